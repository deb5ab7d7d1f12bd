/* The CPU backend's private state, shared by cpu_backend.c (create, free,
 * packing of the weights and the slots) and cpu_forward.c (the forward of
 * docs/math.md in four stages on the engine's threads). */
#ifndef LS_GPU_CPU_CPU_H
#define LS_GPU_CPU_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/backend_impl.h"
#include "gpu/cpu/gemm.h"
#include "gpu/cpu/threads.h"

/* How one slot's factors for one layer are packed (see the pool below). */
typedef struct {
    int rank;       /* every factor value at a rank index >= rank is zero */
    ls_dtype dt[4]; /* gu_a, gu_b, d_a, d_b: BF16 or F16 when every value
                     * of that factor is exactly such a number, else F32 */
    bool gate_d;    /* the slot has a delta of the shared-expert gate here (gdelta) */
} ls_cpu_form;

/* One slot and layer's block of packed operands: the length of one
 * operand of each factor and where the 2n gu_b, n d_a and O d_b
 * operands begin (gu_a is first); the same form for the fp32 pool and
 * the bf16 pairs copies, whose operands pack to other lengths. */
typedef struct {
    size_t gu_a, gu_b, d_a, d_b; /* one operand's length each */
    size_t off_gu_b, off_d_a, off_d_b, len;
} ls_cpu_slot_layout;

typedef struct {
    int n, H, F, L;
    int S, R, O;
    int max_tokens;
    ls_w13_layout w13_layout;
    ls_dtype dtype;
    const ls_cpu_kernels *kr;
    /* bf16 compute (--compute bf16, docs/math.md): the base weights are
     * packed once in bf16 pair panels instead of at dtype, each slot's
     * factors get pair-packed copies in dpool beside the exact ones in
     * pool (which slot_read gives back), and every GEMM but the gate's
     * runs on kb's pairs tiles. */
    bool bf16;
    const ls_cpu_kernels *kb;
    ls_cpu_threads *threads;

    /* Base weights, packed once at upload_base at their storage dtype (no
     * fp32 copy). Per layer, w13 is one operand [H, zw] whose panels run
     * over the intermediate axis and, within each block of 16 columns j,
     * over the experts' gate and up: panel q * 2n + 2e + half holds
     * expert e's gate (half 0) or up (1) for j in [16q, 16q + 16),
     * whatever the model's row layout (a permutation of output columns
     * changes no dot product). One GEMM then covers every expert, and the
     * gate and up of each j land in the thread that applies SiLU to them.
     * w2 is one operand [n*F, H]: the experts stacked along K, so the down
     * projection sums over experts inside each element's chain. */
    void *w13, *w2;
    int zw;                 /* columns of w13 and of zs: ceil(F/16) * 2n * 16 */
    size_t w13_len, w2_len; /* values of one layer's operand */
    /* The shared-expert gate when the model has one: per layer an fp32
     * operand [H, 1] (one panel; fp32 holds any stored dtype exactly), and
     * gs [max_tokens] the gate of each row of a forward that sent no
     * gammas: sigmoid(x . w), computed by the same tiles as the GEMMs, so
     * it is one multiply-add chain over H whatever the batch or path. */
    bool gated;
    float *gate;    /* [L][gate_len] */
    size_t gate_len;
    float *gs;      /* [max_tokens] */
    /* [S][L][gate_len]: a slot's delta of the gate's weight (s * B * A
     * of a factor of shared_expert_gate), packed as the gate; its chain
     * over H is added to the gate's before the sigmoid. Gated models only. */
    float *gdelta;

    /* The pool, one block of slot.len floats per slot and layer, room for
     * rank R in fp32. A block holds its factors at the rank r and dtypes
     * of form[slot * L + layer], which change no value: past r every
     * factor value the pool gave was zero, and a factor whose every value
     * is a bf16 (or f16) number is kept at 2 bytes and widened exactly in
     * registers. So a rank-16 adapter in a --max-rank 64 pool streams and
     * multiplies a quarter of R's values, and one saved in bf16 (scaled
     * by a power of two) half the bytes again. The operands: gu_a
     * [H, O*2r] (outer block o's gate shrink in columns o*2r + k, its up
     * shrink in o*2r + r + k); gu_b 2n operands [r, F] (expert e's gate
     * expand at 2e, up at 2e+1); d_a n operands [F, r]; d_b O operands
     * [r, H]. Rank 0 (never written, cleared, or all zero) adds nothing,
     * and the forward skips the slot. slot_write packs from the
     * docs/math.md layout and slot_read unpacks back to it. */
    float *pool;
    uint16_t *dpool;                             /* [S * L][dslot.len], bf16 compute only */
    ls_cpu_slot_layout dslot;                    /* dpool's block: pairs operands at rank R */
    ls_cpu_form *form;                           /* [S * L] */
    float *gather;                               /* [O*2R*H] slot_write/slot_read's staging of gu_a */
    ls_cpu_slot_layout slot;                     /* pool's block: operands at rank R in fp32 (the room) */

    /* Scratch for max_tokens tokens, allocated once. Rows are in the
     * token plan's order (gpu/token_plan.h: by slot, base-only last). */
    float *xs;   /* [max_tokens, H] inputs in plan order */
    float *zs;   /* [max_tokens, zw] gate/up pre-activations, w13's column order */
    float *as;   /* [max_tokens, n*F] activations */
    float *ys;   /* [max_tokens, H] outputs in plan order */
    float *st;   /* [max_tokens, O*2R] gate/up shrink */
    float *pt;   /* [max_tokens, O*R] down shrink */
    float *apack;      /* [threads][apack_len] packed A blocks */
    size_t apack_len;
} ls_cpu;

/* Operand views of a layer's weights and of a slot's factors (at the
 * slot's rank in that layer). */
int ls_cpu_rank(const ls_cpu *c, int slot, int layer);
ls_cpu_mat ls_cpu_w13(const ls_cpu *c, int layer);
ls_cpu_mat ls_cpu_w2(const ls_cpu *c, int layer);
ls_cpu_mat ls_cpu_gate(const ls_cpu *c, int layer);
/* A slot's gate delta at a layer; NULL .p when it has none. */
ls_cpu_mat ls_cpu_gate_delta(const ls_cpu *c, int slot, int layer);
ls_cpu_mat ls_cpu_gu_a(const ls_cpu *c, int slot, int layer);
ls_cpu_mat ls_cpu_gu_b(const ls_cpu *c, int slot, int layer, int e, int half);
ls_cpu_mat ls_cpu_d_a(const ls_cpu *c, int slot, int layer, int e);
ls_cpu_mat ls_cpu_d_b(const ls_cpu *c, int slot, int layer, int o);

/* The kernels that multiply by m: kb for pairs, kr otherwise. */
static inline const ls_cpu_kernels *ls_cpu_kernels_of(const ls_cpu *c, const ls_cpu_mat *m) {
    return m->pairs ? c->kb : c->kr;
}

ls_status ls_cpu_forward(ls_backend *be, int layer, const float *x, const float *gammas, const ls_token_plan *plan,
                         float *y, ls_error *err);

#endif
