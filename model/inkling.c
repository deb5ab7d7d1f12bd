/* The fused weights file (sglang's Inkling layout): for every layer l from
 * 0, model.layers.{l}.mlp.shared_experts.w13_weight [n, 2F, H] and
 * w2_weight [n, H, F]. Only the header is read here; every name, shape and
 * dtype is checked against layer 0's, and errors name the tensor. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

#define LS_FUSED_PREFIX "model.layers."
#define LS_FUSED_MIDDLE ".mlp.shared_experts."
#define LS_FUSED_HINT                                                                                        \
    "the file needs model.layers.{l}.mlp.shared_experts.w13_weight [n, 2F, H] and w2_weight [n, H, F] for "  \
    "every layer l (or pass a Hugging Face checkpoint directory)"

enum { LS_FUSED_W13, LS_FUSED_W2 };

/* Parses "model.layers.{l}.mlp.shared_experts.{w13,w2}_weight" strictly
 * (decimal l without sign or leading zeros). False for any other name. */
static bool ls_fused_parse_name(const char *name, long *layer, int *kind) {
    size_t plen = strlen(LS_FUSED_PREFIX);
    if (strncmp(name, LS_FUSED_PREFIX, plen) != 0) return false;
    const char *p = name + plen;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) return false;
    char *end;
    errno = 0;
    long l = strtol(p, &end, 10);
    if (errno || l < 0 || l >= INT_MAX) return false;
    size_t mlen = strlen(LS_FUSED_MIDDLE);
    if (strncmp(end, LS_FUSED_MIDDLE, mlen) != 0) return false;
    end += mlen;
    if (!strcmp(end, "w13_weight")) *kind = LS_FUSED_W13;
    else if (!strcmp(end, "w2_weight")) *kind = LS_FUSED_W2;
    else return false;
    *layer = l;
    return true;
}

static void ls_fused_name(char *buf, size_t len, long layer, int kind) {
    snprintf(buf, len, LS_FUSED_PREFIX "%ld" LS_FUSED_MIDDLE "%s", layer,
             kind == LS_FUSED_W13 ? "w13_weight" : "w2_weight");
}

/* The entry of each layer's two tensors (idx13/idx2, -1 = none) for
 * layers below cap, and the layer count. */
static ls_status ls_fused_index(const ls_st_header *h, long *idx13, long *idx2, long cap, int *L_out, ls_error *err) {
    long max_layer = -1;
    for (long l = 0; l < cap; l++) idx13[l] = idx2[l] = -1;
    for (size_t i = 0; i < h->n; i++) {
        const char *name = h->items[i].name;
        long layer;
        int kind;
        if (!ls_fused_parse_name(name, &layer, &kind))
            return ls_error_add(err, LS_SAFETENSORS_INVALID, LS_NA, name, LS_NA, LS_NA, LS_NA, LS_FUSED_HINT,
                                "weights: unexpected tensor %s (expected model.layers.{l}.mlp.shared_experts."
                                "w13_weight or w2_weight)",
                                name);
        if (layer > max_layer) max_layer = layer;
        if (layer < cap) (kind == LS_FUSED_W13 ? idx13 : idx2)[layer] = (long)i;
    }
    if (max_layer < 0)
        return ls_error_set(err, LS_INVALID_SHAPE, LS_FUSED_HINT, "weights: the file holds no layer tensors");
    /* Each layer takes two tensors, so a layer index >= cap implies a gap
     * below cap: the scan finds it. */
    for (long l = 0; l <= max_layer; l++) {
        if (l >= cap || idx13[l] < 0 || idx2[l] < 0) {
            char name[160];
            ls_fused_name(name, sizeof name, l, l < cap && idx13[l] >= 0 ? LS_FUSED_W2 : LS_FUSED_W13);
            return ls_error_add(err, LS_INVALID_SHAPE, (int)l, name, LS_NA, LS_NA, LS_NA, LS_FUSED_HINT,
                                "weights: %s is missing (the file has tensors up to layer %ld)", name, max_layer);
        }
    }
    *L_out = (int)(max_layer + 1);
    return LS_OK;
}

/* The tensor's dtype is a float one and its shape equals want[3]. */
static ls_status ls_fused_check(const ls_st_info *t, long layer, const int64_t *want, const char *what,
                                ls_error *err) {
    char got[96], exp[96];
    if (!ls_dtype_is_float(t->dtype))
        return ls_error_add(err, LS_SAFETENSORS_INVALID, (int)layer, t->name, LS_NA, LS_NA, LS_NA,
                            "store the weights as F32, F16 or BF16",
                            "weights: %s has dtype %s, expected F32, F16 or BF16", t->name, ls_dtype_name(t->dtype));
    if (t->ndim != 3)
        return ls_error_add(err, LS_INVALID_SHAPE, (int)layer, t->name, LS_NA, 3, t->ndim, LS_FUSED_HINT,
                            "weights: %s has %d dimensions %s, expected 3 (%s)", t->name, t->ndim,
                            ls_shape_str(t->shape, t->ndim, got, sizeof got), what);
    for (int a = 0; a < 3; a++) {
        if (t->shape[a] != want[a])
            return ls_error_add(err, LS_INVALID_SHAPE, (int)layer, t->name, a, want[a], t->shape[a], LS_FUSED_HINT,
                                "weights: %s has shape %s, expected %s (%s, from layer 0's w13_weight)", t->name,
                                ls_shape_str(t->shape, 3, got, sizeof got), ls_shape_str(want, 3, exp, sizeof exp),
                                what);
    }
    return LS_OK;
}

/* n, F, H from layer 0's w13_weight, which must be [n, 2F, H] with
 * positive extents that fit an int. */
static ls_status ls_fused_dims(const ls_st_info *t0, int *n, int *F, int *H, ls_error *err) {
    if (t0->ndim != 3 || t0->shape[0] <= 0 || t0->shape[1] <= 0 || t0->shape[2] <= 0 || t0->shape[1] % 2 ||
        t0->shape[0] > INT_MAX || t0->shape[1] > INT_MAX || t0->shape[2] > INT_MAX) {
        char got[96];
        int axis = LS_NA;
        for (int a = 0; t0->ndim == 3 && a < 3 && axis == LS_NA; a++)
            if (t0->shape[a] <= 0 || t0->shape[a] > INT_MAX || (a == 1 && t0->shape[a] % 2)) axis = a;
        return ls_error_add(err, LS_INVALID_SHAPE, 0, t0->name, axis, LS_NA,
                            axis == LS_NA ? t0->ndim : t0->shape[axis], LS_FUSED_HINT,
                            "weights: %s has shape %s, expected [n, 2F, H] with positive n, F, H (2F even)", t0->name,
                            ls_shape_str(t0->shape, t0->ndim, got, sizeof got));
    }
    *n = (int)t0->shape[0], *F = (int)(t0->shape[1] / 2), *H = (int)t0->shape[2];
    return LS_OK;
}

/* The W13 row layout: the override, else __metadata__ w13_layout. A
 * file that states none is refused: both layouts have the same shape,
 * and a wrong guess gives wrong outputs without an error. */
static ls_status ls_fused_layout(const ls_st_header *h, const ls_w13_layout *override, ls_w13_layout *out,
                                 ls_error *err) {
    const char *meta = ls_tensor_set_meta(&h->meta, "w13_layout");
    *out = LS_W13_INTERLEAVED;
    if (override) *out = *override;
    else if (!meta)
        return ls_error_set(err, LS_INVALID_REQUEST,
                            "pass --w13-layout contiguous or --w13-layout interleaved, or write __metadata__ "
                            "w13_layout into the file",
                            "weights: the fused file does not say how the 2F rows of w13_weight hold gate and up: "
                            "contiguous (rows 0..F-1 gate, F..2F-1 up: what sglang's and vLLM's FusedMoE loaders "
                            "write) or interleaved (row 2j gate j, row 2j+1 up j) have the same shape; pass "
                            "--w13-layout contiguous|interleaved or write __metadata__ w13_layout");
    else if (!ls_w13_layout_parse(meta, out))
        return ls_error_set(err, LS_SAFETENSORS_INVALID, "set __metadata__.w13_layout to interleaved or contiguous",
                            "weights: __metadata__ w13_layout is \"%s\", expected interleaved or contiguous", meta);
    return LS_OK;
}

/* Records every layer's two tensors in m->src (file 0). */
static ls_status ls_fused_record(const ls_st_header *h, const long *idx13, const long *idx2, ls_model *m,
                                 ls_error *err) {
    const ls_dims *d = &m->dims;
    const int64_t want13[3] = {d->n, 2 * (int64_t)d->F, d->H}, want2[3] = {d->n, d->H, d->F};
    bool first = true;
    for (int l = 0; l < d->L; l++) {
        for (int kind = LS_FUSED_W13; kind <= LS_FUSED_W2; kind++) {
            const ls_st_info *t = &h->items[kind == LS_FUSED_W13 ? idx13[l] : idx2[l]];
            LS_MODEL_TRY(ls_fused_check(t, l, kind == LS_FUSED_W13 ? want13 : want2,
                                  kind == LS_FUSED_W13 ? "[n, 2F, H]" : "[n, H, F]", err));
            ls_model_tensor *mt = ls_model_tensor_at(m->src, l, kind == LS_FUSED_W13 ? LS_MT_W13 : LS_MT_W2);
            if (!ls_model_info_copy(&mt->info, t)) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
            mt->file = 0;
            m->bytes += t->nbytes;
            /* F32 wins over 16-bit; F16 with BF16 is F32 too, since neither
             * holds the other's values. */
            m->dtype = first || m->dtype == t->dtype ? t->dtype : LS_DTYPE_F32;
            first = false;
        }
    }
    return LS_OK;
}

ls_status ls_model_open_fused(int fd, const char *path, const ls_w13_layout *layout_override, ls_model *m,
                              ls_error *err) {
    ls_st_header h;
    ls_status st = ls_safetensors_read_header(fd, path, &h, err);
    if (st != LS_OK) return st;
    long cap = (long)h.n / 2 + 1;
    long *idx = malloc(2 * (size_t)cap * sizeof *idx);
    int L = 0, n = 0, F = 0, H = 0;
    ls_w13_layout layout;
    if (!idx) st = ls_error_set(err, LS_INTERNAL, NULL, "weights: out of memory");
    if (st == LS_OK) st = ls_fused_layout(&h, layout_override, &layout, err);
    if (st == LS_OK) st = ls_fused_index(&h, idx, idx + cap, cap, &L, err);
    if (st == LS_OK) st = ls_fused_dims(&h.items[idx[0]], &n, &F, &H, err);
    if (st == LS_OK) {
        m->dims = (ls_dims){.n = n, .H = H, .F = F, .L = L, .w13_layout = layout};
        if (!(m->src = ls_model_source_new(L))) st = ls_error_set(err, LS_INTERNAL, NULL, "weights: out of memory");
    }
    if (st == LS_OK) st = ls_fused_record(&h, idx, idx + cap, m, err);
    free(idx);
    ls_st_header_free(&h);
    return st;
}
