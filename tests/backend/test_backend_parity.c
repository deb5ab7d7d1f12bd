/* Backend parity: one list of forward cases run on every device backend
 * (CUDA with its tensor-core LoRA kernels and CUDA graphs, with its
 * fp32 LoRA kernels launched directly, with the BGMV shrinks, and with
 * cuBLAS per slot) against the CPU
 * backend, the reference, with docs/math.md's tolerance; on small shapes both
 * are also checked against the tests' double-precision reference. The
 * weights are uploaded typed, at the dtype they are stored in (16-bit
 * bytes for 16-bit cases, and mixed dtypes into an f32 backend), and the
 * gated cases carry a shared-expert gate that forwards without gammas
 * apply, and their even slots a delta of it (an adapter of
 * shared_expert_gate, gate_lora on for every CUDA backend here); each
 * device forward is run twice and must give the same bits.
 * Exits 77 (skipped) when no CUDA device answers. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/tensor.h"
#include "common/text.h"
#include "gpu/backend.h"
#include "gpu/cpu/cpu_backend.h"
#include "gpu/cuda/cuda_backend.h"
#include "tests/util/reference.h"
#include "tests/util/testutil.h"

#define MAX_T 6
#define MAX_DEV 4

typedef struct {
    const char *name;
    int n, H, F, L;
    ls_w13_layout w13;
    ls_lora_layout pool;
    int S, R;
    ls_dtype dtype;
    int T[MAX_T]; /* token counts, 0-terminated */
    int gate;     /* a shared-expert gate on every layer */
    int up_given; /* upload w13 at up13 and w2 at up2, not at dtype */
    ls_dtype up13, up2;
} pcase;

/* From the worked example's size to Inkling-Small (n=2, H=4096, F=2048);
 * odd sizes reach the kernels' unaligned paths. The largest shapes get
 * few token counts to keep the CPU reference affordable. */
#define PLAIN 0, 0, LS_DTYPE_F32, LS_DTYPE_F32 /* no gate, uploaded at the case's dtype */
#define GATED 1, 0, LS_DTYPE_F32, LS_DTYPE_F32
static const pcase CASES[] = {
    {"tiny", 2, 4, 3, 1, LS_W13_INTERLEAVED, LS_LORA_SHARED, 2, 4, LS_DTYPE_BF16, {1, 3, 7}, PLAIN},
    {"tiny-f32", 2, 4, 3, 1, LS_W13_CONTIGUOUS, LS_LORA_SHARED, 2, 4, LS_DTYPE_F32, {1, 3, 7}, PLAIN},
    {"odd-f32", 3, 40, 24, 2, LS_W13_CONTIGUOUS, LS_LORA_PER_EXPERT, 3, 5, LS_DTYPE_F32, {1, 5, 33, 70}, PLAIN},
    {"odd-bf16", 3, 40, 24, 2, LS_W13_INTERLEAVED, LS_LORA_PER_EXPERT, 3, 5, LS_DTYPE_BF16, {2, 33, 70}, PLAIN},
    {"small", 2, 64, 48, 1, LS_W13_INTERLEAVED, LS_LORA_PER_EXPERT, 4, 8, LS_DTYPE_BF16, {1, 31, 64, 100}, PLAIN},
    {"medium", 2, 512, 256, 2, LS_W13_INTERLEAVED, LS_LORA_SHARED, 8, 16, LS_DTYPE_BF16, {1, 8, 64, 300, 1024}, PLAIN},
    {"medium-f16", 4, 256, 128, 1, LS_W13_CONTIGUOUS, LS_LORA_PER_EXPERT, 5, 32, LS_DTYPE_F16, {2, 65, 513}, PLAIN},
    {"medium-f32", 2, 1024, 512, 1, LS_W13_CONTIGUOUS, LS_LORA_SHARED, 4, 64, LS_DTYPE_F32, {1, 129, 2048}, PLAIN},
    {"inkling", 2, 4096, 2048, 1, LS_W13_INTERLEAVED, LS_LORA_SHARED, 8, 64, LS_DTYPE_BF16, {1, 64, 4096}, PLAIN},
    {"inkling-pe", 2, 4096, 2048, 1, LS_W13_CONTIGUOUS, LS_LORA_PER_EXPERT, 4, 16, LS_DTYPE_BF16, {7, 512}, PLAIN},
    {"inkling-f32", 2, 4096, 2048, 1, LS_W13_INTERLEAVED, LS_LORA_SHARED, 2, 16, LS_DTYPE_F32, {1, 256}, PLAIN},
    {"mixed-f32", 2, 64, 48, 2, LS_W13_INTERLEAVED, LS_LORA_SHARED, 3, 8, LS_DTYPE_F32, {1, 31, 100}, 0, 1,
     LS_DTYPE_BF16, LS_DTYPE_F16},
    {"gated-bf16", 1, 40, 24, 2, LS_W13_CONTIGUOUS, LS_LORA_SHARED, 3, 5, LS_DTYPE_BF16, {1, 33, 70}, GATED},
    {"gated-f32", 1, 64, 48, 2, LS_W13_CONTIGUOUS, LS_LORA_SHARED, 3, 8, LS_DTYPE_F32, {2, 65}, GATED},
    {"gated-medium", 1, 2048, 1408, 2, LS_W13_CONTIGUOUS, LS_LORA_SHARED, 4, 16, LS_DTYPE_BF16, {1, 64, 1024}, GATED},
};

typedef struct {
    const char *name;
    ls_backend *be;
    int graphs; /* a CUDA backend that replays graphs */
} device;

/* One slot's factors for every layer, R-padded as the pool holds them. */
typedef struct {
    int rank; /* 0: cleared, adds nothing */
    float **gu_a, **gu_b, **d_a, **d_b; /* [L] */
    int gated;       /* gated cases, even slots: a delta of the gate's weight too */
    float **gate_d;  /* [L] that delta (an adapter of shared_expert_gate) */
} slot_data;

static int g_checks, g_failures;

/* ---- data -------------------------------------------------------------------- */

/* splitmix64 to uniform floats in [-scale, scale]. */
static void fill(float *v, size_t count, double scale, uint64_t *state) {
    for (size_t i = 0; i < count; i++) {
        uint64_t z = ls_splitmix64(state);
        v[i] = (float)((2.0 * ((double)(z >> 11) * (1.0 / 9007199254740992.0)) - 1.0) * scale);
    }
}

/* Random factors of rank r zero-padded to R (docs/math.md, the pool), scaled so the LoRA
 * terms are as large as the base ones: a wrong adapter cannot hide. */
static void make_factors(const ls_dims *d, const ls_pool_dims *p, int r, uint64_t *st, float *gu_a, float *gu_b,
                         float *d_a, float *d_b) {
    const int n = d->n, H = d->H, F = d->F, R = p->max_rank, O = ls_pool_outer(d, p);
    memset(gu_a, 0, ls_pool_gu_a_len(d, p) * sizeof(float));
    memset(gu_b, 0, ls_pool_gu_b_len(d, p) * sizeof(float));
    memset(d_a, 0, ls_pool_d_a_len(d, p) * sizeof(float));
    memset(d_b, 0, ls_pool_d_b_len(d, p) * sizeof(float));
    const double sa = sqrt(3.0 / H), sb = sqrt(3.0 / r), sd = sqrt(3.0 / F);
    for (int o = 0; o < O; o++) {
        fill(gu_a + (size_t)o * 2 * R * H, (size_t)r * H, sa, st);           /* gate rows 0..r-1 */
        fill(gu_a + ((size_t)o * 2 * R + R) * H, (size_t)r * H, sa, st);     /* up rows R..R+r-1 */
        for (int h = 0; h < H; h++) fill(d_b + ((size_t)o * H + h) * R, (size_t)r, sb, st);
    }
    for (int e = 0; e < n; e++) {
        for (int i = 0; i < 2 * F; i++) fill(gu_b + ((size_t)e * 2 * F + i) * R, (size_t)r, sb, st);
        fill(d_a + (size_t)e * R * F, (size_t)r * F, sd, st);
    }
}

/* ---- comparison ------------------------------------------------------------------ */

/* docs/math.md on the whole output, plus every token on its own (looser, so a
 * token served with the wrong adapter shows even among thousands). */
static int compare(const char *label, const float *y, const float *ref_f, const double *ref_d, int T, int H,
                   double tol) {
    double diff2 = 0, ref2 = 0, worst = 0;
    int worst_t = -1, bad_t = -1;
    for (long i = 0; i < (long)T * H; i++) {
        double r = ref_f ? ref_f[i] : ref_d[i];
        diff2 += (y[i] - r) * (y[i] - r);
        ref2 += r * r;
    }
    const double rms = sqrt(ref2 / T);
    for (int t = 0; t < T; t++) {
        double e2 = 0, r2 = 0;
        for (int h = 0; h < H; h++) {
            long i = (long)t * H + h;
            double r = ref_f ? ref_f[i] : ref_d[i];
            e2 += (y[i] - r) * (y[i] - r);
            r2 += r * r;
        }
        double scale = fmax(sqrt(r2), 0.25 * rms), rel = scale > 0 ? sqrt(e2) / scale : sqrt(e2);
        if (!(rel <= worst)) worst = rel, worst_t = t;
        if (!(rel <= 4 * tol) && bad_t < 0) bad_t = t;
    }
    double rel = ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2);
    int ok = rel <= tol && bad_t < 0;
    g_checks++;
    if (!ok) {
        g_failures++;
        printf("FAIL %s: rel %.3g (tol %.0e), worst token %d at %.3g", label, rel, tol, worst_t, worst);
        if (bad_t >= 0) {
            long i = (long)bad_t * H;
            printf("; token %d: y[0..2] = %g %g %g, ref %g %g %g", bad_t, y[i], H > 1 ? y[i + 1] : 0.0,
                   H > 2 ? y[i + 2] : 0.0, ref_f ? ref_f[i] : ref_d[i],
                   H > 1 ? (ref_f ? ref_f[i + 1] : ref_d[i + 1]) : 0.0,
                   H > 2 ? (ref_f ? ref_f[i + 2] : ref_d[i + 2]) : 0.0);
        }
        printf("\n");
    } else {
        printf("ok   %s: rel %.3g (tol %.0e), worst token %.3g\n", label, rel, tol, worst);
    }
    return ok;
}

static void expect(int cond, const char *what) {
    g_checks++;
    if (!cond) {
        g_failures++;
        printf("FAIL %s\n", what);
    } else {
        printf("ok   %s\n", what);
    }
}

/* The slots' factors of one layer at their own rank, for ls_ref_forward. */
typedef struct {
    ls_ref_lora lora;
    double *gu_a, *gu_b, *d_a, *d_b;
} ref_adapter;

static void ref_adapter_make(const ls_dims *d, const ls_pool_dims *p, const slot_data *sd, int layer,
                             ref_adapter *ra) {
    const long n = d->n, H = d->H, F = d->F, R = p->max_rank, O = ls_pool_outer(d, p), r = sd->rank;
    ra->gu_a = ls_test_calloc((size_t)(O * 2 * r * H), sizeof(double));
    ra->gu_b = ls_test_calloc((size_t)(n * 2 * F * r), sizeof(double));
    ra->d_a = ls_test_calloc((size_t)(n * r * F), sizeof(double));
    ra->d_b = ls_test_calloc((size_t)(O * H * r), sizeof(double));
    const float *ga = sd->gu_a[layer], *gb = sd->gu_b[layer], *da = sd->d_a[layer], *db = sd->d_b[layer];
    for (long o = 0; o < O; o++)
        for (long k = 0; k < r; k++)
            for (long h = 0; h < H; h++) {
                ra->gu_a[(o * 2 * r + k) * H + h] = ga[(o * 2 * R + k) * H + h];
                ra->gu_a[(o * 2 * r + r + k) * H + h] = ga[(o * 2 * R + R + k) * H + h];
            }
    for (long i = 0; i < n * 2 * F; i++)
        for (long k = 0; k < r; k++) ra->gu_b[i * r + k] = gb[i * R + k];
    for (long e = 0; e < n; e++)
        for (long k = 0; k < r; k++)
            for (long j = 0; j < F; j++) ra->d_a[(e * r + k) * F + j] = da[(e * R + k) * F + j];
    for (long i = 0; i < O * H; i++)
        for (long k = 0; k < r; k++) ra->d_b[i * r + k] = db[i * R + k];
    ra->lora = (ls_ref_lora){(int)r, (int)O, ra->gu_a, ra->gu_b, ra->d_a, ra->d_b};
}

static void ref_adapter_free(ref_adapter *ra) {
    free(ra->gu_a);
    free(ra->gu_b);
    free(ra->d_a);
    free(ra->d_b);
}

/* ---- one case ------------------------------------------------------------------------ */

typedef struct {
    const pcase *pc;
    ls_dims dims;
    ls_pool_dims pool;
    ls_backend *cpu;
    device dev[MAX_DEV];
    int ndev;
    float **w13, **w2; /* [L] host copies (dtype-rounded) */
    float **gate;      /* [L] the gate's weights (bf16 values), gated cases */
    slot_data *slots;  /* [S] */
    int ref_ok;        /* small enough for the double reference */
    double tol;
} run;

static int must(ls_status st, ls_error *err, const char *what) {
    if (st == LS_OK) return 1;
    g_checks++;
    g_failures++;
    printf("FAIL %s: %s: %s\n", what, ls_status_code(st), err->message);
    ls_error_clear(err);
    return 0;
}

/* Writes slot s at its rank (0: zero factors), with a gate delta when
 * gated (gated cases only). */
static void write_slot(run *rn, int s, int gated, uint64_t *st, ls_error *err) {
    slot_data *sd = &rn->slots[s];
    sd->gated = rn->gate && gated;
    for (int l = 0; l < rn->dims.L; l++) {
        make_factors(&rn->dims, &rn->pool, sd->rank, st, sd->gu_a[l], sd->gu_b[l], sd->d_a[l], sd->d_b[l]);
        if (sd->gated) fill(sd->gate_d[l], (size_t)rn->dims.H, 2.0 * sqrt(3.0 / rn->dims.H), st);
        ls_slot_factors f = {sd->gu_a[l], sd->gu_b[l], sd->d_a[l], sd->d_b[l], sd->gated ? sd->gate_d[l] : NULL};
        must(ls_backend_slot_write(rn->cpu, s, l, &f, err), err, "cpu slot_write");
        for (int i = 0; i < rn->ndev; i++)
            must(ls_backend_slot_write(rn->dev[i].be, s, l, &f, err), err, "device slot_write");
    }
}

/* One forward on every backend and the comparisons. */
static void check_forward(run *rn, const char *pattern, int layer, int T, const float *x, const float *gam,
                          const int *slot_of_token, ls_error *err) {
    const int H = rn->dims.H;
    float *y_cpu = ls_test_calloc((size_t)T * H, sizeof(float));
    float *y = ls_test_calloc((size_t)T * H, sizeof(float)), *y2 = ls_test_calloc((size_t)T * H, sizeof(float));
    char label[256];
    if (!must(ls_backend_forward(rn->cpu, layer, T, x, gam, slot_of_token, y_cpu, err), err, "cpu forward"))
        goto out;
    for (int i = 0; i < rn->ndev; i++) {
        snprintf(label, sizeof label, "%s %s T=%d layer %d %s vs cpu", rn->pc->name, rn->dev[i].name, T, layer,
                 pattern);
        memset(y, 0xff, (size_t)T * H * sizeof(float)); /* NaN: a row left unwritten fails */
        if (must(ls_backend_forward(rn->dev[i].be, layer, T, x, gam, slot_of_token, y, err), err, label))
            compare(label, y, y_cpu, NULL, T, H, rn->tol);
        /* The same batch again gives the same bits (docs/math.md): no
         * atomics, the K split summed in a fixed order. */
        snprintf(label, sizeof label, "%s %s T=%d layer %d %s repeated: the same bits", rn->pc->name,
                 rn->dev[i].name, T, layer, pattern);
        memset(y2, 0xff, (size_t)T * H * sizeof(float));
        if (must(ls_backend_forward(rn->dev[i].be, layer, T, x, gam, slot_of_token, y2, err), err, label))
            expect(memcmp(y, y2, (size_t)T * H * sizeof(float)) == 0, label);
    }
    if (rn->ref_ok) {
        const ls_dims *d = &rn->dims;
        const long n13 = (long)d->n * 2 * d->F * d->H, n2 = (long)d->n * d->H * d->F;
        double *w13 = ls_test_calloc((size_t)n13, sizeof(double)), *w2 = ls_test_calloc((size_t)n2, sizeof(double));
        double *xd = ls_test_calloc((size_t)T * H, sizeof(double)), *gd = ls_test_calloc((size_t)T * d->n, sizeof(double));
        double *yd = ls_test_calloc((size_t)T * H, sizeof(double));
        for (long i = 0; i < n13; i++) w13[i] = rn->w13[layer][i];
        for (long i = 0; i < n2; i++) w2[i] = rn->w2[layer][i];
        for (long i = 0; i < (long)T * H; i++) xd[i] = x[i];
        if (gam)
            for (long i = 0; i < (long)T * d->n; i++) gd[i] = gam[i];
        /* Without gammas a gated model's gamma is sigmoid(gate . x), with
         * the token's slot's delta of the gate when it has one. */
        for (int t = 0; !gam && rn->gate && t < T; t++) {
            const int s = slot_of_token ? slot_of_token[t] : -1;
            const float *dw = s >= 0 && rn->slots[s].gated ? rn->slots[s].gate_d[layer] : NULL;
            double z = 0;
            for (int h = 0; h < H; h++) z += xd[(long)t * H + h] * (rn->gate[layer][h] + (dw ? (double)dw[h] : 0.0));
            for (int e = 0; e < d->n; e++) gd[(long)t * d->n + e] = 1.0 / (1.0 + exp(-z));
        }
        ref_adapter *ra = ls_test_calloc((size_t)rn->pool.slots, sizeof *ra);
        const ls_ref_lora **lot = ls_test_calloc((size_t)T, sizeof *lot);
        for (int s = 0; s < rn->pool.slots; s++)
            if (rn->slots[s].rank > 0) ref_adapter_make(d, &rn->pool, &rn->slots[s], layer, &ra[s]);
        for (int t = 0; t < T; t++) {
            int s = slot_of_token ? slot_of_token[t] : -1;
            lot[t] = s >= 0 && rn->slots[s].rank > 0 ? &ra[s].lora : NULL;
        }
        ls_ref_forward(d, w13, w2, T, xd, gam || rn->gate ? gd : NULL, lot, yd);
        /* The CPU backend computes in fp32: it must meet the f32 bound. */
        snprintf(label, sizeof label, "%s cpu T=%d layer %d %s vs double", rn->pc->name, T, layer, pattern);
        compare(label, y_cpu, NULL, yd, T, H, 1e-5);
        for (int i = 0; i < rn->ndev; i++) {
            snprintf(label, sizeof label, "%s %s T=%d layer %d %s vs double", rn->pc->name, rn->dev[i].name, T,
                     layer, pattern);
            if (must(ls_backend_forward(rn->dev[i].be, layer, T, x, gam, slot_of_token, y, err), err,
                     label))
                compare(label, y, NULL, yd, T, H, rn->tol);
        }
        for (int s = 0; s < rn->pool.slots; s++)
            if (rn->slots[s].rank > 0) ref_adapter_free(&ra[s]);
        free(ra);
        free(lot);
        free(w13);
        free(w2);
        free(xd);
        free(gd);
        free(yd);
    }
out:
    free(y_cpu);
    free(y);
    free(y2);
}

/* What slot_read returns is exactly what slot_write received; a cleared
 * slot reads as zeros. */
static void check_slot_read(run *rn, ls_error *err) {
    const ls_dims *d = &rn->dims;
    const ls_pool_dims *p = &rn->pool;
    const size_t la = ls_pool_gu_a_len(d, p), lb = ls_pool_gu_b_len(d, p), lc = ls_pool_d_a_len(d, p),
                 ld = ls_pool_d_b_len(d, p);
    float *a = ls_test_calloc(la, sizeof(float)), *b = ls_test_calloc(lb, sizeof(float)), *c = ls_test_calloc(lc, sizeof(float)),
          *dd = ls_test_calloc(ld, sizeof(float));
    const int layer = d->L - 1;
    char label[200];
    for (int i = 0; i < rn->ndev; i++) {
        ls_backend *be = rn->dev[i].be;
        const slot_data *sd = &rn->slots[0];
        snprintf(label, sizeof label, "%s %s slot_read(0, %d) returns what was written", rn->pc->name,
                 rn->dev[i].name, layer);
        if (must(ls_backend_slot_read(be, 0, layer, a, b, c, dd, err), err, label))
            expect(!memcmp(a, sd->gu_a[layer], la * 4) && !memcmp(b, sd->gu_b[layer], lb * 4) &&
                       !memcmp(c, sd->d_a[layer], lc * 4) && !memcmp(dd, sd->d_b[layer], ld * 4),
                   label);
        if (p->slots >= 2 && rn->slots[p->slots - 1].rank == 0) {
            snprintf(label, sizeof label, "%s %s cleared slot reads as zeros", rn->pc->name, rn->dev[i].name);
            if (must(ls_backend_slot_read(be, p->slots - 1, layer, a, b, c, dd, err), err, label)) {
                int zero = 1;
                for (size_t k = 0; k < la; k++) zero &= a[k] == 0;
                for (size_t k = 0; k < lb; k++) zero &= b[k] == 0;
                for (size_t k = 0; k < lc; k++) zero &= c[k] == 0;
                for (size_t k = 0; k < ld; k++) zero &= dd[k] == 0;
                expect(zero, label);
            }
        }
        size_t fr = 0, tot = 0;
        snprintf(label, sizeof label, "%s %s memory reports free <= total", rn->pc->name, rn->dev[i].name);
        if (must(ls_backend_memory(be, &fr, &tot, err), err, label)) expect(tot > 0 && fr <= tot, label);
    }
    free(a);
    free(b);
    free(c);
    free(dd);
}

static const char *PATTERNS[] = {"base-only", "one-adapter", "mixed+base", "every-slot"};

/* slot_of_token for pattern k: NULL (base only), every token on `one`,
 * slots -1..2 interleaved, or token t on slot t % S. */
static const int *make_pattern(int k, int T, int S, int one, int *sot) {
    if (k == 0) return NULL;
    for (int t = 0; t < T; t++) {
        if (k == 1)
            sot[t] = one;
        else if (k == 2)
            sot[t] = (t * 7 + 3) % ((S < 3 ? S : 3) + 1) - 1;
        else
            sot[t] = t % S;
    }
    return sot;
}

/* Rounds layer l's weights to the dtypes they are uploaded at (then to
 * the backends', which is exact), encodes them at those dtypes and uploads
 * them typed to every backend, the gate as bf16. */
static void upload_layer(run *rn, int l, size_t n13, size_t n2, ls_error *err) {
    const pcase *pc = rn->pc;
    const ls_dtype d13 = pc->up_given ? pc->up13 : pc->dtype, d2 = pc->up_given ? pc->up2 : pc->dtype;
    ls_round_to_dtype(d13, rn->w13[l], n13);
    ls_round_to_dtype(d2, rn->w2[l], n2);
    /* Every backend and the double reference see the same weights. */
    ls_round_to_dtype(pc->dtype, rn->w13[l], n13);
    ls_round_to_dtype(pc->dtype, rn->w2[l], n2);
    void *b13 = ls_test_calloc(n13, ls_dtype_size(d13)), *b2 = ls_test_calloc(n2, ls_dtype_size(d2));
    void *bg = rn->gate ? ls_test_calloc((size_t)pc->H, 2) : NULL;
    ls_convert_from_f32(d13, rn->w13[l], n13, b13);
    ls_convert_from_f32(d2, rn->w2[l], n2, b2);
    if (bg) ls_convert_from_f32(LS_DTYPE_BF16, rn->gate[l], (size_t)pc->H, bg);
    const ls_base_layer bl = {{d13, b13}, {d2, b2}, {LS_DTYPE_BF16, bg}};
    must(ls_backend_upload_base(rn->cpu, l, &bl, err), err, "cpu upload_base");
    for (int i = 0; i < rn->ndev; i++) must(ls_backend_upload_base(rn->dev[i].be, l, &bl, err), err, "device upload_base");
    free(b13);
    free(b2);
    free(bg);
}

#ifdef LS_HAVE_CUDA
/* One more CUDA backend of cfg (settings NULL: the defaults) with its
 * LoRA kernels set to mode, named name; a failed create is reported. */
static void add_cuda(run *rn, const ls_backend_config *cfg, const ls_cuda_settings *settings, ls_cuda_sgmv_mode mode,
                     const char *name, ls_error *err) {
    ls_backend *be = NULL;
    /* The gate's per-slot delta, off in serving until this suite has
     * passed on a device, is on in every CUDA backend here. */
    ls_cuda_settings with_gate = settings ? *settings : (ls_cuda_settings){0};
    with_gate.gate_lora = 1;
    if (!must(ls_backend_cuda_create(cfg, &with_gate, &be, err), err, "cuda create")) return;
    ls_backend_cuda_set_sgmv_mode(be, mode);
    rn->dev[rn->ndev++] = (device){name, be, !settings || settings->graphs >= 0};
}

/* Serving's graphs were used as docs/server.md says: every forward ran
 * at least twice, so each backend with graphs captured (the second
 * sighting) and none failed; a shape run three times (the double
 * reference's forward) was replayed; --cuda-graphs 0 captured nothing.
 * A failed capture falls back to direct launches, which pass every other
 * check: only this one sees it. */
static void check_graphs(const run *rn) {
    for (int i = 0; i < rn->ndev; i++) {
        const ls_graph_cache *g = ls_backend_cuda_graphs(rn->dev[i].be);
        char label[256];
        snprintf(label, sizeof label, "%s %s CUDA graphs: %llu captured, %llu replays, %llu failed", rn->pc->name,
                 rn->dev[i].name, (unsigned long long)g->captures, (unsigned long long)g->hits,
                 (unsigned long long)g->failures);
        if (rn->dev[i].graphs)
            expect(g->captures > 0 && g->failures == 0 && (!rn->ref_ok || g->hits > 0), label);
        else
            expect(g->captures == 0 && g->hits == 0, label);
    }
}
#endif

static void run_case(const pcase *pc, int threads) {
    run rn;
    memset(&rn, 0, sizeof rn);
    rn.pc = pc;
    int Tmax = 1;
    for (int i = 0; i < MAX_T && pc->T[i]; i++) Tmax = pc->T[i] > Tmax ? pc->T[i] : Tmax;
    rn.dims = (ls_dims){.n = pc->n, .H = pc->H, .F = pc->F, .L = pc->L, .w13_layout = pc->w13, .gate = pc->gate};
    rn.pool = (ls_pool_dims){.slots = pc->S, .max_rank = pc->R, .layout = pc->pool, .max_tokens = Tmax};
    rn.tol = pc->dtype == LS_DTYPE_F32 ? 1e-5 : 1e-2;
    const long nFH = (long)pc->n * pc->F * pc->H;
    rn.ref_ok = (long)Tmax * nFH <= 60000000L && (long)pc->S * pc->R * nFH <= 60000000L;
    ls_backend_config cfg = {.dims = rn.dims, .pool = rn.pool, .dtype = pc->dtype};
    const ls_cpu_settings cpu = {.threads = threads};
    ls_error err;
    ls_error_init(&err);
    printf("== %s: n=%d H=%d F=%d L=%d, %s W13, %s pool, S=%d R=%d, %s, T up to %d\n", pc->name, pc->n, pc->H,
           pc->F, pc->L, ls_w13_layout_name(pc->w13), ls_lora_layout_name(pc->pool), pc->S, pc->R,
           ls_dtype_name(pc->dtype), Tmax);
    fflush(stdout);
    if (!must(ls_backend_cpu_create(&cfg, &cpu, &rn.cpu, &err), &err, "cpu create")) goto done;
#ifdef LS_HAVE_CUDA
    {
        add_cuda(&rn, &cfg, NULL, LS_CUDA_SGMV_AUTO, "cuda", &err);
        /* f32 runs the fp32 kernels already; 16-bit also checks them, and
         * without CUDA graphs, so a failure names its part: the default
         * backend replays graphs, this one launches every kernel. */
        const ls_cuda_settings direct = {.device_id = 0, .graphs = -1};
        if (pc->dtype != LS_DTYPE_F32) add_cuda(&rn, &cfg, &direct, LS_CUDA_SGMV_SIMT, "cuda-simt-direct", &err);
        /* The BGMV shrinks and cuBLAS per slot, not the default yet, in
         * every dtype. */
        add_cuda(&rn, &cfg, NULL, LS_CUDA_SGMV_BGMV, "cuda-bgmv", &err);
        add_cuda(&rn, &cfg, NULL, LS_CUDA_SGMV_BLAS, "cuda-blas-slots", &err);
    }
#endif
    if (rn.ndev == 0) goto done;

    uint64_t st = 0x5eed;
    for (const char *c = pc->name; *c; c++) st = st * 131 + (unsigned char)*c;
    const size_t n13 = (size_t)pc->n * 2 * pc->F * pc->H, n2 = (size_t)nFH;
    rn.w13 = ls_test_calloc((size_t)pc->L, sizeof(float *));
    rn.w2 = ls_test_calloc((size_t)pc->L, sizeof(float *));
    rn.gate = pc->gate ? ls_test_calloc((size_t)pc->L, sizeof(float *)) : NULL;
    for (int l = 0; l < pc->L; l++) {
        rn.w13[l] = ls_test_calloc(n13, sizeof(float));
        rn.w2[l] = ls_test_calloc(n2, sizeof(float));
        fill(rn.w13[l], n13, sqrt(3.0 / pc->H), &st);
        fill(rn.w2[l], n2, sqrt(3.0 / ((double)pc->n * pc->F)), &st);
        if (rn.gate) {
            rn.gate[l] = ls_test_calloc((size_t)pc->H, sizeof(float));
            fill(rn.gate[l], (size_t)pc->H, 4.0 * sqrt(3.0 / pc->H), &st); /* gates spread over (0, 1) */
            ls_round_to_dtype(LS_DTYPE_BF16, rn.gate[l], (size_t)pc->H);
        }
        upload_layer(&rn, l, n13, n2, &err);
    }

    /* Ranks spread over 1..R; the last slot is written, then cleared. */
    rn.slots = ls_test_calloc((size_t)pc->S, sizeof *rn.slots);
    for (int s = 0; s < pc->S; s++) {
        slot_data *sd = &rn.slots[s];
        sd->rank = pc->S == 1 ? pc->R : 1 + (int)((long)s * (pc->R - 1) / (pc->S - 1));
        sd->gu_a = ls_test_calloc((size_t)pc->L, sizeof(float *));
        sd->gu_b = ls_test_calloc((size_t)pc->L, sizeof(float *));
        sd->d_a = ls_test_calloc((size_t)pc->L, sizeof(float *));
        sd->d_b = ls_test_calloc((size_t)pc->L, sizeof(float *));
        for (int l = 0; l < pc->L; l++) {
            sd->gu_a[l] = ls_test_calloc(ls_pool_gu_a_len(&rn.dims, &rn.pool), sizeof(float));
            sd->gu_b[l] = ls_test_calloc(ls_pool_gu_b_len(&rn.dims, &rn.pool), sizeof(float));
            sd->d_a[l] = ls_test_calloc(ls_pool_d_a_len(&rn.dims, &rn.pool), sizeof(float));
            sd->d_b[l] = ls_test_calloc(ls_pool_d_b_len(&rn.dims, &rn.pool), sizeof(float));
        }
        sd->gate_d = ls_test_calloc((size_t)pc->L, sizeof(float *));
        for (int l = 0; rn.gate && l < pc->L; l++) sd->gate_d[l] = ls_test_calloc((size_t)pc->H, sizeof(float));
        write_slot(&rn, s, s % 2 == 0, &st, &err);
    }
    int live = pc->S;
    if (pc->S >= 2) {
        must(ls_backend_slot_clear(rn.cpu, pc->S - 1, &err), &err, "cpu slot_clear");
        for (int i = 0; i < rn.ndev; i++)
            must(ls_backend_slot_clear(rn.dev[i].be, pc->S - 1, &err), &err, "device slot_clear");
        rn.slots[pc->S - 1].rank = 0;
        rn.slots[pc->S - 1].gated = 0; /* a clear drops the gate's delta too */
        live = pc->S - 1;
    }
    check_slot_read(&rn, &err);

    for (int ti = 0; ti < MAX_T && pc->T[ti]; ti++) {
        const int T = pc->T[ti];
        float *x = ls_test_calloc((size_t)T * pc->H, sizeof(float)), *gam = ls_test_calloc((size_t)T * pc->n, sizeof(float));
        int *sot = ls_test_calloc((size_t)T, sizeof(int));
        fill(x, (size_t)T * pc->H, 1.0, &st);
        fill(gam, (size_t)T * pc->n, 1.0, &st);
        for (long i = 0; i < (long)T * pc->n; i++) gam[i] += 1.0f; /* gates in [0, 2] */
        for (int k = 0; k < 4; k++) {
            const int *s = make_pattern(k, T, pc->S, ti % live, sot);
            check_forward(&rn, PATTERNS[k], (ti + k) % pc->L, T, x, k % 2 ? gam : NULL, s, &err);
        }
        free(x);
        free(gam);
        free(sot);
    }

    /* A rewritten slot serves its new factors: derived operands follow. */
    {
        const int T = Tmax < 100 ? Tmax : 100;
        float *x = ls_test_calloc((size_t)T * pc->H, sizeof(float));
        int *sot = ls_test_calloc((size_t)T, sizeof(int));
        fill(x, (size_t)T * pc->H, 1.0, &st);
        write_slot(&rn, 0, 1, &st, &err);
        check_forward(&rn, "rewritten slot 0", 0, T, x, NULL, make_pattern(1, T, pc->S, 0, sot), &err);
        check_forward(&rn, "rewritten, mixed", pc->L - 1, T, x, NULL, make_pattern(3, T, pc->S, 0, sot), &err);
        /* A shape of the first round again: its graph, captured then, is
         * replayed over the new factors and gate delta. */
        const int T0 = pc->T[0];
        float *x0 = ls_test_calloc((size_t)T0 * pc->H, sizeof(float));
        int *sot0 = ls_test_calloc((size_t)T0, sizeof(int));
        fill(x0, (size_t)T0 * pc->H, 1.0, &st);
        check_forward(&rn, "rewritten, a shape seen before", 2 % pc->L, T0, x0, NULL,
                      make_pattern(2, T0, pc->S, 0, sot0), &err);
        free(x0);
        free(sot0);
        /* A slot index outside the pool is refused, and nothing breaks. */
        sot[0] = pc->S;
        float *y = ls_test_calloc((size_t)T * pc->H, sizeof(float));
        for (int i = 0; i < rn.ndev; i++) {
            char label[160];
            snprintf(label, sizeof label, "%s %s refuses slot %d", pc->name, rn.dev[i].name, pc->S);
            ls_status s = ls_backend_forward(rn.dev[i].be, 0, T, x, NULL, sot, y, &err);
            expect(s != LS_OK, label);
            ls_error_clear(&err);
        }
        check_forward(&rn, "after a refused call", 0, T, x, NULL, NULL, &err);
        free(y);
        free(x);
        free(sot);
    }

    /* The same shape with the tokens split otherwise between two slots:
     * a CUDA graph captured for the first split (each check runs a
     * forward twice or more) must not replay its rows for the second. */
    if (live >= 2 && Tmax >= 2) {
        const int T = Tmax < 8 ? Tmax : 8;
        float *x = ls_test_calloc((size_t)T * pc->H, sizeof(float));
        int *sot = ls_test_calloc((size_t)T, sizeof(int));
        fill(x, (size_t)T * pc->H, 1.0, &st);
        for (int t = 0; t < T; t++) sot[t] = t < T / 2 ? 0 : 1;
        check_forward(&rn, "split in halves", 0, T, x, NULL, sot, &err);
        for (int t = 0; t < T; t++) sot[t] = t < 1 ? 0 : 1;
        check_forward(&rn, "split 1 and T-1", 0, T, x, NULL, sot, &err);
        free(x);
        free(sot);
    }
    /* The gate alone: slot 1 rewritten as zero factors and a gate delta
     * (an adapter of shared_expert_gate only), its rows beside base rows. */
    if (rn.gate && live >= 2 && Tmax >= 2) {
        const int T = Tmax < 8 ? Tmax : 8;
        float *x = ls_test_calloc((size_t)T * pc->H, sizeof(float));
        int *sot = ls_test_calloc((size_t)T, sizeof(int));
        fill(x, (size_t)T * pc->H, 1.0, &st);
        rn.slots[1].rank = 0;
        write_slot(&rn, 1, 1, &st, &err);
        for (int t = 0; t < T; t++) sot[t] = t % 2 ? 1 : -1;
        check_forward(&rn, "the gate alone", pc->L - 1, T, x, NULL, sot, &err);
        for (int t = 0; t < T; t++) sot[t] = t % 3 == 0 ? 0 : t % 3 == 1 ? 1 : -1;
        check_forward(&rn, "the gate alone beside a full slot", 0, T, x, NULL, sot, &err);
        free(x);
        free(sot);
    }

#ifdef LS_HAVE_CUDA
    check_graphs(&rn);
#endif

done:
    for (int i = 0; i < rn.ndev; i++) ls_backend_free(rn.dev[i].be);
    ls_backend_free(rn.cpu);
    for (int l = 0; rn.w13 && l < pc->L; l++) {
        free(rn.w13[l]);
        free(rn.w2[l]);
    }
    for (int l = 0; rn.gate && l < pc->L; l++) free(rn.gate[l]);
    free(rn.w13);
    free(rn.w2);
    free(rn.gate);
    for (int s = 0; rn.slots && s < pc->S; s++) {
        for (int l = 0; l < pc->L; l++) {
            free(rn.slots[s].gu_a[l]);
            free(rn.slots[s].gu_b[l]);
            free(rn.slots[s].d_a[l]);
            free(rn.slots[s].d_b[l]);
            if (rn.slots[s].gate_d) free(rn.slots[s].gate_d[l]);
        }
        free(rn.slots[s].gate_d);
        free(rn.slots[s].gu_a);
        free(rn.slots[s].gu_b);
        free(rn.slots[s].d_a);
        free(rn.slots[s].d_b);
    }
    free(rn.slots);
    ls_error_free(&err);
}

#ifdef LS_HAVE_CUDA
/* A pool that cannot fit fails with LS_DEVICE_ERROR and says how much it
 * needed and how much was free. */
static void check_too_large(void) {
    ls_backend_config cfg = {.dims = {2, 4096, 2048, 20000, LS_W13_INTERLEAVED, false, NULL, 0},
                             .pool = {8, 64, LS_LORA_SHARED, 4096},
                             .dtype = LS_DTYPE_BF16};
    ls_backend *be = NULL;
    ls_error err;
    ls_error_init(&err);
    ls_status st = ls_backend_cuda_create(&cfg, NULL, &be, &err);
    printf("   create of 20000 layers: %s: %s\n", ls_status_code(st), err.message);
    expect(st == LS_DEVICE_ERROR && be == NULL && strstr(err.message, "free") && strstr(err.message, "MiB"),
           "an oversized create fails with device_error naming needed and free memory");
    ls_backend_free(be);
    ls_error_free(&err);
    expect(!ls_backend_cuda_poisoned(NULL), "no CUDA error poisoned the process");
}
#endif

int main(int argc, char **argv) {
    if (!ls_backend_cuda_available()) {
        printf("SKIPPED: no CUDA device\n");
        return 77;
    }
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = nproc < 1 ? 1 : nproc > 16 ? 16 : (int)nproc;
    /* An argument runs only the cases whose name contains it. */
    const char *only = argc > 1 ? argv[1] : NULL;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
        if (!only || strstr(CASES[i].name, only)) run_case(&CASES[i], threads);
#ifdef LS_HAVE_CUDA
    check_too_large();
#endif
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
