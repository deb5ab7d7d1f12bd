/* lora/pool: forwards served in groups (fake and CPU backends, against
 * single-token runs and the reference), failed slot writes and their
 * rollback, the host tier (drops, reloads, a changed file, inline uploads
 * kept, reloads that hold up no other forward) and the one state where
 * nothing can be evicted. */
#include <pthread.h>

#include "tests/util/pool_cases.h"

/* A forward with more distinct adapters than slots (and more tokens than
 * one backend call takes) equals each token run alone. */
static void test_groups_match_single_tokens(void **state) {
    (void)state;
    pc_fx f = pc_fx_make(3, 4, 16, NULL, NULL);
    pc_load_ok(f.p, "P", 1, true, false);
    const char *ids[] = {"a", "b", "c", "d", "e"};
    for (int i = 0; i < 5; i++) pc_load_ok(f.p, ids[i], 1, false, false);
    const char *names[13] = {"a", NULL, "b", "c", "P", "d", "e", "a", NULL, "e", "d", "c", "b"};
    ls_pool_used used[13];
    int n_used;
    float y[13 * 6];
    assert_int_equal(pc_fwd(f.p, 0, 13, names, used, &n_used, y, NULL), LS_OK); /* checks every token */
    assert_int_equal(n_used, 6);
    const char *order[] = {"a", "b", "c", "P", "d", "e"};
    for (int i = 0; i < 6; i++) assert_string_equal(used[i].name, order[i]);
    assert_true(atomic_load(&f.fk->max_distinct) <= 3);
    assert_int_equal(atomic_load(&f.fk->bad_slots), 0);

    float x[13 * 6], g[13 * 2], y1[6];
    pc_fill_inputs(13, x, g, 99 + 13);
    for (int t = 0; t < 13; t++) {
        assert_int_equal(pc_pool_forward(f.p, 0, 1, x + t * 6, g + t * 2, names + t, y1, used, &n_used, NULL), LS_OK);
        assert_memory_equal(y1, y + t * 6, sizeof y1);
    }
    ls_slot_info *s;
    assert_int_equal(ls_pool_snapshot(f.p, &s, NULL, NULL), LS_OK);
    for (int i = 0; i < 3; i++) assert_int_equal(s[i].in_flight, 0);
    assert_string_equal(s[0].adapter, "P");
    free(s);
    pc_fx_free(&f);
}

/* The same on the CPU backend: the real math, bit for bit against single
 * tokens and within 1e-5 of the reference forward. */
static void test_groups_cpu(void **state) {
    (void)state;
    const int T = 11, S = 2;
    double *w13, *w2;
    ls_backend *be = pt_cpu_create(pc_dims, S, PC_RMAX, 5, 7, &w13, &w2);
    ls_pool *p = pt_pool(be, 16, NULL, NULL);
    const char *ids[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++) pc_load_ok(p, ids[i], 1, false, false);
    const char *names[11] = {"a", "b", NULL, "c", "d", "a", "d", NULL, "c", "b", "a"};
    float x[11 * 6], g[11 * 2], y[11 * 6], y1[6];
    pc_fill_inputs(T, x, g, 5);
    ls_pool_used used[11];
    int n_used;
    ls_error err;
    ls_error_init(&err);
    for (int layer = 0; layer < pc_dims.L; layer++) {
        if (pc_pool_forward(p, layer, T, x, g, names, y, used, &n_used, &err) != LS_OK) fail_msg("%s", err.message);
        assert_int_equal(n_used, 4);
        for (int t = 0; t < T; t++) {
            assert_int_equal(pc_pool_forward(p, layer, 1, x + t * 6, g + t * 2, names + t, y1, used, &n_used, NULL),
                             LS_OK);
            assert_memory_equal(y1, y + t * 6, sizeof y1);
        }
        ls_adapter a[4];
        ls_ref_lora rl[4];
        const ls_ref_lora *per_tok[11];
        for (int i = 0; i < 4; i++) {
            pt_adapter(&pc_dims, PC_RK, pc_seed_of(ids[i], 1), &a[i]);
            rl[i] = pt_ref_lora(&pc_dims, &a[i], layer);
        }
        for (int t = 0; t < T; t++) {
            per_tok[t] = NULL;
            for (int i = 0; names[t] && i < 4; i++)
                if (!strcmp(names[t], ids[i])) per_tok[t] = &rl[i];
        }
        double xd[11 * 6], gd[11 * 2], yr[11 * 6];
        for (int i = 0; i < T * 6; i++) xd[i] = x[i];
        for (int i = 0; i < T * 2; i++) gd[i] = g[i];
        size_t n13 = (size_t)pc_dims.n * 2 * pc_dims.F * pc_dims.H, n2 = (size_t)pc_dims.n * pc_dims.H * pc_dims.F;
        ls_ref_forward(&pc_dims, w13 + layer * n13, w2 + layer * n2, T, xd, gd, per_tok, yr);
        assert_true(ls_ref_rel_err_f(y, yr, T * 6) <= 1e-5);
        for (int i = 0; i < 4; i++) {
            pt_ref_lora_free(&rl[i]);
            ls_adapter_free(&a[i]);
        }
    }
    assert_true(pc_stats(p).evictions > 0);
    ls_error_free(&err);
    ls_pool_free(p);
    ls_backend_free(be);
    free(w13);
    free(w2);
}

static void test_failed_slot_write_rolls_back(void **state) {
    (void)state;
    pc_fx f = pc_fx_make(2, 16, 8, NULL, NULL);
    ls_error err;
    ls_error_init(&err);
    atomic_store(&f.fk->fail_write_in, 2); /* the second layer fails */
    assert_int_equal(pc_load(f.p, "a", 1, false, false, NULL, NULL, &err), LS_DEVICE_ERROR);
    ls_adapter_info info;
    assert_int_equal(ls_pool_describe(f.p, "a", &info, NULL), LS_ADAPTER_NOT_FOUND);
    assert_string_equal(pc_slots(f.p), "- -");
    assert_int_equal(atomic_load(&f.fk->clears), 1);
    assert_int_equal(pc_stats(f.p).loads, 0);
    assert_int_equal(pc_stats(f.p).registered, 0);

    /* A failed replace leaves version 1 registered and serving. */
    pc_load_ok(f.p, "a", 1, false, false);
    ls_error_clear(&err);
    atomic_store(&f.fk->fail_write_in, 1);
    assert_int_equal(pc_load(f.p, "a", 2, false, true, NULL, NULL, &err), LS_DEVICE_ERROR);
    assert_int_equal(pc_describe(f.p, "a").version, 1);
    const char *na[] = {"a"};
    ls_pool_used used[1];
    int n_used;
    assert_int_equal(pc_fwd(f.p, 0, 1, na, used, &n_used, NULL, NULL), LS_OK);
    assert_int_equal(used[0].version, 1);

    /* A failed write during a forward: error, nothing held, slot free. */
    pc_load_ok(f.p, "b", 1, false, false);
    pc_load_ok(f.p, "c", 1, false, false); /* a evicted */
    assert_string_equal(pc_slots(f.p), "c b");
    ls_error_clear(&err);
    atomic_store(&f.fk->fail_write_in, 1);
    assert_int_equal(pc_fwd(f.p, 0, 1, na, NULL, NULL, NULL, &err), LS_DEVICE_ERROR);
    assert_int_equal(pc_describe(f.p, "a").in_flight, 0);
    assert_int_equal(pc_describe(f.p, "a").slot, -1);
    assert_string_equal(pc_slots(f.p), "c -"); /* b was evicted for the failed write */
    pc_fwd_ok(f.p, 1, na);
    assert_string_equal(pc_slots(f.p), "c a");
    ls_error_free(&err);
    pc_fx_free(&f);
}

static void test_host_tier_reload(void **state) {
    (void)state;
    pc_reload_ctx rc = {0};
    pc_fx f = pc_fx_make(2, 16, 2, pc_reload, &rc);
    char path[3][64];
    const char *ids[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        snprintf(path[i], sizeof path[i], "seed:%llu", (unsigned long long)pc_seed_of(ids[i], 1));
        ls_adapter_info info;
        assert_int_equal(pc_load(f.p, ids[i], 1, false, false, path[i], &info, NULL), LS_OK);
        assert_string_equal(info.source_path, path[i]);
    }
    /* c evicted a from its slot and pushed a out of the host tier. */
    assert_string_equal(pc_slots(f.p), "c b");
    ls_adapter_info a = pc_describe(f.p, "a");
    assert_false(a.host_data);
    assert_int_equal(a.slot, -1);
    ls_pool_stats st = pc_stats(f.p);
    assert_int_equal(st.host_used, 2);
    assert_int_equal(st.host_drops, 1);
    assert_int_equal(st.registered, 3);

    const char *na[] = {"a"}, *nb[] = {"b"};
    pc_fwd_ok(f.p, 1, na); /* reloaded from its path into b's slot */
    assert_int_equal(rc.calls, 1);
    assert_string_equal(pc_slots(f.p), "c a");
    assert_true(pc_describe(f.p, "a").host_data);
    assert_false(pc_describe(f.p, "b").host_data); /* b was the LRU idle one */
    assert_true(pc_describe(f.p, "c").host_data);
    st = pc_stats(f.p);
    assert_int_equal(st.host_used, 2);
    assert_int_equal(st.host_drops, 2);

    rc.tamper = true;
    ls_error err;
    ls_error_init(&err);
    /* The file changed: the request named a stale adapter, it did not err. */
    assert_int_equal(pc_fwd(f.p, 0, 1, nb, NULL, NULL, NULL, &err), LS_ADAPTER_STALE);
    assert_non_null(strstr(err.message, "changed since it was loaded"));
    assert_int_equal(pc_describe(f.p, "b").in_flight, 0);
    rc.tamper = false;
    pc_fwd_ok(f.p, 1, nb);
    ls_error_free(&err);
    pc_fx_free(&f);
}

/* A reload that records the most host copies the pool held while it ran. */
typedef struct {
    ls_pool *p;
    int calls, most;
} counting_reload;

static ls_status counting_reload_fn(void *ctx, const char *path, const ls_adapter_params *params, ls_adapter *out,
                                    ls_error *err) {
    counting_reload *c = ctx;
    ls_pool_stats st = pc_stats(c->p);
    if (st.host_used > c->most) c->most = st.host_used;
    c->calls++;
    pc_reload_ctx plain = {0};
    return pc_reload(&plain, path, params, out, err);
}

/* One forward naming more adapters than the host tier holds read every
 * one back before running any and kept them all: a forward naming 300
 * left 300 copies in a tier of 8. Now each group's copies are read just
 * before it runs (at most ls_pool_read_budget beyond the tier) and let go
 * after: the tier never holds more than its size plus that budget, is
 * back to its size when the forward ends, and the outputs are the same
 * bits as each token run alone. */
static void test_forward_keeps_host_tier_cap(void **state) {
    (void)state;
    enum { N = 12, T = 2 * N + 1 };
    counting_reload rc = {0};
    pc_fx f = pc_fx_make(2, 16, 2, counting_reload_fn, &rc);
    rc.p = f.p;
    char ids[N][8], path[N][64];
    const char *names[T];
    for (int i = 0; i < N; i++) {
        snprintf(ids[i], sizeof ids[i], "a%d", i);
        snprintf(path[i], sizeof path[i], "seed:%llu", (unsigned long long)pc_seed_of(ids[i], 1));
        assert_int_equal(pc_load(f.p, ids[i], 1, false, false, path[i], NULL, NULL), LS_OK);
        names[i] = names[2 * N - 1 - i] = ids[i];
    }
    names[T - 1] = NULL;
    assert_int_equal(pc_stats(f.p).host_used, 2);
    assert_int_equal(ls_pool_read_budget(f.p), 2);
    /* What the forward may hold is counted before it runs: ten of the
     * twelve are neither resident nor in the tier, at most two at once. */
    ls_adapter_info a0 = pc_describe(f.p, "a0");
    assert_int_equal(pc_read_bytes(f.p, T, names, false), 2 * a0.meta.bytes);
    const char *unknown[2] = {"nobody", "a0"};
    assert_int_equal(pc_read_bytes(f.p, 2, unknown, false), a0.meta.bytes);
    assert_true(pc_read_bytes(f.p, 2, unknown, true) >= 2 * a0.meta.bytes);
    ls_pool_used used[T];
    int n_used;
    float y[T * 6], y1[6], x[T * 6], g[T * 2];
    assert_int_equal(pc_fwd(f.p, 0, T, names, used, &n_used, y, NULL), LS_OK); /* checks every token */
    assert_int_equal(n_used, N);
    print_message("%d adapters in one forward: %d read back, at most %d host copies (tier of 2)\n", N, rc.calls,
                  rc.most);
    assert_true(rc.calls >= N - 2);
    assert_true(rc.most <= 2 + 2);
    ls_pool_stats st = pc_stats(f.p);
    assert_true(st.host_used <= 2);
    for (int i = 0; i < N; i++) assert_int_equal(pc_describe(f.p, ids[i]).in_flight, 0);
    pc_fill_inputs(T, x, g, 99 + T);
    for (int t = 0; t < T; t++) {
        assert_int_equal(pc_pool_forward(f.p, 0, 1, x + t * 6, g + t * 2, names + t, y1, used, &n_used, NULL), LS_OK);
        assert_memory_equal(y1, y + t * 6, sizeof y1);
        assert_true(pc_stats(f.p).host_used <= 2);
    }
    pc_fx_free(&f);
}

/* What a forward may read back counts each adapter once, however its
 * tokens interleave: names took only a run of one name as one before
 * (u v u v counted four copies where the forward reads two). */
static void test_read_bytes_counts_each_name_once(void **state) {
    (void)state;
    enum { N = 12 };
    counting_reload rc = {0};
    pc_fx f = pc_fx_make(4, 16, 4, counting_reload_fn, &rc);
    rc.p = f.p;
    char ids[N][8], path[N][64];
    const char *cold[N];
    int n_cold = 0;
    for (int i = 0; i < N; i++) {
        snprintf(ids[i], sizeof ids[i], "a%d", i);
        snprintf(path[i], sizeof path[i], "seed:%llu", (unsigned long long)pc_seed_of(ids[i], 1));
        assert_int_equal(pc_load(f.p, ids[i], 1, false, false, path[i], NULL, NULL), LS_OK);
    }
    for (int i = 0; i < N; i++) {
        ls_adapter_info info = pc_describe(f.p, ids[i]);
        if (info.slot < 0 && !info.host_data) cold[n_cold++] = ids[i];
    }
    assert_int_equal(ls_pool_read_budget(f.p), 4);
    assert_true(n_cold >= 2);
    const size_t bytes = pc_describe(f.p, cold[0]).meta.bytes;
    const char *names[] = {cold[0], cold[1], cold[0], cold[1], NULL};
    assert_int_equal(pc_read_bytes(f.p, 5, names, false), 2 * bytes);
    pc_fx_free(&f);
}

/* A reload that waits at a gate, to see what runs meanwhile. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open, entered;
} gated_reload;

static ls_status gated_reload_fn(void *ctx, const char *path, const ls_adapter_params *params, ls_adapter *out,
                                 ls_error *err) {
    gated_reload *g = ctx;
    pthread_mutex_lock(&g->mu);
    g->entered = true;
    pthread_cond_broadcast(&g->cv);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    pc_reload_ctx plain = {0};
    return pc_reload(&plain, path, params, out, err);
}

typedef struct {
    ls_pool *p;
    ls_status st;
} fwd_arg;

static void *forward_a(void *arg) {
    fwd_arg *f = arg;
    const char *na[] = {"a"};
    f->st = pc_fwd(f->p, 0, 1, na, NULL, NULL, NULL, NULL);
    return NULL;
}

/* Reading adapters back from disk happens before the backend is taken:
 * one forward waiting on its files (1,000 of them stalled every other
 * forward for seconds) does not hold up forwards that need none. */
static void test_reload_does_not_stall_others(void **state) {
    (void)state;
    gated_reload g = {.open = false};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    pc_fx f = pc_fx_make(2, 16, 2, gated_reload_fn, &g);
    const char *ids[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        char path[64];
        snprintf(path, sizeof path, "seed:%llu", (unsigned long long)pc_seed_of(ids[i], 1));
        assert_int_equal(pc_load(f.p, ids[i], 1, false, false, path, NULL, NULL), LS_OK);
    }
    assert_string_equal(pc_slots(f.p), "c b"); /* a: neither resident nor in host memory */
    fwd_arg fa = {.p = f.p, .st = LS_INTERNAL};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, forward_a, &fa), 0);
    pthread_mutex_lock(&g.mu);
    while (!g.entered) pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    /* While a's file is being read: base tokens and resident adapters. */
    const char *nc[] = {"c", NULL, "b"};
    pc_fwd_ok(f.p, 3, nc);
    pc_fwd_ok(f.p, 2, NULL);
    pthread_mutex_lock(&g.mu);
    assert_false(g.open); /* they ran with the reload still waiting */
    g.open = true;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    pthread_join(th, NULL);
    assert_int_equal(fa.st, LS_OK);
    pc_fx_free(&f);
    pthread_mutex_destroy(&g.mu);
    pthread_cond_destroy(&g.cv);
}

/* An inline upload cannot be read back, so the host tier never drops it
 * (dropping would unregister an adapter the client was told is stored):
 * the tier goes over its size instead. */
static void test_host_tier_keeps_inline(void **state) {
    (void)state;
    pc_fx f = pc_fx_make(4, 16, 2, NULL, NULL);
    pc_load_ok(f.p, "a", 1, false, false);
    pc_load_ok(f.p, "b", 1, false, false);
    const char *na[] = {"a"};
    pc_fwd_ok(f.p, 1, na);
    pc_load_ok(f.p, "c", 1, false, false); /* over the tier: nothing can be dropped */
    ls_adapter_info info;
    assert_int_equal(ls_pool_describe(f.p, "b", &info, NULL), LS_OK);
    assert_true(info.host_data);
    assert_string_equal(pc_slots(f.p), "a b c -");
    ls_pool_stats st = pc_stats(f.p);
    assert_int_equal(st.registered, 3);
    assert_int_equal(st.host_drops, 0);
    assert_int_equal(st.host_used, 3);
    const char *nb[] = {"b"};
    pc_fwd_ok(f.p, 1, nb);
    pc_fx_free(&f);

    /* Pinned adapters are never dropped: the tier goes over instead. */
    f = pc_fx_make(4, 16, 1, NULL, NULL);
    pc_load_ok(f.p, "P", 1, true, false);
    pc_load_ok(f.p, "a", 1, false, false);
    st = pc_stats(f.p);
    assert_int_equal(st.registered, 2);
    assert_int_equal(st.host_used, 2);
    assert_int_equal(st.host_drops, 0);
    pc_fx_free(&f);
}

/* Nothing can be evicted: every slot is pinned or held by a deleted
 * version whose host copy is gone (it could not be written back). */
static void test_no_slot_now(void **state) {
    (void)state;
    pc_reload_ctx rc = {0};
    pc_fx f = pc_fx_make(3, 16, 1, pc_reload, &rc);
    char pb[64], pc[64];
    snprintf(pb, sizeof pb, "seed:%llu", (unsigned long long)pc_seed_of("b", 1));
    snprintf(pc, sizeof pc, "seed:%llu", (unsigned long long)pc_seed_of("c", 1));
    assert_int_equal(pc_load(f.p, "b", 1, false, false, pb, NULL, NULL), LS_OK);
    assert_int_equal(pc_load(f.p, "c", 1, false, false, pc, NULL, NULL), LS_OK); /* drops b's host copy */
    pc_load_ok(f.p, "P", 1, true, false);                                          /* drops c's */
    assert_false(pc_describe(f.p, "b").host_data);
    assert_false(pc_describe(f.p, "c").host_data);
    ls_pool_hold *hb, *hc;
    assert_int_equal(ls_pool_debug_hold(f.p, "b", &hb, NULL), LS_OK);
    assert_int_equal(ls_pool_debug_hold(f.p, "c", &hc, NULL), LS_OK);
    assert_int_equal(ls_pool_delete(f.p, "b", NULL, NULL), LS_OK);
    assert_int_equal(ls_pool_delete(f.p, "c", NULL, NULL), LS_OK);
    assert_string_equal(pc_slots(f.p), "b c P");

    ls_error err;
    ls_error_init(&err);
    assert_int_equal(pc_load(f.p, "d", 1, true, false, NULL, NULL, &err), LS_POOL_EXHAUSTED);
    ls_adapter_info info;
    assert_int_equal(ls_pool_describe(f.p, "d", &info, NULL), LS_ADAPTER_NOT_FOUND);
    assert_int_equal(pc_load(f.p, "e", 1, false, false, NULL, &info, NULL), LS_OK);
    assert_int_equal(info.slot, -1); /* waits in the host tier */
    const char *ne[] = {"e"};
    ls_error_clear(&err);
    assert_int_equal(pc_fwd(f.p, 0, 1, ne, NULL, NULL, NULL, &err), LS_POOL_EXHAUSTED);
    assert_non_null(strstr(err.message, "'e'"));
    assert_int_equal(pc_describe(f.p, "e").in_flight, 0);
    ls_pool_debug_release(f.p, hb);
    pc_fwd_ok(f.p, 1, ne);
    assert_string_equal(pc_slots(f.p), "e c P");
    ls_pool_debug_release(f.p, hc);
    assert_string_equal(pc_slots(f.p), "e - P");
    assert_int_equal(rc.calls, 0);
    ls_error_free(&err);
    pc_fx_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_groups_match_single_tokens),
        cmocka_unit_test(test_groups_cpu),
        cmocka_unit_test(test_failed_slot_write_rolls_back),
        cmocka_unit_test(test_host_tier_reload),
        cmocka_unit_test(test_forward_keeps_host_tier_cap),
        cmocka_unit_test(test_read_bytes_counts_each_name_once),
        cmocka_unit_test(test_host_tier_keeps_inline),
        cmocka_unit_test(test_reload_does_not_stall_others),
        cmocka_unit_test(test_no_slot_now),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
