/* The bf16 GEMM rate of a device, measured on buffers of its own: the
 * ceiling the GPU benchmark divides its large-T TFLOP/s by. Independent
 * of the backend (its own stream, cuBLAS handle and memory), so it can be
 * measured beside any backend build. Only in builds with LS_HAVE_CUDA. */
#ifndef LS_GPU_CUDA_PEAK_H
#define LS_GPU_CUDA_PEAK_H

#ifdef __cplusplus
extern "C" {
#endif

#include "common/error.h"

/* The rate of C[m, n] = A[m, k] . B[n, k]^T on device `device` (an
 * ordinal), row-major, the layout of our forward's GEMMs (tokens x
 * weights^T): bf16 A, B and C, fp32 accumulation (CUBLAS_COMPUTE_32F),
 * cublasGemmEx. A and B hold random values (never zeros: a product of
 * zeros runs faster than real data). Runs 3 products untimed, then `iters`
 * timed with CUDA events, and stores 2*m*n*k / median time in TFLOP/s in
 * *tflops. Everything it allocates (buffers, stream, events, handle) is
 * freed before it returns, on every path. */
ls_status ls_cuda_gemm_peak(int device, int m, int n, int k, int iters, double *tflops, ls_error *err);

#ifdef __cplusplus
}
#endif

#endif
