/* The AVX2+FMA register tiles: up to 6 rows by up to 4 panels, a panel
 * being two ymm registers of 8 columns; at most 12 accumulators of the
 * 16 registers. Built with -mavx2 -mfma -mf16c; only called when the CPU
 * has all three. Each lane runs its column's multiply-add chain in k
 * order, exactly as kern_generic.c does with fmaf. */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "gpu/cpu/kernels.h"

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "kern_avx2.c must be built with -mavx2 -mfma -mf16c"
#endif

#define MR 6
#define INLINE static inline __attribute__((always_inline))

/* 8 consecutive B values of panel row k, widened to fp32 (exact). */
INLINE __m256 ls_avx2_load_b(ls_dtype dt, const void *b, size_t at) {
    if (dt == LS_DTYPE_F32) return _mm256_loadu_ps((const float *)b + at);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)b + at));
    if (dt == LS_DTYPE_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* All-ones lanes for the columns j0..j0+7 of the tile that are real. */
INLINE __m256i ls_avx2_mask(int ncols, int j0) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(ncols - j0), lane);
}

/* v with its denormal lanes made zeros of their sign (kernels.h's ftz). */
INLINE __m256 ls_avx2_ftz(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f), tiny = _mm256_set1_ps(0x1p-126f);
    __m256 keep = _mm256_cmp_ps(_mm256_andnot_ps(sign, v), tiny, _CMP_GE_OQ);
    return _mm256_and_ps(v, _mm256_or_ps(keep, sign));
}

/* C of a tile, half v of panel p at c + p * cstride + v * 8 of row i:
 * the accumulators set to zero or loaded from C (flushed by ls_avx2_ftz
 * with FTZ), and stored back (flushed with FTZ). Only the last panel can
 * be partial; vmaskmovps costs several times a plain load or store (on
 * Zen 4 the tile's 24 of them took about 8% of a 384-step tile), so
 * whole panels use plain ones. M, NP and FTZ are constants. */
typedef struct {
    bool whole;
    __m256i m0, m1; /* the last panel's two halves */
} ls_avx2_edge;

INLINE ls_avx2_edge ls_avx2_edge_of(const int NP, const ls_cpu_tile *t) {
    return (ls_avx2_edge){t->ncols == NP * LS_CPU_NR, ls_avx2_mask(t->ncols, (NP - 1) * LS_CPU_NR),
                          ls_avx2_mask(t->ncols, (NP - 1) * LS_CPU_NR + 8)};
}

INLINE void ls_avx2_c_load(const int M, const int NP, const bool FTZ, const ls_cpu_tile *t, ls_avx2_edge e,
                           __m256 acc[MR][8]) {
    const int V = 2 * NP;
#pragma GCC unroll 6
    for (int i = 0; i < M; i++) {
        const float *c = t->c + (size_t)i * t->ldc;
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) {
            const float *at = c + (v / 2) * t->cstride + (v % 2) * 8;
            __m256 r;
            if (!t->acc) r = _mm256_setzero_ps();
            else if (v < V - 2 || e.whole) r = _mm256_loadu_ps(at);
            else r = _mm256_maskload_ps(at, v == V - 2 ? e.m0 : e.m1);
            acc[i][v] = FTZ ? ls_avx2_ftz(r) : r;
        }
    }
}

INLINE void ls_avx2_c_store(const int M, const int NP, const bool FTZ, const ls_cpu_tile *t, ls_avx2_edge e,
                            __m256 acc[MR][8]) {
    const int V = 2 * NP;
#pragma GCC unroll 6
    for (int i = 0; i < M; i++) {
        float *c = t->c + (size_t)i * t->ldc;
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) {
            const __m256 r = FTZ ? ls_avx2_ftz(acc[i][v]) : acc[i][v];
            float *at = c + (v / 2) * t->cstride + (v % 2) * 8;
            if (v < V - 2 || e.whole) _mm256_storeu_ps(at, r);
            else _mm256_maskstore_ps(at, v == V - 2 ? e.m0 : e.m1, r);
        }
    }
}

/* The tile body; M and NP are constants in every instance, so the loops
 * unroll and acc lives in registers. Half h of panel p holds columns
 * p*16 + h*8 .. +7. */
INLINE void ls_avx2_tile(const int M, const int NP, const ls_dtype dt, const ls_cpu_tile *t) {
    __m256 acc[MR][8];
    const char *bp[4];
    const size_t esz = dt == LS_DTYPE_F32 ? 4 : 2;
    const int V = 2 * NP;
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++) bp[p] = (const char *)t->b + (size_t)p * t->bstride * esz;
    const ls_avx2_edge e = ls_avx2_edge_of(NP, t);
    ls_avx2_c_load(M, NP, false, t, e, acc);
    const float *a = t->a;
    for (int k = 0; k < t->k; k++, a += MR) {
        __m256 b[8];
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++)
            _mm_prefetch(ls_cpu_ahead(t->pf, (size_t)p * t->bstride * esz + (size_t)k * t->pf_step), _MM_HINT_T0);
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) b[v] = ls_avx2_load_b(dt, bp[v / 2], (size_t)k * LS_CPU_NR + (size_t)(v % 2) * 8);
#pragma GCC unroll 6
        for (int i = 0; i < M; i++) {
            __m256 av = _mm256_broadcast_ss(a + i);
#pragma GCC unroll 8
            for (int v = 0; v < V; v++) acc[i][v] = _mm256_fmadd_ps(av, b[v], acc[i][v]);
        }
    }
    ls_avx2_c_store(M, NP, false, t, e, acc);
}

/* bf16 compute, VDPBF16PS emulated (kernels.h): B's 64-byte step rows
 * hold 16 (even, odd) pairs; a dword's high half is the odd value as an
 * fp32 (mask the low half off), its low half shifted up the even one. A
 * is fp32 values, even k at a[2p * MR + i], odd at a[(2p + 1) * MR + i].
 * A bf16 x bf16 product is exact in fp32, so one FMA is the step's
 * multiply-add; what is left is the flush of denormal results. FLUSH
 * does it after every step (exact, and slow); without FLUSH the chain is
 * plain FMAs, which equal the flushed chain exactly when no step made a
 * denormal, and the caller checks that from MXCSR's flags. */
INLINE bool ls_avx2_pairs(const int M, const int NP, const bool FLUSH, const ls_cpu_tile *t) {
    __m256 acc[MR][8];
    const char *bp[4];
    const int V = 2 * NP;
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++) bp[p] = (const char *)t->b + (size_t)p * t->bstride * 4;
    const __m256 hi = _mm256_castsi256_ps(_mm256_set1_epi32((int)0xFFFF0000u));
    const ls_avx2_edge e = ls_avx2_edge_of(NP, t);
    ls_avx2_c_load(M, NP, true, t, e, acc);
    /* MXCSR's denormal-operand and underflow flags, cleared here and read
     * at the end; the empty asm keeps the FMAs between the two. */
    const unsigned flags = 0x12u, csr = FLUSH ? 0 : _mm_getcsr();
    if (!FLUSH) _mm_setcsr(csr & ~flags);
#pragma GCC unroll 6
    for (int i = 0; i < M; i++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) __asm__ volatile("" : "+x"(acc[i][v]));
    const float *a = t->a;
    for (int k = 0; k < t->k; k++, a += 2 * MR) {
        __m256 b[8];
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++)
            _mm_prefetch(ls_cpu_ahead(t->pf, (size_t)p * t->bstride * 4 + (size_t)k * t->pf_step), _MM_HINT_T0);
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) {
            b[v] = _mm256_loadu_ps((const float *)bp[v / 2] + (size_t)k * LS_CPU_NR + (size_t)(v % 2) * 8);
            __m256 odd = _mm256_and_ps(b[v], hi);
#pragma GCC unroll 6
            for (int i = 0; i < M; i++) {
                acc[i][v] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + MR + i), odd, acc[i][v]);
                if (FLUSH) acc[i][v] = ls_avx2_ftz(acc[i][v]);
            }
        }
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) {
            __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(b[v]), 16));
#pragma GCC unroll 6
            for (int i = 0; i < M; i++) {
                acc[i][v] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + i), even, acc[i][v]);
                if (FLUSH) acc[i][v] = ls_avx2_ftz(acc[i][v]);
            }
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < M; i++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) __asm__ volatile("" : "+x"(acc[i][v]));
    if (!FLUSH) {
        const unsigned seen = _mm_getcsr();
        _mm_setcsr(csr);
        if (seen & flags) return false; /* a denormal appeared: the caller reruns with FLUSH */
    }
    /* Without FLUSH: the last step's denormal raised no flag if it was
     * exact, so the store flushes. */
    ls_avx2_c_store(M, NP, !FLUSH, t, e, acc);
    return true;
}

#define LS_AVX2_SHAPES(X)                                                                                  \
    X(1, 1) X(1, 2) X(1, 3) X(1, 4)                                                                        \
    X(2, 1) X(2, 2) X(2, 3)                                                                                \
    X(3, 1) X(3, 2)                                                                                        \
    X(4, 1) X(5, 1) X(6, 1)

#define LS_AVX2_DEFINE(DTN)                                                                                \
    static void ls_avx2_tile_##DTN(const ls_cpu_tile *t) {                                                 \
        switch (t->m * 16 + t->np) {                                                                       \
            LS_AVX2_SHAPES(LS_AVX2_CASE_##DTN)                                                             \
        default: __builtin_unreachable();                                                                  \
        }                                                                                                  \
    }

#define LS_AVX2_CASE_f32(M, NP)                                                                            \
    case M * 16 + NP: ls_avx2_tile(M, NP, LS_DTYPE_F32, t); return;
#define LS_AVX2_CASE_bf16(M, NP)                                                                           \
    case M * 16 + NP: ls_avx2_tile(M, NP, LS_DTYPE_BF16, t); return;
#define LS_AVX2_CASE_f16(M, NP)                                                                            \
    case M * 16 + NP: ls_avx2_tile(M, NP, LS_DTYPE_F16, t); return;

#define LS_AVX2_CASE_pairs(M, NP)                                                                          \
    case M * 16 + NP:                                                                                      \
        if (!ls_avx2_pairs(M, NP, false, t)) ls_avx2_pairs(M, NP, true, t);                                \
        return;

LS_AVX2_DEFINE(f32)
LS_AVX2_DEFINE(pairs)
LS_AVX2_DEFINE(bf16)
LS_AVX2_DEFINE(f16)

const ls_cpu_kernels ls_cpu_kernels_avx2 = {
    /* .isa       = */ LS_CPU_ISA_AVX2,
    /* .name      = */ "avx2",
    /* .mr        = */ MR,
    /* .mr_reuse  = */ MR,
    /* .np        = */ {0, 4, 3, 2, 1, 1, 1, 0, 0},
    /* .tile_f32  = */ ls_avx2_tile_f32,
    /* .tile_bf16 = */ ls_avx2_tile_bf16,
    /* .tile_f16  = */ ls_avx2_tile_f16,
    /* .tile_pairs = */ ls_avx2_tile_pairs,
    /* .a_pairs   = */ false,
    /* .pack_a_pairs = */ NULL,
};
