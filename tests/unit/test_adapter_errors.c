/* Adapter validation, PEFT format and the checks common to both formats:
 * the smallest upload that triggers each code, with the violation's
 * layer, tensor, axis, expected, got and hint; several problems reported
 * at once; a failure leaves the output zeroed. */
#include <math.h>

#include "tests/util/adapter_fixture.h"

/* A valid two-layer PEFT upload. */
static void fx_peft(tu_fx *f) {
    tu_add_peft_layer(&f->s, "", &f->d, 0, 2, 0);
    tu_add_peft_layer(&f->s, "", &f->d, 1, 2, 0);
}

static const char *N(tu_fx *f, const char *fmt, int layer) { return tu_name(f->name, sizeof f->name, "", fmt, layer); }

static void test_valid_baseline(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    ls_adapter a;
    assert_int_equal(ls_adapter_normalise(&f->s, &tu_scale1, &f->d, &f->p, &a, &f->err), LS_OK);
    assert_int_equal(f->err.n_violations, 0);
    ls_adapter_free(&a);
}

static void test_dtype_unsupported(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    const int64_t shape[2] = {2, 4};
    tu_replace(&f->s, N(f, TU_GU_A, 0), LS_DTYPE_I32, shape, 2);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_DTYPE_UNSUPPORTED, &f->err);
    const ls_violation *v = tu_expect(&f->err, LS_LORA_DTYPE_UNSUPPORTED, 0, N(f, TU_GU_A, 0), LS_NA, LS_NA, LS_NA);
    assert_non_null(strstr(v->message, "I32"));
    assert_int_equal(f->err.n_violations, 1);
}

static void test_peft_not_2d(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    const int64_t shape[3] = {1, 4, 2};
    tu_replace(&f->s, N(f, TU_D_B, 0), LS_DTYPE_F32, shape, 3);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_INVALID_SHAPE, &f->err);
    tu_expect(&f->err, LS_INVALID_SHAPE, 0, N(f, TU_D_B, 0), LS_NA, 2, 3);
    assert_int_equal(f->err.n_violations, 1); /* no rank or hidden noise from the same tensor */
}

/* A factor that is not 2D is skipped, not the checks of the others: the
 * rest of its layer and the other layer are still reported. */
static void test_peft_not_2d_keeps_checking(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    const int64_t ga[3] = {1, 2, 4}, gb[2] = {11, 2}, da[2] = {2, 8}, db[2] = {5, 2};
    tu_replace(&f->s, N(f, TU_GU_A, 0), LS_DTYPE_F32, ga, 3);
    tu_replace(&f->s, N(f, TU_GU_B, 0), LS_DTYPE_F32, gb, 2);
    tu_replace(&f->s, N(f, TU_D_A, 0), LS_DTYPE_F32, da, 2);
    tu_replace(&f->s, N(f, TU_D_B, 0), LS_DTYPE_F32, db, 2);
    const int64_t gb1[1] = {24}, da1[2] = {3, 6};
    tu_replace(&f->s, N(f, TU_GU_B, 1), LS_DTYPE_F32, gb1, 1);
    tu_replace(&f->s, N(f, TU_D_A, 1), LS_DTYPE_F32, da1, 2);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_INVALID_SHAPE, &f->err);
    tu_expect(&f->err, LS_INVALID_SHAPE, 0, N(f, TU_GU_A, 0), LS_NA, 2, 3);
    tu_expect(&f->err, LS_LORA_EXTENT_NOT_DIVISIBLE, 0, N(f, TU_GU_B, 0), 0, 12, 11);
    tu_expect(&f->err, LS_LORA_INTERMEDIATE_MISMATCH, 0, N(f, TU_D_A, 0), 1, 6, 8);
    tu_expect(&f->err, LS_LORA_HIDDEN_MISMATCH, 0, N(f, TU_D_B, 0), 0, 4, 5);
    tu_expect(&f->err, LS_INVALID_SHAPE, 1, N(f, TU_GU_B, 1), LS_NA, 2, 1);
    tu_expect(&f->err, LS_LORA_RANK_MISMATCH, 1, N(f, TU_D_A, 1), 0, 2, 3);
    assert_int_equal(f->err.n_violations, 6);
}

/* No factor 2D: each is reported as such, and nothing about a rank that
 * none of them can show (that would be a consequence, not a problem). */
static void test_peft_none_2d(void **state) {
    tu_fx *f = *state;
    const int64_t s3[3] = {1, 2, 4};
    const char *fmts[4] = {TU_GU_A, TU_GU_B, TU_D_A, TU_D_B};
    for (int k = 0; k < 4; k++) tu_add_pattern(&f->s, N(f, fmts[k], 0), LS_DTYPE_F32, s3, 3, k);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_INVALID_SHAPE, &f->err);
    for (int k = 0; k < 4; k++) tu_expect(&f->err, LS_INVALID_SHAPE, 0, N(f, fmts[k], 0), LS_NA, 2, 3);
    assert_int_equal(f->err.n_violations, 4);

    /* One 2D factor of rank 0 among them: the rank is reported on it. */
    ls_error_clear(&f->err);
    const int64_t z[2] = {0, 4};
    tu_replace(&f->s, N(f, TU_D_A, 0), LS_DTYPE_F32, z, 2);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_INVALID_SHAPE, &f->err);
    const ls_violation *v = tu_expect(&f->err, LS_INVALID_SHAPE, 0, N(f, TU_D_A, 0), LS_NA, LS_NA, 0);
    assert_non_null(strstr(v->message, "rank 0"));
    assert_int_equal(f->err.n_violations, 5); /* three not 2D, its rank, its n*F columns */
}

static void test_hidden_mismatch(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    const int64_t a[2] = {2, 5}, b[2] = {5, 2};
    tu_replace(&f->s, N(f, TU_GU_A, 0), LS_DTYPE_F32, a, 2);
    tu_replace(&f->s, N(f, TU_D_B, 1), LS_DTYPE_F32, b, 2);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_HIDDEN_MISMATCH, &f->err);
    tu_expect(&f->err, LS_LORA_HIDDEN_MISMATCH, 0, N(f, TU_GU_A, 0), 1, 4, 5);
    tu_expect(&f->err, LS_LORA_HIDDEN_MISMATCH, 1, N(f, TU_D_B, 1), 0, 4, 5);
    assert_int_equal(f->err.n_violations, 2);
}

static void test_extent_not_divisible(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    const int64_t b[2] = {11, 2}, a[2] = {2, 7};
    tu_replace(&f->s, N(f, TU_GU_B, 0), LS_DTYPE_F32, b, 2);
    tu_replace(&f->s, N(f, TU_D_A, 1), LS_DTYPE_F32, a, 2);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_EXTENT_NOT_DIVISIBLE, &f->err);
    tu_expect(&f->err, LS_LORA_EXTENT_NOT_DIVISIBLE, 0, N(f, TU_GU_B, 0), 0, 12, 11);
    tu_expect(&f->err, LS_LORA_EXTENT_NOT_DIVISIBLE, 1, N(f, TU_D_A, 1), 1, 6, 7);
    assert_int_equal(f->err.n_violations, 2); /* divisibility first, no intermediate noise */
}

static void test_intermediate_mismatch(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    const int64_t b[2] = {10, 2}, a[2] = {2, 8};
    tu_replace(&f->s, N(f, TU_GU_B, 0), LS_DTYPE_F32, b, 2);
    tu_replace(&f->s, N(f, TU_D_A, 1), LS_DTYPE_F32, a, 2);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_INTERMEDIATE_MISMATCH, &f->err);
    const ls_violation *v = tu_expect(&f->err, LS_LORA_INTERMEDIATE_MISMATCH, 0, N(f, TU_GU_B, 0), 0, 12, 10);
    assert_non_null(strstr(v->message, "n * 5"));
    tu_expect(&f->err, LS_LORA_INTERMEDIATE_MISMATCH, 1, N(f, TU_D_A, 1), 1, 6, 8);
    assert_int_equal(f->err.n_violations, 2);
}

static void test_peft_rank_mismatch(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    const int64_t b[2] = {12, 3};
    tu_replace(&f->s, N(f, TU_GU_B, 1), LS_DTYPE_F32, b, 2);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_RANK_MISMATCH, &f->err);
    /* The odd factor is reported against the rank the others share. */
    tu_expect(&f->err, LS_LORA_RANK_MISMATCH, 1, N(f, TU_GU_B, 1), 1, 2, 3);
    assert_int_equal(f->err.n_violations, 1);
}

static void test_peft_transposed(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    const int64_t a[2] = {4, 2};
    tu_replace(&f->s, N(f, TU_GU_A, 0), LS_DTYPE_F32, a, 2);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_RANK_MISMATCH, &f->err);
    const ls_violation *v = tu_expect(&f->err, LS_LORA_RANK_MISMATCH, 0, N(f, TU_GU_A, 0), 0, 2, 4);
    assert_non_null(strstr(v->hint, "transposed"));
    v = tu_expect(&f->err, LS_LORA_HIDDEN_MISMATCH, 0, N(f, TU_GU_A, 0), 1, 4, 2);
    assert_non_null(strstr(v->hint, "transposed"));
    assert_int_equal(f->err.n_violations, 2);
}

static void test_config_rank_mismatch(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    ls_adapter_params p = {.r = 4, .has_alpha = true, .lora_alpha = 8};
    tu_expect_fail(&f->s, &p, &f->d, &f->p, LS_LORA_RANK_MISMATCH, &f->err);
    const ls_violation *v = tu_expect(&f->err, LS_LORA_RANK_MISMATCH, LS_NA, N(f, TU_GU_A, 0), LS_NA, 4, 2);
    assert_non_null(strstr(v->message, "r = 4"));
    assert_int_equal(f->err.n_violations, 1);
}

static void test_rank_too_large(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    f->p.max_rank = 1;
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_RANK_TOO_LARGE, &f->err);
    const ls_violation *v = tu_expect(&f->err, LS_LORA_RANK_TOO_LARGE, LS_NA, N(f, TU_GU_A, 0), LS_NA, 1, 2);
    assert_non_null(strstr(v->hint, "--max-rank 2"));
    assert_int_equal(f->err.n_violations, 1);
}

static void test_missing_tensor(void **state) {
    tu_fx *f = *state;
    tu_add_peft_layer(&f->s, "", &f->d, 0, 2, 0);
    tu_add_peft_layer(&f->s, "base_model.model.", &f->d, 1, 2, 0);
    tu_remove(&f->s, N(f, TU_D_B, 0));
    char prefixed[192];
    tu_name(prefixed, sizeof prefixed, "base_model.model.", TU_GU_A, 1);
    tu_remove(&f->s, prefixed);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_MISSING_TENSOR, &f->err);
    tu_expect(&f->err, LS_LORA_MISSING_TENSOR, 0, N(f, TU_D_B, 0), LS_NA, LS_NA, LS_NA);
    /* The missing name carries the prefix its partner was uploaded with. */
    tu_expect(&f->err, LS_LORA_MISSING_TENSOR, 1, prefixed, LS_NA, LS_NA, LS_NA);
    assert_int_equal(f->err.n_violations, 2);
}

static void test_unknown_tensor(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    const char *bad[] = {
        "model.layers.0.mlp.shared_experts.w13_weight",
        "optimizer.state",
        "model.layers.01.mlp.shared_experts.gate_up_proj.lora_A.weight",
        "model.layers.-1.mlp.shared_experts.gate_up_proj.lora_A.weight",
        "model.layers.+1.mlp.shared_experts.down_proj.lora_B.weight",
        "model.layers.x.mlp.shared_experts.down_proj.lora_B.weight",
        "model.layers.1.mlp.shared_experts.gate_proj.lora_B.bias",
        "model.layers.1.mlp.shared_experts.down_proj.lora_magnitude_vector",
        "layers.0.mlp.shared_experts.gate_up_proj.lora_A.weight",
        "model.layers.0.mlp.shared_expert_gate.lora_A.default.weight", /* not as PEFT saves it */
        "model.layers.0.mlp.shared_experts.gate_proj.lora_A.default.weight",
        "base_model.model.model.layers.0.mlp.shared_experts.gate_proj.weight", /* modules_to_save copies */
        "model.layers.0.mlp.shared_expert_gate.weight",
        "model.layers.00.mlp.experts.gate_up_proj", /* no layer PyTorch names */
        /* Granite's shared MLP: its DoRA vector, its trained copy, a name it lacks */
        "model.layers.1.shared_mlp.input_linear.lora_magnitude_vector",
        "base_model.model.model.layers.0.shared_mlp.output_linear.weight",
        "model.layers.0.shared_mlp.gate_proj.lora_A.weight",
        /* HunYuan-MoE's, in its MoE block: its DoRA vector, its trained copy, Granite's name */
        "model.layers.1.mlp.shared_mlp.down_proj.lora_magnitude_vector",
        "base_model.model.model.layers.0.mlp.shared_mlp.up_proj.weight",
        "model.layers.0.mlp.shared_mlp.input_linear.lora_A.weight",
    };
    const size_t nbad = sizeof bad / sizeof bad[0];
    const int64_t shape[2] = {2, 4};
    for (size_t i = 0; i < nbad; i++) tu_add_pattern(&f->s, bad[i], LS_DTYPE_F32, shape, 2, 0);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_UNKNOWN_TENSOR, &f->err);
    for (size_t i = 0; i < nbad; i++) tu_expect(&f->err, LS_LORA_UNKNOWN_TENSOR, LS_NA, bad[i], LS_NA, LS_NA, LS_NA);
    assert_int_equal(f->err.n_violations, nbad);
    const ls_violation *v = tu_find(&f->err, LS_LORA_UNKNOWN_TENSOR, bad[2]);
    assert_non_null(strstr(v->message, "layer index"));
    v = tu_find(&f->err, LS_LORA_UNKNOWN_TENSOR, bad[6]);
    assert_non_null(strstr(v->message, "lora_bias"));
    v = tu_find(&f->err, LS_LORA_UNKNOWN_TENSOR, bad[9]);
    assert_non_null(strstr(v->message, "gate"));
    v = tu_find(&f->err, LS_LORA_UNKNOWN_TENSOR, bad[7]);
    assert_non_null(strstr(v->message, "DoRA"));
    for (size_t i = 11; i < 13; i++) {
        v = tu_find(&f->err, LS_LORA_UNKNOWN_TENSOR, bad[i]);
        assert_non_null(strstr(v->message, "trained copy"));
        assert_non_null(strstr(v->hint, "modules_to_save"));
    }
    assert_non_null(strstr(tu_find(&f->err, LS_LORA_UNKNOWN_TENSOR, bad[14])->message, "DoRA"));
    assert_non_null(strstr(tu_find(&f->err, LS_LORA_UNKNOWN_TENSOR, bad[15])->message, "trained copy"));
    assert_non_null(strstr(tu_find(&f->err, LS_LORA_UNKNOWN_TENSOR, bad[17])->message, "DoRA"));
    assert_non_null(strstr(tu_find(&f->err, LS_LORA_UNKNOWN_TENSOR, bad[18])->message, "trained copy"));
}

static void test_layer_out_of_range(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    const int64_t shape[2] = {2, 4};
    tu_add_pattern(&f->s, N(f, TU_GU_A, 5), LS_DTYPE_F32, shape, 2, 0);
    const char *huge = "model.layers.123456789012.mlp.shared_experts.gate_up_proj.lora_B.weight";
    tu_add_pattern(&f->s, huge, LS_DTYPE_F32, shape, 2, 0);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_LAYER_OUT_OF_RANGE, &f->err);
    tu_expect(&f->err, LS_LORA_LAYER_OUT_OF_RANGE, 5, N(f, TU_GU_A, 5), LS_NA, 2, 5);
    tu_expect(&f->err, LS_LORA_LAYER_OUT_OF_RANGE, LS_NA, huge, LS_NA, 2, 123456789012LL);
    assert_int_equal(f->err.n_violations, 2); /* no missing-partner noise for out-of-range layers */
}

static void test_duplicate_factor(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    char prefixed[192];
    const int64_t shape[2] = {2, 4};
    tu_add_pattern(&f->s, tu_name(prefixed, sizeof prefixed, "base_model.model.", TU_GU_A, 0), LS_DTYPE_F32, shape, 2,
                   0);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_UNKNOWN_TENSOR, &f->err);
    const ls_violation *v = tu_expect(&f->err, LS_LORA_UNKNOWN_TENSOR, 0, prefixed, LS_NA, LS_NA, LS_NA);
    assert_non_null(strstr(v->message, "same factor"));
    assert_int_equal(f->err.n_violations, 1);
}

static void test_mixed_formats(void **state) {
    tu_fx *f = *state;
    /* 8 PEFT names and one pool name: the pool name is the minority. */
    fx_peft(f);
    const int64_t ga[4] = {1, 1, 4, 4};
    const char *pool_name = "model.layers.0.mlp.shared_experts.gate_up_lora_a";
    tu_add_pattern(&f->s, pool_name, LS_DTYPE_F32, ga, 4, 0);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_UNKNOWN_TENSOR, &f->err);
    const ls_violation *v = tu_expect(&f->err, LS_LORA_UNKNOWN_TENSOR, LS_NA, pool_name, LS_NA, LS_NA, LS_NA);
    assert_non_null(strstr(v->message, "minority"));
    assert_int_equal(f->err.n_violations, 1);
}

static void test_mixed_formats_tie(void **state) {
    tu_fx *f = *state;
    /* One PEFT layer first, then one pool layer: 4 names each, so the
     * second format (pool) is flagged, every name of it. */
    tu_add_peft_layer(&f->s, "", &f->d, 0, 2, 0);
    tu_add_pool_layer(&f->s, &f->d, 1, 1, 2, 0);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_UNKNOWN_TENSOR, &f->err);
    const char *pool[4] = {"gate_up_lora_a", "gate_up_lora_b", "down_lora_a", "down_lora_b"};
    for (int k = 0; k < 4; k++) {
        char name[192];
        snprintf(name, sizeof name, "model.layers.1.mlp.shared_experts.%s", pool[k]);
        const ls_violation *v = tu_expect(&f->err, LS_LORA_UNKNOWN_TENSOR, LS_NA, name, LS_NA, LS_NA, LS_NA);
        assert_non_null(strstr(v->message, "first factor name decides"));
    }
    assert_int_equal(f->err.n_violations, 4);
}

static void test_explicit_format(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    ls_adapter_params p = {.format = LS_ADAPTER_FORMAT_POOL};
    tu_expect_fail(&f->s, &p, &f->d, &f->p, LS_LORA_UNKNOWN_TENSOR, &f->err);
    assert_int_equal(tu_count(&f->err, LS_LORA_UNKNOWN_TENSOR), 8);
    assert_int_equal(f->err.n_violations, 8); /* named factors, so no lora_empty on top */
    const ls_violation *v = tu_find(&f->err, LS_LORA_UNKNOWN_TENSOR, N(f, TU_D_A, 1));
    assert_non_null(strstr(v->message, "format \"pool\""));
    assert_non_null(strstr(v->hint, "\"peft\""));
}

static void test_nonfinite(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    tu_f32_data(&f->s, N(f, TU_D_A, 1))[5] = NAN;
    float *b = tu_f32_data(&f->s, N(f, TU_GU_B, 0));
    b[3] = INFINITY;
    b[7] = -INFINITY;
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_NONFINITE, &f->err);
    const ls_violation *v = tu_expect(&f->err, LS_LORA_NONFINITE, 1, N(f, TU_D_A, 1), LS_NA, LS_NA, LS_NA);
    assert_non_null(strstr(v->message, "NaN at flat index 5"));
    v = tu_expect(&f->err, LS_LORA_NONFINITE, 0, N(f, TU_GU_B, 0), LS_NA, LS_NA, LS_NA);
    assert_non_null(strstr(v->message, "Inf at flat index 3"));
    assert_non_null(strstr(v->message, "2 non-finite"));
    assert_int_equal(f->err.n_violations, 2);
}

static void test_nonfinite_bf16(void **state) {
    tu_fx *f = *state;
    const int64_t a[2] = {2, 4};
    float v[8] = {0, 0, 0, 0, 0, 0, 0, NAN};
    tu_add(&f->s, N(f, TU_GU_A, 0), LS_DTYPE_BF16, a, 2, v);
    const int64_t b[2] = {12, 2};
    tu_add_pattern(&f->s, N(f, TU_GU_B, 0), LS_DTYPE_F32, b, 2, 0);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_NONFINITE, &f->err);
    const ls_violation *x = tu_expect(&f->err, LS_LORA_NONFINITE, 0, N(f, TU_GU_A, 0), LS_NA, LS_NA, LS_NA);
    assert_non_null(strstr(x->message, "flat index 7"));
}

static void test_scale_overflow(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    ls_adapter_params p = {.has_alpha = true, .lora_alpha = 1e300};
    tu_expect_fail(&f->s, &p, &f->d, &f->p, LS_LORA_NONFINITE, &f->err);
    /* every B factor of both layers overflows, and each is named */
    for (int l = 0; l < 2; l++) {
        const ls_violation *v = tu_expect(&f->err, LS_LORA_NONFINITE, l, N(f, TU_GU_B, l), LS_NA, LS_NA, LS_NA);
        assert_non_null(strstr(v->message, "scaled"));
        tu_expect(&f->err, LS_LORA_NONFINITE, l, N(f, TU_D_B, l), LS_NA, LS_NA, LS_NA);
    }
    assert_int_equal(f->err.n_violations, 4);
}

static void test_empty(void **state) {
    tu_fx *f = *state;
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_EMPTY, &f->err);
    tu_expect(&f->err, LS_LORA_EMPTY, LS_NA, "", LS_NA, LS_NA, LS_NA);
    assert_int_equal(f->err.n_violations, 1);

    /* Only other modules' factors: skipped, so nothing is left. */
    ls_error_clear(&f->err);
    const int64_t shape[2] = {2, 4};
    tu_add_pattern(&f->s, "model.layers.0.self_attn.o_proj.lora_A.weight", LS_DTYPE_F32, shape, 2, 0);
    tu_add_pattern(&f->s, "model.layers.0.self_attn.o_proj.lora_B.weight", LS_DTYPE_F32, shape, 2, 0);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_EMPTY, &f->err);
    const ls_violation *v = tu_expect(&f->err, LS_LORA_EMPTY, LS_NA, "", LS_NA, LS_NA, LS_NA);
    assert_non_null(strstr(v->message, "2 tensors of other modules"));
    assert_non_null(strstr(v->hint, "target_parameters"));
    assert_int_equal(f->err.n_violations, 1);
}

static void test_bad_params(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    ls_adapter_params p = {.r = -3, .has_alpha = true, .lora_alpha = NAN};
    tu_expect_fail(&f->s, &p, &f->d, &f->p, LS_ADAPTER_CONFIG_INVALID, &f->err);
    assert_int_equal(tu_count(&f->err, LS_ADAPTER_CONFIG_INVALID), 2);
}

static void test_byte_count_mismatch(void **state) {
    tu_fx *f = *state;
    fx_peft(f);
    for (size_t i = 0; i < f->s.n; i++)
        if (!strcmp(f->s.items[i].name, N(f, TU_D_B, 1))) f->s.items[i].t.nbytes -= 4;
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_INVALID_SHAPE, &f->err);
    tu_expect(&f->err, LS_INVALID_SHAPE, 1, N(f, TU_D_B, 1), LS_NA, 32, 28);
}

/* Independent problems in different layers all come back at once, in
 * order, and the top-level code is the first one's. */
static void test_many_violations(void **state) {
    tu_fx *f = *state;
    f->d.L = 3;
    tu_add_peft_layer(&f->s, "", &f->d, 0, 2, 0);
    tu_add_peft_layer(&f->s, "", &f->d, 1, 2, 8); /* no down B */
    tu_add_peft_layer(&f->s, "", &f->d, 2, 2, 0);
    const int64_t a[2] = {2, 5};
    tu_replace(&f->s, N(f, TU_GU_A, 0), LS_DTYPE_F32, a, 2);
    tu_f32_data(&f->s, N(f, TU_GU_B, 2))[0] = NAN;
    const int64_t shape[1] = {3};
    tu_add_pattern(&f->s, "lora_config_blob", LS_DTYPE_F32, shape, 1, 0);
    tu_expect_fail(&f->s, &tu_scale1, &f->d, &f->p, LS_LORA_UNKNOWN_TENSOR, &f->err);
    tu_expect(&f->err, LS_LORA_UNKNOWN_TENSOR, LS_NA, "lora_config_blob", LS_NA, LS_NA, LS_NA);
    tu_expect(&f->err, LS_LORA_HIDDEN_MISMATCH, 0, N(f, TU_GU_A, 0), 1, 4, 5);
    tu_expect(&f->err, LS_LORA_MISSING_TENSOR, 1, N(f, TU_D_B, 1), LS_NA, LS_NA, LS_NA);
    tu_expect(&f->err, LS_LORA_NONFINITE, 2, N(f, TU_GU_B, 2), LS_NA, LS_NA, LS_NA);
    assert_int_equal(f->err.n_violations, 4);
    assert_string_equal(f->err.message, f->err.violations[0].message);
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, tu_fx_setup, tu_fx_teardown)
    const struct CMUnitTest tests[] = {
        T(test_valid_baseline),     T(test_dtype_unsupported),    T(test_peft_not_2d),
        T(test_peft_not_2d_keeps_checking), T(test_peft_none_2d),
        T(test_hidden_mismatch),    T(test_extent_not_divisible), T(test_intermediate_mismatch),
        T(test_peft_rank_mismatch), T(test_peft_transposed),      T(test_config_rank_mismatch),
        T(test_rank_too_large),     T(test_missing_tensor),       T(test_unknown_tensor),
        T(test_layer_out_of_range), T(test_duplicate_factor),     T(test_mixed_formats),
        T(test_mixed_formats_tie),  T(test_explicit_format),      T(test_nonfinite),
        T(test_nonfinite_bf16),     T(test_scale_overflow),       T(test_empty),
        T(test_bad_params),         T(test_byte_count_mismatch),  T(test_many_violations),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
