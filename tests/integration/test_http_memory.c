/* The memory a request makes the server hold, over HTTP against the real
 * binary, each bound measured as peak RSS (VmHWM): adapter files checked
 * from their size and header before they are read (sparse files of
 * 2 GiB and 1 TiB); the host tier's cap held within one forward that
 * names more adapters than it holds, and those adapters' bytes counted
 * in --max-queue-mb; JSON adapter uploads read without a tree of JSON
 * values (docs/api.md states each bound). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "api/base64.h"
#include "common/buf.h"
#include "format/safetensors.h"
#include "tests/util/testutil.h"
#include "tests/util/tiny_server.h"

/* The model the adapter memory tests serve: the demo's shape, so that a
 * rank-64 adapter's normalised factors take 3 MiB of host memory. */
enum { MH = 1024, MF = 512, MN = 2, ML = 2, MR = 64 };
#define M_ADAPTER_BYTES ((double)ML * (2.0 * MR * MH + MN * 2.0 * MF * MR + MN * (double)MR * MF + MH * (double)MR) * 4)
#define MIB 1048576.0

/* A sanitizer's allocator gives each small allocation a redzone and keeps
 * freed ones in quarantine: the bounds of many small tensors are what
 * glibc's malloc gives, checked outside sanitizer builds (those still
 * check every answer). */
#define LS_SMALL_ALLOCS_MEASURED (!LS_TEST_SANITIZED)

/* The server's peak RSS must count what requests hold, not memory a
 * sanitizer keeps in quarantine after it was freed: this environment
 * entry turns the quarantine off. */
static const char *no_quarantine(char *buf, size_t len) {
    const char *prev = getenv("ASAN_OPTIONS");
    snprintf(buf, len, "ASAN_OPTIONS=%s%squarantine_size_mb=0", prev ? prev : "", prev && *prev ? ":" : "");
    return buf;
}

/* A rank-MR PEFT adapter for the MH/MF/MN/ML model as a safetensors file
 * (bf16 factors, lora_alpha in __metadata__), seeded: malloc'd bytes. */
static uint8_t *peft_adapter(uint64_t seed, size_t *len) {
    const char *mods[4] = {"gate_up_proj.lora_A", "gate_up_proj.lora_B", "down_proj.lora_A", "down_proj.lora_B"};
    const int64_t shapes[4][2] = {{MR, MH}, {MN * 2 * MF, MR}, {MR, MN * MF}, {MH, MR}};
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    for (int l = 0; l < ML; l++)
        for (int k = 0; k < 4; k++) {
            const size_t count = (size_t)(shapes[k][0] * shapes[k][1]);
            ls_tensor t = {.dtype = LS_DTYPE_BF16, .ndim = 2, .nbytes = count * 2, .owned = true};
            memcpy(t.shape, shapes[k], sizeof shapes[k]);
            uint16_t *v = malloc(t.nbytes);
            assert_non_null(v);
            for (size_t i = 0; i < count; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                v[i] = ls_f32_to_bf16(((float)(seed >> 40) / 16777216.0f - 0.5f) * 0.02f);
            }
            t.data = v;
            char name[160];
            snprintf(name, sizeof name, "model.layers.%d.mlp.shared_experts.%s.weight", l, mods[k]);
            assert_true(ls_tensor_set_add(&set, name, &t));
        }
    assert_true(ls_tensor_set_add_meta(&set, "lora_alpha", "64"));
    uint8_t *out = NULL;
    assert_int_equal(ls_safetensors_write(&set, &out, len, NULL), LS_OK);
    ls_tensor_set_free(&set);
    return out;
}

/* A forward with one token per name (x row t holds 0.01 * (t % 7 + 1)):
 * malloc'd JSON asking for base64 y, so that rows compare bit for bit. */
static char *forward_names(int T, char names[][16], int first) {
    ls_buf b;
    ls_buf_init(&b);
    const char *head = "{\"encoding\": \"base64\", \"x\": [", *mid = "], \"adapters\": [";
    ls_buf_append(&b, head, strlen(head));
    for (int t = 0; t < T; t++) {
        ls_buf_append(&b, t ? ",[" : "[", t ? 2 : 1);
        for (int h = 0; h < MH; h++) ls_buf_printf(&b, "%s%g", h ? "," : "", 0.01 * ((first + t) % 7 + 1));
        ls_buf_append(&b, "]", 1);
    }
    ls_buf_append(&b, mid, strlen(mid));
    for (int t = 0; t < T; t++) ls_buf_printf(&b, "%s\"%s\"", t ? "," : "", names[first + t]);
    ls_buf_append(&b, "]}", 2);
    char *text = ls_buf_take(&b, NULL);
    assert_non_null(text);
    return text;
}

/* y's base64 text from a forward reply (malloc'd). */
static char *y_data(const ls_test_response *r) {
    json_t *j = ls_test_response_json(r);
    assert_non_null(j);
    const char *d = json_string_value(json_object_get(json_object_get(j, "y"), "data"));
    assert_non_null(d);
    char *copy = strdup(d);
    json_decref(j);
    return copy;
}

/* Row t of a base64 y [T, MH] of f32. */
static void decode_row(const char *b64, int t, float *row) {
    const size_t len = strlen(b64);
    uint8_t *bytes = malloc(ls_base64_decoded_max(len));
    assert_non_null(bytes);
    size_t got;
    assert_true(ls_base64_decode(b64, len, bytes, &got));
    assert_true(got >= (size_t)(t + 1) * MH * sizeof(float));
    memcpy(row, bytes + (size_t)t * MH * sizeof(float), MH * sizeof(float));
    free(bytes);
}

/* GET /pool's host_cache.used. */
static long host_used(const ls_test_server *s) {
    ls_test_response r;
    assert_int_equal(ls_test_http(s, "GET", "/pool", NULL, NULL, 0, NULL, &r), 0);
    json_t *j = ls_test_response_json(&r);
    assert_non_null(j);
    long used = (long)json_integer_value(json_object_get(json_object_get(j, "host_cache"), "used"));
    json_decref(j);
    ls_test_response_free(&r);
    return used;
}

/* Sets the process's peak RSS (VmHWM) to its RSS now (clear_refs 5),
 * so that the next peak is the next request's, not one of start-up. */
static void reset_peak(int pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/clear_refs", pid);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_true(fputs("5", f) >= 0);
    assert_int_equal(fclose(f), 0);
}

/* dir/name as a sparse file of size bytes: holes, read as zeros, that
 * take no disk. */
static void write_sparse(const char *dir, const char *name, long long size) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    if (ftruncate(fd, (off_t)size) != 0) fprintf(stderr, "ftruncate %s to %lld: %s\n", path, size, strerror(errno));
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    close(fd);
}

/* One request on a thread of its own. */
typedef struct {
    const ls_test_server *srv;
    const char *path, *body;
    long status;
    char code[64];
    char *reply; /* owned */
} call;

/* On a thread of its own: a cmocka assertion here would jump to the main
 * thread's stack, so a request without an answer is status -1. */
static void *call_thread(void *arg) {
    call *c = arg;
    ls_test_response r;
    if (ls_test_http(c->srv, "POST", c->path, NULL, c->body, strlen(c->body), NULL, &r) != 0) {
        c->status = -1;
        c->code[0] = '\0';
        c->reply = strdup("(no answer)");
        return NULL;
    }
    c->status = r.status;
    json_t *j = ls_test_response_json(&r);
    snprintf(c->code, sizeof c->code, "%s", j ? ls_test_error_code(j) : "");
    json_decref(j);
    c->reply = r.body;
    r.body = NULL;
    ls_test_response_free(&r);
    return NULL;
}

/* Runs the n calls at once and waits for all of them. */
static void run_calls(call *calls, int n) {
    pthread_t th[16];
    assert_true(n <= 16);
    for (int i = 0; i < n; i++) assert_int_equal(pthread_create(&th[i], NULL, call_thread, &calls[i]), 0);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

/* calls[i] answered status with code, and a message holding want. */
static void expect_call(const call *c, long status, const char *code, const char *want) {
    if (c->status != status || strcmp(c->code, code) || !strstr(c->reply, want))
        fprintf(stderr, "POST %s %s -> %ld: %s\n", c->path, c->body, c->status, c->reply);
    assert_int_equal(c->status, status);
    assert_string_equal(c->code, code);
    assert_non_null(strstr(c->reply, want));
}

/* Adapter files were read whole before their header was checked, with
 * no size cap: four 2 GiB sparse files named by auto-loading forwards
 * took 7.65 GB to answer "header length is 0", a path upload of one
 * read it again every time, and a 1 TiB sparse file answered 500 "out of
 * memory". The size is checked from fstat before any read (413 naming
 * --max-adapter-mb past it) and the header before the data: every way
 * in answers at once, and the server's peak RSS does not grow. */
static void test_large_adapter_files(void **state) {
    (void)state;
    const char *extra[] = {"--auto-load", NULL};
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", extra));
    const long long two_gib = 2LL << 30;
    const char *names[4] = {"z0", "z1", "z2", "z3"};
    for (int i = 0; i < 4; i++) {
        char file[64];
        snprintf(file, sizeof file, "%s.safetensors", names[i]);
        write_sparse(ts.dir, file, two_gib);
    }
    write_sparse(ts.dir, "tib.safetensors", 1LL << 40);
    const int pid = ls_test_server_pid(ts.srv);
    reset_peak(pid);
    const long before = ls_test_proc_kib(pid, "VmHWM");
    /* One path upload first: alone it read the whole 2 GiB. */
    call one = {.srv = ts.srv, .path = "/adapters", .body = "{\"name\": \"z\", \"path\": \"z0.safetensors\"}"};
    call_thread(&one);
    expect_call(&one, 422, "safetensors_invalid", "header length is 0");
    free(one.reply);
    assert_true(ls_test_proc_kib(pid, "VmHWM") - before < 64 * 1024);
    /* Four auto-loading forwards, four path uploads and four validations
     * at once, and each again (a failed file is not read again). */
    char bodies[12][160];
    call calls[12];
    for (int i = 0; i < 4; i++) {
        snprintf(bodies[i], sizeof bodies[i], "{\"x\": [[0.5, -0.25, 0.125, 1.0]], \"adapter\": \"%s\"}", names[i]);
        snprintf(bodies[4 + i], sizeof bodies[4 + i], "{\"name\": \"p%d\", \"path\": \"%s.safetensors\"}", i, names[i]);
        snprintf(bodies[8 + i], sizeof bodies[8 + i], "{\"path\": \"%s.safetensors\"}", names[i]);
    }
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 12; i++)
            calls[i] = (call){.srv = ts.srv, .path = i < 4 ? "/forward" : i < 8 ? "/adapters" : "/adapters/validate",
                              .body = bodies[i]};
        run_calls(calls, 12);
        for (int i = 0; i < 12; i++) {
            expect_call(&calls[i], 422, "safetensors_invalid", "header length is 0");
            free(calls[i].reply);
        }
    }
    /* The 1 TiB file: 413 from its size, by every way in. */
    const char *tib[3][2] = {{"/adapters", "{\"name\": \"t\", \"path\": \"tib.safetensors\"}"},
                             {"/adapters/validate", "{\"path\": \"tib.safetensors\"}"},
                             {"/forward", "{\"x\": [[0.5, -0.25, 0.125, 1.0]], \"adapter\": \"tib\"}"}};
    for (int i = 0; i < 3; i++) {
        call c = {.srv = ts.srv, .path = tib[i][0], .body = tib[i][1]};
        call_thread(&c);
        expect_call(&c, 413, "payload_too_large", "over the limit of 4096 MiB (--max-adapter-mb)");
        assert_null(strstr(c.reply, ts.dir)); /* the path as the client knows it */
        free(c.reply);
    }
    const long grew = ls_test_proc_kib(pid, "VmHWM") - before;
    print_message("25 requests for 2 GiB and 1 TiB adapter files: peak RSS grew by %ld KiB\n", grew);
    assert_true(grew < 64 * 1024);
    /* Nothing was registered; a good adapter still loads. */
    tiny_write_adapter_file(&ts, "good.safetensors", "4");
    json_t *req = json_pack("{s:s, s:s}", "name", "good", "path", "good.safetensors");
    json_decref(tiny_post_json(&ts, "/adapters", req, 201));
    json_decref(req);
    tiny_server_stop(&ts);
}

/* The adapter server: the demo model's shape, a host tier and slots of
 * cap, the adapter directory dir, plus extra arguments. */
static ls_test_server *adapter_server(const char *dir, const char *cap, const char *const *extra) {
    char asan[512];
    const char *env[] = {no_quarantine(asan, sizeof asan), NULL};
    const char *args[32] = {"--demo", "--experts", "2", "--hidden", "1024", "--intermediate", "512", "--layers",
                            ML == 2 ? "2" : "?", "--max-rank", "64", "--slots", cap, "--host-cache", cap,
                            "--adapter-dir", dir};
    int a = 17;
    for (int i = 0; extra && extra[i]; i++) args[a++] = extra[i];
    args[a] = NULL;
    ls_test_server *s = ls_test_server_start_env(args, env);
    assert_non_null(s);
    return s;
}

/* One forward naming n adapters (one token each) against the same tokens
 * served one by one: the same bits (the CPU backend is batch-invariant,
 * and serving in groups changes nothing), and the host tier at its cap
 * after each. Returns the peak RSS growth of the big forward, in bytes. */
static double forward_all_then_each(const ls_test_server *s, char names[][16], int n, long cap) {
    const int pid = ls_test_server_pid(s);
    char *all = forward_names(n, names, 0);
    /* Warm up (thread stacks, engine buffers) on a base forward. */
    char *base = ls_test_forward_json(1, MH, "0.01", NULL, NULL);
    ls_test_response r;
    assert_int_equal(ls_test_http(s, "POST", "/forward", NULL, base, strlen(base), NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    free(base);
    reset_peak(pid);
    const long before = ls_test_proc_kib(pid, "VmHWM");
    assert_int_equal(ls_test_http_long(s, "POST", "/forward", NULL, all, strlen(all), NULL, &r), 0);
    if (r.status != 200) fprintf(stderr, "forward of %d adapters: %ld %s\n", n, r.status, r.body);
    assert_int_equal(r.status, 200);
    const double grew = (double)(ls_test_proc_kib(pid, "VmHWM") - before) * 1024.0;
    char *y = y_data(&r);
    ls_test_response_free(&r);
    free(all);
    const long used = host_used(s);
    print_message("one forward naming %d adapters: peak RSS +%.1f MiB (%.1f MiB an adapter), host_cache.used %ld "
                  "of %ld\n", n, grew / MIB, M_ADAPTER_BYTES / MIB, used, cap);
    assert_true(used <= cap);
    /* Each token alone: its row of y, bit for bit. */
    for (int t = 0; t < n; t++) {
        char *one = forward_names(1, names, t);
        assert_int_equal(ls_test_http(s, "POST", "/forward", NULL, one, strlen(one), NULL, &r), 0);
        assert_int_equal(r.status, 200);
        char *y1 = y_data(&r);
        ls_test_response_free(&r);
        float a[MH], b[MH];
        decode_row(y, t, a);
        decode_row(y1, 0, b);
        assert_memory_equal(a, b, sizeof a);
        free(y1);
        free(one);
        assert_true(host_used(s) <= cap);
    }
    free(y);
    return grew;
}

/* A forward's peak growth against its bound, beside what holding all n
 * adapters at once would take. */
static void assert_held_within(double grew, double bound, int n) {
    print_message("bound %.1f MiB; every adapter held at once would be %.1f MiB\n", bound / MIB,
                  n * M_ADAPTER_BYTES / MIB);
    assert_true(grew <= bound);
}

/* One forward naming 400 auto-loadable rank-64 adapters took the server
 * from 278 MB to 2.5 GB and left host_cache.used at 400 of 64: every file
 * was read and held before any was registered, and every dropped copy
 * read back before the forward ran and kept until it ended. Now at most
 * --host-cache of them wait to be registered, the rest are read one at
 * a time as they are, and the forward reads back what each group of it
 * needs just before the group runs and lets it go after: the peak is a
 * few adapters' worth, not one per name, and the tier is at its cap. */
static void test_autoload_forward_keeps_host_cap(void **state) {
    (void)state;
    enum { N = 48 };
    char *dir = ls_test_mkdtemp();
    char names[N][16];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "ad%02d", i);
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, names[i]);
        size_t len;
        uint8_t *bytes = peft_adapter(1000 + (uint64_t)i, &len);
        ls_test_write_file(path, bytes, len);
        free(bytes);
    }
    const char *extra[] = {"--auto-load", NULL};
    ls_test_server *s = adapter_server(dir, "2", extra);
    const double grew = forward_all_then_each(s, names, N, 2);
    /* The tier (2), what waits to be registered or is read back for a
     * group (2 each), one being read, the file read with it, and 32 MiB
     * for everything else; holding every adapter took N of them. */
    const double bound = 8 * M_ADAPTER_BYTES + 32 * MIB;
    assert_held_within(grew, bound, N);
    assert_int_equal(ls_test_server_stop(s), 0);
    ls_test_rmtree(dir);
    free(dir);
}

/* With --state-dir and --host-cache 8, one forward naming 300 registered
 * adapters left 300 copies: every upload's copy dropped to the state
 * directory was read back at once. Now in groups, as above. */
static void test_state_dir_forward_keeps_host_cap(void **state) {
    (void)state;
    enum { N = 40 };
    char *dir = ls_test_mkdtemp(), *sd = ls_test_mkdtemp();
    const char *extra[] = {"--state-dir", sd, NULL};
    ls_test_server *s = adapter_server(dir, "2", extra);
    char names[N][16];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "up%02d", i);
        size_t len;
        uint8_t *bytes = peft_adapter(2000 + (uint64_t)i, &len);
        char path[64];
        snprintf(path, sizeof path, "/adapters?name=%s", names[i]);
        ls_test_response r;
        assert_int_equal(ls_test_http(s, "POST", path, "application/octet-stream", bytes, len, NULL, &r), 0);
        assert_int_equal(r.status, 201);
        ls_test_response_free(&r);
        free(bytes);
    }
    assert_true(host_used(s) <= 2);
    const double grew = forward_all_then_each(s, names, N, 2);
    const double bound = 6 * M_ADAPTER_BYTES + 32 * MIB;
    assert_held_within(grew, bound, N);
    assert_int_equal(ls_test_server_stop(s), 0);
    ls_test_rmtree(dir);
    ls_test_rmtree(sd);
    free(dir);
    free(sd);
}

/* --max-queue-mb counted a forward's body and tensors but not the
 * adapters it reads into host memory: one naming hundreds of them held
 * gigabytes past the budget. Now what a forward will read (each adapter
 * neither resident nor in the host tier, or not registered yet, at most
 * the read budget of them) is counted from its admission: past the
 * budget it is 429 while others are served, and alone it still runs. */
static void test_queue_budget_counts_adapters(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    char names[3][16] = {"fresh", "res", "base"};
    for (int i = 0; i < 2; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, names[i]);
        size_t len;
        uint8_t *bytes = peft_adapter(3000 + (uint64_t)i, &len);
        ls_test_write_file(path, bytes, len);
        free(bytes);
    }
    /* A 1-token forward holds a few KiB; the adapter it would read 3 MiB. */
    const char *extra[] = {"--auto-load", "--max-queue-mb", "2", "--batch-wait-us", "1000000", NULL};
    ls_test_server *s = adapter_server(dir, "2", extra);
    const char *load = "{\"name\": \"res\", \"path\": \"res.safetensors\"}";
    ls_test_response r;
    assert_int_equal(ls_test_http(s, "POST", "/adapters", NULL, load, strlen(load), NULL, &r), 0);
    assert_int_equal(r.status, 201);
    ls_test_response_free(&r);
    char *base = ls_test_forward_json(1, MH, "0.01", NULL, NULL);
    char *fresh = forward_names(1, names, 0), *res = forward_names(1, names, 1);
    /* A client still sending a forward holds each batch open: the first
     * forward stays queued, holding its bytes, while the others come. */
    int slow = ls_test_open_receiving_forward(s);
    assert_true(slow >= 0);
    call first = {.srv = s, .path = "/forward", .body = base}, third = {.srv = s, .path = "/forward", .body = res};
    pthread_t t1, t3;
    assert_int_equal(pthread_create(&t1, NULL, call_thread, &first), 0);
    assert_true(ls_test_wait_metric(s, "lorasink_queue_depth", 1));
    call second = {.srv = s, .path = "/forward", .body = fresh};
    call_thread(&second);
    expect_call(&second, 429, "overloaded", "MiB of it for adapters it reads into host memory");
    /* A resident adapter costs the forward nothing more: it is queued. */
    assert_int_equal(pthread_create(&t3, NULL, call_thread, &third), 0);
    assert_true(ls_test_wait_metric(s, "lorasink_queue_depth", 2));
    close(slow);
    pthread_join(t1, NULL);
    pthread_join(t3, NULL);
    assert_int_equal(first.status, 200);
    assert_int_equal(third.status, 200);
    /* Alone, the forward over the budget runs (and loads the adapter). */
    call alone = {.srv = s, .path = "/forward", .body = fresh};
    call_thread(&alone);
    assert_int_equal(alone.status, 200);
    free(first.reply), free(second.reply), free(third.reply), free(alone.reply);
    free(base), free(fresh), free(res);
    assert_int_equal(ls_test_server_stop(s), 0);
    ls_test_rmtree(dir);
    free(dir);
}

/* A JSON upload of a rank-MR PEFT adapter for a model of layers layers
 * (the MH/MF/MN shape): the gate_up factors as nested arrays of numbers,
 * the down factors as bf16 base64 objects. *tensor_bytes receives what
 * the tensors take decoded (4 bytes a number, 2 a bf16 value). */
static char *json_upload(int layers, size_t *len, double *tensor_bytes) {
    const char *mods[4] = {"gate_up_proj.lora_A", "gate_up_proj.lora_B", "down_proj.lora_A", "down_proj.lora_B"};
    const int64_t shapes[4][2] = {{MR, MH}, {MN * 2 * MF, MR}, {MR, MN * MF}, {MH, MR}};
    ls_buf b;
    ls_buf_init(&b);
    ls_buf_printf(&b, "{\"format\": \"peft\", \"config\": {\"r\": %d, \"lora_alpha\": %d}, \"tensors\": {", MR, MR);
    uint64_t rng = 11;
    *tensor_bytes = 0;
    for (int l = 0; l < layers; l++)
        for (int k = 0; k < 4; k++) {
            ls_buf_printf(&b, "%s\"model.layers.%d.mlp.shared_experts.%s.weight\": ", l || k ? ", " : "", l, mods[k]);
            const size_t count = (size_t)(shapes[k][0] * shapes[k][1]);
            if (k < 2) {
                for (int64_t i = 0; i < shapes[k][0]; i++) {
                    ls_buf_append(&b, i ? ",[" : "[[", i ? 2 : 2);
                    for (int64_t j = 0; j < shapes[k][1]; j++) {
                        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                        /* Eighths from -1 to 1: short numbers, as a trained
                         * adapter's are not, make the tree's cost show. */
                        ls_buf_printf(&b, "%s%g", j ? "," : "", (double)((int)(rng >> 59) - 8) / 8.0);
                    }
                    ls_buf_append(&b, "]", 1);
                }
                ls_buf_append(&b, "]", 1);
                *tensor_bytes += 4.0 * (double)count;
            } else {
                uint16_t *v = malloc(count * 2);
                assert_non_null(v);
                for (size_t i = 0; i < count; i++) {
                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                    v[i] = ls_f32_to_bf16(((float)(rng >> 40) / 16777216.0f - 0.5f) * 0.02f);
                }
                char *data = ls_base64_encode((const uint8_t *)v, count * 2);
                assert_non_null(data);
                ls_buf_printf(&b, "{\"dtype\": \"bf16\", \"shape\": [%lld, %lld], \"data\": \"%s\"}",
                              (long long)shapes[k][0], (long long)shapes[k][1], data);
                free(data);
                free(v);
                *tensor_bytes += 2.0 * (double)count;
            }
        }
    ls_buf_append(&b, "}}", 2);
    char *text = ls_buf_take(&b, len);
    assert_non_null(text);
    return text;
}

/* n validations of body at once: the peak RSS growth (bytes), and the
 * normalised adapter's bytes from a reply. */
static double validate_at_once(const ls_test_server *s, const char *body, int n, double *normalised) {
    const int pid = ls_test_server_pid(s);
    reset_peak(pid);
    const long before = ls_test_proc_kib(pid, "VmHWM");
    call calls[4];
    for (int i = 0; i < n; i++) calls[i] = (call){.srv = s, .path = "/adapters/validate", .body = body};
    run_calls(calls, n);
    const double grew = (double)(ls_test_proc_kib(pid, "VmHWM") - before) * 1024.0;
    for (int i = 0; i < n; i++) {
        if (calls[i].status != 200) fprintf(stderr, "validate: %ld %.300s\n", calls[i].status, calls[i].reply);
        assert_int_equal(calls[i].status, 200);
        json_t *j = json_loads(calls[i].reply, 0, NULL);
        assert_non_null(j);
        *normalised = (double)json_integer_value(json_object_get(j, "bytes"));
        json_decref(j);
        free(calls[i].reply);
    }
    return grew;
}

/* A JSON adapter upload became a jansson tree of the whole body: a
 * 64 MB POST /adapters/validate peaked at 1.6 GB (4 at once, 5.6 GB),
 * and 255 MB left 4.5 GB resident after. The body is now read in one
 * pass with every tensor going straight into its buffer: an upload holds
 * its body, its tensors as decoded, and the normalised adapter, at most
 * body + tensors + normalised + 32 MiB (docs/api.md), each of 4 at once
 * as much, and gives it back after the reply. */
static void test_json_upload_peak_memory(void **state) {
    (void)state;
    enum { LAYERS = 16 };
    char asan[512];
    const char *env[] = {no_quarantine(asan, sizeof asan), NULL};
    const char *args[] = {"--demo", "--experts", "2", "--hidden", "1024", "--intermediate", "512", "--layers", "16",
                          "--max-rank", "64", "--slots", "2", NULL};
    ls_test_server *s = ls_test_server_start_env(args, env);
    assert_non_null(s);
    size_t body_len, small_len;
    double tensors, small_tensors, normalised = 0;
    char *body = json_upload(LAYERS, &body_len, &tensors);
    /* Warm up (worker stacks, the reader's first allocations) on a small
     * upload: the same adapter cut to its first layer, as the server
     * sees any body. */
    char *small = json_upload(1, &small_len, &small_tensors);
    validate_at_once(s, small, 4, &normalised);
    free(small);
    const int pid = ls_test_server_pid(s);
    const long rss0 = ls_test_proc_kib(pid, "VmRSS");
    const double one = validate_at_once(s, body, 1, &normalised);
    const double bound = (double)body_len + tensors + normalised + 32 * MIB;
    print_message("JSON upload of %.1f MiB (tensors %.1f MiB decoded, %.1f MiB normalised): peak RSS +%.1f MiB "
                  "(bound %.1f MiB)\n", (double)body_len / MIB, tensors / MIB, normalised / MIB, one / MIB, bound / MIB);
    assert_true(one <= bound);
    const double four = validate_at_once(s, body, 4, &normalised);
    const double bound4 = 4 * ((double)body_len + tensors + normalised) + 32 * MIB;
    print_message("four at once: peak RSS +%.1f MiB (bound %.1f MiB)\n", four / MIB, bound4 / MIB);
    assert_true(four <= bound4);
    /* Given back after the replies (a moment after the client has read
     * them all). */
    long after = ls_test_proc_kib(pid, "VmRSS");
    for (int i = 0; i < 50 && (double)(after - rss0) * 1024.0 > (double)body_len; i++) {
        usleep(100000);
        after = ls_test_proc_kib(pid, "VmRSS");
    }
    print_message("RSS after: %+.1f MiB\n", (double)(after - rss0) / 1024.0);
    assert_true((double)(after - rss0) * 1024.0 <= (double)body_len);
    free(body);
    assert_int_equal(ls_test_server_stop(s), 0);
}

/* A safetensors file of n one-element F32 tensors named t0000000...
 * (what a header can hold at its cheapest: about 60 bytes an entry):
 * malloc'd bytes, *header its header's length. */
static uint8_t *many_tensor_file(size_t n, size_t *len, size_t *header) {
    ls_buf h;
    ls_buf_init(&h);
    assert_true(ls_buf_append(&h, "{", 1));
    for (size_t i = 0; i < n; i++)
        assert_true(ls_buf_printf(&h, "%s\"t%07zu\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%zu,%zu]}",
                                  i ? "," : "", i, 4 * i, 4 * i + 4));
    assert_true(ls_buf_append(&h, "}", 1));
    while (h.len % 8) assert_true(ls_buf_append(&h, " ", 1));
    *header = h.len;
    *len = 8 + h.len + 4 * n;
    uint8_t *b = calloc(1, *len);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    memcpy(b + 8, h.data, h.len);
    ls_buf_free(&h);
    return b;
}

/* many_tensor_file's file of n entries, also written as ts's
 * many.safetensors for path uploads: malloc'd bytes. */
static uint8_t *write_many_tensor_file(const tiny_server *ts, size_t n, size_t *len, size_t *header) {
    uint8_t *file = many_tensor_file(n, len, header);
    char path[1024];
    snprintf(path, sizeof path, "%s/many.safetensors", ts->dir);
    ls_test_write_file(path, file, *len);
    return file;
}

/* One validation of a body (raw when name is given, else JSON) or, with
 * body NULL, of many.safetensors by path: the answer in *r and the
 * server's peak RSS growth over it, in bytes. */
static double validate_peak(const tiny_server *ts, const void *body, size_t len, bool raw, ls_test_response *r) {
    static const char by_path[] = "{\"path\": \"many.safetensors\"}";
    const int pid = ls_test_server_pid(ts->srv);
    reset_peak(pid);
    const long before = ls_test_proc_kib(pid, "VmHWM");
    const char *route = raw ? "/adapters/validate?name=m" : "/adapters/validate";
    if (!body) {
        body = by_path;
        len = sizeof by_path - 1;
    }
    assert_int_equal(ls_test_http(ts->srv, "POST", route, raw ? "application/octet-stream" : NULL, body, len, NULL, r),
                     0);
    return (double)(ls_test_proc_kib(pid, "VmHWM") - before) * 1024.0;
}

/* A safetensors header was a jansson tree of the whole header: a raw
 * upload of 94 MB, 1.3 million small entries, peaked at 1.6 GB (17 times
 * its header) and left 1.4 GB resident, and a path upload of the same
 * file took as much again. The header is now read from its text: what
 * an upload or a file holds is its bytes, the entries (about 100 bytes
 * each) and the tensor set they become (about 110 each, names apart),
 * at most bytes + 320 bytes a tensor + 32 MiB, here with 200,000. */
static void test_safetensors_header_memory(void **state) {
    (void)state;
    enum { N = 200000 };
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", NULL));
    size_t len, header;
    uint8_t *file = write_many_tensor_file(&ts, N, &len, &header);
    const double bound = (double)len + 320.0 * N + 32 * MIB;
    for (int way = 0; way < 2; way++) {
        ls_test_response r;
        const double grew = way == 0 ? validate_peak(&ts, file, len, true, &r) : validate_peak(&ts, NULL, 0, false, &r);
        if (r.status != 422 || !strstr(r.body, "lora_unknown_tensor")) fprintf(stderr, "%ld %.300s\n", r.status, r.body);
        assert_int_equal(r.status, 422);
        assert_non_null(strstr(r.body, "lora_unknown_tensor"));
        ls_test_response_free(&r);
        print_message("%s of %.1f MiB (header %.1f MiB, %d tensors): peak RSS +%.1f MiB (bound %.1f MiB)\n",
                      way ? "path upload" : "raw upload", (double)len / MIB, (double)header / MIB, N, grew / MIB,
                      bound / MIB);
        if (LS_SMALL_ALLOCS_MEASURED) assert_true(grew <= bound);
    }
    free(file);
    tiny_server_stop(&ts);
}

/* An upload of many tiny tensors paid some 200 bytes a tensor beyond its
 * bytes (the set's entry, the name, the buffer): a 43 MB JSON body of
 * 3 million one-number tensors peaked at 600 MB, 256 MiB would have
 * taken 3.6 GB. An adapter may name at most 262,144 tensors (a PEFT
 * adapter of every routed expert of Kimi-K2 has 141,000): one past it is
 * 413, in a JSON body from the tensor past the limit (nothing more is
 * held: at most the body + 320 bytes a tensor kept + 32 MiB), in a raw
 * body and a file from the header's count, before any entry is kept
 * (the body + 100 bytes a name + 32 MiB). */
static void test_tensor_count_is_capped(void **state) {
    (void)state;
    enum { N = 262145 };
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", NULL));
    size_t len, header;
    uint8_t *file = write_many_tensor_file(&ts, N, &len, &header);
    ls_buf j;
    ls_buf_init(&j);
    assert_true(ls_buf_printf(&j, "{\"name\": \"m\", \"tensors\": {"));
    for (int i = 0; i < N; i++) assert_true(ls_buf_printf(&j, "%s\"t%07d\": [0]", i ? ", " : "", i));
    assert_true(ls_buf_printf(&j, "}}"));
    for (int way = 0; way < 3; way++) {
        ls_test_response r;
        size_t sent = way == 0 ? j.len : way == 1 ? len : 28;
        const double grew = way == 0   ? validate_peak(&ts, j.data, j.len, false, &r)
                            : way == 1 ? validate_peak(&ts, file, len, true, &r)
                                       : validate_peak(&ts, NULL, 0, false, &r);
        if (r.status != 413 || !strstr(r.body, "262144 tensors")) fprintf(stderr, "%ld %.300s\n", r.status, r.body);
        assert_int_equal(r.status, 413);
        assert_non_null(strstr(r.body, "payload_too_large"));
        assert_non_null(strstr(r.body, "262144 tensors"));
        ls_test_response_free(&r);
        /* A JSON body has kept the tensors before the one past the limit;
         * a header is refused from its count, before any entry is kept
         * (what the count took: the set of names that catches one given
         * twice, some 100 bytes a name). */
        const double bound = (double)(way == 2 ? len : sent) + (way == 0 ? 320.0 : 100.0) * N + 32 * MIB;
        print_message("%s of %.1f MiB with %d tensors: 413, peak RSS +%.1f MiB (bound %.1f MiB)\n",
                      way == 0 ? "JSON upload" : way == 1 ? "raw upload" : "path upload",
                      (double)(way == 0 ? j.len : len) / MIB, N, grew / MIB, bound / MIB);
        if (LS_SMALL_ALLOCS_MEASURED) assert_true(grew <= bound);
    }
    ls_buf_free(&j);
    free(file);
    tiny_server_stop(&ts);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_large_adapter_files),
        cmocka_unit_test(test_autoload_forward_keeps_host_cap),
        cmocka_unit_test(test_state_dir_forward_keeps_host_cap),
        cmocka_unit_test(test_queue_budget_counts_adapters),
        cmocka_unit_test(test_json_upload_peak_memory),
        cmocka_unit_test(test_safetensors_header_memory),
        cmocka_unit_test(test_tensor_count_is_capped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
