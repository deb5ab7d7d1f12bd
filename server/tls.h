/* HTTPS in the server itself (--tls-cert, --tls-key, --tls-client-ca):
 * the certificate, key and client CAs read from their PEM files, handed to
 * each new connection, and re-read when the files change. libmicrohttpd
 * runs the TLS (GnuTLS); this owns what it runs with. */
#ifndef LS_SERVER_TLS_H
#define LS_SERVER_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"

struct MHD_Connection;
struct MHD_OptionItem;
typedef struct ls_tls ls_tls;

/* The protocol versions served: TLS 1.2 and 1.3, nothing older. */
#define LS_TLS_PRIORITIES "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"
/* How often the files are looked at for a change, milliseconds. */
#define LS_TLS_WATCH_MS 1000
/* Room ls_tls_daemon_options needs, its MHD_OPTION_END included. */
#define LS_TLS_OPTIONS_MAX 6

/* Reads cfg's tls_cert, tls_key and tls_client_ca (cfg->tls_cert is not
 * "") and starts watching them. NULL after logging which file is wrong
 * and why. The caller owns the result (ls_tls_free). */
ls_tls *ls_tls_open(const ls_config *cfg);

/* Stops the watcher and frees every credential ever loaded; after the
 * daemon is stopped (a connection may use any of them until then). NULL
 * is a no-op. */
void ls_tls_free(ls_tls *tls);

/* libmicrohttpd's TLS options for MHD_OPTION_ARRAY into ops (room for
 * LS_TLS_OPTIONS_MAX), ending with MHD_OPTION_END; the strings they
 * point at are tls's until ls_tls_free. */
void ls_tls_daemon_options(ls_tls *tls, struct MHD_OptionItem *ops);

/* For a connection just accepted (MHD_CONNECTION_NOTIFY_STARTED, before
 * its handshake): gives it the credentials loaded last and, with client
 * CAs, requires a client certificate that chains to one of them. *slot
 * (the connection's, NULL before) then holds what the connection uses,
 * until ls_tls_connection_closed; when the session cannot be had the
 * socket is shut down, so no connection goes on without them. */
void ls_tls_connection_started(ls_tls *tls, struct MHD_Connection *conn, int fd, void **slot);

/* MHD_CONNECTION_NOTIFY_CLOSED: the connection's TLS session is gone;
 * slot is what ls_tls_connection_started put in it (NULL: nothing). The
 * credentials replaced by a reload are freed when their last connection
 * closes. */
void ls_tls_connection_closed(ls_tls *tls, void *slot);

/* For libmicrohttpd's log callback, on its generic line of a failed
 * handshake: true when this thread has just logged why (a refused client
 * certificate, with the client's address), so the generic line is not
 * needed. Consumes what it reports. */
bool ls_tls_refusal_logged(void);

/* " (TLS)" or " (TLS, client certificates required)", for the start-up
 * log line; static. */
const char *ls_tls_describe(const ls_tls *tls);

#endif
