/* The BGMV shrink: the LoRA shrinks (a long K, a narrow N cut to each
 * slot's rank) for batches with few tokens per slot, where a tile kernel
 * spends its time waiting on one load after another. Each block of 8
 * warps computes BG_JG outputs of one task and batch; the warps split K
 * in 8 contiguous ranges and every lane issues the 16-byte loads of a
 * run of every row of W and X before it multiplies. The sums meet in a fixed order (a butterfly inside the
 * warp, then the warps in order), so there is no split-K scratch, no
 * second launch, and a repeated batch gives the same bits. */
#include "gpu/cuda/dtype.cuh"
#include "gpu/cuda/kernels.cuh"

#include <stdint.h>

#define BG_WARPS 8
#define BG_JG 4 /* outputs j per block */
#define BG_MR 8 /* token rows per pass over K */

/* V = 16 / sizeof(T) consecutive values from src as fp32, zeros past
 * valid, one element load each. */
template <typename T> __device__ __forceinline__ void load_run(float *out, const T *src, int valid) {
    constexpr int V = 16 / sizeof(T);
#pragma unroll
    for (int i = 0; i < V; i++) out[i] = i < valid ? to_f(src[i]) : 0.0f;
}

/* The sum over the warp's lanes, in every lane; the same order each run. */
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* acc[j][r] += the products of one run (V values from k) of X's row r
 * and W's row j, for j < jn and r < rn (both the same in the whole
 * block, so the branches do not diverge); the rest stay 0, even where X
 * holds an inf. Whole, aligned runs: every load is issued before the
 * first product, so a lane has jn + rn loads of 16 bytes in flight. */
template <typename T>
__device__ __forceinline__ void bgmv_run_vec(float (&acc)[BG_JG][BG_MR], const T *__restrict__ X, int ldx,
                                             const T *__restrict__ W, int ldw, int jn, int rn, int k) {
    constexpr int V = 16 / sizeof(T);
    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4 wr[BG_JG], xr[BG_MR];
#pragma unroll
    for (int j = 0; j < BG_JG; j++) wr[j] = j < jn ? *reinterpret_cast<const uint4 *>(W + (long long)j * ldw + k) : zero;
#pragma unroll
    for (int r = 0; r < BG_MR; r++) xr[r] = r < rn ? *reinterpret_cast<const uint4 *>(X + (long long)r * ldx + k) : zero;
#pragma unroll
    for (int r = 0; r < BG_MR; r++) {
        if (r >= rn) continue;
        float xv[V];
        unpack16<T>(xr[r], xv);
#pragma unroll
        for (int j = 0; j < BG_JG; j++) {
            if (j >= jn) continue;
            float wv[V];
            unpack16<T>(wr[j], wv);
#pragma unroll
            for (int i = 0; i < V; i++) acc[j][r] = fmaf(xv[i], wv[i], acc[j][r]);
        }
    }
}

/* The same for a run that is unaligned or cut short by the warp's K
 * range (valid values from k): element loads. */
template <typename T>
__device__ __forceinline__ void bgmv_run_any(float (&acc)[BG_JG][BG_MR], const T *__restrict__ X, int ldx,
                                             const T *__restrict__ W, int ldw, int jn, int rn, int k, int valid) {
    constexpr int V = 16 / sizeof(T);
#pragma unroll
    for (int r = 0; r < BG_MR; r++) {
        if (r >= rn) continue;
        float xv[V];
        load_run<T>(xv, X + (long long)r * ldx + k, valid);
#pragma unroll
        for (int j = 0; j < BG_JG; j++) {
            if (j >= jn) continue;
            float wv[V];
            load_run<T>(wv, W + (long long)j * ldw + k, valid);
#pragma unroll
            for (int i = 0; i < V; i++) acc[j][r] = fmaf(xv[i], wv[i], acc[j][r]);
        }
    }
}

/* acc[j][r] += sum over this warp's K range [kb, ke) of X[r, k] * W[j, k],
 * the lane taking every 32nd run. Not unrolled: a run's loads are in
 * flight together already, and the registers then allow two blocks per
 * SM. */
template <typename T>
__device__ __forceinline__ void bgmv_pass(float (&acc)[BG_JG][BG_MR], const T *X, int ldx, const T *W, int ldw,
                                          int jn, int rn, int kb, int ke, int vec) {
    constexpr int V = 16 / sizeof(T);
    const int lane = threadIdx.x % 32;
#pragma unroll 1
    for (int k = kb + lane * V; k < ke; k += 32 * V) {
        const int valid = min(V, ke - k);
        if (vec && valid == V)
            bgmv_run_vec<T>(acc, X, ldx, W, ldw, jn, rn, k);
        else
            bgmv_run_any<T>(acc, X, ldx, W, ldw, jn, rn, k, valid);
    }
}

/* One block: task blockIdx.x / njg (its rows, slot and rank), outputs
 * j0 .. j0 + BG_JG - 1 with j0 = (blockIdx.x % njg) * BG_JG, batch
 * blockIdx.y. Outputs at or past the cut N are written as 0 (beta 0). */
template <typename T> __global__ void __launch_bounds__(BG_WARPS * 32, 2) bgmv_kernel(ls_sgmv_params p, int njg, int vec) {
    constexpr int V = 16 / sizeof(T);
    __shared__ float red[BG_WARPS][BG_JG][BG_MR];
    const int4 task = p.tasks[blockIdx.x / njg];
    const int j0 = (int)(blockIdx.x % njg) * BG_JG, b = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int nlim = p.cut == 1 ? min(p.N, task.w) : p.N;
    const int K = p.cut == 2 ? min(p.K, task.w) : p.K;
    const int jn = max(0, min(BG_JG, nlim - j0));
    /* Each warp's K range starts on a whole run. */
    const int per = ((K + BG_WARPS - 1) / BG_WARPS + V - 1) / V * V;
    const int kb = min(K, warp * per), ke = jn > 0 ? min(K, kb + per) : kb;
    const T *X = (const T *)p.X + (long long)task.x * p.ldx + b * p.x_bs;
    const T *W = (const T *)p.W + task.z * p.w_ss + b * p.w_bs + (long long)j0 * p.ldw;

    for (int r0 = 0; r0 < task.y; r0 += BG_MR) {
        const int rn = min(BG_MR, task.y - r0);
        float acc[BG_JG][BG_MR];
#pragma unroll
        for (int j = 0; j < BG_JG; j++)
#pragma unroll
            for (int r = 0; r < BG_MR; r++) acc[j][r] = 0.0f;
        bgmv_pass<T>(acc, X + (long long)r0 * p.ldx, p.ldx, W, p.ldw, jn, rn, kb, ke, vec);
        /* Only the sums with data: jn and rn are the same in every lane. */
#pragma unroll
        for (int j = 0; j < BG_JG; j++)
#pragma unroll
            for (int r = 0; r < BG_MR; r++) {
                const float s = j < jn && r < rn ? warp_sum(acc[j][r]) : 0.0f;
                if (lane == 0) red[warp][j][r] = s;
            }
        __syncthreads();
        if (threadIdx.x < BG_JG * BG_MR) {
            const int j = threadIdx.x / BG_MR, r = threadIdx.x % BG_MR;
            if (r < rn && j0 + j < p.N) {
                float s = 0.0f;
#pragma unroll
                for (int w = 0; w < BG_WARPS; w++) s += red[w][j][r];
                float *c = p.C + (long long)(task.x + r0 + r) * p.ldc + b * p.c_bs + j0 + j;
                *c = p.beta ? *c + s : s;
            }
        }
        __syncthreads(); /* red is rewritten by the next pass */
    }
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

template <typename T> static void bgmv_launch(const ls_sgmv_params *p, dim3 grid, int njg, cudaStream_t stream) {
    const long long V = 16 / sizeof(T);
    const int vec = aligned16(p->X) && aligned16(p->W) && p->ldx % V == 0 && p->x_bs % V == 0 && p->ldw % V == 0 &&
                    p->w_bs % V == 0 && p->w_ss % V == 0;
    bgmv_kernel<T><<<grid, BG_WARPS * 32, 0, stream>>>(*p, njg, vec);
}

cudaError_t ls_cuda_bgmv(const ls_sgmv_params *p, cudaStream_t stream) {
    if (p->ntasks <= 0 || p->N <= 0 || p->batch <= 0) return cudaSuccess;
    if (p->xt != p->wt) return cudaErrorInvalidValue;
    const int njg = (p->N + BG_JG - 1) / BG_JG;
    const long long blocks = (long long)p->ntasks * njg;
    if (blocks > 0x7fffffffLL || p->batch > 65535) return cudaErrorInvalidConfiguration;
    const dim3 grid((unsigned)blocks, (unsigned)p->batch);
    switch (p->wt) {
    case LS_DTYPE_BF16: bgmv_launch<__nv_bfloat16>(p, grid, njg, stream); break;
    case LS_DTYPE_F16: bgmv_launch<__half>(p, grid, njg, stream); break;
    case LS_DTYPE_F32: bgmv_launch<float>(p, grid, njg, stream); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
