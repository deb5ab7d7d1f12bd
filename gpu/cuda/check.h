/* Checking every CUDA and cuBLAS call: a failure fills ls_error with
 * LS_DEVICE_ERROR, the call, the file and the line, and returns from the
 * calling function. Errors that poison the CUDA context (illegal address,
 * launch failure, ...) are remembered process-wide for /ready. For the
 * .cu files of gpu/cuda only (C++ linkage). */
#ifndef LS_GPU_CUDA_CHECK_H
#define LS_GPU_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "common/error.h"
#ifdef __cplusplus
}
#endif

/* Fills err with the failed call and its place, marks the process poisoned
 * when e is sticky, and returns LS_DEVICE_ERROR. */
ls_status ls_cuda_fail(ls_error *err, cudaError_t e, const char *call, const char *file, int line);
/* The same for cuBLAS; the CUDA error behind an execution failure is
 * looked at too, so a kernel fault inside cuBLAS still poisons. */
ls_status ls_cublas_fail(ls_error *err, cublasStatus_t s, const char *call, const char *file, int line);

/* True when e leaves the context unusable: every later call fails too. */
int ls_cuda_error_is_sticky(cudaError_t e);
/* Nonzero once a sticky error was seen in this process. */
int ls_cuda_poisoned_flag(void);
/* The message of the first sticky error ("" when none). */
const char *ls_cuda_poison_message(void);

#define LS_CUDA_TRY(err, call)                                                                       \
    do {                                                                                             \
        cudaError_t ls_cu_e_ = (call);                                                               \
        if (ls_cu_e_ != cudaSuccess) return ls_cuda_fail((err), ls_cu_e_, #call, __FILE__, __LINE__); \
    } while (0)

#define LS_CUBLAS_TRY(err, call)                                                                            \
    do {                                                                                                    \
        cublasStatus_t ls_cb_s_ = (call);                                                                   \
        if (ls_cb_s_ != CUBLAS_STATUS_SUCCESS) return ls_cublas_fail((err), ls_cb_s_, #call, __FILE__, __LINE__); \
    } while (0)

/* After a kernel launch: catches bad launch configurations at once. */
#define LS_CUDA_LAUNCHED(err) LS_CUDA_TRY(err, cudaGetLastError())

/* For calls that return ls_status themselves. */
#define LS_TRY(call)                       \
    do {                                   \
        ls_status ls_st_ = (call);         \
        if (ls_st_ != LS_OK) return ls_st_; \
    } while (0)

#endif
