/* The CPU forward of docs/math.md in the stages every backend names alike
 * (gpu/backend_impl.h), on the token plan's rows (gpu/token_plan.h: each
 * slot's tokens contiguous, base-only tokens last), as four jobs on the
 * engine's threads:
 *   shrink_gate_up (rows)  gather x into plan order; st = x · A_gu
 *   gate_up (columns)      z = x · W13 for a share of the intermediate
 *                          axis, every expert's gate and up columns of
 *                          it, + st · B_gu for the adapted rows, then
 *                          SiLU and the gate into a
 *   shrink_down (rows)     pt = a · A_d                (adapted rows only)
 *   down (columns)         y = a · W2 + pt · B_d, scattered back to token
 *                          order
 * Each job splits rows or output columns by thread index, never K, and
 * every element is one chain of multiply-adds (gemm.h), so a token's
 * output is the same bits whatever else is in the call. Nothing is
 * allocated here: every buffer was sized in ls_backend_cpu_create.
 * Without gammas, a model with a shared-expert gate takes each row's gate
 * in shrink_gate_up (gs = sigmoid(xs . w_gate), a GEMM of one column), and
 * gate_up applies it as every expert's gamma. */
#include <string.h>

#include "gpu/cpu/cpu.h"
#include "gpu/cpu/eltwise.h"

typedef struct {
    ls_cpu *c;
    const ls_token_plan *plan;
    int layer, T;
    const float *x, *gammas;
    float *y;
    const float *xs; /* x itself when the plan order is the token order */
    float *ys;       /* y itself then */
    bool gate;       /* compute the gate into c->gs (no gammas, a gated model) */
} ls_cpu_job;

/* [lo, hi) of count items for thread index of count threads. */
static void ls_cpu_share(int items, int index, int count, int *lo, int *hi) {
    *lo = (int)((long long)items * index / count);
    *hi = (int)((long long)items * (index + 1) / count);
}

static float *ls_cpu_apack_of(const ls_cpu *c, int index) { return c->apack + (size_t)index * c->apack_len; }

/* Rows [r0, r1) of the adapted rows, one slot's run at a time, skipping
 * slots of rank 0 in this layer (they add nothing):
 * fn(job, slot, first row, row count, thread index). */
typedef void (*ls_cpu_rows_fn)(const ls_cpu_job *j, int slot, int r, int m, int index);
static void ls_cpu_each_slot_rows(const ls_cpu_job *j, int r0, int r1, int index, ls_cpu_rows_fn fn) {
    const ls_cpu *c = j->c;
    const int *start = j->plan->start;
    for (int s = 0; s < c->S; s++) {
        int a = start[s] > r0 ? start[s] : r0;
        int b = start[s + 1] < r1 ? start[s + 1] : r1;
        if (a < b && ls_cpu_rank(c, s, j->layer) > 0) fn(j, s, a, b - a, index);
    }
}

/* st[r:r+m] = xs[r:r+m] · gu_a(slot): every outer block's 2r columns
 * (the slot's rank r; st's rows are O*2R apart). */
static void ls_cpu_shrink_gate_up_slot(const ls_cpu_job *j, int slot, int r, int m, int index) {
    const ls_cpu *c = j->c;
    const int SW = c->O * 2 * c->R;
    ls_cpu_mat b = ls_cpu_gu_a(c, slot, j->layer);
    ls_cpu_gemm(ls_cpu_kernels_of(c, &b), ls_cpu_apack_of(c, index), m, j->xs + (size_t)r * c->H, (size_t)c->H, &b, 0,
                ls_cpu_panel_count(b.n), c->st + (size_t)r * SW, (size_t)SW, LS_CPU_NR, false);
}

/* pt[r:r+m] = the down shrink of as[r:r+m]: with one outer block the
 * experts' shrinks sum in one chain (expert 0's K first), with n blocks
 * each expert writes its own rank columns (pt's rows are O*R apart). */
static void ls_cpu_shrink_down_slot(const ls_cpu_job *j, int slot, int r, int m, int index) {
    const ls_cpu *c = j->c;
    const int AW = c->n * c->F, PW = c->O * c->R, rank = ls_cpu_rank(c, slot, j->layer);
    for (int e = 0; e < c->n; e++) {
        ls_cpu_mat b = ls_cpu_d_a(c, slot, j->layer, e);
        float *dst = c->pt + (size_t)r * PW + (c->O == 1 ? 0 : (size_t)e * rank);
        ls_cpu_gemm(ls_cpu_kernels_of(c, &b), ls_cpu_apack_of(c, index), m, c->as + (size_t)r * AW + (size_t)e * c->F, (size_t)AW, &b,
                    0, ls_cpu_panel_count(b.n), dst, (size_t)PW, LS_CPU_NR, c->O == 1 && e > 0);
    }
}

/* Rows [r0, r1) of x into plan order (nothing when it is the token order). */
static void ls_cpu_gather(const ls_cpu_job *j, int r0, int r1) {
    ls_cpu *c = j->c;
    if (j->xs != c->xs) return;
    for (int i = r0; i < r1; i++)
        memcpy(c->xs + (size_t)i * c->H, j->x + (size_t)j->plan->order[i] * c->H, (size_t)c->H * sizeof(float));
}

/* gs[r0:r1) += each adapted row's chain over H of its slot's gate delta
 * (whatever the slot's rank at the layer: a layer may adapt the gate
 * alone), so a row's gate is the same bits in any batch. */
static void ls_cpu_gate_deltas(const ls_cpu_job *j, int r0, int r1, int index) {
    const ls_cpu *c = j->c;
    const int *start = j->plan->start;
    for (int s = 0; s < c->S; s++) {
        const int a = start[s] > r0 ? start[s] : r0, b = start[s + 1] < r1 ? start[s + 1] : r1;
        ls_cpu_mat g = ls_cpu_gate_delta(c, s, j->layer);
        if (a < b && g.p)
            ls_cpu_gemm(c->kr, ls_cpu_apack_of(c, index), b - a, j->xs + (size_t)a * c->H, (size_t)c->H, &g, 0, 1,
                        c->gs + a, 1, LS_CPU_NR, true);
    }
}

/* Stage shrink_gate_up, by rows: this thread's share gathered, its gate
 * when the model's gate stands in for gammas, then the gate/up shrink of
 * its adapted rows. */
static void ls_cpu_shrink_gate_up(void *p, int index, int count) {
    ls_cpu_job *j = p;
    ls_cpu *c = j->c;
    int r0, r1;
    ls_cpu_share(j->T, index, count, &r0, &r1);
    ls_cpu_gather(j, r0, r1);
    if (j->gate && r1 > r0) {
        ls_cpu_mat g = ls_cpu_gate(c, j->layer);
        ls_cpu_gemm(c->kr, ls_cpu_apack_of(c, index), r1 - r0, j->xs + (size_t)r0 * c->H, (size_t)c->H, &g, 0, 1,
                    c->gs + r0, 1, LS_CPU_NR, false);
        ls_cpu_gate_deltas(j, r0, r1, index);
        ls_cpu_sigmoid(c->gs + r0, r1 - r0);
    }
    const int n_lora = j->plan->n_lora;
    ls_cpu_each_slot_rows(j, r0, r1 < n_lora ? r1 : n_lora, index, ls_cpu_shrink_gate_up_slot);
}

/* Stage gate_up, by columns: panels [q0, q1) of the intermediate axis,
 * for every expert's gate and up (w13's panels [q0 * 2n, q1 * 2n), see
 * cpu.h), then SiLU and the gammas into a. */
static void ls_cpu_gate_up(void *p, int index, int count) {
    ls_cpu_job *j = p;
    ls_cpu *c = j->c;
    const int n = c->n, F = c->F, H = c->H, R = c->R, ZW = c->zw, AW = n * F, SW = c->O * 2 * R;
    const size_t step = (size_t)2 * n * LS_CPU_NR; /* zs columns from one j panel to the next */
    int q0, q1;
    ls_cpu_share(ls_cpu_panel_count(F), index, count, &q0, &q1);
    if (q0 == q1) return;
    float *ap = ls_cpu_apack_of(c, index);
    ls_cpu_mat w13 = ls_cpu_w13(c, j->layer);
    ls_cpu_gemm(ls_cpu_kernels_of(c, &w13), ap, j->T, j->xs, (size_t)H, &w13, q0 * 2 * n, q1 * 2 * n, c->zs, (size_t)ZW, LS_CPU_NR, false);
    const int *start = j->plan->start, *order = j->plan->order;
    for (int s = 0; s < c->S; s++) {
        const int r = start[s], m = start[s + 1] - r, rank = ls_cpu_rank(c, s, j->layer);
        if (m == 0 || rank == 0) continue;
        for (int e = 0; e < n; e++)
            for (int half = 0; half < 2; half++) {
                ls_cpu_mat b = ls_cpu_gu_b(c, s, j->layer, e, half);
                const float *a =
                    c->st + (size_t)r * SW + (size_t)(c->O == 1 ? 0 : e) * 2 * rank + (size_t)half * rank;
                float *z = c->zs + (size_t)r * ZW + (size_t)(2 * e + half) * LS_CPU_NR;
                ls_cpu_gemm(ls_cpu_kernels_of(c, &b), ap, m, a, (size_t)SW, &b, q0, q1, z, (size_t)ZW, step, true);
            }
    }
    for (int i = 0; i < j->T; i++) {
        const float *gam = j->gammas ? j->gammas + (size_t)order[i] * n : NULL;
        const float every = j->gate ? c->gs[i] : 1.0f; /* each expert's gamma without gammas */
        for (int q = q0; q < q1; q++) {
            const float *z = c->zs + (size_t)i * ZW + (size_t)q * step;
            const int w = F - q * LS_CPU_NR < LS_CPU_NR ? F - q * LS_CPU_NR : LS_CPU_NR;
            for (int e = 0; e < n; e++)
                ls_cpu_swiglu(z + (size_t)2 * e * LS_CPU_NR, z + (size_t)(2 * e + 1) * LS_CPU_NR, gam ? gam[e] : every,
                              c->as + (size_t)i * AW + (size_t)e * F + (size_t)q * LS_CPU_NR, w);
        }
    }
}

/* Stage shrink_down, by rows: this thread's share of the adapted rows. */
static void ls_cpu_shrink_down(void *p, int index, int count) {
    ls_cpu_job *j = p;
    int r0, r1;
    ls_cpu_share(j->plan->n_lora, index, count, &r0, &r1);
    ls_cpu_each_slot_rows(j, r0, r1, index, ls_cpu_shrink_down_slot);
}

/* Columns [h0, h1) of y back to token order (nothing when the plan order
 * is the token order). */
static void ls_cpu_scatter(const ls_cpu_job *j, int h0, int h1) {
    const ls_cpu *c = j->c;
    const int H = c->H;
    if (j->ys != c->ys) return;
    for (int i = 0; i < j->T; i++)
        memcpy(j->y + (size_t)j->plan->order[i] * H + h0, c->ys + (size_t)i * H + h0,
               (size_t)(h1 - h0) * sizeof(float));
}

/* Stage down, by columns: output columns [q0, q1) of panels: the down
 * projection, each slot's expand chained on (outer block 0's K first),
 * then this share's scatter. */
static void ls_cpu_down(void *p, int index, int count) {
    ls_cpu_job *j = p;
    ls_cpu *c = j->c;
    const int H = c->H, R = c->R, AW = c->n * c->F, PW = c->O * R;
    int q0, q1;
    ls_cpu_share(ls_cpu_panel_count(H), index, count, &q0, &q1);
    if (q0 == q1) return;
    float *ap = ls_cpu_apack_of(c, index);
    ls_cpu_mat w2 = ls_cpu_w2(c, j->layer);
    ls_cpu_gemm(ls_cpu_kernels_of(c, &w2), ap, j->T, c->as, (size_t)AW, &w2, q0, q1, j->ys, (size_t)H, LS_CPU_NR, false);
    const int *start = j->plan->start;
    for (int s = 0; s < c->S; s++) {
        const int r = start[s], m = start[s + 1] - r, rank = ls_cpu_rank(c, s, j->layer);
        for (int o = 0; m > 0 && rank > 0 && o < c->O; o++) {
            ls_cpu_mat b = ls_cpu_d_b(c, s, j->layer, o);
            ls_cpu_gemm(ls_cpu_kernels_of(c, &b), ap, m, c->pt + (size_t)r * PW + (size_t)o * rank, (size_t)PW, &b, q0, q1,
                        j->ys + (size_t)r * H, (size_t)H, LS_CPU_NR, true);
        }
    }
    ls_cpu_scatter(j, q0 * LS_CPU_NR, q1 * LS_CPU_NR < H ? q1 * LS_CPU_NR : H);
}

/* backend.c has checked every argument and made the plan. Owns nothing;
 * x, gammas, plan and y are the caller's. */
ls_status ls_cpu_forward(ls_backend *be, int layer, const float *x, const float *gammas, const ls_token_plan *plan,
                         float *y, ls_error *err) {
    (void)err;
    ls_cpu *c = be->ctx;
    const int T = plan->T;
    /* Already in plan order (one adapter, or grouped): no gather, no scatter. */
    ls_cpu_job j = {.c = c, .plan = plan, .layer = layer, .T = T, .x = x, .gammas = gammas, .y = y,
                    .xs = plan->identity ? x : c->xs, .ys = plan->identity ? y : c->ys,
                    .gate = c->gated && !gammas};
    const bool lora = plan->n_lora > 0;
    if (lora || !plan->identity || j.gate) ls_cpu_threads_run(c->threads, ls_cpu_shrink_gate_up, &j);
    ls_cpu_threads_run(c->threads, ls_cpu_gate_up, &j);
    if (lora) ls_cpu_threads_run(c->threads, ls_cpu_shrink_down, &j);
    ls_cpu_threads_run(c->threads, ls_cpu_down, &j);
    return LS_OK;
}
