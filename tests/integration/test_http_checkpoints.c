/* Hugging Face checkpoint directories served over HTTP, one per family in
 * its real layout (tests/util/ckpt_writer.h: config.json with the
 * family's keys, sharded with an index or one model.safetensors, the
 * vision-language prefixes, decoys beside the shared experts). For each:
 * GET /model says what was loaded; forwards on every layer with shared
 * experts match the tests' fp64 reference within 2e-5 (f32 weights), the
 * gate applied without gammas and replaced by them; a dense layer and one
 * past the model are 400 naming the layers served; GET /pool lists the
 * checkpoint's numbers. On the DeepSeek layout an adapter in today's
 * fused PEFT names (model.layers.{l}.mlp.shared_experts.gate_up_proj)
 * matches the reference, and factors on a dense layer are 422. Also bf16
 * and FP8 block-quantized checkpoints, the index file as --weights, a
 * separate-projection adapter of a wider model: 422, every factor named;
 * and a Git LFS pointer for weights, refused at start-up saying so. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/text.h"
#include "tests/util/ckpt_writer.h"
#include "tests/util/reference.h"
#include "tests/util/server_driver.h"

#define TOL 2e-5

typedef struct {
    ck_spec spec;
    ck_model m;
    char *dir;
    ls_test_server *s;
} served;

/* Writes the checkpoint and starts a server on it (weights path: the
 * directory, or the index itself when index is set). */
static void serve(served *sv, const ck_spec *spec, bool index) {
    memset(sv, 0, sizeof *sv);
    sv->spec = *spec;
    sv->dir = ls_test_mkdtemp();
    ck_write(sv->dir, spec, &sv->m);
    char path[4200];
    snprintf(path, sizeof path, "%s%s", sv->dir, index ? "/model.safetensors.index.json" : "");
    const char *args[] = {"--weights", path, "--slots", "2", "--max-rank", "8", NULL};
    sv->s = ls_test_server_start(args);
    assert_non_null(sv->s);
}

static void unserve(served *sv) {
    assert_int_equal(ls_test_server_stop(sv->s), 0);
    ck_model_free(&sv->m);
    ls_test_rmtree(sv->dir);
    free(sv->dir);
}

/* A JSON request; returns the parsed body (the caller decrefs) and the status. */
static json_t *call(const served *sv, const char *method, const char *path, json_t *body, long *status) {
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    ls_test_response r;
    assert_int_equal(ls_test_http(sv->s, method, path, NULL, text, text ? strlen(text) : 0, NULL, &r), 0);
    *status = r.status;
    json_t *j = ls_test_response_json(&r);
    if (!j) fprintf(stderr, "%s %s: %ld %s\n", method, path, r.status, r.body);
    assert_non_null(j);
    ls_test_response_free(&r);
    free(text);
    json_decref(body);
    return j;
}

/* Nested JSON rows of v [rows, cols]. */
static json_t *rows_of(const double *v, int rows, int cols) {
    json_t *a = json_array();
    for (int i = 0; i < rows; i++) {
        json_t *r = json_array();
        for (int j = 0; j < cols; j++) json_array_append_new(r, json_real(v[(size_t)i * cols + j]));
        json_array_append_new(a, r);
    }
    return a;
}

/* Values drawn in [-scale, scale], rounded to float. */
static double *draw(size_t count, double scale, unsigned long long *st) {
    double *v = ls_test_calloc(count, sizeof *v);
    ls_ref_fill_uniform(v, (long)count, scale, st);
    for (size_t i = 0; i < count; i++) v[i] = (float)v[i];
    return v;
}

/* ---- GET /model and /pool ------------------------------------------------ */

static void check_ids(const json_t *arr, const ck_model *m) {
    assert_true(json_is_array(arr));
    assert_int_equal(json_array_size(arr), m->L);
    for (int i = 0; i < m->L; i++) assert_int_equal(json_integer_value(json_array_get(arr, (size_t)i)), m->ids[i]);
}

static void check_model(const served *sv, const char *dtype) {
    long st;
    json_t *j = call(sv, "GET", "/model", NULL, &st);
    assert_int_equal(st, 200);
    assert_string_equal(json_string_value(json_object_get(j, "source")), "checkpoint");
    assert_string_equal(json_string_value(json_object_get(j, "family")), sv->m.family);
    assert_string_equal(json_string_value(json_object_get(j, "model_type")), sv->m.model_type);
    assert_int_equal(json_integer_value(json_object_get(j, "n")), 1);
    assert_int_equal(json_integer_value(json_object_get(j, "hidden")), sv->spec.H);
    assert_int_equal(json_integer_value(json_object_get(j, "intermediate")), sv->spec.F);
    assert_int_equal(json_integer_value(json_object_get(j, "layers_total")), sv->m.layers_total);
    check_ids(json_object_get(j, "layers"), &sv->m);
    assert_string_equal(json_string_value(json_object_get(j, "dtype")), dtype);
    assert_int_equal(json_is_true(json_object_get(j, "gate")), sv->m.gate);
    assert_int_equal(json_is_true(json_object_get(j, "fp8_dequantized")), sv->spec.fp8);
    assert_int_equal(json_integer_value(json_object_get(j, "bytes")), (json_int_t)sv->m.shared_bytes);
    /* config.json, the index when sharded, and the files read (no more
     * than were written: only those holding shared experts) */
    const json_t *files = json_object_get(j, "files");
    assert_string_equal(json_string_value(json_array_get(files, 0)), "config.json");
    const size_t extra = sv->spec.shards ? 2 : 1;
    assert_true(json_array_size(files) > extra - 1 && json_array_size(files) <= extra + (size_t)sv->m.n_files);
    json_decref(j);
    j = call(sv, "GET", "/pool", NULL, &st);
    assert_int_equal(st, 200);
    check_ids(json_object_get(json_object_get(j, "capacity"), "layer_ids"), &sv->m);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "capacity"), "layers")), sv->m.L);
    json_decref(j);
}

/* ---- forwards ----------------------------------------------------------------- */

/* One adapter's factors on one layer, scale folded in (ls_ref_lora). */
typedef struct {
    int r;
    double *a_gu, *b_gu, *a_d, *b_d; /* [r, H], [2F, r], [r, F], [H, r] as uploaded */
    double s;
    ls_ref_lora ref;
    double *gu_a, *gu_b, *d_b; /* the reference's: A twice, s * B */
} lora_layer;

/* y of a forward (layer id, T tokens of x, gammas or NULL) against the
 * reference; lora NULL is the base model. */
static void check_forward(const served *sv, int id, int T, const double *x, const double *g, const lora_layer *lora,
                          const char *adapter) {
    const int H = sv->spec.H, F = sv->spec.F;
    int i = -1;
    for (int k = 0; k < sv->m.L; k++)
        if (sv->m.ids[k] == id) i = k;
    assert_true(i >= 0);
    json_t *req = json_pack("{s:i, s:o}", "layer", id, "x", rows_of(x, T, H));
    if (g) json_object_set_new(req, "gammas", rows_of(g, T, 1));
    if (adapter) json_object_set_new(req, "adapter", json_string(adapter));
    long st;
    json_t *j = call(sv, "POST", "/forward", req, &st);
    if (st != 200) fprintf(stderr, "%s\n", json_dumps(j, 0));
    assert_int_equal(st, 200);
    assert_int_equal(json_integer_value(json_object_get(j, "layer")), id);
    long cnt;
    double *y = ls_test_json_doubles(json_object_get(j, "y"), &cnt);
    assert_int_equal(cnt, (long)T * H);
    /* Without gammas a gated model's gamma is sigmoid(gate . x). */
    double *gam = ls_test_calloc((size_t)T, sizeof(double));
    for (int t = 0; t < T; t++) {
        double z = 0;
        for (int h = 0; sv->m.gate && h < H; h++) z += x[(size_t)t * H + h] * sv->m.gatew[i][h];
        gam[t] = g ? g[t] : sv->m.gate ? 1.0 / (1.0 + exp(-z)) : 1.0;
    }
    const ls_ref_lora **lot = ls_test_calloc((size_t)T, sizeof *lot);
    for (int t = 0; t < T; t++) lot[t] = lora ? &lora->ref : NULL;
    ls_dims d = {.n = 1, .H = H, .F = F, .L = sv->m.L, .w13_layout = LS_W13_CONTIGUOUS};
    double *ref = ls_test_calloc((size_t)T * H, sizeof(double));
    ls_ref_forward(&d, sv->m.w13[i], sv->m.w2[i], T, x, gam, lot, ref);
    const double rel = ls_ref_rel_err_d(y, ref, cnt);
    printf("%s layer %d T=%d %s%s: relative error %.3g\n", sv->m.model_type, id, T, g ? "gammas" : "no gammas",
           adapter ? " adapter" : "", rel);
    assert_true(rel <= TOL);
    if (sv->m.gate && !g) { /* the gate does something: ones would not match */
        for (int t = 0; t < T; t++) gam[t] = 1.0;
        ls_ref_forward(&d, sv->m.w13[i], sv->m.w2[i], T, x, gam, lot, ref);
        assert_true(ls_ref_rel_err_d(y, ref, cnt) > 1e-3);
    }
    free(ref);
    free(lot);
    free(gam);
    free(y);
    json_decref(j);
}

/* A forward on a layer that is not served: 400 that says why. */
static void check_refused(const served *sv, int id, const char *why) {
    double x[64] = {0};
    json_t *req = json_pack("{s:i, s:o}", "layer", id, "x", rows_of(x, 1, sv->spec.H));
    long st;
    json_t *j = call(sv, "POST", "/forward", req, &st);
    assert_int_equal(st, 400);
    assert_string_equal(ls_test_error_code(j), "invalid_request");
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    printf("layer %d: %s\n", id, msg);
    assert_non_null(strstr(msg, why));
    char first[16];
    snprintf(first, sizeof first, "%d", sv->m.ids[0]);
    assert_non_null(strstr(msg, first)); /* names the layers served */
    json_decref(j);
}

static void check_family(ck_family f, int shards, unsigned long long seed) {
    ck_spec spec = {.family = f, .H = 48, .F = 32, .dtype = LS_DTYPE_F32, .shards = shards, .seed = seed};
    served sv;
    serve(&sv, &spec, false);
    check_model(&sv, "F32");
    unsigned long long st = seed + 1;
    for (int k = 0; k < sv.m.L; k++) {
        double *x = draw((size_t)5 * spec.H, 1.0, &st), *g = draw(5, 1.0, &st);
        check_forward(&sv, sv.m.ids[k], 5, x, NULL, NULL, NULL);
        check_forward(&sv, sv.m.ids[k], 5, x, g, NULL, NULL);
        free(x);
        free(g);
    }
    if (sv.m.dense >= 0) check_refused(&sv, sv.m.dense, "dense");
    check_refused(&sv, sv.m.layers_total + 3, "out of range");
    unserve(&sv);
}

static void test_deepseek_family(void **state) {
    (void)state;
    check_family(CK_DEEPSEEK_V3, 3, 101);
    check_family(CK_KIMI_K2, 0, 102);
    check_family(CK_DEEPSEEK_V2, 2, 103);
    check_family(CK_GLM4_MOE, 1, 104);
    check_family(CK_DOTS1, 0, 105);
    check_family(CK_ERNIE4_5_MOE, 4, 106);
    check_family(CK_BAILING_MOE, 2, 107);
}

static void test_qwen_family(void **state) {
    (void)state;
    check_family(CK_QWEN2_MOE, 3, 201);
    check_family(CK_QWEN3_NEXT, 0, 202);
    check_family(CK_QWEN3_5_MOE, 2, 203);
}

static void test_llama4(void **state) {
    (void)state;
    check_family(CK_LLAMA4, 2, 301);
}

/* Granite 4's shared MLP: one fused input_linear, beside a MoE block
 * whose experts' fused input_linear is not served. */
static void test_granite(void **state) {
    (void)state;
    check_family(CK_GRANITEMOEHYBRID, 2, 311);
}

/* bf16 weights stay bf16; FP8 blocks are served as bf16. The index file
 * itself may be the --weights path. */
static void test_bf16_fp8_and_index_path(void **state) {
    (void)state;
    const ck_spec specs[] = {
        {.family = CK_DEEPSEEK_V3, .H = 48, .F = 32, .dtype = LS_DTYPE_BF16, .shards = 2, .seed = 401},
        {.family = CK_DEEPSEEK_V3, .H = 64, .F = 48, .dtype = LS_DTYPE_BF16, .shards = 3, .fp8 = true,
         .fp8_block = {16, 32}, .seed = 402},
        {.family = CK_QWEN2_MOE, .H = 48, .F = 32, .dtype = LS_DTYPE_F16, .shards = 1, .seed = 403},
    };
    const char *dtypes[] = {"BF16", "BF16", "F16"};
    for (size_t c = 0; c < sizeof specs / sizeof *specs; c++) {
        served sv;
        serve(&sv, &specs[c], c == 2);
        check_model(&sv, dtypes[c]);
        unsigned long long st = specs[c].seed;
        double *x = draw((size_t)9 * specs[c].H, 1.0, &st);
        for (int k = 0; k < sv.m.L; k++) check_forward(&sv, sv.m.ids[k], 9, x, NULL, NULL, NULL);
        free(x);
        unserve(&sv);
    }
}

/* ---- adapters in today's fused PEFT names ------------------------------------ */

static void lora_make(lora_layer *lz, int r, double s, int H, int F, unsigned long long *st) {
    lz->r = r;
    lz->s = s;
    lz->a_gu = draw((size_t)r * H, 0.5, st);
    lz->b_gu = draw((size_t)2 * F * r, 0.5, st);
    lz->a_d = draw((size_t)r * F, 0.5, st);
    lz->b_d = draw((size_t)H * r, 0.5, st);
    lz->gu_a = ls_test_calloc((size_t)2 * r * H, sizeof(double));
    lz->gu_b = ls_test_calloc((size_t)2 * F * r, sizeof(double));
    lz->d_b = ls_test_calloc((size_t)H * r, sizeof(double));
    for (size_t i = 0; i < (size_t)r * H; i++) lz->gu_a[i] = lz->gu_a[(size_t)r * H + i] = lz->a_gu[i];
    for (size_t i = 0; i < (size_t)2 * F * r; i++) lz->gu_b[i] = s * lz->b_gu[i];
    for (size_t i = 0; i < (size_t)H * r; i++) lz->d_b[i] = s * lz->b_d[i];
    lz->ref = (ls_ref_lora){r, 1, lz->gu_a, lz->gu_b, lz->a_d, lz->d_b};
}

static void lora_free(lora_layer *lz) {
    free(lz->a_gu), free(lz->b_gu), free(lz->a_d), free(lz->b_d);
    free(lz->gu_a), free(lz->gu_b), free(lz->d_b);
}

/* The four fused factors of layer id into tensors. */
static void lora_put(json_t *tensors, int id, const lora_layer *lz, int H, int F) {
    char name[160];
    const char *p = "model.layers.%d.mlp.shared_experts.%s";
    snprintf(name, sizeof name, p, id, "gate_up_proj.lora_A.weight");
    json_object_set_new(tensors, name, rows_of(lz->a_gu, lz->r, H));
    snprintf(name, sizeof name, p, id, "gate_up_proj.lora_B.weight");
    json_object_set_new(tensors, name, rows_of(lz->b_gu, 2 * F, lz->r));
    snprintf(name, sizeof name, p, id, "down_proj.lora_A.weight");
    json_object_set_new(tensors, name, rows_of(lz->a_d, lz->r, F));
    snprintf(name, sizeof name, p, id, "down_proj.lora_B.weight");
    json_object_set_new(tensors, name, rows_of(lz->b_d, H, lz->r));
}

static json_t *upload(const char *name, int r, json_t *tensors) {
    return json_pack("{s:s, s:s, s:{s:i, s:i}, s:o}", "name", name, "format", "peft", "config", "r", r, "lora_alpha",
                     2 * r, "tensors", tensors);
}

static void test_fused_adapter_on_deepseek(void **state) {
    (void)state;
    ck_spec spec = {.family = CK_DEEPSEEK_V3, .H = 48, .F = 32, .dtype = LS_DTYPE_F32, .shards = 2, .seed = 501};
    served sv;
    serve(&sv, &spec, false);
    const int H = spec.H, F = spec.F, r = 3;
    unsigned long long st = 502;
    lora_layer l2, l3;
    lora_make(&l2, r, 2.0, H, F, &st);
    lora_make(&l3, r, 2.0, H, F, &st);
    /* factors on layers 2 and 3 (the checkpoint's numbers; served as 1 and 2) */
    json_t *t = json_object();
    lora_put(t, 2, &l2, H, F);
    lora_put(t, 3, &l3, H, F);
    long code;
    json_t *j = call(&sv, "POST", "/adapters", upload("ds", r, t), &code);
    assert_int_equal(code, 201);
    json_decref(j);
    double *x = draw((size_t)6 * H, 1.0, &st);
    check_forward(&sv, 2, 6, x, NULL, &l2, "ds");
    check_forward(&sv, 3, 6, x, NULL, &l3, "ds");
    check_forward(&sv, 1, 6, x, NULL, NULL, "ds"); /* no factors on layer 1: no delta */

    /* a factor on the dense layer 0: 422, naming the tensor and why */
    t = json_object();
    lora_put(t, 0, &l2, H, F);
    lora_put(t, 2, &l2, H, F);
    j = call(&sv, "POST", "/adapters/validate", upload("dense", r, t), &code);
    assert_int_equal(code, 422);
    assert_string_equal(ls_test_error_code(j), "lora_layer_out_of_range");
    const json_t *v = json_array_get(json_object_get(json_object_get(j, "error"), "violations"), 0);
    assert_int_equal(json_integer_value(json_object_get(v, "layer")), 0);
    assert_non_null(strstr(json_string_value(json_object_get(v, "tensor")), "model.layers.0."));
    assert_non_null(strstr(json_string_value(json_object_get(v, "message")), "dense"));
    assert_non_null(strstr(json_string_value(json_object_get(v, "message")), "1-3"));
    /* A dense layer is under the layer count: no limit to name as expected. */
    assert_null(json_object_get(v, "expected"));
    assert_int_equal(json_integer_value(json_object_get(v, "got")), 0);
    json_decref(j);

    /* a violation of a served layer names it by the checkpoint's number */
    t = json_object();
    lora_put(t, 3, &l3, H, F);
    json_object_set_new(t, "model.layers.3.mlp.shared_experts.down_proj.lora_B.weight", rows_of(l3.b_d, H - 1, r));
    j = call(&sv, "POST", "/adapters/validate", upload("shape", r, t), &code);
    assert_int_equal(code, 422);
    v = json_array_get(json_object_get(json_object_get(j, "error"), "violations"), 0);
    printf("%s\n", json_string_value(json_object_get(v, "message")));
    assert_int_equal(json_integer_value(json_object_get(v, "layer")), 3);
    assert_true(!strncmp(json_string_value(json_object_get(v, "message")), "layer 3: ", 9));
    json_decref(j);

    /* a pool-format buffer missing on layer 3 is named as layer 3's */
    double a[2 * 3 * 48];
    memset(a, 0, sizeof a);
    json_t *one = json_pack("[[o]]", rows_of(a, 2 * r, H));
    j = call(&sv, "POST", "/adapters/validate",
             json_pack("{s:s, s:{s:o}}", "format", "pool", "tensors", "model.layers.3.mlp.shared_experts.gate_up_lora_a",
                       one),
             &code);
    assert_int_equal(code, 422);
    assert_string_equal(ls_test_error_code(j), "lora_missing_tensor");
    v = json_array_get(json_object_get(json_object_get(j, "error"), "violations"), 0);
    printf("%s\n", json_string_value(json_object_get(v, "message")));
    assert_int_equal(json_integer_value(json_object_get(v, "layer")), 3);
    assert_non_null(strstr(json_string_value(json_object_get(v, "tensor")), "model.layers.3."));
    json_decref(j);
    free(x);
    lora_free(&l2);
    lora_free(&l3);
    unserve(&sv);
}

/* An adapter that trains no shared expert (attention only): 422
 * lora_empty naming a module it trains, the hint giving the LoraConfig
 * keys that reach this family's shared experts. */
static void check_empty(ck_family f, const char *targets, unsigned long long seed) {
    ck_spec spec = {.family = f, .H = 16, .F = 8, .dtype = LS_DTYPE_F32, .shards = 0, .seed = seed};
    served sv;
    serve(&sv, &spec, false);
    unsigned long long st = seed;
    double *v = draw(2 * 16, 0.5, &st);
    char name[200];
    json_t *t = json_object();
    snprintf(name, sizeof name, "base_model.model.%s%d.self_attn.q_proj.lora_A.weight", sv.m.prefix, sv.m.ids[0]);
    json_object_set_new(t, name, rows_of(v, 2, 16));
    snprintf(name, sizeof name, "base_model.model.%s%d.self_attn.q_proj.lora_B.weight", sv.m.prefix, sv.m.ids[0]);
    json_object_set_new(t, name, rows_of(v, 16, 2));
    long code;
    json_t *j = call(&sv, "POST", "/adapters", upload("attn", 2, t), &code);
    const json_t *e = json_object_get(j, "error");
    const char *msg = json_string_value(json_object_get(e, "message")), *hint = json_string_value(json_object_get(e, "hint"));
    printf("%s: %s; hint: %s\n", sv.m.model_type, msg, hint);
    assert_int_equal(code, 422);
    assert_string_equal(ls_test_error_code(j), "lora_empty");
    assert_non_null(strstr(msg, "self_attn.q_proj"));
    assert_non_null(strstr(hint, targets));
    json_decref(j);
    free(v);
    unserve(&sv);
}

static void test_empty_adapter_hint(void **state) {
    (void)state;
    check_empty(CK_QWEN2_MOE, "LoraConfig(target_modules=[\"gate_proj\", \"up_proj\", \"down_proj\"])", 801);
    check_empty(CK_DEEPSEEK_V3, "target_parameters=[\"mlp.shared_experts.gate_proj.weight\"", 802);
    check_empty(CK_GRANITEMOEHYBRID, "target_modules=[\"input_linear\", \"output_linear\"]", 803);
}

/* ---- an adapter of another model -------------------------------------------- */

static void print_reply(const json_t *j) {
    char *text = json_dumps(j, JSON_COMPACT);
    fprintf(stderr, "unexpected reply: %.2000s\n", text ? text : "(none)");
    free(text);
}

/* A PEFT adapter of a wider model (H + 16, F + 8), separate gate, up and
 * down factors under the family's own names: 422 saying it was made for
 * another model and its sizes, with a violation for every factor, each
 * naming its tensor and the checkpoint's layer, and nothing registered. */
static void check_wider(ck_family f, unsigned long long seed) {
    ck_spec spec = {.family = f, .H = 48, .F = 32, .dtype = LS_DTYPE_F32, .shards = 1, .seed = seed};
    served sv;
    serve(&sv, &spec, false);
    const int H = spec.H + 16, F = spec.F + 8, r = 2;
    unsigned long long st = seed;
    double *v = draw((size_t)r * (H > 2 * F ? H : 2 * F), 0.5, &st); /* every factor's values fit */
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    static const char *const fused[3] = {"input_linear", NULL, "output_linear"}; /* Granite's */
    json_t *t = json_object();
    for (int k = 0; k < sv.m.L; k++)
        for (int p = 0; p < 3; p++) {
            if (sv.m.fused && p == 1) continue;
            const int in = p == 2 ? F : H, out = p == 2 ? H : sv.m.fused ? 2 * F : F;
            char name[200];
            snprintf(name, sizeof name, "base_model.model.%s%d.%s%s.lora_A.weight", sv.m.prefix, sv.m.ids[k],
                     sv.m.module, (sv.m.fused ? fused : proj)[p]);
            json_object_set_new(t, name, rows_of(v, r, in));
            snprintf(name, sizeof name, "base_model.model.%s%d.%s%s.lora_B.weight", sv.m.prefix, sv.m.ids[k],
                     sv.m.module, (sv.m.fused ? fused : proj)[p]);
            json_object_set_new(t, name, rows_of(v, out, r));
        }
    long code;
    json_incref(t); /* kept to look the violations' tensors up */
    json_t *j = call(&sv, "POST", "/adapters", upload("wide", r, t), &code);
    if (code != 422) print_reply(j);
    assert_int_equal(code, 422);
    const json_t *vs = json_object_get(json_object_get(j, "error"), "violations");
    printf("%s: %s (%zu violations)\n", sv.m.model_type,
           json_string_value(json_object_get(json_object_get(j, "error"), "message")), json_array_size(vs));
    assert_int_equal(json_array_size(vs), (sv.m.fused ? 4 : 6) * sv.m.L);
    /* The summary first: every factor says the same other model, under
     * the hidden size's code (the first violation may be a width's). */
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                        "lora_hidden_mismatch");
    assert_non_null(strstr(json_string_value(json_object_get(json_object_get(j, "error"), "message")),
                           "made for another model: its factors give hidden size 64 and a shared-expert width n*F of "
                           "40, this server's model has H = 48 and n*F = 1*32 = 32"));
    size_t i;
    const json_t *e;
    json_array_foreach(vs, i, e) {
        const char *c = json_string_value(json_object_get(e, "code"));
        assert_true(!strcmp(c, "lora_hidden_mismatch") || !strcmp(c, "lora_intermediate_mismatch"));
        assert_non_null(json_object_get(t, json_string_value(json_object_get(e, "tensor"))));
        const json_int_t layer = json_integer_value(json_object_get(e, "layer"));
        assert_non_null(strstr(json_string_value(json_object_get(e, "tensor")), sv.m.prefix));
        bool served_layer = false;
        for (int k = 0; k < sv.m.L; k++) served_layer |= sv.m.ids[k] == layer;
        assert_true(served_layer);
    }
    json_decref(j);
    json_decref(t);
    j = call(&sv, "GET", "/adapters", NULL, &code);
    assert_int_equal(json_array_size(json_object_get(j, "adapters")), 0);
    json_decref(j);
    free(v);
    unserve(&sv);
}

static void test_wider_adapter_refused(void **state) {
    (void)state;
    check_wider(CK_DEEPSEEK_V3, 601);
    check_wider(CK_QWEN2_MOE, 602);
    check_wider(CK_LLAMA4, 603);
    check_wider(CK_GRANITEMOEHYBRID, 604);
}

/* A clone without git-lfs leaves pointers where the weights should be:
 * start-up says so, and how to fetch them. */
static void test_lfs_pointer_refused(void **state) {
    (void)state;
    const ck_spec spec = {.family = CK_QWEN2_MOE, .H = 16, .F = 8, .dtype = LS_DTYPE_F32, .shards = 0, .seed = 701};
    char *dir = ls_test_mkdtemp();
    ck_model m;
    ck_write(dir, &spec, &m);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 12345\n", f);
    assert_int_equal(fclose(f), 0);
    const char *args[] = {"--weights", dir, "--port", "0", NULL};
    char out[8192];
    assert_int_equal(ls_test_run_binary(args, out, sizeof out), 1);
    if (!strstr(out, "model.safetensors") || !strstr(out, "a Git LFS pointer") || !strstr(out, "hint: fetch the file"))
        fail_msg("start-up does not say the weights are an LFS pointer:\n%s", out);
    ck_model_free(&m);
    ls_test_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lfs_pointer_refused),
        cmocka_unit_test(test_deepseek_family),
        cmocka_unit_test(test_qwen_family),
        cmocka_unit_test(test_llama4),
        cmocka_unit_test(test_granite),
        cmocka_unit_test(test_empty_adapter_hint),
        cmocka_unit_test(test_bf16_fp8_and_index_path),
        cmocka_unit_test(test_fused_adapter_on_deepseek),
        cmocka_unit_test(test_wider_adapter_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
