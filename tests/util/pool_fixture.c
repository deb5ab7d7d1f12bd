/* The pool tests' fixtures, compiled once: seeded adapters, the fake
 * backend (a test double of the private backend table, hence
 * gpu/backend_impl.h), the CPU backend fixture and reference helpers. */
#include "tests/util/pool_fixture.h"

#include "common/sha256.h"
#include "gpu/backend_impl.h" /* the fake below is a backend */
#include "gpu/cpu/cpu_backend.h"

uint64_t pt_mix(uint64_t *s) { return ls_splitmix64(s); }
/* Uniform in [-scale, scale). */
float pt_uniform(uint64_t *s, float scale) {
    return (float)(((double)(pt_mix(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0) * scale);
}
int pt_rand(uint64_t *s, int n) { return (int)(pt_mix(s) % (uint64_t)n); }

static size_t pt_layer_floats(const ls_dims *d, int r) {
    size_t n = (size_t)d->n, H = (size_t)d->H, F = (size_t)d->F, R = (size_t)r;
    return 2 * R * H + n * 2 * F * R + n * R * F + H * R; /* outer = 1 */
}

/* A normalised adapter of rank r (outer 1) whose factors follow from seed
 * alone, as ls_adapter_normalise would leave it. Owned by the caller
 * (ls_adapter_free). */
void pt_adapter(const ls_dims *d, int r, uint64_t seed, ls_adapter *a) {
    memset(a, 0, sizeof *a);
    a->meta.format = LS_ADAPTER_FORMAT_POOL;
    a->meta.rank = r;
    a->meta.outer = 1;
    a->layers = d->L;
    a->meta.scale = 1.0;
    a->layer_floats = pt_layer_floats(d, r);
    size_t count = a->layer_floats * (size_t)d->L;
    a->data = malloc(count * sizeof(float));
    a->layer_present = calloc((size_t)d->L, sizeof(bool));
    assert_non_null(a->data);
    assert_non_null(a->layer_present);
    uint64_t s = seed * 0x2545F4914F6CDD1Dull + 17;
    for (size_t i = 0; i < count; i++) a->data[i] = pt_uniform(&s, 0.5f);
    for (int l = 0; l < d->L; l++) a->layer_present[l] = true;
    a->meta.bytes = count * sizeof(float);
    ls_sha256_hex(a->data, a->meta.bytes, a->meta.sha256);
}

/* The compact factors of one layer of a. */
typedef struct {
    const float *gu_a, *gu_b, *d_a, *d_b;
} pt_layer;
static pt_layer pt_layer_of(const ls_dims *d, const ls_adapter *a, int layer) {
    size_t n = (size_t)d->n, H = (size_t)d->H, F = (size_t)d->F, r = (size_t)a->meta.rank;
    pt_layer f;
    f.gu_a = a->data + (size_t)layer * a->layer_floats;
    f.gu_b = f.gu_a + 2 * r * H;
    f.d_a = f.gu_b + n * 2 * F * r;
    f.d_b = f.d_a + n * r * F;
    return f;
}

/* The fake backend's signature of one layer's factors at output index h,
 * from factors padded to rank R (the slot) or compact at rank r (R = r
 * and the up half of gu_a right after the gate half). The padding rows
 * and columns are zeros, which leave a sum unchanged, so both give the
 * same bits: gu_a column h, d_b row h, gu_b row h mod n*2F and the d_a
 * column h mod F over every expert. */
static float pt_sig(const ls_dims *d, int R, int r, int up_row, const float *gu_a, const float *gu_b, const float *d_a,
                    const float *d_b, int h) {
    const int H = d->H, F = d->F, n = d->n;
    double s = 0;
    for (int k = 0; k < r; k++) s += gu_a[(size_t)k * H + h];
    for (int k = 0; k < r; k++) s += gu_a[(size_t)(up_row + k) * H + h];
    for (int k = 0; k < r; k++) s += d_b[(size_t)h * R + k];
    for (int k = 0; k < r; k++) s += gu_b[(size_t)(h % (n * 2 * F)) * R + k];
    for (int e = 0; e < n; e++)
        for (int k = 0; k < r; k++) s += d_a[((size_t)e * R + k) * F + h % F];
    return (float)s;
}

/* What the fake backend returns for one token: x * sum(gammas) + the
 * signature of the adapter's layer (a NULL: base, no signature). */
void pt_expect_token(const ls_dims *d, const ls_adapter *a, int layer, const float *x, const float *gam, float *y) {
    float g = 0;
    for (int e = 0; e < d->n; e++) g += gam ? gam[e] : 1.0f;
    pt_layer f = a ? pt_layer_of(d, a, layer) : (pt_layer){0};
    for (int h = 0; h < d->H; h++) {
        float sig = a ? pt_sig(d, a->meta.rank, a->meta.rank, a->meta.rank, f.gu_a, f.gu_b, f.d_a, f.d_b, h) : 0.0f;
        y[h] = x[h] * g + sig;
    }
}

static void pt_fake_enter(pt_fake *f) {
    if (atomic_fetch_add(&f->in_call, 1) != 0) atomic_fetch_add(&f->overlaps, 1);
}
static void pt_fake_leave(pt_fake *f) { atomic_fetch_sub(&f->in_call, 1); }

static float *pt_fake_at(pt_fake *f, int slot, int layer) {
    return f->store + ((size_t)slot * ls_backend_dims(f->be)->L + (size_t)layer) * f->per_layer;
}

static void pt_fake_free(ls_backend *be) {
    pt_fake *f = be->ctx;
    free(f->store);
    free(f->layers_ok);
    pthread_mutex_destroy(&f->gate_mu);
    pthread_cond_destroy(&f->gate_cv);
    free(f);
}

static ls_status pt_fake_memory(ls_backend *be, size_t *fr, size_t *total, ls_error *err) {
    (void)err;
    *fr = *total = be->pool_bytes;
    return LS_OK;
}

static ls_status pt_fake_upload(ls_backend *be, int layer, const ls_base_layer *w, ls_error *err) {
    (void)be, (void)layer, (void)w, (void)err;
    return LS_OK;
}

static ls_status pt_fake_write(ls_backend *be, int slot, int layer, const ls_slot_factors *sf, ls_error *err) {
    pt_fake *f = be->ctx;
    pt_fake_enter(f);
    atomic_fetch_add(&f->slot_writes, 1);
    ls_status st = LS_OK;
    if (atomic_load(&f->fail_write_in) > 0 && atomic_fetch_sub(&f->fail_write_in, 1) == 1) {
        st = ls_error_set(err, LS_DEVICE_ERROR, NULL, "fake: injected slot write failure");
        float *dst = pt_fake_at(f, slot, layer);
        for (size_t i = 0; i < f->per_layer; i++) dst[i] = 1e30f; /* a half-written slot */
    } else {
        float *dst = pt_fake_at(f, slot, layer);
        const float *src[4] = {sf->gu_a, sf->gu_b, sf->d_a, sf->d_b};
        for (int b = 0; b < 4; b++) {
            memcpy(dst, src[b], f->len[b] * sizeof(float));
            dst += f->len[b];
        }
        if (layer == f->layers_ok[slot]) f->layers_ok[slot]++;
    }
    pt_fake_leave(f);
    return st;
}

static ls_status pt_fake_clear(ls_backend *be, int slot, ls_error *err) {
    (void)err;
    pt_fake *f = be->ctx;
    pt_fake_enter(f);
    atomic_fetch_add(&f->clears, 1);
    memset(pt_fake_at(f, slot, 0), 0, f->per_layer * (size_t)be->dims.L * sizeof(float));
    f->layers_ok[slot] = 0;
    pt_fake_leave(f);
    return LS_OK;
}

static ls_status pt_fake_read(ls_backend *be, int slot, int layer, float *gu_a, float *gu_b, float *d_a, float *d_b,
                              ls_error *err) {
    (void)err;
    pt_fake *f = be->ctx;
    const float *src = pt_fake_at(f, slot, layer);
    float *dst[4] = {gu_a, gu_b, d_a, d_b};
    for (int b = 0; b < 4; b++) {
        memcpy(dst[b], src, f->len[b] * sizeof(float));
        src += f->len[b];
    }
    return LS_OK;
}

static ls_status pt_fake_forward(ls_backend *be, int layer, const float *x, const float *gammas,
                                 const ls_token_plan *plan, float *y, ls_error *err) {
    pt_fake *f = be->ctx;
    const int T = plan->T, *slot_of_token = plan->slot_of_token;
    const ls_dims *d = &be->dims;
    const int R = be->pool.max_rank, S = be->pool.slots;
    (void)err;
    pthread_mutex_lock(&f->gate_mu);
    f->waiting++;
    pthread_cond_broadcast(&f->gate_cv);
    while (f->gate_closed) pthread_cond_wait(&f->gate_cv, &f->gate_mu);
    f->waiting--;
    pthread_mutex_unlock(&f->gate_mu);
    pt_fake_enter(f);
    atomic_fetch_add(&f->forwards, 1);
    if (f->delay_us) usleep((useconds_t)f->delay_us);
    int seen[64], n_seen = 0;
    for (int t = 0; t < T; t++) {
        int s = slot_of_token ? slot_of_token[t] : -1;
        const float *xt = x + (size_t)t * d->H;
        float g = 0;
        for (int e = 0; e < d->n; e++) g += gammas ? gammas[(size_t)t * d->n + e] : 1.0f;
        if (s < -1 || s >= S || (s >= 0 && f->layers_ok[s] != d->L)) {
            atomic_fetch_add(&f->bad_slots, 1);
            s = -1;
        }
        if (s >= 0) {
            int i = 0;
            while (i < n_seen && seen[i] != s) i++;
            if (i == n_seen && n_seen < 64) seen[n_seen++] = s;
        }
        const float *base = s >= 0 ? pt_fake_at(f, s, layer) : NULL;
        for (int h = 0; h < d->H; h++) {
            float sig = 0;
            if (base) {
                const float *gu_a = base, *gu_b = gu_a + f->len[0], *d_a = gu_b + f->len[1], *d_b = d_a + f->len[2];
                sig = pt_sig(d, R, R, R, gu_a, gu_b, d_a, d_b, h);
            }
            y[(size_t)t * d->H + h] = xt[h] * g + sig;
        }
    }
    int m = atomic_load(&f->max_distinct);
    while (n_seen > m && !atomic_compare_exchange_weak(&f->max_distinct, &m, n_seen)) {
    }
    pt_fake_leave(f);
    return LS_OK;
}

static ls_status pt_fake_sync(ls_backend *be, ls_error *err) {
    (void)be, (void)err;
    return LS_OK;
}

/* Designated initialisers: optional hooks added later stay NULL. */
static const ls_backend_ops pt_fake_ops = {
    .name = "fake",
    .free = pt_fake_free,
    .memory = pt_fake_memory,
    .upload_base = pt_fake_upload,
    .slot_write = pt_fake_write,
    .slot_clear = pt_fake_clear,
    .slot_read = pt_fake_read,
    .forward = pt_fake_forward,
    .synchronize = pt_fake_sync,
};

/* A fake backend for the shared pool layout, every layer's (no) weights
 * uploaded; freed with ls_backend_free(f->be). */
pt_fake *pt_fake_create(ls_dims d, int S, int R, int max_tokens) {
    pt_fake *f = calloc(1, sizeof *f);
    assert_non_null(f);
    ls_backend_config cfg = {.dims = d,
                             .pool = {.slots = S, .max_rank = R, .layout = LS_LORA_SHARED, .max_tokens = max_tokens},
                             .dtype = LS_DTYPE_F32};
    ls_error err;
    ls_error_init(&err);
    if (ls_backend_new(&pt_fake_ops, &cfg, &f->be, &err) != LS_OK) fail_msg("fake backend: %s", err.message);
    f->be->ctx = f;
    const ls_pool_dims *pd = ls_backend_pool_dims(f->be);
    f->len[0] = ls_pool_gu_a_len(&d, pd);
    f->len[1] = ls_pool_gu_b_len(&d, pd);
    f->len[2] = ls_pool_d_a_len(&d, pd);
    f->len[3] = ls_pool_d_b_len(&d, pd);
    f->per_layer = f->len[0] + f->len[1] + f->len[2] + f->len[3];
    f->be->pool_bytes = f->per_layer * sizeof(float) * (size_t)S * (size_t)d.L;
    f->store = calloc(f->per_layer * (size_t)S * (size_t)d.L, sizeof(float));
    f->layers_ok = calloc((size_t)S, sizeof(int));
    assert_non_null(f->store);
    assert_non_null(f->layers_ok);
    pthread_mutex_init(&f->gate_mu, NULL);
    pthread_cond_init(&f->gate_cv, NULL);
    for (int l = 0; l < d.L; l++)
        if (ls_backend_upload_base(f->be, l, &(ls_base_layer){ls_typed_f32(f->store), ls_typed_f32(f->store), {0}},
                                   &err) != LS_OK)
            fail_msg("fake upload: %s", err.message);
    ls_error_free(&err);
    return f;
}

void pt_fake_gate(pt_fake *f, bool closed) {
    pthread_mutex_lock(&f->gate_mu);
    f->gate_closed = closed;
    pthread_cond_broadcast(&f->gate_cv);
    pthread_mutex_unlock(&f->gate_mu);
}

/* Waits until `count` forwards wait at the closed gate. */
void pt_fake_wait_blocked(pt_fake *f, int count) {
    pthread_mutex_lock(&f->gate_mu);
    while (f->waiting < count) pthread_cond_wait(&f->gate_cv, &f->gate_mu);
    pthread_mutex_unlock(&f->gate_mu);
}

ls_pool *pt_pool(ls_backend *be, int host_cache, ls_pool_reload_fn reload, void *ctx) {
    ls_pool_config cfg = {.host_cache = host_cache, .reload = reload, .reload_ctx = ctx};
    ls_pool *p = NULL;
    ls_error err;
    ls_error_init(&err);
    ls_status st = ls_pool_create(be, &cfg, &p, &err);
    if (st != LS_OK) fail_msg("ls_pool_create: %s", err.message);
    ls_error_free(&err);
    return p;
}

/* Loads pt_adapter(d, r, seed) under name with the given options. The
 * adapter goes to the pool on success and is freed here on failure. */
ls_status pt_load(ls_pool *p, const ls_dims *d, const char *name, int r, uint64_t seed, bool pinned, bool replace,
                  const char *path, ls_adapter_info *info, ls_error *err) {
    ls_adapter a;
    pt_adapter(d, r, seed, &a);
    ls_pool_load_opts o = {.pinned = pinned, .replace = replace, .source_path = path};
    ls_status st = ls_pool_load(p, name, &a, &o, info, err);
    if (st == LS_OK) assert_null(a.data); /* the pool took it */
    else assert_non_null(a.data);         /* still ours */
    ls_adapter_free(&a);
    return st;
}

/* A CPU backend (f32) with random base weights; *w13 and *w2 receive the
 * same weights in double for ls_ref_forward, [L][n*2F*H] and [L][n*H*F]
 * (caller frees). */
ls_backend *pt_cpu_create(ls_dims d, int S, int R, int max_tokens, uint64_t seed, double **w13, double **w2) {
    ls_backend_config cfg = {.dims = d,
                             .pool = {.slots = S, .max_rank = R, .layout = LS_LORA_SHARED, .max_tokens = max_tokens},
                             .dtype = LS_DTYPE_F32};
    const ls_cpu_settings cpu = {.threads = 1};
    ls_backend *be = NULL;
    ls_error err;
    ls_error_init(&err);
    if (ls_backend_cpu_create(&cfg, &cpu, &be, &err) != LS_OK) fail_msg("cpu backend: %s", err.message);
    size_t n13 = (size_t)d.n * 2 * d.F * d.H, n2 = (size_t)d.n * d.H * d.F;
    *w13 = malloc(n13 * (size_t)d.L * sizeof(double));
    *w2 = malloc(n2 * (size_t)d.L * sizeof(double));
    float *f13 = malloc(n13 * sizeof(float)), *f2 = malloc(n2 * sizeof(float));
    assert_true(*w13 && *w2 && f13 && f2);
    uint64_t s = seed;
    for (int l = 0; l < d.L; l++) {
        for (size_t i = 0; i < n13; i++) (*w13)[l * n13 + i] = f13[i] = pt_uniform(&s, 0.5f);
        for (size_t i = 0; i < n2; i++) (*w2)[l * n2 + i] = f2[i] = pt_uniform(&s, 0.5f);
        const ls_base_layer bl = ls_base_layer_f32(f13, f2);
        if (ls_backend_upload_base(be, l, &bl, &err) != LS_OK) fail_msg("upload_base: %s", err.message);
    }
    free(f13);
    free(f2);
    ls_error_free(&err);
    return be;
}

/* One layer of a as the reference wants it (double; arrays malloc'd,
 * released with pt_ref_lora_free). */
ls_ref_lora pt_ref_lora(const ls_dims *d, const ls_adapter *a, int layer) {
    pt_layer f = pt_layer_of(d, a, layer);
    size_t n = (size_t)d->n, H = (size_t)d->H, F = (size_t)d->F, r = (size_t)a->meta.rank;
    size_t len[4] = {2 * r * H, n * 2 * F * r, n * r * F, H * r};
    const float *src[4] = {f.gu_a, f.gu_b, f.d_a, f.d_b};
    double *dst[4];
    for (int b = 0; b < 4; b++) {
        dst[b] = malloc(len[b] * sizeof(double));
        assert_non_null(dst[b]);
        for (size_t i = 0; i < len[b]; i++) dst[b][i] = src[b][i];
    }
    return (ls_ref_lora){.r = a->meta.rank, .outer = 1, .gu_a = dst[0], .gu_b = dst[1], .d_a = dst[2], .d_b = dst[3]};
}
void pt_ref_lora_free(ls_ref_lora *l) {
    free((void *)l->gu_a);
    free((void *)l->gu_b);
    free((void *)l->d_a);
    free((void *)l->d_b);
}
