/* The CUDA backend's own kernels, seen from the host: the fused SwiGLU
 * x gamma, the shared-expert gate, and the segmented LoRA GEMM (SGMV,
 * and the BGMV shrink) for batches with several adapters. Each launcher returns
 * cudaGetLastError() so callers can check it. */
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
/* Output columns per SGMV tile (grid.y counts them). */
#define LS_SGMV_TILE_N 64

/* The K split of the shrinks is fixed-order: each split block writes its
 * partial sums to a scratch buffer and one reduction adds them in split
 * order, so a repeated identical batch gives identical bits. Splitting is
 * for few rows (a long K over a handful of tokens), so the scratch is
 * LS_SGMV_SPLIT_MAX x LS_SGMV_SPLIT_ROWS rows of the widest C. */
#define LS_SGMV_SPLIT_MAX 16
#define LS_SGMV_SPLIT_ROWS 256

/* C[t, b*c_bs + j] (= or +=) sum_k X[t, b*x_bs + k] * W_slot[b*w_bs + j*ldw + k]
 * for every task (rows row0..row0+rows-1 of one slot, of rank `rank`),
 * j < N, k < K and batch b < batch; with cut N (K) the task's rank
 * replaces N (K), and outputs j in [rank, N) are written as 0. X is the
 * compute dtype or fp32, W the compute dtype, C fp32. */
typedef struct {
    const int4 *tasks; /* x: first row, y: rows (<= LS_SGMV_BM), z: slot, w: rank */
    int ntasks;
    int nrows; /* rows the tasks cover (0..nrows-1), for the split's scratch */
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
    int cut;   /* 0 none, 1 N, 2 K (ls_op_cut) */
    int beta;  /* 0: C is written, 1: added to */
    int split; /* K may be split (needs beta 0 and C rows batch*c_bs = ldc wide, c_bs = N) */
    float *part; /* the split's scratch, LS_SGMV_SPLIT_MAX * LS_SGMV_SPLIT_ROWS * ldc floats */
} ls_sgmv_params;

/* wmma: tensor-core kernel (needs a 16-bit W); otherwise fp32 FMA.
 * num_sms sizes the K split. */
cudaError_t ls_cuda_sgmv(const ls_sgmv_params *p, int wmma, int num_sms, cudaStream_t stream);

/* The same product for the shrinks of batches with few rows per slot
 * (gpu/cuda/bgmv.cu): one block per task, batch and 4 outputs, the K
 * range split over its warps and summed in a fixed order. X and W of one
 * dtype; split and part are not used. */
cudaError_t ls_cuda_bgmv(const ls_sgmv_params *p, cudaStream_t stream);

/* cudaSuccess when this binary holds code the current device can run
 * (its SASS, or PTX it can compile); else the error that says why. */
cudaError_t ls_cuda_kernels_loadable(void);

/* a[t, e*F + j] = gamma[t, e] * silu(g) * u with g = z[t, e*F + j] and
 * u = z[t, n*F + e*F + j] (z in the device's [2][n][F] order,
 * gpu/lora_plan.h); gam NULL = ones; a in dtype t. */
cudaError_t ls_cuda_swiglu(const float *z, const float *gam, void *a, ls_dtype t, int T, int n, int F,
                           cudaStream_t stream);

/* The shared-expert gate: gam[t, e] = sigmoid(sum_h x[t, h] * w[h]) for
 * every expert e < n, t < T; x and w fp32, the sum in fp32. With gsel
 * (NULL: none), a row t with gsel[t] >= 0 sums x . (w + dw) instead, dw
 * the H floats at gd + gsel[t] * gstride. */
cudaError_t ls_cuda_gate(const float *x, const float *w, const int *gsel, const float *gd, long long gstride,
                         float *gam, int T, int H, int n, cudaStream_t stream);

#endif
