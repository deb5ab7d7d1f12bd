/* The failing backend (fault_backend.h): a test double of the private
 * backend table (hence gpu/backend_impl.h, as tests/util/pool_fixture.c's
 * fake) that forwards every operation to the wrapped backend through its
 * public entry points and fails the armed one. */
#include "tests/fault/fault_backend.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/backend_impl.h" /* the wrapper below is a backend */

struct fb_backend {
    ls_backend *be;    /* the wrapper; its ctx is this struct */
    ls_backend *inner; /* owned */
    /* One layer of garbage factors: what a failed slot write leaves. */
    float *junk[4];
    /* The pool serialises operations, but ls_backend_usable and the
     * tests' reads may come from any thread. */
    atomic_long calls, slot_changes, fail_at;
    atomic_bool counting, fired, sticky, poisoned;
};

static fb_backend *fb_of(const ls_backend *be) { return be->ctx; }

/* Counts one operation; LS_OK when it is to run, else err filled (and
 * *injected set when this is the armed failure, not a refusal). */
static ls_status fb_enter(fb_backend *fb, const char *op, bool changes_slot, bool *injected, ls_error *err) {
    if (injected) *injected = false;
    if (atomic_load(&fb->poisoned))
        return ls_error_set(err, LS_DEVICE_ERROR, NULL,
                            "fault backend: %s refused: the device is unusable after an earlier injected fault", op);
    if (!atomic_load(&fb->counting)) return LS_OK;
    long n = atomic_fetch_add(&fb->calls, 1) + 1;
    if (changes_slot) atomic_fetch_add(&fb->slot_changes, 1);
    if (n != atomic_load(&fb->fail_at)) return LS_OK;
    atomic_store(&fb->fired, true);
    if (injected) *injected = true;
    bool sticky = atomic_load(&fb->sticky);
    if (sticky) atomic_store(&fb->poisoned, true);
    return ls_error_set(err, LS_DEVICE_ERROR, NULL, "fault backend: injected %sdevice error in %s (operation %ld)",
                        sticky ? "sticky " : "", op, n);
}

static void fb_free_ctx(ls_backend *be) {
    fb_backend *fb = be->ctx;
    if (!fb) return;
    ls_backend_free(fb->inner);
    for (int b = 0; b < 4; b++) free(fb->junk[b]);
    free(fb);
    be->ctx = NULL;
}

static ls_status fb_memory(ls_backend *be, size_t *free_bytes, size_t *total_bytes, ls_error *err) {
    fb_backend *fb = fb_of(be);
    ls_status st = fb_enter(fb, "memory", false, NULL, err);
    return st != LS_OK ? st : ls_backend_memory(fb->inner, free_bytes, total_bytes, err);
}

static ls_status fb_upload_base(ls_backend *be, int layer, const ls_base_layer *w, ls_error *err) {
    fb_backend *fb = fb_of(be);
    ls_status st = fb_enter(fb, "upload_base", false, NULL, err);
    return st != LS_OK ? st : ls_backend_upload_base(fb->inner, layer, w, err);
}

/* A failed write leaves the layer half written, as a copy cut short on
 * a device would: garbage the pool must clear or never use. */
static ls_status fb_slot_write(ls_backend *be, int slot, int layer, const ls_slot_factors *f, ls_error *err) {
    fb_backend *fb = fb_of(be);
    bool injected;
    ls_status st = fb_enter(fb, "slot_write", true, &injected, err);
    if (st == LS_OK) return ls_backend_slot_write(fb->inner, slot, layer, f, err);
    if (injected) {
        ls_slot_factors junk = {fb->junk[0], fb->junk[1], fb->junk[2], fb->junk[3], NULL};
        ls_error ignored;
        ls_error_init(&ignored);
        ls_backend_slot_write(fb->inner, slot, layer, &junk, &ignored);
        ls_error_free(&ignored);
    }
    return st;
}

static ls_status fb_slot_clear(ls_backend *be, int slot, ls_error *err) {
    fb_backend *fb = fb_of(be);
    ls_status st = fb_enter(fb, "slot_clear", true, NULL, err);
    return st != LS_OK ? st : ls_backend_slot_clear(fb->inner, slot, err);
}

static ls_status fb_slot_read(ls_backend *be, int slot, int layer, float *gu_a, float *gu_b, float *d_a, float *d_b,
                              ls_error *err) {
    fb_backend *fb = fb_of(be);
    ls_status st = fb_enter(fb, "slot_read", false, NULL, err);
    return st != LS_OK ? st : ls_backend_slot_read(fb->inner, slot, layer, gu_a, gu_b, d_a, d_b, err);
}

/* The inner backend plans the call again from the tokens' slots. */
static ls_status fb_forward(ls_backend *be, int layer, const float *x, const float *gammas, const ls_token_plan *plan,
                            float *y, ls_error *err) {
    fb_backend *fb = fb_of(be);
    ls_status st = fb_enter(fb, "forward", false, NULL, err);
    if (st == LS_OK) return ls_backend_forward(fb->inner, layer, plan->T, x, gammas, plan->slot_of_token, y, err);
    for (size_t i = 0; i < (size_t)plan->T * (size_t)be->dims.H; i++) y[i] = NAN; /* a kernel that died midway */
    return st;
}

static ls_status fb_synchronize(ls_backend *be, ls_error *err) {
    fb_backend *fb = fb_of(be);
    ls_status st = fb_enter(fb, "synchronize", false, NULL, err);
    return st != LS_OK ? st : ls_backend_synchronize(fb->inner, err);
}

static bool fb_poisoned(const ls_backend *be) { return atomic_load(&fb_of(be)->poisoned); }

static const ls_backend_ops fb_ops = {
    .name = "fault",
    .free = fb_free_ctx,
    .memory = fb_memory,
    .upload_base = fb_upload_base,
    .slot_write = fb_slot_write,
    .slot_clear = fb_slot_clear,
    .slot_read = fb_slot_read,
    .forward = fb_forward,
    .synchronize = fb_synchronize,
    .poisoned = fb_poisoned,
};

fb_backend *fb_wrap(ls_backend *inner) {
    fb_backend *fb = calloc(1, sizeof *fb);
    assert_non_null(fb);
    fb->inner = inner;
    const ls_dims *d = ls_backend_dims(inner);
    const ls_pool_dims *pd = ls_backend_pool_dims(inner);
    size_t len[4] = {ls_pool_gu_a_len(d, pd), ls_pool_gu_b_len(d, pd), ls_pool_d_a_len(d, pd),
                     ls_pool_d_b_len(d, pd)};
    for (int b = 0; b < 4; b++) {
        fb->junk[b] = malloc(len[b] * sizeof(float));
        assert_non_null(fb->junk[b]);
        for (size_t i = 0; i < len[b]; i++) fb->junk[b][i] = 1e30f;
    }
    ls_backend_config cfg = {.dims = *d, .pool = *pd, .dtype = ls_backend_dtype(inner)};
    ls_error err;
    ls_error_init(&err);
    if (ls_backend_new(&fb_ops, &cfg, &fb->be, &err) != LS_OK) fail_msg("fault backend: %s", err.message);
    ls_error_free(&err);
    fb->be->ctx = fb;
    fb->be->pool_bytes = ls_backend_pool_bytes(inner);
    fb->be->isa = ls_backend_isa(inner);
    fb->be->threads = ls_backend_threads(inner);
    /* The inner backend holds the base weights; the wrapper's checks must
     * know which layers it holds. */
    memcpy(fb->be->uploaded, inner->uploaded, (size_t)d->L * sizeof *fb->be->uploaded);
    return fb;
}

ls_backend *fb_be(fb_backend *fb) { return fb->be; }
ls_backend *fb_inner(fb_backend *fb) { return fb->inner; }

void fb_free(fb_backend *fb) {
    if (fb) ls_backend_free(fb->be); /* its free op frees fb and inner */
}

void fb_arm(fb_backend *fb, long n, bool sticky) {
    atomic_store(&fb->calls, 0);
    atomic_store(&fb->slot_changes, 0);
    atomic_store(&fb->fired, false);
    atomic_store(&fb->fail_at, n);
    atomic_store(&fb->sticky, sticky);
    atomic_store(&fb->counting, true);
}

void fb_disarm(fb_backend *fb) {
    atomic_store(&fb->counting, false);
    atomic_store(&fb->fail_at, 0);
}

long fb_calls(const fb_backend *fb) { return atomic_load(&fb->calls); }
long fb_slot_changes(const fb_backend *fb) { return atomic_load(&fb->slot_changes); }
bool fb_fired(const fb_backend *fb) { return atomic_load(&fb->fired); }
