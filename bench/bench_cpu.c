/* CPU engine benchmark (issue 6): GFLOP/s of the CPU forward for T in
 * {1, 16, 256, 2048} with 1 and 8 distinct adapters, each beside this
 * machine's OpenBLAS sgemm rate on the same FLOP count measured in the same
 * run, and beside the same forward in PyTorch (CPU, fp32, written as a user
 * would) when PyTorch can be imported. Prints one summary line per ratio;
 * never passes or fails on time.
 *   bench_cpu [--hidden H] [--intermediate F] [--experts n] [--rank r]
 *             [--threads N] [--python PATH] [--no-peer] */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/backend.h"

static double ls_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int ls_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void ls_fill(float *v, size_t n, unsigned *state, float scale) {
    for (size_t i = 0; i < n; i++) {
        *state = *state * 1664525u + 1013904223u;
        v[i] = scale * ((float)(*state >> 8) / 16777216.0f * 2.0f - 1.0f);
    }
}

/* Median seconds of fn over enough runs to fill ~0.6 s (at least 3). */
typedef void (*ls_bench_fn)(void *ctx);
static double ls_median_s(ls_bench_fn fn, void *ctx) {
    fn(ctx); /* warm-up */
    double times[64];
    int n = 0;
    double start = ls_now();
    while (n < 64 && (n < 3 || ls_now() - start < 0.6)) {
        double t0 = ls_now();
        fn(ctx);
        times[n++] = ls_now() - t0;
    }
    qsort(times, (size_t)n, sizeof *times, ls_cmp_double);
    return times[n / 2];
}

typedef struct {
    ls_backend *be;
    int T;
    float *x, *g, *y, *a, *z, *w13, *w2;
    int *slots;
    int n, H, F;
} ls_bench_ctx;

static void ls_bench_forward(void *p) {
    ls_bench_ctx *c = p;
    ls_error err;
    ls_error_init(&err);
    if (c->be->ops->forward(c->be, 0, c->T, c->x, c->g, c->slots, c->y, &err) != LS_OK) {
        fprintf(stderr, "forward failed: %s\n", err.message);
        exit(1);
    }
    ls_error_free(&err);
}

/* The base forward's two GEMMs as plain sgemm calls: same M, N, K. */
static void ls_bench_sgemm(void *p) {
    ls_bench_ctx *c = p;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c->T, c->n * 2 * c->F, c->H, 1.0f, c->x, c->H, c->w13, c->H,
                0.0f, c->z, c->n * 2 * c->F);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c->T, c->H, c->n * c->F, 1.0f, c->a, c->n * c->F, c->w2,
                c->n * c->F, 0.0f, c->y, c->H);
}

int main(int argc, char **argv) {
    int H = 2048, F = 1024, n = 2, rank = 16, threads = 2, peer = 1;
    const char *python = "/usr/bin/python3";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--hidden") && i + 1 < argc) H = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--intermediate") && i + 1 < argc) F = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--experts") && i + 1 < argc) n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc) rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--python") && i + 1 < argc) python = argv[++i];
        else if (!strcmp(argv[i], "--no-peer")) peer = 0;
        else {
            fprintf(stderr, "usage: %s [--hidden H] [--intermediate F] [--experts n] [--rank r] [--threads N] "
                            "[--python PATH] [--no-peer]\n", argv[0]);
            return 2;
        }
    }
    const int Ts[] = {1, 16, 256, 2048}, As[] = {1, 8};
    const int maxT = 2048, S = 8;
    ls_backend_config cfg = {.dims = {.n = n, .H = H, .F = F, .L = 1, .w13_layout = LS_W13_INTERLEAVED},
                             .pool = {.slots = S, .max_rank = rank, .layout = LS_LORA_SHARED, .max_tokens = maxT},
                             .dtype = LS_DTYPE_F32,
                             .threads = threads};
    ls_error err;
    ls_error_init(&err);
    ls_backend *be = NULL;
    if (ls_backend_cpu_create(&cfg, &be, &err) != LS_OK) {
        fprintf(stderr, "cpu backend: %s\n", err.message);
        return 1;
    }
    unsigned seed = 12345;
    size_t n13 = (size_t)n * 2 * F * H, n2 = (size_t)n * H * F;
    ls_bench_ctx c = {.be = be, .n = n, .H = H, .F = F};
    c.w13 = malloc(n13 * 4);
    c.w2 = malloc(n2 * 4);
    c.x = malloc((size_t)maxT * H * 4);
    c.g = malloc((size_t)maxT * n * 4);
    c.y = malloc((size_t)maxT * H * 4);
    c.z = malloc((size_t)maxT * n * 2 * F * 4);
    c.a = malloc((size_t)maxT * n * F * 4);
    c.slots = malloc((size_t)maxT * sizeof(int));
    ls_fill(c.w13, n13, &seed, 1.0f / sqrtf((float)H));
    ls_fill(c.w2, n2, &seed, 1.0f / sqrtf((float)F));
    ls_fill(c.x, (size_t)maxT * H, &seed, 1.0f);
    ls_fill(c.g, (size_t)maxT * n, &seed, 1.0f);
    ls_fill(c.a, (size_t)maxT * n * F, &seed, 1.0f);
    if (be->ops->upload_base(be, 0, c.w13, c.w2, &err) != LS_OK) return 1;
    size_t la = ls_pool_gu_a_len(&cfg.dims, &cfg.pool), lb = ls_pool_gu_b_len(&cfg.dims, &cfg.pool),
           lc = ls_pool_d_a_len(&cfg.dims, &cfg.pool), ld = ls_pool_d_b_len(&cfg.dims, &cfg.pool);
    float *fa = malloc(la * 4), *fb = malloc(lb * 4), *fc = malloc(lc * 4), *fd = malloc(ld * 4);
    for (int s = 0; s < S; s++) {
        ls_fill(fa, la, &seed, 0.05f), ls_fill(fb, lb, &seed, 0.05f), ls_fill(fc, lc, &seed, 0.05f),
            ls_fill(fd, ld, &seed, 0.05f);
        ls_slot_factors f = {fa, fb, fc, fd};
        if (be->ops->slot_write(be, s, 0, &f, &err) != LS_OK) return 1;
    }

    printf("# lorasink CPU engine: n=%d H=%d F=%d rank=%d, %d BLAS threads, fp32\n", n, H, F, rank, threads);
    printf("| T | adapters | ours ms | ours GFLOP/s | sgemm GFLOP/s | ours/sgemm |\n|---|---|---|---|---|---|\n");
    double ours_ms[4][2];
    for (int ti = 0; ti < 4; ti++) {
        for (int ai = 0; ai < 2; ai++) {
            int T = Ts[ti], A = As[ai];
            ours_ms[ti][ai] = 0;
            if (A > T) continue; /* T tokens cannot use more adapters */
            c.T = T;
            for (int t = 0; t < T; t++) c.slots[t] = t % A;
            double base = 2.0 * T * ((double)n * 2 * F * H + (double)n * H * F);
            double lora = 2.0 * T * (2.0 * rank * H + (double)n * 2 * F * rank + (double)n * rank * F + (double)H * rank);
            double ts = ls_median_s(ls_bench_forward, &c);
            double tg = ls_median_s(ls_bench_sgemm, &c);
            double ours = (base + lora) / ts / 1e9, ref = base / tg / 1e9;
            ours_ms[ti][ai] = ts * 1e3;
            printf("| %d | %d | %.3f | %.1f | %.1f | %.2f |\n", T, A, ts * 1e3, ours, ref, ours / ref);
            fflush(stdout);
        }
    }
    for (int ti = 0; ti < 4; ti++)
        for (int ai = 0; ai < 2; ai++) {
            int T = Ts[ti], A = As[ai];
            if (A > T) continue;
            double base = 2.0 * T * ((double)n * 2 * F * H + (double)n * H * F);
            c.T = T;
            double tg = ls_median_s(ls_bench_sgemm, &c);
            printf("engine: T=%d adapters=%d ours/sgemm GFLOP/s ratio %.2f\n", T, A,
                   (base / (ours_ms[ti][ai] / 1e3)) / (base / tg));
        }

    if (peer) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd,
                 "'%s' '%s/torch_cpu.py' --hidden %d --intermediate %d --experts %d --rank %d --threads %d 2>&1",
                 python, LS_BENCH_DIR, H, F, n, rank, threads);
        FILE *p = popen(cmd, "r");
        char line[512];
        int got = 0;
        while (p && fgets(line, sizeof line, p)) {
            int T, A;
            double ms;
            if (sscanf(line, "{\"T\": %d, \"adapters\": %d, \"ms\": %lf}", &T, &A, &ms) == 3) {
                for (int ti = 0; ti < 4; ti++)
                    for (int ai = 0; ai < 2; ai++)
                        if (Ts[ti] == T && As[ai] == A && ours_ms[ti][ai] > 0 && ms > 0) {
                            printf("peer: T=%d adapters=%d ours %.3f ms / pytorch %.3f ms = %.2f\n", T, A,
                                   ours_ms[ti][ai], ms, ours_ms[ti][ai] / ms);
                            got++;
                        }
            } else {
                printf("peer: %s", line);
            }
        }
        if (p) pclose(p);
        if (!got) printf("peer: skipped: PyTorch did not run (install it with: apt-get install python3-torch)\n");
    }
    free(fa), free(fb), free(fc), free(fd);
    free(c.w13), free(c.w2), free(c.x), free(c.g), free(c.y), free(c.z), free(c.a), free(c.slots);
    ls_backend_free(be);
    ls_error_free(&err);
    return 0;
}
