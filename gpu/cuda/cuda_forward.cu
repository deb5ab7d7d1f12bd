/* The CUDA forward of docs/math.md: tokens grouped by slot on the host, then on
 * the device two cuBLAS GEMMs for the base (fp32 accumulation), the fused
 * SwiGLU x gamma, and the LoRA shrink/expand pairs: cuBLAS when every
 * adapted token uses one slot, one SGMV launch per stage otherwise. Also
 * the device-only timing entry point of the benchmark. */
#include <stdlib.h>
#include <string.h>

#include "gpu/cuda/cuda_internal.h"

/* ---- grouping tokens by slot ------------------------------------------------------ */

/* Fills c->perm (grouped position -> token), the SGMV tasks in pinned
 * memory and the plan. Slots run in ascending order, base tokens last. */
static void plan_tokens(ls_cuda *c, int T, const int *slot_of_token, ls_cuda_plan *p) {
    const int S = c->S;
    int *count = c->counts, *cursor = c->counts + (S + 1);
    memset(count, 0, (size_t)(S + 1) * sizeof(int));
    for (int t = 0; t < T; t++) {
        int s = slot_of_token ? slot_of_token[t] : -1; /* in -1..S-1: backend.c checked */
        count[s < 0 ? S : s]++;
    }
    int pos = 0;
    p->T = T;
    p->n_slots = 0;
    p->single_slot = -1;
    p->ntasks = 0;
    for (int s = 0; s <= S; s++) {
        cursor[s] = pos;
        if (s < S && count[s] > 0) {
            p->n_slots++;
            p->single_slot = s;
            for (int r0 = 0; r0 < count[s]; r0 += LS_SGMV_BM) {
                int rows = count[s] - r0 < LS_SGMV_BM ? count[s] - r0 : LS_SGMV_BM;
                c->h_tasks[p->ntasks++] = make_int4(pos + r0, rows, s, 0);
            }
        }
        pos += count[s];
    }
    p->n_lora = T - count[S];
    for (int t = 0; t < T; t++) {
        int s = slot_of_token ? slot_of_token[t] : -1;
        c->perm[cursor[s < 0 ? S : s]++] = t;
    }
}

/* Copies x and gammas in grouped order through pinned memory, and the
 * SGMV tasks when more than one slot is used. Asynchronous. */
static ls_status stage_inputs(ls_cuda *c, const ls_cuda_plan *p, const float *x, const float *gammas,
                              ls_error *err) {
    const size_t H = c->H, n = c->n, T = p->T;
    for (size_t i = 0; i < T; i++) memcpy(c->h_io + i * H, x + (size_t)c->perm[i] * H, H * sizeof(float));
    LS_CUDA_TRY(err, cudaMemcpyAsync(c->d_x32, c->h_io, T * H * sizeof(float), cudaMemcpyHostToDevice, c->stream));
    if (gammas) {
        for (size_t i = 0; i < T; i++) memcpy(c->h_gam + i * n, gammas + (size_t)c->perm[i] * n, n * sizeof(float));
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

/* g, u += B13 * (Agu * x) for the adapted rows 0..n_lora-1 of z. */
static ls_status lora_gate_up(ls_cuda *c, int layer, const ls_cuda_plan *p, ls_error *err) {
    const int n = c->n, H = c->H, F = c->F, R = c->R, O = c->O, nL = p->n_lora;
    const int n2F = 2 * n * F, OR2 = O * 2 * R;
    const size_t esz = c->esz;
    const int per_expert = O > 1;
    if (p->n_slots == 1) {
        const char *der = ls_cuda_der(c, p->single_slot, layer);
        LS_TRY(gemm(c, nL, OR2, H, der + c->der_agu * esz, H, 0, c->d_xc, H, 0, c->d_vc, c->cdt, OR2, 0, 1, 0.0f,
                    err));
        if (!per_expert)
            LS_TRY(gemm(c, nL, n2F, 2 * R, der + c->der_b13 * esz, 2 * R, 0, c->d_vc, OR2, 0, c->d_z, CUDA_R_32F,
                        n2F, 0, 1, 1.0f, err));
        else
            LS_TRY(gemm(c, nL, 2 * F, 2 * R, der + c->der_b13 * esz, 2 * R, 2LL * F * 2 * R, c->d_vc, OR2, 2 * R,
                        c->d_z, CUDA_R_32F, n2F, 2 * F, n, 1.0f, err));
        return LS_OK;
    }
    const char *der0 = ls_cuda_der(c, 0, layer);
    LS_CUDA_TRY(err, cudaMemsetAsync(c->d_v32, 0, (size_t)nL * OR2 * sizeof(float), c->stream));
    LS_TRY(sgmv(c, p, c->d_xc, c->dt, H, 0, der0 + c->der_agu * esz, H, 0, c->d_v32, OR2, 0, OR2, H, 1, 1, err));
    if (!per_expert)
        LS_TRY(sgmv(c, p, c->d_v32, LS_DTYPE_F32, OR2, 0, der0 + c->der_b13 * esz, 2 * R, 0, c->d_z, n2F, 0, n2F,
                    2 * R, 1, 0, err));
    else
        LS_TRY(sgmv(c, p, c->d_v32, LS_DTYPE_F32, OR2, 2 * R, der0 + c->der_b13 * esz, 2 * R, 2LL * F * 2 * R,
                    c->d_z, n2F, 2 * F, 2 * F, 2 * R, n, 0, err));
    return LS_OK;
}

/* y += Bdcat * (Adcat * a) for the adapted rows; with per-expert outer
 * factors each expert's shrink lands in its own R columns of w. */
static ls_status lora_down(ls_cuda *c, int layer, const ls_cuda_plan *p, ls_error *err) {
    const int n = c->n, H = c->H, F = c->F, R = c->R, O = c->O, nL = p->n_lora;
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
        LS_TRY(gemm(c, nL, H, OR, der + c->der_bd * esz, OR, 0, c->d_wc, OR, 0, c->d_y, CUDA_R_32F, H, 0, 1, 1.0f,
                    err));
        return LS_OK;
    }
    const char *der0 = ls_cuda_der(c, 0, layer);
    LS_CUDA_TRY(err, cudaMemsetAsync(c->d_w32, 0, (size_t)nL * OR * sizeof(float), c->stream));
    if (!per_expert)
        LS_TRY(sgmv(c, p, c->d_a, c->dt, nF, 0, der0 + c->der_ad * esz, nF, 0, c->d_w32, OR, 0, R, nF, 1, 1, err));
    else
        LS_TRY(sgmv(c, p, c->d_a, c->dt, nF, F, der0 + c->der_ad * esz, nF, F, c->d_w32, OR, R, R, F, n, 1, err));
    LS_TRY(sgmv(c, p, c->d_w32, LS_DTYPE_F32, OR, 0, der0 + c->der_bd * esz, OR, 0, c->d_y, H, 0, H, OR, 1, 0, err));
    return LS_OK;
}

/* Everything between the copy in (d_x32, d_gam, d_tasks ready) and the
 * copy out (d_y). Enqueues only; no host synchronisation. */
static ls_status run_device(ls_cuda *c, int layer, const ls_cuda_plan *p, ls_error *err) {
    const int T = p->T, n = c->n, H = c->H, F = c->F;
    const int n2F = 2 * n * F, nF = n * F;
    const char *w13 = (const char *)c->d_w13 + (size_t)layer * n2F * H * c->esz;
    const char *w2 = (const char *)c->d_w2 + (size_t)layer * H * nF * c->esz;
    if (c->dt != LS_DTYPE_F32) LS_CUDA_TRY(err, ls_cuda_convert(c->d_x32, c->d_xc, c->dt, (long long)T * H, c->stream));
    LS_TRY(gemm(c, T, n2F, H, w13, H, 0, c->d_xc, H, 0, c->d_z, CUDA_R_32F, n2F, 0, 1, 0.0f, err));
    if (p->n_lora > 0) LS_TRY(lora_gate_up(c, layer, p, err));
    /* Without gammas a gated model's gamma is its gate, from fp32 x. */
    const bool gate = !p->has_gammas && c->gated;
    if (gate) LS_CUDA_TRY(err, ls_cuda_gate(c->d_x32, c->d_gate + (size_t)layer * H, c->d_gam, T, H, n, c->stream));
    LS_CUDA_TRY(err, ls_cuda_swiglu(c->d_z, p->has_gammas || gate ? c->d_gam : NULL, c->d_a, c->dt, T, n, F,
                                    c->w13_layout, c->stream));
    LS_TRY(gemm(c, T, H, nF, w2, nF, 0, c->d_a, nF, 0, c->d_y, CUDA_R_32F, H, 0, 1, 0.0f, err));
    if (p->n_lora > 0) LS_TRY(lora_down(c, layer, p, err));
    return LS_OK;
}

/* ---- entry points ------------------------------------------------------------------- */

static ls_status forward_locked(ls_cuda *c, int layer, int T, const float *x, const float *gammas,
                                const int *slot_of_token, float *y, ls_error *err) {
    ls_cuda_plan p;
    plan_tokens(c, T, slot_of_token, &p);
    p.has_gammas = gammas != NULL;
    LS_TRY(stage_inputs(c, &p, x, gammas, err));
    LS_TRY(run_device(c, layer, &p, err));
    const size_t H = c->H;
    LS_CUDA_TRY(err, cudaMemcpyAsync(c->h_io, c->d_y, (size_t)T * H * sizeof(float), cudaMemcpyDeviceToHost,
                                     c->stream));
    LS_CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    for (int i = 0; i < T; i++) memcpy(y + (size_t)c->perm[i] * H, c->h_io + (size_t)i * H, H * sizeof(float));
    return LS_OK;
}

/* x, gammas, slot_of_token and y are the caller's host buffers; y is
 * complete when this returns. */
ls_status ls_cuda_forward(ls_backend *be, int layer, int T, const float *x, const float *gammas,
                          const int *slot_of_token, float *y, ls_error *err) {
    ls_cuda *c = ls_cuda_of(be);
    LS_TRY(ls_cuda_op_begin(c, err));
    return forward_locked(c, layer, T, x, gammas, slot_of_token, y, err);
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

static ls_status time_locked(ls_cuda *c, int layer, int T, const float *x, const float *gammas,
                             const int *slot_of_token, int iters, float *ms, ls_error *err) {
    ls_cuda_plan p;
    plan_tokens(c, T, slot_of_token, &p);
    p.has_gammas = gammas != NULL;
    LS_TRY(stage_inputs(c, &p, x, gammas, err));
    LS_CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    cudaGraphExec_t exec = capture(c, layer, &p);
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
                                       const int *slot_of_token, int iters, float *ms, ls_error *err) {
    ls_cuda *c = ls_cuda_of(be);
    LS_TRY(ls_backend_check_forward(be, layer, T, x, slot_of_token, ms, err));
    if (T == 0 || iters < 1) return ls_error_set(err, LS_INTERNAL, NULL, "time_forward needs T and iters > 0");
    LS_TRY(ls_cuda_op_begin(c, err));
    return time_locked(c, layer, T, x, gammas, slot_of_token, iters, ms, err);
}
