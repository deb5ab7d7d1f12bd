/* lora/registry, white-box through lora/pool_internal.h on a pool over the
 * fake backend: the name table (insert, find, unlink) across enough names
 * to grow it several times, the list of every entry, the pinned and host
 * tier counts, entry lifetimes (release keeps a live entry, the last
 * release of an unlinked one destroys it and frees its slot) and the info
 * snapshot. */
#include "tests/util/pool_fixture.h"

#include "lora/pool_internal.h"

static const ls_dims D = {.n = 2, .H = 6, .F = 3, .L = 2, .w13_layout = LS_W13_INTERLEAVED};

typedef struct {
    pt_fake *fk;
    ls_pool *p;
} rg_fx;

static rg_fx rg_make(int S) {
    rg_fx f;
    f.fk = pt_fake_create(D, S, 4, 16);
    f.p = pt_pool(f.fk->be, 8, NULL, NULL);
    return f;
}

/* The pool first (it destroys every entry left), then the backend. */
static void rg_free(rg_fx *f) {
    ls_pool_free(f->p);
    ls_backend_free(f->fk->be);
}

/* A bare entry, as ls_pool_load builds one: owned by the caller until
 * inserted, then by the pool (ls_registry_destroy frees it). host: give
 * it the host copy of a seeded adapter. */
static ls_pool_entry *rg_entry(const char *name, uint64_t version, bool host) {
    ls_pool_entry *e = calloc(1, sizeof *e);
    assert_non_null(e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->version = version;
    e->slot = -1;
    if (host) {
        pt_adapter(&D, 2, ls_fnv1a64(name) + version, &e->a);
        e->host_data = true;
        e->meta = e->a.meta;
    }
    return e;
}

/* The registry's calls run under mu; so do the tests'. */
static ls_pool_entry *rg_find(ls_pool *p, const char *name) {
    pthread_mutex_lock(&p->mu);
    ls_pool_entry *e = ls_registry_find(p, name);
    pthread_mutex_unlock(&p->mu);
    return e;
}
static void rg_insert(ls_pool *p, ls_pool_entry *e) {
    pthread_mutex_lock(&p->mu);
    ls_registry_insert(p, e);
    pthread_mutex_unlock(&p->mu);
}
static void rg_unlink(ls_pool *p, ls_pool_entry *e) {
    pthread_mutex_lock(&p->mu);
    ls_registry_unlink(p, e);
    pthread_mutex_unlock(&p->mu);
}
static void rg_release(ls_pool *p, ls_pool_entry *e) {
    pthread_mutex_lock(&p->mu);
    ls_registry_release(p, e);
    pthread_mutex_unlock(&p->mu);
}
static void rg_destroy(ls_pool *p, ls_pool_entry *e) {
    pthread_mutex_lock(&p->mu);
    ls_registry_destroy(p, e);
    pthread_mutex_unlock(&p->mu);
}

/* Whether e is on the list of every entry; checks the list's back links
 * on the way and counts it into *count when given. */
static bool rg_listed(const ls_pool *p, const ls_pool_entry *e, size_t *count) {
    bool found = false;
    size_t n = 0;
    const ls_pool_entry *prev = NULL;
    for (const ls_pool_entry *it = p->all; it; it = it->next) {
        assert_ptr_equal(it->prev, prev);
        found |= it == e;
        prev = it;
        n++;
    }
    if (count) *count = n;
    return found;
}

/* Entries in the name table (every chain walked), each in the bucket its
 * name hashes to. */
static size_t rg_table_count(const ls_pool *p) {
    size_t n = 0;
    for (size_t b = 0; b < p->n_buckets; b++)
        for (const ls_pool_entry *e = p->buckets[b]; e; e = e->hnext) {
            assert_int_equal((size_t)ls_fnv1a64(e->name) & (p->n_buckets - 1), b);
            assert_true(e->live);
            n++;
        }
    return n;
}

static void test_table_grows(void **state) {
    (void)state;
    rg_fx f = rg_make(2);
    ls_pool *p = f.p;
    assert_int_equal(p->n_buckets, 64); /* allocated at creation */
    enum { N = 1000 };
    ls_pool_entry *ents[N];
    char name[32];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "adapter-%04d", i);
        ents[i] = rg_entry(name, 1, false);
        rg_insert(p, ents[i]);
        /* load factor at most 1, the table a power of two */
        assert_true((size_t)p->registered <= p->n_buckets);
        assert_int_equal(p->n_buckets & (p->n_buckets - 1), 0);
    }
    assert_int_equal(p->n_buckets, 1024); /* 64 doubled four times */
    assert_int_equal(p->registered, N);
    assert_int_equal(rg_table_count(p), N);
    size_t listed;
    rg_listed(p, NULL, &listed);
    assert_int_equal(listed, N);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "adapter-%04d", i);
        assert_ptr_equal(rg_find(p, name), ents[i]);
    }
    assert_null(rg_find(p, "adapter-1000"));
    assert_null(rg_find(p, "adapter-"));
    assert_null(rg_find(p, ""));

    /* Unlink every odd one: unknown by name, still listed until destroyed. */
    for (int i = 1; i < N; i += 2) rg_unlink(p, ents[i]);
    assert_int_equal(p->registered, N / 2);
    assert_int_equal(rg_table_count(p), N / 2);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "adapter-%04d", i);
        assert_ptr_equal(rg_find(p, name), i % 2 ? NULL : ents[i]);
        assert_int_equal(ents[i]->live, i % 2 == 0);
    }
    rg_listed(p, NULL, &listed);
    assert_int_equal(listed, N);
    /* A second unlink changes nothing. */
    rg_unlink(p, ents[1]);
    assert_int_equal(p->registered, N / 2);
    /* The table does not shrink. */
    assert_int_equal(p->n_buckets, 1024);

    for (int i = 1; i < N; i += 2) rg_destroy(p, ents[i]);
    rg_listed(p, NULL, &listed);
    assert_int_equal(listed, N / 2);
    /* The names are free again: a new version takes each. */
    for (int i = 1; i < N; i += 2) {
        snprintf(name, sizeof name, "adapter-%04d", i);
        ents[i] = rg_entry(name, 2, false);
        rg_insert(p, ents[i]);
    }
    assert_int_equal(p->registered, N);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "adapter-%04d", i);
        ls_pool_entry *e = rg_find(p, name);
        assert_ptr_equal(e, ents[i]);
        assert_int_equal(e->version, i % 2 ? 2 : 1);
    }
    /* ls_pool_list sees every live entry, sorted by name. */
    ls_adapter_info *list;
    size_t n;
    assert_int_equal(ls_pool_list(p, &list, &n, NULL), LS_OK);
    assert_int_equal(n, N);
    for (size_t i = 1; i < n; i++) assert_true(strcmp(list[i - 1].name, list[i].name) < 0);
    free(list);
    rg_free(&f); /* destroys the N entries left */
}

/* Names that collide in a small table still resolve to their own entry,
 * from any position in the chain. */
static void test_chains(void **state) {
    (void)state;
    rg_fx f = rg_make(2);
    ls_pool *p = f.p;
    /* N names that all land in bucket 0 of the first (64-bucket) table */
    enum { N = 40 };
    ls_pool_entry *ents[N];
    char names[N][32];
    int found = 0;
    for (int k = 0; found < N; k++) {
        char name[32];
        snprintf(name, sizeof name, "c%d", k);
        if ((ls_fnv1a64(name) & 63) != 0) continue;
        snprintf(names[found], sizeof names[found], "%s", name);
        found++;
    }
    for (int i = 0; i < N; i++) {
        ents[i] = rg_entry(names[i], 1, false);
        rg_insert(p, ents[i]);
    }
    assert_int_equal(p->n_buckets, 64);
    for (int i = 0; i < N; i++) assert_ptr_equal(rg_find(p, names[i]), ents[i]);
    /* unlink from the head, the middle and the tail of the chain */
    int order[] = {N - 1, N / 2, 0};
    for (int k = 0; k < 3; k++) {
        rg_unlink(p, ents[order[k]]);
        assert_null(rg_find(p, names[order[k]]));
        assert_null(ents[order[k]]->hnext);
    }
    for (int i = 0; i < N; i++)
        if (i != N - 1 && i != N / 2 && i != 0) assert_ptr_equal(rg_find(p, names[i]), ents[i]);
    assert_int_equal(rg_table_count(p), N - 3);
    rg_free(&f); /* unlinked entries too: they are still listed */
}

/* Pins and host bytes follow entries in and out of the registry. */
static void test_counts(void **state) {
    (void)state;
    rg_fx f = rg_make(3);
    ls_pool *p = f.p;
    ls_pool_entry *a = rg_entry("a", 1, true), *b = rg_entry("b", 1, true), *c = rg_entry("c", 1, false);
    a->pinned = true;
    const size_t a_bytes = a->meta.bytes, b_bytes = b->meta.bytes;
    assert_true(a_bytes > 0 && b_bytes > 0);
    rg_insert(p, a);
    rg_insert(p, b);
    rg_insert(p, c);
    assert_int_equal(p->registered, 3);
    assert_int_equal(p->pinned, 1);
    assert_int_equal(p->host_used, 2);
    assert_int_equal(p->host_bytes, a_bytes + b_bytes);

    /* An unlinked version is no longer pinned; its host copy stays until
     * it is destroyed. */
    rg_unlink(p, a);
    assert_false(a->pinned);
    assert_int_equal(p->pinned, 0);
    assert_int_equal(p->registered, 2);
    assert_int_equal(p->host_used, 2);
    rg_destroy(p, a);
    assert_int_equal(p->host_used, 1);
    assert_int_equal(p->host_bytes, b_bytes);

    /* Destroying a live entry unlinks it first. */
    rg_destroy(p, b);
    assert_null(rg_find(p, "b"));
    assert_int_equal(p->registered, 1);
    assert_int_equal(p->host_used, 0);
    assert_int_equal(p->host_bytes, 0);
    size_t listed;
    assert_true(rg_listed(p, c, &listed));
    assert_int_equal(listed, 1);
    rg_free(&f);
}

/* release drops a reference; only the last one of an unlinked entry
 * destroys it, and that frees its slot. */
static void test_lifetimes(void **state) {
    (void)state;
    rg_fx f = rg_make(2);
    ls_pool *p = f.p;
    ls_pool_entry *e = rg_entry("held", 1, true);
    e->source_path = strdup("/adapters/held");
    assert_non_null(e->source_path);
    /* resident in slot 1, two requests holding it */
    e->slot = 1;
    p->slots[1].state = LS_SLOT_RESIDENT;
    p->slots[1].entry = e;
    e->refs = 2;
    rg_insert(p, e);

    rg_release(p, e); /* live: stays whatever the count */
    assert_int_equal(e->refs, 1);
    rg_release(p, e);
    assert_int_equal(e->refs, 0);
    assert_ptr_equal(rg_find(p, "held"), e);
    assert_int_equal(p->slots[1].state, LS_SLOT_RESIDENT);

    e->refs = 1; /* a request takes it again, then it is deleted */
    rg_unlink(p, e);
    assert_null(rg_find(p, "held"));
    assert_true(rg_listed(p, e, NULL));
    assert_int_equal(p->slots[1].state, LS_SLOT_RESIDENT); /* still in use */
    assert_ptr_equal(p->slots[1].entry, e);

    rg_release(p, e); /* the last reference: gone, slot free */
    assert_int_equal(p->slots[1].state, LS_SLOT_FREE);
    assert_null(p->slots[1].entry);
    assert_null(p->all);
    assert_int_equal(p->host_used, 0);
    assert_int_equal(p->host_bytes, 0);

    /* The same through the pool's own entry points. */
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(pt_load(p, &D, "x", 3, 7, false, false, "/adapters/x", NULL, &err), LS_OK);
    ls_pool_hold *h;
    assert_int_equal(ls_pool_debug_hold(p, "x", &h, NULL), LS_OK);
    ls_pool_entry *x = rg_find(p, "x");
    assert_ptr_equal(x, h);
    assert_int_equal(x->refs, 1);
    assert_int_equal(ls_pool_delete(p, "x", NULL, NULL), LS_OK);
    assert_null(rg_find(p, "x"));
    assert_true(rg_listed(p, x, NULL));
    ls_pool_debug_release(p, h);
    assert_null(p->all);
    ls_error_free(&err);
    rg_free(&f);
}

/* The info snapshot copies what a client may see, strings bounded. */
static void test_info(void **state) {
    (void)state;
    rg_fx f = rg_make(2);
    ls_pool *p = f.p;
    char name[129];
    memset(name, 'n', 128);
    name[128] = '\0';
    ls_pool_entry *e = rg_entry(name, 7, true);
    e->pinned = true;
    e->refs = 3;
    e->hits = 11;
    e->last_used_ms = 1234567;
    e->slot = 0;
    p->slots[0].state = LS_SLOT_RESIDENT;
    p->slots[0].entry = e;
    size_t long_len = sizeof((ls_adapter_info *)0)->source_path + 100;
    e->source_path = malloc(long_len + 1);
    assert_non_null(e->source_path);
    memset(e->source_path, 'p', long_len);
    e->source_path[long_len] = '\0';
    rg_insert(p, e);

    ls_adapter_info info;
    memset(&info, 0x5a, sizeof info);
    pthread_mutex_lock(&p->mu);
    ls_registry_info(p, e, &info);
    pthread_mutex_unlock(&p->mu);
    assert_string_equal(info.name, name);
    assert_int_equal(info.version, 7);
    assert_true(info.pinned);
    assert_int_equal(info.slot, 0);
    assert_true(info.host_data);
    assert_int_equal(info.in_flight, 3);
    assert_int_equal(info.hits, 11);
    assert_int_equal(info.last_used_ms, 1234567);
    assert_int_equal(info.meta.rank, 2);
    assert_int_equal(info.meta.bytes, e->meta.bytes);
    assert_string_equal(info.meta.sha256, e->meta.sha256);
    assert_int_equal(strlen(info.source_path), sizeof info.source_path - 1); /* cut, terminated */
    assert_int_equal(info.source_path[0], 'p');

    /* ls_pool_describe is this snapshot under the lock. */
    ls_adapter_info described;
    assert_int_equal(ls_pool_describe(p, name, &described, NULL), LS_OK);
    assert_memory_equal(&described, &info, sizeof info);

    /* An inline upload has no path: "". */
    ls_pool_entry *g = rg_entry("inline", 1, false);
    rg_insert(p, g);
    memset(&info, 0x5a, sizeof info);
    pthread_mutex_lock(&p->mu);
    ls_registry_info(p, g, &info);
    pthread_mutex_unlock(&p->mu);
    assert_string_equal(info.source_path, "");
    assert_int_equal(info.slot, -1);
    assert_false(info.host_data);
    assert_int_equal(info.in_flight, 0);

    e->refs = 0; /* the pool may only be freed with no request running */
    rg_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_grows), cmocka_unit_test(test_chains), cmocka_unit_test(test_counts),
        cmocka_unit_test(test_lifetimes),   cmocka_unit_test(test_info),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
