/* Factors of Qwen's shared_expert_gate (what target_modules="all-linear"
 * gives on Qwen2-MoE and its kin): folded into the delta s * B * A of the
 * gate's weight with the module's own rank and scale (rank_pattern,
 * alpha_pattern), refused on a model without the gate and on a backend
 * that does not apply it, checked for shape; and on the CPU engine a
 * forward without gammas takes sigmoid((w + s*B*A) . x) for the adapted
 * tokens and sigmoid(w . x) for the others, as PEFT computes it; the
 * state directory keeps the gate through a restart. */
#include <math.h>

#include "gpu/backend.h"
#include "gpu/cpu/cpu_backend.h"
#include "lora/adapter_config.h"
#include "lora/state.h"
#include "tests/util/adapter_fixture.h"
#include "tests/util/reference.h"
#include "tests/util/testutil.h"

#define HH 8
#define FF 5
#define GATE_N "model.layers.%d.mlp.shared_expert_gate.%s.weight"
#define UP_N "model.layers.%d.mlp.shared_expert.up_proj.%s.weight"
#define DOWN_N "model.layers.%d.mlp.shared_expert.down_proj.%s.weight"

/* Qwen2-MoE's shape: one shared expert and its gate. */
static ls_dims gated_dims(int layers) {
    return (ls_dims){.n = 1, .H = HH, .F = FF, .L = layers, .w13_layout = LS_W13_CONTIGUOUS, .gate = true};
}

static unsigned long long seed = 99;

/* A module's A [r, in] and B [out, r] of random values into s; A and B
 * (when given) receive copies the caller frees. */
static void add_module(ls_tensor_set *s, const char *fmt, int layer, int r, int in, int out, float **A, float **B) {
    float *a = malloc(sizeof(float) * (size_t)(r * in)), *b = malloc(sizeof(float) * (size_t)(out * r));
    ls_ref_fill_uniform_f(a, (size_t)(r * in), 0.5, &seed);
    ls_ref_fill_uniform_f(b, (size_t)(out * r), 0.5, &seed);
    char name[192];
    const int64_t sa[2] = {r, in}, sb[2] = {out, r};
    snprintf(name, sizeof name, fmt, layer, "lora_A");
    tu_add(s, name, LS_DTYPE_F32, sa, 2, a);
    snprintf(name, sizeof name, fmt, layer, "lora_B");
    tu_add(s, name, LS_DTYPE_F32, sb, 2, b);
    if (A) *A = a;
    else free(a);
    if (B) *B = b;
    else free(b);
}

/* An adapter of up and the gate on layer 0, rank 2, into a fresh s. */
static void up_and_gate(ls_tensor_set *s) {
    ls_tensor_set_init(s);
    add_module(s, UP_N, 0, 2, HH, FF, NULL, NULL);
    add_module(s, GATE_N, 0, 2, HH, 1, NULL, NULL);
}

#define GATE_A0 "model.layers.0.mlp.shared_expert_gate.lora_A.weight"

static ls_status normalise(const ls_tensor_set *s, const char *config, const ls_dims *d, const ls_pool_dims *p,
                           ls_adapter *a, ls_error *err) {
    ls_adapter_params params;
    memset(&params, 0, sizeof params);
    assert_int_equal(ls_adapter_config_parse_text(config, &params, err), LS_OK);
    return ls_adapter_normalise(s, &params, d, p, a, err);
}

/* s * B A in fp64, for the gate (B [1, r]). */
static double gate_delta(const float *A, const float *B, int r, double scale, int h) {
    double sum = 0;
    for (int k = 0; k < r; k++) sum += (double)B[k] * A[k * HH + h];
    return scale * sum;
}

/* all-linear on layer 0 (up, down and the gate), the gate alone on layer
 * 1, nothing on layer 2; the gate's own rank and alpha from the patterns. */
static void test_gate_is_folded(void **state) {
    (void)state;
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    float *A0, *B0, *A1, *B1;
    add_module(&s, UP_N, 0, 2, HH, FF, NULL, NULL);
    add_module(&s, DOWN_N, 0, 2, FF, HH, NULL, NULL);
    add_module(&s, GATE_N, 0, 3, HH, 1, &A0, &B0);
    add_module(&s, GATE_N, 1, 3, HH, 1, &A1, &B1);
    const char *cfg = "{\"r\": 2, \"lora_alpha\": 4, \"target_modules\": \"all-linear\", "
                      "\"rank_pattern\": {\"shared_expert_gate\": 3}, \"alpha_pattern\": {\"shared_expert_gate\": 9}}";
    ls_dims d = gated_dims(3);
    ls_pool_dims p = tu_pool(4, LS_LORA_SHARED);
    ls_adapter a;
    ls_error err;
    ls_error_init(&err);
    ls_status st = normalise(&s, cfg, &d, &p, &a, &err);
    if (st != LS_OK) tu_dump(&err);
    assert_int_equal(st, LS_OK);
    assert_true(a.meta.gate);
    assert_int_equal(a.layer_floats, ls_factor_layout_of(&d, 1, a.meta.rank).total + HH);
    assert_true(a.layer_present[0] && a.layer_present[1] && !a.layer_present[2]);
    const float *g0 = ls_adapter_gate(&a, 0, &d), *g1 = ls_adapter_gate(&a, 1, &d);
    assert_non_null(g0);
    assert_non_null(g1);
    assert_null(ls_adapter_gate(&a, 2, &d)); /* zeros: nothing to add */
    /* The replies' modules: the gate at its own rank and alpha_pattern scale. */
    const int K = LS_ADAPTER_MODULE_KINDS, SG = 4;
    assert_string_equal(a.modules->name[SG], "shared_expert_gate");
    assert_int_equal(a.modules->rank[1 * K + SG], 3);
    assert_true(fabs(a.modules->scale[1 * K + SG] - 3.0) < 1e-12);
    for (int h = 0; h < HH; h++) {
        assert_true(fabs(g0[h] - gate_delta(A0, B0, 3, 9.0 / 3, h)) < 1e-6);
        assert_true(fabs(g1[h] - gate_delta(A1, B1, 3, 9.0 / 3, h)) < 1e-6);
    }
    /* The digest covers the gate: another gate gives another one. */
    char before[65];
    snprintf(before, sizeof before, "%s", a.meta.sha256);
    ls_adapter_free(&a);
    float *b = tu_f32_data(&s, "model.layers.1.mlp.shared_expert_gate.lora_B.weight");
    b[0] += 0.25f;
    assert_int_equal(normalise(&s, cfg, &d, &p, &a, &err), LS_OK);
    assert_string_not_equal(before, a.meta.sha256);
    ls_adapter_free(&a);
    free(A0), free(B0), free(A1), free(B1);
    ls_error_free(&err);
    ls_tensor_set_free(&s);
}

/* The gate's factors alone make an adapter too, whatever their rank:
 * they take none in a slot (rank 1 of zeros), even past --max-rank. */
static void test_gate_alone(void **state) {
    (void)state;
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    add_module(&s, GATE_N, 0, 8, HH, 1, NULL, NULL);
    ls_dims d = gated_dims(1);
    ls_pool_dims p = tu_pool(4, LS_LORA_SHARED);
    ls_adapter a;
    ls_error err;
    ls_error_init(&err);
    ls_status st = normalise(&s, "{\"r\": 8, \"lora_alpha\": 2}", &d, &p, &a, &err);
    if (st != LS_OK) tu_dump(&err);
    assert_int_equal(st, LS_OK);
    assert_true(a.meta.gate);
    assert_int_equal(a.meta.rank, 1);
    assert_non_null(ls_adapter_gate(&a, 0, &d));
    ls_adapter_free(&a);
    ls_error_free(&err);
    ls_tensor_set_free(&s);
}

/* No gate in the model, or a backend that does not apply it: refused,
 * naming the tensor and what to do. */
static void test_gate_refused_where_not_applied(void **state) {
    (void)state;
    ls_tensor_set s;
    up_and_gate(&s);
    ls_dims d = gated_dims(1);
    d.gate = false;
    ls_pool_dims p = tu_pool(4, LS_LORA_SHARED);
    ls_adapter a;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(normalise(&s, "{\"r\": 2, \"lora_alpha\": 2}", &d, &p, &a, &err), LS_LORA_UNKNOWN_TENSOR);
    const ls_violation *v = tu_find(&err, LS_LORA_UNKNOWN_TENSOR, GATE_A0);
    assert_int_equal(v->layer, 0);
    assert_non_null(strstr(v->message, "this server's model has none"));
    assert_non_null(strstr(v->hint, "shared-expert gate"));
    ls_error_clear(&err);
    d.gate = true;
    p.no_gate_lora = true;
    assert_int_equal(normalise(&s, "{\"r\": 2, \"lora_alpha\": 2}", &d, &p, &a, &err), LS_LORA_UNKNOWN_TENSOR);
    v = tu_find(&err, LS_LORA_UNKNOWN_TENSOR, GATE_A0);
    assert_non_null(strstr(v->message, "CUDA backend does not apply"));
    assert_non_null(strstr(v->hint, "--device cpu"));
    ls_error_free(&err);
    ls_tensor_set_free(&s);
}

/* Shapes: B with more than one row, A of another hidden size, a lone A. */
static void test_gate_shapes(void **state) {
    (void)state;
    ls_dims d = gated_dims(2);
    ls_pool_dims p = tu_pool(4, LS_LORA_SHARED);
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    add_module(&s, GATE_N, 0, 2, HH, 2, NULL, NULL);
    add_module(&s, GATE_N, 1, 2, HH + 1, 1, NULL, NULL);
    ls_adapter a;
    ls_error err;
    ls_error_init(&err);
    assert_int_not_equal(normalise(&s, "{\"r\": 2, \"lora_alpha\": 2}", &d, &p, &a, &err), LS_OK);
    tu_expect(&err, LS_INVALID_SHAPE, 0, "model.layers.0.mlp.shared_expert_gate.lora_B.weight", 0, 1, 2);
    tu_expect(&err, LS_LORA_HIDDEN_MISMATCH, 1, "model.layers.1.mlp.shared_expert_gate.lora_A.weight", 1, HH, HH + 1);
    ls_error_free(&err);
    ls_tensor_set_free(&s);

    up_and_gate(&s);
    tu_remove(&s, "model.layers.0.mlp.shared_expert_gate.lora_B.weight");
    ls_error_init(&err);
    assert_int_equal(normalise(&s, "{\"r\": 2, \"lora_alpha\": 2}", &d, &p, &a, &err), LS_LORA_MISSING_TENSOR);
    tu_find(&err, LS_LORA_MISSING_TENSOR, "model.layers.0.mlp.shared_expert_gate.lora_B.weight");
    ls_error_free(&err);
    ls_tensor_set_free(&s);
}

/* target_modules that leave the gate out: PEFT would not create its
 * factors, so they are refused as the other modules' are. */
static void test_gate_outside_target_modules(void **state) {
    (void)state;
    ls_tensor_set s;
    up_and_gate(&s);
    ls_dims d = gated_dims(1);
    ls_pool_dims p = tu_pool(4, LS_LORA_SHARED);
    ls_adapter a;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(normalise(&s, "{\"r\": 2, \"lora_alpha\": 2, \"target_modules\": [\"up_proj\"]}", &d, &p, &a, &err),
                     LS_ADAPTER_CONFIG_INVALID);
    tu_find(&err, LS_ADAPTER_CONFIG_INVALID, GATE_A0);
    ls_error_free(&err);
    ls_tensor_set_free(&s);
}

/* On the CPU engine: tokens of the adapter get sigmoid((w + s*B*A) . x)
 * as their gamma, base tokens sigmoid(w . x); the rest of the block is
 * the reference's. */
static void test_gate_forward(void **state) {
    (void)state;
    const int T = 4, H = HH, F = FF;
    ls_dims d = gated_dims(1);
    ls_backend_config cfg = {.dims = d, .pool = tu_pool(4, LS_LORA_SHARED), .dtype = LS_DTYPE_F32};
    ls_backend *be = NULL;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_backend_cpu_create(&cfg, NULL, &be, &err), LS_OK);
    float w13[2 * FF * HH], w2[HH * FF], w[HH], x[4 * HH];
    ls_ref_fill_uniform_f(w13, 2 * F * H, 0.4, &seed);
    ls_ref_fill_uniform_f(w2, H * F, 0.4, &seed);
    ls_ref_fill_uniform_f(w, H, 0.4, &seed);
    ls_ref_fill_uniform_f(x, (size_t)T * H, 1.0, &seed);
    const ls_base_layer bl = {{LS_DTYPE_F32, w13}, {LS_DTYPE_F32, w2}, {LS_DTYPE_F32, w}};
    assert_int_equal(ls_backend_upload_base(be, 0, &bl, &err), LS_OK);

    ls_tensor_set s;
    ls_tensor_set_init(&s);
    float *A, *B;
    add_module(&s, UP_N, 0, 2, HH, FF, NULL, NULL);
    add_module(&s, GATE_N, 0, 2, HH, 1, &A, &B);
    ls_adapter a;
    assert_int_equal(normalise(&s, "{\"r\": 2, \"lora_alpha\": 6}", &d, &cfg.pool, &a, &err), LS_OK);
    const ls_pool_dims *p = ls_backend_pool_dims(be);
    float *f[4];
    const size_t len[4] = {ls_pool_gu_a_len(&d, p), ls_pool_gu_b_len(&d, p), ls_pool_d_a_len(&d, p),
                           ls_pool_d_b_len(&d, p)};
    for (int k = 0; k < 4; k++) f[k] = calloc(len[k], sizeof(float));
    ls_adapter_expand(&a, 0, &d, p, f[0], f[1], f[2], f[3]);
    const ls_slot_factors sf = {f[0], f[1], f[2], f[3], ls_adapter_gate(&a, 0, &d)};
    assert_int_equal(ls_backend_slot_write(be, 2, 0, &sf, &err), LS_OK);
    const int slot_of[4] = {2, -1, 2, -1};
    float y[4 * HH];
    assert_int_equal(ls_backend_forward(be, 0, T, x, NULL, slot_of, y, &err), LS_OK);

    /* The reference: the adapter's pool factors in double, gammas from
     * the gate with and without the delta (PEFT: w.x + s*B(A x)). */
    const int R = p->max_rank;
    double *gd[4];
    for (int k = 0; k < 4; k++) {
        gd[k] = calloc(len[k], sizeof(double));
        for (size_t i = 0; i < len[k]; i++) gd[k][i] = f[k][i];
    }
    const ls_ref_lora lora = {.r = R, .outer = 1, .gu_a = gd[0], .gu_b = gd[1], .d_a = gd[2], .d_b = gd[3]};
    const ls_ref_lora *of[4] = {&lora, NULL, &lora, NULL};
    double dw13[2 * FF * HH], dw2[HH * FF], dx[4 * HH], gam[4], plain[4], ref[4 * HH];
    for (int i = 0; i < 2 * F * H; i++) dw13[i] = w13[i];
    for (int i = 0; i < H * F; i++) dw2[i] = w2[i];
    for (int i = 0; i < T * H; i++) dx[i] = x[i];
    for (int t = 0; t < T; t++) {
        double z = 0, dz = 0;
        for (int h = 0; h < H; h++) {
            z += (double)w[h] * x[t * H + h];
            dz += gate_delta(A, B, 2, 3.0, h) * x[t * H + h];
        }
        plain[t] = 1 / (1 + exp(-z));
        gam[t] = of[t] ? 1 / (1 + exp(-(z + dz))) : plain[t];
    }
    ls_ref_forward(&d, dw13, dw2, T, dx, gam, of, ref);
    double e = ls_ref_rel_err_f(y, ref, (long)T * H);
    if (e > 1e-5) fail_msg("gated forward differs from the reference by %g", e);
    /* The delta matters here: the base gate would be far off. */
    ls_ref_forward(&d, dw13, dw2, T, dx, plain, of, ref);
    assert_true(ls_ref_rel_err_f(y, ref, (long)T * H) > 1e-3);

    /* A cleared slot forgets the delta with its factors. */
    assert_int_equal(ls_backend_slot_clear(be, 2, &err), LS_OK);
    assert_int_equal(ls_backend_forward(be, 0, T, x, NULL, slot_of, y, &err), LS_OK);
    ls_ref_forward(&d, dw13, dw2, T, dx, plain, NULL, ref);
    assert_true(ls_ref_rel_err_f(y, ref, (long)T * H) < 1e-5);

    for (int k = 0; k < 4; k++) free(f[k]), free(gd[k]);
    free(A), free(B);
    ls_adapter_free(&a);
    ls_tensor_set_free(&s);
    ls_backend_free(be);
    ls_error_free(&err);
}

/* What a restore hands over, for the test below. */
static ls_status keep_restored(void *ctx, const ls_state_record *rec, ls_adapter *a, ls_error *err) {
    (void)rec, (void)err;
    ls_adapter *out = ctx;
    *out = *a; /* taken: the restore frees a zeroed one */
    memset(a, 0, sizeof *a);
    return LS_OK;
}

static void no_tomb(void *ctx, const char *name, uint64_t version) { (void)ctx, (void)name, (void)version; }

/* A record of a gate adapter reads back, and restores, with its gate and
 * its digest. */
static void test_gate_survives_a_restart(void **state) {
    (void)state;
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    add_module(&s, DOWN_N, 0, 2, FF, HH, NULL, NULL);
    add_module(&s, GATE_N, 1, 2, HH, 1, NULL, NULL);
    ls_dims d = gated_dims(2);
    ls_pool_dims p = tu_pool(4, LS_LORA_SHARED);
    ls_adapter a, back, restored;
    memset(&restored, 0, sizeof restored);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(normalise(&s, "{\"r\": 2, \"lora_alpha\": 2}", &d, &p, &a, &err), LS_OK);
    char *dir = ls_test_mkdtemp();
    ls_state *st = NULL;
    assert_int_equal(ls_state_open(dir, &st, &err), LS_OK);
    ls_state_fit(st, &d, &p);
    ls_state_record rec = {.name = "gated", .version = 1, .a = &a};
    bool made;
    assert_int_equal(ls_state_save(st, &rec, &made, &err), LS_OK);
    assert_int_equal(ls_state_read(st, "gated", 1, &back, &err), LS_OK);
    assert_true(back.meta.gate);
    assert_string_equal(back.meta.sha256, a.meta.sha256);
    assert_null(ls_adapter_gate(&back, 0, &d));
    assert_memory_equal(ls_adapter_gate(&back, 1, &d), ls_adapter_gate(&a, 1, &d), HH * sizeof(float));
    ls_state_close(st);
    assert_int_equal(ls_state_open(dir, &st, &err), LS_OK);
    ls_state_fit(st, &d, &p);
    assert_int_equal(ls_state_restore(st, keep_restored, no_tomb, &restored, &err), LS_OK);
    assert_int_equal(ls_state_unrestored(st), 0);
    assert_true(restored.meta.gate);
    assert_string_equal(restored.meta.sha256, a.meta.sha256);
    ls_state_close(st);
    ls_adapter_free(&restored);
    ls_adapter_free(&back);
    ls_adapter_free(&a);
    ls_test_rmtree(dir);
    free(dir);
    ls_error_free(&err);
    ls_tensor_set_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate_is_folded),
        cmocka_unit_test(test_gate_alone),
        cmocka_unit_test(test_gate_refused_where_not_applied),
        cmocka_unit_test(test_gate_shapes),
        cmocka_unit_test(test_gate_outside_target_modules),
        cmocka_unit_test(test_gate_forward),
        cmocka_unit_test(test_gate_survives_a_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
