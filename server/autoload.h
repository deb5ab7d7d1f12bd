/* --auto-load: a forward that names an adapter nobody registered, found in
 * the adapter directory as NAME/ (PEFT) or NAME.safetensors, registers it
 * first. One load per name at a time (concurrent requests wait for it);
 * a file that failed is not read again until it changes. */
#ifndef LS_SERVER_AUTOLOAD_H
#define LS_SERVER_AUTOLOAD_H

#include <stdbool.h>

#include "common/error.h"
#include "lora/loader.h"
#include "lora/pool.h"
#include "server/metrics.h"

typedef struct ls_autoload ls_autoload;

/* Over ld, pool and metrics (borrowed, outliving it; loads are counted
 * in the loads gauge); strict as --strict-adapters. Free with ls_autoload_free. */
ls_status ls_autoload_create(const ls_loader *ld, ls_pool *pool, ls_metrics *metrics, bool strict, ls_autoload **out,
                             ls_error *err);
void ls_autoload_free(ls_autoload *al);

/* Makes name registered: LS_OK when it is already, or once it was loaded
 * from the adapter directory (by this call or by one it waited for).
 * LS_ADAPTER_NOT_FOUND when the directory holds neither NAME/ nor
 * NAME.safetensors; a file that fails validation gives its error (err),
 * remembered with the file's identity, size and time, and given again
 * without reading the file until one of them changes. */
ls_status ls_autoload_ensure(ls_autoload *al, const char *name, ls_error *err);

/* What ls_autoload_ensure(al, name) would have to do. */
typedef enum {
    LS_AUTOLOAD_READY, /* nothing: name is registered (or the answer is an error) */
    LS_AUTOLOAD_LOAD,  /* read name's files and register them */
    LS_AUTOLOAD_WAIT,  /* wait for the load of name another request is running */
} ls_autoload_need;

/* What ls_autoload_ensure would do, without reading a file or waiting:
 * the answers that come at once (a name with no files, LS_ADAPTER_NOT_FOUND;
 * a failure remembered for these very files, its error) are given here,
 * so a thread that must never wait can still give them. */
ls_status ls_autoload_check(ls_autoload *al, const char *name, ls_autoload_need *need, ls_error *err);

/* Loads attempted (files read) since start: what the failure memory saves. */
unsigned long long ls_autoload_attempts(const ls_autoload *al);

#endif
