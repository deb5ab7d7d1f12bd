/* The CUDA backend's lifecycle and memory: create (every device buffer
 * allocated once, pinned staging, stream, cuBLAS), base weight upload into
 * the GEMM layouts, slot writes with their derived operands, reads, clears
 * and free. The forward lives in cuda_forward.cu. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cuda/cuda_internal.h"

extern "C" {
#include "common/log.h"
#include "gpu/parallel_rows.h"
#include "gpu/slot_rank.h"
}

#define MIB(b) ((double)(b) / (1024.0 * 1024.0))
#define BLAS_WS_BYTES (32u << 20) /* cuBLAS's recommendation for Hopper */
/* The shrinks' handle gets as much: cuBLAS may pick its algorithm by the
 * workspace it has, and the stage profile times the shrinks on the main
 * handle, so both must choose alike. */
#define BLAS_WS_SIDE_BYTES BLAS_WS_BYTES
#define CHUNK_BYTES (16u << 20)

static size_t pad8(size_t v) { return (v + 7) & ~(size_t)7; }

/* ---- the common prologue ------------------------------------------------------ */

/* See cuda_internal.h. */
void ls_cuda_drain(ls_cuda *c) {
    const cudaError_t e_side = c->side ? cudaStreamSynchronize(c->side) : cudaSuccess;
    const cudaError_t e_main = c->stream ? cudaStreamSynchronize(c->stream) : cudaSuccess;
    (void)cudaGetLastError();
    /* A kernel fault found only here still poisons the process now, so
     * /ready says so before the next request finds it. */
    const cudaError_t sticky = ls_cuda_error_is_sticky(e_side) ? e_side : e_main;
    if (ls_cuda_error_is_sticky(sticky)) {
        ls_error scratch;
        ls_error_init(&scratch);
        (void)ls_cuda_fail(&scratch, sticky, "cudaStreamSynchronize (drain)", __FILE__, __LINE__);
        ls_error_free(&scratch);
    }
}

/* Every operation: refuse once poisoned, select the device. */
ls_status ls_cuda_op_begin(ls_cuda *c, ls_error *err) {
    if (ls_cuda_poisoned_flag())
        return ls_error_set(err, LS_DEVICE_ERROR, NULL, "CUDA context is unusable after an earlier error: %s",
                            ls_cuda_poison_message());
    cudaError_t e = cudaSetDevice(c->device);
    if (e != cudaSuccess) return ls_cuda_fail(err, e, "cudaSetDevice", __FILE__, __LINE__);
    return LS_OK;
}

/* ---- free --------------------------------------------------------------------- */

/* Releases whatever create managed to set up (backend.c frees the rest);
 * errors are ignored since the context may already be poisoned. */
static void cuda_free(ls_backend *be) {
    ls_cuda *c = ls_cuda_of(be);
    if (c) {
        cudaSetDevice(c->device);
        ls_cuda_drain(c);
        const ls_graph_cache *g = &c->graphs;
        if (g->captures || g->failures)
            ls_log_info("cuda backend: CUDA graphs: %llu captured, %llu replays, %llu failed, %llu evicted (%llu never "
                        "replayed)%s",
                        (unsigned long long)g->captures, (unsigned long long)g->hits, (unsigned long long)g->failures,
                        (unsigned long long)g->evicted, (unsigned long long)g->wasted,
                        g->stopped ? "; capture had stopped" : "");
        ls_graph_cache_free(&c->graphs);
        if (c->blas) cublasDestroy(c->blas);
        if (c->blas_side) cublasDestroy(c->blas_side);
        if (c->ev_fork) cudaEventDestroy(c->ev_fork);
        if (c->ev_join) cudaEventDestroy(c->ev_join);
        if (c->side) cudaStreamDestroy(c->side);
        if (c->ev_start) cudaEventDestroy(c->ev_start);
        if (c->ev_stop) cudaEventDestroy(c->ev_stop);
        if (c->stream) cudaStreamDestroy(c->stream);
        for (int i = 0; i < c->n_parts; i++) cudaFree(c->d_parts[i]);
        if (c->h_xc && c->h_xc != c->h_io) cudaFreeHost(c->h_xc);
        if (c->h_io) cudaFreeHost(c->h_io);
        if (c->h_gam) cudaFreeHost(c->h_gam);
        if (c->h_tasks) cudaFreeHost(c->h_tasks);
        if (c->h_gsel) cudaFreeHost(c->h_gsel);
        if (c->h_der) cudaFreeHost(c->h_der);
        for (int i = 0; i < 2; i++) {
            if (c->h_chunk[i]) cudaFreeHost(c->h_chunk[i]);
            if (c->chunk_done[i]) cudaEventDestroy(c->chunk_done[i]);
        }
        (void)cudaGetLastError();
        free(c->h_canon);
        free(c->h_der32);
        free(c->rank);
        free(c->gflag);
        ls_nvml_close(c->nvml);
        free(c);
    }
    be->ctx = NULL;
}

/* ---- create ------------------------------------------------------------------- */

typedef struct {
    void **dst;
    size_t bytes;
} dev_part;

static ls_status pinned(void **dst, size_t bytes, ls_error *err) {
    cudaError_t e = cudaMallocHost(dst, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        *dst = NULL;
        (void)cudaGetLastError();
        return ls_error_set(err, LS_DEVICE_ERROR, NULL, "cuda backend: cannot pin %.1f MiB of host staging memory (%s)",
                            MIB(bytes), cudaGetErrorString(e));
    }
    return LS_OK;
}

/* NVML for the device's utilisation gauge: optional, so a failure is a
 * warning that says why the series is absent, never an error. */
static void cuda_open_nvml(ls_cuda *c) {
    char bus[64], why[256];
    cudaError_t e = cudaDeviceGetPCIBusId(bus, (int)sizeof bus, c->device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        ls_log_warn("cuda backend: no device utilisation in /metrics: cudaDeviceGetPCIBusId failed (%s)",
                    cudaGetErrorName(e));
        return;
    }
    c->nvml = ls_nvml_open(NULL, bus, why, sizeof why);
    if (!c->nvml) ls_log_warn("cuda backend: no device utilisation in /metrics: %s", why);
}

/* Takes device device_id and says what it is; refuses a device that can
 * run none of this binary's kernels (an older architecture than it was
 * built for), which would otherwise fail every forward while /ready
 * answers 200. */
static ls_status cuda_open_device(ls_cuda *c, int device_id, ls_error *err) {
    int count = 0;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return ls_error_set(err, LS_DEVICE_ERROR,
                            "serve on the CPU engine with --device cpu (--device auto picks it when no GPU "
                            "answers); for a GPU, nvidia-smi must list it and the container must be given it",
                            "cuda backend: no CUDA device answers (CUDA runtime: %s)",
                            ce != cudaSuccess ? cudaGetErrorString(ce) : "device count is 0");
    }
    if (device_id < 0 || device_id >= count)
        return ls_error_set(err, LS_DEVICE_ERROR, NULL, "cuda backend: device %d does not exist (%d device(s))",
                            device_id, count);
    c->device = device_id;
    LS_CUDA_TRY(err, cudaSetDevice(c->device));
    cudaDeviceProp prop;
    LS_CUDA_TRY(err, cudaGetDeviceProperties(&prop, c->device));
    snprintf(c->device_name, sizeof c->device_name, "%s", prop.name);
    c->num_sms = prop.multiProcessorCount;
    ce = ls_cuda_kernels_loadable();
    if (ce != cudaSuccess) {
        char hint[160];
        snprintf(hint, sizeof hint,
                 "rebuild with -DCMAKE_CUDA_ARCHITECTURES naming this device's architecture, e.g. \"%d%d-real;%s\"",
                 prop.major, prop.minor, "90-virtual");
        return ls_error_set(err, LS_DEVICE_ERROR, hint,
                            "cuda backend: device %d (%s) has compute capability %d.%d, and this binary holds code "
                            "for CUDA architectures %s only (%s)",
                            c->device, c->device_name, prop.major, prop.minor, LS_CUDA_ARCHS, cudaGetErrorName(ce));
    }
    return LS_OK;
}

/* Sizes of everything, from the config; no device call. */
static void cuda_sizes(ls_cuda *c, const ls_backend_config *cfg) {
    const ls_dims *d = &cfg->dims;
    const ls_pool_dims *p = &cfg->pool;
    c->dims = *d;
    c->pool = *p;
    c->n = d->n, c->H = d->H, c->F = d->F, c->L = d->L;
    c->S = p->slots, c->R = p->max_rank, c->O = ls_pool_outer(d, p), c->max_tokens = p->max_tokens;
    c->gated = d->gate;
    c->dt = cfg->dtype;
    c->esz = ls_dtype_size(c->dt);
    c->cdt = ls_cuda_type(c->dt);
    c->ct = c->dt == LS_DTYPE_F32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
    c->sgmv_mode = LS_CUDA_SGMV_AUTO;
    ls_gemm_plan_make(d, p, &c->gplan);
    c->canon = ls_pool_layout(d, p);
    const ls_lora_derived_lens dl = ls_lora_derived_lens_of(d, p);
    c->der_agu = 0;
    c->der_b13 = pad8(dl.agu);
    c->der_ad = c->der_b13 + pad8(dl.b13);
    c->der_bd = c->der_ad + pad8(dl.adcat);
    c->der_len = c->der_bd + pad8(dl.bdcat);
    c->max_tasks = (int)(c->max_tokens / LS_SGMV_BM + c->S + 1);
    c->blas_ws_bytes = BLAS_WS_BYTES;
    c->blas_ws_side_bytes = BLAS_WS_SIDE_BYTES;
    /* A chunk holds at least one row of either weight matrix. */
    c->chunk_bytes = CHUNK_BYTES;
    if (c->chunk_bytes < (size_t)c->H * sizeof(float)) c->chunk_bytes = (size_t)c->H * sizeof(float);
    if (c->chunk_bytes < (size_t)c->n * c->F * c->esz) c->chunk_bytes = (size_t)c->n * c->F * c->esz;
}

/* Stream, events and cuBLAS on the stream. */
static ls_status cuda_streams(ls_cuda *c, ls_error *err) {
    LS_CUDA_TRY(err, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    LS_CUDA_TRY(err, cudaEventCreate(&c->ev_start));
    LS_CUDA_TRY(err, cudaEventCreate(&c->ev_stop));
    for (int i = 0; i < 2; i++) LS_CUDA_TRY(err, cudaEventCreateWithFlags(&c->chunk_done[i], cudaEventDisableTiming));
    LS_CUDA_TRY(err, cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking));
    LS_CUDA_TRY(err, cudaEventCreateWithFlags(&c->ev_fork, cudaEventDisableTiming));
    LS_CUDA_TRY(err, cudaEventCreateWithFlags(&c->ev_join, cudaEventDisableTiming));
    LS_CUBLAS_TRY(err, cublasCreate(&c->blas));
    LS_CUBLAS_TRY(err, cublasSetStream(c->blas, c->stream));
    LS_CUBLAS_TRY(err, cublasCreate(&c->blas_side));
    LS_CUBLAS_TRY(err, cublasSetStream(c->blas_side, c->side));
    /* No TF32 anywhere: f32 weights must agree with the CPU to 1e-5. The
     * 16-bit GEMMs write 16-bit outputs: split-K partial sums must still
     * be added in fp32, not in the output type. */
    const cublasMath_t math = c->dt == LS_DTYPE_F32
                                  ? CUBLAS_PEDANTIC_MATH
                                  : (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    LS_CUBLAS_TRY(err, cublasSetMathMode(c->blas, math));
    LS_CUBLAS_TRY(err, cublasSetMathMode(c->blas_side, math));
    return LS_OK;
}

/* Every device buffer, once, after saying what will not fit; then zeroed
 * (an empty slot must add nothing). *weights and *pool get their bytes. */
static ls_status cuda_alloc_device(ls_cuda *c, size_t *weights, size_t *pool, ls_error *err) {
    const size_t n = c->n, H = c->H, F = c->F, L = c->L, S = c->S, R = c->R, O = c->O, Tm = c->max_tokens;
    const size_t esz = c->esz;
    const int f32 = c->dt == LS_DTYPE_F32;
    const size_t split_rows = Tm < LS_SGMV_SPLIT_ROWS ? Tm : LS_SGMV_SPLIT_ROWS;
    dev_part parts[LS_CUDA_MAX_PARTS] = {
        {&c->d_w13, L * n * 2 * F * H * esz},
        {&c->d_w2, L * H * n * F * esz},
        {(void **)&c->d_gate, c->gated ? L * H * sizeof(float) : 0},
        {&c->d_der, S * L * c->der_len * esz},
        {(void **)&c->d_gdelta, c->gate_lora ? S * L * H * sizeof(float) : 0},
        {(void **)&c->d_x32, f32 || c->gated ? Tm * H * sizeof(float) : 0},
        {&c->d_xc, f32 ? 0 : Tm * H * esz},
        {(void **)&c->d_gam, Tm * n * sizeof(float)},
        {(void **)&c->d_z, Tm * n * 2 * F * sizeof(float)},
        {&c->d_a, Tm * n * F * esz},
        {(void **)&c->d_v32, Tm * O * 2 * R * sizeof(float)},
        {&c->d_vc, Tm * O * 2 * R * esz},
        {(void **)&c->d_w32, Tm * O * R * sizeof(float)},
        {&c->d_wc, Tm * O * R * esz},
        {(void **)&c->d_y, Tm * H * sizeof(float)},
        {(void **)&c->d_tasks, (size_t)c->max_tasks * sizeof(int4)},
        {(void **)&c->d_gsel, c->gate_lora ? Tm * sizeof(int) : 0},
        {(void **)&c->d_part, LS_SGMV_SPLIT_MAX * split_rows * O * 2 * R * sizeof(float)},
        {&c->d_blas_ws, c->blas_ws_bytes},
        {&c->d_blas_ws_side, c->blas_ws_side_bytes},
    };
    size_t total = 0;
    for (int i = 0; i < LS_CUDA_MAX_PARTS; i++) total += parts[i].bytes;
    c->device_bytes = total;
    *weights = parts[0].bytes + parts[1].bytes + parts[2].bytes;
    *pool = parts[3].bytes + parts[4].bytes; /* derived operands and gate deltas */
    size_t free_b = 0, total_b = 0;
    LS_CUDA_TRY(err, cudaMemGetInfo(&free_b, &total_b));
    cudaError_t ce = total <= free_b ? cudaSuccess : cudaErrorMemoryAllocation;
    for (int i = 0; i < LS_CUDA_MAX_PARTS && ce == cudaSuccess; i++) {
        if (!parts[i].bytes) continue;
        ce = cudaMalloc(parts[i].dst, parts[i].bytes);
        if (ce == cudaSuccess) c->d_parts[c->n_parts++] = *parts[i].dst;
    }
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        return ls_error_set(err, LS_DEVICE_ERROR,
                            "lower --max-batch-tokens, --slots, --max-rank or --layers, or use a larger device",
                            "cuda backend: device %d (%s) needs %.1f MiB (weights %.1f, LoRA pool %.1f, scratch "
                            "%.1f) but only %.1f MiB of %.1f MiB are free (%s)",
                            c->device, c->device_name, MIB(total), MIB(*weights), MIB(*pool),
                            MIB(total - *weights - *pool), MIB(free_b), MIB(total_b), cudaGetErrorName(ce));
    }
    if (f32) c->d_xc = c->d_x32;
    for (int i = 0; i < LS_CUDA_MAX_PARTS; i++)
        if (parts[i].bytes) LS_CUDA_TRY(err, cudaMemsetAsync(*parts[i].dst, 0, parts[i].bytes, c->stream));
    LS_CUBLAS_TRY(err, cublasSetWorkspace(c->blas, c->d_blas_ws, c->blas_ws_bytes));
    LS_CUBLAS_TRY(err, cublasSetWorkspace(c->blas_side, c->d_blas_ws_side, c->blas_ws_side_bytes));
    return LS_OK;
}

/* Host memory: the canonical factors of every slot (slot_read's), the
 * ranks, one slot write's derived operands, and the pinned staging. */
static ls_status cuda_alloc_host(ls_cuda *c, ls_error *err) {
    const size_t S = c->S, L = c->L, H = c->H, Tm = c->max_tokens;
    c->h_canon = (float *)calloc(S * L * c->canon.total, sizeof(float));
    c->rank = (int *)calloc(S * L, sizeof(int));
    c->gflag = (unsigned char *)calloc(S * L, 1);
    c->h_der32 = (float *)calloc(c->der_len, sizeof(float));
    if (!c->h_canon || !c->rank || !c->gflag || !c->h_der32)
        return ls_error_set(err, LS_DEVICE_ERROR, "lower --slots, --max-rank or --layers",
                            "cuda backend: cannot allocate %.1f MiB of host memory for the slots' factors",
                            MIB(S * L * c->canon.total * sizeof(float)));
    LS_TRY(pinned((void **)&c->h_io, Tm * H * sizeof(float), err));
    if (c->dt == LS_DTYPE_F32)
        c->h_xc = c->h_io;
    else
        LS_TRY(pinned(&c->h_xc, Tm * H * c->esz, err));
    LS_TRY(pinned((void **)&c->h_gam, Tm * c->n * sizeof(float), err));
    LS_TRY(pinned((void **)&c->h_tasks, (size_t)c->max_tasks * sizeof(int4), err));
    if (c->gate_lora) LS_TRY(pinned((void **)&c->h_gsel, Tm * sizeof(int), err));
    LS_TRY(pinned(&c->h_der, c->der_len * c->esz, err));
    for (int i = 0; i < 2; i++) LS_TRY(pinned(&c->h_chunk[i], c->chunk_bytes, err));
    return LS_OK;
}

static void graph_destroy(void *g) { (void)cudaGraphExecDestroy((cudaGraphExec_t)g); }

/* Takes the device and allocates everything the backend will use, once;
 * the caller unwinds (ls_backend_free) from whatever was set. */
static ls_status cuda_init(ls_backend *be, const ls_backend_config *cfg, int device_id, int graphs, int gate_lora,
                           ls_error *err) {
    ls_cuda *c = ls_cuda_of(be);
    LS_TRY(cuda_open_device(c, device_id, err));
    cuda_sizes(c, cfg);
    c->gate_lora = c->gated && gate_lora;
    char why[256];
    if (!ls_gemm_plan_fits_grid(&c->gplan, LS_SGMV_TILE_N, why, sizeof why))
        return ls_error_set(err, LS_DEVICE_ERROR, "lower --max-rank, or use fewer shared experts per block",
                            "cuda backend: %s", why);
    LS_TRY(cuda_streams(c, err));
    if (!ls_graph_cache_init(&c->graphs, graphs, graph_destroy))
        return ls_error_set(err, LS_DEVICE_ERROR, NULL, "cuda backend: out of host memory");
    size_t weights = 0, pool = 0;
    LS_TRY(cuda_alloc_device(c, &weights, &pool, err));
    LS_TRY(cuda_alloc_host(c, err));
    LS_CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    /* What the forward reads its adapters from (gpu/backend.h): the
     * derived operands; the canonical copy on the host is slot_read's. */
    be->pool_bytes = pool;
    cuda_open_nvml(c);
    ls_log_info("cuda backend: device %d (%s, %d SMs), %s weights: %.1f MiB weights, %.1f MiB LoRA pool, %.1f MiB "
                "scratch for %d tokens; %.1f MiB of host memory keep the slots' fp32 factors",
                c->device, c->device_name, c->num_sms, ls_dtype_name(c->dt), MIB(weights), MIB(pool),
                MIB(c->device_bytes - weights - pool), c->max_tokens,
                MIB((size_t)c->S * c->L * c->canon.total * sizeof(float)));
    if (graphs > 0)
        ls_log_info("cuda backend: forward shapes seen twice are replayed as CUDA graphs (up to %d kept)", graphs);
    else
        ls_log_info("cuda backend: no CUDA graphs (--cuda-graphs 0): every forward launches its kernels");
    return LS_OK;
}

/* ---- operations ----------------------------------------------------------------- */

static ls_status cuda_memory(ls_backend *be, size_t *free_bytes, size_t *total_bytes, ls_error *err) {
    ls_cuda *c = ls_cuda_of(be);
    LS_TRY(ls_cuda_op_begin(c, err));
    cudaError_t e = cudaMemGetInfo(free_bytes, total_bytes);
    return e == cudaSuccess ? LS_OK : ls_cuda_fail(err, e, "cudaMemGetInfo", __FILE__, __LINE__);
}

/* One chunk of a weight upload: rows r0..r1-1 of a device matrix
 * converted into a pinned chunk (each thread its own rows). */
typedef struct {
    const ls_cuda *c;
    const ls_typed *src;
    int w13; /* 1: W13 rows in device order, 0: W2cat rows */
    size_t row0;
    char *dst;
} chunk_job;

static void chunk_rows(void *ctx, size_t r0, size_t r1) {
    const chunk_job *j = (const chunk_job *)ctx;
    const ls_cuda *c = j->c;
    const size_t n = c->n, H = c->H, F = c->F, esz = c->esz, ss = ls_dtype_size(j->src->dtype);
    const char *src = (const char *)j->src->data;
    for (size_t r = r0; r < r1; r++) {
        const size_t row = j->row0 + r;
        if (j->w13) {
            const size_t from = ls_w13_device_source_row(c->dims.w13_layout, c->n, c->F, row);
            ls_convert_dtype(j->src->dtype, src + from * H * ss, c->dt, j->dst + r * H * esz, H);
        } else { /* W2 [n, H, F] -> W2cat row h = [W2[0, h, :], ..., W2[n-1, h, :]] */
            for (size_t e = 0; e < n; e++)
                ls_convert_dtype(j->src->dtype, src + (e * H + row) * F * ss, c->dt, j->dst + (r * n + e) * F * esz,
                                 F);
        }
    }
}

/* Uploads a [rows, width] device matrix a chunk at a time: the host
 * converts the next chunk on several threads while the previous one is
 * copied, each pinned chunk reused only once its copy is done. */
static ls_status upload_matrix(ls_cuda *c, const ls_typed *src, int w13, size_t rows, size_t width, char *dst,
                               ls_error *err) {
    const size_t row_bytes = width * c->esz, per = c->chunk_bytes / row_bytes;
    const int threads = ls_parallel_rows_threads();
    int k = 0;
    for (size_t r0 = 0; r0 < rows; r0 += per, k ^= 1) {
        const size_t cnt = rows - r0 < per ? rows - r0 : per;
        LS_CUDA_TRY(err, cudaEventSynchronize(c->chunk_done[k]));
        chunk_job job = {c, src, w13, r0, (char *)c->h_chunk[k]};
        ls_parallel_rows(cnt, threads, chunk_rows, &job);
        LS_CUDA_TRY(err, cudaMemcpyAsync(dst + r0 * row_bytes, c->h_chunk[k], cnt * row_bytes, cudaMemcpyHostToDevice,
                                         c->stream));
        LS_CUDA_TRY(err, cudaEventRecord(c->chunk_done[k], c->stream));
    }
    return LS_OK;
}

/* Each tensor is converted on the host from its stored dtype (a float
 * dtype, as ls_backend_upload_base made sure) to the backend's
 * (ls_convert_dtype: exact when that is at least as wide):
 * W13 into the device's gate-first row order, W2 [n, H, F] into W2cat
 * [H, n*F] so the down projection of every expert is one GEMM. */
static ls_status upload_base_locked(ls_cuda *c, int layer, const ls_base_layer *w, ls_error *err) {
    const size_t n = c->n, H = c->H, F = c->F, esz = c->esz;
    LS_TRY(upload_matrix(c, &w->w13, 1, 2 * n * F, H, (char *)c->d_w13 + (size_t)layer * 2 * n * F * H * esz, err));
    LS_TRY(upload_matrix(c, &w->w2, 0, H, n * F, (char *)c->d_w2 + (size_t)layer * H * n * F * esz, err));
    if (c->gated) {
        LS_CUDA_TRY(err, cudaStreamSynchronize(c->stream));
        ls_convert_dtype(w->gate.dtype, w->gate.data, LS_DTYPE_F32, c->h_chunk[0], H);
        LS_CUDA_TRY(err, cudaMemcpyAsync(c->d_gate + (size_t)layer * H, c->h_chunk[0], H * sizeof(float),
                                         cudaMemcpyHostToDevice, c->stream));
    }
    LS_CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    return LS_OK;
}

static ls_status cuda_upload_base(ls_backend *be, int layer, const ls_base_layer *w, ls_error *err) {
    ls_cuda *c = ls_cuda_of(be);
    LS_TRY(ls_cuda_op_begin(c, err));
    ls_status st = upload_base_locked(c, layer, w, err);
    if (st != LS_OK) ls_cuda_drain(c); /* a copy may still read a chunk */
    return st;
}

/* The derived operands (gpu/lora_plan.h) are made on the host in fp32,
 * rounded to the compute dtype into pinned staging and copied over the
 * slot's in place; the canonical factors stay on the host. */
static ls_status slot_write_locked(ls_cuda *c, int slot, int layer, const ls_slot_factors *f, ls_error *err) {
    const ls_dims *d = &c->dims;
    const ls_pool_dims *p = &c->pool;
    float *der = c->h_der32;
    memset(der, 0, c->der_len * sizeof(float)); /* the padding too */
    ls_lora_derive(d, p, f, der + c->der_agu, der + c->der_b13, der + c->der_ad, der + c->der_bd);
    ls_convert_dtype(LS_DTYPE_F32, der, c->dt, c->h_der, c->der_len);
    LS_CUDA_TRY(err, cudaMemcpyAsync(ls_cuda_der(c, slot, layer), c->h_der, c->der_len * c->esz,
                                     cudaMemcpyHostToDevice, c->stream));
    const size_t at = (size_t)slot * c->L + layer;
    if (f->gate_d) /* backend.c lets one through only with gate_lora */
        LS_CUDA_TRY(err, cudaMemcpyAsync(c->d_gdelta + at * c->H, f->gate_d, (size_t)c->H * sizeof(float),
                                         cudaMemcpyHostToDevice, c->stream));
    LS_CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    /* Host state changes only once the device holds the new operands. */
    float *canon = ls_cuda_canon(c, slot, layer);
    const float *src[LS_FACTORS] = {f->gu_a, f->gu_b, f->d_a, f->d_b};
    for (int k = 0; k < LS_FACTORS; k++) memcpy(canon + c->canon.off[k], src[k], c->canon.len[k] * sizeof(float));
    c->rank[at] = ls_slot_factors_rank(d, p, f);
    if (c->gate_lora) c->gflag[at] = f->gate_d != NULL;
    return LS_OK;
}

static ls_status cuda_slot_write(ls_backend *be, int slot, int layer, const ls_slot_factors *f, ls_error *err) {
    ls_cuda *c = ls_cuda_of(be);
    LS_TRY(ls_cuda_op_begin(c, err));
    ls_status st = slot_write_locked(c, slot, layer, f, err);
    if (st != LS_OK) ls_cuda_drain(c); /* the copy may still read h_der */
    return st;
}

static ls_status slot_clear_locked(ls_cuda *c, int slot, ls_error *err) {
    /* [S][L] order: a slot's layers are one run in every buffer. */
    const size_t L = c->L;
    LS_CUDA_TRY(err, cudaMemsetAsync(ls_cuda_der(c, slot, 0), 0, L * c->der_len * c->esz, c->stream));
    LS_CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    memset(ls_cuda_canon(c, slot, 0), 0, L * c->canon.total * sizeof(float));
    for (size_t l = 0; l < L; l++) c->rank[(size_t)slot * L + l] = 0;
    memset(c->gflag + (size_t)slot * L, 0, L); /* the deltas stay, unread */
    return LS_OK;
}

static ls_status cuda_slot_clear(ls_backend *be, int slot, ls_error *err) {
    ls_cuda *c = ls_cuda_of(be);
    LS_TRY(ls_cuda_op_begin(c, err));
    return slot_clear_locked(c, slot, err);
}

/* From the host copy: no device call. A poisoned context still refuses
 * it (ls_cuda_op_begin), as every operation. */
static ls_status cuda_slot_read(ls_backend *be, int slot, int layer, float *gu_a, float *gu_b, float *d_a,
                                float *d_b, ls_error *err) {
    ls_cuda *c = ls_cuda_of(be);
    LS_TRY(ls_cuda_op_begin(c, err));
    const float *h = ls_cuda_canon(c, slot, layer);
    float *dst[LS_FACTORS] = {gu_a, gu_b, d_a, d_b};
    for (int k = 0; k < LS_FACTORS; k++)
        if (dst[k]) memcpy(dst[k], h + c->canon.off[k], c->canon.len[k] * sizeof(float));
    return LS_OK;
}

static ls_status cuda_synchronize(ls_backend *be, ls_error *err) {
    ls_cuda *c = ls_cuda_of(be);
    LS_TRY(ls_cuda_op_begin(c, err));
    cudaError_t e = cudaStreamSynchronize(c->stream);
    return e == cudaSuccess ? LS_OK : ls_cuda_fail(err, e, "cudaStreamSynchronize", __FILE__, __LINE__);
}

static bool cuda_poisoned(const ls_backend *be) {
    (void)be;
    return ls_cuda_poisoned_flag() != 0;
}

/* c->nvml is set once at create; NVML's calls are thread-safe. */
static bool cuda_utilization(const ls_backend *be, unsigned *percent) {
    return ls_nvml_gpu_utilization(ls_cuda_of(be)->nvml, percent);
}

static const ls_backend_ops cuda_ops = {
    /* .name = */ "cuda",
    /* .free = */ cuda_free,
    /* .memory = */ cuda_memory,
    /* .upload_base = */ cuda_upload_base,
    /* .slot_write = */ cuda_slot_write,
    /* .slot_clear = */ cuda_slot_clear,
    /* .slot_read = */ cuda_slot_read,
    /* .forward = */ ls_cuda_forward,
    /* .synchronize = */ cuda_synchronize,
    /* .poisoned = */ cuda_poisoned,
    /* .utilization = */ cuda_utilization,
};

/* ---- public entry points ------------------------------------------------------- */

/* On success *out is owned by the caller (ls_backend_free); on failure
 * *out is NULL and everything allocated so far is released. cuda NULL:
 * device 0. */
ls_status ls_backend_cuda_create(const ls_backend_config *cfg, const ls_cuda_settings *cuda, ls_backend **out,
                                 ls_error *err) {
    *out = NULL;
    if (ls_cuda_poisoned_flag())
        return ls_error_set(err, LS_DEVICE_ERROR, NULL, "CUDA context is unusable after an earlier error: %s",
                            ls_cuda_poison_message());
    ls_backend *be = NULL;
    LS_TRY(ls_backend_new(&cuda_ops, cfg, &be, err));
    /* The gate kernel's per-slot delta has not run on a device: unless a
     * test asks for it, the pool refuses adapters with factors of the
     * shared-expert gate (lora/adapter_peft.c). */
    be->pool.no_gate_lora = !(cuda && cuda->gate_lora);
    ls_cuda *c = (ls_cuda *)calloc(1, sizeof *c);
    if (!c) {
        ls_backend_free(be);
        return ls_error_set(err, LS_DEVICE_ERROR, NULL, "cuda backend: out of host memory");
    }
    be->ctx = c;
    const int graphs = !cuda || cuda->graphs == 0 ? LS_CUDA_GRAPHS_DEFAULT : cuda->graphs < 0 ? 0 : cuda->graphs;
    ls_status st = cuda_init(be, cfg, cuda ? cuda->device_id : 0, graphs, cuda && cuda->gate_lora, err);
    if (st != LS_OK) {
        ls_backend_free(be);
        return st;
    }
    be->pool.no_gate_lora = !c->gate_lora; /* what it applies: a gated model's, when asked */
    *out = be;
    return LS_OK;
}

int ls_backend_cuda_available(void) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return count > 0;
}

int ls_backend_cuda_poisoned(const ls_backend *be) {
    (void)be;
    return ls_cuda_poisoned_flag();
}

const char *ls_backend_cuda_device_name(const ls_backend *be) { return ls_cuda_of(be)->device_name; }

void ls_backend_cuda_set_sgmv_mode(ls_backend *be, ls_cuda_sgmv_mode mode) { ls_cuda_of(be)->sgmv_mode = mode; }

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static ls_status copy_bandwidth_locked(ls_cuda *c, size_t bytes, int iters, double *bytes_per_s, ls_error *err) {
    char *buf = NULL;
    float *ms = (float *)calloc((size_t)iters, sizeof(float));
    if (!ms) return ls_error_set(err, LS_DEVICE_ERROR, NULL, "out of host memory");
    cudaError_t e = cudaMalloc((void **)&buf, 2 * bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        free(ms);
        return ls_error_set(err, LS_DEVICE_ERROR, NULL, "cannot allocate 2 x %.1f MiB for the copy test", MIB(bytes));
    }
    ls_status st = LS_OK;
    for (int i = -2; i < iters && st == LS_OK; i++) {
        if ((e = cudaEventRecord(c->ev_start, c->stream)) != cudaSuccess ||
            (e = cudaMemcpyAsync(buf + bytes, buf, bytes, cudaMemcpyDeviceToDevice, c->stream)) != cudaSuccess ||
            (e = cudaEventRecord(c->ev_stop, c->stream)) != cudaSuccess ||
            (e = cudaEventSynchronize(c->ev_stop)) != cudaSuccess ||
            (i >= 0 && (e = cudaEventElapsedTime(&ms[i], c->ev_start, c->ev_stop)) != cudaSuccess))
            st = ls_cuda_fail(err, e, "device-to-device copy", __FILE__, __LINE__);
    }
    (void)cudaFree(buf);
    (void)cudaGetLastError(); /* a failed free must not be blamed on the next launch */
    if (st == LS_OK) {
        qsort(ms, (size_t)iters, sizeof(float), cmp_float);
        float med = ms[iters / 2];
        *bytes_per_s = med > 0 ? 2.0 * (double)bytes / (med * 1e-3) : 0.0;
    }
    free(ms);
    return st;
}

/* See cuda_backend.h. */
const ls_graph_cache *ls_backend_cuda_graphs(ls_backend *be) { return &ls_cuda_of(be)->graphs; }

/* See cuda_backend.h. A graph still running is freed when it ends. */
void ls_backend_cuda_clear_graphs(ls_backend *be) { ls_graph_cache_clear(&ls_cuda_of(be)->graphs); }

/* A benchmark helper: allocates its scratch here (not a serving path). */
ls_status ls_backend_cuda_copy_bandwidth(ls_backend *be, size_t bytes, int iters, double *bytes_per_s,
                                         ls_error *err) {
    ls_cuda *c = ls_cuda_of(be);
    if (bytes == 0 || iters < 1) return ls_error_set(err, LS_INTERNAL, NULL, "copy_bandwidth: bytes and iters > 0");
    LS_TRY(ls_cuda_op_begin(c, err));
    return copy_bandwidth_locked(c, bytes, iters, bytes_per_s, err);
}
