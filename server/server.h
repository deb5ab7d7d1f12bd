/* The running server: configuration, model, backend, pool and metrics,
 * shared by the HTTP layer and the handlers. */
#ifndef LS_SERVER_SERVER_H
#define LS_SERVER_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dims.h"
#include "config/config.h"
#include "gpu/backend.h"
#include "lora/loader.h"
#include "lora/pool.h"
#include "model/model.h"
#include "server/metrics.h"

struct MHD_Daemon;
struct ls_autoload;
struct ls_batcher;
struct ls_offload;
struct ls_tls;
struct ls_tenants;

typedef struct ls_server {
    ls_config cfg;
    ls_dims dims;         /* its layer_ids are model's */
    ls_model model;       /* what was loaded (GET /model); its files are closed after the upload */
    ls_pool_dims pool_dims;
    ls_backend *backend; /* owned */
    ls_loader loader;    /* adapter directory and shapes: every adapter load goes through it */
    ls_state *state;     /* owned; NULL without --state-dir */
    ls_pool *pool;       /* owned */
    struct ls_autoload *autoload; /* owned; NULL without --auto-load */
    struct ls_batcher *batcher; /* owned; NULL with --batching false */
    struct ls_offload *offload; /* owned: runs the requests that may wait on the backend (server/offload.h) */
    struct ls_offload *offload_disk; /* owned: runs validations, which read but never wait on the backend */
    ls_metrics metrics;
    struct ls_tenants *tenants; /* owned; NULL without --api-keys (server/tenant.h) */
    struct MHD_Daemon *daemon;
    struct ls_guard *guard; /* owned while the daemon runs: connection deadlines and counts (server/guard.h) */
    struct ls_tls *tls;     /* owned; NULL without --tls-cert (server/tls.h) */
    int port;
    atomic_int active;    /* requests being handled, for graceful shutdown */
    atomic_int suspended; /* connections parked for the batcher or an offload worker, not yet resumed */
    atomic_int dispatching; /* requests an HTTP thread is computing the reply of */
    atomic_bool stopping; /* shutdown began: no new suspensions, Connection: close */
} ls_server;

/* Builds the model, backend and pool from cfg (cfg is copied). Errors are
 * logged; returns false and leaves nothing allocated. */
bool ls_server_init(ls_server *srv, const ls_config *cfg);
/* The same on a backend the caller made (be NULL: the one cfg asks for,
 * as ls_server_init): a test double, or a backend of its own. The server
 * takes be, on failure too (freed with the server), and uploads the
 * model's base weights into it, so be must be made for the model's
 * dimensions and for the pool cfg gives (slots, max rank, LoRA layout,
 * max batch tokens); it keeps its own weight dtype, and cfg's device,
 * threads and kernel path are not read. A backend made for anything else
 * stops start-up with a log line naming both. */
bool ls_server_init_with_backend(ls_server *srv, const ls_config *cfg, ls_backend *be);
void ls_server_free(ls_server *srv);

/* Whether cfg's address and port can be bound now: false, logged, when
 * another process holds the port for 5 s (an older server draining lets
 * go sooner), or it is privileged and we are not.
 * Called before the weights load, which can take minutes, so that a
 * taken port is said at once; ls_http_start binds for real later. */
bool ls_http_probe(const ls_config *cfg);
/* Starts listening (port 0 = ephemeral; srv->port gets the real one). */
bool ls_http_start(ls_server *srv);
/* Stops accepting, waits for the requests in flight, stops the daemon. */
void ls_http_stop(ls_server *srv);

#endif
