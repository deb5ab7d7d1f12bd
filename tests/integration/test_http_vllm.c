/* vLLM's runtime adapter routes, /v1/load_lora_adapter and
 * /v1/unload_lora_adapter, as a vLLM client sends them (JSON bodies, a
 * bearer key): the adapter loads by path and serves forwards, vLLM's
 * status codes where ours differ, our error bodies, and nothing changed
 * by a refused request. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/util/server_driver.h"
#include "tests/util/tiny_server.h"

#define KEY "vllm-key"

static tiny_server ts;
/* The server of the tests but test_auth has no key: the header is sent
 * as a vLLM client would, and ignored. */
static const char *const auth[] = {"Authorization: Bearer " KEY, NULL};

static int setup(void **state) {
    (void)state;
    return tiny_server_start(&ts, "interleaved", NULL) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tiny_server_stop(&ts);
    return 0;
}

/* POSTs body (JSON text) to path with headers; asserts the status and
 * returns the body (owned). */
static char *post_to(tiny_server *t, const char *path, const char *body, const char *const *headers, long want) {
    return tiny_request(t, "POST", path, body, headers, want);
}

static char *post(const char *path, const char *body, const char *const *headers, long want) {
    return post_to(&ts, path, body, headers, want);
}

/* The error code of an error body text. */
/* Also: an error body's status is its status line's, 400 for what
 * POST /adapters answers 409 or 422. */
static void assert_code(const char *text, const char *code) {
    json_t *j = json_loads(text, 0, NULL);
    assert_non_null(j);
    assert_string_equal(ls_test_error_code(j), code);
    if (strcmp(code, "adapter_not_found") && strcmp(code, "unauthorized"))
        assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "error"), "status")), 400);
    json_decref(j);
}

static long adapter_status(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "/adapters/%s", name);
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "GET", path, NULL, NULL, 0, auth, &r), 0);
    long st = r.status;
    ls_test_response_free(&r);
    return st;
}

static void test_load_forward_unload(void **state) {
    (void)state;
    tiny_write_peft_dir(&ts, "v-dir", "{\"r\": 2, \"lora_alpha\": 4, \"target_modules\": [\"gate_up_proj\", \"down_proj\"]}");
    char *t = post("/v1/load_lora_adapter", "{\"lora_name\": \"v-a\", \"lora_path\": \"v-dir\"}", auth, 200);
    assert_string_equal(t, "Success: LoRA adapter 'v-a' added successfully.");
    free(t);
    assert_int_equal(adapter_status("v-a"), 200);
    /* vLLM: a name already loaded is 400; our body says which error. */
    t = post("/v1/load_lora_adapter", "{\"lora_name\": \"v-a\", \"lora_path\": \"v-dir\"}", auth, 400);
    assert_code(t, "adapter_exists");
    /* The hint is this route's way to replace (it said "replace": true,
     * a key this route refuses), and the body ends as every JSON reply. */
    assert_non_null(strstr(t, "send \\\"load_inplace\\\": true to replace it"));
    assert_true(t[strlen(t) - 1] == '\n');
    free(t);
    t = post("/v1/load_lora_adapter", "{\"lora_name\": \"v-a\", \"lora_path\": \"v-dir\", \"load_inplace\": true}",
             auth, 200);
    free(t);
    t = post("/v1/unload_lora_adapter", "{\"lora_name\": \"v-a\", \"lora_int_id\": 7}", auth, 200);
    assert_string_equal(t, "Success: LoRA adapter 'v-a' removed successfully.");
    free(t);
    assert_int_equal(adapter_status("v-a"), 404);
    t = post("/v1/unload_lora_adapter", "{\"lora_name\": \"v-a\"}", auth, 404);
    assert_code(t, "adapter_not_found");
    free(t);
}

/* The adapter loaded by the vLLM route serves the example's forward. */
static void test_loaded_adapter_serves(void **state) {
    (void)state;
    tiny_write_peft_dir(&ts, "v-dir2", "{\"r\": 2, \"lora_alpha\": 4, \"target_modules\": [\"gate_up_proj\", \"down_proj\"]}");
    free(post("/v1/load_lora_adapter", "{\"lora_name\": \"v-b\", \"lora_path\": \"v-dir2\"}", auth, 200));
    tiny_check_forward(&ts, "v-b", "interleaved");
    free(post("/v1/unload_lora_adapter", "{\"lora_name\": \"v-b\"}", auth, 200));
}

/* With --api-key both routes need it, as every route but /health. */
static void test_auth(void **state) {
    (void)state;
    tiny_server k;
    const char *extra[] = {"--api-key", KEY, NULL};
    assert_true(tiny_server_start(&k, "interleaved", extra));
    tiny_write_peft_dir(&k, "k-dir", "{\"r\": 2, \"lora_alpha\": 4, \"target_modules\": [\"gate_up_proj\", \"down_proj\"]}");
    const char *load = "{\"lora_name\": \"k-a\", \"lora_path\": \"k-dir\"}";
    char *t = post_to(&k, "/v1/load_lora_adapter", load, NULL, 401);
    assert_code(t, "unauthorized");
    free(t);
    const char *const wrong[] = {"Authorization: Bearer nope", NULL};
    free(post_to(&k, "/v1/load_lora_adapter", load, wrong, 401));
    free(post_to(&k, "/v1/load_lora_adapter", load, auth, 200));
    free(post_to(&k, "/v1/unload_lora_adapter", "{\"lora_name\": \"k-a\"}", NULL, 401));
    free(post_to(&k, "/v1/unload_lora_adapter", "{\"lora_name\": \"k-a\"}", auth, 200));
    tiny_server_stop(&k);
}

/* Refused bodies change nothing and answer our error body. */
static void test_bad_requests(void **state) {
    (void)state;
    tiny_make_escape_link(&ts, "v-escape");
    static const struct {
        const char *path, *body, *code;
        long status;
    } cases[] = {
        {"/v1/load_lora_adapter", "{\"lora_name\": \"v-d\", \"lora_path\": \"../outside\"}", "invalid_request", 400},
        {"/v1/load_lora_adapter", "{\"lora_name\": \"v-d\", \"lora_path\": \"v-escape\"}", "invalid_request", 400},
        {"/v1/load_lora_adapter", "{\"lora_name\": \"v-d\", \"lora_path\": \"no-such-dir\"}", "invalid_request", 400},
        {"/v1/load_lora_adapter", "{\"lora_name\": \"v-d\"}", "invalid_request", 400},
        {"/v1/load_lora_adapter", "{\"lora_name\": \"v-d\", \"lora_path\": \"v-dir\", \"pinned\": true}",
         "invalid_request", 400},
        {"/v1/load_lora_adapter", "{\"lora_name\": \"v-d\", \"lora_path\": 3}", "invalid_request", 400},
        {"/v1/load_lora_adapter", "{\"lora_name\": \"v-d\", \"lora_path\": \"v-dir\", \"is_3d_lora_weight\": 1}",
         "invalid_request", 400},
        {"/v1/load_lora_adapter", "{\"lora_name\": \"bad/na/me\", \"lora_path\": \"v-dir\"}", "invalid_request", 400},
        {"/v1/load_lora_adapter", "[1]", "invalid_json", 400},
        {"/v1/load_lora_adapter", "{", "invalid_json", 400},
        {"/v1/unload_lora_adapter", "{\"lora_int_id\": 1}", "invalid_request", 400},
        {"/v1/unload_lora_adapter", "{}", "invalid_request", 400},
        {"/v1/unload_lora_adapter", "{\"lora_name\": \"v-d\", \"lora_int_id\": \"x\"}", "invalid_request", 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *snap = tiny_state_snapshot(&ts);
        char *t = post(cases[i].path, cases[i].body, auth, cases[i].status);
        assert_code(t, cases[i].code);
        free(t);
        char *after = tiny_state_snapshot(&ts);
        assert_string_equal(snap, after);
        free(snap);
        free(after);
    }
}

/* The card of id in a GET /v1/models list, or NULL. Borrowed. */
static json_t *card_of(json_t *list, const char *id) {
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(list, "data"), i, c) if (!strcmp(json_string_value(json_object_get(c, "id")), id)) return c;
    return NULL;
}

static json_t *models(void) {
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "GET", "/v1/models", NULL, NULL, 0, auth, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = ls_test_response_json(&r);
    ls_test_response_free(&r);
    assert_non_null(j);
    return j;
}

/* GET /v1/models as vLLM lists it: the base model first, then each
 * adapter with its path as root and the base as parent, gone once
 * unloaded (tools confirm a load by it). is_3d_lora_weight, which vLLM
 * takes, is taken as a boolean. */
static void test_models(void **state) {
    (void)state;
    tiny_write_peft_dir(&ts, "v-mdir", "{\"r\": 2, \"lora_alpha\": 4, \"target_modules\": [\"gate_up_proj\", \"down_proj\"]}");
    free(post("/v1/load_lora_adapter",
              "{\"lora_name\": \"v-m\", \"lora_path\": \"v-mdir\", \"is_3d_lora_weight\": false}", auth, 200));
    json_t *j = models();
    assert_string_equal(json_string_value(json_object_get(j, "object")), "list");
    json_t *base = json_array_get(json_object_get(j, "data"), 0);
    const char *base_id = json_string_value(json_object_get(base, "id"));
    assert_non_null(base_id);
    assert_true(json_is_null(json_object_get(base, "parent")));
    json_t *c = card_of(j, "v-m");
    assert_non_null(c);
    assert_string_equal(json_string_value(json_object_get(c, "object")), "model");
    assert_string_equal(json_string_value(json_object_get(c, "root")), "v-mdir");
    assert_string_equal(json_string_value(json_object_get(c, "parent")), base_id);
    assert_true(json_integer_value(json_object_get(c, "created")) > 1700000000);
    json_decref(j);
    free(post("/v1/unload_lora_adapter", "{\"lora_name\": \"v-m\"}", auth, 200));
    j = models();
    assert_null(card_of(j, "v-m"));
    json_decref(j);
}

/* An adapter that fails validation: ours 422, vLLM's 400, code kept. */
static void test_invalid_adapter_is_400(void **state) {
    (void)state;
    tiny_write_peft_dir(&ts, "v-rank", "{\"r\": 3, \"lora_alpha\": 4, \"target_modules\": [\"gate_up_proj\", \"down_proj\"]}");
    char *t = post("/v1/load_lora_adapter", "{\"lora_name\": \"v-e\", \"lora_path\": \"v-rank\"}", auth, 400);
    json_t *j = json_loads(t, 0, NULL);
    assert_non_null(j);
    const char *code = ls_test_error_code(j);
    assert_true(strlen(code) > 0 && strcmp(code, "invalid_request") != 0);
    json_decref(j);
    free(t);
    assert_int_equal(adapter_status("v-e"), 404);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_forward_unload), cmocka_unit_test(test_loaded_adapter_serves),
        cmocka_unit_test(test_auth),                cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_invalid_adapter_is_400), cmocka_unit_test(test_models),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
