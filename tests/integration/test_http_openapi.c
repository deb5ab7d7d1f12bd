/* GET /openapi.json against the real binary: the same bytes as
 * docs/openapi.json (the binary embeds the file at build time), behind
 * --api-key like every route but /health and /ready, and every path and
 * method the document lists is served by a route (no 404 not_found, no
 * 405), so the document cannot name a route the server lacks. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "tests/util/server_driver.h"
#include "tests/util/testutil.h"

#ifndef LS_SOURCE_DIR
#error "LS_SOURCE_DIR must name the source tree (tests/CMakeLists.txt sets it)"
#endif

#define KEY "openapi-test-key"

static ls_test_server *srv;
static const char *const auth[] = {"Authorization: Bearer " KEY, NULL};

static int setup(void **state) {
    (void)state;
    const char *args[] = {"--demo", "--hidden", "64", "--intermediate", "32", "--api-key", KEY, NULL};
    srv = ls_test_server_start(args);
    return srv ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    assert_int_equal(ls_test_server_stop(srv), 0);
    return 0;
}

static void test_same_bytes_as_the_file(void **state) {
    (void)state;
    size_t len;
    char *file = ls_test_read_file(LS_SOURCE_DIR "/docs/openapi.json", &len);
    ls_test_response r;
    assert_int_equal(ls_test_http(srv, "GET", "/openapi.json", NULL, NULL, 0, auth, &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(r.content_type);
    assert_true(!strncmp(r.content_type, "application/json", 16));
    /* A build that embedded an older file differs here: rebuild. */
    assert_int_equal(r.len, len);
    assert_memory_equal(r.body, file, len);
    json_t *doc = ls_test_response_json(&r);
    assert_non_null(doc);
    assert_string_equal(json_string_value(json_object_get(doc, "openapi")), "3.1.0");
    json_decref(doc);
    ls_test_response_free(&r);
    free(file);
}

static void test_needs_the_key(void **state) {
    (void)state;
    ls_test_response r;
    assert_int_equal(ls_test_http(srv, "GET", "/openapi.json", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 401);
    json_t *j = ls_test_response_json(&r);
    assert_string_equal(ls_test_error_code(j), "unauthorized");
    json_decref(j);
    ls_test_response_free(&r);
    /* HEAD is served by the GET route, without a body. */
    assert_int_equal(ls_test_http(srv, "HEAD", "/openapi.json", NULL, NULL, 0, auth, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
}

/* Every operation of the document reaches a handler: whatever it answers
 * to an empty request, it is not the router's 404 not_found or 405. */
static void test_every_documented_route_exists(void **state) {
    (void)state;
    size_t len;
    char *file = ls_test_read_file(LS_SOURCE_DIR "/docs/openapi.json", &len);
    json_t *doc = json_loads(file, 0, NULL);
    assert_non_null(doc);
    const char *path;
    json_t *item;
    int checked = 0;
    json_object_foreach(json_object_get(doc, "paths"), path, item) {
        char concrete[256];
        const char *brace = strchr(path, '{');
        if (brace) snprintf(concrete, sizeof concrete, "%.*sno-such-adapter", (int)(brace - path), path);
        else snprintf(concrete, sizeof concrete, "%s", path);
        const char *method;
        json_t *op;
        json_object_foreach(item, method, op) {
            char upper[16];
            size_t i = 0;
            for (; method[i] && i < sizeof upper - 1; i++) upper[i] = (char)(method[i] & ~0x20);
            upper[i] = '\0';
            const bool post = !strcmp(upper, "POST");
            ls_test_response r;
            assert_int_equal(ls_test_http(srv, upper, concrete, NULL, post ? "{}" : NULL, post ? 2 : 0, auth, &r), 0);
            json_t *j = r.content_type && !strncmp(r.content_type, "application/json", 16) ? ls_test_response_json(&r)
                                                                                           : NULL;
            const char *code = j ? ls_test_error_code(j) : "";
            if (!strcmp(code, "not_found") || r.status == 405)
                fail_msg("%s %s is documented but the server answers %ld %s", upper, concrete, r.status, code);
            json_decref(j);
            ls_test_response_free(&r);
            checked++;
        }
    }
    assert_true(checked >= 10);
    json_decref(doc);
    free(file);
}

int main(void) {
    curl_global_init(CURL_GLOBAL_ALL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bytes_as_the_file),
        cmocka_unit_test(test_needs_the_key),
        cmocka_unit_test(test_every_documented_route_exists),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    curl_global_cleanup();
    return rc;
}
