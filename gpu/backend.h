/* The backend interface: what every backend (cpu, cuda) offers the rest of
 * the server, as ls_backend_* functions over an opaque handle (the table
 * behind them is private to gpu/, in backend_impl.h, as in ggml-backend).
 * A backend owns the base weights and the LoRA pool buffers in its memory
 * and runs the forward of the shared sink. It knows nothing of adapter
 * names or HTTP.
 *
 * Thread safety, one rule: the operations (memory, upload_base,
 * slot_write, slot_clear, slot_read, forward, synchronize) must not
 * overlap on one backend; the caller serialises them (lora/pool holds one
 * lock around every backend call). The facts fixed at create (name, dims,
 * dtype, pool bytes, kernel path, threads) and ls_backend_usable may be
 * read from any thread at any time.
 *
 * Statuses, the same in every backend: LS_INTERNAL for arguments out of
 * range (a caller's bug; checked once, in backend.c, before any backend
 * sees them), LS_DEVICE_ERROR when the device fails or its memory (host
 * memory, for the CPU) runs out; ls_backend_usable then says whether the
 * backend can still serve. Every function returns a status and fills err;
 * none exits. */
#ifndef LS_GPU_BACKEND_H
#define LS_GPU_BACKEND_H

/* The common headers carry no linkage of their own: C++ users (the CUDA
 * backend) see them through this block too. */
#ifdef __cplusplus
extern "C" {
#endif

#include <stdbool.h>
#include <stddef.h>

#include "common/dims.h"
#include "common/error.h"
#include "common/tensor.h"

/* One slot's normalised factors for one layer, fp32, R-padded:
 * gu_a [O, 2R, H], gu_b [n, 2F, R], d_a [n, R, F], d_b [O, H, R].
 * Scaling is already folded into the B factors. gate_d [H] is the delta
 * s * B * A of the shared-expert gate's weight (docs/math.md), NULL when
 * the adapter has none; only on a gated model whose backend applies it
 * (pool dims' no_gate_lora false). */
typedef struct {
    const float *gu_a;
    const float *gu_b;
    const float *d_a;
    const float *d_b;
    const float *gate_d;
} ls_slot_factors;

/* One tensor as the model holds it: values of a float dtype (F32, F16 or
 * BF16), little-endian, row-major. data NULL: absent. */
typedef struct {
    ls_dtype dtype;
    const void *data;
} ls_typed;

static inline ls_typed ls_typed_f32(const float *v) {
    ls_typed t = {LS_DTYPE_F32, v};
    return t;
}

/* One layer's base weights at their storage dtypes (each its own): w13
 * [n, 2F, H] with its rows in dims.w13_layout, w2 [n, H, F], and gate
 * [H], the shared-expert gate's weight, present exactly when dims.gate. */
typedef struct {
    ls_typed w13, w2, gate;
} ls_base_layer;

/* An fp32 layer without a gate (tests and benchmarks build these). */
static inline ls_base_layer ls_base_layer_f32(const float *w13, const float *w2) {
    ls_base_layer b = {ls_typed_f32(w13), ls_typed_f32(w2), {LS_DTYPE_F32, NULL}};
    return b;
}

typedef struct ls_backend ls_backend;

/* What every backend is made for. Each backend's own settings and its
 * constructor are in its own header: gpu/cpu/cpu_backend.h
 * (ls_backend_cpu_create), gpu/cuda/cuda_backend.h
 * (ls_backend_cuda_create). */
typedef struct {
    ls_dims dims;
    ls_pool_dims pool;
    ls_dtype dtype; /* base weight storage: the backends keep this dtype */
} ls_backend_config;

/* Frees the backend and every buffer. NULL is a no-op. */
void ls_backend_free(ls_backend *be);

/* ---- facts fixed at create (any thread, any time) ---------------------- */

const char *ls_backend_name(const ls_backend *be); /* "cpu", "cuda" */
const ls_dims *ls_backend_dims(const ls_backend *be);
const ls_pool_dims *ls_backend_pool_dims(const ls_backend *be);
ls_dtype ls_backend_dtype(const ls_backend *be); /* storage dtype of the base weights */
/* The pool's bytes, all slots and layers, in the memory the forward reads
 * adapters from (host memory for the CPU engine, device memory for CUDA):
 * every copy kept there, in each form the forward reads. */
size_t ls_backend_pool_bytes(const ls_backend *be);
const char *ls_backend_isa(const ls_backend *be);   /* the kernel path it chose (the CPU's); NULL when none */
int ls_backend_threads(const ls_backend *be);       /* host threads of its engine (the CPU's); 0 when none */

/* False once an error has poisoned the device context for good (illegal
 * address, launch failure): every operation fails from then on and
 * /ready answers 503. Any thread, any time. */
bool ls_backend_usable(const ls_backend *be);

/* The percent of the last sample period in which the device ran a
 * kernel (CUDA, through NVML); false where the backend cannot say (the
 * CPU, a CUDA device without NVML). Any thread, any time. */
bool ls_backend_utilization(const ls_backend *be, unsigned *percent);

/* Bytes free and total of the backend's memory (the whole device's, or
 * the host's). Any thread, any time: it asks the driver or the kernel
 * and touches no state of the backend, so /metrics calls it while a
 * forward runs. */
ls_status ls_backend_memory(ls_backend *be, size_t *free_bytes, size_t *total_bytes, ls_error *err);

/* ---- operations (one at a time per backend) ------------------------------- */

/* Copies one layer's base weights (typed host tensors, see ls_base_layer;
 * the caller keeps them); the backend stores w13 and w2 at its dtype
 * (converting: exact when it is at least as wide) and the gate in fp32.
 * When the backend's upload fails, the layer may be half written and
 * counts as not uploaded. */
ls_status ls_backend_upload_base(ls_backend *be, int layer, const ls_base_layer *w, ls_error *err);
/* Writes one layer of a slot and refreshes any operand derived from it. */
ls_status ls_backend_slot_write(ls_backend *be, int slot, int layer, const ls_slot_factors *f, ls_error *err);
/* Zeroes every layer of a slot. */
ls_status ls_backend_slot_clear(ls_backend *be, int slot, ls_error *err);
/* Reads one layer of a slot back into host buffers laid out like
 * ls_slot_factors; a NULL buffer is skipped. */
ls_status ls_backend_slot_read(ls_backend *be, int slot, int layer, float *gu_a, float *gu_b, float *d_a, float *d_b,
                               ls_error *err);
/* y[T, H] = the shared sink on x[T, H] with gammas[T, n] (NULL: the
 * layer's gate sigmoid(w . x) for every expert when dims.gate, else ones)
 * and slot_of_token[T] (NULL = all -1; -1 = base only), T <= max_tokens.
 * The layer's base weights must have been uploaded. */
ls_status ls_backend_forward(ls_backend *be, int layer, int T, const float *x, const float *gammas,
                             const int *slot_of_token, float *y, ls_error *err);
/* Returns when every earlier operation has finished. */
ls_status ls_backend_synchronize(ls_backend *be, ls_error *err);

#ifdef __cplusplus
}
#endif

#endif
