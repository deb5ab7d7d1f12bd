/* The CPU engine's building blocks on their own: the blocked GEMM over
 * every kernel path this CPU has against an fp64 reference on awkward
 * shapes (rows 1, 3, 12, 15, 17, 33, 100; K and N not multiples of a vector width,
 * K past one K block; f32, bf16 and f16 panels; overwrite and accumulate;
 * column subranges and strided C panels), every path bit for bit equal to
 * the portable one; packing round trips; and the element-wise step: the
 * project's exp against libm's in double, and the (vectorised) SiLU loop
 * equal to the scalar formula bit for bit. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/cpu/eltwise.h"
#include "gpu/cpu/gemm.h"
#include "tests/util/reference.h"
#include "tests/util/testutil.h"

static const ls_cpu_isa PATHS[] = {LS_CPU_ISA_AVX512, LS_CPU_ISA_AVX2, LS_CPU_ISA_GENERIC};
#define N_PATHS (sizeof PATHS / sizeof PATHS[0])
static const ls_dtype DTYPES[] = {LS_DTYPE_F32, LS_DTYPE_BF16, LS_DTYPE_F16};

/* B [k, n] packed at dt; *rounded receives B's values as the panels hold
 * them (rounded to dt), row-major. */
static void *pack(const float *b, int k, int n, ls_dtype dt, float **rounded) {
    size_t esz = dt == LS_DTYPE_F32 ? 4 : 2;
    void *p = ls_test_calloc(ls_cpu_packed_len(k, n), esz);
    ls_cpu_pack_b(p, dt, k, 0, 1, b, (size_t)n, 1, k, n);
    *rounded = ls_test_calloc((size_t)k * n, sizeof(float));
    ls_cpu_unpack_b(p, dt, k, 0, *rounded, (size_t)n, 1, k, n);
    return p;
}

/* One case on every path: C (m x ldc, columns of panels [p0, p1) only)
 * against the fp64 sum of A times the rounded B, within the error bound of
 * a K-term fp32 sum, and bit for bit equal to the portable path. With
 * bf16 or f16 panels, also bit for bit equal to f32 panels of the same
 * (rounded) values: the engine keeps LoRA factors that are exact bf16 or
 * f16 numbers at 2 bytes on that promise. */
static void check_case(int m, int k, int n, ls_dtype dt, bool acc, int p0, int p1, unsigned long long *st) {
    const int ldc = n + 5; /* C rows wider than B: the tiles must not spill */
    float *a = ls_test_calloc((size_t)m * k, 4), *b = ls_test_calloc((size_t)k * n, 4), *c0 = ls_test_calloc((size_t)m * ldc, 4);
    ls_ref_fill_uniform_f(a, (size_t)m * k, 1.0, st);
    ls_ref_fill_uniform_f(b, (size_t)k * n, 1.0, st);
    ls_ref_fill_uniform_f(c0, (size_t)m * ldc, 1.0, st);
    float *rb;
    void *pb = pack(b, k, n, dt, &rb);
    ls_cpu_mat bm = {pb, dt, k, n, false};
    float *ap = ls_test_calloc(ls_cpu_apack_len(k), 4);
    float *want = NULL;
    const ls_cpu_kernels *first = NULL;
    const int j0 = p0 * LS_CPU_NR, j1 = p1 * LS_CPU_NR < n ? p1 * LS_CPU_NR : n;
    for (size_t pi = 0; pi < N_PATHS; pi++) {
        const ls_cpu_kernels *kr = ls_cpu_kernels_for(PATHS[pi]);
        if (!kr) continue;
        float *c = ls_test_calloc((size_t)m * ldc, 4);
        memcpy(c, c0, (size_t)m * ldc * 4);
        ls_cpu_gemm(kr, ap, m, a, (size_t)k, &bm, p0, p1, c, (size_t)ldc, LS_CPU_NR, acc);
        for (int i = 0; i < m; i++)
            for (int j = 0; j < ldc; j++) {
                float got = c[(size_t)i * ldc + j];
                if (j < j0 || j >= j1) {
                    /* outside the columns asked for: untouched */
                    assert_memory_equal(&got, &c0[(size_t)i * ldc + j], 4);
                    continue;
                }
                double ref = acc ? c0[(size_t)i * ldc + j] : 0.0, mag = fabs(ref);
                for (int kk = 0; kk < k; kk++) {
                    double t = (double)a[(size_t)i * k + kk] * rb[(size_t)kk * n + j];
                    ref += t;
                    mag += fabs(t);
                }
                double bound = (k + 2) * 0x1p-24 * mag + 1e-30;
                if (fabs(got - ref) > bound) {
                    fprintf(stderr, "%s %s m=%d k=%d n=%d acc=%d: C[%d,%d] = %.9g, fp64 %.9g (bound %.3g)\n",
                            kr->name, ls_dtype_name(dt), m, k, n, acc, i, j, got, ref, bound);
                    fail();
                }
            }
        if (!want) {
            want = c;
            first = kr;
            continue;
        }
        if (memcmp(c, want, (size_t)m * ldc * 4) != 0) {
            fprintf(stderr, "%s and the first path differ: %s m=%d k=%d n=%d\n", kr->name, ls_dtype_name(dt), m, k, n);
            fail();
        }
        free(c);
    }
    if (dt != LS_DTYPE_F32) {
        float *same;
        void *pf = pack(rb, k, n, LS_DTYPE_F32, &same);
        ls_cpu_mat fm = {pf, LS_DTYPE_F32, k, n, false};
        float *c = ls_test_calloc((size_t)m * ldc, 4);
        memcpy(c, c0, (size_t)m * ldc * 4);
        ls_cpu_gemm(first, ap, m, a, (size_t)k, &fm, p0, p1, c, (size_t)ldc, LS_CPU_NR, acc);
        if (memcmp(c, want, (size_t)m * ldc * 4) != 0) {
            fprintf(stderr, "%s: %s panels and f32 panels of the same values differ: m=%d k=%d n=%d\n", first->name,
                    ls_dtype_name(dt), m, k, n);
            fail();
        }
        free(c), free(same), free(pf);
    }
    free(want), free(a), free(b), free(c0), free(rb), free(pb), free(ap);
}

static void test_gemm_against_fp64(void **state) {
    (void)state;
    const int rows[] = {1, 3, 12, 15, 17, 33, 100}, ks[] = {1, 7, 37, LS_CPU_KC + 29}, ns[] = {1, 5, 17, 33, 70};
    unsigned long long st = 42;
    for (size_t d = 0; d < 3; d++)
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                    const int n = ns[ni], panels = ls_cpu_panel_count(n);
                    check_case(rows[ri], ks[ki], n, DTYPES[d], false, 0, panels, &st);
                    check_case(rows[ri], ks[ki], n, DTYPES[d], true, 0, panels, &st);
                    /* a caller's share: the last panels only */
                    if (panels > 1) check_case(rows[ri], ks[ki], n, DTYPES[d], ni % 2, 1, panels, &st);
                }
}

/* C panels scattered with a stride (the engine's interleaved gate/up
 * columns): the same values as contiguous C, in the strided places. */
static void test_gemm_strided_c(void **state) {
    (void)state;
    const int m = 19, k = 45, n = 40, panels = ls_cpu_panel_count(n), step = 3 * LS_CPU_NR;
    unsigned long long st = 7;
    float *a = ls_test_calloc((size_t)m * k, 4), *b = ls_test_calloc((size_t)k * n, 4);
    ls_ref_fill_uniform_f(a, (size_t)m * k, 1.0, &st);
    ls_ref_fill_uniform_f(b, (size_t)k * n, 1.0, &st);
    float *rb;
    void *pb = pack(b, k, n, LS_DTYPE_BF16, &rb);
    ls_cpu_mat bm = {pb, LS_DTYPE_BF16, k, n, false};
    float *ap = ls_test_calloc(ls_cpu_apack_len(k), 4);
    const int ldc = panels * step;
    for (size_t pi = 0; pi < N_PATHS; pi++) {
        const ls_cpu_kernels *kr = ls_cpu_kernels_for(PATHS[pi]);
        if (!kr) continue;
        float *dense = ls_test_calloc((size_t)m * n, 4), *sparse = ls_test_calloc((size_t)m * ldc, 4);
        ls_cpu_gemm(kr, ap, m, a, (size_t)k, &bm, 0, panels, dense, (size_t)n, LS_CPU_NR, false);
        ls_cpu_gemm(kr, ap, m, a, (size_t)k, &bm, 0, panels, sparse, (size_t)ldc, (size_t)step, false);
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                size_t at = (size_t)i * ldc + (size_t)(j / LS_CPU_NR) * step + (size_t)(j % LS_CPU_NR);
                assert_memory_equal(&sparse[at], &dense[(size_t)i * n + j], 4);
            }
        /* between the panels nothing was written */
        for (int i = 0; i < m; i++)
            for (int p = 0; p < panels; p++)
                for (int l = LS_CPU_NR; l < step; l++) assert_true(sparse[(size_t)i * ldc + (size_t)p * step + l] == 0.0f);
        free(dense), free(sparse);
    }
    free(a), free(b), free(rb), free(pb), free(ap);
}

/* f32 panels hold values exactly; bf16 and f16 panels the nearest even. */
static void test_pack_round_trip(void **state) {
    (void)state;
    const int k = 13, n = 21;
    unsigned long long st = 9;
    float *b = ls_test_calloc((size_t)k * n, 4);
    ls_ref_fill_uniform_f(b, (size_t)k * n, 3.0, &st);
    for (size_t d = 0; d < 3; d++) {
        float *rb;
        void *pb = pack(b, k, n, DTYPES[d], &rb);
        for (int i = 0; i < k * n; i++) {
            float want = b[i];
            if (DTYPES[d] == LS_DTYPE_BF16) want = ls_bf16_to_f32(ls_f32_to_bf16(b[i]));
            if (DTYPES[d] == LS_DTYPE_F16) want = ls_f16_to_f32(ls_f32_to_f16(b[i]));
            assert_memory_equal(&rb[i], &want, 4);
        }
        /* padding columns of the last panel are zero */
        const size_t esz = DTYPES[d] == LS_DTYPE_F32 ? 4 : 2, last = (size_t)(n / LS_CPU_NR) * k * LS_CPU_NR;
        for (int kk = 0; kk < k; kk++)
            for (int l = n % LS_CPU_NR; l < LS_CPU_NR; l++) {
                const unsigned char *v = (const unsigned char *)pb + (last + (size_t)kk * LS_CPU_NR + l) * esz;
                for (size_t byte = 0; byte < esz; byte++) assert_int_equal(v[byte], 0);
            }
        free(rb), free(pb);
    }
    free(b);
}

/* Within 2 ulp of e^x wherever e^x is a float (the subnormal range's
 * ulp is 2^-149), exact at 0, NaN stays NaN, inf past ln(FLT_MAX) and 0
 * far below: it clamped at 88.3 and -87.3, so e^89 was 2.2e38, and
 * silu(-1e19) came out 0.45. */
static void test_expf(void **state) {
    (void)state;
    double worst = 0;
    for (int i = 0; i <= 400000; i++) {
        float x = -103.9f + 192.6f * (float)i / 400000.0f;
        double want = exp((double)x), got = ls_cpu_expf(x);
        double ulp = ldexp(1.0, (ilogb(want) > -126 ? ilogb(want) : -126) - 23);
        double err = fabs(got - want) / ulp;
        if (err > worst) worst = err;
    }
    printf("ls_cpu_expf: worst error %.2f ulp\n", worst);
    assert_true(worst <= 2.0);
    assert_true(ls_cpu_expf(0.0f) == 1.0f);
    assert_true(isnan(ls_cpu_expf(NAN)));
    assert_true(isfinite(ls_cpu_expf(88.72f)) && ls_cpu_expf(88.72f) > 3.3e38f);
    assert_true(isinf(ls_cpu_expf(88.73f)) && isinf(ls_cpu_expf(1000.0f)) && isinf(ls_cpu_expf(INFINITY)));
    assert_true(ls_cpu_expf(-105.0f) == 0.0f && ls_cpu_expf(-1000.0f) == 0.0f && ls_cpu_expf(-INFINITY) == 0.0f);
}

/* SiLU and the gate against fp64 far down their negative tail, where
 * e^-v overflows: silu(-1e19) was 0.45 and sigmoid(-95) 815 times too
 * large. Relative 1e-5 where the value is a normal float; below, within
 * two subnormal steps of e^v times |v| (e^v itself is subnormal there). */
static void test_silu_tail(void **state) {
    (void)state;
    const float vs[] = {-20.0f, -87.9f, -88.0f, -88.31f, -90.0f, -95.0f, -100.0f, -120.0f, -1e15f, -1e19f,
                        -3e38f, -INFINITY, 50.0f, 1e19f};
    for (size_t i = 0; i < sizeof vs / sizeof *vs; i++) {
        const double v = vs[i];
        const double sig = isinf(v) ? 0.0 : v < 0 ? exp(v) / (1.0 + exp(v)) : 1.0 / (1.0 + exp(-v));
        const double silu = isinf(v) || sig == 0.0 ? 0.0 : v * sig;
        float g = vs[i], u = 1.0f, a, s = vs[i];
        ls_cpu_swiglu(&g, &u, 1.0f, &a, 1);
        ls_cpu_sigmoid(&s, 1);
        const double tol_a = fmax(1e-5 * fabs(silu), 2 * fabs(v) * 0x1p-149), tol_s = fmax(1e-5 * sig, 2 * 0x1p-149);
        if (!(fabs(a - silu) <= tol_a)) fail_msg("silu(%g) = %g, wanted %g", v, a, silu);
        if (!(fabs(s - sig) <= tol_s)) fail_msg("sigmoid(%g) = %g, wanted %g", v, s, sig);
    }
}

/* The SiLU loop, vectorised by the compiler, against the scalar formula
 * on every length up to 40 (vector bodies and tails) and on values that
 * reach the clamps, zero, and NaN: the same bits. */
static void test_swiglu_matches_scalar(void **state) {
    (void)state;
    unsigned long long st = 3;
    float g[40], u[40], a[40];
    for (int len = 1; len <= 40; len++) {
        ls_ref_fill_uniform_f(g, 40, 30.0, &st);
        ls_ref_fill_uniform_f(u, 40, 2.0, &st);
        g[len / 2] = len % 3 ? 100.0f : -100.0f;
        if (len > 3) g[len - 2] = 0.0f;
        if (len > 5) g[1] = NAN;
        if (len > 7) g[len - 3] = len % 2 ? -INFINITY : -95.0f; /* the tail's form */
        const float gamma = 0.75f + 0.01f * (float)len;
        ls_cpu_swiglu(g, u, gamma, a, len);
        for (int j = 0; j < len; j++) {
            const float v = g[j];
            const float silu = v < -88.0f ? (v > -3.0e38f ? v : -3.0e38f) * ls_cpu_expf(v) : v / (1.0f + ls_cpu_expf(-v));
            float want = gamma * silu * u[j];
            if (isnan(want)) assert_true(isnan(a[j]));
            else assert_memory_equal(&a[j], &want, 4);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_against_fp64),
        cmocka_unit_test(test_gemm_strided_c),
        cmocka_unit_test(test_pack_round_trip),
        cmocka_unit_test(test_expf),
        cmocka_unit_test(test_silu_tail),
        cmocka_unit_test(test_swiglu_matches_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
