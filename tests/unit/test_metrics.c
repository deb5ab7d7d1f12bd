/* server/metrics: the Prometheus text ls_metrics_render writes. Every
 * family has its HELP and TYPE before its samples; counters count what was
 * observed; histogram buckets are cumulative and end in +Inf with _sum
 * and _count; validation failures per code; the queue depth gauge; the
 * pool's gauges and counters read from a pool over the fake backend; the
 * build info and process_* series; the per-adapter series, their label
 * cap (the rest summed under adapter="_other"), the escaping of names in
 * label values, and lora_requests_info. */
#include "tests/util/pool_cases.h"
#include "tests/util/pool_fixture.h"

#include <math.h>
#include <time.h>

#include "gpu/backend_impl.h" /* a fake CUDA backend's table, below */
#include "server/metrics.h"

/* The value of the sample whose name and labels are exactly `series`
 * ("name" or "name{...}"); fails the test when there is none or more than
 * one. */
static double mt_value(const char *text, const char *series) {
    size_t len = strlen(series);
    const char *found = NULL;
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        if (!end) end = line + strlen(line);
        if ((size_t)(end - line) > len && !strncmp(line, series, len) && line[len] == ' ') {
            if (found) fail_msg("two samples %s", series);
            found = line + len + 1;
        }
        line = *end ? end + 1 : end;
    }
    if (!found) fail_msg("no sample %s in:\n%s", series, text);
    char *stop;
    double v = strtod(found, &stop);
    assert_true(stop != found);
    return v;
}

/* A sample of the request latency histogram of (route, status): the
 * bucket le="bound", or "sum" / "count". */
static double mt_duration(const char *text, const char *route, int status, const char *bound) {
    char series[256];
    if (!strcmp(bound, "sum") || !strcmp(bound, "count"))
        snprintf(series, sizeof series, "lorasink_request_duration_seconds_%s{route=\"%s\",status=\"%d\"}", bound,
                 route, status);
    else
        snprintf(series, sizeof series,
                 "lorasink_request_duration_seconds_bucket{route=\"%s\",status=\"%d\",le=\"%s\"}", route, status,
                 bound);
    return mt_value(text, series);
}

static bool mt_has(const char *text, const char *needle) { return strstr(text, needle) != NULL; }

/* The exposition format's rules as this renderer must keep them: every
 * line a comment or "series value"; each family's HELP directly followed
 * by its TYPE, both once, before any sample of the family; samples of a
 * histogram named name_bucket/_sum/_count; every value a number. */
static void mt_check_format(const char *text) {
    char families[64][96], types[64][16];
    int n = 0;
    assert_true(strlen(text) > 0);
    assert_int_equal(text[strlen(text) - 1], '\n');
    const char *line = text;
    while (*line) {
        const char *end = strchr(line, '\n');
        assert_non_null(end);
        char buf[16384]; /* lora_requests_info may list many names */
        size_t l = (size_t)(end - line);
        assert_true(l > 0 && l < sizeof buf);
        memcpy(buf, line, l);
        buf[l] = '\0';
        line = end + 1;
        if (!strncmp(buf, "# HELP ", 7)) {
            char name[96];
            assert_int_equal(sscanf(buf + 7, "%95s", name), 1);
            for (int i = 0; i < n; i++) assert_string_not_equal(families[i], name);
            /* the TYPE line comes next */
            const char *tend = strchr(line, '\n');
            assert_non_null(tend);
            char tname[96], type[16];
            assert_int_equal(sscanf(line, "# TYPE %95s %15s", tname, type), 2);
            assert_string_equal(tname, name);
            assert_true(!strcmp(type, "counter") || !strcmp(type, "gauge") || !strcmp(type, "histogram") ||
                        !strcmp(type, "summary"));
            assert_true(n < 64);
            snprintf(families[n], sizeof families[n], "%s", name);
            snprintf(types[n], sizeof types[n], "%s", type);
            n++;
            line = tend + 1;
            continue;
        }
        assert_true(buf[0] != '#'); /* no TYPE without its HELP, no other comment */
        char *space = strrchr(buf, ' ');
        assert_non_null(space);
        char *stop;
        double v = strtod(space + 1, &stop);
        assert_true(*stop == '\0' && isfinite(v) && v >= 0);
        *space = '\0';
        char *brace = strchr(buf, '{');
        if (brace) {
            assert_int_equal(buf[strlen(buf) - 1], '}');
            *brace = '\0';
        }
        /* the sample's family is the last one declared */
        assert_true(n > 0);
        const char *fam = families[n - 1];
        if (!strcmp(types[n - 1], "histogram")) {
            size_t fl = strlen(fam);
            assert_true(!strncmp(buf, fam, fl));
            const char *suffix = buf + fl;
            assert_true(!strcmp(suffix, "_bucket") || !strcmp(suffix, "_sum") || !strcmp(suffix, "_count"));
        } else if (!strcmp(types[n - 1], "summary")) {
            /* no quantiles are exported: just _sum and _count */
            size_t fl = strlen(fam);
            assert_true(!strncmp(buf, fam, fl));
            assert_true(!strcmp(buf + fl, "_sum") || !strcmp(buf + fl, "_count"));
        } else {
            assert_string_equal(buf, fam);
        }
    }
}

/* The buckets of one histogram series, in order; checks they are
 * cumulative, that the last is le="+Inf" and equals _count. labels is
 * "" or "k=\"v\",...," (the labels before le). Returns the +Inf count. */
static double mt_check_histogram(const char *text, const char *name, const char *labels, const char *count_series) {
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%s_bucket{%sle=\"", name, labels);
    double prev = 0, inf = -1;
    int buckets = 0;
    for (const char *p = strstr(text, prefix); p; p = strstr(p + 1, prefix)) {
        const char *le = p + strlen(prefix);
        const char *close = strstr(le, "\"} ");
        assert_non_null(close);
        double v = strtod(close + 3, NULL);
        assert_true(v >= prev);
        prev = v;
        buckets++;
        if (!strncmp(le, "+Inf\"", 5)) {
            inf = v;
            assert_null(strstr(close, prefix)); /* +Inf is the last bucket */
        }
    }
    assert_true(buckets >= 2);
    assert_true(inf >= 0);
    assert_true(mt_value(text, count_series) == inf);
    return inf;
}

static void test_empty_families(void **state) {
    (void)state;
    ls_metrics m;
    ls_metrics_init(&m);
    char *text = ls_metrics_render(&m, NULL, NULL);
    assert_non_null(text);
    mt_check_format(text);
    const char *families[] = {
        "# TYPE lorasink_requests_total counter\n",   "# TYPE lorasink_request_duration_seconds histogram\n",
        "# TYPE lorasink_tokens_total counter\n",     "# TYPE lorasink_validation_failures_total counter\n",
        "# TYPE lorasink_batch_requests histogram\n", "# TYPE lorasink_batch_tokens_total counter\n",
        "# TYPE lorasink_queue_depth gauge\n",        "# TYPE lorasink_rejected_overload_total counter\n",
        "# TYPE lorasink_batch_wait_seconds summary\n",  "# TYPE lorasink_forwards_receiving gauge\n",
        "# TYPE lorasink_adapter_loads_running gauge\n",
    };
    for (size_t i = 0; i < sizeof families / sizeof *families; i++)
        if (!mt_has(text, families[i])) fail_msg("missing %s", families[i]);
    assert_true(mt_value(text, "lorasink_tokens_total") == 0);
    assert_true(mt_value(text, "lorasink_queue_depth") == 0);
    assert_true(mt_value(text, "lorasink_forwards_receiving") == 0);
    assert_true(mt_value(text, "lorasink_adapter_loads_running") == 0);
    assert_true(mt_value(text, "lorasink_rejected_overload_total") == 0);
    assert_true(mt_check_histogram(text, "lorasink_batch_requests", "", "lorasink_batch_requests_count") == 0);
    /* no series yet, no pool given */
    assert_false(mt_has(text, "lorasink_requests_total{"));
    assert_false(mt_has(text, "lorasink_validation_failures_total{"));
    assert_false(mt_has(text, "lorasink_pool_"));
    free(text);
    ls_metrics_free(&m);
}

static void test_request_series(void **state) {
    (void)state;
    ls_metrics m;
    ls_metrics_init(&m);
    ls_metrics_observe_request(&m, "/health", 200, 0.0003);
    ls_metrics_observe_request(&m, "/health", 200, 0.0005); /* on a bound: counted in it */
    ls_metrics_observe_request(&m, "/forward", 200, 0.003);
    ls_metrics_observe_request(&m, "/forward", 400, 20.0); /* past every finite bound */
    char *text = ls_metrics_render(&m, NULL, NULL);
    mt_check_format(text);

    assert_true(mt_value(text, "lorasink_requests_total{route=\"/health\",status=\"200\"}") == 2);
    assert_true(mt_value(text, "lorasink_requests_total{route=\"/forward\",status=\"200\"}") == 1);
    assert_true(mt_value(text, "lorasink_requests_total{route=\"/forward\",status=\"400\"}") == 1);

    const char *h = "lorasink_request_duration_seconds";
    assert_true(mt_check_histogram(text, h, "route=\"/health\",status=\"200\",",
                                   "lorasink_request_duration_seconds_count{route=\"/health\",status=\"200\"}") == 2);
    assert_true(mt_duration(text, "/health", 200, "0.0005") == 2);
    assert_true(fabs(mt_duration(text, "/health", 200, "sum") - 0.0008) < 1e-9);

    mt_check_histogram(text, h, "route=\"/forward\",status=\"200\",",
                       "lorasink_request_duration_seconds_count{route=\"/forward\",status=\"200\"}");
    assert_true(mt_duration(text, "/forward", 200, "0.0025") == 0);
    assert_true(mt_duration(text, "/forward", 200, "0.005") == 1);
    assert_true(mt_duration(text, "/forward", 200, "10") == 1);

    /* Slower than the last bound: only +Inf, _count and _sum have it. */
    mt_check_histogram(text, h, "route=\"/forward\",status=\"400\",",
                       "lorasink_request_duration_seconds_count{route=\"/forward\",status=\"400\"}");
    assert_true(mt_duration(text, "/forward", 400, "10") == 0);
    assert_true(mt_duration(text, "/forward", 400, "+Inf") == 1);
    assert_true(mt_duration(text, "/forward", 400, "count") == 1);
    assert_true(mt_duration(text, "/forward", 400, "sum") == 20.0);
    free(text);
    ls_metrics_free(&m);
}

/* Past LS_METRICS_MAX_SERIES distinct (route, status) pairs new ones are
 * dropped; the existing ones keep counting. */
static void test_series_cap(void **state) {
    (void)state;
    ls_metrics m;
    ls_metrics_init(&m);
    for (int s = 0; s < LS_METRICS_MAX_SERIES + 10; s++) ls_metrics_observe_request(&m, "/pool", 1000 + s, 0.001);
    ls_metrics_observe_request(&m, "/pool", 1000, 0.001);
    assert_int_equal(m.n_series, LS_METRICS_MAX_SERIES);
    char *text = ls_metrics_render(&m, NULL, NULL);
    mt_check_format(text);
    assert_true(mt_value(text, "lorasink_requests_total{route=\"/pool\",status=\"1000\"}") == 2);
    char last[128];
    snprintf(last, sizeof last, "lorasink_requests_total{route=\"/pool\",status=\"%d\"}",
             1000 + LS_METRICS_MAX_SERIES - 1);
    assert_true(mt_value(text, last) == 1);
    snprintf(last, sizeof last, "status=\"%d\"", 1000 + LS_METRICS_MAX_SERIES);
    assert_false(mt_has(text, last));
    free(text);
    ls_metrics_free(&m);
}

static void test_counters_and_gauge(void **state) {
    (void)state;
    ls_metrics m;
    ls_metrics_init(&m);
    ls_metrics_add_tokens(&m, 5);
    ls_metrics_add_tokens(&m, 7);
    ls_metrics_overload(&m);
    ls_metrics_overload(&m);
    ls_metrics_set_queue_depth(&m, 4);
    char *text = ls_metrics_render(&m, NULL, NULL);
    mt_check_format(text);
    assert_true(mt_value(text, "lorasink_tokens_total") == 12);
    assert_true(mt_value(text, "lorasink_rejected_overload_total") == 2);
    assert_true(mt_value(text, "lorasink_queue_depth") == 4);
    free(text);
    /* a gauge follows the last value set, down as well as up */
    ls_metrics_set_queue_depth(&m, 1);
    text = ls_metrics_render(&m, NULL, NULL);
    assert_true(mt_value(text, "lorasink_queue_depth") == 1);
    free(text);
    ls_metrics_free(&m);
}

static void test_validation_failures(void **state) {
    (void)state;
    ls_metrics m;
    ls_metrics_init(&m);
    ls_metrics_validation_failure(&m, LS_LORA_RANK_TOO_LARGE);
    ls_metrics_validation_failure(&m, LS_LORA_RANK_TOO_LARGE);
    ls_metrics_validation_failure(&m, LS_SAFETENSORS_INVALID);
    ls_metrics_validation_failure(&m, LS_STATUS_COUNT); /* out of range: ignored */
    ls_metrics_validation_failure(&m, (ls_status)-1); /* likewise */
    char *text = ls_metrics_render(&m, NULL, NULL);
    mt_check_format(text);
    char series[160];
    snprintf(series, sizeof series, "lorasink_validation_failures_total{code=\"%s\"}",
             ls_status_code(LS_LORA_RANK_TOO_LARGE));
    assert_true(mt_value(text, series) == 2);
    snprintf(series, sizeof series, "lorasink_validation_failures_total{code=\"%s\"}",
             ls_status_code(LS_SAFETENSORS_INVALID));
    assert_true(mt_value(text, series) == 1);
    /* only the codes seen */
    int lines = 0;
    for (const char *p = strstr(text, "lorasink_validation_failures_total{"); p;
         p = strstr(p + 1, "lorasink_validation_failures_total{"))
        lines++;
    assert_int_equal(lines, 2);
    free(text);
    ls_metrics_free(&m);
}

/* Queue and compute seconds: one observation per request; a backend
 * call serving three requests counts three times. */
static void test_forward_seconds(void **state) {
    (void)state;
    ls_metrics m;
    ls_metrics_init(&m);
    ls_metrics_observe_forward_queue(&m, 0.0004);
    ls_metrics_observe_forward_queue(&m, 0.02);
    ls_metrics_observe_forward_compute(&m, 0.003, 3);
    ls_metrics_observe_forward_compute(&m, 20, 1); /* past the last bound */
    char *text = ls_metrics_render(&m, NULL, NULL);
    mt_check_format(text);
    assert_true(mt_has(text, "# TYPE lorasink_forward_queue_seconds histogram\n"));
    assert_true(mt_has(text, "# TYPE lorasink_forward_compute_seconds histogram\n"));
    assert_true(mt_check_histogram(text, "lorasink_forward_queue_seconds", "", "lorasink_forward_queue_seconds_count") ==
                2);
    assert_true(mt_check_histogram(text, "lorasink_forward_compute_seconds", "",
                                   "lorasink_forward_compute_seconds_count") == 4);
    assert_true(mt_value(text, "lorasink_forward_queue_seconds_bucket{le=\"0.0005\"}") == 1);
    assert_true(mt_value(text, "lorasink_forward_queue_seconds_bucket{le=\"0.025\"}") == 2);
    assert_true(mt_value(text, "lorasink_forward_compute_seconds_bucket{le=\"0.0025\"}") == 0);
    assert_true(mt_value(text, "lorasink_forward_compute_seconds_bucket{le=\"0.005\"}") == 3);
    assert_true(mt_value(text, "lorasink_forward_compute_seconds_bucket{le=\"10\"}") == 3);
    assert_true(mt_value(text, "lorasink_forward_compute_seconds_bucket{le=\"+Inf\"}") == 4);
    assert_true(fabs(mt_value(text, "lorasink_forward_compute_seconds_sum") - (0.009 + 20)) < 1e-9);
    free(text);
    ls_metrics_free(&m);
}

/* A CUDA device as the metrics see it: 1 GiB free of 4 GiB, and NVML's
 * busy percent when the test gives one (dev_util < 0: no NVML). */
static int dev_util = -1;

static ls_status dev_memory(ls_backend *be, size_t *free_b, size_t *total_b, ls_error *err) {
    (void)be, (void)err;
    *free_b = (size_t)1 << 30, *total_b = (size_t)4 << 30;
    return LS_OK;
}

static bool dev_utilization(const ls_backend *be, unsigned *percent) {
    (void)be;
    if (dev_util < 0) return false;
    *percent = (unsigned)dev_util;
    return true;
}

/* The device gauges: memory used and total, and utilisation as a ratio
 * only where NVML gives it (never a made-up 0); none on other backends. */
static void test_device_gauges(void **state) {
    (void)state;
    const ls_dims d = {.n = 2, .H = 6, .F = 3, .L = 1, .w13_layout = LS_W13_INTERLEAVED};
    pt_fake *fk = pt_fake_create(d, 1, 4, 16);
    ls_metrics m;
    ls_metrics_init(&m);
    char *text = ls_metrics_render(&m, NULL, fk->be);
    assert_false(mt_has(text, "lorasink_device_"));
    free(text);
    const ls_backend_ops *fake_ops = fk->be->ops;
    ls_backend_ops cuda = *fake_ops;
    cuda.name = "cuda", cuda.memory = dev_memory, cuda.utilization = dev_utilization;
    fk->be->ops = &cuda;
    dev_util = 37;
    text = ls_metrics_render(&m, NULL, fk->be);
    mt_check_format(text);
    assert_true(mt_value(text, "lorasink_device_memory_used_bytes") == 3.0 * (1 << 30));
    assert_true(mt_value(text, "lorasink_device_memory_total_bytes") == 4.0 * (1 << 30));
    assert_true(mt_has(text, "# TYPE lorasink_device_utilization_ratio gauge\n"));
    assert_true(fabs(mt_value(text, "lorasink_device_utilization_ratio") - 0.37) < 1e-9);
    free(text);
    dev_util = -1;
    text = ls_metrics_render(&m, NULL, fk->be);
    mt_check_format(text);
    assert_true(mt_has(text, "lorasink_device_memory_total_bytes"));
    assert_false(mt_has(text, "lorasink_device_utilization_ratio"));
    free(text);
    fk->be->ops = fake_ops;
    ls_metrics_free(&m);
    ls_backend_free(fk->be);
}

static void test_batch_histogram(void **state) {
    (void)state;
    ls_metrics m;
    ls_metrics_init(&m);
    ls_metrics_observe_batch(&m, 1, 3);
    ls_metrics_observe_batch(&m, 3, 10);
    ls_metrics_observe_batch(&m, 5, 20);
    ls_metrics_observe_batch(&m, 5000, 5000); /* past the last bound */
    char *text = ls_metrics_render(&m, NULL, NULL);
    mt_check_format(text);
    assert_true(mt_check_histogram(text, "lorasink_batch_requests", "", "lorasink_batch_requests_count") == 4);
    assert_true(mt_value(text, "lorasink_batch_requests_bucket{le=\"1\"}") == 1);
    assert_true(mt_value(text, "lorasink_batch_requests_bucket{le=\"2\"}") == 1);
    assert_true(mt_value(text, "lorasink_batch_requests_bucket{le=\"4\"}") == 2);
    assert_true(mt_value(text, "lorasink_batch_requests_bucket{le=\"8\"}") == 3);
    assert_true(mt_value(text, "lorasink_batch_requests_bucket{le=\"4096\"}") == 3);
    assert_true(mt_value(text, "lorasink_batch_requests_bucket{le=\"+Inf\"}") == 4);
    assert_true(mt_value(text, "lorasink_batch_requests_sum") == 1 + 3 + 5 + 5000);
    assert_true(mt_value(text, "lorasink_batch_tokens_total") == 3 + 10 + 20 + 5000);
    assert_true(mt_value(text, "lorasink_batch_wait_seconds_count") == 0);
    free(text);
    ls_metrics_observe_batch_wait(&m, 0.25);
    ls_metrics_observe_batch_wait(&m, 0.5);
    text = ls_metrics_render(&m, NULL, NULL);
    mt_check_format(text);
    assert_true(mt_value(text, "lorasink_batch_wait_seconds_count") == 2);
    assert_true(mt_value(text, "lorasink_batch_wait_seconds_sum") == 0.75);
    free(text);
    ls_metrics_free(&m);
}

/* The pool's families, read from the pool at render time. */
static void test_pool_families(void **state) {
    (void)state;
    const ls_dims d = {.n = 2, .H = 6, .F = 3, .L = 2, .w13_layout = LS_W13_INTERLEAVED};
    pt_fake *fk = pt_fake_create(d, 3, 4, 16);
    ls_pool *p = pt_pool(fk->be, 8, NULL, NULL);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(pt_load(p, &d, "a", 2, 1, true, false, NULL, NULL, &err), LS_OK);
    assert_int_equal(pt_load(p, &d, "b", 3, 2, false, false, NULL, NULL, &err), LS_OK);
    ls_pool_stats st;
    ls_slot_info *slots;
    assert_int_equal(ls_pool_snapshot(p, &slots, &st, NULL), LS_OK);
    free(slots);

    ls_metrics m;
    ls_metrics_init(&m);
    char *text = ls_metrics_render(&m, p, NULL);
    mt_check_format(text);
    assert_true(mt_value(text, "lorasink_pool_slots") == 3);
    assert_true(mt_value(text, "lorasink_pool_slots_used") == 2);
    assert_true(mt_value(text, "lorasink_pool_slots_pinned") == 1);
    assert_true(mt_value(text, "lorasink_pool_bytes") == (double)st.bytes_total);
    assert_true(mt_value(text, "lorasink_adapters_registered") == 2);
    assert_true(mt_value(text, "lorasink_host_cache_adapters") == st.host_used);
    assert_true(mt_value(text, "lorasink_host_cache_bytes") == (double)st.host_bytes);
    assert_true(mt_value(text, "lorasink_pool_loads_total") == 2);
    assert_true(mt_value(text, "lorasink_pool_evictions_total") == 0);
    assert_true(mt_value(text, "lorasink_pool_hits_total") == 0);
    assert_true(mt_value(text, "lorasink_pool_misses_total") == 0);
    assert_true(mt_has(text, "# TYPE lorasink_pool_slots gauge\n"));
    assert_true(mt_has(text, "# TYPE lorasink_pool_loads_total counter\n"));
    free(text);

    /* A forward that hits: the counters move. */
    const char *names[] = {"a", "b", NULL};
    float x[3 * 6] = {0}, y[3 * 6];
    ls_pool_used used[3];
    int n_used;
    assert_int_equal(pc_pool_forward(p, 0, 3, x, NULL, names, y, used, &n_used, &err), LS_OK);
    text = ls_metrics_render(&m, p, NULL);
    assert_true(mt_value(text, "lorasink_pool_hits_total") == 2);
    free(text);

    ls_metrics_free(&m);
    ls_error_free(&err);
    ls_pool_free(p);
    ls_backend_free(fk->be);

    /* A host tier of 2 behind 2 slots: the third load pushes the least
     * recently used adapter out of host memory, which /pool counts as
     * host_drops and the metrics as lorasink_host_cache_drops_total. */
    pc_reload_ctx rc = {0};
    pc_fx f = pc_fx_make(2, 16, 2, pc_reload, &rc);
    ls_metrics_init(&m);
    text = ls_metrics_render(&m, f.p, NULL);
    assert_true(mt_value(text, "lorasink_host_cache_drops_total") == 0);
    assert_true(mt_has(text, "# TYPE lorasink_host_cache_drops_total counter\n"));
    free(text);
    const char *ids[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        char path[64];
        snprintf(path, sizeof path, "seed:%llu", (unsigned long long)pc_seed_of(ids[i], 1));
        assert_int_equal(pc_load(f.p, ids[i], 1, false, false, path, NULL, NULL), LS_OK);
    }
    assert_int_equal(pc_stats(f.p).host_drops, 1);
    text = ls_metrics_render(&m, f.p, NULL);
    mt_check_format(text);
    assert_true(mt_value(text, "lorasink_host_cache_drops_total") == 1);
    free(text);
    ls_metrics_free(&m);
    pc_fx_free(&f);
}

/* The sample line that starts with prefix (borrowed), or NULL. */
static const char *mt_line(const char *text, const char *prefix) {
    for (const char *line = text; *line;) {
        if (!strncmp(line, prefix, strlen(prefix))) return line;
        const char *end = strchr(line, '\n');
        if (!end) break;
        line = end + 1;
    }
    return NULL;
}

/* build_info names the version and the backend; process_* come from
 * /proc/self under their standard names and types. */
static void test_build_and_process(void **state) {
    (void)state;
    const ls_dims d = {.n = 2, .H = 6, .F = 3, .L = 2, .w13_layout = LS_W13_INTERLEAVED};
    pt_fake *fk = pt_fake_create(d, 3, 4, 16);
    ls_metrics m;
    ls_metrics_init(&m);
    char *text = ls_metrics_render(&m, NULL, fk->be);
    mt_check_format(text);
    char want[256];
    snprintf(want, sizeof want, "lorasink_build_info{version=\"%s\",backend=\"%s\",isa=\"", LS_VERSION,
             ls_backend_name(fk->be));
    const char *build = mt_line(text, want);
    if (!build) fail_msg("no %s in:\n%s", want, text);
    assert_non_null(strstr(build, "\",compiler=\""));
    assert_true(!strncmp(strchr(build, '}'), "} 1\n", 4));
    assert_true(mt_has(text, "# TYPE lorasink_build_info gauge\n"));

    assert_true(mt_has(text, "# TYPE process_cpu_seconds_total counter\n"));
    const char *gauges[] = {"process_resident_memory_bytes", "process_virtual_memory_bytes", "process_open_fds",
                            "process_max_fds", "process_start_time_seconds"};
    for (size_t i = 0; i < sizeof gauges / sizeof *gauges; i++) {
        char type[96];
        snprintf(type, sizeof type, "# TYPE %s gauge\n", gauges[i]);
        if (!mt_has(text, type)) fail_msg("missing %s", type);
        assert_true(mt_value(text, gauges[i]) > 0);
    }
    assert_true(mt_value(text, "process_resident_memory_bytes") <= mt_value(text, "process_virtual_memory_bytes"));
    assert_true(mt_value(text, "process_open_fds") <= mt_value(text, "process_max_fds"));
    double now = (double)time(NULL), start = mt_value(text, "process_start_time_seconds");
    assert_true(start <= now + 2 && start > now - 3600);
    assert_true(mt_value(text, "process_cpu_seconds_total") >= 0);
    free(text);
    ls_metrics_free(&m);
    ls_backend_free(fk->be);
}

/* Per-adapter counters and gauges, read from the pool: requests and
 * tokens counted by ls_pool_count_served, loads and evictions by the
 * pool, in flight from the references requests hold; a replace keeps
 * the name's counters. lora_requests_info lists held adapters. */
static void test_adapter_series(void **state) {
    (void)state;
    const ls_dims d = {.n = 2, .H = 6, .F = 3, .L = 2, .w13_layout = LS_W13_INTERLEAVED};
    pt_fake *fk = pt_fake_create(d, 2, 4, 16);
    ls_pool *p = pt_pool(fk->be, 8, NULL, NULL);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(pt_load(p, &d, "a", 2, 1, false, false, NULL, NULL, &err), LS_OK);
    assert_int_equal(pt_load(p, &d, "b", 2, 2, false, false, NULL, NULL, &err), LS_OK);
    assert_int_equal(pt_load(p, &d, "c", 2, 3, false, false, NULL, NULL, &err), LS_OK); /* evicts a */
    const char *names[] = {"a", "a", NULL};
    float x[3 * 6] = {0}, y[3 * 6];
    ls_pool_used used[3];
    int n_used;
    assert_int_equal(pc_pool_forward(p, 0, 3, x, NULL, names, y, used, &n_used, &err), LS_OK); /* loads a again */
    assert_int_equal(n_used, 1);
    const uint64_t tokens[] = {2};
    ls_pool_count_served(p, used, tokens, 1);
    ls_pool_count_served(p, used, tokens, 1);

    ls_metrics m;
    ls_metrics_init(&m);
    char *text = ls_metrics_render(&m, p, NULL);
    mt_check_format(text);
    assert_true(mt_value(text, "lorasink_adapter_requests_total{adapter=\"a\"}") == 2);
    assert_true(mt_value(text, "lorasink_adapter_tokens_total{adapter=\"a\"}") == 4);
    assert_true(mt_value(text, "lorasink_adapter_loads_total{adapter=\"a\"}") == 2);
    assert_true(mt_value(text, "lorasink_adapter_evictions_total{adapter=\"a\"}") == 1);
    assert_true(mt_value(text, "lorasink_adapter_requests_total{adapter=\"b\"}") == 0);
    assert_true(mt_value(text, "lorasink_adapter_loads_total{adapter=\"c\"}") == 1);
    assert_true(mt_value(text, "lorasink_adapter_resident{adapter=\"a\"}") == 1);
    assert_true(mt_value(text, "lorasink_adapter_in_flight{adapter=\"a\"}") == 0);
    assert_true(mt_value(text, "lorasink_adapters_folded") == 0);
    assert_false(mt_has(text, "{adapter=\"_other\"}"));
    assert_true(mt_has(text, "# TYPE lorasink_adapter_requests_total counter\n"));
    assert_true(mt_has(text, "# TYPE lorasink_adapter_in_flight gauge\n"));
    assert_true(mt_value(text, "lorasink_lora_requests_info{running_lora_adapters=\"\",waiting_lora_adapters=\"\","
                               "max_lora=\"2\"}") == 1);
    free(text);

    /* Held by requests: a resident one runs, one not resident waits. */
    ls_pool_hold *ha, *hb;
    assert_int_equal(ls_pool_debug_hold(p, "a", &ha, &err), LS_OK);
    assert_int_equal(ls_pool_debug_hold(p, "b", &hb, &err), LS_OK);
    ls_adapter_info ib;
    assert_int_equal(ls_pool_describe(p, "b", &ib, &err), LS_OK);
    text = ls_metrics_render(&m, p, NULL);
    mt_check_format(text);
    assert_true(mt_value(text, "lorasink_adapter_in_flight{adapter=\"a\"}") == 1);
    const char *info = ib.slot >= 0 ? "lorasink_lora_requests_info{running_lora_adapters=\"a,b\",waiting_lora_adapters="
                                      "\"\",max_lora=\"2\"}"
                                    : "lorasink_lora_requests_info{running_lora_adapters=\"a\",waiting_lora_adapters="
                                      "\"b\",max_lora=\"2\"}";
    assert_true(mt_value(text, info) == 1);
    free(text);
    ls_pool_debug_release(p, ha);
    ls_pool_debug_release(p, hb);

    /* A replace keeps the name's counters; a delete drops its series. */
    assert_int_equal(pt_load(p, &d, "a", 2, 9, false, true, NULL, NULL, &err), LS_OK);
    assert_int_equal(ls_pool_delete(p, "b", NULL, &err), LS_OK);
    text = ls_metrics_render(&m, p, NULL);
    assert_true(mt_value(text, "lorasink_adapter_requests_total{adapter=\"a\"}") == 2);
    assert_true(mt_value(text, "lorasink_adapter_loads_total{adapter=\"a\"}") >= 2);
    assert_false(mt_has(text, "adapter=\"b\""));
    free(text);

    ls_metrics_free(&m);
    ls_error_free(&err);
    ls_pool_free(p);
    ls_backend_free(fk->be);
}

/* The first LS_METRICS_MAX_ADAPTERS names in byte order get series of
 * their own; the rest, and an adapter named "_other" itself, are summed
 * under adapter="_other". The running list in lora_requests_info is
 * capped the same way. */
static void test_adapter_label_cap(void **state) {
    (void)state;
    const ls_dims d = {.n = 2, .H = 6, .F = 3, .L = 2, .w13_layout = LS_W13_INTERLEAVED};
    const int total = LS_METRICS_MAX_ADAPTERS + 3;
    pt_fake *fk = pt_fake_create(d, 2, 4, 16);
    ls_pool *p = pt_pool(fk->be, total + 1, NULL, NULL);
    ls_error err;
    ls_error_init(&err);
    ls_pool_hold *holds[LS_METRICS_MAX_ADAPTERS + 3];
    for (int i = 0; i < total; i++) {
        char name[16];
        snprintf(name, sizeof name, "n%03d", i);
        assert_int_equal(pt_load(p, &d, name, 2, (uint64_t)i + 1, false, false, NULL, NULL, &err), LS_OK);
        assert_int_equal(ls_pool_debug_hold(p, name, &holds[i], &err), LS_OK);
    }
    assert_int_equal(pt_load(p, &d, "_other", 2, 99, false, false, NULL, NULL, &err), LS_OK);
    ls_metrics m;
    ls_metrics_init(&m);
    char *text = ls_metrics_render(&m, p, NULL);
    mt_check_format(text);
    int own = 0;
    for (const char *q = strstr(text, "lorasink_adapter_in_flight{adapter=\"n"); q;
         q = strstr(q + 1, "lorasink_adapter_in_flight{adapter=\"n"))
        own++;
    assert_int_equal(own, LS_METRICS_MAX_ADAPTERS);
    char last[96];
    snprintf(last, sizeof last, "lorasink_adapter_in_flight{adapter=\"n%03d\"}", LS_METRICS_MAX_ADAPTERS - 1);
    assert_true(mt_value(text, last) == 1);
    snprintf(last, sizeof last, "adapter=\"n%03d\"", LS_METRICS_MAX_ADAPTERS);
    assert_false(mt_has(text, last));
    /* n064..n066 and "_other": 4 folded, 3 of them held */
    assert_true(mt_value(text, "lorasink_adapters_folded") == 4);
    assert_true(mt_value(text, "lorasink_adapter_in_flight{adapter=\"_other\"}") == 3);
    assert_true(mt_value(text, "lorasink_adapter_loads_total{adapter=\"_other\"}") >= 0);
    /* one _other sample per family, never two */
    const char *info = mt_line(text, "lorasink_lora_requests_info{");
    assert_non_null(info);
    const char *end = strchr(info, '\n');
    int commas = 0;
    for (const char *c = info; c < end; c++) commas += *c == ',';
    /* 64 names and ",_other" across running and waiting (2 separators of
     * labels), whichever list each held adapter is in */
    assert_true(commas <= 2 * LS_METRICS_MAX_ADAPTERS + 2);
    assert_non_null(strstr(info, "_other"));
    free(text);
    for (int i = 0; i < total; i++) ls_pool_debug_release(p, holds[i]);
    ls_metrics_free(&m);
    ls_error_free(&err);
    ls_pool_free(p);
    ls_backend_free(fk->be);
}

/* Names reach label values escaped as the format wants: backslash, double
 * quote and line feed (the HTTP API allows none of them, but the pool and
 * a state directory do not check). */
static void test_label_escaping(void **state) {
    (void)state;
    const ls_dims d = {.n = 2, .H = 6, .F = 3, .L = 2, .w13_layout = LS_W13_INTERLEAVED};
    pt_fake *fk = pt_fake_create(d, 2, 4, 16);
    ls_pool *p = pt_pool(fk->be, 8, NULL, NULL);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(pt_load(p, &d, "q\"b\\s\nn", 2, 1, false, false, NULL, NULL, &err), LS_OK);
    ls_pool_hold *h;
    assert_int_equal(ls_pool_debug_hold(p, "q\"b\\s\nn", &h, &err), LS_OK);
    ls_metrics m;
    ls_metrics_init(&m);
    char *text = ls_metrics_render(&m, p, NULL);
    mt_check_format(text);
    assert_true(mt_value(text, "lorasink_adapter_in_flight{adapter=\"q\\\"b\\\\s\\nn\"}") == 1);
    assert_non_null(strstr(text, "running_lora_adapters=\"q\\\"b\\\\s\\nn\""));
    free(text);
    ls_pool_debug_release(p, h);
    ls_metrics_free(&m);
    ls_error_free(&err);
    ls_pool_free(p);
    ls_backend_free(fk->be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_families),      cmocka_unit_test(test_request_series),
        cmocka_unit_test(test_series_cap),          cmocka_unit_test(test_counters_and_gauge),
        cmocka_unit_test(test_validation_failures), cmocka_unit_test(test_batch_histogram), cmocka_unit_test(test_forward_seconds),
        cmocka_unit_test(test_pool_families),       cmocka_unit_test(test_build_and_process),
        cmocka_unit_test(test_adapter_series),      cmocka_unit_test(test_adapter_label_cap),
        cmocka_unit_test(test_label_escaping),      cmocka_unit_test(test_device_gauges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
