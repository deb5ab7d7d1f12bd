/* The route table: which handler serves a method and path, whether it
 * needs the API key and reads a body, and what a path known only under
 * other methods allows. Pure lookups over a static table. */
#ifndef LS_SERVER_ROUTES_H
#define LS_SERVER_ROUTES_H

#include <stdbool.h>
#include <stddef.h>

#include "server/request.h"

typedef void (*ls_handler_fn)(const ls_request *req, ls_reply *r);

/* Where a route's handler runs. Requests that may wait on the backend and
 * requests that never do are queued apart: one that never does must not
 * wait behind loads that wait for a seconds-long forward. */
typedef enum {
    LS_ROUTE_INLINE,  /* on the HTTP thread: it never waits */
    LS_ROUTE_BACKEND, /* may wait on the backend or a lock held across it: srv->offload */
    LS_ROUTE_DISK,    /* may read the disk but never waits on the backend: srv->offload_disk */
    LS_ROUTE_LOAD,    /* POST /adapters: validated as DISK, then registered as BACKEND */
} ls_route_offload;

typedef struct {
    const char *method;
    const char *pattern; /* "/adapters/{name}" matches one non-empty segment */
    ls_handler_fn fn;
    bool open;     /* served without the API key */
    bool has_body; /* POST with a JSON or safetensors body */
    ls_route_offload offload; /* not LS_ROUTE_INLINE: runs on an offload worker, the connection suspended */
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
