/* Serving's CUDA graphs under streams of forwards whose shapes change, as
 * an engine's decode steps do: three traces of forwards (fixed, decode,
 * random), each run end to end through ls_backend_forward on a backend
 * that replays graphs and on one that launches directly, with the graph
 * cache's counters over the trace. What they say is how much of what a
 * graph saves on a repeated shape survives batches that change, which is
 * what padding batch sizes to buckets would win back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "gpu_bench.h"
#include "common/text.h"
#include "gpu/graph_cache.h"

static const char *const TRACE_NAMES[BENCH_TRACES] = {"fixed", "decode", "random"};

const char *bench_trace_name(int kind) { return kind >= 0 && kind < BENCH_TRACES ? TRACE_NAMES[kind] : "?"; }

/* A uniform integer in [0, n). */
static int draw(uint64_t *seed, int n) { return (int)(ls_splitmix64(seed) % (uint64_t)n); }

/* fixed: every step BENCH_TRACE_TMAX tokens, token t on slot t % slots.
 * decode: a batch of requests, each on one slot (drawn at random, so
 * requests share slots) for its life, in the
 * order they joined; every step one leaves or one joins, each half the
 * time, the batch kept within 1..BENCH_TRACE_TMAX (32 at the start).
 * random: every step 1..BENCH_TRACE_TMAX tokens, each on a slot drawn
 * afresh. */
static void trace_fill(bench_trace *tr, int slots, uint64_t *seed) {
    int live[BENCH_TRACE_TMAX], n = 32;
    for (int i = 0; i < n; i++) live[i] = draw(seed, slots);
    for (int s = 0; s < tr->steps; s++) {
        int *sot = tr->sot + (size_t)s * BENCH_TRACE_TMAX;
        if (tr->kind == 0) {
            tr->T[s] = BENCH_TRACE_TMAX;
            for (int t = 0; t < BENCH_TRACE_TMAX; t++) sot[t] = t % slots;
        } else if (tr->kind == 1) {
            const int leave = draw(seed, 2);
            if (leave && n > 1) {
                const int k = draw(seed, n);
                memmove(live + k, live + k + 1, (size_t)(n - k - 1) * sizeof *live);
                n--;
            } else if (n < BENCH_TRACE_TMAX) {
                live[n++] = draw(seed, slots);
            }
            tr->T[s] = n;
            memcpy(sot, live, (size_t)n * sizeof *live);
        } else {
            tr->T[s] = 1 + draw(seed, BENCH_TRACE_TMAX);
            for (int t = 0; t < tr->T[s]; t++) sot[t] = draw(seed, slots);
        }
    }
}

int bench_trace_make(int kind, int steps, int slots, uint64_t seed, bench_trace *tr) {
    memset(tr, 0, sizeof *tr);
    tr->kind = kind;
    tr->steps = steps;
    tr->T = malloc((size_t)steps * sizeof *tr->T);
    tr->sot = malloc((size_t)steps * BENCH_TRACE_TMAX * sizeof *tr->sot);
    if (!tr->T || !tr->sot) {
        fprintf(stderr, "bench_gpu: out of host memory for a trace\n");
        bench_trace_free(tr);
        return -1;
    }
    trace_fill(tr, slots, &seed);
    return 0;
}

void bench_trace_free(bench_trace *tr) {
    free(tr->T);
    free(tr->sot);
    tr->T = NULL;
    tr->sot = NULL;
}

int bench_trace_run(ls_backend *be, const bench_inputs *in, const bench_trace *tr, bench_trace_result *out) {
    memset(out, 0, sizeof *out);
    const ls_graph_cache *g = ls_backend_cuda_graphs(be);
    const uint64_t hits = g->hits, captures = g->captures, failures = g->failures;
    ls_error err;
    ls_error_init(&err);
    double total = 0;
    int rc = 0;
    for (int s = 0; s < tr->steps && rc == 0; s++) {
        const double t0 = bench_now_ms();
        if (ls_backend_forward(be, 0, tr->T[s], in->x, in->gam, tr->sot + (size_t)s * BENCH_TRACE_TMAX, in->y,
                               &err) != LS_OK) {
            fprintf(stderr, "bench_gpu: trace %s step %d: %s\n", bench_trace_name(tr->kind), s, err.message);
            rc = -1;
        }
        total += bench_now_ms() - t0;
    }
    ls_error_free(&err);
    out->mean_ms = total / tr->steps;
    out->hits = g->hits - hits;
    out->captures = g->captures - captures;
    out->failures = g->failures - failures;
    out->stopped = g->stopped;
    return rc;
}
