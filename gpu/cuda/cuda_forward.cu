/* The CUDA forward of docs/math.md in the stages every backend names alike
 * (gpu/backend_impl.h), on the token plan's rows (gpu/token_plan.h: each
 * slot's tokens contiguous, base-only tokens last): gather on the host
 * into pinned memory; on the device shrink_gate_up, gate_up (the base
 * cuBLAS GEMM with fp32 accumulation, the LoRA expand, the fused SwiGLU x
 * gamma), shrink_down and down (the base GEMM, the LoRA expand); scatter
 * back on the host. The LoRA GEMMs are cuBLAS when every adapted token
 * uses one slot, one SGMV launch each otherwise. Also the device-only
 * timing entry point of the benchmark. */
#include <stdlib.h>
#include <string.h>

#include "gpu/cuda/cuda_internal.h"

/* ---- the plan's SGMV tasks --------------------------------------------------------- */

/* The CUDA part of the plan: the SGMV tasks (LS_SGMV_BM rows of one slot
 * each, slots in the token plan's order) in pinned memory. */
static void plan_tasks(ls_cuda *c, const ls_token_plan *tp, ls_cuda_plan *p) {
    p->tokens = tp;
    p->T = tp->T;
    p->n_lora = tp->n_lora;
    p->n_slots = tp->n_slots;
    p->single_slot = tp->single_slot;
    p->ntasks = 0;
    for (int s = 0; s < c->S; s++) {
        const int pos = tp->start[s], count = tp->start[s + 1] - pos;
        for (int r0 = 0; r0 < count; r0 += LS_SGMV_BM) {
            int rows = count - r0 < LS_SGMV_BM ? count - r0 : LS_SGMV_BM;
            c->h_tasks[p->ntasks++] = make_int4(pos + r0, rows, s, 0);
        }
    }
}

/* Stage gather: copies x and gammas in plan order through pinned memory,
 * and the SGMV tasks when more than one slot is used. Asynchronous. */
static ls_status gather(ls_cuda *c, const ls_cuda_plan *p, const float *x, const float *gammas, ls_error *err) {
    const size_t H = c->H, n = c->n, T = p->T;
    const int *order = p->tokens->order;
    for (size_t i = 0; i < T; i++) memcpy(c->h_io + i * H, x + (size_t)order[i] * H, H * sizeof(float));
    LS_CUDA_TRY(err, cudaMemcpyAsync(c->d_x32, c->h_io, T * H * sizeof(float), cudaMemcpyHostToDevice, c->stream));
    if (gammas) {
        for (size_t i = 0; i < T; i++) memcpy(c->h_gam + i * n, gammas + (size_t)order[i] * n, n * sizeof(float));
        LS_CUDA_TRY(err, cudaMemcpyAsync(c->d_gam, c->h_gam, T * n * sizeof(float), cudaMemcpyHostToDevice, c->stream));
    }
    if (p->n_slots > 1)
        LS_CUDA_TRY(err, cudaMemcpyAsync(c->d_tasks, c->h_tasks, (size_t)p->ntasks * sizeof(int4),
                                         cudaMemcpyHostToDevice, c->stream));
    return LS_OK;
}

/* ---- GEMM helpers --------------------------------------------------------------- */

/* C[t, c_bs*b + j] = beta*C + sum_k X[t, x_bs*b + k] * W[w_bs*b + j*ldw + k]
 * for t < T, j < N, b < batch; all row-major. In cuBLAS's column-major
 * terms that is C^T = W^T(op T) * X^T: m = N, n = T. */
static ls_status gemm(ls_cuda *c, int T, int N, int K, const void *W, int ldw, long long w_bs, const void *X, int ldx,
                      long long x_bs, void *C, cudaDataType_t c_type, int ldc, long long c_bs, int batch, float beta,
                      ls_error *err) {
    const float alpha = 1.0f;
    if (batch == 1)
        LS_CUBLAS_TRY(err, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W, c->cdt, ldw, X, c->cdt,
                                        ldx, &beta, C, c_type, ldc, c->ct, CUBLAS_GEMM_DEFAULT));
    else
        LS_CUBLAS_TRY(err, cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W, c->cdt,
                                                      ldw, w_bs, X, c->cdt, ldx, x_bs, &beta, C, c_type, ldc, c_bs,
                                                      batch, c->ct, CUBLAS_GEMM_DEFAULT));
    return LS_OK;
}

/* One SGMV stage over every task of the plan. */
static ls_status sgmv(ls_cuda *c, const ls_cuda_plan *p, const void *X, ls_dtype xt, int ldx, long long x_bs,
                      const void *W, int ldw, long long w_bs, float *C, int ldc, long long c_bs, int N, int K,
                      int batch, int atomic, ls_error *err) {
    ls_sgmv_params a;
    a.tasks = c->d_tasks;
    a.ntasks = p->ntasks;
    a.X = X;
    a.xt = xt;
    a.ldx = ldx;
    a.x_bs = x_bs;
    a.W = W;
    a.wt = c->dt;
    a.w_ss = (long long)c->L * (long long)c->der_len;
    a.ldw = ldw;
    a.w_bs = w_bs;
    a.C = C;
    a.ldc = ldc;
    a.c_bs = c_bs;
    a.N = N;
    a.K = K;
    a.batch = batch;
    a.atomic = atomic;
    const int wmma = c->sgmv_mode == LS_CUDA_SGMV_AUTO && c->dt != LS_DTYPE_F32;
    LS_CUDA_TRY(err, ls_cuda_sgmv(&a, wmma, c->num_sms, c->stream));
    return LS_OK;
}

/* ---- the device part of the forward ------------------------------------------------ */

/* Stage shrink_gate_up: v = Agu * x for the adapted rows 0..n_lora-1
 * (d_vc through cuBLAS for one slot, d_v32 through SGMV otherwise). */
static ls_status shrink_gate_up(ls_cuda *c, int layer, const ls_cuda_plan *p, ls_error *err) {
    const int H = c->H, R = c->R, O = c->O, nL = p->n_lora;
    const int OR2 = O * 2 * R;
    const size_t esz = c->esz;
    if (p->n_slots == 1) {
        const char *der = ls_cuda_der(c, p->single_slot, layer);
        LS_TRY(gemm(c, nL, OR2, H, der + c->der_agu * esz, H, 0, c->d_xc, H, 0, c->d_vc, c->cdt, OR2, 0, 1, 0.0f,
                    err));
        return LS_OK;
    }
    const char *der0 = ls_cuda_der(c, 0, layer);
    LS_CUDA_TRY(err, cudaMemsetAsync(c->d_v32, 0, (size_t)nL * OR2 * sizeof(float), c->stream));
    LS_TRY(sgmv(c, p, c->d_xc, c->dt, H, 0, der0 + c->der_agu * esz, H, 0, c->d_v32, OR2, 0, OR2, H, 1, 1, err));
    return LS_OK;
}

/* g, u += B13 * v for the adapted rows of z (gate_up's LoRA part). */
static ls_status expand_gate_up(ls_cuda *c, int layer, const ls_cuda_plan *p, ls_error *err) {
    const int n = c->n, F = c->F, R = c->R, O = c->O, nL = p->n_lora;
    const int n2F = 2 * n * F, OR2 = O * 2 * R;
    const size_t esz = c->esz;
    const int per_expert = O > 1;
    if (p->n_slots == 1) {
        const char *der = ls_cuda_der(c, p->single_slot, layer);
        if (!per_expert)
            LS_TRY(gemm(c, nL, n2F, 2 * R, der + c->der_b13 * esz, 2 * R, 0, c->d_vc, OR2, 0, c->d_z, CUDA_R_32F,
                        n2F, 0, 1, 1.0f, err));
        else
            LS_TRY(gemm(c, nL, 2 * F, 2 * R, der + c->der_b13 * esz, 2 * R, 2LL * F * 2 * R, c->d_vc, OR2, 2 * R,
                        c->d_z, CUDA_R_32F, n2F, 2 * F, n, 1.0f, err));
        return LS_OK;
    }
    const char *der0 = ls_cuda_der(c, 0, layer);
    if (!per_expert)
        LS_TRY(sgmv(c, p, c->d_v32, LS_DTYPE_F32, OR2, 0, der0 + c->der_b13 * esz, 2 * R, 0, c->d_z, n2F, 0, n2F,
                    2 * R, 1, 0, err));
    else
        LS_TRY(sgmv(c, p, c->d_v32, LS_DTYPE_F32, OR2, 2 * R, der0 + c->der_b13 * esz, 2 * R, 2LL * F * 2 * R,
                    c->d_z, n2F, 2 * F, 2 * F, 2 * R, n, 0, err));
    return LS_OK;
}

/* Stage gate_up: z = W13 * x (+ the LoRA expand), then a = SiLU(g) * u
 * * gamma; without gammas a gated model's gamma is its gate, from fp32 x. */
static ls_status gate_up(ls_cuda *c, int layer, const ls_cuda_plan *p, ls_error *err) {
    const int T = p->T, n = c->n, H = c->H, F = c->F, n2F = 2 * n * F;
    const char *w13 = (const char *)c->d_w13 + (size_t)layer * n2F * H * c->esz;
    LS_TRY(gemm(c, T, n2F, H, w13, H, 0, c->d_xc, H, 0, c->d_z, CUDA_R_32F, n2F, 0, 1, 0.0f, err));
    if (p->n_lora > 0) LS_TRY(expand_gate_up(c, layer, p, err));
    const bool gate = !p->has_gammas && c->gated;
    if (gate) LS_CUDA_TRY(err, ls_cuda_gate(c->d_x32, c->d_gate + (size_t)layer * H, c->d_gam, T, H, n, c->stream));
    LS_CUDA_TRY(err, ls_cuda_swiglu(c->d_z, p->has_gammas || gate ? c->d_gam : NULL, c->d_a, c->dt, T, n, F,
                                    c->w13_layout, c->stream));
    return LS_OK;
}

/* Stage shrink_down: w = Adcat * a for the adapted rows; with per-expert
 * outer factors each expert's shrink lands in its own R columns of w. */
static ls_status shrink_down(ls_cuda *c, int layer, const ls_cuda_plan *p, ls_error *err) {
    const int n = c->n, F = c->F, R = c->R, O = c->O, nL = p->n_lora;
    const int nF = n * F, OR = O * R;
    const size_t esz = c->esz;
    const int per_expert = O > 1;
    if (p->n_slots == 1) {
        const char *der = ls_cuda_der(c, p->single_slot, layer);
        if (!per_expert)
            LS_TRY(gemm(c, nL, R, nF, der + c->der_ad * esz, nF, 0, c->d_a, nF, 0, c->d_wc, c->cdt, OR, 0, 1, 0.0f,
                        err));
        else
            LS_TRY(gemm(c, nL, R, F, der + c->der_ad * esz, nF, F, c->d_a, nF, F, c->d_wc, c->cdt, OR, R, n, 0.0f,
                        err));
        return LS_OK;
    }
    const char *der0 = ls_cuda_der(c, 0, layer);
    LS_CUDA_TRY(err, cudaMemsetAsync(c->d_w32, 0, (size_t)nL * OR * sizeof(float), c->stream));
    if (!per_expert)
        LS_TRY(sgmv(c, p, c->d_a, c->dt, nF, 0, der0 + c->der_ad * esz, nF, 0, c->d_w32, OR, 0, R, nF, 1, 1, err));
    else
        LS_TRY(sgmv(c, p, c->d_a, c->dt, nF, F, der0 + c->der_ad * esz, nF, F, c->d_w32, OR, R, R, F, n, 1, err));
    return LS_OK;
}

/* y += Bdcat * w for the adapted rows (down's LoRA part). */
static ls_status expand_down(ls_cuda *c, int layer, const ls_cuda_plan *p, ls_error *err) {
    const int H = c->H, R = c->R, O = c->O, nL = p->n_lora, OR = O * R;
    const size_t esz = c->esz;
    if (p->n_slots == 1) {
        const char *der = ls_cuda_der(c, p->single_slot, layer);
        LS_TRY(gemm(c, nL, H, OR, der + c->der_bd * esz, OR, 0, c->d_wc, OR, 0, c->d_y, CUDA_R_32F, H, 0, 1, 1.0f,
                    err));
        return LS_OK;
    }
    const char *der0 = ls_cuda_der(c, 0, layer);
    LS_TRY(sgmv(c, p, c->d_w32, LS_DTYPE_F32, OR, 0, der0 + c->der_bd * esz, OR, 0, c->d_y, H, 0, H, OR, 1, 0, err));
    return LS_OK;
}

/* Stage down: y = W2 * a (+ the LoRA expand). */
static ls_status down(ls_cuda *c, int layer, const ls_cuda_plan *p, ls_error *err) {
    const int T = p->T, H = c->H, nF = c->n * c->F;
    const char *w2 = (const char *)c->d_w2 + (size_t)layer * H * nF * c->esz;
    LS_TRY(gemm(c, T, H, nF, w2, nF, 0, c->d_a, nF, 0, c->d_y, CUDA_R_32F, H, 0, 1, 0.0f, err));
    if (p->n_lora > 0) LS_TRY(expand_down(c, layer, p, err));
    return LS_OK;
}

/* Everything between the copy in (d_x32, d_gam, d_tasks ready) and the
 * copy out (d_y), the stages in the CPU's order: each shrink is enqueued
 * before the base GEMM beside it, which neither reads nor writes its
 * output. Enqueues only; no host synchronisation. */
static ls_status run_device(ls_cuda *c, int layer, const ls_cuda_plan *p, ls_error *err) {
    const int T = p->T, H = c->H;
    if (c->dt != LS_DTYPE_F32) LS_CUDA_TRY(err, ls_cuda_convert(c->d_x32, c->d_xc, c->dt, (long long)T * H, c->stream));
    if (p->n_lora > 0) LS_TRY(shrink_gate_up(c, layer, p, err));
    LS_TRY(gate_up(c, layer, p, err));
    if (p->n_lora > 0) LS_TRY(shrink_down(c, layer, p, err));
    LS_TRY(down(c, layer, p, err));
    return LS_OK;
}

/* Stage scatter: copies y out through pinned memory and back to token
 * order; y is complete when this returns. */
static ls_status scatter(ls_cuda *c, const ls_cuda_plan *p, float *y, ls_error *err) {
    const size_t H = c->H;
    const int T = p->T, *order = p->tokens->order;
    LS_CUDA_TRY(err, cudaMemcpyAsync(c->h_io, c->d_y, (size_t)T * H * sizeof(float), cudaMemcpyDeviceToHost,
                                     c->stream));
    LS_CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    for (int i = 0; i < T; i++) memcpy(y + (size_t)order[i] * H, c->h_io + (size_t)i * H, H * sizeof(float));
    return LS_OK;
}

/* ---- entry points ------------------------------------------------------------------- */

static ls_status forward_locked(ls_cuda *c, int layer, const float *x, const float *gammas,
                                const ls_token_plan *tp, float *y, ls_error *err) {
    ls_cuda_plan p;
    plan_tasks(c, tp, &p);
    p.has_gammas = gammas != NULL;
    LS_TRY(gather(c, &p, x, gammas, err));
    LS_TRY(run_device(c, layer, &p, err));
    return scatter(c, &p, y, err);
}

/* x, gammas, plan and y are the caller's (host buffers); y is complete
 * when this returns. */
ls_status ls_cuda_forward(ls_backend *be, int layer, const float *x, const float *gammas, const ls_token_plan *plan,
                          float *y, ls_error *err) {
    ls_cuda *c = ls_cuda_of(be);
    LS_TRY(ls_cuda_op_begin(c, err));
    return forward_locked(c, layer, x, gammas, plan, y, err);
}

/* Captures the device part once as a CUDA graph so the timings hold the
 * device work and not the host's launch overhead. NULL when capture is
 * not possible (the caller then times direct launches). */
static cudaGraphExec_t capture(ls_cuda *c, int layer, const ls_cuda_plan *p) {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    ls_error tmp;
    ls_error_init(&tmp);
    ls_status st = run_device(c, layer, p, &tmp);
    ls_error_free(&tmp);
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    if (st == LS_OK && e == cudaSuccess && graph && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) exec = NULL;
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    return exec;
}

static ls_status time_locked(ls_cuda *c, int layer, const float *x, const float *gammas, const ls_token_plan *tp,
                             int iters, float *ms, int *graph_used, ls_error *err) {
    ls_cuda_plan p;
    plan_tasks(c, tp, &p);
    p.has_gammas = gammas != NULL;
    LS_TRY(gather(c, &p, x, gammas, err));
    LS_CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    cudaGraphExec_t exec = capture(c, layer, &p);
    if (graph_used) *graph_used = exec != NULL;
    ls_status st = LS_OK;
    for (int i = -3; i < iters && st == LS_OK; i++) {
        cudaError_t e = cudaEventRecord(c->ev_start, c->stream);
        if (e == cudaSuccess) {
            if (exec)
                e = cudaGraphLaunch(exec, c->stream);
            else
                st = run_device(c, layer, &p, err);
        }
        if (e == cudaSuccess && st == LS_OK) e = cudaEventRecord(c->ev_stop, c->stream);
        if (e == cudaSuccess && st == LS_OK) e = cudaEventSynchronize(c->ev_stop);
        if (e == cudaSuccess && st == LS_OK && i >= 0) e = cudaEventElapsedTime(&ms[i], c->ev_start, c->ev_stop);
        if (e != cudaSuccess && st == LS_OK) st = ls_cuda_fail(err, e, "timed forward", __FILE__, __LINE__);
    }
    if (exec) cudaGraphExecDestroy(exec);
    return st;
}

/* See cuda_backend.h; ms is the caller's, iters entries long. */
ls_status ls_backend_cuda_time_forward(ls_backend *be, int layer, int T, const float *x, const float *gammas,
                                       const int *slot_of_token, int iters, float *ms, int *graph_used,
                                       ls_error *err) {
    ls_cuda *c = ls_cuda_of(be);
    LS_TRY(ls_backend_check_forward(be, layer, T, x, slot_of_token, ms, err));
    if (T == 0 || iters < 1) return ls_error_set(err, LS_INTERNAL, NULL, "time_forward needs T and iters > 0");
    LS_TRY(ls_cuda_op_begin(c, err));
    ls_token_plan_build(&be->plan, T, slot_of_token); /* as ls_backend_forward does */
    return time_locked(c, layer, x, gammas, &be->plan, iters, ms, graph_used, err);
}
