/* lora/pool: the registry and slot policy case by case on the fake backend
 * (whose output identifies the factors it ran with): load, duplicate,
 * replace, delete (also under a held version or a running forward), pins,
 * LRU order, what a failed lookup leaves. Groups, failures and the host
 * tier are in test_pool_tier.c. */
#include "tests/util/pool_cases.h"

static void test_load_into_free_slot(void **state) {
    (void)state;
    pc_fx f = pc_fx_make(3, 16, 8, NULL, NULL);
    ls_adapter_info info;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(pc_load(f.p, "a", 1, false, false, NULL, &info, &err), LS_OK);
    assert_string_equal(info.name, "a");
    assert_int_equal(info.slot, 0);
    assert_false(info.pinned);
    assert_true(info.host_data);
    assert_int_equal(info.meta.rank, PC_RK);
    assert_int_equal(info.in_flight, 0);
    assert_int_equal(strlen(info.meta.sha256), 64);
    assert_string_equal(pc_slots(f.p), "a - -");
    assert_int_equal(atomic_load(&f.fk->slot_writes), pc_dims.L);

    /* The slot holds exactly the adapter padded to the pool's rank. */
    ls_adapter a;
    pt_adapter(&pc_dims, PC_RK, pc_seed_of("a", 1), &a);
    ls_pool_dims pd = *ls_backend_pool_dims(f.fk->be);
    size_t len[4] = {ls_pool_gu_a_len(&pc_dims, &pd), ls_pool_gu_b_len(&pc_dims, &pd), ls_pool_d_a_len(&pc_dims, &pd),
                     ls_pool_d_b_len(&pc_dims, &pd)};
    float *want[4], *got[4];
    for (int b = 0; b < 4; b++) want[b] = malloc(len[b] * sizeof(float)), got[b] = malloc(len[b] * sizeof(float));
    for (int l = 0; l < pc_dims.L; l++) {
        ls_adapter_expand(&a, l, &pc_dims, &pd, want[0], want[1], want[2], want[3]);
        ls_backend_slot_read(f.fk->be, 0, l, got[0], got[1], got[2], got[3], &err);
        for (int b = 0; b < 4; b++) assert_memory_equal(got[b], want[b], len[b] * sizeof(float));
    }
    for (int b = 0; b < 4; b++) free(want[b]), free(got[b]);
    ls_adapter_free(&a);

    const char *names[] = {"a", NULL, "a"};
    ls_pool_used used[3];
    int n_used = 0;
    assert_int_equal(pc_fwd(f.p, 1, 3, names, used, &n_used, NULL, &err), LS_OK);
    assert_int_equal(n_used, 1);
    assert_string_equal(used[0].name, "a");
    assert_int_equal(used[0].version, 1);
    assert_int_equal(used[0].slot, 0);
    ls_pool_stats st = pc_stats(f.p);
    assert_int_equal(st.loads, 1);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.misses, 0);
    assert_int_equal(st.registered, 1);
    assert_int_equal(st.bytes_total, ls_backend_pool_bytes(f.fk->be));
    assert_int_equal(st.bytes_per_slot, ls_backend_pool_bytes(f.fk->be) / 3);
    assert_true(pc_describe(f.p, "a").last_used_ms > 0);
    assert_int_equal(pc_describe(f.p, "a").hits, 1);

    assert_int_equal(pc_load(f.p, "b", 1, false, false, NULL, &info, &err), LS_OK);
    assert_int_equal(info.slot, 1);
    ls_error_free(&err);
    pc_fx_free(&f);
}

static void test_duplicate_name_409(void **state) {
    (void)state;
    pc_fx f = pc_fx_make(3, 16, 8, NULL, NULL);
    pc_load_ok(f.p, "a", 1, false, false);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(pc_load(f.p, "a", 2, false, false, NULL, NULL, &err), LS_ADAPTER_EXISTS);
    assert_non_null(strstr(err.message, "'a'"));
    assert_non_null(strstr(err.hint, "replace"));
    assert_int_equal(pc_describe(f.p, "a").version, 1);
    assert_int_equal(pc_stats(f.p).loads, 1);
    assert_string_equal(pc_slots(f.p), "a - -");
    ls_error_free(&err);
    pc_fx_free(&f);
}

static void test_replace_bumps_version(void **state) {
    (void)state;
    pc_fx f = pc_fx_make(3, 16, 8, NULL, NULL);
    pc_load_ok(f.p, "a", 1, false, false);
    pc_load_ok(f.p, "b", 1, false, false);
    const char *names[] = {"a", "b"};
    float y1[2 * 6], y2[2 * 6];
    ls_pool_used used[2];
    int n_used;
    assert_int_equal(pc_fwd(f.p, 0, 2, names, used, &n_used, y1, NULL), LS_OK);
    assert_int_equal(used[0].version, 1);

    pc_load_ok(f.p, "a", 2, false, true);
    /* The idle old version gave its slot to the new one. */
    assert_string_equal(pc_slots(f.p), "a b -");
    assert_int_equal(pc_stats(f.p).registered, 2);
    assert_int_equal(pc_fwd(f.p, 0, 2, names, used, &n_used, y2, NULL), LS_OK);
    assert_string_equal(used[0].name, "a");
    assert_int_equal(used[0].version, 2);
    assert_int_equal(used[0].slot, 0);
    assert_memory_not_equal(y1, y2, sizeof(float) * 6);         /* a's token changed */
    assert_memory_equal(y1 + 6, y2 + 6, sizeof(float) * 6);     /* b's did not */
    pc_load_ok(f.p, "a", 3, true, true);
    assert_true(pc_describe(f.p, "a").pinned);
    assert_int_equal(pc_describe(f.p, "a").version, 3);
    pc_fx_free(&f);
}

static void test_delete_unknown_404(void **state) {
    (void)state;
    pc_fx f = pc_fx_make(2, 16, 8, NULL, NULL);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_pool_delete(f.p, "nope", NULL, &err), LS_ADAPTER_NOT_FOUND);
    assert_non_null(strstr(err.message, "nope"));
    pc_load_ok(f.p, "a", 1, false, false);
    assert_int_equal(ls_pool_delete(f.p, "a", NULL, NULL), LS_OK);
    assert_string_equal(pc_slots(f.p), "- -");
    ls_adapter_info info;
    assert_int_equal(ls_pool_describe(f.p, "a", &info, NULL), LS_ADAPTER_NOT_FOUND);
    assert_int_equal(ls_pool_delete(f.p, "a", NULL, NULL), LS_ADAPTER_NOT_FOUND);
    /* The name is free again; its versions continue (never reused). */
    pc_load_ok(f.p, "a", 2, false, false);
    ls_error_free(&err);
    pc_fx_free(&f);
}

static void test_delete_while_held(void **state) {
    (void)state;
    pc_fx f = pc_fx_make(2, 16, 8, NULL, NULL);
    pc_load_ok(f.p, "a", 1, false, false);
    ls_pool_hold *h;
    assert_int_equal(ls_pool_debug_hold(f.p, "a", &h, NULL), LS_OK);
    assert_int_equal(ls_pool_delete(f.p, "a", NULL, NULL), LS_OK);

    ls_adapter_info info;
    assert_int_equal(ls_pool_describe(f.p, "a", &info, NULL), LS_ADAPTER_NOT_FOUND);
    const char *names[] = {"a"};
    assert_int_equal(pc_fwd(f.p, 0, 1, names, NULL, NULL, NULL, NULL), LS_ADAPTER_NOT_FOUND);
    ls_adapter_info *list;
    size_t n;
    assert_int_equal(ls_pool_list(f.p, &list, &n, NULL), LS_OK);
    assert_int_equal(n, 0);
    free(list);

    ls_slot_info *s;
    ls_pool_stats st;
    assert_int_equal(ls_pool_snapshot(f.p, &s, &st, NULL), LS_OK);
    assert_int_equal(s[0].state, LS_SLOT_RESIDENT);
    assert_string_equal(s[0].adapter, "a");
    assert_int_equal(s[0].in_flight, 1);
    assert_false(s[0].live);
    assert_int_equal(st.registered, 0);
    free(s);

    /* The held slot is not reusable: two more adapters share the other. */
    pc_load_ok(f.p, "b", 1, false, false);
    pc_load_ok(f.p, "c", 1, false, false);
    assert_string_equal(pc_slots(f.p), "a c");
    ls_pool_debug_release(f.p, h);
    assert_string_equal(pc_slots(f.p), "- c");
    pc_fx_free(&f);
}

typedef struct {
    ls_pool *p;
    const char *const *names;
    int T;
    ls_status st;
    ls_pool_used used[8];
    int n_used;
} fwd_job;

static void *fwd_thread(void *arg) {
    fwd_job *j = arg;
    j->st = pc_fwd(j->p, 0, j->T, j->names, j->used, &j->n_used, NULL, NULL);
    return NULL;
}

static void test_delete_during_forward(void **state) {
    (void)state;
    pc_fx f = pc_fx_make(2, 16, 8, NULL, NULL);
    pc_load_ok(f.p, "a", 1, false, false);
    pt_fake_gate(f.fk, true);
    const char *names[] = {"a", NULL, "a"};
    fwd_job j = {.p = f.p, .names = names, .T = 3};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fwd_thread, &j), 0);
    pt_fake_wait_blocked(f.fk, 1);

    /* The forward is inside the backend holding a. */
    assert_int_equal(ls_pool_delete(f.p, "a", NULL, NULL), LS_OK);
    const char *again[] = {"a"};
    assert_int_equal(pc_fwd(f.p, 0, 1, again, NULL, NULL, NULL, NULL), LS_ADAPTER_NOT_FOUND);
    ls_slot_info *s;
    assert_int_equal(ls_pool_snapshot(f.p, &s, NULL, NULL), LS_OK);
    assert_int_equal(s[0].state, LS_SLOT_RESIDENT);
    assert_int_equal(s[0].in_flight, 1);
    free(s);

    pt_fake_gate(f.fk, false);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(j.st, LS_OK);
    assert_int_equal(j.n_used, 1);
    assert_int_equal(j.used[0].version, 1);
    assert_string_equal(pc_slots(f.p), "- -");
    pc_fx_free(&f);
}

static void test_replace_while_held(void **state) {
    (void)state;
    pc_fx f = pc_fx_make(3, 16, 8, NULL, NULL);
    pc_load_ok(f.p, "a", 1, false, false);
    ls_pool_hold *h;
    assert_int_equal(ls_pool_debug_hold(f.p, "a", &h, NULL), LS_OK);
    pc_load_ok(f.p, "a", 2, false, true);
    assert_string_equal(pc_slots(f.p), "a a -");
    ls_slot_info *s;
    assert_int_equal(ls_pool_snapshot(f.p, &s, NULL, NULL), LS_OK);
    assert_int_equal(s[0].version, 1);
    assert_int_equal(s[0].in_flight, 1);
    assert_false(s[0].live);
    assert_int_equal(s[1].version, 2);
    assert_int_equal(s[1].in_flight, 0);
    assert_true(s[1].live);
    free(s);

    const char *names[] = {"a"};
    ls_pool_used used[1];
    int n_used;
    assert_int_equal(pc_fwd(f.p, 0, 1, names, used, &n_used, NULL, NULL), LS_OK);
    assert_int_equal(used[0].version, 2);
    assert_int_equal(used[0].slot, 1);
    ls_pool_debug_release(f.p, h);
    assert_string_equal(pc_slots(f.p), "- a -");
    pc_load_ok(f.p, "a", 3, false, true);
    assert_string_equal(pc_slots(f.p), "- a -");
    assert_int_equal(pc_describe(f.p, "a").slot, 1);
    pc_fx_free(&f);
}

static void test_pin_limit(void **state) {
    (void)state;
    pc_fx f = pc_fx_make(3, 16, 8, NULL, NULL);
    pc_load_ok(f.p, "p1", 1, true, false);
    pc_load_ok(f.p, "p2", 1, true, false);
    ls_error err;
    ls_error_init(&err);
    /* pin_limit, not pool_exhausted: no wait helps, only unpinning or deleting one does. */
    assert_int_equal(pc_load(f.p, "p3", 1, true, false, NULL, NULL, &err), LS_PIN_LIMIT);
    assert_non_null(strstr(err.message, "at most S-1 = 2"));
    assert_non_null(strstr(err.message, "'p3'")); /* which upload was refused */
    ls_adapter_info info;
    assert_int_equal(ls_pool_describe(f.p, "p3", &info, NULL), LS_ADAPTER_NOT_FOUND);
    assert_int_equal(pc_stats(f.p).pinned, 2);
    pc_load_ok(f.p, "u", 1, false, false);
    assert_string_equal(pc_slots(f.p), "p1 p2 u");
    /* Replacing a pinned adapter with a pinned one is no extra pin. */
    pc_load_ok(f.p, "p1", 2, true, true);
    assert_int_equal(pc_stats(f.p).pinned, 2);
    assert_int_equal(ls_pool_delete(f.p, "p2", NULL, NULL), LS_OK);
    pc_load_ok(f.p, "p3", 1, true, false);
    assert_int_equal(pc_stats(f.p).pinned, 2);
    ls_error_free(&err);
    pc_fx_free(&f);
}

static void test_pinned_never_evicted_lru_order(void **state) {
    (void)state;
    pc_fx f = pc_fx_make(3, 16, 8, NULL, NULL);
    pc_load_ok(f.p, "P", 1, true, false);
    pc_load_ok(f.p, "a", 1, false, false);
    pc_load_ok(f.p, "b", 1, false, false);
    const char *na[] = {"a"}, *nb[] = {"b"}, *nac[] = {"a", "c"}, *nd[] = {"d"}, *nP[] = {"P"};
    pc_fwd_ok(f.p, 1, na);                 /* b is now the least recently used */
    pc_load_ok(f.p, "c", 1, false, false); /* evicts b */
    assert_string_equal(pc_slots(f.p), "P a c");
    assert_int_equal(pc_describe(f.p, "b").slot, -1);
    pc_fwd_ok(f.p, 1, nb); /* evicts a (used before c was loaded) */
    assert_string_equal(pc_slots(f.p), "P b c");
    pc_fwd_ok(f.p, 2, nac); /* c hits; a evicts b */
    assert_string_equal(pc_slots(f.p), "P a c");
    pc_fwd_ok(f.p, 1, nP);
    pc_load_ok(f.p, "d", 1, false, false); /* evicts a: c was used with it, after it */
    assert_string_equal(pc_slots(f.p), "P d c");
    pc_fwd_ok(f.p, 1, nd);
    for (int i = 0; i < 5; i++) pc_fwd_ok(f.p, 1, i % 2 ? nb : na); /* a evicts c, b evicts d */
    assert_string_equal(pc_slots(f.p), "P b a");
    assert_true(pc_describe(f.p, "P").pinned);
    ls_pool_stats st = pc_stats(f.p);
    assert_int_equal(st.evictions, 6);
    assert_int_equal(st.loads, 5 + 4);
    assert_int_equal(st.misses, 4);
    assert_int_equal(st.hits, 7);
    pc_fx_free(&f);
}

static void test_forward_unknown_changes_nothing(void **state) {
    (void)state;
    pc_fx f = pc_fx_make(2, 16, 8, NULL, NULL);
    pc_load_ok(f.p, "a", 1, false, false);
    pc_load_ok(f.p, "b", 1, false, false);
    pc_load_ok(f.p, "c", 1, false, false); /* a is evicted */
    ls_slot_info *s0, *s1;
    ls_pool_stats st0, st1;
    assert_int_equal(ls_pool_snapshot(f.p, &s0, &st0, NULL), LS_OK);
    int forwards = atomic_load(&f.fk->forwards), writes = atomic_load(&f.fk->slot_writes);

    const char *names[] = {"a", "zzz", "b"};
    ls_pool_used used[3];
    int n_used = 7;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(pc_fwd(f.p, 0, 3, names, used, &n_used, NULL, &err), LS_ADAPTER_NOT_FOUND);
    assert_non_null(strstr(err.message, "'zzz'"));
    assert_int_equal(n_used, 0);
    assert_int_equal(ls_pool_snapshot(f.p, &s1, &st1, NULL), LS_OK);
    assert_memory_equal(s0, s1, 2 * sizeof *s0);
    assert_memory_equal(&st0, &st1, sizeof st0);
    assert_int_equal(atomic_load(&f.fk->forwards), forwards);
    assert_int_equal(atomic_load(&f.fk->slot_writes), writes);
    assert_int_equal(pc_describe(f.p, "a").in_flight, 0);
    /* LRU untouched too: the next load evicts b, not whichever was named. */
    pc_load_ok(f.p, "d", 1, false, false);
    assert_string_equal(pc_slots(f.p), "c d");
    free(s0);
    free(s1);
    ls_error_free(&err);
    pc_fx_free(&f);
}

/* Idle adapters are evicted before held ones, however recently used; among
 * held ones the least recent goes, a superseded version with its host copy
 * included. */
static void test_eviction_prefers_idle(void **state) {
    (void)state;
    pc_fx f = pc_fx_make(2, 16, 8, NULL, NULL);
    pc_load_ok(f.p, "a", 1, false, false);
    pc_load_ok(f.p, "b", 1, false, false);
    ls_pool_hold *ha, *hc, *he, *hc1;
    assert_int_equal(ls_pool_debug_hold(f.p, "a", &ha, NULL), LS_OK);
    pc_load_ok(f.p, "c", 1, false, false); /* b (idle) goes, not a (older, held) */
    assert_string_equal(pc_slots(f.p), "a c");
    assert_int_equal(ls_pool_debug_hold(f.p, "c", &hc, NULL), LS_OK);
    pc_load_ok(f.p, "d", 1, false, false); /* both held: the least recent, a */
    assert_string_equal(pc_slots(f.p), "d c");
    assert_int_equal(pc_describe(f.p, "a").slot, -1);
    ls_pool_debug_release(f.p, ha);
    ls_pool_debug_release(f.p, hc);

    assert_int_equal(ls_pool_debug_hold(f.p, "c", &hc1, NULL), LS_OK);
    pc_load_ok(f.p, "c", 2, false, true); /* c v1 is held: v2 evicts d */
    assert_string_equal(pc_slots(f.p), "c c");
    pc_load_ok(f.p, "e", 1, false, false); /* c v2 is idle: it goes, not held v1 */
    assert_string_equal(pc_slots(f.p), "e c");
    assert_int_equal(ls_pool_debug_hold(f.p, "e", &he, NULL), LS_OK);
    pc_load_ok(f.p, "f", 1, false, false); /* all held: superseded c v1 is the LRU */
    assert_string_equal(pc_slots(f.p), "e f");
    ls_pool_debug_release(f.p, hc1);
    ls_pool_debug_release(f.p, he);
    assert_string_equal(pc_slots(f.p), "e f");
    assert_int_equal(pc_stats(f.p).evictions, 5);
    pc_fx_free(&f);
}

static void test_base_list_and_bad_args(void **state) {
    (void)state;
    pc_fx f = pc_fx_make(2, 3, 8, NULL, NULL);
    pc_fwd_ok(f.p, 7, NULL); /* all base, in three backend calls */
    assert_int_equal(atomic_load(&f.fk->forwards), 3);
    ls_error err;
    ls_error_init(&err);
    float x[6] = {0}, y[6];
    assert_int_equal(pc_pool_forward(f.p, pc_dims.L, 1, x, NULL, NULL, y, NULL, NULL, &err), LS_INVALID_REQUEST);
    int n_used = 5;
    assert_int_equal(pc_pool_forward(f.p, 0, 0, NULL, NULL, NULL, NULL, NULL, &n_used, NULL), LS_OK);
    assert_int_equal(n_used, 0);

    pc_load_ok(f.p, "c", 1, false, false);
    pc_load_ok(f.p, "a", 1, false, false);
    pc_load_ok(f.p, "b", 1, false, false);
    ls_adapter_info *list;
    size_t n;
    assert_int_equal(ls_pool_list(f.p, &list, &n, NULL), LS_OK);
    assert_int_equal(n, 3);
    assert_string_equal(list[0].name, "a");
    assert_string_equal(list[1].name, "b");
    assert_string_equal(list[2].name, "c");
    assert_int_equal(list[2].slot, -1); /* c, loaded first, was evicted by b */
    free(list);
    ls_error_clear(&err);
    ls_adapter a;
    pt_adapter(&pc_dims, PC_RMAX + 1, 1, &a);
    assert_int_equal(ls_pool_load(f.p, "big", &a, NULL, NULL, &err), LS_INTERNAL);
    ls_adapter_free(&a);
    ls_error_free(&err);
    pc_fx_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_into_free_slot),
        cmocka_unit_test(test_duplicate_name_409),
        cmocka_unit_test(test_replace_bumps_version),
        cmocka_unit_test(test_delete_unknown_404),
        cmocka_unit_test(test_delete_while_held),
        cmocka_unit_test(test_delete_during_forward),
        cmocka_unit_test(test_replace_while_held),
        cmocka_unit_test(test_pin_limit),
        cmocka_unit_test(test_pinned_never_evicted_lru_order),
        cmocka_unit_test(test_forward_unknown_changes_nothing),
        cmocka_unit_test(test_eviction_prefers_idle),
        cmocka_unit_test(test_base_list_and_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
