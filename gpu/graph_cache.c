/* The CUDA backend's graph cache (gpu/graph_cache.h). */
#include "gpu/graph_cache.h"

#include <stdlib.h>
#include <string.h>

bool ls_graph_cache_init(ls_graph_cache *c, int cap, void (*destroy)(void *graph)) {
    memset(c, 0, sizeof *c);
    c->destroy = destroy;
    if (cap <= 0) return true;
    c->e = calloc((size_t)cap, sizeof *c->e);
    c->seen = calloc((size_t)cap, sizeof *c->seen);
    if (!c->e || !c->seen) {
        free(c->e);
        free(c->seen);
        c->e = c->seen = NULL;
        return false;
    }
    c->cap = cap;
    return true;
}

void ls_graph_cache_clear(ls_graph_cache *c) {
    for (int i = 0; i < c->count; i++)
        if (c->destroy) c->destroy(c->e[i].graph);
    c->count = c->nseen = 0;
    c->stopped = false;
    c->evicted = c->wasted = 0;
}

void ls_graph_cache_free(ls_graph_cache *c) {
    ls_graph_cache_clear(c);
    free(c->e);
    free(c->seen);
    memset(c, 0, sizeof *c);
}

static int find(const ls_graph_entry *e, int n, const ls_graph_key *k) {
    for (int i = 0; i < n; i++)
        if (!memcmp(&e[i].key, k, sizeof *k)) return i;
    return -1;
}

static int lru(const ls_graph_entry *e, int n) {
    int at = 0;
    for (int i = 1; i < n; i++)
        if (e[i].used < e[at].used) at = i;
    return at;
}

/* A free graph entry: the next unused one, else the least recently used,
 * its graph destroyed and counted (wasted when it was never replayed). */
static ls_graph_entry *take_graph(ls_graph_cache *c) {
    if (c->count < c->cap) return &c->e[c->count++];
    ls_graph_entry *e = &c->e[lru(c->e, c->count)];
    if (c->destroy) c->destroy(e->graph);
    c->evicted++;
    if (e->hits == 0) c->wasted++;
    e->graph = NULL;
    return e;
}

static void forget_seen(ls_graph_cache *c, const ls_graph_key *k) {
    const int i = find(c->seen, c->nseen, k);
    if (i >= 0) c->seen[i] = c->seen[--c->nseen];
}

/* k's sighting, made (over the least recently used one when full) when
 * there is none. */
static ls_graph_entry *sighting(ls_graph_cache *c, const ls_graph_key *k) {
    const int i = find(c->seen, c->nseen, k);
    if (i >= 0) return &c->seen[i];
    ls_graph_entry *s = c->nseen < c->cap ? &c->seen[c->nseen++] : &c->seen[lru(c->seen, c->nseen)];
    memset(s, 0, sizeof *s);
    s->key = *k;
    return s;
}

/* k launches directly from now on: its sighting marked failed. */
static void mark_failed(ls_graph_cache *c, const ls_graph_key *k) {
    ls_graph_entry *s = sighting(c, k);
    s->failed = true;
    s->used = ++c->clock;
    c->failures++;
}

void *ls_graph_cache_get(ls_graph_cache *c, const ls_graph_key *k, bool *capture) {
    *capture = false;
    if (c->cap == 0) return NULL;
    c->clock++;
    int i = find(c->e, c->count, k);
    if (i >= 0) {
        ls_graph_entry *e = &c->e[i];
        e->used = c->clock;
        e->hits++;
        c->hits++;
        return e->graph;
    }
    i = find(c->seen, c->nseen, k);
    if (i >= 0) {
        c->seen[i].used = c->clock;
        *capture = !c->stopped && !c->seen[i].failed;
        return NULL;
    }
    sighting(c, k)->used = c->clock;
    return NULL;
}

bool ls_graph_cache_put(ls_graph_cache *c, const ls_graph_key *k, void *graph) {
    if (c->cap == 0) return false;
    const int i = find(c->e, c->count, k);
    if (!graph) {
        if (i < 0) mark_failed(c, k);
        return false;
    }
    forget_seen(c, k);
    ls_graph_entry *e = i >= 0 ? &c->e[i] : take_graph(c);
    if (i >= 0 && e->graph != graph && c->destroy) c->destroy(e->graph);
    e->key = *k;
    e->graph = graph;
    e->failed = false;
    e->hits = 0;
    e->used = ++c->clock;
    c->captures++;
    const bool stop = !c->stopped && c->wasted >= LS_GRAPH_WASTE_MIN && 2 * c->wasted >= c->evicted;
    if (stop) c->stopped = true;
    return stop;
}

void ls_graph_cache_drop(ls_graph_cache *c, const ls_graph_key *k) {
    const int i = find(c->e, c->count, k);
    if (i < 0) return;
    if (c->destroy) c->destroy(c->e[i].graph);
    c->e[i] = c->e[--c->count];
    mark_failed(c, k);
}
