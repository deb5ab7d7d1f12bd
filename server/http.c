/* The requests libmicrohttpd hands over: the three-phase handler
 * (allocate state and check head rules, route, auth, size and media
 * type; consume the body under the size cap; dispatch and reply) and the
 * one place where responses are created, queued and destroyed. A request that may wait
 * (a forward in the batcher, an adapter load, an auto-load) has its
 * connection suspended while it does, so HTTP threads never wait. The
 * routing table is server/routes.c, the daemon server/http_daemon.c. */
#include <ctype.h>
#include <errno.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "common/log.h"
#include "common/mem.h"
#include "common/text.h"
#include "api/forward.h"
#include "server/batcher.h"
#include "server/guard.h"
#include "server/http_head.h"
#include "server/offload.h"
#include "server/http_internal.h"
#include "server/http_status.h"
#include "server/jobs.h"
#include "server/routes.h"
#include "server/tenant.h"

/* The longest request target (path and query) and the most query
 * parameters a request may carry; no route reads more than ten. */
#define LS_HTTP_TARGET_MAX 8192
#define LS_HTTP_QUERY_MAX 64

/* Where a request stands: one phase, moved forward by the handler and,
 * while the connection is suspended, by the one worker or batch that
 * holds it (which sets it before resuming the connection, and the
 * resume orders that write before the handler's read). */
typedef enum {
    LS_PHASE_LINE,       /* only the request line has come */
    LS_PHASE_BODY,       /* the head passed its checks: the body (if any) arrives */
    LS_PHASE_DISCARDING, /* the body ran past the cap, or the --max-queue-mb budget: dropped, 413
                          * (429 when overloaded) once it ends */
    LS_PHASE_AWAY,       /* suspended: a worker or the batcher has the request */
    LS_PHASE_ANSWERED,   /* resumed: a worker left its reply in reply */
    LS_PHASE_COMPUTED,   /* resumed: the batch has run fjob */
    LS_PHASE_REPLIED,    /* a response is queued */
} ls_phase;

typedef struct {
    ls_phase phase;
    size_t target_len;       /* the request target's bytes, as sent */
    size_t query_n;          /* its query parameters */
    const ls_route *route;
    const char *label; /* metrics label: the route pattern or "other" */
    char param[256];
    char allow[64]; /* Allow header of a 405 */
    ls_body_kind kind;
    uint8_t *body;
    size_t len, cap;
    size_t discarded; /* body bytes dropped past the limit */
    /* The body's bytes counted as they arrive: a /forward's in
     * srv->metrics.queue_bytes (--max-queue-mb) until its handler takes
     * them over with the rest of the request (ls_request.held); any
     * other's in upload_bytes (--max-upload-mb) until it is answered. */
    size_t held;
    bool overloaded; /* discarded for the budget, not the size */
    ls_forward_job *fjob; /* a /forward bound for the batcher */
    /* Counted by ls_batcher_arriving, not yet submitted: a count the
     * batcher reads to wait for companions, not a phase of the request. */
    bool arriving;
    ls_offload_job ojob;  /* this request on an offload worker (connection suspended) */
    ls_adapter_load_job *ljob; /* a POST /adapters validated, waiting to be registered */
    ls_reply reply;       /* a worker's answer (LS_PHASE_ANSWERED) */
    ls_server *srv;               /* for the workers' callbacks */
    struct MHD_Connection *conn;
    struct timespec t0;
    const char *method, *url; /* MHD's, valid for the whole request: for the access log */
    /* The target as sent, read before libmicrohttpd decodes it: in
     * absolute-form its host is read in place of Host, and path (owned)
     * is what follows the host, decoded here. */
    ls_http_target target;
    char *path;
    char request_id[LS_REQUEST_ID_MAX + 1];
    ls_guard_conn *gc;  /* the connection's state in the guard (NULL: unguarded) */
    bool body_done;     /* the guard was told the body came whole */
    ls_principal who;   /* the caller (server/tenant.h), set in the first phase */
} ls_conn_state;

/* Seeds the ids this process generates (http_daemon.c seeds it): two
 * servers started in the same second still differ by their pid. */
atomic_ullong ls_http_id_state;

static double ls_elapsed_s(const struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* The guard's state of the connection (MHD_OPTION_NOTIFY_CONNECTION's
 * socket context), or NULL. */
ls_guard_conn *ls_http_guard_conn(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *i = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return i ? i->socket_context : NULL;
}

/* The client's X-Request-Id when it is 1 to LS_REQUEST_ID_MAX printable
 * ASCII characters without spaces (so it can be logged and echoed as it
 * is), else a new 16-hex-digit id; into id. */
static void ls_http_request_id(struct MHD_Connection *conn, char *id) {
    const char *v = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
    size_t n = 0;
    while (v && v[n] && n <= LS_REQUEST_ID_MAX && v[n] > ' ' && v[n] < 0x7f) n++;
    if (v && n > 0 && n <= LS_REQUEST_ID_MAX && !v[n]) {
        memcpy(id, v, n + 1);
        return;
    }
    ls_http_new_request_id(id);
}

void ls_http_new_request_id(char *id) {
    uint64_t s = atomic_fetch_add(&ls_http_id_state, 0x9e3779b97f4a7c15ULL);
    snprintf(id, LS_REQUEST_ID_MAX + 1, "%016llx", (unsigned long long)ls_splitmix64(&s));
}

/* The fields of a request the log shows, each written by
 * ls_text_log_field: a method, path or id a client chose never splits a
 * line or reaches a terminal raw ("GET\x1b[2J" is GET%1B[2J). */
typedef struct {
    char id[3 * LS_REQUEST_ID_MAX + 1];
    char method[128];
    char path[512];
} ls_http_log_fields;

static void ls_http_log_fields_of(const ls_conn_state *st, ls_http_log_fields *f) {
    ls_text_log_field(st->request_id, false, f->id, sizeof f->id);
    ls_text_log_field(st->method, false, f->method, sizeof f->method);
    ls_text_log_field(st->url, false, f->path, sizeof f->path);
}

/* Who the request came from, as the access log shows it: the key's id,
 * "-" when none was taken (a 401, a refusal before the key was looked at). */
static const char *ls_http_who(const ls_conn_state *st) { return st->who.key_id[0] ? st->who.key_id : "-"; }

/* The response of r's body, which it takes (freed with the response):
 * sent from where it lies, r->skip bytes into its buffer, never copied. */
static struct MHD_Response *ls_http_response(ls_reply *r) {
    if (!r->body) return MHD_create_response_from_buffer(r->len, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r->skip) return MHD_create_response_from_buffer(r->len, r->body, MHD_RESPMEM_MUST_FREE);
    return MHD_create_response_from_buffer_with_free_callback_cls(r->len, r->body + r->skip, free, r->body);
}

/* Creates, decorates, queues and destroys the response; frees r->body. */
static enum MHD_Result ls_http_send(struct MHD_Connection *conn, ls_server *srv, ls_conn_state *st, ls_reply *r) {
    /* The guard's reaper may have answered 408 on the socket already. */
    if (!ls_guard_body_done(srv->guard, st->gc)) {
        free(r->body);
        r->body = NULL;
        return MHD_NO;
    }
    /* A 5xx is the server's trouble, not the client's: the operator
     * reads it in the log (the error body says what and how to fix).
     * A drain's 503 shutting_down is what a stop is meant to answer (a
     * probe asks /ready at every beat of it): the access line is enough. */
    ls_http_log_fields f;
    ls_http_log_fields_of(st, &f);
    if (r->status >= 500 && r->code != LS_SHUTTING_DOWN) {
        size_t n = r->body ? r->len : 0;
        while (n && r->body[n - 1] == '\n') n--;
        char body[3 * 400 + 1], cut[401];
        snprintf(cut, sizeof cut, "%.*s", (int)(n > 400 ? 400 : n), r->body ? r->body : "");
        ls_text_log_field(cut, true, body, sizeof body);
        ls_log_error("%s %s %s: %d %s", f.id, f.method, f.path, r->status, body);
    }
    /* A tenant's errors name its adapters as it does (server/tenant.h). */
    if (r->status >= 400 && r->body) r->len = ls_tenant_strip_body(&st->who, r->body, r->len);
    struct MHD_Response *resp = ls_http_response(r);
    if (!resp) {
        free(r->body);
        return MHD_NO;
    }
    r->body = NULL;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type ? r->content_type : "application/json");
    MHD_add_response_header(resp, "X-Lorasink-Version", LS_VERSION);
    MHD_add_response_header(resp, "X-Request-Id", st->request_id);
    if (r->retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", r->retry_after);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, v);
    }
    for (size_t i = 0; i < ls_http_hardening_count; i++)
        MHD_add_response_header(resp, ls_http_hardening[i][0], ls_http_hardening[i][1]);
    const bool page = r->content_type && !strncmp(r->content_type, "text/html", 9);
    MHD_add_response_header(resp, "Content-Security-Policy", ls_http_csp(page));
    if (r->allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow);
    if (r->www_authenticate) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"lorasink\"");
    /* While stopping, keep-alive clients must not hold shutdown open; a
     * connection from the reserve serves one probe. */
    if (atomic_load(&srv->stopping) || ls_guard_reserved(st->gc))
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    /* The body bytes sent: none for HEAD (its Content-Length is GET's). */
    const size_t bytes = strcmp(st->method, "HEAD") ? r->len : 0;
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    const double elapsed = ls_elapsed_s(&st->t0);
    ls_metrics_observe_request(&srv->metrics, st->label, r->status, elapsed);
    if (srv->cfg.access_log) {
        /* Who: the client's address and the key's id ("none" without
         * auth, "-" for a request no key was taken for). */
        char peer[INET6_ADDRSTRLEN];
        ls_guard_peer(st->gc, peer, sizeof peer);
        ls_log_access("%s %s %s %d %zu %lld %s %s", f.id, f.method, f.path, r->status, bytes,
                      (long long)(elapsed * 1e6), peer, ls_http_who(st));
    }
    st->phase = LS_PHASE_REPLIED;
    return ret;
}

/* The bearer token of the request, or NULL. A value whose length runs
 * past a NUL byte is refused, as a C string would end early there.
 * (libmicrohttpd 0.9.75 itself cuts a header value at a NUL, so
 * "KEY\0junk" reaches us as "KEY": accepted, but only with the key.) */
static const char *ls_http_bearer(struct MHD_Connection *conn) {
    const char *h = NULL;
    size_t hl = 0;
    if (MHD_lookup_connection_value_n(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION,
                                      strlen(MHD_HTTP_HEADER_AUTHORIZATION), &h, &hl) != MHD_YES ||
        !h || strlen(h) != hl || strncasecmp(h, "Bearer ", 7))
        return NULL;
    return h + 7;
}

/* Who the request comes from (st->who), and whether that caller may use
 * this route now: false with r filled (401, 403 for a viewer's change,
 * 429 past its rate). An open route needs no key: its caller sees no
 * tenant's adapters unless the server has no key at all. */
static bool ls_http_auth(ls_server *srv, struct MHD_Connection *conn, ls_conn_state *st, const char *method,
                         ls_reply *r) {
    int retry = 0;
    const ls_auth a = ls_tenants_authorize(srv->tenants, srv->cfg.api_key, ls_http_bearer(conn), &st->who, &retry);
    if (st->route->open) {
        if (a != LS_AUTH_OK) st->who = (ls_principal){.role = LS_ROLE_VIEWER, .max_adapters = 0};
        return true;
    }
    if (a == LS_AUTH_DENIED) {
        /* A key was sent and is not taken: saying so tells the client
         * nothing it did not send, and sends it to the right fix. */
        if (ls_http_bearer(conn))
            ls_reply_fail(r, LS_UNAUTHORIZED,
                          "check the key: it must be the --api-key or one whose SHA-256 is in --api-keys (a removed "
                          "key is refused as soon as the file is read again)",
                          "the key sent in Authorization: Bearer is not one this server takes");
        else ls_reply_fail(r, LS_UNAUTHORIZED, NULL, "this route needs Authorization: Bearer <api key>");
        return false;
    }
    if (a == LS_AUTH_RATE) {
        ls_reply_fail(r, LS_RATE_LIMITED, NULL, "key %s is past its rate in --api-keys", st->who.key_id);
        r->retry_after = retry;
        return false;
    }
    if (st->who.role == LS_ROLE_VIEWER && strcmp(method, "GET") && strcmp(method, "HEAD")) {
        ls_reply_fail(r, LS_FORBIDDEN, NULL, "a viewer key may not %s %s", method, st->route->pattern);
        return false;
    }
    return true;
}

/* The Content-Length of the request when it is a number within max,
 * else 4096 (a first guess for a chunked body). */
static size_t ls_http_content_length(struct MHD_Connection *conn, size_t max) {
    const char *v = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    char *end = NULL;
    errno = 0;
    unsigned long long n = v ? strtoull(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || n == 0 || n > max) return 4096;
    return (size_t)n;
}

/* Decides how to read the body from Content-Type; false = unsupported. */
static bool ls_http_body_kind(struct MHD_Connection *conn, ls_body_kind *kind) {
    const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    /* curl -d sends form-urlencoded by default; the body is still JSON. */
    if (!ct || !*ct || !strncasecmp(ct, "application/json", 16) || !strncasecmp(ct, "text/plain", 10) ||
        !strncasecmp(ct, "application/x-www-form-urlencoded", 33)) {
        *kind = LS_BODY_JSON;
        return true;
    }
    if (!strncasecmp(ct, "application/octet-stream", 24)) {
        *kind = LS_BODY_SAFETENSORS;
        return true;
    }
    return false;
}

/* Counts each header the head rules read and keeps its first value. */
static enum MHD_Result ls_http_head_visit(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    ls_http_head *h = cls;
    ls_http_head_name(h, key);
    const struct {
        const char *name;
        const char **first;
        int *n;
    } f[] = {{MHD_HTTP_HEADER_HOST, &h->host, &h->n_host},
             {MHD_HTTP_HEADER_ORIGIN, &h->origin, &h->n_origin},
             {"Sec-Fetch-Site", &h->sec_fetch_site, NULL},
             {LS_FORWARD_ADAPTER_HEADER, &h->adapter, &h->n_adapter},
             {MHD_HTTP_HEADER_CONTENT_LENGTH, NULL, &h->n_content_length},
             {MHD_HTTP_HEADER_TRANSFER_ENCODING, &h->transfer_encoding, &h->n_transfer_encoding}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (strcasecmp(key, f[i].name)) continue;
        if (f[i].first && !*f[i].first) *f[i].first = value ? value : "";
        if (f[i].n) (*f[i].n)++;
    }
    return MHD_YES;
}

/* The head rules (server/http_head.h) on this request's head. */
static bool ls_http_head_ok(ls_server *srv, struct MHD_Connection *conn, const char *version, const ls_conn_state *st,
                            bool open, ls_reply *r) {
    ls_http_head h = {.http10 = version && !strcmp(version, MHD_HTTP_VERSION_1_0)};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, ls_http_head_visit, &h);
    /* HTTP/1.1 must send Host even with an absolute target (RFC 9112
     * 3.2): without one it stays missing and is refused below. */
    if (st->target.absolute && (h.host || h.http10)) h.host = st->target.host;
    const ls_http_head_policy p = {srv->cfg.allowed_hosts, srv->cfg.allowed_origins};
    ls_error err;
    ls_error_init(&err);
    const bool ok = ls_http_head_check(&h, &p, open, &err) == LS_OK;
    if (!ok) ls_reply_error(r, &err);
    ls_error_free(&err);
    return ok;
}

/* Whether the request is a forward, whose bytes count against
 * --max-queue-mb; any other body counts against --max-upload-mb. */
static bool ls_http_is_forward(const ls_conn_state *st) { return st->route->steps == LS_STEPS_FORWARD; }

/* The count a body's bytes go to, and its budget in bytes. */
static atomic_ullong *ls_http_budget(ls_server *srv, const ls_conn_state *st, unsigned long long *budget) {
    const int mb = ls_http_is_forward(st) ? srv->cfg.max_queue_mb : srv->cfg.max_upload_mb;
    *budget = (unsigned long long)mb << 20;
    return ls_http_is_forward(st) ? &srv->metrics.queue_bytes : &srv->metrics.upload_bytes;
}

/* Whether a body of total bytes would fit its budget beside what other
 * requests hold now (a request alone always does, as at the forward
 * handler's count). Counts nothing: a head alone costs no memory, and a
 * few heads that promise large bodies must not refuse everyone. */
static bool ls_http_body_fits(ls_server *srv, const ls_conn_state *st, size_t total) {
    unsigned long long budget;
    atomic_ullong *held = ls_http_budget(srv, st, &budget);
    return ls_metrics_budget_fits(held, st->held, total > st->held ? total - st->held : 0, budget);
}

/* Counts a body's total bytes arrived so far in its budget. False,
 * counting nothing more, when other requests hold bytes and this would
 * pass it. */
static bool ls_http_hold_body(ls_server *srv, ls_conn_state *st, size_t total) {
    if (total <= st->held) return true;
    unsigned long long budget, others;
    atomic_ullong *held = ls_http_budget(srv, st, &budget);
    if (!ls_metrics_budget_take(held, st->held, total - st->held, budget, &others)) return false;
    st->held = total;
    return true;
}

/* The body will never reach its handler, or its request is answered:
 * it leaves the budget's count. */
static void ls_http_release_body(ls_server *srv, ls_conn_state *st) {
    if (!st->held) return;
    unsigned long long budget;
    atomic_fetch_sub(ls_http_budget(srv, st, &budget), st->held);
    st->held = 0;
}

static void ls_http_refuse_budget(ls_server *srv, const ls_conn_state *st, ls_reply *r, size_t bytes) {
    ls_metrics_overload(&srv->metrics);
    if (ls_http_is_forward(st))
        ls_reply_fail(r, LS_OVERLOADED, "retry after a short wait, or send fewer tokens per request",
                      "forward requests in flight hold the %d MiB budget (--max-queue-mb): this body of %.1f MiB "
                      "does not fit beside them",
                      srv->cfg.max_queue_mb, (double)bytes / 1048576.0);
    else
        ls_reply_fail(r, LS_OVERLOADED, "retry after a short wait: the uploads in flight are answered first",
                      "the bodies of uploads in flight hold the %d MiB budget (--max-upload-mb): this body of "
                      "%.1f MiB does not fit beside them",
                      srv->cfg.max_upload_mb, (double)bytes / 1048576.0);
}

/* Whether the head frames no body: no Transfer-Encoding, and no
 * Content-Length or one of 0. */
static bool ls_http_bodiless(struct MHD_Connection *conn) {
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    return !MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) &&
           (!cl || !strcmp(cl, "0"));
}

/* First call of a request: head rules, route, auth, size and media type.
 * Returns true when the request is answered: its reply queued, or kept
 * for the next call. */
static bool ls_http_begin(ls_server *srv, struct MHD_Connection *conn, const char *url, const char *method,
                          const char *version, ls_conn_state *st, enum MHD_Result *ret) {
    char allow[64];
    ls_reply r = {0};
    bool head_ok = false;
    st->route = ls_route_find(method, url, st->param, sizeof st->param, allow, sizeof allow);
    st->label = st->route ? st->route->pattern : "other";
    if (st->target_len > LS_HTTP_TARGET_MAX || st->query_n > LS_HTTP_QUERY_MAX) {
        if (!st->route) st->label = ls_route_label(url);
        ls_reply_fail(&r, LS_URI_TOO_LONG, NULL,
                      "the request target is %zu bytes with %zu query parameters: at most %d bytes and %d "
                      "parameters are read",
                      st->target_len, st->query_n, LS_HTTP_TARGET_MAX, LS_HTTP_QUERY_MAX);
    } else if (st->target.why || (st->target.absolute && !st->path)) {
        if (!st->route) st->label = ls_route_label(url);
        ls_reply_fail(&r, LS_INVALID_REQUEST, "send the target as /PATH, with the host in Host",
                      "the absolute-form request target's host %s",
                      st->target.why ? st->target.why : "could not be read (out of memory)");
    } else if (ls_guard_reserved(st->gc) && !(st->route && st->route->probe)) {
        if (!st->route) st->label = ls_route_label(url);
        ls_reply_fail(&r, LS_TOO_MANY_CONNECTIONS, NULL,
                      "this connection is past the open-connection cap of its address or of the server: it "
                      "serves only GET /health and GET /ready");
    } else if (!(head_ok = ls_http_head_ok(srv, conn, version, st, st->route && st->route->open, &r))) {
        if (!st->route) st->label = ls_route_label(url);
    } else if (!st->route && allow[0]) {
        st->label = ls_route_label(url);
        snprintf(st->allow, sizeof st->allow, "%s", allow);
        r.allow = st->allow;
        ls_reply_fail(&r, LS_METHOD_NOT_ALLOWED, NULL, "%s is not allowed on %s (allowed: %s)", method, url, allow);
    } else if (!st->route) {
        ls_reply_fail(&r, LS_NOT_FOUND, ls_http_routes_hint, "no route %s %s", method, url);
    } else if (!ls_http_auth(srv, conn, st, method, &r)) {
        /* r holds the refusal */
    } else if (st->route->has_body) {
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        unsigned long long max = (unsigned long long)srv->cfg.max_body_mb << 20;
        if (!ls_http_body_kind(conn, &st->kind))
            ls_reply_fail(&r, LS_UNSUPPORTED_MEDIA_TYPE, NULL, "Content-Type %s is not supported",
                          MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE));
        else if (cl && strtoull(cl, NULL, 10) > max)
            ls_reply_fail(&r, LS_PAYLOAD_TOO_LARGE, NULL, "the body of %s bytes is over the limit of %d MiB", cl,
                          srv->cfg.max_body_mb);
        /* Refused before it is read when it cannot fit now. */
        else if (cl && !ls_http_body_fits(srv, st, (size_t)strtoull(cl, NULL, 10)))
            ls_http_refuse_budget(srv, st, &r, (size_t)strtoull(cl, NULL, 10));
        else return false;
    } else {
        return false;
    }
    if (head_ok && ls_http_bodiless(conn)) {
        /* Queued now, libmicrohttpd would close the connection (it
         * cannot know no body follows); on the next call, which comes
         * at once, the connection is kept: a client retrying a 401 or a
         * 429 saves a connection, and a TLS handshake. */
        st->reply = r;
        st->phase = LS_PHASE_ANSWERED;
        *ret = MHD_YES;
        return true;
    }
    *ret = ls_http_send(conn, srv, st, &r);
    return true;
}

/* The request as the handlers see it. The connection is read from an
 * offload worker too: its headers and arguments stay put while it is
 * suspended. */
static ls_request ls_http_request(ls_server *srv, struct MHD_Connection *conn, const ls_conn_state *st) {
    return (ls_request){.srv = srv,
                        .conn = conn,
                        .method = st->method,
                        .path = st->url,
                        .param = st->param[0] ? st->param : NULL,
                        .body = st->body,
                        .len = st->len,
                        .kind = st->kind,
                        .who = &st->who};
}

static void ls_http_dispatch(ls_server *srv, struct MHD_Connection *conn, ls_conn_state *st, ls_reply *r) {
    if (st->phase == LS_PHASE_DISCARDING && st->overloaded) {
        ls_http_refuse_budget(srv, st, r, st->discarded);
        return;
    }
    if (st->phase == LS_PHASE_DISCARDING) {
        ls_reply_fail(r, LS_PAYLOAD_TOO_LARGE, NULL, "the body is over the limit of %d MiB", srv->cfg.max_body_mb);
        return;
    }
    ls_request req = ls_http_request(srv, conn, st);
    if (ls_http_is_forward(st)) { /* the handler's now; another's stays counted until answered */
        req.held = st->held;
        st->held = 0;
    }
    st->route->fn(&req, r);
}

/* This forward will not reach the batcher after all (refused, served
 * synchronously, or its client went away): batches stop waiting for it. */
static void ls_http_arrived(ls_server *srv, ls_conn_state *st) {
    if (!st->arriving) return;
    st->arriving = false;
    ls_batcher_arrived(srv->batcher);
}

/* The last step away from the HTTP thread: the phase the handler finds
 * when it is called again, then the connection resumed. st may be freed
 * as soon as the connection is resumed, so it is read before. */
static void ls_http_resume(ls_conn_state *st, ls_phase phase) {
    ls_server *srv = st->srv;
    st->phase = phase;
    MHD_resume_connection(st->conn);
    atomic_fetch_sub(&srv->suspended, 1);
}

static void ls_http_forward_again(void *ctx);

/* The batcher's done(): the batch has run (on the batcher's worker, or at a failed submit). A
 * forward that goes again (server/jobs.h) does so from a disk worker,
 * its connection still suspended; else the connection resumes. */
static void ls_http_computed(void *ctx) {
    ls_conn_state *st = ctx;
    if (!ls_forward_again(st->fjob)) {
        ls_http_resume(st, LS_PHASE_COMPUTED);
        return;
    }
    /* No worker holds ojob while the batch has the forward; a forward
     * whose adapters were all registered never had one set up. */
    st->ojob = (ls_offload_job){.run = ls_http_forward_again, .ctx = st};
    ls_offload_submit(st->srv->offload_disk, &st->ojob);
}

/* On a worker: st->reply holds the answer; the resumed connection sends
 * it. */
static void ls_http_answered(ls_conn_state *st) { ls_http_resume(st, LS_PHASE_ANSWERED); }

/* Hands the prepared forward to the batcher, whose worker resumes the
 * (suspended) connection when the batch has run. */
static void ls_http_forward_submit(ls_server *srv, ls_conn_state *st) {
    ls_batch_job *job = ls_forward_batch_job(st->fjob);
    job->done = ls_http_computed;
    job->done_ctx = st;
    job->arriving = st->arriving; /* submit uncounts it */
    st->arriving = false;
    ls_status s = ls_batcher_submit(srv->batcher, job, &job->err);
    if (s != LS_OK) {
        job->status = s;
        ls_http_computed(st);
    }
}

/* The workers that run steps on `on` (never LS_RUN_HTTP). */
static ls_offload *ls_http_workers(ls_server *srv, ls_run_on on) {
    return on == LS_RUN_DISK ? srv->offload_disk : srv->offload;
}

/* Suspends the connection and queues run(st) on a worker of `on`. The
 * caller counted the suspension in srv->suspended. */
static enum MHD_Result ls_http_offload(ls_server *srv, struct MHD_Connection *conn, ls_conn_state *st, ls_run_on on,
                                       void (*run)(void *)) {
    st->srv = srv;
    st->conn = conn;
    st->phase = LS_PHASE_AWAY;
    st->ojob = (ls_offload_job){.run = run, .ctx = st};
    MHD_suspend_connection(conn);
    ls_offload_submit(ls_http_workers(srv, on), &st->ojob);
    return MHD_YES;
}

/* On an offload worker: the route's handler, then the reply is sent. */
static void ls_http_offload_dispatch(void *ctx) {
    ls_conn_state *st = ctx;
    ls_http_dispatch(st->srv, st->conn, st, &st->reply);
    ls_http_answered(st);
}

/* On a backend worker: the validated upload is registered. */
static void ls_http_offload_commit(void *ctx) {
    ls_conn_state *st = ctx;
    ls_adapter_load_commit(st->ljob, &st->reply);
    st->ljob = NULL;
    ls_http_answered(st);
}

/* On a disk worker: an upload is parsed and validated, so that its errors
 * do not wait behind loads that wait for the backend; a valid one moves
 * on to the backend workers. (The disk worker is done with ojob once it
 * has called this, so the job is queued again as it is.) */
static void ls_http_offload_load(void *ctx) {
    ls_conn_state *st = ctx;
    ls_request req = ls_http_request(st->srv, st->conn, st);
    st->ljob = ls_adapter_load_prepare(&req, &st->reply);
    if (st->ljob) {
        st->ojob.run = ls_http_offload_commit;
        ls_offload_submit(ls_http_workers(st->srv, LS_RUN_BACKEND), &st->ojob);
        return;
    }
    ls_http_answered(st);
}

static void ls_http_forward_load(void *ctx);

/* On a worker: the forward's next step, where it runs: the batch, a
 * backend worker (registering an adapter, or waiting for another
 * request's load) or, when answered, the reply. */
static void ls_http_forward_next(ls_conn_state *st, ls_forward_step next) {
    if (next == LS_FORWARD_BATCH) {
        ls_http_forward_submit(st->srv, st);
    } else if (next == LS_FORWARD_LOAD) {
        st->ojob.run = ls_http_forward_load; /* this worker is done with ojob */
        ls_offload_submit(ls_http_workers(st->srv, LS_RUN_BACKEND), &st->ojob);
    } else {
        ls_forward_job_free(st->fjob);
        st->fjob = NULL;
        ls_http_answered(st);
    }
}

/* On a disk worker: a forward's adapters read and validated, so that a
 * bad file's error never waits behind loads that wait for the backend. */
static void ls_http_forward_read(void *ctx) {
    ls_conn_state *st = ctx;
    ls_http_forward_next(st, ls_forward_read(st->fjob, &st->reply));
}

/* On a backend worker: the adapters read are registered (or another
 * request's load is waited for), then the forward is batched. */
static void ls_http_forward_load(void *ctx) {
    ls_conn_state *st = ctx;
    ls_http_forward_next(st, ls_forward_load(st->fjob, &st->reply));
}

/* On a disk worker: the forward's adapters looked at again after its
 * batch found one deleted; it goes on from the step that leaves. */
static void ls_http_forward_again(void *ctx) {
    ls_conn_state *st = ctx;
    const ls_forward_step next = ls_forward_restart(st->fjob, &st->reply);
    if (next == LS_FORWARD_READ) ls_http_forward_read(st);
    else ls_http_forward_next(st, next);
}

/* Parses the forward, suspends the connection and hands the job to the
 * batcher (or first to an offload worker, when an adapter must be
 * loaded). The caller counted the suspension in srv->suspended. */
static enum MHD_Result ls_http_forward_async(ls_server *srv, struct MHD_Connection *conn, ls_conn_state *st) {
    ls_reply r = {0};
    ls_request req = ls_http_request(srv, conn, st);
    req.held = st->held; /* the job's now */
    st->held = 0;
    ls_forward_step next;
    st->fjob = ls_forward_prepare(&req, &next, &r);
    if (next == LS_FORWARD_READ || next == LS_FORWARD_LOAD) {
        /* Batches must not wait for a load: it is no longer arriving. */
        ls_http_arrived(srv, st);
        return ls_http_offload(srv, conn, st, next == LS_FORWARD_READ ? LS_RUN_DISK : LS_RUN_BACKEND,
                               next == LS_FORWARD_READ ? ls_http_forward_read : ls_http_forward_load);
    }
    if (!st->fjob) {
        ls_http_arrived(srv, st);
        atomic_fetch_sub(&srv->suspended, 1);
        return ls_http_send(conn, srv, st, &r);
    }
    st->srv = srv;
    st->conn = conn;
    st->phase = LS_PHASE_AWAY;
    /* Suspend before submitting: the worker may resume at once. */
    MHD_suspend_connection(conn);
    ls_http_forward_submit(srv, st);
    return MHD_YES;
}

/* The first call, the head whole: the request's state, its checks (a
 * refusal is answered at once, or on the next call when no body follows)
 * and the body's deadline. */
static enum MHD_Result ls_http_first(ls_server *srv, struct MHD_Connection *conn, const char *url, const char *method,
                                     const char *version, void **con_cls) {
    ls_conn_state *st = *con_cls;
    if (!st && !(st = calloc(1, sizeof *st))) return MHD_NO;
    st->phase = LS_PHASE_BODY; /* a refusal below moves it on to REPLIED */
    clock_gettime(CLOCK_MONOTONIC, &st->t0);
    st->method = method;
    if (st->target.absolute && st->path) url = st->path;
    st->url = url;
    ls_http_request_id(conn, st->request_id);
    st->gc = ls_http_guard_conn(conn);
    *con_cls = st;
    atomic_fetch_add(&srv->active, 1);
    enum MHD_Result ret;
    if (ls_http_begin(srv, conn, url, method, version, st, &ret)) return ret;
    /* From here until the body is whole, the body's deadline. */
    char what[sizeof(ls_http_log_fields)];
    ls_http_log_fields f;
    ls_http_log_fields_of(st, &f);
    snprintf(what, sizeof what, "%s %s", f.method, f.path);
    if (!ls_guard_head_done(srv->guard, st->gc, st->request_id, what, ls_http_who(st), st->label)) return MHD_NO;
    if (srv->batcher && st->route->steps == LS_STEPS_FORWARD) {
        ls_batcher_arriving(srv->batcher);
        st->arriving = true;
    }
    return MHD_YES;
}

/* n more bytes of the body, kept under the size cap. */
static enum MHD_Result ls_http_take_body(ls_server *srv, struct MHD_Connection *conn, ls_conn_state *st,
                                         const char *data, size_t n) {
    size_t max = (size_t)srv->cfg.max_body_mb << 20;
    /* A route that reads no body (the open /health and /ready among
     * them) must not buffer one: drop it unread. */
    if (!st->route->has_body) return MHD_YES;
    if (st->phase == LS_PHASE_DISCARDING || n > max - st->len) {
        /* Discard up to one more limit's worth so a client that
         * overshoots a little still reads its 413; past that, close
         * the connection rather than read an endless body. */
        st->phase = LS_PHASE_DISCARDING;
        st->discarded += n;
        return st->discarded > max ? MHD_NO : MHD_YES;
    }
    /* Counted as it arrives (the buffer's pages are committed only as
     * they are written): past the budget, dropped as it comes, 429 when
     * it ends. */
    if (!ls_http_hold_body(srv, st, st->len + n)) {
        st->overloaded = true;
        st->phase = LS_PHASE_DISCARDING;
        st->discarded = st->len + n;
        free(st->body);
        st->body = NULL;
        st->len = st->cap = 0;
        ls_http_release_body(srv, st);
        return MHD_YES;
    }
    if (st->len + n > st->cap) {
        /* Sized once from Content-Length when it is given (it is
         * within the limit, or the request was refused above), so a
         * large body is neither copied as it grows nor held twice. */
        size_t cap = st->cap ? st->cap : ls_http_content_length(conn, max);
        while (cap < st->len + n) cap = cap > max / 2 ? max : cap * 2;
        uint8_t *b = realloc(st->body, cap);
        if (!b) return MHD_NO;
        ls_mem_advise_large(b, cap);
        st->body = b;
        st->cap = cap;
    }
    memcpy(st->body + st->len, data, n);
    st->len += n;
    return MHD_YES;
}

/* The body is whole: the route's steps (server/routes.h) begin. A step
 * off the HTTP thread suspends the connection; the rest run here. */
static enum MHD_Result ls_http_run(ls_server *srv, struct MHD_Connection *conn, ls_conn_state *st) {
    const ls_route *rt = st->route;
    ls_reply r = {0};
    /* Without either header there is no body to read, whatever the
     * client sent after its head (HTTP/1.0 has no other framing). */
    const bool empty = rt->has_body && st->len == 0 && st->phase != LS_PHASE_DISCARDING;
    const bool framed = empty && (MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH) ||
                                  MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING));
    if (empty && (!framed || st->kind == LS_BODY_JSON)) {
        /* Said plainly: the JSON readers would call it a malformed
         * number. (An empty safetensors body that was framed is the
         * safetensors reader's safetensors_invalid, as any file too short
         * for its header.) */
        ls_http_arrived(srv, st);
        if (framed) ls_reply_fail(&r, LS_INVALID_JSON, "send a JSON object", "the body is empty");
        else
            ls_reply_fail(&r, LS_INVALID_REQUEST, "send Content-Length: N with the body (curl -d does)",
                          "the body is empty: the request has no Content-Length (nor Transfer-Encoding: chunked), so "
                          "nothing after its head is read as its body");
        return ls_http_send(conn, srv, st, &r);
    }
    const bool away = rt->on != LS_RUN_HTTP || rt->steps != LS_STEPS_HANDLER;
    if (st->phase != LS_PHASE_DISCARDING && away) {
        /* Count before looking at stopping, so ls_http_stop either sees
         * this suspension or this request sees stopping (then it runs the
         * blocking form below: MHD_stop_daemon must not meet a suspended
         * connection). */
        atomic_fetch_add(&srv->suspended, 1);
        if (!atomic_load(&srv->stopping)) {
            if (rt->steps == LS_STEPS_FORWARD && srv->batcher) return ls_http_forward_async(srv, conn, st);
            if (rt->steps == LS_STEPS_LOAD) return ls_http_offload(srv, conn, st, LS_RUN_DISK, ls_http_offload_load);
            return ls_http_offload(srv, conn, st, rt->on, ls_http_offload_dispatch);
        }
        atomic_fetch_sub(&srv->suspended, 1);
    }
    ls_http_arrived(srv, st);
    atomic_fetch_add(&srv->dispatching, 1);
    ls_http_dispatch(srv, conn, st, &r);
    atomic_fetch_sub(&srv->dispatching, 1);
    return ls_http_send(conn, srv, st, &r);
}

/* libmicrohttpd calls this with the head, with each part of the body,
 * once the body has ended, and again after a resume: each call is read
 * by the request's phase. */
enum MHD_Result ls_http_handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                const char *version, const char *upload_data, size_t *upload_data_size,
                                void **con_cls) {
    ls_server *srv = cls;
    ls_conn_state *st = *con_cls;
    if (!st || st->phase == LS_PHASE_LINE) return ls_http_first(srv, conn, url, method, version, con_cls);
    if (st->phase == LS_PHASE_REPLIED) {
        *upload_data_size = 0; /* discard the rest of a refused body */
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        return ls_http_take_body(srv, conn, st, upload_data, n);
    }
    if (!st->body_done) {
        /* Whole: what remains is the server's work, on no deadline. */
        st->body_done = true;
        /* A body that reaches its handler stays counted: a forward's
         * handler takes its bytes over (ls_request.held), another's
         * stay until it is answered, so no request that came later
         * finds the budget empty in between. */
        if (st->phase == LS_PHASE_DISCARDING) ls_http_release_body(srv, st);
        if (!ls_guard_body_done(srv->guard, st->gc)) return MHD_NO;
    }
    ls_reply r = {0};
    switch (st->phase) {
    case LS_PHASE_ANSWERED:
        r = st->reply;
        st->reply = (ls_reply){0};
        return ls_http_send(conn, srv, st, &r);
    case LS_PHASE_COMPUTED:
        ls_forward_complete(srv, st->fjob, &r);
        return ls_http_send(conn, srv, st, &r);
    default: return ls_http_run(srv, conn, st);
    }
}

void ls_http_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                              enum MHD_RequestTerminationCode toe) {
    (void)toe;
    ls_server *srv = cls;
    /* The connection waits for its next request (or is closing). */
    ls_guard_request_done(srv->guard, ls_http_guard_conn(conn));
    ls_conn_state *st = *con_cls;
    if (!st) return;
    *con_cls = NULL;
    if (st->phase == LS_PHASE_LINE) { /* the head never came whole */
        free(st->path);
        free(st);
        return;
    }
    ls_http_arrived(srv, st); /* a body cut short */
    ls_http_release_body(srv, st);
    ls_forward_job_free(st->fjob);
    ls_adapter_load_job_free(st->ljob);
    free(st->reply.body); /* a reply never sent */
    free(st->body);
    free(st->path);
    free(st);
    atomic_fetch_sub(&srv->active, 1);
}

/* libmicrohttpd's MHD_OPTION_URI_LOG_CALLBACK: the request line has
 * come, its query not yet split. The request's state begins here. A
 * target over the limits is answered 414 by the handler; its query is
 * emptied first, because libmicrohttpd 0.9.75 keeps a record of every
 * parameter in the connection's memory pool, and when they do not fit
 * it logs a 431 and closes the connection without sending it. Emptying
 * writes into the library's own copy of the line (passed as const),
 * which it splits only after this returns. */
void *ls_http_uri_seen(void *cls, const char *uri, struct MHD_Connection *conn) {
    ls_server *srv = cls;
    ls_guard_request_line(srv->guard, ls_http_guard_conn(conn));
    ls_conn_state *st = calloc(1, sizeof *st);
    if (!st) return NULL; /* the handler tries again */
    st->target_len = strlen(uri);
    char *q = strchr(uri, '?');
    if (q) {
        st->query_n = 1;
        for (const char *c = q + 1; *c; c++) st->query_n += *c == '&';
    }
    if (q && (st->target_len > LS_HTTP_TARGET_MAX || st->query_n > LS_HTTP_QUERY_MAX)) q[1] = '\0';
    /* Read as sent: libmicrohttpd hands the handler a decoded copy, in
     * which an escaped "/" or "@" would move the host's end. */
    const char *path = ls_http_target_read(uri, &st->target);
    if (path && !st->target.why) {
        const size_t n = strcspn(path, "?#");
        if ((st->path = malloc(n + 2))) {
            snprintf(st->path, n + 2, "%s%.*s", n ? "" : "/", (int)n, path);
            MHD_http_unescape(st->path);
        }
    }
    return st;
}

