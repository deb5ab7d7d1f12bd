/* What the GPU benchmark's files share (bench_gpu.c prints, gpu_rows.c
 * measures rows and stage profiles, gpu_refs.c reads the peers' JSON
 * lines): the bench shape, one row's measurements, and the calls between
 * them. */
#ifndef LS_BENCH_GPU_BENCH_H
#define LS_BENCH_GPU_BENCH_H

#include <stdint.h>

#include "gpu/backend.h"
#include "gpu/cuda/cuda_backend.h"

/* Inkling-Small-like: n shared experts of H x F, one layer, bf16 weights,
 * a shared pool of SLOTS slots, forwards of up to TMAX tokens. */
#define BENCH_N 2
#define BENCH_H 4096
#define BENCH_F 2048
#define BENCH_SLOTS 8
#define BENCH_TMAX 4096

/* Host inputs, made once and shared by every row: w13 [n, 2F, H], w2
 * [n, H, F], x [TMAX, H], gammas [TMAX, n], the token-to-slot map and
 * y [TMAX, H] for the end-to-end forwards. Owned by main. */
typedef struct {
    float *w13, *w2, *x, *gam, *y;
    int *sot;
} bench_inputs;

/* One row of the table: a forward of T tokens spread over `adapters`
 * slots holding adapters of rank `rank` in a pool of rank `pool_rank`. */
typedef struct {
    int pool_rank, rank, T, adapters;
    int graph;     /* the device-only runs replayed a CUDA graph */
    double ms;     /* device-only median */
    double base_ms; /* device-only median with every token on the base */
    double e2e_ms; /* ls_backend_forward wall time (host x and y) median */
} bench_row;

/* ---- gpu_rows.c ---------------------------------------------------------- */

/* Uniform floats in [-scale, scale] from splitmix64. */
void bench_fill(float *v, size_t count, double scale, uint64_t *seed);
/* A CUDA backend at the bench shape with pool rank pool_rank, the base
 * uploaded from in and every slot written with random factors of rank
 * `rank` (every rank index >= rank exactly zero, so a backend that detects
 * a slot's rank from the zeros can use it). NULL after printing why. The
 * caller frees it with ls_backend_free. */
ls_backend *bench_backend(int pool_rank, int rank, const bench_inputs *in, uint64_t *seed);
/* The same with graphs as ls_cuda_settings.graphs says (0 the default,
 * < 0 none). */
ls_backend *bench_backend_graphs(int pool_rank, int rank, int graphs, const bench_inputs *in, uint64_t *seed);
/* The device-only median ms of a forward of T tokens all on the base;
 * < 0 after printing why. */
double bench_base_ms(ls_backend *be, const bench_inputs *in, int T);
/* Fills r's ms, graph and e2e_ms (r's T and adapters set) on be;
 * in->sot is overwritten. 0 on success, else -1 after printing why. */
int bench_measure_row(ls_backend *be, const bench_inputs *in, bench_row *r);
/* Where one forward's time goes (ls_backend_cuda_profile_forward): the
 * median of each stage in ms, with T tokens over `adapters` slots as in
 * bench_measure_row and be's LoRA kernels as set; in->sot is
 * overwritten. 0 on success, else -1 after printing why. */
int bench_profile(ls_backend *be, const bench_inputs *in, int T, int adapters, double stage_ms[LS_CUDA_STAGES]);
/* The device-only median ms of that forward (graph replay, as the rows'
 * ms); < 0 after printing why. */
double bench_forward_ms(ls_backend *be, const bench_inputs *in, int T, int adapters);
/* The minimal bytes and the FLOPs (2 per multiply-add, no padding) of a
 * forward of T tokens over `adapters` adapters of rank `rank`. */
double bench_min_bytes(int T, int adapters, int rank);
double bench_flops(int T, int rank);

/* ---- gpu_traces.c -------------------------------------------------------- */

/* A trace of forwards: step s has T[s] tokens, token t on slot
 * sot[s * BENCH_TRACE_TMAX + t]. Kinds (bench_trace_name): 0 fixed (the
 * same forward every step), 1 decode (requests join and leave one at a
 * time, each on its own slot), 2 random (every step a new size and
 * slots). */
#define BENCH_TRACES 3
#define BENCH_TRACE_TMAX 64
typedef struct {
    int kind, steps;
    int *T;   /* [steps] */
    int *sot; /* [steps][BENCH_TRACE_TMAX] */
} bench_trace;

/* What a run of a trace measured: the mean wall time of ls_backend_forward
 * per step, and what the backend's graph cache counted over it. */
typedef struct {
    double mean_ms;
    uint64_t hits, captures, failures;
    int stopped; /* the cache stopped capturing (by the end) */
} bench_trace_result;

const char *bench_trace_name(int kind);
/* Makes the trace of kind over slots 0..slots-1 from seed (the same
 * trace for the same arguments); 0 on success, else -1 after printing
 * why. Freed with bench_trace_free (safe after a failure). */
int bench_trace_make(int kind, int steps, int slots, uint64_t seed, bench_trace *tr);
void bench_trace_free(bench_trace *tr);
/* Runs every step on be's layer 0 with in's x and gammas; 0 on success,
 * else -1 after printing why. */
int bench_trace_run(ls_backend *be, const bench_inputs *in, const bench_trace *tr, bench_trace_result *out);

/* ---- gpu_refs.c ---------------------------------------------------------- */

/* Reads JSON lines of bench/torch_ref.py ({"variant": "eager"|"graph",
 * "rank", "T", "adapters", "ms"}; lines without "variant" are eager) or
 * bench/bench_gpu_http.py ({"body", "T", "adapters", "ms"}); other lines
 * are skipped. Prints why when the file cannot be read. */
void refs_load(const char *path);
/* The ms of a torch row (variant "eager" or "graph"), 0 when absent. */
double refs_torch_ms(const char *variant, int rank, int T, int adapters);
/* The i-th HTTP row, 0 past the last. */
int refs_http(int i, int *T, int *adapters, const char **body, double *ms);
/* Frees what refs_load read. */
void refs_free(void);

#endif
