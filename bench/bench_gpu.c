/* The GPU benchmark: the CUDA forward at an Inkling-Small shape (n=2,
 * H=4096, F=2048, bf16) for T in {1, 8, 64, 512, 4096}, 1, 4 and T
 * distinct adapters (at most the 8 slots), rank 16 and 64. Device time per
 * forward (median, CUDA events), fraction of the copy roofline for small
 * T, TFLOP/s for large T, LoRA overhead over the base-only forward, and
 * the ratio to PyTorch eager (bench/torch_ref.py) when its JSON lines are
 * given. Prints a markdown table; never passes or fails on time. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/text.h"
#include "gpu/backend.h"
#include "gpu/cuda/cuda_backend.h"

#define N_EXPERTS 2
#define HIDDEN 4096
#define INTER 2048
#define SLOTS 8

static const int TOKENS[] = {1, 8, 64, 512, 4096};
static const int RANKS[] = {16, 64};

typedef struct {
    int rank, T, adapters; /* adapters 0 = base only */
    double ms;
} torch_row;

static torch_row *g_torch;
static size_t g_ntorch;

/* Reads torch_ref.py's JSON lines; lines without "ms" are skipped. */
static void load_torch(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "bench_gpu: cannot open %s; no torch column\n", path);
        return;
    }
    char line[4096];
    size_t cap = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        if (!j) continue;
        json_t *ms = json_object_get(j, "ms");
        if (json_is_number(ms)) {
            if (g_ntorch == cap) {
                cap = cap ? 2 * cap : 64;
                torch_row *p = realloc(g_torch, cap * sizeof *p);
                if (!p) break;
                g_torch = p;
            }
            g_torch[g_ntorch++] = (torch_row){(int)json_integer_value(json_object_get(j, "rank")),
                                              (int)json_integer_value(json_object_get(j, "T")),
                                              (int)json_integer_value(json_object_get(j, "adapters")),
                                              json_number_value(ms)};
        }
        json_decref(j);
    }
    fclose(f);
}

static double torch_ms(int rank, int T, int adapters) {
    for (size_t i = 0; i < g_ntorch; i++)
        if (g_torch[i].rank == rank && g_torch[i].T == T && g_torch[i].adapters == adapters) return g_torch[i].ms;
    return 0;
}

static void fill(float *v, size_t count, double scale, unsigned long long *s) {
    for (size_t i = 0; i < count; i++) {
        uint64_t st = *s, z = ls_splitmix64(&st);
        *s = st;
        v[i] = (float)(((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0) * scale);
    }
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void die(const char *what, const ls_error *err) {
    fprintf(stderr, "bench_gpu: %s: %s\n", what, err->message);
    exit(1);
}

/* Median device time of one forward in ms. */
static double median_ms(ls_backend *be, int T, const float *x, const float *gam, const int *sot, int iters) {
    float *ms = malloc((size_t)iters * sizeof *ms);
    ls_error err;
    ls_error_init(&err);
    if (!ms) die("out of memory", &err);
    if (ls_backend_cuda_time_forward(be, 0, T, x, gam, sot, iters, ms, NULL, &err) != LS_OK) die("time_forward", &err);
    qsort(ms, (size_t)iters, sizeof *ms, cmp_float);
    double med = ms[iters / 2];
    free(ms);
    ls_error_free(&err);
    return med;
}

int main(int argc, char **argv) {
    const char *torch_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--torch") && i + 1 < argc)
            torch_path = argv[++i];
        else {
            fprintf(stderr, "usage: bench_gpu [--torch torch_ref.jsonl]\n");
            return 2;
        }
    }
    if (torch_path) load_torch(torch_path);
    if (!ls_backend_cuda_available()) {
        printf("SKIPPED: no CUDA device\n");
        return 77;
    }
    const int n = N_EXPERTS, H = HIDDEN, F = INTER, Tmax = 4096;
    const size_t n13 = (size_t)n * 2 * F * H, n2 = (size_t)n * H * F;
    unsigned long long seed = 42;
    float *w13 = malloc(n13 * sizeof(float)), *w2 = malloc(n2 * sizeof(float));
    float *x = malloc((size_t)Tmax * H * sizeof(float)), *gam = malloc((size_t)Tmax * n * sizeof(float));
    int *sot = malloc((size_t)Tmax * sizeof(int));
    ls_error err;
    ls_error_init(&err);
    if (!w13 || !w2 || !x || !gam || !sot) die("out of host memory", &err);
    fill(w13, n13, 0.027, &seed);
    fill(w2, n2, 0.027, &seed);
    fill(x, (size_t)Tmax * H, 1.0, &seed);
    fill(gam, (size_t)Tmax * n, 1.0, &seed);

    double copy_bps = 0;
    int header = 0;
    for (size_t ri = 0; ri < sizeof RANKS / sizeof RANKS[0]; ri++) {
        const int R = RANKS[ri];
        ls_backend_config cfg = {.dims = {n, H, F, 1, LS_W13_INTERLEAVED},
                                 .pool = {SLOTS, R, LS_LORA_SHARED, Tmax},
                                 .dtype = LS_DTYPE_BF16};
        ls_backend *be = NULL;
        if (ls_backend_cuda_create(&cfg, NULL, &be, &err) != LS_OK) die("create", &err);
        const ls_base_layer bl = ls_base_layer_f32(w13, w2);
        if (ls_backend_upload_base(be, 0, &bl, &err) != LS_OK) die("upload_base", &err);
        const size_t la = ls_pool_gu_a_len(&cfg.dims, &cfg.pool), lb = ls_pool_gu_b_len(&cfg.dims, &cfg.pool),
                     lc = ls_pool_d_a_len(&cfg.dims, &cfg.pool), ld = ls_pool_d_b_len(&cfg.dims, &cfg.pool);
        float *fa = malloc(la * 4), *fb = malloc(lb * 4), *fc = malloc(lc * 4), *fd = malloc(ld * 4);
        if (!fa || !fb || !fc || !fd) die("out of host memory", &err);
        for (int s = 0; s < SLOTS; s++) {
            fill(fa, la, 0.027, &seed);
            fill(fb, lb, 0.1, &seed);
            fill(fc, lc, 0.038, &seed);
            fill(fd, ld, 0.1, &seed);
            ls_slot_factors f = {fa, fb, fc, fd};
            if (ls_backend_slot_write(be, s, 0, &f, &err) != LS_OK) die("slot_write", &err);
        }
        free(fa);
        free(fb);
        free(fc);
        free(fd);
        if (!header) {
            if (ls_backend_cuda_copy_bandwidth(be, (size_t)1 << 30, 20, &copy_bps, &err) != LS_OK)
                die("copy bandwidth", &err);
            printf("GPU: %s; bf16 weights, n=%d H=%d F=%d, %d slots, shared pool, interleaved W13; "
                   "device-to-device copy %.0f GB/s (read + write)\n\n",
                   ls_backend_cuda_device_name(be), n, H, F, SLOTS, copy_bps / 1e9);
            printf("| rank | T | adapters | ms | base ms | LoRA overhead | GB/s | roofline | TFLOP/s | torch ms | "
                   "ours/torch |\n");
            printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
            header = 1;
        }
        for (size_t ti = 0; ti < sizeof TOKENS / sizeof TOKENS[0]; ti++) {
            const int T = TOKENS[ti];
            const int iters = T <= 64 ? 200 : T <= 512 ? 50 : 20;
            const double base = median_ms(be, T, x, gam, NULL, iters);
            const int cands[3] = {1, 4, T < SLOTS ? T : SLOTS};
            for (int ai = 0; ai < 3; ai++) {
                const int A = cands[ai];
                if (A > T || (ai > 0 && A <= cands[ai - 1])) continue;
                for (int t = 0; t < T; t++) sot[t] = t % A;
                const double ms = median_ms(be, T, x, gam, sot, iters);
                /* Minimal traffic: weights and each adapter's factors once
                 * (bf16), x and y in fp32, the gates. */
                const double wbytes = 2.0 * ((double)n13 + (double)n2);
                const double abytes = 2.0 * ((double)2 * R * H + (double)n * 2 * F * R + (double)R * n * F +
                                             (double)H * R);
                const double bytes = wbytes + A * abytes + 8.0 * T * H + 4.0 * T * n;
                const double flops = 2.0 * T * ((double)n13 + (double)n2) +
                                     2.0 * T * ((double)2 * R * H + (double)n * 2 * F * R + (double)R * n * F +
                                                (double)H * R);
                const double gbs = bytes / (ms * 1e-3) / 1e9;
                const double tms = torch_ms(R, T, A);
                printf("| %d | %d | %d | %.4f | %.4f | %+.1f%% | %.0f | ", R, T, A, ms, base, (ms / base - 1) * 100,
                       gbs);
                if (T <= 64 && copy_bps > 0)
                    printf("%.0f%% | ", 100.0 * gbs * 1e9 / copy_bps);
                else
                    printf("- | ");
                if (T >= 512)
                    printf("%.0f | ", flops / (ms * 1e-3) / 1e12);
                else
                    printf("- | ");
                if (tms > 0)
                    printf("%.4f | %.2f |\n", tms, ms / tms);
                else
                    printf("- | - |\n");
                fflush(stdout);
            }
        }
        ls_backend_free(be);
    }
    printf("\nms: median device time of one forward (CUDA graph of the device work, inputs resident); roofline: "
           "minimal bytes / time / copy bandwidth; ours/torch < 1 means faster than PyTorch eager.\n");
    free(w13);
    free(w2);
    free(x);
    free(gam);
    free(sot);
    free(g_torch);
    ls_error_free(&err);
    return 0;
}
