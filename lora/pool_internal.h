/* The pool's private state, shared by lora/pool.c (entry points),
 * lora/registry.c (names and entry lifetimes), lora/pool_policy.c (slots,
 * eviction, the host tier) and lora/pool_forward.c (the grouped forward).
 * Outside lora/ only white-box tests include this file. */
#ifndef LS_LORA_POOL_INTERNAL_H
#define LS_LORA_POOL_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "lora/pool.h"

/* One registered (name, version): immutable weights plus the mutable
 * bookkeeping, all of it guarded by ls_pool.mu. */
typedef struct ls_pool_entry {
    char name[129];
    uint64_t version;
    ls_adapter a;   /* host copy; a.data NULL once dropped from the host tier */
    bool host_data; /* a holds the factors */
    ls_adapter_meta meta; /* describes the adapter even while its host copy is dropped */
    char *source_path; /* owned; NULL for inline uploads */
    bool auto_loaded;  /* registered by --auto-load */
    ls_adapter_params params;
    /* What its load said though it stood (ls_adapter.warnings), kept
     * while the host copy is dropped and across restarts. */
    char warnings[LS_ADAPTER_WARNINGS][512];
    /* What its load applied and skipped (copies of a.layer_present and
     * a.ignored), kept while the host copy is dropped: GET shows them. */
    ls_adapter_details details; /* owned */

    bool live;   /* the name table points here; false once deleted or replaced */
    bool keep_copy; /* its record is being removed or replaced: the host tier keeps its copy */
    bool pinned;
    int refs;    /* requests holding this version */
    int slot;    /* -1 when not in a slot (LOADING or RESIDENT otherwise) */
    uint64_t seq;  /* registration order: the LRU tie-break */
    uint64_t tick; /* logical clock of the last use (load or forward) */
    int64_t last_used_ms;
    uint64_t hits;
    uint64_t requests, tokens, loads, evictions; /* the name's, carried over at replace */
    uint64_t mark;  /* id of the forward group that last marked it */

    struct ls_pool_entry *hnext;      /* name-table chain (live entries only) */
    struct ls_pool_entry *prev, *next; /* every entry, live or still referenced */
} ls_pool_entry;

typedef struct {
    ls_slot_state state;
    ls_pool_entry *entry; /* occupant when LOADING or RESIDENT */
} ls_pool_slot;

/* The last version a deleted name had: the next load of it continues
 * after it, so a version is never reused. */
typedef struct {
    char name[129];
    uint64_t version;
} ls_pool_floor;

struct ls_pool {
    ls_backend *be; /* borrowed */
    ls_dims dims;
    ls_pool_dims pd;
    int S;
    ls_pool_config cfg;

    /* Lock order: be_mu before mu, never the reverse. be_mu serialises
     * every backend call and every change of slot assignment; mu guards
     * all the state below and is only held for short bookkeeping. */
    pthread_mutex_t state_mu;
    pthread_mutex_t be_mu;
    pthread_mutex_t mu;

    ls_pool_slot *slots; /* S */
    ls_pool_entry **buckets;
    size_t n_buckets;
    int registered; /* live entries */
    int pinned;     /* live pinned entries */
    ls_pool_entry *all;
    int host_used; /* entries holding host factors, live or not */
    size_t host_bytes;

    ls_pool_floor *floors; /* under mu */
    size_t n_floors, cap_floors;

    uint64_t clock, seq, marks;
    uint64_t loads, evictions, hits, misses, host_drops;

    /* Scratch, used only under be_mu: one layer of expanded factors for a
     * slot write, and max_tokens rows for gathered groups. */
    float *w_gu_a, *w_gu_b, *w_d_a, *w_d_b;
    float *g_x, *g_gam, *g_y;
    int *g_slot, *g_rows;
};

/* registry.c: all of these but init run under mu. */
bool ls_registry_init(ls_pool *p);
ls_pool_entry *ls_registry_find(ls_pool *p, const char *name);
void ls_registry_insert(ls_pool *p, ls_pool_entry *e);
void ls_registry_unlink(ls_pool *p, ls_pool_entry *e);
void ls_registry_release(ls_pool *p, ls_pool_entry *e);
void ls_registry_destroy(ls_pool *p, ls_pool_entry *e);
void ls_registry_info(const ls_pool *p, const ls_pool_entry *e, ls_adapter_info *info);
void ls_registry_nearest(const ls_pool *p, const char *name, char *out, size_t len);

/* pool.c, with mu not held: adapter_not_found for name, saying it was
 * deleted when it was (with its last version), else with the nearest
 * registered name when one is near; hint NULL: the code's own ("load it
 * first with POST /adapters"). */
ls_status ls_pool_not_found(ls_pool *p, const char *name, const char *hint, ls_error *err);

/* pool.c, under mu: a deleted name's last version (0 when none), and
 * raising it (false on out of memory). */
uint64_t ls_pool_floor_of(const ls_pool *p, const char *name);
bool ls_pool_floor_raise(ls_pool *p, const char *name, uint64_t version);

/* pool_policy.c */
int64_t ls_policy_now_ms(void);
void ls_policy_touch(ls_pool *p, ls_pool_entry *e);
bool ls_policy_in_slot(const ls_pool *p, const ls_pool_entry *e);
int ls_policy_take_slot(ls_pool *p, ls_pool_entry *e, uint64_t group);
void ls_policy_trim_host(ls_pool *p, const ls_pool_entry *keep);
ls_status ls_policy_fill_slot(ls_pool *p, ls_pool_entry *e, int slot, ls_error *err);
/* Without a lock: gives each of the count held entries that is not
 * resident its host copy, reading dropped ones back from their source
 * path, in order. */
ls_status ls_policy_reload_held(ls_pool *p, ls_pool_entry *const *ents, int count, ls_error *err);
/* Under state_mu, before a delete or a replace takes the record of name's
 * live version: when that version has nothing but the record to read a
 * copy back from (an inline upload), a request that holds it, or takes
 * it before the name goes, could not be served after without one. Its
 * copy is read back now unless it has one, resident or not, and kept
 * (keep_copy: the host tier does not drop it) until its last release; the
 * caller clears keep_copy, under mu, if the change fails and the version
 * stays live. Returns that entry, or NULL when nothing needed keeping. */
ls_pool_entry *ls_policy_keep_copy(ls_pool *p, const char *name);
/* For the tests only: when set, called with the entry's name as
 * ls_policy_reload starts, in the window between a caller's look at
 * host_data and the reload's own, where a delete or replace of the name
 * may end. Set before the threads that reload start; NULL in the
 * server. */
extern void (*ls_policy_reload_hook)(const char *name);

#endif
