/* Test hooks of the pool: hold a version exactly as an in-flight forward
 * does (resolve and count a reference under the pool lock), without
 * running anything, so tests can delete or replace under it. */
#ifndef LS_LORA_POOL_DEBUG_H
#define LS_LORA_POOL_DEBUG_H

#include "lora/pool.h"

typedef struct ls_pool_entry ls_pool_hold;

/* Takes a reference to the current version of name; LS_ADAPTER_NOT_FOUND
 * when unknown. *out must be given back with ls_pool_debug_release. */
ls_status ls_pool_debug_hold(ls_pool *p, const char *name, ls_pool_hold **out, ls_error *err);
/* Drops the reference; the last one of a deleted or replaced version frees
 * it and its slot. */
void ls_pool_debug_release(ls_pool *p, ls_pool_hold *h);

#endif
