/* A hostile client against the real server: bytes that are not UTF-8 in
 * the URL and the body, a nested array that promises more than it holds,
 * a forward whose result overflows float32, early replies while a body is
 * pending, bodies on routes that read none, and a shutdown while
 * keep-alive clients keep /forward connections parked in the batcher. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "common/buf.h"
#include "tests/util/server_driver.h"

#define H 8

static ls_test_server *srv;

static int setup(void **state) {
    (void)state;
    const char *args[] = {"--demo", "--experts", "2", "--hidden", "8", "--intermediate", "4", "--layers", "1",
                          "--max-body-mb", "1", NULL};
    srv = ls_test_server_start(args);
    return srv ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    assert_int_equal(ls_test_server_stop(srv), 0);
    return 0;
}

/* Sends a request and asserts a JSON error body with code and status. */
static void expect_error_at(ls_test_server *s, const char *method, const char *path, const char *ct, const void *body,
                            size_t len, long status, const char *code) {
    ls_test_response r;
    assert_int_equal(ls_test_http(s, method, path, ct, body, len, NULL, &r), 0);
    if (r.status != status) fprintf(stderr, "%s %s -> %ld: %s\n", method, path, r.status, r.body);
    assert_int_equal(r.status, status);
    json_t *j = ls_test_response_json(&r);
    if (!j) fprintf(stderr, "%s %s: the body is not JSON: '%s'\n", method, path, r.body);
    assert_non_null(j);
    assert_string_equal(ls_test_error_code(j), code);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "error"), "status")), status);
    json_decref(j);
    ls_test_response_free(&r);
}

static void expect_health(ls_test_server *s) {
    ls_test_response r;
    assert_int_equal(ls_test_http(s, "GET", "/health", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
}

static void test_not_utf8_still_json(void **state) {
    (void)state;
    /* MHD percent-decodes the path: %FF is a raw 0xFF byte in the
     * message, which jansson refuses; the body used to be empty. */
    expect_error_at(srv, "GET", "/%FF", NULL, NULL, 0, 404, "not_found");
    expect_error_at(srv, "GET", "/x%E2%82", NULL, NULL, 0, 404, "not_found");
    expect_error_at(srv, "GET", "/adapters/%FF%FE", NULL, NULL, 0, 404, "adapter_not_found");
    expect_error_at(srv, "PUT", "/%C0%AF", NULL, "{}", 2, 404, "not_found");
    /* an unknown key of three-byte characters, cut by "%.64s" mid-character */
    ls_buf b;
    ls_buf_init(&b);
    ls_buf_append(&b, "{\"", 2);
    for (int i = 0; i < 30; i++) ls_buf_append(&b, "\xe2\x82\xac", 3);
    ls_buf_append(&b, "\": 1}", 5);
    size_t len;
    char *body = ls_buf_take(&b, &len);
    expect_error_at(srv, "POST", "/forward", NULL, body, len, 400, "invalid_request");
    expect_error_at(srv, "POST", "/adapters", NULL, body, len, 400, "invalid_request");
    free(body);
    /* a query value that is not UTF-8, quoted in the message */
    static const uint8_t st[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    expect_error_at(srv, "POST", "/forward?layer=%FF", "application/octet-stream", st, sizeof st, 400,
                    "invalid_request");
    expect_health(srv);
}

static void test_nested_array_cannot_amplify(void **state) {
    (void)state;
    /* [[[100000 zeros], 0, ...], 0, ...]: 600 kB that promise 1e15
     * floats. The allocation used to come first (500, or an abort under
     * ASan); now the array is checked whole before anything is allocated. */
    ls_buf b;
    ls_buf_init(&b);
    ls_buf_append(&b, "{\"x\": [[[0", 10);
    for (int i = 1; i < 100000; i++) ls_buf_append(&b, ",0", 2);
    ls_buf_append(&b, "]", 1);
    for (int l = 1; l < 3; l++) {
        for (int i = 1; i < 100000; i++) ls_buf_append(&b, ",0", 2);
        ls_buf_append(&b, "]", 1);
    }
    ls_buf_append(&b, "}", 1);
    size_t len;
    char *body = ls_buf_take(&b, &len);
    assert_non_null(body);
    expect_error_at(srv, "POST", "/forward", NULL, body, len, 422, "invalid_shape");
    free(body);
    expect_health(srv);
}

static void test_nonfinite_y(void **state) {
    (void)state;
    /* Finite inputs whose result overflows float32: JSON cannot carry
     * Inf or NaN, and the answer used to be 200 with "y": null. */
    const char *x = "[[3e38, 3e38, 3e38, 3e38, 3e38, 3e38, 3e38, 3e38]]";
    const char *g = "[[3e38, 3e38]]";
    char body[256];
    snprintf(body, sizeof body, "{\"x\": %s, \"gammas\": %s}", x, g);
    expect_error_at(srv, "POST", "/forward", NULL, body, strlen(body), 400, "invalid_request");
    ls_test_response e;
    assert_int_equal(ls_test_http(srv, "POST", "/forward", NULL, body, strlen(body), NULL, &e), 0);
    assert_non_null(strstr(e.body, "overflows float32 (the base model)"));
    ls_test_response_free(&e);
    /* base64 carries them: 200 with every value present */
    snprintf(body, sizeof body, "{\"x\": %s, \"gammas\": %s, \"encoding\": \"base64\"}", x, g);
    ls_test_response r;
    assert_int_equal(ls_test_http(srv, "POST", "/forward", NULL, body, strlen(body), NULL, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = ls_test_response_json(&r);
    assert_non_null(j);
    json_t *y = json_object_get(j, "y");
    assert_true(json_is_object(y));
    assert_int_equal(strlen(json_string_value(json_object_get(y, "data"))), (H * 4 + 2) / 3 * 4);
    json_decref(j);
    ls_test_response_free(&r);
}

/* A raw connection that must succeed. */
static int raw_connect(const ls_test_server *s) {
    int fd = ls_test_raw_connect(s);
    assert_true(fd >= 0);
    return fd;
}

static int count_responses(const char *buf) {
    int n = 0;
    for (const char *p = buf; (p = strstr(p, "HTTP/1.1 ")); p++) n++;
    return n;
}

static void test_early_413_closes(void **state) {
    (void)state;
    /* Content-Length over --max-body-mb: 413 before the body is read,
     * then the connection is closed rather than the body parsed as the
     * next request. */
    int fd = raw_connect(srv);
    const char *req = "POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: 2097152\r\n\r\n";
    assert_int_equal(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
    char buf[8192];
    size_t len;
    assert_true(ls_test_raw_read_all(fd, buf, sizeof buf, &len));
    close(fd);
    assert_non_null(strstr(buf, "HTTP/1.1 413"));
    assert_non_null(strstr(buf, "\"payload_too_large\""));
    assert_int_equal(count_responses(buf), 1);

    /* An early 405 on a method MHD has no special case for, with a body
     * that is itself a request: one response, never two. */
    fd = raw_connect(srv);
    const char *inner = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    char smuggle[512];
    snprintf(smuggle, sizeof smuggle,
             "PATCH /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(inner), inner);
    assert_int_equal(send(fd, smuggle, strlen(smuggle), 0), (ssize_t)strlen(smuggle));
    ls_test_raw_read_all(fd, buf, sizeof buf, &len);
    close(fd);
    assert_non_null(strstr(buf, "HTTP/1.1 405"));
    assert_int_equal(count_responses(buf), 1);
    expect_health(srv);
}

static void test_body_on_bodyless_route(void **state) {
    (void)state;
    /* /health is open even with an API key; a body sent to it used to be
     * buffered up to --max-body-mb (and answered 413). Now it is dropped. */
    const char *args[] = {"--demo",      "--experts",     "2", "--hidden",  "8", "--intermediate", "4", "--layers", "1",
                          "--max-body-mb", "1", "--api-key", "k", NULL};
    ls_test_server *s = ls_test_server_start(args);
    assert_non_null(s);
    size_t len = 3u << 20;
    char *body = malloc(len);
    assert_non_null(body);
    memset(body, ' ', len);
    ls_test_response r;
    assert_int_equal(ls_test_http(s, "GET", "/health", "application/json", body, len, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    free(body);
    /* a route that reads a body still refuses it before auth is passed */
    expect_error_at(s, "POST", "/forward", NULL, "{}", 2, 401, "unauthorized");
    assert_int_equal(ls_test_server_stop(s), 0);
}

/* Sends req on a new connection and reads until the server closes; the
 * answer in buf, its count of responses returned. */
static int pipelined(const ls_test_server *s, const char *req, char *buf, size_t cap) {
    int fd = raw_connect(s);
    assert_int_equal(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
    size_t len;
    ls_test_raw_read_all(fd, buf, cap, &len);
    close(fd);
    return count_responses(buf);
}

static void test_bodiless_refusal_keeps_alive(void **state) {
    (void)state;
    /* A refusal of a request that frames no body (wrong key, no route,
     * method not allowed) keeps its connection: the next request on it
     * is answered. One that frames a body is still closed, since the
     * body is never read. */
    const char *args[] = {"--demo", "--experts", "2", "--hidden", "8", "--intermediate", "4", "--layers", "1",
                          "--api-key", "k", NULL};
    ls_test_server *s = ls_test_server_start(args);
    assert_non_null(s);
    const char *next = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    const char *first[] = {"GET /pool HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer wrong\r\n\r\n",
                           "GET /pool HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                           "GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer k\r\n\r\n",
                           "DELETE /pool HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer k\r\n"
                           "Content-Length: 0\r\n\r\n"};
    const char *status[] = {"HTTP/1.1 401", "HTTP/1.1 401", "HTTP/1.1 404", "HTTP/1.1 405"};
    char req[512], buf[16384];
    for (size_t i = 0; i < sizeof first / sizeof *first; i++) {
        snprintf(req, sizeof req, "%s%s", first[i], next);
        const int n = pipelined(s, req, buf, sizeof buf);
        if (n != 2) fprintf(stderr, "%s-> %s\n", first[i], buf);
        assert_memory_equal(buf, status[i], strlen(status[i]));
        assert_int_equal(n, 2);
        const char *second = strstr(buf + 1, "HTTP/1.1 ");
        assert_memory_equal(second, "HTTP/1.1 200", 12);
        char one[8192];
        snprintf(one, sizeof one, "%.*s", (int)(second - buf), buf);
        assert_null(strstr(one, "Connection: close"));
    }
    /* A body framed: one answer, the connection closed. */
    snprintf(req, sizeof req, "POST /nope HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer k\r\n"
                              "Content-Length: 2\r\n\r\n{}%s", next);
    assert_int_equal(pipelined(s, req, buf, sizeof buf), 1);
    assert_memory_equal(buf, "HTTP/1.1 404", 12);
    assert_non_null(strstr(buf, "Connection: close"));
    /* A head that is refused as unsound is closed too. */
    snprintf(req, sizeof req, "GET /pool HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: 127.0.0.1\r\n\r\n%s", next);
    assert_int_equal(pipelined(s, req, buf, sizeof buf), 1);
    assert_memory_equal(buf, "HTTP/1.1 400", 12);
    assert_int_equal(ls_test_server_stop(s), 0);
}

typedef struct {
    int port;
    atomic_int ok, failed_status; /* read by the test while the client runs */
} keepalive_client;

static size_t discard(char *p, size_t size, size_t n, void *ud) {
    (void)p;
    (void)ud;
    return size * n;
}

/* Forwards on one reused connection until the transport fails. */
static void *keepalive_loop(void *arg) {
    keepalive_client *c = arg;
    CURL *h = curl_easy_init();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/forward", c->port);
    const char *body = "{\"x\": [[1, 2, 3, 4, 5, 6, 7, 8]]}";
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 5L);
    for (int i = 0; i < 100000; i++) {
        if (curl_easy_perform(h) != CURLE_OK) break;
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        if (status == 200) atomic_fetch_add(&c->ok, 1);
        else atomic_store(&c->failed_status, (int)status);
    }
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return NULL;
}

static void test_shutdown_with_parked_forwards(void **state) {
    (void)state;
    /* Each forward waits up to 200 ms in the batcher with its connection
     * suspended, and keep-alive clients send the next at once. The server
     * used to wait 30 s for them, then call MHD_stop_daemon with a
     * connection still suspended, which makes libmicrohttpd abort. Now
     * replies carry Connection: close once stopping, no new connection is
     * parked, and it exits 0 at once. */
    const char *args[] = {"--demo", "--experts", "2", "--hidden", "8", "--intermediate", "4", "--layers", "1",
                          "--batch-wait-us", "200000", "--max-batch-tokens", "64", NULL};
    ls_test_server *s = ls_test_server_start(args);
    assert_non_null(s);
    enum { N_CLIENTS = 3 };
    keepalive_client c[N_CLIENTS];
    pthread_t th[N_CLIENTS];
    for (int i = 0; i < N_CLIENTS; i++) {
        c[i].port = ls_test_server_port(s);
        atomic_init(&c[i].ok, 0);
        atomic_init(&c[i].failed_status, 0);
        assert_int_equal(pthread_create(&th[i], NULL, keepalive_loop, &c[i]), 0);
    }
    /* Stop once every client has been served and so is on its kept-alive
     * connection, sending the next forward at once (to be parked in the
     * batcher with the others'). A fixed 700 ms let a client that had
     * not been served yet on a busy machine find the server gone. */
    for (int i = 0; i < N_CLIENTS; i++)
        for (int t = 0; t < 1000 && atomic_load(&c[i].ok) == 0; t++) usleep(10000);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = ls_test_server_stop(s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    for (int i = 0; i < N_CLIENTS; i++) pthread_join(th[i], NULL);
    fprintf(stderr, "shutdown took %.2f s; forwards served: %d %d %d\n", took, atomic_load(&c[0].ok),
            atomic_load(&c[1].ok), atomic_load(&c[2].ok));
    assert_int_equal(rc, 0);
    assert_true(took < 10.0);
    for (int i = 0; i < N_CLIENTS; i++) {
        assert_true(atomic_load(&c[i].ok) > 0);                /* forwards were served before and during the stop */
        assert_int_equal(atomic_load(&c[i].failed_status), 0); /* and none was answered with an error */
    }
}

int main(void) {
    curl_global_init(CURL_GLOBAL_ALL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_not_utf8_still_json),
        cmocka_unit_test(test_nested_array_cannot_amplify),
        cmocka_unit_test(test_nonfinite_y),
        cmocka_unit_test(test_early_413_closes),
        cmocka_unit_test(test_body_on_bodyless_route),
        cmocka_unit_test(test_bodiless_refusal_keeps_alive),
        cmocka_unit_test(test_shutdown_with_parked_forwards),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    curl_global_cleanup();
    return rc;
}
