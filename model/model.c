/* The base weights on the host: loaded from a safetensors file with every
 * name, shape, dtype and value checked (errors name the tensor), or built
 * as the deterministic demo model; then uploaded layer by layer. */
#include "model/model.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"
#include "common/text.h"
#include "common/file.h"

#define LS_MODEL_PREFIX "model.layers."
#define LS_MODEL_MIDDLE ".mlp.shared_experts."
#define LS_MODEL_HINT                                                                                        \
    "the file needs model.layers.{l}.mlp.shared_experts.w13_weight [n, 2F, H] and w2_weight [n, H, F] for "  \
    "every layer l"

enum { LS_MODEL_W13, LS_MODEL_W2 };

/* Parses "model.layers.{l}.mlp.shared_experts.{w13,w2}_weight" strictly
 * (decimal l without sign or leading zeros). Returns false for any other
 * name. */
static bool ls_model_parse_name(const char *name, long *layer, int *kind) {
    size_t plen = strlen(LS_MODEL_PREFIX);
    if (strncmp(name, LS_MODEL_PREFIX, plen) != 0) return false;
    const char *p = name + plen;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) return false;
    char *end;
    errno = 0;
    long l = strtol(p, &end, 10);
    if (errno || l < 0 || l >= INT_MAX) return false;
    size_t mlen = strlen(LS_MODEL_MIDDLE);
    if (strncmp(end, LS_MODEL_MIDDLE, mlen) != 0) return false;
    end += mlen;
    if (!strcmp(end, "w13_weight")) *kind = LS_MODEL_W13;
    else if (!strcmp(end, "w2_weight")) *kind = LS_MODEL_W2;
    else return false;
    *layer = l;
    return true;
}

static void ls_model_name(char *buf, size_t len, long layer, int kind) {
    snprintf(buf, len, LS_MODEL_PREFIX "%ld" LS_MODEL_MIDDLE "%s", layer,
             kind == LS_MODEL_W13 ? "w13_weight" : "w2_weight");
}

/* The tensor's shape must equal want[3] (n, 2F, H or n, H, F). */
static ls_status ls_model_check_shape(const char *name, long layer, const ls_tensor *t, const int64_t *want,
                                      const char *what, ls_error *err) {
    char got[96], exp[96];
    if (t->ndim != 3)
        return ls_error_add(err, LS_INVALID_SHAPE, (int)layer, name, LS_NA, 3, t->ndim, LS_MODEL_HINT,
                            "weights: %s has %d dimensions %s, expected 3 (%s)", name, t->ndim,
                            ls_shape_str(t->shape, t->ndim, got, sizeof got), what);
    for (int a = 0; a < 3; a++) {
        if (t->shape[a] != want[a])
            return ls_error_add(err, LS_INVALID_SHAPE, (int)layer, name, a, want[a], t->shape[a], LS_MODEL_HINT,
                                "weights: %s has shape %s, expected %s (%s, from layer 0's w13_weight)", name,
                                ls_shape_str(t->shape, 3, got, sizeof got), ls_shape_str(want, 3, exp, sizeof exp),
                                what);
    }
    return LS_OK;
}

/* fp32 copy of a tensor of a float dtype, refusing any NaN or Inf. The
 * caller frees *out. */
static ls_status ls_model_values(const char *name, long layer, const ls_tensor *t, float **out, ls_error *err) {
    *out = NULL;
    size_t count = (size_t)ls_tensor_numel(t);
    float *v = malloc((count ? count : 1) * sizeof *v);
    if (!v) return ls_error_set(err, LS_INTERNAL, NULL, "weights: out of memory reading %s", name);
    if (!ls_convert_to_f32(t->dtype, t->data, count, v)) {
        free(v);
        return ls_error_set(err, LS_INTERNAL, NULL, "weights: cannot convert %s from %s", name,
                            ls_dtype_name(t->dtype));
    }
    for (size_t i = 0; i < count; i++) {
        if (!isfinite(v[i])) {
            free(v);
            return ls_error_add(err, LS_SAFETENSORS_INVALID, (int)layer, name, LS_NA, LS_NA, LS_NA,
                                "the weights file is corrupt or came from a diverged run",
                                "weights: %s holds a non-finite value at flat index %zu", name, i);
        }
    }
    *out = v;
    return LS_OK;
}

/* Allocates the per-layer pointer arrays (values NULL). */
static bool ls_model_alloc(ls_model *m, int L) {
    m->w13 = calloc((size_t)L, sizeof *m->w13);
    m->w2 = calloc((size_t)L, sizeof *m->w2);
    return m->w13 && m->w2;
}

/* Frees every layer and the arrays; m is zeroed and can be reused. */
void ls_model_free(ls_model *m) {
    if (!m) return;
    for (int l = 0; m->w13 && l < m->dims.L; l++) free(m->w13[l]);
    for (int l = 0; m->w2 && l < m->dims.L; l++) free(m->w2[l]);
    free(m->w13);
    free(m->w2);
    memset(m, 0, sizeof *m);
}

/* F32 wins over 16-bit; F16 with BF16 is F32 too, since neither holds the
 * other's values and the backend rounds to this dtype on upload. */
static ls_dtype ls_model_widen(ls_dtype have, ls_dtype next, bool first) {
    if (first || have == next) return next;
    return LS_DTYPE_F32;
}

/* Finds both tensors of each layer and the layer count. idx13/idx2 hold
 * the set index of each layer's tensor (or -1), for layers below cap. */
static ls_status ls_model_index(const ls_tensor_set *set, long *idx13, long *idx2, long cap, int *L_out,
                                ls_error *err) {
    long max_layer = -1;
    for (long l = 0; l < cap; l++) idx13[l] = idx2[l] = -1;
    for (size_t i = 0; i < set->n; i++) {
        const char *name = set->items[i].name;
        long layer;
        int kind;
        if (!ls_model_parse_name(name, &layer, &kind))
            return ls_error_add(err, LS_SAFETENSORS_INVALID, LS_NA, name, LS_NA, LS_NA, LS_NA, LS_MODEL_HINT,
                                "weights: unexpected tensor %s (expected model.layers.{l}.mlp.shared_experts."
                                "w13_weight or w2_weight)",
                                name);
        if (layer > max_layer) max_layer = layer;
        if (layer < cap) (kind == LS_MODEL_W13 ? idx13 : idx2)[layer] = (long)i;
    }
    if (max_layer < 0)
        return ls_error_set(err, LS_INVALID_SHAPE, LS_MODEL_HINT, "weights: the file holds no layer tensors");
    /* Each layer takes two tensors, so a layer index >= cap implies a gap
     * below cap: the scan finds it. */
    for (long l = 0; l <= max_layer; l++) {
        if (l >= cap || idx13[l] < 0 || idx2[l] < 0) {
            char name[160];
            ls_model_name(name, sizeof name, l, l < cap && idx13[l] >= 0 ? LS_MODEL_W2 : LS_MODEL_W13);
            return ls_error_add(err, LS_INVALID_SHAPE, (int)l, name, LS_NA, LS_NA, LS_NA, LS_MODEL_HINT,
                                "weights: %s is missing (the file has tensors up to layer %ld)", name, max_layer);
        }
    }
    *L_out = (int)(max_layer + 1);
    return LS_OK;
}

/* Checks the names, shapes, dtypes and values of set and fills out. */
static ls_status ls_model_from_set(const ls_tensor_set *set, const ls_w13_layout *layout_override, ls_model *out,
                                   ls_error *err) {
    ls_w13_layout layout = LS_W13_INTERLEAVED;
    const char *meta = ls_tensor_set_meta(set, "w13_layout");
    if (layout_override) {
        layout = *layout_override;
    } else if (meta && !ls_w13_layout_parse(meta, &layout)) {
        return ls_error_set(err, LS_SAFETENSORS_INVALID, "set __metadata__.w13_layout to interleaved or contiguous",
                            "weights: __metadata__ w13_layout is \"%s\", expected interleaved or contiguous", meta);
    }

    long cap = (long)set->n / 2 + 1;
    long *idx = malloc(2 * (size_t)cap * sizeof *idx);
    if (!idx) return ls_error_set(err, LS_INTERNAL, NULL, "weights: out of memory");
    int L = 0;
    ls_status st = ls_model_index(set, idx, idx + cap, cap, &L, err);
    if (st != LS_OK) {
        free(idx);
        return st;
    }

    const ls_tensor *t0 = &set->items[idx[0]].t;
    char name0[160];
    ls_model_name(name0, sizeof name0, 0, LS_MODEL_W13);
    if (t0->ndim != 3 || t0->shape[0] <= 0 || t0->shape[1] <= 0 || t0->shape[2] <= 0 || t0->shape[1] % 2 ||
        t0->shape[0] > INT_MAX || t0->shape[1] > INT_MAX || t0->shape[2] > INT_MAX) {
        char got[96];
        int axis = LS_NA;
        for (int a = 0; t0->ndim == 3 && a < 3 && axis == LS_NA; a++)
            if (t0->shape[a] <= 0 || t0->shape[a] > INT_MAX || (a == 1 && t0->shape[a] % 2)) axis = a;
        free(idx);
        return ls_error_add(err, LS_INVALID_SHAPE, 0, name0, axis, LS_NA, axis == LS_NA ? t0->ndim : t0->shape[axis],
                            LS_MODEL_HINT,
                            "weights: %s has shape %s, expected [n, 2F, H] with positive n, F, H (2F even)", name0,
                            ls_shape_str(t0->shape, t0->ndim, got, sizeof got));
    }
    const int n = (int)t0->shape[0], F = (int)(t0->shape[1] / 2), H = (int)t0->shape[2];
    const int64_t want13[3] = {n, 2 * (int64_t)F, H}, want2[3] = {n, H, F};

    memset(out, 0, sizeof *out);
    out->dims = (ls_dims){.n = n, .H = H, .F = F, .L = L, .w13_layout = layout};
    if (!ls_model_alloc(out, L)) {
        free(idx);
        ls_model_free(out);
        return ls_error_set(err, LS_INTERNAL, NULL, "weights: out of memory");
    }
    for (int l = 0; l < L && st == LS_OK; l++) {
        for (int kind = LS_MODEL_W13; kind <= LS_MODEL_W2 && st == LS_OK; kind++) {
            const ls_named_tensor *nt = &set->items[idx[kind == LS_MODEL_W13 ? l : cap + l]];
            if (!ls_dtype_is_float(nt->t.dtype))
                st = ls_error_add(err, LS_SAFETENSORS_INVALID, l, nt->name, LS_NA, LS_NA, LS_NA,
                                  "store the weights as F32, F16 or BF16",
                                  "weights: %s has dtype %s, expected F32, F16 or BF16", nt->name,
                                  ls_dtype_name(nt->t.dtype));
            if (st == LS_OK)
                st = ls_model_check_shape(nt->name, l, &nt->t, kind == LS_MODEL_W13 ? want13 : want2,
                                          kind == LS_MODEL_W13 ? "[n, 2F, H]" : "[n, H, F]", err);
            if (st == LS_OK)
                st = ls_model_values(nt->name, l, &nt->t, kind == LS_MODEL_W13 ? &out->w13[l] : &out->w2[l], err);
            if (st == LS_OK) out->dtype = ls_model_widen(out->dtype, nt->t.dtype, l == 0 && kind == LS_MODEL_W13);
        }
    }
    free(idx);
    if (st != LS_OK) ls_model_free(out);
    return st;
}

/* Maps and parses path, then checks it (see model.h). On success out owns
 * fp32 copies of every layer (ls_model_free); the mapping is released
 * before returning. On failure out is zeroed. */
ls_status ls_model_load(const char *path, const ls_w13_layout *layout_override, ls_model *out, ls_error *err) {
    memset(out, 0, sizeof *out);
    ls_file_map map;
    ls_status st = ls_file_map_open(path, &map, LS_INVALID_REQUEST, err);
    if (st != LS_OK) return st;
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    st = ls_safetensors_parse(map.data, map.len, &set, err);
    if (st == LS_OK) st = ls_model_from_set(&set, layout_override, out, err);
    ls_tensor_set_free(&set);
    ls_file_map_close(&map);
    return st;
}

/* Uniform in [-scale, scale) from splitmix64 (a fixed integer recurrence,
 * so the demo model is the same on every machine and compiler): 24 random
 * bits make an exact float in [0, 1), and every later step is one
 * correctly rounded fp32 operation. */
static void ls_model_fill(float *v, size_t count, float scale, uint64_t *state) {
    for (size_t i = 0; i < count; i++) {
        float u = (float)(ls_splitmix64(state) >> 40) * (1.0f / 16777216.0f);
        v[i] = (2.0f * u - 1.0f) * scale;
    }
}

/* Builds the demo model (see model.h). Uniform weights with variance
 * 1/fan_in (bound sqrt(3/fan_in)) keep z = W13·x at the scale of x, and
 * W2 over all n*F inputs keeps y = O(1) whatever n. Draw order: layer by
 * layer, w13 then w2, row-major. On success out owns the weights. */
ls_status ls_model_demo(const ls_dims *dims, uint64_t seed, ls_dtype dtype, ls_model *out, ls_error *err) {
    memset(out, 0, sizeof *out);
    if (dims->n <= 0 || dims->H <= 0 || dims->F <= 0 || dims->L <= 0)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL,
                            "demo model: dimensions must be positive (n=%d H=%d F=%d L=%d)", dims->n, dims->H,
                            dims->F, dims->L);
    if (!ls_dtype_is_float(dtype))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "demo model: dtype %s is not F32, F16 or BF16",
                            ls_dtype_name(dtype));
    const size_t n = (size_t)dims->n, H = (size_t)dims->H, F = (size_t)dims->F;
    if (n * 2 * F > SIZE_MAX / sizeof(float) / H)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "demo model: dimensions too large");
    out->dims = *dims;
    out->dtype = dtype;
    if (!ls_model_alloc(out, dims->L)) {
        ls_model_free(out);
        return ls_error_set(err, LS_INTERNAL, NULL, "demo model: out of memory");
    }
    uint64_t state = seed;
    const float s13 = sqrtf(3.0f / (float)H), s2 = sqrtf(3.0f / (float)(n * F));
    for (int l = 0; l < dims->L; l++) {
        out->w13[l] = malloc(n * 2 * F * H * sizeof(float));
        out->w2[l] = malloc(n * H * F * sizeof(float));
        if (!out->w13[l] || !out->w2[l]) {
            ls_model_free(out);
            return ls_error_set(err, LS_INTERNAL, NULL, "demo model: out of memory for layer %d", l);
        }
        ls_model_fill(out->w13[l], n * 2 * F * H, s13, &state);
        ls_model_fill(out->w2[l], n * H * F, s2, &state);
        ls_round_to_dtype(dtype, out->w13[l], n * 2 * F * H);
        ls_round_to_dtype(dtype, out->w2[l], n * H * F);
    }
    return LS_OK;
}

/* Copies every layer into be (the model keeps its own copy). */
ls_status ls_model_upload(const ls_model *m, ls_backend *be, ls_error *err) {
    const ls_dims *a = &m->dims, *b = ls_backend_dims(be);
    if (a->n != b->n || a->H != b->H || a->F != b->F || a->L != b->L || a->w13_layout != b->w13_layout)
        return ls_error_set(err, LS_INTERNAL, NULL,
                            "model (n=%d H=%d F=%d L=%d %s) and backend (n=%d H=%d F=%d L=%d %s) disagree", a->n,
                            a->H, a->F, a->L, ls_w13_layout_name(a->w13_layout), b->n, b->H, b->F, b->L,
                            ls_w13_layout_name(b->w13_layout));
    for (int l = 0; l < a->L; l++) {
        ls_status st = ls_backend_upload_base(be, l, m->w13[l], m->w2[l], err);
        if (st != LS_OK) return st;
    }
    return LS_OK;
}
