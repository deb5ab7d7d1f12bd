/* The CUDA forward's layouts and GEMM list, made on the host
 * (gpu/lora_plan.h). */
#include "gpu/lora_plan.h"

#include <stdio.h>

size_t ls_w13_device_source_row(ls_w13_layout layout, int n, int F, size_t device_row) {
    const size_t nF = (size_t)n * F, h = device_row / nF, e = (device_row % nF) / F, j = device_row % F;
    if (layout == LS_W13_INTERLEAVED) return e * 2 * F + 2 * j + h;
    return e * 2 * F + h * F + j;
}

ls_lora_derived_lens ls_lora_derived_lens_of(const ls_dims *d, const ls_pool_dims *p) {
    const size_t n = d->n, H = d->H, F = d->F, R = p->max_rank, O = ls_pool_outer(d, p);
    ls_lora_derived_lens l = {2 * O * R * H, 2 * n * F * R, R * n * F, H * O * R};
    return l;
}

void ls_lora_derive(const ls_dims *d, const ls_pool_dims *p, const ls_slot_factors *f, float *agu, float *b13,
                    float *adcat, float *bdcat) {
    const size_t n = d->n, H = d->H, F = d->F, R = p->max_rank, O = ls_pool_outer(d, p);
    for (size_t h = 0; h < 2; h++) /* agu [2][O][R] rows: gu_a's [O][2][R] with the halves outermost */
        for (size_t o = 0; o < O; o++)
            for (size_t k = 0; k < R; k++) {
                const float *src = f->gu_a + ((o * 2 + h) * R + k) * H;
                float *dst = agu + ((h * O + o) * R + k) * H;
                for (size_t x = 0; x < H; x++) dst[x] = src[x];
            }
    for (size_t h = 0; h < 2; h++) /* b13 [2][n][F] rows of R: gu_b's [n][2][F] rows */
        for (size_t e = 0; e < n; e++)
            for (size_t j = 0; j < F; j++) {
                const float *src = f->gu_b + (e * 2 * F + h * F + j) * R;
                float *dst = b13 + ((h * n + e) * F + j) * R;
                for (size_t k = 0; k < R; k++) dst[k] = src[k];
            }
    for (size_t k = 0; k < R; k++) /* adcat [R][n*F] from d_a [n][R][F] */
        for (size_t e = 0; e < n; e++)
            for (size_t j = 0; j < F; j++) adcat[k * n * F + e * F + j] = f->d_a[(e * R + k) * F + j];
    for (size_t h = 0; h < H; h++) /* bdcat [H][O*R] from d_b [O][H][R] */
        for (size_t o = 0; o < O; o++)
            for (size_t k = 0; k < R; k++) bdcat[(h * O + o) * R + k] = f->d_b[(o * H + h) * R + k];
}

static ls_gemm_op op_base(const char *stage, ls_op_buf c, ls_op_buf x, ls_op_buf w, int ldc, int ldx, int ldw, int N,
                          int K) {
    ls_gemm_op op = {0};
    op.stage = stage;
    op.c = c, op.x = x, op.w = w;
    op.ldc = ldc, op.ldx = ldx, op.ldw = ldw;
    op.N = N, op.K = K, op.batch = 1;
    op.cut = LS_CUT_NONE;
    return op;
}

/* A LoRA op: batches at constant strides, one dimension cut to the rank. */
static ls_gemm_op op_lora(ls_gemm_op op, int batch, long long c_bs, long long x_bs, long long w_bs, ls_op_cut cut,
                          int beta) {
    op.batch = batch;
    op.c_bs = c_bs, op.x_bs = x_bs, op.w_bs = w_bs;
    op.cut = cut;
    op.beta = beta;
    op.split = beta == 0;
    op.lora = 1;
    return op;
}

void ls_gemm_plan_make(const ls_dims *d, const ls_pool_dims *p, ls_gemm_plan *plan) {
    const int n = d->n, H = d->H, F = d->F, R = p->max_rank, O = ls_pool_outer(d, p);
    const int nF = n * F, per_o = nF / O; /* O is 1 or n */
    ls_gemm_op *op = plan->op;
    op[LS_OP_SHRINK_GU] = op_lora(op_base("shrink_gate_up", LS_OPB_V, LS_OPB_X, LS_OPB_AGU, 2 * O * R, H, H, R, H),
                                  2 * O, R, 0, (long long)R * H, LS_CUT_N, 0);
    op[LS_OP_GATE_UP] = op_base("gate_up", LS_OPB_Z, LS_OPB_X, LS_OPB_W13, 2 * nF, H, H, 2 * nF, H);
    op[LS_OP_EXPAND_GU] = op_lora(op_base("gate_up", LS_OPB_Z, LS_OPB_V, LS_OPB_B13, 2 * nF, 2 * O * R, R, per_o, R),
                                  2 * O, per_o, R, (long long)per_o * R, LS_CUT_K, 1);
    op[LS_OP_SHRINK_D] = op_lora(op_base("shrink_down", LS_OPB_W, LS_OPB_A, LS_OPB_ADCAT, O * R, nF, nF, R, per_o), O,
                                 R, per_o, per_o, LS_CUT_N, 0);
    op[LS_OP_DOWN] = op_base("down", LS_OPB_Y, LS_OPB_A, LS_OPB_W2, H, nF, nF, H, nF);
    op[LS_OP_EXPAND_D] =
        op_lora(op_base("down", LS_OPB_Y, LS_OPB_W, LS_OPB_BDCAT, H, O * R, O * R, H, R), O, 0, R, R, LS_CUT_K, 1);
    op[LS_OP_EXPAND_D].sum_batches = 1;
}

bool ls_gemm_plan_fits_grid(const ls_gemm_plan *plan, int tile_n, char *why, size_t len) {
    const long long most = 65535;
    for (int i = 0; i < LS_OPS; i++) {
        const ls_gemm_op *op = &plan->op[i];
        if (!op->lora) continue;
        const long long tiles = ((long long)op->N + tile_n - 1) / tile_n, batch = op->sum_batches ? 1 : op->batch;
        if (tiles > most) {
            snprintf(why, len, "%s's LoRA GEMM needs %lld column tiles of %d (N = %d), more than a grid's %lld",
                     op->stage, tiles, tile_n, op->N, most);
            return false;
        }
        if (batch > most) {
            snprintf(why, len, "%s's LoRA GEMM needs %lld batches, more than a grid's %lld", op->stage, batch, most);
            return false;
        }
    }
    return true;
}
