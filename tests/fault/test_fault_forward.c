/* Allocation failures while a /forward body is read (api/forward_json):
 * x and gammas as base64 tensor objects (read key by key, their small
 * values parsed by jansson) and as nested arrays. Every N fails cleanly
 * with LS_INTERNAL, leaves the request empty and gives every allocation
 * back; the retry reads the same request. jansson's parser is failed
 * too here (fa_fail_parser): the values it parses, such as "[1,8]", are
 * too short to meet its lexer's mishandled failure, and a failure it
 * reports as an unknown error must still be out of memory, not a
 * malformed body. */
#include "api/base64.h"
#include "api/forward.h"
#include "common/buf.h"
#include "tests/fault/fault_fixture.h"

static char *fw_bodies[3];

typedef struct {
    const char *body;
    ls_forward_req req;
} fw_ctx;

static void *fw_setup(void *arg) {
    fw_ctx *c = calloc(1, sizeof *c);
    assert_non_null(c);
    c->body = arg;
    return c;
}

static void fw_teardown(void *ctx) {
    fw_ctx *c = ctx;
    ls_forward_req_free(&c->req);
    free(c);
}

static ls_status fw_op(void *ctx, ls_error *err) {
    fw_ctx *c = ctx;
    ls_forward_req_free(&c->req);
    ls_status st = ls_forward_req_parse_json(c->body, strlen(c->body), &fx_dims, FX_TOKENS, &c->req, err);
    static const ls_forward_req empty;
    if (st != LS_OK && memcmp(&c->req, &empty, sizeof empty)) fail_msg("a failed parse left the request filled");
    return st;
}

static void fw_outputs(void *ctx, fx_blob *out) {
    fw_ctx *c = ctx;
    const ls_forward_req *r = &c->req;
    fx_blob_add(out, &r->layer, sizeof r->layer);
    fx_blob_add(out, &r->T, sizeof r->T);
    fx_blob_add(out, &r->base64, sizeof r->base64);
    fx_blob_add(out, r->x, (size_t)r->T * (size_t)fx_dims.H * sizeof(float));
    if (r->gammas) fx_blob_add(out, r->gammas, (size_t)r->T * (size_t)fx_dims.n * sizeof(float));
    const ls_token_names *tn = &r->names;
    for (int t = 0; tn->of_token && t < r->T; t++) {
        const char *name = tn->of_token[t] >= 0 ? tn->names[tn->of_token[t]] : "";
        fx_blob_add(out, name, strlen(name) + 1);
    }
}

static void fw_sweep(const char *what, int body) {
    fx_case c = {.what = what, .setup = fw_setup, .arg = fw_bodies[body], .op = fw_op,
                 .outputs = fw_outputs, .teardown = fw_teardown};
    fa_fail_parser(true);
    fx_sweep(&c, FX_ALLOC);
    fa_fail_parser(false);
}

static void test_forward_base64(void **state) {
    (void)state;
    fw_sweep("forward body: base64 x and gammas, one adapter", 0);
}

static void test_forward_base64_names(void **state) {
    (void)state;
    fw_sweep("forward body: base64 x, adapters per token, base64 reply", 1);
}

static void test_forward_nested(void **state) {
    (void)state;
    fw_sweep("forward body: nested x and gammas", 2);
}

static int fw_group_setup(void **state) {
    (void)state;
    const int T = 2, H = fx_dims.H, n = fx_dims.n;
    float x[2 * 8], g[2 * 2];
    assert_true(H <= 8 && n <= 2);
    for (int i = 0; i < T * H; i++) x[i] = (float)(i % 7) * 0.25f - 0.5f;
    for (int i = 0; i < T * n; i++) g[i] = 1.0f - 0.125f * (float)i;
    char *xb = ls_base64_encode((const uint8_t *)x, sizeof(float) * (size_t)(T * H));
    char *gb = ls_base64_encode((const uint8_t *)g, sizeof(float) * (size_t)(T * n));
    assert_true(xb && gb);
    char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"layer\": 1, \"x\": {\"dtype\": \"f32\", \"shape\": [%d, %d], \"data\": \"%s\"}, "
             "\"gammas\": {\"shape\": [%d, %d], \"data\": \"%s\", \"dtype\": \"f32\"}, \"adapter\": \"a1\"}",
             T, H, xb, T, n, gb);
    fw_bodies[0] = strdup(buf);
    snprintf(buf, sizeof buf,
             "{\"x\": {\"dtype\": \"f32\", \"shape\": [%d, %d], \"data\": \"%s\"}, \"adapters\": [\"a1\", null], "
             "\"encoding\": \"base64\"}",
             T, H, xb);
    fw_bodies[1] = strdup(buf);
    ls_buf b;
    ls_buf_init(&b);
    ls_buf_printf(&b, "{\"x\": [");
    for (int t = 0; t < T; t++) {
        ls_buf_printf(&b, "%s[", t ? ", " : "");
        for (int h = 0; h < H; h++) ls_buf_printf(&b, "%s%.9g", h ? ", " : "", (double)x[t * H + h]);
        ls_buf_printf(&b, "]");
    }
    ls_buf_printf(&b, "], \"gammas\": [[1, 0.5], [0.25, 2]]}");
    fw_bodies[2] = ls_buf_take(&b, NULL);
    free(xb);
    free(gb);
    for (int i = 0; i < 3; i++) assert_non_null(fw_bodies[i]);
    return 0;
}

static int fw_group_teardown(void **state) {
    (void)state;
    for (int i = 0; i < 3; i++) free(fw_bodies[i]);
    return 0;
}

int main(void) {
    fx_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_base64),
        cmocka_unit_test(test_forward_base64_names),
        cmocka_unit_test(test_forward_nested),
    };
    return cmocka_run_group_tests(tests, fw_group_setup, fw_group_teardown);
}
