/* The rules on a request's head against the real server: Host (DNS
 * rebinding) and Origin / Sec-Fetch-Site (cross-site requests a page
 * makes a browser send), headers that must come once (the adapter header
 * a proxy hashes), Transfer-Encoding with Content-Length, query integers
 * written plainly, the cap on query parameters (answered, not a closed
 * connection), the security headers of every response, and log fields
 * a client chose escaped. The browser side of the cross-site rules is
 * tests/system/check_cross_site.py, in headless Chromium. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/tiny_server.h"

static tiny_server ts;

static int setup(void **state) {
    (void)state;
    return tiny_server_start(&ts, "interleaved", NULL) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tiny_server_stop(&ts);
    return 0;
}

/* One request with extra headers; asserts the status and, for an error,
 * its code. Returns the response (the caller frees it). */
static ls_test_response expect(ls_test_server *s, const char *method, const char *path, const char *ct,
                               const char *body, const char *const *headers, long status, const char *code) {
    ls_test_response r;
    assert_int_equal(ls_test_http(s, method, path, ct, body, body ? strlen(body) : 0, headers, &r), 0);
    if (r.status != status) fprintf(stderr, "%s %s -> %ld: %s\n", method, path, r.status, r.body);
    assert_int_equal(r.status, status);
    if (code) {
        json_t *j = ls_test_response_json(&r);
        assert_non_null(j);
        if (strcmp(ls_test_error_code(j), code)) fprintf(stderr, "%s %s: %s\n", method, path, r.body);
        assert_string_equal(ls_test_error_code(j), code);
        json_decref(j);
    }
    return r;
}

static void expect_status(ls_test_server *s, const char *method, const char *path, const char *const *headers,
                          long status, const char *code) {
    ls_test_response r = expect(s, method, path, NULL, NULL, headers, status, code);
    ls_test_response_free(&r);
}

/* Sends raw bytes, reads the whole answer (the server closes, or 3 s
 * pass) into buf. */
static void raw(ls_test_server *s, const char *req, char *buf, size_t cap) {
    int fd = ls_test_raw_connect(s);
    assert_true(fd >= 0);
    assert_int_equal(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    size_t len;
    ls_test_raw_read_all(fd, buf, cap, &len);
    close(fd);
}

static void expect_raw(ls_test_server *s, const char *req, const char *status_line, const char *code) {
    char buf[16384];
    raw(s, req, buf, sizeof buf);
    if (strncmp(buf, status_line, strlen(status_line)) || (code && !strstr(buf, code)))
        fprintf(stderr, "%s\n-> %s\n", req, buf);
    assert_memory_equal(buf, status_line, strlen(status_line));
    if (code) assert_non_null(strstr(buf, code));
}

/* Host: an IP literal or localhost, with or without a port, always; a
 * name only when listed (rebinding needs a name); probes whatever. */
static void test_host(void **state) {
    (void)state;
    const char *names[] = {"Host: evil.test", "Host: evil.test:8080", "Host: 127.0.0.1.evil.test",
                           "Host: ::1",       "Host: 127.0.0.1:x",   "Host: [::1",
                           "Host: localhost.evil.test"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *h[] = {names[i], NULL};
        expect_status(ts.srv, "GET", "/pool", h, 403, "forbidden_host");
    }
    const char *ok[] = {"Host: 127.0.0.1", "Host: 127.0.0.1:1", "Host: [::1]", "Host: [::1]:8080",
                        "Host: localhost", "Host: LocalHost:99", "Host: 10.1.2.3:80"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        const char *h[] = {ok[i], NULL};
        expect_status(ts.srv, "GET", "/pool", h, 200, NULL);
    }
    /* Probes and the page (which holds no data) answer any name. */
    const char *evil[] = {"Host: evil.test", NULL};
    expect_status(ts.srv, "GET", "/health", evil, 200, NULL);
    expect_status(ts.srv, "GET", "/ready", evil, 200, NULL);
    expect_status(ts.srv, "GET", "/dashboard", evil, 200, NULL);
    /* An adapter cannot be loaded under a rebound name either. */
    json_t *up = tiny_adapter_inline(&ts, "rebound", NULL);
    char *body = json_dumps(up, JSON_COMPACT);
    json_decref(up);
    ls_test_response r = expect(ts.srv, "POST", "/adapters", "text/plain", body, evil, 403, "forbidden_host");
    ls_test_response_free(&r);
    free(body);
    expect_status(ts.srv, "GET", "/adapters/rebound", NULL, 404, "adapter_not_found");
    /* No Host: HTTP/1.0 may omit it (old clients, HAProxy's default
     * check); HTTP/1.1 may not. */
    expect_raw(ts.srv, "GET /pool HTTP/1.0\r\n\r\n", "HTTP/1.1 200", NULL);
    expect_raw(ts.srv, "GET /pool HTTP/1.1\r\n\r\n", "HTTP/1.1 400", "\"invalid_request\"");
    expect_raw(ts.srv, "GET /health HTTP/1.1\r\n\r\n", "HTTP/1.1 200", NULL);
    expect_raw(ts.srv, "GET /pool HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.test\r\n\r\n", "HTTP/1.1 400",
               "Host is given 2 times");
}

/* An absolute-form target (a client sent here as to a proxy) reaches the
 * route its path names, and its host, not Host, passes the host rule. */
static void test_absolute_form(void **state) {
    (void)state;
    expect_raw(ts.srv, "GET http://127.0.0.1/pool HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "HTTP/1.1 200", "\"slots\"");
    expect_raw(ts.srv, "GET HTTP://localhost:9/adapters/nope HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "HTTP/1.1 404",
               "\"adapter_not_found\"");
    expect_raw(ts.srv, "GET http://127.0.0.1/pool HTTP/1.1\r\nHost: evil.test\r\n\r\n", "HTTP/1.1 200", NULL);
    expect_raw(ts.srv, "GET http://evil.test/pool HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "HTTP/1.1 403",
               "\"forbidden_host\"");
    expect_raw(ts.srv, "GET http:///pool HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "HTTP/1.1 403", "\"forbidden_host\"");
    expect_raw(ts.srv, "GET http://evil.test/health HTTP/1.1\r\n\r\n", "HTTP/1.1 200", NULL);
    /* HTTP/1.1 still needs Host beside it; HTTP/1.0 may omit it. */
    expect_raw(ts.srv, "GET http://127.0.0.1/pool HTTP/1.1\r\n\r\n", "HTTP/1.1 400", "an HTTP/1.1 request without Host");
    expect_raw(ts.srv, "GET http://127.0.0.1/pool HTTP/1.0\r\n\r\n", "HTTP/1.1 200", NULL);
    expect_raw(ts.srv, "GET http://evil.test/pool HTTP/1.0\r\n\r\n", "HTTP/1.1 403", "\"forbidden_host\"");
    /* Read as sent, before decoding: an escaped "/" served /pool for the
     * host "127.0.0.1%2Fpool", and a target escaped whole was taken for
     * absolute-form. */
    const char *unreadable[] = {"http://127.0.0.1%2Fpool", "http://127.0.0.%31/pool", "http://a@127.0.0.1/pool",
                                "http://127.0.0.1%2F@evil.com/pool"};
    for (size_t i = 0; i < sizeof unreadable / sizeof *unreadable; i++) {
        char req[256];
        snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", unreadable[i]);
        expect_raw(ts.srv, req, "HTTP/1.1 400", "the absolute-form request target's host");
    }
    expect_raw(ts.srv, "GET http%3A%2F%2F127.0.0.1%2Fpool HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "HTTP/1.1 404",
               "\"not_found\"");
    expect_raw(ts.srv, "GET http://127.0.0.1/adapters/%61bc HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "HTTP/1.1 404",
               "'abc'"); /* the path is decoded as an origin-form one is */
}

/* --allowed-hosts names more; * takes any. */
static void test_allowed_hosts(void **state) {
    (void)state;
    const char *listed_args[] = {"--demo", "--hidden", "8", "--intermediate", "4", "--layers", "1",
                                 "--allowed-hosts", "lorasink.internal,LB.example", NULL};
    ls_test_server *s = ls_test_server_start(listed_args);
    assert_non_null(s);
    const char *a[] = {"Host: lorasink.internal:8080", NULL}, *b[] = {"Host: lb.example", NULL},
               *c[] = {"Host: other.internal", NULL}, *d[] = {"Host: [::1]:1", NULL};
    expect_status(s, "GET", "/pool", a, 200, NULL);
    expect_status(s, "GET", "/pool", b, 200, NULL);
    expect_status(s, "GET", "/pool", c, 403, "forbidden_host");
    expect_status(s, "GET", "/pool", d, 200, NULL);
    assert_int_equal(ls_test_server_stop(s), 0);
    const char *any_args[] = {"--demo", "--hidden", "8", "--intermediate", "4", "--layers", "1",
                              "--allowed-hosts", "*", NULL};
    s = ls_test_server_start(any_args);
    assert_non_null(s);
    expect_status(s, "GET", "/pool", c, 200, NULL);
    assert_int_equal(ls_test_server_stop(s), 0);
    /* A list that is not one is a setting error, not a server that
     * refuses everything. */
    char out[4096];
    const char *bad[] = {"--allowed-hosts", "a.example:8080", NULL};
    assert_int_equal(ls_test_run_binary(bad, out, sizeof out), 2);
    assert_non_null(strstr(out, "--allowed-hosts"));
    const char *bad_origin[] = {"--allowed-origins", "ui.example.com", NULL};
    assert_int_equal(ls_test_run_binary(bad_origin, out, sizeof out), 2);
    assert_non_null(strstr(out, "--allowed-origins"));
}

/* Origin: a page's requests carry it (a no-cors text/plain POST too);
 * one of another origin is refused, the server's own and listed ones
 * are not; curl sends none. Sec-Fetch-Site: cross-site without Origin
 * (an image, a script) is refused on data routes. */
static void test_origin(void **state) {
    (void)state;
    json_t *up = tiny_adapter_inline(&ts, "forged", NULL);
    char *body = json_dumps(up, JSON_COMPACT);
    json_decref(up);
    const char *foreign[] = {"Origin: http://127.0.0.1:1", NULL}, *null_origin[] = {"Origin: null", NULL},
               *named[] = {"Origin: http://evil.test", NULL};
    const char *types[] = {"text/plain", "application/x-www-form-urlencoded", "application/json"};
    for (size_t i = 0; i < 3; i++) {
        ls_test_response r = expect(ts.srv, "POST", "/adapters", types[i], body, foreign, 403, "forbidden_origin");
        ls_test_response_free(&r);
    }
    ls_test_response r = expect(ts.srv, "POST", "/adapters", "text/plain", body, null_origin, 403, "forbidden_origin");
    ls_test_response_free(&r);
    r = expect(ts.srv, "POST", "/adapters", "text/plain", body, named, 403, "forbidden_origin");
    ls_test_response_free(&r);
    expect_status(ts.srv, "DELETE", "/adapters/forged", foreign, 403, "forbidden_origin");
    expect_status(ts.srv, "GET", "/adapters/forged", NULL, 404, "adapter_not_found");
    /* The server's own origin (the page at /dashboard), any scheme. */
    char own[128], own_tls[128];
    snprintf(own, sizeof own, "Origin: http://127.0.0.1:%d", ls_test_server_port(ts.srv));
    snprintf(own_tls, sizeof own_tls, "Origin: https://127.0.0.1:%d", ls_test_server_port(ts.srv));
    const char *mine[] = {own, NULL}, *mine_tls[] = {own_tls, NULL};
    r = expect(ts.srv, "POST", "/adapters", "text/plain", body, mine, 201, NULL);
    ls_test_response_free(&r);
    expect_status(ts.srv, "GET", "/pool", mine_tls, 200, NULL);
    expect_status(ts.srv, "DELETE", "/adapters/forged", mine, 200, NULL);
    /* Sec-Fetch-Site. */
    const char *cross[] = {"Sec-Fetch-Site: cross-site", NULL}, *same[] = {"Sec-Fetch-Site: same-site", NULL};
    expect_status(ts.srv, "GET", "/pool", cross, 403, "forbidden_origin");
    expect_status(ts.srv, "GET", "/metrics", cross, 403, "forbidden_origin");
    expect_status(ts.srv, "GET", "/pool", same, 200, NULL);
    expect_status(ts.srv, "GET", "/health", cross, 200, NULL);
    expect_status(ts.srv, "GET", "/dashboard", cross, 200, NULL);
    free(body);

    /* --allowed-origins lets a UI elsewhere in. */
    const char *args[] = {"--demo", "--hidden", "8", "--intermediate", "4", "--layers", "1",
                          "--allowed-origins", "https://ui.example:8443,http://127.0.0.1:1", NULL};
    ls_test_server *s = ls_test_server_start(args);
    assert_non_null(s);
    const char *ui[] = {"Origin: https://ui.example:8443", "Sec-Fetch-Site: cross-site", NULL},
               *ui_port[] = {"Origin: https://ui.example", NULL};
    expect_status(s, "GET", "/pool", ui, 200, NULL);
    expect_status(s, "GET", "/pool", foreign, 200, NULL);
    expect_status(s, "GET", "/pool", ui_port, 403, "forbidden_origin");
    expect_status(s, "GET", "/pool", cross, 403, "forbidden_origin");
    assert_int_equal(ls_test_server_stop(s), 0);
}

/* X-Lorasink-Adapter twice: the server read the first, HAProxy's hdr()
 * hashes the last. Refused, as a list in one header is. */
static void test_adapter_header_once(void **state) {
    (void)state;
    char req[1024];
    const char *body = "{\"x\": [[1, 2, 3, 4]]}";
    snprintf(req, sizeof req,
             "POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             "X-Lorasink-Adapter: a1\r\nX-Lorasink-Adapter: a2\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(body), body);
    expect_raw(ts.srv, req, "HTTP/1.1 400", "the header X-Lorasink-Adapter is given 2 times");
    const char *list[] = {"X-Lorasink-Adapter: a1, a2", NULL};
    ls_test_response r = expect(ts.srv, "POST", "/forward", NULL, body, list, 400, "invalid_request");
    assert_non_null(strstr(r.body, "X-Lorasink-Adapter holds a list"));
    ls_test_response_free(&r);
}

/* Body framing a proxy in front could read otherwise. */
static void test_framing(void **state) {
    (void)state;
    expect_raw(ts.srv,
               "POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n"
               "Content-Type: application/json\r\n\r\n0\r\n\r\n",
               "HTTP/1.1 400", "Transfer-Encoding and Content-Length together");
    expect_raw(ts.srv,
               "POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: gzip\r\n"
               "Content-Type: application/json\r\n\r\n{}",
               "HTTP/1.1 400", "Transfer-Encoding \\\"gzip\\\" is not supported");
    expect_raw(ts.srv,
               "POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n"
               "Content-Type: application/json\r\n\r\n{}",
               "HTTP/1.1 400", "Content-Length is given 2 times");
    /* A name libmicrohttpd keeps with a blank before its colon is
     * another header to it ("Transfer-Encoding "), and the body would be
     * read by Content-Length where a proxy took it as chunked; a line
     * folded onto the one before (obs-fold) is appended to that one's
     * name. RFC 9112 makes both a 400. */
    expect_raw(ts.srv,
               "POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding : chunked\r\nContent-Length: 5\r\n"
               "Content-Type: application/json\r\n\r\n0\r\n\r\n",
               "HTTP/1.1 400", "the header name \\\"Transfer-Encoding \\\" is not a token");
    expect_raw(ts.srv,
               "POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Foo: a\r\n Transfer-Encoding: chunked\r\n"
               "Content-Length: 5\r\nContent-Type: application/json\r\n\r\n0\r\n\r\n",
               "HTTP/1.1 400", "is not a token");
    expect_raw(ts.srv, "GET /pool HTTP/1.1\r\nHost: 127.0.0.1\r\nHost\t: evil.test\r\n\r\n", "HTTP/1.1 400",
               "is not a token");
    /* A fold onto the adapter header made it X-Lorasink-Adapterb to the
     * server, which then served the base model; a typo did the same. */
    expect_raw(ts.srv,
               "POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Lorasink-Adapter: a1\r\n b\r\nContent-Length: 20\r\n"
               "Content-Type: application/json\r\n\r\n{\"x\": [[1, 2, 3, 4]]}",
               "HTTP/1.1 400", "the header X-Lorasink-Adapterb is not one this server reads");
    expect_raw(ts.srv,
               "POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Lorasink-Adaptor: a1\r\nContent-Length: 20\r\n"
               "Content-Type: application/json\r\n\r\n{\"x\": [[1, 2, 3, 4]]}",
               "HTTP/1.1 400", "X-Lorasink-Adaptor is not one this server reads");
    /* HTTP/1.0 has no chunked bodies: a proxy may frame this one otherwise. */
    expect_raw(ts.srv,
               "POST /adapters/validate HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n"
               "\r\n2\r\n{}\r\n0\r\n\r\n",
               "HTTP/1.1 400", "Transfer-Encoding on an HTTP/1.0 request");
    /* Chunked alone still reads. */
    expect_raw(ts.srv,
               "POST /adapters/validate HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
               "Content-Type: application/json\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
               "HTTP/1.1 400", "\"invalid_request\"");
}

/* Integers in a query are digits (and a '-'): " 1", "+1", "0x1" are not
 * the layer 1 or the rank 2 they used to be read as. */
static void test_query_integers(void **state) {
    (void)state;
    static const uint8_t st[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    const char *layers[] = {"%201", "+0", "0x0", "0%20", "%090", "0.0", ""};
    for (size_t i = 0; i < sizeof layers / sizeof *layers; i++) {
        char path[64];
        snprintf(path, sizeof path, "/forward?layer=%s", layers[i]);
        ls_test_response r;
        assert_int_equal(ls_test_http(ts.srv, "POST", path, "application/octet-stream", st, sizeof st, NULL, &r), 0);
        if (r.status != 400 || !strstr(r.body, "is not an integer")) fprintf(stderr, "%s -> %s\n", path, r.body);
        assert_int_equal(r.status, 400);
        assert_non_null(strstr(r.body, "is not an integer"));
        ls_test_response_free(&r);
    }
    /* layer=0 passes the layer: the body's error comes next. */
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "POST", "/forward?layer=0", "application/octet-stream", st, sizeof st, NULL,
                                  &r),
                     0);
    assert_null(strstr(r.body, "layer"));
    ls_test_response_free(&r);
    /* A raw upload's r: " 2" is no rank. */
    size_t len;
    uint8_t *body = tiny_adapter_safetensors(&ts, "4", &len);
    assert_int_equal(ls_test_http(ts.srv, "POST", "/adapters/validate?name=a&r=2", "application/octet-stream", body,
                                  len, NULL, &r),
                     0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    const char *ranks[] = {"%202", "+2", "2%20"};
    for (size_t i = 0; i < 3; i++) {
        char path[64];
        snprintf(path, sizeof path, "/adapters/validate?name=a&r=%s", ranks[i]);
        assert_int_equal(ls_test_http(ts.srv, "POST", path, "application/octet-stream", body, len, NULL, &r), 0);
        if (r.status != 422) fprintf(stderr, "%s -> %s\n", path, r.body);
        assert_int_equal(r.status, 422);
        assert_non_null(strstr(r.body, "is not a positive integer"));
        ls_test_response_free(&r);
    }
    free(body);
}

/* ~500 query parameters: libmicrohttpd logged a 431 and closed the
 * connection without a byte; now a JSON 414 comes back. */
static void test_query_cap(void **state) {
    (void)state;
    char path[4096] = "/health?";
    for (int i = 0; i < 500; i++) {
        size_t l = strlen(path);
        snprintf(path + l, sizeof path - l, "%sa%d=1", i ? "&" : "", i);
    }
    char req[12000];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
    expect_raw(ts.srv, req, "HTTP/1.1 414", "\"uri_too_long\"");
    /* '&' alone makes a parameter for the library too. */
    char amps[600] = "/pool?";
    memset(amps + 6, '&', 500);
    amps[506] = '\0';
    expect_status(ts.srv, "GET", amps, NULL, 414, "uri_too_long");
    /* Up to the cap, as before: a GET ignores them. */
    char some[1024] = "/health?";
    for (int i = 0; i < 64; i++) {
        size_t l = strlen(some);
        snprintf(some + l, sizeof some - l, "%sa%d=1", i ? "&" : "", i);
    }
    expect_status(ts.srv, "GET", some, NULL, 200, NULL);
    /* A target longer than 8192 bytes (raw: the test client's URLs are
     * shorter). */
    snprintf(req, sizeof req, "GET /pool?x=%09000d HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 1);
    expect_raw(ts.srv, req, "HTTP/1.1 414", "\"uri_too_long\"");
    expect_status(ts.srv, "GET", "/health", NULL, 200, NULL);
}

/* Every response says: not to be framed, sniffed, cached or referred;
 * the page's own CSP is a header now, not only a <meta>. */
static void test_security_headers(void **state) {
    (void)state;
    const char *paths[][2] = {{"/dashboard", "200"}, {"/health", "200"}, {"/pool", "200"}, {"/nowhere", "404"}};
    for (size_t i = 0; i < 4; i++) {
        ls_test_response r = expect(ts.srv, "GET", paths[i][0], NULL, NULL, NULL, atol(paths[i][1]), NULL);
        char v[512];
        assert_string_equal(ls_test_header(r.headers, "X-Frame-Options", v, sizeof v), "DENY");
        assert_string_equal(ls_test_header(r.headers, "X-Content-Type-Options", v, sizeof v), "nosniff");
        assert_string_equal(ls_test_header(r.headers, "Cache-Control", v, sizeof v), "no-store");
        assert_string_equal(ls_test_header(r.headers, "Referrer-Policy", v, sizeof v), "no-referrer");
        ls_test_header(r.headers, "Content-Security-Policy", v, sizeof v);
        assert_non_null(strstr(v, "frame-ancestors 'none'"));
        if (!strcmp(paths[i][0], "/dashboard")) assert_non_null(strstr(v, "default-src 'self'"));
        else assert_non_null(strstr(v, "default-src 'none'"));
        ls_test_response_free(&r);
    }
    ls_test_response r = expect(ts.srv, "HEAD", "/dashboard", NULL, NULL, NULL, 200, NULL);
    char v[64];
    assert_string_equal(ls_test_header(r.headers, "X-Frame-Options", v, sizeof v), "DENY");
    ls_test_response_free(&r);
}

/* A method a client chose reached the log raw ("GET\x1b[2J": an escape
 * sequence on the operator's terminal); every field is escaped now. */
static void test_log_fields_escaped(void **state) {
    (void)state;
    expect_raw(ts.srv, "GET\x1b[2J /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: esc-probe\r\n\r\n",
               "HTTP/1.1 405", NULL);
    expect_raw(ts.srv, "G\xc3\xa9T\x7f /a\x1b%1b HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: esc%probe\r\n\r\n",
               "HTTP/1.1 ", NULL);
    assert_true(ls_test_server_wait_output(ts.srv, " access esc-probe GET%1B[2J /health 405 ") > 0);
    assert_true(ls_test_server_wait_output(ts.srv, " access esc%25probe G%C3%A9T%7F /a%1B%1B ") > 0);
    char *out = ls_test_server_output(ts.srv);
    assert_null(strchr(out, '\x1b'));
    assert_null(strchr(out, '\x7f'));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host),
        cmocka_unit_test(test_allowed_hosts),
        cmocka_unit_test(test_absolute_form),
        cmocka_unit_test(test_origin),
        cmocka_unit_test(test_adapter_header_once),
        cmocka_unit_test(test_framing),
        cmocka_unit_test(test_query_integers),
        cmocka_unit_test(test_query_cap),
        cmocka_unit_test(test_security_headers),
        cmocka_unit_test(test_log_fields_escaped),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
