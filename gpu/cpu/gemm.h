/* Packed operands and the blocked GEMM of the CPU engine. B operands
 * (weights and LoRA factors) are packed once into panels of LS_CPU_NR
 * columns at their storage dtype; A operands (activations) are packed per
 * block into the tile height of the chosen path. Every C element is one
 * multiply-add chain over K in order, so the blocking (rows, K, panels,
 * threads) never changes a bit of the result. */
#ifndef LS_GPU_CPU_GEMM_H
#define LS_GPU_CPU_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/cpu/kernels.h"

/* Rows and K per packed A block: an A block (LS_CPU_MC x LS_CPU_KC floats)
 * stays in L2 while it meets every panel of the caller's columns. */
#define LS_CPU_MC 96
#define LS_CPU_KC 384

/* A packed B operand [k, n]: ceil(n / 16) panels of k x 16 values; or,
 * with pairs (bf16 compute), ceil(n / 16) panels of ceil(k / 2) rows of
 * 16 pairs: value (kk, j) of panel j / 16 at uint16 index
 * (kk / 2) * 32 + (j % 16) * 2 + kk % 2, a padding k row zero. This is
 * the layout VDPBF16PS reads: one 64-byte row is 16 lanes of (k = 2p,
 * k = 2p + 1). */
typedef struct {
    const void *p;
    ls_dtype dt; /* F32, BF16 or F16; BF16 with pairs */
    int k, n;
    bool pairs;
} ls_cpu_mat;

static inline int ls_cpu_panel_count(int n) { return (n + LS_CPU_NR - 1) / LS_CPU_NR; }
/* Values (not bytes) of a packed [k, n] operand. */
static inline size_t ls_cpu_packed_len(int k, int n) {
    return (size_t)ls_cpu_panel_count(n) * LS_CPU_NR * (size_t)k;
}

/* uint16 values of a pair-packed [k, n] operand. */
static inline size_t ls_cpu_pairs_len(int k, int n) {
    return (size_t)ls_cpu_panel_count(n) * LS_CPU_NR * 2 * (size_t)((k + 1) / 2);
}

/* Writes rows [k0, k0 + k) of a pair-packed operand of kdst rows
 * (ls_cpu_mat pairs), panel q at panel q * pstep of dst, from fp32 src
 * (value (kk, j) at src[kk * ld_k + j * ld_n]) through
 * ls_cpu_bf16_operand. Padding columns are zeroed, and so is the padding
 * row of an odd kdst when the rows reach it. */
void ls_cpu_pack_pairs(uint16_t *dst, int kdst, int k0, int pstep, const float *src, size_t ld_k, size_t ld_n, int k,
                       int n);
/* The same from a source of any float dtype sdt. */
void ls_cpu_pack_pairs_typed(uint16_t *dst, int kdst, int k0, int pstep, const void *src, ls_dtype sdt, size_t ld_k,
                             size_t ld_n, int k, int n);

/* Writes rows [k0, k0 + k) of the ceil(n / 16) panels of height kdst at
 * dt, panel q being panel q * pstep of dst (pstep > 1 interleaves several
 * operands' panels into one), from src, whose value (kk, j) is
 * src[kk * ld_k + j * ld_n] (fp32; bf16 and f16 round to nearest even).
 * Padding columns past n are zeroed. */
void ls_cpu_pack_b(void *dst, ls_dtype dt, int kdst, int k0, int pstep, const float *src, size_t ld_k, size_t ld_n,
                   int k, int n);
/* The same from a source of any float dtype sdt (value (kk, j) at element
 * kk * ld_k + j * ld_n of src): a value of the same dtype keeps its bits,
 * a wider dt is exact, a narrower one rounds to nearest even. */
void ls_cpu_pack_b_typed(void *dst, ls_dtype dt, int kdst, int k0, int pstep, const void *src, ls_dtype sdt,
                         size_t ld_k, size_t ld_n, int k, int n);
/* The inverse: rows [k0, k0 + k) of a packed operand back into dst. */
void ls_cpu_unpack_b(const void *src, ls_dtype dt, int ksrc, int k0, float *dst, size_t ld_k, size_t ld_n, int k,
                     int n);

/* Floats of packed-A scratch one thread needs for GEMMs with K <= kmax
 * (a lone row group packs all of K at once). */
static inline size_t ls_cpu_apack_len(int kmax) {
    /* + 1: bf16 compute pads K to whole pairs. */
    size_t whole = (size_t)LS_CPU_MR_MAX * ((size_t)kmax + 1), block = (size_t)LS_CPU_MC * LS_CPU_KC;
    return whole > block ? whole : block;
}

/* bf16 compute's A for a_pairs tiles, the definition every path's
 * pack_a_pairs matches bit for bit: k pairs [s0, s0 + sc) of `rows` rows
 * of a (row i at a + i * lda, K values), pair p of row i at dst[p * as +
 * i] as one dword (k = 2p through ls_cpu_bf16_operand in the low half,
 * k = 2p + 1 in the high half, zero past K). */
void ls_cpu_pack_a_pairs(uint32_t *dst, int as, int rows, const float *a, size_t lda, int K, int s0, int sc);

/* C[0:m, cols] = (acc ? C : 0) + A[0:m, 0:b->k] · B[:, cols] for the
 * columns of panels [p0, p1) (clipped to b->n). Panel p's 16 columns of
 * row i are at c + i * ldc + p * cstride (cstride 16: C's columns in
 * B's order). apack is ls_cpu_apack_len(b->k) floats of the calling
 * thread's scratch. */
/* A pairs operand b needs kernels with tile_pairs; A's values are then
 * rounded by ls_cpu_bf16_operand as they are packed (docs/math.md). */
void ls_cpu_gemm(const ls_cpu_kernels *kr, float *apack, int m, const float *a, size_t lda, const ls_cpu_mat *b,
                 int p0, int p1, float *c, size_t ldc, size_t cstride, bool acc);

#endif
