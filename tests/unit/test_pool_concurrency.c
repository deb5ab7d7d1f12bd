/* lora/pool under concurrency: threads forwarding random mixes of adapters
 * while others replace, delete and re-load them (more adapters than slots,
 * a host tier smaller than the registry, so evictions and reloads never
 * stop) and a pinned one comes and goes. Every forward must either fail
 * with 404 (a name deleted meanwhile) or 503 (no slot now), or return, for
 * every token, exactly the result of the version it reports in used[]
 * run alone; with a state directory too, where inline uploads drop their
 * host copies and a version a forward still holds is read back from the
 * record a replace or delete is rewriting. A delete reports the version
 * it removed, one a load acknowledged; a forward held in the window
 * before its reload while the version is deleted or replaced is still
 * served with it; the copy a delete keeps for such requests drops no
 * other adapter's. Built to run clean under TSan and ASan+UBSan. */
#include "common/text.h"
#include "lora/pool_debug.h"
#include "lora/pool_internal.h"
#include "lora/state.h"
#include "tests/util/pool_cases.h"
#include "tests/util/testutil.h"
#include "tests/util/pool_fixture.h"

#include <inttypes.h>
#include <time.h>

#include "common/log.h"

#define TMAX 8
static const ls_dims D = {.n = 2, .H = 8, .F = 4, .L = 2, .w13_layout = LS_W13_INTERLEAVED};
static const char *NAMES[] = {"c0", "c1", "c2", "c3", "c4", "c5", "pin"};
#define NNAMES 7
#define RMAX 4

/* cmocka's asserts may only fail on the main thread: workers report and
 * abort instead. */
#define W_REQUIRE(cond, ...)                                                   \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond);         \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
            abort();                                                           \
        }                                                                      \
    } while (0)

/* The factors of (name, version): rank and seed follow from both, so any
 * thread can rebuild the adapter a result claims to come from. */
static uint64_t seed_of(const char *name, uint64_t version) {
    return ls_fnv1a64(name) ^ (version * 0x9E3779B97F4A7C15ull);
}
static int rank_of(const char *name, uint64_t version) { return 1 + (int)(seed_of(name, version) % RMAX); }
static void adapter_of(const char *name, uint64_t version, ls_adapter *a) {
    pt_adapter(&D, rank_of(name, version), seed_of(name, version), a);
}

/* Paths are "name@version": reloading rebuilds the same factors. */
static ls_status reload_fn(void *ctx, const char *path, const ls_adapter_params *params, ls_adapter *out,
                           ls_error *err) {
    (void)ctx, (void)params;
    char name[32];
    unsigned long long v;
    if (sscanf(path, "%31[^@]@%llu", name, &v) != 2) return ls_error_set(err, LS_INTERNAL, NULL, "bad path");
    adapter_of(name, v, out);
    return LS_OK;
}

/* The expected y of one token run alone. On the fake backend: its formula
 * on the adapter's compact factors. On the CPU backend: one token through
 * a second CPU backend with the same base weights and the adapter written
 * into its only slot. */
typedef struct {
    ls_backend *be; /* NULL: the fake's formula */
    pthread_mutex_t mu;
    char in_slot[64]; /* "name@version" now in slot 0 */
    float *buf[4];
} oracle;

static void oracle_expect(oracle *o, const char *name, uint64_t version, int layer, const float *x, const float *g,
                          float *y) {
    ls_adapter a;
    if (name) adapter_of(name, version, &a);
    if (!o->be) {
        pt_expect_token(&D, name ? &a : NULL, layer, x, g, y);
    } else {
        pthread_mutex_lock(&o->mu);
        char key[64];
        snprintf(key, sizeof key, "%s@%" PRIu64, name ? name : "", version);
        if (name && strcmp(key, o->in_slot) != 0) {
            for (int l = 0; l < D.L; l++) {
                ls_adapter_expand(&a, l, &D, ls_backend_pool_dims(o->be), o->buf[0], o->buf[1], o->buf[2], o->buf[3]);
                ls_slot_factors f = {o->buf[0], o->buf[1], o->buf[2], o->buf[3], NULL};
                W_REQUIRE(ls_backend_slot_write(o->be, 0, l, &f, NULL) == LS_OK, "oracle slot write");
            }
            snprintf(o->in_slot, sizeof o->in_slot, "%s", key);
        }
        int slot = name ? 0 : -1;
        W_REQUIRE(ls_backend_forward(o->be, layer, 1, x, g, &slot, y, NULL) == LS_OK, "oracle forward");
        pthread_mutex_unlock(&o->mu);
    }
    if (name) ls_adapter_free(&a);
}

typedef struct {
    ls_pool *p;
    oracle *o;
    atomic_bool *stop;
    uint64_t rng;
    int first, count; /* mutators: the names they own */
    /* atomic: the test reads them while the workers run */
    atomic_long ok, not_found, exhausted, tokens, replaces, deletes, loads;
} worker;

static void *forward_worker(void *arg) {
    worker *w = arg;
    float x[TMAX * 8], g[TMAX * 2], y[TMAX * 8], want[8];
    const char *names[TMAX];
    ls_pool_used used[TMAX];
    ls_error err;
    ls_error_init(&err);
    while (!atomic_load(&w->stop[0])) {
        int T = 1 + pt_rand(&w->rng, TMAX), layer = pt_rand(&w->rng, D.L);
        for (int t = 0; t < T; t++) {
            int k = pt_rand(&w->rng, NNAMES + 1);
            names[t] = k < NNAMES ? NAMES[k] : NULL;
        }
        for (int i = 0; i < T * D.H; i++) x[i] = pt_uniform(&w->rng, 1.0f);
        for (int i = 0; i < T * D.n; i++) g[i] = 1.0f + pt_uniform(&w->rng, 0.5f);
        int n_used = -1;
        ls_error_clear(&err);
        ls_status st = pc_pool_forward(w->p, layer, T, x, g, names, y, used, &n_used, &err);
        if (st == LS_ADAPTER_NOT_FOUND) {
            w->not_found++;
            continue;
        }
        if (st == LS_POOL_EXHAUSTED) {
            w->exhausted++;
            continue;
        }
        W_REQUIRE(st == LS_OK, "forward: %s: %s", ls_status_code(st), err.message);
        w->ok++;
        int distinct = 0;
        for (int t = 0; t < T; t++) {
            bool first = names[t] != NULL;
            for (int u = 0; first && u < t; u++) first = !(names[u] && !strcmp(names[u], names[t]));
            distinct += first;
        }
        W_REQUIRE(n_used == distinct, "n_used %d, distinct %d", n_used, distinct);
        for (int t = 0; t < T; t++) {
            uint64_t version = 0;
            const char *name = names[t];
            for (int i = 0; name && i < n_used && i < TMAX; i++)
                if (!strcmp(used[i].name, name)) version = used[i].version;
            W_REQUIRE(!names[t] || version, "token %d: %s missing from used[]", t, names[t]);
            oracle_expect(w->o, names[t], version, layer, x + t * D.H, g + t * D.n, want);
            W_REQUIRE(!memcmp(want, y + t * D.H, sizeof(float) * D.H),
                      "token %d of %d: %s version %" PRIu64 " differs from that version alone", t, T,
                      names[t] ? names[t] : "(base)", version);
            w->tokens++;
        }
    }
    ls_error_free(&err);
    return NULL;
}

/* Replaces, deletes and re-loads the names it owns, tracking their
 * versions exactly (nobody else touches them). The last name of the list
 * is loaded pinned. */
static void *mutate_worker(void *arg) {
    worker *w = arg;
    uint64_t version[NNAMES] = {0}; /* the last version (kept after a delete: versions continue) */
    bool registered[NNAMES] = {false};
    ls_error err;
    ls_error_init(&err);
    while (!atomic_load(&w->stop[0])) {
        int k = pt_rand(&w->rng, w->count);
        const char *name = NAMES[w->first + k];
        bool pinned = !strcmp(name, "pin");
        int op = pt_rand(&w->rng, 4);
        ls_error_clear(&err);
        if (registered[k] && op == 0) {
            W_REQUIRE(ls_pool_delete(w->p, name, NULL, &err) == LS_OK, "delete %s: %s", name, err.message);
            registered[k] = false;
            w->deletes++;
        } else {
            uint64_t v = version[k] + 1;
            char path[64];
            snprintf(path, sizeof path, "%s@%" PRIu64, name, v);
            ls_adapter a;
            adapter_of(name, v, &a);
            ls_pool_load_opts o = {.pinned = pinned, .replace = registered[k], .source_path = path};
            ls_adapter_info info;
            ls_status st = ls_pool_load(w->p, name, &a, &o, &info, &err);
            if (st == LS_OK) {
                W_REQUIRE(info.version == v, "%s: version %" PRIu64 ", expected %" PRIu64, name, info.version, v);
                if (registered[k]) w->replaces++;
                else w->loads++;
                version[k] = v;
                registered[k] = true;
            } else {
                W_REQUIRE(pinned && (st == LS_POOL_EXHAUSTED || st == LS_PIN_LIMIT), "load %s v%" PRIu64 ": %s: %s",
                          name, v, ls_status_code(st), err.message);
            }
            ls_adapter_free(&a);
        }
        usleep((useconds_t)pt_rand(&w->rng, 300));
    }
    ls_error_free(&err);
    return NULL;
}

/* Watches the pool's snapshots for broken invariants while all this runs. */
static void *watch_worker(void *arg) {
    worker *w = arg;
    while (!atomic_load(&w->stop[0])) {
        ls_slot_info *s;
        ls_pool_stats st;
        W_REQUIRE(ls_pool_snapshot(w->p, &s, &st, NULL) == LS_OK, "snapshot");
        int pins = 0;
        for (int i = 0; i < st.slots; i++) {
            W_REQUIRE(s[i].in_flight >= 0, "slot %d", i);
            W_REQUIRE(s[i].state == LS_SLOT_FREE || s[i].adapter[0], "slot %d", i);
            pins += s[i].pinned;
        }
        W_REQUIRE(st.pinned <= st.slots - 1, "%d pinned", st.pinned);
        W_REQUIRE(pins <= st.slots - 1, "%d pinned slots", pins);
        free(s);
        ls_adapter_info *list;
        size_t n;
        W_REQUIRE(ls_pool_list(w->p, &list, &n, NULL) == LS_OK, "list");
        for (size_t i = 0; i < n; i++)
            W_REQUIRE(!list[i].pinned || list[i].slot >= 0, "%s pinned, not resident", list[i].name);
        free(list);
        w->ok++;
        usleep(200);
    }
    return NULL;
}

/* Whether the workers have done enough of each kind of work for the
 * checks at the end of stress() to hold. */
static bool stress_enough(const worker *fw, int nfwd, const worker *mw, int nmut, ls_pool *p) {
    long ok = 0, rep = 0, del = 0;
    for (int i = 0; i < nfwd; i++) ok += fw[i].ok;
    for (int i = 0; i < nmut; i++) rep += mw[i].replaces, del += mw[i].deletes;
    ls_slot_info *s;
    ls_pool_stats st;
    if (ls_pool_snapshot(p, &s, &st, NULL) != LS_OK) return false;
    free(s);
    return ok > 20 && rep > 5 && del > 2 && st.evictions > 0;
}

static void stress(bool cpu, int millis) {
    const int S = 3;
    double *w13 = NULL, *w2 = NULL, *r13 = NULL, *r2 = NULL;
    pt_fake *fk = NULL;
    ls_backend *be;
    oracle o = {0};
    pthread_mutex_init(&o.mu, NULL);
    if (cpu) {
        be = pt_cpu_create(D, S, RMAX, 6, 11, &w13, &w2);
        o.be = pt_cpu_create(D, 1, RMAX, 1, 11, &r13, &r2); /* same seed: same base */
        size_t len[4] = {ls_pool_gu_a_len(&D, ls_backend_pool_dims(o.be)), ls_pool_gu_b_len(&D, ls_backend_pool_dims(o.be)),
                         ls_pool_d_a_len(&D, ls_backend_pool_dims(o.be)), ls_pool_d_b_len(&D, ls_backend_pool_dims(o.be))};
        for (int b = 0; b < 4; b++) assert_non_null(o.buf[b] = malloc(len[b] * sizeof(float)));
    } else {
        fk = pt_fake_create(D, S, RMAX, 6);
        fk->delay_us = 20;
        be = fk->be;
    }
    ls_pool *p = pt_pool(be, 4, reload_fn, NULL);
    atomic_bool stop = false;

    enum { NFWD = 4, NMUTW = 2 };
    worker fw[NFWD], mw[NMUTW], watch;
    pthread_t tf[NFWD], tm[NMUTW], tw;
    for (int i = 0; i < NFWD; i++) {
        fw[i] = (worker){.p = p, .o = &o, .stop = &stop, .rng = 1000 + (uint64_t)i};
        assert_int_equal(pthread_create(&tf[i], NULL, forward_worker, &fw[i]), 0);
    }
    /* One mutator owns c0..c2, the other c3..c5 and the pinned one. */
    mw[0] = (worker){.p = p, .o = &o, .stop = &stop, .rng = 77, .first = 0, .count = 3};
    mw[1] = (worker){.p = p, .o = &o, .stop = &stop, .rng = 78, .first = 3, .count = 4};
    for (int i = 0; i < NMUTW; i++) assert_int_equal(pthread_create(&tm[i], NULL, mutate_worker, &mw[i]), 0);
    watch = (worker){.p = p, .stop = &stop};
    assert_int_equal(pthread_create(&tw, NULL, watch_worker, &watch), 0);

    struct timespec ts = {.tv_sec = millis / 1000, .tv_nsec = (long)(millis % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    /* Then on (60 s at most) until there is enough to check: under TSan
     * on a busy machine the mutators got so little of the time that they
     * made 1 replace and no delete. */
    for (int i = 0; i < 6000 && !stress_enough(fw, NFWD, mw, NMUTW, p); i++) usleep(10000);
    atomic_store(&stop, true);
    for (int i = 0; i < NFWD; i++) pthread_join(tf[i], NULL);
    for (int i = 0; i < NMUTW; i++) pthread_join(tm[i], NULL);
    pthread_join(tw, NULL);

    long ok = 0, nf = 0, ex = 0, tok = 0, rep = 0, del = 0, lo = 0;
    for (int i = 0; i < NFWD; i++) ok += fw[i].ok, nf += fw[i].not_found, ex += fw[i].exhausted, tok += fw[i].tokens;
    for (int i = 0; i < NMUTW; i++) rep += mw[i].replaces, del += mw[i].deletes, lo += mw[i].loads;
    ls_slot_info *s;
    ls_pool_stats st;
    assert_int_equal(ls_pool_snapshot(p, &s, &st, NULL), LS_OK);
    for (int i = 0; i < S; i++) assert_int_equal(s[i].in_flight, 0);
    free(s);
    print_message("%s: %ld forwards ok (%ld tokens checked), %ld 404, %ld 503; %ld replaces, %ld deletes, %ld loads; "
                  "evictions %" PRIu64 ", pool loads %" PRIu64 ", host drops %" PRIu64 ", %ld snapshots\n",
                  cpu ? "cpu" : "fake", ok, tok, nf, ex, rep, del, lo, st.evictions, st.loads, st.host_drops,
                  watch.ok);
    assert_true(ok > 20);
    assert_true(rep > 5 && del > 2);
    assert_true(st.evictions > 0);
    if (fk) {
        assert_int_equal(atomic_load(&fk->overlaps), 0);
        assert_int_equal(atomic_load(&fk->bad_slots), 0);
    }
    ls_pool_free(p);
    ls_backend_free(be);
    if (o.be) ls_backend_free(o.be);
    for (int b = 0; b < 4; b++) free(o.buf[b]);
    pthread_mutex_destroy(&o.mu);
    free(w13), free(w2), free(r13), free(r2);
}

static void test_concurrency_fake(void **state) {
    (void)state;
    stress(false, 2500);
}
static void test_concurrency_cpu(void **state) {
    (void)state;
    stress(true, 1500);
}

/* One name under contention: many threads replace-load it while others
 * delete it and forward with it (the load used to read its entry after
 * dropping the locks, while a racing load or delete freed it). Every
 * acknowledged version is new (never one seen before), a delete only
 * ever misses, and a forward returns exactly the version it reports. */
typedef struct {
    ls_pool *p;
    oracle *o;
    int id, iters;
    atomic_int *loading; /* loaders still running: deleters go on until 0 */
    uint64_t versions[64]; /* acknowledged, in order */
    int n_versions;
    bool delete_after_ok; /* a deleter deletes only after a forward that found the name */
    uint64_t deleted[256]; /* versions the deletes said they removed (the first 256) */
    int n_deleted;
    long deletes, missed, forwards;
} rr_worker;

static void *rr_loader(void *arg) {
    rr_worker *w = arg;
    ls_error err;
    ls_error_init(&err);
    for (int i = 0; i < w->iters; i++) {
        /* The factors of the version the pool will give are unknown here,
         * so every version carries the factors of "rr@0": forwards still
         * check the whole path bit for bit. */
        ls_adapter a;
        adapter_of("rr", 0, &a);
        ls_pool_load_opts o = {.replace = true};
        ls_adapter_info info;
        ls_error_clear(&err);
        ls_status st = ls_pool_load(w->p, "rr", &a, &o, &info, &err);
        W_REQUIRE(st == LS_OK, "load rr: %s: %s", ls_status_code(st), err.message);
        W_REQUIRE(!strcmp(info.name, "rr") && info.version >= 1, "info");
        W_REQUIRE(w->n_versions == 0 || info.version > w->versions[w->n_versions - 1], "version went back");
        w->versions[w->n_versions++] = info.version;
        ls_adapter_free(&a);
        usleep((useconds_t)(100 + 37 * ((w->id + i) % 7)));
    }
    atomic_fetch_sub(w->loading, 1);
    ls_error_free(&err);
    return NULL;
}

static void *rr_deleter(void *arg) {
    rr_worker *w = arg;
    ls_error err;
    ls_error_init(&err);
    uint64_t rng = 5 + (uint64_t)w->id;
    while (atomic_load(w->loading) > 0) {
        float x[4 * 8], g[4 * 2], y[4 * 8], want[8];
        for (int k = 0; k < 4 * D.H; k++) x[k] = pt_uniform(&rng, 1.0f);
        for (int k = 0; k < 4 * D.n; k++) g[k] = 1.0f + pt_uniform(&rng, 0.5f);
        const char *names[4] = {"rr", NULL, "rr", NULL};
        ls_pool_used used[4];
        int n_used = 0;
        ls_error_clear(&err);
        ls_status st = pc_pool_forward(w->p, 0, 4, x, g, names, y, used, &n_used, &err);
        W_REQUIRE(st == LS_OK || st == LS_ADAPTER_NOT_FOUND, "forward rr: %s", err.message);
        if (st == LS_OK) {
            W_REQUIRE(n_used == 1 && !strcmp(used[0].name, "rr"), "used");
            for (int t = 0; t < 4; t++) {
                oracle_expect(w->o, names[t] ? "rr" : NULL, 0, 0, x + t * D.H, g + t * D.n, want);
                W_REQUIRE(!memcmp(want, y + t * D.H, sizeof want), "token %d differs", t);
            }
            w->forwards++;
        }
        /* A delete waits for the load saving its record and then takes
         * the name at once: with a state directory it follows only a
         * forward that saw the name, or no forward would. */
        if ((!w->delete_after_ok || st == LS_OK) && pt_rand(&rng, 4) == 0) {
            ls_error_clear(&err);
            ls_adapter_info info;
            st = ls_pool_delete(w->p, "rr", &info, &err);
            W_REQUIRE(st == LS_OK || st == LS_ADAPTER_NOT_FOUND, "delete rr: %s", err.message);
            if (st == LS_OK) {
                W_REQUIRE(!strcmp(info.name, "rr") && info.version >= 1, "delete info");
                if (w->n_deleted < (int)(sizeof w->deleted / sizeof w->deleted[0]))
                    w->deleted[w->n_deleted++] = info.version;
                w->deletes++;
            } else {
                w->missed++;
            }
        }
    }
    ls_error_free(&err);
    return NULL;
}

/* A pool on the fake backend with `slots` slots and a host tier of
 * host_cache, with a state directory of its own when with_state (no
 * reload function: inline uploads, read back from their records). */
typedef struct {
    pt_fake *fk;
    char *dir;
    ls_state *sd;
    ls_pool *p;
} state_pool;

static state_pool state_pool_make(int slots, int host_cache, bool with_state) {
    state_pool sp = {.fk = pt_fake_create(D, slots, RMAX, 6), .dir = with_state ? ls_test_mkdtemp() : NULL};
    ls_error err;
    ls_error_init(&err);
    if (sp.dir && ls_state_open(sp.dir, &sp.sd, &err) != LS_OK) fail_msg("ls_state_open: %s", err.message);
    ls_pool_config cfg = {.host_cache = host_cache, .state = sp.sd};
    if (ls_pool_create(sp.fk->be, &cfg, &sp.p, &err) != LS_OK) fail_msg("ls_pool_create: %s", err.message);
    ls_error_free(&err);
    return sp;
}

static void state_pool_free(state_pool *sp) {
    ls_pool_free(sp->p); /* first: it borrows the backend and the state */
    ls_backend_free(sp->fk->be);
    if (sp->sd) ls_state_close(sp->sd);
    if (sp->dir) ls_test_rmtree(sp->dir);
    free(sp->dir);
}

/* with_state: a state directory and a host tier of one, so most
 * versions keep no host copy and are read back from their records. */
static void one_name_run(bool with_state) {
    enum { NLOAD = 8, NDEL = 2, ITERS = 50 };
    state_pool sp = state_pool_make(3, with_state ? 1 : 2, with_state);
    pt_fake *fk = sp.fk;
    ls_pool *p = sp.p;
    ls_error err;
    ls_error_init(&err);
    oracle o = {0};
    pthread_mutex_init(&o.mu, NULL);
    rr_worker w[NLOAD + NDEL];
    pthread_t t[NLOAD + NDEL];
    atomic_int loading = NLOAD;
    for (int i = 0; i < NLOAD + NDEL; i++) {
        w[i] = (rr_worker){.p = p, .o = &o, .id = i, .iters = ITERS, .loading = &loading,
                           .delete_after_ok = with_state};
        assert_int_equal(pthread_create(&t[i], NULL, i < NLOAD ? rr_loader : rr_deleter, &w[i]), 0);
    }
    for (int i = 0; i < NLOAD + NDEL; i++) pthread_join(t[i], NULL);

    /* No version was handed out twice. */
    uint64_t seen[NLOAD * ITERS], max = 0;
    int n = 0;
    for (int i = 0; i < NLOAD; i++)
        for (int k = 0; k < w[i].n_versions; k++) {
            for (int j = 0; j < n; j++) assert_true(seen[j] != w[i].versions[k]);
            seen[n++] = w[i].versions[k];
            if (w[i].versions[k] > max) max = w[i].versions[k];
        }
    assert_int_equal(n, NLOAD * ITERS);
    assert_true(w[NLOAD].deletes + w[NLOAD + 1].deletes > 0);
    assert_true(w[NLOAD].forwards + w[NLOAD + 1].forwards > 0);
    long deletes = w[NLOAD].deletes + w[NLOAD + 1].deletes, forwards = w[NLOAD].forwards + w[NLOAD + 1].forwards;
    print_message("one name%s: %d loads (last version %" PRIu64 "), %ld deletes, %ld forwards\n",
                  with_state ? ", state directory" : "", n, max, deletes, forwards);
    /* Each delete removed a version some load acknowledged. */
    for (int i = NLOAD; i < NLOAD + NDEL; i++)
        for (int k = 0; k < w[i].n_deleted; k++) {
            bool acked = false;
            for (int j = 0; j < n && !acked; j++) acked = seen[j] == w[i].deleted[k];
            assert_true(acked);
        }
    /* Whatever is registered now is the newest version acknowledged. */
    ls_adapter_info info;
    ls_status st = ls_pool_describe(p, "rr", &info, &err);
    if (st == LS_OK) assert_int_equal(info.version, max);
    else assert_int_equal(st, LS_ADAPTER_NOT_FOUND);
    ls_error_free(&err);
    ls_slot_info *slots;
    ls_pool_stats stats;
    assert_int_equal(ls_pool_snapshot(p, &slots, &stats, NULL), LS_OK);
    for (int i = 0; i < stats.slots; i++) assert_int_equal(slots[i].in_flight, 0);
    free(slots);
    assert_int_equal(atomic_load(&fk->overlaps), 0);
    assert_int_equal(atomic_load(&fk->bad_slots), 0);
    state_pool_free(&sp);
    pthread_mutex_destroy(&o.mu);
}

static void test_concurrency_one_name(void **state) {
    (void)state;
    one_name_run(false);
}

static void test_concurrency_one_name_state(void **state) {
    (void)state;
    one_name_run(true);
}

/* The window between a forward's look at a held version's host_data and
 * its reload: a delete or replace that ends there reads the version's
 * copy back and unlinks it, and the reload, finding it no longer live,
 * refused it (adapter_stale, "no host copy") although the copy was there.
 * The reload hook holds the forward in that window until the change has
 * returned. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int phase; /* 0 armed, 1 the forward waits in the window, 2 let it go */
} reload_window;

static reload_window g_window = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};

/* The first reload of "a" (the forward's) waits; the change's own reload
 * of it (ls_policy_keep_copy) then passes. */
static void hold_first_reload(const char *name) {
    if (strcmp(name, "a")) return;
    pthread_mutex_lock(&g_window.mu);
    if (g_window.phase == 0) {
        g_window.phase = 1;
        pthread_cond_broadcast(&g_window.cv);
        while (g_window.phase != 2) pthread_cond_wait(&g_window.cv, &g_window.mu);
    }
    pthread_mutex_unlock(&g_window.mu);
}

typedef struct {
    ls_pool *p;
    float x[8], g[2], y[8];
    ls_pool_used used[1];
    int n_used;
    ls_status st;
    char why[512];
} window_forward;

static void *window_forward_run(void *arg) {
    window_forward *f = arg;
    const char *names[1] = {"a"};
    ls_error err;
    ls_error_init(&err);
    f->st = pc_pool_forward(f->p, 0, 1, f->x, f->g, names, f->y, f->used, &f->n_used, &err);
    snprintf(f->why, sizeof f->why, "%s", err.message);
    ls_error_free(&err);
    return NULL;
}

static void window_run(bool replace) {
    state_pool sp = state_pool_make(1, 1, true);
    ls_pool *p = sp.p;
    ls_error err;
    ls_error_init(&err);
    /* Inline uploads: b takes the one slot and the one host place, so a
     * has neither and only its record to be read back from. */
    ls_adapter_info info;
    assert_int_equal(pt_load(p, &D, "a", rank_of("a", 1), seed_of("a", 1), false, false, NULL, &info, &err), LS_OK);
    assert_int_equal(pt_load(p, &D, "b", rank_of("b", 1), seed_of("b", 1), false, false, NULL, &info, &err), LS_OK);
    assert_int_equal(ls_pool_describe(p, "a", &info, &err), LS_OK);
    assert_true(info.slot < 0 && !info.host_data);
    window_forward f = {.p = p};
    for (int i = 0; i < 8; i++) f.x[i] = 0.25f * (float)(i - 3);
    f.g[0] = 1.0f, f.g[1] = 0.5f;
    g_window.phase = 0;
    ls_policy_reload_hook = hold_first_reload;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, window_forward_run, &f), 0);
    pthread_mutex_lock(&g_window.mu);
    while (g_window.phase != 1) pthread_cond_wait(&g_window.cv, &g_window.mu);
    pthread_mutex_unlock(&g_window.mu);
    if (replace)
        assert_int_equal(pt_load(p, &D, "a", rank_of("a", 2), seed_of("a", 2), false, true, NULL, &info, &err), LS_OK);
    else
        assert_int_equal(ls_pool_delete(p, "a", &info, &err), LS_OK);
    pthread_mutex_lock(&g_window.mu);
    g_window.phase = 2;
    pthread_cond_broadcast(&g_window.cv);
    pthread_mutex_unlock(&g_window.mu);
    pthread_join(t, NULL);
    ls_policy_reload_hook = NULL;
    if (f.st != LS_OK) fail_msg("forward held across a %s: %s: %s", replace ? "replace" : "delete",
                                ls_status_code(f.st), f.why);
    assert_int_equal(f.n_used, 1);
    assert_int_equal(f.used[0].version, 1);
    oracle o = {0};
    float want[8];
    oracle_expect(&o, "a", 1, 0, f.x, f.g, want);
    assert_memory_equal(want, f.y, sizeof want);
    ls_error_free(&err);
    state_pool_free(&sp);
}

/* The copy a delete reads back for the requests that may still hold the
 * version is not the host tier's to make room for: deleting an idle
 * inline adapter dropped another adapter's copy (tier of one: b held it,
 * a was resident without one). */
static void test_delete_keeps_others_copies(void **state) {
    (void)state;
    state_pool sp = state_pool_make(2, 1, true);
    ls_adapter_info info;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(pt_load(sp.p, &D, "a", 2, 1, false, false, NULL, &info, &err), LS_OK);
    assert_int_equal(pt_load(sp.p, &D, "b", 2, 2, false, false, NULL, &info, &err), LS_OK);
    assert_int_equal(ls_pool_describe(sp.p, "a", &info, &err), LS_OK);
    assert_true(info.slot >= 0 && !info.host_data);
    assert_int_equal(ls_pool_describe(sp.p, "b", &info, &err), LS_OK);
    assert_true(info.host_data);
    ls_pool_stats before, after;
    ls_slot_info *slots;
    assert_int_equal(ls_pool_snapshot(sp.p, &slots, &before, NULL), LS_OK);
    free(slots);
    assert_int_equal(ls_pool_delete(sp.p, "a", &info, &err), LS_OK);
    assert_int_equal(ls_pool_describe(sp.p, "b", &info, &err), LS_OK);
    assert_true(info.host_data);
    assert_int_equal(ls_pool_snapshot(sp.p, &slots, &after, NULL), LS_OK);
    free(slots);
    assert_int_equal(after.host_drops, before.host_drops);
    assert_int_equal(after.host_used, 1);
    ls_error_free(&err);
    state_pool_free(&sp);
}

/* The same for a replace of a version a request holds: the old
 * version's copy, kept for that request, took another adapter's place
 * in the tier (of two: a and b; the new a takes the old one's). */
static void test_replace_of_held_keeps_others_copies(void **state) {
    (void)state;
    state_pool sp = state_pool_make(3, 2, true);
    ls_adapter_info info;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(pt_load(sp.p, &D, "a", 2, 1, false, false, NULL, &info, &err), LS_OK);
    assert_int_equal(pt_load(sp.p, &D, "b", 2, 2, false, false, NULL, &info, &err), LS_OK);
    ls_pool_hold *held;
    assert_int_equal(ls_pool_debug_hold(sp.p, "a", &held, &err), LS_OK);
    assert_int_equal(pt_load(sp.p, &D, "a", 2, 3, false, true, NULL, &info, &err), LS_OK);
    assert_int_equal(ls_pool_describe(sp.p, "b", &info, &err), LS_OK);
    assert_true(info.host_data);
    assert_int_equal(ls_pool_debug_read_back(sp.p, held, &err), LS_OK); /* the holder still has its version */
    ls_pool_debug_release(sp.p, held);
    ls_pool_stats stats;
    ls_slot_info *slots;
    assert_int_equal(ls_pool_snapshot(sp.p, &slots, &stats, NULL), LS_OK);
    free(slots);
    assert_int_equal(stats.host_drops, 0);
    assert_int_equal(stats.host_used, 2); /* the old copy left with its last holder */
    ls_error_free(&err);
    state_pool_free(&sp);
}

static void test_held_version_across_the_reload_window(void **state) {
    (void)state;
    window_run(false);
    window_run(true);
}

int main(void) {
    ls_log_set_level(LS_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrency_fake),
        cmocka_unit_test(test_concurrency_cpu),
        cmocka_unit_test(test_concurrency_one_name),
        cmocka_unit_test(test_concurrency_one_name_state),
        cmocka_unit_test(test_held_version_across_the_reload_window),
        cmocka_unit_test(test_delete_keeps_others_copies),
        cmocka_unit_test(test_replace_of_held_keeps_others_copies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
