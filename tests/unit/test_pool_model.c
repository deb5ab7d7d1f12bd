/* lora/pool against a reference model: seeded random sequences of loads
 * (pinned, replacing, with and without a source path), deletes and
 * forwards over random subsets of names (unknown ones included) on small
 * pools. After every operation the pool's list, snapshot and counters must
 * equal a plain-array simulation of the policy (registered names,
 * versions, which slot each resident adapter is in, LRU order, pins, the
 * host tier), and every forward's y must equal the reference forward of
 * the versions it reports. */
#include "tests/util/pool_cases.h"
#include "tests/util/pool_fixture.h"

#include <inttypes.h>

#include "common/log.h"

#define NNAMES 8
#define SMAX 4
#define RMAX 4
#define TMAX 8
static const ls_dims D = {.n = 2, .H = 8, .F = 4, .L = 2, .w13_layout = LS_W13_CONTIGUOUS};
static const char *NAMES[NNAMES] = {"n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"};

typedef struct {
    bool live, pinned, host, path;
    uint64_t version, tick, seq, seed;
    int slot, rank;
    ls_adapter ref; /* the factors of the current version */
} m_ent;

typedef struct {
    int S, host_cache;
    m_ent e[NNAMES];
    int owner[SMAX]; /* -1 free */
    uint64_t clock, seq;
    uint64_t loads, evictions, hits, misses, host_drops;
    int reloads;
} model;

static int m_pinned(const model *m) {
    int c = 0;
    for (int i = 0; i < NNAMES; i++) c += m->e[i].live && m->e[i].pinned;
    return c;
}
static int m_host_used(const model *m) {
    int c = 0;
    for (int i = 0; i < NNAMES; i++) c += m->e[i].live && m->e[i].host;
    return c;
}
static bool m_older(const m_ent *a, const m_ent *b) {
    return a->tick != b->tick ? a->tick < b->tick : a->seq < b->seq;
}

/* The slot rule of docs/math.md as the model states it: the lowest free slot,
 * else evict the LRU unpinned resident adapter outside the running group,
 * adapters the request itself holds (in_req) only when no other is left. */
static int m_take_slot(model *m, int idx, const bool *in_group, const bool *in_req) {
    int slot = -1;
    for (int s = 0; s < m->S && slot < 0; s++)
        if (m->owner[s] < 0) slot = s;
    if (slot < 0) {
        int v = -1;
        for (int s = 0; s < m->S; s++) {
            int c = m->owner[s];
            if (m->e[c].pinned || (in_group && in_group[c])) continue;
            bool idle = !(in_req && in_req[c]), vidle = v >= 0 && !(in_req && in_req[v]);
            if (v < 0 || (idle && !vidle) || (idle == vidle && m_older(&m->e[c], &m->e[v]))) v = c;
        }
        if (v < 0) return -1;
        slot = m->e[v].slot;
        m->e[v].slot = -1;
        m->evictions++;
    }
    m->owner[slot] = idx;
    m->e[idx].slot = slot;
    return slot;
}

static void m_unregister(model *m, int i) {
    if (m->e[i].slot >= 0) m->owner[m->e[i].slot] = -1;
    m->e[i].slot = -1;
    m->e[i].live = false;
    ls_adapter_free(&m->e[i].ref);
}

static void m_trim(model *m, int keep, const bool *in_req) {
    while (m_host_used(m) > m->host_cache) {
        int v = -1;
        for (int i = 0; i < NNAMES; i++) {
            const m_ent *e = &m->e[i];
            /* Only what can be read back loses its copy: never an inline one. */
            if (i == keep || !e->live || e->pinned || !e->host || !e->path || (in_req && in_req[i])) continue;
            if (v < 0 || m_older(e, &m->e[v])) v = i;
        }
        if (v < 0) return;
        m->host_drops++;
        m->e[v].host = false;
    }
}

static ls_status m_load(model *m, int i, int rank, uint64_t seed, bool pinned, bool replace, bool path) {
    m_ent *old = &m->e[i];
    if (old->live && !replace) return LS_ADAPTER_EXISTS;
    if (pinned && m_pinned(m) - (old->live && old->pinned) >= m->S - 1) return LS_PIN_LIMIT;
    /* A deleted name keeps its last version: versions are never reused. */
    uint64_t version = old->version + 1;
    int slot;
    if (old->live && old->slot >= 0) {
        slot = old->slot; /* the idle old version's slot */
    } else {
        if (old->live) assert_int_equal(old->slot, -1);
        slot = m_take_slot(m, i, NULL, NULL);
        if (slot < 0 && pinned) return LS_POOL_EXHAUSTED;
    }
    if (slot >= 0) m->loads++;
    ls_adapter_free(&old->ref);
    m_ent n = {.live = true, .pinned = pinned, .host = true, .path = path, .version = version,
               .tick = ++m->clock, .seq = ++m->seq, .seed = seed, .slot = slot, .rank = rank};
    pt_adapter(&D, rank, seed, &n.ref);
    *old = n;
    if (slot >= 0) m->owner[slot] = i;
    m_trim(m, i, NULL);
    return LS_OK;
}

static ls_status m_delete(model *m, int i) {
    if (!m->e[i].live) return LS_ADAPTER_NOT_FOUND;
    m_unregister(m, i);
    return LS_OK;
}

/* tok[t]: name index, -1 base, -2 unknown. Fills distinct[] (first
 * appearance order) and slot_of[] per distinct. */
static ls_status m_forward(model *m, int T, const int *tok, int *distinct, int *n_distinct, int *slot_of) {
    bool in_req[NNAMES] = {0};
    int D_ = 0;
    for (int t = 0; t < T; t++) {
        if (tok[t] == -1) continue;
        if (tok[t] == -2 || !m->e[tok[t]].live) {
            m_trim(m, -1, NULL); /* every forward ends with the tier shrunk to its size */
            return LS_ADAPTER_NOT_FOUND;
        }
        if (!in_req[tok[t]]) in_req[tok[t]] = true, distinct[D_++] = tok[t];
    }
    *n_distinct = D_;
    /* Groups, each one's host copies read back first (in order of
     * appearance, before the pool's backend lock), as many as the read
     * budget allows beyond those read and not yet served; the group's
     * adapters are let go once it has run, and the tier shrunk to its
     * size. in_req is what the call still holds. */
    const int budget = m->host_cache < m->S ? (m->host_cache < 1 ? 1 : m->host_cache) : m->S;
    bool done[NNAMES] = {0}, read[NNAMES] = {0};
    int pending = D_;
    ls_status st = LS_OK;
    while (pending > 0) {
        int held = 0;
        for (int d = 0; d < D_; d++) held += !done[distinct[d]] && read[distinct[d]];
        for (int d = 0; d < D_ && held < budget; d++) {
            int i = distinct[d];
            if (done[i] || read[i] || m->e[i].host || m->e[i].slot >= 0) continue;
            read[i] = true;
            held++;
            m->e[i].host = true;
            m->reloads++;
            m_trim(m, i, in_req);
        }
        bool in_group[NNAMES] = {0}, miss[NNAMES] = {0};
        int size = 0;
        for (int d = 0; d < D_; d++) {
            int i = distinct[d];
            if (!done[i] && m->e[i].slot >= 0) in_group[i] = true, size++;
        }
        for (int d = 0; d < D_; d++) {
            int i = distinct[d];
            if (done[i] || m->e[i].slot >= 0 || !m->e[i].host) continue;
            if (m_take_slot(m, i, in_group, in_req) < 0) break;
            in_group[i] = miss[i] = true;
            size++;
        }
        if (size == 0) {
            st = LS_POOL_EXHAUSTED;
            break;
        }
        for (int d = 0; d < D_; d++) {
            int i = distinct[d];
            if (!in_group[i]) continue;
            m->e[i].tick = ++m->clock;
            if (miss[i]) m->misses++;
            else m->hits++;
            slot_of[d] = m->e[i].slot;
        }
        for (int d = 0; d < D_; d++) {
            int i = distinct[d];
            if (miss[i]) m->loads++;
        }
        for (int i = 0; i < NNAMES; i++)
            if (in_group[i]) done[i] = true, in_req[i] = false;
        m_trim(m, -1, in_req);
        pending -= size;
    }
    m_trim(m, -1, NULL); /* everything let go */
    return st;
}

/* Every observable of the pool equals the model. */
static void check(ls_pool *p, const model *m, int reloads, long op) {
    ls_adapter_info *list;
    size_t n;
    assert_int_equal(ls_pool_list(p, &list, &n, NULL), LS_OK);
    size_t k = 0;
    for (int i = 0; i < NNAMES; i++) {
        const m_ent *e = &m->e[i];
        if (!e->live) continue;
        if (k >= n || strcmp(list[k].name, NAMES[i]) != 0)
            fail_msg("op %ld: %s registered in the model only", op, NAMES[i]);
        const ls_adapter_info *a = &list[k++];
        if (a->version != e->version || a->slot != e->slot || a->pinned != e->pinned || a->host_data != e->host ||
            a->in_flight != 0 || a->meta.rank != e->rank)
            fail_msg("op %ld: %s: pool v%" PRIu64 " slot %d pinned %d host %d in_flight %d; model v%" PRIu64
                     " slot %d pinned %d host %d",
                     op, a->name, a->version, a->slot, a->pinned, a->host_data, a->in_flight, e->version, e->slot,
                     e->pinned, e->host);
        assert_string_equal(a->meta.sha256, e->ref.meta.sha256);
    }
    assert_int_equal(k, n);
    free(list);

    ls_slot_info *s;
    ls_pool_stats st;
    assert_int_equal(ls_pool_snapshot(p, &s, &st, NULL), LS_OK);
    int used = 0, free_ = 0, pins = 0;
    for (int i = 0; i < m->S; i++) {
        int o = m->owner[i];
        if (s[i].state == LS_SLOT_FREE) free_++;
        if (s[i].state == LS_SLOT_RESIDENT) used++;
        if (o < 0) {
            if (s[i].state != LS_SLOT_FREE) fail_msg("op %ld: slot %d holds %s, model: free", op, i, s[i].adapter);
            continue;
        }
        if (s[i].state != LS_SLOT_RESIDENT || strcmp(s[i].adapter, NAMES[o]) != 0 || s[i].version != m->e[o].version)
            fail_msg("op %ld: slot %d holds '%s' (state %d), model: %s", op, i, s[i].adapter, s[i].state, NAMES[o]);
        pins += s[i].pinned;
        assert_int_equal(s[i].in_flight, 0);
    }
    free(s);
    assert_int_equal(used + free_, m->S);
    assert_int_equal(pins, m_pinned(m)); /* every pinned adapter is resident */
    assert_true(st.pinned <= m->S - 1);
    assert_int_equal(st.pinned, m_pinned(m));
    if (st.loads != m->loads || st.evictions != m->evictions || st.hits != m->hits || st.misses != m->misses ||
        st.host_drops != m->host_drops)
        fail_msg("op %ld: counters loads %" PRIu64 "/%" PRIu64 " evictions %" PRIu64 "/%" PRIu64 " hits %" PRIu64
                 "/%" PRIu64 " misses %" PRIu64 "/%" PRIu64 " drops %" PRIu64 "/%" PRIu64 " (pool/model)",
                 op, st.loads, m->loads, st.evictions, m->evictions, st.hits, m->hits, st.misses, m->misses,
                 st.host_drops, m->host_drops);
    assert_int_equal(st.host_used, m_host_used(m));
    int reg = 0;
    for (int i = 0; i < NNAMES; i++) reg += m->e[i].live;
    assert_int_equal(st.registered, reg);
    assert_int_equal(reloads, m->reloads);
}

typedef struct {
    int calls;
} reload_ctx;

/* Paths are "m:<rank>:<seed>": the file's content follows from its name. */
static ls_status model_reload(void *ctx, const char *path, const ls_adapter_params *params, ls_adapter *out,
                              ls_error *err) {
    (void)params;
    ((reload_ctx *)ctx)->calls++;
    int rank;
    unsigned long long seed;
    if (sscanf(path, "m:%d:%llu", &rank, &seed) != 2) return ls_error_set(err, LS_INTERNAL, NULL, "bad path %s", path);
    pt_adapter(&D, rank, seed, out);
    return LS_OK;
}

typedef struct {
    int S, host_cache, ops;
    uint64_t seed;
    bool cpu; /* the CPU backend and the reference forward; else the fake, bit for bit */
} run_cfg;

static void check_y(const run_cfg *rc, const model *m, const double *w13, const double *w2, int layer, int T,
                    const int *tok, const float *x, const float *g, const float *y, long op) {
    if (!rc->cpu) {
        float want[16];
        for (int t = 0; t < T; t++) {
            const ls_adapter *a = tok[t] >= 0 ? &m->e[tok[t]].ref : NULL;
            pt_expect_token(&D, a, layer, x + t * D.H, g + t * D.n, want);
            if (memcmp(want, y + t * D.H, sizeof(float) * D.H) != 0) fail_msg("op %ld: token %d differs", op, t);
        }
        return;
    }
    ls_ref_lora rl[NNAMES];
    bool made[NNAMES] = {0};
    const ls_ref_lora *per_tok[TMAX];
    double xd[TMAX * 8], gd[TMAX * 2], yr[TMAX * 8];
    for (int t = 0; t < T; t++) {
        per_tok[t] = NULL;
        if (tok[t] >= 0) {
            if (!made[tok[t]]) rl[tok[t]] = pt_ref_lora(&D, &m->e[tok[t]].ref, layer), made[tok[t]] = true;
            per_tok[t] = &rl[tok[t]];
        }
    }
    for (int i = 0; i < T * D.H; i++) xd[i] = x[i];
    for (int i = 0; i < T * D.n; i++) gd[i] = g[i];
    size_t n13 = (size_t)D.n * 2 * D.F * D.H, n2 = (size_t)D.n * D.H * D.F;
    ls_ref_forward(&D, w13 + layer * n13, w2 + layer * n2, T, xd, gd, per_tok, yr);
    for (int t = 0; t < T; t++) {
        double e = ls_ref_rel_err_f(y + t * D.H, yr + t * D.H, D.H);
        if (!(e <= 1e-5)) fail_msg("op %ld: token %d relative error %g", op, t, e);
    }
    for (int i = 0; i < NNAMES; i++)
        if (made[i]) pt_ref_lora_free(&rl[i]);
}

static void run(const run_cfg *rc) {
    double *w13 = NULL, *w2 = NULL;
    ls_backend *be;
    if (rc->cpu) be = pt_cpu_create(D, rc->S, RMAX, 5, rc->seed, &w13, &w2);
    else be = pt_fake_create(D, rc->S, RMAX, 5)->be;
    reload_ctx rctx = {0};
    ls_pool *p = pt_pool(be, rc->host_cache, model_reload, &rctx);
    model m = {.S = rc->S, .host_cache = rc->host_cache};
    for (int s = 0; s < SMAX; s++) m.owner[s] = -1;
    for (int i = 0; i < NNAMES; i++) m.e[i].slot = -1;
    uint64_t rng = rc->seed;
    ls_error err;
    ls_error_init(&err);
    long counts[4] = {0}, forwards_ok = 0;

    for (long op = 0; op < rc->ops; op++) {
        ls_error_clear(&err);
        int kind = pt_rand(&rng, 100);
        if (kind < 40) { /* forward */
            int T = 1 + pt_rand(&rng, TMAX), tok[TMAX], layer = pt_rand(&rng, D.L);
            const char *names[TMAX];
            /* Mostly registered names, so that most forwards run; now and
             * then an unregistered or a never-known one. */
            int live[NNAMES], n_live = 0;
            for (int i = 0; i < NNAMES; i++)
                if (m.e[i].live) live[n_live++] = i;
            bool allow_unknown = pt_rand(&rng, 10) == 0;
            for (int t = 0; t < T; t++) {
                int r = pt_rand(&rng, 100);
                if (r < 15) tok[t] = -1;
                else if (r < 18 && allow_unknown) tok[t] = -2;
                else if (r < 97 && n_live) tok[t] = live[pt_rand(&rng, n_live)];
                else tok[t] = pt_rand(&rng, NNAMES);
                names[t] = tok[t] == -1 ? NULL : tok[t] == -2 ? "zz" : NAMES[tok[t]];
            }
            float x[TMAX * 8], g[TMAX * 2], y[TMAX * 8];
            for (int i = 0; i < T * D.H; i++) x[i] = pt_uniform(&rng, 1.0f);
            for (int i = 0; i < T * D.n; i++) g[i] = 1.0f + pt_uniform(&rng, 0.5f);
            ls_pool_used used[TMAX];
            int n_used = -1, distinct[TMAX], n_distinct = 0, slot_of[TMAX];
            ls_status want = m_forward(&m, T, tok, distinct, &n_distinct, slot_of);
            ls_status got = pc_pool_forward(p, layer, T, x, g, names, y, used, &n_used, &err);
            if (got != want) fail_msg("op %ld forward: got %s (%s), model %s", op, ls_status_code(got), err.message,
                                      ls_status_code(want));
            if (got == LS_OK) {
                forwards_ok++;
                assert_int_equal(n_used, n_distinct);
                for (int d = 0; d < n_distinct; d++) {
                    assert_string_equal(used[d].name, NAMES[distinct[d]]);
                    assert_int_equal(used[d].version, m.e[distinct[d]].version);
                    assert_int_equal(used[d].slot, slot_of[d]);
                }
                check_y(rc, &m, w13, w2, layer, T, tok, x, g, y, op);
            } else {
                assert_int_equal(n_used, 0);
            }
            counts[0]++;
        } else if (kind < 80) { /* load: plain, pinned, replacing */
            int i = pt_rand(&rng, NNAMES), rank = 1 + pt_rand(&rng, RMAX);
            uint64_t seed = pt_mix(&rng);
            bool pinned = pt_rand(&rng, 100) < 12, replace = pt_rand(&rng, 2), path = pt_rand(&rng, 2);
            char pbuf[64];
            snprintf(pbuf, sizeof pbuf, "m:%d:%llu", rank, (unsigned long long)seed);
            ls_status want = m_load(&m, i, rank, seed, pinned, replace, path);
            ls_adapter_info info;
            ls_status got = pt_load(p, &D, NAMES[i], rank, seed, pinned, replace, path ? pbuf : NULL, &info, &err);
            if (got != want) fail_msg("op %ld load %s: got %s (%s), model %s", op, NAMES[i], ls_status_code(got),
                                      err.message, ls_status_code(want));
            if (got == LS_OK) assert_int_equal(info.version, m.e[i].version);
            counts[1]++;
        } else if (kind < 95) { /* delete */
            int i = pt_rand(&rng, NNAMES);
            ls_status want = m_delete(&m, i), got = ls_pool_delete(p, NAMES[i], NULL, &err);
            assert_int_equal(got, want);
            counts[2]++;
        } else { /* describe */
            int i = pt_rand(&rng, NNAMES);
            ls_adapter_info info;
            ls_status got = ls_pool_describe(p, NAMES[i], &info, &err);
            assert_int_equal(got, m.e[i].live ? LS_OK : LS_ADAPTER_NOT_FOUND);
            if (got == LS_OK) assert_int_equal(info.version, m.e[i].version);
            counts[3]++;
        }
        check(p, &m, rctx.calls, op);
    }
    print_message("S=%d host_cache=%d %s: %ld forwards (%ld ok), %ld loads, %ld deletes, %ld describes; "
                  "evictions %" PRIu64 ", misses %" PRIu64 ", host drops %" PRIu64 ", reloads %d\n",
                  rc->S, rc->host_cache, rc->cpu ? "cpu" : "fake", counts[0], forwards_ok, counts[1], counts[2],
                  counts[3], m.evictions, m.misses, m.host_drops, m.reloads);
    assert_true(forwards_ok > rc->ops / 4);
    assert_true(m.evictions > 0 && m.misses > 0);
    for (int i = 0; i < NNAMES; i++) ls_adapter_free(&m.e[i].ref);
    ls_error_free(&err);
    ls_pool_free(p);
    ls_backend_free(be);
    free(w13);
    free(w2);
}

static void test_model_s3_cpu(void **state) {
    (void)state;
    run_cfg rc = {.S = 3, .host_cache = 5, .ops = 20000, .seed = 1, .cpu = true};
    run(&rc);
}
static void test_model_s4_cpu(void **state) {
    (void)state;
    run_cfg rc = {.S = 4, .host_cache = 4, .ops = 20000, .seed = 2, .cpu = true};
    run(&rc);
}
static void test_model_s3_fake_no_drops(void **state) {
    (void)state;
    run_cfg rc = {.S = 3, .host_cache = 100, .ops = 20000, .seed = 3, .cpu = false};
    run(&rc);
}
static void test_model_s4_fake_small_host(void **state) {
    (void)state;
    run_cfg rc = {.S = 4, .host_cache = 3, .ops = 20000, .seed = 4, .cpu = false};
    run(&rc);
}

int main(void) {
    ls_log_set_level(LS_LOG_ERROR); /* the host tier warns on every drop */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_s3_cpu),
        cmocka_unit_test(test_model_s4_cpu),
        cmocka_unit_test(test_model_s3_fake_no_drops),
        cmocka_unit_test(test_model_s4_fake_small_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
