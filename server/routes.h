/* The route table: which handler serves a method and path, whether it
 * needs the API key and reads a body, and what a path known only under
 * other methods allows. Pure lookups over a static table. */
#ifndef LS_SERVER_ROUTES_H
#define LS_SERVER_ROUTES_H

#include <stdbool.h>
#include <stddef.h>

#include "server/request.h"

typedef void (*ls_handler_fn)(const ls_request *req, ls_reply *r);

/* Where a step of a request runs. Requests that may wait on the backend
 * and requests that never do are queued apart: one that never does must
 * not wait behind loads that wait for a seconds-long forward. */
typedef enum {
    LS_RUN_HTTP,    /* the HTTP thread: the step never waits */
    LS_RUN_DISK,    /* a disk worker (srv->offload_disk): may read files, never waits on the backend */
    LS_RUN_BACKEND, /* a backend worker (srv->offload): may wait on the backend or a lock held across it */
} ls_run_on;

/* The steps of a request once its body is whole, each on its thread,
 * and how it completes; every one ends with the reply sent from the
 * HTTP thread (resumed, when a step ran elsewhere). */
typedef enum {
    LS_STEPS_HANDLER, /* fn on `on` */
    LS_STEPS_LOAD,    /* POST /adapters: validated on a disk worker, registered on a backend worker */
    LS_STEPS_FORWARD, /* with the batcher: parsed on the HTTP thread, adapters to auto-load read on a disk
                       * worker and registered on a backend worker, computed in the batcher, completed on
                       * the HTTP thread; without it, fn on `on` */
} ls_route_steps;

typedef struct {
    const char *method;
    const char *pattern; /* "/adapters/{name}" matches one non-empty segment */
    ls_handler_fn fn;
    bool open;     /* served without the API key */
    bool has_body; /* POST with a JSON or safetensors body */
    bool probe;    /* served on a connection past the connection caps (the reserve) */
    ls_route_steps steps;
    ls_run_on on; /* where fn runs */
} ls_route;

/* The route serving method on path (HEAD is served by GET routes), or
 * NULL. On a match param receives the {name} segment ("" when the pattern
 * has none); allow always receives the other methods the path is known
 * under ("GET, DELETE"; "" when none), so NULL with allow[0] means 405.
 * The route is static. */
const ls_route *ls_route_find(const char *method, const char *path, char *param, size_t plen, char *allow,
                              size_t alen);

/* The pattern of the first route whose path matches under any method, or
 * "other" when none does: the metrics label of a request no route serves
 * (405 or 404). Static. */
const char *ls_route_label(const char *path);

#endif
