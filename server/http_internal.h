/* Between the request handler (http.c) and the daemon that calls it
 * (http_daemon.c): libmicrohttpd's per-request callbacks, the guard's
 * state of a connection, and the seed of request ids. */
#ifndef LS_SERVER_HTTP_INTERNAL_H
#define LS_SERVER_HTTP_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>

#include <microhttpd.h>

#include "server/guard.h"

/* MHD_AccessHandlerCallback, MHD_OPTION_NOTIFY_COMPLETED and
 * MHD_OPTION_URI_LOG_CALLBACK; cls is the ls_server. */
enum MHD_Result ls_http_handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                const char *version, const char *upload_data, size_t *upload_data_size,
                                void **con_cls);
void ls_http_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe);
void *ls_http_uri_seen(void *cls, const char *uri, struct MHD_Connection *conn);

/* The guard's state of conn (its socket context), or NULL. */
ls_guard_conn *ls_http_guard_conn(struct MHD_Connection *conn);

/* The state request ids are drawn from; seeded at start. */
extern atomic_ullong ls_http_id_state;

#endif
