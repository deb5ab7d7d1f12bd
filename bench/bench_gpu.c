/* The GPU benchmark: the CUDA forward at an Inkling-Small shape (n=2,
 * H=4096, F=2048, bf16) for T in {1, 8, 64, 512, 4096}, 1, 4 and T
 * distinct adapters (at most the 8 slots), in three row groups: pool rank
 * 16 with rank-16 adapters, pool rank 64 with rank-64 adapters, and pool
 * rank 64 holding rank-16 adapters (the rank cut's case). Per row: device
 * time of one forward (graph replay, inputs resident), the end-to-end time
 * of ls_backend_forward from host x to host y, the copy roofline (T <= 64),
 * TFLOP/s (T >= 512), the LoRA overhead over the base forward, and the
 * ratios to PyTorch eager and PyTorch in a CUDA graph (bench/torch_ref.py)
 * when their JSON lines are given; the device-to-device copy bandwidth and
 * the bf16 GEMM peak measured in the same run. Then where the time of
 * a few forwards goes, stage by stage, with the default multi-adapter
 * kernels, with the BGMV shrinks and with cuBLAS per slot
 * (ls_backend_cuda_profile_forward). Then serving's graphs under
 * traces of changing forwards (gpu_traces.c). Then the HTTP rows
 * (bench/bench_gpu_http.py) beside the in-process end-to-end ones, and the
 * issue's targets, each met or not. Prints markdown; never passes or
 * fails on time (exit 0 once it ran, 77 without a device).
 *   bench_gpu [--torch torch_ref.jsonl] [--http http.jsonl] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_bench.h"
#include "gpu/cuda/cuda_backend.h"
#include "gpu/cuda/peak.h"

static const int TOKENS[] = {1, 8, 64, 512, 4096};
static const int GROUPS[][2] = {{16, 16}, {64, 64}, {64, 16}}; /* pool rank, adapter rank */
#define MAX_ROWS 64
/* The forwards whose stages are profiled (T, adapters), at the first
 * group's ranks. */
static const int PROFILED[][2] = {{1, 1}, {8, 8}, {64, 8}, {512, 8}, {4096, 1}, {4096, 8}};
#define MAX_PROF 16
/* The multi-adapter kernel sets profiled, the default first. */
static const ls_cuda_sgmv_mode PROF_MODE[] = {LS_CUDA_SGMV_AUTO, LS_CUDA_SGMV_BGMV, LS_CUDA_SGMV_BLAS};
#define PROF_MODES (int)(sizeof PROF_MODE / sizeof PROF_MODE[0])

/* One stage profile: a forward, the kernels its LoRA stages ran, its
 * device-only time and its stages' medians, all in ms. */
typedef struct {
    int T, adapters;
    ls_cuda_sgmv_mode mode;
    double fwd_ms;
    double stage[LS_CUDA_STAGES];
} prof_row;

/* What the whole run measured besides the rows. */
typedef struct {
    double copy_bps;   /* device-to-device, read + write */
    double peak_cube;  /* 8192^3 bf16 GEMM, TFLOP/s */
    double peak_13;    /* m=4096, n=n*2F, k=H: the forward's W13 GEMM at T=4096 */
    double peak_2;     /* m=4096, n=H, k=n*F: its W2 GEMM */
    double peak_fwd;   /* both at their own rates, the forward's mix of FLOPs */
    bench_row rows[MAX_ROWS];
    int nrows;
    prof_row prof[MAX_PROF];
    int nprof;
    /* Each trace on a backend with graphs ([k][0]) and without ([k][1]). */
    bench_trace_result trace[BENCH_TRACES][2];
    int traced;
} bench_run;

/* ---- run-wide ceilings ----------------------------------------------------- */

/* One GEMM peak in TFLOP/s, 0 (printed) when it fails. */
static double peak(int m, int n, int k) {
    ls_error err;
    ls_error_init(&err);
    double t = 0;
    if (ls_cuda_gemm_peak(0, m, n, k, 20, &t, &err) != LS_OK) {
        fprintf(stderr, "bench_gpu: gemm peak %dx%dx%d: %s\n", m, n, k, err.message);
        t = 0;
    }
    ls_error_free(&err);
    return t;
}

static void measure_ceilings(ls_backend *be, bench_run *run) {
    ls_error err;
    ls_error_init(&err);
    if (ls_backend_cuda_copy_bandwidth(be, (size_t)1 << 30, 20, &run->copy_bps, &err) != LS_OK) {
        fprintf(stderr, "bench_gpu: copy bandwidth: %s\n", err.message);
        run->copy_bps = 0;
    }
    ls_error_free(&err);
    const int n13 = BENCH_N * 2 * BENCH_F, n2 = BENCH_N * BENCH_F;
    run->peak_cube = peak(8192, 8192, 8192);
    run->peak_13 = peak(BENCH_TMAX, n13, BENCH_H);
    run->peak_2 = peak(BENCH_TMAX, BENCH_H, n2);
    if (run->peak_13 > 0 && run->peak_2 > 0) {
        const double f13 = 2.0 * BENCH_TMAX * n13 * BENCH_H, f2 = 2.0 * BENCH_TMAX * BENCH_H * n2;
        run->peak_fwd = (f13 + f2) / (f13 / run->peak_13 + f2 / run->peak_2);
    }
}

static void print_header(ls_backend *be, const bench_run *run) {
    printf("GPU: %s; bf16 weights, n=%d H=%d F=%d, %d slots, shared pool, interleaved W13; "
           "device-to-device copy %.0f GB/s (read + write)\n\n",
           ls_backend_cuda_device_name(be), BENCH_N, BENCH_H, BENCH_F, BENCH_SLOTS, run->copy_bps / 1e9);
    printf("bf16 GEMM peak in this run (cublasGemmEx, fp32 accumulation, random data, median of 20): "
           "8192x8192x8192 %.0f TFLOP/s; the forward's GEMMs at T=%d: m=%d n=%d k=%d %.0f, m=%d n=%d k=%d %.0f, "
           "together %.0f TFLOP/s (the T=%d targets' ceiling)\n\n",
           run->peak_cube, BENCH_TMAX, BENCH_TMAX, BENCH_N * 2 * BENCH_F, BENCH_H, run->peak_13, BENCH_TMAX,
           BENCH_H, BENCH_N * BENCH_F, run->peak_2, run->peak_fwd, BENCH_TMAX);
    printf("| pool R | rank | T | adapters | graph | ms | base ms | LoRA overhead | GB/s | roofline | TFLOP/s | "
           "e2e ms | e2e roofline | torch ms | ours/torch | torch graph ms | ours/torch graph |\n");
    printf("|---:|---:|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
}

/* ---- the table ----------------------------------------------------------- */

/* Copy-roofline fraction of a time (T <= 64 only; 0 otherwise). */
static double roofline(const bench_run *run, const bench_row *r, double ms) {
    if (r->T > 64 || run->copy_bps <= 0 || ms <= 0) return 0;
    return bench_min_bytes(r->T, r->adapters, r->rank) / (ms * 1e-3) / run->copy_bps;
}

static double tflops(const bench_row *r) { return bench_flops(r->T, r->rank) / (r->ms * 1e-3) / 1e12; }

/* "| 0.1234 | 0.56 |" for a peer's time, or dashes when absent. */
static void print_peer(double ours, double theirs) {
    if (theirs > 0)
        printf(" %.4f | %.2f |", theirs, ours / theirs);
    else
        printf(" - | - |");
}

static void print_row(const bench_run *run, const bench_row *r) {
    const double gbs = bench_min_bytes(r->T, r->adapters, r->rank) / (r->ms * 1e-3) / 1e9;
    printf("| %d | %d | %d | %d | %s | %.4f | %.4f | %+.1f%% | %.0f |", r->pool_rank, r->rank, r->T, r->adapters,
           r->graph ? "yes" : "no", r->ms, r->base_ms, (r->ms / r->base_ms - 1) * 100, gbs);
    if (r->T <= 64)
        printf(" %.0f%% | - |", 100 * roofline(run, r, r->ms));
    else
        printf(" - | %.0f |", tflops(r));
    printf(" %.4f |", r->e2e_ms);
    if (r->T <= 64)
        printf(" %.0f%% |", 100 * roofline(run, r, r->e2e_ms));
    else
        printf(" - |");
    /* Torch has no padded pool: its rows are at the adapters' rank. */
    print_peer(r->ms, refs_torch_ms("eager", r->rank, r->T, r->adapters));
    print_peer(r->ms, refs_torch_ms("graph", r->rank, r->T, r->adapters));
    printf("\n");
    fflush(stdout);
}

/* ---- the stage profile -------------------------------------------------- */

/* Profiles one forward with its LoRA stages on mode's kernels; 0 on
 * success. */
static int profile_one(bench_run *run, ls_backend *be, const bench_inputs *in, int T, int A, ls_cuda_sgmv_mode mode) {
    if (run->nprof == MAX_PROF) return 0;
    prof_row *p = &run->prof[run->nprof];
    *p = (prof_row){.T = T, .adapters = A, .mode = mode};
    ls_backend_cuda_set_sgmv_mode(be, mode);
    p->fwd_ms = bench_forward_ms(be, in, T, A);
    int rc = p->fwd_ms > 0 ? bench_profile(be, in, T, A, p->stage) : -1;
    ls_backend_cuda_set_sgmv_mode(be, LS_CUDA_SGMV_AUTO);
    if (rc == 0) run->nprof++;
    return rc;
}

/* The PROFILED forwards on a backend of the first group's ranks, after
 * every row is measured, the default kernels first: a kernel not yet
 * run on a device that faults (which poisons the process's CUDA
 * context) then loses only what follows it. Several adapters run every
 * multi-adapter kernel set (SGMV, the BGMV shrinks, cuBLAS per slot);
 * one adapter is cuBLAS either way. 0 on success. */
static int profile_all(bench_run *run, const bench_inputs *in, uint64_t *seed) {
    ls_backend *be = bench_backend(GROUPS[0][0], GROUPS[0][1], in, seed);
    if (!be) return -1;
    int rc = 0;
    for (int m = 0; m < PROF_MODES && rc == 0; m++)
        for (size_t i = 0; i < sizeof PROFILED / sizeof PROFILED[0] && rc == 0; i++) {
            const int T = PROFILED[i][0], A = PROFILED[i][1];
            if (m == 0 || A > 1) rc = profile_one(run, be, in, T, A, PROF_MODE[m]);
        }
    ls_backend_free(be);
    return rc;
}

static const char *prof_kernels(const prof_row *p) {
    if (p->adapters == 1) return "cuBLAS";
    if (p->mode == LS_CUDA_SGMV_BGMV) return "BGMV shrinks, SGMV expands";
    if (p->mode == LS_CUDA_SGMV_BLAS) return "cuBLAS per slot";
    return "SGMV (WMMA)";
}

static const prof_row *find_prof(const bench_run *run, int T, int adapters, ls_cuda_sgmv_mode mode) {
    for (int i = 0; i < run->nprof; i++) {
        const prof_row *q = &run->prof[i];
        if (q->T == T && q->adapters == adapters && q->mode == mode) return q;
    }
    return NULL;
}

static int lora_stage(int s) {
    return s == LS_CUDA_STAGE_SHRINK_GU || s == LS_CUDA_STAGE_EXPAND_GU || s == LS_CUDA_STAGE_SHRINK_D ||
           s == LS_CUDA_STAGE_EXPAND_D;
}

static void print_profile(const bench_run *run) {
    if (run->nprof == 0) return;
    printf("\nWhere the time goes (pool R %d, rank %d; microseconds): each stage launched directly on one stream "
           "between CUDA events, no side stream and no graph, median of the e2e run count; forward: the "
           "device-only time of the whole forward as in the rows above (graph replay, shrinks beside the base "
           "GEMMs; cuBLAS per slot launched directly, as serving runs it); vs SGMV: that forward over the one "
           "with the default kernels; LoRA: the four LoRA stages together, and over the forward.\n\n",
           GROUPS[0][0], GROUPS[0][1]);
    printf("| T | adapters | LoRA kernels | forward | vs SGMV |");
    for (int s = 0; s < LS_CUDA_STAGES; s++) printf(" %s |", ls_cuda_stage_name(s));
    printf(" stages | LoRA | LoRA / forward |\n|---:|---:|:---|---:|---:|");
    for (int s = 0; s < LS_CUDA_STAGES; s++) printf("---:|");
    printf("---:|---:|---:|\n");
    for (int i = 0; i < PROF_MODES * (int)(sizeof PROFILED / sizeof PROFILED[0]); i++) {
        const int T = PROFILED[i / PROF_MODES][0], A = PROFILED[i / PROF_MODES][1];
        const prof_row *p = find_prof(run, T, A, PROF_MODE[i % PROF_MODES]);
        const prof_row *d = find_prof(run, T, A, LS_CUDA_SGMV_AUTO);
        if (!p) continue;
        const double def = d ? d->fwd_ms : 0;
        printf("| %d | %d | %s | %.1f |", p->T, p->adapters, prof_kernels(p), p->fwd_ms * 1e3);
        if (p->adapters > 1 && def > 0)
            printf(" %.2f |", p->fwd_ms / def);
        else
            printf(" - |");
        double sum = 0, lora = 0;
        for (int s = 0; s < LS_CUDA_STAGES; s++) {
            printf(" %.1f |", p->stage[s] * 1e3);
            sum += p->stage[s];
            if (lora_stage(s)) lora += p->stage[s];
        }
        printf(" %.1f | %.1f | %.2f |\n", sum * 1e3, lora * 1e3, lora / p->fwd_ms);
    }
}

/* Measures and prints one group's rows; 0 on success. */
static int run_group(bench_run *run, const bench_inputs *in, int pool_rank, int rank, uint64_t *seed) {
    ls_backend *be = bench_backend(pool_rank, rank, in, seed);
    if (!be) return -1;
    if (run->nrows == 0) {
        measure_ceilings(be, run);
        print_header(be, run);
    }
    int rc = 0;
    for (size_t ti = 0; ti < sizeof TOKENS / sizeof TOKENS[0] && rc == 0; ti++) {
        const int T = TOKENS[ti];
        const double base_ms = bench_base_ms(be, in, T);
        if (base_ms <= 0) rc = -1;
        const int cands[3] = {1, 4, T < BENCH_SLOTS ? T : BENCH_SLOTS};
        for (int ai = 0; ai < 3 && rc == 0; ai++) {
            const int A = cands[ai];
            if (A > T || (ai > 0 && A <= cands[ai - 1]) || run->nrows == MAX_ROWS) continue;
            bench_row *r = &run->rows[run->nrows];
            *r = (bench_row){.pool_rank = pool_rank, .rank = rank, .T = T, .adapters = A, .base_ms = base_ms};
            rc = bench_measure_row(be, in, r);
            if (rc == 0) print_row(run, &run->rows[run->nrows++]);
        }
    }
    ls_backend_free(be);
    return rc;
}

/* ---- serving's graphs under changing forwards ----------------------------- */

#define TRACE_STEPS 400

/* Every trace on two backends of the first group's ranks, one replaying
 * graphs (the default cache) and one launching directly, each trace on a
 * fresh cache: 0 on success. Default kernels only, so it runs before the
 * stage profile's kernels that no device has run yet. */
static int trace_all(bench_run *run, const bench_inputs *in, uint64_t *seed) {
    ls_backend *be[2] = {bench_backend_graphs(GROUPS[0][0], GROUPS[0][1], 0, in, seed),
                         bench_backend_graphs(GROUPS[0][0], GROUPS[0][1], -1, in, seed)};
    int rc = be[0] && be[1] ? 0 : -1;
    for (int k = 0; k < BENCH_TRACES && rc == 0; k++) {
        bench_trace tr;
        rc = bench_trace_make(k, TRACE_STEPS, BENCH_SLOTS, 1000 + (uint64_t)k, &tr);
        for (int g = 0; g < 2 && rc == 0; g++) {
            ls_backend_cuda_clear_graphs(be[g]);
            rc = bench_trace_run(be[g], in, &tr, &run->trace[k][g]);
        }
        bench_trace_free(&tr);
    }
    run->traced = rc == 0;
    ls_backend_free(be[0]);
    ls_backend_free(be[1]);
    return rc;
}

static void print_traces(const bench_run *run) {
    if (!run->traced) return;
    printf("\nServing's CUDA graphs when forwards change (ls_backend_forward end to end, %d forwards a trace, "
           "pool R %d, rank %d, up to %d tokens over %d slots, one layer). fixed: the same forward every step; "
           "decode: one request joins or leaves a step, each keeping the adapter it drew for its life; random: a new size and new "
           "adapters every step. A graph is kept per exact shape (tokens, adapted tokens, slot or segment count): "
           "what fixed saves and decode does not is what bucketing sizes could win back.\n\n",
           TRACE_STEPS, GROUPS[0][0], GROUPS[0][1], BENCH_TRACE_TMAX, BENCH_SLOTS);
    printf("| trace | graphs ms | direct ms | graphs / direct | replays | captures | capture failures | stopped |\n"
           "|:---|---:|---:|---:|---:|---:|---:|:---|\n");
    for (int k = 0; k < BENCH_TRACES; k++) {
        const bench_trace_result *on = &run->trace[k][0], *off = &run->trace[k][1];
        printf("| %s | %.4f | %.4f | %.2f | %llu | %llu | %llu | %s |\n", bench_trace_name(k), on->mean_ms,
               off->mean_ms, on->mean_ms / off->mean_ms, (unsigned long long)on->hits,
               (unsigned long long)on->captures, (unsigned long long)on->failures, on->stopped ? "yes" : "no");
    }
}

/* ---- HTTP rows and targets -------------------------------------------------- */

static const bench_row *find_row(const bench_run *run, int pool_rank, int rank, int T, int adapters) {
    for (int i = 0; i < run->nrows; i++) {
        const bench_row *r = &run->rows[i];
        if (r->pool_rank == pool_rank && r->rank == rank && r->T == T && r->adapters == adapters) return r;
    }
    return NULL;
}

/* The server of bench_gpu_http.py runs --max-rank 16 with rank-16
 * adapters: its rows sit beside the pool R 16 group's end-to-end ones. */
static void print_http(const bench_run *run) {
    int T, A;
    const char *body;
    double ms;
    if (!refs_http(0, &T, &A, &body, &ms)) return;
    printf("\nThrough the server (bench/bench_gpu_http.py: lorasink --device cuda, --max-rank 16, 8 adapters of "
           "rank 16, one kept-alive connection, or for \"N conns\" N requests of T/N tokens sent at once, one "
           "adapter and connection each; median time to the last reply) beside the in-process end-to-end "
           "forward (pool R 16):\n\n");
    printf("| T | adapters | body | HTTP ms | e2e ms | HTTP / e2e |\n|---:|---:|:---|---:|---:|---:|\n");
    for (int i = 0; refs_http(i, &T, &A, &body, &ms); i++) {
        const bench_row *r = find_row(run, 16, 16, T, A);
        printf("| %d | %d | %s | %.4f |", T, A, body, ms);
        if (r)
            printf(" %.4f | %.2f |\n", r->e2e_ms, ms / r->e2e_ms);
        else
            printf(" - | - |\n");
    }
}

/* One target over the rows it names: the worst value among them. */
typedef enum { AT_LEAST, AT_MOST, BELOW } bound;
typedef struct {
    const char *what, *goal;
    bound kind;
    double limit;
    double worst;
    const bench_row *at; /* the worst row; NULL: no row had the data */
} target;

static void consider(target *t, const bench_row *r, double v) {
    const int worse = t->kind == AT_LEAST ? v < t->worst : v > t->worst;
    if (!t->at || worse) {
        t->worst = v;
        t->at = r;
    }
}

static void print_target(const target *t) {
    printf("| %s | %s | ", t->what, t->goal);
    if (!t->at) {
        printf("no data | - | - |\n");
        return;
    }
    const double v = t->worst;
    const int met = t->kind == AT_LEAST ? v >= t->limit : t->kind == AT_MOST ? v <= t->limit : v < t->limit;
    printf("%.2f | pool R %d, rank %d, T %d, adapters %d | %s |\n", v, t->at->pool_rank, t->at->rank, t->at->T,
           t->at->adapters, met ? "met" : "not met");
}

static void print_targets(const bench_run *run) {
    target t[] = {
        {"device-only roofline, T <= 64, 8 adapters of rank 16", ">= 0.80", AT_LEAST, 0.80, 0, NULL},
        {"end-to-end roofline, T <= 64, 8 adapters of rank 16", ">= 0.60", AT_LEAST, 0.60, 0, NULL},
        {"LoRA overhead over the base forward, T <= 64, 8 adapters of rank 16", "<= 0.15", AT_MOST, 0.15, 0, NULL},
        {"T = 4096, 1 adapter: TFLOP/s / forward-shape GEMM peak", ">= 0.75", AT_LEAST, 0.75, 0, NULL},
        {"T = 4096, 8 adapters: TFLOP/s / forward-shape GEMM peak", ">= 0.65", AT_LEAST, 0.65, 0, NULL},
        {"ours / PyTorch in a CUDA graph, device-only, every row", "< 1", BELOW, 1.0, 0, NULL},
    };
    for (int i = 0; i < run->nrows; i++) {
        const bench_row *r = &run->rows[i];
        if (r->rank == 16 && r->T <= 64 && r->adapters == 8) {
            consider(&t[0], r, roofline(run, r, r->ms));
            consider(&t[1], r, roofline(run, r, r->e2e_ms));
            consider(&t[2], r, r->ms / r->base_ms - 1);
        }
        if (r->T == BENCH_TMAX && run->peak_fwd > 0 && (r->adapters == 1 || r->adapters == 8))
            consider(&t[r->adapters == 1 ? 3 : 4], r, tflops(r) / run->peak_fwd);
        const double tg = refs_torch_ms("graph", r->rank, r->T, r->adapters);
        if (tg > 0) consider(&t[5], r, r->ms / tg);
    }
    printf("\nTargets (issue 29), each the worst of the rows it names, over every row group:\n\n");
    printf("| target | goal | measured | worst row | |\n|:---|:---|---:|:---|:---|\n");
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) print_target(&t[i]);
}

/* ---- main ------------------------------------------------------------------ */

static int inputs_alloc(bench_inputs *in, uint64_t *seed) {
    const size_t n13 = (size_t)BENCH_N * 2 * BENCH_F * BENCH_H, n2 = (size_t)BENCH_N * BENCH_H * BENCH_F;
    const size_t nx = (size_t)BENCH_TMAX * BENCH_H, ng = (size_t)BENCH_TMAX * BENCH_N;
    in->w13 = malloc(n13 * sizeof(float));
    in->w2 = malloc(n2 * sizeof(float));
    in->x = malloc(nx * sizeof(float));
    in->y = malloc(nx * sizeof(float));
    in->gam = malloc(ng * sizeof(float));
    in->sot = malloc((size_t)BENCH_TMAX * sizeof(int));
    if (!in->w13 || !in->w2 || !in->x || !in->y || !in->gam || !in->sot) return -1;
    bench_fill(in->w13, n13, 0.027, seed);
    bench_fill(in->w2, n2, 0.027, seed);
    bench_fill(in->x, nx, 1.0, seed);
    bench_fill(in->gam, ng, 1.0, seed);
    return 0;
}

static void inputs_free(bench_inputs *in) {
    free(in->w13);
    free(in->w2);
    free(in->x);
    free(in->y);
    free(in->gam);
    free(in->sot);
}

/* True when argv[i] is a file flag (--torch or --http) with a value. */
static int file_flag(int argc, char **argv, int i) {
    return (!strcmp(argv[i], "--torch") || !strcmp(argv[i], "--http")) && i + 1 < argc;
}

/* True when the file after flag i was named by an earlier file flag: one
 * file may hold both kinds of lines (check.sh's peers.jsonl), and reading
 * it twice would print its HTTP rows twice. */
static int named_before(char **argv, int i) {
    for (int j = 1; j < i; j++)
        if (file_flag(i + 1, argv, j) && !strcmp(argv[j + 1], argv[i + 1])) return 1;
    return 0;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (file_flag(argc, argv, i)) {
            if (!named_before(argv, i)) refs_load(argv[i + 1]);
            i++;
        } else {
            fprintf(stderr, "usage: bench_gpu [--torch torch_ref.jsonl] [--http http.jsonl]\n");
            refs_free();
            return 2;
        }
    }
    if (!ls_backend_cuda_available()) {
        printf("SKIPPED: no CUDA device\n");
        refs_free();
        return 77;
    }
    uint64_t seed = 42;
    bench_inputs in = {0};
    static bench_run run; /* 64 rows: off the stack */
    int rc = inputs_alloc(&in, &seed);
    if (rc) fprintf(stderr, "bench_gpu: out of host memory\n");
    for (size_t g = 0; g < sizeof GROUPS / sizeof GROUPS[0] && rc == 0; g++)
        rc = run_group(&run, &in, GROUPS[g][0], GROUPS[g][1], &seed);
    if (rc == 0) rc = trace_all(&run, &in, &seed);
    if (rc == 0) rc = profile_all(&run, &in, &seed);
    if (run.nrows > 0) {
        printf("\nms: median device time of one forward (CUDA graph of the device work when graph says yes, inputs "
               "resident); e2e ms: median wall time of ls_backend_forward from host x to host y (staging, PCIe, "
               "sync); roofline: minimal bytes / time / copy bandwidth; pool R: the pool's rank, rank: the "
               "adapters' (zero past it); ours/torch: our device time / PyTorch eager's, ours/torch graph: / "
               "PyTorch's in a CUDA graph; < 1 is faster.\n");
        print_profile(&run);
        print_traces(&run);
        print_http(&run);
        print_targets(&run);
    }
    inputs_free(&in);
    refs_free();
    return rc ? 1 : 0;
}
