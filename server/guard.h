/* The connection guard: what libmicrohttpd 0.9.75 lacks against clients
 * that hold connections open. Its --connection-timeout is an idle
 * timeout, which a byte every few seconds resets forever; the guard puts
 * deadlines on the head and the body of each request, kept by a reaper
 * thread that answers 408 and shuts the socket down. And it counts
 * connections per address itself, with a reserve past
 * --per-ip-connections and --max-connections that serves only /health
 * and /ready, so an address that holds its cap (a proxy, a NAT) is still
 * probed. http.c calls it from libmicrohttpd's callbacks. */
#ifndef LS_SERVER_GUARD_H
#define LS_SERVER_GUARD_H

#include <stdbool.h>
#include <sys/socket.h>

#include "server/metrics.h"

/* Connections an address may open past --per-ip-connections, and the
 * server past --max-connections, for probes only. */
#define LS_GUARD_RESERVE_PER_IP 4
#define LS_GUARD_RESERVE_TOTAL 16
/* A reserve connection's head must come within this of its accept (or
 * --request-timeout when shorter), idle or not: a probe sends it at
 * once. */
#define LS_GUARD_RESERVE_HEAD_S 5

typedef struct ls_guard ls_guard;
typedef struct ls_guard_conn ls_guard_conn;

typedef struct {
    int request_timeout_s; /* a head's first byte to its end */
    int body_timeout_s;    /* a head's end to its body's */
    int per_ip;            /* --per-ip-connections; 0 = no cap */
    int max_connections;
    bool access_log; /* a 408 gets its access log line (--access-log) */
    bool tls;        /* the sockets carry TLS records: no 408 is written raw, the connection is only closed */
} ls_guard_config;

/* Starts the reaper. metrics is borrowed and outlives the guard. NULL
 * (logged) when the thread cannot start. */
ls_guard *ls_guard_new(const ls_guard_config *cfg, ls_metrics *metrics);
/* Stops the reaper and frees the guard; every connection must have been
 * closed (after MHD_stop_daemon). NULL is a no-op. */
void ls_guard_free(ls_guard *g);

/* libmicrohttpd's accept policy: false refuses (closes) a connection from
 * an address that holds its cap and its reserve. */
bool ls_guard_admit(ls_guard *g, const struct sockaddr *addr, socklen_t len);
/* MHD_CONNECTION_NOTIFY_STARTED: the connection on fd from addr begins,
 * waiting for a request. NULL when out of memory (the socket is then
 * shut down, so the connection ends at once). Owned by the guard until
 * ls_guard_close. */
ls_guard_conn *ls_guard_open(ls_guard *g, int fd, const struct sockaddr *addr);
/* MHD_CONNECTION_NOTIFY_CLOSED, while fd is still open: forgets c. */
void ls_guard_close(ls_guard *g, ls_guard_conn *c);

/* The steps of each request on c, from libmicrohttpd's threads. The
 * request line came (its head's clock runs, if no byte had started it). */
void ls_guard_request_line(ls_guard *g, ls_guard_conn *c);
/* The head came whole: the body's clock starts. id (its X-Request-Id),
 * what (the method and path as the log shows them), who (the key's id
 * as the access log shows it) and route (a static metrics label) name
 * the request in a timeout's reply, log lines and metrics. False when
 * the reaper took the connection first: answer nothing, close it. */
bool ls_guard_head_done(ls_guard *g, ls_guard_conn *c, const char *id, const char *what, const char *who,
                        const char *route);
/* The body came whole, or a reply is about to be queued: no deadline
 * any more (the server's own work is not bounded here). False as above. */
bool ls_guard_body_done(ls_guard *g, ls_guard_conn *c);
/* The request ended and the connection stays: waiting for the next. */
void ls_guard_request_done(ls_guard *g, ls_guard_conn *c);
/* Taken from the reserve: it may serve a probe, once. */
bool ls_guard_reserved(const ls_guard_conn *c);
/* The client's address as text ("?" when c is NULL or it is not IP). */
void ls_guard_peer(const ls_guard_conn *c, char *out, size_t len);
/* A slot of c for the TLS layer's state of the connection (server/tls.h),
 * NULL until it sets it; the guard never reads it. */
void **ls_guard_tls_slot(ls_guard_conn *c);

#endif
