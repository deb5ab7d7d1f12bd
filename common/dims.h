/* The shapes every module agrees on: the model's dimensions and layouts,
 * and the pool's. Plain values, no behaviour. */
#ifndef LS_COMMON_DIMS_H
#define LS_COMMON_DIMS_H

#include <stdbool.h>
#include <stddef.h>

typedef enum { LS_W13_INTERLEAVED, LS_W13_CONTIGUOUS } ls_w13_layout;
typedef enum { LS_LORA_SHARED, LS_LORA_PER_EXPERT } ls_lora_layout;

typedef struct {
    int n; /* shared experts */
    int H; /* hidden size */
    int F; /* intermediate size per expert */
    int L; /* layers served (those with shared experts) */
    ls_w13_layout w13_layout;
    /* Every served layer has a shared-expert gate (Qwen2-MoE's
     * shared_expert_gate): a forward without gammas takes sigmoid(w . x)
     * as each expert's gamma instead of 1. */
    bool gate;
    /* The checkpoint's own number of served layer i is layer_ids[i]
     * (ascending); NULL: served layer i is layer i. layers_total is the
     * checkpoint's layer count, dense layers included (0: L). The model
     * owns the array and outlives every user of the dims. Users name
     * layers by the checkpoint's numbers; arrays are indexed 0..L-1. */
    const int *layer_ids;
    int layers_total;
    /* How PEFT's LoraConfig reaches this model's shared experts, for
     * hints (a static string of the checkpoint's family); NULL when no
     * family says (the demo, the fused file). */
    const char *peft_targets;
} ls_dims;

/* The served index (0..L-1) of the checkpoint's layer id; -1 when that
 * layer is not served (a dense layer, or past the model). */
int ls_dims_layer_index(const ls_dims *d, long long id);
/* The checkpoint's number of served layer index (0..L-1). */
int ls_dims_layer_id(const ls_dims *d, int index);
/* The checkpoint's layer count, dense layers included. */
static inline int ls_dims_layers_total(const ls_dims *d) { return d->layers_total > 0 ? d->layers_total : d->L; }
/* The served layers in the checkpoint's numbers, short enough for a
 * message: "0-1", "3-60", "1, 3, 5, ..., 47 (every 2nd)", "0, 2, 5-7". A
 * list longer than len is cut with "...". Returns buf. */
const char *ls_dims_layers_str(const ls_dims *d, char *buf, size_t len);

typedef struct {
    int slots;    /* S */
    int max_rank; /* R */
    ls_lora_layout layout;
    int max_tokens; /* largest T of one backend forward call */
    /* The backend applies no factors of the shared-expert gate (CUDA,
     * until a device run checks its kernel): adapters with them are
     * refused at upload. */
    bool no_gate_lora;
} ls_pool_dims;

/* O: 1 for the shared pool layout, n for per-expert. */
static inline int ls_pool_outer(const ls_dims *d, const ls_pool_dims *p) {
    return p->layout == LS_LORA_SHARED ? 1 : d->n;
}

/* The four LoRA factors of one layer, back to back in one block of
 * floats, for factors of rank r with O outer blocks: gu_a [O, 2r, H]
 * (rows 0..r-1 feed gate, r..2r-1 up), gu_b [n, 2F, r], d_a [n, r, F],
 * d_b [O, H, r]. A pool slot holds them at (O, R), an adapter's compact
 * copy at (its O', its r). */
enum { LS_FACTOR_GU_A, LS_FACTOR_GU_B, LS_FACTOR_D_A, LS_FACTOR_D_B, LS_FACTORS };

typedef struct {
    size_t len[LS_FACTORS]; /* floats of each factor */
    size_t off[LS_FACTORS]; /* where each starts in the block */
    size_t total;           /* floats of the block */
} ls_factor_layout;

static inline ls_factor_layout ls_factor_layout_of(const ls_dims *d, int outer, int rank) {
    const size_t n = (size_t)d->n, H = (size_t)d->H, F = (size_t)d->F, O = (size_t)outer, r = (size_t)rank;
    ls_factor_layout l;
    l.len[LS_FACTOR_GU_A] = O * 2 * r * H;
    l.len[LS_FACTOR_GU_B] = n * 2 * F * r;
    l.len[LS_FACTOR_D_A] = n * r * F;
    l.len[LS_FACTOR_D_B] = O * H * r;
    l.total = 0;
    for (int k = 0; k < LS_FACTORS; k++) {
        l.off[k] = l.total;
        l.total += l.len[k];
    }
    return l;
}

/* The pool's slot layout, and its factors' sizes one by one. */
static inline ls_factor_layout ls_pool_layout(const ls_dims *d, const ls_pool_dims *p) {
    return ls_factor_layout_of(d, ls_pool_outer(d, p), p->max_rank);
}
static inline size_t ls_pool_gu_a_len(const ls_dims *d, const ls_pool_dims *p) {
    return ls_pool_layout(d, p).len[LS_FACTOR_GU_A];
}
static inline size_t ls_pool_gu_b_len(const ls_dims *d, const ls_pool_dims *p) {
    return ls_pool_layout(d, p).len[LS_FACTOR_GU_B];
}
static inline size_t ls_pool_d_a_len(const ls_dims *d, const ls_pool_dims *p) {
    return ls_pool_layout(d, p).len[LS_FACTOR_D_A];
}
static inline size_t ls_pool_d_b_len(const ls_dims *d, const ls_pool_dims *p) {
    return ls_pool_layout(d, p).len[LS_FACTOR_D_B];
}

const char *ls_w13_layout_name(ls_w13_layout l);
bool ls_w13_layout_parse(const char *s, ls_w13_layout *out);
const char *ls_lora_layout_name(ls_lora_layout l);
bool ls_lora_layout_parse(const char *s, ls_lora_layout *out);

#endif
