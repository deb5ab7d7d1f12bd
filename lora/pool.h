/* The adapter registry and the slot pool policy (docs/math.md, the pool): names ->
 * immutable adapter versions held in a host tier, residency in the
 * backend's S slots with LRU eviction, pins, reference counts that keep a
 * version alive while a request uses it, and the forward over any mix of
 * adapters (served in groups when they do not all fit at once).
 * Thread-safe: every entry point may be called from any thread. */
#ifndef LS_LORA_POOL_H
#define LS_LORA_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dims.h"
#include "common/error.h"
#include "gpu/backend.h"
#include "lora/adapter.h"
#include "lora/state.h"
#include "lora/token_names.h"

typedef struct ls_pool ls_pool;

/* Re-reads an adapter dropped from the host tier from its source path.
 * Fills out (owned by the pool afterwards) or err. Called without any of
 * the pool's locks (ls_loader_reload is the server's); it must not call
 * back into the pool. */
typedef ls_status (*ls_pool_reload_fn)(void *ctx, const char *path, const ls_adapter_params *params, ls_adapter *out,
                                       ls_error *err);

typedef struct {
    int host_cache;              /* adapters kept in the host tier */
    ls_pool_reload_fn reload;    /* reads an adapter back from its source path; NULL: never */
    void *reload_ctx;
    ls_state *state;             /* durable registry (borrowed); NULL: none */
} ls_pool_config;

/* Creates the pool over be (borrowed: must outlive the pool). The pool
 * serialises every call it makes into the backend. */
ls_status ls_pool_create(ls_backend *be, const ls_pool_config *cfg, ls_pool **out, ls_error *err);
/* Frees every adapter; requests must have ended. */
void ls_pool_free(ls_pool *p);

typedef struct {
    bool pinned;
    bool keep_pin;             /* with replace: pinned as the version replaced is (pinned is then ignored) */
    bool replace;              /* swap an existing name atomically, version + 1 */
    const char *source_path;   /* NULL for inline uploads; else copied */
    ls_adapter_params params;  /* kept to reload from source_path */
    uint64_t restore_version;  /* > 0: restoring from the state directory: this version, nothing written */
    bool auto_loaded;          /* registered by a forward that named it (--auto-load), not by a client's upload */
} ls_pool_load_opts;

typedef enum { LS_SLOT_FREE, LS_SLOT_LOADING, LS_SLOT_RESIDENT } ls_slot_state;

/* A snapshot of one registered adapter (strings copied into the struct). */
typedef struct {
    char name[129];
    uint64_t version;
    ls_adapter_meta meta;
    bool pinned;
    int slot;       /* -1 when not resident */
    bool host_data; /* normalised factors held in the host tier */
    int in_flight;      /* requests holding this version now */
    int64_t last_used_ms; /* unix ms of the last forward, 0 = never */
    uint64_t hits;
    /* Per-name counters for the metrics: a replace carries them over to
     * the new version, a delete drops them with the name. */
    uint64_t requests, tokens; /* forwards answered (ls_pool_count_served) and their tokens */
    uint64_t loads, evictions; /* slot writes of the adapter, and evictions from a slot */
    bool auto_loaded; /* registered by --auto-load */
    ls_gate_up_order gate_up_order; /* how its PEFT gate_up_proj.lora_B rows were read */
    char warnings[LS_ADAPTER_WARNINGS][512]; /* its load's (ls_adapter.warnings); "" none */
    char source_path[4096]; /* "" for inline uploads */
    uint64_t replaced; /* from ls_pool_load: the version this load replaced, 0 when the name was new */
} ls_adapter_info;

/* Registers a (validated, normalised) adapter under name and tries to make
 * it resident. On success takes ownership of *a (zeroing it) and fills
 * info; on failure *a stays the caller's and nothing changed. Errors:
 * LS_ADAPTER_EXISTS (name taken, no replace), LS_PIN_LIMIT (a pin over
 * S-1), LS_POOL_EXHAUSTED (pinned and no slot can be had now), LS_DEVICE_ERROR (slot
 * write failed: rolled back), LS_VERSIONS_EXHAUSTED (the name had
 * LS_STATE_VERSION_MAX), LS_INSUFFICIENT_STORAGE (the state directory's
 * disk or quota is full: nothing changed), LS_INTERNAL (out of memory, or
 * the state directory refused: nothing changed). One exception: when the state
 * directory renamed the record into place and only the sync after it
 * failed, the adapter is registered as the disk now says (*a taken and
 * info filled as on success) and LS_INTERNAL says its durability is not
 * confirmed: after any other failure info->version is 0, so a caller can
 * tell (and audit) a change that stands. An unpinned adapter that finds
 * no slot now stays registered in the host tier. */
ls_status ls_pool_load(ls_pool *p, const char *name, ls_adapter *a, const ls_pool_load_opts *opts,
                       ls_adapter_info *info, ls_error *err);

/* Unregisters name: unknown at once to new requests; the slot is freed at
 * the last release. info (when not NULL) gets the snapshot of the version
 * this call removed, taken as it went (a replace racing the delete may
 * have made it a newer one than a describe before the call saw).
 * LS_ADAPTER_NOT_FOUND when unknown. With a state
 * directory the delete is durable before this returns (LS_INTERNAL, or
 * LS_INSUFFICIENT_STORAGE for the one write it may need, and nothing
 * changed, when the disk refuses; but when the record was removed
 * and only the sync after it failed, the name is unregistered as the disk
 * says, and LS_INTERNAL says the delete's durability is not confirmed).
 * After a failure info->version is 0 unless the delete stands (that last
 * case, info as on success). */
ls_status ls_pool_delete(ls_pool *p, const char *name, ls_adapter_info *info, ls_error *err);

/* Registers every adapter of the state directory with its version, and
 * the versions of deleted names; call once, before serving. What cannot
 * be read is moved aside and logged (the state module's rule), and a
 * record for another model shape is skipped; *restored receives the
 * count. All or nothing: out of memory or a device error undoes what it
 * registered and is returned (the server must not start without an
 * acknowledged adapter). */
ls_status ls_pool_restore(ls_pool *p, int *restored, ls_error *err);

/* The registered name nearest to name within a small edit distance (a
 * "did you mean"), copied into out (len bytes); "" when none is near.
 * Returns the last version name had when it was registered before
 * (deleted, or not restored at start-up): then out is "", as offering
 * another live name would point a second DELETE at it. 0 otherwise. */
uint64_t ls_pool_nearest(ls_pool *p, const char *name, char *out, size_t len);

/* Snapshot of one adapter (info NULL: only whether it is registered);
 * LS_ADAPTER_NOT_FOUND when unknown. */
ls_status ls_pool_describe(ls_pool *p, const char *name, ls_adapter_info *info, ls_error *err);

/* What a registered adapter's load applied and skipped: the layers that
 * have factors ([n_layers], the pool's index order) and the tensors of
 * other modules it skipped. Copies the caller frees with
 * ls_adapter_details_free. */
typedef struct {
    bool *layers;
    int n_layers;
    char **ignored;
    size_t n_ignored;
} ls_adapter_details;

/* ls_pool_describe, with the details of the same version taken under
 * the same lock. */
ls_status ls_pool_describe_details(ls_pool *p, const char *name, ls_adapter_info *info, ls_adapter_details *d,
                                   ls_error *err);
void ls_adapter_details_free(ls_adapter_details *d);
/* Snapshot of every registered adapter, by name; *out malloc'd (caller
 * frees), *n set. */
ls_status ls_pool_list(ls_pool *p, ls_adapter_info **out, size_t *n, ls_error *err);

typedef struct {
    int index;
    ls_slot_state state;
    char adapter[129]; /* "" when free */
    uint64_t version;
    int rank;
    bool pinned;
    int in_flight;
    int64_t last_used_ms;
    uint64_t hits;
    bool live; /* the name's current version; false for a deleted or replaced one that requests still hold */
} ls_slot_info;

typedef struct {
    int slots, max_rank, layers;
    ls_lora_layout layout;
    size_t bytes_per_slot, bytes_total;
    int host_capacity, host_used; /* adapters with factors in the host tier */
    size_t host_bytes;
    int registered, pinned;
    uint64_t loads, evictions, hits, misses, host_drops;
} ls_pool_stats;

/* Snapshot of every slot (*out malloc'd, S entries) and the counters. */
ls_status ls_pool_snapshot(ls_pool *p, ls_slot_info **out, ls_pool_stats *stats, ls_error *err);

/* Counts one answered forward request: for each of the n adapters it
 * used, one request and tokens[i] tokens on the live version of used[i]'s
 * name (a name deleted meanwhile is skipped). Both arrays borrowed. */
void ls_pool_count_served(ls_pool *p, const ls_pool_used *used, const uint64_t *tokens, int n);

/* y[T, H] for tokens whose adapter is names->names[names->of_token[t]]
 * (-1 = base). names NULL, or its of_token NULL, = all base; else it has
 * T tokens. Resolves each distinct name once, first (LS_ADAPTER_NOT_FOUND
 * for an unknown one, nothing run) and holds each version until its
 * tokens have run; makes them resident (evicting as docs/math.md says), in
 * groups when they do not fit at once, and runs the backend forward per
 * group. A group's adapters dropped from the host tier are read back
 * just before it runs, at most ls_pool_read_budget at a time, and the
 * tier is shrunk to its size after each group: however many adapters a
 * forward names, it holds no more than that many copies beyond the
 * tier's size. used receives entry k for names->names[k] (capacity
 * names->n entries; *n_used set to n). */
ls_status ls_pool_forward(ls_pool *p, int layer, int T, const float *x, const float *gammas,
                          const ls_token_names *names, float *y, ls_pool_used *used, int *n_used, ls_error *err);

/* The host copies a forward reads back at most at once: --host-cache,
 * no more than the slots a group can use, at least 1. */
int ls_pool_read_budget(const ls_pool *p);

/* What a forward over names may hold, now, in host copies it reads:
 * for each distinct name neither resident nor in the host tier, its
 * bytes, and with unregistered (--auto-load may read them) for a name not
 * registered the largest adapter the pool takes; at most
 * ls_pool_read_budget of them (each counted at the largest). 0 when
 * names is NULL or names none. */
size_t ls_pool_forward_read_bytes(ls_pool *p, const ls_token_names *names, bool unregistered);

#endif
