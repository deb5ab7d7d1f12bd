/* --auto-load: a forward that names an adapter nobody registered, found in
 * the adapter directory as NAME/ (PEFT) or NAME.safetensors, registers it
 * first. One load per name at a time (concurrent requests wait for it);
 * a file that failed is not read again until it changes. */
#ifndef LS_LORA_AUTOLOAD_H
#define LS_LORA_AUTOLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "lora/loader.h"
#include "lora/pool.h"

typedef struct ls_autoload ls_autoload;

/* Told of every load as it starts (+1) and ends (-1), from whichever
 * thread runs it: the server's loads gauge. */
typedef struct {
    void (*fn)(void *ctx, int delta);
    void *ctx; /* borrowed */
} ls_autoload_gauge;

/* How an auto-load registers the adapter it read, on the thread that
 * registers it, for the actor of the call that does (the one given to
 * ls_autoload_ensure_by or ls_autoload_finish_by; NULL from the plain
 * calls): the server's quota check, registration and audit line in one
 * step, so that a quota is checked where the place is taken. Takes *a
 * and fills info as ls_pool_load does. fn NULL: ls_pool_load itself. */
typedef struct {
    ls_status (*fn)(void *ctx, const void *actor, const char *name, ls_adapter *a, const ls_pool_load_opts *opts,
                    ls_adapter_info *info, ls_error *err);
    void *ctx; /* borrowed */
} ls_autoload_registrar;

/* Over ld and pool (borrowed, outliving it); gauge may be NULL; strict as
 * --strict-adapters. Free with ls_autoload_free. */
ls_status ls_autoload_create(const ls_loader *ld, ls_pool *pool, const ls_autoload_gauge *gauge, bool strict,
                             ls_autoload **out, ls_error *err);
void ls_autoload_free(ls_autoload *al);
/* Sets the registrar, before the first load (NULL or fn NULL: none). */
void ls_autoload_set_registrar(ls_autoload *al, const ls_autoload_registrar *registrar);

/* Makes name registered: LS_OK when it is already, or once it was loaded
 * from the adapter directory (by this call or by one it waited for).
 * LS_ADAPTER_NOT_FOUND when the directory holds neither NAME/ nor
 * NAME.safetensors; a file that fails validation gives its error (err),
 * remembered with the file's identity, size and time, and given again
 * without reading the file until one of them changes. An adapter read
 * by ls_autoload_read and waiting to be registered is registered first,
 * whatever the pool or the directory hold now (a name a client
 * registered meanwhile keeps the client's adapter). May read the disk,
 * wait for another request's load and wait for the backend. */
ls_status ls_autoload_ensure(ls_autoload *al, const char *name, ls_error *err);
/* ls_autoload_ensure on behalf of actor (borrowed; handed to the audit
 * hook when this call registers the adapter). */
ls_status ls_autoload_ensure_by(ls_autoload *al, const char *name, const void *actor, ls_error *err);

/* What is left to do before name is registered. */
typedef enum {
    LS_AUTOLOAD_READY, /* nothing: name is registered (or the answer is an error) */
    LS_AUTOLOAD_READ,  /* its files are to be read: ls_autoload_read, then ls_autoload_ensure */
    LS_AUTOLOAD_LOAD,  /* this ls_autoload_read read them: ls_autoload_ensure registers them */
    LS_AUTOLOAD_WAIT,  /* another request reads or registers them: ls_autoload_ensure waits or finishes */
} ls_autoload_need;

/* What is left, without reading a file or waiting: the answers that come
 * at once (a name with no files, LS_ADAPTER_NOT_FOUND; a failure
 * remembered for these very files, its error) are given here, so a
 * thread that must never wait can still give them. */
ls_status ls_autoload_check(ls_autoload *al, const char *name, ls_autoload_need *need, ls_error *err);

/* The first half of a load, for a thread that may read the disk but must
 * not wait for the backend or for other requests: when name's files are
 * to be read, reads and validates them. A bad file is answered here (its
 * error, remembered); a good one is kept for the next ls_autoload_ensure
 * of name, which registers it (need LS_AUTOLOAD_LOAD). */
ls_status ls_autoload_read(ls_autoload *al, const char *name, ls_autoload_need *need, ls_error *err);

/* The second half alone, for a forward whose answer is an error already
 * (another of its adapters failed): registers name's adapter when one
 * was read and waits to be registered (its outcome), else does nothing
 * (LS_OK). Never reads a file nor waits for another request's load; may
 * wait for the backend. A forward that read an adapter calls this or
 * ls_autoload_ensure for it, so none is left read and never registered. */
ls_status ls_autoload_finish(ls_autoload *al, const char *name, ls_error *err);
/* ls_autoload_finish on behalf of actor, as ls_autoload_ensure_by. */
ls_status ls_autoload_finish_by(ls_autoload *al, const char *name, const void *actor, ls_error *err);

/* Loads attempted (files read) since start: what the failure memory saves. */
unsigned long long ls_autoload_attempts(const ls_autoload *al);

#endif
