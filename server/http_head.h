/* The rules a request's head must pass before it is routed: the Host
 * header (DNS rebinding), Origin and Sec-Fetch-Site (requests a page of
 * another site makes a browser send), headers that may come only once,
 * and how the body is framed; and the headers every response carries
 * for browsers (framing, sniffing, caching, referrers). Pure functions
 * over ls_http_head, which http.c fills from libmicrohttpd, so the rules
 * are tested without a socket too. docs/api.md (Conventions) says what
 * each rule refuses. */
#ifndef LS_SERVER_HTTP_HEAD_H
#define LS_SERVER_HTTP_HEAD_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"

/* What the rules read of a head: the first value of each header (NULL
 * when absent) and how often it came. Borrowed strings. */
typedef struct {
    const char *host, *origin, *sec_fetch_site, *adapter, *transfer_encoding;
    int n_host, n_origin, n_adapter, n_content_length, n_transfer_encoding;
    bool http10; /* HTTP/1.0, where a request may lack Host */
    /* The first header name that is not a token (libmicrohttpd keeps a
     * blank before the colon in the name, and appends a folded line to
     * it), and the first X-Lorasink-* name the server does not read. */
    const char *bad_name, *unknown_own;
} ls_http_head;

/* The settings the rules read (borrowed from the configuration): comma
 * lists, "" for none, "*" for any. */
typedef struct {
    const char *allowed_hosts;
    const char *allowed_origins;
} ls_http_head_policy;

/* Notes the header name key in h (bad_name, unknown_own) when it is not
 * a token or is an X-Lorasink-* header the server does not read. */
void ls_http_head_name(ls_http_head *h, const char *key);

/* LS_OK, or the error that refuses the request: 400 invalid_request for a
 * head that is ambiguous (a header given twice, Transfer-Encoding with
 * Content-Length or on HTTP/1.0, a coding other than chunked, an adapter
 * header holding a list, a header name that is not a token or an
 * X-Lorasink-* header the server does not read), 403 forbidden_host or
 * forbidden_origin. open: a route that
 * holds no data (/health, /ready, /dashboard), which any Host may reach,
 * so that probes work whatever name they use. */
ls_status ls_http_head_check(const ls_http_head *h, const ls_http_head_policy *p, bool open, ls_error *err);

/* Whether host (a Host header's value) names an IP address literal
 * (v4, or v6 in brackets) or localhost, with or without a port, or a
 * name of the comma list allowed ("*": any name). */
bool ls_http_host_allowed(const char *host, const char *allowed);

/* Whether a --host to bind names only this machine: localhost,
 * 127.0.0.0/8 or ::1 (a wildcard or any other address is reachable from
 * others). */
bool ls_http_bind_loopback(const char *host);

/* A request target as sent (before any percent-decoding), read for its
 * form. RFC 9112 3.2.2: a server must accept absolute-form
 * ("http://host:8080/forward", any case of http or https) and read the
 * host from it instead of Host. */
typedef struct {
    bool absolute;   /* absolute-form; else origin-form (or "*"), served as the target itself */
    char host[256];  /* absolute-form: the authority as sent ("" for none) */
    const char *why; /* absolute-form that cannot be read (static text), else NULL */
} ls_http_target;

/* Reads raw into *t; returns, in absolute-form, what follows the
 * authority (a pointer into raw: "" or "?..." for none), else NULL. An
 * authority with userinfo ("a@host"), a percent escape (whose decoding a
 * proxy in front could read otherwise) or more than 255 bytes is
 * absolute-form with why set. */
const char *ls_http_target_read(const char *raw, ls_http_target *t);

/* Name and value of each header every response carries, besides
 * Content-Security-Policy (below). Static. */
extern const char *const ls_http_hardening[][2];
extern const size_t ls_http_hardening_count;

/* The Content-Security-Policy of a response: the dashboard page's (page
 * true: its own scripts and styles, fetches to this server only), or
 * none at all for everything else; neither may be framed. Static. */
const char *ls_http_csp(bool page);

#endif
