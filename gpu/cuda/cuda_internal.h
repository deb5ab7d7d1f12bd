/* The CUDA backend's private state, shared by cuda_backend.cu (create,
 * free, weights and slot writes) and cuda_forward.cu (the forward and its
 * timing). Every buffer is allocated once at create. */
#ifndef LS_GPU_CUDA_CUDA_INTERNAL_H
#define LS_GPU_CUDA_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "gpu/backend_impl.h"
#include "gpu/cuda/check.h"
#include "gpu/cuda/cuda_backend.h"
#include "gpu/cuda/kernels.cuh"
#include "gpu/graph_cache.h"
#include "gpu/lora_plan.h"
#include "gpu/nvml.h"

#define LS_CUDA_MAX_PARTS 20

typedef struct {
    int device;
    int num_sms;
    char device_name[256];
    ls_nvml *nvml; /* NULL where NVML is not there: no utilisation figure */
    cudaStream_t stream;
    cublasHandle_t blas;
    /* The LoRA shrinks run on a side stream beside the base GEMM they do
     * not touch (forked and joined by events; its own cuBLAS handle and
     * workspace, which keeps cuBLAS's results reproducible). */
    cudaStream_t side;
    cublasHandle_t blas_side;
    cudaEvent_t ev_fork, ev_join;
    cudaEvent_t ev_start, ev_stop;
    ls_cuda_sgmv_mode sgmv_mode;

    ls_dims dims;      /* as created */
    ls_pool_dims pool;
    int n, H, F, L, S, R, O, max_tokens;
    ls_dtype dt;            /* compute and storage dtype of weights and activations */
    cudaDataType_t cdt;     /* the same for cuBLAS */
    cublasComputeType_t ct; /* fp32 accumulation; pedantic for f32 (no TF32) */
    size_t esz;

    /* The forward's GEMMs and the layouts they read (gpu/lora_plan.h). */
    ls_gemm_plan gplan;
    /* Forward shapes replayed as CUDA graphs (their cudaGraphExec_t). */
    ls_graph_cache graphs;
    /* Elements of one slot and layer: canonical fp32 (docs/math.md order, the
     * four buffers back to back, kept on the host for slot_read) and
     * derived (compute dtype, on the device, each part padded to 8
     * elements so 16-byte loads stay aligned). */
    ls_factor_layout canon; /* common/dims.h at the pool's O and R */
    size_t der_len, der_agu, der_b13, der_ad, der_bd; /* der_*: offsets */
    int *rank; /* [S][L] each slot and layer's rank (gpu/slot_rank.h), host */
    unsigned char *gflag; /* [S][L] the slot has a gate delta at the layer (gate_lora), host */

    /* Device memory, allocated at create; d_parts owns it. */
    void *d_parts[LS_CUDA_MAX_PARTS];
    int n_parts;
    size_t device_bytes;
    void *d_w13;     /* [L][2nF, H] rows gate-first ([2][n][F], gpu/lora_plan.h) */
    void *d_w2;      /* [L][H, n*F]: W2cat[h, e*F + j] = W2[e, h, j] */
    int gated;       /* the model has a shared-expert gate (dims.gate) */
    float *d_gate;   /* [L][H] its weights in fp32 (absent without) */
    int gate_lora;   /* gated, and slots may carry a gate delta (ls_cuda_settings.gate_lora) */
    float *d_gdelta; /* [S][L][H] each slot's gate delta, fp32 (gate_lora only) */
    int *d_gsel;     /* [T] the slot whose gate delta a row adds, -1 none (gate_lora only) */
    void *d_der;     /* [S][L][der_len] derived operands */
    float *d_x32;    /* [T, H] fp32 inputs in plan order, for the gate (absent when neither gated nor f32) */
    void *d_xc;      /* [T, H] inputs in the compute dtype, rounded on the host (= d_x32 for f32) */
    float *d_gam;    /* [T, n] */
    float *d_z;      /* [T, 2nF] gate/up sums, [2][n][F] per row */
    void *d_a;       /* [T, n*F] activations, compute dtype */
    float *d_v32;    /* [T, O*2R] gate/up shrink (SGMV) */
    void *d_vc;      /* [T, O*2R] the same for cuBLAS, compute dtype */
    float *d_w32;    /* [T, O*R] down shrink (SGMV) */
    void *d_wc;      /* [T, O*R] */
    float *d_y;      /* [T, H] */
    int4 *d_tasks;   /* SGMV tasks */
    float *d_part;   /* the SGMV K split's scratch (kernels.cuh) */
    void *d_blas_ws; /* cuBLAS workspace */
    void *d_blas_ws_side;
    size_t blas_ws_bytes, blas_ws_side_bytes;

    /* Host memory. */
    float *h_canon;   /* [S][L][canon.total] what slot_write received (malloc) */
    float *h_der32;   /* [der_len] one slot write's derived operands in fp32 (malloc) */
    /* Pinned host staging. */
    float *h_io;      /* [max_tokens, H]: fp32 x in (f32, or for the gate), then y out */
    void *h_xc;       /* [max_tokens, H]: x in the compute dtype (= h_io for f32) */
    float *h_gam;     /* [max_tokens, n] */
    int4 *h_tasks;    /* [max_tasks] */
    int *h_gsel;      /* [max_tokens] d_gsel's staging (gate_lora) */
    void *h_der;      /* [der_len] one slot write's derived operands, compute dtype */
    void *h_chunk[2]; /* base weight upload: two chunks, one filled while the other copies */
    cudaEvent_t chunk_done[2];
    size_t chunk_bytes;
    int max_tasks;
} ls_cuda;

/* One forward's token plan (gpu/token_plan.h: positions 0..n_lora-1 hold
 * the tokens with an adapter, slot by slot; the base-only tokens follow),
 * the facts the stages read from it, and its SGMV tasks (in h_tasks). */
typedef struct {
    const ls_token_plan *tokens;
    int T;
    int n_lora;
    int n_slots;     /* distinct slots among the tokens */
    int single_slot; /* the slot when n_slots == 1 */
    int layer;
    int lora;        /* whether the LoRA GEMMs run (a single slot of rank 0: no) */
    int rank;        /* the single slot's rank */
    int ntasks;
    int has_gammas;
} ls_cuda_plan;

static inline ls_cuda *ls_cuda_of(const ls_backend *be) { return (ls_cuda *)be->ctx; }

/* cuBLAS's name for a float dtype. */
static inline cudaDataType_t ls_cuda_type(ls_dtype t) {
    return t == LS_DTYPE_BF16 ? CUDA_R_16BF : t == LS_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* Derived operands of one slot and layer (compute dtype, device). */
static inline char *ls_cuda_der(const ls_cuda *c, int slot, int layer) {
    return (char *)c->d_der + ((size_t)slot * c->L + layer) * c->der_len * c->esz;
}
static inline float *ls_cuda_canon(const ls_cuda *c, int slot, int layer) {
    return c->h_canon + ((size_t)slot * c->L + layer) * c->canon.total;
}

/* After a failed step whose copies may still read pinned staging: waits
 * for the stream (ignoring what it says) so the next call may reuse it. */
void ls_cuda_drain(ls_cuda *c);

/* Refuses once the context is poisoned, else selects the device (the
 * calling thread may not have used it yet). Calls never overlap: the
 * backend's caller serialises them (gpu/backend.h). */
ls_status ls_cuda_op_begin(ls_cuda *c, ls_error *err);

ls_status ls_cuda_forward(ls_backend *be, int layer, const float *x, const float *gammas, const ls_token_plan *plan,
                          float *y, ls_error *err);

#endif
