/* The batcher through HTTP: concurrent /forward requests are answered from
 * fewer backend calls than requests (the batch histogram in /metrics says
 * so), each result bit-identical to the same request served alone, on
 * every CPU kernel path this machine has, and the same bits on every
 * path; a full queue answers 429 with Retry-After and loses nothing else. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/tensor.h"
#include "format/safetensors.h"
#include "gpu/backend.h"
#include "gpu/cpu/kernels.h"
#include "gpu/cpu/cpu_backend.h"
#include "gpu/cuda/cuda_backend.h"
#include "tests/util/testutil.h"
#include "tests/util/server_driver.h"

#define H 48
#define NREQ 24

static ls_test_server *srv;

/* A PEFT adapter of rank 4 for n = 2 experts of hidden size h and
 * intermediate size f, values from seed, as an inline JSON upload
 * (caller frees). */
static char *adapter_body_dims(const char *name, int h, int f, int seed) {
    json_t *t = json_object();
    const char *p = "model.layers.0.mlp.shared_experts.";
    int shapes[4][2] = {{4, h}, {2 * 2 * f, 4}, {4, 2 * f}, {h, 4}};
    const char *names[4] = {"gate_up_proj.lora_A.weight", "gate_up_proj.lora_B.weight", "down_proj.lora_A.weight",
                            "down_proj.lora_B.weight"};
    for (int k = 0; k < 4; k++) {
        json_t *m = json_array();
        for (int i = 0; i < shapes[k][0]; i++) {
            json_t *row = json_array();
            for (int j = 0; j < shapes[k][1]; j++)
                json_array_append_new(row, json_real(((i * 5 + j * 3 + seed * 7 + k) % 11 - 5) / 64.0));
            json_array_append_new(m, row);
        }
        char full[128];
        snprintf(full, sizeof full, "%s%s", p, names[k]);
        json_object_set_new(t, full, m);
    }
    json_t *j = json_pack("{s:s, s:{s:i, s:i}, s:o}", "name", name, "config", "r", 4, "lora_alpha", 8, "tensors", t);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

/* The same for this file's model (H, F = 16), in a static buffer. */
static const char *adapter_body(const char *name, int seed) {
    static char buf[1 << 16];
    char *s = adapter_body_dims(name, H, 16, seed);
    snprintf(buf, sizeof buf, "%s", s);
    free(s);
    return buf;
}

/* Request i: T in 1..3 tokens, adapters cycling through none, a, b. */
static char *request_body(int i) {
    int T = 1 + i % 3;
    json_t *x = json_array(), *names = json_array();
    for (int t = 0; t < T; t++) {
        json_t *row = json_array();
        for (int h = 0; h < H; h++) json_array_append_new(row, json_real(((i * 13 + t * 7 + h) % 17 - 8) / 16.0));
        json_array_append_new(x, row);
        int a = (i + t) % 3;
        json_array_append_new(names, a == 0 ? json_null() : json_string(a == 1 ? "a" : "b"));
    }
    json_t *j = json_pack("{s:o, s:o}", "x", x, "adapters", names);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

static json_t *post(const char *path, const char *body, long want) {
    ls_test_response r;
    assert_int_equal(ls_test_http(srv, "POST", path, NULL, body, strlen(body), NULL, &r), 0);
    if (r.status != want) fprintf(stderr, "%s -> %ld %s\n", path, r.status, r.body);
    assert_int_equal(r.status, want);
    json_t *j = ls_test_response_json(&r);
    ls_test_response_free(&r);
    return j;
}

static json_t *get_json(const char *path) {
    ls_test_response r;
    assert_int_equal(ls_test_http(srv, "GET", path, NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = ls_test_response_json(&r);
    ls_test_response_free(&r);
    assert_non_null(j);
    return j;
}

/* Scrapes one sample value from /metrics; the sample must be there. */
static double metric(const char *name) {
    double v = ls_test_metric(srv, name);
    assert_true(v >= 0);
    return v;
}

typedef struct {
    int i;
    json_t *result;
    long status;
} worker_arg;

static void *worker(void *arg) {
    worker_arg *w = arg;
    char *body = request_body(w->i);
    ls_test_response r;
    if (ls_test_http(srv, "POST", "/forward", NULL, body, strlen(body), NULL, &r) == 0) {
        w->status = r.status;
        w->result = ls_test_response_json(&r);
        ls_test_response_free(&r);
    }
    free(body);
    return NULL;
}

/* The NREQ requests one after the other; alone[i] gets request i's body. */
static void send_alone(json_t *alone[NREQ]) {
    for (int i = 0; i < NREQ; i++) {
        char *body = request_body(i);
        alone[i] = post("/forward", body, 200);
        free(body);
    }
}

/* The NREQ requests at once, one thread each; w[i] gets request i's answer. */
static void send_together(worker_arg w[NREQ]) {
    pthread_t th[NREQ];
    for (int i = 0; i < NREQ; i++) {
        w[i] = (worker_arg){.i = i};
        pthread_create(&th[i], NULL, worker, &w[i]);
    }
    for (int i = 0; i < NREQ; i++) pthread_join(th[i], NULL);
}

/* Relative L2 distance between two JSON arrays of rows of numbers. */
static double rel_l2(const json_t *got, const json_t *want) {
    double diff = 0, norm = 0;
    assert_int_equal(json_array_size(got), json_array_size(want));
    for (size_t t = 0; t < json_array_size(want); t++) {
        const json_t *g = json_array_get(got, t), *w = json_array_get(want, t);
        assert_int_equal(json_array_size(g), json_array_size(w));
        for (size_t h = 0; h < json_array_size(w); h++) {
            double a = json_number_value(json_array_get(g, h)), b = json_number_value(json_array_get(w, h));
            diff += (a - b) * (a - b);
            norm += b * b;
        }
    }
    return norm > 0 ? sqrt(diff / norm) : sqrt(diff);
}

/* Each request alone, then all at once, on one device: on the CPU the
 * same bits (the README's promise); on CUDA, whose GEMMs may pick another
 * algorithm for another batch size, within the bf16 tolerance of
 * docs/math.md, which a wrong row or adapter would far exceed. */
static void batched_equals_alone(const char *device) {
    const char *args[] = {"--experts", "2", "--hidden", "48", "--intermediate", "16", "--layers", "1", "--slots", "3",
                          "--max-rank", "8", "--batch-wait-us", "300000", "--http-threads", "2", "--device", device,
                          NULL};
    const bool bitwise = !strcmp(device, "cpu");
    srv = ls_test_server_start(args);
    assert_non_null(srv);
    json_t *ready = get_json("/ready");
    assert_string_equal(json_string_value(json_object_get(ready, "backend")), device);
    json_decref(ready);
    json_decref(post("/adapters", adapter_body("a", 1), 201));
    json_decref(post("/adapters", adapter_body("b", 2), 201));

    json_t *alone[NREQ];
    send_alone(alone);
    double calls0 = metric("lorasink_batch_requests_count"), reqs0 = metric("lorasink_batch_requests_sum");
    assert_true(calls0 == NREQ); /* served one at a time: one call each */
    /* ... and none held open for company: a lone client never waits. */
    assert_true(metric("lorasink_batch_wait_seconds_count") == 0);

    /* A client still sending a forward holds each batch open for the
     * whole wait, so the concurrent requests merge however they are
     * scheduled. */
    int slow = ls_test_open_receiving_forward(srv);
    assert_true(slow >= 0);
    worker_arg w[NREQ];
    send_together(w);
    close(slow);
    assert_true(ls_test_wait_receiving(srv, 0));
    double worst = 0;
    for (int i = 0; i < NREQ; i++) {
        assert_int_equal(w[i].status, 200);
        const json_t *y = json_object_get(w[i].result, "y"), *y1 = json_object_get(alone[i], "y");
        if (bitwise) {
            /* bit for bit: JSON reals print every double exactly */
            assert_true(json_equal(y, y1));
        } else {
            double e = rel_l2(y, y1);
            worst = e > worst ? e : worst;
            assert_true(e <= 1e-2);
        }
        assert_true(json_equal(json_object_get(w[i].result, "adapters"), json_object_get(alone[i], "adapters")));
        json_decref(w[i].result);
        json_decref(alone[i]);
    }
    double calls = metric("lorasink_batch_requests_count") - calls0;
    double reqs = metric("lorasink_batch_requests_sum") - reqs0;
    printf("%s: %d concurrent requests served by %.0f backend calls", device, NREQ, calls);
    if (bitwise)
        printf(", each bitwise as alone\n");
    else
        printf(", largest relative L2 distance to alone %.2g\n", worst);
    assert_true(reqs == NREQ);
    assert_true(calls < NREQ);
    assert_true(metric("lorasink_batch_wait_seconds_count") >= 1); /* the merged ones waited */
    assert_int_equal(ls_test_server_stop(srv), 0);
}

static void test_batched_equals_alone(void **state) {
    (void)state;
    batched_equals_alone("cpu");
    if (ls_backend_cuda_available())
        batched_equals_alone("cuda");
    else
        printf("no CUDA device: batching on the cuda backend not tested here\n");
}

/* Starts a server on one kernel path and compute mode with the two
 * adapters loaded. */
static void start_on(const char *isa, const char *compute, bool batching) {
    const char *args[] = {"--experts", "2", "--hidden", "48", "--intermediate", "16", "--layers", "1", "--slots", "3",
                          "--max-rank", "8", "--batch-wait-us", "300000", "--http-threads", "2", "--device", "cpu",
                          "--cpu-isa", isa, "--compute", compute, batching ? "--batching=true" : "--batching=false",
                          NULL};
    srv = ls_test_server_start(args);
    assert_non_null(srv);
    json_decref(post("/adapters", adapter_body("a", 1), 201));
    json_decref(post("/adapters", adapter_body("b", 2), 201));
}

/* On every path: each request alone (batching off), then all of them at
 * once (batched), must give the bits the first path gave alone; *want
 * receives those. Under bf16 compute avx512 is the VDPBF16PS tiles,
 * which need AVX512-BF16. */
static void paths_over_http(const char *compute, json_t **want) {
    const ls_cpu_isa paths[] = {LS_CPU_ISA_AVX512, LS_CPU_ISA_AVX2, LS_CPU_ISA_GENERIC};
    const bool bf16 = !strcmp(compute, "bf16");
    int tested = 0;
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        const char *isa = ls_cpu_isa_name(paths[pi]);
        const ls_cpu_kernels *kb = bf16 ? ls_cpu_kernels_bf16_for(paths[pi]) : NULL;
        if (bf16 ? !kb : !ls_cpu_isa_supported(paths[pi])) {
            printf("this CPU has no %s path%s: not tested here\n", isa, bf16 ? " for bf16 compute" : "");
            continue;
        }
        start_on(isa, compute, false);
        json_t *ready = get_json("/ready");
        assert_string_equal(json_string_value(json_object_get(ready, "isa")), bf16 ? kb->name : isa);
        assert_string_equal(json_string_value(json_object_get(ready, "compute")), compute);
        json_decref(ready);
        json_t *alone[NREQ];
        send_alone(alone);
        assert_int_equal(ls_test_server_stop(srv), 0);

        start_on(isa, compute, true);
        worker_arg w[NREQ];
        send_together(w);
        for (int i = 0; i < NREQ; i++) {
            assert_int_equal(w[i].status, 200);
            if (!want[i]) want[i] = json_incref(alone[i]);
            const json_t *y = json_object_get(alone[i], "y");
            if (!json_equal(y, json_object_get(want[i], "y")) || !json_equal(y, json_object_get(w[i].result, "y"))) {
                fprintf(stderr, "%s, compute %s: request %d differs from the first path alone or from itself batched\n",
                        isa, compute, i);
                fail();
            }
            json_decref(w[i].result);
            json_decref(alone[i]);
        }
        assert_int_equal(ls_test_server_stop(srv), 0);
        tested++;
    }
    assert_true(tested >= 1);
}

/* Both compute modes; bf16 is other numbers (so the flag took effect)
 * within the bf16 tolerance of f32's. */
static void test_paths_over_http(void **state) {
    (void)state;
    json_t *f32[NREQ] = {0}, *bf16[NREQ] = {0};
    paths_over_http("f32", f32);
    paths_over_http("bf16", bf16);
    int differ = 0;
    double worst = 0;
    for (int i = 0; i < NREQ; i++) {
        const json_t *a = json_object_get(bf16[i], "y"), *b = json_object_get(f32[i], "y");
        differ += !json_equal(a, b);
        double e = rel_l2(a, b);
        worst = e > worst ? e : worst;
        json_decref(f32[i]), json_decref(bf16[i]);
    }
    printf("bf16 compute: %d of %d requests differ from f32, largest relative L2 distance %.2g\n", differ, NREQ, worst);
    assert_true(differ > 0);
    assert_true(worst <= 1e-2);
}

static void test_queue_full_is_429(void **state) {
    (void)state;
    const char *args[] = {"--experts", "2", "--hidden", "48", "--intermediate", "16", "--layers", "1",
                          "--batch-wait-us", "1000000", "--max-queue-tokens", "4", "--http-threads", "2", NULL};
    srv = ls_test_server_start(args);
    assert_non_null(srv);
    json_decref(post("/adapters", adapter_body("a", 1), 201));
    json_decref(post("/adapters", adapter_body("b", 2), 201));
    /* A client still sending a forward holds the first batch open for
     * the whole wait, so the others find the queue full. */
    int slow = ls_test_open_receiving_forward(srv);
    assert_true(slow >= 0);
    pthread_t th[6];
    worker_arg w[6];
    for (int i = 0; i < 6; i++) {
        w[i] = (worker_arg){.i = 2 + 3 * i}; /* T = 3 each: only one fits in the queue at a time */
        pthread_create(&th[i], NULL, worker, &w[i]);
        /* The first queued, the others come while the batch is held
         * for the slow client (a second at most): the queue is full. */
        if (i == 0) assert_true(ls_test_wait_metric(srv, "lorasink_queue_depth", 1));
    }
    int ok = 0, overloaded = 0;
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        if (w[i].status == 200) ok++;
        if (w[i].status == 429) {
            overloaded++;
            assert_string_equal(ls_test_error_code(w[i].result), "overloaded");
        }
        json_decref(w[i].result);
    }
    close(slow);
    assert_true(ls_test_wait_receiving(srv, 0)); /* refused ones are counted out */
    assert_true(ok >= 1);
    assert_true(overloaded >= 1);
    assert_int_equal(ok + overloaded, 6);
    assert_true(metric("lorasink_rejected_overload_total") == overloaded);
    ls_test_response r;
    char *body = request_body(0);
    assert_int_equal(ls_test_http(srv, "POST", "/forward", NULL, body, strlen(body), NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    free(body);
    assert_int_equal(ls_test_server_stop(srv), 0);
}

/* Wait (a minute at most, for sanitizer builds) for a /metrics sample,
 * labels included, to be n. */
static void wait_for(const char *sample, double n) {
    for (int i = 0; i < 6000 && metric(sample) != n; i++) usleep(10 * 1000);
    assert_true(metric(sample) == n);
}

static void wait_loads(double n) { wait_for("lorasink_adapter_loads_running", n); }

typedef struct {
    const char *path;
    char *body; /* NULL: none */
    long status;
    const char *method; /* NULL: POST */
} post_arg;

/* For test_waits_hold_no_http_thread: each of these waits for its long
 * forward (minutes on a loaded machine), longer than ls_test_http
 * allows. */
static void *post_worker(void *arg) {
    post_arg *a = arg;
    ls_test_response r;
    if (ls_test_http_long(srv, a->method ? a->method : "POST", a->path, NULL, a->body, a->body ? strlen(a->body) : 0,
                          NULL, &r) == 0) {
        a->status = r.status;
        ls_test_response_free(&r);
    }
    return NULL;
}

/* The adapter of adapter_body_dims as dir/NAME.safetensors (rank 4,
 * lora_alpha 8 in its metadata), for --auto-load. */
static void write_adapter_file(const char *dir, const char *name, int h, int f, int seed) {
    const char *p = "model.layers.0.mlp.shared_experts.";
    const int64_t shapes[4][2] = {{4, h}, {2 * 2 * f, 4}, {4, 2 * f}, {h, 4}};
    const char *names[4] = {"gate_up_proj.lora_A.weight", "gate_up_proj.lora_B.weight", "down_proj.lora_A.weight",
                            "down_proj.lora_B.weight"};
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    for (int k = 0; k < 4; k++) {
        const size_t n = (size_t)(shapes[k][0] * shapes[k][1]);
        ls_tensor t = {.dtype = LS_DTYPE_F32, .ndim = 2, .shape = {shapes[k][0], shapes[k][1]},
                       .nbytes = n * sizeof(float), .owned = true};
        float *v = malloc(t.nbytes);
        assert_non_null(v);
        for (size_t i = 0; i < n; i++) {
            const int r = (int)(i / (size_t)shapes[k][1]), c = (int)(i % (size_t)shapes[k][1]);
            v[i] = (float)(((r * 5 + c * 3 + seed * 7 + k) % 11 - 5) / 64.0);
        }
        t.data = v;
        char full[128];
        snprintf(full, sizeof full, "%s%s", p, names[k]);
        assert_true(ls_tensor_set_add(&set, full, &t));
    }
    assert_true(ls_tensor_set_add_meta(&set, "lora_alpha", "8"));
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(ls_safetensors_write(&set, &buf, &len, NULL), LS_OK);
    ls_tensor_set_free(&set);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, name);
    ls_test_write_file(path, buf, len);
    free(buf);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* When the long forward was sent, and when what was asked beside it was
 * last seen answered while it ran: printed (never asserted) so that a
 * log shows how much room the forward left. */
static double long_sent, beside_done;

/* The long forward's adapter is still on the backend: what was asked
 * meanwhile was answered while it ran, not after. */
static void assert_forward_running(void) {
    json_t *ad = get_json("/adapters/a");
    assert_int_equal(json_integer_value(json_object_get(ad, "in_flight")), 1);
    json_decref(ad);
    beside_done = now_s();
}

static void send_long_forward(pthread_t *t, post_arg *fwd) {
    long_sent = now_s();
    assert_int_equal(pthread_create(t, NULL, post_worker, fwd), 0);
}

static void join_long_forward(pthread_t t) {
    pthread_join(t, NULL);
    print_message("the long forward took %.1f s; what ran beside it was answered %.1f s in\n", now_s() - long_sent,
                  beside_done - long_sent);
}

/* Wait (a minute at most) until the long forward holds "a", which it
 * does from when its body has been read. */
static void wait_forward_running(void) {
    for (int i = 0; i < 6000; i++) {
        json_t *ad = get_json("/adapters/a");
        const bool running = json_integer_value(json_object_get(ad, "in_flight")) == 1;
        json_decref(ad);
        if (running) break;
        usleep(10 * 1000);
    }
    assert_forward_running();
}

/* The model of the tests around a long forward: H and F, and its tokens.
 * A sanitizer slows the requests sent beside the forward as much as the
 * kernels or more (TSan: more), yet with a third of the tokens the
 * forward still outlasted them 20 to 55 times over under TSan and 15 to
 * 80 under ASan (the default build, all tokens: 37 to 125); with all,
 * three such forwards took this test to 883 (TSan) and 836 (ASan) of its
 * 900 s. A forward that ends too soon fails assert_forward_running: it
 * never passes unchecked. */
enum { HD = 2048, FD = 1024, LONG_T = LS_TEST_SANITIZED ? 100 : 300 };

/* Starts srv with the extra arguments (NULL-terminated) on a model where
 * a forward of LONG_T tokens on the portable kernels on one thread is 8
 * GFLOP (under a sanitizer a third of that), seconds to minutes on the backend
 * as the machine is loaded, from a body read
 * fast; registers "a" and returns that forward's body on it (malloc'd;
 * the caller frees it). */
static char *start_long_forward_server(const char *const *extra) {
    const char *args[32] = {"--experts", "2", "--hidden", "2048", "--intermediate", "1024", "--layers", "1",
                            "--device", "cpu", "--cpu-isa", "generic", "--threads", "1"};
    size_t n = 14;
    for (size_t i = 0; extra[i]; i++) {
        assert_true(n + 1 < sizeof args / sizeof args[0]);
        args[n++] = extra[i];
    }
    args[n] = NULL;
    srv = ls_test_server_start(args);
    assert_non_null(srv);
    char *a = adapter_body_dims("a", HD, FD, 1);
    json_decref(post("/adapters", a, 201));
    free(a);
    return ls_test_forward_json(LONG_T, HD, "0.5", NULL, "a");
}

/* A load waits for the backend while a forward runs on it, seconds for a
 * large batch. It used to wait on an HTTP thread: once --http-threads
 * loads (or auto-loading forwards) waited, /health and /ready stopped
 * answering and a load balancer took a healthy replica out. Loads,
 * validations, deletes and auto-loading forwards now wait on offload
 * workers with their connection suspended: with 2 HTTP threads, 3 loads
 * and 3 auto-loading forwards behind a seconds-long forward, the probes,
 * the read-only routes, a validation, an upload that fails validation
 * and forwards that need no load (an
 * adapter with no file, a file remembered as bad) answer while it runs,
 * and every request gets its answer once it has. */
static void test_waits_hold_no_http_thread(void **state) {
    (void)state;
    enum { N = 3 };
    char *dir = ls_test_mkdtemp();
    char name[32];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "auto%d", i);
        write_adapter_file(dir, name, HD, FD, 10 + i);
    }
    const char *extra[] = {"--http-threads", "2", "--auto-load", "--adapter-dir", dir, NULL};
    char *big = start_long_forward_server(extra);
    /* One token for each auto-loading forward. */
    char *one = ls_test_forward_json(1, HD, "0.25", NULL, NULL);
    /* A file that fails validation, remembered as failed from now on. */
    char bad[1024];
    snprintf(bad, sizeof bad, "%s/broken.safetensors", dir);
    ls_test_write_file(bad, "not safetensors at all", 22);
    json_decref(post("/forward?adapter=broken", one, 422));
    post_arg fwd = {.path = "/forward", .body = big};
    post_arg loads[N], autos[N];
    char auto_paths[N][64];
    pthread_t tf, tl[N], ta[N];
    send_long_forward(&tf, &fwd);
    /* The forward holds "a" from when its body has been read; the idle
     * batcher puts it on the backend at once. */
    wait_forward_running();
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "load%d", i);
        loads[i] = (post_arg){.path = "/adapters", .body = adapter_body_dims(name, HD, FD, 2 + i)};
        assert_int_equal(pthread_create(&tl[i], NULL, post_worker, &loads[i]), 0);
    }
    /* All three validated; two hold the backend workers (one per HTTP
     * thread) waiting on the backend, one is queued for them. */
    wait_loads(N);
    for (int i = 0; i < N; i++) {
        snprintf(auto_paths[i], sizeof auto_paths[i], "/forward?adapter=auto%d", i);
        autos[i] = (post_arg){.path = auto_paths[i], .body = one};
        assert_int_equal(pthread_create(&ta[i], NULL, post_worker, &autos[i]), 0);
    }
    /* 6 requests wait behind the forward, more than the 2 HTTP threads.
     * The auto-loads' files are read and validated meanwhile (on the
     * workers that never wait for the backend): 3 uploads and 3 read
     * adapters wait to be registered. */
    wait_loads(2 * N);
    /* Queued for the 2 backend workers (both held by loads): the third
     * load and the 3 auto-loads. */
    wait_for("lorasink_offload_waiting{workers=\"backend\"}", N + 1);
    const char *probes[] = {"/health", "/ready", "/pool", "/adapters", "/metrics"};
    for (size_t i = 0; i < sizeof probes / sizeof *probes; i++) {
        ls_test_response r;
        assert_int_equal(ls_test_http(srv, "GET", probes[i], NULL, NULL, 0, NULL, &r), 0);
        if (r.status != 200) fprintf(stderr, "GET %s -> %ld %s\n", probes[i], r.status, r.body);
        assert_int_equal(r.status, 200);
        ls_test_response_free(&r);
    }
    /* A validation reads and checks an upload but never touches the
     * backend: it must not queue behind the loads that wait for it (it
     * answered at once before they were offloaded, and then took as long
     * as the forward). */
    char *v = adapter_body_dims("v", HD, FD, 9);
    json_t *valid = post("/adapters/validate", v, 200);
    assert_true(json_is_true(json_object_get(valid, "valid")));
    json_decref(valid);
    free(v);
    /* An upload that fails validation is answered too: it is checked
     * before it would queue for the backend. */
    char *wrong = adapter_body_dims("wrong", 48, 16, 9);
    json_decref(post("/adapters", wrong, 422));
    free(wrong);
    /* Nor does a forward naming an adapter the directory lacks (a typo),
     * or one whose file failed as it still is: their answers need no
     * load, and they came after every load queued ahead of them. */
    json_decref(post("/forward?adapter=nosuch", one, 404));
    json_decref(post("/forward?adapter=broken", one, 422));
    /* A bad file never read before is read and answered there too, not
     * behind the loads queued for the backend. */
    snprintf(bad, sizeof bad, "%s/broken2.safetensors", dir);
    ls_test_write_file(bad, "not safetensors either", 22);
    json_decref(post("/forward?adapter=broken2", one, 422));
    /* Nor when the same forward names an adapter another request has
     * read and waits to register: the bad file is the answer, at once. */
    snprintf(bad, sizeof bad, "%s/broken3.safetensors", dir);
    ls_test_write_file(bad, "not safetensors, third", 22);
    char *pair_text = ls_test_forward_json(2, HD, "0.25", NULL, NULL);
    json_t *pair = json_loads(pair_text, 0, NULL);
    free(pair_text);
    assert_non_null(pair);
    json_object_set_new(pair, "adapters", json_pack("[s, s]", "auto0", "broken3"));
    pair_text = json_dumps(pair, JSON_COMPACT);
    json_decref(pair);
    json_decref(post("/forward", pair_text, 422));
    free(pair_text);
    assert_forward_running();
    join_long_forward(tf);
    assert_int_equal(fwd.status, 200);
    for (int i = 0; i < N; i++) {
        pthread_join(tl[i], NULL);
        pthread_join(ta[i], NULL);
        assert_int_equal(loads[i].status, 201);
        assert_int_equal(autos[i].status, 200);
        free(loads[i].body);
    }
    assert_true(metric("lorasink_adapter_loads_running") == 0);
    json_t *list = get_json("/adapters");
    assert_int_equal(json_array_size(json_object_get(list, "adapters")), 1 + 2 * N);
    json_decref(list);
    free(one);
    free(big);
    assert_int_equal(ls_test_server_stop(srv), 0);
    ls_test_rmtree(dir);
    free(dir);
}

/* An adapter an auto-loading forward has read is registered by that
 * forward whatever happens before its turn on the backend: a client
 * uploads the name (the client's adapter serves), the file goes away
 * (what was read serves), an earlier adapter of the same forward fails
 * (that failure is the answer, and the adapter is registered all the
 * same). Each used to leave it read and never registered: the loads
 * gauge stayed above 0 for good, and once the name was free again a
 * later forward registered that old read in place of the file as it had
 * become. One HTTP thread, so one backend worker, held by an upload
 * that waits for a long forward: everything after it queues there in
 * the order sent. */
static void test_read_adapters_always_registered(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    write_adapter_file(dir, "up", HD, FD, 1);
    write_adapter_file(dir, "gone", HD, FD, 2);
    write_adapter_file(dir, "third", HD, FD, 3);
    const char *extra[] = {"--http-threads", "1", "--auto-load", "--adapter-dir", dir, NULL};
    char *big = start_long_forward_server(extra);
    char *one = ls_test_forward_json(1, HD, "0.25", NULL, NULL);
    char *two_text = ls_test_forward_json(2, HD, "0.25", NULL, NULL);
    json_t *two_j = json_loads(two_text, 0, NULL);
    free(two_text);
    assert_non_null(two_j);
    json_object_set_new(two_j, "adapters", json_pack("[s, s]", "r", "third"));
    char *two = json_dumps(two_j, JSON_COMPACT);
    json_decref(two_j);
    /* r is registered by a client and has no file. */
    char *body = adapter_body_dims("r", HD, FD, 4);
    json_decref(post("/adapters", body, 201));
    free(body);

    post_arg fwd = {.path = "/forward", .body = big};
    post_arg hold = {.path = "/adapters", .body = adapter_body_dims("hold", HD, FD, 5)};
    post_arg upload = {.path = "/adapters", .body = adapter_body_dims("up", HD, FD, 6)};
    post_arg f_up = {.path = "/forward?adapter=up", .body = one};
    post_arg f_gone = {.path = "/forward?adapter=gone", .body = one};
    post_arg del = {.path = "/adapters/r", .method = "DELETE"};
    post_arg f_two = {.path = "/forward", .body = two};
    pthread_t tf, th, tu, tfu, tfg, td, tft;
    send_long_forward(&tf, &fwd);
    wait_forward_running();
    assert_int_equal(pthread_create(&th, NULL, post_worker, &hold), 0);
    wait_loads(1);
    /* The upload of "up" waits behind hold; then a forward reads up.safetensors. */
    assert_int_equal(pthread_create(&tu, NULL, post_worker, &upload), 0);
    wait_loads(2);
    assert_int_equal(pthread_create(&tfu, NULL, post_worker, &f_up), 0);
    wait_loads(3);
    /* A forward reads gone.safetensors, which is then removed. */
    assert_int_equal(pthread_create(&tfg, NULL, post_worker, &f_gone), 0);
    wait_loads(4);
    char path[1024];
    snprintf(path, sizeof path, "%s/gone.safetensors", dir);
    assert_int_equal(unlink(path), 0);
    /* r is deleted before the forward naming r, then third, has its
     * turn; third is read meanwhile. Queued for the one backend worker
     * (busy with hold): up's upload, the two forwards' registrations and
     * then the delete. */
    const char *backend_queue = "lorasink_offload_waiting{workers=\"backend\"}";
    wait_for(backend_queue, 3);
    assert_int_equal(pthread_create(&td, NULL, post_worker, &del), 0);
    wait_for(backend_queue, 4);
    assert_int_equal(pthread_create(&tft, NULL, post_worker, &f_two), 0);
    wait_loads(5);
    assert_forward_running();

    join_long_forward(tf);
    pthread_join(th, NULL);
    pthread_join(tu, NULL);
    pthread_join(tfu, NULL);
    pthread_join(tfg, NULL);
    pthread_join(td, NULL);
    pthread_join(tft, NULL);
    assert_int_equal(fwd.status, 200);
    assert_int_equal(hold.status, 201);
    assert_int_equal(upload.status, 201);
    assert_int_equal(f_up.status, 200);
    assert_int_equal(f_gone.status, 200);
    assert_int_equal(del.status, 200);
    assert_int_equal(f_two.status, 404);
    assert_true(metric("lorasink_adapter_loads_running") == 0);
    assert_true(metric(backend_queue) == 0);
    assert_true(metric("lorasink_offload_waiting{workers=\"disk\"}") == 0);
    json_t *ad = get_json("/adapters/up");
    assert_true(json_is_false(json_object_get(ad, "auto_loaded")));
    json_decref(ad);
    json_decref(get_json("/adapters/gone"));
    json_decref(get_json("/adapters/third"));
    /* Nothing read is left over: up deleted and its file bad now, a
     * forward reads the file and answers its 422. */
    ls_test_response r;
    assert_int_equal(ls_test_http(srv, "DELETE", "/adapters/up", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    snprintf(path, sizeof path, "%s/up.safetensors", dir);
    ls_test_write_file(path, "not safetensors at all", 22);
    json_decref(post("/forward?adapter=up", one, 422));
    assert_true(metric("lorasink_adapter_loads_running") == 0);
    free(hold.body);
    free(upload.body);
    free(two);
    free(one);
    free(big);
    assert_int_equal(ls_test_server_stop(srv), 0);
    ls_test_rmtree(dir);
    free(dir);
}

/* A stop waits for clients for --shutdown-timeout only. Replies the
 * server owes are another matter: a load queued behind a long forward, or
 * forwards in the batch queue, used to be cut unanswered once the long
 * forward outlasted the bound (the load went through all the same): the
 * stop closed the connections as soon as the last job was done, while
 * HTTP threads were still writing its replies. With --shutdown-timeout 1
 * and a forward of seconds, every request in flight at the SIGTERM gets
 * its reply: here forwards of 64 tokens (20 under a sanitizer: the four of them
 * make one batch, which must not outweigh the shorter long forward),
 * whose replies take milliseconds to write. */
static void test_stop_finishes_owed_replies(void **state) {
    (void)state;
    enum { N = 4, MID_T = LS_TEST_SANITIZED ? 20 : 64 };
    const char *extra[] = {"--http-threads", "2", "--shutdown-timeout", "1", NULL};
    char *big = start_long_forward_server(extra);
    char *mid = ls_test_forward_json(MID_T, HD, "0.25", NULL, NULL);
    post_arg fwd = {.path = "/forward", .body = big};
    post_arg load = {.path = "/adapters", .body = adapter_body_dims("late", HD, FD, 2)};
    post_arg queued[N];
    pthread_t tf, tl, tq[N];
    send_long_forward(&tf, &fwd);
    wait_forward_running();
    assert_int_equal(pthread_create(&tl, NULL, post_worker, &load), 0);
    wait_loads(1);
    for (int i = 0; i < N; i++) {
        queued[i] = (post_arg){.path = "/forward", .body = mid};
        assert_int_equal(pthread_create(&tq[i], NULL, post_worker, &queued[i]), 0);
    }
    wait_for("lorasink_queue_depth", N);
    assert_forward_running();
    assert_int_equal(kill(ls_test_server_pid(srv), SIGTERM), 0);
    /* The bound passes with all of them still open... */
    assert_true(ls_test_server_wait_output(srv, "still open after 1 s") >= 1);
    join_long_forward(tf);
    pthread_join(tl, NULL);
    for (int i = 0; i < N; i++) pthread_join(tq[i], NULL);
    /* ...and each is answered all the same. */
    assert_int_equal(fwd.status, 200);
    assert_int_equal(load.status, 201);
    for (int i = 0; i < N; i++) assert_int_equal(queued[i].status, 200);
    assert_int_equal(ls_test_server_stop(srv), 0);
    free(load.body);
    free(big);
    free(mid);
}

/* Every batched forward served adds one observation to the queue-time
 * and the compute-time histograms (Triton's queue and compute_infer),
 * and the scrape is a well-formed histogram; a forward refused in the
 * batcher (an adapter nobody has) ran no backend call and adds none, nor
 * batch tokens (each refused one counted as a call of about 10 us); with
 * --batching=false there is no batcher queue, and neither series moves. */
static void test_queue_and_compute_seconds(void **state) {
    (void)state;
    for (int batching = 1; batching >= 0; batching--) {
        start_on("generic", "f32", batching);
        const int K = 5;
        int tokens = 0;
        for (int i = 0; i < K; i++) {
            char *body = request_body(i);
            json_decref(post("/forward", body, 200));
            free(body);
            tokens += 1 + i % 3;
        }
        for (int i = 0; i < 3; i++) {
            json_t *x = json_array(), *row = json_array();
            for (int h = 0; h < H; h++) json_array_append_new(row, json_real(0.25));
            json_array_append_new(x, row);
            json_t *j = json_pack("{s:o, s:[s]}", "x", x, "adapters", "nobody");
            char *body = json_dumps(j, JSON_COMPACT);
            json_decref(j);
            json_decref(post("/forward", body, 404));
            free(body);
        }
        const double want = batching ? K : 0;
        /* The worker observes a batch's compute time after its replies
         * are handed over, so a scrape right after the last reply may
         * come before it: wait for it, bounded. */
        if (batching) wait_for("lorasink_forward_compute_seconds_count", want);
        assert_true(metric("lorasink_forward_queue_seconds_count") == want);
        assert_true(metric("lorasink_forward_queue_seconds_bucket{le=\"+Inf\"}") == want);
        assert_true(metric("lorasink_forward_compute_seconds_count") == want);
        assert_true(metric("lorasink_forward_compute_seconds_bucket{le=\"+Inf\"}") == want);
        /* cumulative buckets: never above the count */
        assert_true(metric("lorasink_forward_compute_seconds_bucket{le=\"0.0005\"}") <= want);
        assert_true(metric("lorasink_forward_queue_seconds_bucket{le=\"10\"}") <= want);
        if (batching) assert_true(metric("lorasink_forward_compute_seconds_sum") > 0);
        if (batching) assert_true(metric("lorasink_batch_tokens_total") == tokens);
        assert_int_equal(ls_test_server_stop(srv), 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_equals_alone),
        cmocka_unit_test(test_paths_over_http),
        cmocka_unit_test(test_queue_and_compute_seconds),
        cmocka_unit_test(test_queue_full_is_429),
        cmocka_unit_test(test_waits_hold_no_http_thread),
        cmocka_unit_test(test_read_adapters_always_registered),
        cmocka_unit_test(test_stop_finishes_owed_replies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
