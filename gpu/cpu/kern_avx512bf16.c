/* The AVX512-BF16 register tiles of bf16 compute: VDPBF16PS, one zmm
 * accumulator per row and panel, the shapes of kern_avx512.c. Every
 * function here carries its target attribute instead of the file being
 * built for AVX-512, so the file compiles everywhere and the CPU check
 * (ls_cpu_has_avx512bf16) decides at run time whether it is called.
 * The instruction is the definition of kernels.h: per lane, the odd
 * element's fused multiply-add then the even's, denormals in read as
 * zero and out flushed, nearest even; the portable tiles compute exactly
 * that, so the bits agree by construction. */
#include <immintrin.h>
#include <stdint.h>

#include "gpu/cpu/kernels.h"

#define MR 16
#define MR_REUSE 8
#define TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl")))
#define INLINE static inline __attribute__((always_inline)) TARGET

INLINE __mmask16 ls_bf16x_mask(int ncols, int p) {
    int rem = ncols - p * LS_CPU_NR;
    return rem >= LS_CPU_NR ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1u);
}

/* A holds one dword per row and k pair (gemm.c packs it so for a_pairs);
 * B's step row of a panel is 16 such pairs, one 64-byte load. */
INLINE void ls_bf16x_tile(const int M, const int NP, const ls_cpu_tile *t) {
    __m512 acc[32];
    const char *bp[8];
#pragma GCC unroll 16
    for (int p = 0; p < NP; p++) bp[p] = (const char *)t->b + (size_t)p * t->bstride * 4;
    const __mmask16 last = ls_bf16x_mask(t->ncols, NP - 1);
#pragma GCC unroll 16
    for (int i = 0; i < M; i++) {
        float *c = t->c + (size_t)i * t->ldc;
#pragma GCC unroll 16
        for (int p = 0; p < NP; p++) {
            if (!t->acc) acc[i * NP + p] = _mm512_setzero_ps();
            else if (p < NP - 1) acc[i * NP + p] = _mm512_loadu_ps(c + p * t->cstride);
            else acc[i * NP + p] = _mm512_maskz_loadu_ps(last, c + p * t->cstride);
        }
    }
    const uint32_t *a = (const uint32_t *)(const void *)t->a;
    const int as = ls_cpu_a_stride(MR, MR_REUSE, M);
    for (int k = 0; k < t->k; k++, a += as) {
        __m512i b[8];
#pragma GCC unroll 16
        for (int p = 0; p < NP; p++) {
            _mm_prefetch(ls_cpu_ahead(t->pf, (size_t)p * t->bstride * 4 + (size_t)k * t->pf_step), _MM_HINT_T0);
            b[p] = _mm512_loadu_si512((const void *)(bp[p] + (size_t)k * LS_CPU_NR * 4));
        }
#pragma GCC unroll 16
        for (int i = 0; i < M; i++) {
            __m512i av = _mm512_set1_epi32((int)a[i]);
#pragma GCC unroll 16
            for (int p = 0; p < NP; p++)
                acc[i * NP + p] = _mm512_dpbf16_ps(acc[i * NP + p], (__m512bh)b[p], (__m512bh)av);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < M; i++) {
        float *c = t->c + (size_t)i * t->ldc;
#pragma GCC unroll 16
        for (int p = 0; p < NP - 1; p++) _mm512_storeu_ps(c + p * t->cstride, acc[i * NP + p]);
        _mm512_mask_storeu_ps(c + (NP - 1) * t->cstride, last, acc[i * NP + NP - 1]);
    }
}

#define LS_BF16X_CASE(M, NP)                                                                               \
    case M * 16 + NP: ls_bf16x_tile(M, NP, t); return;

TARGET static void ls_bf16x_tile_pairs(const ls_cpu_tile *t) {
    switch (t->m * 16 + t->np) {
        LS_CPU_AVX512_SHAPES(LS_BF16X_CASE)
    default: __builtin_unreachable();
    }
}

/* Only the pairs tiles: the gate's fp32 GEMM of bf16 compute runs on the
 * f32 kernels of --cpu-isa. */
const ls_cpu_kernels ls_cpu_kernels_avx512bf16 = {
    /* .isa       = */ LS_CPU_ISA_AVX512,
    /* .name      = */ "avx512bf16",
    /* .mr        = */ MR,
    /* .mr_reuse  = */ MR_REUSE,
    /* .np        = */ {0, 8, 8, 6, 6, 4, 4, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1},
    /* .tile_f32  = */ NULL,
    /* .tile_bf16 = */ NULL,
    /* .tile_f16  = */ NULL,
    /* .tile_pairs = */ ls_bf16x_tile_pairs,
    /* .a_pairs   = */ true,
};
