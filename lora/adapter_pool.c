/* Pool-format adapters (docs/api.md, adapter formats and errors): per layer the four 4D buffers of one
 * slot, checked in the order sglang's set_lora_info checks them, then the
 * model's axes and the adapter-wide rank and outer layout; the fill drops
 * the slot axis and folds an explicit scale into the B factors. */
#include <stdio.h>
#include <stdlib.h>

#include "lora/adapter_internal.h"

/* What one layer establishes once its own checks pass (0 = nothing), and
 * the buffer that shows its outer layout (gate_up_lora_a unless that one
 * is not 4D), to name in the checks across layers. */
typedef struct {
    int64_t rank;
    int64_t outer;
    const char *outer_from;
} ls_pool_layer;

static void ls_pool_missing(ls_adapter_ctx *c, int l, int slot, bool prefixed) {
    char name[192];
    /* named as the user names it: the checkpoint's layer number */
    ls_adapter_name_build(name, sizeof name, LS_ADAPTER_FORMAT_POOL, prefixed, ls_dims_layer_id(c->dims, l), slot);
    ls_adapter_violation(c, LS_LORA_MISSING_TENSOR, l, name, LS_NA, LS_NA, LS_NA,
                         "upload all four buffers of a layer (gate_up_lora_a, gate_up_lora_b, down_lora_a, "
                         "down_lora_b) or none of them",
                         "layer %d: %s is missing; the pool format needs all four buffers of a layer", l, name);
}

static void ls_pool_outer_axis(ls_adapter_ctx *c, int l, const ls_adapter_in *in, const char *label) {
    const int64_t got = in->t->shape[1], n = c->dims->n;
    if (got == 1 || got == n) return;
    ls_adapter_violation(c, LS_LORA_OUTER_DIM_INVALID, l, in->name, 1, got > 1 ? n : 1, got, NULL,
                         "layer %d: %s expert axis (1) is %lld; outer factors must have expert dimension 1 (shared) "
                         "or n = %lld (per-expert)",
                         l, label, (long long)got, (long long)n);
}

static void ls_pool_axis(ls_adapter_ctx *c, ls_status code, int l, const ls_adapter_in *in, const char *label, int axis,
                         int64_t want, const char *what) {
    const int64_t got = in->t->shape[axis];
    if (got == want) return;
    ls_adapter_violation(c, code, l, in->name, axis, want, got, NULL,
                         "layer %d: %s %s axis (%d) is %lld, expected %lld", l, label, what, axis, (long long)got,
                         (long long)want);
}

/* One layer's four buffers, their labels, and which are 4D (the checks
 * that read axes skip the others). */
typedef struct {
    const ls_adapter_in *b[LS_FACTORS];
    const char *lab[LS_FACTORS];
    bool is4[LS_FACTORS];
} ls_pool_bufs;

/* Reports every buffer missing or not 4D. */
static void ls_pool_check_4d(ls_adapter_ctx *c, int l, bool prefixed, ls_pool_bufs *p) {
    for (int k = 0; k < LS_FACTORS; k++) {
        if (!p->b[k]->name) {
            ls_pool_missing(c, l, k, prefixed);
            p->is4[k] = false;
            continue;
        }
        const ls_tensor *t = p->b[k]->t;
        p->is4[k] = t->ndim == 4;
        if (p->is4[k]) continue;
        char shape[96];
        ls_shape_str(t->shape, t->ndim >= 0 && t->ndim <= LS_MAX_DIMS ? t->ndim : 0, shape, sizeof shape);
        ls_adapter_violation(c, LS_LORA_NOT_4D, l, p->b[k]->name, LS_NA, 4, t->ndim, NULL,
                             "layer %d: %s has %d dimensions %s; the pool format requires four 4D MoE buffers "
                             "[1, experts, rows, cols]",
                             l, p->lab[k], t->ndim, shape);
    }
}

/* The expert (outer) axes of gate_up_lora_a and down_lora_b: each 1 or n,
 * and the same. An outer axis that is neither 1 nor n is reported by
 * itself; only valid ones are compared, so it does not come back as a
 * mismatch. */
static void ls_pool_check_outer(ls_adapter_ctx *c, int l, const ls_pool_bufs *p, ls_pool_layer *out) {
    const ls_adapter_in *ga = p->b[LS_AD_GU_A], *db = p->b[LS_AD_D_B];
    const bool ga4 = p->is4[LS_AD_GU_A], db4 = p->is4[LS_AD_D_B];
    const int64_t n = c->dims->n;
    bool ga_ok = false, db_ok = false;
    int64_t ga_o = 0, db_o = 0;
    if (ga4) {
        ga_o = ga->t->shape[1];
        ga_ok = ga_o == 1 || ga_o == n;
        ls_pool_outer_axis(c, l, ga, p->lab[LS_AD_GU_A]);
    }
    if (db4) {
        db_o = db->t->shape[1];
        db_ok = db_o == 1 || db_o == n;
        ls_pool_outer_axis(c, l, db, p->lab[LS_AD_D_B]);
    }
    if (ga_ok && db_ok) {
        if (ga_o != db_o) {
            ls_adapter_violation(c, LS_LORA_EXPERT_LAYOUT_MISMATCH, l, db->name, 1, ga_o, db_o, NULL,
                                 "layer %d: gate-up A and down B must use the same expert layout: gate_up_lora_a "
                                 "expert axis is %lld, down_lora_b's is %lld",
                                 l, (long long)ga_o, (long long)db_o);
        } else {
            out->outer = ga_o;
            out->outer_from = ga->name;
        }
    } else if (ga4 != db4 && (ga_ok || db_ok)) {
        /* The partner is not 4D: the one valid outer axis is still this
         * layer's layout, which every layer must share. */
        out->outer = ga_ok ? ga_o : db_o;
        out->outer_from = ga_ok ? ga->name : db->name;
    }
}

/* The rank axes against r from gate_up_lora_b (4D, r already checked in
 * range); true when every one that could be compared agrees. */
static bool ls_pool_check_ranks(ls_adapter_ctx *c, int l, const ls_pool_bufs *p, int64_t r) {
    const ls_adapter_in *ga = p->b[LS_AD_GU_A], *da = p->b[LS_AD_D_A], *db = p->b[LS_AD_D_B];
    bool rank_ok = true;
    const int64_t ga_r = p->is4[LS_AD_GU_A] ? ga->t->shape[2] : 0;
    if (p->is4[LS_AD_GU_A] && ga_r != 2 * r) {
        char hint[256];
        snprintf(hint, sizeof hint,
                 "fuse the gate and up A matrices along the rank axis (axis 2) into 2*r = %lld rows before "
                 "upload: rows 0..r-1 feed gate, rows r..2r-1 feed up%s",
                 (long long)(2 * r), ga_r == r ? " (only r rows were given: the up half is missing)" : "");
        ls_adapter_violation(c, LS_LORA_RANK_MISMATCH, l, ga->name, 2, 2 * r, ga_r, hint,
                             "layer %d: gate_up_lora_a rank axis is %lld, expected 2*r = %lld (r = %lld from "
                             "gate_up_lora_b)",
                             l, (long long)ga_r, (long long)(2 * r), (long long)r);
        rank_ok = false;
    }
    const char *rank_hint = "make all four buffers use one rank r: gate_up_lora_a 2r rows, gate_up_lora_b, "
                            "down_lora_a and down_lora_b r (the rank axis of gate_up_lora_b is the reference)";
    if (p->is4[LS_AD_D_A] && da->t->shape[2] != r) {
        ls_adapter_violation(c, LS_LORA_RANK_MISMATCH, l, da->name, 2, r, da->t->shape[2], rank_hint,
                             "layer %d: down_lora_a rank axis is %lld, expected r = %lld (from gate_up_lora_b)", l,
                             (long long)da->t->shape[2], (long long)r);
        rank_ok = false;
    }
    if (p->is4[LS_AD_D_B] && db->t->shape[3] != r) {
        ls_adapter_violation(c, LS_LORA_RANK_MISMATCH, l, db->name, 3, r, db->t->shape[3], rank_hint,
                             "layer %d: down_lora_b rank axis is %lld, expected r = %lld (from gate_up_lora_b)", l,
                             (long long)db->t->shape[3], (long long)r);
        rank_ok = false;
    }
    return rank_ok;
}

/* gate_up_lora_b with its last two axes swapped ([1, n, r, 2F]): its
 * "rank" would be 2F and every partner blamed for it, so it is named
 * itself (true) and the layer's ranks are not compared. */
static bool ls_pool_gb_swapped(ls_adapter_ctx *c, int l, const ls_adapter_in *gb) {
    const int64_t *d = gb->t->shape, F = c->dims->F;
    if (d[2] == 2 * F || d[3] != 2 * F) return false;
    ls_adapter_violation(c, LS_LORA_INTERMEDIATE_MISMATCH, l, gb->name, 2, 2 * F, d[2],
                         "transpose the last two axes of gate_up_lora_b: it is [1, n, 2F, r] (B maps the rank to "
                         "the 2F gate and up rows)",
                         "layer %d: gate_up_lora_b is [%lld, %lld, %lld, %lld], its last two axes swapped: expected "
                         "[1, n, 2F, r] = [1, %d, %lld, r]",
                         l, (long long)d[0], (long long)d[1], (long long)d[2], (long long)d[3], c->dims->n,
                         (long long)(2 * F));
    return true;
}

/* One layer, in sglang's order. A structural failure stops the checks
 * that depend on it; independent ones still run. A buffer that is
 * missing or not 4D is reported once and left out of every check that
 * reads its axes, but the other buffers of the layer are still checked:
 * one missing or squeezed buffer must not hide the problems of the rest
 * ("every problem at once"). */
static void ls_pool_check_layer(ls_adapter_ctx *c, int l, ls_pool_layer *out) {
    ls_pool_bufs p;
    int present = 0;
    bool prefixed = false;
    for (int k = 0; k < LS_FACTORS; k++) {
        p.b[k] = ls_adapter_at(c, l, k);
        p.lab[k] = ls_adapter_slot_label(LS_ADAPTER_FORMAT_POOL, k);
        if (p.b[k]->name && !present++) prefixed = p.b[k]->prefixed;
    }
    out->rank = out->outer = 0;
    out->outer_from = NULL;
    if (present == 0) return;
    ls_pool_check_4d(c, l, prefixed, &p);
    for (int k = 0; k < LS_FACTORS; k++)
        if (p.is4[k]) ls_pool_axis(c, LS_LORA_SLOT_AXIS_INVALID, l, p.b[k], p.lab[k], 0, 1, "slot");
    ls_pool_check_outer(c, l, &p, out);

    const ls_adapter_in *ga = p.b[LS_AD_GU_A], *gb = p.b[LS_AD_GU_B], *da = p.b[LS_AD_D_A], *db = p.b[LS_AD_D_B];
    const bool ga4 = p.is4[LS_AD_GU_A], gb4 = p.is4[LS_AD_GU_B], da4 = p.is4[LS_AD_D_A], db4 = p.is4[LS_AD_D_B];
    const int64_t n = c->dims->n;
    if (gb4) ls_pool_axis(c, LS_LORA_EXPERT_COUNT_MISMATCH, l, gb, p.lab[LS_AD_GU_B], 1, n, "expert");
    if (da4) ls_pool_axis(c, LS_LORA_EXPERT_COUNT_MISMATCH, l, da, p.lab[LS_AD_D_A], 1, n, "expert");

    /* sglang takes r from gate_up_lora_b's last axis. Without it (not 4D)
     * the layer has no reference rank, so the other rank axes are not
     * compared: a mismatch against a guess would blame the wrong buffer. */
    const bool gb_swapped = gb4 && ls_pool_gb_swapped(c, l, gb);
    const int64_t r = gb4 && !gb_swapped ? gb->t->shape[3] : 0;
    if (gb_swapped) {
        /* reported above */
    } else if (gb4 && (r < 1 || r > INT32_MAX)) {
        ls_adapter_violation(c, LS_INVALID_SHAPE, l, gb->name, 3, LS_NA, r,
                             "an adapter has a rank r from 1 to the pool's max rank: give gate_up_lora_b [1, n, 2F, r]",
                             "layer %d: gate_up_lora_b rank axis (3) is %lld", l, (long long)r);
    } else if (gb4 && ls_pool_check_ranks(c, l, &p, r)) {
        /* The rank gate_up_lora_b shows, agreed by the buffers that could
         * be compared, is this layer's, which every layer must share. */
        out->rank = r;
    }

    const int64_t H = c->dims->H, F = c->dims->F;
    if (ga4) ls_pool_axis(c, LS_LORA_HIDDEN_MISMATCH, l, ga, p.lab[LS_AD_GU_A], 3, H, "hidden");
    if (gb4 && !gb_swapped)
        ls_pool_axis(c, LS_LORA_INTERMEDIATE_MISMATCH, l, gb, p.lab[LS_AD_GU_B], 2, 2 * F, "2F (gate then up)");
    if (da4) ls_pool_axis(c, LS_LORA_INTERMEDIATE_MISMATCH, l, da, p.lab[LS_AD_D_A], 3, F, "intermediate");
    if (db4) ls_pool_axis(c, LS_LORA_HIDDEN_MISMATCH, l, db, p.lab[LS_AD_D_B], 2, H, "hidden");
}

/* Reports into c; its scratch arrays are freed before it returns. */
void ls_adapter_pool_check(ls_adapter_ctx *c) {
    const int L = c->dims->L;
    ls_pool_layer *lay = calloc((size_t)L, sizeof *lay);
    int64_t *vals = calloc((size_t)L, sizeof *vals);
    if (!lay || !vals) {
        free(lay);
        free(vals);
        ls_adapter_violation(c, LS_INTERNAL, LS_NA, NULL, LS_NA, LS_NA, LS_NA, NULL,
                             "out of memory validating an adapter");
        return;
    }
    for (int l = 0; l < L; l++) ls_pool_check_layer(c, l, &lay[l]);

    /* Across layers: one rank and one outer layout, taken from the most
     * layers so the odd layer out is the one reported. */
    size_t nv = 0;
    for (int l = 0; l < L; l++)
        if (lay[l].rank > 0) vals[nv++] = lay[l].rank;
    const int64_t rank = ls_adapter_mode(vals, nv);
    nv = 0;
    for (int l = 0; l < L; l++)
        if (lay[l].outer > 0) vals[nv++] = lay[l].outer;
    const int64_t outer = ls_adapter_mode(vals, nv);
    int first_outer_layer = -1;
    const char *first_outer_from = NULL; /* lay is freed before it is named */
    for (int l = 0; l < L; l++) {
        const ls_adapter_in *gb = ls_adapter_at(c, l, LS_AD_GU_B);
        if (lay[l].rank > 0 && lay[l].rank != rank)
            ls_adapter_violation(c, LS_LORA_RANK_MISMATCH, l, gb->name, 3, rank, lay[l].rank,
                                 "every layer of an adapter has the same rank r; re-export the layers at one rank",
                                 "layer %d: the buffers have rank %lld, but the adapter's other layers have rank "
                                 "%lld",
                                 l, (long long)lay[l].rank, (long long)rank);
        else if (lay[l].rank > 0 && !c->rank_from)
            c->rank_from = gb->name;
        if (lay[l].outer > 0 && lay[l].outer != outer)
            ls_adapter_violation(c, LS_LORA_EXPERT_LAYOUT_MISMATCH, l, lay[l].outer_from, 1, outer, lay[l].outer,
                                 "give every layer the same expert axis on gate_up_lora_a and down_lora_b",
                                 "layer %d: the outer factors have expert axis %lld, but the adapter's other layers "
                                 "use %lld",
                                 l, (long long)lay[l].outer, (long long)outer);
        else if (lay[l].outer > 0 && first_outer_layer < 0) {
            first_outer_layer = l;
            first_outer_from = lay[l].outer_from;
        }
    }
    free(lay);
    free(vals);
    c->rank = rank <= INT32_MAX ? (int)rank : 0;
    c->outer = (int)outer;

    const ls_adapter_params *p = c->params;
    if (c->rank > 0 && p->r > 0 && p->r != c->rank) {
        char hint[256];
        snprintf(hint, sizeof hint, "set r to %d, or upload buffers of rank %d", c->rank, p->r);
        ls_adapter_violation(c, LS_LORA_RANK_MISMATCH, LS_NA, c->rank_from, 3, p->r, c->rank, hint,
                             "the upload says r = %d, but the buffers have rank %d (gate_up_lora_b axis 3)", p->r,
                             c->rank);
    }
    if (c->rank > c->pool->max_rank) {
        char hint[256];
        snprintf(hint, sizeof hint,
                 "restart the server with --max-rank %d (or larger), or upload an adapter of rank <= %d", c->rank,
                 c->pool->max_rank);
        ls_adapter_violation(c, LS_LORA_RANK_TOO_LARGE, LS_NA, c->rank_from, 3, c->pool->max_rank, c->rank, hint,
                             "the adapter's rank r = %d exceeds the pool's max rank R = %d", c->rank,
                             c->pool->max_rank);
    }
    if (c->outer > 1 && first_outer_layer >= 0 && c->pool->layout == LS_LORA_SHARED) {
        ls_adapter_violation(c, LS_LORA_LAYOUT_UNSUPPORTED, first_outer_layer, first_outer_from, 1, 1, c->outer,
                             "restart with --lora-layout per-expert, or upload outer factors with expert axis 1 "
                             "(shared by every expert)",
                             "the upload's outer factors are per-expert (gate_up_lora_a and down_lora_b have expert "
                             "axis n = %d), but the pool's layout is shared",
                             c->outer);
    }
    c->scale = p->has_scale ? p->scale : 1.0;
}

/* dst is the caller's (a layer of ls_adapter.data); c is borrowed. */
void ls_adapter_pool_fill(const ls_adapter_ctx *c, int l, float *dst) {
    const ls_factor_layout lay = ls_factor_layout_of(c->dims, c->outer, c->rank);
    const double s = c->scale;
    /* The slot axis is 1, so each buffer is already its compact block. */
    for (int k = 0; k < LS_FACTORS; k++) {
        const ls_tensor *t = ls_adapter_at(c, l, k)->t;
        const bool is_b = k == LS_AD_GU_B || k == LS_AD_D_B;
        for (size_t i = 0; i < lay.len[k]; i++)
            dst[i] = is_b ? (float)(s * ls_adapter_value(t, i)) : ls_adapter_value(t, i);
        dst += lay.len[k];
    }
}
