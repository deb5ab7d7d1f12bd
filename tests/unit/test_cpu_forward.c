/* The CPU backend against the conformance example (tests/data/tiny.json)
 * and against the independent fp64 reference (tests/util/reference.c) on
 * random models and adapters written straight into slots; its error
 * statuses; slot write, read and clear; and that a slot's cost and bits
 * follow its adapter's rank, not the pool's. */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/backend.h"
#include "gpu/cpu/cpu_backend.h"
#include "gpu/cuda/cuda_backend.h"
#include "tests/util/reference.h"
#include "tests/util/testutil.h"

/* ---- helpers -------------------------------------------------------- */

/* Uniform doubles that are exact floats, so the backend (fp32) and the
 * reference (fp64) see the very same inputs. */
static void fill_exact(double *v, long count, double scale, unsigned long long *state) {
    ls_ref_fill_uniform(v, count, scale, state);
    for (long i = 0; i < count; i++) v[i] = (double)(float)v[i];
}

static float *to_float(const double *v, long count) {
    float *f = ls_test_calloc((size_t)count, sizeof *f);
    for (long i = 0; i < count; i++) f[i] = (float)v[i];
    return f;
}

static ls_backend *make_backend_compute(const ls_dims *d, ls_lora_layout layout, int S, int R, int max_tokens,
                                       ls_cpu_compute compute) {
    ls_backend_config cfg = {.dims = *d,
                             .pool = {.slots = S, .max_rank = R, .layout = layout, .max_tokens = max_tokens},
                             .dtype = LS_DTYPE_F32};
    const ls_cpu_settings cpu = {.compute = compute};
    ls_backend *be = NULL;
    ls_error err;
    ls_error_init(&err);
    ls_status st = ls_backend_cpu_create(&cfg, &cpu, &be, &err);
    if (st != LS_OK) fprintf(stderr, "create: %s\n", err.message);
    assert_int_equal(st, LS_OK);
    assert_non_null(be);
    assert_string_equal(ls_backend_name(be), "cpu");
    ls_error_free(&err);
    return be;
}

static ls_backend *make_backend(const ls_dims *d, ls_lora_layout layout, int S, int R, int max_tokens) {
    return make_backend_compute(d, layout, S, R, max_tokens, LS_CPU_COMPUTE_F32);
}

/* One adapter of rank r with `outer` outer blocks, as compact doubles. */
typedef struct {
    ls_ref_lora ref;
    double *buf;
} rand_lora;

static void rand_lora_make(rand_lora *a, const ls_dims *d, int r, int outer, unsigned long long *state) {
    const long n = d->n, H = d->H, F = d->F;
    long ga = (long)outer * 2 * r * H, gb = n * 2 * F * r, da = n * r * F, db = (long)outer * H * r;
    a->buf = ls_test_calloc((size_t)(ga + gb + da + db), sizeof(double));
    /* A ~ 1/sqrt(H) and B ~ 1/sqrt(r) make the delta as large as the base,
     * so a mistake in any LoRA term shows far above fp32 noise. */
    fill_exact(a->buf, ga, 1.0 / sqrt((double)H), state);
    fill_exact(a->buf + ga, gb, 1.0 / sqrt((double)r), state);
    fill_exact(a->buf + ga + gb, da, 1.0 / sqrt((double)F), state);
    fill_exact(a->buf + ga + gb + da, db, 1.0 / sqrt((double)r), state);
    a->ref = (ls_ref_lora){.r = r,
                           .outer = outer,
                           .gu_a = a->buf,
                           .gu_b = a->buf + ga,
                           .d_a = a->buf + ga + gb,
                           .d_b = a->buf + ga + gb + da};
}

/* Pads a compact adapter to the pool's R and O (broadcasting outer 1 into
 * a per-expert pool) and writes it into slot `slot` of layer `layer`. */
static void write_slot(ls_backend *be, int slot, int layer, const ls_ref_lora *a) {
    const ls_dims *d = ls_backend_dims(be);
    const ls_pool_dims *p = ls_backend_pool_dims(be);
    float *ga = ls_test_calloc(ls_pool_gu_a_len(d, p), sizeof(float));
    float *gb = ls_test_calloc(ls_pool_gu_b_len(d, p), sizeof(float));
    float *da = ls_test_calloc(ls_pool_d_a_len(d, p), sizeof(float));
    float *db = ls_test_calloc(ls_pool_d_b_len(d, p), sizeof(float));
    ls_ref_lora_pad(d, p, a, ga, gb, da, db);
    ls_slot_factors f = {.gu_a = ga, .gu_b = gb, .d_a = da, .d_b = db};
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_backend_slot_write(be, slot, layer, &f, &err), LS_OK);
    ls_error_free(&err);
    free(ga);
    free(gb);
    free(da);
    free(db);
}

static void upload(ls_backend *be, int layer, const double *w13, const double *w2) {
    const ls_dims *d = ls_backend_dims(be);
    long c13 = (long)d->n * 2 * d->F * d->H, c2 = (long)d->n * d->H * d->F;
    float *f13 = to_float(w13, c13), *f2 = to_float(w2, c2);
    ls_error err;
    ls_error_init(&err);
    const ls_base_layer bl = ls_base_layer_f32(f13, f2);
    assert_int_equal(ls_backend_upload_base(be, layer, &bl, &err), LS_OK);
    ls_error_free(&err);
    free(f13);
    free(f2);
}

/* ---- (a) conformance: tiny.json ------------------------------------- */

/* Appends every number of a nested JSON array to v[*k...]. */
static void json_flatten(const json_t *j, double *v, long cap, long *k) {
    if (json_is_array(j)) {
        for (size_t i = 0; i < json_array_size(j); i++) json_flatten(json_array_get(j, i), v, cap, k);
        return;
    }
    assert_true(json_is_number(j));
    assert_true(*k < cap);
    v[(*k)++] = json_number_value(j);
}

static double *json_doubles(const json_t *root, const char *path1, const char *path2, long want) {
    const json_t *j = json_object_get(root, path1);
    if (path2) j = json_object_get(j, path2);
    assert_non_null(j);
    double *v = ls_test_calloc((size_t)want, sizeof *v);
    long k = 0;
    json_flatten(j, v, want, &k);
    assert_int_equal(k, want);
    return v;
}

static void test_tiny_conformance(void **state) {
    (void)state;
    json_error_t jerr;
    json_t *root = json_load_file(LS_TEST_DATA "/tiny.json", 0, &jerr);
    if (!root) fprintf(stderr, "tiny.json: %s\n", jerr.text);
    assert_non_null(root);
    const int n = 2, H = 4, F = 3, R = 4, T = 3;
    double *w13 = json_doubles(root, "w13_weight", NULL, n * 2 * F * H);
    double *w2 = json_doubles(root, "w2_weight", NULL, n * H * F);
    double *x = json_doubles(root, "x", NULL, T * H);
    double *gam = json_doubles(root, "gammas", NULL, T * n);
    double *pga = json_doubles(root, "pool", "gate_up_lora_a", 2 * R * H);
    double *pgb = json_doubles(root, "pool", "gate_up_lora_b", n * 2 * F * R);
    double *pda = json_doubles(root, "pool", "down_lora_a", n * R * F);
    double *pdb = json_doubles(root, "pool", "down_lora_b", H * R);
    assert_int_equal(json_integer_value(json_object_get(root, "max_rank")), R);
    float *xf = to_float(x, T * H), *gf = to_float(gam, T * n);
    float *fga = to_float(pga, 2 * R * H), *fgb = to_float(pgb, n * 2 * F * R);
    float *fda = to_float(pda, n * R * F), *fdb = to_float(pdb, H * R);
    const char *layouts[2] = {"interleaved", "contiguous"};

    for (int li = 0; li < 2; li++) {
        ls_dims d = {.n = n, .H = H, .F = F, .L = 1, .w13_layout = li ? LS_W13_CONTIGUOUS : LS_W13_INTERLEAVED};
        ls_backend *be = make_backend(&d, LS_LORA_SHARED, 2, R, 8);
        upload(be, 0, w13, w2);
        ls_slot_factors f = {.gu_a = fga, .gu_b = fgb, .d_a = fda, .d_b = fdb};
        ls_error err;
        ls_error_init(&err);
        assert_int_equal(ls_backend_slot_write(be, 1, 0, &f, &err), LS_OK);
        const int slots[3] = {1, -1, 1};
        float y[12];
        assert_int_equal(ls_backend_forward(be, 0, T, xf, gf, slots, y, &err), LS_OK);
        double *want = json_doubles(root, "y", layouts[li], T * H);
        for (int i = 0; i < T * H; i++) {
            if (fabs(y[i] - want[i]) > 1e-6 * fabs(want[i]) + 1e-9)
                fprintf(stderr, "%s y[%d] = %.12g, expected %.12g\n", layouts[li], i, y[i], want[i]);
            assert_true(fabs(y[i] - want[i]) <= 1e-6 * fabs(want[i]) + 1e-9);
        }

        /* The reference, fed the adapter in its PEFT form (rank 2, scale
         * alpha/r = 2 folded into B), must agree with the file too: it
         * checks the reference the other tests trust. */
        const int r = 2;
        double *A = json_doubles(json_object_get(json_object_get(root, "adapter"), "tensors"),
                                 "model.layers.0.mlp.shared_experts.gate_up_proj.lora_A.weight", NULL, r * H);
        double *B = json_doubles(json_object_get(json_object_get(root, "adapter"), "tensors"),
                                 "model.layers.0.mlp.shared_experts.gate_up_proj.lora_B.weight", NULL, n * 2 * F * r);
        double *Ad = json_doubles(json_object_get(json_object_get(root, "adapter"), "tensors"),
                                  "model.layers.0.mlp.shared_experts.down_proj.lora_A.weight", NULL, r * n * F);
        double *Bd = json_doubles(json_object_get(json_object_get(root, "adapter"), "tensors"),
                                  "model.layers.0.mlp.shared_experts.down_proj.lora_B.weight", NULL, H * r);
        double gu_a[2 * 2 * 4], d_a[2 * 2 * 3], gu_b[2 * 6 * 2], d_b[4 * 2];
        for (int k = 0; k < r; k++)
            for (int h = 0; h < H; h++) gu_a[k * H + h] = gu_a[(r + k) * H + h] = A[k * H + h];
        for (int i = 0; i < n * 2 * F * r; i++) gu_b[i] = 2.0 * B[i];
        for (int e = 0; e < n; e++)
            for (int k = 0; k < r; k++)
                for (int j = 0; j < F; j++) d_a[(e * r + k) * F + j] = Ad[k * n * F + e * F + j];
        for (int i = 0; i < H * r; i++) d_b[i] = 2.0 * Bd[i];
        ls_ref_lora a = {.r = r, .outer = 1, .gu_a = gu_a, .gu_b = gu_b, .d_a = d_a, .d_b = d_b};
        const ls_ref_lora *per_tok[3] = {&a, NULL, &a};
        double yref[12];
        ls_ref_forward(&d, w13, w2, T, x, gam, per_tok, yref);
        assert_true(ls_ref_rel_err_d(yref, want, T * H) < 1e-10);
        for (int i = 0; i < T * H; i++) assert_true(fabs(yref[i] - want[i]) < 1e-11);
        free(A);
        free(B);
        free(Ad);
        free(Bd);
        free(want);
        ls_error_free(&err);
        ls_backend_free(be);
    }
    free(w13), free(w2), free(x), free(gam), free(pga), free(pgb), free(pda), free(pdb);
    free(xf), free(gf), free(fga), free(fgb), free(fda), free(fdb);
    json_decref(root);
}

/* ---- (b) random cases against the fp64 reference -------------------- */

/* The worst relative L2 errors seen (whole call, one token) of the last
 * run_random_case: the bf16 test prints them for docs/math.md. */
static double g_worst_rel, g_worst_token;

/* tol, tok_tol: the bounds on the relative L2 error of each call and of
 * each token. */
static void run_random_case(ls_w13_layout w13l, ls_lora_layout pl, unsigned long long seed, ls_cpu_compute compute,
                            double tol, double tok_tol) {
    const int n = 3, H = 48, F = 40, L = 2, R = 8, S = 4, MAXT = 300;
    ls_dims d = {.n = n, .H = H, .F = F, .L = L, .w13_layout = w13l};
    ls_backend *be = make_backend_compute(&d, pl, S, R, MAXT, compute);
    g_worst_rel = g_worst_token = 0;
    unsigned long long st = seed;
    const long c13 = (long)n * 2 * F * H, c2 = (long)n * H * F;
    double *w13 = ls_test_calloc((size_t)(L * c13), sizeof(double));
    double *w2 = ls_test_calloc((size_t)(L * c2), sizeof(double));
    fill_exact(w13, L * c13, 1.0 / sqrt((double)H), &st);
    fill_exact(w2, L * c2, 1.0 / sqrt((double)(n * F)), &st);
    for (int l = 0; l < L; l++) upload(be, l, w13 + l * c13, w2 + l * c2);

    /* Slots 0..2: ranks 1, R/2, R (two layers each); slot 3 stays empty.
     * In a per-expert pool slot 1's adapter has one outer block,
     * broadcast by write_slot, the others one per expert. */
    const int ranks[3] = {1, R / 2, R};
    rand_lora ad[3][2];
    for (int s = 0; s < 3; s++) {
        for (int l = 0; l < L; l++) {
            int outer = pl == LS_LORA_PER_EXPERT && s != 1 ? n : 1;
            rand_lora_make(&ad[s][l], &d, ranks[s], outer, &st);
            write_slot(be, s, l, &ad[s][l].ref);
        }
    }

    const int Ts[4] = {1, 7, 33, 300};
    for (int ti = 0; ti < 4; ti++) {
        for (int with_gam = 0; with_gam < 2; with_gam++) {
            const int T = Ts[ti], layer = (ti + with_gam) % L;
            double *x = ls_test_calloc((size_t)T * H, sizeof(double));
            double *gam = ls_test_calloc((size_t)T * n, sizeof(double));
            fill_exact(x, (long)T * H, 1.0, &st);
            fill_exact(gam, (long)T * n, 1.0, &st);
            for (long i = 0; i < (long)T * n; i++) gam[i] += 1.0; /* [0, 2] */
            int *slots = ls_test_calloc((size_t)T, sizeof(int));
            const ls_ref_lora **per_tok = ls_test_calloc((size_t)T, sizeof *per_tok);
            double pick[300];
            ls_ref_fill_uniform(pick, T, 1.0, &st);
            for (int t = 0; t < T; t++) {
                int s = (int)floor((pick[t] + 1.0) * 2.5) - 1; /* -1 .. 3 */
                if (s > 3) s = 3;
                if (T == 1) s = 2; /* the lone token takes the full-rank adapter */
                slots[t] = s;
                per_tok[t] = s >= 0 && s < 3 ? &ad[s][layer].ref : NULL;
            }
            float *xf = to_float(x, (long)T * H), *gf = to_float(gam, (long)T * n);
            float *y = ls_test_calloc((size_t)T * H, sizeof(float));
            double *yref = ls_test_calloc((size_t)T * H, sizeof(double));
            ls_error err;
            ls_error_init(&err);
            assert_int_equal(ls_backend_forward(be, layer, T, xf, with_gam ? gf : NULL, slots, y, &err), LS_OK);
            ls_ref_forward(&d, w13 + layer * c13, w2 + layer * c2, T, x, with_gam ? gam : NULL, per_tok, yref);
            double rel = ls_ref_rel_err_f(y, yref, (long)T * H);
            /* Per token too, so one wrong token among 300 cannot hide. */
            double worst = 0;
            for (int t = 0; t < T; t++) {
                double r1 = ls_ref_rel_err_f(y + (long)t * H, yref + (long)t * H, H);
                if (r1 > worst) worst = r1;
            }
            if (rel > tol || worst > tok_tol)
                fprintf(stderr, "%s/%s T=%d gammas=%d: rel %.3g, worst token %.3g\n", ls_w13_layout_name(w13l),
                        ls_lora_layout_name(pl), T, with_gam, rel, worst);
            if (rel > g_worst_rel) g_worst_rel = rel;
            if (worst > g_worst_token) g_worst_token = worst;
            assert_true(rel <= tol);
            assert_true(worst <= tok_tol);
            ls_error_free(&err);
            free(x), free(gam), free(slots), free(per_tok), free(xf), free(gf), free(y), free(yref);
        }
    }
    for (int s = 0; s < 3; s++)
        for (int l = 0; l < L; l++) free(ad[s][l].buf);
    free(w13);
    free(w2);
    ls_backend_free(be);
}

static void test_random_interleaved_shared(void **state) {
    (void)state;
    run_random_case(LS_W13_INTERLEAVED, LS_LORA_SHARED, 11, LS_CPU_COMPUTE_F32, 1e-5, 1e-5);
}
static void test_random_interleaved_per_expert(void **state) {
    (void)state;
    run_random_case(LS_W13_INTERLEAVED, LS_LORA_PER_EXPERT, 12, LS_CPU_COMPUTE_F32, 1e-5, 1e-5);
}
static void test_random_contiguous_shared(void **state) {
    (void)state;
    run_random_case(LS_W13_CONTIGUOUS, LS_LORA_SHARED, 13, LS_CPU_COMPUTE_F32, 1e-5, 1e-5);
}
static void test_random_contiguous_per_expert(void **state) {
    (void)state;
    run_random_case(LS_W13_CONTIGUOUS, LS_LORA_PER_EXPERT, 14, LS_CPU_COMPUTE_F32, 1e-5, 1e-5);
}

/* bf16 compute against the same fp64 reference (unrounded operands):
 * each call within BF16_TOL (the CUDA backend's bf16 bound, which
 * docs/math.md states), each token within twice that (48 outputs a
 * token: its error is noisier than a call's), on every layout. */
#define BF16_TOL 1e-2
static void test_random_bf16_compute(void **state) {
    (void)state;
    double rel = 0, tok = 0;
    for (int c = 0; c < 4; c++) {
        run_random_case(c & 1 ? LS_W13_CONTIGUOUS : LS_W13_INTERLEAVED, c & 2 ? LS_LORA_PER_EXPERT : LS_LORA_SHARED,
                        21 + (unsigned long long)c, LS_CPU_COMPUTE_BF16, BF16_TOL, 2 * BF16_TOL);
        if (g_worst_rel > rel) rel = g_worst_rel;
        if (g_worst_token > tok) tok = g_worst_token;
    }
    fprintf(stderr, "note: bf16 compute vs fp64: worst relative L2 %.3g per call, %.3g per token (bounds %g, %g)\n", rel,
            tok, BF16_TOL, 2 * BF16_TOL);
}

/* bf16 storage: the backend rounds what it is given; the reference fed
 * the rounded values agrees to fp32 accuracy. */
static void test_bf16_storage_rounds(void **state) {
    (void)state;
    ls_dims d = {.n = 2, .H = 16, .F = 8, .L = 1, .w13_layout = LS_W13_INTERLEAVED};
    ls_backend_config cfg = {.dims = d, .pool = {.slots = 1, .max_rank = 2, .max_tokens = 4}, .dtype = LS_DTYPE_BF16};
    ls_backend *be = NULL;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_backend_cpu_create(&cfg, NULL, &be, &err), LS_OK);
    assert_int_equal(ls_backend_dtype(be), LS_DTYPE_BF16);
    unsigned long long st = 5;
    const long c13 = 2 * 2 * 8 * 16, c2 = 2 * 16 * 8;
    double w13[512], w2[256], x[4 * 16];
    fill_exact(w13, c13, 0.25, &st);
    fill_exact(w2, c2, 0.25, &st);
    fill_exact(x, 4 * 16, 1.0, &st);
    upload(be, 0, w13, w2);
    float xf[64], y[64];
    for (int i = 0; i < 64; i++) xf[i] = (float)x[i];
    for (long i = 0; i < c13; i++) w13[i] = ls_bf16_to_f32(ls_f32_to_bf16((float)w13[i]));
    for (long i = 0; i < c2; i++) w2[i] = ls_bf16_to_f32(ls_f32_to_bf16((float)w2[i]));
    double yref[64];
    assert_int_equal(ls_backend_forward(be, 0, 4, xf, NULL, NULL, y, &err), LS_OK);
    ls_ref_forward(&d, w13, w2, 4, x, NULL, NULL, yref);
    assert_true(ls_ref_rel_err_f(y, yref, 64) <= 1e-5);
    ls_error_free(&err);
    ls_backend_free(be);
}

/* ---- (c) errors ----------------------------------------------------- */

static void test_errors(void **state) {
    (void)state;
    ls_dims d = {.n = 2, .H = 8, .F = 4, .L = 2, .w13_layout = LS_W13_INTERLEAVED};
    ls_backend *be = make_backend(&d, LS_LORA_SHARED, 2, 4, 16);
    double w13[2 * 8 * 8], w2[2 * 8 * 4];
    unsigned long long st = 3;
    fill_exact(w13, 128, 0.3, &st);
    fill_exact(w2, 64, 0.3, &st);
    upload(be, 0, w13, w2);
    float x[17 * 8] = {0}, y[17 * 8];
    for (int i = 0; i < 17 * 8; i++) y[i] = 42.0f;
    ls_error err;
    ls_error_init(&err);

    int bad_hi[3] = {0, 2, -1}, bad_lo[3] = {-2, 0, 0};
    assert_int_equal(ls_backend_forward(be, 0, 3, x, NULL, bad_hi, y, &err), LS_INTERNAL);
    assert_non_null(strstr(err.message, "slot 2"));
    ls_error_clear(&err);
    assert_int_equal(ls_backend_forward(be, 0, 3, x, NULL, bad_lo, y, &err), LS_INTERNAL);
    ls_error_clear(&err);
    assert_int_equal(ls_backend_forward(be, 0, 17, x, NULL, NULL, y, &err), LS_INTERNAL);
    ls_error_clear(&err);
    assert_int_equal(ls_backend_forward(be, 0, -1, x, NULL, NULL, y, &err), LS_INTERNAL);
    ls_error_clear(&err);
    assert_int_equal(ls_backend_forward(be, 2, 1, x, NULL, NULL, y, &err), LS_INTERNAL);
    ls_error_clear(&err);
    assert_int_equal(ls_backend_forward(be, -1, 1, x, NULL, NULL, y, &err), LS_INTERNAL);
    ls_error_clear(&err);
    /* Layer 1 exists but never got weights. */
    assert_int_equal(ls_backend_forward(be, 1, 1, x, NULL, NULL, y, &err), LS_INTERNAL);
    ls_error_clear(&err);
    /* A rejected call leaves y alone. */
    for (int i = 0; i < 17 * 8; i++) assert_true(y[i] == 42.0f);
    /* T = 0 is a valid empty call; T = max_tokens is fine. */
    assert_int_equal(ls_backend_forward(be, 0, 0, NULL, NULL, NULL, NULL, &err), LS_OK);
    assert_int_equal(ls_backend_forward(be, 0, 16, x, NULL, NULL, y, &err), LS_OK);

    float buf[256] = {0};
    ls_slot_factors f = {.gu_a = buf, .gu_b = buf, .d_a = buf, .d_b = buf};
    assert_int_equal(ls_backend_slot_write(be, 2, 0, &f, &err), LS_INTERNAL);
    ls_error_clear(&err);
    assert_int_equal(ls_backend_slot_write(be, -1, 0, &f, &err), LS_INTERNAL);
    ls_error_clear(&err);
    assert_int_equal(ls_backend_slot_write(be, 0, 2, &f, &err), LS_INTERNAL);
    ls_error_clear(&err);
    ls_slot_factors half = {.gu_a = buf};
    assert_int_equal(ls_backend_slot_write(be, 0, 0, &half, &err), LS_INTERNAL);
    ls_error_clear(&err);
    assert_int_equal(ls_backend_slot_clear(be, 5, &err), LS_INTERNAL);
    ls_error_clear(&err);
    assert_int_equal(ls_backend_slot_read(be, 0, 7, buf, NULL, NULL, NULL, &err), LS_INTERNAL);
    ls_error_clear(&err);
    const ls_base_layer bad = ls_base_layer_f32(buf, buf);
    assert_int_equal(ls_backend_upload_base(be, 3, &bad, &err), LS_INTERNAL);
    ls_error_clear(&err);
    assert_int_equal(ls_backend_synchronize(be, &err), LS_OK);

    size_t fr = 0, tot = 0;
    assert_int_equal(ls_backend_memory(be, &fr, &tot, &err), LS_OK);
    assert_true(tot > 0 && fr <= tot);
    /* pool_bytes covers S * L * (gu_a + gu_b + d_a + d_b) floats. */
    const size_t f32_bytes = 2 * 2 * (2 * 4 * 8 + 2 * 8 * 4 + 2 * 4 * 4 + 8 * 4) * sizeof(float);
    assert_int_equal(ls_backend_pool_bytes(be), f32_bytes);
    /* Under bf16 compute, and the bf16 pair copies beside them: at least
     * half as many bytes again (2-byte values, padded to whole panels). */
    ls_backend *b16 = NULL;
    const ls_cpu_settings bf16 = {.compute = LS_CPU_COMPUTE_BF16};
    ls_backend_config c16 = {.dims = *ls_backend_dims(be), .pool = {.slots = 2, .max_rank = 4, .max_tokens = 16},
                             .dtype = LS_DTYPE_F32};
    assert_int_equal(ls_backend_cpu_create(&c16, &bf16, &b16, &err), LS_OK);
    assert_true(ls_backend_pool_bytes(b16) >= f32_bytes + f32_bytes / 2);
    ls_backend_free(b16);

    /* Bad configurations fail cleanly. */
    ls_backend *nb = (ls_backend *)0x1;
    ls_backend_config cfg = {.dims = d, .pool = {.slots = 1, .max_rank = 0, .max_tokens = 4}, .dtype = LS_DTYPE_F32};
    assert_int_equal(ls_backend_cpu_create(&cfg, NULL, &nb, &err), LS_INVALID_REQUEST);
    assert_null(nb);
    ls_error_clear(&err);
    cfg.pool.max_rank = 4;
    cfg.dtype = LS_DTYPE_I32;
    assert_int_equal(ls_backend_cpu_create(&cfg, NULL, &nb, &err), LS_INVALID_REQUEST);
    ls_error_clear(&err);

#ifndef LS_HAVE_CUDA
    assert_int_equal(ls_backend_cuda_create(&cfg, NULL, &nb, &err), LS_DEVICE_ERROR);
    assert_non_null(strstr(err.message, "no CUDA backend"));
    assert_false(ls_backend_cuda_available());
#endif
    ls_error_free(&err);
    ls_backend_free(be);
}

/* ---- (d) slot write, read back, clear -------------------------------- */

static void test_slot_clear_is_base(void **state) {
    (void)state;
    ls_dims d = {.n = 2, .H = 24, .F = 12, .L = 2, .w13_layout = LS_W13_CONTIGUOUS};
    ls_backend *be = make_backend(&d, LS_LORA_PER_EXPERT, 3, 4, 40);
    unsigned long long st = 99;
    const long c13 = 2 * 2 * 12 * 24, c2 = 2 * 24 * 12;
    double *w13 = ls_test_calloc(2 * c13, sizeof(double)), *w2 = ls_test_calloc(2 * c2, sizeof(double));
    fill_exact(w13, 2 * c13, 0.2, &st);
    fill_exact(w2, 2 * c2, 0.2, &st);
    upload(be, 0, w13, w2);
    upload(be, 1, w13 + c13, w2 + c2);
    rand_lora a0, a1;
    rand_lora_make(&a0, &d, 3, 2, &st);
    rand_lora_make(&a1, &d, 4, 2, &st);
    write_slot(be, 1, 0, &a0.ref);
    write_slot(be, 1, 1, &a1.ref);

    /* Read back what was written: the padding is zero, the rest exact. */
    size_t lga = ls_pool_gu_a_len(ls_backend_dims(be), ls_backend_pool_dims(be)), lgb = ls_pool_gu_b_len(ls_backend_dims(be), ls_backend_pool_dims(be));
    size_t lda = ls_pool_d_a_len(ls_backend_dims(be), ls_backend_pool_dims(be)), ldb = ls_pool_d_b_len(ls_backend_dims(be), ls_backend_pool_dims(be));
    float *ga = ls_test_calloc(lga, 4), *gb = ls_test_calloc(lgb, 4), *da = ls_test_calloc(lda, 4), *db = ls_test_calloc(ldb, 4);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_backend_slot_read(be, 1, 0, ga, gb, da, db, &err), LS_OK);
    assert_true(ga[0] == (float)a0.ref.gu_a[0]);
    assert_true(ga[(4 + 1) * 24 + 5] == (float)a0.ref.gu_a[(3 + 1) * 24 + 5]); /* up row 1 sits at R + 1 */
    assert_true(ga[3 * 24 + 5] == 0.0f);                                      /* rank row 3 >= r is padding */
    assert_true(gb[3] == 0.0f && gb[2] == (float)a0.ref.gu_b[2]);
    assert_true(db[(24 + 7) * 4 + 1] == (float)a0.ref.d_b[(24 + 7) * 3 + 1]);

    const int T = 40;
    float *x = ls_test_calloc(T * 24, 4), *y_base = ls_test_calloc(T * 24, 4), *y_slot = ls_test_calloc(T * 24, 4);
    double *xd = ls_test_calloc(T * 24, sizeof(double));
    fill_exact(xd, T * 24, 1.0, &st);
    for (int i = 0; i < T * 24; i++) x[i] = (float)xd[i];
    int *on1 = ls_test_calloc(T, sizeof(int));
    for (int t = 0; t < T; t++) on1[t] = 1;
    for (int layer = 0; layer < 2; layer++) {
        assert_int_equal(ls_backend_forward(be, layer, T, x, NULL, NULL, y_base, &err), LS_OK);
        assert_int_equal(ls_backend_forward(be, layer, T, x, NULL, on1, y_slot, &err), LS_OK);
        assert_true(memcmp(y_base, y_slot, T * 24 * sizeof(float)) != 0);
    }
    assert_int_equal(ls_backend_slot_clear(be, 1, &err), LS_OK);
    assert_int_equal(ls_backend_slot_read(be, 1, 1, ga, gb, da, db, &err), LS_OK);
    for (size_t i = 0; i < lga; i++) assert_true(ga[i] == 0.0f);
    for (size_t i = 0; i < lgb; i++) assert_true(gb[i] == 0.0f);
    for (size_t i = 0; i < lda; i++) assert_true(da[i] == 0.0f);
    for (size_t i = 0; i < ldb; i++) assert_true(db[i] == 0.0f);
    for (int layer = 0; layer < 2; layer++) {
        assert_int_equal(ls_backend_forward(be, layer, T, x, NULL, NULL, y_base, &err), LS_OK);
        assert_int_equal(ls_backend_forward(be, layer, T, x, NULL, on1, y_slot, &err), LS_OK);
        for (int i = 0; i < T * 24; i++) assert_true(y_base[i] == y_slot[i]);
    }
    ls_error_free(&err);
    free(a0.buf), free(a1.buf), free(ga), free(gb), free(da), free(db);
    free(x), free(y_base), free(y_slot), free(xd), free(on1), free(w13), free(w2);
    ls_backend_free(be);
}

/* ---- (e) a slot costs its own rank, not --max-rank ------------------- */

/* Every value slot_read returns equals the adapter's (broadcast over
 * outer blocks) below its rank, and zero past it. */
static void check_read_back(ls_backend *be, int slot, int layer, const ls_ref_lora *a) {
    const ls_dims *d = ls_backend_dims(be);
    const ls_pool_dims *p = ls_backend_pool_dims(be);
    const long n = d->n, H = d->H, F = d->F, R = p->max_rank, r = a->r, O = ls_pool_outer(d, p);
    float *ga = ls_test_calloc(ls_pool_gu_a_len(d, p), 4), *gb = ls_test_calloc(ls_pool_gu_b_len(d, p), 4);
    float *da = ls_test_calloc(ls_pool_d_a_len(d, p), 4), *db = ls_test_calloc(ls_pool_d_b_len(d, p), 4);
    /* Garbage first: slot_read must write every value, padding included. */
    memset(ga, 0x7f, ls_pool_gu_a_len(d, p) * 4), memset(gb, 0x7f, ls_pool_gu_b_len(d, p) * 4);
    memset(da, 0x7f, ls_pool_d_a_len(d, p) * 4), memset(db, 0x7f, ls_pool_d_b_len(d, p) * 4);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_backend_slot_read(be, slot, layer, ga, gb, da, db, &err), LS_OK);
    for (long o = 0; o < O; o++) {
        long src = a->outer == 1 ? 0 : o;
        for (long half = 0; half < 2; half++)
            for (long k = 0; k < R; k++)
                for (long h = 0; h < H; h++)
                    assert_true(ga[(o * 2 * R + half * R + k) * H + h] ==
                                (k < r ? (float)a->gu_a[(src * 2 * r + half * r + k) * H + h] : 0.0f));
        for (long h = 0; h < H; h++)
            for (long k = 0; k < R; k++)
                assert_true(db[(o * H + h) * R + k] == (k < r ? (float)a->d_b[(src * H + h) * r + k] : 0.0f));
    }
    for (long e = 0; e < n; e++) {
        for (long i = 0; i < 2 * F; i++)
            for (long k = 0; k < R; k++)
                assert_true(gb[(e * 2 * F + i) * R + k] == (k < r ? (float)a->gu_b[(e * 2 * F + i) * r + k] : 0.0f));
        for (long k = 0; k < R; k++)
            for (long j = 0; j < F; j++)
                assert_true(da[(e * R + k) * F + j] == (k < r ? (float)a->d_a[(e * r + k) * F + j] : 0.0f));
    }
    ls_error_free(&err);
    free(ga), free(gb), free(da), free(db);
}

/* The same adapters (ranks 1, 5 and 12, and one of all-zero factors) in
 * a pool of --max-rank 12 and in one of 40: the forward cuts each slot
 * to its own rank, so the two pools give the same bits for every token,
 * before and after the slots are rewritten with other ranks, read back
 * the same factors, and the all-zero adapter gives the base model's
 * bits. The rank-1 adapter's factors are bf16 numbers and the
 * rank-5 one's f16 numbers (kept at 2 bytes, read back exactly); every
 * token agrees with the fp64 reference. For both pool layouts. */
static void run_max_rank_case(ls_lora_layout pl, unsigned long long seed) {
    enum { S = 4, T = 33 };
    const int n = 3, H = 48, F = 40;
    ls_dims d = {.n = n, .H = H, .F = F, .L = 1, .w13_layout = LS_W13_INTERLEAVED};
    ls_backend *tight = make_backend(&d, pl, S, 12, T), *loose = make_backend(&d, pl, S, 40, T);
    unsigned long long st = seed;
    const long c13 = (long)n * 2 * F * H, c2 = (long)n * H * F;
    double *w13 = ls_test_calloc((size_t)c13, sizeof(double)), *w2 = ls_test_calloc((size_t)c2, sizeof(double));
    fill_exact(w13, c13, 1.0 / sqrt((double)H), &st);
    fill_exact(w2, c2, 1.0 / sqrt((double)(n * F)), &st);
    upload(tight, 0, w13, w2);
    upload(loose, 0, w13, w2);
    const int ranks[S] = {1, 5, 12, 3};
    rand_lora ad[S];
    for (int s = 0; s < S; s++) {
        rand_lora_make(&ad[s], &d, ranks[s], pl == LS_LORA_PER_EXPERT && s != 1 ? n : 1, &st);
        const ls_ref_lora *a = &ad[s].ref;
        const long count =
            (long)a->outer * 2 * a->r * H + (long)n * 2 * F * a->r + (long)n * a->r * F + (long)a->outer * H * a->r;
        if (s == 3) memset(ad[s].buf, 0, (size_t)count * sizeof(double)); /* all zero */
        for (long i = 0; s < 2 && i < count; i++) {
            float v = (float)ad[s].buf[i];
            ad[s].buf[i] = s == 0 ? ls_bf16_to_f32(ls_f32_to_bf16(v)) : ls_f16_to_f32(ls_f32_to_f16(v));
        }
        write_slot(tight, s, 0, &ad[s].ref);
        write_slot(loose, s, 0, &ad[s].ref);
        check_read_back(loose, s, 0, &ad[s].ref);
    }
    double *xd = ls_test_calloc((size_t)T * H, sizeof(double));
    fill_exact(xd, (long)T * H, 1.0, &st);
    float *x = to_float(xd, (long)T * H);
    float *y_tight = ls_test_calloc((size_t)T * H, 4), *y_loose = ls_test_calloc((size_t)T * H, 4);
    float *y_base = ls_test_calloc((size_t)T * H, 4);
    int slots[T], zero[T];
    for (int t = 0; t < T; t++) slots[t] = t % (S + 1) - 1, zero[t] = 3; /* base, then slots 0..3 in turn */
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_backend_forward(tight, 0, T, x, NULL, slots, y_tight, &err), LS_OK);
    assert_int_equal(ls_backend_forward(loose, 0, T, x, NULL, slots, y_loose, &err), LS_OK);
    assert_memory_equal(y_tight, y_loose, (size_t)T * H * sizeof(float));
    const ls_ref_lora *per_tok[T];
    for (int t = 0; t < T; t++) per_tok[t] = slots[t] >= 0 ? &ad[slots[t]].ref : NULL;
    double *yref = ls_test_calloc((size_t)T * H, sizeof(double));
    ls_ref_forward(&d, w13, w2, T, xd, NULL, per_tok, yref);
    for (int t = 0; t < T; t++)
        assert_true(ls_ref_rel_err_f(y_tight + (size_t)t * H, yref + (size_t)t * H, H) <= 1e-5);
    free(yref);
    assert_int_equal(ls_backend_forward(loose, 0, T, x, NULL, NULL, y_base, &err), LS_OK);
    assert_int_equal(ls_backend_forward(loose, 0, T, x, NULL, zero, y_loose, &err), LS_OK);
    assert_memory_equal(y_base, y_loose, (size_t)T * H * sizeof(float));
    /* And the adapters did change their tokens. */
    for (int t = 1; t < 4; t++)
        assert_true(memcmp(y_tight + (size_t)t * H, y_base + (size_t)t * H, (size_t)H * sizeof(float)) != 0);
    /* Slots rewritten with another rank (1 and 12 swapped, the all-zero
     * one replaced by rank 5): nothing of the previous contents is read. */
    const int next[S] = {2, 1, 0, 1};
    for (int s = 0; s < S; s++) {
        write_slot(tight, s, 0, &ad[next[s]].ref);
        write_slot(loose, s, 0, &ad[next[s]].ref);
        check_read_back(loose, s, 0, &ad[next[s]].ref);
    }
    assert_int_equal(ls_backend_forward(tight, 0, T, x, NULL, slots, y_tight, &err), LS_OK);
    assert_int_equal(ls_backend_forward(loose, 0, T, x, NULL, slots, y_loose, &err), LS_OK);
    assert_memory_equal(y_tight, y_loose, (size_t)T * H * sizeof(float));
    for (int t = 0; t < T; t++) per_tok[t] = slots[t] >= 0 ? &ad[next[slots[t]]].ref : NULL;
    yref = ls_test_calloc((size_t)T * H, sizeof(double));
    ls_ref_forward(&d, w13, w2, T, xd, NULL, per_tok, yref);
    for (int t = 0; t < T; t++)
        assert_true(ls_ref_rel_err_f(y_tight + (size_t)t * H, yref + (size_t)t * H, H) <= 1e-5);
    free(yref);
    ls_error_free(&err);
    for (int s = 0; s < S; s++) free(ad[s].buf);
    free(w13), free(w2), free(xd), free(x), free(y_tight), free(y_loose), free(y_base);
    ls_backend_free(tight);
    ls_backend_free(loose);
}

/* slot_read gives back every bit slot_write received, a -0 past the
 * values' rank included (the rank the engine keeps counts it). */
static void test_read_back_negative_zero(void **state) {
    (void)state;
    ls_dims d = {.n = 1, .H = 16, .F = 16, .L = 1, .w13_layout = LS_W13_INTERLEAVED};
    ls_backend *be = make_backend(&d, LS_LORA_SHARED, 1, 4, 4);
    const ls_pool_dims *p = ls_backend_pool_dims(be);
    size_t len[4] = {ls_pool_gu_a_len(&d, p), ls_pool_gu_b_len(&d, p), ls_pool_d_a_len(&d, p), ls_pool_d_b_len(&d, p)};
    float *in[4], *out[4];
    unsigned long long st = 3;
    for (int i = 0; i < 4; i++) {
        in[i] = ls_test_calloc(len[i], 4), out[i] = ls_test_calloc(len[i], 4);
        ls_ref_fill_uniform_f(in[i], len[i], 1.0, &st);
    }
    /* Rank 2: rank indices 2 and 3 zero, but d_b[0][5][3] is -0. */
    for (int k = 2; k < 4; k++) {
        memset(in[0] + (size_t)k * 16, 0, 16 * 4), memset(in[0] + (size_t)(4 + k) * 16, 0, 16 * 4);
        for (int i = 0; i < 32; i++) in[1][i * 4 + k] = 0.0f;
        memset(in[2] + (size_t)k * 16, 0, 16 * 4);
        for (int h = 0; h < 16; h++) in[3][h * 4 + k] = 0.0f;
    }
    in[3][5 * 4 + 3] = -0.0f;
    ls_slot_factors f = {.gu_a = in[0], .gu_b = in[1], .d_a = in[2], .d_b = in[3]};
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_backend_slot_write(be, 0, 0, &f, &err), LS_OK);
    assert_int_equal(ls_backend_slot_read(be, 0, 0, out[0], out[1], out[2], out[3], &err), LS_OK);
    for (int i = 0; i < 4; i++) {
        assert_memory_equal(in[i], out[i], len[i] * 4);
        free(in[i]), free(out[i]);
    }
    ls_error_free(&err);
    ls_backend_free(be);
}

/* A rank above H and n*F (the backend allows it; the server caps
 * --max-rank at 1024): the expands' K is the rank, and 16 rows of one
 * slot pack 16 x K floats of A, past one packed block. Under ASan this
 * overflowed the packing scratch when it was sized for K <= max(H, n*F). */
static void test_rank_above_hidden(void **state) {
    (void)state;
    enum { T = 16 };
    const int n = 1, H = 16, F = 8, R = 2400;
    ls_dims d = {.n = n, .H = H, .F = F, .L = 1, .w13_layout = LS_W13_CONTIGUOUS};
    ls_backend *be = make_backend(&d, LS_LORA_SHARED, 1, R, T);
    unsigned long long st = 77;
    double w13[2 * 8 * 16], w2[16 * 8], xd[T * 16];
    fill_exact(w13, 2 * F * H, 0.25, &st);
    fill_exact(w2, H * F, 0.25, &st);
    fill_exact(xd, T * H, 1.0, &st);
    upload(be, 0, w13, w2);
    rand_lora a;
    rand_lora_make(&a, &d, R, 1, &st);
    write_slot(be, 0, 0, &a.ref);
    float *x = to_float(xd, T * H), y[T * 16];
    int slots[T] = {0};
    const ls_ref_lora *per_tok[T];
    for (int t = 0; t < T; t++) per_tok[t] = &a.ref;
    double yref[T * 16];
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_backend_forward(be, 0, T, x, NULL, slots, y, &err), LS_OK);
    ls_ref_forward(&d, w13, w2, T, xd, NULL, per_tok, yref);
    assert_true(ls_ref_rel_err_f(y, yref, T * H) <= 1e-5);
    ls_error_free(&err);
    free(a.buf), free(x);
    ls_backend_free(be);
}

static void test_max_rank_shared(void **state) {
    (void)state;
    run_max_rank_case(LS_LORA_SHARED, 21);
}
static void test_max_rank_per_expert(void **state) {
    (void)state;
    run_max_rank_case(LS_LORA_PER_EXPERT, 22);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_conformance),
        cmocka_unit_test(test_random_interleaved_shared),
        cmocka_unit_test(test_random_interleaved_per_expert),
        cmocka_unit_test(test_random_contiguous_shared),
        cmocka_unit_test(test_random_contiguous_per_expert),
        cmocka_unit_test(test_random_bf16_compute),
        cmocka_unit_test(test_bf16_storage_rounds),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_slot_clear_is_base),
        cmocka_unit_test(test_max_rank_shared),
        cmocka_unit_test(test_max_rank_per_expert),
        cmocka_unit_test(test_read_back_negative_zero),
        cmocka_unit_test(test_rank_above_hidden),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
