/* What the case-by-case pool tests (test_pool.c, test_pool_tier.c) share:
 * one model shape, adapters named by (name, version), a pool over the
 * fake backend, and forwards checked bit for bit against the fake's
 * formula for the versions they report. Compiled once (pool_cases.c). */
#ifndef LS_TESTS_POOL_CASES_H
#define LS_TESTS_POOL_CASES_H

#include "tests/util/pool_fixture.h"

/* The rank of every case adapter and the pool's max rank. */
#define PC_RK 3
#define PC_RMAX 4
/* n=2, H=6, F=3, two layers, interleaved W13. */
extern const ls_dims pc_dims;

/* The seed of (name, version)'s factors. */
uint64_t pc_seed_of(const char *name, uint64_t version);

/* A fake backend and a pool over it. */
typedef struct {
    pt_fake *fk;
    ls_pool *p;
} pc_fx;

/* S slots of rank PC_RMAX; the caller frees both with pc_fx_free. */
pc_fx pc_fx_make(int S, int max_tokens, int host_cache, ls_pool_reload_fn reload, void *ctx);
void pc_fx_free(pc_fx *f);

/* Loads (name, version)'s factors and checks the pool gave that version
 * (info NULL: not reported). */
ls_status pc_load(ls_pool *p, const char *name, uint64_t version, bool pinned, bool replace, const char *path,
                  ls_adapter_info *info, ls_error *err);
/* The same, failing the test unless it succeeds. */
void pc_load_ok(ls_pool *p, const char *name, uint64_t version, bool pinned, bool replace);

/* The slots as "name name -" (- = free), for readable policy asserts.
 * Points to a static buffer, overwritten by the next call. */
const char *pc_slots(ls_pool *p);
/* The pool's counters. */
ls_pool_stats pc_stats(ls_pool *p);
/* The snapshot of name, failing the test when it is unknown. */
ls_adapter_info pc_describe(ls_pool *p, const char *name);

/* Deterministic x [T, H] and gammas [T, n] from seed. */
void pc_fill_inputs(int T, float *x, float *g, uint64_t seed);

/* The table of a string per token (NULL = base; names NULL = none, as
 * a request that names no adapter), borrowing the strings: free it with
 * ls_token_names_free. Fails the test when out of memory. */
void pc_names(ls_token_names *tn, int T, const char *const *names);
/* ls_pool_forward and ls_pool_forward_read_bytes with a string per token,
 * as the tests write forwards (used[].name points into names). */
ls_status pc_pool_forward(ls_pool *p, int layer, int T, const float *x, const float *g, const char *const *names,
                          float *y, ls_pool_used *used, int *n_used, ls_error *err);
size_t pc_read_bytes(ls_pool *p, int T, const char *const *names, bool unregistered);

/* Runs a forward on deterministic inputs. On success checks every token's
 * y bit for bit against the fake's formula for the version used[] names.
 * used and n_used may be NULL (then a local list is used); y_out (T*H
 * floats) receives y when given. */
ls_status pc_fwd(ls_pool *p, int layer, int T, const char *const *names, ls_pool_used *used, int *n_used,
                 float *y_out, ls_error *err);
/* The same on layer 0, failing the test unless it succeeds. */
void pc_fwd_ok(ls_pool *p, int T, const char *const *names);

/* The reload context of pc_reload: calls counted, tamper = give back
 * other factors than the path names. */
typedef struct {
    int calls;
    bool tamper;
} pc_reload_ctx;

/* An ls_pool_reload_fn reading "seed:N" back as pt_adapter(N) (another
 * adapter when tampered); ctx is a pc_reload_ctx. */
ls_status pc_reload(void *ctx, const char *path, const ls_adapter_params *params, ls_adapter *out, ls_error *err);

#endif
