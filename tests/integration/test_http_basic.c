/* The HTTP surface on the demo model: health, readiness, routing errors,
 * /forward in every encoding, and the errors docs/api.md names for bad forward
 * requests, with the server still serving after each. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/base64.h"
#include "format/safetensors.h"
#include "gpu/backend.h"
#include "gpu/cpu/cpu_backend.h"
#include "gpu/cuda/cuda_backend.h"
#include "tests/util/server_driver.h"

#define H 64
#define N 3

static ls_test_server *srv;

static int setup(void **state) {
    (void)state;
    const char *args[] = {"--demo", "--experts", "3", "--hidden", "64", "--intermediate", "32", "--layers", "2",
                          "--slots", "2", "--max-rank", "8", NULL};
    srv = ls_test_server_start(args);
    return srv ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    assert_int_equal(ls_test_server_stop(srv), 0); /* graceful shutdown exits 0 */
    return 0;
}

static json_t *request_json(const char *method, const char *path, const char *body, long want_status) {
    ls_test_response r;
    assert_int_equal(ls_test_http(srv, method, path, NULL, body, body ? strlen(body) : 0, NULL, &r), 0);
    if (r.status != want_status) fprintf(stderr, "%s %s -> %ld: %s\n", method, path, r.status, r.body);
    assert_int_equal(r.status, want_status);
    json_t *j = ls_test_response_json(&r);
    ls_test_response_free(&r);
    assert_non_null(j);
    return j;
}

static void expect_error(const char *method, const char *path, const char *body, long status, const char *code) {
    json_t *j = request_json(method, path, body, status);
    assert_string_equal(ls_test_error_code(j), code);
    json_t *e = json_object_get(j, "error");
    assert_int_equal(json_integer_value(json_object_get(e, "status")), status);
    assert_true(strlen(json_string_value(json_object_get(e, "message"))) > 0);
    assert_true(strlen(json_string_value(json_object_get(e, "hint"))) > 0);
    assert_true(json_is_array(json_object_get(e, "violations")));
    json_decref(j);
    /* the server keeps serving */
    j = request_json("GET", "/health", NULL, 200);
    json_decref(j);
}

static char *x_json(int T, int width) {
    json_t *x = json_array();
    for (int t = 0; t < T; t++) {
        json_t *row = json_array();
        for (int h = 0; h < width; h++) json_array_append_new(row, json_real(((t * 7 + h * 3) % 11 - 5) / 8.0));
        json_array_append_new(x, row);
    }
    char *s = json_dumps(x, JSON_COMPACT);
    json_decref(x);
    return s;
}

/* lorasink --probe, the image's health check: exit 0 with /ready's body
 * for a ready server, 1 saying why where none listens. */
static void test_probe(void **state) {
    (void)state;
    char port[16], out[4096];
    snprintf(port, sizeof port, "%d", ls_test_server_port(srv));
    const char *ask[] = {"--probe", "--port", port, NULL};
    assert_int_equal(ls_test_run_binary(ask, out, sizeof out), 0);
    assert_non_null(strstr(out, "\"status\":\"ready\""));
    const char *none[] = {"--probe", "--port", "1", NULL};
    assert_int_equal(ls_test_run_binary(none, out, sizeof out), 1);
    assert_non_null(strstr(out, "cannot connect to 127.0.0.1:1"));
}

static void test_health_ready(void **state) {
    (void)state;
    json_t *j = request_json("GET", "/health", NULL, 200);
    assert_string_equal(json_string_value(json_object_get(j, "status")), "ok");
    json_decref(j);
    j = request_json("GET", "/ready", NULL, 200);
    /* --device auto: CUDA where a device answers, else the CPU. */
    if (ls_backend_cuda_available()) {
        assert_string_equal(json_string_value(json_object_get(j, "backend")), "cuda");
        assert_null(json_object_get(j, "isa"));
        json_decref(j);
        return;
    }
    assert_string_equal(json_string_value(json_object_get(j, "backend")), "cpu");
    /* --cpu-isa auto: the widest path this CPU runs, named. */
    const char *want = ls_cpu_isa_supported(LS_CPU_ISA_AVX512) ? "avx512"
                       : ls_cpu_isa_supported(LS_CPU_ISA_AVX2) ? "avx2"
                                                               : "generic";
    assert_string_equal(json_string_value(json_object_get(j, "isa")), want);
    json_decref(j);
}

/* GET /model on the demo model: its dimensions, layers 0..L-1, no files. */
static void test_model_demo(void **state) {
    (void)state;
    json_t *j = request_json("GET", "/model", NULL, 200);
    assert_string_equal(json_string_value(json_object_get(j, "source")), "demo");
    assert_int_equal(json_integer_value(json_object_get(j, "n")), 3);
    assert_int_equal(json_integer_value(json_object_get(j, "hidden")), 64);
    assert_int_equal(json_integer_value(json_object_get(j, "intermediate")), 32);
    assert_int_equal(json_integer_value(json_object_get(j, "layers_total")), 2);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(j, "layers"), 1)), 1);
    assert_string_equal(json_string_value(json_object_get(j, "dtype")), "BF16");
    assert_int_equal(json_array_size(json_object_get(j, "files")), 0);
    assert_false(json_is_true(json_object_get(j, "gate")));
    json_decref(j);
    expect_error("POST", "/model", "{}", 405, "method_not_allowed");
}

static void test_routing_errors(void **state) {
    (void)state;
    expect_error("GET", "/nope", NULL, 404, "not_found");
    expect_error("POST", "/health", "{}", 405, "method_not_allowed");
    ls_test_response r;
    assert_int_equal(ls_test_http(srv, "PUT", "/forward", NULL, "{}", 2, NULL, &r), 0);
    assert_int_equal(r.status, 405);
    assert_non_null(strstr(r.headers, "Allow: POST"));
    ls_test_response_free(&r);
    assert_int_equal(ls_test_http(srv, "POST", "/forward", "text/html", "<p>", 3, NULL, &r), 0);
    assert_int_equal(r.status, 415);
    ls_test_response_free(&r);
}

static void test_forward_json(void **state) {
    (void)state;
    char *x = x_json(3, H);
    char body[8192];
    snprintf(body, sizeof body, "{\"layer\": 1, \"x\": %s}", x);
    json_t *j = request_json("POST", "/forward", body, 200);
    json_t *y = json_object_get(j, "y");
    assert_int_equal(json_array_size(y), 3);
    assert_int_equal(json_array_size(json_array_get(y, 0)), H);
    assert_int_equal(json_integer_value(json_object_get(j, "tokens")), 3);
    assert_int_equal(json_integer_value(json_object_get(j, "layer")), 1);
    assert_int_equal(json_array_size(json_object_get(j, "adapters")), 0);
    /* deterministic: the same request gives the same numbers, and the
     * output is not trivially zero */
    json_t *j2 = request_json("POST", "/forward", body, 200);
    assert_true(json_equal(y, json_object_get(j2, "y")));
    double norm = 0;
    for (size_t t = 0; t < 3; t++)
        for (size_t h = 0; h < H; h++) {
            double v = json_number_value(json_array_get(json_array_get(y, t), h));
            norm += v * v;
        }
    assert_true(norm > 1e-12);
    /* gammas scale each expert's contribution: all-zero gammas give zero */
    snprintf(body, sizeof body, "{\"layer\": 1, \"x\": %s, \"gammas\": [[0,0,0],[0,0,0],[0,0,0]]}", x);
    json_t *j3 = request_json("POST", "/forward", body, 200);
    for (size_t t = 0; t < 3; t++)
        for (size_t h = 0; h < H; h++)
            assert_true(json_number_value(json_array_get(json_array_get(json_object_get(j3, "y"), t), h)) == 0.0);
    json_decref(j);
    json_decref(j2);
    json_decref(j3);
    free(x);
}

static void test_forward_base64_and_safetensors(void **state) {
    (void)state;
    char *x = x_json(2, H);
    char body[8192];
    snprintf(body, sizeof body, "{\"x\": %s}", x);
    json_t *plain = request_json("POST", "/forward", body, 200);
    /* base64 in and out */
    float xv[2 * H];
    for (int t = 0; t < 2; t++)
        for (int h = 0; h < H; h++) xv[t * H + h] = (float)(((t * 7 + h * 3) % 11 - 5) / 8.0);
    char *b64 = ls_base64_encode((const uint8_t *)xv, sizeof xv);
    snprintf(body, sizeof body, "{\"x\": {\"dtype\": \"f32\", \"shape\": [2, %d], \"data\": \"%s\"}, "
             "\"encoding\": \"base64\"}", H, b64);
    free(b64);
    json_t *jb = request_json("POST", "/forward", body, 200);
    json_t *yb = json_object_get(jb, "y");
    assert_string_equal(json_string_value(json_object_get(yb, "dtype")), "f32");
    const char *yd = json_string_value(json_object_get(yb, "data"));
    uint8_t ybytes[2 * H * 4 + 8];
    size_t ylen = 0;
    assert_true(ls_base64_decode(yd, strlen(yd), ybytes, &ylen));
    assert_int_equal(ylen, 2 * H * 4);
    for (int i = 0; i < 2 * H; i++) {
        float v;
        memcpy(&v, ybytes + 4 * i, 4);
        assert_true((float)json_number_value(json_array_get(json_array_get(json_object_get(plain, "y"), i / H), i % H)) ==
                    v);
    }
    json_decref(jb);
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    ls_tensor tx = {.dtype = LS_DTYPE_F32, .ndim = 2, .shape = {2, H}, .data = xv, .nbytes = sizeof xv};
    assert_true(ls_tensor_set_add(&set, "x", &tx));
    uint8_t *st = NULL;
    size_t st_len = 0;
    assert_int_equal(ls_safetensors_write(&set, &st, &st_len, NULL), LS_OK);
    ls_tensor_set_free(&set);
    ls_test_response r;
    assert_int_equal(ls_test_http(srv, "POST", "/forward?layer=0", "application/octet-stream", st, st_len, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.content_type, "application/octet-stream");
    ls_tensor_set out;
    ls_tensor_set_init(&out);
    assert_int_equal(ls_safetensors_parse((uint8_t *)r.body, r.len, &out, NULL), LS_OK);
    const ls_tensor *ty = ls_tensor_set_find(&out, "y");
    assert_non_null(ty);
    assert_int_equal(ty->shape[0], 2);
    assert_int_equal(ty->shape[1], H);
    const float *yv = ty->data;
    for (int t = 0; t < 2; t++)
        for (int h = 0; h < H; h++)
            assert_true((float)json_number_value(json_array_get(json_array_get(json_object_get(plain, "y"), t), h)) ==
                        yv[t * H + h]);
    ls_tensor_set_free(&out);
    ls_test_response_free(&r);
    free(st);
    json_decref(plain);
    free(x);
}

static void test_forward_errors(void **state) {
    (void)state;
    expect_error("POST", "/forward", "{\"x\": [[1, 2", 400, "invalid_json");
    expect_error("POST", "/forward", "{\"x\": [[1, 2, 3]]}", 422, "invalid_shape");
    char *x = x_json(2, H);
    char body[8192];
    snprintf(body, sizeof body, "{\"layer\": 2, \"x\": %s}", x);
    expect_error("POST", "/forward", body, 400, "invalid_request");
    snprintf(body, sizeof body, "{\"layer\": -1, \"x\": %s}", x);
    expect_error("POST", "/forward", body, 400, "invalid_request");
    snprintf(body, sizeof body, "{\"x\": %s, \"gammas\": [[1, 1], [1, 1]]}", x);
    expect_error("POST", "/forward", body, 422, "invalid_shape");
    snprintf(body, sizeof body, "{\"x\": %s, \"gammas\": [[1, 1, 1]]}", x);
    expect_error("POST", "/forward", body, 422, "invalid_shape");
    snprintf(body, sizeof body, "{\"x\": %s, \"adapter\": \"nobody\"}", x);
    expect_error("POST", "/forward", body, 404, "adapter_not_found");
    snprintf(body, sizeof body, "{\"x\": %s, \"adapters\": [null, \"nobody\"]}", x);
    expect_error("POST", "/forward", body, 404, "adapter_not_found");
    snprintf(body, sizeof body, "{\"x\": %s, \"adapters\": [null]}", x);
    expect_error("POST", "/forward", body, 422, "invalid_shape");
    snprintf(body, sizeof body, "{\"x\": %s, \"gamma\": 1}", x);
    expect_error("POST", "/forward", body, 400, "invalid_request");
    expect_error("POST", "/forward", "[1, 2]", 400, "invalid_request");
    expect_error("POST", "/forward", "{\"x\": [[1, \"a\"]]}", 400, "invalid_request");
    expect_error("POST", "/forward", "{\"x\": []}", 422, "invalid_shape");
    free(x);
    /* Every refused forward was counted out again: none holds a batch. */
    assert_true(ls_test_wait_receiving(srv, 0));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_ready),
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_model_demo),
        cmocka_unit_test(test_routing_errors),
        cmocka_unit_test(test_forward_json),
        cmocka_unit_test(test_forward_base64_and_safetensors),
        cmocka_unit_test(test_forward_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
