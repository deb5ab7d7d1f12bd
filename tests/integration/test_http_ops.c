/* What an operator relies on: the API key (constant-time, 401 with
 * WWW-Authenticate, /health and /ready open), body limits (413 from
 * Content-Length before reading, and while streaming), /metrics in the
 * Prometheus text format, /pool and /adapters routes, HEAD, and the
 * environment variable form of the key. */
#include <ctype.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "tests/util/tiny_server.h"

static tiny_server ts;
static const char *auth[] = {"Authorization: Bearer s3cret", NULL};

static int setup(void **state) {
    (void)state;
    const char *extra[] = {"--api-key", "s3cret", "--max-body-mb", "1", NULL};
    return tiny_server_start(&ts, "interleaved", extra) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tiny_server_stop(&ts);
    return 0;
}

static long status_of(const char *method, const char *path, const char *const *headers, const char *body,
                      ls_test_response *keep) {
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, method, path, NULL, body, body ? strlen(body) : 0, headers, &r), 0);
    long st = r.status;
    if (keep) *keep = r;
    else ls_test_response_free(&r);
    return st;
}

static void test_auth(void **state) {
    (void)state;
    assert_int_equal(status_of("GET", "/health", NULL, NULL, NULL), 200);
    assert_int_equal(status_of("GET", "/ready", NULL, NULL, NULL), 200);
    const char *routes[][2] = {{"GET", "/pool"}, {"GET", "/adapters"}, {"GET", "/metrics"}, {"POST", "/forward"},
                               {"POST", "/adapters"}, {"DELETE", "/adapters/x"}, {"GET", "/adapters/x"},
                               {"POST", "/adapters/validate"}};
    const char *wrong[] = {"Authorization: Bearer s3cre", NULL};
    const char *wrong2[] = {"Authorization: Bearer s3cretX", NULL};
    const char *basic[] = {"Authorization: Basic czNjcmV0", NULL};
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        ls_test_response r;
        const char *body = !strcmp(routes[i][0], "POST") ? "{}" : NULL;
        assert_int_equal(status_of(routes[i][0], routes[i][1], NULL, body, &r), 401);
        assert_non_null(strstr(r.headers, "WWW-Authenticate: Bearer"));
        json_t *j = ls_test_response_json(&r);
        assert_string_equal(ls_test_error_code(j), "unauthorized");
        json_decref(j);
        assert_non_null(strstr(r.body, "this route needs Authorization: Bearer"));
        ls_test_response_free(&r);
        /* A wrong key is told apart from none: the fix is another key. */
        assert_int_equal(status_of(routes[i][0], routes[i][1], wrong, body, &r), 401);
        assert_non_null(strstr(r.body, "the key sent in Authorization: Bearer is not one this server takes"));
        assert_non_null(strstr(r.body, "check the key"));
        ls_test_response_free(&r);
        assert_int_equal(status_of(routes[i][0], routes[i][1], wrong2, body, NULL), 401);
        assert_int_equal(status_of(routes[i][0], routes[i][1], basic, body, NULL), 401);
        assert_true(status_of(routes[i][0], routes[i][1], auth, body, NULL) != 401);
    }
}

static void test_body_limits(void **state) {
    (void)state;
    size_t big = (1u << 20) + 100;
    char *body = malloc(big + 1);
    memset(body, ' ', big);
    body[big] = '\0';
    ls_test_response r;
    /* as curl sends a large body: the 413 comes before the body is sent */
    const char *expect[] = {"Authorization: Bearer s3cret", "Expect: 100-continue", NULL};
    assert_int_equal(status_of("POST", "/forward", expect, body, &r), 413);
    json_t *j = ls_test_response_json(&r);
    assert_string_equal(ls_test_error_code(j), "payload_too_large");
    json_decref(j);
    ls_test_response_free(&r);
    /* chunked: no Content-Length, the cap is enforced while streaming */
    const char *chunked[] = {"Authorization: Bearer s3cret", "Transfer-Encoding: chunked", NULL};
    assert_int_equal(status_of("POST", "/adapters", chunked, body, NULL), 413);
    free(body);
    /* an endless chunked body is cut off: no success, and the server lives */
    size_t huge = (size_t)5 << 20;
    body = malloc(huge + 1);
    memset(body, ' ', huge);
    body[huge] = '\0';
    ls_test_response rr;
    if (ls_test_http(ts.srv, "POST", "/forward", NULL, body, huge, chunked, &rr) == 0)
        assert_int_equal(rr.status, 413);
    ls_test_response_free(&rr);
    free(body);
    assert_int_equal(status_of("GET", "/health", NULL, NULL, NULL), 200);
}

/* Every non-comment line is `name{labels} value` or `name value`. */
static void check_prometheus(const char *text) {
    const char *p = text;
    int samples = 0;
    while (*p) {
        const char *eol = strchr(p, '\n');
        assert_non_null(eol);
        if (*p != '#') {
            const char *q = p;
            assert_true(isalpha((unsigned char)*q) || *q == '_');
            while (isalnum((unsigned char)*q) || *q == '_' || *q == ':') q++;
            if (*q == '{') { /* label="value" pairs; values may hold any character but '"' unescaped */
                q++;
                while (*q != '}') {
                    while (isalnum((unsigned char)*q) || *q == '_') q++;
                    assert_true(q[0] == '=' && q[1] == '"');
                    q += 2;
                    while (*q != '"') {
                        assert_true(*q && *q != '\n');
                        q += *q == '\\' ? 2 : 1;
                    }
                    q++;
                    if (*q == ',') q++;
                    assert_true(q < eol);
                }
                q++;
            }
            if (*q != ' ') fprintf(stderr, "bad metrics line: %.*s\n", (int)(eol - p), p);
            assert_true(*q == ' ');
            char *end;
            strtod(q + 1, &end);
            assert_true(end == eol);
            samples++;
        } else {
            assert_true(!strncmp(p, "# HELP ", 7) || !strncmp(p, "# TYPE ", 7));
        }
        p = eol + 1;
    }
    assert_true(samples > 10);
}

static void test_metrics(void **state) {
    (void)state;
    json_t *a = tiny_adapter_inline(&ts, "m1", NULL);
    char *text = json_dumps(a, JSON_COMPACT);
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "POST", "/adapters", NULL, text, strlen(text), auth, &r), 0);
    assert_int_equal(r.status, 201);
    ls_test_response_free(&r);
    free(text);
    json_decref(a);
    assert_int_equal(status_of("POST", "/adapters", auth, "{\"name\": \"bad\", \"tensors\": {\"foo\": [[1]]}}", NULL), 422);
    assert_int_equal(status_of("POST", "/forward", auth, "{\"x\": [[1, 2, 3, 4]], \"adapter\": \"m1\"}", NULL), 200);
    assert_int_equal(status_of("GET", "/metrics", auth, NULL, &r), 200);
    assert_non_null(strstr(r.content_type, "text/plain"));
    check_prometheus(r.body);
    assert_non_null(strstr(r.body, "lorasink_requests_total{route=\"/forward\",status=\"200\"} 1\n"));
    assert_non_null(strstr(r.body, "lorasink_request_duration_seconds_bucket{route=\"/forward\",status=\"200\",le=\"+Inf\"} 1\n"));
    assert_non_null(strstr(r.body, "lorasink_tokens_total 1\n"));
    assert_non_null(strstr(r.body, "lorasink_validation_failures_total{code=\"lora_unknown_tensor\"} 1\n"));
    assert_non_null(strstr(r.body, "lorasink_pool_slots 4\n"));
    assert_non_null(strstr(r.body, "lorasink_pool_loads_total"));
    assert_non_null(strstr(r.body, "lorasink_pool_evictions_total"));
    ls_test_response_free(&r);
}

static void test_pool_and_adapter_routes(void **state) {
    (void)state;
    ls_test_response r;
    assert_int_equal(status_of("GET", "/pool", auth, NULL, &r), 200);
    json_t *p = ls_test_response_json(&r);
    ls_test_response_free(&r);
    json_t *cap = json_object_get(p, "capacity");
    assert_int_equal(json_integer_value(json_object_get(cap, "slots")), 4);
    assert_int_equal(json_integer_value(json_object_get(cap, "max_rank")), 4);
    assert_int_equal(json_integer_value(json_object_get(cap, "layers")), 1);
    assert_string_equal(json_string_value(json_object_get(cap, "layout")), "shared");
    /* 4 buffers per slot, one layer: (1*2*4*4 + 2*6*4 + 2*4*3 + 1*4*4)
     * floats. The CPU holds just these; CUDA holds them and the operands
     * its kernels read, derived from them at the weights' dtype. */
    const json_int_t factors = (32 + 48 + 24 + 16) * 4;
    const json_int_t per_slot = json_integer_value(json_object_get(cap, "bytes_per_slot"));
    if (!strcmp(json_string_value(json_object_get(p, "backend")), "cpu"))
        assert_int_equal(per_slot, factors);
    else
        assert_true(per_slot > factors);
    assert_int_equal(json_integer_value(json_object_get(cap, "bytes_total")), 4 * per_slot);
    json_t *slots = json_object_get(p, "slots");
    assert_int_equal(json_array_size(slots), 4);
    int resident = 0;
    for (size_t i = 0; i < 4; i++) {
        json_t *s = json_array_get(slots, i);
        assert_int_equal(json_integer_value(json_object_get(s, "index")), (json_int_t)i);
        if (!strcmp(json_string_value(json_object_get(s, "state")), "resident")) {
            resident++;
            assert_string_equal(json_string_value(json_object_get(s, "adapter")), "m1");
        }
    }
    assert_int_equal(resident, 1);
    assert_true(json_is_object(json_object_get(p, "counters")));
    assert_true(json_is_object(json_object_get(p, "host_cache")));
    json_decref(p);

    assert_int_equal(status_of("GET", "/adapters", auth, NULL, &r), 200);
    json_t *l = ls_test_response_json(&r);
    ls_test_response_free(&r);
    assert_int_equal(json_array_size(json_object_get(l, "adapters")), 1);
    json_t *a = json_array_get(json_object_get(l, "adapters"), 0);
    const char *keys[] = {"name", "version", "rank", "scale", "format", "layout", "pinned", "state", "slot", "bytes",
                          "sha256", "in_flight", "last_used"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) assert_non_null(json_object_get(a, keys[i]));
    assert_true(json_is_string(json_object_get(a, "last_used"))); /* used by the forward above */
    json_decref(l);
    assert_int_equal(status_of("GET", "/adapters/m1", auth, NULL, NULL), 200);
    assert_int_equal(status_of("HEAD", "/adapters/m1", auth, NULL, NULL), 200);
    assert_int_equal(status_of("GET", "/adapters/none", auth, NULL, NULL), 404);
    assert_int_equal(status_of("DELETE", "/adapters/m1", auth, NULL, NULL), 200);
    assert_int_equal(status_of("POST", "/forward", auth, "{\"x\": [[1, 2, 3, 4]], \"adapter\": \"m1\"}", NULL), 404);
}

static void test_key_from_environment(void **state) {
    (void)state;
    const char *env[] = {"LORASINK_API_KEY=from-env", NULL};
    ls_test_server *s = ls_test_server_start_env((const char *[]){"--experts", "2", "--hidden", "8", "--intermediate",
                                                                  "4", "--layers", "1", NULL},
                                                 env);
    assert_non_null(s);
    ls_test_response r;
    assert_int_equal(ls_test_http(s, "GET", "/pool", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 401);
    ls_test_response_free(&r);
    assert_int_equal(ls_test_http(s, "GET", "/pool", NULL, NULL, 0, (const char *[]){"Authorization: Bearer from-env", NULL},
                                  &r),
                     0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    assert_int_equal(ls_test_server_stop(s), 0);
}

/* The end of the access line of request id, after its time: who sent
 * it (address and key id), into out. */
static void access_who(const char *id, char *out, size_t len) {
    char want[192];
    snprintf(want, sizeof want, " access %s ", id);
    assert_true(ls_test_server_wait_output(ts.srv, want) > 0);
    char *all = ls_test_server_output(ts.srv);
    const char *line = strstr(all, want);
    assert_non_null(line);
    const size_t n = strcspn(line, "\n");
    /* id, method, path, status, bytes, microseconds: then who. */
    const char *p = line + strlen(want);
    for (int field = 0; field < 5; field++) p = strchr(p, ' ') + 1;
    snprintf(out, len, "%.*s", (int)(n - (size_t)(p - line)), p);
    free(all);
}

/* Every response carries X-Request-Id (the client's when it is fit to
 * echo, else a new one), the access log has one line per request with
 * that id, method, path, status, bytes, time, the client's address and
 * the key's id, and JSON bodies end with a newline. */
static void test_request_id_and_access_log(void **state) {
    (void)state;
    ls_test_response r;
    char id[160], want[512];
    const char *mine[] = {"X-Request-Id: client-id.42", NULL};
    assert_int_equal(ls_test_http(ts.srv, "GET", "/health", NULL, NULL, 0, mine, &r), 0);
    assert_string_equal(ls_test_header(r.headers, "X-Request-Id", id, sizeof id), "client-id.42");
    assert_true(r.len > 0 && r.body[r.len - 1] == '\n');
    snprintf(want, sizeof want, " access client-id.42 GET /health 200 %zu ", r.len);
    ls_test_response_free(&r);
    assert_true(ls_test_server_wait_output(ts.srv, want) > 0);

    /* HEAD sends no body, and its line says so. */
    const char *head_id[] = {"X-Request-Id: head-probe", NULL};
    assert_int_equal(ls_test_http(ts.srv, "HEAD", "/health", NULL, NULL, 0, head_id, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    assert_true(ls_test_server_wait_output(ts.srv, " access head-probe HEAD /health 200 0 ") > 0);

    /* Generated: 16 hex digits, a new one per request; an error too. */
    char first[32];
    assert_int_equal(ls_test_http(ts.srv, "GET", "/nowhere", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 404);
    assert_true(r.body[r.len - 1] == '\n');
    snprintf(first, sizeof first, "%s", ls_test_header(r.headers, "X-Request-Id", id, sizeof id));
    assert_int_equal(strlen(first), 16);
    for (int i = 0; i < 16; i++) assert_true(isxdigit((unsigned char)first[i]));
    snprintf(want, sizeof want, " access %s GET /nowhere 404 %zu ", first, r.len);
    ls_test_response_free(&r);
    assert_true(ls_test_server_wait_output(ts.srv, want) > 0);
    assert_int_equal(ls_test_http(ts.srv, "GET", "/nowhere", NULL, NULL, 0, NULL, &r), 0);
    assert_string_not_equal(ls_test_header(r.headers, "X-Request-Id", id, sizeof id), first);
    ls_test_response_free(&r);

    /* Ids that cannot be echoed or logged as they are get replaced. */
    char longer[200];
    snprintf(longer, sizeof longer, "X-Request-Id: %0129d", 7);
    const char *bad[][2] = {{"X-Request-Id: two words", NULL}, {longer, NULL}};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ls_test_http(ts.srv, "GET", "/health", NULL, NULL, 0, bad[i], &r), 0);
        assert_int_equal(strlen(ls_test_header(r.headers, "X-Request-Id", id, sizeof id)), 16);
        ls_test_response_free(&r);
    }

    /* A decoded %0a in the path cannot split the log line. */
    const char *tagged[] = {"X-Request-Id: crlf-probe", NULL};
    assert_int_equal(ls_test_http(ts.srv, "GET", "/adapters/a%0aforged", NULL, NULL, 0, tagged, &r), 0);
    ls_test_response_free(&r);
    assert_true(ls_test_server_wait_output(ts.srv, " access crlf-probe GET /adapters/a%0Aforged 401 ") > 0);

    /* Who: the address, and the key ("-" when none was taken). */
    char who[128];
    access_who("crlf-probe", who, sizeof who);
    assert_string_equal(who, "127.0.0.1 -");
    const char *keyed[] = {"Authorization: Bearer s3cret", "X-Request-Id: keyed-probe", NULL};
    assert_int_equal(ls_test_http(ts.srv, "GET", "/pool", NULL, NULL, 0, keyed, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    access_who("keyed-probe", who, sizeof who);
    assert_string_equal(who, "127.0.0.1 api-key");
}

/* --access-log false: no access lines, the id header still sent. */
static void test_access_log_off(void **state) {
    (void)state;
    const char *args[] = {"--hidden", "8", "--intermediate", "4", "--layers", "1", "--access-log=false", NULL};
    ls_test_server *s = ls_test_server_start(args);
    assert_non_null(s);
    ls_test_response r;
    const char *mine[] = {"X-Request-Id: quiet-1", NULL};
    assert_int_equal(ls_test_http(s, "GET", "/health", NULL, NULL, 0, mine, &r), 0);
    char id[64];
    assert_string_equal(ls_test_header(r.headers, "X-Request-Id", id, sizeof id), "quiet-1");
    ls_test_response_free(&r);
    /* An access line is written before the reply, so ahead of any line
     * written after it: once the stop's first line is read, so would be
     * the request's. A fixed 100 ms stood in for that, and a reader
     * thread that had not caught up yet passed the check unseen. */
    assert_int_equal(kill(ls_test_server_pid(s), SIGTERM), 0);
    assert_true(ls_test_server_wait_output(s, "SIGTERM: stopping") > 0);
    char *out = ls_test_server_output(s);
    assert_null(strstr(out, " access "));
    free(out);
    assert_int_equal(ls_test_server_stop(s), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auth),    cmocka_unit_test(test_body_limits),
        cmocka_unit_test(test_metrics), cmocka_unit_test(test_pool_and_adapter_routes),
        cmocka_unit_test(test_key_from_environment),
        cmocka_unit_test(test_request_id_and_access_log),
        cmocka_unit_test(test_access_log_off),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
