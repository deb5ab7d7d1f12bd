/* server/routes: which handler serves a method and path, the {name}
 * segment of /adapters/{name}, HEAD served by GET, unknown paths (404)
 * and known paths under other methods (405 with the Allow list). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "server/handlers.h"
#include "server/routes.h"

/* One lookup with buffers the size http.c uses. */
typedef struct {
    const ls_route *route;
    char param[256];
    char allow[64];
} rt_hit;

static rt_hit rt_find(const char *method, const char *path) {
    rt_hit h;
    memset(&h, 0x5a, sizeof h); /* the finder must write both strings */
    h.route = ls_route_find(method, path, h.param, sizeof h.param, h.allow, sizeof h.allow);
    return h;
}

/* Asserts that method path is served by fn with the given {name} and
 * Allow list of its other methods. */
static void rt_expect(const char *method, const char *path, ls_handler_fn fn, const char *param, const char *allow) {
    rt_hit h = rt_find(method, path);
    if (!h.route) fail_msg("%s %s: no route (allow '%s')", method, path, h.allow);
    if (h.route->fn != fn)
        fail_msg("%s %s: served by the route of %s %s", method, path, h.route->method, h.route->pattern);
    assert_string_equal(h.param, param);
    assert_string_equal(h.allow, allow);
}

/* Asserts that no route serves method path, and what the Allow list is
 * ("" = 404, else 405). */
static void rt_expect_none(const char *method, const char *path, const char *allow) {
    rt_hit h = rt_find(method, path);
    if (h.route) fail_msg("%s %s: unexpectedly served by %s %s", method, path, h.route->method, h.route->pattern);
    assert_string_equal(h.allow, allow);
}

static void test_exact_paths(void **state) {
    (void)state;
    rt_expect("GET", "/health", ls_handle_health, "", "");
    rt_expect("GET", "/ready", ls_handle_ready, "", "");
    rt_expect("GET", "/metrics", ls_handle_metrics, "", "");
    rt_expect("GET", "/pool", ls_handle_pool, "", "");
    rt_expect("POST", "/forward", ls_handle_forward, "", "");
    rt_expect("POST", "/adapters", ls_handle_adapter_load, "", "GET, HEAD");
    rt_expect("GET", "/adapters", ls_handle_adapter_list, "", "POST");
    rt_expect("POST", "/adapters/validate", ls_handle_adapter_validate, "", "");
}

/* What each route asks of the request (the key: all but the probes and
 * the page; a body: the POSTs), whether a connection past the caps may
 * ask it, and where its steps run: reads on the HTTP thread, what may
 * wait on the backend on its workers, a validation on a disk worker. */
static void test_route_flags(void **state) {
    (void)state;
    const struct {
        const char *method, *path;
        bool open, has_body, probe;
        ls_route_steps steps;
        ls_run_on on;
    } want[] = {
        {"GET", "/health", true, false, true, LS_STEPS_HANDLER, LS_RUN_HTTP},
        {"GET", "/ready", true, false, true, LS_STEPS_HANDLER, LS_RUN_HTTP},
        {"GET", "/metrics", false, false, false, LS_STEPS_HANDLER, LS_RUN_HTTP},
        {"GET", "/pool", false, false, false, LS_STEPS_HANDLER, LS_RUN_HTTP},
        {"GET", "/dashboard", true, false, false, LS_STEPS_HANDLER, LS_RUN_HTTP},
        {"POST", "/forward", false, true, false, LS_STEPS_FORWARD, LS_RUN_BACKEND},
        {"POST", "/adapters", false, true, false, LS_STEPS_LOAD, LS_RUN_BACKEND},
        {"GET", "/adapters", false, false, false, LS_STEPS_HANDLER, LS_RUN_HTTP},
        {"POST", "/adapters/validate", false, true, false, LS_STEPS_HANDLER, LS_RUN_DISK},
        {"GET", "/adapters/a", false, false, false, LS_STEPS_HANDLER, LS_RUN_HTTP},
        {"DELETE", "/adapters/a", false, false, false, LS_STEPS_HANDLER, LS_RUN_BACKEND},
        {"POST", "/v1/load_lora_adapter", false, true, false, LS_STEPS_HANDLER, LS_RUN_BACKEND},
        {"POST", "/v1/unload_lora_adapter", false, true, false, LS_STEPS_HANDLER, LS_RUN_BACKEND},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        rt_hit h = rt_find(want[i].method, want[i].path);
        assert_non_null(h.route);
        assert_string_equal(h.route->method, want[i].method);
        assert_int_equal(h.route->open, want[i].open);
        assert_int_equal(h.route->has_body, want[i].has_body);
        assert_int_equal(h.route->probe, want[i].probe);
        assert_int_equal(h.route->steps, want[i].steps);
        assert_int_equal(h.route->on, want[i].on);
    }
}

static void test_adapter_name_segment(void **state) {
    (void)state;
    rt_expect("GET", "/adapters/my-lora", ls_handle_adapter_get, "my-lora", "DELETE");
    rt_expect("DELETE", "/adapters/my-lora", ls_handle_adapter_delete, "my-lora", "GET, HEAD");
    rt_expect("GET", "/adapters/a.b_c%20d", ls_handle_adapter_get, "a.b_c%20d", "DELETE");
    assert_string_equal(rt_find("GET", "/adapters/x").route->pattern, "/adapters/{name}");
    /* "validate" is a name like any other except for POST */
    rt_expect("GET", "/adapters/validate", ls_handle_adapter_get, "validate", "POST, DELETE");
    rt_expect("DELETE", "/adapters/validate", ls_handle_adapter_delete, "validate", "POST, GET, HEAD");

    /* The longest segment that fits the 256-byte parameter, and one more:
     * still this route (no name is that long, so its answer is
     * adapter_not_found), the name cut and marked. */
    char path[300], name[256];
    memset(name, 'n', 255);
    name[255] = '\0';
    memcpy(path, "/adapters/", 10);
    memcpy(path + 10, name, 256);
    rt_expect("GET", path, ls_handle_adapter_get, name, "DELETE");
    memcpy(path + 10 + 255, "n", 2);
    memcpy(name + 252, "...", 4);
    rt_expect("GET", path, ls_handle_adapter_get, name, "DELETE");

    /* A small parameter buffer gets a truncated, terminated name. */
    char small[4], allow[64];
    const ls_route *r = ls_route_find("GET", "/adapters/abcdef", small, sizeof small, allow, sizeof allow);
    assert_non_null(r);
    assert_string_equal(small, "abc");
}

static void test_head_is_get(void **state) {
    (void)state;
    rt_expect("HEAD", "/health", ls_handle_health, "", "");
    rt_expect("HEAD", "/adapters", ls_handle_adapter_list, "", "POST");
    rt_expect("HEAD", "/adapters/a", ls_handle_adapter_get, "a", "DELETE");
    /* a tenant's adapter as an admin names it */
    rt_expect("GET", "/adapters/acme/a", ls_handle_adapter_get, "acme/a", "DELETE");
    rt_expect_none("HEAD", "/forward", "POST");
}

static void test_unknown_paths(void **state) {
    (void)state;
    const char *paths[] = {"/",           "",           "/nope",         "/health/",    "/HEALTH",
                           "/health?x=1", "/adapters/", "/adapters/a/b/c", "/adapters//", "/adapters/a/", "/adapters//b", "/forward/x",
                           "/adapter",    "/poolx"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        rt_expect_none("GET", paths[i], "");
        rt_expect_none("POST", paths[i], "");
        rt_expect_none("DELETE", paths[i], "");
        assert_string_equal(ls_route_label(paths[i]), "other");
    }
}

static void test_wrong_methods(void **state) {
    (void)state;
    rt_expect_none("POST", "/health", "GET, HEAD");
    rt_expect_none("DELETE", "/ready", "GET, HEAD");
    rt_expect_none("PUT", "/metrics", "GET, HEAD");
    rt_expect_none("GET", "/forward", "POST");
    rt_expect_none("DELETE", "/forward", "POST");
    rt_expect_none("PUT", "/adapters", "POST, GET, HEAD");
    rt_expect_none("DELETE", "/adapters", "POST, GET, HEAD");
    rt_expect_none("POST", "/adapters/x", "GET, HEAD, DELETE");
    rt_expect_none("PUT", "/adapters/x", "GET, HEAD, DELETE");
    rt_expect_none("PUT", "/adapters/validate", "POST, GET, HEAD, DELETE");
    /* methods are case-sensitive */
    rt_expect_none("get", "/health", "GET, HEAD");
}

/* A short Allow buffer is cut, never overrun. */
static void test_allow_truncated(void **state) {
    (void)state;
    char param[16], allow[8];
    memset(allow, 0x5a, sizeof allow);
    assert_null(ls_route_find("PUT", "/adapters/validate", param, sizeof param, allow, sizeof allow));
    assert_string_equal(allow, "POST, G");
}

/* The metrics label of a request no route serves: the first pattern the
 * path matches under any method. */
static void test_labels(void **state) {
    (void)state;
    assert_string_equal(ls_route_label("/health"), "/health");
    assert_string_equal(ls_route_label("/forward"), "/forward");
    assert_string_equal(ls_route_label("/adapters"), "/adapters");
    assert_string_equal(ls_route_label("/adapters/x"), "/adapters/{name}");
    assert_string_equal(ls_route_label("/adapters/validate"), "/adapters/validate");
    assert_string_equal(ls_route_label("/adapters/x/y"), "/adapters/{name}");
    assert_string_equal(ls_route_label("/adapters/x/y/z"), "other");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_paths),          cmocka_unit_test(test_route_flags),
        cmocka_unit_test(test_adapter_name_segment), cmocka_unit_test(test_head_is_get),
        cmocka_unit_test(test_unknown_paths),        cmocka_unit_test(test_wrong_methods),
        cmocka_unit_test(test_allow_truncated),      cmocka_unit_test(test_labels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
