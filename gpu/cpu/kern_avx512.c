/* The AVX-512F register tiles: up to 16 rows by up to 8 panels of 16
 * columns, one zmm accumulator per row and panel (24 of 32 registers in
 * the widest shapes). Built with -mavx512f -mfma -mf16c; only called when
 * the CPU has AVX-512F. Each lane runs its column's multiply-add chain in
 * k order, exactly as kern_generic.c does with fmaf. */
#include <immintrin.h>
#include <stdint.h>

#include "gpu/cpu/kernels.h"

#if !defined(__AVX512F__) || !defined(__FMA__) || !defined(__F16C__)
#error "kern_avx512.c must be built with -mavx512f -mfma -mf16c"
#endif

#define MR 16
/* 8 x 3 tiles (24 FMAs for 3 B loads and 8 broadcasts) measured 3-5%
 * faster than 16 x 1 where B is reused from cache (T=256, T=2048). */
#define MR_REUSE 8
#define INLINE static inline __attribute__((always_inline))

#include "gpu/cpu/kern_avx512_c.h"

/* 16 consecutive B values of panel row k, widened to fp32 (exact). */
INLINE __m512 ls_avx512_load_b(ls_dtype dt, const void *b, size_t at) {
    if (dt == LS_DTYPE_F32) return _mm512_loadu_ps((const float *)b + at);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)b + at));
    if (dt == LS_DTYPE_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* The tile body; M and NP are constants in every instance, so the loops
 * unroll and acc lives in registers. */
INLINE void ls_avx512_tile(const int M, const int NP, const ls_dtype dt, const ls_cpu_tile *t) {
    __m512 acc[32]; /* acc[i * NP + p], at most 24 live */
    const char *bp[8];
    const size_t esz = dt == LS_DTYPE_F32 ? 4 : 2;
#pragma GCC unroll 16
    for (int p = 0; p < NP; p++) bp[p] = (const char *)t->b + (size_t)p * t->bstride * esz;
    const __mmask16 last = ls_zmm_mask(t->ncols, NP - 1);
    ls_zmm_c_load(M, NP, t, last, acc);
    const float *a = t->a;
    const int as = ls_cpu_a_stride(MR, MR_REUSE, M);
    for (int k = 0; k < t->k; k++, a += as) {
        __m512 b[8];
#pragma GCC unroll 16
        for (int p = 0; p < NP; p++) {
            _mm_prefetch(ls_cpu_ahead(t->pf, (size_t)p * t->bstride * esz + (size_t)k * t->pf_step), _MM_HINT_T0);
            b[p] = ls_avx512_load_b(dt, bp[p], (size_t)k * LS_CPU_NR);
        }
#pragma GCC unroll 16
        for (int i = 0; i < M; i++) {
            __m512 av = _mm512_set1_ps(a[i]);
#pragma GCC unroll 16
            for (int p = 0; p < NP; p++) acc[i * NP + p] = _mm512_fmadd_ps(av, b[p], acc[i * NP + p]);
        }
    }
    ls_zmm_c_store(M, NP, t, last, acc);
}

#define LS_AVX512_DEFINE(DTN)                                                                              \
    static void ls_avx512_tile_##DTN(const ls_cpu_tile *t) {                                               \
        switch (t->m * 16 + t->np) {                                                                       \
            LS_CPU_AVX512_SHAPES(LS_AVX512_CASE_##DTN)                                                     \
        default: __builtin_unreachable();                                                                  \
        }                                                                                                  \
    }

#define LS_AVX512_CASE_f32(M, NP)                                                                          \
    case M * 16 + NP: ls_avx512_tile(M, NP, LS_DTYPE_F32, t); return;
#define LS_AVX512_CASE_bf16(M, NP)                                                                         \
    case M * 16 + NP: ls_avx512_tile(M, NP, LS_DTYPE_BF16, t); return;
#define LS_AVX512_CASE_f16(M, NP)                                                                          \
    case M * 16 + NP: ls_avx512_tile(M, NP, LS_DTYPE_F16, t); return;

LS_AVX512_DEFINE(f32)
LS_AVX512_DEFINE(bf16)
LS_AVX512_DEFINE(f16)

const ls_cpu_kernels ls_cpu_kernels_avx512 = {
    /* .isa       = */ LS_CPU_ISA_AVX512,
    /* .name      = */ "avx512",
    /* .mr        = */ MR,
    /* .mr_reuse  = */ MR_REUSE,
    /* .np        = */ {0, 8, 8, 6, 6, 4, 4, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1},
    /* .tile_f32  = */ ls_avx512_tile_f32,
    /* .tile_bf16 = */ ls_avx512_tile_bf16,
    /* .tile_f16  = */ ls_avx512_tile_f16,
    /* .tile_pairs = */ NULL, /* bf16 compute on AVX-512 is kern_avx512bf16.c */
    /* .a_pairs   = */ false,
    /* .pack_a_pairs = */ NULL,
};
