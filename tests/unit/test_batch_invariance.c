/* Batch invariance of the CPU backend (bit for bit, on every CPU): a
 * token's y computed alone, inside a random batch of mixed adapters and
 * base tokens, inside the same batch reversed and shuffled must be the
 * same bytes. Run on every kernel path this CPU has (avx512, avx2,
 * generic), with 1, 2 and 4 engine threads, both W13 layouts, both pool
 * layouts and every weight dtype; and the paths must agree with each
 * other bit for bit. T runs from 1 to past several row blocks (past one
 * on the slow portable path), and the
 * second model's K and N are past one K block and not multiples of a
 * vector width. A model with a shared-expert gate, uploaded typed at its
 * dtype, takes sigmoid(w . x) as the gamma of tokens sent without gammas,
 * and every other slot adds a delta of the gate's weight (an adapter of
 * shared_expert_gate): the same invariance and agreement hold for it. */
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
#include "gpu/cpu/gemm.h"
#include "tests/util/reference.h"
#include "tests/util/testutil.h"

#define MAX_T 300
#define SLOTS 4

typedef struct {
    ls_dims d;
    ls_lora_layout layout;
    int R;
    ls_dtype dtype;
    ls_cpu_compute compute;
} model_spec;

static const ls_cpu_isa PATHS[] = {LS_CPU_ISA_AVX512, LS_CPU_ISA_AVX2, LS_CPU_ISA_GENERIC};
#define N_PATHS (sizeof PATHS / sizeof PATHS[0])

/* Whether this CPU runs path under compute, and the name it goes by:
 * bf16 compute on avx512 is the VDPBF16PS tiles (avx512bf16). */
static bool path_runs(ls_cpu_isa isa, ls_cpu_compute compute) {
    return compute == LS_CPU_COMPUTE_BF16 ? ls_cpu_kernels_bf16_for(isa) != NULL : ls_cpu_isa_supported(isa);
}
static const char *path_name(ls_cpu_isa isa, ls_cpu_compute compute) {
    return compute == LS_CPU_COMPUTE_BF16 ? ls_cpu_kernels_bf16_for(isa)->name : ls_cpu_isa_name(isa);
}

/* v rounded to bf16 (to_bf16) or f16 numbers, as a 16-bit adapter's
 * factors arrive. */
static void round_to(float *v, size_t count, bool to_bf16) {
    for (size_t i = 0; i < count; i++)
        v[i] = to_bf16 ? ls_bf16_to_f32(ls_f32_to_bf16(v[i])) : ls_f16_to_f32(ls_f32_to_f16(v[i]));
}

/* A random model and SLOTS random adapters of ranks R/4.., padding left
 * zero past each rank as the pool's contract says; slot 1's factors are
 * bf16 numbers and slot 2's f16 numbers, which the engine keeps at 2
 * bytes. The same seed gives the same weights whatever the path and
 * thread count. */
static ls_backend *setup(const model_spec *m, ls_cpu_isa isa, int threads, unsigned long long seed) {
    ls_backend_config cfg = {.dims = m->d,
                             .pool = {.slots = SLOTS, .max_rank = m->R, .layout = m->layout, .max_tokens = MAX_T},
                             .dtype = m->dtype};
    const ls_cpu_settings cpu = {.threads = threads, .isa = isa, .compute = m->compute};
    ls_backend *be = NULL;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_backend_cpu_create(&cfg, &cpu, &be, &err), LS_OK);
    assert_string_equal(ls_backend_isa(be), path_name(isa, m->compute));
    const ls_dims *d = &m->d;
    const size_t n = (size_t)d->n, H = (size_t)d->H, F = (size_t)d->F;
    const int R = m->R;
    unsigned long long st = seed;
    float *w13 = ls_test_calloc(n * 2 * F * H, sizeof(float)), *w2 = ls_test_calloc(n * H * F, sizeof(float));
    ls_ref_fill_uniform_f(w13, n * 2 * F * H, 1.0 / sqrt((double)H), &st);
    ls_ref_fill_uniform_f(w2, n * H * F, 1.0 / sqrt((double)(n * F)), &st);
    if (!d->gate) {
        const ls_base_layer bl = ls_base_layer_f32(w13, w2);
        assert_int_equal(ls_backend_upload_base(be, 0, &bl, &err), LS_OK);
    } else { /* typed: the weights at the model's dtype, the gate in bf16 */
        float *g = ls_test_calloc(H, sizeof(float));
        ls_ref_fill_uniform_f(g, H, 4.0 / sqrt((double)H), &st);
        void *b13 = ls_test_calloc(n * 2 * F * H, 4), *b2 = ls_test_calloc(n * H * F, 4), *bg = ls_test_calloc(H, 2);
        ls_convert_from_f32(m->dtype, w13, n * 2 * F * H, b13);
        ls_convert_from_f32(m->dtype, w2, n * H * F, b2);
        ls_convert_from_f32(LS_DTYPE_BF16, g, H, bg);
        const ls_base_layer bl = {{m->dtype, b13}, {m->dtype, b2}, {LS_DTYPE_BF16, bg}};
        assert_int_equal(ls_backend_upload_base(be, 0, &bl, &err), LS_OK);
        free(g), free(b13), free(b2), free(bg);
    }

    const ls_pool_dims *p = ls_backend_pool_dims(be);
    size_t lga = ls_pool_gu_a_len(d, p), lgb = ls_pool_gu_b_len(d, p);
    size_t lda = ls_pool_d_a_len(d, p), ldb = ls_pool_d_b_len(d, p);
    float *ga = ls_test_calloc(lga, 4), *gb = ls_test_calloc(lgb, 4), *da = ls_test_calloc(lda, 4), *db = ls_test_calloc(ldb, 4);
    float *gd = ls_test_calloc(H, 4);
    for (int s = 0; s < SLOTS; s++) {
        ls_ref_fill_uniform_f(ga, lga, 1.0 / sqrt((double)H), &st);
        ls_ref_fill_uniform_f(gb, lgb, 0.5, &st);
        ls_ref_fill_uniform_f(da, lda, 1.0 / sqrt((double)F), &st);
        ls_ref_fill_uniform_f(db, ldb, 0.5, &st);
        if (s == 1 || s == 2) {
            round_to(ga, lga, s == 1), round_to(gb, lgb, s == 1);
            round_to(da, lda, s == 1), round_to(db, ldb, s == 1);
        }
        int r = R * (s + 1) / SLOTS, O = ls_pool_outer(d, p);
        for (int o = 0; o < O; o++)
            for (int k = r; k < R; k++) {
                memset(ga + ((size_t)o * 2 * R + k) * H, 0, H * 4);
                memset(ga + ((size_t)o * 2 * R + R + k) * H, 0, H * 4);
                for (size_t h = 0; h < H; h++) db[((size_t)o * H + h) * R + k] = 0;
            }
        for (size_t e = 0; e < n; e++)
            for (int k = r; k < R; k++) {
                memset(da + (e * R + k) * F, 0, F * 4);
                for (size_t i = 0; i < 2 * F; i++) gb[(e * 2 * F + i) * R + k] = 0;
            }
        /* On a gated model every other slot adapts the gate too. */
        ls_ref_fill_uniform_f(gd, H, 2.0 / sqrt((double)H), &st);
        ls_slot_factors f = {.gu_a = ga, .gu_b = gb, .d_a = da, .d_b = db, .gate_d = d->gate && s % 2 == 0 ? gd : NULL};
        assert_int_equal(ls_backend_slot_write(be, s, 0, &f, &err), LS_OK);
    }
    free(ga), free(gb), free(da), free(db), free(gd), free(w13), free(w2);
    ls_error_free(&err);
    return be;
}

/* A batch of T tokens: inputs, gates and a slot per token (n_slots
 * adapters and base, about evenly). */
typedef struct {
    int T;
    float *x, *gam;
    int *slot;
} batch;

static batch batch_make(const ls_dims *d, int T, int n_slots, unsigned long long *st) {
    batch b = {.T = T};
    b.x = ls_test_calloc((size_t)T * d->H, 4);
    b.gam = ls_test_calloc((size_t)T * d->n, 4);
    b.slot = ls_test_calloc((size_t)T, sizeof(int));
    ls_ref_fill_uniform_f(b.x, (size_t)T * d->H, 1.0, st);
    ls_ref_fill_uniform_f(b.gam, (size_t)T * d->n, 1.0, st);
    double pick[MAX_T];
    ls_ref_fill_uniform(pick, T, 1.0, st);
    for (int t = 0; t < T; t++) {
        int s = (int)floor((pick[t] + 1.0) / 2.0 * (n_slots + 1)) - 1;
        b.slot[t] = s >= n_slots ? n_slots - 1 : s;
    }
    return b;
}

static void batch_free(batch *b) { free(b->x), free(b->gam), free(b->slot); }

/* The batch permuted: row t of the result is row perm[t] of b. */
static batch batch_permute(const batch *b, const int *perm, int H, int n) {
    batch p = {.T = b->T};
    p.x = ls_test_calloc((size_t)b->T * H, 4);
    p.gam = ls_test_calloc((size_t)b->T * n, 4);
    p.slot = ls_test_calloc((size_t)b->T, sizeof(int));
    for (int t = 0; t < b->T; t++) {
        memcpy(p.x + (size_t)t * H, b->x + (size_t)perm[t] * H, (size_t)H * 4);
        memcpy(p.gam + (size_t)t * n, b->gam + (size_t)perm[t] * n, (size_t)n * 4);
        p.slot[t] = b->slot[perm[t]];
    }
    return p;
}

static void run(ls_backend *be, const batch *b, bool gammas, float *y) {
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_backend_forward(be, 0, b->T, b->x, gammas ? b->gam : NULL, b->slot, y, &err), LS_OK);
    ls_error_free(&err);
}

/* Every token alone, and the batch reversed and shuffled, must match its
 * row of the batch byte for byte. Returns the tokens that used an adapter. */
static int check_mix(ls_backend *be, int T, int n_slots, bool gammas, unsigned long long *st) {
    const int H = ls_backend_dims(be)->H, n = ls_backend_dims(be)->n;
    batch b = batch_make(ls_backend_dims(be), T, n_slots, st);
    int *rev = ls_test_calloc((size_t)T, sizeof(int)), *shuf = ls_test_calloc((size_t)T, sizeof(int));
    for (int t = 0; t < T; t++) rev[t] = T - 1 - t, shuf[t] = t;
    double u[MAX_T];
    ls_ref_fill_uniform(u, T, 1.0, st);
    for (int t = T - 1; t > 0; t--) { /* Fisher-Yates */
        int k = (int)((u[t] + 1.0) / 2.0 * (t + 1));
        if (k > t) k = t;
        int tmp = shuf[t];
        shuf[t] = shuf[k], shuf[k] = tmp;
    }
    batch br = batch_permute(&b, rev, H, n), bs = batch_permute(&b, shuf, H, n);
    float *y = ls_test_calloc((size_t)T * H, 4), *yr = ls_test_calloc((size_t)T * H, 4), *ys = ls_test_calloc((size_t)T * H, 4);
    float *y1 = ls_test_calloc((size_t)H, 4);
    run(be, &b, gammas, y);
    run(be, &br, gammas, yr);
    run(be, &bs, gammas, ys);
    /* Where each token went in the permuted batches. */
    int *at_r = ls_test_calloc((size_t)T, sizeof(int)), *at_s = ls_test_calloc((size_t)T, sizeof(int));
    for (int t = 0; t < T; t++) at_r[rev[t]] = t, at_s[shuf[t]] = t;
    int adapted = 0;
    for (int t = 0; t < T; t++) {
        adapted += b.slot[t] >= 0;
        batch one = {.T = 1, .x = b.x + (size_t)t * H, .gam = b.gam + (size_t)t * n, .slot = &b.slot[t]};
        run(be, &one, gammas, y1);
        const float *in_b = y + (size_t)t * H, *in_r = yr + (size_t)at_r[t] * H, *in_s = ys + (size_t)at_s[t] * H;
        if (memcmp(y1, in_b, (size_t)H * 4) || memcmp(y1, in_r, (size_t)H * 4) || memcmp(y1, in_s, (size_t)H * 4)) {
            for (int h = 0; h < H; h++)
                if (y1[h] != in_b[h] || y1[h] != in_r[h] || y1[h] != in_s[h]) {
                    fprintf(stderr, "%s: T=%d token %d (slot %d) h=%d: alone %.9g, batch %.9g, reversed %.9g, "
                                    "shuffled %.9g\n",
                            ls_backend_isa(be), T, t, b.slot[t], h, y1[h], in_b[h], in_r[h], in_s[h]);
                    break;
                }
            fail();
        }
    }
    free(at_r), free(at_s), free(y), free(yr), free(ys), free(y1), free(rev), free(shuf);
    batch_free(&b), batch_free(&br), batch_free(&bs);
    return adapted;
}

/* dtypes in turn over the four layout combinations. */
static ls_dtype dtype_of(int combo) {
    static const ls_dtype dts[] = {LS_DTYPE_F32, LS_DTYPE_BF16, LS_DTYPE_F16};
    return dts[combo % 3];
}

/* generic_max_t caps T on the portable path, whose fmaf calls are ~100x
 * slower than the vector paths (its blocking is the same code). */
static void run_invariance(int n, int H, int F, int R, int trials, int generic_max_t, bool gate,
                           unsigned long long seed, ls_cpu_compute compute) {
    int paths_run = 0;
    for (size_t pi = 0; pi < N_PATHS; pi++) {
        if (!path_runs(PATHS[pi], compute)) {
            fprintf(stderr, "note: this CPU has no %s path%s; not tested here\n", ls_cpu_isa_name(PATHS[pi]),
                    compute == LS_CPU_COMPUTE_BF16 ? " for bf16 compute (VDPBF16PS needs AVX512-BF16)" : "");
            continue;
        }
        paths_run++;
        const int max_t = PATHS[pi] == LS_CPU_ISA_GENERIC ? generic_max_t : MAX_T;
        for (int threads = 1; threads <= 4; threads *= 2) {
            for (int combo = 0; combo < 4; combo++) {
                const int w = combo & 1, pl = combo >> 1;
                model_spec m = {.d = {.n = n, .H = H, .F = F, .L = 1,
                                      .w13_layout = w ? LS_W13_CONTIGUOUS : LS_W13_INTERLEAVED, .gate = gate},
                                .layout = pl ? LS_LORA_PER_EXPERT : LS_LORA_SHARED,
                                .R = R,
                                .dtype = dtype_of(combo),
                                .compute = compute};
                ls_backend *be = setup(&m, PATHS[pi], threads, seed + (unsigned long long)combo);
                unsigned long long st = seed * 31 + (unsigned long long)(threads * 4 + combo);
                int adapted = 0;
                for (int trial = 0; trial < trials; trial++) {
                    double u[2];
                    ls_ref_fill_uniform(u, 2, 1.0, &st);
                    /* T = 1 first, max_t last, random in between; 0..4 adapters. */
                    int T = trial == 0 ? 1 : trial == trials - 1 ? max_t : 1 + (int)((u[0] + 1.0) / 2.0 * (max_t - 1));
                    adapted += check_mix(be, T, trial % (SLOTS + 1), u[1] > 0, &st);
                }
                assert_true(adapted > 0);
                ls_backend_free(be);
            }
        }
    }
    /* The portable path exists everywhere. */
    assert_true(paths_run >= 1);
}

/* Odd sizes: no dimension is a multiple of a vector width or a panel. */
static void test_invariance_small(void **state) {
    (void)state;
    run_invariance(3, 40, 24, 8, 6, MAX_T, false, 1000, LS_CPU_COMPUTE_F32);
}

/* K past one K block (H and n*F above LS_CPU_KC), N and K not multiples
 * of 16, the rank not a multiple of a panel, and enough columns for
 * every thread to get a share. */
static void test_invariance_blocked(void **state) {
    (void)state;
    assert_true(520 > LS_CPU_KC && 2 * 200 > LS_CPU_KC && 120 > LS_CPU_MC);
    run_invariance(2, 520, 200, 24, 3, 120, false, 2000, LS_CPU_COMPUTE_F32);
}

/* The gate (half the trials send no gammas): one expert, as Qwen2-MoE
 * has, with K past one block; and two experts sharing it. */
static void test_invariance_gated(void **state) {
    (void)state;
    run_invariance(1, 520, 136, 8, 4, 60, true, 3000, LS_CPU_COMPUTE_F32);
    run_invariance(2, 40, 24, 8, 4, MAX_T, true, 3100, LS_CPU_COMPUTE_F32);
}

/* The same batch on every path this CPU has, and on 1 and 3 threads:
 * the outputs must be the same bytes as the portable path's. */
static void paths_agree(ls_cpu_compute compute) {
    for (int combo = 0; combo < 6; combo++) {
        const bool gated = combo >= 4; /* gated, and without gammas */
        model_spec m = {.d = {.n = gated ? 1 : 2, .H = 520, .F = 200, .L = 1,
                              .w13_layout = combo & 1 ? LS_W13_CONTIGUOUS : LS_W13_INTERLEAVED, .gate = gated},
                        .layout = combo & 2 ? LS_LORA_PER_EXPERT : LS_LORA_SHARED,
                        .R = 24,
                        .dtype = dtype_of(combo),
                        .compute = compute};
        unsigned long long st = 77 + (unsigned long long)combo;
        batch b = batch_make(&m.d, 230, SLOTS, &st);
        const size_t len = (size_t)b.T * m.d.H;
        float *want = ls_test_calloc(len, 4), *got = ls_test_calloc(len, 4);
        ls_backend *be = setup(&m, LS_CPU_ISA_GENERIC, 1, 5000 + (unsigned long long)combo);
        run(be, &b, !gated, want);
        ls_backend_free(be);
        for (size_t pi = 0; pi < N_PATHS; pi++) {
            if (!path_runs(PATHS[pi], compute)) continue;
            for (int threads = 1; threads <= 3; threads += 2) {
                be = setup(&m, PATHS[pi], threads, 5000 + (unsigned long long)combo);
                run(be, &b, !gated, got);
                if (memcmp(got, want, len * 4) != 0) {
                    for (size_t i = 0; i < len; i++)
                        if (got[i] != want[i]) {
                            fprintf(stderr, "%s x%d threads, %s weights: y[%zu] = %.9g, generic %.9g\n", ls_backend_isa(be),
                                    threads, ls_dtype_name(m.dtype), i, got[i], want[i]);
                            break;
                        }
                    fail();
                }
                ls_backend_free(be);
            }
        }
        free(want), free(got);
        batch_free(&b);
    }
}

static void test_paths_agree(void **state) {
    (void)state;
    paths_agree(LS_CPU_COMPUTE_F32);
}

/* bf16 compute: the same invariance and agreement, each path against the
 * portable definition (the VDPBF16PS tiles where the CPU has them). */
static void test_invariance_small_bf16(void **state) {
    (void)state;
    run_invariance(3, 40, 24, 8, 4, 120, false, 1500, LS_CPU_COMPUTE_BF16);
}

static void test_invariance_blocked_bf16(void **state) {
    (void)state;
    run_invariance(2, 520, 200, 24, 2, 40, false, 2500, LS_CPU_COMPUTE_BF16);
}

static void test_invariance_gated_bf16(void **state) {
    (void)state;
    run_invariance(1, 520, 136, 8, 3, 30, true, 3500, LS_CPU_COMPUTE_BF16);
}

static void test_paths_agree_bf16(void **state) {
    (void)state;
    paths_agree(LS_CPU_COMPUTE_BF16);
}

/* auto takes the widest path the CPU runs; a path it lacks is refused. */
static void test_auto_and_refusal(void **state) {
    (void)state;
    ls_cpu_isa widest = ls_cpu_isa_supported(LS_CPU_ISA_AVX512) ? LS_CPU_ISA_AVX512
                        : ls_cpu_isa_supported(LS_CPU_ISA_AVX2) ? LS_CPU_ISA_AVX2
                                                                : LS_CPU_ISA_GENERIC;
    ls_backend_config cfg = {.dims = {.n = 1, .H = 8, .F = 8, .L = 1},
                             .pool = {.slots = 1, .max_rank = 2, .max_tokens = 4},
                             .dtype = LS_DTYPE_F32};
    ls_cpu_settings cpu = {.threads = 1, .isa = LS_CPU_ISA_AUTO};
    ls_backend *be = NULL;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_backend_cpu_create(&cfg, &cpu, &be, &err), LS_OK);
    assert_string_equal(ls_backend_isa(be), ls_cpu_isa_name(widest));
    ls_backend_free(be);
    for (size_t pi = 0; pi < N_PATHS; pi++) {
        if (ls_cpu_isa_supported(PATHS[pi])) continue;
        cpu.isa = PATHS[pi];
        be = NULL;
        assert_int_equal(ls_backend_cpu_create(&cfg, &cpu, &be, &err), LS_INVALID_REQUEST);
        assert_null(be);
        assert_non_null(strstr(err.message, ls_cpu_isa_name(PATHS[pi])));
        ls_error_clear(&err);
    }
    /* bf16 compute: auto names the bf16 tiles it took; avx512 without
     * AVX512-BF16 is refused, saying what is missing. */
    cpu.isa = LS_CPU_ISA_AUTO;
    cpu.compute = LS_CPU_COMPUTE_BF16;
    be = NULL;
    assert_int_equal(ls_backend_cpu_create(&cfg, &cpu, &be, &err), LS_OK);
    assert_string_equal(ls_backend_isa(be), ls_cpu_kernels_bf16_for(LS_CPU_ISA_AUTO)->name);
    ls_backend_free(be);
    if (!ls_cpu_has_avx512bf16()) {
        cpu.isa = LS_CPU_ISA_AVX512;
        be = NULL;
        assert_int_equal(ls_backend_cpu_create(&cfg, &cpu, &be, &err), LS_INVALID_REQUEST);
        assert_null(be);
        assert_non_null(strstr(err.message, "AVX512-BF16"));
        ls_error_clear(&err);
    }
    ls_error_free(&err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invariance_small),
        cmocka_unit_test(test_invariance_blocked),
        cmocka_unit_test(test_invariance_gated),
        cmocka_unit_test(test_paths_agree),
        cmocka_unit_test(test_invariance_small_bf16),
        cmocka_unit_test(test_invariance_blocked_bf16),
        cmocka_unit_test(test_invariance_gated_bf16),
        cmocka_unit_test(test_paths_agree_bf16),
        cmocka_unit_test(test_auto_and_refusal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
