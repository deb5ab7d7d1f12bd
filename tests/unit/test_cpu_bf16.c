/* bf16 compute's GEMM on its own: every bf16 path this CPU runs (the
 * VDPBF16PS tiles, the AVX2 emulation, the portable tiles) bit for bit
 * equal to the definition of kernels.h, written here as a plain loop over
 * unpacked operands (odd element of each k pair first, fmaf, denormal
 * results flushed, operands rounded to bf16 with denormals flushed), on
 * the awkward shapes of test_cpu_kernels.c (rows 1..100, K odd, past one
 * K block, N not a multiple of 16, accumulate, column subranges); within
 * the fp64 bound of a 2K-term fp32 sum of the rounded operands; and on
 * operands whose products and sums are denormal, where a plain FMA chain
 * differs from the definition, so the flush is what is tested there. A
 * path this CPU lacks is reported and skipped, never stood in for. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/cpu/gemm.h"
#include "tests/util/reference.h"
#include "tests/util/testutil.h"

static const ls_cpu_isa PATHS[] = {LS_CPU_ISA_AVX512, LS_CPU_ISA_AVX2, LS_CPU_ISA_GENERIC};
#define N_PATHS (sizeof PATHS / sizeof PATHS[0])

static float op(float v) { return ls_bf16_to_f32(ls_cpu_bf16_operand(v)); }

/* The definition, from row-major A [m, k] and B [k, n] (fp32): C[i, j]
 * over columns [j0, j1). flush false gives the plain FMA chain instead. */
static void definition(int m, int k, int n, const float *a, const float *b, const float *c0, int ldc, bool acc,
                       int j0, int j1, bool flush, float *c) {
    memcpy(c, c0, (size_t)m * ldc * 4);
    for (int i = 0; i < m; i++)
        for (int j = j0; j < j1; j++) {
            float s = acc ? ls_cpu_ftz(c0[(size_t)i * ldc + j]) : 0.0f;
            for (int p = 0; 2 * p < k; p++) {
                const int e = 2 * p, o = 2 * p + 1;
                float ao = o < k ? op(a[(size_t)i * k + o]) : 0.0f, bo = o < k ? op(b[(size_t)o * n + j]) : 0.0f;
                s = fmaf(ao, bo, s);
                if (flush) s = ls_cpu_ftz(s);
                s = fmaf(op(a[(size_t)i * k + e]), op(b[(size_t)e * n + j]), s);
                if (flush) s = ls_cpu_ftz(s);
            }
            c[(size_t)i * ldc + j] = s;
        }
}

/* The first C value where got and want differ, printed; false then. */
static bool same_bits(const char *what, const float *got, const float *want, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (memcmp(&got[i], &want[i], 4) != 0) {
            fprintf(stderr, "%s: C[%zu] = %a, definition %a\n", what, i, (double)got[i], (double)want[i]);
            return false;
        }
    return true;
}

/* One case on every bf16 path this CPU runs; returns how many ran. */
static int check_case(int m, int k, int n, bool acc, int p0, int p1, double scale, const float *a, const float *b,
                      const float *c0) {
    const int ldc = n + 5;
    uint16_t *pb = ls_test_calloc(ls_cpu_pairs_len(k, n), 2);
    ls_cpu_pack_pairs(pb, k, 0, 1, b, (size_t)n, 1, k, n);
    ls_cpu_mat bm = {pb, LS_DTYPE_BF16, k, n, true};
    float *ap = ls_test_calloc(ls_cpu_apack_len(k), 4), *want = ls_test_calloc((size_t)m * ldc, 4);
    float *c = ls_test_calloc((size_t)m * ldc, 4);
    const int j0 = p0 * LS_CPU_NR, j1 = p1 * LS_CPU_NR < n ? p1 * LS_CPU_NR : n;
    definition(m, k, n, a, b, c0, ldc, acc, j0, j1, true, want);
    int ran = 0;
    for (size_t pi = 0; pi < N_PATHS; pi++) {
        const ls_cpu_kernels *kr = ls_cpu_kernels_bf16_for(PATHS[pi]);
        if (!kr) continue;
        ran++;
        memcpy(c, c0, (size_t)m * ldc * 4);
        ls_cpu_gemm(kr, ap, m, a, (size_t)k, &bm, p0, p1, c, (size_t)ldc, LS_CPU_NR, acc);
        char what[128];
        snprintf(what, sizeof what, "%s m=%d k=%d n=%d acc=%d panels [%d,%d) scale %g", kr->name, m, k, n, acc, p0, p1,
                 scale);
        if (!same_bits(what, c, want, (size_t)m * ldc)) fail();
    }
    free(pb), free(ap), free(want), free(c);
    return ran;
}

/* Random operands of the given scale: A [m, k], B [k, n], C [m, n + 5]. */
static void operands(int m, int k, int n, double scale, unsigned long long *st, float **a, float **b, float **c0) {
    *a = ls_test_calloc((size_t)m * k, 4), *b = ls_test_calloc((size_t)k * n, 4);
    *c0 = ls_test_calloc((size_t)m * (n + 5), 4);
    ls_ref_fill_uniform_f(*a, (size_t)m * k, scale, st);
    ls_ref_fill_uniform_f(*b, (size_t)k * n, scale, st);
    ls_ref_fill_uniform_f(*c0, (size_t)m * (n + 5), scale * scale, st);
}

static void test_paths_equal_definition(void **state) {
    (void)state;
    const int rows[] = {1, 3, 12, 15, 17, 33, 100}, ks[] = {1, 7, 37, LS_CPU_KC + 29}, ns[] = {1, 5, 17, 33, 70};
    unsigned long long st = 4242;
    for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                const int m = rows[ri], k = ks[ki], n = ns[ni], panels = ls_cpu_panel_count(n);
                float *a, *b, *c0;
                operands(m, k, n, 1.0, &st, &a, &b, &c0);
                assert_true(check_case(m, k, n, false, 0, panels, 1.0, a, b, c0) >= 1);
                check_case(m, k, n, true, 0, panels, 1.0, a, b, c0);
                if (panels > 1) check_case(m, k, n, ni % 2, 1, panels, 1.0, a, b, c0);
                free(a), free(b), free(c0);
            }
}

/* The definition itself against fp64: within the bound of a sum of 2K
 * fp32 roundings of the rounded operands' products (none flushed at
 * this scale). */
static void test_definition_against_fp64(void **state) {
    (void)state;
    const int m = 5, k = LS_CPU_KC + 29, n = 33, ldc = n + 5;
    unsigned long long st = 99;
    float *a, *b, *c0;
    operands(m, k, n, 1.0, &st, &a, &b, &c0);
    float *c = ls_test_calloc((size_t)m * ldc, 4);
    definition(m, k, n, a, b, c0, ldc, false, 0, n, true, c);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (int kk = 0; kk < k; kk++) {
                double t = (double)op(a[(size_t)i * k + kk]) * op(b[(size_t)kk * n + j]);
                ref += t, mag += fabs(t);
            }
            assert_true(fabs(c[(size_t)i * ldc + j] - ref) <= (2 * k + 2) * 0x1p-24 * mag);
        }
    free(a), free(b), free(c0), free(c);
}

/* Operands near 2^-63: products near 2^-126, so sums go denormal and are
 * flushed. The plain FMA chain must differ from the definition here (else
 * the case tests nothing), and every path must still give the
 * definition's bits (the AVX2 emulation sees MXCSR's flags and reruns
 * the tile with the flush). */
static void test_denormal_results_flushed(void **state) {
    (void)state;
    const int m = 7, k = 37, n = 20, ldc = n + 5;
    unsigned long long st = 1234;
    float *a, *b, *c0;
    operands(m, k, n, 0x1p-63, &st, &a, &b, &c0);
    float *flushed = ls_test_calloc((size_t)m * ldc, 4), *plain = ls_test_calloc((size_t)m * ldc, 4);
    definition(m, k, n, a, b, c0, ldc, false, 0, n, true, flushed);
    definition(m, k, n, a, b, c0, ldc, false, 0, n, false, plain);
    assert_true(memcmp(flushed, plain, (size_t)m * ldc * 4) != 0);
    assert_true(check_case(m, k, n, false, 0, ls_cpu_panel_count(n), 0x1p-63, a, b, c0) >= 1);
    check_case(m, k, n, true, 0, ls_cpu_panel_count(n), 0x1p-63, a, b, c0);
    free(a), free(b), free(c0), free(flushed), free(plain);
}

/* Operands: round to nearest even, then a denormal bf16 becomes a zero of
 * its sign; NaN stays NaN. */
static void test_operand_rounding(void **state) {
    (void)state;
    assert_int_equal(ls_cpu_bf16_operand(1.0f), 0x3F80);
    assert_int_equal(ls_cpu_bf16_operand(0x1.00fp0f), 0x3F80);    /* below half an ulp (2^-8): down */
    assert_int_equal(ls_cpu_bf16_operand(0x1.03p0f), 0x3F82);     /* a half, odd below: up to even */
    assert_int_equal(ls_cpu_bf16_operand(0x1.01p0f), 0x3F80);     /* a half, even below: stays */
    assert_int_equal(ls_cpu_bf16_operand(0x1p-127f), 0x0000);     /* denormal: +0 */
    assert_int_equal(ls_cpu_bf16_operand(-0x1p-130f), 0x8000);    /* denormal: -0 */
    assert_int_equal(ls_cpu_bf16_operand(0x1p-126f), 0x0080);     /* the least normal stays */
    assert_true((ls_cpu_bf16_operand(NAN) & 0x7FFF) > 0x7F80);
    float z = ls_cpu_ftz(-0x1p-140f);
    assert_true(z == 0.0f && signbit(z));
}

/* The two points where the SDM's words admit two readings, on one k pair
 * (A = [a_even, a_odd], B the same, C accumulated), every path against
 * the definition: the flush judges the rounded result (2^-126 - 2^-151
 * rounds to the least normal, which stays), and the odd element goes
 * first (two ties that round differently in the other order). On a CPU
 * with AVX512-BF16 this compares the instruction itself. */
static void test_flush_after_rounding_and_odd_first(void **state) {
    (void)state;
    static const struct {
        float c, ae, be, ao, bo, want;
    } cases[] = {
        {0x1p-126f, 0x1p-75f, -0x1p-76f, 0, 0, 0x1p-126f},                    /* rounds up to normal: kept */
        {0x1p-126f, 0x1p-75f, -0x1p-74f, 0, 0, 0.0f},                         /* a denormal: flushed */
        {1.0f, 1.0f, 0x1p-24f, 1.0f, 0x1.8p-24f, 0x1.000004p+0f},             /* odd first: 1 + 1.5u, then + u */
        {1.0f, 1.0f, 0x1.8p-24f, 1.0f, 0x1p-24f, 0x1.000002p+0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const float a[2] = {cases[i].ae, cases[i].ao}, b[2] = {cases[i].be, cases[i].bo};
        float c0[6] = {cases[i].c}, want[6];
        definition(1, 2, 1, a, b, c0, 6, true, 0, 1, true, want);
        assert_memory_equal(&want[0], &cases[i].want, 4);
        assert_true(check_case(1, 2, 1, true, 0, 1, 1.0, a, b, c0) >= 1);
    }
}

/* Every path's own A packer (pack_a_pairs) against gemm.h's definition,
 * dword for dword, on values that stress the rounding (ties either way,
 * carries into the exponent, the largest finite value rounding to
 * infinity, denormals of both signs, -0, NaNs quiet and signalling of
 * both signs, infinities), on rows 1..16, odd and even K, a pair offset,
 * pair counts around 16, and both A strides. */
static void test_pack_a_equals_definition(void **state) {
    (void)state;
    static const uint32_t special[] = {0x3F808000u, 0x3F818000u, 0x3F80FFFFu, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x00000001u,
                                       0x807FFFFFu, 0x80000000u, 0x7FC00000u, 0xFF800001u, 0x7FA00000u, 0x7F800000u,
                                       0xFF800000u, 0x00800000u, 0x3F7F8000u, 0xBF7F8000u};
    const int nspecial = (int)(sizeof special / sizeof special[0]), lda = 90;
    float *a = ls_test_calloc((size_t)LS_CPU_MR_MAX * lda, 4);
    unsigned long long st = 77;
    ls_ref_fill_uniform_f(a, (size_t)LS_CPU_MR_MAX * lda, 4.0, &st);
    for (int i = 0; i < LS_CPU_MR_MAX * lda; i += 3) memcpy(&a[i], &special[(i / 3) % nspecial], 4);
    uint32_t *want = ls_test_calloc((size_t)16 * 48, 4), *got = ls_test_calloc((size_t)16 * 48, 4);
    int ran = 0;
    for (size_t pi = 0; pi < N_PATHS; pi++) {
        const ls_cpu_kernels *kr = ls_cpu_kernels_bf16_for(PATHS[pi]);
        if (!kr || !kr->pack_a_pairs) continue;
        ran++;
        const int ks[] = {1, 2, 31, 32, 33, 64, 67, 90};
        for (int rows = 1; rows <= LS_CPU_MR_MAX; rows++)
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                for (int s0 = 0; s0 <= 1; s0++) {
                    const int K = ks[ki], sc = (K + 1) / 2 - s0, as = rows <= 8 ? 8 : 16;
                    if (sc <= 0) continue;
                    memset(want, 0xAB, (size_t)16 * 48 * 4), memset(got, 0xAB, (size_t)16 * 48 * 4);
                    ls_cpu_pack_a_pairs(want, as, rows, a, (size_t)lda, K, s0, sc);
                    kr->pack_a_pairs(got, as, rows, a, (size_t)lda, K, s0, sc);
                    for (int q = 0; q < sc * as; q++)
                        if (got[q] != want[q]) {
                            fprintf(stderr, "%s pack_a_pairs rows=%d K=%d s0=%d: dword %d = %08x, definition %08x\n",
                                    kr->name, rows, K, s0, q, got[q], want[q]);
                            fail();
                        }
                }
    }
    if (!ran) {
        fprintf(stderr, "note: no bf16 path this CPU runs has its own A packer (only the VDPBF16PS path has one)\n");
        skip();
    }
    free(a), free(want), free(got);
}

/* Which bf16 paths this CPU runs, said in the output. */
static void test_avx512bf16_here(void **state) {
    (void)state;
    if (!ls_cpu_has_avx512bf16()) {
        fprintf(stderr, "note: this CPU has no AVX512-BF16: the VDPBF16PS tiles are compiled but not run here, "
                        "and --compute bf16 --cpu-isa avx512 is refused\n");
        assert_null(ls_cpu_kernels_bf16_for(LS_CPU_ISA_AVX512));
        skip();
    }
    assert_string_equal(ls_cpu_kernels_bf16_for(LS_CPU_ISA_AUTO)->name, "avx512bf16");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_operand_rounding),
        cmocka_unit_test(test_definition_against_fp64),
        cmocka_unit_test(test_paths_equal_definition),
        cmocka_unit_test(test_denormal_results_flushed),
        cmocka_unit_test(test_pack_a_equals_definition),
        cmocka_unit_test(test_flush_after_rounding_and_odd_first),
        cmocka_unit_test(test_avx512bf16_here),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
