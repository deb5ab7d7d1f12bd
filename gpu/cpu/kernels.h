/* The CPU engine's register tiles, one set per instruction set (kern_*.c),
 * and the contract that makes them interchangeable: every output element
 * is one chain of fused multiply-adds over k in increasing order, started
 * from +0 (or from C's value when accumulating), whatever the tile's rows,
 * panels, position or instruction set. Vector lanes are output columns,
 * so widening a tile never regroups a sum: all paths give the same bits. */
#ifndef LS_GPU_CPU_KERNELS_H
#define LS_GPU_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/tensor.h"
#include "gpu/cpu/cpu_backend.h"

/* Columns of one packed panel: a B operand [K, N] is stored as ceil(N/16)
 * panels, each K rows of 16 values (k-major), columns past N zero. */
#define LS_CPU_NR 16
/* How far ahead of the k row a lone row group prefetches each of its
 * panels, in B values. A lone row group streams its panels from memory
 * once, and the hardware prefetcher alone left the tiles waiting: with it,
 * T=16 on bf16 weights went from 2.3 to 2.0 ms (n=2, H=2048, F=1024, 2
 * threads, CI machine, 2026-11-30). A prefetch reads nothing into the
 * arithmetic, so results are unchanged. */
#define LS_CPU_PREFETCH 1024
/* The address `bytes` past p, for a prefetch: it may lie past the end of
 * p's buffer (prefetches never fault), where pointer arithmetic would be
 * undefined, so it is computed on integers. */
static inline const char *ls_cpu_ahead(const void *p, size_t bytes) {
    return (const char *)((uintptr_t)p + bytes);
}
/* The most rows any tile takes (ls_cpu_kernels.mr <= LS_CPU_MR_MAX). */
#define LS_CPU_MR_MAX 16

/* One register tile: C[m, cols] = (acc ? C : 0) + A[m, 0:k] · B[0:k, cols]
 * where cols are np consecutive panels of which the first ncols columns
 * are written. A is packed: value (i, kk) at a[kk * s + i] with s the
 * path's A stride for m rows (ls_cpu_a_stride). b is the first panel's
 * row 0; panels are bstride
 * values apart. Row i of panel p's 16 columns is at c + i * ldc +
 * p * cstride (cstride 16: C's columns in order). */
typedef struct {
    int m, np, k, ncols;
    bool acc;
    const float *a;
    const void *b;
    size_t bstride;
    float *c;
    size_t ldc, cstride;
    /* At step k the tile prefetches pf + k * pf_step bytes, plus q *
     * bstride values for panel q < np: the B bytes it wants in cache next
     * (gemm.c chooses them). Never dereferenced; may lie past any buffer. */
    const char *pf;
    size_t pf_step;
} ls_cpu_tile;

typedef void (*ls_cpu_tile_fn)(const ls_cpu_tile *t);

typedef struct {
    ls_cpu_isa isa;
    const char *name;
    int mr;                         /* rows of the tallest tile: one pass over B for up to mr rows */
    int mr_reuse;                   /* rows of a tile when several row groups reuse B (<= mr) */
    int np[LS_CPU_MR_MAX + 1];      /* widest tile, in panels, for m rows */
    ls_cpu_tile_fn tile_f32;        /* B panels of float */
    ls_cpu_tile_fn tile_bf16;       /* B panels of bf16, widened in registers */
    ls_cpu_tile_fn tile_f16;        /* B panels of f16, widened in registers */
    /* bf16 compute (--compute bf16, docs/math.md): B in pair panels of
     * bf16, each element's chain a sequence of vdpbf16ps steps (below);
     * t->k counts k pairs, and A is packed per a_pairs. NULL when the path
     * has no bf16 tiles. */
    ls_cpu_tile_fn tile_pairs;
    /* A of a pairs tile: true, one dword per row and k pair (bf16 of k =
     * 2p in its low half, 2p + 1 in its high half) at a[p * s + i];
     * false, fp32 values (bf16 numbers) at a[k * s + i] as for tile_f32. */
    bool a_pairs;
    /* With a_pairs, the path's packer of one row group's A (the bits of
     * gemm.h's ls_cpu_pack_a_pairs); NULL: that portable one. */
    void (*pack_a_pairs)(uint32_t *dst, int as, int rows, const float *a, size_t lda, int K, int s0, int sc);
} ls_cpu_kernels;

/* The bf16 compute step, the definition every pairs tile matches bit for
 * bit (the Intel SDM's VDPBF16PS: an fp32 fused multiply-add rounding to
 * nearest even, inputs that are denormal read as zero, a denormal result
 * flushed to a zero of its sign, the odd element of a pair before the
 * even). Operands are bf16 numbers with denormals already flushed. */
static inline float ls_cpu_ftz(float v) {
    const float tiny = 0x1p-126f;
    return (v < tiny && v > -tiny) ? __builtin_copysignf(0.0f, v) : v;
}
/* A value rounded to a bf16 number as the bf16 operands are: nearest
 * even, then a denormal flushed to a zero of its sign (what VDPBF16PS's
 * DAZ would read it as). */
uint16_t ls_cpu_bf16_operand(float v);

/* Floats between one k's rows of a packed A block of tiles of up to m
 * rows: mr_reuse when they fit it, else mr. */
static inline int ls_cpu_a_stride(int mr, int mr_reuse, int m) { return m <= mr_reuse ? mr_reuse : mr; }

/* The paths, each defined in its own file built for its instruction set;
 * call one only where ls_cpu_isa_supported says the CPU runs it. */
extern const ls_cpu_kernels ls_cpu_kernels_avx512;
extern const ls_cpu_kernels ls_cpu_kernels_avx2;
extern const ls_cpu_kernels ls_cpu_kernels_generic;
/* VDPBF16PS tiles (pairs only), built for AVX512-BF16 with a target
 * attribute: call only where ls_cpu_has_avx512bf16. */
extern const ls_cpu_kernels ls_cpu_kernels_avx512bf16;
bool ls_cpu_has_avx512bf16(void);

/* The kernels for isa (AUTO: the widest supported), or NULL when the CPU
 * does not run it. */
const ls_cpu_kernels *ls_cpu_kernels_for(ls_cpu_isa isa);
/* The kernels of bf16 compute for isa: avx512 is the VDPBF16PS tiles
 * (NULL on a CPU without AVX512-BF16), avx2 and generic their own; AUTO
 * the fastest this CPU runs. NULL when the CPU does not run it. */
const ls_cpu_kernels *ls_cpu_kernels_bf16_for(ls_cpu_isa isa);

/* The 16-lane tiles (kern_avx512.c, kern_avx512bf16.c), widest per row
 * count: at most 24 accumulators, and no more than 8
 * panels streamed at once for a lone row. Rows go up to 16 so that a
 * batch of up to 16 tokens is one row group, which reads each weight
 * panel from memory once (8-row tiles read it twice, the second time
 * from L2). */
#define LS_CPU_AVX512_SHAPES(X)                                                                            \
    X(1, 1) X(1, 2) X(1, 3) X(1, 4) X(1, 5) X(1, 6) X(1, 7) X(1, 8)                                        \
    X(2, 1) X(2, 2) X(2, 3) X(2, 4) X(2, 5) X(2, 6) X(2, 7) X(2, 8)                                        \
    X(3, 1) X(3, 2) X(3, 3) X(3, 4) X(3, 5) X(3, 6)                                                        \
    X(4, 1) X(4, 2) X(4, 3) X(4, 4) X(4, 5) X(4, 6)                                                        \
    X(5, 1) X(5, 2) X(5, 3) X(5, 4)                                                                        \
    X(6, 1) X(6, 2) X(6, 3) X(6, 4)                                                                        \
    X(7, 1) X(7, 2) X(7, 3)                                                                                \
    X(8, 1) X(8, 2) X(8, 3)                                                                                \
    X(9, 1) X(9, 2) X(10, 1) X(10, 2) X(11, 1) X(11, 2) X(12, 1) X(12, 2)                                  \
    X(13, 1) X(14, 1) X(15, 1) X(16, 1)

#endif
