/* The head rules of server/http_head.c without a socket: which Host
 * values are addresses or allowed names, which Origin is the server's
 * own, and what a head must not carry twice or together.
 * tests/integration/test_http_head.c has the same rules end to end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "server/http_head.h"

/* Which --host binds are said to be reachable from other machines
 * when no key is set (the start-up warning). */
static void test_bind_loopback(void **state) {
    (void)state;
    const char *local[] = {"127.0.0.1", "127.8.9.10", "::1", "localhost", "LocalHost"};
    for (size_t i = 0; i < sizeof local / sizeof *local; i++)
        if (!ls_http_bind_loopback(local[i])) fail_msg("%s taken as reachable", local[i]);
    const char *reachable[] = {"0.0.0.0", "::", "10.0.0.7", "128.0.0.1", "fe80::1", "::ffff:127.0.0.1", "example.com", ""};
    for (size_t i = 0; i < sizeof reachable / sizeof *reachable; i++)
        if (ls_http_bind_loopback(reachable[i])) fail_msg("%s taken as loopback", reachable[i]);
}

static void test_host_values(void **state) {
    (void)state;
    const char *ok[] = {"127.0.0.1", "127.0.0.1:8080", "10.0.0.7:1", "[::1]", "[::1]:65535", "[fe80::1]:80",
                        "localhost", "LOCALHOST:8080", "0.0.0.0"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        if (!ls_http_host_allowed(ok[i], "")) fail_msg("%s refused", ok[i]);
    }
    const char *bad[] = {"",          "evil.test",  "evil.test:80",   "::1",         "[::1",        "[::1]x",
                         "[1.2.3.4]", "127.0.0.1:", "127.0.0.1:x",    "1.2.3.4:123456", "127.1",    "0x7f.0.0.1",
                         "localhost.", "a.localhost", "127.0.0.1.nip.io", "[evil]:80"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (ls_http_host_allowed(bad[i], "")) fail_msg("%s allowed", bad[i]);
    }
    assert_true(ls_http_host_allowed("lb.example:8000", "a.example, LB.example"));
    assert_true(ls_http_host_allowed("Lb.Example", "a.example,lb.example"));
    assert_false(ls_http_host_allowed("lb.example.evil", "lb.example"));
    assert_false(ls_http_host_allowed("example", "lb.example"));
    assert_true(ls_http_host_allowed("anything.at.all:1", "*"));
    assert_false(ls_http_host_allowed("[::1", "*")); /* still a Host value */
}

static ls_status check(const ls_http_head *h, const char *hosts, const char *origins, bool open, const char *want) {
    const ls_http_head_policy p = {hosts, origins};
    ls_error err;
    ls_error_init(&err);
    ls_status st = ls_http_head_check(h, &p, open, &err);
    if (want && !strstr(err.message, want)) fail_msg("message %s, wanted %s", err.message, want);
    ls_error_free(&err);
    return st;
}

static void test_origin(void **state) {
    (void)state;
    ls_http_head h = {.host = "127.0.0.1:8080", .n_host = 1, .origin = "http://127.0.0.1:8080", .n_origin = 1};
    assert_int_equal(check(&h, "", "", false, NULL), LS_OK);
    h.origin = "https://127.0.0.1:8080"; /* a TLS proxy in front */
    assert_int_equal(check(&h, "", "", false, NULL), LS_OK);
    const char *foreign[] = {"http://127.0.0.1:8081", "http://127.0.0.1", "null", "http://evil.test",
                             "http://127.0.0.1:8080/path", "127.0.0.1:8080"};
    for (size_t i = 0; i < sizeof foreign / sizeof *foreign; i++) {
        h.origin = foreign[i];
        if (check(&h, "", "", false, NULL) != LS_FORBIDDEN_ORIGIN) fail_msg("%s allowed", foreign[i]);
        /* open routes too: a page gains nothing from them, and may not POST. */
        assert_int_equal(check(&h, "", "", true, NULL), LS_FORBIDDEN_ORIGIN);
    }
    h.origin = "http://evil.test";
    assert_int_equal(check(&h, "", "https://ui.example,http://evil.test", false, NULL), LS_OK);
    assert_int_equal(check(&h, "", "*", false, NULL), LS_OK);
    h.n_origin = 2;
    assert_int_equal(check(&h, "", "*", false, "Origin is given 2 times"), LS_INVALID_REQUEST);
}

static void test_sec_fetch_site(void **state) {
    (void)state;
    ls_http_head h = {.host = "127.0.0.1", .n_host = 1, .sec_fetch_site = "cross-site"};
    assert_int_equal(check(&h, "", "", false, "Sec-Fetch-Site"), LS_FORBIDDEN_ORIGIN);
    assert_int_equal(check(&h, "", "", true, NULL), LS_OK);
    assert_int_equal(check(&h, "", "*", false, NULL), LS_OK);
    h.sec_fetch_site = "same-site";
    assert_int_equal(check(&h, "", "", false, NULL), LS_OK);
    h.sec_fetch_site = "none"; /* typed into the address bar */
    assert_int_equal(check(&h, "", "", false, NULL), LS_OK);
}

static void test_host_rule(void **state) {
    (void)state;
    ls_http_head h = {.host = "evil.test:8080", .n_host = 1};
    assert_int_equal(check(&h, "", "", false, "evil.test:8080"), LS_FORBIDDEN_HOST);
    assert_int_equal(check(&h, "", "", true, NULL), LS_OK);
    assert_int_equal(check(&h, "evil.test", "", false, NULL), LS_OK);
    ls_http_head none = {0};
    assert_int_equal(check(&none, "", "", false, "without Host"), LS_INVALID_REQUEST);
    assert_int_equal(check(&none, "", "", true, NULL), LS_OK);
    none.http10 = true;
    assert_int_equal(check(&none, "", "", false, NULL), LS_OK);
}

static void test_framing(void **state) {
    (void)state;
    ls_http_head h = {.host = "127.0.0.1", .n_host = 1, .transfer_encoding = "chunked", .n_transfer_encoding = 1,
                      .n_content_length = 1};
    assert_int_equal(check(&h, "*", "*", true, "Transfer-Encoding and Content-Length"), LS_INVALID_REQUEST);
    h.n_content_length = 0;
    assert_int_equal(check(&h, "", "", false, NULL), LS_OK);
    h.transfer_encoding = "CHUNKED";
    assert_int_equal(check(&h, "", "", false, NULL), LS_OK);
    h.transfer_encoding = "gzip, chunked";
    assert_int_equal(check(&h, "", "", false, "is not supported"), LS_INVALID_REQUEST);
    h.transfer_encoding = NULL, h.n_transfer_encoding = 0, h.n_content_length = 2;
    assert_int_equal(check(&h, "", "", false, "Content-Length is given 2 times"), LS_INVALID_REQUEST);
    h.n_content_length = 1, h.n_host = 2;
    assert_int_equal(check(&h, "", "", true, "Host is given 2 times"), LS_INVALID_REQUEST);
    h.n_host = 1, h.adapter = "a1", h.n_adapter = 2;
    assert_int_equal(check(&h, "", "", false, "X-Lorasink-Adapter is given 2 times"), LS_INVALID_REQUEST);
    h.n_adapter = 1;
    assert_int_equal(check(&h, "", "", false, NULL), LS_OK);
    h.adapter = "a1,a2";
    assert_int_equal(check(&h, "", "", false, "holds a list"), LS_INVALID_REQUEST);
}

/* Header names: tokens only (libmicrohttpd keeps "Name :" as "Name " and
 * appends a folded line to the name before it), and no X-Lorasink-*
 * header the server does not read (a folded adapter header, a typo). */
static void test_header_names(void **state) {
    (void)state;
    const char *ok[] = {"Host", "X-Lorasink-Adapter", "x-lorasink-adapter", "X-Request-Id", "a!#$%&'*+-.^_`|~9"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        ls_http_head h = {.host = "127.0.0.1", .n_host = 1};
        ls_http_head_name(&h, ok[i]);
        if (check(&h, "", "", false, NULL) != LS_OK) fail_msg("%s refused", ok[i]);
    }
    const char *bad[] = {"Transfer-Encoding ", "Host\t", "X-FooTransfer-Encoding: chunked", "", "a\"b", "a(b)", "\x7f"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ls_http_head h = {.host = "127.0.0.1", .n_host = 1};
        ls_http_head_name(&h, "Host");
        ls_http_head_name(&h, bad[i]);
        if (check(&h, "", "", true, "is not a token") != LS_INVALID_REQUEST) fail_msg("\"%s\" allowed", bad[i]);
    }
    const char *own[] = {"X-Lorasink-Adapterb", "X-Lorasink-Adaptor", "x-lorasink-version"};
    for (size_t i = 0; i < sizeof own / sizeof *own; i++) {
        ls_http_head h = {.host = "127.0.0.1", .n_host = 1};
        ls_http_head_name(&h, own[i]);
        if (check(&h, "", "", false, "is not one this server reads") != LS_INVALID_REQUEST)
            fail_msg("%s allowed", own[i]);
    }
    ls_http_head h10 = {.http10 = true, .transfer_encoding = "chunked", .n_transfer_encoding = 1};
    assert_int_equal(check(&h10, "", "", true, "Transfer-Encoding on an HTTP/1.0 request"), LS_INVALID_REQUEST);
}

static void test_response_headers(void **state) {
    (void)state;
    assert_non_null(strstr(ls_http_csp(true), "frame-ancestors 'none'"));
    assert_non_null(strstr(ls_http_csp(false), "frame-ancestors 'none'"));
    assert_non_null(strstr(ls_http_csp(false), "default-src 'none'"));
    bool nosniff = false, frames = false;
    for (size_t i = 0; i < ls_http_hardening_count; i++) {
        nosniff |= !strcmp(ls_http_hardening[i][0], "X-Content-Type-Options");
        frames |= !strcmp(ls_http_hardening[i][0], "X-Frame-Options");
    }
    assert_true(nosniff && frames);
}

/* Absolute-form targets (what a client configured with this server as
 * its proxy sends) are read as sent: the host ends at the first "/", "?"
 * or "#" of the raw target, and one that a decoding could move (a percent
 * escape), userinfo or a host too long for the buffer are refused. */
static void test_target_read(void **state) {
    (void)state;
    const char *cases[][3] = {
        {"http://127.0.0.1:8080/forward", "127.0.0.1:8080", "/forward"},
        {"HTTPS://lb.example/adapters/a?x=1", "lb.example", "/adapters/a?x=1"},
        {"http://lb.example", "lb.example", ""},
        {"http://lb.example?x=1", "lb.example", "?x=1"},
        {"http:///pool", "", "/pool"},
        {"http://[::1]:9/pool", "[::1]:9", "/pool"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ls_http_target t;
        const char *path = ls_http_target_read(cases[i][0], &t);
        if (!t.absolute || t.why || !path || strcmp(t.host, cases[i][1]) || strcmp(path, cases[i][2]))
            fail_msg("%s: host %s path %s why %s", cases[i][0], t.host, path ? path : "-", t.why ? t.why : "-");
    }
    const char *origin_form[] = {"/forward", "*", "httpx://a/b", "http%3A%2F%2Fevil.com%2Fpool", "/http://x/"};
    for (size_t i = 0; i < sizeof origin_form / sizeof *origin_form; i++) {
        ls_http_target t;
        const char *path = ls_http_target_read(origin_form[i], &t);
        if (t.absolute || path) fail_msg("%s read as absolute-form", origin_form[i]);
    }
    const char *bad[][2] = {
        {"http://127.0.0.1%2Fpool", "percent escape"},
        {"http://127.0.0.%31/pool", "percent escape"},
        {"http://a@127.0.0.1/pool", "userinfo"},
        {"http://127.0.0.1%2F@evil.com/pool", "userinfo"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ls_http_target t;
        ls_http_target_read(bad[i][0], &t);
        if (!t.absolute || !t.why || !strstr(t.why, bad[i][1])) fail_msg("%s: why %s", bad[i][0], t.why ? t.why : "-");
    }
    char longest[400] = "http://";
    memset(longest + 7, 'a', 300);
    strcpy(longest + 307, "/pool");
    ls_http_target t;
    ls_http_target_read(longest, &t);
    assert_non_null(t.why);
    assert_non_null(strstr(t.why, "longer than 255 bytes"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bind_loopback),
        cmocka_unit_test(test_host_values), cmocka_unit_test(test_origin),  cmocka_unit_test(test_sec_fetch_site),
        cmocka_unit_test(test_host_rule),   cmocka_unit_test(test_framing), cmocka_unit_test(test_header_names),
        cmocka_unit_test(test_response_headers), cmocka_unit_test(test_target_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
