/* The CUDA forward as plain data, made on the host so the CPU can test it:
 * the device's row order of W13, the operands a slot write derives from
 * the canonical factors, and the list of strided-batched GEMMs of one
 * forward, each LoRA GEMM marked with the dimension a slot's rank cuts.
 *
 * Layouts (row-major; h = 0 gate, 1 up; O outer blocks, R the pool's rank):
 *   W13 on the device  [2][n][F] rows x H   gate rows of every expert, then up
 *   z (gate/up sums)   [T][2][n][F]
 *   agu                [2][O][R] rows x H   gu_a's rows, gate block first
 *   v (shrink out)     [T][2][O][R]
 *   b13                [2][n][F] rows x R   gu_b's rows in W13's device order
 *   adcat              [R] rows x n*F       d_a of every expert side by side
 *   w (shrink out)     [T][O][R]
 *   bdcat              [H] rows x O*R       d_b of every outer block side by side
 * With these, every LoRA stage is one strided-batched GEMM whose batches
 * sit a constant stride apart, and a slot of rank r < R reads only its r
 * rows or columns: no zero column of the R padding is ever multiplied. */
#ifndef LS_GPU_LORA_PLAN_H
#define LS_GPU_LORA_PLAN_H

#include <stddef.h>

#include "common/dims.h"
#include "gpu/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The source row (in W13's own layout, [n*2F] rows) of device row
 * (h*n + e)*F + j. */
size_t ls_w13_device_source_row(ls_w13_layout layout, int n, int F, size_t device_row);

/* Element counts of the four derived operands of one slot and layer. */
typedef struct {
    size_t agu, b13, adcat, bdcat;
} ls_lora_derived_lens;
ls_lora_derived_lens ls_lora_derived_lens_of(const ls_dims *d, const ls_pool_dims *p);

/* Writes the derived operands (fp32, layouts above) of the canonical
 * factors f (common/dims.h, at the pool's O and R). Every element of the
 * four buffers is written. Buffers are the caller's. */
void ls_lora_derive(const ls_dims *d, const ls_pool_dims *p, const ls_slot_factors *f, float *agu, float *b13,
                    float *adcat, float *bdcat);

/* The buffers a GEMM reads and writes. */
typedef enum {
    LS_OPB_X,     /* [T, H] inputs, compute dtype */
    LS_OPB_Z,     /* [T, 2nF] fp32 */
    LS_OPB_A,     /* [T, nF] activations, compute dtype */
    LS_OPB_Y,     /* [T, H] fp32 */
    LS_OPB_V,     /* [T, 2OR] */
    LS_OPB_W,     /* [T, OR] */
    LS_OPB_W13,   /* one layer's [2nF, H] */
    LS_OPB_W2,    /* one layer's W2cat [H, nF] */
    LS_OPB_AGU,   /* one slot and layer's derived operands */
    LS_OPB_B13,
    LS_OPB_ADCAT,
    LS_OPB_BDCAT,
} ls_op_buf;

/* Which dimension is the slot's rank (cut to it at run time). */
typedef enum { LS_CUT_NONE, LS_CUT_N, LS_CUT_K } ls_op_cut;

/* For rows t and batches b < batch, j < N, k < K:
 *   C[t*ldc + c_off + b*c_bs + j] (beta 0: =, 1: +=)
 *       sum_k X[t*ldx + x_off + b*x_bs + k] * W[w_off + b*w_bs + j*ldw + k]
 * N or K (as cut says) is R here and the slot's rank r when run. With
 * sum_batches the batches' sums all meet in the same C (c_bs is 0): they
 * run one after another, each adding to C, in batch order. */
typedef struct {
    const char *stage; /* gpu/backend_impl.h's stage names */
    ls_op_buf c, x, w;
    long long c_off, x_off, w_off;
    int ldc, ldx, ldw;
    long long c_bs, x_bs, w_bs;
    int N, K, batch;
    ls_op_cut cut;
    int beta;        /* 0: C is written, 1: added to */
    int sum_batches; /* see above; then beta is 1 */
    int split;       /* K may be split over blocks (a shrink: few outputs, a long K) */
    int lora;        /* runs on the adapted rows only, with a slot's operands */
} ls_gemm_op;

/* The ops of one forward, in the order they run:
 *   shrink_gate_up  v = agu . x            (lora, cut N)
 *   gate_up         z = W13 . x            (base)
 *   gate_up         z += b13 . v           (lora, cut K)
 *   -- SwiGLU x gamma makes a from z (not a GEMM), after op LS_OP_EXPAND_GU
 *   shrink_down     w = adcat . a          (lora, cut N)
 *   down            y = W2cat . a          (base)
 *   down            y += bdcat . w         (lora, cut K; one batch per
 *                                           outer block, summed in y) */
enum { LS_OP_SHRINK_GU, LS_OP_GATE_UP, LS_OP_EXPAND_GU, LS_OP_SHRINK_D, LS_OP_DOWN, LS_OP_EXPAND_D, LS_OPS };
typedef struct {
    ls_gemm_op op[LS_OPS];
} ls_gemm_plan;

void ls_gemm_plan_make(const ls_dims *d, const ls_pool_dims *p, ls_gemm_plan *plan);

/* Whether every LoRA op fits a CUDA grid of tiles tile_n columns wide
 * (grid.y = the N tiles, grid.z = the batches, each at most 65535). When
 * not, why says which op and which limit, with the sizes. */
bool ls_gemm_plan_fits_grid(const ls_gemm_plan *plan, int tile_n, char *why, size_t len);

/* The op's N and K when its slot has rank r. */
static inline int ls_gemm_op_n(const ls_gemm_op *op, int r) { return op->cut == LS_CUT_N ? r : op->N; }
static inline int ls_gemm_op_k(const ls_gemm_op *op, int r) { return op->cut == LS_CUT_K ? r : op->K; }

#ifdef __cplusplus
}
#endif

#endif
