/* The tests' reference forward of docs/math.md, written apart from the backends:
 * every distinct adapter is merged into dense double weights
 * (W13 + B·A at the layout's row positions, W2[e] + Bd·Ad[e]), then each
 * token runs through plain loops. Slow and obviously right. */
#include "tests/util/reference.h"

#include "common/text.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Row of gate j / up j inside W13[e] for the layout. */
static long ref_gate_row(const ls_dims *d, int j) { return d->w13_layout == LS_W13_INTERLEAVED ? 2L * j : j; }
static long ref_up_row(const ls_dims *d, int j) {
    return d->w13_layout == LS_W13_INTERLEAVED ? 2L * j + 1 : (long)d->F + j;
}

typedef struct {
    const ls_ref_lora *lora; /* NULL = the base weights */
    double *w13;             /* [n, 2F, H] */
    double *w2;              /* [n, H, F] */
} ref_merged;

static void *ref_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) abort(); /* a test helper: running out of memory ends the test */
    return p;
}

/* Dense weights with one adapter folded in. */
static void ref_merge(const ls_dims *d, const double *w13, const double *w2, const ls_ref_lora *a, ref_merged *m) {
    const long n = d->n, H = d->H, F = d->F;
    m->lora = a;
    m->w13 = ref_xmalloc(sizeof(double) * n * 2 * F * H);
    m->w2 = ref_xmalloc(sizeof(double) * n * H * F);
    memcpy(m->w13, w13, sizeof(double) * n * 2 * F * H);
    memcpy(m->w2, w2, sizeof(double) * n * H * F);
    if (!a) return;
    const long r = a->r;
    for (long e = 0; e < n; e++) {
        const long o = a->outer == 1 ? 0 : e;
        const double *A = a->gu_a + o * 2 * r * H; /* rows 0..r-1 gate, r..2r-1 up */
        const double *B = a->gu_b + e * 2 * F * r; /* rows 0..F-1 gate, F..2F-1 up */
        for (long j = 0; j < F; j++) {
            double *gate = m->w13 + (e * 2 * F + ref_gate_row(d, (int)j)) * H;
            double *up = m->w13 + (e * 2 * F + ref_up_row(d, (int)j)) * H;
            for (long h = 0; h < H; h++) {
                double dg = 0, du = 0;
                for (long k = 0; k < r; k++) {
                    dg += B[j * r + k] * A[k * H + h];
                    du += B[(F + j) * r + k] * A[(r + k) * H + h];
                }
                gate[h] += dg;
                up[h] += du;
            }
        }
        const double *Ad = a->d_a + e * r * F; /* [r, F] */
        const double *Bd = a->d_b + o * H * r; /* [H, r] */
        for (long h = 0; h < H; h++) {
            for (long j = 0; j < F; j++) {
                double s = 0;
                for (long k = 0; k < r; k++) s += Bd[h * r + k] * Ad[k * F + j];
                m->w2[(e * H + h) * F + j] += s;
            }
        }
    }
}

/* One token through merged weights. */
static void ref_token(const ls_dims *d, const ref_merged *m, const double *x, const double *gam, double *y) {
    const long n = d->n, H = d->H, F = d->F;
    double *act = ref_xmalloc(sizeof(double) * F);
    for (long h = 0; h < H; h++) y[h] = 0;
    for (long e = 0; e < n; e++) {
        for (long j = 0; j < F; j++) {
            const double *gr = m->w13 + (e * 2 * F + ref_gate_row(d, (int)j)) * H;
            const double *ur = m->w13 + (e * 2 * F + ref_up_row(d, (int)j)) * H;
            double g = 0, u = 0;
            for (long h = 0; h < H; h++) {
                g += gr[h] * x[h];
                u += ur[h] * x[h];
            }
            double silu = g / (1.0 + exp(-g));
            act[j] = (gam ? gam[e] : 1.0) * silu * u;
        }
        for (long h = 0; h < H; h++) {
            const double *row = m->w2 + (e * H + h) * F;
            double s = 0;
            for (long j = 0; j < F; j++) s += row[j] * act[j];
            y[h] += s;
        }
    }
    free(act);
}

/* See reference.h. Allocates and frees its own merged copies. */
void ls_ref_forward(const ls_dims *dims, const double *w13, const double *w2, int T, const double *x,
                    const double *gammas, const ls_ref_lora *const *lora_of_token, double *y) {
    /* At most T adapters plus the base. */
    ref_merged *merged = ref_xmalloc(sizeof *merged * ((size_t)T + 1));
    int n_merged = 0;
    for (int t = 0; t < T; t++) {
        const ls_ref_lora *a = lora_of_token ? lora_of_token[t] : NULL;
        int i = 0;
        while (i < n_merged && merged[i].lora != a) i++;
        if (i == n_merged) ref_merge(dims, w13, w2, a, &merged[n_merged++]);
        ref_token(dims, &merged[i], x + (long)t * dims->H, gammas ? gammas + (long)t * dims->n : NULL,
                  y + (long)t * dims->H);
    }
    for (int i = 0; i < n_merged; i++) {
        free(merged[i].w13);
        free(merged[i].w2);
    }
    free(merged);
}

static double ref_ratio(double diff2, double ref2) {
    if (ref2 == 0) return sqrt(diff2);
    return sqrt(diff2) / sqrt(ref2);
}

double ls_ref_rel_err_f(const float *y, const double *ref, long count) {
    double diff2 = 0, ref2 = 0;
    for (long i = 0; i < count; i++) {
        double dlt = (double)y[i] - ref[i];
        diff2 += dlt * dlt;
        ref2 += ref[i] * ref[i];
    }
    /* A NaN in y must not read as agreement. */
    return isnan(diff2) ? INFINITY : ref_ratio(diff2, ref2);
}

double ls_ref_rel_err_d(const double *y, const double *ref, long count) {
    double diff2 = 0, ref2 = 0;
    for (long i = 0; i < count; i++) {
        double dlt = y[i] - ref[i];
        diff2 += dlt * dlt;
        ref2 += ref[i] * ref[i];
    }
    return isnan(diff2) ? INFINITY : ref_ratio(diff2, ref2);
}

void ls_ref_fill_uniform(double *v, long count, double scale, unsigned long long *state) {
    for (long i = 0; i < count; i++) {
        uint64_t s = *state, z = ls_splitmix64(&s);
        *state = s;
        double u = (double)(z >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) */
        v[i] = (2.0 * u - 1.0) * scale;
    }
}

void ls_ref_fill_uniform_f(float *v, size_t count, double scale, unsigned long long *state) {
    for (size_t i = 0; i < count; i++) {
        double d;
        ls_ref_fill_uniform(&d, 1, scale, state);
        v[i] = (float)d;
    }
}

void ls_ref_lora_pad(const ls_dims *d, const ls_pool_dims *p, const ls_ref_lora *a, float *ga, float *gb, float *da,
                     float *db) {
    const long n = d->n, H = d->H, F = d->F, R = p->max_rank, r = a->r, O = ls_pool_outer(d, p);
    memset(ga, 0, ls_pool_gu_a_len(d, p) * sizeof *ga);
    memset(gb, 0, ls_pool_gu_b_len(d, p) * sizeof *gb);
    memset(da, 0, ls_pool_d_a_len(d, p) * sizeof *da);
    memset(db, 0, ls_pool_d_b_len(d, p) * sizeof *db);
    for (long o = 0; o < O; o++) {
        long src = a->outer == 1 ? 0 : o;
        for (long k = 0; k < r; k++)
            for (long h = 0; h < H; h++) {
                ga[(o * 2 * R + k) * H + h] = (float)a->gu_a[(src * 2 * r + k) * H + h];
                ga[(o * 2 * R + R + k) * H + h] = (float)a->gu_a[(src * 2 * r + r + k) * H + h];
            }
        for (long h = 0; h < H; h++)
            for (long k = 0; k < r; k++) db[(o * H + h) * R + k] = (float)a->d_b[(src * H + h) * r + k];
    }
    for (long e = 0; e < n; e++) {
        for (long i = 0; i < 2 * F; i++)
            for (long k = 0; k < r; k++) gb[(e * 2 * F + i) * R + k] = (float)a->gu_b[(e * 2 * F + i) * r + k];
        for (long k = 0; k < r; k++)
            for (long j = 0; j < F; j++) da[(e * R + k) * F + j] = (float)a->d_a[(e * r + k) * F + j];
    }
}
