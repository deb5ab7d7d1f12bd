/* The CUDA forward's host-side plan (gpu/lora_plan.h) run on the CPU: the
 * device's W13 row order, the derived operands and the list of GEMMs,
 * executed here row by row in double as the CUDA backend runs them, equal
 * the independent fp64 reference (tests/util/reference.c) for both W13
 * layouts, both pool layouts and slots of every rank. Every element past a
 * slot's rank, in the derived operands and in the shrinks' outputs, is a
 * NaN here: a GEMM that read one, or a rank cut on the wrong dimension,
 * fails the test. Also the shared rank detection (gpu/slot_rank.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/lora_plan.h"
#include "gpu/slot_rank.h"
#include "tests/util/reference.h"
#include "tests/util/testutil.h"

#define S 3
#define R 4
#define T 7

/* One slot's canonical factors at the pool's (O, R) and the same adapter
 * compact at its rank, for the reference. */
typedef struct {
    int r;
    float *f[4];       /* gu_a, gu_b, d_a, d_b padded to R */
    double *compact;   /* the reference's copy */
    ls_ref_lora ref;
    float *der[4];     /* agu, b13, adcat, bdcat */
} slot;

static void slot_make(slot *s, const ls_dims *d, const ls_pool_dims *p, int r, unsigned long long *seed) {
    const int O = ls_pool_outer(d, p);
    const ls_factor_layout pl = ls_pool_layout(d, p), cl = ls_factor_layout_of(d, O, r);
    for (int k = 0; k < 4; k++) s->f[k] = ls_test_calloc(pl.len[k], sizeof(float));
    s->compact = ls_test_calloc(cl.total + 1, sizeof(double));
    ls_ref_fill_uniform(s->compact, (long)cl.total, 0.5, seed);
    for (size_t i = 0; i < cl.total; i++) s->compact[i] = (double)(float)s->compact[i];
    s->r = r;
    s->ref = (ls_ref_lora){.r = r,
                           .outer = O,
                           .gu_a = s->compact + cl.off[0],
                           .gu_b = s->compact + cl.off[1],
                           .d_a = s->compact + cl.off[2],
                           .d_b = s->compact + cl.off[3]};
    ls_ref_lora_pad(d, p, &s->ref, s->f[0], s->f[1], s->f[2], s->f[3]);
}

/* The derived operands, with every element at a rank index >= r made NaN. */
static void slot_derive(slot *s, const ls_dims *d, const ls_pool_dims *p) {
    const ls_lora_derived_lens l = ls_lora_derived_lens_of(d, p);
    const size_t lens[4] = {l.agu, l.b13, l.adcat, l.bdcat};
    for (int k = 0; k < 4; k++) s->der[k] = ls_test_calloc(lens[k], sizeof(float));
    const ls_slot_factors f = {s->f[0], s->f[1], s->f[2], s->f[3], NULL};
    ls_lora_derive(d, p, &f, s->der[0], s->der[1], s->der[2], s->der[3]);
    const size_t H = d->H, nF = (size_t)d->n * d->F, O = ls_pool_outer(d, p);
    for (size_t i = 0; i < l.agu; i++)
        if ((i / H) % R >= (size_t)s->r) s->der[0][i] = NAN;
    for (size_t i = 0; i < l.b13; i++)
        if (i % R >= (size_t)s->r) s->der[1][i] = NAN;
    for (size_t i = 0; i < l.adcat; i++)
        if (i / nF >= (size_t)s->r) s->der[2][i] = NAN;
    for (size_t i = 0; i < l.bdcat; i++)
        if ((i % (O * R)) % R >= (size_t)s->r) s->der[3][i] = NAN;
}

static void slot_free(slot *s) {
    for (int k = 0; k < 4; k++) {
        free(s->f[k]);
        free(s->der[k]);
    }
    free(s->compact);
}

/* One row's buffers (ls_op_buf order) and their lengths (for a token's
 * buffer, its row width); each value read must be inside its buffer and
 * not one of the NaNs. */
typedef struct {
    const float *ro[12];
    double *rw[12];
    size_t len[12];
} row_bufs;

static double at(const row_bufs *b, ls_op_buf which, long long i) {
    assert_true(i >= 0 && (size_t)i < b->len[which]);
    const double v = b->ro[which] ? (double)b->ro[which][i] : b->rw[which][i];
    assert_false(isnan(v)); /* past a rank, or never written */
    return v;
}

/* One op on one row, as lora_plan.h defines it, at rank r. */
static void run_op(const ls_gemm_op *op, int r, row_bufs *b) {
    const int N = ls_gemm_op_n(op, r), K = ls_gemm_op_k(op, r);
    assert_true(N <= op->N && K <= op->K);
    /* One row of X and of C each: the op's leading dimensions must be
     * those rows' widths, or row t + 1 would be read or written. */
    assert_int_equal((size_t)op->ldx, b->len[op->x]);
    assert_int_equal((size_t)op->ldc, b->len[op->c]);
    assert_null(b->ro[op->c]);
    for (int bt = 0; bt < op->batch; bt++)
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++)
                acc += at(b, op->x, op->x_off + bt * op->x_bs + k) *
                       at(b, op->w, op->w_off + bt * op->w_bs + (long long)j * op->ldw + k);
            const long long ci = op->c_off + bt * op->c_bs + j;
            assert_true(ci >= 0 && (size_t)ci < b->len[op->c] && !b->ro[op->c]);
            b->rw[op->c][ci] = op->beta ? b->rw[op->c][ci] + acc : acc;
        }
}

/* SwiGLU x gamma on the device's z order ([2][n][F]). */
static void swiglu(const ls_dims *d, const double *z, const double *gam, double *a) {
    const int nF = d->n * d->F;
    for (int i = 0; i < nF; i++) {
        const double g = z[i], u = z[nF + i];
        a[i] = gam[i / d->F] * g / (1.0 + exp(-g)) * u;
    }
}

static void check_plan(ls_w13_layout w13l, ls_lora_layout ll) {
    const ls_dims d = {.n = 2, .H = 12, .F = 6, .L = 1, .w13_layout = w13l};
    const ls_pool_dims p = {.slots = S, .max_rank = R, .layout = ll, .max_tokens = T};
    const int n = d.n, H = d.H, F = d.F, nF = n * F, O = ls_pool_outer(&d, &p);
    unsigned long long seed = 7 + 2 * w13l + ll;
    double *w13 = ls_test_calloc((size_t)2 * nF * H, sizeof(double)), *w2 = ls_test_calloc((size_t)nF * H, sizeof(double));
    ls_ref_fill_uniform(w13, 2L * nF * H, 0.5, &seed);
    ls_ref_fill_uniform(w2, (long)nF * H, 0.5, &seed);
    for (long i = 0; i < 2L * nF * H; i++) w13[i] = (double)(float)w13[i];
    for (long i = 0; i < (long)nF * H; i++) w2[i] = (double)(float)w2[i];
    /* The device's images of the base weights. */
    float *w13d = ls_test_calloc((size_t)2 * nF * H, sizeof(float)), *w2cat = ls_test_calloc((size_t)nF * H, sizeof(float));
    for (size_t row = 0; row < (size_t)2 * nF; row++) {
        const size_t src = ls_w13_device_source_row(w13l, n, F, row);
        for (int x = 0; x < H; x++) w13d[row * H + x] = (float)w13[src * H + x];
    }
    for (int h = 0; h < H; h++)
        for (int e = 0; e < n; e++)
            for (int j = 0; j < F; j++) w2cat[(size_t)h * nF + e * F + j] = (float)w2[((size_t)e * H + h) * F + j];

    const int ranks[S] = {R, 2, 0};
    slot sl[S];
    for (int s = 0; s < S; s++) {
        slot_make(&sl[s], &d, &p, ranks[s], &seed);
        const ls_slot_factors f = {sl[s].f[0], sl[s].f[1], sl[s].f[2], sl[s].f[3], NULL};
        assert_int_equal(ls_slot_factors_rank(&d, &p, &f), ranks[s]);
        slot_derive(&sl[s], &d, &p);
    }
    const int slot_of[T] = {0, -1, 1, 0, 2, 1, -1};
    double x[T * 12], gam[T * 2], want[T * 12];
    ls_ref_fill_uniform(x, T * H, 1.0, &seed);
    ls_ref_fill_uniform(gam, T * n, 1.0, &seed);
    for (int i = 0; i < T * H; i++) x[i] = (double)(float)x[i];
    const ls_ref_lora *lora_of[T];
    for (int t = 0; t < T; t++) lora_of[t] = slot_of[t] >= 0 && ranks[slot_of[t]] > 0 ? &sl[slot_of[t]].ref : NULL;
    ls_ref_forward(&d, w13, w2, T, x, gam, lora_of, want);

    ls_gemm_plan plan;
    ls_gemm_plan_make(&d, &p, &plan);
    const ls_lora_derived_lens dl = ls_lora_derived_lens_of(&d, &p);
    float xf[12];
    double v[2 * 2 * R], z[2 * 12], a[12], w[2 * R], y[12];
    double worst = 0;
    for (int t = 0; t < T; t++) {
        const slot *s = slot_of[t] >= 0 ? &sl[slot_of[t]] : NULL;
        for (int i = 0; i < H; i++) xf[i] = (float)x[t * H + i];
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) v[i] = NAN; /* past r: never written, never read */
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) w[i] = NAN;
        row_bufs b = {0};
        b.ro[LS_OPB_X] = xf, b.len[LS_OPB_X] = (size_t)H;
        b.rw[LS_OPB_Z] = z, b.len[LS_OPB_Z] = (size_t)2 * nF;
        b.rw[LS_OPB_A] = a, b.len[LS_OPB_A] = (size_t)nF;
        b.rw[LS_OPB_Y] = y, b.len[LS_OPB_Y] = (size_t)H;
        b.rw[LS_OPB_V] = v, b.len[LS_OPB_V] = (size_t)2 * O * R;
        b.rw[LS_OPB_W] = w, b.len[LS_OPB_W] = (size_t)O * R;
        b.ro[LS_OPB_W13] = w13d, b.len[LS_OPB_W13] = (size_t)2 * nF * H;
        b.ro[LS_OPB_W2] = w2cat, b.len[LS_OPB_W2] = (size_t)nF * H;
        if (s) {
            b.ro[LS_OPB_AGU] = s->der[0], b.len[LS_OPB_AGU] = dl.agu;
            b.ro[LS_OPB_B13] = s->der[1], b.len[LS_OPB_B13] = dl.b13;
            b.ro[LS_OPB_ADCAT] = s->der[2], b.len[LS_OPB_ADCAT] = dl.adcat;
            b.ro[LS_OPB_BDCAT] = s->der[3], b.len[LS_OPB_BDCAT] = dl.bdcat;
        }
        for (int i = 0; i < LS_OPS; i++) {
            const ls_gemm_op *op = &plan.op[i];
            if (!op->lora || (s && s->r > 0)) run_op(op, s ? s->r : R, &b);
            if (i == LS_OP_EXPAND_GU) swiglu(&d, z, gam + t * n, a);
        }
        for (int h = 0; h < H; h++) {
            const double e = fabs(y[h] - want[t * H + h]) / (fabs(want[t * H + h]) + 1e-3);
            if (!(e <= worst)) worst = isnan(e) || isnan(worst) ? NAN : e; /* a NaN sticks */
        }
    }
    /* The same products in double, summed in another order. */
    assert_true(worst < 1e-9);
    for (int s = 0; s < S; s++) slot_free(&sl[s]);
    free(w13);
    free(w2);
    free(w13d);
    free(w2cat);
}

static void test_plan_equals_reference(void **state) {
    (void)state;
    check_plan(LS_W13_INTERLEAVED, LS_LORA_SHARED);
    check_plan(LS_W13_CONTIGUOUS, LS_LORA_SHARED);
    check_plan(LS_W13_INTERLEAVED, LS_LORA_PER_EXPERT);
    check_plan(LS_W13_CONTIGUOUS, LS_LORA_PER_EXPERT);
}

/* Gate rows of every expert first, then up rows, from either layout. */
static void test_w13_device_rows(void **state) {
    (void)state;
    /* n = 2, F = 3: device row 4 is expert 1's gate row 1. */
    assert_int_equal(ls_w13_device_source_row(LS_W13_INTERLEAVED, 2, 3, 4), 6 + 2);
    assert_int_equal(ls_w13_device_source_row(LS_W13_CONTIGUOUS, 2, 3, 4), 6 + 1);
    /* device row 6 + 2 is expert 0's up row 2. */
    assert_int_equal(ls_w13_device_source_row(LS_W13_INTERLEAVED, 2, 3, 8), 5);
    assert_int_equal(ls_w13_device_source_row(LS_W13_CONTIGUOUS, 2, 3, 8), 5);
}

/* The rank is the last index with any value that is not +0: a -0 counts,
 * in any one factor. */
static void test_slot_rank(void **state) {
    (void)state;
    const ls_dims d = {.n = 2, .H = 4, .F = 3, .L = 1};
    const ls_pool_dims p = {.slots = 1, .max_rank = 5, .layout = LS_LORA_SHARED, .max_tokens = 1};
    const ls_factor_layout l = ls_pool_layout(&d, &p);
    float *buf = ls_test_calloc(l.total, sizeof(float));
    const ls_slot_factors f = {buf + l.off[0], buf + l.off[1], buf + l.off[2], buf + l.off[3], NULL};
    assert_int_equal(ls_slot_factors_rank(&d, &p, &f), 0);
    buf[l.off[3] + 2 * 5 + 3] = -0.0f; /* d_b[0][2][3] */
    assert_int_equal(ls_slot_factors_rank(&d, &p, &f), 4);
    buf[l.off[1] + (1 * 6 + 5) * 5 + 4] = 1e-30f; /* gu_b[1][5][4]: expert 1's last up row */
    assert_int_equal(ls_slot_factors_rank(&d, &p, &f), 5);
    free(buf);
}

/* A LoRA GEMM wider than a grid's 65535 column tiles is refused with
 * its stage and sizes; the pool's shapes here fit. */
static void test_grid_limits(void **state) {
    (void)state;
    char why[256];
    ls_gemm_plan plan;
    const ls_pool_dims p = {.slots = 8, .max_rank = 64, .layout = LS_LORA_PER_EXPERT, .max_tokens = 4096};
    const ls_dims ok = {.n = 2, .H = 7168, .F = 2048, .L = 1};
    ls_gemm_plan_make(&ok, &p, &plan);
    assert_true(ls_gemm_plan_fits_grid(&plan, 64, why, sizeof why));
    const ls_dims wide = {.n = 1, .H = 64 * 65535 + 1, .F = 8, .L = 1};
    ls_gemm_plan_make(&wide, &p, &plan);
    assert_false(ls_gemm_plan_fits_grid(&plan, 64, why, sizeof why));
    assert_non_null(strstr(why, "down's LoRA GEMM needs 65536 column tiles"));
    const ls_dims many = {.n = 40000, .H = 8, .F = 8, .L = 1};
    ls_gemm_plan_make(&many, &p, &plan);
    assert_false(ls_gemm_plan_fits_grid(&plan, 64, why, sizeof why));
    assert_non_null(strstr(why, "shrink_gate_up's LoRA GEMM needs 80000 batches"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_equals_reference),
        cmocka_unit_test(test_w13_device_rows),
        cmocka_unit_test(test_slot_rank),
        cmocka_unit_test(test_grid_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
