/* CPU engine benchmark: the forward for T in {1, 16, 256, 2048} with 1 and
 * 8 distinct adapters, f32 and bf16 weights, measured in one run beside
 *   - the weight-streaming floor: bytes of one layer's base weights at
 *     their storage dtype over the bandwidth of a large memcpy (the
 *     forward cycles through --layers layers so its weights come from
 *     memory, not from the last call's cache);
 *     and beside it that floor with the bytes of the adapters' factors
 *     (at their rank and kept dtype) added, which a forward must also read;
 *   - the compute floor: the forward's FLOPs over the fused multiply-add
 *     peak of the same threads on the kernels' vector width, measured by
 *     a loop of independent FMAs (what no forward can beat);
 *   - OpenBLAS sgemm on the base forward's two GEMMs (same M, N, K);
 *   - the same forward in PyTorch (bench/torch_cpu.py, fp32), once per
 *     --python given (default /usr/bin/python3, Debian's python3-torch).
 * Prints a table and one line per ratio; never passes or fails on time.
 * --max-rank puts the rank-r adapters in a pool of a larger rank (as a
 * server started with that --max-rank holds them; the default is r).
 * --factors bf16 makes every factor value a bf16 number, as an adapter
 * saved in bf16 with a power-of-two scale arrives (the default, f32, is
 * full fp32 values).
 * --fma-peak prints only that FMA peak, in GFLOP/s, and exits
 * (bench/bench_http.sh bounds what batching can gain with it).
 * --compute f32|bf16|both (default both) picks the engine's arithmetic:
 * rows of f32 compute on f32 and bf16 weights, and of bf16 compute (the
 * weights packed in bf16 whatever they were). The bf16 rows' compute
 * floor is the VDPBF16PS peak where the CPU has AVX512-BF16, measured as
 * the FMA peak is; elsewhere bf16 compute is emulated with FMAs and its
 * floor is the FMA peak (said in the output). PyTorch runs once in fp32
 * and once with bf16 tensors, as a user writes either. The accuracy of
 * bf16 compute is printed too: the relative L2 distance of its outputs
 * from f32 compute's on the same inputs.
 *   bench_cpu [--hidden H] [--intermediate F] [--experts n] [--rank r]
 *             [--max-rank R] [--factors f32|bf16] [--threads N] [--layers L]
 *             [--isa auto|avx512|avx2|generic] [--compute f32|bf16|both]
 *             [--python PATH]... [--no-peer]
 *   bench_cpu --fma-peak [--threads N] [--isa auto|avx512|avx2|generic] */
#include <cblas.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/backend.h"
#include "gpu/cpu/kernels.h"
#include "bench_util.h"

#define MAX_PEERS 4

/* The rows: weight storage and the engine's arithmetic. */
typedef struct {
    ls_dtype dt;
    ls_cpu_compute compute;
} ls_row_kind;
static const ls_row_kind ROWS[] = {{LS_DTYPE_F32, LS_CPU_COMPUTE_F32},
                                   {LS_DTYPE_BF16, LS_CPU_COMPUTE_F32},
                                   {LS_DTYPE_BF16, LS_CPU_COMPUTE_BF16}};
#define NROWS 3
/* The batch whose outputs bf16 compute's accuracy is measured on. */
#define ACC_T 256
#define ACC_A 8

static const int Ts[] = {1, 16, 256, 2048}, As[] = {1, 8};
#define NT 4
#define NA 2

/* Seconds on the monotonic clock. */
static double ls_now(void) { return bench_now_ms() * 1e-3; }

static void ls_fill(float *v, size_t n, unsigned *state, float scale) {
    for (size_t i = 0; i < n; i++) {
        *state = *state * 1664525u + 1013904223u;
        v[i] = scale * ((float)(*state >> 8) / 16777216.0f * 2.0f - 1.0f);
    }
}

/* Zeroes rank indices k >= r of one slot's factors in the pool's layout
 * (gu_a [1, 2R, H], gu_b [n, 2F, R], d_a [n, R, F], d_b [1, H, R]), as
 * the server pads a rank-r adapter. */
static void ls_pad_rank(float *ga, float *gb, float *da, float *db, int n, int H, int F, int R, int r) {
    for (int k = r; k < R; k++) {
        memset(ga + (size_t)k * H, 0, (size_t)H * 4);
        memset(ga + ((size_t)R + k) * H, 0, (size_t)H * 4);
        for (size_t i = 0; i < (size_t)n * 2 * F; i++) gb[i * R + k] = 0;
        for (int e = 0; e < n; e++) memset(da + ((size_t)e * R + k) * F, 0, (size_t)F * 4);
        for (int h = 0; h < H; h++) db[(size_t)h * R + k] = 0;
    }
}

/* v rounded to bf16 numbers. */
static void ls_round_bf16(float *v, size_t n) {
    for (size_t i = 0; i < n; i++) v[i] = ls_bf16_to_f32(ls_f32_to_bf16(v[i]));
}

static void *ls_xmalloc(size_t bytes) {
    void *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "bench_cpu: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* Median seconds of fn over enough runs to fill ~1.5 s (at least 5). On
 * a shared machine a neighbour takes the CPUs for a few calls now and
 * then; with 3 calls of T=2048 one slow call moved the median by a third. */
typedef void (*ls_bench_fn)(void *ctx);
static double ls_median_s(ls_bench_fn fn, void *ctx) {
    fn(ctx); /* warm-up */
    double times[64];
    int n = 0;
    double start = ls_now();
    while (n < 64 && (n < 5 || ls_now() - start < 1.5)) {
        double t0 = ls_now();
        fn(ctx);
        times[n++] = ls_now() - t0;
    }
    return bench_median(times, n);
}

/* ---- memcpy bandwidth: each of `threads` threads copies its slice ---- */

typedef struct {
    char *dst;
    const char *src;
    size_t bytes;
} ls_copy_job;

static void *ls_copy_run(void *p) {
    ls_copy_job *j = p;
    memcpy(j->dst, j->src, j->bytes);
    return NULL;
}

/* Best of 5 copies of 256 MiB, in bytes per second (bytes copied / time). */
static double ls_bw_last; /* the last bandwidth measured, for the report */

static double ls_memcpy_bandwidth(int threads) {
    const size_t bytes = (size_t)256 << 20;
    char *src = ls_xmalloc(bytes), *dst = ls_xmalloc(bytes);
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    pthread_t tid[64];
    ls_copy_job job[64];
    if (threads > 64) threads = 64;
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = ls_now();
        for (int i = 0; i < threads; i++) {
            size_t a = bytes * (size_t)i / (size_t)threads, b = bytes * (size_t)(i + 1) / (size_t)threads;
            job[i] = (ls_copy_job){dst + a, src + a, b - a};
            if (i > 0) pthread_create(&tid[i], NULL, ls_copy_run, &job[i]);
        }
        ls_copy_run(&job[0]);
        for (int i = 1; i < threads; i++) pthread_join(tid[i], NULL);
        double bw = (double)bytes / (ls_now() - t0);
        if (bw > best) best = bw;
    }
    free(src);
    free(dst);
    ls_bw_last = best;
    return best;
}

/* ---- FMA peak: each of `threads` threads runs independent FMA chains -- */

#define LS_PEAK_ITERS 20000000L

/* 12 independent chains of `lanes` floats each, so latency never limits
 * the rate; returns a value that depends on every chain. The loops are
 * fully unrolled (the pragmas) so the chains live in registers in every build
 * type: at -O2 (RelWithDebInfo, the default build) gcc kept them in
 * memory, and a store and a load between FMAs measured under half the
 * peak, which overstated the compute floor. */
__attribute__((target("avx512f"))) static float ls_peak_avx512(void) {
    __m512 acc[12], b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_ps((float)i);
    for (long n = 0; n < LS_PEAK_ITERS; n++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
    float s = 0;
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(acc[i]);
    return s;
}
__attribute__((target("avx2,fma"))) static float ls_peak_avx2(void) {
    __m256 acc[12], b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_ps((float)i);
    for (long n = 0; n < LS_PEAK_ITERS; n++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = _mm256_fmadd_ps(acc[i], b, c);
    float v[8], s = 0;
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) {
        _mm256_storeu_ps(v, acc[i]);
        for (int l = 0; l < 8; l++) s += v[l];
    }
    return s;
}
/* VDPBF16PS: 12 independent accumulators, each instruction 2 multiply-
 * adds a lane (32 FLOPs a 16-lane instruction). */
__attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl"))) static float ls_peak_avx512bf16(void) {
    __m512 acc[12];
    const __m512bh b = (__m512bh)_mm512_set1_epi32(0x3F7F3F7F), c = (__m512bh)_mm512_set1_epi32(0x3A833A83);
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_ps((float)i);
    for (long n = 0; n < LS_PEAK_ITERS; n++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = _mm512_dpbf16_ps(acc[i], b, c);
    float s = 0;
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(acc[i]);
    return s;
}
static float ls_peak_generic(void) {
    float acc[12];
    for (int i = 0; i < 12; i++) acc[i] = (float)i;
    for (long n = 0; n < LS_PEAK_ITERS / 16; n++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = fmaf(acc[i], 0.999f, 1e-3f);
    float s = 0;
    for (int i = 0; i < 12; i++) s += acc[i];
    return s;
}

typedef struct {
    int lanes; /* 16, 8 or 1; 32: VDPBF16PS (16 lanes, 2 multiply-adds each) */
    float sink;
} ls_peak_job;

static void *ls_peak_run(void *p) {
    ls_peak_job *j = p;
    j->sink = j->lanes == 32   ? ls_peak_avx512bf16()
              : j->lanes == 16 ? ls_peak_avx512()
              : j->lanes == 8  ? ls_peak_avx2()
                               : ls_peak_generic();
    return NULL;
}

/* Floats in one vector of the kernels named name ("avx512", "avx2",
 * "generic"). */
static int ls_isa_lanes(const char *name) { return !strcmp(name, "avx512") ? 16 : !strcmp(name, "avx2") ? 8 : 1; }

/* FLOP/s of `threads` threads doing nothing but FMAs `lanes` wide (32:
 * VDPBF16PS, as 32 multiply-adds an instruction), best of 3. */
static double ls_fma_peak(int threads, int lanes) {
    pthread_t tid[64];
    ls_peak_job job[64];
    if (threads > 64) threads = 64;
    const double iters = lanes == 1 ? (double)(LS_PEAK_ITERS / 16) : (double)LS_PEAK_ITERS;
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = ls_now();
        for (int i = 0; i < threads; i++) {
            job[i].lanes = lanes;
            if (i > 0) pthread_create(&tid[i], NULL, ls_peak_run, &job[i]);
        }
        ls_peak_run(&job[0]);
        for (int i = 1; i < threads; i++) pthread_join(tid[i], NULL);
        double fl = 2.0 * 12 * lanes * iters * threads / (ls_now() - t0);
        if (fl > best) best = fl;
    }
    return best;
}

/* ---- the forward and sgemm ------------------------------------------ */

typedef struct {
    ls_backend *be;
    int T, L, call;
    float *x, *g, *y, *a, *z, *w13, *w2;
    int *slots;
    int n, H, F;
} ls_bench_ctx;

/* One forward on the next layer in turn. */
static void ls_bench_forward(void *p) {
    ls_bench_ctx *c = p;
    ls_error err;
    ls_error_init(&err);
    if (ls_backend_forward(c->be, c->call++ % c->L, c->T, c->x, c->g, c->slots, c->y, &err) != LS_OK) {
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

/* sgemm's seconds, then ours, back to back so the ratio sees the same
 * machine. OpenBLAS's threads poll for a while after a call and would take
 * the CPUs from ours, hence the pause between. */
static void ls_measure_row(void *ctx, double *ours_s, double *sgemm_s) {
    *sgemm_s = ls_median_s(ls_bench_sgemm, ctx);
    struct timespec pause = {0, 500 * 1000 * 1000};
    nanosleep(&pause, NULL);
    *ours_s = ls_median_s(ls_bench_forward, ctx);
}

/* FLOPs of one forward of T tokens, all on adapters: the base GEMMs and
 * the LoRA's shrinks and expands (2 per multiply-add). */
static double ls_forward_flops(int T, int n, int H, int F, int rank) {
    double base = 2.0 * T * ((double)n * 2 * F * H + (double)n * H * F);
    double lora = 2.0 * T * (2.0 * rank * H + (double)n * 2 * F * rank + (double)n * rank * F + (double)H * rank);
    return base + lora;
}

/* ---- PyTorch peers ---------------------------------------------------- */

typedef struct {
    char label[128];
    double ms[NT][NA];
    double gemms_ms[NT]; /* the two base GEMMs alone, all tokens at once */
} ls_peer;

/* Runs torch_cpu.py under python; false (with the reason printed) when it
 * gave no timings. */
static bool ls_peer_run(const char *python, const char *dtype, int H, int F, int n, int rank, int threads,
                        ls_peer *out) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' '%s/torch_cpu.py' --hidden %d --intermediate %d --experts %d --rank %d --threads %d --dtype %s 2>&1",
             python, LS_BENCH_DIR, H, F, n, rank, threads, dtype);
    memset(out, 0, sizeof *out);
    snprintf(out->label, sizeof out->label, "%s, %s", python, dtype);
    FILE *p = popen(cmd, "r");
    char line[512];
    int got = 0;
    while (p && fgets(line, sizeof line, p)) {
        int T, A;
        double ms;
        char version[64];
        if (sscanf(line, "{\"T\": %d, \"gemms_ms\": %lf}", &T, &ms) == 2) {
            for (int ti = 0; ti < NT; ti++)
                if (Ts[ti] == T) out->gemms_ms[ti] = ms;
        } else if (sscanf(line, "{\"T\": %d, \"adapters\": %d, \"ms\": %lf}", &T, &A, &ms) == 3) {
            for (int ti = 0; ti < NT; ti++)
                for (int ai = 0; ai < NA; ai++)
                    if (Ts[ti] == T && As[ai] == A) out->ms[ti][ai] = ms, got++;
        } else if (sscanf(line, "{\"torch\": \"%63[^\"]\"}", version) == 1) {
            snprintf(out->label, sizeof out->label, "pytorch %s %s (%s)", version, dtype, python);
        } else {
            printf("peer %s: %s", python, line);
        }
    }
    if (p) pclose(p);
    if (!got) printf("peer %s: skipped: PyTorch did not run (apt-get install python3-torch)\n", python);
    return got > 0;
}

/* Relative L2 distance of y from ref (count values). */
static double ls_rel_l2(const float *y, const float *ref, size_t count) {
    double d = 0, r = 0;
    for (size_t i = 0; i < count; i++) {
        double e = (double)y[i] - ref[i];
        d += e * e, r += (double)ref[i] * ref[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

typedef struct {
    int H, F, n, rank, max_rank, threads, L, S, maxT;
    bool bf16_factors;
    ls_cpu_isa isa;
} ls_bench_opts;

/* One row kind's backend: the base weights uploaded to every layer and S
 * adapters of the given rank (padded to max_rank, the same in every row)
 * written; NULL (said)
 * when the backend refuses the configuration. */
static ls_backend *ls_bench_backend(const ls_bench_opts *o, const ls_row_kind *k, ls_bench_ctx *c,
                                    double *lora_bytes) {
    /* The same adapters in every row, so the rows' outputs compare. */
    unsigned seed_state = 777, *seed = &seed_state;
    ls_backend_config cfg = {.dims = {.n = o->n, .H = o->H, .F = o->F, .L = o->L, .w13_layout = LS_W13_INTERLEAVED},
                             .pool = {.slots = o->S, .max_rank = o->max_rank, .layout = LS_LORA_SHARED,
                                      .max_tokens = o->maxT},
                             .dtype = k->dt};
    const ls_cpu_settings cpu = {.threads = o->threads, .isa = o->isa, .compute = k->compute};
    ls_error err;
    ls_error_init(&err);
    ls_backend *be = NULL;
    if (ls_backend_cpu_create(&cfg, &cpu, &be, &err) != LS_OK) {
        printf("cpu backend (%s weights, %s compute): %s\n", ls_dtype_name(k->dt),
               k->compute == LS_CPU_COMPUTE_BF16 ? "bf16" : "f32", err.message);
        ls_error_free(&err);
        return NULL;
    }
    for (int l = 0; l < o->L; l++) {
        const ls_base_layer bl = ls_base_layer_f32(c->w13, c->w2);
        if (ls_backend_upload_base(be, l, &bl, &err) != LS_OK) exit(1);
    }
    size_t la = ls_pool_gu_a_len(&cfg.dims, &cfg.pool), lb = ls_pool_gu_b_len(&cfg.dims, &cfg.pool),
           lc = ls_pool_d_a_len(&cfg.dims, &cfg.pool), ld = ls_pool_d_b_len(&cfg.dims, &cfg.pool);
    float *fa = ls_xmalloc(la * 4), *fb = ls_xmalloc(lb * 4), *fc = ls_xmalloc(lc * 4), *fd = ls_xmalloc(ld * 4);
    for (int s = 0; s < o->S; s++)
        for (int l = 0; l < o->L; l++) {
            ls_fill(fa, la, seed, 0.05f), ls_fill(fb, lb, seed, 0.05f), ls_fill(fc, lc, seed, 0.05f),
                ls_fill(fd, ld, seed, 0.05f);
            ls_pad_rank(fa, fb, fc, fd, o->n, o->H, o->F, o->max_rank, o->rank);
            if (o->bf16_factors) ls_round_bf16(fa, la), ls_round_bf16(fb, lb), ls_round_bf16(fc, lc), ls_round_bf16(fd, ld);
            ls_slot_factors f = {fa, fb, fc, fd, NULL};
            if (ls_backend_slot_write(be, s, l, &f, &err) != LS_OK) exit(1);
        }
    free(fa), free(fb), free(fc), free(fd);
    /* Each factor has one rank axis: the slot keeps rank of max_rank. */
    *lora_bytes = (double)(la + lb + lc + ld) / o->max_rank * o->rank * (o->bf16_factors ? 2 : 4);
    ls_error_free(&err);
    return be;
}

static const char *ls_compute_name(ls_cpu_compute c) { return c == LS_CPU_COMPUTE_BF16 ? "bf16" : "f32"; }

/* bf16 compute's distance from f32 compute on the same batch. */
static void ls_bench_accuracy(float *const *acc_y, size_t count) {
    if (acc_y[2] && acc_y[1])
        printf("accuracy: bf16 compute vs f32 compute (bf16 weights), T=%d, %d adapters: relative L2 %.3g\n", ACC_T,
               ACC_A, ls_rel_l2(acc_y[2], acc_y[1], count));
    if (acc_y[2] && acc_y[0])
        printf("accuracy: bf16 compute vs f32 compute (f32 weights), T=%d, %d adapters: relative L2 %.3g\n", ACC_T,
               ACC_A, ls_rel_l2(acc_y[2], acc_y[0], count));
    if (acc_y[1] && acc_y[0])
        printf("accuracy: f32 compute, bf16 weights vs f32 weights, T=%d, %d adapters: relative L2 %.3g\n", ACC_T,
               ACC_A, ls_rel_l2(acc_y[1], acc_y[0], count));
}

/* The table and the ratio lines of every row measured (ms > 0). */
/* Our whole forward against each peer's two base GEMMs alone: the time of
 * its GEMM library with nothing around it, which a forward can only
 * approach (ours also does the LoRA, SiLU and the token order). Only
 * T >= 256, where both are bound by compute: below, the peer's one layer
 * of weights stays in cache while ours come from memory (4 layers in
 * turn), so the ratio would compare the cache with memory. */
static void ls_bench_gemms_report(const ls_bench_opts *o, double ms[NROWS][NT][NA], const ls_peer *peers, int np) {
    const double base_flops = 2.0 * ((double)o->n * 2 * o->F * o->H + (double)o->n * o->H * o->F);
    for (int p = 0; p < np; p++)
        for (int di = 0; di < NROWS; di++)
            for (int ti = 2; ti < NT; ti++)
                for (int ai = 0; ai < NA; ai++)
                    if (ms[di][ti][ai] > 0 && peers[p].gemms_ms[ti] > 0)
                        printf("gemms: %s/%s T=%d adapters=%d ours (whole forward) %.3f ms / %s base GEMMs alone "
                               "%.3f ms (%.1f GFLOP/s) = %.2f\n",
                               ls_dtype_name(ROWS[di].dt), ls_compute_name(ROWS[di].compute), Ts[ti], As[ai],
                               ms[di][ti][ai], peers[p].label, peers[p].gemms_ms[ti],
                               base_flops * Ts[ti] / (peers[p].gemms_ms[ti] / 1e3) / 1e9,
                               ms[di][ti][ai] / peers[p].gemms_ms[ti]);
}

static void ls_bench_report(const ls_bench_opts *o, double ms[NROWS][NT][NA], const double *floor_ms,
                            double sgemm_gf[NROWS][NT][NA], double lora_ms, const char *const *isa_name,
                            float *const *acc_y, const ls_peer *peers, int np) {
    const int n = o->n, H = o->H, F = o->F, rank = o->rank, threads = o->threads;
    const char *f32_isa = isa_name[0] ? isa_name[0] : isa_name[1] ? isa_name[1] : "generic";
    const double peak = ls_fma_peak(threads, ls_isa_lanes(f32_isa));
    /* bf16 compute's floor: VDPBF16PS's own peak, or the FMAs that emulate it. */
    const bool native = isa_name[2] && !strcmp(isa_name[2], "avx512bf16");
    const double bf16_peak = !isa_name[2] ? 0 : native ? ls_fma_peak(threads, 32) : ls_fma_peak(threads, ls_isa_lanes(isa_name[2]));
    double row_peak[NROWS] = {peak, peak, bf16_peak};
    printf("# lorasink CPU engine: n=%d H=%d F=%d rank=%d (pool max rank %d, %s factors), %d threads, %s kernels "
           "(f32 compute), %s (bf16 compute), %d layers in turn\n",
           n, H, F, rank, o->max_rank, o->bf16_factors ? "bf16" : "f32", threads, f32_isa,
           isa_name[2] ? isa_name[2] : "not run", o->L);
    printf("# memcpy %.1f GB/s (256 MiB, %d threads); floor = one layer's weight bytes / that bandwidth\n", ls_bw_last / 1e9,
           threads);
    printf("# fma peak %.1f GFLOP/s (%d threads, %d lanes); compute floor = the forward's FLOPs / that peak\n",
           peak / 1e9, threads, ls_isa_lanes(f32_isa));
    if (isa_name[2])
        printf("# bf16 peak %.1f GFLOP/s (%d threads): %s\n", bf16_peak / 1e9, threads,
               native ? "VDPBF16PS, 2 multiply-adds a lane an instruction; the bf16 rows' compute floor"
                      : "this CPU has no AVX512-BF16, so bf16 compute is emulated with FMAs and its floor is the "
                        "FMA peak; the VDPBF16PS peak is not measurable here");
    printf("| weights | compute | T | adapters | ours ms | floor ms | ours/floor | compute ms | ours/compute | ours "
           "GFLOP/s | sgemm GFLOP/s | ours/sgemm |");
    for (int p = 0; p < np; p++) printf(" torch%d ms | ours/torch%d |", p + 1, p + 1);
    printf("\n|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (int p = 0; p < np; p++) printf("---|---|");
    printf("\n");
    for (int di = 0; di < NROWS; di++)
        for (int ti = 0; ti < NT; ti++)
            for (int ai = 0; ai < NA; ai++) {
                if (ms[di][ti][ai] <= 0) continue;
                int T = Ts[ti];
                double flops = ls_forward_flops(T, n, H, F, rank);
                double gf = flops / (ms[di][ti][ai] / 1e3) / 1e9;
                double compute_ms = flops / row_peak[di] * 1e3;
                printf("| %s | %s | %d | %d | %.3f | %.3f | %.2f | %.3f | %.2f | %.1f | %.1f | %.2f |",
                       ls_dtype_name(ROWS[di].dt), ls_compute_name(ROWS[di].compute), T, As[ai], ms[di][ti][ai],
                       floor_ms[di], ms[di][ti][ai] / floor_ms[di], compute_ms, ms[di][ti][ai] / compute_ms, gf,
                       sgemm_gf[di][ti][ai], gf / sgemm_gf[di][ti][ai]);
                for (int p = 0; p < np; p++) {
                    double pm = peers[p].ms[ti][ai];
                    if (pm > 0) printf(" %.3f | %.2f |", pm, ms[di][ti][ai] / pm);
                    else printf(" | |");
                }
                printf("\n");
            }
    for (int p = 0; p < np; p++) printf("torch%d: %s, %d threads\n", p + 1, peers[p].label, threads);
    for (int di = 0; di < NROWS; di++)
        for (int ti = 0; ti < 2; ti++)
            for (int ai = 0; ai < NA; ai++)
                if (ms[di][ti][ai] > 0) {
                    const int T = Ts[ti];
                    double compute_ms = ls_forward_flops(T, n, H, F, rank) / row_peak[di] * 1e3;
                    const double with_lora = floor_ms[di] + As[ai] * lora_ms;
                    printf("floor: %s/%s T=%d adapters=%d ours/floor time ratio %.2f (compute floor %.3f ms = %.2f "
                           "of the memory floor; ours/compute %.2f; with the adapters' factors the memory floor is "
                           "%.3f ms, ours/that %.2f)\n",
                           ls_dtype_name(ROWS[di].dt), ls_compute_name(ROWS[di].compute), T, As[ai],
                           ms[di][ti][ai] / floor_ms[di], compute_ms, compute_ms / floor_ms[di],
                           ms[di][ti][ai] / compute_ms, with_lora, ms[di][ti][ai] / with_lora);
                }
    for (int di = 0; di < NROWS; di++)
        for (int ti = 2; ti < NT; ti++)
            for (int ai = 0; ai < NA; ai++)
                if (ms[di][ti][ai] > 0)
                    printf("engine: %s/%s T=%d adapters=%d ours/sgemm GFLOP/s ratio %.2f\n", ls_dtype_name(ROWS[di].dt),
                           ls_compute_name(ROWS[di].compute), Ts[ti], As[ai],
                           ls_forward_flops(Ts[ti], n, H, F, rank) / (ms[di][ti][ai] / 1e3) / 1e9 / sgemm_gf[di][ti][ai]);
    for (int p = 0; p < np; p++)
        for (int di = 0; di < NROWS; di++)
            for (int ti = 0; ti < NT; ti++)
                for (int ai = 0; ai < NA; ai++)
                    if (ms[di][ti][ai] > 0 && peers[p].ms[ti][ai] > 0)
                        printf("peer: %s/%s T=%d adapters=%d ours %.3f ms / %s %.3f ms = %.2f\n",
                               ls_dtype_name(ROWS[di].dt), ls_compute_name(ROWS[di].compute), Ts[ti], As[ai],
                               ms[di][ti][ai], peers[p].label, peers[p].ms[ti][ai], ms[di][ti][ai] / peers[p].ms[ti][ai]);
    ls_bench_gemms_report(o, ms, peers, np);
    ls_bench_accuracy(acc_y, (size_t)ACC_T * H);
}

/* Reads the command line into o and the rest; false (usage printed) on
 * anything it does not know. */
static bool ls_bench_args(int argc, char **argv, ls_bench_opts *o, int *peer, int *which, bool *peak_only,
                          const char **python, int *npy) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--hidden") && i + 1 < argc) o->H = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--intermediate") && i + 1 < argc) o->F = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--experts") && i + 1 < argc) o->n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc) o->rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-rank") && i + 1 < argc) o->max_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--factors") && i + 1 < argc) o->bf16_factors = !strcmp(argv[++i], "bf16");
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) o->threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) o->L = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--python") && i + 1 < argc && *npy < MAX_PEERS) python[(*npy)++] = argv[++i];
        else if (!strcmp(argv[i], "--no-peer")) *peer = 0;
        else if (!strcmp(argv[i], "--fma-peak")) *peak_only = true;
        else if (!strcmp(argv[i], "--compute") && i + 1 < argc) {
            const char *v = argv[++i];
            *which = !strcmp(v, "f32") ? 0 : !strcmp(v, "bf16") ? 1 : !strcmp(v, "both") ? 2 : -1;
            if (*which < 0) return false;
        } else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *v = argv[++i];
            o->isa = !strcmp(v, "avx512") ? LS_CPU_ISA_AVX512
                    : !strcmp(v, "avx2") ? LS_CPU_ISA_AVX2
                    : !strcmp(v, "generic") ? LS_CPU_ISA_GENERIC
                                            : LS_CPU_ISA_AUTO;
        } else {
            fprintf(stderr, "usage: %s [--hidden H] [--intermediate F] [--experts n] [--rank r] [--max-rank R] "
                            "[--factors f32|bf16] [--threads N] [--layers L] [--isa auto|avx512|avx2|generic] "
                            "[--compute f32|bf16|both] [--python PATH]... [--no-peer]\n"
                            "       %s --fma-peak [--threads N] [--isa ...]\n",
                    argv[0], argv[0]);
            return false;
        }
    }
    return true;
}

int main(int argc, char **argv) {
    ls_bench_opts o = {.H = 2048, .F = 1024, .n = 2, .rank = 16, .threads = 2, .L = 4, .S = 8, .maxT = 2048,
                       .isa = LS_CPU_ISA_AUTO};
    int peer = 1, npy = 0, which = 2; /* 0 f32, 1 bf16, 2 both */
    bool peak_only = false;
    const char *python[MAX_PEERS];
    if (!ls_bench_args(argc, argv, &o, &peer, &which, &peak_only, python, &npy)) return 2;
    if (o.max_rank == 0) o.max_rank = o.rank;
    if (o.L < 1 || o.threads < 1 || o.rank < 1 || o.max_rank < o.rank) return 2;
    if (peak_only) {
        const ls_cpu_kernels *k = ls_cpu_kernels_for(o.isa); /* what the engine would run */
        if (!k) return 2;
        printf("%.1f\n", ls_fma_peak(o.threads, ls_isa_lanes(k->name)) / 1e9);
        return 0;
    }
    if (npy == 0) python[npy++] = "/usr/bin/python3";
    openblas_set_num_threads(o.threads);
    const int n = o.n, H = o.H, F = o.F, maxT = o.maxT, threads = o.threads, rank = o.rank;
    const double bw = ls_memcpy_bandwidth(threads);

    unsigned seed = 12345;
    size_t n13 = (size_t)n * 2 * F * H, n2 = (size_t)n * H * F;
    ls_bench_ctx c = {.n = n, .H = H, .F = F, .L = o.L};
    c.w13 = ls_xmalloc(n13 * 4);
    c.w2 = ls_xmalloc(n2 * 4);
    c.x = ls_xmalloc((size_t)maxT * H * 4);
    c.g = ls_xmalloc((size_t)maxT * n * 4);
    c.y = ls_xmalloc((size_t)maxT * H * 4);
    c.z = ls_xmalloc((size_t)maxT * n * 2 * F * 4);
    c.a = ls_xmalloc((size_t)maxT * n * F * 4);
    c.slots = ls_xmalloc((size_t)maxT * sizeof(int));
    ls_fill(c.w13, n13, &seed, 1.0f / sqrtf((float)H));
    ls_fill(c.w2, n2, &seed, 1.0f / sqrtf((float)F));
    ls_fill(c.x, (size_t)maxT * H, &seed, 1.0f);
    ls_fill(c.g, (size_t)maxT * n, &seed, 1.0f);
    ls_fill(c.a, (size_t)maxT * n * F, &seed, 1.0f);

    /* PyTorch in fp32 and with bf16 tensors, each python in turn. */
    ls_peer peers[2 * MAX_PEERS];
    int np = 0;
    for (int i = 0; peer && i < npy; i++)
        for (int d = 0; d < 2; d++)
            if (ls_peer_run(python[i], d ? "bfloat16" : "float32", H, F, n, rank, threads, &peers[np])) np++;

    /* sgemm GFLOP/s measured in turn with each of our rows */
    double ms[NROWS][NT][NA] = {{{0}}}, floor_ms[NROWS] = {0}, sgemm_gf[NROWS][NT][NA] = {{{0}}};
    double lora_ms = 0; /* one adapter's factors of one layer, streamed at bw */
    const char *isa_name[NROWS] = {0};
    float *acc_y[NROWS] = {0}; /* the ACC_T x ACC_A batch's outputs, for bf16's accuracy */
    for (int di = 0; di < NROWS; di++) {
        if ((which == 0 && ROWS[di].compute == LS_CPU_COMPUTE_BF16) ||
            (which == 1 && ROWS[di].compute == LS_CPU_COMPUTE_F32 && ROWS[di].dt == LS_DTYPE_F32))
            continue; /* --compute bf16 keeps the bf16-weight f32 row: its accuracy's reference */
        double lora_bytes = 0;
        ls_backend *be = ls_bench_backend(&o, &ROWS[di], &c, &lora_bytes);
        if (!be) continue;
        isa_name[di] = ls_backend_isa(be);
        c.be = be;
        floor_ms[di] = (double)(n13 + n2) * ls_dtype_size(ROWS[di].dt) / bw * 1e3;
        lora_ms = lora_bytes / bw * 1e3;
        for (int ti = 0; ti < NT; ti++)
            for (int ai = 0; ai < NA; ai++) {
                if (As[ai] > Ts[ti]) continue; /* T tokens cannot use more adapters */
                c.T = Ts[ti];
                for (int t = 0; t < c.T; t++) c.slots[t] = t % As[ai];
                double ours_s, sgemm_s;
                ls_measure_row(&c, &ours_s, &sgemm_s);
                ms[di][ti][ai] = ours_s * 1e3;
                sgemm_gf[di][ti][ai] = 2.0 * c.T * ((double)n * 2 * F * H + (double)n * H * F) / sgemm_s / 1e9;
            }
        c.T = ACC_T, c.call = 0;
        for (int t = 0; t < c.T; t++) c.slots[t] = t % ACC_A;
        ls_bench_forward(&c);
        acc_y[di] = ls_xmalloc((size_t)ACC_T * H * 4);
        memcpy(acc_y[di], c.y, (size_t)ACC_T * H * 4);
        ls_backend_free(be);
    }
    ls_bench_report(&o, ms, floor_ms, sgemm_gf, lora_ms, isa_name, acc_y, peers, np);
    for (int di = 0; di < NROWS; di++) free(acc_y[di]);
    free(c.w13), free(c.w2), free(c.x), free(c.g), free(c.y), free(c.z), free(c.a), free(c.slots);
    return 0;
}
