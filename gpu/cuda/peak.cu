/* The bf16 GEMM peak of peak.h: random bf16 buffers of its own, one
 * cuBLAS handle on a stream of its own, CUDA events around each product.
 * Owns nothing past a call: every resource is made and freed inside it. */
#include "gpu/cuda/peak.h"

#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>

#include "gpu/cuda/check.h"

/* Everything one measurement holds; zero-initialised so that freeing
 * skips what was never made. */
typedef struct {
    __nv_bfloat16 *a, *b, *c; /* device: A [m, k], B [n, k], C [m, n] */
    cudaStream_t stream;
    cudaEvent_t start, stop;
    cublasHandle_t blas;
    float *ms; /* host: iters timings */
} peak_run;

/* Uniform values in [-1, 1) from a hash of the index: random enough that
 * the tensor cores see real data, and no host buffer or upload needed. */
__global__ void peak_fill(__nv_bfloat16 *v, size_t count, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 0x9E3779B1u ^ (uint32_t)(i >> 32) ^ seed;
        h ^= h >> 16;
        h *= 0x85EBCA6Bu;
        h ^= h >> 13;
        h *= 0xC2B2AE35u;
        h ^= h >> 16;
        v[i] = __float2bfloat16((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Frees whatever p holds. Cleanup: a failure here cannot be acted on,
 * and the error that led here (if any) is already in err. */
static void peak_free(peak_run *p) {
    if (p->blas) (void)cublasDestroy(p->blas);
    if (p->start) (void)cudaEventDestroy(p->start);
    if (p->stop) (void)cudaEventDestroy(p->stop);
    if (p->stream) (void)cudaStreamDestroy(p->stream);
    (void)cudaFree(p->a);
    (void)cudaFree(p->b);
    (void)cudaFree(p->c);
    (void)cudaGetLastError(); /* nor left pending for the next launch to report */
    free(p->ms);
}

/* Allocates p's buffers and handles on the current device and fills A
 * and B. */
static ls_status peak_setup(peak_run *p, int m, int n, int k, int iters, ls_error *err) {
    p->ms = (float *)calloc((size_t)iters, sizeof(float));
    if (!p->ms) return ls_error_set(err, LS_DEVICE_ERROR, NULL, "gemm peak: out of host memory");
    const size_t na = (size_t)m * k, nb = (size_t)n * k, nc = (size_t)m * n;
    LS_CUDA_TRY(err, cudaMalloc((void **)&p->a, na * sizeof(__nv_bfloat16)));
    LS_CUDA_TRY(err, cudaMalloc((void **)&p->b, nb * sizeof(__nv_bfloat16)));
    LS_CUDA_TRY(err, cudaMalloc((void **)&p->c, nc * sizeof(__nv_bfloat16)));
    LS_CUDA_TRY(err, cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking));
    LS_CUDA_TRY(err, cudaEventCreate(&p->start));
    LS_CUDA_TRY(err, cudaEventCreate(&p->stop));
    LS_CUBLAS_TRY(err, cublasCreate(&p->blas));
    LS_CUBLAS_TRY(err, cublasSetStream(p->blas, p->stream));
    peak_fill<<<1024, 256, 0, p->stream>>>(p->a, na, 1u);
    LS_CUDA_LAUNCHED(err);
    peak_fill<<<1024, 256, 0, p->stream>>>(p->b, nb, 2u);
    LS_CUDA_LAUNCHED(err);
    return LS_OK;
}

/* One product C = A . B^T: row-major C [m, n] is column-major [n, m] =
 * op_T(B col-major [k, n]) . A col-major [k, m], the "TN" call. */
static ls_status peak_gemm(peak_run *p, int m, int n, int k, ls_error *err) {
    const float alpha = 1.0f, beta = 0.0f;
    LS_CUBLAS_TRY(err, cublasGemmEx(p->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, p->b, CUDA_R_16BF, k, p->a,
                                    CUDA_R_16BF, k, &beta, p->c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
    return LS_OK;
}

/* 3 untimed products (cuBLAS picks and loads its kernel), then iters
 * timed ones; the median time in *median_ms. */
static ls_status peak_time(peak_run *p, int m, int n, int k, int iters, float *median_ms, ls_error *err) {
    for (int i = -3; i < iters; i++) {
        LS_CUDA_TRY(err, cudaEventRecord(p->start, p->stream));
        LS_TRY(peak_gemm(p, m, n, k, err));
        LS_CUDA_TRY(err, cudaEventRecord(p->stop, p->stream));
        LS_CUDA_TRY(err, cudaEventSynchronize(p->stop));
        if (i >= 0) LS_CUDA_TRY(err, cudaEventElapsedTime(&p->ms[i], p->start, p->stop));
    }
    qsort(p->ms, (size_t)iters, sizeof(float), cmp_float);
    *median_ms = p->ms[iters / 2];
    return LS_OK;
}

ls_status ls_cuda_gemm_peak(int device, int m, int n, int k, int iters, double *tflops, ls_error *err) {
    if (m < 1 || n < 1 || k < 1 || iters < 1 || !tflops)
        return ls_error_set(err, LS_INTERNAL, NULL, "gemm peak: m, n, k and iters must be > 0");
    /* The caller's current device is put back afterwards: this is a
     * measurement, not a change of the thread's state. */
    int prev = 0;
    LS_CUDA_TRY(err, cudaGetDevice(&prev));
    LS_CUDA_TRY(err, cudaSetDevice(device));
    peak_run p = {};
    float med = 0;
    ls_status st = peak_setup(&p, m, n, k, iters, err);
    if (st == LS_OK) st = peak_time(&p, m, n, k, iters, &med, err);
    peak_free(&p);
    if (st == LS_OK && med <= 0) st = ls_error_set(err, LS_DEVICE_ERROR, NULL, "gemm peak: a zero timing");
    if (st == LS_OK) *tflops = 2.0 * m * n * k / (med * 1e-3) / 1e12;
    cudaError_t e = cudaSetDevice(prev);
    if (st == LS_OK && e != cudaSuccess) st = ls_cuda_fail(err, e, "cudaSetDevice(prev)", __FILE__, __LINE__);
    return st;
}
