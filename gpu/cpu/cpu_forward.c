/* The CPU forward of SPEC §1. Tokens are sorted by slot into contiguous
 * rows; the base GEMMs (W13 over all experts, then W2) run over all rows
 * in tiles of LS_CPU_TILE, whatever the slots; each slot's LoRA runs over
 * its own rows in tiles of LS_CPU_LORA_TILE and adds its deltas. Nothing
 * is allocated here: every buffer was sized in ls_backend_cpu_create.
 *
 * Why the base path ignores slots: it is ~90% of the work, and cutting it
 * per slot would pad every slot's last tile (up to S+1 padded tiles per
 * call). The LoRA GEMMs are small, so their own smaller tile pads little.
 *
 * Tile sizes, measured with the server's default model (n=2 H=1024 F=512
 * R=64) on the development machine (AMD EPYC Zen4, 2 cores, OpenBLAS
 * 0.3.21 Cooperlake kernels), microseconds per token, best of 3-5 runs:
 *
 *   base tile     T=1    T=8   T=32  T>=512   (1 thread)
 *       16       1763    215    115     100
 *       32       2576    323     84      84
 *       64       4413    559    152      75
 *      128       8545   1086    270      70
 *   2 threads: 32: 1547 at T=1, 54 at T>=512; 64: 2873 and 45; 128: 5051
 *   and 44.
 *
 * Every call pays OpenBLAS's packing of the whole weight matrix (~13
 * rows' worth of compute), so small tiles lose throughput and large ones
 * pad a lone token with idle rows. 32 costs 1.5-1.9x less than 64 for a
 * lone token and stays within 12-20% of it for large batches; 16 is 20%
 * slower than 32 once T >= 32. LoRA tiles, four adapters and base mixed
 * evenly, 1 thread: 16 costs 486 us per token at T=8 and 95 at T>=512,
 * 32 costs 551 and 98-104 (16 pads each small group half as much); the
 * LoRA adds ~7% to the base path for large batches. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "gpu/cpu/cpu.h"

/* C[M, N] = A[M, K] · B[K, N], row-major. Every weight and pool factor
 * is stored transposed for this form (see cpu.h). */
static void ls_sgemm(int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}

/* Copies m rows of width w (stride w) into the LoRA tile and zeroes the
 * rest, so every LoRA GEMM reads a whole tile at the same address. */
static void ls_cpu_lora_gather(float *dst, const float *src, int m, int w) {
    memcpy(dst, src, (size_t)m * w * sizeof(float));
    memset(dst + (size_t)m * w, 0, (size_t)(LS_CPU_LORA_TILE - m) * w * sizeof(float));
}

/* dst[i, :] += delta[i, :] for the m real rows. */
static void ls_cpu_add_rows(float *dst, int ld_dst, const float *delta, int ld_delta, int m, int w) {
    for (int i = 0; i < m; i++) {
        float *d = dst + (size_t)i * ld_dst;
        const float *s = delta + (size_t)i * ld_delta;
        for (int j = 0; j < w; j++) d[j] += s[j];
    }
}

/* zs rows [r0, r0+m) += the gate/up LoRA of one slot: ga [H, O*2R],
 * gb [n][2][R][F]. zs's columns per expert are gate then up, like gu_b's
 * rows (the base weights were permuted to that order on upload). */
static void ls_cpu_lora_gate_up(ls_cpu *c, const float *ga, const float *gb, int r0, int m) {
    const int M = LS_CPU_LORA_TILE, n = c->n, F = c->F, R = c->R, O = c->O, H = c->H;
    const int W = n * 2 * F, SW = O * 2 * R;
    ls_cpu_lora_gather(c->lin, c->xs + (size_t)r0 * H, m, H);
    /* One shrink for every outer block: st[:, o*2R + k] = A[o, k] · x. */
    ls_sgemm(M, SW, H, c->lin, H, ga, SW, c->st, SW);
    for (int e = 0; e < n; e++) {
        const float *s = c->st + (size_t)(O == 1 ? 0 : e) * 2 * R;
        const float *b = gb + (size_t)e * 2 * R * F;
        float *d = c->lout + (size_t)e * 2 * F;
        ls_sgemm(M, F, R, s, SW, b, F, d, W);
        ls_sgemm(M, F, R, s + R, SW, b + (size_t)R * F, F, d + F, W);
    }
    ls_cpu_add_rows(c->zs + (size_t)r0 * W, W, c->lout, W, m, W);
}

/* xs (now the outputs) rows [r0, r0+m) += the down LoRA of one slot:
 * da [n*F, R], db [O*R, H]. */
static void ls_cpu_lora_down(ls_cpu *c, const float *da, const float *db, int r0, int m) {
    const int M = LS_CPU_LORA_TILE, n = c->n, F = c->F, R = c->R, H = c->H, O = c->O;
    const int AW = n * F;
    ls_cpu_lora_gather(c->lin, c->as + (size_t)r0 * AW, m, AW);
    if (O == 1) {
        /* One B for all experts: K = n*F sums the experts' shrinks. */
        ls_sgemm(M, R, AW, c->lin, AW, da, R, c->pt, R);
    } else {
        for (int e = 0; e < n; e++)
            ls_sgemm(M, R, F, c->lin + (size_t)e * F, AW, da + (size_t)e * F * R, R, c->pt + (size_t)e * R, n * R);
    }
    /* K = O*R: per expert, the expands are summed here. */
    ls_sgemm(M, H, O * R, c->pt, O * R, db, H, c->lout, H);
    ls_cpu_add_rows(c->xs + (size_t)r0 * H, H, c->lout, H, m, H);
}

/* as = gamma · silu(g) ⊙ u row by row. Each row is its own loop from
 * j = 0, so a value's place in a vectorised loop never depends on the
 * token's row. */
static void ls_cpu_swiglu(ls_cpu *c, int T, const float *gammas) {
    const int n = c->n, F = c->F, W = n * 2 * F;
    for (int i = 0; i < T; i++) {
        const float *gam = gammas ? gammas + (size_t)c->order[i] * n : NULL;
        for (int e = 0; e < n; e++) {
            const float *g = c->zs + (size_t)i * W + (size_t)e * 2 * F;
            const float *u = g + F;
            float *a = c->as + ((size_t)i * n + e) * F;
            const float ge = gam ? gam[e] : 1.0f;
            for (int j = 0; j < F; j++) a[j] = ge * (g[j] / (1.0f + expf(-g[j]))) * u[j];
        }
    }
}

/* Sorts the tokens by slot (counting sort, stable, base-only first) into
 * c->order and c->group. Returns false (nothing written) on a bad slot,
 * with *bad_token set. */
static bool ls_cpu_sort(ls_cpu *c, int T, const int *slot_of_token, int *bad_token) {
    int *group = c->group;
    memset(group, 0, (size_t)(c->S + 2) * sizeof *group);
    for (int t = 0; t < T; t++) {
        int s = slot_of_token ? slot_of_token[t] : -1;
        if (s < -1 || s >= c->S) {
            *bad_token = t;
            return false;
        }
        group[s + 2]++; /* bucket b = s + 1 counts at b + 1 */
    }
    for (int b = 1; b <= c->S + 1; b++) group[b] += group[b - 1];
    /* group[b] is now bucket b's first row; placing advances it to the end. */
    for (int t = 0; t < T; t++) {
        int b = slot_of_token ? slot_of_token[t] + 1 : 0;
        c->order[group[b]++] = t;
    }
    for (int b = c->S + 1; b > 0; b--) group[b] = group[b - 1];
    group[0] = 0;
    return true;
}

/* Checks everything first so a rejected call writes nothing into y.
 * Owns nothing; x, gammas, slot_of_token and y are the caller's. */
ls_status ls_cpu_forward(ls_backend *be, int layer, int T, const float *x, const float *gammas,
                         const int *slot_of_token, float *y, ls_error *err) {
    ls_cpu *c = be->ctx;
    if (layer < 0 || layer >= c->L)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "forward: layer %d out of range [0, %d)", layer, c->L);
    if (T < 0 || T > c->max_tokens)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "forward: %d tokens, expected 0 to %d", T, c->max_tokens);
    if (T == 0) return LS_OK;
    if (!x || !y) return ls_error_set(err, LS_INTERNAL, NULL, "forward: NULL x or y");
    if (!c->uploaded[layer])
        return ls_error_set(err, LS_INTERNAL, NULL, "forward: layer %d has no base weights uploaded", layer);
    int bad = 0;
    if (!ls_cpu_sort(c, T, slot_of_token, &bad))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "forward: token %d names slot %d, expected -1 to %d", bad,
                            slot_of_token[bad], c->S - 1);

    const int n = c->n, H = c->H, F = c->F, W = n * 2 * F, AW = n * F;
    const int rows = (T + LS_CPU_TILE - 1) / LS_CPU_TILE * LS_CPU_TILE;
    const float *w13 = c->w13 + (size_t)layer * W * H, *w2 = c->w2 + (size_t)layer * H * AW;

    for (int i = 0; i < T; i++) memcpy(c->xs + (size_t)i * H, x + (size_t)c->order[i] * H, (size_t)H * sizeof(float));
    memset(c->xs + (size_t)T * H, 0, (size_t)(rows - T) * H * sizeof(float));

    for (int r = 0; r < rows; r += LS_CPU_TILE)
        ls_sgemm(LS_CPU_TILE, W, H, c->xs + (size_t)r * H, H, w13, W, c->zs + (size_t)r * W, W);

    for (int s = 0; s < c->S; s++) {
        const size_t at = (size_t)s * (size_t)c->L + (size_t)layer;
        for (int r = c->group[s + 1]; r < c->group[s + 2]; r += LS_CPU_LORA_TILE) {
            int m = c->group[s + 2] - r < LS_CPU_LORA_TILE ? c->group[s + 2] - r : LS_CPU_LORA_TILE;
            ls_cpu_lora_gate_up(c, c->gu_a + at * c->gu_a_len, c->gu_b + at * c->gu_b_len, r, m);
        }
    }

    ls_cpu_swiglu(c, T, gammas);
    memset(c->as + (size_t)T * AW, 0, (size_t)(rows - T) * AW * sizeof(float));

    /* The outputs reuse xs: the inputs are not read again. */
    for (int r = 0; r < rows; r += LS_CPU_TILE)
        ls_sgemm(LS_CPU_TILE, H, AW, c->as + (size_t)r * AW, AW, w2, H, c->xs + (size_t)r * H, H);

    for (int s = 0; s < c->S; s++) {
        const size_t at = (size_t)s * (size_t)c->L + (size_t)layer;
        for (int r = c->group[s + 1]; r < c->group[s + 2]; r += LS_CPU_LORA_TILE) {
            int m = c->group[s + 2] - r < LS_CPU_LORA_TILE ? c->group[s + 2] - r : LS_CPU_LORA_TILE;
            ls_cpu_lora_down(c, c->d_a + at * c->d_a_len, c->d_b + at * c->d_b_len, r, m);
        }
    }

    for (int i = 0; i < T; i++) memcpy(y + (size_t)c->order[i] * H, c->xs + (size_t)i * H, (size_t)H * sizeof(float));
    return LS_OK;
}
