/* POST /adapters in its three ways in (inline JSON, path to a PEFT
 * directory or .safetensors file, raw safetensors body), in PEFT and pool
 * format, f32 and bf16, checked against the conformance example's expected
 * outputs; then naming, replace and pin rules. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/base64.h"
#include "format/safetensors.h"
#include "tests/util/tiny_server.h"
#include "tests/util/server_driver.h"

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

static void test_inline_peft(void **state) {
    (void)state;
    json_t *a = tiny_adapter_inline(&ts, "inline-a", NULL);
    json_t *r = tiny_post_json(&ts, "/adapters", a, 201);
    assert_string_equal(json_string_value(json_object_get(r, "name")), "inline-a");
    assert_int_equal(json_integer_value(json_object_get(r, "version")), 1);
    assert_int_equal(json_integer_value(json_object_get(r, "rank")), 2);
    assert_true(json_real_value(json_object_get(r, "scale")) == 2.0);
    assert_string_equal(json_string_value(json_object_get(r, "state")), "resident");
    assert_int_equal(strlen(json_string_value(json_object_get(r, "sha256"))), 64);
    json_decref(r);
    json_decref(a);
    tiny_check_forward(&ts, "inline-a", "interleaved");
}

static void test_inline_bf16_base64(void **state) {
    (void)state;
    json_t *a = tiny_adapter_inline(&ts, "inline-bf16", "bf16");
    json_t *r = tiny_post_json(&ts, "/adapters", a, 201);
    json_decref(r);
    json_decref(a);
    tiny_check_forward(&ts, "inline-bf16", "interleaved");
}

static void test_inline_pool_format(void **state) {
    (void)state;
    json_t *a = tiny_adapter_pool_format(&ts, "pool-a");
    json_t *r = tiny_post_json(&ts, "/adapters", a, 201);
    assert_string_equal(json_string_value(json_object_get(r, "format")), "pool");
    json_decref(r);
    json_decref(a);
    tiny_check_forward(&ts, "pool-a", "interleaved");
}

static void test_path_peft_dir(void **state) {
    (void)state;
    tiny_write_peft_dir(&ts, "peft-dir", "{\"r\": 2, \"lora_alpha\": 4, \"target_modules\": [\"gate_up_proj\", \"down_proj\"]}");
    json_t *req = json_pack("{s:s, s:s}", "name", "dir-a", "path", "peft-dir");
    json_t *r = tiny_post_json(&ts, "/adapters", req, 201);
    assert_non_null(strstr(json_string_value(json_object_get(r, "source")), "peft-dir"));
    json_decref(r);
    json_decref(req);
    tiny_check_forward(&ts, "dir-a", "interleaved");
}

static void test_path_safetensors_file(void **state) {
    (void)state;
    tiny_write_adapter_file(&ts, "file-a.safetensors", "4");
    json_t *req = json_pack("{s:s, s:s}", "name", "file-a", "path", "file-a.safetensors");
    json_t *r = tiny_post_json(&ts, "/adapters", req, 201);
    json_decref(r);
    json_decref(req);
    tiny_check_forward(&ts, "file-a", "interleaved");
}

static void test_raw_body(void **state) {
    (void)state;
    size_t len;
    uint8_t *body = tiny_adapter_safetensors(&ts, NULL, &len);
    ls_test_response resp;
    assert_int_equal(ls_test_http(ts.srv, "POST", "/adapters?name=raw-a&lora_alpha=4", "application/octet-stream", body,
                                  len, NULL, &resp),
                     0);
    assert_int_equal(resp.status, 201);
    ls_test_response_free(&resp);
    free(body);
    tiny_check_forward(&ts, "raw-a", "interleaved");
    /* lora_alpha stated nowhere: 422 saying where to give it, nothing loaded */
    char *snap = tiny_state_snapshot(&ts);
    body = tiny_adapter_safetensors(&ts, NULL, &len);
    assert_int_equal(ls_test_http(ts.srv, "POST", "/adapters?name=raw-noalpha", "application/octet-stream", body, len,
                                  NULL, &resp),
                     0);
    assert_int_equal(resp.status, 422);
    json_t *j = ls_test_response_json(&resp);
    assert_string_equal(ls_test_error_code(j), "adapter_config_invalid");
    const json_t *v = json_array_get(json_object_get(json_object_get(j, "error"), "violations"), 0);
    assert_non_null(strstr(json_string_value(json_object_get(v, "message")), "lora_alpha is stated nowhere"));
    const char *hint = json_string_value(json_object_get(v, "hint"));
    assert_non_null(strstr(hint, "?lora_alpha="));
    assert_non_null(strstr(hint, "__metadata__ lora_alpha"));
    assert_non_null(strstr(hint, "adapter_config.json"));
    assert_non_null(strstr(hint, "scale"));
    assert_non_null(strstr(hint, "PEFT's LoraConfig default is 8")); /* what an untold training used */
    json_decref(j);
    ls_test_response_free(&resp);
    char *after = tiny_state_snapshot(&ts);
    assert_string_equal(snap, after);
    free(snap);
    free(after);
    /* a scale given instead of alpha is the scale */
    assert_int_equal(ls_test_http(ts.srv, "POST", "/adapters?name=raw-scale2&scale=2", "application/octet-stream", body,
                                  len, NULL, &resp),
                     0);
    assert_int_equal(resp.status, 201);
    j = ls_test_response_json(&resp);
    assert_true(json_real_value(json_object_get(j, "scale")) == 2.0);
    json_decref(j);
    ls_test_response_free(&resp);
    tiny_check_forward(&ts, "raw-scale2", "interleaved");
    /* both: one would be ignored */
    assert_int_equal(ls_test_http(ts.srv, "POST", "/adapters?name=raw-both&scale=2&lora_alpha=4",
                                  "application/octet-stream", body, len, NULL, &resp),
                     0);
    assert_int_equal(resp.status, 422);
    ls_test_response_free(&resp);
    free(body);
}

/* PEFT's files carry __metadata__ "format": "pt" (tiny's do too, as every
 * upload above shows): a writer's marker, not our format option; a value
 * that is neither ours nor a writer's is refused, naming both kinds. */
static void test_metadata_format(void **state) {
    (void)state;
    size_t len;
    uint8_t *pt = tiny_adapter_safetensors(&ts, "4", &len);
    ls_tensor_set parsed, set;
    ls_error err;
    ls_error_init(&err);
    ls_tensor_set_init(&parsed);
    assert_int_equal(ls_safetensors_parse(pt, len, &parsed, &err), LS_OK);
    ls_tensor_set_init(&set);
    for (size_t i = 0; i < parsed.n; i++) {
        ls_tensor t = parsed.items[i].t;
        t.owned = false; /* pt's bytes */
        assert_true(ls_tensor_set_add(&set, parsed.items[i].name, &t));
    }
    assert_true(ls_tensor_set_add_meta(&set, "format", "pool-ish") && ls_tensor_set_add_meta(&set, "lora_alpha", "4"));
    uint8_t *bogus = NULL;
    size_t blen;
    assert_int_equal(ls_safetensors_write(&set, &bogus, &blen, &err), LS_OK);
    ls_tensor_set_free(&set);
    ls_tensor_set_free(&parsed);
    ls_test_response resp;
    assert_int_equal(ls_test_http(ts.srv, "POST", "/adapters?name=meta-bogus", "application/octet-stream", bogus, blen,
                                  NULL, &resp),
                     0);
    assert_int_equal(resp.status, 400);
    assert_non_null(strstr(resp.body, "is not peft, pool or auto"));
    assert_non_null(strstr(resp.body, "writer"));
    ls_test_response_free(&resp);
    /* The query's format goes over the file's. */
    assert_int_equal(ls_test_http(ts.srv, "POST", "/adapters?name=meta-pt&format=peft", "application/octet-stream", pt,
                                  len, NULL, &resp),
                     0);
    assert_int_equal(resp.status, 201);
    ls_test_response_free(&resp);
    tiny_check_forward(&ts, "meta-pt", "interleaved");
    ls_error_free(&err);
    free(pt);
    free(bogus);
}

/* A path to the adapter_model.safetensors of a PEFT directory reads the
 * directory's adapter_config.json: the same adapter as the directory. */
static void test_path_file_in_peft_dir(void **state) {
    (void)state;
    tiny_write_peft_dir(&ts, "peft-dir2", "{\"r\": 2, \"lora_alpha\": 4, \"target_modules\": [\"gate_up_proj\", \"down_proj\"]}");
    json_t *req = json_pack("{s:s, s:s}", "name", "dir-file", "path", "peft-dir2/adapter_model.safetensors");
    json_t *r = tiny_post_json(&ts, "/adapters", req, 201);
    assert_true(json_real_value(json_object_get(r, "scale")) == 2.0);
    json_decref(r);
    json_decref(req);
    tiny_check_forward(&ts, "dir-file", "interleaved");
}

static void test_names_replace_delete(void **state) {
    (void)state;
    json_t *a = tiny_adapter_inline(&ts, "dup", NULL);
    json_decref(tiny_post_json(&ts, "/adapters", a, 201));
    json_t *e = tiny_post_json(&ts, "/adapters", a, 409);
    assert_string_equal(ls_test_error_code(e), "adapter_exists");
    json_decref(e);
    json_object_set_new(a, "replace", json_true());
    json_t *r = tiny_post_json(&ts, "/adapters", a, 201);
    assert_int_equal(json_integer_value(json_object_get(r, "version")), 2);
    json_decref(r);
    json_object_set_new(a, "name", json_string(".hidden"));
    e = tiny_post_json(&ts, "/adapters", a, 400);
    assert_string_equal(ls_test_error_code(e), "invalid_request");
    json_decref(e);
    /* One '/' is a tenant's TENANT/NAME (docs/api.md); these are no names. */
    const char *bad[] = {"bad/na/me", "Bad/name", "bad/.name", "/name", "bad/"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_object_set_new(a, "name", json_string(bad[i]));
        json_decref(tiny_post_json(&ts, "/adapters", a, 400));
    }
    json_decref(a);

    ls_test_response resp;
    assert_int_equal(ls_test_http(ts.srv, "DELETE", "/adapters/dup", NULL, NULL, 0, NULL, &resp), 0);
    assert_int_equal(resp.status, 200);
    ls_test_response_free(&resp);
    assert_int_equal(ls_test_http(ts.srv, "GET", "/adapters/dup", NULL, NULL, 0, NULL, &resp), 0);
    assert_int_equal(resp.status, 404);
    ls_test_response_free(&resp);
    assert_int_equal(ls_test_http(ts.srv, "DELETE", "/adapters/dup", NULL, NULL, 0, NULL, &resp), 0);
    assert_int_equal(resp.status, 404);
    /* Not "load it first": a delete's hint is about deleting. */
    assert_non_null(strstr(resp.body, "nothing was deleted"));
    assert_null(strstr(resp.body, "load it first"));
    ls_test_response_free(&resp);
}

static void test_paths_outside_refused(void **state) {
    (void)state;
    const char *bad[] = {"../outside", "/etc", "escape-link", "no-such-dir"};
    tiny_make_escape_link(&ts, "escape-link");
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *snap = tiny_state_snapshot(&ts);
        json_t *req = json_pack("{s:s, s:s}", "name", "p", "path", bad[i]);
        json_t *e = tiny_post_json(&ts, "/adapters", req, 400);
        assert_string_equal(ls_test_error_code(e), "invalid_request");
        json_decref(e);
        json_decref(req);
        char *after = tiny_state_snapshot(&ts);
        assert_string_equal(snap, after);
        free(snap);
        free(after);
    }
}

static void test_validate_touches_nothing(void **state) {
    (void)state;
    char *snap = tiny_state_snapshot(&ts);
    json_t *a = tiny_adapter_inline(&ts, "validated-only", NULL);
    json_t *r = tiny_post_json(&ts, "/adapters/validate", a, 200);
    assert_true(json_is_true(json_object_get(r, "valid")));
    assert_int_equal(json_integer_value(json_object_get(r, "rank")), 2);
    json_decref(r);
    json_decref(a);
    char *after = tiny_state_snapshot(&ts);
    assert_string_equal(snap, after);
    ls_test_response resp;
    assert_int_equal(ls_test_http(ts.srv, "GET", "/adapters/validated-only", NULL, NULL, 0, NULL, &resp), 0);
    assert_int_equal(resp.status, 404);
    ls_test_response_free(&resp);
    free(snap);
    free(after);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inline_peft),           cmocka_unit_test(test_inline_bf16_base64),
        cmocka_unit_test(test_inline_pool_format),    cmocka_unit_test(test_path_peft_dir),
        cmocka_unit_test(test_path_safetensors_file), cmocka_unit_test(test_raw_body),
        cmocka_unit_test(test_metadata_format),
        cmocka_unit_test(test_names_replace_delete),  cmocka_unit_test(test_paths_outside_refused),
        cmocka_unit_test(test_validate_touches_nothing), cmocka_unit_test(test_path_file_in_peft_dir),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
