/* Counters and histograms behind one mutex, rendered in the Prometheus
 * text exposition format (version 0.0.4), with what is read at render
 * time: the pool, the per-adapter series, the build and the process. */
#include "server/metrics.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/buf.h"
#include "gpu/backend.h"
#include "lora/pool.h"

static const double ls_latency_bounds[LS_METRICS_LATENCY_BUCKETS] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
static const int ls_batch_bounds[LS_METRICS_BATCH_BUCKETS] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096};

void ls_metrics_init(ls_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->lock, NULL);
}

void ls_metrics_connections(ls_metrics *m, int open, int reserved) {
    atomic_fetch_add(&m->connections, open);
    atomic_fetch_add(&m->connections_reserved, reserved);
}

void ls_metrics_connection_refused(ls_metrics *m) { atomic_fetch_add(&m->connections_refused, 1); }

void ls_metrics_request_timeout(ls_metrics *m, bool body) { atomic_fetch_add(&m->request_timeouts[body ? 1 : 0], 1); }

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

/* Adds n observations of seconds to h; the caller holds the lock. */
static void ls_metrics_seconds_add(ls_metrics_seconds *h, double seconds, int n) {
    h->count += (uint64_t)n;
    h->sum_s += seconds * n;
    for (int b = 0; b < LS_METRICS_LATENCY_BUCKETS; b++)
        if (seconds <= ls_latency_bounds[b]) {
            h->buckets[b] += (uint64_t)n;
            break;
        }
}

void ls_metrics_observe_forward_queue(ls_metrics *m, double seconds) {
    pthread_mutex_lock(&m->lock);
    ls_metrics_seconds_add(&m->forward_queue, seconds, 1);
    pthread_mutex_unlock(&m->lock);
}

void ls_metrics_observe_forward_compute(ls_metrics *m, double seconds, int requests) {
    pthread_mutex_lock(&m->lock);
    ls_metrics_seconds_add(&m->forward_compute, seconds, requests);
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

void ls_metrics_observe_batch_wait(ls_metrics *m, double seconds) {
    pthread_mutex_lock(&m->lock);
    m->batch_waits++;
    m->batch_wait_seconds += seconds;
    pthread_mutex_unlock(&m->lock);
}

void ls_metrics_set_receiving(ls_metrics *m, int64_t forwards) {
    pthread_mutex_lock(&m->lock);
    m->receiving = forwards;
    pthread_mutex_unlock(&m->lock);
}

void ls_metrics_loads(ls_metrics *m, int delta) {
    pthread_mutex_lock(&m->lock);
    m->loads += delta;
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

/* The budget's one rule: a request alone always fits; beside others,
 * all of it together must be within the budget. */
static bool ls_metrics_budget_room(unsigned long long others, unsigned long long mine, unsigned long long more,
                                   unsigned long long budget) {
    return others == 0 || others + mine + more <= budget;
}

bool ls_metrics_budget_take(atomic_ullong *held, unsigned long long mine, unsigned long long more,
                            unsigned long long budget, unsigned long long *others) {
    unsigned long long cur = atomic_load(held);
    do {
        *others = cur - mine;
        if (!ls_metrics_budget_room(*others, mine, more, budget)) return false;
    } while (!atomic_compare_exchange_weak(held, &cur, cur + more));
    return true;
}

bool ls_metrics_budget_fits(atomic_ullong *held, unsigned long long mine, unsigned long long more,
                            unsigned long long budget) {
    return ls_metrics_budget_room(atomic_load(held) - mine, mine, more, budget);
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

/* One label-free histogram of seconds, with its HELP and TYPE. */
static void ls_metrics_render_seconds(ls_buf *b, const char *name, const char *help, const ls_metrics_seconds *h) {
    ls_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int k = 0; k < LS_METRICS_LATENCY_BUCKETS; k++) {
        cum += h->buckets[k];
        ls_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, ls_latency_bounds[k], (unsigned long long)cum);
    }
    ls_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9f\n%s_count %llu\n", name,
                  (unsigned long long)h->count, name, h->sum_s, name, (unsigned long long)h->count);
}

static void ls_metrics_render_batches(const ls_metrics *m, ls_buf *b) {
    ls_metrics_render_seconds(b, "lorasink_forward_queue_seconds",
                              "Time a batched forward waited in the queue before its backend call.",
                              &m->forward_queue);
    ls_metrics_render_seconds(b, "lorasink_forward_compute_seconds",
                              "Time of the backend call that served a batched forward (shared by the requests "
                              "merged into it).",
                              &m->forward_compute);
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
    ls_buf_printf(b, "# HELP lorasink_batch_wait_seconds Time a batch was held open for more requests "
                     "(only batches that waited).\n"
                     "# TYPE lorasink_batch_wait_seconds summary\nlorasink_batch_wait_seconds_sum %.9g\n"
                     "lorasink_batch_wait_seconds_count %llu\n",
                  m->batch_wait_seconds, (unsigned long long)m->batch_waits);
    ls_buf_printf(b, "# HELP lorasink_forwards_receiving Forward requests whose body is being read "
                     "(a batch may wait for them).\n"
                     "# TYPE lorasink_forwards_receiving gauge\nlorasink_forwards_receiving %lld\n",
                  (long long)m->receiving);
    ls_buf_printf(b, "# HELP lorasink_queue_bytes Bytes forward requests hold against --max-queue-mb: bodies "
                     "arriving, and requests parsed until they are answered.\n"
                     "# TYPE lorasink_queue_bytes gauge\nlorasink_queue_bytes %llu\n",
                  (unsigned long long)atomic_load(&m->queue_bytes));
    ls_buf_printf(b, "# HELP lorasink_state_records_unrestored Records of --state-dir the start-up did not register "
                     "(damaged ones moved to corrupt/, others kept for another model or pool shape): adapters once "
                     "acknowledged that are not served now.\n"
                     "# TYPE lorasink_state_records_unrestored gauge\nlorasink_state_records_unrestored %d\n",
                  m->state_unrestored);
    ls_buf_printf(b, "# HELP lorasink_upload_bytes Bytes the bodies of other requests (adapter uploads, "
                     "validations) hold against --max-upload-mb, from their first byte until answered.\n"
                     "# TYPE lorasink_upload_bytes gauge\nlorasink_upload_bytes %llu\n",
                  (unsigned long long)atomic_load(&m->upload_bytes));
    ls_buf_printf(b, "# HELP lorasink_queue_depth Forward requests waiting for the batcher.\n"
                     "# TYPE lorasink_queue_depth gauge\nlorasink_queue_depth %lld\n",
                  (long long)m->queue_depth);
    ls_buf_printf(b, "# HELP lorasink_adapter_loads_running Adapter loads running now (POST /adapters and "
                     "auto-loads), each on an offload worker.\n"
                     "# TYPE lorasink_adapter_loads_running gauge\nlorasink_adapter_loads_running %lld\n",
                  (long long)m->loads);
    ls_buf_printf(b, "# HELP lorasink_offload_waiting Requests queued for an offload worker: on \"backend\", "
                     "loads, deletes and auto-loads (behind a running forward); on \"disk\", validations and the "
                     "reading of uploads and auto-loaded files.\n"
                     "# TYPE lorasink_offload_waiting gauge\n"
                     "lorasink_offload_waiting{workers=\"backend\"} %lld\nlorasink_offload_waiting{workers=\"disk\"} "
                     "%lld\n",
                  (long long)atomic_load(&m->offload_waiting[LS_METRICS_BACKEND_WORKERS]),
                  (long long)atomic_load(&m->offload_waiting[LS_METRICS_DISK_WORKERS]));
    ls_buf_printf(b, "# HELP lorasink_http_connections Open HTTP connections.\n"
                     "# TYPE lorasink_http_connections gauge\nlorasink_http_connections %lld\n"
                     "# HELP lorasink_http_connections_reserved Open connections taken from the reserve past "
                     "--per-ip-connections or --max-connections (they serve /health and /ready only).\n"
                     "# TYPE lorasink_http_connections_reserved gauge\nlorasink_http_connections_reserved %lld\n"
                     "# HELP lorasink_http_connections_refused_total Connections closed at accept: their address "
                     "held its --per-ip-connections and the reserve.\n"
                     "# TYPE lorasink_http_connections_refused_total counter\n"
                     "lorasink_http_connections_refused_total %llu\n"
                     "# HELP lorasink_request_timeouts_total Requests answered 408 and closed: the head not in "
                     "--request-timeout, or the body not in --body-timeout.\n"
                     "# TYPE lorasink_request_timeouts_total counter\n"
                     "lorasink_request_timeouts_total{phase=\"head\"} %llu\n"
                     "lorasink_request_timeouts_total{phase=\"body\"} %llu\n",
                  (long long)atomic_load(&m->connections), (long long)atomic_load(&m->connections_reserved),
                  (unsigned long long)atomic_load(&m->connections_refused),
                  (unsigned long long)atomic_load(&m->request_timeouts[0]),
                  (unsigned long long)atomic_load(&m->request_timeouts[1]));
    ls_buf_printf(b, "# HELP lorasink_rejected_overload_total Requests refused with 429 overloaded: the queue full "
                     "(--max-queue-tokens, --max-queue-mb).\n"
                     "# TYPE lorasink_rejected_overload_total counter\nlorasink_rejected_overload_total %llu\n",
                  (unsigned long long)m->rejected_overload);
}

/* Returns the slot count (0 when the pool could not be read). */
static int ls_metrics_render_pool(struct ls_pool *pool, ls_buf *b) {
    ls_slot_info *slots = NULL;
    ls_pool_stats st;
    if (!pool || ls_pool_snapshot(pool, &slots, &st, NULL) != LS_OK) return 0;
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
                  "# HELP lorasink_pool_bytes Bytes of the pool in the memory the forward reads adapters from.\n# TYPE lorasink_pool_bytes gauge\n"
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
                  "# TYPE lorasink_pool_misses_total counter\nlorasink_pool_misses_total %llu\n"
                  "# HELP lorasink_host_cache_drops_total Adapters dropped from the host tier (read again from "
                  "their source or the state directory when next needed).\n"
                  "# TYPE lorasink_host_cache_drops_total counter\nlorasink_host_cache_drops_total %llu\n",
                  st.slots, resident, pinned, st.bytes_total, st.registered, st.host_used, st.host_bytes,
                  (unsigned long long)st.loads, (unsigned long long)st.evictions, (unsigned long long)st.hits,
                  (unsigned long long)st.misses, (unsigned long long)st.host_drops);
    return st.slots;
}

/* Appends s as a label value: the exposition format escapes backslash,
 * double quote and line feed, and nothing else. */
static void ls_metrics_label(ls_buf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '\\') ls_buf_append(b, "\\\\", 2);
        else if (*s == '"') ls_buf_append(b, "\\\"", 2);
        else if (*s == '\n') ls_buf_append(b, "\\n", 2);
        else ls_buf_append(b, s, 1);
    }
}

#if defined(__clang__)
#define LS_METRICS_COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define LS_METRICS_COMPILER "gcc " __VERSION__
#else
#define LS_METRICS_COMPILER "unknown"
#endif

/* be borrowed, may be NULL. One sample whose labels are the point: join
 * on it (`* on() group_left(version)`) to tag any series with the build. */
static void ls_metrics_render_build(const ls_backend *be, ls_buf *b) {
    const char *isa = be ? ls_backend_isa(be) : NULL;
    ls_buf_printf(b, "# HELP lorasink_build_info Always 1; the labels say what runs: version, backend, CPU kernel path, "
                     "compiler.\n# TYPE lorasink_build_info gauge\nlorasink_build_info{version=\"");
    ls_metrics_label(b, LS_VERSION);
    ls_buf_printf(b, "\",backend=\"");
    ls_metrics_label(b, be ? ls_backend_name(be) : "");
    ls_buf_printf(b, "\",isa=\"");
    ls_metrics_label(b, isa ? isa : "");
    ls_buf_printf(b, "\",compiler=\"");
    ls_metrics_label(b, LS_METRICS_COMPILER);
    ls_buf_printf(b, "\"} 1\n");
}

/* The CUDA device's memory, as cudaMemGetInfo sees it (the whole
 * device: other processes' use included), and its utilisation as NVML
 * samples it (absent without NVML: the start-up log says why). The CUDA
 * backend's memory operation only sets the device and asks the driver,
 * touching no state of the backend, so a scrape may call it while a
 * forward runs. be borrowed, may be NULL. */
static void ls_metrics_render_device(const ls_backend *be, ls_buf *b) {
    if (!be || strcmp(ls_backend_name(be), "cuda")) return;
    size_t free_b = 0, total_b = 0;
    ls_error err;
    ls_error_init(&err);
    const bool ok = ls_backend_memory((ls_backend *)be, &free_b, &total_b, &err) == LS_OK;
    ls_error_free(&err);
    if (ok)
        ls_buf_printf(b,
                      "# HELP lorasink_device_memory_used_bytes Memory in use on the CUDA device (every process's).\n"
                      "# TYPE lorasink_device_memory_used_bytes gauge\nlorasink_device_memory_used_bytes %zu\n"
                      "# HELP lorasink_device_memory_total_bytes Memory of the CUDA device.\n"
                      "# TYPE lorasink_device_memory_total_bytes gauge\nlorasink_device_memory_total_bytes %zu\n",
                      total_b - free_b, total_b);
    unsigned percent = 0;
    if (ls_backend_utilization(be, &percent))
        ls_buf_printf(b,
                      "# HELP lorasink_device_utilization_ratio Share of NVML's last sample period (1/6 s to 1 s) "
                      "in which a kernel ran on the CUDA device (any process's).\n"
                      "# TYPE lorasink_device_utilization_ratio gauge\nlorasink_device_utilization_ratio %.2f\n",
                      percent / 100.0);
}

/* Seconds since the epoch at which the kernel booted (/proc/stat btime),
 * 0 when unknown. */
static long long ls_metrics_boot_time(void) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return 0;
    char line[512];
    long long btime = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "btime %lld", &btime) == 1) break;
    fclose(f);
    return btime;
}

/* The process_* series every Prometheus client library exports, under
 * their standard names, read from /proc/self. Left out where /proc is not
 * there (a scrape must not fail for them). */
static void ls_metrics_render_process(ls_buf *b) {
    char stat[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = '\0';
    /* The command name may hold spaces and parentheses: fields are
     * counted from the last ')'. */
    const char *p = strrchr(stat, ')');
    unsigned long utime, stime, vsize;
    unsigned long long start;
    long rss;
    if (!p || sscanf(p + 2,
                     "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d %*d %*d %*d %*d %llu %lu %ld",
                     &utime, &stime, &start, &vsize, &rss) != 5)
        return;
    const double ticks = (double)sysconf(_SC_CLK_TCK);
    const long page = sysconf(_SC_PAGESIZE);
    ls_buf_printf(b,
                  "# HELP process_cpu_seconds_total User and system CPU time the process used, in seconds.\n"
                  "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.2f\n"
                  "# HELP process_resident_memory_bytes Resident set size in bytes.\n"
                  "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %lld\n"
                  "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
                  "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %lu\n",
                  (double)(utime + stime) / ticks, (long long)rss * page, vsize);
    long long boot = ls_metrics_boot_time();
    if (boot > 0)
        ls_buf_printf(b,
                      "# HELP process_start_time_seconds When the process started, in seconds since the epoch.\n"
                      "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %.2f\n",
                      (double)boot + (double)start / ticks);
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        long fds = 0;
        const struct dirent *de;
        while ((de = readdir(d)))
            if (de->d_name[0] != '.' && atoi(de->d_name) != dirfd(d)) fds++; /* not the listing's own */
        closedir(d);
        ls_buf_printf(b, "# HELP process_open_fds Open file descriptors.\n"
                         "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n",
                      fds);
    }
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY)
        ls_buf_printf(b, "# HELP process_max_fds The limit on open file descriptors (soft RLIMIT_NOFILE).\n"
                         "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n",
                      (unsigned long long)rl.rlim_cur);
}

/* One row of the per-adapter families: an adapter, or the sum of those
 * folded under "_other". */
typedef struct {
    const char *name;
    uint64_t requests, tokens, loads, evictions;
    long long in_flight, resident;
} ls_metrics_adapter_row;

static const struct {
    const char *name, *type, *help;
    size_t field; /* offset in ls_metrics_adapter_row */
    bool is_signed;
} ls_adapter_families[] = {
    {"lorasink_adapter_requests_total", "counter", "Forward requests answered that used the adapter.",
     offsetof(ls_metrics_adapter_row, requests), false},
    {"lorasink_adapter_tokens_total", "counter", "Tokens of forward requests run with the adapter.",
     offsetof(ls_metrics_adapter_row, tokens), false},
    {"lorasink_adapter_loads_total", "counter", "Writes of the adapter into a slot.",
     offsetof(ls_metrics_adapter_row, loads), false},
    {"lorasink_adapter_evictions_total", "counter", "Evictions of the adapter from its slot.",
     offsetof(ls_metrics_adapter_row, evictions), false},
    {"lorasink_adapter_in_flight", "gauge", "Requests holding the adapter now.",
     offsetof(ls_metrics_adapter_row, in_flight), true},
    {"lorasink_adapter_resident", "gauge", "1 while the adapter holds a slot (for _other: how many do).",
     offsetof(ls_metrics_adapter_row, resident), true},
};

/* Appends, comma-separated, the names (infos is in byte order) of the
 * adapters held by a forward that are resident (running) or not
 * (waiting); past LS_METRICS_MAX_ADAPTERS names the list ends with
 * ",_other". infos borrowed. */
static void ls_metrics_name_list(ls_buf *b, const ls_adapter_info *infos, size_t n, bool running) {
    int listed = 0;
    for (size_t i = 0; i < n; i++) {
        if (infos[i].in_flight <= 0 || (infos[i].slot >= 0) != running) continue;
        if (listed) ls_buf_append(b, ",", 1);
        if (listed == LS_METRICS_MAX_ADAPTERS) {
            ls_buf_append(b, "_other", 6);
            return;
        }
        ls_metrics_label(b, infos[i].name);
        listed++;
    }
}

/* The per-adapter families and lorasink_lora_requests_info (the shape of
 * vLLM's vllm:lora_requests_info, so its dashboards carry over): running
 * adapters are held by a forward and resident, waiting ones are held by a
 * forward and not resident yet (a later group of the call, or a load in
 * progress); max_lora is the slot count. */
/* pool borrowed; what it lists is copied and freed here. */
static void ls_metrics_render_adapters(struct ls_pool *pool, int slots, ls_buf *b) {
    ls_adapter_info *infos = NULL;
    size_t n = 0;
    if (ls_pool_list(pool, &infos, &n, NULL) != LS_OK) return;
    ls_metrics_adapter_row *rows = calloc(n + 1, sizeof *rows);
    if (!rows) {
        free(infos);
        b->failed = true; /* a scrape missing families must not look complete */
        return;
    }
    /* The first names in byte order keep their own series; "_other" is
     * the bucket, so an adapter of that name is always folded into it. */
    size_t named = 0;
    ls_metrics_adapter_row other = {.name = "_other"};
    long long folded = 0;
    for (size_t i = 0; i < n; i++) {
        const ls_adapter_info *a = &infos[i];
        bool own = named < LS_METRICS_MAX_ADAPTERS && strcmp(a->name, "_other") != 0;
        ls_metrics_adapter_row *r = own ? &rows[named++] : &other;
        if (own) r->name = a->name;
        else folded++;
        r->requests += a->requests;
        r->tokens += a->tokens;
        r->loads += a->loads;
        r->evictions += a->evictions;
        r->in_flight += a->in_flight;
        r->resident += a->slot >= 0;
    }
    if (folded) rows[named++] = other;
    for (size_t f = 0; f < sizeof ls_adapter_families / sizeof *ls_adapter_families; f++) {
        ls_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", ls_adapter_families[f].name, ls_adapter_families[f].help,
                      ls_adapter_families[f].name, ls_adapter_families[f].type);
        for (size_t i = 0; i < named; i++) {
            const char *field = (const char *)&rows[i] + ls_adapter_families[f].field;
            ls_buf_printf(b, "%s{adapter=\"", ls_adapter_families[f].name);
            ls_metrics_label(b, rows[i].name);
            if (ls_adapter_families[f].is_signed) ls_buf_printf(b, "\"} %lld\n", *(const long long *)field);
            else ls_buf_printf(b, "\"} %llu\n", (unsigned long long)*(const uint64_t *)field);
        }
    }
    ls_buf_printf(b,
                  "# HELP lorasink_adapters_folded Registered adapters past the per-adapter label cap, summed "
                  "under adapter=\"_other\".\n# TYPE lorasink_adapters_folded gauge\nlorasink_adapters_folded %lld\n",
                  folded);
    ls_buf_printf(b, "# HELP lorasink_lora_requests_info Always 1; the labels name the adapters forwards run with now "
                     "(resident) and wait for (not resident yet), and the slot count.\n"
                     "# TYPE lorasink_lora_requests_info gauge\nlorasink_lora_requests_info{running_lora_adapters=\"");
    ls_metrics_name_list(b, infos, n, true);
    ls_buf_printf(b, "\",waiting_lora_adapters=\"");
    ls_metrics_name_list(b, infos, n, false);
    ls_buf_printf(b, "\",max_lora=\"%d\"} 1\n", slots);
    free(rows);
    free(infos);
}

char *ls_metrics_render(ls_metrics *m, struct ls_pool *pool, const ls_backend *be) {
    ls_buf b;
    ls_buf_init(&b);
    pthread_mutex_lock(&m->lock);
    ls_metrics_render_requests(m, &b);
    ls_buf_printf(&b, "# HELP lorasink_tokens_total Tokens served by /forward.\n"
                      "# TYPE lorasink_tokens_total counter\nlorasink_tokens_total %llu\n",
                  (unsigned long long)m->tokens);
    ls_buf_printf(&b, "# HELP lorasink_validation_failures_total Adapters refused with 422 by POST /adapters or "
                      "/adapters/validate, by error code (once per distinct code of each).\n"
                      "# TYPE lorasink_validation_failures_total counter\n");
    for (int c = 0; c < LS_STATUS_COUNT; c++)
        if (m->validation_failures[c])
            ls_buf_printf(&b, "lorasink_validation_failures_total{code=\"%s\"} %llu\n", ls_status_code((ls_status)c),
                          (unsigned long long)m->validation_failures[c]);
    ls_metrics_render_batches(m, &b);
    pthread_mutex_unlock(&m->lock);
    ls_metrics_render_device(be, &b); /* asks the driver: not under the lock */
    int slots = ls_metrics_render_pool(pool, &b);
    if (slots > 0) ls_metrics_render_adapters(pool, slots, &b);
    ls_metrics_render_build(be, &b);
    ls_metrics_render_process(&b);
    return ls_buf_take(&b, NULL);
}
