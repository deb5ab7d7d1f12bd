/* A failing backend for the fault tests: an ls_backend whose operations
 * forward to a real one (the CPU backend, or any other) and fail the Nth
 * call when armed, as a device fails: LS_DEVICE_ERROR with a message, a
 * slot write that fails leaves its layer half written (garbage in the
 * inner slot), a forward that fails leaves y garbage. A sticky fault
 * poisons it like a CUDA context after an illegal address: every later
 * operation fails and ls_backend_usable answers false (the CUDA backend's
 * ls_cuda_op_begin and its poisoned op, gpu/cuda/). */
#ifndef LS_TESTS_FAULT_BACKEND_H
#define LS_TESTS_FAULT_BACKEND_H

#include <stdbool.h>

#include "gpu/backend.h"

typedef struct fb_backend fb_backend;

/* Wraps inner (taken: freed with the wrapper). The wrapper has inner's
 * dimensions, pool, dtype and uploaded layers. Fails the test on error. */
fb_backend *fb_wrap(ls_backend *inner);
/* The wrapper as a backend (for the pool, the server). */
ls_backend *fb_be(fb_backend *fb);
/* The wrapped backend: reads that must not count (the tests' checks). */
ls_backend *fb_inner(fb_backend *fb);
/* Frees the wrapper and inner. NULL is a no-op. */
void fb_free(fb_backend *fb);

/* Starts counting operations from zero; the nth from now (1-based) fails,
 * sticky or not. n = 0 counts without failing. */
void fb_arm(fb_backend *fb, long n, bool sticky);
/* Stops counting and failing (a poisoned backend stays poisoned). */
void fb_disarm(fb_backend *fb);
/* Operations since the last fb_arm, and of those the slot writes and
 * clears (the ones that change what a slot holds). */
long fb_calls(const fb_backend *fb);
long fb_slot_changes(const fb_backend *fb);
/* True when the armed failure happened since the last fb_arm. */
bool fb_fired(const fb_backend *fb);

#endif
