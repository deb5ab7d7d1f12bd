/* The CUDA backend's kernels and their launchers: SwiGLU x gamma on the
 * device's gate-first z, the shared-expert gate, and the segmented LoRA
 * GEMM (SGMV) in two variants, tensor cores
 * through WMMA for bf16/f16 weights and fp32 FMA for every dtype, with
 * its fixed-order K-split reduction. */
#include "gpu/cuda/kernels.cuh"
#include "gpu/cuda/dtype.cuh"

#include <mma.h>
#include <stdint.h>

#include <type_traits>

/* Grid-stride launches: enough blocks to fill the device, never more than
 * the work needs. */
static unsigned grid_for(long long count, int threads) {
    long long blocks = (count + threads - 1) / threads;
    if (blocks > 65536) blocks = 65536;
    return (unsigned)(blocks < 1 ? 1 : blocks);
}

/* ---- SwiGLU x gamma -------------------------------------------------------- */

/* One thread per activation; g and u are two coalesced runs of z. */
/* silu(v) and sigmoid(v) as the CPU engine takes them (gpu/cpu/eltwise.c):
 * below -88, where 1 + e^-v overflows, v e^v and e^v, so the far tail
 * gives its limit 0 (a gate sum of -inf gave NaN: -inf / inf). */
__device__ __forceinline__ float ls_silu(float v) {
    return v < -88.0f ? fmaxf(v, -3.0e38f) * expf(v) : v / (1.0f + expf(-v));
}
__device__ __forceinline__ float ls_sigmoid(float v) { return v < -88.0f ? expf(v) : 1.0f / (1.0f + expf(-v)); }

template <typename T>
__global__ void swiglu_kernel(const float *__restrict__ z, const float *__restrict__ gam, T *__restrict__ a, int T_,
                              int n, int F) {
    const long long nF = (long long)n * F, total = (long long)T_ * nF;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long t = i / nF, rem = i - t * nF;
        const float *zr = z + t * 2 * nF;
        const float g = zr[rem], u = zr[nF + rem];
        const float gm = gam ? gam[t * n + rem / F] : 1.0f;
        const float silu = ls_silu(g);
        a[i] = from_f<T>(gm * silu * u);
    }
}

cudaError_t ls_cuda_swiglu(const float *z, const float *gam, void *a, ls_dtype t, int T, int n, int F,
                           cudaStream_t stream) {
    const long long total = (long long)T * n * F;
    if (total <= 0) return cudaSuccess;
    unsigned g = grid_for(total, 256);
    switch (t) {
    case LS_DTYPE_BF16: swiglu_kernel<<<g, 256, 0, stream>>>(z, gam, (__nv_bfloat16 *)a, T, n, F); break;
    case LS_DTYPE_F16: swiglu_kernel<<<g, 256, 0, stream>>>(z, gam, (__half *)a, T, n, F); break;
    default: swiglu_kernel<<<g, 256, 0, stream>>>(z, gam, (float *)a, T, n, F); break;
    }
    return cudaGetLastError();
}

/* ---- the shared-expert gate ------------------------------------------------- */

/* One block of 256 threads per token: strided partial sums, then a tree
 * in shared memory; thread 0 writes the sigmoid for every expert. A row
 * whose gsel names a slot adds that slot's delta dw (gd + slot * gstride)
 * in the same sums: (w + dw) . x. */
__global__ void gate_kernel(const float *__restrict__ x, const float *__restrict__ w, const int *__restrict__ gsel,
                            const float *__restrict__ gd, long long gstride, float *__restrict__ gam, int H, int n) {
    __shared__ float part[256];
    const int t = blockIdx.x;
    const float *xr = x + (long long)t * H;
    const int slot = gsel ? gsel[t] : -1;
    const float *dw = slot >= 0 ? gd + (long long)slot * gstride : NULL;
    float acc = 0.0f;
    if (dw)
        for (int h = threadIdx.x; h < H; h += blockDim.x) acc = fmaf(xr[h], dw[h], fmaf(xr[h], w[h], acc));
    else
        for (int h = threadIdx.x; h < H; h += blockDim.x) acc = fmaf(xr[h], w[h], acc);
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const float g = ls_sigmoid(part[0]);
        for (int e = 0; e < n; e++) gam[(long long)t * n + e] = g;
    }
}

cudaError_t ls_cuda_gate(const float *x, const float *w, const int *gsel, const float *gd, long long gstride,
                         float *gam, int T, int H, int n, cudaStream_t stream) {
    if (T <= 0) return cudaSuccess;
    gate_kernel<<<(unsigned)T, 256, 0, stream>>>(x, w, gsel, gd, gstride, gam, H, n);
    return cudaGetLastError();
}

/* ---- SGMV ------------------------------------------------------------------ */

#define SG_BM LS_SGMV_BM
#define SG_BN LS_SGMV_TILE_N
#define SG_BK 32

typedef struct {
    ls_sgmv_params p;
    int ksplit; /* blocks along K (grid.z = batch * ksplit) */
    int kchunk; /* K per split, a multiple of SG_BK */
    int vec_x;  /* 8-element runs of X are 16-byte aligned */
    int vec_w;
} sgmv_args;

/* The rows, slot, batch, columns and K range of this block: nlim is N
 * cut to the slot's rank (cut N), kend is K's end cut to it (cut K). */
struct sgmv_block {
    int row0, rows, slot, b, ks, n0, nlim, kbeg, kend;
};

__device__ __forceinline__ sgmv_block sgmv_where(const sgmv_args &a) {
    sgmv_block s;
    const int4 task = a.p.tasks[blockIdx.x];
    s.row0 = task.x;
    s.rows = task.y;
    s.slot = task.z;
    s.b = blockIdx.z / a.ksplit;
    s.ks = blockIdx.z - s.b * a.ksplit;
    s.n0 = blockIdx.y * SG_BN;
    s.nlim = a.p.cut == 1 ? min(a.p.N, task.w) : a.p.N;
    s.kbeg = s.ks * a.kchunk;
    s.kend = min(a.p.K, s.kbeg + a.kchunk);
    if (a.p.cut == 2) s.kend = min(s.kend, task.w);
    /* Nothing to multiply: the loop is skipped and the block stores zeros. */
    if (s.n0 >= s.nlim) s.kend = s.kbeg;
    return s;
}

/* The block's sum for output (r, c) of its tile: into the split's scratch
 * (its own place: the reduction adds the splits in order), or into C. */
__device__ __forceinline__ void sgmv_store(const sgmv_args &a, const sgmv_block &s, int r, int c, float v) {
    if (r >= s.rows || s.n0 + c >= a.p.N) return;
    const long long row = s.row0 + r, col = s.b * a.p.c_bs + s.n0 + c;
    if (a.ksplit > 1)
        a.p.part[((long long)s.ks * a.p.nrows + row) * a.p.ldc + col] = v;
    else if (a.p.beta)
        a.p.C[row * a.p.ldc + col] += v;
    else
        a.p.C[row * a.p.ldc + col] = v;
}

/* C[i] = the splits' partial sums added in split order, for rows
 * 0..nrows-1. A row of a task was written by one block of every split;
 * the rows of a slot of rank 0 at this layer have no task, so they get
 * stale scratch here, which no expand reads (it cuts to that rank: a host
 * emulation of the forward gave the same y with the scratch NaN-filled). */
__global__ void sgmv_reduce_kernel(const float *__restrict__ part, float *__restrict__ C, long long total,
                                   int ksplit) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int ks = 0; ks < ksplit; ks++) acc += part[ks * total + i];
        C[i] = acc;
    }
}

/* fp32 FMA variant: 256 threads, each 2 rows x 4 columns of the 32 x 64
 * tile; operands are widened to fp32 in shared memory (row pitch 33 so the
 * column reads of one warp hit distinct banks). */
template <typename TX, typename TW> __global__ void __launch_bounds__(256) sgmv_simt_kernel(sgmv_args a) {
    __shared__ float xs[SG_BM][SG_BK + 1];
    __shared__ float ws[SG_BN][SG_BK + 1];
    const sgmv_block s = sgmv_where(a);
    const TX *X = (const TX *)a.p.X + (long long)s.row0 * a.p.ldx + s.b * a.p.x_bs;
    const TW *W = (const TW *)a.p.W + s.slot * a.p.w_ss + s.b * a.p.w_bs + (long long)s.n0 * a.p.ldw;
    const int tid = threadIdx.x, tm = tid / 16, tn = tid % 16;
    float acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};

    for (int k0 = s.kbeg; k0 < s.kend; k0 += SG_BK) {
#pragma unroll
        for (int i = 0; i < (SG_BM * SG_BK) / 256; i++) {
            const int idx = tid + i * 256, r = idx / SG_BK, c = idx % SG_BK, k = k0 + c;
            xs[r][c] = (r < s.rows && k < s.kend) ? to_f(X[(long long)r * a.p.ldx + k]) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < (SG_BN * SG_BK) / 256; i++) {
            const int idx = tid + i * 256, r = idx / SG_BK, c = idx % SG_BK, k = k0 + c;
            ws[r][c] = (s.n0 + r < s.nlim && k < s.kend) ? to_f(W[(long long)r * a.p.ldw + k]) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < SG_BK; kk++) {
            const float x0 = xs[tm * 2][kk], x1 = xs[tm * 2 + 1][kk];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float w = ws[tn + 16 * c][kk];
                acc[0][c] = fmaf(x0, w, acc[0][c]);
                acc[1][c] = fmaf(x1, w, acc[1][c]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) sgmv_store(a, s, tm * 2 + i, tn + 16 * c, acc[i][c]);
}

/* Eight consecutive operand values into shared memory as TW, zeros past
 * `valid`; one 16-byte load when aligned and whole. */
template <typename TX, typename TW>
__device__ __forceinline__ void load8(TW *dst, const TX *src, int valid, int vec) {
    if (vec && valid == 8) {
        if constexpr (std::is_same<TX, TW>::value) {
            *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
        } else {
            const float4 lo = reinterpret_cast<const float4 *>(src)[0];
            const float4 hi = reinterpret_cast<const float4 *>(src)[1];
            dst[0] = from_f<TW>(lo.x);
            dst[1] = from_f<TW>(lo.y);
            dst[2] = from_f<TW>(lo.z);
            dst[3] = from_f<TW>(lo.w);
            dst[4] = from_f<TW>(hi.x);
            dst[5] = from_f<TW>(hi.y);
            dst[6] = from_f<TW>(hi.z);
            dst[7] = from_f<TW>(hi.w);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) dst[i] = from_f<TW>(i < valid ? to_f(src[i]) : 0.0f);
    }
}

/* Tensor-core variant for 16-bit W: 4 warps in a 2 x 2 grid, each owning a
 * 16 x 32 piece of the 32 x 64 tile as two 16x16x16 WMMA accumulators in
 * fp32. X (fp32 or 16-bit) is rounded to W's type on its way into shared
 * memory. Rows are padded by 8 elements (16 bytes) against bank conflicts;
 * every fragment pointer stays 32-byte aligned as WMMA requires. */
#define SG_LDS (SG_BK + 8)
#define SG_LDC (SG_BN + 4)
template <typename TX, typename TW> __global__ void __launch_bounds__(128) sgmv_wmma_kernel(sgmv_args a) {
    using namespace nvcuda;
    __shared__ __align__(128) TW xs[SG_BM * SG_LDS];
    __shared__ __align__(128) TW ws[SG_BN * SG_LDS];
    __shared__ __align__(128) float cs[SG_BM * SG_LDC];
    const sgmv_block s = sgmv_where(a);
    const TX *X = (const TX *)a.p.X + (long long)s.row0 * a.p.ldx + s.b * a.p.x_bs;
    const TW *W = (const TW *)a.p.W + s.slot * a.p.w_ss + s.b * a.p.w_bs + (long long)s.n0 * a.p.ldw;
    const int tid = threadIdx.x, warp = tid / 32, wm = warp / 2, wn = warp % 2;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
    wmma::fill_fragment(acc[0], 0.0f);
    wmma::fill_fragment(acc[1], 0.0f);

    /* X tile: 32 rows x 4 runs of 8; W tile: 64 rows x 2 runs of 16. */
    const int xr = tid / 4, xc = (tid % 4) * 8;
    const int wr = tid / 2, wc = (tid % 2) * 16;
    const bool x_row_ok = xr < s.rows, w_row_ok = s.n0 + wr < s.nlim;
    const TX *xrow = X + (long long)(x_row_ok ? xr : 0) * a.p.ldx;
    const TW *wrow = W + (long long)(w_row_ok ? wr : 0) * a.p.ldw;

    for (int k0 = s.kbeg; k0 < s.kend; k0 += SG_BK) {
        const int xk = k0 + xc, wk = k0 + wc;
        const int xv = x_row_ok ? max(0, min(8, s.kend - xk)) : 0;
        load8<TX, TW>(xs + xr * SG_LDS + xc, xrow + xk, xv, a.vec_x);
        const int wv0 = w_row_ok ? max(0, min(8, s.kend - wk)) : 0;
        const int wv1 = w_row_ok ? max(0, min(8, s.kend - wk - 8)) : 0;
        load8<TW, TW>(ws + wr * SG_LDS + wc, wrow + wk, wv0, a.vec_w);
        load8<TW, TW>(ws + wr * SG_LDS + wc + 8, wrow + wk + 8, wv1, a.vec_w);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < SG_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, TW, wmma::row_major> fa;
            wmma::load_matrix_sync(fa, xs + (wm * 16) * SG_LDS + kk, SG_LDS);
#pragma unroll
            for (int f = 0; f < 2; f++) {
                /* ws holds W[j][k] row-major, i.e. B[k][j] column-major. */
                wmma::fragment<wmma::matrix_b, 16, 16, 16, TW, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, ws + (wn * 32 + f * 16) * SG_LDS + kk, SG_LDS);
                wmma::mma_sync(acc[f], fa, fb, acc[f]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int f = 0; f < 2; f++)
        wmma::store_matrix_sync(cs + (wm * 16) * SG_LDC + wn * 32 + f * 16, acc[f], SG_LDC, wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < SG_BM * SG_BN; i += 128) {
        const int r = i / SG_BN, c = i % SG_BN;
        sgmv_store(a, s, r, c, cs[r * SG_LDC + c]);
    }
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

template <typename TW> static void sgmv_launch_w(const sgmv_args &a, dim3 grid, int wmma, cudaStream_t stream) {
    const bool x_f32 = a.p.xt == LS_DTYPE_F32;
    if (wmma) {
        if (x_f32)
            sgmv_wmma_kernel<float, TW><<<grid, 128, 0, stream>>>(a);
        else
            sgmv_wmma_kernel<TW, TW><<<grid, 128, 0, stream>>>(a);
    } else {
        if (x_f32)
            sgmv_simt_kernel<float, TW><<<grid, 256, 0, stream>>>(a);
        else
            sgmv_simt_kernel<TW, TW><<<grid, 256, 0, stream>>>(a);
    }
}

/* The K split: enough blocks for about two per SM when few tasks and a
 * narrow N would leave SMs idle, at least 2 K steps per block, at most
 * LS_SGMV_SPLIT_MAX splits; only where the scratch and the reduction
 * apply (see ls_sgmv_params.split). */
static int sgmv_ksplit(const ls_sgmv_params *p, int ntiles, int ksteps, int num_sms) {
    if (!p->split || !p->part || p->beta || p->nrows > LS_SGMV_SPLIT_ROWS || p->c_bs != p->N ||
        (long long)p->batch * p->c_bs != p->ldc || ksteps < 4)
        return 1;
    const long long blocks = (long long)p->ntasks * ntiles * p->batch;
    long long want = (2LL * num_sms + blocks - 1) / blocks;
    const long long most = ksteps / 2 < LS_SGMV_SPLIT_MAX ? ksteps / 2 : LS_SGMV_SPLIT_MAX;
    if (want > most) want = most;
    if ((long long)p->batch * want > 65535) want = 1;
    return want < 1 ? 1 : (int)want;
}

static cudaError_t sgmv_launch(const sgmv_args &a, dim3 grid, int wmma, cudaStream_t stream) {
    const ls_sgmv_params *p = &a.p;
    const int use_wmma = wmma && p->wt != LS_DTYPE_F32;
    switch (p->wt) {
    case LS_DTYPE_BF16: sgmv_launch_w<__nv_bfloat16>(a, grid, use_wmma, stream); break;
    case LS_DTYPE_F16: sgmv_launch_w<__half>(a, grid, use_wmma, stream); break;
    case LS_DTYPE_F32:
        if (p->xt != LS_DTYPE_F32) return cudaErrorInvalidValue;
        sgmv_simt_kernel<float, float><<<grid, 256, 0, stream>>>(a);
        break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

cudaError_t ls_cuda_sgmv(const ls_sgmv_params *p, int wmma, int num_sms, cudaStream_t stream) {
    if (p->ntasks <= 0 || p->N <= 0 || p->batch <= 0) return cudaSuccess;
    /* X is either fp32 or W's own type. */
    if (p->xt != LS_DTYPE_F32 && p->xt != p->wt) return cudaErrorInvalidValue;
    sgmv_args a;
    a.p = *p;
    const int ntiles = (p->N + SG_BN - 1) / SG_BN;
    const int ksteps = (p->K + SG_BK - 1) / SG_BK;
    const int ksplit = sgmv_ksplit(p, ntiles, ksteps, num_sms);
    const int steps_per = ksteps > 0 ? (ksteps + ksplit - 1) / ksplit : 1;
    a.kchunk = steps_per * SG_BK;
    a.ksplit = ksteps > 0 ? (ksteps + steps_per - 1) / steps_per : 1;
    a.vec_x = aligned16(p->X) && p->ldx % 8 == 0 && p->x_bs % 8 == 0;
    a.vec_w = aligned16(p->W) && p->ldw % 8 == 0 && p->w_bs % 8 == 0 && p->w_ss % 8 == 0;
    dim3 grid((unsigned)p->ntasks, (unsigned)ntiles, (unsigned)(p->batch * a.ksplit));
    cudaError_t e = sgmv_launch(a, grid, wmma, stream);
    if (e != cudaSuccess || a.ksplit == 1) return e;
    const long long total = (long long)p->nrows * p->ldc;
    sgmv_reduce_kernel<<<grid_for(total, 256), 256, 0, stream>>>(p->part, p->C, total, a.ksplit);
    return cudaGetLastError();
}

/* Any kernel of this file stands for all: they are built for the same
 * architectures. */
cudaError_t ls_cuda_kernels_loadable(void) {
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, sgmv_reduce_kernel);
    if (e != cudaSuccess) (void)cudaGetLastError();
    return e;
}
