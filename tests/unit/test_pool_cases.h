/* The cases of test_pool.c and test_pool_tier.c share these: the model
 * dimensions, adapters named by (name, version), a pool over the fake
 * backend, and forwards checked bit for bit against the fake's formula for
 * the versions they report. */
#ifndef LS_TESTS_POOL_CASES_H
#define LS_TESTS_POOL_CASES_H

#include "tests/unit/test_pool_util.h"

#define RK 3
#define RMAX 4
static const ls_dims D = {.n = 2, .H = 6, .F = 3, .L = 2, .w13_layout = LS_W13_INTERLEAVED};

static inline uint64_t seed_of(const char *name, uint64_t version) {
    return ls_fnv1a64(name) ^ (version * 0x9E3779B97F4A7C15ull);
}

typedef struct {
    pt_fake *fk;
    ls_pool *p;
} fx;

static inline fx fx_make(int S, int max_tokens, int host_cache, ls_pool_reload_fn reload, void *ctx) {
    fx f;
    f.fk = pt_fake_create(D, S, RMAX, max_tokens);
    f.p = pt_pool(f.fk->be, host_cache, reload, ctx);
    return f;
}
static inline void fx_free(fx *f) {
    ls_pool_free(f->p);
    ls_backend_free(f->fk->be);
}

/* Loads (name, version)'s factors and checks the pool gave that version. */
static inline ls_status load(ls_pool *p, const char *name, uint64_t version, bool pinned, bool replace,
                             const char *path, ls_adapter_info *info, ls_error *err) {
    ls_adapter_info tmp;
    if (!info) info = &tmp;
    ls_status st = pt_load(p, &D, name, RK, seed_of(name, version), pinned, replace, path, info, err);
    if (st == LS_OK) assert_int_equal(info->version, version);
    return st;
}
static inline void load_ok(ls_pool *p, const char *name, uint64_t version, bool pinned, bool replace) {
    ls_error err;
    ls_error_init(&err);
    ls_status st = load(p, name, version, pinned, replace, NULL, NULL, &err);
    if (st != LS_OK) fail_msg("load %s: %s", name, err.message);
    ls_error_free(&err);
}

/* The slots as "name name -" (- = free), for readable policy asserts. */
static inline const char *slots(ls_pool *p) {
    static char buf[512];
    ls_slot_info *s;
    ls_pool_stats st;
    assert_int_equal(ls_pool_snapshot(p, &s, &st, NULL), LS_OK);
    buf[0] = '\0';
    for (int i = 0; i < st.slots; i++) {
        if (i) strcat(buf, " ");
        strcat(buf, s[i].state == LS_SLOT_FREE ? "-" : s[i].adapter);
    }
    free(s);
    return buf;
}
static inline ls_pool_stats stats(ls_pool *p) {
    ls_slot_info *s;
    ls_pool_stats st;
    assert_int_equal(ls_pool_snapshot(p, &s, &st, NULL), LS_OK);
    free(s);
    return st;
}
static inline ls_adapter_info describe(ls_pool *p, const char *name) {
    ls_adapter_info info;
    ls_error err;
    ls_error_init(&err);
    if (ls_pool_describe(p, name, &info, &err) != LS_OK) fail_msg("describe %s: %s", name, err.message);
    ls_error_free(&err);
    return info;
}

static inline void fill_inputs(int T, float *x, float *g, uint64_t seed) {
    for (long i = 0; i < (long)T * D.H; i++) x[i] = pt_uniform(&seed, 1.0f);
    for (long i = 0; i < (long)T * D.n; i++) g[i] = 1.0f + pt_uniform(&seed, 0.5f);
}

/* Runs a forward on deterministic inputs. On success checks every token's
 * y bit for bit against the fake's formula for the version used[] names.
 * y_out (T*H floats) receives y when given. */
static inline ls_status fwd(ls_pool *p, int layer, int T, const char *const *names, ls_pool_used *used,
                            int *n_used, float *y_out, ls_error *err) {
    float *x = calloc((size_t)T * D.H, sizeof(float)), *g = calloc((size_t)T * D.n, sizeof(float));
    float *y = calloc((size_t)T * D.H, sizeof(float)), want[64];
    assert_true(x && g && y);
    ls_pool_used local[64];
    int n_local = 0;
    if (!used) used = local, n_used = &n_local;
    fill_inputs(T, x, g, 99 + (uint64_t)T);
    ls_status st = ls_pool_forward(p, layer, T, x, g, names, y, used, n_used, err);
    for (int t = 0; st == LS_OK && t < T; t++) {
        const char *name = names ? names[t] : NULL;
        ls_adapter a, *ap = NULL;
        if (name) {
            int i = 0;
            while (i < *n_used && strcmp(used[i].name, name) != 0) i++;
            assert_true(i < *n_used);
            pt_adapter(&D, RK, seed_of(name, used[i].version), &a);
            ap = &a;
        }
        pt_expect_token(&D, ap, layer, x + t * D.H, g + t * D.n, want);
        assert_memory_equal(y + t * D.H, want, sizeof(float) * D.H);
        if (ap) ls_adapter_free(ap);
    }
    if (y_out) memcpy(y_out, y, sizeof(float) * T * D.H);
    free(x);
    free(g);
    free(y);
    return st;
}
static inline void fwd_ok(ls_pool *p, int T, const char *const *names) {
    ls_error err;
    ls_error_init(&err);
    if (fwd(p, 0, T, names, NULL, NULL, NULL, &err) != LS_OK) fail_msg("forward: %s", err.message);
    ls_error_free(&err);
}

typedef struct {
    int calls;
    bool tamper;
} reload_ctx;

/* Reads "seed:N" back as pt_adapter(N), or another adapter when tampered. */
static inline ls_status test_reload(void *ctx, const char *path, const ls_adapter_params *params,
                                    ls_adapter *out, ls_error *err) {
    (void)params;
    reload_ctx *c = ctx;
    c->calls++;
    unsigned long long seed;
    if (sscanf(path, "seed:%llu", &seed) != 1) return ls_error_set(err, LS_INVALID_REQUEST, NULL, "bad path");
    pt_adapter(&D, RK, seed + (c->tamper ? 1 : 0), out);
    return LS_OK;
}

#endif
