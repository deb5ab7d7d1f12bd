/* Batch invariance of the CPU backend (SPEC §5: bit for bit on the CPU):
 * a token's y computed alone, inside a random batch, and inside the same
 * batch reversed must be the same bytes, whatever the other tokens, their
 * adapters and its position. Run with 1 and 2 OpenBLAS threads, both W13
 * layouts and both pool layouts, on a small odd-sized model and on one
 * large enough for OpenBLAS to split its GEMMs across threads. */
#include <cblas.h>
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
#include "tests/util/reference.h"

#define MAX_T 300
#define SLOTS 4

static void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size);
    assert_non_null(p);
    return p;
}

static void fill(float *v, size_t count, double scale, unsigned long long *state) {
    double *d = xcalloc(count, sizeof *d);
    ls_ref_fill_uniform(d, (long)count, scale, state);
    for (size_t i = 0; i < count; i++) v[i] = (float)d[i];
    free(d);
}

/* Random model and SLOTS random adapters of ranks R/4.., padding left
 * zero past each rank as the pool's contract says. */
static ls_backend *setup(const ls_dims *d, ls_lora_layout layout, int R, int threads, unsigned long long *st) {
    ls_backend_config cfg = {.dims = *d,
                             .pool = {.slots = SLOTS, .max_rank = R, .layout = layout, .max_tokens = MAX_T},
                             .dtype = LS_DTYPE_F32,
                             .threads = threads};
    ls_backend *be = NULL;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_backend_cpu_create(&cfg, &be, &err), LS_OK);
    assert_int_equal(openblas_get_num_threads(), threads);
    const size_t n = (size_t)d->n, H = (size_t)d->H, F = (size_t)d->F;
    float *w13 = xcalloc(n * 2 * F * H, sizeof(float)), *w2 = xcalloc(n * H * F, sizeof(float));
    fill(w13, n * 2 * F * H, 1.0 / sqrt((double)H), st);
    fill(w2, n * H * F, 1.0 / sqrt((double)(n * F)), st);
    assert_int_equal(be->ops->upload_base(be, 0, w13, w2, &err), LS_OK);

    const ls_pool_dims *p = &be->pool;
    size_t lga = ls_pool_gu_a_len(d, p), lgb = ls_pool_gu_b_len(d, p);
    size_t lda = ls_pool_d_a_len(d, p), ldb = ls_pool_d_b_len(d, p);
    float *ga = xcalloc(lga, 4), *gb = xcalloc(lgb, 4), *da = xcalloc(lda, 4), *db = xcalloc(ldb, 4);
    for (int s = 0; s < SLOTS; s++) {
        fill(ga, lga, 1.0 / sqrt((double)H), st);
        fill(gb, lgb, 0.5, st);
        fill(da, lda, 1.0 / sqrt((double)F), st);
        fill(db, ldb, 0.5, st);
        /* Rank r = R * (s + 1) / SLOTS: zero the rank rows and columns past r. */
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
        ls_slot_factors f = {.gu_a = ga, .gu_b = gb, .d_a = da, .d_b = db};
        assert_int_equal(be->ops->slot_write(be, s, 0, &f, &err), LS_OK);
    }
    free(ga), free(gb), free(da), free(db), free(w13), free(w2);
    ls_error_free(&err);
    return be;
}

/* One random mix: every token alone and in the reversed batch must match
 * its row of the batch byte for byte. Returns the number of tokens that
 * used an adapter (so the caller can check the mixes were mixed). */
static int check_mix(ls_backend *be, int T, int n_slots, bool with_gammas, unsigned long long *st) {
    const int H = be->dims.H, n = be->dims.n;
    float *x = xcalloc((size_t)T * H, 4), *gam = xcalloc((size_t)T * n, 4);
    float *y = xcalloc((size_t)T * H, 4), *yrev = xcalloc((size_t)T * H, 4), *y1 = xcalloc(H, 4);
    float *xrev = xcalloc((size_t)T * H, 4), *gamrev = xcalloc((size_t)T * n, 4);
    int *slot = xcalloc(T, sizeof(int)), *slotrev = xcalloc(T, sizeof(int));
    fill(x, (size_t)T * H, 1.0, st);
    fill(gam, (size_t)T * n, 1.0, st);
    double pick[MAX_T];
    ls_ref_fill_uniform(pick, T, 1.0, st);
    int adapted = 0;
    for (int t = 0; t < T; t++) {
        /* n_slots adapters plus base, about evenly. */
        int s = (int)floor((pick[t] + 1.0) / 2.0 * (n_slots + 1)) - 1;
        if (s >= n_slots) s = n_slots - 1;
        slot[t] = s;
        adapted += s >= 0;
    }
    for (int t = 0; t < T; t++) {
        memcpy(xrev + (size_t)(T - 1 - t) * H, x + (size_t)t * H, (size_t)H * 4);
        memcpy(gamrev + (size_t)(T - 1 - t) * n, gam + (size_t)t * n, (size_t)n * 4);
        slotrev[T - 1 - t] = slot[t];
    }
    const float *g = with_gammas ? gam : NULL, *grev = with_gammas ? gamrev : NULL;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(be->ops->forward(be, 0, T, x, g, slot, y, &err), LS_OK);
    assert_int_equal(be->ops->forward(be, 0, T, xrev, grev, slotrev, yrev, &err), LS_OK);
    for (int t = 0; t < T; t++) {
        assert_int_equal(be->ops->forward(be, 0, 1, x + (size_t)t * H, g ? g + (size_t)t * n : NULL, &slot[t], y1,
                                          &err),
                         LS_OK);
        if (memcmp(y1, y + (size_t)t * H, (size_t)H * 4) != 0 ||
            memcmp(y1, yrev + (size_t)(T - 1 - t) * H, (size_t)H * 4) != 0) {
            for (int h = 0; h < H; h++)
                if (y1[h] != y[(size_t)t * H + h] || y1[h] != yrev[(size_t)(T - 1 - t) * H + h]) {
                    fprintf(stderr, "T=%d token %d (slot %d) h=%d: alone %.9g, batch %.9g, reversed %.9g\n", T, t,
                            slot[t], h, y1[h], y[(size_t)t * H + h], yrev[(size_t)(T - 1 - t) * H + h]);
                    break;
                }
            fail();
        }
    }
    ls_error_free(&err);
    free(x), free(gam), free(y), free(yrev), free(y1), free(xrev), free(gamrev), free(slot), free(slotrev);
    return adapted;
}

static void run_invariance(int n, int H, int F, int R, int trials, unsigned long long seed) {
    for (int threads = 1; threads <= 2; threads++) {
        for (int w = 0; w < 2; w++) {
            for (int pl = 0; pl < 2; pl++) {
                ls_dims d = {.n = n, .H = H, .F = F, .L = 1, .w13_layout = w ? LS_W13_CONTIGUOUS : LS_W13_INTERLEAVED};
                unsigned long long st = seed + (unsigned long long)(threads * 4 + w * 2 + pl);
                ls_backend *be = setup(&d, pl ? LS_LORA_PER_EXPERT : LS_LORA_SHARED, R, threads, &st);
                int adapted = 0;
                for (int trial = 0; trial < trials; trial++) {
                    double u[2];
                    ls_ref_fill_uniform(u, 2, 1.0, &st);
                    /* T from 1 to 300 (the last trial takes 300), 0..4 slots. */
                    int T = trial == trials - 1 ? MAX_T : 1 + (int)((u[0] + 1.0) / 2.0 * (MAX_T - 1));
                    int n_slots = trial % (SLOTS + 1);
                    adapted += check_mix(be, T, n_slots, u[1] > 0, &st);
                }
                assert_true(adapted > 0);
                ls_backend_free(be);
            }
        }
    }
}

/* Odd sizes: no dimension is a multiple of a SIMD width or of the tile. */
static void test_invariance_small(void **state) {
    (void)state;
    run_invariance(3, 40, 24, 8, 10, 1000);
}

/* GEMMs big enough for OpenBLAS to use both threads (M*N*K well above its
 * single-thread cutoff), with the default-sized rank. */
static void test_invariance_threaded(void **state) {
    (void)state;
    run_invariance(2, 256, 192, 32, 3, 2000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invariance_small),
        cmocka_unit_test(test_invariance_threaded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
