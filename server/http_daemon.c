/* Starting and stopping the libmicrohttpd daemon, and its callbacks that
 * are about connections rather than one request: the logger, the
 * unescaper, the accept policy and the connection notifier (both the
 * guard's, server/guard.h). A stop finishes every reply the server owes
 * before it closes the rest. The requests themselves are http.c's. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "common/log.h"
#include "common/text.h"
#include "server/guard.h"
#include "server/http_internal.h"
#include "server/server.h"
#include "server/tls.h"

/* How often a held port is asked again before start-up stops: 5 s in
 * steps of 250 ms. */
#define LS_HTTP_PROBE_TRIES 20

/* During a stop, how long a reply the server has just finished gets to go
 * out before the connections still open past --shutdown-timeout are
 * closed: a send of a few MB to a client that reads. */
#define LS_HTTP_FLUSH_MS 2000

/* Whether a message of libmicrohttpd (0.9.75's wording) says a client
 * went away mid-request: the client's doing (or the deadline reaper's,
 * which logged its own warning). Its running short of memory is not. */
static bool ls_http_client_gone(const char *msg) {
    static const char *const whole[] = {"Socket has been disconnected when reading request.",
                                        "Connection was closed by remote side with incomplete request.", NULL};
    static const char closed[] = "Connection socket is closed when reading request due to the error: ";
    static const char *const why[] = {"The connection was forcibly closed by remote peer",
                                      "The socket is not connected", "detected connection closure", NULL};
    for (int i = 0; whole[i]; i++)
        if (!strcmp(msg, whole[i])) return true;
    if (strncmp(msg, closed, sizeof closed - 1)) return false;
    for (int i = 0; why[i]; i++)
        if (!strcmp(msg + sizeof closed - 1, why[i])) return true;
    return false;
}

static void ls_http_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512], shown[3 * sizeof msg];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t l = strlen(msg);
    while (l && (msg[l - 1] == '\n' || msg[l - 1] == '\r')) msg[--l] = '\0';
    /* libmicrohttpd says this of every failed TLS handshake: a client's
     * doing, told as such, unless server/tls.c has just said why (a
     * refused certificate, with the client's address). */
    if (!strcmp(msg, "Error: received handshake message out of context.")) {
        if (ls_tls_refusal_logged()) return;
        ls_log_info("tls: a handshake failed: the client spoke plain HTTP to this HTTPS port, is not TLS 1.2 or "
                    "later, refused the certificate, or gave no valid client certificate");
        return;
    }
    /* Its messages quote the request (a decoded URL among them). */
    ls_text_log_field(msg, true, shown, sizeof shown);
    if (ls_http_client_gone(msg)) {
        ls_log_info("microhttpd: %s", shown);
        return;
    }
    ls_log_warn("microhttpd: %s", shown);
}

/* %XX escapes of the path and the query decoded in place, except %00:
 * a NUL byte would cut a name short in every C string after this (as
 * "a%00evil" would register "a"), so it stays written as %00, which no
 * adapter name may hold. Returns the new length. */
static size_t ls_http_unescape(void *cls, struct MHD_Connection *conn, char *s) {
    (void)cls, (void)conn;
    char *out = s;
    for (const char *in = s; *in; in++) {
        int hi = -1, lo = -1;
        if (in[0] == '%' && in[1] && in[2]) {
            hi = isxdigit((unsigned char)in[1]) ? (isdigit((unsigned char)in[1]) ? in[1] - '0' : (in[1] | 32) - 'a' + 10) : -1;
            lo = isxdigit((unsigned char)in[2]) ? (isdigit((unsigned char)in[2]) ? in[2] - '0' : (in[2] | 32) - 'a' + 10) : -1;
        }
        if (hi >= 0 && lo >= 0 && (hi | lo) != 0) {
            *out++ = (char)(hi * 16 + lo);
            in += 2;
        } else {
            *out++ = *in;
        }
    }
    *out = '\0';
    return (size_t)(out - s);
}

/* The accept policy: an address past its cap and the reserve is closed
 * at once, as libmicrohttpd's own per-address limit did. */
static enum MHD_Result ls_http_admit(void *cls, const struct sockaddr *addr, socklen_t len) {
    ls_server *srv = cls;
    return ls_guard_admit(srv->guard, addr, len) ? MHD_YES : MHD_NO;
}

/* MHD_OPTION_NOTIFY_CONNECTION: each connection is the guard's from its
 * start to its end (the socket is still open when it ends). */
static void ls_http_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                           enum MHD_ConnectionNotificationCode toe) {
    ls_server *srv = cls;
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (srv->tls && *socket_context) ls_tls_connection_closed(srv->tls, *ls_guard_tls_slot(*socket_context));
        ls_guard_close(srv->guard, *socket_context);
        *socket_context = NULL;
        return;
    }
    const union MHD_ConnectionInfo *fd = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *addr = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (fd && addr) *socket_context = ls_guard_open(srv->guard, fd->connect_fd, addr->client_addr);
    /* Unguarded (NULL), the socket is already shut down. */
    if (srv->tls && *socket_context)
        ls_tls_connection_started(srv->tls, conn, fd->connect_fd, ls_guard_tls_slot(*socket_context));
}

/* cfg's host and port as the address to bind (numeric only), into *ai
 * (the caller's freeaddrinfo); getaddrinfo's code, 0 on success. */
static int ls_http_resolve(const ls_config *cfg, struct addrinfo **ai) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_PASSIVE};
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    *ai = NULL;
    return getaddrinfo(cfg->host, port, &hints, ai);
}

/* One bind of ai's address as libmicrohttpd binds it; the errno of a
 * failure, 0 when it could be bound (or could not be tried). */
static int ls_http_try_bind(const struct addrinfo *ai) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    /* A port in TIME_WAIT is not taken, and an IPv6 address is bound
     * without IPv4 (no MHD_USE_DUAL_STACK). */
    const int on = 1;
    int e = 0;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) == 0 &&
        (ai->ai_family != AF_INET6 || setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on) == 0) &&
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0)
        e = errno;
    close(fd);
    return e;
}

bool ls_http_probe(const ls_config *cfg) {
    if (cfg->port == 0) return true; /* any free port: nothing to be taken */
    struct addrinfo *ai;
    if (ls_http_resolve(cfg, &ai)) return true; /* ls_http_start says why */
    /* An older server may still be draining on the port: it lets go once
     * its requests end, so a held port is asked again for a while. */
    int e = ls_http_try_bind(ai);
    for (int tries = 0; e == EADDRINUSE && tries < LS_HTTP_PROBE_TRIES; tries++) {
        nanosleep(&(struct timespec){.tv_nsec = 250 * 1000 * 1000}, NULL);
        e = ls_http_try_bind(ai);
    }
    freeaddrinfo(ai);
    /* Only what will surely fail again: the rest ls_http_start says. */
    if (e != EADDRINUSE && e != EACCES) return true;
    char ebuf[128];
    ls_log_error("cannot listen on %s:%d: %s%s (checked before the weights load)", cfg->host, cfg->port,
                 strerror_r(e, ebuf, sizeof ebuf),
                 e == EADDRINUSE ? ": another process has held the port for 5 s (an older server?); stop it or give "
                                   "--port"
                                 : "");
    return false;
}

bool ls_http_start(ls_server *srv) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    atomic_store(&ls_http_id_state, (unsigned long long)now.tv_sec * 1000000007ULL ^
                                        (unsigned long long)now.tv_nsec << 20 ^ (unsigned long long)getpid());
    struct addrinfo *ai;
    int gai = ls_http_resolve(&srv->cfg, &ai);
    if (gai) {
        ls_log_error("--host %s is not a numeric IPv4 or IPv6 address: %s", srv->cfg.host, gai_strerror(gai));
        return false;
    }
    /* A pool of threads, each polling its share of the connections. Not
     * epoll: in libmicrohttpd 0.9.75 MHD_quiesce_daemon on a thread pool of
     * epoll sets can race a worker and abort the process ("Failed to remove
     * listen FD from epoll set"), which broke graceful shutdown. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG |
                     MHD_ALLOW_SUSPEND_RESUME;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* HTTPS: the certificate options, or none (server/tls.h). */
    struct MHD_OptionItem tls_ops[LS_TLS_OPTIONS_MAX] = {{MHD_OPTION_END, 0, NULL}};
    if (srv->tls) {
        flags |= MHD_USE_TLS;
        ls_tls_daemon_options(srv->tls, tls_ops);
    }
    unsigned pool = (unsigned)srv->cfg.http_threads;
    /* The logger first, so MHD routes every message through it. */
    /* The guard counts connections per address (libmicrohttpd's own
     * limit has no reserve for probes) and keeps the deadlines. */
    const ls_guard_config gcfg = {.request_timeout_s = srv->cfg.request_timeout_s,
                                  .body_timeout_s = srv->cfg.body_timeout_s,
                                  .per_ip = srv->cfg.per_ip_connections,
                                  .max_connections = srv->cfg.max_connections,
                                  .access_log = srv->cfg.access_log,
                                  .tls = srv->tls != NULL};
    if (!(srv->guard = ls_guard_new(&gcfg, &srv->metrics))) {
        freeaddrinfo(ai);
        return false;
    }
    srv->daemon = MHD_start_daemon(
        flags, (uint16_t)srv->cfg.port, ls_http_admit, srv, ls_http_handler, srv, MHD_OPTION_EXTERNAL_LOGGER,
        ls_http_log, NULL, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_THREAD_POOL_SIZE, pool,
        MHD_OPTION_NOTIFY_COMPLETED, ls_http_completed, srv, MHD_OPTION_NOTIFY_CONNECTION, ls_http_notify, srv,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->cfg.max_connections + LS_GUARD_RESERVE_TOTAL,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)srv->cfg.connection_timeout_s, MHD_OPTION_UNESCAPE_CALLBACK,
        ls_http_unescape, NULL, MHD_OPTION_URI_LOG_CALLBACK, ls_http_uri_seen, srv, MHD_OPTION_ARRAY, tls_ops,
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!srv->daemon) {
        ls_log_error("cannot listen on %s:%d (in use, or not an address of this machine)", srv->cfg.host, srv->cfg.port);
        ls_guard_free(srv->guard);
        srv->guard = NULL;
        return false;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = info ? info->port : srv->cfg.port;
    return true;
}

void ls_http_stop(ls_server *srv) {
    if (!srv->daemon) return;
    atomic_store(&srv->stopping, true);
    MHD_socket fd = MHD_quiesce_daemon(srv->daemon);
    /* The listening socket is ours once quiesced. Shut down now, a new
     * client is refused at once instead of waiting in the backlog until the
     * requests in flight are done; closed only after MHD_stop_daemon, as a
     * worker may still hold the descriptor in a poll set until then and a
     * reused number must never reach its accept(). */
    if (fd != MHD_INVALID_SOCKET) shutdown(fd, SHUT_RDWR);
    /* Let requests in flight finish. --shutdown-timeout bounds only what
     * clients hold up (a body still arriving, a reply not read), so a stuck
     * client cannot hold the stop forever. A request queued or running
     * (suspended, or dispatching on an HTTP thread) is a reply the server
     * owes: a load that went through unanswered would leave its client
     * not knowing it happened, so the stop waits for every such reply and
     * then gives it LS_HTTP_FLUSH_MS to go out. No new suspension starts
     * once stopping is set and the workers run every queued job, so this
     * ends. */
    const long bound_ms = (long)srv->cfg.shutdown_timeout_s * 1000;
    long waited_ms = 0, owed_ms = -LS_HTTP_FLUSH_MS; /* owed_ms: when a reply was last owed */
    bool warned = false;
    while (atomic_load(&srv->active) > 0) {
        const bool owed = atomic_load(&srv->suspended) > 0 || atomic_load(&srv->dispatching) > 0;
        if (owed) owed_ms = waited_ms;
        if (waited_ms >= bound_ms) {
            if (!warned)
                ls_log_warn("shutdown: %d request(s) still open after %d s; finishing the replies the server owes, "
                            "then closing the rest",
                            atomic_load(&srv->active), srv->cfg.shutdown_timeout_s);
            warned = true;
            if (!owed && waited_ms - owed_ms >= LS_HTTP_FLUSH_MS) break;
        }
        usleep(10000);
        waited_ms += 10;
    }
    if (atomic_load(&srv->active) > 0)
        ls_log_warn("shutdown: closing %d connection(s) whose client is still sending or reading",
                    atomic_load(&srv->active));
    /* MHD_stop_daemon panics on a connection still suspended. */
    while (atomic_load(&srv->suspended) > 0) usleep(1000);
    MHD_stop_daemon(srv->daemon);
    srv->daemon = NULL;
    ls_guard_free(srv->guard);
    srv->guard = NULL;
    if (fd != MHD_INVALID_SOCKET) close(fd);
}
