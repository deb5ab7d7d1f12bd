/* SiLU with the per-token gate, on its own exponential. The operations
 * are plain IEEE multiplies, adds and one divide in a fixed order (the
 * file is built with -ffp-contract=off), so the compiler's vectorisation
 * of these loops (this file is built with -ftree-vectorize) keeps every
 * bit: a lane computes exactly what the scalar code would. */
#include "gpu/cpu/eltwise.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Inlined into the loops so they vectorise; ls_cpu_expf is the same code. */
static inline float ls_cpu_exp_body(float in) {
    /* Branch-free so the loops below vectorise; a NaN is clamped to a
     * number here (never converted to int) and given back at the end. */
    /* Past ln(FLT_MAX) = 88.72 the product below overflows to inf, as
     * e^x does in float; below -103.97 it rounds to 0. */
    float x = in < 89.0f ? in : 89.0f;
    x = x > -104.0f ? x : -104.0f;
    /* k = round(x / ln 2) by the 1.5 * 2^23 trick (|x / ln 2| < 2^22). */
    const float shift = 12582912.0f;
    float k = (x * 1.44269504088896341f + shift) - shift;
    /* r = x - k ln 2 in two steps (Cody and Waite): the high part of ln 2
     * has few bits, so k * ln2_hi is exact. */
    float r = x - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    /* e^r on |r| <= ln2 / 2: 1 + r + r^2 P(r) (Cephes' coefficients). */
    float z = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * z + r + 1.0f;
    /* Times 2^k (k in [-150, 128]) as 2^k1 * 2^k2, each a normal float
     * built from its exponent bits: p * 2^k1 is exact, and the second
     * product rounds once (to a subnormal, or to inf past FLT_MAX).
     * Where e^x is a normal float both products are exact. */
    const int32_t ki = (int32_t)k, k1 = ki / 2, k2 = ki - k1;
    const int32_t bits1 = (k1 + 127) << 23, bits2 = (k2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &bits1, sizeof s1);
    memcpy(&s2, &bits2, sizeof s2);
    return in == in ? p * s1 * s2 : in;
}

/* Below it, 1 + e^-v overflows or rounds e^v away: silu(v) and the gate
 * are taken as v e^v and e^v instead (the divide would give -0 and 0,
 * or, with e^-v clamped, v / 2^128). At and above it the usual forms. */
#define LS_CPU_TAIL (-88.0f)

float ls_cpu_expf(float x) { return ls_cpu_exp_body(x); }

/* The loops, inlined into a portable copy and an AVX-512 one: 16 lanes
 * instead of SSE's 4 for the same operations (the file allows no fused
 * multiply-add, so both give the same bits). Chosen per call by CPUID
 * rather than by target_clones, whose load-time resolver runs before
 * ThreadSanitizer's runtime and crashed every TSan binary. */
static inline __attribute__((always_inline)) void ls_cpu_swiglu_body(const float *g, const float *u, float gamma,
                                                                     float *a, int count) {
    for (int j = 0; j < count; j++) {
        const float v = g[j];
        const bool tail = v < LS_CPU_TAIL;
        const float e = ls_cpu_exp_body(tail ? v : -v);
        /* -inf (a gate sum that overflowed) times e^-inf = 0 gives 0, its limit. */
        const float vt = v > -3.0e38f ? v : -3.0e38f;
        a[j] = gamma * (tail ? vt * e : v / (1.0f + e)) * u[j];
    }
}

static inline __attribute__((always_inline)) void ls_cpu_sigmoid_body(float *v, int count) {
    for (int i = 0; i < count; i++) {
        const bool tail = v[i] < LS_CPU_TAIL;
        const float e = ls_cpu_exp_body(tail ? v[i] : -v[i]);
        v[i] = tail ? e : 1.0f / (1.0f + e);
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
#define LS_ELTWISE_AVX512 1
__attribute__((target("avx512f"))) static void ls_cpu_swiglu_avx512(const float *g, const float *u, float gamma,
                                                                      float *a, int count) {
    ls_cpu_swiglu_body(g, u, gamma, a, count);
}

__attribute__((target("avx512f"))) static void ls_cpu_sigmoid_avx512(float *v, int count) {
    ls_cpu_sigmoid_body(v, count);
}
#else
#define LS_ELTWISE_AVX512 0
#endif

void ls_cpu_swiglu(const float *g, const float *u, float gamma, float *a, int count) {
#if LS_ELTWISE_AVX512
    if (__builtin_cpu_supports("avx512f")) {
        ls_cpu_swiglu_avx512(g, u, gamma, a, count);
        return;
    }
#endif
    ls_cpu_swiglu_body(g, u, gamma, a, count);
}

void ls_cpu_sigmoid(float *v, int count) {
#if LS_ELTWISE_AVX512
    if (__builtin_cpu_supports("avx512f")) {
        ls_cpu_sigmoid_avx512(v, count);
        return;
    }
#endif
    ls_cpu_sigmoid_body(v, count);
}
