/* What an attack run against the server found, one regression each, over
 * HTTP against the real binary: NUL bytes in names, a shutdown
 * that left new clients hanging, an empty safetensors adapter= serving
 * the base model, pins past S-1, hex alpha, PEFT factors of rank 0, a
 * missing --adapter-dir, one request's reload failure failing its whole
 * batch, and forwards that could hold unbounded memory (the token cap,
 * the queue budget, and the peak RSS of a large body). */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/buf.h"
#include "format/safetensors.h"
#include "tests/util/tiny_server.h"

/* Sends a request and asserts a JSON error body with status and code;
 * returns the response for more checks (the caller frees it). */
static ls_test_response expect_error(const ls_test_server *s, const char *method, const char *path, const char *ct,
                                     const void *body, size_t len, long status, const char *code) {
    ls_test_response r;
    assert_int_equal(ls_test_http(s, method, path, ct, body, len, NULL, &r), 0);
    if (r.status != status) fprintf(stderr, "%s %s -> %ld (wanted %ld): %s\n", method, path, r.status, status, r.body);
    assert_int_equal(r.status, status);
    json_t *j = ls_test_response_json(&r);
    assert_non_null(j);
    assert_string_equal(ls_test_error_code(j), code);
    json_decref(j);
    return r;
}

static void expect_error_free(const ls_test_server *s, const char *method, const char *path, const char *ct,
                              const void *body, size_t len, long status, const char *code) {
    ls_test_response r = expect_error(s, method, path, ct, body, len, status, code);
    ls_test_response_free(&r);
}

static long status_of(const ls_test_server *s, const char *method, const char *path) {
    ls_test_response r;
    assert_int_equal(ls_test_http(s, method, path, NULL, NULL, 0, NULL, &r), 0);
    long st = r.status;
    ls_test_response_free(&r);
    return st;
}

/* The version of name in GET /adapters/NAME (0 when unknown). */
static long version_of(const ls_test_server *s, const char *name) {
    char path[256];
    snprintf(path, sizeof path, "/adapters/%s", name);
    ls_test_response r;
    assert_int_equal(ls_test_http(s, "GET", path, NULL, NULL, 0, NULL, &r), 0);
    json_t *j = r.status == 200 ? ls_test_response_json(&r) : NULL;
    long v = j ? (long)json_integer_value(json_object_get(j, "version")) : 0;
    json_decref(j);
    ls_test_response_free(&r);
    return v;
}

static void load_inline(tiny_server *ts, const char *name) {
    json_t *req = tiny_adapter_inline(ts, name, NULL);
    json_decref(tiny_post_json(ts, "/adapters", req, 201));
    json_decref(req);
}

/* ?name=a%00evil once registered "a", and /adapters/a%00x acted on "a":
 * %00 stays escaped, so such a name is simply not a valid one. */
static void test_nul_in_names(void **state) {
    (void)state;
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", NULL));
    load_inline(&ts, "a");
    size_t len;
    uint8_t *st = tiny_adapter_safetensors(&ts, "4", &len);
    expect_error_free(ts.srv, "POST", "/adapters?name=a%00evil", "application/octet-stream", st, len, 400,
                      "invalid_request");
    expect_error_free(ts.srv, "POST", "/adapters?name=b%00", "application/octet-stream", st, len, 400,
                      "invalid_request");
    free(st);
    /* The name asked for is "a%00x", which nothing may be called. */
    expect_error_free(ts.srv, "GET", "/adapters/a%00x", NULL, NULL, 0, 404, "adapter_not_found");
    expect_error_free(ts.srv, "DELETE", "/adapters/a%00x", NULL, NULL, 0, 404, "adapter_not_found");
    /* A name too long for the route's buffer was "no route GET ...". */
    char url[400] = "/adapters/";
    memset(url + strlen(url), 'n', 300);
    ls_test_response lng = expect_error(ts.srv, "GET", url, NULL, NULL, 0, 404, "adapter_not_found");
    assert_non_null(strstr(lng.body, "nnn..."));
    ls_test_response_free(&lng);
    expect_error_free(ts.srv, "DELETE", url, NULL, NULL, 0, 404, "adapter_not_found");
    /* A JSON name holding \u0000 is refused by the JSON reader. */
    const char *body = "{\"name\": \"a\\u0000evil\", \"path\": \"x.safetensors\"}";
    ls_test_response nul = expect_error(ts.srv, "POST", "/adapters", NULL, body, strlen(body), 400, "invalid_json");
    /* The rule, not the JSON library's flag name. */
    assert_non_null(strstr(nul.body, "not allowed in a string"));
    assert_null(strstr(nul.body, "JSON_ALLOW_NUL"));
    ls_test_response_free(&nul);
    assert_int_equal(version_of(ts.srv, "a"), 1);
    assert_int_equal(status_of(ts.srv, "GET", "/adapters/b"), 404);
    /* An escaped name that decodes to a valid one still works. */
    assert_int_equal(status_of(ts.srv, "GET", "/adapters/%61"), 200);
    tiny_server_stop(&ts);
}

/* A 500 (here: the state directory is gone, so the upload cannot be
 * made durable) left nothing in the log but the access line: the error
 * is logged with its request id and body now. */
static void test_server_errors_are_logged(void **state) {
    (void)state;
    char *sd = ls_test_mkdtemp();
    const char *extra[] = {"--state-dir", sd, NULL};
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", extra));
    ls_test_rmtree(sd);
    json_t *req = tiny_adapter_inline(&ts, "gone", NULL);
    char *body = json_dumps(req, JSON_COMPACT);
    const char *hdr[] = {"X-Request-Id: state-gone-1", NULL};
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "POST", "/adapters", NULL, body, strlen(body), hdr, &r), 0);
    assert_int_equal(r.status, 500);
    ls_test_response_free(&r);
    const char *line = "state-gone-1 POST /adapters: 500 {\"error\":{\"code\":\"internal\"";
    if (ls_test_server_wait_output(ts.srv, line) == 0) {
        char *out = ls_test_server_output(ts.srv);
        fprintf(stderr, "%s\n", out);
        free(out);
        fail_msg("no log line for the 500");
    }
    free(body);
    json_decref(req);
    tiny_server_stop(&ts);
    free(sd);
}

/* SIGHUP killed the server on the spot (exit 129, requests in flight
 * cut): it stops gracefully like SIGTERM now, exit 0. */
static void test_sighup_stops_gracefully(void **state) {
    (void)state;
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", NULL));
    assert_int_equal(kill(ls_test_server_pid(ts.srv), SIGHUP), 0);
    assert_true(ls_test_server_wait_output(ts.srv, "info  stopped") > 0);
    assert_true(ls_test_server_wait_output(ts.srv, "SIGHUP: stopping") > 0);
    tiny_server_stop(&ts);
}

/* One GET on fd, a connection kept alive: the response (status line,
 * headers and its Content-Length of body) into buf, NUL-terminated. */
static void get_on(int fd, const char *path, char *buf, size_t cap) {
    char req[256];
    const int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
    assert_int_equal(send(fd, req, (size_t)n, 0), n);
    size_t len = 0;
    for (;;) {
        const char *end = len ? strstr(buf, "\r\n\r\n") : NULL;
        const char *cl = len ? strcasestr(buf, "Content-Length:") : NULL;
        if (end && cl && len >= (size_t)(end + 4 - buf) + strtoul(cl + 15, NULL, 10)) return;
        assert_true(len + 1 < cap);
        const ssize_t got = recv(fd, buf + len, cap - 1 - len, 0);
        assert_true(got > 0);
        len += (size_t)got;
        buf[len] = '\0';
    }
}

/* After SIGTERM a new client is refused at once (it used to wait in the
 * backlog for 30 s, then get a reset) while the request in flight still
 * gets its answer, and /ready on a connection kept alive from before
 * says the server is going (it used to say ready). */
static void test_sigterm_refuses_new_clients(void **state) {
    (void)state;
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", NULL));
    int probe = ls_test_raw_connect(ts.srv);
    assert_true(probe >= 0);
    char reply[4096];
    get_on(probe, "/ready", reply, sizeof reply);
    assert_memory_equal(reply, "HTTP/1.1 200", 12);
    /* A forward whose body is half sent keeps shutdown waiting. */
    const char *body = "{\"x\": [[1, 2, 3, 4]], \"gammas\": [[1, 1]]}";
    char head[256];
    int hl = snprintf(head, sizeof head,
                      "POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n%.10s",
                      strlen(body), body);
    int fd = ls_test_raw_connect(ts.srv);
    assert_true(fd >= 0);
    assert_int_equal(send(fd, head, (size_t)hl, 0), hl);
    /* Only a request the server has begun holds shutdown open: one still
     * in the backlog, or accepted with its headers unread, is dropped at
     * the stop. Its headers are read once it counts as receiving. */
    assert_true(ls_test_wait_receiving(ts.srv, 1));
    assert_int_equal(kill(ls_test_server_pid(ts.srv), SIGTERM), 0);
    bool refused = false;
    for (int i = 0; i < 100 && !refused; i++) {
        int c = ls_test_raw_connect(ts.srv);
        if (c < 0) refused = errno == ECONNREFUSED;
        else close(c);
        if (!refused) usleep(50000);
    }
    assert_true(refused);
    get_on(probe, "/ready", reply, sizeof reply);
    if (strncmp(reply, "HTTP/1.1 503", 12) || !strstr(reply, "\"shutting_down\""))
        fprintf(stderr, "/ready while draining: %.300s\n", reply);
    assert_memory_equal(reply, "HTTP/1.1 503", 12);
    assert_non_null(strstr(reply, "\"code\":\"shutting_down\""));
    close(probe);
    /* A drain's 503 is what a stop answers, not the server's trouble:
     * its access line, and no error line beside it. */
    assert_true(ls_test_server_wait_output(ts.srv, " GET /ready 503 ") > 0);
    char *out = ls_test_server_output(ts.srv);
    if (strstr(out, "/ready: 503")) fail_msg("a drain's /ready logged as an error:\n%s", out);
    free(out);
    /* The server is still there for the request it had begun. */
    size_t rest = strlen(body) - 10;
    assert_int_equal(send(fd, body + 10, rest, 0), (ssize_t)rest);
    char buf[8192];
    size_t n;
    ls_test_raw_read_all(fd, buf, sizeof buf, &n);
    close(fd);
    if (strncmp(buf, "HTTP/1.1 200", 12)) fprintf(stderr, "in-flight forward: %.300s\n", buf);
    assert_memory_equal(buf, "HTTP/1.1 200", 12);
    tiny_server_stop(&ts);
}

/* x [T, 4] and gammas [T, 2] of the tiny model as a safetensors body. */
static uint8_t *forward_safetensors(int T, size_t *len) {
    float *x = calloc((size_t)T * 4, sizeof(float)), *g = calloc((size_t)T * 2, sizeof(float));
    assert_true(x && g);
    for (int i = 0; i < T * 4; i++) x[i] = 0.25f * (float)(i % 5);
    for (int i = 0; i < T * 2; i++) g[i] = 1.0f;
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    ls_tensor tx = {.dtype = LS_DTYPE_F32, .ndim = 2, .shape = {T, 4}, .data = x, .nbytes = (size_t)T * 16};
    ls_tensor tg = {.dtype = LS_DTYPE_F32, .ndim = 2, .shape = {T, 2}, .data = g, .nbytes = (size_t)T * 8};
    assert_true(ls_tensor_set_add(&set, "x", &tx) && ls_tensor_set_add(&set, "gammas", &tg));
    uint8_t *buf = NULL;
    assert_int_equal(ls_safetensors_write(&set, &buf, len, NULL), LS_OK);
    ls_tensor_set_free(&set);
    free(x);
    free(g);
    return buf;
}

static void test_safetensors_empty_adapter(void **state) {
    (void)state;
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", NULL));
    size_t len;
    uint8_t *body = forward_safetensors(2, &len);
    ls_test_response r = expect_error(ts.srv, "POST", "/forward?adapter=", "application/octet-stream", body, len, 400,
                                      "invalid_request");
    assert_non_null(strstr(r.body, "adapter"));
    ls_test_response_free(&r);
    /* Without the parameter: the base model, 200. */
    assert_int_equal(ls_test_http(ts.srv, "POST", "/forward", "application/octet-stream", body, len, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    free(body);
    tiny_server_stop(&ts);
}

/* Sets every number under j to v. */
static void set_numbers(json_t *j, double v) {
    size_t i;
    const char *k;
    json_t *e;
    if (json_is_array(j)) {
        json_array_foreach(j, i, e) {
            if (json_is_number(e)) json_array_set_new(j, i, json_real(v));
            else set_numbers(e, v);
        }
    } else if (json_is_object(j)) {
        json_object_foreach(j, k, e) set_numbers(e, v);
    }
}

/* Finite factors so large that y overflows: the 400 blamed x and gammas
 * ("scale x or gammas down") and said nothing of the adapter. Another
 * adapter on an earlier token must not be the one named. */
static void test_overflow_names_adapter(void **state) {
    (void)state;
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", NULL));
    json_t *fine = tiny_adapter_inline(&ts, "fine", NULL);
    json_decref(tiny_post_json(&ts, "/adapters", fine, 201));
    json_decref(fine);
    json_t *big = tiny_adapter_inline(&ts, "big", NULL);
    set_numbers(json_object_get(big, "tensors"), 1e30);
    json_decref(tiny_post_json(&ts, "/adapters", big, 201));
    json_decref(big);
    json_t *req = json_pack("{s:O, s:O, s:[s, s, n]}", "x", json_object_get(ts.tiny, "x"), "gammas",
                            json_object_get(ts.tiny, "gammas"), "adapters", "fine", "big");
    char *text = json_dumps(req, JSON_COMPACT);
    ls_test_response r = expect_error(ts.srv, "POST", "/forward", NULL, text, strlen(text), 400, "invalid_request");
    assert_non_null(strstr(r.body, "y[1]["));
    assert_non_null(strstr(r.body, "(adapter 'big' v1)"));
    assert_non_null(strstr(r.body, "factors of the token's adapter"));
    ls_test_response_free(&r);
    free(text);
    json_decref(req);
    tiny_server_stop(&ts);
}

/* Pins past S-1 answered 503 with Retry-After though no retry helps. */
static void test_pin_limit(void **state) {
    (void)state;
    tiny_server ts; /* 4 slots: 3 pins */
    assert_true(tiny_server_start(&ts, "interleaved", NULL));
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof name, "p%d", i);
        json_t *req = tiny_adapter_inline(&ts, name, NULL);
        json_object_set_new(req, "pinned", json_true());
        char *text = json_dumps(req, JSON_COMPACT);
        if (i < 3) {
            json_decref(tiny_post_json(&ts, "/adapters", req, 201));
        } else {
            ls_test_response r = expect_error(ts.srv, "POST", "/adapters", NULL, text, strlen(text), 409, "pin_limit");
            assert_null(strcasestr(r.headers, "Retry-After"));
            assert_non_null(strstr(r.body, "3 adapters are, and at most S-1 = 3"));
            ls_test_response_free(&r);
        }
        free(text);
        json_decref(req);
    }
    assert_int_equal(status_of(ts.srv, "GET", "/adapters/p3"), 404);
    /* Unpinned, the fourth loads. */
    load_inline(&ts, "p3");
    tiny_server_stop(&ts);
}

/* Numbers in query parameters are decimal: 0x10 was read as 16. */
static void test_alpha_is_decimal(void **state) {
    (void)state;
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", NULL));
    size_t len;
    uint8_t *body = tiny_adapter_safetensors(&ts, NULL, &len);
    const char *bad[] = {"lora_alpha=0x10", "lora_alpha=inf", "lora_alpha=nan", "lora_alpha=1e999", "scale=0x1p2",
                         "lora_alpha=-infinity"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char path[128];
        snprintf(path, sizeof path, "/adapters?name=h&%s", bad[i]);
        ls_test_response r =
            expect_error(ts.srv, "POST", path, "application/octet-stream", body, len, 400, "invalid_request");
        ls_test_response_free(&r);
    }
    assert_int_equal(status_of(ts.srv, "GET", "/adapters/h"), 404);
    ls_test_response r;
    assert_int_equal(
        ls_test_http(ts.srv, "POST", "/adapters?name=h&lora_alpha=16.0", "application/octet-stream", body, len, NULL, &r),
        0);
    assert_int_equal(r.status, 201);
    ls_test_response_free(&r);
    free(body);
    tiny_server_stop(&ts);
}

/* The pin of name in GET /adapters/NAME. */
static bool pinned_of(tiny_server *ts, const char *name) {
    char path[256];
    snprintf(path, sizeof path, "/adapters/%s", name);
    ls_test_response r;
    assert_int_equal(ls_test_http(ts->srv, "GET", path, NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = ls_test_response_json(&r);
    bool pinned = json_is_true(json_object_get(j, "pinned"));
    json_decref(j);
    ls_test_response_free(&r);
    return pinned;
}

/* A replace that did not say "pinned" unpinned a pinned adapter (the
 * new version took the request's default, false): it keeps the replaced
 * version's pin now; stating "pinned" either way still decides. */
static void test_replace_keeps_pin(void **state) {
    (void)state;
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", NULL));
    json_t *req = tiny_adapter_inline(&ts, "p", NULL);
    json_object_set_new(req, "pinned", json_true());
    json_decref(tiny_post_json(&ts, "/adapters", req, 201));
    json_object_del(req, "pinned");
    json_object_set_new(req, "replace", json_true());
    json_decref(tiny_post_json(&ts, "/adapters", req, 201));
    assert_true(pinned_of(&ts, "p"));
    assert_int_equal(version_of(ts.srv, "p"), 2);
    json_object_set_new(req, "pinned", json_null()); /* null: not given */
    json_decref(tiny_post_json(&ts, "/adapters", req, 201));
    assert_true(pinned_of(&ts, "p"));
    json_object_set_new(req, "pinned", json_false());
    json_decref(tiny_post_json(&ts, "/adapters", req, 201));
    assert_false(pinned_of(&ts, "p"));
    json_object_del(req, "pinned"); /* unpinned stays unpinned */
    json_decref(tiny_post_json(&ts, "/adapters", req, 201));
    assert_false(pinned_of(&ts, "p"));
    json_decref(req);
    /* A raw body's query says it the same way. */
    size_t len;
    uint8_t *st = tiny_adapter_safetensors(&ts, "4", &len);
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "POST", "/adapters?name=p&replace=true&pinned=true",
                                  "application/octet-stream", st, len, NULL, &r),
                     0);
    assert_int_equal(r.status, 201);
    ls_test_response_free(&r);
    assert_int_equal(
        ls_test_http(ts.srv, "POST", "/adapters?name=p&replace=true", "application/octet-stream", st, len, NULL, &r), 0);
    assert_int_equal(r.status, 201);
    ls_test_response_free(&r);
    assert_true(pinned_of(&ts, "p"));
    free(st);
    tiny_server_stop(&ts);
}

/* An empty JSON body was "number expected (at byte 0)" (and "wrong
 * arguments (line -1, column -1)" for an upload): it is said plainly. */
static void test_empty_body(void **state) {
    (void)state;
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", NULL));
    const char *paths[] = {"/forward", "/adapters", "/adapters/validate"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        ls_test_response r = expect_error(ts.srv, "POST", paths[i], NULL, "", 0, 400, "invalid_json");
        assert_non_null(strstr(r.body, "the body is empty"));
        ls_test_response_free(&r);
        /* No body at all (no Content-Length): said so. */
        r = expect_error(ts.srv, "POST", paths[i], NULL, NULL, 0, 400, "invalid_request");
        assert_non_null(strstr(r.body, "the request has no Content-Length"));
        ls_test_response_free(&r);
    }
    tiny_server_stop(&ts);
}

/* A query parameter the server would not read was ignored: ?adaptor=a
 * (a typo) ran the base model, ?layer=1 beside a JSON body answered
 * layer 0, ?pinned=true beside a JSON upload did not pin. Each is 400
 * now, naming the parameter and listing the known ones, and so is a
 * parameter given twice or without a value (?adapter alone ran the base
 * model too); nothing is run or registered. */
static void test_query_is_strict(void **state) {
    (void)state;
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", NULL));
    load_inline(&ts, "a");
    const char *x = "{\"x\": [[0.5, -0.25, 0.125, 1.0]]}";
    struct {
        const char *method, *path, *ct, *want; /* want: in the message or hint */
    } cases[] = {
        {"POST", "/forward?adaptor=a", NULL, "adaptor"},
        {"POST", "/forward?layer=0", NULL, "a JSON body gives layer"},
        {"POST", "/forward?adapter=a&adapter=a", NULL, "more than once"},
        {"POST", "/adapters?pinned=true", NULL, "keys of the body"},
        {"POST", "/adapters?name=q&lora-alpha=16", "application/octet-stream", "lora-alpha"},
        {"POST", "/adapters/validate?alpha=16", "application/octet-stream", "known query parameters: name"},
        {"POST", "/adapters?name=q&name=r", "application/octet-stream", "more than once"},
        {"DELETE", "/adapters/a?force=1", NULL, "takes no query parameters"},
        {"POST", "/forward?adapter", NULL, "has no value"},
        {"POST", "/adapters?name=q&pinned", "application/octet-stream", "has no value"},
    };
    size_t st_len;
    uint8_t *st = tiny_adapter_safetensors(&ts, "4", &st_len);
    json_t *inline_a = tiny_adapter_inline(&ts, "q", NULL);
    char *inline_text = json_dumps(inline_a, JSON_COMPACT);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bool raw = cases[i].ct != NULL, upload = strstr(cases[i].path, "/adapters") == cases[i].path;
        const void *body = raw ? (const void *)st : upload ? inline_text : x;
        size_t len = !strcmp(cases[i].method, "DELETE") ? 0 : raw ? st_len : strlen(body);
        ls_test_response r =
            expect_error(ts.srv, cases[i].method, cases[i].path, cases[i].ct, len ? body : NULL, len, 400,
                         "invalid_request");
        if (!strstr(r.body, cases[i].want)) fprintf(stderr, "%s %s: %s\n", cases[i].method, cases[i].path, r.body);
        assert_non_null(strstr(r.body, cases[i].want));
        ls_test_response_free(&r);
    }
    /* Nothing was registered, deleted or pinned by any of them. */
    assert_int_equal(status_of(ts.srv, "GET", "/adapters/q"), 404);
    assert_int_equal(status_of(ts.srv, "GET", "/adapters/r"), 404);
    assert_int_equal(version_of(ts.srv, "a"), 1);
    /* The parameters each form reads still work. */
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "POST", "/forward?adapter=a", NULL, x, strlen(x), NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    /* An empty argument ("&&", a URL joined from parts) says nothing. */
    assert_int_equal(ls_test_http(ts.srv, "POST", "/forward?&adapter=a&&", NULL, x, strlen(x), NULL, &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"name\":\"a\""));
    ls_test_response_free(&r);
    assert_int_equal(ls_test_http(ts.srv, "POST", "/adapters?name=q&lora_alpha=4&pinned=true&replace=false",
                                  "application/octet-stream", st, st_len, NULL, &r),
                     0);
    assert_int_equal(r.status, 201);
    ls_test_response_free(&r);
    free(inline_text);
    json_decref(inline_a);
    free(st);
    tiny_server_stop(&ts);
}

/* A file loaded by path had its text quoted in errors: a bad
 * __metadata__ value (r=SECRET is not a positive integer) or a string in
 * adapter_config.json. The key and where it is are named instead. */
static void test_file_text_never_quoted(void **state) {
    (void)state;
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", NULL));
    tiny_write_adapter_file(&ts, "meta.safetensors", "SECRETALPHA");
    const char *body = "{\"name\": \"m\", \"path\": \"meta.safetensors\"}";
    ls_test_response r = expect_error(ts.srv, "POST", "/adapters", NULL, body, strlen(body), 400, "invalid_request");
    assert_null(strstr(r.body, "SECRET"));
    assert_non_null(strstr(r.body, "lora_alpha in the file's __metadata__"));
    ls_test_response_free(&r);
    tiny_write_peft_dir(&ts, "peft", "{\"r\": \"SECRETR\", \"lora_alpha\": 8}");
    body = "{\"name\": \"p\", \"path\": \"peft\"}";
    r = expect_error(ts.srv, "POST", "/adapters", NULL, body, strlen(body), 422, "adapter_config_invalid");
    assert_null(strstr(r.body, "SECRET"));
    assert_non_null(strstr(r.body, "found a string"));
    ls_test_response_free(&r);
    /* The client's own query value is still quoted back. */
    size_t len;
    uint8_t *st = tiny_adapter_safetensors(&ts, NULL, &len);
    r = expect_error(ts.srv, "POST", "/adapters?name=q&lora_alpha=MINE", "application/octet-stream", st, len, 400,
                     "invalid_request");
    assert_non_null(strstr(r.body, "lora_alpha=MINE"));
    ls_test_response_free(&r);
    free(st);
    tiny_server_stop(&ts);
}

/* PEFT factors all of rank 0 answered 500 internal. */
static void test_rank_zero_peft(void **state) {
    (void)state;
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", NULL));
    /* lora_A [0, in], lora_B [out, 0]: no bytes at all. */
    const char *header = "{\"model.layers.0.mlp.shared_experts.gate_up_proj.lora_A.weight\":"
                         "{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]},"
                         "\"model.layers.0.mlp.shared_experts.gate_up_proj.lora_B.weight\":"
                         "{\"dtype\":\"F32\",\"shape\":[12,0],\"data_offsets\":[0,0]},"
                         "\"model.layers.0.mlp.shared_experts.down_proj.lora_A.weight\":"
                         "{\"dtype\":\"F32\",\"shape\":[0,6],\"data_offsets\":[0,0]},"
                         "\"model.layers.0.mlp.shared_experts.down_proj.lora_B.weight\":"
                         "{\"dtype\":\"F32\",\"shape\":[4,0],\"data_offsets\":[0,0]}}";
    size_t hl = strlen(header), len = 8 + hl;
    uint8_t *body = malloc(len);
    assert_non_null(body);
    for (int i = 0; i < 8; i++) body[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(body + 8, header, hl);
    ls_test_response r =
        expect_error(ts.srv, "POST", "/adapters?name=z&lora_alpha=4", "application/octet-stream", body, len, 422,
                     "invalid_shape");
    assert_non_null(strstr(r.body, "rank"));
    ls_test_response_free(&r);
    free(body);
    assert_int_equal(status_of(ts.srv, "GET", "/adapters/z"), 404);
    tiny_server_stop(&ts);
}

/* It started and then answered 500 to every path upload. */
static void test_missing_adapter_dir_stops_startup(void **state) {
    (void)state;
    const char *args[] = {"--demo",       "--experts",      "2", "--hidden",      "8",
                          "--intermediate", "4",            "--layers", "1",      "--port",
                          "0",            "--adapter-dir", "/nonexistent/lorasink-adapters", NULL};
    char out[8192];
    assert_int_equal(ls_test_run_binary(args, out, sizeof out), 1);
    assert_non_null(strstr(out, "the adapter directory /nonexistent/lorasink-adapters cannot be opened"));
    assert_null(strstr(out, "listening on"));
}

/* An adapter directory at / (a server started from / without
 * --adapter-dir took the working directory) would let a client's path
 * name any file of the machine: start-up stops and says so. */
static void test_root_adapter_dir_stops_startup(void **state) {
    (void)state;
    const char *dirs[] = {"/", "/tmp/.."};
    for (int i = 0; i < 2; i++) {
        const char *args[] = {"--demo",   "--experts", "2", "--hidden",      "8",     "--intermediate", "4",
                              "--layers", "1",         "--port", "0", "--adapter-dir", dirs[i], NULL};
        char out[8192];
        assert_int_equal(ls_test_run_binary(args, out, sizeof out), 1);
        assert_non_null(strstr(out, "the adapter directory is / (--adapter-dir)"));
        assert_non_null(strstr(out, "give --adapter-dir the directory that holds the adapters"));
        assert_null(strstr(out, "listening on"));
    }
}

/* A forward body of T tokens of the tiny model (x and gammas). */
static char *forward_json(int T, const char *adapter) {
    ls_buf b;
    ls_buf_init(&b);
    ls_buf_append(&b, "{\"x\":[", 6);
    for (int t = 0; t < T; t++) ls_buf_printf(&b, "%s[0.5,-0.25,0.125,1]", t ? "," : "");
    ls_buf_append(&b, "],\"gammas\":[", 12);
    for (int t = 0; t < T; t++) ls_buf_printf(&b, "%s[1,0.5]", t ? "," : "");
    ls_buf_append(&b, "]", 1);
    if (adapter) {
        ls_buf_append(&b, ",\"adapters\":[", 13);
        for (int t = 0; t < T; t++) ls_buf_printf(&b, "%s\"%s\"", t ? "," : "", adapter);
        ls_buf_append(&b, "]", 1);
    }
    ls_buf_append(&b, "}", 1);
    return ls_buf_take(&b, NULL);
}

static void test_max_request_tokens(void **state) {
    (void)state;
    const char *extra[] = {"--max-request-tokens", "2", NULL};
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", extra));
    char *two = forward_json(2, NULL), *three = forward_json(3, NULL);
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "POST", "/forward", NULL, two, strlen(two), NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    r = expect_error(ts.srv, "POST", "/forward", NULL, three, strlen(three), 413, "payload_too_large");
    assert_non_null(strstr(r.body, "--max-request-tokens"));
    ls_test_response_free(&r);
    size_t len;
    uint8_t *st = forward_safetensors(3, &len);
    expect_error_free(ts.srv, "POST", "/forward", "application/octet-stream", st, len, 413, "payload_too_large");
    free(st);
    free(two);
    free(three);
    tiny_server_stop(&ts);
}

/* One forward in a thread: its status. */
typedef struct {
    const ls_test_server *srv;
    const void *body;
    size_t len;        /* 0: body is JSON text */
    const char *ctype; /* NULL: JSON */
    long status;
    char code[64];
} fwd_call;

static void *fwd_thread(void *arg) {
    fwd_call *c = arg;
    ls_test_response r;
    const size_t len = c->len ? c->len : strlen(c->body);
    if (ls_test_http(c->srv, "POST", "/forward", c->ctype, c->body, len, NULL, &r) != 0) {
        c->status = -1;
        return NULL;
    }
    c->status = r.status;
    json_t *j = ls_test_response_json(&r);
    snprintf(c->code, sizeof c->code, "%s", j ? ls_test_error_code(j) : "");
    json_decref(j);
    ls_test_response_free(&r);
    return NULL;
}

/* Runs the calls as one batch and waits for all. A client still sending
 * a forward holds the batch open (up to --batch-wait-us), each call is
 * sent once the ones before it are queued, and the hold ends once all
 * are: the batcher then takes them together. Delays of 20 and 40 ms stood
 * in for this, but a forward that finds the server idle runs at once, so
 * each ran alone and the batch under test never formed. */
static void run_as_one_batch(fwd_call *calls, int n) {
    pthread_t th[8];
    assert_true(n <= 8);
    const ls_test_server *srv = calls[0].srv;
    int slow = ls_test_open_receiving_forward(srv);
    assert_true(slow >= 0);
    int started = 0;
    bool queued = true;
    for (; started < n && queued; started++) {
        assert_int_equal(pthread_create(&th[started], NULL, fwd_thread, &calls[started]), 0);
        queued = ls_test_wait_metric(srv, "lorasink_queue_depth", started + 1);
    }
    close(slow);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    assert_true(queued); /* else a batch ran before all its calls were queued */
    assert_true(ls_test_wait_receiving(srv, 0));
}

/* Runs first, and once the server has it queued in the batcher (holding
 * its bytes), second; waits for both. A fixed delay instead let the
 * second overtake a first not yet read and parsed on a busy machine. */
static void run_queued_then(fwd_call *first, fwd_call *second) {
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fwd_thread, first), 0);
    assert_true(ls_test_wait_metric(first->srv, "lorasink_queue_depth", 1));
    fwd_thread(second);
    pthread_join(th, NULL);
}

/* Bytes held by queued forwards have a budget: past it 429, except for a
 * request alone (which must always be able to run). */
static void test_queue_budget(void **state) {
    (void)state;
    /* Each request parks a second in the batcher, holding its bytes: a
     * client still sending a forward keeps the batch open. */
    const char *extra[] = {"--max-queue-mb", "1", "--batch-wait-us", "1000000", "--max-batch-tokens", "1000000",
                           "--max-request-tokens", "100000", "--max-queue-tokens", "1000000", NULL};
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", extra));
    char *big = forward_json(2500, NULL), *huge = forward_json(6000, NULL);
    int slow = ls_test_open_receiving_forward(ts.srv);
    assert_true(slow >= 0);
    fwd_call calls[2] = {{.srv = ts.srv, .body = big}, {.srv = ts.srv, .body = big}};
    run_queued_then(&calls[0], &calls[1]);
    close(slow);
    assert_true(ls_test_wait_receiving(ts.srv, 0)); /* the refused and the abandoned one too */
    assert_int_equal(calls[0].status, 200);
    assert_int_equal(calls[1].status, 429);
    assert_string_equal(calls[1].code, "overloaded");
    /* The budget is given back: alone, even a request over it runs. */
    fwd_call alone = {.srv = ts.srv, .body = huge};
    fwd_thread(&alone);
    assert_int_equal(alone.status, 200);
    slow = ls_test_open_receiving_forward(ts.srv);
    assert_true(slow >= 0);
    fwd_call again[2] = {{.srv = ts.srv, .body = big}, {.srv = ts.srv, .body = big}};
    run_queued_then(&again[0], &again[1]);
    close(slow);
    assert_int_equal(again[0].status, 200);
    assert_int_equal(again[1].status, 429);
    free(big);
    free(huge);
    tiny_server_stop(&ts);
}

/* A safetensors body's x is read in place, so the budget counts it once
 * (as part of the body), not twice: two forwards of 2100 tokens hold
 * about 0.96 MiB of the tiny model's body, gammas, y and names, and fit
 * a 1 MiB budget that counting x again (1.03 MiB) would refuse. */
static void test_queue_budget_counts_borrowed_x_once(void **state) {
    (void)state;
    const char *extra[] = {"--max-queue-mb", "1", "--batch-wait-us", "1000000", "--max-batch-tokens", "1000000",
                           "--max-request-tokens", "100000", "--max-queue-tokens", "1000000", NULL};
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", extra));
    size_t len, big_len;
    uint8_t *body = forward_safetensors(2100, &len), *big = forward_safetensors(2200, &big_len);
    const char *oct = "application/octet-stream";
    int slow = ls_test_open_receiving_forward(ts.srv);
    assert_true(slow >= 0);
    fwd_call calls[2] = {{.srv = ts.srv, .body = body, .len = len, .ctype = oct},
                         {.srv = ts.srv, .body = body, .len = len, .ctype = oct}};
    run_queued_then(&calls[0], &calls[1]);
    close(slow);
    assert_int_equal(calls[0].status, 200);
    assert_int_equal(calls[1].status, 200);
    /* The budget still binds: 2200 tokens each are over it (1.01 MiB). */
    assert_true(ls_test_wait_receiving(ts.srv, 0));
    slow = ls_test_open_receiving_forward(ts.srv);
    assert_true(slow >= 0);
    fwd_call over[2] = {{.srv = ts.srv, .body = big, .len = big_len, .ctype = oct},
                        {.srv = ts.srv, .body = big, .len = big_len, .ctype = oct}};
    run_queued_then(&over[0], &over[1]);
    close(slow);
    assert_int_equal(over[0].status, 200);
    assert_int_equal(over[1].status, 429);
    assert_string_equal(over[1].code, "overloaded");
    free(body);
    free(big);
    tiny_server_stop(&ts);
}

/* Sends all of len bytes on fd. */
static void send_all(int fd, const char *p, size_t len) {
    while (len) {
        ssize_t k = send(fd, p, len, MSG_NOSIGNAL);
        assert_true(k > 0);
        p += k;
        len -= (size_t)k;
    }
}

/* The answer on fd (the request asked Connection: close) into buf. */
static void read_answer(int fd, char *buf, size_t cap) {
    size_t got;
    ls_test_raw_read_all(fd, buf, cap, &got);
    close(fd);
}

/* A JSON body of len bytes: open (an object left open), blanks, '}'. */
static char *padded_json(const char *open, size_t len) {
    char *body = malloc(len + 1);
    assert_non_null(body);
    memset(body, ' ', len);
    memcpy(body, open, strlen(open));
    body[len - 1] = '}';
    body[len] = '\0';
    return body;
}

/* Sends POST route with body but its last 20 bytes on a new connection
 * (Connection: close); returns the socket. */
static int send_all_but_20(const ls_test_server *srv, const char *route, const char *body, size_t len) {
    char head[256];
    snprintf(head, sizeof head,
             "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
             "Content-Length: %zu\r\n\r\n",
             route, len);
    int fd = ls_test_raw_connect(srv);
    assert_true(fd >= 0);
    send_all(fd, head, strlen(head));
    send_all(fd, body, len - 20);
    return fd;
}

/* POST route with body is 429 overloaded naming the budget flag, with
 * Retry-After: 1. */
static void expect_overloaded(const ls_test_server *srv, const char *route, const char *body, size_t len,
                              const char *flag) {
    ls_test_response r = expect_error(srv, "POST", route, NULL, body, len, 429, "overloaded");
    assert_non_null(strstr(r.body, flag));
    assert_non_null(strcasestr(r.headers, "Retry-After: 1"));
    ls_test_response_free(&r);
}

/* Bodies still arriving held no part of --max-queue-mb: twelve clients
 * each holding back the last byte of a 60 MiB forward made the server
 * hold 720 MiB under a 64 MiB budget. A body counts as it arrives (in
 * lorasink_queue_bytes); one that cannot fit beside them is 429 from its
 * head (Content-Length), or once it ends (chunked). */
static void test_queue_budget_counts_arriving_bodies(void **state) {
    (void)state;
    const char *extra[] = {"--max-queue-mb", "1", "--max-body-mb", "4", NULL};
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", extra));
    const size_t len = 700000; /* JSON padded with blanks: 0.67 MiB, one x row */
    char *body = padded_json("{\"x\": [[1, 2, 3, 4]]", len);
    /* The first holds back the last 20 bytes of its body: what came is
     * counted, byte for byte. */
    int first = send_all_but_20(ts.srv, "/forward", body, len);
    assert_true(ls_test_wait_metric(ts.srv, "lorasink_queue_bytes", (double)(len - 20)));
    /* A second by Content-Length: refused from its head. */
    expect_overloaded(ts.srv, "/forward", body, len, "--max-queue-mb");
    /* A chunked one: read and dropped, 429 at its end. */
    int chunked = ls_test_raw_connect(ts.srv);
    assert_true(chunked >= 0);
    char chead[256];
    snprintf(chead, sizeof chead,
             "POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
             "Transfer-Encoding: chunked\r\n\r\n%zx\r\n",
             len);
    send_all(chunked, chead, strlen(chead));
    send_all(chunked, body, len);
    send_all(chunked, "\r\n0\r\n\r\n", 7);
    char buf[4096];
    read_answer(chunked, buf, sizeof buf);
    assert_memory_equal(buf, "HTTP/1.1 429", 12);
    assert_non_null(strstr(buf, "\"overloaded\""));
    /* The first, once whole, is served. */
    send_all(first, body + len - 20, 20);
    read_answer(first, buf, sizeof buf);
    assert_memory_equal(buf, "HTTP/1.1 200", 12);
    /* Its bytes were given back: alone, the same body runs. */
    assert_true(ls_test_wait_receiving(ts.srv, 0));
    ls_test_response ok;
    assert_int_equal(ls_test_http(ts.srv, "POST", "/forward", NULL, body, len, NULL, &ok), 0);
    assert_int_equal(ok.status, 200);
    ls_test_response_free(&ok);
    assert_true(ls_test_wait_metric(ts.srv, "lorasink_queue_bytes", 0));
    free(body);
    tiny_server_stop(&ts);
}

/* The bodies of uploads had no budget beside --max-body-mb: a thousand
 * connections each sending most of a 256 MiB upload held 256 GiB. They
 * count in lorasink_upload_bytes as they arrive and until answered, one
 * that cannot fit beside them is 429 from its head, and forwards keep
 * their own budget. */
static void test_upload_budget_counts_arriving_bodies(void **state) {
    (void)state;
    const char *extra[] = {"--max-upload-mb", "1", "--max-body-mb", "4", NULL};
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", extra));
    tiny_write_adapter_file(&ts, "a.safetensors", "4");
    const size_t len = 700000; /* JSON padded with blanks: 0.67 MiB */
    char *body = padded_json("{\"name\": \"a\", \"path\": \"a.safetensors\"", len);
    int first = send_all_but_20(ts.srv, "/adapters", body, len);
    assert_true(ls_test_wait_metric(ts.srv, "lorasink_upload_bytes", (double)(len - 20)));
    expect_overloaded(ts.srv, "/adapters/validate", body, len, "--max-upload-mb");
    /* A forward of the same size is not an upload: its budget is free. */
    char *fwd = padded_json("{\"x\": [[1, 2, 3, 4]]", len);
    ls_test_response ok;
    assert_int_equal(ls_test_http(ts.srv, "POST", "/forward", NULL, fwd, len, NULL, &ok), 0);
    assert_int_equal(ok.status, 200);
    ls_test_response_free(&ok);
    /* The first, once whole, loads; then its bytes are given back. */
    send_all(first, body + len - 20, 20);
    char buf[4096];
    read_answer(first, buf, sizeof buf);
    assert_memory_equal(buf, "HTTP/1.1 201", 12);
    assert_true(ls_test_wait_metric(ts.srv, "lorasink_upload_bytes", 0));
    assert_int_equal(ls_test_http(ts.srv, "POST", "/adapters/validate", NULL, body, len, NULL, &ok), 0);
    assert_int_equal(ok.status, 200);
    ls_test_response_free(&ok);
    assert_true(ls_test_wait_metric(ts.srv, "lorasink_upload_bytes", 0));
    free(fwd);
    free(body);
    tiny_server_stop(&ts);
}

/* An HTTP/1.0 POST without Content-Length sends its body after the head,
 * which is never read as one: "the body is empty" with "send a JSON
 * object" told the client nothing it could fix. */
static void test_unframed_body(void **state) {
    (void)state;
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", NULL));
    const char *reqs[] = {"POST /forward HTTP/1.0\r\nContent-Type: application/json\r\n\r\n{\"x\": [[1, 2, 3, 4]]}",
                          "POST /adapters HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
                          "Connection: close\r\n\r\n"};
    for (size_t i = 0; i < sizeof reqs / sizeof *reqs; i++) {
        int fd = ls_test_raw_connect(ts.srv);
        assert_true(fd >= 0);
        send_all(fd, reqs[i], strlen(reqs[i]));
        shutdown(fd, SHUT_WR);
        char buf[4096];
        read_answer(fd, buf, sizeof buf);
        assert_memory_equal(buf, "HTTP/1.1 400", 12);
        assert_non_null(strstr(buf, "\"invalid_request\""));
        assert_non_null(strstr(buf, "the request has no Content-Length"));
        assert_non_null(strstr(buf, "send Content-Length: N with the body"));
    }
    tiny_server_stop(&ts);
}

/* Heads that promise large bodies and send none cost no memory, so they
 * hold none of the budget: two of them refused every forward with 429
 * until --body-timeout. */
static void test_queue_budget_ignores_promises(void **state) {
    (void)state;
    const char *extra[] = {"--max-queue-mb", "1", "--max-body-mb", "4", NULL};
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", extra));
    const char *head = "POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       "Content-Length: 4000000\r\n\r\n";
    int idle[2];
    for (int i = 0; i < 2; i++) {
        idle[i] = ls_test_raw_connect(ts.srv);
        assert_true(idle[i] >= 0);
        send_all(idle[i], head, strlen(head));
    }
    assert_true(ls_test_wait_receiving(ts.srv, 2));
    assert_true(ls_test_wait_metric(ts.srv, "lorasink_queue_bytes", 0));
    const char *small = "{\"x\": [[1, 2, 3, 4]]}";
    ls_test_response ok;
    assert_int_equal(ls_test_http(ts.srv, "POST", "/forward", NULL, small, strlen(small), NULL, &ok), 0);
    if (ok.status != 200) fprintf(stderr, "%s\n", ok.body);
    assert_int_equal(ok.status, 200);
    ls_test_response_free(&ok);
    for (int i = 0; i < 2; i++) close(idle[i]);
    tiny_server_stop(&ts);
}

/* An adapter whose file changed under the server fails its own request
 * with 409 adapter_stale; the requests batched with it are answered as
 * if it were not there (they all failed with its 500 before). */
static void test_reload_failure_stays_in_its_request(void **state) {
    (void)state;
    /* Two slots and a host tier of one: loading a, b, c leaves a neither
     * resident nor in host memory, so using it reads its file again. The
     * batch is held open for as long as its calls take to be queued one
     * by one (up to 1 s, the most it may wait). */
    const char *extra[] = {"--slots", "2", "--host-cache", "1", "--batch-wait-us", "1000000", NULL};
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", extra));
    const char *names[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        char file[32];
        snprintf(file, sizeof file, "%s.safetensors", names[i]);
        tiny_write_adapter_file(&ts, file, "4");
        json_t *req = json_pack("{s:s, s:s}", "name", names[i], "path", file);
        json_decref(tiny_post_json(&ts, "/adapters", req, 201));
        json_decref(req);
    }
    /* As cp does: the same name, other factors (the last float's low
     * bytes changed). */
    size_t len;
    uint8_t *other = tiny_adapter_safetensors(&ts, "4", &len);
    other[len - 1] ^= 0x01;
    char path[1024];
    snprintf(path, sizeof path, "%s/a.safetensors", ts.dir);
    ls_test_write_file(path, other, len);
    free(other);
    char *with_a = forward_json(2, "a"), *with_c = forward_json(3, "c"), *base = forward_json(1, NULL);
    fwd_call calls[3] = {{.srv = ts.srv, .body = with_a}, {.srv = ts.srv, .body = base},
                         {.srv = ts.srv, .body = with_c}};
    run_as_one_batch(calls, 3);
    assert_int_equal(calls[0].status, 409);
    assert_string_equal(calls[0].code, "adapter_stale");
    assert_int_equal(calls[1].status, 200);
    assert_int_equal(calls[2].status, 200);
    /* A removed file is stale too, not the client's bad request. */
    assert_int_equal(unlink(path), 0);
    ls_test_response r = expect_error(ts.srv, "POST", "/forward", NULL, with_a, strlen(with_a), 409, "adapter_stale");
    assert_null(strstr(r.body, ts.dir)); /* paths are relative to --adapter-dir */
    ls_test_response_free(&r);
    free(with_a);
    free(with_c);
    free(base);
    tiny_server_stop(&ts);
}

/* One forward of a large JSON body raised the peak RSS by 23 times the
 * body. Now x is parsed straight into floats: the peak of a forward is
 * its body, its tensors (x, gammas, y) and its reply text, measured here
 * against the bound the README states: body + 4 x tensor bytes +
 * 32 MiB; and it is given back after the reply. */
static void test_forward_peak_memory(void **state) {
    (void)state;
    enum { HID = 1024, T = 6000 };
    /* Freed memory must leave the process as it does in a release build:
     * no sanitizer quarantine holding it. */
    char asan[512];
    const char *prev = getenv("ASAN_OPTIONS");
    snprintf(asan, sizeof asan, "ASAN_OPTIONS=%s%squarantine_size_mb=0", prev ? prev : "", prev && *prev ? ":" : "");
    const char *env[] = {asan, NULL};
    const char *args[] = {"--demo", "--experts", "2", "--hidden", "1024", "--intermediate", "64", "--layers", "1",
                          "--dtype", "f32", NULL};
    ls_test_server *s = ls_test_server_start_env(args, env);
    assert_non_null(s);
    ls_buf b;
    ls_buf_init(&b);
    ls_buf_append(&b, "{\"x\":[", 6);
    uint64_t rng = 7;
    for (int t = 0; t < T; t++) {
        ls_buf_append(&b, t ? ",[" : "[", t ? 2 : 1);
        for (int h = 0; h < HID; h++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            ls_buf_printf(&b, "%s%.6f", h ? "," : "", (double)(int64_t)(rng >> 11) / 9007199254740992.0 - 0.5);
        }
        ls_buf_append(&b, "]", 1);
    }
    ls_buf_append(&b, "],\"gammas\":[", 12);
    for (int t = 0; t < T; t++) ls_buf_printf(&b, "%s[1,0.5]", t ? "," : "");
    ls_buf_append(&b, "]}", 2);
    size_t body_len = 0;
    char *body = ls_buf_take(&b, &body_len);
    assert_non_null(body);
    /* Warm up (thread stacks, engine buffers) on a small forward. */
    char *small = ls_test_forward_json(4, HID, "0.5", "[1,0.5]", NULL);
    ls_test_response r;
    assert_int_equal(ls_test_http(s, "POST", "/forward", NULL, small, strlen(small), NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    free(small);
    /* CUDA loads a GEMM kernel the first time a size needs it (lazy module
     * loading) and keeps it: host memory the process takes once, not what
     * a request holds. There the warm-up sends the large body too. */
    assert_int_equal(ls_test_http(s, "GET", "/ready", NULL, NULL, 0, NULL, &r), 0);
    json_t *ready = ls_test_response_json(&r);
    assert_non_null(ready);
    const int cuda = !strcmp(json_string_value(json_object_get(ready, "backend")), "cuda");
    json_decref(ready);
    ls_test_response_free(&r);
    if (cuda) {
        assert_int_equal(ls_test_http(s, "POST", "/forward", NULL, body, body_len, NULL, &r), 0);
        assert_int_equal(r.status, 200);
        ls_test_response_free(&r);
    }
    const int pid = ls_test_server_pid(s);
    const long before = ls_test_proc_kib(pid, "VmRSS");
    assert_int_equal(ls_test_http(s, "POST", "/forward", NULL, body, body_len, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    const size_t reply_len = r.len;
    ls_test_response_free(&r);
    const long peak = ls_test_proc_kib(pid, "VmHWM");
    /* What the request held is given back once its reply is sent (the
     * server frees it a moment after the client has read it all). */
    long after = ls_test_proc_kib(pid, "VmRSS");
    for (int i = 0; i < 50 && (double)(after - before) * 1024.0 > (double)body_len / 2; i++) {
        usleep(100000);
        after = ls_test_proc_kib(pid, "VmRSS");
    }
    const double tensors = 4.0 * T * (2.0 * HID + 2), mib = 1048576.0;
    const double grew = (double)(peak - before) * 1024.0, bound = (double)body_len + 4 * tensors + 32 * mib;
    print_message("forward of %d tokens: body %.1f MiB, tensors %.1f MiB, reply %.1f MiB; peak RSS +%.1f MiB "
                  "(bound %.1f MiB), RSS after %+.1f MiB\n",
                  T, (double)body_len / mib, tensors / mib, (double)reply_len / mib, grew / mib, bound / mib,
                  (double)(after - before) / 1024.0);
    assert_true(grew <= bound);
    assert_true((double)(after - before) * 1024.0 <= (double)body_len / 2);
    free(body);
    assert_int_equal(ls_test_server_stop(s), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nul_in_names),
        cmocka_unit_test(test_sigterm_refuses_new_clients),
        cmocka_unit_test(test_sighup_stops_gracefully),
        cmocka_unit_test(test_server_errors_are_logged),
        cmocka_unit_test(test_safetensors_empty_adapter),
        cmocka_unit_test(test_pin_limit),
        cmocka_unit_test(test_overflow_names_adapter),
        cmocka_unit_test(test_queue_budget_counts_arriving_bodies),
        cmocka_unit_test(test_queue_budget_ignores_promises),
        cmocka_unit_test(test_upload_budget_counts_arriving_bodies),
        cmocka_unit_test(test_unframed_body),
        cmocka_unit_test(test_alpha_is_decimal),
        cmocka_unit_test(test_rank_zero_peft),
        cmocka_unit_test(test_query_is_strict),
        cmocka_unit_test(test_empty_body),
        cmocka_unit_test(test_replace_keeps_pin),
        cmocka_unit_test(test_file_text_never_quoted),
        cmocka_unit_test(test_missing_adapter_dir_stops_startup),
        cmocka_unit_test(test_root_adapter_dir_stops_startup),
        cmocka_unit_test(test_max_request_tokens),
        cmocka_unit_test(test_queue_budget),
        cmocka_unit_test(test_queue_budget_counts_borrowed_x_once),
        cmocka_unit_test(test_reload_failure_stays_in_its_request),
        cmocka_unit_test(test_forward_peak_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
