/* The CUDA forward of docs/math.md in the stages every backend names alike
 * (gpu/backend_impl.h), on the token plan's rows (gpu/token_plan.h: each
 * slot's tokens contiguous, base-only tokens last): gather on the host
 * into pinned memory, x rounded to the compute dtype on the way; on the
 * device the GEMM list of gpu/lora_plan.h (shrink_gate_up, gate_up with
 * its LoRA expand, the fused SwiGLU x gamma, shrink_down, down with its
 * LoRA expand), each LoRA GEMM cut to the slot's rank; scatter back on
 * the host. The LoRA GEMMs are cuBLAS when every adapted token uses one
 * slot, one SGMV launch each otherwise (or, not by default, BGMV
 * shrinks, or cuBLAS once per slot). Also the device-only timing entry
 * point of the benchmark. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cuda/cuda_internal.h"
#include "gpu/stage_rows.h"

extern "C" {
#include "common/log.h"
}

/* ---- the plan's SGMV tasks --------------------------------------------------------- */

/* The CUDA part of the plan: the LoRA's rank, and the SGMV tasks
 * (LS_SGMV_BM rows of one slot each, slots in the token plan's order,
 * each with that slot's rank) in pinned memory. A slot of rank 0 at this
 * layer has no task: every LoRA GEMM cuts to its rank, so its rows of
 * the shrinks' outputs are never read and its expands add nothing. */
static void plan_tasks(ls_cuda *c, int layer, const ls_token_plan *tp, bool has_gammas, ls_cuda_plan *p) {
    p->tokens = tp;
    p->has_gammas = has_gammas;
    p->T = tp->T;
    p->n_lora = tp->n_lora;
    p->n_slots = tp->n_slots;
    p->single_slot = tp->single_slot;
    p->layer = layer;
    p->rank = p->n_slots == 1 ? c->rank[(size_t)p->single_slot * c->L + layer] : 0;
    p->ntasks = 0;
    for (int s = 0; s < c->S && p->n_slots > 1; s++) {
        const int pos = tp->start[s], count = tp->start[s + 1] - pos;
        const int r = c->rank[(size_t)s * c->L + layer];
        for (int r0 = 0; r0 < count && r > 0; r0 += LS_SGMV_BM) {
            int rows = count - r0 < LS_SGMV_BM ? count - r0 : LS_SGMV_BM;
            c->h_tasks[p->ntasks++] = make_int4(pos + r0, rows, s, r);
        }
    }
    p->lora = p->n_slots > 1 ? p->ntasks > 0 : p->n_slots == 1 && p->rank > 0;
}

/* Whether this forward computes the shared-expert gate (from fp32 x). */
static bool needs_gate(const ls_cuda *c, const ls_cuda_plan *p) { return !p->has_gammas && c->gated; }

/* Each row's slot whose gate delta it adds, in plan order (-1: none):
 * the rows of a slot with a delta at the layer, whatever its rank there.
 * Copied every forward of a gated backend with gate_lora, so a graph's
 * gate kernel always reads it afresh. */
static void stage_gate_slots(ls_cuda *c, const ls_cuda_plan *p) {
    const ls_token_plan *tp = p->tokens;
    for (int i = 0; i < p->T; i++) c->h_gsel[i] = -1;
    for (int s = 0; s < c->S; s++) {
        if (!c->gflag[(size_t)s * c->L + p->layer]) continue;
        for (int i = tp->start[s]; i < tp->start[s + 1]; i++) c->h_gsel[i] = s;
    }
}

/* Stage gather: copies x in plan order through pinned memory, rounded to
 * the compute dtype on the way (gpu/stage_rows.h: the device gets half
 * the bytes and converts nothing), and in fp32 too when the gate reads
 * it; gammas, staged the same way; the SGMV tasks when more than one
 * slot is used and a kernel of ours reads them. Each part is copied as
 * soon as it is staged, so the copies overlap the staging of the next.
 * Without stage (the stage
 * profile) x and gammas are not read (the rows' gate slots, from the
 * plan, are) and only the copies are enqueued,
 * of whatever the pinned buffers hold: after a profile run's copy out,
 * h_io holds y, so fp32 x for the gate (and all of x with f32) is then
 * y's bytes, the same bytes and work with other values. Asynchronous. */
static ls_status gather_parts(ls_cuda *c, const ls_cuda_plan *p, const float *x, const float *gammas, bool stage,
                              ls_error *err) {
    const size_t H = c->H, n = c->n, T = p->T;
    const int *order = p->tokens->order;
    if (stage) ls_stage_rows(c->h_xc, c->dt, x, order, T, H);
    LS_CUDA_TRY(err, cudaMemcpyAsync(c->d_xc, c->h_xc, T * H * c->esz, cudaMemcpyHostToDevice, c->stream));
    if (needs_gate(c, p) && c->dt != LS_DTYPE_F32) {
        if (stage) ls_stage_rows(c->h_io, LS_DTYPE_F32, x, order, T, H);
        LS_CUDA_TRY(err, cudaMemcpyAsync(c->d_x32, c->h_io, T * H * sizeof(float), cudaMemcpyHostToDevice, c->stream));
    }
    if (needs_gate(c, p) && c->gate_lora) {
        stage_gate_slots(c, p); /* from the plan, not x: the profile's too */
        LS_CUDA_TRY(err, cudaMemcpyAsync(c->d_gsel, c->h_gsel, T * sizeof(int), cudaMemcpyHostToDevice, c->stream));
    }
    if (p->has_gammas) {
        if (stage) ls_stage_rows(c->h_gam, LS_DTYPE_F32, gammas, order, T, n);
        LS_CUDA_TRY(err, cudaMemcpyAsync(c->d_gam, c->h_gam, T * n * sizeof(float), cudaMemcpyHostToDevice, c->stream));
    }
    if (p->n_slots > 1 && c->sgmv_mode != LS_CUDA_SGMV_BLAS) /* per-slot cuBLAS reads no task */
        LS_CUDA_TRY(err, cudaMemcpyAsync(c->d_tasks, c->h_tasks, (size_t)p->ntasks * sizeof(int4),
                                         cudaMemcpyHostToDevice, c->stream));
    return LS_OK;
}

static ls_status gather(ls_cuda *c, const ls_cuda_plan *p, const float *x, const float *gammas, ls_error *err) {
    return gather_parts(c, p, x, gammas, true, err);
}

/* ---- the GEMMs of gpu/lora_plan.h ------------------------------------------------ */

/* A buffer of the plan on the device, and its element type. */
typedef struct {
    char *p;
    ls_dtype t;
} dev_buf;

static dev_buf dbuf(void *p, ls_dtype t) {
    dev_buf b = {(char *)p, t};
    return b;
}

/* Where op buffer b lives for this forward: the slot's derived operands
 * (slot 0's for SGMV, which steps by slot itself), the layer's weights,
 * the scratch (fp32 shrink outputs for SGMV, compute dtype for cuBLAS). */
static dev_buf op_buf(const ls_cuda *c, const ls_cuda_plan *p, ls_op_buf b, int slot, int sgmv) {
    const size_t esz = c->esz, nF = (size_t)c->n * c->F, H = c->H;
    char *der = ls_cuda_der(c, slot, p->layer);
    switch (b) {
    case LS_OPB_X: return dbuf(c->d_xc, c->dt);
    case LS_OPB_Z: return dbuf(c->d_z, LS_DTYPE_F32);
    case LS_OPB_A: return dbuf(c->d_a, c->dt);
    case LS_OPB_Y: return dbuf(c->d_y, LS_DTYPE_F32);
    case LS_OPB_V: return sgmv ? dbuf(c->d_v32, LS_DTYPE_F32) : dbuf(c->d_vc, c->dt);
    case LS_OPB_W: return sgmv ? dbuf(c->d_w32, LS_DTYPE_F32) : dbuf(c->d_wc, c->dt);
    case LS_OPB_W13: return dbuf((char *)c->d_w13 + (size_t)p->layer * 2 * nF * H * esz, c->dt);
    case LS_OPB_W2: return dbuf((char *)c->d_w2 + (size_t)p->layer * H * nF * esz, c->dt);
    case LS_OPB_AGU: return dbuf(der + c->der_agu * esz, c->dt);
    case LS_OPB_B13: return dbuf(der + c->der_b13 * esz, c->dt);
    case LS_OPB_ADCAT: return dbuf(der + c->der_ad * esz, c->dt);
    case LS_OPB_BDCAT: return dbuf(der + c->der_bd * esz, c->dt);
    }
    return dbuf(NULL, c->dt);
}

/* C[t, c_bs*b + j] = beta*C + sum_k X[t, x_bs*b + k] * W[w_bs*b + j*ldw + k]
 * for t < T, j < N, b < batch; all row-major, X and W in the compute
 * dtype. In cuBLAS's column-major terms that is C^T = W^T(op T) * X^T:
 * m = N, n = T. */
static ls_status gemm(ls_cuda *c, cublasHandle_t h, int T, int N, int K, const void *W, int ldw, long long w_bs, const void *X, int ldx,
                      long long x_bs, void *C, cudaDataType_t c_type, int ldc, long long c_bs, int batch, float beta,
                      ls_error *err) {
    const float alpha = 1.0f;
    if (batch == 1)
        LS_CUBLAS_TRY(err, cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W, c->cdt, ldw, X, c->cdt,
                                        ldx, &beta, C, c_type, ldc, c->ct, CUBLAS_GEMM_DEFAULT));
    else
        LS_CUBLAS_TRY(err, cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W, c->cdt,
                                                      ldw, w_bs, X, c->cdt, ldx, x_bs, &beta, C, c_type, ldc, c_bs,
                                                      batch, c->ct, CUBLAS_GEMM_DEFAULT));
    return LS_OK;
}

/* One op through cuBLAS handle h on rows row0..row0+rows-1: the base
 * GEMMs, and the LoRA GEMMs of one slot of rank r. */
static ls_status op_blas(ls_cuda *c, cublasHandle_t h, const ls_cuda_plan *p, const ls_gemm_op *op, int row0, int rows,
                         int slot, int r, ls_error *err) {
    const int N = ls_gemm_op_n(op, r), K = ls_gemm_op_k(op, r);
    const dev_buf C = op_buf(c, p, op->c, slot, 0), X = op_buf(c, p, op->x, slot, 0), W = op_buf(c, p, op->w, slot, 0);
    const size_t cs = ls_dtype_size(C.t), xs = ls_dtype_size(X.t), ws = ls_dtype_size(W.t);
    char *cp = C.p + ((long long)row0 * op->ldc + op->c_off) * cs;
    const char *xp = X.p + ((long long)row0 * op->ldx + op->x_off) * xs, *wp = W.p + op->w_off * ws;
    if (!op->sum_batches)
        return gemm(c, h, rows, N, K, wp, op->ldw, op->w_bs, xp, op->ldx, op->x_bs, cp, ls_cuda_type(C.t), op->ldc,
                    op->c_bs, op->batch, op->beta ? 1.0f : 0.0f, err);
    for (int b = 0; b < op->batch; b++) /* one after another: their sums meet in C */
        LS_TRY(gemm(c, h, rows, N, K, wp + b * op->w_bs * ws, op->ldw, 0, xp + b * op->x_bs * xs, op->ldx, 0,
                    cp + b * op->c_bs * cs, ls_cuda_type(C.t), op->ldc, 0, 1, 1.0f, err));
    return LS_OK;
}

/* One LoRA op as SGMV launches on stream over every task of the plan
 * (each task cut to its slot's rank). */
static ls_status op_sgmv(ls_cuda *c, cudaStream_t stream, const ls_cuda_plan *p, const ls_gemm_op *op,
                         ls_error *err) {
    const dev_buf C = op_buf(c, p, op->c, 0, 1), X = op_buf(c, p, op->x, 0, 1), W = op_buf(c, p, op->w, 0, 1);
    const size_t xs = ls_dtype_size(X.t), ws = ls_dtype_size(W.t);
    ls_sgmv_params a;
    memset(&a, 0, sizeof a);
    a.tasks = c->d_tasks;
    a.ntasks = p->ntasks;
    a.nrows = p->n_lora;
    a.X = X.p + op->x_off * xs;
    a.xt = X.t;
    a.ldx = op->ldx;
    a.x_bs = op->x_bs;
    a.W = W.p + op->w_off * ws;
    a.wt = W.t;
    a.w_ss = (long long)c->L * (long long)c->der_len;
    a.ldw = op->ldw;
    a.w_bs = op->w_bs;
    a.C = (float *)C.p + op->c_off;
    a.ldc = op->ldc;
    a.c_bs = op->c_bs;
    a.N = op->N;
    a.K = op->K;
    a.batch = op->batch;
    a.cut = (int)op->cut;
    a.beta = op->beta;
    a.split = op->split;
    a.part = c->d_part;
    const int wmma = c->sgmv_mode != LS_CUDA_SGMV_SIMT && c->dt != LS_DTYPE_F32;
    if (c->sgmv_mode == LS_CUDA_SGMV_BGMV && op->cut == LS_CUT_N && !op->sum_batches) {
        LS_CUDA_TRY(err, ls_cuda_bgmv(&a, stream));
        return LS_OK;
    }
    if (!op->sum_batches) {
        LS_CUDA_TRY(err, ls_cuda_sgmv(&a, wmma, c->num_sms, stream));
        return LS_OK;
    }
    const int batch = a.batch;
    const char *x0 = (const char *)a.X, *w0 = (const char *)a.W;
    a.batch = 1;
    for (int b = 0; b < batch; b++) { /* one after another: their sums meet in C */
        a.X = x0 + b * op->x_bs * xs;
        a.W = w0 + b * op->w_bs * ws;
        LS_CUDA_TRY(err, ls_cuda_sgmv(&a, wmma, c->num_sms, stream));
    }
    return LS_OK;
}

/* One LoRA op as one cuBLAS call per slot on that slot's rows, at its
 * rank (a slot without rows or of rank 0 has none): the single-slot path,
 * once per slot. */
static ls_status op_blas_slots(ls_cuda *c, cublasHandle_t h, const ls_cuda_plan *p, const ls_gemm_op *op,
                               ls_error *err) {
    const int *start = p->tokens->start;
    for (int s = 0; s < c->S; s++) {
        const int rows = start[s + 1] - start[s], r = c->rank[(size_t)s * c->L + p->layer];
        if (rows > 0 && r > 0) LS_TRY(op_blas(c, h, p, op, start[s], rows, s, r, err));
    }
    return LS_OK;
}

/* Op i of the plan: base GEMMs on every row, LoRA GEMMs on the adapted
 * rows (cuBLAS for one slot; SGMV, or cuBLAS per slot, for several) or
 * not at all; on the side stream (and its handle) when side. */
static ls_status run_op(ls_cuda *c, const ls_cuda_plan *p, int i, int side, ls_error *err) {
    const ls_gemm_op *op = &c->gplan.op[i];
    cublasHandle_t h = side ? c->blas_side : c->blas;
    if (!op->lora) return op_blas(c, h, p, op, 0, p->T, 0, c->R, err);
    if (!p->lora) return LS_OK;
    if (p->n_slots == 1) return op_blas(c, h, p, op, 0, p->n_lora, p->single_slot, p->rank, err);
    if (c->sgmv_mode == LS_CUDA_SGMV_BLAS) return op_blas_slots(c, h, p, op, err);
    return op_sgmv(c, side ? c->side : c->stream, p, op, err);
}

/* A shrink on the side stream from this point of the main one; the
 * expand that reads it waits for ev_join. The side stream is joined back
 * even when the shrink fails: a capture whose forked stream never
 * rejoins could not be ended cleanly, and the next forward's wait must
 * not see a stale join. */
static ls_status run_forked(ls_cuda *c, const ls_cuda_plan *p, int i, ls_error *err) {
    LS_CUDA_TRY(err, cudaEventRecord(c->ev_fork, c->stream));
    LS_CUDA_TRY(err, cudaStreamWaitEvent(c->side, c->ev_fork, 0));
    const ls_status st = run_op(c, p, i, 1, err);
    LS_CUDA_TRY(err, cudaEventRecord(c->ev_join, c->side));
    if (st != LS_OK) LS_CUDA_TRY(err, cudaStreamWaitEvent(c->stream, c->ev_join, 0));
    return st;
}

/* Without gammas a gated model's gamma is its gate, from fp32 x. */
static ls_status gate(ls_cuda *c, const ls_cuda_plan *p, ls_error *err) {
    if (needs_gate(c, p)) {
        const size_t H = c->H;
        LS_CUDA_TRY(err, ls_cuda_gate(c->d_x32, c->d_gate + (size_t)p->layer * H, c->gate_lora ? c->d_gsel : NULL,
                                      c->gate_lora ? c->d_gdelta + (size_t)p->layer * H : NULL, (long long)c->L * H,
                                      c->d_gam, p->T, c->H, c->n, c->stream));
    }
    return LS_OK;
}

/* SwiGLU x gamma between the two halves. */
static ls_status swiglu(ls_cuda *c, const ls_cuda_plan *p, ls_error *err) {
    const bool gam = p->has_gammas || needs_gate(c, p);
    LS_CUDA_TRY(err, ls_cuda_swiglu(c->d_z, gam ? c->d_gam : NULL, c->d_a, c->dt, p->T, c->n, c->F, c->stream));
    return LS_OK;
}

/* Everything between the copy in (d_x32, d_gam, d_tasks ready) and the
 * copy out (d_y), the ops in the plan's order: each shrink runs on the
 * side stream beside the base GEMM after it, which neither reads nor
 * writes its output, and the expand waits for it. Every side branch is
 * joined back, so a capture of the main stream holds it all. Enqueues
 * only; no host synchronisation. */
static ls_status run_ops(ls_cuda *c, const ls_cuda_plan *p, bool *forked, ls_error *err) {
    for (int i = 0; i < LS_OPS; i++) {
        const bool shrink = i == LS_OP_SHRINK_GU || i == LS_OP_SHRINK_D;
        const bool expand = i == LS_OP_EXPAND_GU || i == LS_OP_EXPAND_D;
        if (shrink && p->lora) {
            LS_TRY(run_forked(c, p, i, err)); /* joined back when it fails */
            *forked = true;
            continue;
        }
        if (expand && p->lora) {
            LS_CUDA_TRY(err, cudaStreamWaitEvent(c->stream, c->ev_join, 0));
            *forked = false;
        }
        LS_TRY(run_op(c, p, i, 0, err));
        if (i == LS_OP_EXPAND_GU) {
            LS_TRY(gate(c, p, err));
            LS_TRY(swiglu(c, p, err));
        }
    }
    return LS_OK;
}

/* A main-stream op that fails between a shrink's fork and its expand
 * would leave the side stream unjoined: a capture could not end cleanly
 * and the side stream might stay in it. It is joined back, best effort
 * (the error reported is the op's; the wait's own is cleared). */
static ls_status run_device(ls_cuda *c, const ls_cuda_plan *p, ls_error *err) {
    bool forked = false;
    const ls_status st = run_ops(c, p, &forked, err);
    if (st != LS_OK && forked && cudaStreamWaitEvent(c->stream, c->ev_join, 0) != cudaSuccess)
        (void)cudaGetLastError();
    return st;
}

/* Stage scatter: copies y out through pinned memory and back to token
 * order; y is complete when this returns. */
static ls_status copy_out(ls_cuda *c, const ls_cuda_plan *p, ls_error *err) {
    const size_t bytes = (size_t)p->T * c->H * sizeof(float);
    LS_CUDA_TRY(err, cudaMemcpyAsync(c->h_io, c->d_y, bytes, cudaMemcpyDeviceToHost, c->stream));
    return LS_OK;
}

static ls_status scatter(ls_cuda *c, const ls_cuda_plan *p, float *y, ls_error *err) {
    const size_t H = c->H, T = p->T;
    LS_TRY(copy_out(c, p, err));
    LS_CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    ls_unstage_rows(y, c->h_io, p->tokens->order, T, H);
    return LS_OK;
}

/* ---- entry points ------------------------------------------------------------------- */

static cudaGraphExec_t capture(ls_cuda *c, const ls_cuda_plan *p, char *why, size_t why_size);

/* Everything the launches of run_device depend on besides buffer
 * contents, which a replay reads afresh (a slot rewritten in place needs
 * no new graph; one whose rank changed has another key). */
static ls_graph_key graph_key(const ls_cuda *c, const ls_cuda_plan *p) {
    ls_graph_key k;
    memset(&k, 0, sizeof k);
    k.layer = p->layer;
    k.T = p->T;
    k.n_lora = p->lora ? p->n_lora : 0; /* base only: the same work whatever is adapted */
    k.path = !p->lora ? 0 : p->n_slots == 1 ? 1 : 2;
    k.slot = k.path == 1 ? p->single_slot : -1;
    k.rank = k.path == 1 ? p->rank : 0;
    k.ntasks = k.path == 2 ? p->ntasks : 0;
    k.gammas = p->has_gammas;
    k.mode = (int)c->sgmv_mode;
    return k;
}

/* Whether this plan's device part may be a graph: per-slot cuBLAS bakes
 * each slot's rows and rank into its calls, which the key does not hold,
 * so it launches directly (in serving and in the benchmark alike). */
static bool graphs_ok(const ls_cuda *c, const ls_cuda_plan *p) {
    return !(p->lora && p->n_slots > 1 && c->sgmv_mode == LS_CUDA_SGMV_BLAS);
}

/* The first failed capture says why, once per backend: a parity run
 * that passes on direct launches would otherwise hide that serving never
 * replays a graph. */
static void capture_failed(ls_cuda *c, const char *why) {
    if (c->graphs.failures == 0)
        ls_log_warn("cuda backend: a forward shape's CUDA graph could not be captured or launched (%s); that shape "
                    "launches its kernels directly", why);
}

/* The device part for this plan: its graph when the shape has one (or is
 * seen the second time, then captured first), else direct launches.
 * Called before the copies in are enqueued (capture records nothing of
 * them); the caller launches the graph after them. */
static cudaGraphExec_t graph_for(ls_cuda *c, const ls_cuda_plan *p) {
    if (!graphs_ok(c, p)) return NULL;
    const ls_graph_key k = graph_key(c, p);
    bool capture_now = false;
    cudaGraphExec_t g = (cudaGraphExec_t)ls_graph_cache_get(&c->graphs, &k, &capture_now);
    if (!g && capture_now) {
        char why[640]; /* room for an ls_error message and a prefix */
        g = capture(c, p, why, sizeof why);
        if (!g) capture_failed(c, why);
        if (ls_graph_cache_put(&c->graphs, &k, (void *)g))
            ls_log_warn("cuda backend: %llu of the %llu CUDA graphs evicted since start were never replayed "
                        "(forward shapes do not repeat within --cuda-graphs %d): no more captures; new shapes "
                        "launch directly",
                        (unsigned long long)c->graphs.wasted, (unsigned long long)c->graphs.evicted,
                        c->graphs.cap);
    }
    return g;
}

/* The graph's launch failed: a sticky error ends here (the context is
 * gone); otherwise the graph is dropped and the forward launches
 * directly, after the copies in already queued. */
static ls_status launch_graph(ls_cuda *c, const ls_cuda_plan *p, cudaGraphExec_t g, ls_error *err) {
    const cudaError_t e = cudaGraphLaunch(g, c->stream);
    if (e == cudaSuccess) return LS_OK;
    if (ls_cuda_error_is_sticky(e)) return ls_cuda_fail(err, e, "cudaGraphLaunch", __FILE__, __LINE__);
    (void)cudaGetLastError();
    const ls_graph_key k = graph_key(c, p);
    capture_failed(c, cudaGetErrorString(e));
    ls_graph_cache_drop(&c->graphs, &k);
    return run_device(c, p, err);
}

static ls_status forward_locked(ls_cuda *c, int layer, const float *x, const float *gammas,
                                const ls_token_plan *tp, float *y, ls_error *err) {
    ls_cuda_plan p;
    plan_tasks(c, layer, tp, gammas != NULL, &p);
    cudaGraphExec_t g = graph_for(c, &p);
    ls_status st = gather(c, &p, x, gammas, err);
    if (st == LS_OK) st = g ? launch_graph(c, &p, g, err) : run_device(c, &p, err);
    if (st == LS_OK) st = scatter(c, &p, y, err);
    if (st != LS_OK) ls_cuda_drain(c); /* the copies in may still read h_io */
    return st;
}

/* x, gammas, plan and y are the caller's (host buffers); y is complete
 * when this returns. */
ls_status ls_cuda_forward(ls_backend *be, int layer, const float *x, const float *gammas, const ls_token_plan *plan,
                          float *y, ls_error *err) {
    ls_cuda *c = ls_cuda_of(be);
    LS_TRY(ls_cuda_op_begin(c, err));
    return forward_locked(c, layer, x, gammas, plan, y, err);
}

/* Captures the device part as a CUDA graph: for serving (graph_for) and
 * so the benchmark's timings hold the device work and not the host's
 * launch overhead. NULL when capture is not possible, why then says
 * which step refused and with what (the caller launches directly, which
 * reports any error of its own). */
static cudaGraphExec_t capture(ls_cuda *c, const ls_cuda_plan *p, char *why, size_t why_size) {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        snprintf(why, why_size, "cudaStreamBeginCapture: %s", cudaGetErrorString(e));
        (void)cudaGetLastError();
        return NULL;
    }
    ls_error tmp;
    ls_error_init(&tmp);
    const ls_status st = run_device(c, p, &tmp);
    e = cudaStreamEndCapture(c->stream, &graph);
    if (st != LS_OK) snprintf(why, why_size, "during capture: %s", tmp.message);
    else if (e != cudaSuccess || !graph) snprintf(why, why_size, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
    else if ((e = cudaGraphInstantiate(&exec, graph, 0)) != cudaSuccess) {
        snprintf(why, why_size, "cudaGraphInstantiate: %s", cudaGetErrorString(e));
        exec = NULL;
    }
    ls_error_free(&tmp);
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    return exec;
}

static ls_status sync_main(ls_cuda *c, ls_error *err) {
    LS_CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    return LS_OK;
}

static ls_status time_runs(ls_cuda *c, const ls_cuda_plan *p, cudaGraphExec_t exec, int iters, float *ms,
                           ls_error *err) {
    ls_status st = LS_OK;
    for (int i = -3; i < iters && st == LS_OK; i++) {
        cudaError_t e = cudaEventRecord(c->ev_start, c->stream);
        if (e == cudaSuccess) {
            if (exec)
                e = cudaGraphLaunch(exec, c->stream);
            else
                st = run_device(c, p, err);
        }
        if (e == cudaSuccess && st == LS_OK) e = cudaEventRecord(c->ev_stop, c->stream);
        if (e == cudaSuccess && st == LS_OK) e = cudaEventSynchronize(c->ev_stop);
        if (e == cudaSuccess && st == LS_OK && i >= 0) e = cudaEventElapsedTime(&ms[i], c->ev_start, c->ev_stop);
        if (e != cudaSuccess && st == LS_OK) st = ls_cuda_fail(err, e, "timed forward", __FILE__, __LINE__);
    }
    return st;
}

static ls_status time_locked(ls_cuda *c, int layer, const float *x, const float *gammas, const ls_token_plan *tp,
                             int iters, float *ms, int *graph_used, ls_error *err) {
    ls_cuda_plan p;
    plan_tasks(c, layer, tp, gammas != NULL, &p);
    /* One direct run first: handles and kernels are then loaded before
     * the capture, as in serving, where a shape is captured when seen again. */
    ls_status st = gather(c, &p, x, gammas, err);
    if (st == LS_OK) st = run_device(c, &p, err);
    if (st == LS_OK) st = sync_main(c, err);
    /* As serving would: no graph with --cuda-graphs 0 or on a path that
     * launches directly; a refused capture says why on stderr. */
    const bool want = st == LS_OK && graphs_ok(c, &p) && c->graphs.cap > 0;
    char why[640]; /* room for an ls_error message and a prefix */
    cudaGraphExec_t exec = want ? capture(c, &p, why, sizeof why) : NULL;
    if (want && !exec)
        ls_log_warn("cuda backend: time_forward could not capture a graph (%s): timing direct launches", why);
    if (graph_used) *graph_used = exec != NULL;
    if (st == LS_OK) st = time_runs(c, &p, exec, iters, ms, err);
    if (exec) cudaGraphExecDestroy(exec);
    if (st != LS_OK) ls_cuda_drain(c);
    return st;
}

/* What the benchmark's entry points check and do before they run
 * forwards: ls_backend_forward's checks (out is their output), T and
 * iters past 0, the device selected, and the token plan built as
 * ls_backend_forward builds it. who names the entry point in errors. */
static ls_status bench_begin(ls_backend *be, const char *who, int layer, int T, const float *x,
                             const int *slot_of_token, int iters, const void *out, ls_error *err) {
    LS_TRY(ls_backend_check_forward(be, layer, T, x, slot_of_token, out, err));
    if (T == 0 || iters < 1) return ls_error_set(err, LS_INTERNAL, NULL, "%s needs T and iters > 0", who);
    LS_TRY(ls_cuda_op_begin(ls_cuda_of(be), err));
    ls_token_plan_build(&be->plan, T, slot_of_token);
    return LS_OK;
}

/* See cuda_backend.h; ms is the caller's, iters entries long. */
ls_status ls_backend_cuda_time_forward(ls_backend *be, int layer, int T, const float *x, const float *gammas,
                                       const int *slot_of_token, int iters, float *ms, int *graph_used,
                                       ls_error *err) {
    LS_TRY(bench_begin(be, "time_forward", layer, T, x, slot_of_token, iters, ms, err));
    return time_locked(ls_cuda_of(be), layer, x, gammas, &be->plan, iters, ms, graph_used, err);
}

/* ---- the stage profile ------------------------------------------------------------ */

static const char *const STAGE_NAMES[LS_CUDA_STAGES] = {
    "copy in", "shrink gate_up", "gate_up", "expand gate_up", "gate", "SwiGLU", "shrink down", "down",
    "expand down", "copy out"};

const char *ls_cuda_stage_name(int stage) {
    return stage >= 0 && stage < LS_CUDA_STAGES ? STAGE_NAMES[stage] : "?";
}

/* The plan op each GEMM stage runs (-1: not a GEMM). */
static const int STAGE_OP[LS_CUDA_STAGES] = {-1, LS_OP_SHRINK_GU, LS_OP_GATE_UP, LS_OP_EXPAND_GU, -1, -1,
                                             LS_OP_SHRINK_D, LS_OP_DOWN, LS_OP_EXPAND_D, -1};

/* Whether this forward runs the stage at all. */
static bool stage_runs(const ls_cuda *c, const ls_cuda_plan *p, int s) {
    if (s == LS_CUDA_STAGE_GATE) return needs_gate(c, p);
    const int op = STAGE_OP[s];
    return op < 0 || !c->gplan.op[op].lora || p->lora;
}

/* Stage s on the main stream, as run_device would run it (shrinks not
 * forked: each stage's own time). */
static ls_status profile_stage(ls_cuda *c, const ls_cuda_plan *p, int s, ls_error *err) {
    switch (s) {
    case LS_CUDA_STAGE_COPY_IN: return gather_parts(c, p, NULL, NULL, false, err);
    case LS_CUDA_STAGE_GATE: return gate(c, p, err);
    case LS_CUDA_STAGE_SWIGLU: return swiglu(c, p, err);
    case LS_CUDA_STAGE_COPY_OUT: return copy_out(c, p, err);
    default: return run_op(c, p, STAGE_OP[s], 0, err);
    }
}

/* One forward, stage by stage between events ev[0..LS_CUDA_STAGES];
 * ms[s] (when not NULL) gets stage s's time, 0 for a stage not run. */
static ls_status profile_once(ls_cuda *c, const ls_cuda_plan *p, cudaEvent_t *ev, float *ms, ls_error *err) {
    LS_CUDA_TRY(err, cudaEventRecord(ev[0], c->stream));
    for (int s = 0; s < LS_CUDA_STAGES; s++) {
        LS_TRY(profile_stage(c, p, s, err));
        LS_CUDA_TRY(err, cudaEventRecord(ev[s + 1], c->stream));
    }
    LS_CUDA_TRY(err, cudaEventSynchronize(ev[LS_CUDA_STAGES]));
    for (int s = 0; s < LS_CUDA_STAGES && ms; s++) {
        ms[s] = 0;
        if (stage_runs(c, p, s)) LS_CUDA_TRY(err, cudaEventElapsedTime(&ms[s], ev[s], ev[s + 1]));
    }
    return LS_OK;
}

static ls_status profile_runs(ls_cuda *c, const ls_cuda_plan *p, cudaEvent_t *ev, int iters, float *ms,
                              ls_error *err) {
    for (int i = -3; i < iters; i++)
        LS_TRY(profile_once(c, p, ev, i >= 0 ? ms + (size_t)i * LS_CUDA_STAGES : NULL, err));
    return LS_OK;
}

static ls_status profile_locked(ls_cuda *c, int layer, const float *x, const float *gammas, const ls_token_plan *tp,
                                int iters, float *ms, ls_error *err) {
    ls_cuda_plan p;
    plan_tasks(c, layer, tp, gammas != NULL, &p);
    cudaEvent_t ev[LS_CUDA_STAGES + 1];
    int made = 0;
    ls_status st = gather(c, &p, x, gammas, err);
    if (st == LS_OK) st = sync_main(c, err);
    while (made <= LS_CUDA_STAGES && st == LS_OK) {
        cudaError_t e = cudaEventCreate(&ev[made]);
        if (e == cudaSuccess)
            made++;
        else
            st = ls_cuda_fail(err, e, "cudaEventCreate", __FILE__, __LINE__);
    }
    if (st == LS_OK) st = profile_runs(c, &p, ev, iters, ms, err);
    if (st != LS_OK) ls_cuda_drain(c);
    for (int i = 0; i < made; i++) (void)cudaEventDestroy(ev[i]);
    return st;
}

/* See cuda_backend.h; ms is the caller's, iters * LS_CUDA_STAGES long. */
ls_status ls_backend_cuda_profile_forward(ls_backend *be, int layer, int T, const float *x, const float *gammas,
                                          const int *slot_of_token, int iters, float *ms, ls_error *err) {
    LS_TRY(bench_begin(be, "profile_forward", layer, T, x, slot_of_token, iters, ms, err));
    return profile_locked(ls_cuda_of(be), layer, x, gammas, &be->plan, iters, ms, err);
}
