/* The CUDA backend's graph cache (gpu/graph_cache.h). */
#include "gpu/graph_cache.h"

#include <stdlib.h>
#include <string.h>

bool ls_graph_cache_init(ls_graph_cache *c, int cap, void (*destroy)(void *graph)) {
    memset(c, 0, sizeof *c);
    c->destroy = destroy;
    if (cap <= 0) return true;
    c->e = calloc((size_t)cap, sizeof *c->e);
    if (!c->e) return false;
    c->cap = cap;
    return true;
}

void ls_graph_cache_clear(ls_graph_cache *c) {
    for (int i = 0; i < c->count; i++)
        if (c->e[i].graph && c->destroy) c->destroy(c->e[i].graph);
    c->count = 0;
}

void ls_graph_cache_free(ls_graph_cache *c) {
    ls_graph_cache_clear(c);
    free(c->e);
    memset(c, 0, sizeof *c);
}

static int find(const ls_graph_cache *c, const ls_graph_key *k) {
    for (int i = 0; i < c->count; i++)
        if (!memcmp(&c->e[i].key, k, sizeof *k)) return i;
    return -1;
}

/* A free entry: the next unused one, else the least recently used
 * (its graph destroyed). */
static ls_graph_entry *take(ls_graph_cache *c) {
    if (c->count < c->cap) return &c->e[c->count++];
    int lru = 0;
    for (int i = 1; i < c->count; i++)
        if (c->e[i].used < c->e[lru].used) lru = i;
    if (c->e[lru].graph && c->destroy) c->destroy(c->e[lru].graph);
    c->e[lru].graph = NULL;
    return &c->e[lru];
}

void *ls_graph_cache_get(ls_graph_cache *c, const ls_graph_key *k, bool *capture) {
    *capture = false;
    if (c->cap == 0) return NULL;
    c->clock++;
    const int i = find(c, k);
    if (i >= 0) {
        c->e[i].used = c->clock;
        if (c->e[i].graph) {
            c->hits++;
            return c->e[i].graph;
        }
        *capture = !c->e[i].failed;
        return NULL;
    }
    ls_graph_entry *e = take(c);
    e->key = *k;
    e->graph = NULL;
    e->failed = false;
    e->used = c->clock;
    return NULL;
}

void ls_graph_cache_put(ls_graph_cache *c, const ls_graph_key *k, void *graph) {
    if (c->cap == 0) return;
    int i = find(c, k);
    ls_graph_entry *e = i >= 0 ? &c->e[i] : take(c);
    if (i >= 0 && e->graph && e->graph != graph && c->destroy) c->destroy(e->graph);
    e->key = *k;
    e->graph = graph;
    e->failed = graph == NULL;
    e->used = ++c->clock;
    if (graph) c->captures++;
}
