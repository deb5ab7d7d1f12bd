/* HTTP statuses and the route hint: what the server answers for a status
 * of the table (common/status.h), kept here so that no code outside
 * server/ branches on HTTP. */
#ifndef LS_SERVER_HTTP_STATUS_H
#define LS_SERVER_HTTP_STATUS_H

#include "common/status.h"

/* The HTTP status of s (500 for one outside the table). */
int ls_http_status(ls_status s);

/* The hint of a request for no route: the routes a client can call. */
extern const char ls_http_routes_hint[];

#endif
