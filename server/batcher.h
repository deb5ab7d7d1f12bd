/* The forward batcher: concurrent /forward requests for the same layer
 * are coalesced into one pool forward (up to --max-batch-tokens, waiting
 * at most --batch-wait-us after the first arrives, and only when more are
 * likely), every token keeping its own adapter. One worker thread; a
 * bounded queue (429 when full). */
#ifndef LS_SERVER_BATCHER_H
#define LS_SERVER_BATCHER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "common/error.h"
#include "lora/pool.h"
#include "server/metrics.h"

typedef struct ls_batcher ls_batcher;

/* One request's forward. The caller owns the job and every buffer in it,
 * and keeps them alive until done() has been called. */
typedef struct ls_batch_job {
    int layer, T;
    const float *x;            /* [T, H] */
    const float *gammas;       /* [T, n] or NULL */
    const ls_token_names *names; /* T tokens' adapters, or NULL (all base) */
    float *y;                  /* [T, H], filled */
    ls_pool_used *used;        /* capacity names->n, filled: entry k for names->names[k] */
    int n_used;
    ls_status status; /* the outcome, set before done() */
    ls_error err;     /* initialised by submit; the caller frees it */
    void (*done)(void *ctx); /* called once, from the worker, for every accepted job */
    void *done_ctx;
    bool arriving; /* counted by ls_batcher_arriving: submit uncounts it, accepted or not */
    /* queue bookkeeping */
    struct ls_batch_job *next;
    struct timespec enqueued;
} ls_batch_job;

/* Starts the worker. pool and metrics are borrowed; dims (copied) gives
 * H, n and whether the model has a shared-expert gate. */
ls_status ls_batcher_create(ls_pool *pool, ls_metrics *metrics, const ls_dims *dims, int max_batch_tokens, int wait_us,
                            int max_queue_tokens, ls_batcher **out, ls_error *err);
/* Runs what is queued, stops the worker, frees everything. */
void ls_batcher_free(ls_batcher *b);

/* A forward has begun to arrive (its body is being read): until it is
 * submitted (with job->arriving set) or given up (ls_batcher_arrived), a
 * batch may wait for it. */
void ls_batcher_arriving(ls_batcher *b);
void ls_batcher_arrived(ls_batcher *b);

/* Queues job. On LS_OVERLOADED (queue full) the job is not queued and
 * done() is not called; otherwise done() is called once the job has run. */
ls_status ls_batcher_submit(ls_batcher *b, ls_batch_job *job, ls_error *err);

/* Submits and waits: for callers that may block (tests, benchmarks). */
ls_status ls_batcher_run(ls_batcher *b, ls_batch_job *job);

#endif
