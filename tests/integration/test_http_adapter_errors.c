/* Every validation code of docs/api.md through HTTP, from the input it
 * describes: status 422, the code, a message, a hint and the list of
 * violations; the pool and the registry unchanged after each. Then the
 * hostile safetensors corpus as raw uploads. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/base64.h"
#include "tests/util/tiny_server.h"

static tiny_server ts;

#define P "model.layers.0.mlp.shared_experts."

static int setup(void **state) {
    (void)state;
    if (!tiny_server_start(&ts, "interleaved", NULL)) return -1;
    /* one adapter present, so "unchanged" is checked against a non-empty pool */
    json_t *a = tiny_adapter_inline(&ts, "resident", NULL);
    json_decref(tiny_post_json(&ts, "/adapters", a, 201));
    json_decref(a);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tiny_server_stop(&ts);
    return 0;
}

/* Posts body to /adapters and /adapters/validate; both must answer the
 * code with a complete error body, and nothing may change. Returns the
 * first violation (borrowed from the returned root, which the caller
 * frees) for further checks. */
static json_t *expect_code(json_t *body, const char *code, json_t **first) {
    char *before = tiny_state_snapshot(&ts);
    json_t *e = tiny_post_json(&ts, "/adapters/validate", body, 422);
    assert_string_equal(ls_test_error_code(e), code);
    json_decref(e);
    e = tiny_post_json(&ts, "/adapters", body, 422);
    json_t *err = json_object_get(e, "error");
    if (strcmp(ls_test_error_code(e), code)) fprintf(stderr, "wanted %s, got %s\n", code, json_dumps(e, 0));
    assert_string_equal(ls_test_error_code(e), code);
    assert_int_equal(json_integer_value(json_object_get(err, "status")), 422);
    assert_true(strlen(json_string_value(json_object_get(err, "message"))) > 0);
    assert_true(strlen(json_string_value(json_object_get(err, "hint"))) > 0);
    json_t *v = json_object_get(err, "violations");
    assert_true(json_array_size(v) >= 1);
    bool found = false;
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *vi = json_array_get(v, i);
        assert_true(strlen(json_string_value(json_object_get(vi, "hint"))) > 0);
        if (!strcmp(json_string_value(json_object_get(vi, "code")), code)) found = true;
    }
    assert_true(found);
    *first = json_array_get(v, 0);
    char *after = tiny_state_snapshot(&ts);
    assert_string_equal(before, after);
    free(before);
    free(after);
    json_decref(body);
    return e;
}

static void check(json_t *body, const char *code) {
    json_t *first;
    json_decref(expect_code(body, code, &first));
}

static void test_pool_format_codes(void **state) {
    (void)state;
    check(tiny_shaped_pool(TINY_SHAPE(1, 1, 4), TINY_SHAPE(1, 2, 6, 2), TINY_SHAPE(1, 2, 2, 3), TINY_SHAPE(1, 1, 4, 2)), "lora_not_4d");
    check(tiny_shaped_pool(TINY_SHAPE(1, 3, 4, 4), TINY_SHAPE(1, 2, 6, 2), TINY_SHAPE(1, 2, 2, 3), TINY_SHAPE(1, 3, 4, 2)), "lora_outer_dim_invalid");
    check(tiny_shaped_pool(TINY_SHAPE(1, 1, 4, 4), TINY_SHAPE(1, 2, 6, 2), TINY_SHAPE(1, 2, 2, 3), TINY_SHAPE(1, 2, 4, 2)), "lora_expert_layout_mismatch");
    check(tiny_shaped_pool(TINY_SHAPE(1, 1, 4, 4), TINY_SHAPE(1, 3, 6, 2), TINY_SHAPE(1, 2, 2, 3), TINY_SHAPE(1, 1, 4, 2)), "lora_expert_count_mismatch");
    check(tiny_shaped_pool(TINY_SHAPE(2, 1, 4, 4), TINY_SHAPE(2, 2, 6, 2), TINY_SHAPE(2, 2, 2, 3), TINY_SHAPE(2, 1, 4, 2)), "lora_slot_axis_invalid");
    check(tiny_shaped_pool(TINY_SHAPE(1, 2, 4, 4), TINY_SHAPE(1, 2, 6, 2), TINY_SHAPE(1, 2, 2, 3), TINY_SHAPE(1, 2, 4, 2)), "lora_layout_unsupported");
    check(tiny_shaped_pool(TINY_SHAPE(1, 1, 4, 5), TINY_SHAPE(1, 2, 6, 2), TINY_SHAPE(1, 2, 2, 3), TINY_SHAPE(1, 1, 4, 2)), "lora_hidden_mismatch");
    check(tiny_shaped_pool(TINY_SHAPE(1, 1, 4, 4), TINY_SHAPE(1, 2, 8, 2), TINY_SHAPE(1, 2, 2, 3), TINY_SHAPE(1, 1, 4, 2)), "lora_intermediate_mismatch");
}

/* The seed's error: gate and up A not fused along the rank axis. */
static void test_rank_mismatch_seed_error(void **state) {
    (void)state;
    json_t *first;
    json_t *e = expect_code(tiny_shaped_pool(TINY_SHAPE(1, 1, 2, 4), TINY_SHAPE(1, 2, 6, 2), TINY_SHAPE(1, 2, 2, 3), TINY_SHAPE(1, 1, 4, 2)), "lora_rank_mismatch",
                            &first);
    assert_int_equal(json_integer_value(json_object_get(first, "layer")), 0);
    assert_int_equal(json_integer_value(json_object_get(first, "axis")), 2);
    assert_int_equal(json_integer_value(json_object_get(first, "expected")), 4);
    assert_int_equal(json_integer_value(json_object_get(first, "got")), 2);
    assert_non_null(strstr(json_string_value(json_object_get(first, "tensor")), "gate_up_lora_a"));
    assert_non_null(strstr(json_string_value(json_object_get(first, "hint")), "rank axis"));
    json_decref(e);
}

static void test_peft_codes(void **state) {
    (void)state;
    json_t *first;
    json_t *b = tiny_shaped_peft(TINY_SHAPE(5, 4), TINY_SHAPE(12, 5), TINY_SHAPE(5, 6), TINY_SHAPE(4, 5));
    json_object_set_new(json_object_get(b, "config"), "r", json_integer(5));
    json_t *e = expect_code(b, "lora_rank_too_large", &first);
    assert_non_null(strstr(json_string_value(json_object_get(json_object_get(e, "error"), "hint")), "--max-rank"));
    json_decref(e);
    check(tiny_shaped_peft(TINY_SHAPE(2, 5), TINY_SHAPE(12, 2), TINY_SHAPE(2, 6), TINY_SHAPE(4, 2)), "lora_hidden_mismatch");
    check(tiny_shaped_peft(TINY_SHAPE(2, 4), TINY_SHAPE(16, 2), TINY_SHAPE(2, 6), TINY_SHAPE(4, 2)), "lora_intermediate_mismatch");
    check(tiny_shaped_peft(TINY_SHAPE(2, 4), TINY_SHAPE(13, 2), TINY_SHAPE(2, 6), TINY_SHAPE(4, 2)), "lora_extent_not_divisible");
    check(tiny_shaped_peft(TINY_SHAPE(2, 4), TINY_SHAPE(12, 3), TINY_SHAPE(2, 6), TINY_SHAPE(4, 2)), "lora_rank_mismatch");

    b = tiny_shaped_peft(TINY_SHAPE(2, 4), TINY_SHAPE(12, 2), TINY_SHAPE(2, 6), TINY_SHAPE(4, 2));
    json_object_del(json_object_get(b, "tensors"), P "down_proj.lora_B.weight");
    check(b, "lora_missing_tensor");

    b = tiny_shaped_peft(TINY_SHAPE(2, 4), TINY_SHAPE(12, 2), TINY_SHAPE(2, 6), TINY_SHAPE(4, 2));
    json_object_set_new(json_object_get(b, "tensors"), "optimizer.state", tiny_filled(TINY_SHAPE(2, 2), 0.5));
    check(b, "lora_unknown_tensor");

    b = tiny_shaped_peft(TINY_SHAPE(2, 4), TINY_SHAPE(12, 2), TINY_SHAPE(2, 6), TINY_SHAPE(4, 2));
    json_object_set_new(json_object_get(b, "tensors"), "model.layers.1.mlp.shared_experts.down_proj.lora_A.weight",
                        tiny_filled(TINY_SHAPE(2, 6), 0.5));
    json_object_set_new(json_object_get(b, "tensors"), "model.layers.1.mlp.shared_experts.down_proj.lora_B.weight",
                        tiny_filled(TINY_SHAPE(4, 2), 0.5));
    check(b, "lora_layer_out_of_range");

    json_t *t = json_object();
    json_object_set_new(t, "model.layers.0.self_attn.q_proj.lora_A.weight", tiny_filled(TINY_SHAPE(2, 4), 0.5));
    json_object_set_new(t, "model.layers.0.self_attn.q_proj.lora_B.weight", tiny_filled(TINY_SHAPE(4, 2), 0.5));
    check(json_pack("{s:s, s:o}", "name", "bad", "tensors", t), "lora_empty");

    b = tiny_shaped_peft(TINY_SHAPE(2, 4), TINY_SHAPE(12, 2), TINY_SHAPE(2, 6), TINY_SHAPE(4, 2));
    json_object_set_new(json_object_get(b, "config"), "r", json_integer(0));
    check(b, "adapter_config_invalid");
}

static void test_dtype_and_nonfinite(void **state) {
    (void)state;
    json_t *b = tiny_shaped_peft(TINY_SHAPE(2, 4), TINY_SHAPE(12, 2), TINY_SHAPE(2, 6), TINY_SHAPE(4, 2));
    int32_t ints[8] = {0};
    char *b64 = ls_base64_encode((const uint8_t *)ints, sizeof ints);
    json_object_set_new(json_object_get(b, "tensors"), P "gate_up_proj.lora_A.weight",
                        json_pack("{s:s, s:[i, i], s:s}", "dtype", "I32", "shape", 2, 4, "data", b64));
    free(b64);
    check(b, "lora_dtype_unsupported");

    b = tiny_shaped_peft(TINY_SHAPE(2, 4), TINY_SHAPE(12, 2), TINY_SHAPE(2, 6), TINY_SHAPE(4, 2));
    float vals[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    uint32_t nan_bits = 0x7fc00000u;
    memcpy(&vals[5], &nan_bits, 4);
    b64 = ls_base64_encode((const uint8_t *)vals, sizeof vals);
    json_object_set_new(json_object_get(b, "tensors"), P "gate_up_proj.lora_A.weight",
                        json_pack("{s:s, s:[i, i], s:s}", "dtype", "f32", "shape", 2, 4, "data", b64));
    free(b64);
    check(b, "lora_nonfinite");
}

static void test_every_violation_listed(void **state) {
    (void)state;
    /* a wrong hidden size and a rank too large at once: both reported */
    json_t *b = tiny_shaped_peft(TINY_SHAPE(5, 5), TINY_SHAPE(12, 5), TINY_SHAPE(5, 6), TINY_SHAPE(5, 5));
    json_t *e = tiny_post_json(&ts, "/adapters", b, 422);
    json_t *v = json_object_get(json_object_get(e, "error"), "violations");
    bool rank = false, hidden = false;
    for (size_t i = 0; i < json_array_size(v); i++) {
        const char *c = json_string_value(json_object_get(json_array_get(v, i), "code"));
        rank |= !strcmp(c, "lora_rank_too_large");
        hidden |= !strcmp(c, "lora_hidden_mismatch");
    }
    assert_true(json_array_size(v) >= 3); /* A's H, B's H, the rank */
    assert_true(rank && hidden);
    assert_string_equal(ls_test_error_code(e), json_string_value(json_object_get(json_array_get(v, 0), "code")));
    json_decref(e);
    json_decref(b);
}

/* Asserts that the reply's violations are exactly want[0..n) (code and
 * buffer, the name after the layer prefix), in that order. */
static void expect_violations(json_t *e, const char *const (*want)[2], size_t n) {
    json_t *v = json_object_get(json_object_get(e, "error"), "violations");
    if (json_array_size(v) != n) fprintf(stderr, "%s\n", json_dumps(e, 0));
    assert_int_equal(json_array_size(v), n);
    for (size_t i = 0; i < n; i++) {
        json_t *vi = json_array_get(v, i);
        assert_string_equal(json_string_value(json_object_get(vi, "code")), want[i][0]);
        char tensor[192];
        snprintf(tensor, sizeof tensor, P "%s", want[i][1]);
        assert_string_equal(json_string_value(json_object_get(vi, "tensor")), tensor);
        assert_int_equal(json_integer_value(json_object_get(vi, "layer")), 0);
    }
    assert_null(json_object_get(json_object_get(e, "error"), "violations_dropped"));
}

/* The audit's upload: a buffer that is not 4D used to hide every other
 * problem of its layer; all of them come back, the 2D one once. */
static void test_not_4d_reports_the_rest(void **state) {
    (void)state;
    json_t *first;
    json_t *e = expect_code(tiny_shaped_pool(TINY_SHAPE(1, 1, 4, 5), TINY_SHAPE(1, 2, 6, 2), TINY_SHAPE(1, 3, 2, 3), TINY_SHAPE(4, 2)), "lora_not_4d", &first);
    static const char *const pool_want[][2] = {
        {"lora_not_4d", "down_lora_b"},
        {"lora_expert_count_mismatch", "down_lora_a"},
        {"lora_hidden_mismatch", "gate_up_lora_a"},
    };
    expect_violations(e, pool_want, 3);
    assert_int_equal(json_integer_value(json_object_get(first, "expected")), 4);
    assert_int_equal(json_integer_value(json_object_get(first, "got")), 2);
    json_decref(e);

    /* PEFT: a factor that is not 2D does not hide the others either. */
    e = expect_code(tiny_shaped_peft(TINY_SHAPE(1, 2, 4), TINY_SHAPE(11, 2), TINY_SHAPE(2, 8), TINY_SHAPE(5, 2)), "invalid_shape", &first);
    static const char *const peft_want[][2] = {
        {"invalid_shape", "gate_up_proj.lora_A.weight"},
        {"lora_extent_not_divisible", "gate_up_proj.lora_B.weight"},
        {"lora_intermediate_mismatch", "down_proj.lora_A.weight"},
        {"lora_hidden_mismatch", "down_proj.lora_B.weight"},
    };
    expect_violations(e, peft_want, 4);
    json_decref(e);
}

static void test_hostile_corpus(void **state) {
    (void)state;
    char dir[1024];
    ls_test_data_path("hostile", dir, sizeof dir);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int seen = 0;
    struct dirent *de;
    char *before = tiny_state_snapshot(&ts);
    while ((de = readdir(d))) {
        if (!strstr(de->d_name, ".safetensors")) continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        static uint8_t buf[1 << 16];
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        ls_test_response r;
        assert_int_equal(ls_test_http(ts.srv, "POST", "/adapters?name=hostile", "application/octet-stream", buf, len,
                                      NULL, &r),
                         0);
        if (r.status != 422) fprintf(stderr, "%s -> %ld %s\n", de->d_name, r.status, r.body);
        assert_int_equal(r.status, 422);
        json_t *j = ls_test_response_json(&r);
        assert_string_equal(ls_test_error_code(j), "safetensors_invalid");
        json_decref(j);
        ls_test_response_free(&r);
        seen++;
    }
    closedir(d);
    assert_true(seen >= 25);
    char *after = tiny_state_snapshot(&ts);
    assert_string_equal(before, after);
    free(before);
    free(after);
    json_t *h = NULL;
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "GET", "/health", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    json_decref(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_format_codes),      cmocka_unit_test(test_rank_mismatch_seed_error),
        cmocka_unit_test(test_peft_codes),             cmocka_unit_test(test_dtype_and_nonfinite),
        cmocka_unit_test(test_every_violation_listed), cmocka_unit_test(test_not_4d_reports_the_rest),
        cmocka_unit_test(test_hostile_corpus),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
