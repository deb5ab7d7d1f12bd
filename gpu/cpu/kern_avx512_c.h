/* C of a 16-lane register tile, shared by kern_avx512.c (FMA tiles) and
 * kern_avx512bf16.c (VDPBF16PS tiles): the accumulators set to zero or
 * loaded from C, and stored back, the last panel's lanes past ncols
 * masked. The includer defines INLINE (always inline, with its own
 * target) first; M and NP are constants where it is called, so acc stays
 * in registers. */
#ifndef LS_GPU_CPU_KERN_AVX512_C_H
#define LS_GPU_CPU_KERN_AVX512_C_H

#include <immintrin.h>

#include "gpu/cpu/kernels.h"

/* Lanes of panel p that hold real columns. */
INLINE __mmask16 ls_zmm_mask(int ncols, int p) {
    int rem = ncols - p * LS_CPU_NR;
    return rem >= LS_CPU_NR ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1u);
}

/* acc[i * NP + p] = 0, or C's row i of panel p when t->acc. */
INLINE void ls_zmm_c_load(const int M, const int NP, const ls_cpu_tile *t, __mmask16 last, __m512 *acc) {
#pragma GCC unroll 16
    for (int i = 0; i < M; i++) {
        const float *c = t->c + (size_t)i * t->ldc;
#pragma GCC unroll 16
        for (int p = 0; p < NP; p++) {
            if (!t->acc) acc[i * NP + p] = _mm512_setzero_ps();
            else if (p < NP - 1) acc[i * NP + p] = _mm512_loadu_ps(c + p * t->cstride);
            else acc[i * NP + p] = _mm512_maskz_loadu_ps(last, c + p * t->cstride);
        }
    }
}

INLINE void ls_zmm_c_store(const int M, const int NP, const ls_cpu_tile *t, __mmask16 last, const __m512 *acc) {
#pragma GCC unroll 16
    for (int i = 0; i < M; i++) {
        float *c = t->c + (size_t)i * t->ldc;
#pragma GCC unroll 16
        for (int p = 0; p < NP - 1; p++) _mm512_storeu_ps(c + p * t->cstride, acc[i * NP + p]);
        _mm512_mask_storeu_ps(c + (NP - 1) * t->cstride, last, acc[i * NP + NP - 1]);
    }
}

#endif
