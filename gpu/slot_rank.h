/* A slot's rank as its factors show it: the pool pads every adapter to the
 * pool's max rank R with +0, and every backend multiplies only the ranks
 * that are used. One definition for the CPU engine and the CUDA backend. */
#ifndef LS_GPU_SLOT_RANK_H
#define LS_GPU_SLOT_RANK_H

#include "common/dims.h"
#include "gpu/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The smallest r such that every factor value at rank index k >= r is +0
 * (by its bits: a -0 counts as used). An index that is +0 in both the
 * shrink and the expand adds exactly nothing to any output (a +0 term can
 * only turn a -0 sum into +0), so a forward may stop at r. f is laid out
 * at the pool's (O, R) (common/dims.h); 0 for an all-zero slot. */
int ls_slot_factors_rank(const ls_dims *d, const ls_pool_dims *p, const ls_slot_factors *f);

#ifdef __cplusplus
}
#endif

#endif
