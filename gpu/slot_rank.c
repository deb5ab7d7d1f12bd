/* A slot's rank from its factors' zeros (gpu/slot_rank.h). */
#include "gpu/slot_rank.h"

#include <stdint.h>
#include <string.h>

/* True when some value is not +0 (by its bits). */
static bool any_set(const float *v, size_t count, size_t stride) {
    for (size_t i = 0; i < count; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i * stride], sizeof bits);
        if (bits) return true;
    }
    return false;
}

/* Whether rank index k holds a nonzero value in any of the four factors. */
static bool rank_used(const ls_dims *d, const ls_pool_dims *p, const ls_slot_factors *f, size_t k) {
    const size_t H = (size_t)d->H, F = (size_t)d->F, R = (size_t)p->max_rank;
    const int O = ls_pool_outer(d, p);
    for (int b = 0; b < 2 * O; b++) /* outer block b / 2's gate (b even) or up shrink */
        if (any_set(f->gu_a + ((size_t)b * R + k) * H, H, 1)) return true;
    for (int e = 0; e < d->n; e++)
        if (any_set(f->gu_b + (size_t)e * 2 * F * R + k, 2 * F, R) || any_set(f->d_a + ((size_t)e * R + k) * F, F, 1))
            return true;
    for (int o = 0; o < O; o++)
        if (any_set(f->d_b + (size_t)o * H * R + k, H, R)) return true;
    return false;
}

int ls_slot_factors_rank(const ls_dims *d, const ls_pool_dims *p, const ls_slot_factors *f) {
    for (int k = p->max_rank - 1; k >= 0; k--)
        if (rank_used(d, p, f, (size_t)k)) return k + 1;
    return 0;
}
