/* What the fault sweeps share: a world (a CPU backend behind the failing
 * backend, a pool over it, optionally a state directory and an adapter
 * directory), the observable state of a world captured and compared, a
 * catalogue of every adapter the tests made (to check what a slot holds
 * against what the pool says it holds), and the sweep itself: an
 * operation run with its Nth allocation or Nth backend call failing, for
 * N = 1, 2, ... until it runs through without meeting the failure.
 *
 * The contract every sweep checks, for every N:
 * - the call succeeds, or it fails with the status a failure of that
 *   kind gives (LS_INTERNAL for memory, LS_DEVICE_ERROR for the device)
 *   and a message;
 * - on failure the registry (names, versions, sha256, pins, sources) and
 *   the state directory's files are exactly as before; the slots are
 *   exactly as before when no slot was written, else every resident slot
 *   holds a registered version whose factors the backend really holds,
 *   and every pinned adapter is still resident while the device works (a
 *   slot is a cache: a failed write may cost the adapter it displaced its
 *   residency, never its registration or a slot's integrity);
 * - a retry without injection succeeds and gives what a run that never
 *   failed gives: the same outputs, bit for bit, the same registry and the
 *   same files (after a sticky device fault there is no retry: the device
 *   is gone, ls_backend_usable must be false, and fx_after_sticky checks
 *   what else should follow);
 * - every allocation the attempt made was given back (fault_alloc's live
 *   count; LeakSanitizer checks the rest in the ASan build).
 *
 * Environment: FAULT_VERBOSE=1 prints every attempt's outcome (and the
 * two versions of a state file that differs), FAULT_LOG=1 keeps the
 * server's log lines, FAULT_JANSSON_PARSE=1 fails jansson's parser's
 * allocations too (fault_alloc.h says why they are left out). */
#ifndef LS_TESTS_FAULT_FIXTURE_H
#define LS_TESTS_FAULT_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lora/loader.h"
#include "lora/pool.h"
#include "lora/state.h"
#include "tests/fault/fault_alloc.h"
#include "tests/fault/fault_backend.h"

/* The model and pool every world has: n=2, H=8, F=4, two layers; slots
 * of max rank 4; 16 tokens per backend call. */
#define FX_RMAX 4
#define FX_TOKENS 16
extern const ls_dims fx_dims;

/* Quiets the pool's log lines (a sweep produces thousands) unless
 * FAULT_LOG is set, and installs the allocation hook. Call first. */
void fx_init(void);

typedef struct {
    int slots;
    int host_cache;        /* 0: 64 */
    bool state;            /* open a state directory */
    const char *state_dir; /* with state: this one (kept), else a new temp dir (removed) */
    const char *adapter_dir; /* non-NULL: a loader over it, and the pool reloads through it */
} fx_opts;

typedef struct {
    ls_dims d;
    ls_pool_dims pd;
    fb_backend *fb;
    ls_pool *p;
    ls_state *state;
    char *state_dir; /* NULL without a state directory */
    bool own_state_dir;
    ls_loader ld; /* dirfd -1 without an adapter directory */
} fx_world;

/* A world; the CPU backend's base weights are the same in every world,
 * so forwards compare across worlds. Fails the test on error. */
fx_world *fx_world_new(const fx_opts *o);
void fx_world_free(fx_world *w);

/* pt_adapter(rank, seed) for the world's shapes, entered in the
 * catalogue. The caller owns *a. */
void fx_adapter(int rank, uint64_t seed, ls_adapter *a);
/* Enters a copy of a's factors in the catalogue (by sha256). */
void fx_catalog_add(const ls_adapter *a);
/* Loads fx_adapter(rank, seed) under name; fails the test unless it
 * succeeds. Returns the version. */
uint64_t fx_load(fx_world *w, const char *name, int rank, uint64_t seed, bool pinned, bool replace);

/* A PEFT adapter of rank 2 for fx_dims (both layers, with the
 * base_model.model. prefix) plus one factor of another module (skipped
 * and listed as ignored unless strict): its tensors, owned by s. */
void fx_peft_tensors(ls_tensor_set *s);
/* Writes into dir: peft1/ (adapter_config.json with r 2 and lora_alpha 4,
 * and adapter_model.safetensors) and bare.safetensors (the same tensors,
 * the parameters in its __metadata__). */
void fx_write_adapter_dir(const char *dir);

/* ---- observable state -------------------------------------------------------- */

typedef struct {
    char path[640]; /* relative to the state directory */
    uint8_t *data;
    size_t len;
} fx_file;

typedef struct {
    ls_adapter_info *reg; /* ls_pool_list */
    size_t n_reg;
    ls_slot_info *slots; /* ls_pool_snapshot */
    int S;
    fx_file *files; /* the state directory, recursively, sorted */
    size_t n_files;
} fx_state;

/* Captures w (the registry, the slots, the state directory) and checks
 * that every resident slot holds what the pool says (fx_check_slots). */
void fx_capture(fx_world *w, fx_state *s);
void fx_state_free(fx_state *s);
/* The files of dir (recursively) into s->files. */
void fx_read_files(const char *dir, fx_state *s);

/* Fails the test unless a and b have the same registry. */
void fx_expect_registry(const fx_state *a, const fx_state *b, const char *when);
/* ... the same slots (state, adapter, version, pin). */
void fx_expect_slots(const fx_state *a, const fx_state *b, const char *when);
/* ... the same files, byte for byte. */
void fx_expect_files(const fx_state *a, const fx_state *b, const char *when);
/* Every resident slot of s holds a registered (name, version) once, and
 * the backend holds exactly its factors; every pinned adapter is
 * resident; no slot is left LOADING. */
void fx_check_slots(fx_world *w, const fx_state *s);

/* ---- the sweep --------------------------------------------------------------- */

typedef enum {
    FX_ALLOC,          /* fail the Nth allocation */
    FX_DEVICE,         /* fail the Nth backend call */
    FX_DEVICE_STICKY,  /* ... and poison the device */
} fx_kind;

/* Bytes a successful call produced (a version, y, a count), compared bit
 * for bit between a retried run and a run that never failed. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
} fx_blob;
void fx_blob_add(fx_blob *b, const void *data, size_t len);
void fx_blob_free(fx_blob *b);
/* Field by field: a struct's padding is not part of what it says. */
void fx_blob_meta(fx_blob *b, const ls_adapter_meta *m);
void fx_blob_params(fx_blob *b, const ls_adapter_params *p);

typedef struct {
    const char *what;
    /* A fresh context for one attempt (nothing injected). */
    void *(*setup)(void *arg);
    void *arg;
    /* The world the call changes (NULL: none, only outputs and memory). */
    fx_world *(*world)(void *ctx);
    /* The call under test. Also the retry after a failure unless retry is
     * given. */
    ls_status (*op)(void *ctx, ls_error *err);
    /* Optional: the retry after a failure (a restore retries on a fresh
     * pool, as the server does on its next start). */
    ls_status (*retry)(void *ctx, ls_error *err);
    /* Optional: checks after a failed call, beyond the world's state (the
     * caller's buffers left as documented). */
    void (*after_fail)(void *ctx);
    /* Optional: appends the outputs of a successful call; may go on using
     * the world (after it was captured). */
    void (*outputs)(void *ctx, fx_blob *out);
    void (*teardown)(void *ctx);
} fx_case;

typedef struct {
    long last_n;      /* the N that ran through */
    long injected;    /* attempts that met the failure */
    long failed;      /* ... and returned an error (the rest absorbed it) */
    long strict;      /* failures that left the slots exactly as they were */
    long ops_total;   /* allocations (or backend calls) of the run that never failed */
} fx_report;

/* Runs the sweep and checks the contract above; prints one line. */
fx_report fx_sweep(const fx_case *c, fx_kind kind);

/* Called after every failure a sticky device fault caused, once the
 * sweep checked ls_backend_usable (NULL: nothing more): a program that
 * links the server checks its /ready here. */
extern void (*fx_after_sticky)(fx_world *w);

#endif
