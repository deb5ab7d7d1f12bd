/* The pool's entry points: create and free, load (register, possibly
 * replacing, and make resident), delete, describe, list and snapshot. The
 * forward lives in pool_forward.c, the policy in pool_policy.c.
 *
 * Design:
 * - Each registered (name, version) is an immutable entry (the normalised
 *   ls_adapter plus metadata) with a reference count. The name table maps a
 *   name to its current entry. A forward resolves its names and counts its
 *   references under the pool mutex in one critical section, so a version
 *   cannot vanish between lookup and use. DELETE unlinks the name at once;
 *   the entry and its slot are freed at the last release. A replace writes
 *   the new version (version + 1) into a slot first and then switches the
 *   name in one critical section; the old entry lives on while references
 *   hold it (in its slot unless evicted like any held adapter, below). No
 *   request sees a mix of versions because a request runs each version it
 *   resolved, and a slot is only rewritten when the entry in it is evicted
 *   or freed, never while a group that uses it runs.
 * - Locks: be_mu serialises every backend call (the CPU backend is not
 *   re-entrant) and every change of slot assignment; mu guards all
 *   bookkeeping; state_mu orders the changes that reach the state
 *   directory (loads and deletes), so the disk sees them in the order the
 *   registry does. Order: state_mu, be_mu, mu; a thread holding mu never
 *   waits for the others, and mu is never held across a backend call or a
 *   file read or write. be_mu is never held across a write to the state
 *   directory either: a load writes its slot, lets be_mu go, then saves
 *   its record under state_mu alone, so forwards run while the disk
 *   syncs (a slow network volume would otherwise stall every one).
 *   Delete, describe, list, snapshot and a forward's lookup and release
 *   take mu only, so they answer at once even while a slot is written.
 * - Residency: a slot is FREE, LOADING (written now, under be_mu) or
 *   RESIDENT. To make an adapter resident the pool takes a free slot, else
 *   evicts the least recently used resident adapter that is neither pinned
 *   nor part of the group about to run; idle adapters go before those held
 *   by waiting requests (which get made resident again, same version, when
 *   they run). A deleted or replaced version that requests still hold is
 *   such a held adapter too, as long as it keeps its host copy: refusing
 *   its slot would answer pool_exhausted under replace churn although the pool could
 *   serve (without a host copy it stays, since its file may have changed).
 *   When nothing qualifies: LS_POOL_EXHAUSTED (the server adds
 *   Retry-After). LRU follows a logical clock stamped at load and at every
 *   forward use, ties broken by registration order; last_used_ms (wall
 *   clock) is for display. A load counts as a use so that a fresh adapter
 *   is not the first one evicted.
 * - Load: a taken name without replace is LS_ADAPTER_EXISTS. A replace
 *   writes the new version into the old one's slot when the old one is
 *   idle (it goes away at the switch), else into a slot taken by the rule
 *   above. A failed slot write clears and frees the slot and undoes the
 *   registration; the caller keeps its adapter (an old version whose slot
 *   was being reused is written back into it from its host copy, so a
 *   pinned one keeps its slot; without one it stays registered, not
 *   resident).
 * - At most S-1 adapters may be pinned, so one slot always remains for
 *   everything else. A pinned adapter must get a slot at load, else the
 *   load fails and nothing changes; it is never evicted. A deleted or
 *   replaced version is no longer pinned.
 * - Host tier: host_cache adapters keep their factors on the host. Past
 *   that, the least recently used live, unpinned, idle adapter that can be
 *   read back (from the state directory, or from its source path) loses
 *   its host copy; it stays registered (serving from its slot if resident,
 *   read back and checked against its sha256 when it must be made resident
 *   again). An adapter that cannot be read back is never dropped: the
 *   client was told it is stored. When nothing can be dropped the tier
 *   goes over: it is a soft cap. The tier is shrunk at every load, at
 *   every copy read back and after each group of a forward and each
 *   forward: a forward reads back at most ls_pool_read_budget copies at a
 *   time and lets its adapters go once their group has run (read, serve,
 *   drop), so one forward naming many adapters does not fill the tier.
 * - State directory (optional): a load is on disk before it is published
 *   and a delete before the name goes; versions continue from the disk
 *   and from deleted names (version floors), so none is ever reused, and
 *   stop at LS_STATE_VERSION_MAX rather than wrap. Where the disk made a
 *   change whose sync then failed, the registry makes it too, so that it
 *   says what a restart will (docs/reliability.md has every step).
 * - Counters: hits (a forward found the adapter resident), misses (it had
 *   to be loaded), loads (slot writes of an adapter, at load or forward),
 *   evictions (a resident adapter displaced), host_drops (host copies
 *   dropped, whether the adapter stayed registered or not). */
#include "lora/pool_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "lora/pool_debug.h"

/* Creates the pool; *out owned by the caller (ls_pool_free). */
ls_status ls_pool_create(ls_backend *be, const ls_pool_config *cfg, ls_pool **out, ls_error *err) {
    *out = NULL;
    if (!be || !cfg || ls_backend_pool_dims(be)->slots < 1 || ls_backend_pool_dims(be)->max_tokens < 1)
        return ls_error_set(err, LS_INTERNAL, NULL, "pool: a backend with slots, layers and max_tokens is required");
    ls_pool *p = calloc(1, sizeof *p);
    if (!p) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory for the pool");
    p->be = be;
    p->dims = *ls_backend_dims(be);
    p->pd = *ls_backend_pool_dims(be);
    p->S = p->pd.slots;
    p->cfg = *cfg;
    pthread_mutex_init(&p->state_mu, NULL);
    pthread_mutex_init(&p->be_mu, NULL);
    pthread_mutex_init(&p->mu, NULL);

    size_t T = (size_t)p->pd.max_tokens, H = (size_t)p->dims.H, n = (size_t)p->dims.n;
    p->slots = calloc((size_t)p->S, sizeof *p->slots);
    p->w_gu_a = malloc(ls_pool_gu_a_len(&p->dims, &p->pd) * sizeof(float));
    p->w_gu_b = malloc(ls_pool_gu_b_len(&p->dims, &p->pd) * sizeof(float));
    p->w_d_a = malloc(ls_pool_d_a_len(&p->dims, &p->pd) * sizeof(float));
    p->w_d_b = malloc(ls_pool_d_b_len(&p->dims, &p->pd) * sizeof(float));
    p->g_x = malloc(T * H * sizeof(float));
    p->g_y = malloc(T * H * sizeof(float));
    p->g_gam = malloc(T * n * sizeof(float));
    p->g_slot = malloc(T * sizeof(int));
    p->g_rows = malloc(T * sizeof(int));
    if (!p->slots || !p->w_gu_a || !p->w_gu_b || !p->w_d_a || !p->w_d_b || !p->g_x || !p->g_y || !p->g_gam ||
        !p->g_slot || !p->g_rows || !ls_registry_init(p)) {
        ls_pool_free(p);
        return ls_error_set(err, LS_INTERNAL, NULL, "out of memory for the pool's scratch buffers");
    }
    /* Nothing larger than a record this pool could hold is read back. */
    if (cfg->state) ls_state_fit(cfg->state, &p->dims, &p->pd);
    *out = p;
    return LS_OK;
}

/* Frees every entry (live or not) and the pool; no request may run. */
void ls_pool_free(ls_pool *p) {
    if (!p) return;
    while (p->all) ls_registry_destroy(p, p->all);
    free(p->buckets);
    free(p->slots);
    free(p->w_gu_a);
    free(p->w_gu_b);
    free(p->w_d_a);
    free(p->w_d_b);
    free(p->g_x);
    free(p->g_y);
    free(p->g_gam);
    free(p->g_slot);
    free(p->g_rows);
    free(p->floors);
    pthread_mutex_destroy(&p->state_mu);
    pthread_mutex_destroy(&p->be_mu);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* The adapter must have been normalised for this pool's shapes; anything
 * else is a caller bug that would make ls_adapter_expand read out of
 * bounds. */
static ls_status ls_pool_check_adapter(const ls_pool *p, const ls_adapter *a, ls_error *err) {
    const ls_dims *d = &p->dims;
    if (a->meta.gate && (!d->gate || p->pd.no_gate_lora))
        return ls_error_set(err, LS_INTERNAL, NULL,
                            "the adapter has factors of the shared-expert gate, which %s", !d->gate ?
                            "this model does not have" : "the CUDA backend does not apply (serve it with --device cpu)");
    size_t want = ls_adapter_layer_floats(d, a->meta.outer, a->meta.rank, a->meta.gate);
    bool outer_ok = a->meta.outer == 1 || (a->meta.outer == d->n && p->pd.layout == LS_LORA_PER_EXPERT);
    if (!a->data || !a->layer_present || a->meta.rank < 1 || a->meta.rank > p->pd.max_rank || !outer_ok ||
        a->layers != d->L || a->layer_floats != want)
        return ls_error_set(err, LS_INTERNAL, NULL,
                            "adapter does not fit the pool (rank %d of max %d, outer %d, %d layers of %d, "
                            "%zu floats per layer of %zu)",
                            a->meta.rank, p->pd.max_rank, a->meta.outer, a->layers, d->L, a->layer_floats, want);
    return LS_OK;
}

/* Copies of layer flags and skipped names into *out (left zeroed on
 * failure); false when out of memory. */
static bool ls_pool_details_copy(const bool *layers, int n_layers, char *const *ignored, size_t n_ignored,
                                 ls_adapter_details *out) {
    bool *l = calloc(n_layers > 0 ? (size_t)n_layers : 1, sizeof *l);
    char **ig = calloc(n_ignored ? n_ignored : 1, sizeof *ig);
    bool ok = l && ig;
    if (ok && layers) memcpy(l, layers, (size_t)n_layers * sizeof *l);
    for (size_t i = 0; ok && i < n_ignored; i++) ok = (ig[i] = strdup(ignored[i])) != NULL;
    if (!ok) {
        for (size_t i = 0; ig && i < n_ignored; i++) free(ig[i]);
        free(ig);
        free(l);
        return false;
    }
    *out = (ls_adapter_details){l, n_layers, ig, n_ignored};
    return true;
}

void ls_adapter_details_free(ls_adapter_details *d) {
    if (!d) return;
    for (size_t i = 0; d->ignored && i < d->n_ignored; i++) free(d->ignored[i]);
    free(d->ignored);
    free(d->layers);
    memset(d, 0, sizeof *d);
}

static void ls_pool_entry_discard(ls_pool_entry *e);

/* An entry for a, not yet published; it borrows a's buffers until the
 * load commits. NULL when out of memory. */
static ls_pool_entry *ls_pool_entry_new(const char *name, const ls_adapter *a, const ls_pool_load_opts *opts) {
    ls_pool_entry *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    snprintf(e->name, sizeof e->name, "%s", name);
    e->a = *a;
    e->host_data = true;
    e->meta = a->meta;
    memcpy(e->warnings, a->warnings, sizeof e->warnings);
    if (!ls_pool_details_copy(a->layer_present, a->layers, a->ignored, a->meta.n_ignored, &e->details)) {
        free(e);
        return NULL;
    }
    e->params = opts->params;
    e->pinned = opts->pinned;
    e->auto_loaded = opts->auto_loaded;
    e->slot = -1;
    if (opts->source_path && !(e->source_path = strdup(opts->source_path))) {
        ls_pool_entry_discard(e);
        return NULL;
    }
    return e;
}

/* Frees an entry that was never published, leaving a's buffers to the
 * caller. */
static void ls_pool_entry_discard(ls_pool_entry *e) {
    ls_adapter_details_free(&e->details);
    free(e->source_path);
    free(e);
}

/* A change the state directory made although the sync after it failed:
 * err (the state directory's) says so first. */
static void ls_pool_unconfirmed(ls_error *err, const char *fmt, const char *name, uint64_t version) {
    char said[sizeof err->message], what[192];
    snprintf(said, sizeof said, "%s", err->message);
    snprintf(what, sizeof what, fmt, name, version);
    const ls_status code = err->code;
    ls_error_clear(err);
    ls_error_set(err, code, "check the disk of --state-dir", "%s, but its durability is not confirmed: %s", what, said);
}

/* What a load decided under the locks, carried through its steps. */
typedef struct {
    ls_pool_entry *e;      /* the new version, unpublished until the switch */
    ls_pool_entry *kept;   /* the old version whose copy a replace keeps */
    ls_pool_entry *reused; /* the idle old version whose slot e took (held) */
    int slot;              /* e's slot, -1 when it got none */
} ls_pool_loading;

/* Under be_mu and mu: checks that the load may happen, gives e its
 * version and claims its slot (LOADING). */
static ls_status ls_pool_load_claim(ls_pool *p, const char *name, const ls_pool_load_opts *opts, ls_pool_loading *l,
                                    ls_error *err) {
    ls_pool_entry *e = l->e, *old = ls_registry_find(p, name);
    const uint64_t last = old ? old->version : ls_pool_floor_of(p, name);
    int pins = p->pinned - (old && old->pinned ? 1 : 0);
    if (opts->keep_pin && opts->replace) e->pinned = old && old->pinned;
    if (old && !opts->replace)
        return ls_error_set(err, LS_ADAPTER_EXISTS, NULL, "adapter '%s' already exists (version %" PRIu64 ")", name,
                            old->version);
    /* Not pool_exhausted: waiting does not help, only the client's own change. */
    if (e->pinned && pins >= p->S - 1)
        return ls_error_set(err, LS_PIN_LIMIT, NULL,
                            "adapter '%s' cannot be pinned: %d adapter%s, and at most S-1 = %d can be", name,
                            pins, pins == 1 ? " is" : "s are", p->S - 1);
    if (opts->restore_version && (opts->restore_version <= last || opts->restore_version > LS_STATE_VERSION_MAX))
        return ls_error_set(err, LS_INTERNAL, NULL,
                            "restoring adapter '%s' version %" PRIu64 " behind version %" PRIu64, name,
                            opts->restore_version, last);
    /* Never past the last: a version that wrapped would repeat one given
     * before. */
    if (!opts->restore_version && last >= LS_STATE_VERSION_MAX)
        return ls_error_set(err, LS_VERSIONS_EXHAUSTED, NULL,
                            "adapter '%s' has had version %" PRIu64 ", the last one a name can have", name, last);
    /* Versions never go back: after a delete they continue from the
     * deleted name's last one. */
    e->version = opts->restore_version ? opts->restore_version : last + 1;
    e->seq = ++p->seq;
    ls_policy_touch(p, e);
    /* An idle old version goes away at the switch: its slot is the
     * natural home of the new one. Until the switch it keeps its slot
     * index (so a pinned one is never seen unpinned from its slot) and
     * one reference, so that a delete meanwhile cannot free it. The slot
     * holds the new version from now on (its entry says so): a forward
     * that grabs the old one meanwhile, which can run while the record
     * is saved, makes it resident in another slot (ls_policy_in_slot). */
    if (old && old->slot >= 0 && old->refs == 0 && p->slots[old->slot].state == LS_SLOT_RESIDENT) {
        l->slot = old->slot;
        p->slots[l->slot].state = LS_SLOT_LOADING;
        p->slots[l->slot].entry = e;
        e->slot = l->slot;
        l->reused = old;
        old->refs++;
    } else {
        l->slot = ls_policy_take_slot(p, e, 0);
    }
    if (l->slot < 0 && e->pinned)
        return ls_error_set(err, LS_POOL_EXHAUSTED, NULL,
                            "no slot for pinned adapter '%s' now: every slot is pinned or holds a deleted or "
                            "replaced version still in use",
                            name);
    return LS_OK;
}

/* Under state_mu, without be_mu: the record is on disk before the
 * version is published (and so before the client hears of it). A
 * failure undoes the load like a failed slot write, unless the record is
 * in place all the same (only the sync after its rename failed): then
 * the disk says the new version, and so must the registry, while the
 * caller hears of the error (*made). */
static ls_status ls_pool_load_save(ls_pool *p, const char *name, const ls_pool_load_opts *opts,
                                   const ls_pool_loading *l, bool *made, ls_error *err) {
    *made = false;
    if (!p->cfg.state || opts->restore_version) return LS_OK;
    const ls_pool_entry *e = l->e;
    ls_state_record rec = {.name = name, .version = e->version, .pinned = e->pinned,
                           .auto_loaded = opts->auto_loaded, .source_path = e->source_path, .params = e->params,
                           .a = &e->a};
    ls_status st = ls_state_save(p->cfg.state, &rec, made, err);
    if (st != LS_OK && *made)
        ls_pool_unconfirmed(err, "adapter '%s' version %" PRIu64 " is registered and in the state directory", name,
                            e->version);
    return st;
}

/* Under state_mu and be_mu: a load that failed gives back what it took.
 * The old version's factors in the slot it lent were (partly)
 * overwritten: written back from its host copy (held, so the tier keeps
 * it; a pinned one always has it), a failed replace leaves it resident as
 * it was, and a pinned one never loses its slot; unless a forward made it
 * resident elsewhere meanwhile, then the slot is freed. Without a host
 * copy, or when the device fails again, it stays registered, not
 * resident. */
static void ls_pool_load_undo(ls_pool *p, const ls_pool_loading *l) {
    ls_pool_entry *reused = l->reused;
    pthread_mutex_lock(&p->mu);
    /* Under be_mu nothing moves it now. */
    const bool elsewhere = reused && reused->slot >= 0 && reused->slot != l->slot;
    pthread_mutex_unlock(&p->mu);
    bool back = false;
    if (reused && !elsewhere && reused->host_data) {
        ls_error ignored;
        ls_error_init(&ignored);
        back = ls_policy_fill_slot(p, reused, l->slot, &ignored) == LS_OK;
        ls_error_free(&ignored);
    }
    pthread_mutex_lock(&p->mu);
    if (l->kept) { /* still the live version: its copy counts in the tier again */
        l->kept->keep_copy = false;
        ls_policy_trim_host(p, NULL);
    }
    if (back) {
        p->slots[l->slot].state = LS_SLOT_RESIDENT;
        p->slots[l->slot].entry = reused;
    } else if (l->slot >= 0) {
        p->slots[l->slot].state = LS_SLOT_FREE;
        p->slots[l->slot].entry = NULL;
    }
    if (reused) {
        if (!back && !elsewhere) reused->slot = -1; /* its factors were overwritten */
        ls_registry_release(p, reused);
    }
    pthread_mutex_unlock(&p->mu);
}

/* Under mu: publishes e in place of the name's old version (whose
 * counters it carries on). */
static void ls_pool_load_switch(ls_pool *p, const char *name, const ls_pool_loading *l, ls_adapter_info *info) {
    ls_pool_entry *e = l->e;
    if (l->slot >= 0) {
        p->slots[l->slot].state = LS_SLOT_RESIDENT;
        p->loads++;
        e->loads++;
    }
    if (l->reused && l->reused->slot == l->slot) l->reused->slot = -1;
    ls_pool_entry *old = ls_registry_find(p, name); /* a delete may have raced the write */
    const uint64_t replaced = old ? old->version : 0;
    if (old) {
        /* The metrics count per name: a replace must not reset them. */
        e->requests += old->requests;
        e->tokens += old->tokens;
        e->loads += old->loads;
        e->evictions += old->evictions;
        ls_registry_unlink(p, old);
        if (old != l->reused && old->refs == 0) ls_registry_destroy(p, old);
    }
    if (l->reused) ls_registry_release(p, l->reused);
    ls_registry_insert(p, e);
    ls_policy_trim_host(p, e);
    if (info) {
        ls_registry_info(p, e, info);
        info->replaced = replaced;
    }
}

/* Registers a under name (docs/math.md, the pool); see pool.h. On success *a is zeroed
 * and its buffers belong to the pool; on failure they stay the caller's.
 * Steps: claim a version and a slot and write the slot (state_mu, be_mu);
 * save the record (state_mu only: forwards run meanwhile, the new
 * version unseen in its LOADING slot); publish it (mu). state_mu keeps
 * the disk in the registry's order. */
ls_status ls_pool_load(ls_pool *p, const char *name, ls_adapter *a, const ls_pool_load_opts *opts,
                       ls_adapter_info *info, ls_error *err) {
    static const ls_pool_load_opts no_opts;
    if (!opts) opts = &no_opts;
    if (info) memset(info, 0, sizeof *info); /* version 0: nothing changed (pool.h) */
    size_t len = name ? strlen(name) : 0;
    if (len < 1 || len > 128)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "adapter names have 1 to 128 characters");
    if (!a) return ls_error_set(err, LS_INTERNAL, NULL, "pool: no adapter given");
    ls_status st = ls_pool_check_adapter(p, a, err);
    if (st != LS_OK) return st;
    ls_pool_loading l = {.e = ls_pool_entry_new(name, a, opts), .slot = -1};
    if (!l.e) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory registering adapter '%s'", name);

    pthread_mutex_lock(&p->state_mu);
    /* A replace takes the record the old version may be read back from. */
    l.kept = opts->replace && !opts->restore_version ? ls_policy_keep_copy(p, name) : NULL;
    pthread_mutex_lock(&p->be_mu);
    pthread_mutex_lock(&p->mu);
    st = ls_pool_load_claim(p, name, opts, &l, err);
    pthread_mutex_unlock(&p->mu);
    if (st == LS_OK && l.slot >= 0) st = ls_policy_fill_slot(p, l.e, l.slot, err);
    pthread_mutex_unlock(&p->be_mu);

    bool made = false;
    if (st == LS_OK) st = ls_pool_load_save(p, name, opts, &l, &made, err);
    if (st != LS_OK && !made) {
        pthread_mutex_lock(&p->be_mu);
        ls_pool_load_undo(p, &l);
        pthread_mutex_unlock(&p->be_mu);
        pthread_mutex_unlock(&p->state_mu);
        ls_pool_entry_discard(l.e);
        return st;
    }
    pthread_mutex_lock(&p->mu);
    ls_pool_load_switch(p, name, &l, info);
    /* Once mu is released another load or a delete may free e: nothing
     * below may read it. */
    const uint64_t version = l.e->version;
    const int slot = l.slot;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->state_mu);
    memset(a, 0, sizeof *a);
    ls_log_debug("pool: registered adapter '%s' version %" PRIu64 " in slot %d", name, version, slot);
    return st;
}

static bool ls_pool_floor_reserve(ls_pool *p);

/* See pool.h. Takes mu. */
uint64_t ls_pool_nearest(ls_pool *p, const char *name, char *out, size_t len) {
    pthread_mutex_lock(&p->mu);
    const uint64_t was = ls_pool_floor_of(p, name);
    if (was && len) out[0] = '\0';
    else ls_registry_nearest(p, name, out, len);
    pthread_mutex_unlock(&p->mu);
    return was;
}

ls_status ls_pool_not_found(ls_pool *p, const char *name, const char *hint, ls_error *err) {
    char near[136] = "";
    uint64_t was = 0;
    if (name) {
        pthread_mutex_lock(&p->mu);
        /* A name registered before (deleted, or a record the start did
         * not restore) is said to be so, not matched to another name:
         * after a second DELETE that would offer a live adapter to delete
         * in its place. */
        was = ls_pool_floor_of(p, name);
        if (!was) ls_registry_nearest(p, name, near, sizeof near);
        pthread_mutex_unlock(&p->mu);
    }
    if (was)
        return ls_error_set(err, LS_ADAPTER_NOT_FOUND, hint,
                            "adapter '%s' is not registered: it was deleted, or not restored at start-up (its last "
                            "version was %" PRIu64 ")",
                            name, was);
    return ls_error_set(err, LS_ADAPTER_NOT_FOUND, hint, "adapter '%s' is not registered%s%s%s", name ? name : "",
                        near[0] ? "; did you mean '" : "", near, near[0] ? "'?" : "");
}

/* Unregisters name; its weights live on while requests hold them. */
ls_status ls_pool_delete(ls_pool *p, const char *name, ls_adapter_info *info, ls_error *err) {
    /* state_mu keeps loads of the name out while the disk is written, so
     * the entry found first is still the live one after. */
    pthread_mutex_lock(&p->state_mu);
    /* Requests that hold the version must be able to finish with it. */
    ls_pool_entry *kept = name ? ls_policy_keep_copy(p, name) : NULL;
    pthread_mutex_lock(&p->mu);
    ls_pool_entry *e = name ? ls_registry_find(p, name) : NULL;
    const uint64_t version = e ? e->version : 0;
    if (e && info) ls_registry_info(p, e, info);
    /* Room for the name's last version first: a delete that could not
     * remember it would let the name's next load reuse its versions. */
    const bool room = !e || ls_pool_floor_reserve(p);
    pthread_mutex_unlock(&p->mu);
    ls_status st =
        e ? LS_OK : ls_pool_not_found(p, name, "nothing was deleted; GET /adapters lists the registered adapters", err);
    if (st == LS_OK && !room) st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory deleting adapter '%s'", name);
    /* As in a load: a delete the disk made, though its sync failed, is
     * made here too. */
    bool made = false;
    if (st == LS_OK && p->cfg.state) st = ls_state_forget(p->cfg.state, name, version, &made, err);
    if (st != LS_OK && made)
        ls_pool_unconfirmed(err, "adapter '%s' version %" PRIu64 " is deleted, also in the state directory", name,
                            version);
    if (st == LS_OK || made) {
        pthread_mutex_lock(&p->mu);
        ls_registry_unlink(p, e);
        if (e->refs == 0) ls_registry_destroy(p, e);
        if (!ls_pool_floor_raise(p, name, version))
            ls_log_warn("pool: out of memory remembering the last version of '%s'", name);
        pthread_mutex_unlock(&p->mu);
    } else if (kept) {
        pthread_mutex_lock(&p->mu);
        kept->keep_copy = false; /* still registered: the tier may drop it again */
        ls_policy_trim_host(p, NULL);
        pthread_mutex_unlock(&p->mu);
    }
    if (st != LS_OK && !made && info) memset(info, 0, sizeof *info); /* nothing changed */
    pthread_mutex_unlock(&p->state_mu);
    return st;
}

/* ls_state_restore's callbacks. */
typedef struct {
    ls_pool *p;
    int restored;
    bool no_memory; /* a tombstone's version could not be remembered */
} ls_pool_restoring;

static void ls_pool_restore_tomb(void *ctx, const char *name, uint64_t version) {
    ls_pool_restoring *r = ctx;
    ls_pool *p = r->p;
    pthread_mutex_lock(&p->mu);
    if (!ls_pool_floor_raise(p, name, version)) r->no_memory = true;
    pthread_mutex_unlock(&p->mu);
}

static ls_status ls_pool_restore_one(void *ctx, const ls_state_record *rec, ls_adapter *a, ls_error *err) {
    ls_pool_restoring *r = ctx;
    ls_pool *p = r->p;
    pthread_mutex_lock(&p->mu);
    uint64_t floor = ls_pool_floor_of(p, rec->name);
    const ls_pool_entry *old = ls_registry_find(p, rec->name);
    const bool behind = old && old->version >= rec->version;
    pthread_mutex_unlock(&p->mu);
    if (floor >= rec->version) {
        /* Deleted (an older server's tombstone, and a crash before it
         * removed the record): finished now, or at the next start if
         * the disk refuses; the name stays deleted either way. */
        ls_error why;
        ls_error_init(&why);
        bool made;
        if (ls_state_forget(p->cfg.state, rec->name, floor, &made, &why) != LS_OK)
            ls_log_warn("state directory: finishing the delete of '%s': %s", rec->name, why.message);
        ls_error_free(&why);
        return LS_OK;
    }
    ls_pool_load_opts o = {.pinned = rec->pinned, .source_path = rec->source_path, .params = rec->params,
                           .restore_version = rec->version, .auto_loaded = rec->auto_loaded};
    ls_error why;
    ls_error_init(&why);
    ls_status st = ls_pool_load(p, rec->name, a, &o, NULL, &why);
    if (o.pinned && (st == LS_PIN_LIMIT || st == LS_POOL_EXHAUSTED)) {
        /* A pin that no longer fits (fewer --slots now) must not lose the
         * adapter: it comes back unpinned. */
        ls_log_warn("state directory: adapter '%s' restored unpinned: %s", rec->name, why.message);
        o.pinned = false;
        ls_error_clear(&why);
        st = ls_pool_load(p, rec->name, a, &o, NULL, &why);
    }
    if (st == LS_OK) {
        r->restored++;
    } else if (!behind && (st == LS_DEVICE_ERROR || (st == LS_INTERNAL && ls_pool_check_adapter(p, a, NULL) == LS_OK))) {
        /* Out of memory or a failed device, nothing the record says:
         * skipping it would drop an acknowledged adapter (and the next
         * load of its name would overwrite its file). The restore fails
         * and the server does not start. */
        ls_error_set(err, st, why.hint[0] ? why.hint : NULL, "state directory: adapter '%s' version %" PRIu64
                     " could not be restored: %s", rec->name, rec->version, why.message);
        ls_error_free(&why);
        return st;
    } else {
        /* Saved for another model or pool shape: kept on disk for a server
         * that fits it, skipped here; its version stays taken. */
        ls_log_error("state directory: adapter '%s' version %" PRIu64 " not restored: %s", rec->name, rec->version,
                     why.message);
        ls_state_note_unrestored(p->cfg.state);
        pthread_mutex_lock(&p->mu);
        ls_pool_floor_raise(p, rec->name, rec->version);
        pthread_mutex_unlock(&p->mu);
    }
    ls_error_free(&why);
    (void)err;
    return LS_OK;
}

ls_status ls_pool_restore(ls_pool *p, int *restored, ls_error *err) {
    ls_pool_restoring r = {.p = p};
    *restored = 0;
    if (!p->cfg.state) return LS_OK;
    pthread_mutex_lock(&p->mu);
    const uint64_t seq0 = p->seq;
    const size_t floors0 = p->n_floors;
    pthread_mutex_unlock(&p->mu);
    ls_status st = ls_state_restore(p->cfg.state, ls_pool_restore_one, ls_pool_restore_tomb, &r, err);
    if (st == LS_OK && r.no_memory)
        st = ls_error_set(err, LS_INTERNAL, NULL, "state directory: out of memory restoring the versions of deleted "
                                                  "adapters");
    if (st != LS_OK) {
        /* All or nothing: what this restore registered goes again (its
         * files stay for the next start), and the versions it learnt of
         * deleted names (a raise of one known before stays: it only moves
         * towards what the disk says). */
        pthread_mutex_lock(&p->mu);
        for (ls_pool_entry *e = p->all, *next; e; e = next) {
            next = e->next;
            if (e->seq > seq0) ls_registry_destroy(p, e);
        }
        p->n_floors = floors0;
        pthread_mutex_unlock(&p->mu);
        return st;
    }
    *restored = r.restored;
    return LS_OK;
}

ls_status ls_pool_describe_details(ls_pool *p, const char *name, ls_adapter_info *info, ls_adapter_details *d,
                                   ls_error *err) {
    memset(d, 0, sizeof *d);
    pthread_mutex_lock(&p->mu);
    ls_pool_entry *e = name ? ls_registry_find(p, name) : NULL;
    const ls_adapter_details *k = e ? &e->details : NULL;
    bool copied = k && ls_pool_details_copy(k->layers, k->n_layers, k->ignored, k->n_ignored, d);
    if (copied) ls_registry_info(p, e, info);
    pthread_mutex_unlock(&p->mu);
    if (!e) return ls_pool_not_found(p, name, NULL, err);
    return copied ? LS_OK : ls_error_set(err, LS_INTERNAL, NULL, "out of memory describing '%s'", name);
}

/* Fills *info (caller's struct) with a snapshot of name. */
ls_status ls_pool_describe(ls_pool *p, const char *name, ls_adapter_info *info, ls_error *err) {
    pthread_mutex_lock(&p->mu);
    ls_pool_entry *e = name ? ls_registry_find(p, name) : NULL;
    if (e && info) ls_registry_info(p, e, info);
    pthread_mutex_unlock(&p->mu);
    return e ? LS_OK : ls_pool_not_found(p, name, NULL, err);
}

static int ls_pool_info_cmp(const void *a, const void *b) {
    return strcmp(((const ls_adapter_info *)a)->name, ((const ls_adapter_info *)b)->name);
}

/* *out: malloc'd array of *n snapshots sorted by name (caller frees; NULL
 * when none). */
ls_status ls_pool_list(ls_pool *p, ls_adapter_info **out, size_t *n, ls_error *err) {
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&p->mu);
    size_t count = (size_t)p->registered;
    ls_adapter_info *v = count ? malloc(count * sizeof *v) : NULL;
    if (count && !v) {
        pthread_mutex_unlock(&p->mu);
        return ls_error_set(err, LS_INTERNAL, NULL, "out of memory listing adapters");
    }
    size_t i = 0;
    for (ls_pool_entry *e = p->all; e && i < count; e = e->next)
        if (e->live) ls_registry_info(p, e, &v[i++]);
    pthread_mutex_unlock(&p->mu);
    if (i) qsort(v, i, sizeof *v, ls_pool_info_cmp);
    *out = v;
    *n = i;
    return LS_OK;
}

/* Takes mu for a moment. The counts go to whatever version is live now, so a
 * request served by a replaced version still counts for its name. */
void ls_pool_count_served(ls_pool *p, const ls_pool_used *used, const uint64_t *tokens, int n) {
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < n; i++) {
        ls_pool_entry *e = ls_registry_find(p, used[i].name);
        if (!e) continue;
        e->requests++;
        e->tokens += tokens[i];
    }
    pthread_mutex_unlock(&p->mu);
}

/* *out: malloc'd array of S slot snapshots (caller frees); stats filled. */
ls_status ls_pool_snapshot(ls_pool *p, ls_slot_info **out, ls_pool_stats *stats, ls_error *err) {
    *out = NULL;
    ls_slot_info *v = calloc((size_t)p->S, sizeof *v);
    if (!v) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory for the pool snapshot");
    size_t per_layer = ls_pool_gu_a_len(&p->dims, &p->pd) + ls_pool_gu_b_len(&p->dims, &p->pd) +
                       ls_pool_d_a_len(&p->dims, &p->pd) + ls_pool_d_b_len(&p->dims, &p->pd);
    size_t total = ls_backend_pool_bytes(p->be) ? ls_backend_pool_bytes(p->be) : per_layer * sizeof(float) * p->dims.L * p->S;

    pthread_mutex_lock(&p->mu);
    for (int s = 0; s < p->S; s++) {
        const ls_pool_slot *sl = &p->slots[s];
        v[s].index = s;
        v[s].state = sl->state;
        const ls_pool_entry *e = sl->entry;
        if (sl->state == LS_SLOT_FREE || !e) continue;
        snprintf(v[s].adapter, sizeof v[s].adapter, "%s", e->name);
        v[s].version = e->version;
        v[s].rank = e->meta.rank;
        v[s].pinned = e->pinned;
        v[s].in_flight = e->refs;
        v[s].live = e->live;
        v[s].last_used_ms = e->last_used_ms;
        v[s].hits = e->hits;
    }
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->slots = p->S;
        stats->max_rank = p->pd.max_rank;
        stats->layers = p->dims.L;
        stats->layout = p->pd.layout;
        stats->bytes_total = total;
        stats->bytes_per_slot = total / (size_t)p->S;
        stats->host_capacity = p->cfg.host_cache;
        stats->host_used = p->host_used;
        stats->host_bytes = p->host_bytes;
        stats->registered = p->registered;
        stats->pinned = p->pinned;
        stats->loads = p->loads;
        stats->evictions = p->evictions;
        stats->hits = p->hits;
        stats->misses = p->misses;
        stats->host_drops = p->host_drops;
    }
    pthread_mutex_unlock(&p->mu);
    *out = v;
    return LS_OK;
}

/* Test hook: a reference exactly as a forward takes one (see pool_debug.h). */
ls_status ls_pool_debug_hold(ls_pool *p, const char *name, ls_pool_hold **out, ls_error *err) {
    pthread_mutex_lock(&p->mu);
    ls_pool_entry *e = name ? ls_registry_find(p, name) : NULL;
    if (e) e->refs++;
    pthread_mutex_unlock(&p->mu);
    *out = e;
    return e ? LS_OK : ls_pool_not_found(p, name, NULL, err);
}

ls_status ls_pool_debug_read_back(ls_pool *p, ls_pool_hold *h, ls_error *err) {
    return ls_policy_reload_held(p, &h, 1, err);
}

void ls_pool_debug_release(ls_pool *p, ls_pool_hold *h) {
    if (!h) return;
    pthread_mutex_lock(&p->mu);
    ls_registry_release(p, h);
    pthread_mutex_unlock(&p->mu);
}

/* ---- versions of deleted names -------------------------------------------- */

uint64_t ls_pool_floor_of(const ls_pool *p, const char *name) {
    for (size_t i = 0; i < p->n_floors; i++)
        if (!strcmp(p->floors[i].name, name)) return p->floors[i].version;
    return 0;
}

/* Under mu: room for one more floor, so that the next raise cannot fail;
 * false when out of memory. */
static bool ls_pool_floor_reserve(ls_pool *p) {
    if (p->n_floors < p->cap_floors) return true;
    size_t cap = p->cap_floors ? p->cap_floors * 2 : 16;
    ls_pool_floor *f = realloc(p->floors, cap * sizeof *f);
    if (!f) return false;
    p->floors = f, p->cap_floors = cap;
    return true;
}

bool ls_pool_floor_raise(ls_pool *p, const char *name, uint64_t version) {
    for (size_t i = 0; i < p->n_floors; i++)
        if (!strcmp(p->floors[i].name, name)) {
            if (version > p->floors[i].version) p->floors[i].version = version;
            return true;
        }
    if (!ls_pool_floor_reserve(p)) return false;
    snprintf(p->floors[p->n_floors].name, sizeof p->floors[p->n_floors].name, "%s", name);
    p->floors[p->n_floors++].version = version;
    return true;
}
