/* lorasink --probe (server/probe.h): one GET /ready over a fresh
 * connection, plain or TLS, all of it within one deadline. */
#include "server/probe.h"

#include <ctype.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <gnutls/gnutls.h>

/* The whole probe, connect to last byte: under the images' HEALTHCHECK
 * --timeout=3s, so a slow server is reported by the probe, not killed
 * with it. */
#define LS_PROBE_BUDGET_MS 2500
#define LS_PROBE_REPLY_MAX 4096

static long long ls_probe_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds left before the deadline (0 once past it). */
static int ls_probe_left_ms(long long deadline) {
    const long long left = deadline - ls_probe_now_ms();
    return left > 0 ? (int)left : 0;
}

/* The socket's send and receive timeouts: what is left (at least 1 ms,
 * 0 meaning none to the kernel). */
static void ls_probe_timeouts(int fd, long long deadline) {
    const int ms = ls_probe_left_ms(deadline);
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 + (ms == 0)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* "host:port", with brackets around an IPv6 host. */
static void ls_probe_where(const char *host, int port, char *out, size_t len) {
    snprintf(out, len, strchr(host, ':') ? "[%.255s]:%d" : "%.255s:%d", host, port);
}

/* The address to ask: a wildcard bind is asked on the loopback. */
static const char *ls_probe_host(const ls_config *cfg) {
    if (!cfg->host[0] || !strcmp(cfg->host, "0.0.0.0")) return "127.0.0.1";
    if (!strcmp(cfg->host, "::")) return "::1";
    return cfg->host;
}

/* A connected socket with send and receive timeouts, or -1 (why says,
 * naming where: host and port as messages print them). Linux bounds a
 * blocking connect by the send timeout. */
static int ls_probe_connect(const char *host, int port, const char *where, long long deadline, char *why,
                            size_t len) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(host, service, &hints, &ai);
    if (rc) {
        snprintf(why, len, "cannot resolve %.255s: %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        ls_probe_timeouts(fd, deadline);
        if (connect(fd, a->ai_addr, a->ai_addrlen)) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) snprintf(why, len, "cannot connect to %s (no server listening there?)", where);
    return fd;
}

/* The TLS side of one connection: its session and credentials. */
typedef struct {
    gnutls_session_t session;
    gnutls_certificate_credentials_t cred;
} ls_probe_tls;

static void ls_probe_tls_free(ls_probe_tls *t) {
    if (t->session) gnutls_deinit(t->session);
    if (t->cred) gnutls_certificate_free_credentials(t->cred);
}

/* A TLS client session over fd, handshake done; false with why set. */
static bool ls_probe_tls_open(const ls_config *cfg, int fd, long long deadline, ls_probe_tls *t, char *why,
                              size_t len) {
    int rc = gnutls_certificate_allocate_credentials(&t->cred);
    if (!rc && cfg->tls_client_ca[0])
        rc = gnutls_certificate_set_x509_key_file(t->cred, cfg->tls_cert, cfg->tls_key, GNUTLS_X509_FMT_PEM);
    if (!rc) rc = gnutls_init(&t->session, GNUTLS_CLIENT);
    if (!rc) rc = gnutls_set_default_priority(t->session);
    if (!rc) rc = gnutls_credentials_set(t->session, GNUTLS_CRD_CERTIFICATE, t->cred);
    if (rc) {
        snprintf(why, len, "TLS setup: %s", gnutls_strerror(rc));
        return false;
    }
    gnutls_transport_set_int(t->session, fd);
    gnutls_handshake_set_timeout(t->session, (unsigned)ls_probe_left_ms(deadline) + 1);
    do rc = gnutls_handshake(t->session);
    while (rc < 0 && !gnutls_error_is_fatal(rc) && ls_probe_left_ms(deadline) > 0);
    if (rc < 0) snprintf(why, len, "TLS handshake: %s", gnutls_strerror(rc));
    return rc >= 0;
}

/* Sends the request and reads the reply to its end (the server closes
 * the connection after it: HTTP/1.0) into buf, by the deadline: its
 * length, or -1. *tls_err is the TLS error that ended the read (0 when
 * none), which says more than "no reply" when a server refuses the
 * probe's certificate; *closed, whether the server closed the
 * connection (else the time ran out). */
static long ls_probe_exchange(int fd, ls_probe_tls *t, long long deadline, char *buf, size_t cap, int *tls_err,
                              bool *closed) {
    static const char req[] = "GET /ready HTTP/1.0\r\nHost: localhost\r\n\r\n";
    *tls_err = 0;
    *closed = false;
    ls_probe_timeouts(fd, deadline);
    const long sent = t->session ? (long)gnutls_record_send(t->session, req, sizeof req - 1)
                                 : (long)send(fd, req, sizeof req - 1, MSG_NOSIGNAL);
    if (sent != (long)sizeof req - 1) {
        if (t->session && sent < 0) *tls_err = (int)sent;
        return -1;
    }
    size_t got = 0;
    while (got + 1 < cap && ls_probe_left_ms(deadline) > 0) {
        ls_probe_timeouts(fd, deadline);
        const long n = t->session ? (long)gnutls_record_recv(t->session, buf + got, cap - 1 - got)
                                  : (long)recv(fd, buf + got, cap - 1 - got, 0);
        if (n < 0 && t->session && n != GNUTLS_E_AGAIN && n != GNUTLS_E_INTERRUPTED) *tls_err = (int)n;
        *closed = n == 0;
        if (n <= 0) break;
        got += (size_t)n;
    }
    buf[got] = '\0';
    return (long)got;
}

/* Whether the reply's status line says exactly HTTP/1.x 200. */
static bool ls_probe_status_ok(const char *reply) {
    return !strncmp(reply, "HTTP/1.", 7) && isdigit((unsigned char)reply[7]) && !strncmp(reply + 8, " 200", 4) &&
           (reply[12] == ' ' || reply[12] == '\r');
}

/* The reply's first line for a message, each byte that is not printable
 * ASCII shown as '?'. */
static void ls_probe_first_line(const char *reply, char *out, size_t len) {
    size_t i = 0;
    for (; reply[i] && reply[i] != '\r' && reply[i] != '\n' && i + 1 < len; i++)
        out[i] = reply[i] >= 0x20 && reply[i] < 0x7f ? reply[i] : '?';
    out[i] = '\0';
}

int ls_probe_run(const ls_config *cfg) {
    const long long deadline = ls_probe_now_ms() + LS_PROBE_BUDGET_MS;
    char why[640] = "", reply[LS_PROBE_REPLY_MAX], where[280];
    const char *host = ls_probe_host(cfg);
    ls_probe_where(host, cfg->port, where, sizeof where);
    ls_probe_tls t = {NULL, NULL};
    long n = -1;
    int fd = ls_probe_connect(host, cfg->port, where, deadline, why, sizeof why);
    if (fd >= 0 && (!cfg->tls_cert[0] || ls_probe_tls_open(cfg, fd, deadline, &t, why, sizeof why))) {
        int tls_err = 0;
        bool closed = false;
        n = ls_probe_exchange(fd, &t, deadline, reply, sizeof reply, &tls_err, &closed);
        char when[48];
        snprintf(when, sizeof when, closed ? ": the connection was closed" : " within %d ms", LS_PROBE_BUDGET_MS);
        if (n <= 0 && tls_err)
            snprintf(why, sizeof why, "no reply from %s: TLS: %s%s", where, gnutls_strerror(tls_err),
                     cfg->tls_client_ca[0] ? " (does the server take this certificate for a client?)" : "");
        else if (n <= 0)
            snprintf(why, sizeof why, "no reply from %s%s%s", where, when,
                     cfg->tls_cert[0] ? "" : " (a TLS port? give its --tls-cert and --tls-key)");
    }
    ls_probe_tls_free(&t);
    if (fd >= 0) close(fd);
    if (n <= 0) {
        fprintf(stderr, "lorasink --probe: %s\n", why);
        return 1;
    }
    /* A whole 200: that status line, and the end of its headers. */
    const char *body = strstr(reply, "\r\n\r\n");
    if (!ls_probe_status_ok(reply) || !body) {
        char line[200];
        ls_probe_first_line(reply, line, sizeof line);
        fprintf(stderr, "lorasink --probe: GET /ready on %s answered %s%s\n", where, line, body ? "" : " (cut short)");
        return 1;
    }
    fputs(body + 4, stdout);
    return 0;
}
