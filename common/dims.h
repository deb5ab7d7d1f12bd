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
    int L; /* layers */
    ls_w13_layout w13_layout;
} ls_dims;

typedef struct {
    int slots;    /* S */
    int max_rank; /* R */
    ls_lora_layout layout;
    int max_tokens; /* largest T of one backend forward call */
} ls_pool_dims;

/* O: 1 for the shared pool layout, n for per-expert. */
static inline int ls_pool_outer(const ls_dims *d, const ls_pool_dims *p) {
    return p->layout == LS_LORA_SHARED ? 1 : d->n;
}

/* Floats of one slot's factors for one layer, per buffer (SPEC §2). */
static inline size_t ls_pool_gu_a_len(const ls_dims *d, const ls_pool_dims *p) {
    return (size_t)ls_pool_outer(d, p) * 2 * p->max_rank * d->H;
}
static inline size_t ls_pool_gu_b_len(const ls_dims *d, const ls_pool_dims *p) {
    return (size_t)d->n * 2 * d->F * p->max_rank;
}
static inline size_t ls_pool_d_a_len(const ls_dims *d, const ls_pool_dims *p) {
    return (size_t)d->n * p->max_rank * d->F;
}
static inline size_t ls_pool_d_b_len(const ls_dims *d, const ls_pool_dims *p) {
    return (size_t)ls_pool_outer(d, p) * d->H * p->max_rank;
}

const char *ls_w13_layout_name(ls_w13_layout l);
bool ls_w13_layout_parse(const char *s, ls_w13_layout *out);
const char *ls_lora_layout_name(ls_lora_layout l);
bool ls_lora_layout_parse(const char *s, ls_lora_layout *out);

#endif
