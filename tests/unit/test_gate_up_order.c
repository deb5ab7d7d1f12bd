/* What a PEFT upload may state besides its factors. The row order of a
 * PEFT gate_up_proj.lora_B: an adapter whose module
 * keeps each expert's gate rows before its up rows (gate_up, the default)
 * and one whose rows alternate (interleaved), each declared as such, give
 * the fp64 reference's output; the same interleaved factors read as
 * gate_up do not. The reference takes gate and up rows from the test's
 * own arrays, never from the normalised adapter. */
#include "tests/util/adapter_fixture.h"
#include "tests/util/pool_cases.h"
#include "tests/util/pool_fixture.h"

#include "lora/adapter_config.h"

enum { N = 2, H = 8, F = 4, R = 3, T = 5 };
static const ls_dims D = {.n = N, .H = H, .F = F, .L = 1, .w13_layout = LS_W13_CONTIGUOUS};
#define PFX "model.layers.0.mlp.shared_experts."

/* One adapter's factors as the trainer saw them: gate and up rows apart. */
typedef struct {
    float a[R * H], gate[N * F * R], up[N * F * R], da[R * N * F], db[H * R];
} factors;

static void factors_fill(factors *f, unsigned long long seed) {
    ls_ref_fill_uniform_f(f->a, R * H, 0.5, &seed);
    ls_ref_fill_uniform_f(f->gate, N * F * R, 0.5, &seed);
    ls_ref_fill_uniform_f(f->up, N * F * R, 0.5, &seed);
    ls_ref_fill_uniform_f(f->da, R * N * F, 0.5, &seed);
    ls_ref_fill_uniform_f(f->db, H * R, 0.5, &seed);
}

/* The PEFT tensors of f with gate_up_proj.lora_B's rows in `order`. */
static void factors_peft(const factors *f, ls_gate_up_order order, ls_tensor_set *s) {
    float b[N * 2 * F * R];
    for (int e = 0; e < N; e++)
        for (int j = 0; j < F; j++) {
            const int g_row = order == LS_GATE_UP_ORDER_INTERLEAVED ? 2 * j : j;
            const int u_row = order == LS_GATE_UP_ORDER_INTERLEAVED ? 2 * j + 1 : F + j;
            memcpy(&b[(e * 2 * F + g_row) * R], &f->gate[(e * F + j) * R], R * sizeof(float));
            memcpy(&b[(e * 2 * F + u_row) * R], &f->up[(e * F + j) * R], R * sizeof(float));
        }
    const int64_t sa[2] = {R, H}, sb[2] = {N * 2 * F, R}, sda[2] = {R, N * F}, sdb[2] = {H, R};
    tu_add(s, PFX "gate_up_proj.lora_A.weight", LS_DTYPE_F32, sa, 2, f->a);
    tu_add(s, PFX "gate_up_proj.lora_B.weight", LS_DTYPE_F32, sb, 2, b);
    tu_add(s, PFX "down_proj.lora_A.weight", LS_DTYPE_F32, sda, 2, f->da);
    tu_add(s, PFX "down_proj.lora_B.weight", LS_DTYPE_F32, sdb, 2, f->db);
}

/* The reference's view of f (scale folded into B), in arrays of ref. */
typedef struct {
    double gu_a[2 * R * H], gu_b[N * 2 * F * R], d_a[N * R * F], d_b[H * R];
    ls_ref_lora lora;
} ref_factors;

static void factors_ref(const factors *f, double scale, ref_factors *rf) {
    for (int k = 0; k < R; k++)
        for (int h = 0; h < H; h++) rf->gu_a[k * H + h] = rf->gu_a[(R + k) * H + h] = f->a[k * H + h];
    for (int e = 0; e < N; e++)
        for (int j = 0; j < F; j++)
            for (int k = 0; k < R; k++) {
                rf->gu_b[(e * 2 * F + j) * R + k] = scale * f->gate[(e * F + j) * R + k];
                rf->gu_b[(e * 2 * F + F + j) * R + k] = scale * f->up[(e * F + j) * R + k];
            }
    for (int e = 0; e < N; e++)
        for (int k = 0; k < R; k++)
            for (int j = 0; j < F; j++) rf->d_a[(e * R + k) * F + j] = f->da[k * N * F + e * F + j];
    for (int i = 0; i < H * R; i++) rf->d_b[i] = scale * f->db[i];
    rf->lora = (ls_ref_lora){.r = R, .outer = 1, .gu_a = rf->gu_a, .gu_b = rf->gu_b, .d_a = rf->d_a, .d_b = rf->d_b};
}

/* Loads f written in `written` order, declared as `declared` (NULL: not
 * declared), runs T tokens through it on the CPU backend and returns the
 * relative error against the reference of f. */
static double run_case(ls_gate_up_order written, const char *declared) {
    double *w13 = NULL, *w2 = NULL;
    ls_backend *be = pt_cpu_create(D, 2, R, T, 7, &w13, &w2);
    ls_pool *p = pt_pool(be, 8, NULL, NULL);
    factors f;
    factors_fill(&f, 11);
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    factors_peft(&f, written, &s);

    /* Declared the way a raw upload's query string does it. */
    ls_adapter_params prm = {.has_alpha = true, .lora_alpha = 6.0};
    ls_adapter_text_params text = {.gate_up_order = declared};
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_adapter_params_from_text(&text, &prm, &err), LS_OK);
    ls_adapter a;
    if (ls_adapter_normalise(&s, &prm, &D, &(ls_pool_dims){.slots = 2, .max_rank = R}, &a, &err) != LS_OK)
        fail_msg("normalise: %s", err.message);
    ls_pool_load_opts o = {0};
    if (ls_pool_load(p, "a", &a, &o, NULL, &err) != LS_OK) fail_msg("load: %s", err.message);
    ls_adapter_free(&a);

    float x[T * H], g[T * N], y[T * H];
    ls_ref_fill_uniform_f(x, T * H, 1.0, &(unsigned long long){3});
    ls_ref_fill_uniform_f(g, T * N, 1.0, &(unsigned long long){5});
    const char *names[T] = {"a", NULL, "a", "a", NULL};
    ls_pool_used used[T];
    int n_used = 0;
    if (pc_pool_forward(p, 0, T, x, g, names, y, used, &n_used, &err) != LS_OK) fail_msg("forward: %s", err.message);

    ref_factors rf;
    factors_ref(&f, 6.0 / R, &rf);
    const ls_ref_lora *per_tok[T];
    for (int t = 0; t < T; t++) per_tok[t] = names[t] ? &rf.lora : NULL;
    double xd[T * H], gd[T * N], yr[T * H];
    for (int i = 0; i < T * H; i++) xd[i] = x[i];
    for (int i = 0; i < T * N; i++) gd[i] = g[i];
    ls_ref_forward(&D, w13, w2, T, xd, gd, per_tok, yr);
    const double rel = ls_ref_rel_err_f(y, yr, T * H);

    ls_error_free(&err);
    ls_tensor_set_free(&s);
    ls_pool_free(p);
    ls_backend_free(be);
    free(w13);
    free(w2);
    return rel;
}

static void test_gate_up_default(void **state) {
    (void)state;
    assert_true(run_case(LS_GATE_UP_ORDER_GATE_UP, NULL) < 1e-5);
}

static void test_gate_up_declared(void **state) {
    (void)state;
    assert_true(run_case(LS_GATE_UP_ORDER_GATE_UP, "gate_up") < 1e-5);
}

static void test_interleaved_declared(void **state) {
    (void)state;
    assert_true(run_case(LS_GATE_UP_ORDER_INTERLEAVED, "interleaved") < 1e-5);
}

/* The failure the declaration exists for: the same factors read in the
 * other order are a different adapter. */
static void test_interleaved_undeclared_differs(void **state) {
    (void)state;
    assert_true(run_case(LS_GATE_UP_ORDER_INTERLEAVED, NULL) > 1e-2);
}

/* Every carrier reads the key and refuses a bad value with its own code;
 * a request's order goes over the file's. */
static void test_carriers(void **state) {
    (void)state;
    ls_error err;
    ls_error_init(&err);
    ls_adapter_params p = {0};
    json_t *cfg = json_pack("{s:i, s:f, s:s}", "r", 4, "lora_alpha", 8.0, "gate_up_order", "interleaved");
    assert_int_equal(ls_adapter_config_parse(cfg, true, &p, &err), LS_OK);
    assert_true(p.has_order);
    assert_int_equal(p.gate_up_order, LS_GATE_UP_ORDER_INTERLEAVED);
    json_decref(cfg);

    ls_adapter_params bad = {0};
    cfg = json_pack("{s:i, s:f, s:s}", "r", 4, "lora_alpha", 8.0, "gate_up_order", "up_gate");
    assert_int_equal(ls_adapter_config_parse(cfg, true, &bad, &err), LS_ADAPTER_CONFIG_INVALID);
    assert_non_null(strstr(err.message, "gate_up_order"));
    assert_false(bad.has_order);
    json_decref(cfg);
    ls_error_free(&err);
    ls_error_init(&err);

    ls_adapter_text_params text = {.gate_up_order = "Interleaved"};
    assert_int_equal(ls_adapter_params_from_text(&text, &bad, &err), LS_INVALID_REQUEST);
    ls_error_free(&err);

    ls_adapter_params given = {.has_order = true, .gate_up_order = LS_GATE_UP_ORDER_GATE_UP};
    ls_adapter_params m = ls_adapter_params_merge(&p, &given);
    assert_int_equal(m.gate_up_order, LS_GATE_UP_ORDER_GATE_UP);
    ls_adapter_params none = {0};
    m = ls_adapter_params_merge(&p, &none);
    assert_int_equal(m.gate_up_order, LS_GATE_UP_ORDER_INTERLEAVED);
}

/* Pool buffers have one order: declaring the other is refused, not
 * silently ignored. */
static void test_pool_format_refuses_interleaved(void **state) {
    (void)state;
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    ls_dims d = tu_tiny_dims(1);
    tu_add_pool_layer(&s, &d, 0, 1, 2, 0);
    ls_adapter_params p = {.has_order = true, .gate_up_order = LS_GATE_UP_ORDER_INTERLEAVED};
    ls_pool_dims pool = tu_pool(4, LS_LORA_SHARED);
    ls_adapter a;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_adapter_normalise(&s, &p, &d, &pool, &a, &err), LS_ADAPTER_CONFIG_INVALID);
    assert_non_null(tu_find(&err, LS_ADAPTER_CONFIG_INVALID, NULL));
    ls_error_free(&err);
    ls_error_init(&err);
    p.gate_up_order = LS_GATE_UP_ORDER_GATE_UP;
    assert_int_equal(ls_adapter_normalise(&s, &p, &d, &pool, &a, &err), LS_OK);
    ls_adapter_free(&a);
    ls_error_free(&err);
    ls_tensor_set_free(&s);
}

/* A scale beside a lora_alpha would leave one of them ignored (each
 * sets the scale): refused, like an order the pool format cannot take. */
static void test_peft_refuses_scale(void **state) {
    (void)state;
    factors f;
    factors_fill(&f, 3);
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    factors_peft(&f, LS_GATE_UP_ORDER_GATE_UP, &s);
    ls_adapter_params p = {.has_scale = true, .scale = 5.0, .has_alpha = true, .lora_alpha = 4};
    ls_adapter a;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(
        ls_adapter_normalise(&s, &p, &D, &(ls_pool_dims){.slots = 2, .max_rank = R}, &a, &err),
        LS_ADAPTER_CONFIG_INVALID);
    assert_non_null(strstr(err.message, "scale"));
    ls_error_free(&err);
    ls_tensor_set_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate_up_default),
        cmocka_unit_test(test_gate_up_declared),
        cmocka_unit_test(test_interleaved_declared),
        cmocka_unit_test(test_interleaved_undeclared_differs),
        cmocka_unit_test(test_carriers),
        cmocka_unit_test(test_pool_format_refuses_interleaved),
        cmocka_unit_test(test_peft_refuses_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
