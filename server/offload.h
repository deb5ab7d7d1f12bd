/* Worker threads for the requests that may wait: adapter loads and
 * deletes (on the backend, behind a running forward), forwards that
 * auto-load an adapter, and every forward when the batcher is off; and,
 * on a set of workers of their own, validations and the parsing and
 * validation of an upload (on the disk: a FIFO shared with the loads made
 * them wait for the forward the loads wait for). http.c suspends such a request's connection, a worker runs it and
 * resumes the connection, so no HTTP thread ever waits and /health and
 * /ready answer whatever runs. */
#ifndef LS_SERVER_OFFLOAD_H
#define LS_SERVER_OFFLOAD_H

#include <stdatomic.h>

#include "common/error.h"

typedef struct ls_offload ls_offload;

/* One request's work. Owned by the caller, which keeps it alive until
 * run() has been called; run() is the queue's last touch of it, so it may
 * end the request (and free the job), or queue the job again, as it
 * returns. */
typedef struct ls_offload_job {
    void (*run)(void *ctx);
    void *ctx;
    struct ls_offload_job *next; /* queue bookkeeping */
} ls_offload_job;

/* Starts threads workers (at least one). *waiting (borrowed, may be
 * NULL) counts the jobs queued and not yet taken by a worker. */
ls_status ls_offload_create(int threads, atomic_llong *waiting, ls_offload **out, ls_error *err);
/* Runs every job still queued, stops the workers, frees o (NULL: no-op). */
void ls_offload_free(ls_offload *o);
/* Queues job; it runs on a worker, oldest first. Never fails: the
 * queue is bounded by the connections a job belongs to. */
void ls_offload_submit(ls_offload *o, ls_offload_job *job);

#endif
