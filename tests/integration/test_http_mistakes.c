/* Issue 26's misleading errors, each answered with what to fix: a raw
 * safetensors upload sent without its Content-Type, adapter_config keys at
 * the top of a JSON upload, an adapter for more experts than served, a
 * transposed pool factor, and "did you mean" for adapter names, JSON keys
 * and query parameters. Nothing changes after any of them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/util/tiny_server.h"

static tiny_server ts;

#define P "model.layers.0.mlp.shared_experts."

static int setup(void **state) {
    (void)state;
    if (!tiny_server_start(&ts, "interleaved", NULL)) return -1;
    json_t *a = tiny_adapter_inline(&ts, "tenant-a", NULL);
    json_decref(tiny_post_json(&ts, "/adapters", a, 201));
    json_decref(a);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tiny_server_stop(&ts);
    return 0;
}

/* Sends the request, asserts status, code and that message (and hint,
 * when given) hold the wanted words; the pool and registry unchanged. */
static void expect(const char *method, const char *path, const char *type, const void *body, size_t len,
                   long status, const char *code, const char *in_message, const char *in_hint) {
    char *before = tiny_state_snapshot(&ts);
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, method, path, type, body, len, NULL, &r), 0);
    json_t *j = ls_test_response_json(&r);
    if (r.status != status || !j) fprintf(stderr, "%s %s -> %ld: %s\n", method, path, r.status, r.body);
    assert_int_equal(r.status, status);
    assert_non_null(j);
    json_t *e = json_object_get(j, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    const char *hint = json_string_value(json_object_get(e, "hint"));
    if (strcmp(ls_test_error_code(j), code) || !strstr(msg, in_message) || (in_hint && !strstr(hint, in_hint)))
        fail_msg("%s %s: wanted %s with \"%s\" / \"%s\", got %s", method, path, code, in_message,
                 in_hint ? in_hint : "", r.body);
    json_decref(j);
    ls_test_response_free(&r);
    char *after = tiny_state_snapshot(&ts);
    assert_string_equal(before, after);
    free(before);
    free(after);
}

static void expect_json(const char *path, const json_t *body, long status, const char *code, const char *in_message,
                        const char *in_hint) {
    char *text = json_dumps(body, JSON_COMPACT);
    assert_non_null(text);
    expect("POST", path, "application/json", text, strlen(text), status, code, in_message, in_hint);
    free(text);
}

/* curl --data-binary @file sends application/x-www-form-urlencoded, which
 * is read as JSON: the query's raw-form parameters say what happened. */
static void test_raw_upload_without_type(void **state) {
    (void)state;
    size_t len;
    uint8_t *st = tiny_adapter_safetensors(&ts, "4", &len);
    expect("POST", "/adapters?name=raw&lora_alpha=4", "application/x-www-form-urlencoded", st, len, 400,
           "invalid_request",
           "query parameter \"name\" belongs to a raw safetensors upload, but this body was read as JSON "
           "(Content-Type: application/x-www-form-urlencoded)",
           "Content-Type: application/octet-stream");
    expect("POST", "/adapters/validate?lora_alpha=4", "text/plain", st, len, 400, "invalid_request",
           "\"lora_alpha\" belongs to a raw safetensors upload", "--data-binary @FILE");
    /* With the type it loads. */
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "POST", "/adapters/validate?name=raw", "application/octet-stream", st, len,
                                  NULL, &r),
                     0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    free(st);
}

static void test_config_key_at_top(void **state) {
    (void)state;
    json_t *a = tiny_adapter_inline(&ts, "top", NULL);
    json_object_set_new(a, "lora_alpha", json_integer(4));
    expect_json("/adapters", a, 400, "invalid_request",
                "unknown key \"lora_alpha\" in the adapter upload: \"lora_alpha\" is a key of \"config\"",
                "put it in config");
    json_object_del(a, "lora_alpha");
    json_object_set_new(a, "r", json_integer(2));
    expect_json("/adapters/validate", a, 400, "invalid_request", "\"r\" is a key of \"config\"", "put it in config");
    json_object_del(a, "r");
    json_object_set_new(a, "pined", json_true());
    expect_json("/adapters", a, 400, "invalid_request", "unknown key \"pined\" in the adapter upload; did you mean "
                "\"pinned\"?", "known keys:");
    json_decref(a);
}

/* The tiny model is n=2, F=3: a PEFT adapter trained for n=4 experts of
 * F=3 has 2 * 4 * 3 = 24 gate_up rows and 12 down columns. */
static void test_more_experts(void **state) {
    (void)state;
    json_t *a = tiny_shaped_peft(TINY_SHAPE(2, 4), TINY_SHAPE(24, 2), TINY_SHAPE(2, 12), TINY_SHAPE(4, 2));
    expect_json("/adapters/validate", a, 422, "lora_expert_count_mismatch",
                "= 4 * 2F: an adapter for 4 shared experts of F = 3, and this server serves n = 2 (expected n * 2F = 12, "
                "expert-major); or one for an intermediate size of 6 per expert",
                "GET /model");
    json_decref(a);
    /* Not a whole number of experts: the intermediate size, as before. */
    a = tiny_shaped_peft(TINY_SHAPE(2, 4), TINY_SHAPE(16, 2), TINY_SHAPE(2, 8), TINY_SHAPE(4, 2));
    expect_json("/adapters/validate", a, 422, "lora_intermediate_mismatch", "expected n * 2F", NULL);
    json_decref(a);
}

/* gate_up_lora_b is [1, n, 2F, r]; sent as [1, n, r, 2F] the top-level
 * message must name it, not its partner. */
static void test_transposed_pool_b(void **state) {
    (void)state;
    json_t *a = tiny_shaped_pool(TINY_SHAPE(1, 1, 4, 4), TINY_SHAPE(1, 2, 2, 6), TINY_SHAPE(1, 2, 2, 3), TINY_SHAPE(1, 1, 4, 2));
    expect_json("/adapters/validate", a, 422, "lora_intermediate_mismatch", "gate_up_lora_b", NULL);
    json_decref(a);
}

/* A deleted name is said to be deleted: a second DELETE of "tenant-c"
 * answered "did you mean 'tenant-a'?", offering a live adapter to delete
 * in its place. */
static void test_deleted_name_said(void **state) {
    (void)state;
    json_t *a = tiny_adapter_inline(&ts, "tenant-c", NULL);
    json_decref(tiny_post_json(&ts, "/adapters", a, 201));
    json_decref(a);
    free(tiny_request(&ts, "DELETE", "/adapters/tenant-c", NULL, NULL, 200));
    expect("DELETE", "/adapters/tenant-c", NULL, NULL, 0, 404, "adapter_not_found",
           "adapter 'tenant-c' is not registered: it was deleted, or not restored at start-up (its last version was 1)",
           "nothing was deleted");
    expect("GET", "/adapters/tenant-c", NULL, NULL, 0, 404, "adapter_not_found", "it was deleted", NULL);
    const char *fwd = "{\"x\": [[0.5, 0.25, 0.125, 1.0]], \"adapter\": \"tenant-c\"}";
    expect("POST", "/forward", "application/json", fwd, strlen(fwd), 404, "adapter_not_found", "it was deleted", NULL);
}

static void test_did_you_mean(void **state) {
    (void)state;
    expect("GET", "/adapters/tenant_a", NULL, NULL, 0, 404, "adapter_not_found",
           "adapter 'tenant_a' is not registered; did you mean 'tenant-a'?", NULL);
    expect("DELETE", "/adapters/tenant-b", NULL, NULL, 0, 404, "adapter_not_found", "did you mean 'tenant-a'?", NULL);
    expect("GET", "/adapters/other", NULL, NULL, 0, 404, "adapter_not_found", "adapter 'other' is not registered",
           NULL);
    const char *fwd = "{\"x\": [[0.5, 0.25, 0.125, 1.0]], \"adapter\": \"tenant_a\"}";
    expect("POST", "/forward", "application/json", fwd, strlen(fwd), 404, "adapter_not_found",
           "did you mean 'tenant-a'?", NULL);
    const char *gam = "{\"x\": [[0.5, 0.25, 0.125, 1.0]], \"gamma\": [[1, 1]]}";
    expect("POST", "/forward", "application/json", gam, strlen(gam), 400, "invalid_request",
           "unknown key \"gamma\" in the forward request; did you mean \"gammas\"?", NULL);
    const char *x = "{\"x\": [[0.5, 0.25, 0.125, 1.0]]}";
    expect("POST", "/forward?adaptr=tenant-a", "application/json", x, strlen(x), 400, "invalid_request",
           "unknown query parameter \"adaptr\"; did you mean \"adapter\"?", NULL);
    /* One name where the list goes: the hint names the key for one name. */
    const char *one = "{\"x\": [[0.5, 0.25, 0.125, 1.0]], \"adapters\": \"tenant-a\"}";
    expect("POST", "/forward", "application/json", one, strlen(one), 400, "invalid_request",
           "\"adapters\" must be an array", "send \"adapter\": NAME");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_raw_upload_without_type), cmocka_unit_test(test_config_key_at_top),
        cmocka_unit_test(test_more_experts),            cmocka_unit_test(test_transposed_pool_b),
        cmocka_unit_test(test_did_you_mean), cmocka_unit_test(test_deleted_name_said),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
