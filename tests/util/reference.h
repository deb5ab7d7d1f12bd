/* The tests' own implementation of docs/math.md, independent of the product:
 * per-token loops over dense weights merged with the LoRA deltas
 * (W + B·A), in double precision. */
#ifndef LS_TESTS_REFERENCE_H
#define LS_TESTS_REFERENCE_H

#include <stddef.h>

#include "common/dims.h"

/* One adapter's factors for one layer in double, scale already applied to
 * the B factors, at the adapter's own rank r with O' outer blocks:
 * gu_a [O', 2r, H] (rows 0..r-1 gate, r..2r-1 up), gu_b [n, 2F, r]
 * (rows 0..F-1 gate, F..2F-1 up), d_a [n, r, F], d_b [O', H, r]. */
typedef struct {
    int r;
    int outer; /* 1 (shared) or n (per-expert) */
    const double *gu_a;
    const double *gu_b;
    const double *d_a;
    const double *d_b;
} ls_ref_lora;

/* y[T, H] for one layer: w13 [n, 2F, H] and w2 [n, H, F] laid out per
 * dims->w13_layout; gammas [T, n] (NULL = ones); lora_of_token[t] NULL
 * means base only (lora_of_token itself NULL = all base). Merges each
 * distinct adapter into dense weights, then loops per token. */
void ls_ref_forward(const ls_dims *dims, const double *w13, const double *w2, int T, const double *x,
                    const double *gammas, const ls_ref_lora *const *lora_of_token, double *y);

/* ‖y − ref‖₂ / ‖ref‖₂ (y as float), and the same for two double arrays. */
double ls_ref_rel_err_f(const float *y, const double *ref, long count);
double ls_ref_rel_err_d(const double *y, const double *ref, long count);

/* Fills v[count] with uniform values in [-scale, scale] from a splitmix64
 * stream seeded with *state. */
void ls_ref_fill_uniform(double *v, long count, double scale, unsigned long long *state);
/* The same stream rounded to float. */
void ls_ref_fill_uniform_f(float *v, size_t count, double scale, unsigned long long *state);

/* Writes adapter a as a pool slot's four fp32 factors at pool p's (O, R)
 * (common/dims.h): its values below its rank, an outer-1 adapter
 * broadcast over O, +0 everywhere else. The buffers are the caller's,
 * ls_pool_*_len(d, p) floats each. */
void ls_ref_lora_pad(const ls_dims *d, const ls_pool_dims *p, const ls_ref_lora *a, float *gu_a, float *gu_b,
                     float *d_a, float *d_b);

#endif
