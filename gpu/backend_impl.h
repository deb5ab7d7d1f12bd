/* What a backend implements, private to gpu/ and to test doubles that
 * stand in for a backend: the table behind the ls_backend_* functions and
 * the common part every backend shares. The wrappers in backend.c check
 * every argument first, so an implementation only ever sees valid slots,
 * layers, token counts and pointers, and layers whose weights it holds. */
#ifndef LS_GPU_BACKEND_IMPL_H
#define LS_GPU_BACKEND_IMPL_H

#include "gpu/backend.h"
#include "gpu/token_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;
    /* Frees the implementation's context (be->ctx, which may be half
     * initialised or NULL); backend.c frees the rest. */
    void (*free)(ls_backend *be);
    /* Called from any thread while other operations run: reads no state
     * of the backend that an operation writes. */
    ls_status (*memory)(ls_backend *be, size_t *free_bytes, size_t *total_bytes, ls_error *err);
    /* w->w13, w->w2 present and of a float dtype; w->gate present
     * exactly when dims.gate. */
    ls_status (*upload_base)(ls_backend *be, int layer, const ls_base_layer *w, ls_error *err);
    ls_status (*slot_write)(ls_backend *be, int slot, int layer, const ls_slot_factors *f, ls_error *err);
    ls_status (*slot_clear)(ls_backend *be, int slot, ls_error *err);
    ls_status (*slot_read)(ls_backend *be, int slot, int layer, float *gu_a, float *gu_b, float *d_a, float *d_b,
                           ls_error *err);
    /* The call's tokens grouped by slot (token_plan.h; plan->T >= 1,
     * every slot in -1..S-1); x, y non-NULL, in token order. */
    ls_status (*forward)(ls_backend *be, int layer, const float *x, const float *gammas, const ls_token_plan *plan,
                         float *y, ls_error *err);
    ls_status (*synchronize)(ls_backend *be, ls_error *err);
    /* Optional (NULL = never): true once the device context is lost. */
    bool (*poisoned)(const ls_backend *be);
    /* Optional (NULL = not known): the device's busy percent; any thread. */
    bool (*utilization)(const ls_backend *be, unsigned *percent);
} ls_backend_ops;

struct ls_backend {
    const ls_backend_ops *ops;
    void *ctx; /* the implementation's */
    ls_dims dims;
    ls_pool_dims pool;
    ls_dtype dtype;
    size_t pool_bytes;
    const char *isa;
    int threads;
    bool *uploaded; /* [L] whether the last upload_base succeeded */
    ls_token_plan plan; /* the forward's, rebuilt by every ls_backend_forward */
};

/* The checks every backend needs (positive dimensions, known layouts, a
 * float dtype, extents that fit an int with room to spare), then the
 * common part with cfg's dimensions and ctx NULL. who names the backend in
 * messages. On success *out is the caller's (ls_backend_free, which calls
 * ops->free first); on failure *out is NULL. */
ls_status ls_backend_new(const ls_backend_ops *ops, const ls_backend_config *cfg, ls_backend **out, ls_error *err);

/* The checks of ls_backend_forward (layer, T, buffers, uploaded weights,
 * slots), for a backend's own entry points that run a forward (out is
 * their output buffer). T == 0 passes: there is nothing to run. */
ls_status ls_backend_check_forward(const ls_backend *be, int layer, int T, const float *x, const int *slot_of_token,
                                   const void *out, ls_error *err);

#ifdef __cplusplus
}
#endif

#endif
