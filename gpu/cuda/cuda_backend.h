/* What the CUDA backend offers beyond gpu/backend.h: its own settings and
 * its constructor (in every build: without CUDA compiled in, gpu/backend.c
 * says so plainly), and, only in builds with LS_HAVE_CUDA, the
 * poisoned-context flag for /ready, a switch between its LoRA kernels for
 * tests, and the device-only timing and profile entry points the
 * benchmark uses. */
#ifndef LS_GPU_CUDA_CUDA_BACKEND_H
#define LS_GPU_CUDA_CUDA_BACKEND_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "gpu/backend.h"
#include "gpu/graph_cache.h"

/* The CUDA backend's own settings; all zero is the default. */
typedef struct {
    int device_id; /* CUDA device ordinal */
    /* Forward shapes kept as captured CUDA graphs (gpu/graph_cache.h):
     * 0 = the default, LS_CUDA_GRAPHS_DEFAULT; < 0 = none (direct launches). */
    int graphs;
    /* 1: slots may carry a delta of the shared-expert gate (an adapter of
     * shared_expert_gate) and the gate kernel applies it. Off in serving
     * until a device run of the parity suite (which turns it on) checks
     * it: the pool then refuses such adapters (no_gate_lora). */
    int gate_lora;
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
 * kernels (a second implementation the parity test checks too). BGMV:
 * the shrinks through the warp-per-output kernel of gpu/cuda/bgmv.cu, the
 * expands as AUTO. BLAS: one cuBLAS call per slot on its rows, as for a
 * single slot, launched directly (no CUDA graph: the calls hold each
 * slot's rows). BGMV and BLAS are not the default until a device run
 * has measured them against AUTO (bench_gpu's stage profile) and the
 * parity suite passed. */
typedef enum { LS_CUDA_SGMV_AUTO, LS_CUDA_SGMV_SIMT, LS_CUDA_SGMV_BGMV, LS_CUDA_SGMV_BLAS } ls_cuda_sgmv_mode;
void ls_backend_cuda_set_sgmv_mode(ls_backend *be, ls_cuda_sgmv_mode mode);

/* Stages x, gammas and the token grouping once, then runs the device part
 * of forward (everything between the copy in and the copy out) 3 times
 * untimed and `iters` times timed with CUDA events; ms[i] receives the
 * time of run i. Arguments as for forward; ms holds iters floats.
 * *graph_used (when not NULL) says whether the runs replayed a CUDA graph
 * (1) or launched directly (0): capture failed, or the path takes none,
 * as serving launches it (LS_CUDA_SGMV_BLAS with several slots). */
ls_status ls_backend_cuda_time_forward(ls_backend *be, int layer, int T, const float *x, const float *gammas,
                                       const int *slot_of_token, int iters, float *ms, int *graph_used,
                                       ls_error *err);

/* The stages of ls_backend_cuda_profile_forward, in the order a forward
 * runs them; ls_cuda_stage_name says each in words ("shrink gate_up"). */
enum {
    LS_CUDA_STAGE_COPY_IN,
    LS_CUDA_STAGE_SHRINK_GU,
    LS_CUDA_STAGE_GATE_UP,
    LS_CUDA_STAGE_EXPAND_GU,
    LS_CUDA_STAGE_GATE,
    LS_CUDA_STAGE_SWIGLU,
    LS_CUDA_STAGE_SHRINK_D,
    LS_CUDA_STAGE_DOWN,
    LS_CUDA_STAGE_EXPAND_D,
    LS_CUDA_STAGE_COPY_OUT,
    LS_CUDA_STAGES
};
const char *ls_cuda_stage_name(int stage);

/* Where a forward's device time goes. Stages x, gammas and the token
 * grouping once, then runs every stage of forward (the copies in, the
 * GEMMs with their LoRA kernels, the gate, SwiGLU, the copy out) with
 * direct launches on one stream, an event pair around each: no side
 * stream and no graph, so each stage's own cost shows, and their sum
 * exceeds a forward's by what the side stream and the graph save. 3 runs
 * untimed, then `iters` timed: ms[i * LS_CUDA_STAGES + s] is stage s of
 * run i, 0 for a stage this forward does not run. Arguments as for
 * forward; ms holds iters * LS_CUDA_STAGES floats. */
ls_status ls_backend_cuda_profile_forward(ls_backend *be, int layer, int T, const float *x, const float *gammas,
                                          const int *slot_of_token, int iters, float *ms, ls_error *err);

/* The graph cache of serving's forwards (gpu/graph_cache.h), for the
 * tests, which read its counters to check that a repeated shape is
 * captured and then replayed. The backend's; read it between forwards. */
const ls_graph_cache *ls_backend_cuda_graphs(ls_backend *be);
/* Destroys every graph and sighting of that cache and lets it capture
 * again (hits, captures and failures go on; the waste counts and the
 * stop start afresh): the benchmark's fresh start for each trace.
 * Between forwards, as any other operation. */
void ls_backend_cuda_clear_graphs(ls_backend *be);

/* Device-to-device copy bandwidth: copies a scratch buffer of `bytes`
 * (allocated and freed here) `iters` times and stores the median rate in
 * bytes per second, counting the bytes read and the bytes written. */
ls_status ls_backend_cuda_copy_bandwidth(ls_backend *be, size_t bytes, int iters, double *bytes_per_s,
                                         ls_error *err);

#ifdef __cplusplus
}
#endif

#endif
