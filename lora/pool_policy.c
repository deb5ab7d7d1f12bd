/* The slot and host-tier policy: which slot an adapter gets (a free one,
 * else the least recently used evictable occupant), which host copy is
 * dropped when the host tier is over its size, reading dropped copies
 * back (before the backend lock, so a disk read stalls no other forward),
 * and the slot write itself. */
#include "lora/pool_internal.h"

#include <inttypes.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

int64_t ls_policy_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Marks e as used now on the logical clock that orders LRU (under mu). */
void ls_policy_touch(ls_pool *p, ls_pool_entry *e) { e->tick = ++p->clock; }

/* True when a is less recently used than b (ties: registered earlier). */
static bool ls_policy_older(const ls_pool_entry *a, const ls_pool_entry *b) {
    if (a->tick != b->tick) return a->tick < b->tick;
    return a->seq < b->seq;
}

/* Under mu: whether e's factors are in its slot (resident or being
 * written). A replace's new version takes the old one's slot before the
 * old one goes (lora/pool.c): that slot is no longer the old one's
 * although its index still is. */
bool ls_policy_in_slot(const ls_pool *p, const ls_pool_entry *e) {
    return e->slot >= 0 && p->slots[e->slot].entry == e;
}

/* Under be_mu and mu: claims a slot for e and marks it LOADING, or returns
 * -1 when none can be had now. A free slot (lowest index) first; else the
 * resident adapter to evict: never a pinned one, never one marked with
 * `group` (the group about to run), never a deleted or replaced version
 * that waiting requests hold unless it keeps its host copy (then it can be
 * written back, same weights, when they run; going back to its file could
 * find it changed). Among the rest, idle adapters go before ones that
 * waiting requests hold (those are made resident again, same version, when
 * they run), and within each kind the least recently used goes first. */
int ls_policy_take_slot(ls_pool *p, ls_pool_entry *e, uint64_t group) {
    int slot = -1;
    for (int s = 0; s < p->S && slot < 0; s++)
        if (p->slots[s].state == LS_SLOT_FREE) slot = s;
    if (slot < 0) {
        ls_pool_entry *victim = NULL;
        for (int s = 0; s < p->S; s++) {
            ls_pool_entry *v = p->slots[s].entry;
            if (p->slots[s].state != LS_SLOT_RESIDENT || !v) continue;
            if (v->pinned || (group && v->mark == group) || (!v->live && !v->host_data)) continue;
            if (!victim || (v->refs == 0) > (victim->refs == 0) ||
                ((v->refs == 0) == (victim->refs == 0) && ls_policy_older(v, victim)))
                victim = v;
        }
        if (!victim) return -1;
        slot = victim->slot;
        victim->slot = -1;
        p->evictions++;
        victim->evictions++;
        ls_log_debug("pool: evicting adapter '%s' version %" PRIu64 " from slot %d", victim->name, victim->version,
                     slot);
    }
    p->slots[slot].state = LS_SLOT_LOADING;
    p->slots[slot].entry = e;
    e->slot = slot;
    return slot;
}

/* Under mu: while more live adapters hold host copies than the tier
 * allows, drops the host copy of the least recently used one that is live,
 * unpinned, idle, not keep, and can be read back (it has a source path
 * and the pool a reload function); it stays registered and is read again
 * when it must be made resident. An adapter that cannot be read back
 * keeps its copy: the client was told it is stored, so it is never
 * unregistered behind its back. When nothing qualifies the tier stays
 * over its size: it is a soft cap, because refusing a load or losing an
 * adapter would be worse than using the memory. */
void ls_policy_trim_host(ls_pool *p, const ls_pool_entry *keep) {
    /* Called after every forward: within the tier it looks at nothing. */
    if (p->host_used <= p->cfg.host_cache) return;
    /* Copies kept only for the requests that hold a version no longer
     * live, or one whose record is going (keep_copy), leave with their
     * entries: they are no reason to drop a live adapter's copy. */
    int spare = 0;
    for (const ls_pool_entry *e = p->all; e; e = e->next) spare += e->host_data && (!e->live || e->keep_copy);
    while (p->host_used - spare > p->cfg.host_cache) {
        ls_pool_entry *victim = NULL;
        for (ls_pool_entry *e = p->all; e; e = e->next) {
            if (e == keep || !e->live || e->pinned || e->refs > 0 || !e->host_data || e->keep_copy) continue;
            if (!p->cfg.state && (!e->source_path || !p->cfg.reload)) continue;
            if (!victim || ls_policy_older(e, victim)) victim = e;
        }
        if (!victim) return;
        p->host_drops++;
        ls_log_debug("pool: host tier full, dropping the host copy of '%s' (reloads from %s)", victim->name,
                     victim->source_path);
        ls_adapter_free(&victim->a);
        victim->host_data = false;
        p->host_used--;
        p->host_bytes -= victim->meta.bytes;
    }
}

/* Under no lock: makes *tmp (read back, checked) e's host copy unless
 * another forward did it meanwhile; *tmp is taken or freed. */
static ls_status ls_policy_install(ls_pool *p, ls_pool_entry *e, ls_adapter *tmp) {
    pthread_mutex_lock(&p->mu);
    if (e->host_data) {
        ls_adapter_free(tmp);
    } else {
        e->a = *tmp;
        e->host_data = true;
        p->host_used++;
        p->host_bytes += e->meta.bytes;
        ls_policy_trim_host(p, e); /* which does not count e's copy if it is kept for its holders only */
    }
    pthread_mutex_unlock(&p->mu);
    memset(tmp, 0, sizeof *tmp);
    return LS_OK;
}

void (*ls_policy_reload_hook)(const char *name) = NULL;

/* Without a lock: reads e's factors back from its source path and, when
 * they are still the ones registered, installs them as its host copy
 * (under mu; another forward may have done it meanwhile). e is held, so
 * the host tier does not drop the copy again before the caller uses it;
 * its name, path and parameters never change. */
static ls_status ls_policy_reload(ls_pool *p, ls_pool_entry *e, ls_error *err) {
    ls_adapter tmp;
    memset(&tmp, 0, sizeof tmp);
    if (ls_policy_reload_hook) ls_policy_reload_hook(e->name);
    /* The state directory holds the live version's factors as they were
     * normalised: read them from there when they are the ones wanted.
     * Both read in one critical section: a replace or delete that ends
     * between the caller's look at host_data and here installs the copy
     * (ls_policy_keep_copy) before it unlinks the entry, so a version
     * no longer live may have its copy, and then that is the answer. */
    pthread_mutex_lock(&p->mu);
    const bool live = e->live, installed = e->host_data;
    pthread_mutex_unlock(&p->mu);
    if (installed) return LS_OK;
    ls_error state_why;
    ls_error_init(&state_why);
    if (p->cfg.state && live) {
        ls_status st = ls_state_read(p->cfg.state, e->name, e->version, &tmp, &state_why);
        if (st == LS_OK && !strcmp(tmp.meta.sha256, e->meta.sha256)) {
            ls_error_free(&state_why);
            return ls_policy_install(p, e, &tmp);
        }
        if (st == LS_OK)
            ls_error_set(&state_why, LS_INTERNAL, "the state directory was changed behind the server",
                         "state directory: %s.adapter holds other factors than version %" PRIu64, e->name, e->version);
        ls_adapter_free(&tmp);
        /* A replace or delete may have rewritten or removed the record
         * between the check of live and the read; it reads the copy back
         * first (ls_policy_keep_copy), so that copy is the answer. */
        pthread_mutex_lock(&p->mu);
        const bool now = e->host_data;
        pthread_mutex_unlock(&p->mu);
        if (now) {
            ls_error_free(&state_why);
            return LS_OK;
        }
    }
    if (!e->source_path || !p->cfg.reload) {
        /* Nothing else to read it from: the state directory's failure
         * (out of memory, a record changed behind the server) is the
         * answer, not a stale adapter. */
        ls_status st = state_why.code != LS_OK
                           ? ls_error_set(err, state_why.code, state_why.hint, "adapter '%s' version %" PRIu64
                                          " cannot be read back: %s", e->name, e->version, state_why.message)
                           : ls_error_set(err, LS_ADAPTER_STALE, NULL, "adapter '%s' version %" PRIu64
                                          " has no host copy and nothing to read it back from", e->name, e->version);
        ls_error_free(&state_why);
        return st;
    }
    ls_error_free(&state_why);
    /* Whatever is wrong with the file now (gone, unreadable, invalid,
     * different), it is not the request's fault: the adapter it names is
     * stale. Out of memory stays what it is. */
    ls_error why;
    ls_error_init(&why);
    ls_status st = p->cfg.reload(p->cfg.reload_ctx, e->source_path, &e->params, &tmp, &why);
    if (st == LS_INTERNAL) {
        ls_error_set(err, st, why.hint[0] ? why.hint : NULL, "adapter '%s': reading %s back failed: %s", e->name,
                     e->source_path, why.message);
    } else if (st != LS_OK) {
        ls_error_set(err, LS_ADAPTER_STALE, NULL, "adapter '%s' version %" PRIu64 " cannot be read back from %s: %s",
                     e->name, e->version, e->source_path, why.message);
        st = LS_ADAPTER_STALE;
    } else if (strcmp(tmp.meta.sha256, e->meta.sha256) != 0 || tmp.meta.rank != e->meta.rank ||
               tmp.meta.outer != e->meta.outer || tmp.layers != p->dims.L || !tmp.data) {
        ls_adapter_free(&tmp);
        st = ls_error_set(err, LS_ADAPTER_STALE, NULL,
                          "adapter '%s' version %" PRIu64 ": its file %s changed since it was loaded", e->name,
                          e->version, e->source_path);
    }
    ls_error_free(&why);
    if (st != LS_OK) return st;
    return ls_policy_install(p, e, &tmp);
}

ls_status ls_policy_reload_held(ls_pool *p, ls_pool_entry *const *ents, int count, ls_error *err) {
    for (int d = 0; d < count; d++) {
        pthread_mutex_lock(&p->mu);
        bool missing = !ents[d]->host_data && ents[d]->slot < 0;
        pthread_mutex_unlock(&p->mu);
        if (missing) {
            ls_status st = ls_policy_reload(p, ents[d], err);
            if (st != LS_OK) return st;
        }
    }
    return LS_OK;
}

ls_pool_entry *ls_policy_keep_copy(ls_pool *p, const char *name) {
    pthread_mutex_lock(&p->mu);
    ls_pool_entry *e = p->cfg.state ? ls_registry_find(p, name) : NULL;
    if (e && e->source_path && p->cfg.reload) e = NULL; /* its file stays */
    /* Kept from now on, also a copy it has already: the host tier would
     * otherwise drop it before the record goes, and a forward that takes
     * the version meanwhile would find neither. Nothing else unlinks it:
     * the caller holds state_mu. */
    if (e) e->keep_copy = true;
    const bool have = e && e->host_data;
    pthread_mutex_unlock(&p->mu);
    if (!e) return NULL;
    /* Read whether or not a request holds it now: one may take it until
     * the name goes, and the record is gone by then. Resident or not: a
     * replace may write the new version over its slot, and a forward
     * holding the old one must then fill a slot from this copy. */
    ls_error why;
    ls_error_init(&why);
    if (!have && ls_policy_reload(p, e, &why) != LS_OK)
        ls_log_warn("pool: the copy of adapter '%s' version %" PRIu64 " could not be read back before its record "
                    "goes (a request that holds it will fail): %s",
                    e->name, e->version, why.message);
    ls_error_free(&why);
    return e;
}

/* Under be_mu, without mu: writes every layer of e (held) into slot
 * (which the caller claimed as LOADING for e). Its host copy was read
 * back before the backend lock (ls_policy_reload_held) unless another
 * forward evicted it from its slot in between: then it is read here. On
 * failure the slot is cleared so no half-written adapter remains; the
 * caller frees it. */
ls_status ls_policy_fill_slot(ls_pool *p, ls_pool_entry *e, int slot, ls_error *err) {
    ls_status st = LS_OK;
    /* Under mu: another forward may be installing e's copy right now, and
     * taking mu after it orders its write of e->a before the reads below
     * (be_mu then mu, as ls_policy_reload already takes them). */
    pthread_mutex_lock(&p->mu);
    const bool have = e->host_data;
    pthread_mutex_unlock(&p->mu);
    if (!have) st = ls_policy_reload(p, e, err);
    ls_backend *be = p->be;
    for (int l = 0; st == LS_OK && l < p->dims.L; l++) {
        ls_adapter_expand(&e->a, l, &p->dims, &p->pd, p->w_gu_a, p->w_gu_b, p->w_d_a, p->w_d_b);
        ls_slot_factors f = {p->w_gu_a, p->w_gu_b, p->w_d_a, p->w_d_b, ls_adapter_gate(&e->a, l, &p->dims)};
        st = ls_backend_slot_write(be, slot, l, &f, err);
        if (st != LS_OK) {
            if (err && err->code == LS_OK) ls_error_set(err, st, NULL, "slot %d: write of layer %d failed", slot, l);
            ls_error ignored;
            ls_error_init(&ignored);
            if (ls_backend_slot_clear(be, slot, &ignored) != LS_OK)
                ls_log_error("pool: slot %d could not be cleared after a failed write: %s", slot, ignored.message);
            ls_error_free(&ignored);
        }
    }
    return st;
}
