/* Allocation failures on the way in of an adapter: an upload body parsed
 * (api/adapter_upload: JSON with base64 and nested-array tensors, JSON
 * naming a path, a raw safetensors body) and validated and normalised by
 * lora/loader, and adapters read by the loader from the adapter
 * directory (a PEFT directory, a bare .safetensors file). Every N fails
 * cleanly with LS_INTERNAL, leaves the caller's structures empty as
 * documented and gives every allocation back; the retry gives the very
 * adapter a run that never failed gives. The allocations jansson's parser
 * makes are not failed (fault_alloc.h: jansson 2.14 cannot fail them
 * cleanly); its other ones, and all of ours, are. */
#include <jansson.h>

#include "api/adapter_upload.h"
#include "api/base64.h"
#include "tests/fault/fault_fixture.h"
#include "tests/util/adapter_fixture.h"
#include "tests/util/testutil.h"

/* The adapter directory and the bodies, made once by the group setup. */
static char *up_dir;
static char *up_json_body;    /* inline tensors: base64 and nested arrays */
static char *up_pool_body;    /* inline pool-format tensors with a scale */
static char *up_path_body;    /* {"name", "path"} */
static uint8_t *up_raw_body;  /* bare.safetensors */
static size_t up_raw_len;

typedef enum { UP_JSON, UP_POOL_JSON, UP_PATH_JSON, UP_RAW, UP_PEFT_DIR, UP_BARE_FILE } up_way;

typedef struct {
    up_way way;
    ls_loader ld;
    ls_adapter_upload up;
    ls_adapter a;
    ls_adapter_origin origin;
} up_ctx;

static void *up_setup(void *arg) {
    up_ctx *c = calloc(1, sizeof *c);
    assert_non_null(c);
    c->way = (up_way)(intptr_t)arg;
    ls_pool_dims pd = {.slots = 3, .max_rank = FX_RMAX, .layout = LS_LORA_SHARED, .max_tokens = FX_TOKENS};
    ls_error err;
    ls_error_init(&err);
    if (ls_loader_open(&c->ld, up_dir, &fx_dims, &pd, &err) != LS_OK) fail_msg("loader: %s", err.message);
    ls_error_free(&err);
    return c;
}

static void up_teardown(void *ctx) {
    up_ctx *c = ctx;
    ls_adapter_upload_free(&c->up);
    ls_adapter_free(&c->a);
    ls_loader_close(&c->ld);
    free(c);
}

/* The raw body's query string: a name and a pin. */
static const char *up_query(void *ctx, const char *key) {
    (void)ctx;
    if (!strcmp(key, "name")) return "raw1";
    if (!strcmp(key, "pinned")) return "true";
    return NULL;
}

static bool up_zero(const void *p, size_t len) {
    const uint8_t *b = p;
    for (size_t i = 0; i < len; i++)
        if (b[i]) return false;
    return true;
}

/* Parse (for the uploads), then load: what POST /adapters does before it
 * reaches the pool. On failure both structures must come back empty. */
static ls_status up_op(void *ctx, ls_error *err) {
    up_ctx *c = ctx;
    ls_status st = LS_OK;
    ls_adapter_source src = {0};
    switch (c->way) {
    case UP_JSON:
        st = ls_adapter_upload_parse_json(up_json_body, strlen(up_json_body), false, true, &c->up, err);
        break;
    case UP_POOL_JSON:
        st = ls_adapter_upload_parse_json(up_pool_body, strlen(up_pool_body), false, true, &c->up, err);
        break;
    case UP_PATH_JSON:
        st = ls_adapter_upload_parse_json(up_path_body, strlen(up_path_body), false, true, &c->up, err);
        break;
    case UP_RAW:
        st = ls_adapter_upload_parse_raw(up_raw_body, up_raw_len, up_query, NULL, false, true, &c->up, err);
        break;
    case UP_PEFT_DIR:
        src.path = "peft1";
        break;
    case UP_BARE_FILE:
        src.path = "bare.safetensors";
        src.given.strict = false;
        break;
    }
    if (st != LS_OK) {
        if (!up_zero(&c->up, sizeof c->up)) fail_msg("a failed parse left the upload filled");
        return st;
    }
    if (c->way <= UP_RAW) src = ls_adapter_upload_source(&c->up);
    st = ls_loader_load(&c->ld, &src, &c->a, &c->origin, err);
    if (st != LS_OK) {
        if (!up_zero(&c->a, sizeof c->a)) fail_msg("a failed load left the adapter filled");
        if (c->origin.path[0]) fail_msg("a failed load left an origin");
        ls_adapter_upload_free(&c->up); /* as the handler does */
    }
    return st;
}

/* What the pool would be given: the upload's name and options, the
 * normalised factors and where they came from. */
static void up_outputs(void *ctx, fx_blob *out) {
    up_ctx *c = ctx;
    fx_blob_add(out, c->up.name, sizeof c->up.name);
    fx_blob_add(out, &c->up.pinned, sizeof c->up.pinned);
    fx_blob_add(out, &c->up.replace, sizeof c->up.replace);
    fx_blob_meta(out, &c->a.meta);
    fx_blob_add(out, &c->a.layers, sizeof c->a.layers);
    fx_blob_add(out, c->a.data, (size_t)c->a.layers * c->a.layer_floats * sizeof(float));
    fx_blob_add(out, c->a.layer_present, (size_t)c->a.layers * sizeof(bool));
    for (size_t i = 0; i < c->a.meta.n_ignored; i++) fx_blob_add(out, c->a.ignored[i], strlen(c->a.ignored[i]) + 1);
    fx_blob_add(out, c->origin.path, sizeof c->origin.path);
    fx_blob_params(out, &c->origin.params);
}

/* The retry starts from empty structures, as a new request would. */
static ls_status up_retry(void *ctx, ls_error *err) {
    up_ctx *c = ctx;
    ls_adapter_upload_free(&c->up);
    ls_adapter_free(&c->a);
    return up_op(ctx, err);
}

static void up_sweep(const char *what, up_way way) {
    fx_case c = {.what = what,
                 .setup = up_setup,
                 .arg = (void *)(intptr_t)way,
                 .op = up_op,
                 .retry = up_retry,
                 .outputs = up_outputs,
                 .teardown = up_teardown};
    fx_sweep(&c, FX_ALLOC);
}

static void test_upload_json_inline(void **state) {
    (void)state;
    up_sweep("upload: JSON, base64 + nested tensors", UP_JSON);
}

static void test_upload_json_pool_format(void **state) {
    (void)state;
    up_sweep("upload: JSON, pool format with scale", UP_POOL_JSON);
}

static void test_upload_json_path(void **state) {
    (void)state;
    up_sweep("upload: JSON naming a PEFT directory", UP_PATH_JSON);
}

static void test_upload_raw(void **state) {
    (void)state;
    up_sweep("upload: raw safetensors body", UP_RAW);
}

static void test_loader_peft_dir(void **state) {
    (void)state;
    up_sweep("loader: PEFT directory", UP_PEFT_DIR);
}

static void test_loader_bare_file(void **state) {
    (void)state;
    up_sweep("loader: bare .safetensors file", UP_BARE_FILE);
}

/* ---- the bodies ------------------------------------------------------------------- */

/* {"dtype": "f32", "shape": [...], "data": base64} of t. */
static json_t *up_b64_tensor(const ls_tensor *t) {
    char *b64 = ls_base64_encode(t->data, t->nbytes);
    assert_non_null(b64);
    json_t *shape = json_array();
    for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
    json_t *j = json_pack("{s:s, s:o, s:s}", "dtype", "f32", "shape", shape, "data", b64);
    free(b64);
    assert_non_null(j);
    return j;
}

/* Nested arrays of t's values from axis d on; *v walks the values. */
static json_t *up_nested_from(const ls_tensor *t, int d, const float **v) {
    json_t *a = json_array();
    for (int64_t i = 0; i < t->shape[d]; i++)
        json_array_append_new(a, d + 1 == t->ndim ? json_real(*(*v)++) : up_nested_from(t, d + 1, v));
    return a;
}

static json_t *up_nested_tensor(const ls_tensor *t) {
    const float *v = t->data;
    return up_nested_from(t, 0, &v);
}

static char *up_body(json_t *root) {
    char *s = json_dumps(root, JSON_COMPACT);
    assert_non_null(s);
    json_decref(root);
    return s;
}

static void up_make_bodies(void) {
    ls_tensor_set s;
    fx_peft_tensors(&s);
    json_t *tensors = json_object();
    for (size_t i = 0; i < s.n; i++)
        json_object_set_new(tensors, s.items[i].name,
                            i % 3 == 1 ? up_nested_tensor(&s.items[i].t) : up_b64_tensor(&s.items[i].t));
    up_json_body = up_body(json_pack("{s:s, s:s, s:{s:i, s:f}, s:o, s:b}", "name", "json1", "format", "peft",
                                     "config", "r", 2, "lora_alpha", 4.0, "tensors", tensors, "replace", 1));
    ls_tensor_set_free(&s);

    ls_tensor_set_init(&s);
    for (int l = 0; l < fx_dims.L; l++) tu_add_pool_layer(&s, &fx_dims, l, 1, 3, 0);
    tensors = json_object();
    for (size_t i = 0; i < s.n; i++)
        json_object_set_new(tensors, s.items[i].name,
                            i % 2 ? up_nested_tensor(&s.items[i].t) : up_b64_tensor(&s.items[i].t));
    up_pool_body = up_body(json_pack("{s:s, s:s, s:o, s:f, s:b}", "name", "pool1", "format", "pool", "tensors",
                                     tensors, "scale", 0.5, "pinned", 1));
    ls_tensor_set_free(&s);

    up_path_body = up_body(json_pack("{s:s, s:s, s:{s:i, s:f}}", "name", "path1", "path", "peft1", "config", "r", 2,
                                     "lora_alpha", 8.0));

    char path[1024];
    snprintf(path, sizeof path, "%s/bare.safetensors", up_dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    up_raw_len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    up_raw_body = malloc(up_raw_len);
    assert_non_null(up_raw_body);
    assert_int_equal(fread(up_raw_body, 1, up_raw_len, f), up_raw_len);
    fclose(f);
}

static int up_group_setup(void **state) {
    (void)state;
    up_dir = ls_test_mkdtemp();
    assert_non_null(up_dir);
    fx_write_adapter_dir(up_dir);
    up_make_bodies();
    return 0;
}

static int up_group_teardown(void **state) {
    (void)state;
    ls_test_rmtree(up_dir);
    free(up_dir);
    free(up_json_body);
    free(up_pool_body);
    free(up_path_body);
    free(up_raw_body);
    return 0;
}

int main(void) {
    fx_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_upload_json_inline), cmocka_unit_test(test_upload_json_pool_format),
        cmocka_unit_test(test_upload_json_path),   cmocka_unit_test(test_upload_raw),
        cmocka_unit_test(test_loader_peft_dir),    cmocka_unit_test(test_loader_bare_file),
    };
    return cmocka_run_group_tests(tests, up_group_setup, up_group_teardown);
}
