/* The measurements behind bench_gpu's rows: a CUDA backend at the bench
 * shape with its slots filled, one row's device-only time (graph replay,
 * ls_backend_cuda_time_forward) and end-to-end time (ls_backend_forward
 * with host x and y: staging, PCIe and the sync included), a forward's
 * stage profile, and the bytes and FLOPs the ratios divide by. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "gpu_bench.h"
#include "common/text.h"
#include "gpu/cuda/cuda_backend.h"

void bench_fill(float *v, size_t count, double scale, uint64_t *seed) {
    for (size_t i = 0; i < count; i++) {
        uint64_t z = ls_splitmix64(seed);
        v[i] = (float)(((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0) * scale);
    }
}

/* rows [rows, cols] row-major: the first `keep` columns of every row
 * random, the rest exactly zero. */
static void fill_cols(float *v, size_t rows, size_t cols, size_t keep, double scale, uint64_t *seed) {
    for (size_t i = 0; i < rows; i++) {
        bench_fill(v + i * cols, keep, scale, seed);
        memset(v + i * cols + keep, 0, (cols - keep) * sizeof *v);
    }
}

/* One slot's factors in the pool layout of docs/math.md at pool rank R
 * (shared layout, O = 1) for an adapter of rank r <= R: gu_a [2R, H] rows
 * 0..r-1 (gate) and R..R+r-1 (up), gu_b [n, 2F, R] and d_b [H, R] columns
 * 0..r-1, d_a [n, R, F] rows 0..r-1 of each expert; zero elsewhere. With
 * r == R it draws the values in the order of a plain fill. */
static void fill_slot(const ls_slot_factors *f, int R, int r, uint64_t *seed) {
    const size_t n = BENCH_N, H = BENCH_H, F = BENCH_F, Rz = (size_t)R, rz = (size_t)r;
    float *gu_a = (float *)f->gu_a, *gu_b = (float *)f->gu_b, *d_a = (float *)f->d_a, *d_b = (float *)f->d_b;
    memset(gu_a, 0, 2 * Rz * H * sizeof *gu_a);
    bench_fill(gu_a, rz * H, 0.027, seed);
    bench_fill(gu_a + Rz * H, rz * H, 0.027, seed);
    fill_cols(gu_b, n * 2 * F, Rz, rz, 0.1, seed);
    memset(d_a, 0, n * Rz * F * sizeof *d_a);
    for (size_t e = 0; e < n; e++) bench_fill(d_a + e * Rz * F, rz * F, 0.038, seed);
    fill_cols(d_b, H, Rz, rz, 0.1, seed);
}

/* Writes every slot of be; 0 on success. */
static int write_slots(ls_backend *be, const ls_backend_config *cfg, int rank, uint64_t *seed) {
    const size_t la = ls_pool_gu_a_len(&cfg->dims, &cfg->pool), lb = ls_pool_gu_b_len(&cfg->dims, &cfg->pool),
                 lc = ls_pool_d_a_len(&cfg->dims, &cfg->pool), ld = ls_pool_d_b_len(&cfg->dims, &cfg->pool);
    float *fa = malloc(la * sizeof *fa), *fb = malloc(lb * sizeof *fb), *fc = malloc(lc * sizeof *fc),
          *fd = malloc(ld * sizeof *fd);
    int rc = fa && fb && fc && fd ? 0 : -1;
    if (rc) fprintf(stderr, "bench_gpu: out of host memory for the slots\n");
    ls_error err;
    ls_error_init(&err);
    for (int s = 0; s < BENCH_SLOTS && rc == 0; s++) {
        ls_slot_factors f = {fa, fb, fc, fd, NULL};
        fill_slot(&f, cfg->pool.max_rank, rank, seed);
        if (ls_backend_slot_write(be, s, 0, &f, &err) != LS_OK) {
            fprintf(stderr, "bench_gpu: slot_write: %s\n", err.message);
            rc = -1;
        }
    }
    ls_error_free(&err);
    free(fa);
    free(fb);
    free(fc);
    free(fd);
    return rc;
}

ls_backend *bench_backend(int pool_rank, int rank, const bench_inputs *in, uint64_t *seed) {
    return bench_backend_graphs(pool_rank, rank, 0, in, seed);
}

ls_backend *bench_backend_graphs(int pool_rank, int rank, int graphs, const bench_inputs *in, uint64_t *seed) {
    ls_backend_config cfg = {.dims = {BENCH_N, BENCH_H, BENCH_F, 1, LS_W13_INTERLEAVED},
                             .pool = {BENCH_SLOTS, pool_rank, LS_LORA_SHARED, BENCH_TMAX},
                             .dtype = LS_DTYPE_BF16};
    const ls_cuda_settings cuda = {.device_id = 0, .graphs = graphs};
    ls_backend *be = NULL;
    ls_error err;
    ls_error_init(&err);
    if (ls_backend_cuda_create(&cfg, &cuda, &be, &err) != LS_OK) {
        fprintf(stderr, "bench_gpu: create: %s\n", err.message);
    } else {
        const ls_base_layer bl = ls_base_layer_f32(in->w13, in->w2);
        if (ls_backend_upload_base(be, 0, &bl, &err) != LS_OK) {
            fprintf(stderr, "bench_gpu: upload_base: %s\n", err.message);
            ls_backend_free(be);
            be = NULL;
        } else if (write_slots(be, &cfg, rank, seed) != 0) {
            ls_backend_free(be);
            be = NULL;
        }
    }
    ls_error_free(&err);
    return be;
}

/* Median device time of one forward in ms (< 0 on failure, printed);
 * *graph says whether the runs replayed a CUDA graph. */
static double device_ms(ls_backend *be, int T, const bench_inputs *in, const int *sot, int iters, int *graph) {
    float *ms = malloc((size_t)iters * sizeof *ms);
    double *d = malloc((size_t)iters * sizeof *d);
    double med = -1;
    ls_error err;
    ls_error_init(&err);
    if (!ms || !d)
        fprintf(stderr, "bench_gpu: out of host memory\n");
    else if (ls_backend_cuda_time_forward(be, 0, T, in->x, in->gam, sot, iters, ms, graph, &err) != LS_OK)
        fprintf(stderr, "bench_gpu: time_forward: %s\n", err.message);
    else {
        for (int i = 0; i < iters; i++) d[i] = ms[i];
        med = bench_median(d, iters);
    }
    free(ms);
    free(d);
    ls_error_free(&err);
    return med;
}

/* Median wall time in ms of ls_backend_forward from host x to host y, as
 * the server calls it (< 0 on failure, printed); 3 untimed calls first. */
static double e2e_ms(ls_backend *be, int T, const bench_inputs *in, const int *sot, int iters) {
    double *t = malloc((size_t)iters * sizeof *t);
    double med = -1;
    ls_error err;
    ls_error_init(&err);
    int ok = t != NULL;
    for (int i = -3; i < iters && ok; i++) {
        const double t0 = bench_now_ms();
        if (ls_backend_forward(be, 0, T, in->x, in->gam, sot, in->y, &err) != LS_OK) {
            fprintf(stderr, "bench_gpu: forward: %s\n", err.message);
            ok = 0;
        } else if (i >= 0) {
            t[i] = bench_now_ms() - t0;
        }
    }
    if (ok) med = bench_median(t, iters);
    free(t);
    ls_error_free(&err);
    return med;
}

/* Device-only runs are graph replays of tens of microseconds: many are
 * cheap. End-to-end ones carry PCIe copies of x and y (128 MiB at
 * T = 4096): fewer. */
static int device_iters(int T) { return T <= 64 ? 200 : T <= 512 ? 50 : 20; }
static int e2e_iters(int T) { return T <= 64 ? 50 : T <= 512 ? 20 : 10; }

double bench_base_ms(ls_backend *be, const bench_inputs *in, int T) {
    int graph = 0;
    return device_ms(be, T, in, NULL, device_iters(T), &graph);
}

/* Token t on slot t % adapters: every slot's tokens spread evenly. */
static void spread_tokens(const bench_inputs *in, int T, int adapters) {
    for (int t = 0; t < T; t++) in->sot[t] = t % adapters;
}

int bench_measure_row(ls_backend *be, const bench_inputs *in, bench_row *r) {
    spread_tokens(in, r->T, r->adapters);
    r->ms = device_ms(be, r->T, in, in->sot, device_iters(r->T), &r->graph);
    r->e2e_ms = e2e_ms(be, r->T, in, in->sot, e2e_iters(r->T));
    return r->ms > 0 && r->e2e_ms > 0 ? 0 : -1;
}

double bench_forward_ms(ls_backend *be, const bench_inputs *in, int T, int adapters) {
    int graph = 0;
    spread_tokens(in, T, adapters);
    return device_ms(be, T, in, in->sot, device_iters(T), &graph);
}

int bench_profile(ls_backend *be, const bench_inputs *in, int T, int adapters, double stage_ms[LS_CUDA_STAGES]) {
    const int iters = e2e_iters(T);
    float *ms = malloc((size_t)iters * LS_CUDA_STAGES * sizeof *ms);
    double *d = malloc((size_t)iters * sizeof *d);
    int rc = -1;
    ls_error err;
    ls_error_init(&err);
    spread_tokens(in, T, adapters);
    if (!ms || !d) {
        fprintf(stderr, "bench_gpu: out of host memory\n");
    } else if (ls_backend_cuda_profile_forward(be, 0, T, in->x, in->gam, in->sot, iters, ms, &err) != LS_OK) {
        fprintf(stderr, "bench_gpu: profile_forward: %s\n", err.message);
    } else {
        for (int s = 0; s < LS_CUDA_STAGES; s++) {
            for (int i = 0; i < iters; i++) d[i] = ms[(size_t)i * LS_CUDA_STAGES + s];
            stage_ms[s] = bench_median(d, iters);
        }
        rc = 0;
    }
    free(ms);
    free(d);
    ls_error_free(&err);
    return rc;
}

/* Per adapter at rank r: gu_a [2r, H], gu_b [n, 2F, r], d_a [n, r, F],
 * d_b [H, r] (shared layout), in elements. */
static double adapter_elems(int rank) {
    const double n = BENCH_N, H = BENCH_H, F = BENCH_F, r = rank;
    return 2 * r * H + n * 2 * F * r + r * n * F + H * r;
}

double bench_min_bytes(int T, int adapters, int rank) {
    const double n = BENCH_N, H = BENCH_H, F = BENCH_F;
    const double wbytes = 2.0 * (n * 2 * F * H + n * H * F); /* bf16 W13 and W2 */
    /* Each used adapter's factors once in bf16, x and y in fp32, the gates. */
    return wbytes + adapters * 2.0 * adapter_elems(rank) + 8.0 * T * H + 4.0 * T * n;
}

double bench_flops(int T, int rank) {
    const double n = BENCH_N, H = BENCH_H, F = BENCH_F;
    return 2.0 * T * (n * 2 * F * H + n * H * F) + 2.0 * T * adapter_elems(rank);
}
