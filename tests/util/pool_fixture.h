/* Fixtures of the pool tests: adapters built by hand from a seed in the
 * compact layout of lora/adapter.h, a fake backend whose output identifies
 * the factors in the slot it ran with, and a CPU backend with random base
 * weights for the real math. Compiled once (tests/util/pool_fixture.c). */
#ifndef LS_TESTS_POOL_FIXTURE_H
#define LS_TESTS_POOL_FIXTURE_H

/* What every pool test uses besides the fixture: cmocka, threads, atomics,
 * the pool (with its test hooks) and the reference forward. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/text.h"
#include "gpu/backend.h"
#include "lora/pool.h"
#include "lora/pool_debug.h"
#include "tests/util/reference.h"

/* One step of the splitmix64 stream in *s. */
uint64_t pt_mix(uint64_t *s);
/* Uniform in [-scale, scale). */
float pt_uniform(uint64_t *s, float scale);
/* Uniform in [0, n). */
int pt_rand(uint64_t *s, int n);

/* A normalised adapter of rank r (outer 1) whose factors follow from seed
 * alone, as ls_adapter_normalise would leave it. Owned by the caller
 * (ls_adapter_free). */
void pt_adapter(const ls_dims *d, int r, uint64_t seed, ls_adapter *a);

/* What the fake backend returns for one token: x * sum(gammas) + the
 * signature of the adapter's layer (a NULL: base, no signature). */
void pt_expect_token(const ls_dims *d, const ls_adapter *a, int layer, const float *x, const float *gam, float *y);

/* A fake backend for the shared pool layout. It records slot writes,
 * fails a write on demand, can hold forwards at a gate and counts calls
 * that overlap (the pool must serialise them). The counters are the
 * tests' to read; the rest is the fake's. */
typedef struct {
    ls_backend *be; /* its context is this struct */
    size_t len[4], per_layer;
    float *store;      /* [S][L][per_layer]: gu_a, gu_b, d_a, d_b */
    int *layers_ok;    /* [S] layers written since the last clear */
    atomic_int in_call;
    atomic_int overlaps;   /* backend calls that found another one running */
    atomic_int bad_slots;  /* forwards naming a slot not fully written */
    atomic_int slot_writes, clears, forwards;
    atomic_int fail_write_in; /* > 0: the write that brings it to 0 fails */
    atomic_int max_distinct;  /* most distinct slots seen in one forward */
    int delay_us;             /* sleep inside every forward */
    pthread_mutex_t gate_mu;
    pthread_cond_t gate_cv;
    bool gate_closed; /* forwards wait inside the backend while closed */
    int waiting;
} pt_fake;

/* A fake backend with S slots of rank R, every layer's (no) weights
 * uploaded. The fake is owned by its backend: ls_backend_free(f->be) frees
 * both. */
pt_fake *pt_fake_create(ls_dims d, int S, int R, int max_tokens);
/* Closes (forwards wait inside the backend) or opens the gate. */
void pt_fake_gate(pt_fake *f, bool closed);
/* Waits until `count` forwards wait at the closed gate. */
void pt_fake_wait_blocked(pt_fake *f, int count);

/* A pool over be (borrowed); the caller frees it with ls_pool_free. */
ls_pool *pt_pool(ls_backend *be, int host_cache, ls_pool_reload_fn reload, void *ctx);

/* Loads pt_adapter(d, r, seed) under name with the given options. The
 * adapter goes to the pool on success and is freed here on failure. */
ls_status pt_load(ls_pool *p, const ls_dims *d, const char *name, int r, uint64_t seed, bool pinned, bool replace,
                  const char *path, ls_adapter_info *info, ls_error *err);

/* A CPU backend (f32) with random base weights; *w13 and *w2 receive the
 * same weights in double for ls_ref_forward, [L][n*2F*H] and [L][n*H*F]
 * (caller frees them, and the backend with ls_backend_free). */
ls_backend *pt_cpu_create(ls_dims d, int S, int R, int max_tokens, uint64_t seed, double **w13, double **w2);

/* One layer of a as the reference wants it (double; the arrays are
 * malloc'd and released with pt_ref_lora_free). */
ls_ref_lora pt_ref_lora(const ls_dims *d, const ls_adapter *a, int layer);
void pt_ref_lora_free(ls_ref_lora *l);

#endif
