/* Counters and histograms behind one mutex, rendered in the Prometheus
 * text exposition format (version 0.0.4). */
#include "server/metrics.h"

#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "lora/pool.h"

static const double ls_latency_bounds[LS_METRICS_LATENCY_BUCKETS] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
static const int ls_batch_bounds[LS_METRICS_BATCH_BUCKETS] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096};

void ls_metrics_init(ls_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->lock, NULL);
}

void ls_metrics_free(ls_metrics *m) { pthread_mutex_destroy(&m->lock); }

void ls_metrics_observe_request(ls_metrics *m, const char *route, int status, double seconds) {
    pthread_mutex_lock(&m->lock);
    ls_metrics_series *s = NULL;
    for (int i = 0; i < m->n_series && !s; i++)
        if (m->series[i].status == status && !strcmp(m->series[i].route, route)) s = &m->series[i];
    if (!s && m->n_series < LS_METRICS_MAX_SERIES) {
        s = &m->series[m->n_series++];
        s->route = route;
        s->status = status;
    }
    if (s) {
        s->count++;
        s->sum_s += seconds;
        for (int b = 0; b < LS_METRICS_LATENCY_BUCKETS; b++)
            if (seconds <= ls_latency_bounds[b]) {
                s->buckets[b]++;
                break;
            }
    }
    pthread_mutex_unlock(&m->lock);
}

void ls_metrics_add_tokens(ls_metrics *m, uint64_t tokens) {
    pthread_mutex_lock(&m->lock);
    m->tokens += tokens;
    pthread_mutex_unlock(&m->lock);
}

void ls_metrics_validation_failure(ls_metrics *m, ls_status code) {
    if ((unsigned)code >= LS_STATUS_COUNT) return;
    pthread_mutex_lock(&m->lock);
    m->validation_failures[code]++;
    pthread_mutex_unlock(&m->lock);
}

void ls_metrics_observe_batch(ls_metrics *m, int requests, int tokens) {
    pthread_mutex_lock(&m->lock);
    m->batches++;
    m->batch_requests_sum += (uint64_t)requests;
    m->batch_tokens_sum += (uint64_t)tokens;
    for (int b = 0; b < LS_METRICS_BATCH_BUCKETS; b++)
        if (requests <= ls_batch_bounds[b]) {
            m->batch_size_buckets[b]++;
            break;
        }
    pthread_mutex_unlock(&m->lock);
}

void ls_metrics_set_queue_depth(ls_metrics *m, int64_t depth) {
    pthread_mutex_lock(&m->lock);
    m->queue_depth = depth;
    pthread_mutex_unlock(&m->lock);
}

void ls_metrics_overload(ls_metrics *m) {
    pthread_mutex_lock(&m->lock);
    m->rejected_overload++;
    pthread_mutex_unlock(&m->lock);
}

static void ls_metrics_render_requests(const ls_metrics *m, ls_buf *b) {
    ls_buf_printf(b, "# HELP lorasink_requests_total HTTP requests by route and status.\n"
                     "# TYPE lorasink_requests_total counter\n");
    for (int i = 0; i < m->n_series; i++)
        ls_buf_printf(b, "lorasink_requests_total{route=\"%s\",status=\"%d\"} %llu\n", m->series[i].route,
                      m->series[i].status, (unsigned long long)m->series[i].count);
    ls_buf_printf(b, "# HELP lorasink_request_duration_seconds Request latency by route and status.\n"
                     "# TYPE lorasink_request_duration_seconds histogram\n");
    for (int i = 0; i < m->n_series; i++) {
        const ls_metrics_series *s = &m->series[i];
        uint64_t cum = 0;
        for (int k = 0; k < LS_METRICS_LATENCY_BUCKETS; k++) {
            cum += s->buckets[k];
            ls_buf_printf(b, "lorasink_request_duration_seconds_bucket{route=\"%s\",status=\"%d\",le=\"%g\"} %llu\n",
                          s->route, s->status, ls_latency_bounds[k], (unsigned long long)cum);
        }
        ls_buf_printf(b, "lorasink_request_duration_seconds_bucket{route=\"%s\",status=\"%d\",le=\"+Inf\"} %llu\n",
                      s->route, s->status, (unsigned long long)s->count);
        ls_buf_printf(b, "lorasink_request_duration_seconds_sum{route=\"%s\",status=\"%d\"} %.9f\n", s->route,
                      s->status, s->sum_s);
        ls_buf_printf(b, "lorasink_request_duration_seconds_count{route=\"%s\",status=\"%d\"} %llu\n", s->route,
                      s->status, (unsigned long long)s->count);
    }
}

static void ls_metrics_render_batches(const ls_metrics *m, ls_buf *b) {
    ls_buf_printf(b, "# HELP lorasink_batch_requests Requests coalesced into one backend call.\n"
                     "# TYPE lorasink_batch_requests histogram\n");
    uint64_t cum = 0;
    for (int k = 0; k < LS_METRICS_BATCH_BUCKETS; k++) {
        cum += m->batch_size_buckets[k];
        ls_buf_printf(b, "lorasink_batch_requests_bucket{le=\"%d\"} %llu\n", ls_batch_bounds[k],
                      (unsigned long long)cum);
    }
    ls_buf_printf(b, "lorasink_batch_requests_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)m->batches);
    ls_buf_printf(b, "lorasink_batch_requests_sum %llu\n", (unsigned long long)m->batch_requests_sum);
    ls_buf_printf(b, "lorasink_batch_requests_count %llu\n", (unsigned long long)m->batches);
    ls_buf_printf(b, "# HELP lorasink_batch_tokens_total Tokens run through batched backend calls.\n"
                     "# TYPE lorasink_batch_tokens_total counter\nlorasink_batch_tokens_total %llu\n",
                  (unsigned long long)m->batch_tokens_sum);
    ls_buf_printf(b, "# HELP lorasink_queue_depth Forward requests waiting for the batcher.\n"
                     "# TYPE lorasink_queue_depth gauge\nlorasink_queue_depth %lld\n",
                  (long long)m->queue_depth);
    ls_buf_printf(b, "# HELP lorasink_rejected_overload_total Requests refused with 429 because the queue was full.\n"
                     "# TYPE lorasink_rejected_overload_total counter\nlorasink_rejected_overload_total %llu\n",
                  (unsigned long long)m->rejected_overload);
}

static void ls_metrics_render_pool(struct ls_pool *pool, ls_buf *b) {
    ls_slot_info *slots = NULL;
    ls_pool_stats st;
    if (!pool || ls_pool_snapshot(pool, &slots, &st, NULL) != LS_OK) return;
    int resident = 0, pinned = 0;
    for (int i = 0; i < st.slots; i++) {
        resident += slots[i].state != LS_SLOT_FREE;
        pinned += slots[i].state != LS_SLOT_FREE && slots[i].pinned;
    }
    free(slots);
    ls_buf_printf(b,
                  "# HELP lorasink_pool_slots Slots of the LoRA pool.\n# TYPE lorasink_pool_slots gauge\n"
                  "lorasink_pool_slots %d\n"
                  "# HELP lorasink_pool_slots_used Slots holding an adapter.\n# TYPE lorasink_pool_slots_used gauge\n"
                  "lorasink_pool_slots_used %d\n"
                  "# HELP lorasink_pool_slots_pinned Slots holding a pinned adapter.\n"
                  "# TYPE lorasink_pool_slots_pinned gauge\nlorasink_pool_slots_pinned %d\n"
                  "# HELP lorasink_pool_bytes Bytes of the pool buffers.\n# TYPE lorasink_pool_bytes gauge\n"
                  "lorasink_pool_bytes %zu\n"
                  "# HELP lorasink_adapters_registered Registered adapters.\n"
                  "# TYPE lorasink_adapters_registered gauge\nlorasink_adapters_registered %d\n"
                  "# HELP lorasink_host_cache_adapters Adapters whose factors are in the host tier.\n"
                  "# TYPE lorasink_host_cache_adapters gauge\nlorasink_host_cache_adapters %d\n"
                  "# HELP lorasink_host_cache_bytes Bytes of the host tier.\n"
                  "# TYPE lorasink_host_cache_bytes gauge\nlorasink_host_cache_bytes %zu\n"
                  "# HELP lorasink_pool_loads_total Adapters written into a slot.\n"
                  "# TYPE lorasink_pool_loads_total counter\nlorasink_pool_loads_total %llu\n"
                  "# HELP lorasink_pool_evictions_total Adapters evicted from a slot.\n"
                  "# TYPE lorasink_pool_evictions_total counter\nlorasink_pool_evictions_total %llu\n"
                  "# HELP lorasink_pool_hits_total Forward uses of an adapter already resident.\n"
                  "# TYPE lorasink_pool_hits_total counter\nlorasink_pool_hits_total %llu\n"
                  "# HELP lorasink_pool_misses_total Forward uses that had to load the adapter.\n"
                  "# TYPE lorasink_pool_misses_total counter\nlorasink_pool_misses_total %llu\n",
                  st.slots, resident, pinned, st.bytes_total, st.registered, st.host_used, st.host_bytes,
                  (unsigned long long)st.loads, (unsigned long long)st.evictions, (unsigned long long)st.hits,
                  (unsigned long long)st.misses);
}

char *ls_metrics_render(ls_metrics *m, struct ls_pool *pool) {
    ls_buf b;
    ls_buf_init(&b);
    pthread_mutex_lock(&m->lock);
    ls_metrics_render_requests(m, &b);
    ls_buf_printf(&b, "# HELP lorasink_tokens_total Tokens served by /forward.\n"
                      "# TYPE lorasink_tokens_total counter\nlorasink_tokens_total %llu\n",
                  (unsigned long long)m->tokens);
    ls_buf_printf(&b, "# HELP lorasink_validation_failures_total Rejected adapter uploads by error code.\n"
                      "# TYPE lorasink_validation_failures_total counter\n");
    for (int c = 0; c < LS_STATUS_COUNT; c++)
        if (m->validation_failures[c])
            ls_buf_printf(&b, "lorasink_validation_failures_total{code=\"%s\"} %llu\n", ls_status_code((ls_status)c),
                          (unsigned long long)m->validation_failures[c]);
    ls_metrics_render_batches(m, &b);
    pthread_mutex_unlock(&m->lock);
    ls_metrics_render_pool(pool, &b);
    return ls_buf_take(&b, NULL);
}
