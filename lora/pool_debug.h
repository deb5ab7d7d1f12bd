/* Test hooks of the pool: hold a version exactly as an in-flight forward
 * does (resolve and count a reference under the pool lock), without
 * running anything, so tests can delete or replace under it, and read
 * its copy back afterwards as the forward would. */
#ifndef LS_LORA_POOL_DEBUG_H
#define LS_LORA_POOL_DEBUG_H

#include "lora/pool.h"

typedef struct ls_pool_entry ls_pool_hold;

/* Takes a reference to the current version of name; LS_ADAPTER_NOT_FOUND
 * when unknown. *out must be given back with ls_pool_debug_release. */
ls_status ls_pool_debug_hold(ls_pool *p, const char *name, ls_pool_hold **out, ls_error *err);
/* Gives the held version its host copy as a forward does before its
 * group runs: read back (from the state directory or its source) when
 * it has none. */
ls_status ls_pool_debug_read_back(ls_pool *p, ls_pool_hold *h, ls_error *err);
/* Drops the reference; the last one of a deleted or replaced version frees
 * it and its slot. */
void ls_pool_debug_release(ls_pool *p, ls_pool_hold *h);

#endif
