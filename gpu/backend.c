/* The ls_backend_* functions every caller uses: the checks of every
 * argument (once, here, so every backend answers the same fault with the
 * same status), the facts fixed at create, and the common part of
 * creating a backend. Without CUDA compiled in (LS_HAVE_CUDA undefined)
 * the CUDA constructor reports that plainly, so --device cuda fails with
 * a message instead of a link error. */
#include <stdint.h>
#include <stdlib.h>

#include "gpu/backend_impl.h"
#include "gpu/cuda/cuda_backend.h"

ls_status ls_backend_new(const ls_backend_ops *ops, const ls_backend_config *cfg, ls_backend **out, ls_error *err) {
    *out = NULL;
    const ls_dims *d = &cfg->dims;
    const ls_pool_dims *p = &cfg->pool;
    const char *who = ops->name;
    if (d->n <= 0 || d->H <= 0 || d->F <= 0 || d->L <= 0)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s backend: dimensions must be positive (n=%d H=%d F=%d L=%d)",
                            who, d->n, d->H, d->F, d->L);
    if (p->slots < 0 || p->max_rank <= 0 || p->max_tokens <= 0)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL,
                            "%s backend: need slots >= 0, max_rank > 0, max_tokens > 0 (got %d, %d, %d)", who,
                            p->slots, p->max_rank, p->max_tokens);
    if (d->w13_layout != LS_W13_INTERLEAVED && d->w13_layout != LS_W13_CONTIGUOUS)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s backend: unknown W13 layout %d", who, (int)d->w13_layout);
    if (p->layout != LS_LORA_SHARED && p->layout != LS_LORA_PER_EXPERT)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s backend: unknown pool layout %d", who, (int)p->layout);
    if (!ls_dtype_is_float(cfg->dtype))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s backend: weight dtype %s is not F32, F16 or BF16", who,
                            ls_dtype_name(cfg->dtype));
    /* Row widths, K and leading dimensions are ints in the kernels and in
     * cuBLAS; keep a factor of 2 spare for padding. */
    const int64_t lim = INT32_MAX / 2, n = d->n, R = p->max_rank;
    if (n * 2 * (d->F + 16) > lim || n * 2 * R > lim || (int64_t)d->H * R > lim || (int64_t)d->H + 16 > lim ||
        p->slots > lim || p->max_tokens > lim)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s backend: n*2F, n*2R, H*R or a count is too large", who);
    ls_backend *be = calloc(1, sizeof *be);
    bool *uploaded = calloc((size_t)d->L, sizeof *uploaded);
    if (!be || !uploaded || !ls_token_plan_init(&be->plan, p->slots, p->max_tokens)) {
        if (be) ls_token_plan_free(&be->plan);
        free(be);
        free(uploaded);
        return ls_error_set(err, LS_DEVICE_ERROR, NULL, "%s backend: out of host memory", who);
    }
    be->ops = ops;
    be->dims = *d;
    be->pool = *p;
    be->dtype = cfg->dtype;
    be->uploaded = uploaded;
    *out = be;
    return LS_OK;
}

void ls_backend_free(ls_backend *be) {
    if (!be) return;
    be->ops->free(be);
    ls_token_plan_free(&be->plan);
    free(be->uploaded);
    free(be);
}

const char *ls_backend_name(const ls_backend *be) { return be->ops->name; }
const ls_dims *ls_backend_dims(const ls_backend *be) { return &be->dims; }
const ls_pool_dims *ls_backend_pool_dims(const ls_backend *be) { return &be->pool; }
ls_dtype ls_backend_dtype(const ls_backend *be) { return be->dtype; }
size_t ls_backend_pool_bytes(const ls_backend *be) { return be->pool_bytes; }
const char *ls_backend_isa(const ls_backend *be) { return be->isa; }
int ls_backend_threads(const ls_backend *be) { return be->threads; }

bool ls_backend_usable(const ls_backend *be) { return !(be->ops->poisoned && be->ops->poisoned(be)); }

/* ---- operations: arguments checked, then the backend's own ------------- */

static ls_status ls_backend_check_layer(const ls_backend *be, const char *what, int layer, ls_error *err) {
    if (layer < 0 || layer >= be->dims.L)
        return ls_error_set(err, LS_INTERNAL, NULL, "%s backend: %s of layer %d, expected 0 to %d", be->ops->name,
                            what, layer, be->dims.L - 1);
    return LS_OK;
}

static ls_status ls_backend_check_slot(const ls_backend *be, const char *what, int slot, ls_error *err) {
    if (slot < 0 || slot >= be->pool.slots)
        return ls_error_set(err, LS_INTERNAL, NULL, "%s backend: %s of slot %d, expected 0 to %d", be->ops->name, what,
                            slot, be->pool.slots - 1);
    return LS_OK;
}

bool ls_backend_utilization(const ls_backend *be, unsigned *percent) {
    return be->ops->utilization && be->ops->utilization(be, percent);
}

ls_status ls_backend_memory(ls_backend *be, size_t *free_bytes, size_t *total_bytes, ls_error *err) {
    return be->ops->memory(be, free_bytes, total_bytes, err);
}

static bool ls_backend_typed_ok(const ls_typed *t) { return t->data && ls_dtype_is_float(t->dtype); }

ls_status ls_backend_upload_base(ls_backend *be, int layer, const ls_base_layer *w, ls_error *err) {
    ls_status st = ls_backend_check_layer(be, "upload_base", layer, err);
    if (st != LS_OK) return st;
    if (!w || !ls_backend_typed_ok(&w->w13) || !ls_backend_typed_ok(&w->w2))
        return ls_error_set(err, LS_INTERNAL, NULL, "%s backend: upload_base of layer %d without F32/F16/BF16 weights",
                            be->ops->name, layer);
    if (be->dims.gate ? !ls_backend_typed_ok(&w->gate) : w->gate.data != NULL)
        return ls_error_set(err, LS_INTERNAL, NULL, "%s backend: upload_base of layer %d %s a gate, the model %s one",
                            be->ops->name, layer, w->gate.data ? "with" : "without",
                            be->dims.gate ? "has" : "has none");
    /* A backend's upload that fails may have written part of the layer:
     * its forwards are refused until an upload succeeds. */
    st = be->ops->upload_base(be, layer, w, err);
    be->uploaded[layer] = st == LS_OK;
    return st;
}

ls_status ls_backend_slot_write(ls_backend *be, int slot, int layer, const ls_slot_factors *f, ls_error *err) {
    ls_status st = ls_backend_check_slot(be, "slot_write", slot, err);
    if (st == LS_OK) st = ls_backend_check_layer(be, "slot_write", layer, err);
    if (st != LS_OK) return st;
    if (!f || !f->gu_a || !f->gu_b || !f->d_a || !f->d_b)
        return ls_error_set(err, LS_INTERNAL, NULL, "%s backend: slot_write of slot %d layer %d without factors",
                            be->ops->name, slot, layer);
    if (f->gate_d && (!be->dims.gate || be->pool.no_gate_lora))
        return ls_error_set(err, LS_INTERNAL, NULL,
                            "%s backend: slot_write of slot %d layer %d with a gate delta it does not apply",
                            be->ops->name, slot, layer);
    return be->ops->slot_write(be, slot, layer, f, err);
}

ls_status ls_backend_slot_clear(ls_backend *be, int slot, ls_error *err) {
    ls_status st = ls_backend_check_slot(be, "slot_clear", slot, err);
    return st != LS_OK ? st : be->ops->slot_clear(be, slot, err);
}

ls_status ls_backend_slot_read(ls_backend *be, int slot, int layer, float *gu_a, float *gu_b, float *d_a, float *d_b,
                               ls_error *err) {
    ls_status st = ls_backend_check_slot(be, "slot_read", slot, err);
    if (st == LS_OK) st = ls_backend_check_layer(be, "slot_read", layer, err);
    return st != LS_OK ? st : be->ops->slot_read(be, slot, layer, gu_a, gu_b, d_a, d_b, err);
}

ls_status ls_backend_check_forward(const ls_backend *be, int layer, int T, const float *x, const int *slot_of_token,
                                   const void *out, ls_error *err) {
    ls_status st = ls_backend_check_layer(be, "forward", layer, err);
    if (st != LS_OK) return st;
    if (T < 0 || T > be->pool.max_tokens)
        return ls_error_set(err, LS_INTERNAL, NULL, "%s backend: forward of %d tokens, expected 0 to %d",
                            be->ops->name, T, be->pool.max_tokens);
    if (T == 0) return LS_OK;
    if (!x || !out) return ls_error_set(err, LS_INTERNAL, NULL, "%s backend: forward without x or y", be->ops->name);
    if (!be->uploaded[layer])
        return ls_error_set(err, LS_INTERNAL, NULL, "%s backend: forward on layer %d, whose base weights were not "
                                                    "uploaded (never, or the last upload failed)",
                            be->ops->name, layer);
    for (int t = 0; slot_of_token && t < T; t++)
        if (slot_of_token[t] < -1 || slot_of_token[t] >= be->pool.slots)
            return ls_error_set(err, LS_INTERNAL, NULL, "%s backend: token %d names slot %d, expected -1 to %d",
                                be->ops->name, t, slot_of_token[t], be->pool.slots - 1);
    return LS_OK;
}

/* Checks everything first so a rejected call writes nothing into y, then
 * groups the tokens once for whichever backend runs them. */
ls_status ls_backend_forward(ls_backend *be, int layer, int T, const float *x, const float *gammas,
                             const int *slot_of_token, float *y, ls_error *err) {
    ls_status st = ls_backend_check_forward(be, layer, T, x, slot_of_token, y, err);
    if (st != LS_OK || T == 0) return st;
    ls_token_plan_build(&be->plan, T, slot_of_token);
    return be->ops->forward(be, layer, x, gammas, &be->plan, y, err);
}

ls_status ls_backend_synchronize(ls_backend *be, ls_error *err) { return be->ops->synchronize(be, err); }

#ifndef LS_HAVE_CUDA

/* Always fails: *out stays NULL and err says how to get a CUDA build. */
ls_status ls_backend_cuda_create(const ls_backend_config *cfg, const ls_cuda_settings *cuda, ls_backend **out,
                                 ls_error *err) {
    (void)cfg, (void)cuda;
    *out = NULL;
    return ls_error_set(err, LS_DEVICE_ERROR, NULL,
                        "this build has no CUDA backend (rebuild with nvcc and -DLORASINK_CUDA=ON)");
}

int ls_backend_cuda_available(void) { return 0; }

#endif
