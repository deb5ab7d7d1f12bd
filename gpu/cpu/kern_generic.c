/* The portable register tiles: plain C, one fmaf per multiply-add, built
 * for the baseline x86-64 (fmaf is the C library's, exact on every CPU).
 * This is the definition the vector paths must match bit for bit: each
 * output element starts from +0 (or C) and takes a[i,k] * b[k,j] for
 * k = 0, 1, ... K-1 in one fused multiply-add each; and, for bf16
 * compute, the VDPBF16PS steps of kernels.h. */
#include <math.h>
#include <stdint.h>

#include "gpu/cpu/kernels.h"

#define MR 4
#define NP 4

/* B value (k, j) of the tile's panels, widened to fp32 (exact). */
static inline float ls_generic_load_b(ls_dtype dt, const void *b, size_t at) {
    if (dt == LS_DTYPE_F32) return ((const float *)b)[at];
    uint16_t h = ((const uint16_t *)b)[at];
    return dt == LS_DTYPE_BF16 ? ls_bf16_to_f32(h) : ls_f16_to_f32(h);
}

/* Where C value (i, j) of the tile lives. */
static inline size_t ls_generic_c_at(const ls_cpu_tile *t, int i, int j) {
    return (size_t)i * t->ldc + (size_t)(j / LS_CPU_NR) * t->cstride + (size_t)(j % LS_CPU_NR);
}

static inline void ls_generic_tile(const ls_cpu_tile *t, ls_dtype dt) {
    float acc[MR][NP * LS_CPU_NR];
    const int m = t->m, nc = t->ncols;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < nc; j++) acc[i][j] = t->acc ? t->c[ls_generic_c_at(t, i, j)] : 0.0f;
    const float *a = t->a;
    for (int k = 0; k < t->k; k++, a += MR) {
        for (int j = 0; j < nc; j++) {
            size_t at = (size_t)(j / LS_CPU_NR) * t->bstride + (size_t)k * LS_CPU_NR + (size_t)(j % LS_CPU_NR);
            float b = ls_generic_load_b(dt, t->b, at);
            for (int i = 0; i < m; i++) acc[i][j] = fmaf(a[i], b, acc[i][j]);
        }
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < nc; j++) t->c[ls_generic_c_at(t, i, j)] = acc[i][j];
}

/* bf16 compute's definition (kernels.h): per k pair p, the odd element
 * first, each step one fmaf then the flush; C read in with its denormals
 * as zero. A holds fp32 values (bf16 numbers) at a[k * MR + i]; B's step
 * p of panel q is 16 pairs of uint16. */
static void ls_generic_tile_pairs(const ls_cpu_tile *t) {
    float acc[MR][NP * LS_CPU_NR];
    const int m = t->m, nc = t->ncols;
    const uint16_t *b = t->b;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < nc; j++) acc[i][j] = t->acc ? ls_cpu_ftz(t->c[ls_generic_c_at(t, i, j)]) : 0.0f;
    const float *a = t->a;
    for (int p = 0; p < t->k; p++, a += 2 * MR) {
        for (int j = 0; j < nc; j++) {
            size_t at = (size_t)(j / LS_CPU_NR) * t->bstride * 2 + (size_t)p * 2 * LS_CPU_NR + (size_t)(j % LS_CPU_NR) * 2;
            float even = ls_bf16_to_f32(b[at]), odd = ls_bf16_to_f32(b[at + 1]);
            for (int i = 0; i < m; i++) {
                float v = ls_cpu_ftz(fmaf(a[MR + i], odd, acc[i][j]));
                acc[i][j] = ls_cpu_ftz(fmaf(a[i], even, v));
            }
        }
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < nc; j++) t->c[ls_generic_c_at(t, i, j)] = acc[i][j];
}

static void ls_generic_tile_f32(const ls_cpu_tile *t) { ls_generic_tile(t, LS_DTYPE_F32); }
static void ls_generic_tile_bf16(const ls_cpu_tile *t) { ls_generic_tile(t, LS_DTYPE_BF16); }
static void ls_generic_tile_f16(const ls_cpu_tile *t) { ls_generic_tile(t, LS_DTYPE_F16); }

const ls_cpu_kernels ls_cpu_kernels_generic = {
    /* .isa       = */ LS_CPU_ISA_GENERIC,
    /* .name      = */ "generic",
    /* .mr        = */ MR,
    /* .mr_reuse  = */ MR,
    /* .np        = */ {0, NP, NP, NP, NP, 0, 0, 0, 0},
    /* .tile_f32  = */ ls_generic_tile_f32,
    /* .tile_bf16 = */ ls_generic_tile_bf16,
    /* .tile_f16  = */ ls_generic_tile_f16,
    /* .tile_pairs = */ ls_generic_tile_pairs,
    /* .a_pairs   = */ false,
    /* .pack_a_pairs = */ NULL,
};
