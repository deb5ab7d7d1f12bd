/* Adapter validation, pool format: sglang's checks in its order (four
 * buffers, 4D, outer dim, layout, expert count, ranks; the seed error's
 * hint), the slot axis, model axes, rank and layout across layers, max
 * rank and per-expert outer factors into a shared pool; no noise from
 * checks that depend on a failed one. */
#include <math.h>

#include "lora/adapter_rules.h"
#include "tests/util/adapter_fixture.h"

/* Full name of buffer buf ("gate_up_lora_a", ...) of layer l. */
static const char *B(tu_fx *f, const char *buf, int l) {
    snprintf(f->name, sizeof f->name, "model.layers.%d.mlp.shared_experts.%s", l, buf);
    return f->name;
}

static void set_shape(tu_fx *f, const char *buf, int l, int64_t a0, int64_t a1, int64_t a2, int64_t a3) {
    const int64_t shape[4] = {a0, a1, a2, a3};
    tu_replace(&f->s, B(f, buf, l), LS_DTYPE_F32, shape, 4);
}

static void test_valid_baseline(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    tu_add_pool_layer(&f->s, &f->d, 1, 1, 2, 0);
    ls_adapter a;
    assert_int_equal(ls_adapter_normalise(&f->s, NULL, &f->d, &f->p, &a, &f->err), LS_OK);
    assert_int_equal(a.meta.format, LS_ADAPTER_FORMAT_POOL);
    ls_adapter_free(&a);
}

static void test_missing_buffer(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 8);
    tu_add_pool_layer(&f->s, &f->d, 1, 1, 2, 0);
    set_shape(f, "down_lora_a", 1, 1, 2, 2, 5); /* layer 1 is still checked */
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_MISSING_TENSOR, &f->err);
    tu_expect(&f->err, LS_LORA_MISSING_TENSOR, 0, B(f, "down_lora_b", 0), LS_NA, LS_NA, LS_NA);
    tu_expect(&f->err, LS_LORA_INTERMEDIATE_MISMATCH, 1, B(f, "down_lora_a", 1), 3, 3, 5);
    assert_int_equal(f->err.n_violations, 2);
}

/* A missing buffer does not hide the rest of its layer either: the
 * buffers that are there are still checked (their H axis here). */
static void test_missing_keeps_checking_layer(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 8);
    tu_add_pool_layer(&f->s, &f->d, 1, 1, 2, 0);
    set_shape(f, "gate_up_lora_a", 0, 1, 1, 4, 5);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_MISSING_TENSOR, &f->err);
    tu_expect(&f->err, LS_LORA_MISSING_TENSOR, 0, B(f, "down_lora_b", 0), LS_NA, LS_NA, LS_NA);
    tu_expect(&f->err, LS_LORA_HIDDEN_MISMATCH, 0, B(f, "gate_up_lora_a", 0), 3, 4, 5);
    assert_int_equal(f->err.n_violations, 2);
}

static void test_not_4d(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    tu_add_pool_layer(&f->s, &f->d, 1, 1, 2, 0);
    const int64_t shape[3] = {2, 6, 2};
    tu_replace(&f->s, B(f, "gate_up_lora_b", 0), LS_DTYPE_F32, shape, 3);
    set_shape(f, "gate_up_lora_a", 1, 1, 1, 4, 7);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_NOT_4D, &f->err);
    tu_expect(&f->err, LS_LORA_NOT_4D, 0, B(f, "gate_up_lora_b", 0), LS_NA, 4, 3);
    tu_expect(&f->err, LS_LORA_HIDDEN_MISMATCH, 1, B(f, "gate_up_lora_a", 1), 3, 4, 7);
    /* nothing else from layer 0: its rank and axes depend on the 4D shape */
    assert_int_equal(f->err.n_violations, 2);
}

/* The audit's upload: one layer with a squeezed (2D) down_lora_b, an
 * inner expert axis of 3 and a wrong H. The 2D buffer used to stop the
 * checks of its layer, so only lora_not_4d came back. */
static void test_not_4d_keeps_checking_layer(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    tu_add_pool_layer(&f->s, &f->d, 1, 1, 2, 0);
    const int64_t db[2] = {4, 2};
    tu_replace(&f->s, B(f, "down_lora_b", 0), LS_DTYPE_F32, db, 2);
    set_shape(f, "down_lora_a", 0, 1, 3, 2, 3);
    set_shape(f, "gate_up_lora_a", 0, 1, 1, 4, 5);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_NOT_4D, &f->err);
    tu_expect(&f->err, LS_LORA_NOT_4D, 0, B(f, "down_lora_b", 0), LS_NA, 4, 2);
    tu_expect(&f->err, LS_LORA_EXPERT_COUNT_MISMATCH, 0, B(f, "down_lora_a", 0), 1, 2, 3);
    tu_expect(&f->err, LS_LORA_HIDDEN_MISMATCH, 0, B(f, "gate_up_lora_a", 0), 3, 4, 5);
    assert_int_equal(f->err.n_violations, 3);
}

/* Problems in two layers, each with a buffer that is not 4D: every one
 * is listed, and the layer whose rank reference (gate_up_lora_b) is not
 * 4D gets no rank checks rather than mismatches against a guess. */
static void test_not_4d_two_layers(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    tu_add_pool_layer(&f->s, &f->d, 1, 1, 2, 0);
    const int64_t gb[3] = {2, 6, 2}, ga[2] = {4, 4};
    tu_replace(&f->s, B(f, "gate_up_lora_b", 0), LS_DTYPE_F32, gb, 3);
    set_shape(f, "down_lora_a", 0, 1, 2, 2, 4);
    set_shape(f, "down_lora_b", 0, 2, 1, 4, 2);
    tu_replace(&f->s, B(f, "gate_up_lora_a", 1), LS_DTYPE_F32, ga, 2);
    set_shape(f, "gate_up_lora_b", 1, 1, 3, 6, 2);
    set_shape(f, "down_lora_b", 1, 1, 1, 4, 3);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_NOT_4D, &f->err);
    tu_expect(&f->err, LS_LORA_NOT_4D, 0, B(f, "gate_up_lora_b", 0), LS_NA, 4, 3);
    tu_expect(&f->err, LS_LORA_SLOT_AXIS_INVALID, 0, B(f, "down_lora_b", 0), 0, 1, 2);
    tu_expect(&f->err, LS_LORA_INTERMEDIATE_MISMATCH, 0, B(f, "down_lora_a", 0), 3, 3, 4);
    tu_expect(&f->err, LS_LORA_NOT_4D, 1, B(f, "gate_up_lora_a", 1), LS_NA, 4, 2);
    tu_expect(&f->err, LS_LORA_EXPERT_COUNT_MISMATCH, 1, B(f, "gate_up_lora_b", 1), 1, 2, 3);
    tu_expect(&f->err, LS_LORA_RANK_MISMATCH, 1, B(f, "down_lora_b", 1), 3, 2, 3);
    assert_int_equal(f->err.n_violations, 6);
    /* in sglang's order within a layer, layer after layer */
    assert_int_equal(f->err.violations[0].code, LS_LORA_NOT_4D);
    assert_int_equal(f->err.violations[2].code, LS_LORA_INTERMEDIATE_MISMATCH);
    assert_int_equal(f->err.violations[3].code, LS_LORA_NOT_4D);
    assert_int_equal(f->err.violations[5].code, LS_LORA_RANK_MISMATCH);
}

/* Any one buffer not 4D, in any rank: one violation, no rank or layout
 * mismatch that exists only because its axes could not be read. */
static void test_not_4d_no_consequences(void **state) {
    tu_fx *f = *state;
    static const char *const bufs[4] = {"gate_up_lora_a", "gate_up_lora_b", "down_lora_a", "down_lora_b"};
    const int64_t shapes[3][5] = {{7}, {1, 2}, {1, 1, 2, 4, 2}};
    const int ndims[3] = {1, 2, 5};
    for (int k = 0; k < 4; k++) {
        for (int s = 0; s < 3; s++) {
            ls_tensor_set_free(&f->s);
            ls_tensor_set_init(&f->s);
            ls_error_clear(&f->err);
            tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
            tu_add_pool_layer(&f->s, &f->d, 1, 1, 2, 0);
            tu_replace(&f->s, B(f, bufs[k], 1), LS_DTYPE_F32, shapes[s], ndims[s]);
            tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_NOT_4D, &f->err);
            tu_expect(&f->err, LS_LORA_NOT_4D, 1, B(f, bufs[k], 1), LS_NA, 4, ndims[s]);
            if (f->err.n_violations != 1) tu_dump(&f->err);
            assert_int_equal(f->err.n_violations, 1);
        }
    }
}

/* What the 4D buffers of a layer still show counts across layers: a
 * layer at another rank, or with other outer factors, is reported even
 * when one of its buffers is not 4D. */
static void test_not_4d_layer_still_compared(void **state) {
    tu_fx *f = *state;
    f->d.L = 3;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    tu_add_pool_layer(&f->s, &f->d, 1, 1, 2, 0);
    tu_add_pool_layer(&f->s, &f->d, 2, 1, 3, 0);
    const int64_t db[2] = {4, 3};
    tu_replace(&f->s, B(f, "down_lora_b", 2), LS_DTYPE_F32, db, 2);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_NOT_4D, &f->err);
    tu_expect(&f->err, LS_LORA_NOT_4D, 2, B(f, "down_lora_b", 2), LS_NA, 4, 2);
    tu_expect(&f->err, LS_LORA_RANK_MISMATCH, 2, B(f, "gate_up_lora_b", 2), 3, 2, 3);
    assert_int_equal(f->err.n_violations, 2);

    /* per-expert outer factors: gate_up_lora_a squeezed, down_lora_b O = n
     * where the other layers use O = 1 */
    ls_tensor_set_free(&f->s);
    ls_tensor_set_init(&f->s);
    ls_error_clear(&f->err);
    f->p.layout = LS_LORA_PER_EXPERT;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    tu_add_pool_layer(&f->s, &f->d, 1, 1, 2, 0);
    tu_add_pool_layer(&f->s, &f->d, 2, 2, 2, 0);
    const int64_t ga[3] = {2, 4, 4};
    tu_replace(&f->s, B(f, "gate_up_lora_a", 2), LS_DTYPE_F32, ga, 3);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_NOT_4D, &f->err);
    tu_expect(&f->err, LS_LORA_NOT_4D, 2, B(f, "gate_up_lora_a", 2), LS_NA, 4, 3);
    tu_expect(&f->err, LS_LORA_EXPERT_LAYOUT_MISMATCH, 2, B(f, "down_lora_b", 2), 1, 1, 2);
    assert_int_equal(f->err.n_violations, 2);
}

/* More than LS_ERROR_MAX_VIOLATIONS problems, four a layer with one of
 * them lora_not_4d: the list is full and the rest counted as dropped
 * (violations_dropped in the reply). */
static void test_not_4d_violations_dropped(void **state) {
    tu_fx *f = *state;
    f->d.L = 70;
    const int64_t db[2] = {4, 2};
    for (int l = 0; l < f->d.L; l++) {
        tu_add_pool_layer(&f->s, &f->d, l, 1, 2, 0);
        tu_replace(&f->s, B(f, "down_lora_b", l), LS_DTYPE_F32, db, 2);
        set_shape(f, "down_lora_a", l, 1, 3, 2, 3);
        set_shape(f, "gate_up_lora_a", l, 1, 1, 4, 5);
        set_shape(f, "gate_up_lora_b", l, 1, 2, 8, 2);
    }
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_NOT_4D, &f->err);
    assert_int_equal(f->err.n_violations, LS_ERROR_MAX_VIOLATIONS);
    assert_int_equal(f->err.dropped, 4 * 70 - LS_ERROR_MAX_VIOLATIONS);
    assert_int_equal(tu_count(&f->err, LS_LORA_NOT_4D), 64);
    assert_int_equal(tu_count(&f->err, LS_LORA_HIDDEN_MISMATCH), 64);
    assert_int_equal(f->err.violations[LS_ERROR_MAX_VIOLATIONS - 1].code, LS_LORA_INTERMEDIATE_MISMATCH);
    assert_int_equal(f->err.violations[LS_ERROR_MAX_VIOLATIONS - 1].layer, 63);
}

static void test_slot_axis(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    set_shape(f, "down_lora_a", 0, 3, 2, 2, 3);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_SLOT_AXIS_INVALID, &f->err);
    tu_expect(&f->err, LS_LORA_SLOT_AXIS_INVALID, 0, B(f, "down_lora_a", 0), 0, 1, 3);
    assert_int_equal(f->err.n_violations, 1);
}

static void test_outer_dim_invalid(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    set_shape(f, "gate_up_lora_a", 0, 1, 3, 4, 4);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_OUTER_DIM_INVALID, &f->err);
    tu_expect(&f->err, LS_LORA_OUTER_DIM_INVALID, 0, B(f, "gate_up_lora_a", 0), 1, 2, 3);
    assert_int_equal(f->err.n_violations, 1); /* no layout mismatch on top */
}

static void test_expert_layout_mismatch(void **state) {
    tu_fx *f = *state;
    f->p.layout = LS_LORA_PER_EXPERT;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    set_shape(f, "down_lora_b", 0, 1, 2, 4, 2);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_EXPERT_LAYOUT_MISMATCH, &f->err);
    tu_expect(&f->err, LS_LORA_EXPERT_LAYOUT_MISMATCH, 0, B(f, "down_lora_b", 0), 1, 1, 2);
    assert_int_equal(f->err.n_violations, 1);
}

static void test_layout_across_layers(void **state) {
    tu_fx *f = *state;
    f->d.L = 3;
    f->p.layout = LS_LORA_PER_EXPERT;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    tu_add_pool_layer(&f->s, &f->d, 1, 2, 2, 0);
    tu_add_pool_layer(&f->s, &f->d, 2, 1, 2, 0);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_EXPERT_LAYOUT_MISMATCH, &f->err);
    tu_expect(&f->err, LS_LORA_EXPERT_LAYOUT_MISMATCH, 1, B(f, "gate_up_lora_a", 1), 1, 1, 2);
    assert_int_equal(f->err.n_violations, 1);
}

static void test_expert_count(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    set_shape(f, "gate_up_lora_b", 0, 1, 3, 6, 2);
    set_shape(f, "down_lora_a", 0, 1, 1, 2, 3);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_EXPERT_COUNT_MISMATCH, &f->err);
    tu_expect(&f->err, LS_LORA_EXPERT_COUNT_MISMATCH, 0, B(f, "gate_up_lora_b", 0), 1, 2, 3);
    tu_expect(&f->err, LS_LORA_EXPERT_COUNT_MISMATCH, 0, B(f, "down_lora_a", 0), 1, 2, 1);
    assert_int_equal(f->err.n_violations, 2);
}

/* The seed error (shared/seeds): gate and up A not fused, so
 * gate_up_lora_a has r rows on its rank axis instead of 2r. */
static void test_seed_rank_mismatch(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    set_shape(f, "gate_up_lora_a", 0, 1, 1, 2, 4);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_RANK_MISMATCH, &f->err);
    const ls_violation *v = tu_expect(&f->err, LS_LORA_RANK_MISMATCH, 0, B(f, "gate_up_lora_a", 0), 2, 4, 2);
    assert_string_equal(v->message,
                        "layer 0: gate_up_lora_a rank axis is 2, expected 2*r = 4 (r = 2 from gate_up_lora_b)");
    assert_non_null(strstr(v->hint, "fuse the gate and up A matrices along the rank axis"));
    assert_non_null(strstr(v->hint, "2*r"));
    assert_string_equal(f->err.hint, v->hint);
    assert_int_equal(f->err.n_violations, 1);
}

static void test_down_rank_mismatch(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    set_shape(f, "down_lora_a", 0, 1, 2, 3, 3);
    set_shape(f, "down_lora_b", 0, 1, 1, 4, 1);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_RANK_MISMATCH, &f->err);
    tu_expect(&f->err, LS_LORA_RANK_MISMATCH, 0, B(f, "down_lora_a", 0), 2, 2, 3);
    tu_expect(&f->err, LS_LORA_RANK_MISMATCH, 0, B(f, "down_lora_b", 0), 3, 2, 1);
    assert_int_equal(f->err.n_violations, 2);
}

static void test_model_axes(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    set_shape(f, "gate_up_lora_a", 0, 1, 1, 4, 5);
    set_shape(f, "gate_up_lora_b", 0, 1, 2, 5, 2);
    set_shape(f, "down_lora_a", 0, 1, 2, 2, 4);
    set_shape(f, "down_lora_b", 0, 1, 1, 6, 2);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_HIDDEN_MISMATCH, &f->err);
    tu_expect(&f->err, LS_LORA_HIDDEN_MISMATCH, 0, B(f, "gate_up_lora_a", 0), 3, 4, 5);
    tu_expect(&f->err, LS_LORA_INTERMEDIATE_MISMATCH, 0, B(f, "gate_up_lora_b", 0), 2, 6, 5);
    tu_expect(&f->err, LS_LORA_INTERMEDIATE_MISMATCH, 0, B(f, "down_lora_a", 0), 3, 3, 4);
    tu_expect(&f->err, LS_LORA_HIDDEN_MISMATCH, 0, B(f, "down_lora_b", 0), 2, 4, 6);
    assert_int_equal(f->err.n_violations, 4);
}

/* A zero extent elsewhere lets a shape carry an absurd rank axis with no
 * data; it must be refused, not overflow 2*r. */
static void test_absurd_rank_axis(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    set_shape(f, "gate_up_lora_b", 0, 1, 2, 0, INT64_C(1) << 62);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_INVALID_SHAPE, &f->err);
    tu_expect(&f->err, LS_INVALID_SHAPE, 0, B(f, "gate_up_lora_b", 0), 3, LS_NA, INT64_C(1) << 62);
    tu_expect(&f->err, LS_LORA_INTERMEDIATE_MISMATCH, 0, B(f, "gate_up_lora_b", 0), 2, 6, 0);
    assert_int_equal(f->err.n_violations, 2);
}

static void test_rank_across_layers(void **state) {
    tu_fx *f = *state;
    f->d.L = 3;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    tu_add_pool_layer(&f->s, &f->d, 1, 1, 2, 0);
    tu_add_pool_layer(&f->s, &f->d, 2, 1, 3, 0);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_RANK_MISMATCH, &f->err);
    tu_expect(&f->err, LS_LORA_RANK_MISMATCH, 2, B(f, "gate_up_lora_b", 2), 3, 2, 3);
    assert_int_equal(f->err.n_violations, 1);
}

static void test_rank_too_large(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 6, 0);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_RANK_TOO_LARGE, &f->err);
    const ls_violation *v = tu_expect(&f->err, LS_LORA_RANK_TOO_LARGE, LS_NA, B(f, "gate_up_lora_b", 0), 3, 4, 6);
    assert_non_null(strstr(v->hint, "--max-rank 6"));
    assert_int_equal(f->err.n_violations, 1);
}

static void test_config_rank(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    ls_adapter_params p = {.r = 3};
    tu_expect_fail(&f->s, &p, &f->d, &f->p, LS_LORA_RANK_MISMATCH, &f->err);
    tu_expect(&f->err, LS_LORA_RANK_MISMATCH, LS_NA, B(f, "gate_up_lora_b", 0), 3, 3, 2);
    assert_int_equal(f->err.n_violations, 1);
}

static void test_layout_unsupported(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 2, 2, 0);
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_LAYOUT_UNSUPPORTED, &f->err);
    const ls_violation *v = tu_expect(&f->err, LS_LORA_LAYOUT_UNSUPPORTED, 0, B(f, "gate_up_lora_a", 0), 1, 1, 2);
    assert_non_null(strstr(v->hint, "--lora-layout per-expert"));
    assert_int_equal(f->err.n_violations, 1);
}

static void test_pool_dtype_and_nonfinite(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    tu_add_pool_layer(&f->s, &f->d, 1, 1, 2, 0);
    const int64_t shape[4] = {1, 2, 2, 3};
    tu_replace(&f->s, B(f, "down_lora_a", 0), LS_DTYPE_U8, shape, 4);
    tu_f32_data(&f->s, B(f, "down_lora_b", 1))[6] = -INFINITY;
    tu_expect_fail(&f->s, NULL, &f->d, &f->p, LS_LORA_DTYPE_UNSUPPORTED, &f->err);
    tu_expect(&f->err, LS_LORA_DTYPE_UNSUPPORTED, 0, B(f, "down_lora_a", 0), LS_NA, LS_NA, LS_NA);
    const ls_violation *v = tu_expect(&f->err, LS_LORA_NONFINITE, 1, B(f, "down_lora_b", 1), LS_NA, LS_NA, LS_NA);
    assert_non_null(strstr(v->message, "flat index 6"));
    assert_int_equal(f->err.n_violations, 2);
}

/* Pool buffers are used as they are, times scale: a stated lora_alpha,
 * use_rslora or alpha_pattern used to load with scale 1, the term
 * dropped without a word (a newcomer who forgot to fold the scale got
 * other outputs than PEFT's). Each is refused naming itself; scale, and
 * use_rslora false, still load. */
static void test_peft_terms_refused(void **state) {
    tu_fx *f = *state;
    tu_add_pool_layer(&f->s, &f->d, 0, 1, 2, 0);
    tu_add_pool_layer(&f->s, &f->d, 1, 1, 2, 0);
    ls_adapter_params alpha = {.has_alpha = true, .lora_alpha = 16};
    ls_adapter_params rslora = {.has_rslora = true, .use_rslora = true};
    ls_adapter_params pattern = {0};
    ls_error perr;
    ls_error_init(&perr);
    assert_int_equal(ls_peft_rules_from_text("alpha_pattern", "{\"down_proj\": 4}", "metadata", pattern.peft,
                                             sizeof pattern.peft, &perr),
                     LS_OK);
    ls_error_free(&perr);
    const ls_adapter_params *refused[] = {&alpha, &rslora, &pattern};
    const char *const term[] = {"lora_alpha applies", "use_rslora applies", "alpha_pattern applies"};
    for (int i = 0; i < 3; i++) {
        ls_error_clear(&f->err);
        tu_expect_fail(&f->s, refused[i], &f->d, &f->p, LS_ADAPTER_CONFIG_INVALID, &f->err);
        const ls_violation *v = tu_expect(&f->err, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA);
        assert_non_null(strstr(v->message, term[i]));
        assert_non_null(strstr(v->hint, "scale = lora_alpha / r"));
        assert_int_equal(f->err.n_violations, 1);
    }
    const ls_adapter_params ok[] = {{.has_scale = true, .scale = 2}, {.has_rslora = true, .use_rslora = false}};
    for (int i = 0; i < 2; i++) {
        ls_adapter a;
        ls_error_clear(&f->err);
        assert_int_equal(ls_adapter_normalise(&f->s, &ok[i], &f->d, &f->p, &a, &f->err), LS_OK);
        assert_true(a.meta.scale == (i == 0 ? 2.0 : 1.0));
        ls_adapter_free(&a);
    }
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, tu_fx_setup, tu_fx_teardown)
    const struct CMUnitTest tests[] = {
        T(test_valid_baseline),
        T(test_missing_buffer),
        T(test_not_4d),
        T(test_not_4d_keeps_checking_layer),
        T(test_missing_keeps_checking_layer),
        T(test_not_4d_two_layers),
        T(test_not_4d_no_consequences),
        T(test_not_4d_layer_still_compared),
        T(test_not_4d_violations_dropped),
        T(test_slot_axis),
        T(test_outer_dim_invalid),
        T(test_expert_layout_mismatch),
        T(test_layout_across_layers),
        T(test_expert_count),
        T(test_seed_rank_mismatch),
        T(test_down_rank_mismatch),
        T(test_model_axes),
        T(test_absurd_rank_axis),
        T(test_rank_across_layers),
        T(test_rank_too_large),
        T(test_config_rank),
        T(test_peft_terms_refused),
        T(test_layout_unsupported),
        T(test_pool_dtype_and_nonfinite),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
