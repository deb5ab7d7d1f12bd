/* What the CUDA backend offers beyond gpu/backend.h: its own settings and
 * its constructor (in every build: without CUDA compiled in, gpu/backend.c
 * says so plainly), and, only in builds with LS_HAVE_CUDA, the
 * poisoned-context flag for /ready, a switch between its LoRA kernels for
 * tests, and the device-only timing entry points the benchmark uses. */
#ifndef LS_GPU_CUDA_CUDA_BACKEND_H
#define LS_GPU_CUDA_CUDA_BACKEND_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "gpu/backend.h"

/* The CUDA backend's own settings; all zero is the default. */
typedef struct {
    int device_id; /* CUDA device ordinal */
    /* Forward shapes kept as captured CUDA graphs (gpu/graph_cache.h):
     * 0 = the default, LS_CUDA_GRAPHS_DEFAULT; < 0 = none (direct launches). */
    int graphs;
} ls_cuda_settings;

#define LS_CUDA_GRAPHS_DEFAULT 256

/* Creates the CUDA backend (cuda NULL: the defaults); LS_DEVICE_ERROR
 * when there is no device or the build has no CUDA. On success *out is
 * owned by the caller and released with ls_backend_free. */
ls_status ls_backend_cuda_create(const ls_backend_config *cfg, const ls_cuda_settings *cuda, ls_backend **out,
                                 ls_error *err);
/* True when the build has CUDA and a device answers. */
int ls_backend_cuda_available(void);

/* ---- only with LS_HAVE_CUDA ------------------------------------------------ */

/* Nonzero once a CUDA error that poisons the context (illegal address,
 * launch failure, ...) was seen in this process: every later call of every
 * CUDA backend fails with LS_DEVICE_ERROR, and the server should answer
 * /ready with 503. be may be NULL (the flag is process-wide). */
int ls_backend_cuda_poisoned(const ls_backend *be);

/* The device's name, e.g. "NVIDIA H200"; borrowed, lives as long as be. */
const char *ls_backend_cuda_device_name(const ls_backend *be);

/* Which kernels run the multi-adapter LoRA stages. AUTO: tensor cores
 * (WMMA) for bf16/f16 weights, fp32 FMA for f32. SIMT forces the fp32 FMA
 * kernels (a second implementation the parity test checks too). */
typedef enum { LS_CUDA_SGMV_AUTO, LS_CUDA_SGMV_SIMT } ls_cuda_sgmv_mode;
void ls_backend_cuda_set_sgmv_mode(ls_backend *be, ls_cuda_sgmv_mode mode);

/* Stages x, gammas and the token grouping once, then runs the device part
 * of forward (everything between the copy in and the copy out) 3 times
 * untimed and `iters` times timed with CUDA events; ms[i] receives the
 * time of run i. Arguments as for forward; ms holds iters floats.
 * *graph_used (when not NULL) says whether the runs replayed a CUDA graph
 * (1) or launched directly because capture failed (0). */
ls_status ls_backend_cuda_time_forward(ls_backend *be, int layer, int T, const float *x, const float *gammas,
                                       const int *slot_of_token, int iters, float *ms, int *graph_used,
                                       ls_error *err);

/* Device-to-device copy bandwidth: copies a scratch buffer of `bytes`
 * (allocated and freed here) `iters` times and stores the median rate in
 * bytes per second, counting the bytes read and the bytes written. */
ls_status ls_backend_cuda_copy_bandwidth(ls_backend *be, size_t bytes, int iters, double *bytes_per_s,
                                         ls_error *err);

#ifdef __cplusplus
}
#endif

#endif
