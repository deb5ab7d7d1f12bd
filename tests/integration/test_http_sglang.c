/* sglang's runtime adapter routes, /load_lora_adapter and
 * /unload_lora_adapter, as an sglang client sends them: the adapter
 * loads by path and serves forwards, every reply in sglang's shape
 * ({"success", "error_message", "loaded_adapters"}) with sglang's status
 * codes, our error object beside it, and nothing changed by a refused
 * request. */
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

#define CONFIG "{\"r\": 2, \"lora_alpha\": 4, \"target_modules\": [\"gate_up_proj\", \"down_proj\"]}"

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

/* POSTs body to path; asserts the status and that the reply is sglang's
 * shape with success as expected. Returns the parsed body (owned). */
static json_t *post_to(tiny_server *t, const char *path, const char *body, const char *const *headers, long want) {
    char *text = tiny_request(t, "POST", path, body, headers, want);
    assert_true(text[0] && text[strlen(text) - 1] == '\n');
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    free(text);
    assert_non_null(j);
    assert_true(json_is_boolean(json_object_get(j, "success")));
    assert_true(json_is_string(json_object_get(j, "error_message")));
    assert_true(json_is_object(json_object_get(j, "loaded_adapters")));
    const bool ok = want == 200;
    assert_int_equal(json_is_true(json_object_get(j, "success")), ok);
    assert_int_equal(json_object_get(j, "error") == NULL, ok);
    assert_int_equal(json_string_length(json_object_get(j, "error_message")) == 0, ok);
    return j;
}

static json_t *post(const char *path, const char *body, long want) { return post_to(&ts, path, body, NULL, want); }

/* A failure's error object: its code, its status that of the line, its
 * message the error_message. */
static void assert_error(const json_t *j, const char *code, long status) {
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), code);
    assert_int_equal(json_integer_value(json_object_get(e, "status")), status);
    assert_string_equal(json_string_value(json_object_get(e, "message")),
                        json_string_value(json_object_get(j, "error_message")));
}

static const char *loaded_path(const json_t *j, const char *name) {
    return json_string_value(json_object_get(json_object_get(j, "loaded_adapters"), name));
}

static json_t *adapter(const char *name, long want) {
    char path[256];
    snprintf(path, sizeof path, "/adapters/%s", name);
    return tiny_get_json(&ts, path, want);
}

static void test_load_forward_unload(void **state) {
    (void)state;
    tiny_write_peft_dir(&ts, "s-dir", CONFIG);
    /* sglang's own request keys are taken. */
    json_t *j = post("/load_lora_adapter",
                     "{\"lora_name\": \"s-a\", \"lora_path\": \"s-dir\", \"pinned\": false, \"lora_id\": \"0a1b\", "
                     "\"rid\": null, \"http_worker_ipc\": null}",
                     200);
    assert_string_equal(loaded_path(j, "s-a"), "s-dir");
    json_decref(j);
    json_decref(adapter("s-a", 200));
    tiny_check_forward(&ts, "s-a", "interleaved");
    /* sglang: a name already loaded is refused; nothing is replaced. */
    j = post("/load_lora_adapter", "{\"lora_name\": \"s-a\", \"lora_path\": \"s-dir\"}", 400);
    assert_error(j, "adapter_exists", 400);
    assert_string_equal(loaded_path(j, "s-a"), "s-dir");
    json_decref(j);
    json_t *a = adapter("s-a", 200);
    assert_int_equal(json_integer_value(json_object_get(a, "version")), 1);
    json_decref(a);
    j = post("/unload_lora_adapter", "{\"lora_name\": \"s-a\", \"lora_id\": \"0a1b\"}", 200);
    assert_null(json_object_get(json_object_get(j, "loaded_adapters"), "s-a"));
    json_decref(j);
    json_decref(adapter("s-a", 404));
    j = post("/unload_lora_adapter", "{\"lora_name\": \"s-a\"}", 400);
    assert_error(j, "adapter_not_found", 400);
    json_decref(j);
}

/* "pinned" pins, as POST /adapters' does. */
static void test_pinned(void **state) {
    (void)state;
    tiny_write_peft_dir(&ts, "s-pin", CONFIG);
    json_decref(post("/load_lora_adapter", "{\"lora_name\": \"s-p\", \"lora_path\": \"s-pin\", \"pinned\": true}", 200));
    json_t *a = adapter("s-p", 200);
    assert_true(json_is_true(json_object_get(a, "pinned")));
    json_decref(a);
    json_decref(post("/unload_lora_adapter", "{\"lora_name\": \"s-p\"}", 200));
}

/* With --api-key: 401 stays 401 (sglang's body, our error). */
static void test_auth(void **state) {
    (void)state;
    tiny_server k;
    const char *extra[] = {"--api-key", "sk", NULL};
    assert_true(tiny_server_start(&k, "interleaved", extra));
    tiny_write_peft_dir(&k, "k-dir", CONFIG);
    const char *load = "{\"lora_name\": \"k-a\", \"lora_path\": \"k-dir\"}";
    const char *const auth[] = {"Authorization: Bearer sk", NULL};
    ls_test_response r;
    assert_int_equal(ls_test_http(k.srv, "POST", "/load_lora_adapter", "application/json", load, strlen(load), NULL, &r),
                     0);
    assert_int_equal(r.status, 401);
    assert_non_null(strstr(r.body, "unauthorized"));
    ls_test_response_free(&r);
    json_t *j = post_to(&k, "/load_lora_adapter", load, auth, 200);
    assert_string_equal(loaded_path(j, "k-a"), "k-dir");
    json_decref(j);
    json_decref(post_to(&k, "/unload_lora_adapter", "{\"lora_name\": \"k-a\"}", auth, 200));
    tiny_server_stop(&k);
}

/* Refused bodies change nothing, and answer 400 in sglang's shape. */
static void test_bad_requests(void **state) {
    (void)state;
    tiny_write_peft_dir(&ts, "s-bad", CONFIG);
    tiny_write_peft_dir(&ts, "s-rank", "{\"r\": 3, \"lora_alpha\": 4, \"target_modules\": [\"gate_up_proj\", \"down_proj\"]}");
    static const struct {
        const char *path, *body, *code, *says;
    } cases[] = {
        {"/load_lora_adapter", "{\"lora_name\": \"s-d\", \"lora_path\": \"../outside\"}", "invalid_request", NULL},
        {"/load_lora_adapter", "{\"lora_name\": \"s-d\", \"lora_path\": \"no-such-dir\"}", "invalid_request", NULL},
        {"/load_lora_adapter", "{\"lora_name\": \"s-d\"}", "invalid_request", "both lora_name and lora_path"},
        {"/load_lora_adapter", "{\"lora_nmae\": \"s-d\", \"lora_path\": \"s-bad\"}", "invalid_request",
         "did you mean \"lora_name\""},
        {"/load_lora_adapter", "{\"lora_name\": \"s-d\", \"lora_path\": \"s-bad\", \"replace\": true}",
         "invalid_request", "unknown key \"replace\""},
        {"/load_lora_adapter", "{\"lora_name\": \"s-d\", \"lora_path\": \"s-bad\", \"pinned\": 1}", "invalid_request",
         "pinned must be true or false"},
        {"/load_lora_adapter", "{\"lora_name\": \"s-d\", \"lora_path\": \"s-bad\", \"lora_id\": 5}", "invalid_request",
         "lora_id must be a string"},
        {"/load_lora_adapter", "{\"lora_name\": \"s-d\", \"lora_path\": \"s-rank\"}", "lora_rank_mismatch", NULL},
        {"/load_lora_adapter", "[1]", "invalid_json", NULL},
        {"/unload_lora_adapter", "{}", "invalid_request", "lora_name must be given"},
        {"/unload_lora_adapter", "{\"lora_name\": \"s-d\", \"rid\": []}", "invalid_request", "rid must be a string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *snap = tiny_state_snapshot(&ts);
        json_t *j = post(cases[i].path, cases[i].body, 400);
        assert_error(j, cases[i].code, 400);
        if (cases[i].says && !strstr(json_string_value(json_object_get(j, "error_message")), cases[i].says))
            fail_msg("%s: %s", cases[i].body, json_string_value(json_object_get(j, "error_message")));
        json_decref(j);
        char *after = tiny_state_snapshot(&ts);
        assert_string_equal(snap, after);
        free(snap);
        free(after);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_forward_unload),
        cmocka_unit_test(test_pinned),
        cmocka_unit_test(test_auth),
        cmocka_unit_test(test_bad_requests),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
