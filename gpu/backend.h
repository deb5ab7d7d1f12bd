/* The backend interface: a table of functions plus an opaque context, as
 * in ggml-backend. A backend owns the base weights and the LoRA pool
 * buffers in its memory and runs the forward of SPEC §1. It knows nothing
 * of adapter names or HTTP. Every function returns a status and fills err;
 * none exits. */
#ifndef LS_GPU_BACKEND_H
#define LS_GPU_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "common/dims.h"
#include "common/error.h"
#include "common/tensor.h"

/* One slot's normalised factors for one layer, fp32, R-padded (SPEC §2):
 * gu_a [O, 2R, H], gu_b [n, 2F, R], d_a [n, R, F], d_b [O, H, R].
 * Scaling is already folded into the B factors. */
typedef struct {
    const float *gu_a;
    const float *gu_b;
    const float *d_a;
    const float *d_b;
} ls_slot_factors;

typedef struct ls_backend ls_backend;

typedef struct {
    const char *name;
    /* Frees the context and every buffer. */
    void (*free)(ls_backend *be);
    /* Bytes free and total of the backend's memory. */
    ls_status (*memory)(ls_backend *be, size_t *free_bytes, size_t *total_bytes, ls_error *err);
    /* Copies one layer's base weights (fp32 host: w13 [n, 2F, H], w2 [n, H, F]);
     * the backend stores them at its dtype. */
    ls_status (*upload_base)(ls_backend *be, int layer, const float *w13, const float *w2, ls_error *err);
    /* Writes one layer of a slot and refreshes any derived operand. */
    ls_status (*slot_write)(ls_backend *be, int slot, int layer, const ls_slot_factors *f, ls_error *err);
    /* Zeroes every layer of a slot. */
    ls_status (*slot_clear)(ls_backend *be, int slot, ls_error *err);
    /* Reads one layer of a slot back into host buffers laid out like
     * ls_slot_factors (for tests and checksums). */
    ls_status (*slot_read)(ls_backend *be, int slot, int layer, float *gu_a, float *gu_b, float *d_a, float *d_b,
                           ls_error *err);
    /* y[T, H] = the shared sink on x[T, H] with gammas[T, n] (NULL = ones)
     * and slot_of_token[T] (NULL = all -1; -1 = base only). T <= max_tokens.
     * Calls are not concurrent: the caller serialises them. */
    ls_status (*forward)(ls_backend *be, int layer, int T, const float *x, const float *gammas,
                         const int *slot_of_token, float *y, ls_error *err);
    ls_status (*synchronize)(ls_backend *be, ls_error *err);
    /* Optional (NULL = never): true once an error has poisoned the device
     * context for good (illegal address, launch failure); /ready then
     * answers 503. */
    int (*poisoned)(ls_backend *be);
} ls_backend_ops;

struct ls_backend {
    const ls_backend_ops *ops;
    void *ctx;
    const char *isa;    /* the CPU backend's kernel path ("avx512", ...); NULL elsewhere */
    int threads;        /* the CPU backend's engine threads; 0 elsewhere */
    ls_dims dims;
    ls_pool_dims pool;
    ls_dtype dtype;     /* storage dtype of the base weights */
    size_t pool_bytes;  /* bytes of all pool buffers, all slots and layers */
};

/* The CPU backend's kernel paths (--cpu-isa). Every path gives the same
 * bits; AUTO takes the widest the CPU runs. */
typedef enum { LS_CPU_ISA_AUTO, LS_CPU_ISA_AVX512, LS_CPU_ISA_AVX2, LS_CPU_ISA_GENERIC } ls_cpu_isa;

/* "auto", "avx512", "avx2", "generic". */
const char *ls_cpu_isa_name(ls_cpu_isa isa);
/* True when this CPU (and OS) runs the path; AUTO and GENERIC always. */
bool ls_cpu_isa_supported(ls_cpu_isa isa);

typedef struct {
    ls_dims dims;
    ls_pool_dims pool;
    ls_dtype dtype;     /* base weight storage: the backends keep this dtype */
    int threads;        /* CPU engine threads; 0 = every CPU the process may run on */
    ls_cpu_isa cpu_isa; /* CPU kernel path */
    int device_id;      /* CUDA device ordinal */
} ls_backend_config;

/* Creates the CPU backend: allocates the pool buffers and scratch for
 * max_tokens tokens once and starts the engine's threads. A cpu_isa the
 * CPU does not run is LS_INVALID_REQUEST. On success *out is owned by the caller and
 * released with ls_backend_free. */
ls_status ls_backend_cpu_create(const ls_backend_config *cfg, ls_backend **out, ls_error *err);

/* Creates the CUDA backend; LS_DEVICE_ERROR when there is no device or
 * the build has no CUDA. */
ls_status ls_backend_cuda_create(const ls_backend_config *cfg, ls_backend **out, ls_error *err);
/* True when the build has CUDA and a device answers. */
int ls_backend_cuda_available(void);

static inline int ls_backend_poisoned(ls_backend *be) {
    return be && be->ops->poisoned ? be->ops->poisoned(be) : 0;
}

static inline void ls_backend_free(ls_backend *be) {
    if (be) be->ops->free(be);
}

#endif
