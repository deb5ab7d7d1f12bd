/* Prometheus metrics: requests and latency histograms per route and
 * status, tokens served, validation failures per code, batch sizes; the
 * pool's gauges and counters, the per-adapter series and the vLLM-style
 * lora_requests_info are read from the pool when rendered, the build info
 * from the backend and the process_* series from /proc/self. */
#ifndef LS_SERVER_METRICS_H
#define LS_SERVER_METRICS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define LS_METRICS_MAX_SERIES 128
#define LS_METRICS_LATENCY_BUCKETS 14
#define LS_METRICS_BATCH_BUCKETS 12

/* The two sets of offload workers (server/offload.h), as the metrics
 * label them. */
enum { LS_METRICS_BACKEND_WORKERS, LS_METRICS_DISK_WORKERS, LS_METRICS_WORKER_KINDS };
/* Adapters with series of their own (the first names in byte order); the
 * rest are summed under adapter="_other", so a pool of thousands of
 * adapters cannot blow up a scrape or the TSDB (docs/dashboard.md). */
#define LS_METRICS_MAX_ADAPTERS 64

typedef struct {
    const char *route; /* static string */
    int status;
    uint64_t count;
    double sum_s;
    uint64_t buckets[LS_METRICS_LATENCY_BUCKETS]; /* cumulative at render */
} ls_metrics_series;

/* A histogram of seconds over the latency bounds. */
typedef struct {
    uint64_t count;
    double sum_s;
    uint64_t buckets[LS_METRICS_LATENCY_BUCKETS]; /* cumulative at render */
} ls_metrics_seconds;

typedef struct {
    pthread_mutex_t lock;
    ls_metrics_series series[LS_METRICS_MAX_SERIES];
    int n_series;
    uint64_t tokens;
    uint64_t validation_failures[LS_STATUS_COUNT];
    uint64_t batches, batch_tokens_sum, batch_requests_sum;
    uint64_t batch_size_buckets[LS_METRICS_BATCH_BUCKETS]; /* requests per backend call */
    uint64_t rejected_overload;
    uint64_t batch_waits;      /* batches held open for companions */
    double batch_wait_seconds; /* and how long, in all */
    /* per batched forward: queued (enqueued to its backend call) and
     * computing (its backend call, which it may share with others) */
    ls_metrics_seconds forward_queue, forward_compute;
    int64_t queue_depth; /* gauge, set by the batcher */
    int64_t receiving;   /* gauge, set by the batcher: forwards whose body is being read */
    int64_t loads;       /* gauge: adapter loads running (uploads and auto-loads) */
    /* gauges kept by the offload queues (no lock): requests waiting for a worker */
    atomic_llong offload_waiting[LS_METRICS_WORKER_KINDS];
    /* kept by the connection guard (server/guard.h), no lock */
    atomic_llong connections, connections_reserved; /* gauges: open, and of those taken from the reserve */
    atomic_ullong connections_refused;              /* closed at accept: the address past its cap and reserve */
    atomic_ullong request_timeouts[2];              /* answered 408: [0] the head, [1] the body */
    /* What /forward requests hold against --max-queue-mb, from their
     * body's first byte until they are answered (server/http.c and
     * handlers_forward.c keep it; no lock). */
    atomic_ullong queue_bytes;
    /* What the bodies of other requests (uploads, validations) hold
     * against --max-upload-mb, from their first byte until answered
     * (server/http.c keeps it; no lock). */
    atomic_ullong upload_bytes;
    /* Set once at start-up, before serving: state directory records the
     * restore did not register. */
    int state_unrestored;
} ls_metrics;

void ls_metrics_init(ls_metrics *m);
void ls_metrics_free(ls_metrics *m);
void ls_metrics_observe_request(ls_metrics *m, const char *route, int status, double seconds);
void ls_metrics_add_tokens(ls_metrics *m, uint64_t tokens);
void ls_metrics_validation_failure(ls_metrics *m, ls_status code);
void ls_metrics_observe_batch(ls_metrics *m, int requests, int tokens);
void ls_metrics_observe_batch_wait(ls_metrics *m, double seconds);
/* A forward's time in the batcher's queue, before its backend call. */
void ls_metrics_observe_forward_queue(ls_metrics *m, double seconds);
/* One backend call's time, once for each of the requests it served. */
void ls_metrics_observe_forward_compute(ls_metrics *m, double seconds, int requests);
void ls_metrics_set_queue_depth(ls_metrics *m, int64_t depth);
void ls_metrics_set_receiving(ls_metrics *m, int64_t forwards);
/* An adapter load began (+1) or ended (-1). */
void ls_metrics_loads(ls_metrics *m, int delta);
void ls_metrics_overload(ls_metrics *m);
/* Adds more bytes to held (queue_bytes or upload_bytes) for a request
 * that holds mine there already, unless others hold some (*others:
 * held - mine) and all of it would pass budget; false then, adding
 * nothing. One atomic step, so two requests that would fit one at a
 * time are never both refused for seeing each other's bytes. */
bool ls_metrics_budget_take(atomic_ullong *held, unsigned long long mine, unsigned long long more,
                            unsigned long long budget, unsigned long long *others);
/* Whether ls_metrics_budget_take would take more now; takes nothing. */
bool ls_metrics_budget_fits(atomic_ullong *held, unsigned long long mine, unsigned long long more,
                            unsigned long long budget);
/* Connections opened (+1) or closed (-1), and of those from the reserve. */
void ls_metrics_connections(ls_metrics *m, int open, int reserved);
void ls_metrics_connection_refused(ls_metrics *m);
/* A request answered 408: its head (body false) or its body too slow. */
void ls_metrics_request_timeout(ls_metrics *m, bool body);

struct ls_pool;
struct ls_backend;
/* Renders everything as Prometheus text into a malloc'd string (caller
 * frees; NULL when out of memory). pool and be are borrowed and may be
 * NULL (their families are then left out, and build_info has empty
 * backend and isa labels). */
char *ls_metrics_render(ls_metrics *m, struct ls_pool *pool, const struct ls_backend *be);

#endif
