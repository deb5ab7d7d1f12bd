/* Which forwards the CUDA backend replays as captured graphs: a small
 * cache from a forward's shape (everything its launches depend on: layer,
 * rows, path, slot and rank, tasks) to the graph captured for it. A shape
 * is captured the second time it is seen, so a stream of forwards that
 * never repeat pays no capture. Sightings are kept apart from graphs, so
 * a shape seen once never pushes out a graph that is replayed; the least
 * recently used graph goes when the cache is full. A workload whose
 * shapes do not come back before they are evicted would pay a capture
 * per forward and gain nothing: once half of the graphs evicted since
 * start (or the last clear), and at least LS_GRAPH_WASTE_MIN of them,
 * were never replayed, the cache stops capturing and the forwards launch
 * directly. The ratio is over all those evictions, so after a long run
 * of graphs that were replayed a change to shapes that never repeat
 * stops capture only once it has wasted as many. Host data only, so the CPU
 * tests it; the graphs are opaque pointers the owner destroys through
 * the callback. Not thread-safe: the backend's caller serialises its
 * calls. */
#ifndef LS_GPU_GRAPH_CACHE_H
#define LS_GPU_GRAPH_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Evicted graphs never replayed before the cache may stop capturing. */
#define LS_GRAPH_WASTE_MIN 8

/* Everything a forward's device launches depend on besides the contents
 * of buffers (which a replay reads afresh): two forwards with equal keys
 * launch the same kernels with the same arguments. */
typedef struct {
    int layer, T, n_lora;
    int path;       /* 0 base only, 1 one slot (cuBLAS), 2 several (SGMV) */
    int slot, rank; /* path 1 */
    int ntasks;     /* path 2 */
    int gammas;     /* the request gave gammas */
    int mode;       /* the backend's LoRA kernel switch */
} ls_graph_key;

typedef struct {
    ls_graph_key key;
    void *graph;    /* a graph entry's graph (never NULL there) */
    bool failed;    /* a sighting whose capture or launch failed: direct launches */
    uint64_t hits;  /* replays since it was captured */
    uint64_t used;  /* clock of the last lookup */
} ls_graph_entry;

typedef struct {
    ls_graph_entry *e;    /* graphs */
    ls_graph_entry *seen; /* shapes seen once, not captured, and shapes whose graph failed */
    int cap, count, nseen;
    uint64_t clock;
    void (*destroy)(void *graph);
    /* For the log, /metrics-free diagnosis and tests. */
    uint64_t hits, captures, failures;
    uint64_t evicted, wasted; /* graphs evicted; of those, never replayed */
    bool stopped;             /* too many wasted: no more captures */
} ls_graph_cache;

/* cap graphs (and as many sightings); cap 0 turns graphs off. False when
 * out of memory (the cache is then off). */
bool ls_graph_cache_init(ls_graph_cache *c, int cap, void (*destroy)(void *graph));
/* Destroys every graph; a zeroed cache is a no-op. */
void ls_graph_cache_free(ls_graph_cache *c);

/* The graph for k, or NULL. With NULL, *capture says whether to capture
 * now (k was seen before and the cache still captures) and then hand the
 * graph to put; a first sighting is remembered. */
void *ls_graph_cache_get(ls_graph_cache *c, const ls_graph_key *k, bool *capture);
/* Keeps graph for k (after get said capture); evicts the least recently
 * used graph when full. graph NULL (capture failed) marks the shape's
 * sighting as one to launch directly, so it is not captured again while
 * the cache remembers it (as long as a sighting lasts: least recently
 * used first, as many as graphs); a failure never pushes a graph out.
 * True when this put made the cache stop capturing (for the owner's one
 * log line). */
bool ls_graph_cache_put(ls_graph_cache *c, const ls_graph_key *k, void *graph);
/* Drops k's graph after its launch failed: destroyed, and the shape
 * marked as after a failed capture. */
void ls_graph_cache_drop(ls_graph_cache *c, const ls_graph_key *k);
/* Destroys every graph, forgets every sighting and starts capturing
 * again (evicted and wasted back to 0): ls_graph_cache_free's first
 * step, and what an owner whose buffers move would call (the CUDA
 * backend's never do: they are allocated once, at create; its benchmark
 * clears between traces, ls_backend_cuda_clear_graphs). */
void ls_graph_cache_clear(ls_graph_cache *c);

#ifdef __cplusplus
}
#endif

#endif
