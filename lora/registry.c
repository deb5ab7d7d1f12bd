/* The adapter registry: the name table (live entries by name, a chained
 * hash), the list of every entry still alive, and the lifetime of one
 * (name, version) entry: linked at registration, unlinked from the name
 * table at delete or replace, destroyed at its last release. */
#include "lora/pool_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/text.h"
static size_t ls_registry_hash(const char *s) { return (size_t)ls_fnv1a64(s); }

/* Load factor 1: when the table cannot grow (no memory) it keeps working
 * with longer chains, so registration never fails here. */
static void ls_registry_grow(ls_pool *p) {
    size_t n = p->n_buckets ? p->n_buckets * 2 : 64;
    ls_pool_entry **b = calloc(n, sizeof *b);
    if (!b) return;
    for (size_t i = 0; i < p->n_buckets; i++) {
        ls_pool_entry *e = p->buckets[i];
        while (e) {
            ls_pool_entry *next = e->hnext;
            size_t k = ls_registry_hash(e->name) & (n - 1);
            e->hnext = b[k];
            b[k] = e;
            e = next;
        }
    }
    free(p->buckets);
    p->buckets = b;
    p->n_buckets = n;
}

/* The live entry named name, or NULL. Borrowed; valid while mu is held
 * (take a reference to keep it longer). */
ls_pool_entry *ls_registry_find(ls_pool *p, const char *name) {
    if (!p->n_buckets) return NULL;
    ls_pool_entry *e = p->buckets[ls_registry_hash(name) & (p->n_buckets - 1)];
    while (e && strcmp(e->name, name) != 0) e = e->hnext;
    return e;
}

/* The length of the tenant part of a name, with its '/' (0: none). */
static size_t ls_registry_tenant_len(const char *name) {
    const char *slash = strchr(name, '/');
    return slash ? (size_t)(slash - name) + 1 : 0;
}

/* The live name nearest to name (common/text.h's rule) into out, "" when
 * none is near: the "did you mean" of adapter_not_found. Only names of
 * name's own tenant are offered (TENANT/NAME; or no tenant): a
 * suggestion must never show a tenant another's adapter. */
void ls_registry_nearest(const ls_pool *p, const char *name, char *out, size_t len) {
    ls_text_near n;
    ls_text_near_init(&n, name);
    const size_t tl = ls_registry_tenant_len(name);
    for (size_t i = 0; i < p->n_buckets; i++)
        for (const ls_pool_entry *e = p->buckets[i]; e; e = e->hnext)
            if (ls_registry_tenant_len(e->name) == tl && !strncmp(e->name, name, tl)) ls_text_near_offer(&n, e->name);
    snprintf(out, len, "%s", n.best);
}

/* Allocates the first table (at pool creation, so registration itself
 * never fails). */
bool ls_registry_init(ls_pool *p) {
    ls_registry_grow(p);
    return p->n_buckets > 0;
}

/* Publishes e (owned by the pool from now on) under its name, which must
 * be free. */
void ls_registry_insert(ls_pool *p, ls_pool_entry *e) {
    if (p->registered >= (int)p->n_buckets) ls_registry_grow(p);
    size_t k = ls_registry_hash(e->name) & (p->n_buckets - 1);
    e->hnext = p->buckets[k];
    p->buckets[k] = e;
    e->live = true;
    p->registered++;
    if (e->pinned) p->pinned++;

    e->prev = NULL;
    e->next = p->all;
    if (p->all) p->all->prev = e;
    p->all = e;
    if (e->host_data) {
        p->host_used++;
        p->host_bytes += e->meta.bytes;
    }
}

/* Makes e's name unknown; e itself lives on while references hold it. */
void ls_registry_unlink(ls_pool *p, ls_pool_entry *e) {
    if (!e->live) return;
    ls_pool_entry **pp = &p->buckets[ls_registry_hash(e->name) & (p->n_buckets - 1)];
    while (*pp && *pp != e) pp = &(*pp)->hnext;
    if (*pp) *pp = e->hnext;
    e->hnext = NULL;
    e->live = false;
    p->registered--;
    /* A version that is no longer the name's is no longer pinned either:
     * its slot stays taken only while requests hold it. */
    if (e->pinned) p->pinned--;
    e->pinned = false;
}

/* Drops one reference; the last one of an unlinked entry frees it. */
void ls_registry_release(ls_pool *p, ls_pool_entry *e) {
    e->refs--;
    if (!e->live && e->refs == 0) ls_registry_destroy(p, e);
}

/* Frees e and everything it owns, and its slot. The slot keeps its stale
 * factors: nothing maps a token to a free slot, and the next load
 * overwrites every layer of it. */
void ls_registry_destroy(ls_pool *p, ls_pool_entry *e) {
    ls_registry_unlink(p, e);
    if (e->slot >= 0) {
        p->slots[e->slot].state = LS_SLOT_FREE;
        p->slots[e->slot].entry = NULL;
        e->slot = -1;
    }
    if (e->prev) e->prev->next = e->next;
    else if (p->all == e) p->all = e->next;
    if (e->next) e->next->prev = e->prev;
    if (e->host_data) {
        p->host_used--;
        p->host_bytes -= e->meta.bytes;
        ls_adapter_free(&e->a);
    }
    ls_adapter_details_free(&e->details);
    free(e->source_path);
    free(e);
}

/* A copy of what a client may see of e. */
void ls_registry_info(const ls_pool *p, const ls_pool_entry *e, ls_adapter_info *info) {
    (void)p;
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", e->name);
    info->version = e->version;
    info->meta = e->meta;
    info->pinned = e->pinned;
    info->slot = e->slot;
    info->host_data = e->host_data;
    info->in_flight = e->refs;
    info->last_used_ms = e->last_used_ms;
    info->hits = e->hits;
    info->requests = e->requests;
    info->tokens = e->tokens;
    info->loads = e->loads;
    info->evictions = e->evictions;
    info->auto_loaded = e->auto_loaded;
    info->gate_up_order = e->params.gate_up_order;
    memcpy(info->warnings, e->warnings, sizeof info->warnings);
    snprintf(info->source_path, sizeof info->source_path, "%s", e->source_path ? e->source_path : "");
}
