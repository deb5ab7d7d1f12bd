/* See guard.h. Each connection moves through phases, under the guard's
 * one lock: WAIT (no byte of a request yet; idle, as --connection-timeout
 * bounds it), HEAD (the head's clock runs from its first byte, which the
 * socket's TCP_INFO byte count or the request line shows), BODY (the
 * body's clock runs), BUSY (the server's own work and the reply: no
 * deadline), REAPED. The reaper writes its 408 itself, straight to the
 * socket, which is sound because in HEAD and BODY libmicrohttpd writes
 * nothing there and every step that would let it write (ls_guard_head_done,
 * ls_guard_body_done) first takes the lock and gives way to a reaped
 * connection. It then shuts the socket down (never closes it: the
 * descriptor stays libmicrohttpd's, and a connection is forgotten before
 * libmicrohttpd closes it), so libmicrohttpd reads the end and closes the
 * connection on its own thread. */
#include "server/guard.h"

#include <arpa/inet.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/error_body.h"
#include "common/log.h"
#include "common/text.h"
#include "config/config.h"
#include "server/http_head.h"
#include "server/http_status.h"
#include "server/request.h"

/* How often the reaper looks, and how long a reaped connection's 408 has
 * to leave before the reading side is shut too (libmicrohttpd then
 * closes the socket, and a close with unread bytes sends a reset that
 * can overtake the reply). */
#define LS_GUARD_TICK_NS 250000000LL
#define LS_GUARD_LINGER_NS 1000000000LL

typedef enum { LS_GC_WAIT, LS_GC_HEAD, LS_GC_BODY, LS_GC_BUSY, LS_GC_REAPED } ls_gc_phase;

struct ls_guard_conn {
    ls_guard_conn *prev, *next;
    int fd;
    int family;            /* AF_INET (v4-mapped v6 too) or AF_INET6 */
    unsigned char ip[16];  /* v4 in the first 4 bytes */
    bool reserved;         /* set before the connection is published, never changed */
    ls_gc_phase phase;
    bool shut;             /* REAPED: the reading side is shut too */
    int64_t started_ns;    /* HEAD, BODY: the head's first byte */
    int64_t deadline_ns;   /* HEAD, BODY: the deadline; REAPED: when to shut the reading side */
    unsigned long long mark; /* WAIT: bytes the socket had received when the phase began */
    const char *route;     /* BODY: the request's metrics label (static) */
    char id[LS_REQUEST_ID_MAX + 1];
    char what[160];        /* BODY: method and path, escaped */
    char who[32];          /* BODY: the key's id as the access log shows it */
    void *tls;             /* the TLS layer's (ls_guard_tls_slot) */
};

struct ls_guard {
    ls_guard_config cfg;
    ls_metrics *metrics;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t reaper;
    bool stop;
    ls_guard_conn *head;
    int n;
};

static int64_t ls_guard_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* The address of a, v4-mapped v6 as v4 (a v4 client of a server on ::). */
static void ls_guard_addr(const struct sockaddr *a, int *family, unsigned char ip[16]) {
    memset(ip, 0, 16);
    *family = a->sa_family;
    if (a->sa_family == AF_INET) {
        struct sockaddr_in v4;
        memcpy(&v4, a, sizeof v4);
        memcpy(ip, &v4.sin_addr, 4);
    } else if (a->sa_family == AF_INET6) {
        struct sockaddr_in6 v6;
        memcpy(&v6, a, sizeof v6);
        const bool mapped = IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr);
        *family = mapped ? AF_INET : AF_INET6;
        memcpy(ip, v6.sin6_addr.s6_addr + (mapped ? 12 : 0), mapped ? 4 : 16);
    }
}

/* Connections from the address; the caller holds the lock. */
static int ls_guard_count(const ls_guard *g, int family, const unsigned char ip[16]) {
    int n = 0;
    for (const ls_guard_conn *c = g->head; c; c = c->next) n += c->family == family && !memcmp(c->ip, ip, 16);
    return n;
}

/* Bytes the socket has received in all (0 where TCP_INFO cannot say:
 * then only the request line starts a head's clock). */
static unsigned long long ls_guard_received(int fd) {
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    const size_t need = offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 || len < need) return 0;
    return (unsigned long long)ti.tcpi_bytes_received;
}

static int ls_guard_head_limit_s(const ls_guard *g, const ls_guard_conn *c) {
    const int t = g->cfg.request_timeout_s;
    return c->reserved && t > LS_GUARD_RESERVE_HEAD_S ? LS_GUARD_RESERVE_HEAD_S : t;
}

/* WAIT -> HEAD; the caller holds the lock. */
static void ls_guard_start_head(ls_guard *g, ls_guard_conn *c, int64_t now) {
    c->phase = LS_GC_HEAD;
    c->started_ns = now;
    c->deadline_ns = now + (int64_t)ls_guard_head_limit_s(g, c) * 1000000000LL;
}

/* The 408 as the reaper writes it: the headers every response has (id
 * its X-Request-Id), and Connection: close. Into buf; returns its length
 * (0 when it does not fit or memory is short: then the connection is
 * only closed) and *body_len the bytes of its body. */
static size_t ls_guard_408(const char *id, const char *message, char *buf, size_t cap, size_t *body_len) {
    *body_len = 0;
    ls_error err;
    ls_error_init(&err);
    ls_error_set(&err, LS_REQUEST_TIMEOUT, NULL, "%s", message);
    char *body = ls_error_body_text(&err, ls_http_status(LS_REQUEST_TIMEOUT));
    ls_error_free(&err);
    if (!body) return 0;
    int n = snprintf(buf, cap,
                     "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nX-Lorasink-Version: %s\r\nX-Request-Id: %s\r\n"
                     "Content-Security-Policy: %s\r\n",
                     strlen(body) + 1, LS_VERSION, id, ls_http_csp(false));
    for (size_t i = 0; i < ls_http_hardening_count && n > 0 && (size_t)n < cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, "%s: %s\r\n", ls_http_hardening[i][0], ls_http_hardening[i][1]);
    if (n > 0 && (size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, "\r\n%s\n", body);
    const size_t blen = strlen(body) + 1;
    free(body);
    if (n <= 0 || (size_t)n >= cap) return 0;
    *body_len = blen;
    return (size_t)n;
}

/* A connection past its deadline: answered 408 (what the client sent
 * so far is dropped), its writing side shut, counted and logged once.
 * The caller holds the lock. */
static void ls_guard_reap(ls_guard *g, ls_guard_conn *c, int64_t now) {
    const bool body = c->phase == LS_GC_BODY;
    const int limit = body ? g->cfg.body_timeout_s : ls_guard_head_limit_s(g, c);
    char message[256], buf[4096], ip[INET6_ADDRSTRLEN] = "?", id[LS_REQUEST_ID_MAX + 1];
    snprintf(message, sizeof message, "the request's %s did not arrive within %d s (--%s)", body ? "body" : "head",
             limit, body ? "body-timeout" : "request-timeout");
    if (c->id[0]) memcpy(id, c->id, sizeof id);
    else ls_http_new_request_id(id);
    size_t body_len = 0;
    const size_t n = ls_guard_408(id, message, buf, sizeof buf, &body_len);
    /* Over TLS the bytes would be plain text inside the TLS stream, which
     * the client reads as a broken record: there the connection only
     * closes. */
    if (n && !g->cfg.tls) (void)send(c->fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    shutdown(c->fd, SHUT_WR);
    c->phase = LS_GC_REAPED;
    c->deadline_ns = now + LS_GUARD_LINGER_NS;
    ls_metrics_request_timeout(g->metrics, body);
    if (body) ls_metrics_observe_request(g->metrics, c->route, 408, (double)(now - c->started_ns) * 1e-9);
    inet_ntop(c->family, c->ip, ip, sizeof ip);
    ls_log_warn("request timeout: %s%s%s%s: %s; %s", ip, body ? " " : "", body ? c->what : "",
                body ? "" : " (no complete head)", message,
                g->cfg.tls ? "connection closed (over TLS without a 408)" : "answered 408, connection closed");
    /* Its line of the access log, as every answer has: a head that never
     * came whole has no method or path to show ("- -"). The id is the
     * one the reply carries. */
    if (g->cfg.access_log) {
        char shown[3 * LS_REQUEST_ID_MAX + 1];
        ls_text_log_field(id, false, shown, sizeof shown);
        ls_log_access("%s %s 408 %zu %lld %s %s", shown, body ? c->what : "- -", n && !g->cfg.tls ? body_len : 0,
                      (long long)((now - c->started_ns) / 1000), ip, body ? c->who : "-");
    }
}

/* One connection at one look; the caller holds the lock. */
static void ls_guard_check(ls_guard *g, ls_guard_conn *c, int64_t now) {
    switch (c->phase) {
    case LS_GC_WAIT:
        if (ls_guard_received(c->fd) > c->mark) ls_guard_start_head(g, c, now);
        break;
    case LS_GC_HEAD:
    case LS_GC_BODY:
        if (now >= c->deadline_ns) ls_guard_reap(g, c, now);
        break;
    case LS_GC_REAPED:
        if (!c->shut && now >= c->deadline_ns) {
            shutdown(c->fd, SHUT_RDWR);
            c->shut = true;
        }
        break;
    case LS_GC_BUSY:
        break;
    }
}

static void *ls_guard_run(void *arg) {
    ls_guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        const int64_t now = ls_guard_now();
        for (ls_guard_conn *c = g->head; c; c = c->next) ls_guard_check(g, c, now);
        if (!g->head) {
            pthread_cond_wait(&g->cv, &g->mu); /* nothing to watch: sleep until a connection comes */
            continue;
        }
        const int64_t until = now + LS_GUARD_TICK_NS;
        struct timespec ts = {.tv_sec = (time_t)(until / 1000000000LL), .tv_nsec = (long)(until % 1000000000LL)};
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

ls_guard *ls_guard_new(const ls_guard_config *cfg, ls_metrics *metrics) {
    ls_guard *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->cfg = *cfg;
    g->metrics = metrics;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&g->reaper, NULL, ls_guard_run, g) != 0) {
        ls_log_error("cannot start the connection guard's thread");
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        free(g);
        return NULL;
    }
    return g;
}

void ls_guard_free(ls_guard *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->reaper, NULL);
    /* Left only if the daemon did not close them: nothing uses them now. */
    while (g->head) {
        ls_guard_conn *c = g->head;
        g->head = c->next;
        free(c);
    }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

bool ls_guard_admit(ls_guard *g, const struct sockaddr *addr, socklen_t len) {
    (void)len;
    if (g->cfg.per_ip <= 0) return true;
    int family;
    unsigned char ip[16];
    ls_guard_addr(addr, &family, ip);
    pthread_mutex_lock(&g->mu);
    const bool ok = ls_guard_count(g, family, ip) < g->cfg.per_ip + LS_GUARD_RESERVE_PER_IP;
    pthread_mutex_unlock(&g->mu);
    if (!ok) ls_metrics_connection_refused(g->metrics);
    return ok;
}

ls_guard_conn *ls_guard_open(ls_guard *g, int fd, const struct sockaddr *addr) {
    ls_guard_conn *c = calloc(1, sizeof *c);
    if (!c) {
        shutdown(fd, SHUT_RDWR); /* unguarded, it could not be counted */
        return NULL;
    }
    c->fd = fd;
    c->phase = LS_GC_WAIT;
    ls_guard_addr(addr, &c->family, c->ip);
    pthread_mutex_lock(&g->mu);
    const int from_ip = ls_guard_count(g, c->family, c->ip);
    c->reserved = (g->cfg.per_ip > 0 && from_ip >= g->cfg.per_ip) || g->n >= g->cfg.max_connections;
    /* A reserve connection is on the head's clock from the start: held
     * idle, it would keep the probes out as surely as a slow one. */
    if (c->reserved) ls_guard_start_head(g, c, ls_guard_now());
    c->next = g->head;
    if (g->head) g->head->prev = c;
    else pthread_cond_signal(&g->cv); /* the reaper sleeps while there is none */
    g->head = c;
    g->n++;
    pthread_mutex_unlock(&g->mu);
    ls_metrics_connections(g->metrics, 1, c->reserved ? 1 : 0);
    return c;
}

void ls_guard_close(ls_guard *g, ls_guard_conn *c) {
    if (!c) return;
    pthread_mutex_lock(&g->mu);
    if (c->prev) c->prev->next = c->next;
    else g->head = c->next;
    if (c->next) c->next->prev = c->prev;
    g->n--;
    pthread_mutex_unlock(&g->mu);
    ls_metrics_connections(g->metrics, -1, c->reserved ? -1 : 0);
    free(c);
}

void ls_guard_request_line(ls_guard *g, ls_guard_conn *c) {
    if (!c) return;
    pthread_mutex_lock(&g->mu);
    if (c->phase == LS_GC_WAIT) ls_guard_start_head(g, c, ls_guard_now());
    pthread_mutex_unlock(&g->mu);
}

bool ls_guard_head_done(ls_guard *g, ls_guard_conn *c, const char *id, const char *what, const char *who,
                        const char *route) {
    if (!c) return true;
    const int64_t now = ls_guard_now();
    pthread_mutex_lock(&g->mu);
    const bool ok = c->phase != LS_GC_REAPED;
    if (ok && c->phase != LS_GC_BUSY) {
        if (c->phase == LS_GC_WAIT) c->started_ns = now;
        c->phase = LS_GC_BODY;
        c->deadline_ns = now + (int64_t)g->cfg.body_timeout_s * 1000000000LL;
        c->route = route;
        snprintf(c->id, sizeof c->id, "%s", id);
        snprintf(c->what, sizeof c->what, "%s", what);
        snprintf(c->who, sizeof c->who, "%s", who);
    }
    pthread_mutex_unlock(&g->mu);
    return ok;
}

bool ls_guard_body_done(ls_guard *g, ls_guard_conn *c) {
    if (!c) return true;
    pthread_mutex_lock(&g->mu);
    const bool ok = c->phase != LS_GC_REAPED;
    if (ok) c->phase = LS_GC_BUSY;
    pthread_mutex_unlock(&g->mu);
    return ok;
}

void ls_guard_request_done(ls_guard *g, ls_guard_conn *c) {
    if (!c) return;
    const unsigned long long received = ls_guard_received(c->fd);
    pthread_mutex_lock(&g->mu);
    if (c->phase != LS_GC_REAPED) {
        c->phase = LS_GC_WAIT;
        c->mark = received;
        c->id[0] = '\0';
    }
    pthread_mutex_unlock(&g->mu);
}

void ls_guard_peer(const ls_guard_conn *c, char *out, size_t len) {
    if (!c || (c->family != AF_INET && c->family != AF_INET6) || !inet_ntop(c->family, c->ip, out, (socklen_t)len))
        snprintf(out, len, "?");
}

bool ls_guard_reserved(const ls_guard_conn *c) { return c && c->reserved; }

void **ls_guard_tls_slot(ls_guard_conn *c) { return &c->tls; }
