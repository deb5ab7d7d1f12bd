/* The failure side of check.h: one message format for CUDA and cuBLAS
 * errors, and the process-wide record of a poisoned context. */
#include "gpu/cuda/check.h"

#include <stdio.h>
#include <string.h>

extern "C" {
#include "common/log.h"
}

static int g_poisoned;
static char g_poison_msg[512];

/* __FILE__ is absolute under CMake; the part from "gpu/" on is enough. */
static const char *short_file(const char *file) {
    const char *p = strstr(file, "gpu/");
    return p ? p : file;
}

int ls_cuda_error_is_sticky(cudaError_t e) {
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorExternalDevice:
    case cudaErrorUnknown:
        return 1;
    default:
        return 0;
    }
}

int ls_cuda_poisoned_flag(void) { return __atomic_load_n(&g_poisoned, __ATOMIC_ACQUIRE); }

const char *ls_cuda_poison_message(void) { return ls_cuda_poisoned_flag() ? g_poison_msg : ""; }

static void mark_poisoned(const char *msg) {
    static int claimed;
    int expected = 0;
    /* Only the first sticky error is kept: later ones are its echoes. The
     * message is complete before the flag says it may be read. */
    if (__atomic_compare_exchange_n(&claimed, &expected, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        snprintf(g_poison_msg, sizeof g_poison_msg, "%s", msg);
        __atomic_store_n(&g_poisoned, 1, __ATOMIC_RELEASE);
        ls_log_error("CUDA context poisoned: %s", msg);
    }
}

/* Fills err (first failure wins); never exits. */
ls_status ls_cuda_fail(ls_error *err, cudaError_t e, const char *call, const char *file, int line) {
    char msg[400];
    snprintf(msg, sizeof msg, "CUDA error %s (%s) in %s at %s:%d", cudaGetErrorName(e), cudaGetErrorString(e), call,
             short_file(file), line);
    /* A sticky error stays for good; any other must not be read again by
     * the next launch's cudaGetLastError and blamed on that call. */
    if (ls_cuda_error_is_sticky(e))
        mark_poisoned(msg);
    else
        (void)cudaGetLastError();
    return ls_error_set(err, LS_DEVICE_ERROR, NULL, "%s", msg);
}

/* Fills err (first failure wins); never exits. */
ls_status ls_cublas_fail(ls_error *err, cublasStatus_t s, const char *call, const char *file, int line) {
    char msg[400];
    cudaError_t e = cudaPeekAtLastError();
    if (e != cudaSuccess)
        snprintf(msg, sizeof msg, "cuBLAS error %s in %s at %s:%d (CUDA: %s)", cublasGetStatusString(s), call,
                 short_file(file), line, cudaGetErrorName(e));
    else
        snprintf(msg, sizeof msg, "cuBLAS error %s in %s at %s:%d", cublasGetStatusString(s), call, short_file(file),
                 line);
    /* As in ls_cuda_fail: a pending error that is not sticky is cleared
     * here, or the next launcher's cudaGetLastError would report it. */
    if (ls_cuda_error_is_sticky(e))
        mark_poisoned(msg);
    else if (e != cudaSuccess)
        (void)cudaGetLastError();
    return ls_error_set(err, LS_DEVICE_ERROR, NULL, "%s", msg);
}
