/* The CPU backend's private state, shared by its two files: cpu_backend.c
 * (create, free, weights and slot buffers) and cpu_forward.c (the forward
 * of SPEC §1 on fixed-size token tiles through OpenBLAS). */
#ifndef LS_GPU_CPU_CPU_H
#define LS_GPU_CPU_CPU_H

#include <stdbool.h>
#include <stddef.h>

#include "gpu/backend.h"

/* Rows of every GEMM the forward runs: LS_CPU_TILE for the base weights,
 * LS_CPU_LORA_TILE for the LoRA factors. A token's result must not depend
 * on what else is in the call (SPEC §5, bit for bit on the CPU), so every
 * GEMM sees the same M whatever T is: OpenBLAS then takes the same kernel,
 * the same thread split and the same reduction order for every row, and
 * rows never interact. Both are multiples of 16, so the token axis splits
 * evenly into the register tiles of the x86 sgemm kernels (2 to 16 wide)
 * and no token falls into an edge kernel. The measurement behind the
 * values is in the comment at the top of cpu_forward.c. */
#ifndef LS_CPU_TILE
#define LS_CPU_TILE 32
#endif
#ifndef LS_CPU_LORA_TILE
#define LS_CPU_LORA_TILE 16
#endif

typedef struct {
    int n, H, F, L;
    int S, R, O;
    int max_tokens;
    ls_w13_layout w13_layout;
    ls_dtype dtype;

    /* Base weights per layer, fp32 of dtype-rounded values, stored
     * transposed ([K, N] for y = x·W) because OpenBLAS packs that operand
     * about twice as fast as [N, K] when M is a small tile (measured:
     * M=16, N=K=1024, 1 thread: 0.51 ms against 1.09 ms). w13t's columns
     * hold each expert's outputs in contiguous order (gate 0..F-1, then
     * up) whatever the model's layout: a permutation changes no dot
     * product, and the LoRA expand then writes gate and up as two dense
     * column blocks. w2t stacks the experts along K, so the down
     * projection is one GEMM with K = n*F reducing in a fixed order. */
    float *w13; /* [L][H][n*2F] */
    float *w2;  /* [L][n*F][H] */
    bool *uploaded;

    /* The pool, [S][L][...] per buffer, each factor stored transposed
     * like the base weights so every LoRA GEMM is C = A·B with B [K, N]:
     * slot_write and slot_read convert from and to the SPEC §2 layout
     * (same sizes, so pool_bytes is the SPEC's). */
    float *gu_a; /* per slot and layer [H][O*2R]: column o*2R + k is row k of block o */
    float *gu_b; /* [n][2][R][F]: expert e's gate (0) and up (1) expand */
    float *d_a;  /* [n*F][R]: row e*F + j is column j of d_a[e] */
    float *d_b;  /* [O*R][H]: row o*R + k is column k of d_b[o] */
    size_t gu_a_len, gu_b_len, d_a_len, d_b_len;

    /* Scratch for max_tokens tokens, allocated once. Rows are in slot
     * order (order[i] is the token at row i) and padded to whole tiles. */
    int *order;  /* [max_tokens] */
    int *group;  /* [S + 2] first row of each slot's run (base first) */
    int rows;    /* max_tokens rounded up to LS_CPU_TILE */
    float *xs;   /* [rows, H] inputs, then outputs */
    float *zs;   /* [rows, n*2F] gate/up pre-activations */
    float *as;   /* [rows, n*F] activations */
    /* One LoRA tile. */
    float *lin;  /* [LORA_TILE, max(H, n*F)] gathered rows */
    float *lout; /* [LORA_TILE, max(H, n*2F)] the delta */
    float *st;   /* [LORA_TILE, O*2R] gate/up shrink */
    float *pt;   /* [LORA_TILE, O*R] down shrink (summed over experts when O = 1) */
} ls_cpu;

ls_status ls_cpu_forward(ls_backend *be, int layer, int T, const float *x, const float *gammas,
                         const int *slot_of_token, float *y, ls_error *err);

#endif
