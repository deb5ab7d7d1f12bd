/* HTTPS credentials (server/tls.h): the PEM files read into GnuTLS
 * credentials, set on each connection as it starts, and replaced when the
 * files change. libmicrohttpd runs the handshake with them. */
#include "server/tls.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <microhttpd.h>

#include "common/file.h"
#include "common/log.h"
#include "common/ticker.h"

/* A PEM file larger than this is not a certificate chain or a key. */
#define LS_TLS_FILE_MAX (1 << 20)
#define LS_TLS_WHY_MAX (2 * LS_CONFIG_PATH_MAX + 512) /* two paths and a reason */

/* One generation of credentials. The current one is handed to new
 * connections; one a reload replaced lives until its last connection
 * closes (a TLS 1.2 renegotiation may use it again). */
typedef struct ls_tls_creds {
    gnutls_certificate_credentials_t cred;
    int users; /* connections that hold it; under ls_tls.mu */
    struct ls_tls_creds *next;
} ls_tls_creds;

/* What a file looked like when it was last read, to notice a change. */
typedef struct {
    ls_file_stamp file;
    int err; /* errno of the stat, 0 when it worked */
} ls_tls_stamp;

enum { LS_TLS_CERT, LS_TLS_KEY, LS_TLS_CA, LS_TLS_FILES };
static const char *const ls_tls_flags[LS_TLS_FILES] = {"--tls-cert", "--tls-key", "--tls-client-ca"};

struct ls_tls {
    char paths[LS_TLS_FILES][LS_CONFIG_PATH_MAX]; /* CA: "" = no client certificates */
    char *pem[LS_TLS_FILES]; /* the first load's text, for libmicrohttpd's own credentials */
    ls_tls_stamp stamps[LS_TLS_FILES];
    pthread_mutex_t mu;
    ls_tls_creds *current; /* under mu */
    ls_tls_creds *all;     /* every live generation, current first; under mu */
    ls_ticker *watcher;
};

/* ---- reading and checking the files ------------------------------------------ */

static void ls_tls_stamp_of(const char *path, ls_tls_stamp *st) {
    struct stat sb;
    memset(st, 0, sizeof *st);
    if (stat(path, &sb)) {
        st->err = errno;
        return;
    }
    st->file = ls_file_stamp_of(&sb);
}

static bool ls_tls_stamp_same(const ls_tls_stamp *a, const ls_tls_stamp *b) {
    return a->err == b->err && ls_file_stamp_same(&a->file, &b->file);
}

/* The whole file as a NUL-terminated string into *out (the caller frees);
 * false with why filled. */
static bool ls_tls_read(int which, const char *path, char **out, char *why, size_t len) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        char ebuf[128]; /* strerror_r: certificates are read again on the watcher thread */
        snprintf(why, len, "%s %s: cannot read it: %s", ls_tls_flags[which], path,
                 strerror_r(errno, ebuf, sizeof ebuf));
        return false;
    }
    char *buf = malloc(LS_TLS_FILE_MAX + 1);
    size_t n = buf ? fread(buf, 1, LS_TLS_FILE_MAX + 1, f) : 0;
    const bool bad = !buf || ferror(f);
    fclose(f);
    if (bad || n > LS_TLS_FILE_MAX || n == 0) {
        const char *what = !buf ? "out of memory" : bad ? "cannot read it" : n ? "larger than 1 MiB: not a PEM file"
                                                                              : "it is empty";
        snprintf(why, len, "%s %s: %s", ls_tls_flags[which], path, what);
        free(buf);
        return false;
    }
    buf[n] = '\0';
    *out = buf;
    return true;
}

/* The certificate chain's first (the server's) certificate described in
 * the log: its subject and its end of validity; a warning when it is not
 * valid now, as clients will refuse it. */
static void ls_tls_describe_cert(const char *path, gnutls_x509_crt_t crt) {
    gnutls_datum_t dn = {0};
    const time_t now = time(NULL), until = gnutls_x509_crt_get_expiration_time(crt);
    const time_t from = gnutls_x509_crt_get_activation_time(crt);
    char when[32] = "?";
    struct tm tm;
    if (until != (time_t)-1 && gmtime_r(&until, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    const bool have_dn = gnutls_x509_crt_get_dn3(crt, &dn, 0) == 0;
    const char *subject = have_dn ? (const char *)dn.data : "?";
    if (until != (time_t)-1 && until < now)
        ls_log_warn("tls: the certificate in %s (%s) expired at %s: clients will refuse it", path, subject, when);
    else if (from != (time_t)-1 && from > now)
        ls_log_warn("tls: the certificate in %s (%s) is not valid yet: clients will refuse it", path, subject);
    else
        ls_log_info("tls: certificate %s from %s, valid until %s", subject, path, when);
    if (have_dn) gnutls_free(dn.data);
}

/* The certificate and key into cred, each checked on its own first so the
 * error names the file that is wrong. */
static bool ls_tls_load_pair(gnutls_certificate_credentials_t cred, const char *const *paths, char *const *pem,
                             char *why, size_t len) {
    gnutls_datum_t cd = {(unsigned char *)pem[LS_TLS_CERT], (unsigned)strlen(pem[LS_TLS_CERT])};
    gnutls_datum_t kd = {(unsigned char *)pem[LS_TLS_KEY], (unsigned)strlen(pem[LS_TLS_KEY])};
    gnutls_x509_crt_t *crts = NULL;
    unsigned ncrt = 0;
    gnutls_x509_privkey_t key = NULL;
    int rc = gnutls_x509_crt_list_import2(&crts, &ncrt, &cd, GNUTLS_X509_FMT_PEM, 0);
    if (rc < 0 || ncrt == 0) {
        snprintf(why, len, "--tls-cert %s: not a PEM certificate chain (%s)", paths[LS_TLS_CERT],
                 rc < 0 ? gnutls_strerror(rc) : "no certificate in it");
        return false;
    }
    bool ok = false;
    if ((rc = gnutls_x509_privkey_init(&key)) < 0 ||
        (rc = gnutls_x509_privkey_import2(key, &kd, GNUTLS_X509_FMT_PEM, NULL, GNUTLS_PKCS_PLAIN)) < 0) {
        snprintf(why, len, "--tls-key %s: not an unencrypted PEM private key (%s)", paths[LS_TLS_KEY],
                 gnutls_strerror(rc));
    } else if ((rc = gnutls_certificate_set_x509_key(cred, crts, (int)ncrt, key)) < 0) {
        snprintf(why, len, "--tls-key %s and --tls-cert %s: %s", paths[LS_TLS_KEY], paths[LS_TLS_CERT],
                 rc == GNUTLS_E_CERTIFICATE_KEY_MISMATCH ? "the key is not the certificate's" : gnutls_strerror(rc));
    } else {
        ls_tls_describe_cert(paths[LS_TLS_CERT], crts[0]);
        ok = true;
    }
    if (key) gnutls_x509_privkey_deinit(key);
    for (unsigned i = 0; i < ncrt; i++) gnutls_x509_crt_deinit(crts[i]);
    gnutls_free(crts);
    return ok;
}

/* The client's address of a session libmicrohttpd made (its pointer is
 * the connection) into host, "?" when it cannot say. */
static void ls_tls_peer(gnutls_session_t session, char *host, size_t len) {
    snprintf(host, len, "?");
    struct MHD_Connection *conn = gnutls_session_get_ptr(session);
    const union MHD_ConnectionInfo *ci =
        conn ? MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS) : NULL;
    if (!ci || !ci->client_addr) return;
    const bool v6 = ci->client_addr->sa_family == AF_INET6;
    const socklen_t alen = v6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    getnameinfo(ci->client_addr, alen, host, (socklen_t)len, NULL, 0, NI_NUMERICHOST);
}

/* When this thread last logged a refused client certificate; zero:
 * never, or already reported. libmicrohttpd logs its generic line of
 * the failed handshake right after, in the thread that ran it. */
static _Thread_local struct timespec ls_tls_refused_at;

bool ls_tls_refusal_logged(void) {
    const struct timespec at = ls_tls_refused_at;
    if (at.tv_sec == 0 && at.tv_nsec == 0) return false;
    ls_tls_refused_at = (struct timespec){0};
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    /* Bounded so that a refusal never silences a later, other failure. */
    return now.tv_sec - at.tv_sec < 2;
}

/* The client's certificate, checked during the handshake: it must chain
 * to a CA of --tls-client-ca, be valid now and allow client use. Non-zero
 * ends the handshake. */
static int ls_tls_verify_client(gnutls_session_t session) {
    gnutls_typed_vdata_st purpose = {.type = GNUTLS_DT_KEY_PURPOSE_OID,
                                     .data = (unsigned char *)GNUTLS_KP_TLS_WWW_CLIENT};
    unsigned status = 0;
    const int rc = gnutls_certificate_verify_peers(session, &purpose, 1, &status);
    if (rc == 0 && status == 0) return 0;
    gnutls_datum_t text = {0};
    const bool have_text =
        rc == 0 && gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &text, 0) == 0;
    char host[NI_MAXHOST];
    ls_tls_peer(session, host, sizeof host);
    char reason[256];
    snprintf(reason, sizeof reason, "%s", have_text ? (const char *)text.data : rc ? gnutls_strerror(rc) : "not valid");
    for (size_t n = strlen(reason); n && reason[n - 1] == ' '; n--) reason[n - 1] = '\0';
    ls_log_info("tls: client certificate from %s refused: %s", host, reason);
    clock_gettime(CLOCK_MONOTONIC, &ls_tls_refused_at);
    if (have_text) gnutls_free(text.data);
    return GNUTLS_E_CERTIFICATE_ERROR;
}

/* Fresh credentials from the PEM texts; NULL with why filled. */
static ls_tls_creds *ls_tls_creds_new(const char *const *paths, char *const *pem, char *why, size_t len) {
    ls_tls_creds *c = calloc(1, sizeof *c);
    if (!c || gnutls_certificate_allocate_credentials(&c->cred) < 0) {
        snprintf(why, len, "out of memory for the TLS credentials");
        free(c);
        return NULL;
    }
    bool ok = ls_tls_load_pair(c->cred, paths, pem, why, len);
    if (ok && paths[LS_TLS_CA][0]) {
        gnutls_datum_t ca = {(unsigned char *)pem[LS_TLS_CA], (unsigned)strlen(pem[LS_TLS_CA])};
        const int n = gnutls_certificate_set_x509_trust_mem(c->cred, &ca, GNUTLS_X509_FMT_PEM);
        if (n <= 0) {
            snprintf(why, len, "--tls-client-ca %s: not a PEM CA certificate (%s)", paths[LS_TLS_CA],
                     n < 0 ? gnutls_strerror(n) : "no certificate in it");
            ok = false;
        }
        gnutls_certificate_set_verify_function(c->cred, ls_tls_verify_client);
    }
    if (!ok) {
        gnutls_certificate_free_credentials(c->cred);
        free(c);
        return NULL;
    }
    return c;
}

/* Reads every file and builds credentials of them: NULL with why filled.
 * The texts go to pem[] (the caller frees them, on failure too). */
static ls_tls_creds *ls_tls_load(const ls_tls *tls, char **pem, char *why, size_t len) {
    const char *paths[LS_TLS_FILES];
    for (int i = 0; i < LS_TLS_FILES; i++) {
        paths[i] = tls->paths[i];
        pem[i] = NULL;
    }
    for (int i = 0; i < LS_TLS_FILES; i++)
        if (paths[i][0] && !ls_tls_read(i, paths[i], &pem[i], why, len)) return NULL;
    return ls_tls_creds_new(paths, pem, why, len);
}

/* ---- the watcher ---------------------------------------------------------------- */

/* Under mu. Frees c, which no connection holds, and unlinks it. */
static void ls_tls_creds_drop(ls_tls *tls, ls_tls_creds *c) {
    for (ls_tls_creds **p = &tls->all; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    gnutls_certificate_free_credentials(c->cred);
    free(c);
}

/* Re-reads the files: new connections get the new credentials; on any
 * error the current ones stay and the log says why. */
static void ls_tls_reload(ls_tls *tls) {
    char *pem[LS_TLS_FILES], why[LS_TLS_WHY_MAX];
    ls_tls_creds *c = ls_tls_load(tls, pem, why, sizeof why);
    for (int i = 0; i < LS_TLS_FILES; i++) free(pem[i]);
    if (!c) {
        ls_log_warn("tls: keeping the current certificate: %s", why);
        return;
    }
    pthread_mutex_lock(&tls->mu);
    ls_tls_creds *old = tls->current;
    c->next = tls->all;
    tls->all = tls->current = c;
    if (old && old->users == 0) ls_tls_creds_drop(tls, old);
    pthread_mutex_unlock(&tls->mu);
    ls_log_info("tls: certificate files re-read; new connections use them");
}

/* Every LS_TLS_WATCH_MS, on the watcher's thread: re-reads the files once
 * any changed (a rename onto it, a rewrite, a Kubernetes secret's link
 * swap). */
static void ls_tls_watch(void *arg) {
    ls_tls *tls = arg;
    bool changed = false;
    for (int i = 0; i < LS_TLS_FILES; i++) {
        if (!tls->paths[i][0]) continue;
        ls_tls_stamp now;
        ls_tls_stamp_of(tls->paths[i], &now);
        if (!ls_tls_stamp_same(&now, &tls->stamps[i])) changed = true;
        tls->stamps[i] = now; /* the watcher's alone */
    }
    if (changed) ls_tls_reload(tls);
}

/* ---- the interface ------------------------------------------------------------- */

ls_tls *ls_tls_open(const ls_config *cfg) {
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        ls_log_error("--tls-cert: this libmicrohttpd was built without TLS support (MHD_FEATURE_TLS); serve HTTPS "
                     "with one built with GnuTLS (Debian's is), or terminate TLS at a proxy");
        return NULL;
    }
    ls_tls *tls = calloc(1, sizeof *tls);
    if (!tls) {
        ls_log_error("--tls-cert: out of memory");
        return NULL;
    }
    snprintf(tls->paths[LS_TLS_CERT], sizeof tls->paths[0], "%s", cfg->tls_cert);
    snprintf(tls->paths[LS_TLS_KEY], sizeof tls->paths[0], "%s", cfg->tls_key);
    snprintf(tls->paths[LS_TLS_CA], sizeof tls->paths[0], "%s", cfg->tls_client_ca);
    /* Stamped before the read: a change while it reads is seen next time. */
    for (int i = 0; i < LS_TLS_FILES; i++)
        if (tls->paths[i][0]) ls_tls_stamp_of(tls->paths[i], &tls->stamps[i]);
    pthread_mutex_init(&tls->mu, NULL);
    char why[LS_TLS_WHY_MAX];
    tls->current = tls->all = ls_tls_load(tls, tls->pem, why, sizeof why);
    if (!tls->current) {
        ls_log_error("%s", why);
        ls_tls_free(tls);
        return NULL;
    }
    if (!(tls->watcher = ls_ticker_start(LS_TLS_WATCH_MS, ls_tls_watch, tls))) {
        ls_log_error("tls: cannot start the thread that watches the certificate files");
        ls_tls_free(tls);
        return NULL;
    }
    return tls;
}

void ls_tls_free(ls_tls *tls) {
    if (!tls) return;
    ls_ticker_stop(tls->watcher);
    while (tls->all) ls_tls_creds_drop(tls, tls->all);
    for (int i = 0; i < LS_TLS_FILES; i++) free(tls->pem[i]);
    pthread_mutex_destroy(&tls->mu);
    free(tls);
}

void ls_tls_daemon_options(ls_tls *tls, struct MHD_OptionItem *ops) {
    size_t n = 0;
    /* libmicrohttpd's own credentials are a fallback every connection
     * replaces with the current ones (ls_tls_connection_started). */
    ops[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, tls->pem[LS_TLS_CERT]};
    ops[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, tls->pem[LS_TLS_KEY]};
    ops[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)LS_TLS_PRIORITIES};
    if (tls->pem[LS_TLS_CA]) ops[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_TRUST, 0, tls->pem[LS_TLS_CA]};
    ops[n++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
}

void ls_tls_connection_started(ls_tls *tls, struct MHD_Connection *conn, int fd, void **slot) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    gnutls_session_t session = ci ? (gnutls_session_t)ci->tls_session : NULL;
    if (!session) {
        ls_log_error("tls: a connection without a TLS session; closing it");
        shutdown(fd, SHUT_RDWR);
        return;
    }
    pthread_mutex_lock(&tls->mu);
    ls_tls_creds *c = tls->current;
    c->users++;
    pthread_mutex_unlock(&tls->mu);
    *slot = c;
    const int rc = gnutls_credentials_set(session, GNUTLS_CRD_CERTIFICATE, c->cred);
    /* libmicrohttpd only asks for a certificate; without one there is no
     * handshake here. */
    if (tls->paths[LS_TLS_CA][0]) gnutls_certificate_server_set_request(session, GNUTLS_CERT_REQUIRE);
    if (rc < 0) {
        ls_log_error("tls: cannot set a connection's credentials (%s); closing it", gnutls_strerror(rc));
        shutdown(fd, SHUT_RDWR);
    }
}

void ls_tls_connection_closed(ls_tls *tls, void *slot) {
    ls_tls_creds *c = slot;
    if (!c) return;
    pthread_mutex_lock(&tls->mu);
    if (--c->users == 0 && c != tls->current) ls_tls_creds_drop(tls, c);
    pthread_mutex_unlock(&tls->mu);
}

const char *ls_tls_describe(const ls_tls *tls) {
    return tls->paths[LS_TLS_CA][0] ? " (TLS, client certificates required)" : " (TLS)";
}
