/* The CUDA backend's own kernels, seen from the host: input conversion,
 * the fused SwiGLU x gamma, the derived LoRA operands of a slot write, and
 * the segmented LoRA GEMM (SGMV) for batches with several adapters. Each
 * launcher returns cudaGetLastError() so callers can check it. */
#ifndef LS_GPU_CUDA_KERNELS_CUH
#define LS_GPU_CUDA_KERNELS_CUH

#include <cuda_runtime.h>
#include <stddef.h>

extern "C" {
#include "common/dims.h"
#include "common/tensor.h"
}

/* Token rows per SGMV tile; the host cuts each slot's run of tokens into
 * tasks of at most this many rows. */
#define LS_SGMV_BM 32

/* C[t, b*c_bs + j] (+)= sum_k X[t, b*x_bs + k] * W_slot[b*w_bs + j*ldw + k]
 * for every task (rows row0..row0+rows-1 of one slot), j < N, k < K and
 * batch b < batch (the experts of a per-expert stage; 1 otherwise). X is
 * the compute dtype or fp32, W the compute dtype, C fp32. */
typedef struct {
    const int4 *tasks; /* x: first row, y: rows (<= LS_SGMV_BM), z: slot */
    int ntasks;
    const void *X;
    ls_dtype xt;
    int ldx;
    long long x_bs;
    const void *W; /* slot 0's operand */
    ls_dtype wt;
    long long w_ss; /* elements between slots */
    int ldw;
    long long w_bs;
    float *C;
    int ldc;
    long long c_bs;
    int N, K, batch;
    /* atomic: K may be split over several blocks whose sums meet in C by
     * atomicAdd, so C must start zeroed (the shrinks); otherwise one block
     * owns each output and adds its sum to C (the expands, which add onto
     * the base result). */
    int atomic;
} ls_sgmv_params;

/* wmma: tensor-core kernel (needs a 16-bit W); otherwise fp32 FMA.
 * num_sms sizes the K split of atomic stages. */
cudaError_t ls_cuda_sgmv(const ls_sgmv_params *p, int wmma, int num_sms, cudaStream_t stream);

/* dst[i] = src[i] rounded to t (F32, BF16 or F16). */
cudaError_t ls_cuda_convert(const float *src, void *dst, ls_dtype t, long long count, cudaStream_t stream);

/* a[t, e*F + j] = gamma[t, e] * silu(g) * u, g and u read from z[t, e*2F + ...]
 * per the W13 layout; gam NULL = ones; a in dtype t. */
cudaError_t ls_cuda_swiglu(const float *z, const float *gam, void *a, ls_dtype t, int T, int n, int F,
                           ls_w13_layout layout, cudaStream_t stream);

/* The shared-expert gate: gam[t, e] = sigmoid(sum_h x[t, h] * w[h]) for
 * every expert e < n, t < T; x and w fp32, the sum in fp32. */
cudaError_t ls_cuda_gate(const float *x, const float *w, float *gam, int T, int H, int n, cudaStream_t stream);

/* The four derived operands of one slot and layer, in the compute dtype. */
typedef struct {
    int n, H, F, R, O;
    ls_w13_layout layout;
    /* canonical fp32 buffers (docs/math.md layout) */
    const float *gu_a, *gu_b, *d_a, *d_b;
    /* derived: agu [O*2R, H]; b13 [n*2F, 2R] in W13 row order, gate rows
     * holding Bg in columns 0..R-1 and zeros after, up rows zeros then Bu;
     * adcat [R, n*F] (Ad of every expert side by side); bdcat [H, O*R]. */
    void *agu, *b13, *adcat, *bdcat;
    ls_dtype t;
} ls_derive_params;

cudaError_t ls_cuda_derive(const ls_derive_params *p, cudaStream_t stream);

#endif
