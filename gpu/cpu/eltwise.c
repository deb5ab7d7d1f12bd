/* SiLU with the per-token gate, on its own exponential. The operations
 * are plain IEEE multiplies, adds and one divide in a fixed order (the
 * file is built with -ffp-contract=off), so the compiler's vectorisation
 * of these loops (this file is built with -ftree-vectorize) keeps every
 * bit: a lane computes exactly what the scalar code would. */
#include "gpu/cpu/eltwise.h"

#include <stdint.h>
#include <string.h>

/* Inlined into the loops so they vectorise; ls_cpu_expf is the same code. */
static inline float ls_cpu_exp_body(float in) {
    /* Branch-free so the loops below vectorise; a NaN is clamped to a
     * number here (never converted to int) and given back at the end. */
    float x = in < 88.3f ? in : 88.3f;
    x = x > -87.3f ? x : -87.3f;
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
    /* Times 2^k, built from its exponent bits (k in [-126, 127]). */
    int32_t bits = ((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return in == in ? p * scale : in;
}

float ls_cpu_expf(float x) { return ls_cpu_exp_body(x); }

/* The loops, inlined into a portable copy and an AVX-512 one: 16 lanes
 * instead of SSE's 4 for the same operations (the file allows no fused
 * multiply-add, so both give the same bits). Chosen per call by CPUID
 * rather than by target_clones, whose load-time resolver runs before
 * ThreadSanitizer's runtime and crashed every TSan binary. */
static inline __attribute__((always_inline)) void ls_cpu_swiglu_body(const float *g, const float *u, float gamma,
                                                                     float *a, int count) {
    for (int j = 0; j < count; j++) {
        float v = g[j];
        a[j] = gamma * (v / (1.0f + ls_cpu_exp_body(-v))) * u[j];
    }
}

static inline __attribute__((always_inline)) void ls_cpu_sigmoid_body(float *v, int count) {
    for (int i = 0; i < count; i++) v[i] = 1.0f / (1.0f + ls_cpu_exp_body(-v[i]));
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
