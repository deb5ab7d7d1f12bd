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

#include "gpu/cpu/kern_avx512_c.h"

/* A holds one dword per row and k pair (gemm.c packs it so for a_pairs);
 * B's step row of a panel is 16 such pairs, one 64-byte load. */
INLINE void ls_bf16x_tile(const int M, const int NP, const ls_cpu_tile *t) {
    __m512 acc[32];
    const char *bp[8];
#pragma GCC unroll 16
    for (int p = 0; p < NP; p++) bp[p] = (const char *)t->b + (size_t)p * t->bstride * 4;
    const __mmask16 last = ls_zmm_mask(t->ncols, NP - 1);
    ls_zmm_c_load(M, NP, t, last, acc);
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
    ls_zmm_c_store(M, NP, t, last, acc);
}

/* 16 fp32 values as bf16 operands (gemm.c's ls_cpu_bf16_operand):
 * nearest even, a NaN made quiet, a denormal flushed to a zero of its
 * sign. Integer steps, so the bits are the portable ones by construction
 * (VCVTNE2PS2BF16 would agree on all but NaN payloads; not relied on). */
INLINE __m256i ls_bf16x_operands(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    const __mmask16 tiny = _mm512_testn_epi32_mask(r, _mm512_set1_epi32(0x7f80));
    r = _mm512_mask_and_epi32(r, tiny, r, _mm512_set1_epi32(0x8000));
    return _mm512_cvtepi32_epi16(r);
}

INLINE __mmask16 ls_bf16x_first(int count) {
    return count >= 16 ? (__mmask16)0xFFFF : count <= 0 ? (__mmask16)0 : (__mmask16)((1u << count) - 1u);
}

/* gemm.h's ls_cpu_pack_a_pairs, 16 pairs of a row at a time: the row's
 * 32 values rounded in two vectors into a small row-major block, which
 * is then transposed into the tile's layout with dword moves. */
TARGET static void ls_bf16x_pack_a(uint32_t *dst, int as, int rows, const float *a, size_t lda, int K, int s0, int sc) {
    uint32_t blk[LS_CPU_MR_MAX][16];
    for (int p0 = 0; p0 < sc; p0 += 16) {
        const int w = sc - p0 < 16 ? sc - p0 : 16, k0 = 2 * (s0 + p0);
        const __mmask16 m0 = ls_bf16x_first(K - k0), m1 = ls_bf16x_first(K - k0 - 16);
        for (int i = 0; i < rows; i++) {
            const float *src = a + (size_t)i * lda + k0;
            _mm256_storeu_si256((__m256i *)(void *)&blk[i][0], ls_bf16x_operands(_mm512_maskz_loadu_ps(m0, src)));
            _mm256_storeu_si256((__m256i *)(void *)&blk[i][8], ls_bf16x_operands(_mm512_maskz_loadu_ps(m1, src + 16)));
        }
        for (int p = 0; p < w; p++)
            for (int i = 0; i < rows; i++) dst[(size_t)(p0 + p) * as + i] = blk[i][p];
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
    /* .pack_a_pairs = */ ls_bf16x_pack_a,
};
