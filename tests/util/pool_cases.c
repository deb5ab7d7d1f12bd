/* The case helpers of test_pool.c and test_pool_tier.c, compiled once:
 * (name, version) adapters over the fake backend, readable snapshots, and
 * forwards checked against the fake's formula. */
#include "tests/util/pool_cases.h"

const ls_dims pc_dims = {.n = 2, .H = 6, .F = 3, .L = 2, .w13_layout = LS_W13_INTERLEAVED};

uint64_t pc_seed_of(const char *name, uint64_t version) {
    return ls_fnv1a64(name) ^ (version * 0x9E3779B97F4A7C15ull);
}

pc_fx pc_fx_make(int S, int max_tokens, int host_cache, ls_pool_reload_fn reload, void *ctx) {
    pc_fx f;
    f.fk = pt_fake_create(pc_dims, S, PC_RMAX, max_tokens);
    f.p = pt_pool(f.fk->be, host_cache, reload, ctx);
    return f;
}

/* The pool first: it borrows the backend. */
void pc_fx_free(pc_fx *f) {
    ls_pool_free(f->p);
    ls_backend_free(f->fk->be);
}

ls_status pc_load(ls_pool *p, const char *name, uint64_t version, bool pinned, bool replace, const char *path,
                  ls_adapter_info *info, ls_error *err) {
    ls_adapter_info tmp;
    if (!info) info = &tmp;
    ls_status st = pt_load(p, &pc_dims, name, PC_RK, pc_seed_of(name, version), pinned, replace, path, info, err);
    if (st == LS_OK) assert_int_equal(info->version, version);
    return st;
}

void pc_load_ok(ls_pool *p, const char *name, uint64_t version, bool pinned, bool replace) {
    ls_error err;
    ls_error_init(&err);
    ls_status st = pc_load(p, name, version, pinned, replace, NULL, NULL, &err);
    if (st != LS_OK) fail_msg("load %s: %s", name, err.message);
    ls_error_free(&err);
}

const char *pc_slots(ls_pool *p) {
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

ls_pool_stats pc_stats(ls_pool *p) {
    ls_slot_info *s;
    ls_pool_stats st;
    assert_int_equal(ls_pool_snapshot(p, &s, &st, NULL), LS_OK);
    free(s);
    return st;
}

ls_adapter_info pc_describe(ls_pool *p, const char *name) {
    ls_adapter_info info;
    ls_error err;
    ls_error_init(&err);
    if (ls_pool_describe(p, name, &info, &err) != LS_OK) fail_msg("describe %s: %s", name, err.message);
    ls_error_free(&err);
    return info;
}

void pc_fill_inputs(int T, float *x, float *g, uint64_t seed) {
    for (long i = 0; i < (long)T * pc_dims.H; i++) x[i] = pt_uniform(&seed, 1.0f);
    for (long i = 0; i < (long)T * pc_dims.n; i++) g[i] = 1.0f + pt_uniform(&seed, 0.5f);
}

void pc_names(ls_token_names *tn, int T, const char *const *names) {
    ls_token_names_init(tn, true);
    for (int t = 0; names && t < T; t++) {
        int k = names[t] ? ls_token_names_index(tn, names[t]) : -1;
        assert_true(!names[t] || k >= 0);
        assert_true(ls_token_names_push(tn, k));
    }
}

ls_status pc_pool_forward(ls_pool *p, int layer, int T, const float *x, const float *g, const char *const *names,
                          float *y, ls_pool_used *used, int *n_used, ls_error *err) {
    ls_token_names tn;
    pc_names(&tn, T, names);
    ls_status st = ls_pool_forward(p, layer, T, x, g, &tn, y, used, n_used, err);
    ls_token_names_free(&tn);
    return st;
}

size_t pc_read_bytes(ls_pool *p, int T, const char *const *names, bool unregistered) {
    ls_token_names tn;
    pc_names(&tn, T, names);
    size_t bytes = ls_pool_forward_read_bytes(p, &tn, unregistered);
    ls_token_names_free(&tn);
    return bytes;
}

/* Allocates and frees its own inputs and outputs. */
ls_status pc_fwd(ls_pool *p, int layer, int T, const char *const *names, ls_pool_used *used, int *n_used,
                 float *y_out, ls_error *err) {
    const ls_dims *d = &pc_dims;
    float *x = calloc((size_t)T * d->H, sizeof(float)), *g = calloc((size_t)T * d->n, sizeof(float));
    float *y = calloc((size_t)T * d->H, sizeof(float)), want[64];
    assert_true(x && g && y);
    ls_pool_used local[64];
    int n_local = 0;
    if (!used) used = local, n_used = &n_local;
    pc_fill_inputs(T, x, g, 99 + (uint64_t)T);
    ls_status st = pc_pool_forward(p, layer, T, x, g, names, y, used, n_used, err);
    for (int t = 0; st == LS_OK && t < T; t++) {
        const char *name = names ? names[t] : NULL;
        ls_adapter a, *ap = NULL;
        if (name) {
            int i = 0;
            while (i < *n_used && strcmp(used[i].name, name) != 0) i++;
            assert_true(i < *n_used);
            pt_adapter(d, PC_RK, pc_seed_of(name, used[i].version), &a);
            ap = &a;
        }
        pt_expect_token(d, ap, layer, x + t * d->H, g + t * d->n, want);
        assert_memory_equal(y + t * d->H, want, sizeof(float) * d->H);
        if (ap) ls_adapter_free(ap);
    }
    if (y_out) memcpy(y_out, y, sizeof(float) * T * d->H);
    free(x);
    free(g);
    free(y);
    return st;
}

void pc_fwd_ok(ls_pool *p, int T, const char *const *names) {
    ls_error err;
    ls_error_init(&err);
    if (pc_fwd(p, 0, T, names, NULL, NULL, NULL, &err) != LS_OK) fail_msg("forward: %s", err.message);
    ls_error_free(&err);
}

ls_status pc_reload(void *ctx, const char *path, const ls_adapter_params *params, ls_adapter *out, ls_error *err) {
    (void)params;
    pc_reload_ctx *c = ctx;
    c->calls++;
    unsigned long long seed;
    if (sscanf(path, "seed:%llu", &seed) != 1) return ls_error_set(err, LS_INVALID_REQUEST, NULL, "bad path");
    pt_adapter(&pc_dims, PC_RK, seed + (c->tamper ? 1 : 0), out);
    return LS_OK;
}
