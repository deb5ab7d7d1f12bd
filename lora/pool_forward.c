/* ls_pool_forward: a forward over any mix of adapters. The distinct names
 * are resolved (one lookup each) and held in one critical section, tokens
 * keep their index into them, the distinct adapters are served in
 * groups that fit into the slots and into the host tier (read, serve,
 * drop: a group's host copies are read back just before it runs, and its
 * adapters are let go once it has run), and each group's tokens go
 * through the backend in chunks of at most max_tokens rows. */
#include "lora/pool_internal.h"

#include <stdlib.h>
#include <string.h>

enum { LS_FWD_PENDING, LS_FWD_IN_GROUP, LS_FWD_DONE };

/* One forward call's view of its distinct adapters, local to the call. */
typedef struct {
    int T, D;
    const int *tok;      /* [T] distinct index per token (the request's own), -1 = base */
    ls_pool_entry **ent; /* [D] held entries; NULL once let go (DONE) */
    int *state;          /* [D] LS_FWD_* */
    int *slot;           /* [D] the slot each ran in */
    unsigned char *hit;  /* [D] found resident in its group */
    unsigned char *load; /* [D] to be written for its group */
    unsigned char *read; /* [D] its host copy was read back by this call */
} ls_fwd;

static bool ls_fwd_member(const ls_fwd *f, int t, bool with_base) {
    return f->tok[t] < 0 ? with_base : f->state[f->tok[t]] == LS_FWD_IN_GROUP;
}

static ls_status ls_fwd_backend(ls_pool *p, int layer, int c, const float *x, const float *g, const int *slots,
                                float *y, ls_error *err) {
    ls_status st = ls_backend_forward(p->be, layer, c, x, g, slots, y, err);
    if (st != LS_OK && err && err->code == LS_OK)
        ls_error_set(err, st, NULL, "backend forward of %d tokens failed", c);
    return st;
}

/* Under be_mu, without mu: runs the tokens of the current group (and the
 * base-only ones when with_base). When the group is every token, x and y
 * are used in place; else rows are gathered into the pool's scratch and
 * scattered back. */
static ls_status ls_fwd_run(ls_pool *p, const ls_fwd *f, int layer, const float *x, const float *gammas,
                            bool with_base, bool all, float *y, ls_error *err) {
    const size_t H = (size_t)p->dims.H, n = (size_t)p->dims.n;
    const int cap = p->pd.max_tokens;
    ls_status st = LS_OK;
    if (all) {
        for (int off = 0; off < f->T && st == LS_OK; off += cap) {
            int c = f->T - off < cap ? f->T - off : cap;
            for (int i = 0; i < c; i++) p->g_slot[i] = f->tok[off + i] < 0 ? -1 : f->slot[f->tok[off + i]];
            st = ls_fwd_backend(p, layer, c, x + (size_t)off * H, gammas ? gammas + (size_t)off * n : NULL,
                                p->g_slot, y + (size_t)off * H, err);
        }
        return st;
    }
    int c = 0;
    for (int t = 0; t <= f->T && st == LS_OK; t++) {
        if (t < f->T && ls_fwd_member(f, t, with_base)) {
            p->g_rows[c] = t;
            memcpy(p->g_x + (size_t)c * H, x + (size_t)t * H, H * sizeof(float));
            if (gammas) memcpy(p->g_gam + (size_t)c * n, gammas + (size_t)t * n, n * sizeof(float));
            p->g_slot[c] = f->tok[t] < 0 ? -1 : f->slot[f->tok[t]];
            c++;
        }
        if (c > 0 && (c == cap || t == f->T)) {
            st = ls_fwd_backend(p, layer, c, p->g_x, gammas ? p->g_gam : NULL, p->g_slot, p->g_y, err);
            for (int i = 0; st == LS_OK && i < c; i++)
                memcpy(y + (size_t)p->g_rows[i] * H, p->g_y + (size_t)i * H, H * sizeof(float));
            c = 0;
        }
    }
    return st;
}

/* Under be_mu and mu: picks the next group. Pending adapters already
 * resident join first (so none of them is evicted for another), then as
 * many others with a host copy as slots can be had for, in order of
 * first appearance (one without waits for a group whose copies are read
 * back first; only when nothing else can run, as when another forward
 * evicted one read ahead for this group, is one read under the backend
 * lock). Returns the group's size. */
static int ls_fwd_plan(ls_pool *p, ls_fwd *f) {
    uint64_t group = ++p->marks;
    int size = 0;
    for (int d = 0; d < f->D; d++) {
        ls_pool_entry *e = f->ent[d];
        f->hit[d] = f->load[d] = 0;
        if (f->state[d] != LS_FWD_PENDING || e->slot < 0 || p->slots[e->slot].state != LS_SLOT_RESIDENT) continue;
        f->state[d] = LS_FWD_IN_GROUP;
        f->slot[d] = e->slot;
        f->hit[d] = 1;
        e->mark = group;
        size++;
    }
    for (int d = 0; d < f->D; d++) {
        ls_pool_entry *e = f->ent[d];
        if (f->state[d] != LS_FWD_PENDING || ls_policy_in_slot(p, e) || (!e->host_data && size > 0)) continue;
        int s = ls_policy_take_slot(p, e, group);
        if (s < 0) break;
        f->state[d] = LS_FWD_IN_GROUP;
        f->slot[d] = s;
        f->load[d] = 1;
        e->mark = group;
        size++;
    }
    int64_t now = ls_policy_now_ms();
    for (int d = 0; d < f->D; d++) {
        if (f->state[d] != LS_FWD_IN_GROUP) continue;
        ls_pool_entry *e = f->ent[d];
        ls_policy_touch(p, e);
        e->last_used_ms = now;
        if (f->hit[d]) {
            p->hits++;
            e->hits++;
        } else {
            p->misses++;
        }
    }
    return size;
}

/* Under be_mu: writes the slots of the group's adapters that were not
 * resident. On a failure that slot and the ones not yet written are freed
 * (their adapters stay registered, not resident). */
static ls_status ls_fwd_load(ls_pool *p, ls_fwd *f, ls_error *err) {
    ls_status st = LS_OK;
    int failed = -1;
    for (int d = 0; d < f->D && st == LS_OK; d++) {
        if (!f->load[d]) continue;
        st = ls_policy_fill_slot(p, f->ent[d], f->slot[d], err);
        if (st != LS_OK) failed = d;
    }
    pthread_mutex_lock(&p->mu);
    for (int d = 0; d < f->D; d++) {
        if (!f->load[d]) continue;
        ls_pool_slot *sl = &p->slots[f->slot[d]];
        if (failed < 0 || d < failed) {
            sl->state = LS_SLOT_RESIDENT;
            p->loads++;
            f->ent[d]->loads++;
        } else {
            sl->state = LS_SLOT_FREE;
            sl->entry = NULL;
            f->ent[d]->slot = -1;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return st;
}

/* Resolves each distinct name (one lookup each, in order of first use,
 * so an unknown one is the first a token names) and takes one reference
 * per adapter, all under mu. Distinct names are distinct entries. On an
 * unknown name nothing stays held. */
static ls_status ls_fwd_resolve(ls_pool *p, ls_fwd *f, const ls_token_names *names, ls_error *err) {
    const char *unknown = NULL;
    pthread_mutex_lock(&p->mu);
    for (int d = 0; d < names->n && !unknown; d++) {
        f->ent[d] = ls_registry_find(p, names->names[d]);
        if (!f->ent[d]) unknown = names->names[d];
    }
    if (!unknown) {
        f->D = names->n;
        for (int d = 0; d < f->D; d++) f->ent[d]->refs++;
    }
    pthread_mutex_unlock(&p->mu);
    return unknown ? ls_pool_not_found(p, unknown, NULL, err) : LS_OK;
}

int ls_pool_read_budget(const ls_pool *p) {
    int k = p->cfg.host_cache < p->S ? p->cfg.host_cache : p->S;
    return k < 1 ? 1 : k;
}

/* Without a lock (mu taken for the look): reads back the host copies of
 * pending adapters that are neither resident nor in the host tier, in
 * order of first appearance, until the call holds budget copies it read
 * and has not served yet (list has room for budget). The next group
 * takes them; the rest wait for a later one, so the tier never holds
 * more than budget copies for this call beyond its size. */
static ls_status ls_fwd_read_ahead(ls_pool *p, ls_fwd *f, int budget, ls_pool_entry **list, ls_error *err) {
    int held = 0, n = 0;
    pthread_mutex_lock(&p->mu);
    for (int d = 0; d < f->D; d++)
        if (f->state[d] == LS_FWD_PENDING && f->read[d]) held++;
    for (int d = 0; d < f->D && held + n < budget; d++) {
        const ls_pool_entry *e = f->ent[d];
        if (f->state[d] != LS_FWD_PENDING || f->read[d] || e->host_data || e->slot >= 0) continue;
        f->read[d] = 1;
        list[n++] = f->ent[d];
    }
    pthread_mutex_unlock(&p->mu);
    return n ? ls_policy_reload_held(p, list, n, err) : LS_OK;
}

/* Under mu: lets go of the adapters of the group that has run (they
 * are DONE; used, when given, gets their entries, named by the request's
 * own strings), then shrinks the host tier to its size: what this call
 * read back for them may go now. */
static void ls_fwd_release_group(ls_pool *p, ls_fwd *f, const ls_token_names *names, ls_pool_used *used) {
    for (int d = 0; d < f->D; d++) {
        if (f->state[d] != LS_FWD_IN_GROUP) continue;
        f->state[d] = LS_FWD_DONE;
        if (used) used[d] = (ls_pool_used){names->names[d], f->ent[d]->version, f->slot[d]};
        ls_registry_release(p, f->ent[d]);
        f->ent[d] = NULL;
    }
    ls_policy_trim_host(p, NULL);
}

/* One group: planned, its slots written, its tokens run (under be_mu);
 * *size receives how many adapters it served. */
static ls_status ls_fwd_group(ls_pool *p, ls_fwd *f, int layer, const float *x, const float *gammas, bool with_base,
                              float *y, int *size, ls_error *err) {
    ls_status st = LS_OK;
    pthread_mutex_lock(&p->be_mu);
    pthread_mutex_lock(&p->mu);
    *size = ls_fwd_plan(p, f);
    pthread_mutex_unlock(&p->mu);
    int pending = 0;
    for (int d = 0; d < f->D; d++) pending += f->state[d] == LS_FWD_PENDING;
    if (pending > 0 && *size == 0) {
        int d = 0;
        while (f->state[d] != LS_FWD_PENDING) d++;
        st = ls_error_set(err, LS_POOL_EXHAUSTED, NULL,
                          "no slot for adapter '%s' now: every slot is pinned or holds a deleted or replaced "
                          "version still in use",
                          f->ent[d]->name);
    }
    if (st == LS_OK) st = ls_fwd_load(p, f, err);
    /* A group holding every distinct adapter is the first one, which
     * also carries the base-only tokens: every token, in place. */
    if (st == LS_OK) st = ls_fwd_run(p, f, layer, x, gammas, with_base, *size == f->D, y, err);
    pthread_mutex_unlock(&p->be_mu);
    return st;
}

/* See pool.h. x, gammas, names borrowed; y and used written by the call. */
ls_status ls_pool_forward(ls_pool *p, int layer, int T, const float *x, const float *gammas,
                          const ls_token_names *names, float *y, ls_pool_used *used, int *n_used, ls_error *err) {
    if (n_used) *n_used = 0;
    if (layer < 0 || layer >= p->dims.L)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "layer %d is out of range 0..%d", layer, p->dims.L - 1);
    if (T < 0 || (T > 0 && (!x || !y)))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "forward needs T >= 0 tokens and x, y buffers");
    const ls_token_names none = {.T = T};
    if (!names || !names->of_token) names = &none;
    if (names->of_token && names->T != T)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "forward of %d tokens with adapter names for %d", T,
                            names->T);
    if (T == 0) return LS_OK;

    /* Per distinct adapter, not per token; base tokens index -1 (a row
     * of -1 stands in when no token names one). */
    const int budget = ls_pool_read_budget(p), D = names->n > 0 ? names->n : 1;
    ls_fwd f = {.T = T};
    int *base = names->of_token ? NULL : malloc((size_t)T * sizeof *base);
    f.ent = malloc((size_t)D * sizeof *f.ent);
    f.state = calloc((size_t)D, sizeof *f.state);
    f.slot = malloc((size_t)D * sizeof *f.slot);
    f.hit = malloc((size_t)D);
    f.load = malloc((size_t)D);
    f.read = calloc((size_t)D, 1);
    ls_pool_entry **list = malloc((size_t)budget * sizeof *list);
    for (int t = 0; base && t < T; t++) base[t] = -1;
    f.tok = base ? base : names->of_token;
    ls_status st = LS_OK;
    bool base_pending = ls_token_names_any_base(names);
    if ((!names->of_token && !base) || !f.ent || !f.state || !f.slot || !f.hit || !f.load || !f.read || !list)
        st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory for a forward of %d tokens", T);
    else
        st = ls_fwd_resolve(p, &f, names, err);

    int pending = f.D;
    while (st == LS_OK && (pending > 0 || base_pending)) {
        /* Dropped host copies are read back here, before the backend
         * lock, as many as the next group may use. */
        st = ls_fwd_read_ahead(p, &f, budget, list, err);
        int size = 0;
        if (st == LS_OK) st = ls_fwd_group(p, &f, layer, x, gammas, base_pending, y, &size, err);
        base_pending = false;
        pthread_mutex_lock(&p->mu);
        ls_fwd_release_group(p, &f, names, used);
        pthread_mutex_unlock(&p->mu);
        pending -= size;
    }

    pthread_mutex_lock(&p->mu);
    if (st == LS_OK && n_used) *n_used = f.D;
    for (int d = 0; d < f.D; d++)
        if (f.ent[d]) ls_registry_release(p, f.ent[d]);
    ls_policy_trim_host(p, NULL);
    pthread_mutex_unlock(&p->mu);
    free(base);
    free(f.ent);
    free(f.state);
    free(f.slot);
    free(f.hit);
    free(f.load);
    free(f.read);
    free(list);
    return st;
}

/* The most host bytes one adapter of this pool can take: every layer at
 * the pool's rank and outer size, with the gate's delta where it applies. */
static size_t ls_fwd_max_adapter_bytes(const ls_pool *p) {
    const bool gate = p->dims.gate && !p->pd.no_gate_lora;
    const size_t lf = ls_adapter_layer_floats(&p->dims, ls_pool_outer(&p->dims, &p->pd), p->pd.max_rank, gate);
    return (size_t)p->dims.L * (lf * sizeof(float) + sizeof(bool));
}

size_t ls_pool_forward_read_bytes(ls_pool *p, const ls_token_names *names, bool unregistered) {
    if (!names) return 0;
    size_t largest = 0;
    int count = 0;
    pthread_mutex_lock(&p->mu);
    for (int d = 0; d < names->n; d++) {
        const ls_pool_entry *e = ls_registry_find(p, names->names[d]);
        if ((e && (e->host_data || e->slot >= 0)) || (!e && !unregistered)) continue;
        const size_t bytes = e ? e->meta.bytes : ls_fwd_max_adapter_bytes(p);
        if (bytes > largest) largest = bytes;
        count++;
    }
    pthread_mutex_unlock(&p->mu);
    const int budget = ls_pool_read_budget(p);
    return largest * (size_t)(count < budget ? count : budget);
}
