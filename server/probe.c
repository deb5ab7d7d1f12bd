/* lorasink --probe (server/probe.h): one GET /ready over a fresh
 * connection, plain or TLS, each step under a few seconds' timeout. */
#include "server/probe.h"

#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gnutls/gnutls.h>

#define LS_PROBE_TIMEOUT_S 3
#define LS_PROBE_REPLY_MAX 4096

/* The address to ask: a wildcard bind is asked on the loopback. */
static const char *ls_probe_host(const ls_config *cfg) {
    if (!cfg->host[0] || !strcmp(cfg->host, "0.0.0.0")) return "127.0.0.1";
    if (!strcmp(cfg->host, "::")) return "::1";
    return cfg->host;
}

/* A connected socket with send and receive timeouts, or -1 (why says). */
static int ls_probe_connect(const char *host, int port, char *why, size_t len) {
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
        struct timeval tv = {.tv_sec = LS_PROBE_TIMEOUT_S};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, a->ai_addr, a->ai_addrlen)) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) snprintf(why, len, "cannot connect to %.255s:%d (no server listening there?)", host, port);
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
static bool ls_probe_tls_open(const ls_config *cfg, int fd, ls_probe_tls *t, char *why, size_t len) {
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
    gnutls_handshake_set_timeout(t->session, LS_PROBE_TIMEOUT_S * 1000);
    do rc = gnutls_handshake(t->session);
    while (rc < 0 && !gnutls_error_is_fatal(rc));
    if (rc < 0) snprintf(why, len, "TLS handshake: %s", gnutls_strerror(rc));
    return rc >= 0;
}

/* Sends the request and reads the reply to its end (the server closes
 * the connection after it: HTTP/1.0) into buf; its length, or -1. */
static long ls_probe_exchange(int fd, ls_probe_tls *t, char *buf, size_t cap) {
    static const char req[] = "GET /ready HTTP/1.0\r\nHost: localhost\r\n\r\n";
    const long sent = t->session ? (long)gnutls_record_send(t->session, req, sizeof req - 1)
                                 : (long)send(fd, req, sizeof req - 1, MSG_NOSIGNAL);
    if (sent != (long)sizeof req - 1) return -1;
    size_t got = 0;
    while (got + 1 < cap) {
        const long n = t->session ? (long)gnutls_record_recv(t->session, buf + got, cap - 1 - got)
                                  : (long)recv(fd, buf + got, cap - 1 - got, 0);
        if (n <= 0) break;
        got += (size_t)n;
    }
    buf[got] = '\0';
    return (long)got;
}

int ls_probe_run(const ls_config *cfg) {
    char why[512] = "", reply[LS_PROBE_REPLY_MAX];
    const char *host = ls_probe_host(cfg);
    ls_probe_tls t = {NULL, NULL};
    long n = -1;
    int fd = ls_probe_connect(host, cfg->port, why, sizeof why);
    if (fd >= 0 && (!cfg->tls_cert[0] || ls_probe_tls_open(cfg, fd, &t, why, sizeof why))) {
        n = ls_probe_exchange(fd, &t, reply, sizeof reply);
        if (n <= 0) snprintf(why, sizeof why, "no reply from %.255s:%d%s", host, cfg->port,
                             cfg->tls_cert[0] ? "" : " (a TLS port? give its --tls-cert and --tls-key)");
    }
    ls_probe_tls_free(&t);
    if (fd >= 0) close(fd);
    if (n <= 0) {
        fprintf(stderr, "lorasink --probe: %s\n", why);
        return 1;
    }
    int status = 0;
    const char *body = strstr(reply, "\r\n\r\n");
    if (sscanf(reply, "HTTP/%*d.%*d %d", &status) != 1 || status != 200) {
        fprintf(stderr, "lorasink --probe: GET /ready on %s:%d answered %.*s\n", host, cfg->port,
                (int)strcspn(reply, "\r\n"), reply);
        return 1;
    }
    fputs(body ? body + 4 : "\n", stdout);
    return 0;
}
