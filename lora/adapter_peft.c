/* PEFT-format adapters (docs/api.md, adapter formats): the checks of each lora_A/lora_B pair
 * against the model and the adapter's rank, and the layout change into
 * the compact pool layout with the scale folded into the B factors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "lora/adapter_internal.h"

/* The rank a 2D factor shows: axis 0 of lora_A, axis 1 of lora_B. */
static int64_t ls_peft_rank_of(const ls_adapter_ctx *c, size_t i) {
    const ls_adapter_in *in = &c->in[i];
    if (!in->name || in->t->ndim != 2) return -1;
    int slot = (int)(i % LS_AD_SLOTS);
    return slot == LS_AD_GU_A || slot == LS_AD_D_A ? in->t->shape[0] : in->t->shape[1];
}

/* The adapter's r: the rank most factors show, so that one odd factor
 * (say, a transposed one) is the one reported, not all the others. */
static void ls_peft_find_rank(ls_adapter_ctx *c) {
    const size_t total = (size_t)c->dims->L * LS_AD_SLOTS;
    size_t best_count = 0;
    for (size_t i = 0; i < total; i++) {
        int64_t v = ls_peft_rank_of(c, i);
        if (v <= 0 || v > INT32_MAX) continue;
        size_t count = 0;
        for (size_t j = 0; j < total; j++) count += ls_peft_rank_of(c, j) == v;
        if (count > best_count) {
            best_count = count;
            c->rank = (int)v;
            c->rank_from = c->in[i].name;
        }
    }
}

static void ls_peft_missing(ls_adapter_ctx *c, int l, int slot, const ls_adapter_in *partner) {
    char name[192], hint[256];
    ls_adapter_name_build(name, sizeof name, LS_ADAPTER_FORMAT_PEFT, partner->prefixed, l, slot);
    const char *label = ls_adapter_slot_label(LS_ADAPTER_FORMAT_PEFT, slot);
    snprintf(hint, sizeof hint, "upload %s together with %s, or leave both out",
             ls_adapter_slot_label(LS_ADAPTER_FORMAT_PEFT, slot ^ 1), label);
    ls_adapter_violation(c, LS_LORA_MISSING_TENSOR, l, name, LS_NA, LS_NA, LS_NA, hint,
                         "layer %d: %s is missing; %s was uploaded without it", l, name, partner->name);
}

static bool ls_peft_is_2d(ls_adapter_ctx *c, int l, const ls_adapter_in *in, bool is_a) {
    const ls_tensor *t = in->t;
    if (t->ndim == 2) return true;
    char shape[96];
    ls_shape_str(t->shape, t->ndim >= 0 && t->ndim <= LS_MAX_DIMS ? t->ndim : 0, shape, sizeof shape);
    ls_adapter_violation(c, LS_INVALID_SHAPE, l, in->name, LS_NA, 2, t->ndim,
                         "PEFT factors are 2D: lora_A [r, in_features], lora_B [out_features, r]",
                         "layer %d: %s has %d dimensions %s; a PEFT %s factor is 2D", l, in->name, t->ndim, shape,
                         is_a ? "lora_A" : "lora_B");
    return false;
}

/* Checks an expert-major axis of n blocks of `per` each (docs/api.md, errors:
 * divisible by n first, then the block size against the model). */
static void ls_peft_expert_axis(ls_adapter_ctx *c, int l, const ls_adapter_in *in, int axis, int per,
                                const char *per_name, const char *what, const char *hint) {
    const int64_t got = in->t->shape[axis], n = c->dims->n, want = n * per;
    if (got == want) return;
    if (got % n != 0)
        ls_adapter_violation(c, LS_LORA_EXTENT_NOT_DIVISIBLE, l, in->name, axis, want, got, hint,
                             "layer %d: %s has %lld %s (axis %d), not divisible by the n = %lld shared experts; "
                             "expected n * %s = %lld * %d = %lld, expert-major",
                             l, in->name, (long long)got, what, axis, (long long)n, per_name, (long long)n, per,
                             (long long)want);
    else
        ls_adapter_violation(c, LS_LORA_INTERMEDIATE_MISMATCH, l, in->name, axis, want, got, hint,
                             "layer %d: %s has %lld %s (axis %d) = n * %lld, expected n * %s = %lld * %d = %lld", l,
                             in->name, (long long)got, what, axis, (long long)(got / n), per_name, (long long)n, per,
                             (long long)want);
}

static void ls_peft_rank_axis(ls_adapter_ctx *c, int l, const ls_adapter_in *in, int axis, const char *hint) {
    const int64_t got = in->t->shape[axis];
    if (c->rank < 1 || got == c->rank) return;
    ls_adapter_violation(c, LS_LORA_RANK_MISMATCH, l, in->name, axis, c->rank, got, hint,
                         "layer %d: %s rank axis (%d) is %lld, expected r = %d (the rank of %s)", l, in->name, axis,
                         (long long)got, c->rank, c->rank_from);
}

static const char *ls_peft_rank_hint =
    "every lora_A and lora_B of an adapter has one rank r: lora_A is [r, in_features], lora_B is "
    "[out_features, r]; re-export the factors at one rank";

/* lora_A of gate_up_proj [r, H] (module 0) or down_proj [r, n*F]. */
static void ls_peft_check_a(ls_adapter_ctx *c, int l, int module, const ls_adapter_in *in) {
    if (!ls_peft_is_2d(c, l, in, true)) return;
    const ls_tensor *t = in->t;
    const int64_t in_features = module == 0 ? c->dims->H : (int64_t)c->dims->n * c->dims->F;
    char hint[256];
    const char *rank_hint = ls_peft_rank_hint, *feat_hint = NULL;
    if (c->rank > 0 && in_features != c->rank && t->shape[0] == in_features && t->shape[1] == c->rank) {
        snprintf(hint, sizeof hint, "the tensor looks transposed: PEFT stores lora_A as [r, in_features] = [%d, %lld]",
                 c->rank, (long long)in_features);
        rank_hint = feat_hint = hint;
    }
    ls_peft_rank_axis(c, l, in, 0, rank_hint);
    if (module == 0) {
        if (t->shape[1] != c->dims->H)
            ls_adapter_violation(c, LS_LORA_HIDDEN_MISMATCH, l, in->name, 1, c->dims->H, t->shape[1], feat_hint,
                                 "layer %d: %s input axis (1) is %lld, expected the hidden size H = %d", l, in->name,
                                 (long long)t->shape[1], c->dims->H);
    } else {
        ls_peft_expert_axis(c, l, in, 1, c->dims->F, "F", "columns", feat_hint);
    }
}

/* lora_B of gate_up_proj [n*2F, r] (module 0) or down_proj [H, r]. */
static void ls_peft_check_b(ls_adapter_ctx *c, int l, int module, const ls_adapter_in *in) {
    if (!ls_peft_is_2d(c, l, in, false)) return;
    const ls_tensor *t = in->t;
    const int64_t out_features = module == 0 ? 2 * (int64_t)c->dims->n * c->dims->F : c->dims->H;
    char hint[256];
    const char *rank_hint = ls_peft_rank_hint, *feat_hint = NULL;
    if (c->rank > 0 && out_features != c->rank && t->shape[0] == c->rank && t->shape[1] == out_features) {
        snprintf(hint, sizeof hint, "the tensor looks transposed: PEFT stores lora_B as [out_features, r] = [%lld, %d]",
                 (long long)out_features, c->rank);
        rank_hint = feat_hint = hint;
    }
    ls_peft_rank_axis(c, l, in, 1, rank_hint);
    if (module == 0) {
        ls_peft_expert_axis(c, l, in, 0, 2 * c->dims->F, "2F", "rows", feat_hint);
    } else if (t->shape[0] != c->dims->H) {
        ls_adapter_violation(c, LS_LORA_HIDDEN_MISMATCH, l, in->name, 0, c->dims->H, t->shape[0], feat_hint,
                             "layer %d: %s output axis (0) is %lld, expected the hidden size H = %d", l, in->name,
                             (long long)t->shape[0], c->dims->H);
    }
}

/* Reports into c; allocates nothing. */
void ls_adapter_peft_check(ls_adapter_ctx *c) {
    ls_peft_find_rank(c);
    /* No 2D factor shows a rank of 1 or more (each has an empty rank
     * axis), so the per-factor checks below have nothing to compare
     * against. As the pool format answers it: an invalid shape, named on a
     * 2D factor: one that is not 2D shows no rank at all and is reported
     * as such below, so a rank problem on it would only be a consequence. */
    const size_t total = (size_t)c->dims->L * LS_AD_SLOTS;
    for (size_t i = 0; c->rank < 1 && i < total; i++) {
        const int64_t r = ls_peft_rank_of(c, i);
        if (r < 0) continue;
        ls_adapter_violation(c, LS_INVALID_SHAPE, (int)(i / LS_AD_SLOTS), c->in[i].name, LS_NA, LS_NA, r,
                             "an adapter has a rank r from 1 to the pool's max rank: lora_A is [r, in_features], "
                             "lora_B [out_features, r]",
                             "%s has rank %lld: no factor of the adapter has a usable rank of 1 or more",
                             c->in[i].name, (long long)r);
        break;
    }
    for (int l = 0; l < c->dims->L; l++) {
        for (int module = 0; module < 2; module++) {
            const int ka = module == 0 ? LS_AD_GU_A : LS_AD_D_A, kb = ka + 1;
            const ls_adapter_in *a = ls_adapter_at(c, l, ka), *b = ls_adapter_at(c, l, kb);
            if (!a->name && !b->name) continue;
            if (!a->name) ls_peft_missing(c, l, ka, b);
            if (!b->name) ls_peft_missing(c, l, kb, a);
            if (a->name) ls_peft_check_a(c, l, module, a);
            if (b->name) ls_peft_check_b(c, l, module, b);
        }
    }
    c->outer = 1;
    if (c->rank < 1) return;
    const ls_adapter_params *p = c->params;
    if (p->r > 0 && p->r != c->rank) {
        char hint[256];
        snprintf(hint, sizeof hint, "set \"r\": %d in the adapter config, or upload the factors of rank %d it names",
                 c->rank, p->r);
        ls_adapter_violation(c, LS_LORA_RANK_MISMATCH, LS_NA, c->rank_from, LS_NA, p->r, c->rank, hint,
                             "the adapter config says r = %d, but the factors have rank %d (e.g. %s)", p->r, c->rank,
                             c->rank_from);
    }
    if (c->rank > c->pool->max_rank) {
        char hint[256];
        snprintf(hint, sizeof hint,
                 "restart the server with --max-rank %d (or larger), or upload an adapter of rank <= %d", c->rank,
                 c->pool->max_rank);
        ls_adapter_violation(c, LS_LORA_RANK_TOO_LARGE, LS_NA, c->rank_from, LS_NA, c->pool->max_rank, c->rank, hint,
                             "the adapter's rank r = %d exceeds the pool's max rank R = %d", c->rank,
                             c->pool->max_rank);
    }
    /* PEFT folds lora_alpha / r (rsLoRA: / sqrt(r)) into B; without an
     * alpha the factors are taken as they are. */
    c->scale = 1.0;
    if (p->has_alpha)
        c->scale = p->use_rslora ? p->lora_alpha / sqrt((double)c->rank) : p->lora_alpha / (double)c->rank;
}

/* dst is the caller's (a layer of ls_adapter.data); c is borrowed. */
void ls_adapter_peft_fill(const ls_adapter_ctx *c, int l, float *dst) {
    const size_t n = (size_t)c->dims->n, H = (size_t)c->dims->H, F = (size_t)c->dims->F, r = (size_t)c->rank;
    const double s = c->scale;
    const ls_factor_layout lay = ls_factor_layout_of(c->dims, 1, c->rank); /* PEFT outer factors are shared */
    float *gu_a = dst + lay.off[LS_FACTOR_GU_A], *gu_b = dst + lay.off[LS_FACTOR_GU_B];
    float *d_a = dst + lay.off[LS_FACTOR_D_A], *d_b = dst + lay.off[LS_FACTOR_D_B];
    const ls_adapter_in *in = ls_adapter_at(c, l, LS_AD_GU_A);
    if (in->name) {
        /* One A feeds gate and up: it fills both halves of the rank axis. */
        for (size_t i = 0; i < r * H; i++) gu_a[i] = gu_a[r * H + i] = ls_adapter_value(in->t, i);
        /* B [n*2F, r] expert-major is [n, 2F, r] row-major; the pool
         * wants each expert's gate rows before its up rows. */
        in = ls_adapter_at(c, l, LS_AD_GU_B);
        const bool interleaved = c->params->gate_up_order == LS_GATE_UP_ORDER_INTERLEAVED;
        for (size_t e = 0; e < n; e++)
            for (size_t row = 0; row < 2 * F; row++) {
                /* interleaved: source row 2j is gate j, 2j+1 is up j */
                const size_t src = interleaved ? (row < F ? 2 * row : 2 * (row - F) + 1) : row;
                for (size_t k = 0; k < r; k++)
                    gu_b[(e * 2 * F + row) * r + k] =
                        (float)(s * ls_adapter_value(in->t, (e * 2 * F + src) * r + k));
            }
    }
    in = ls_adapter_at(c, l, LS_AD_D_A);
    if (in->name) {
        /* A [r, n*F] with expert-major columns becomes [n, r, F]. */
        for (size_t e = 0; e < n; e++)
            for (size_t k = 0; k < r; k++)
                for (size_t j = 0; j < F; j++)
                    d_a[(e * r + k) * F + j] = ls_adapter_value(in->t, k * n * F + e * F + j);
        in = ls_adapter_at(c, l, LS_AD_D_B);
        for (size_t i = 0; i < H * r; i++) d_b[i] = (float)(s * ls_adapter_value(in->t, i));
    }
}
