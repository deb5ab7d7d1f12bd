/* See http_head.h. Why each rule: a page of another origin can make a
 * browser send a "simple" POST (text/plain, a form) without asking first,
 * and a name that once resolved to the attacker's server can resolve to
 * this one later (DNS rebinding), making the attacker's page same-origin
 * with it. Browsers name the page's origin in Origin and the name they
 * resolved in Host; curl and other programs send no Origin, and an IP
 * address or localhost cannot be rebound. */
#include "server/http_head.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "api/forward.h"

/* Whether the comma list holds item (n bytes), compared without case;
 * blanks around entries are ignored. */
static bool ls_head_list_has(const char *list, const char *item, size_t n) {
    for (const char *e = list; *e;) {
        while (*e == ' ' || *e == '\t') e++;
        size_t len = strcspn(e, ",");
        size_t l = len;
        while (l && (e[l - 1] == ' ' || e[l - 1] == '\t')) l--;
        if (l == n && !strncasecmp(e, item, n)) return true;
        e += len;
        if (*e) e++;
    }
    return false;
}

/* The host part of a Host value into host (hlen bytes; a v6 literal
 * without its brackets, *v6 set): false when the value is not host,
 * [v6] or either with ":port". */
static bool ls_head_host_part(const char *v, char *host, size_t hlen, bool *v6) {
    const char *end, *rest;
    *v6 = v[0] == '[';
    if (*v6) {
        const char *close = strchr(v, ']');
        if (!close) return false;
        v++, end = close, rest = close + 1;
    } else {
        const char *colon = strchr(v, ':');
        if (colon && strchr(colon + 1, ':')) return false; /* a v6 literal needs its brackets */
        end = colon ? colon : v + strlen(v), rest = end;
    }
    size_t n = (size_t)(end - v);
    if (n == 0 || n >= hlen) return false;
    if (*rest) {
        size_t digits = strspn(rest + 1, "0123456789");
        if (rest[0] != ':' || digits == 0 || digits > 5 || rest[1 + digits]) return false;
    }
    memcpy(host, v, n);
    host[n] = '\0';
    return true;
}

bool ls_http_bind_loopback(const char *host) {
    struct in_addr v4;
    struct in6_addr v6;
    if (!strcasecmp(host, "localhost")) return true;
    if (inet_pton(AF_INET, host, &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, host, &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

bool ls_http_host_allowed(const char *value, const char *allowed) {
    char host[256];
    unsigned char addr[sizeof(struct in6_addr)];
    bool v6;
    if (!ls_head_host_part(value, host, sizeof host, &v6)) return false;
    if (v6) return inet_pton(AF_INET6, host, addr) == 1;
    if (inet_pton(AF_INET, host, addr) == 1 || !strcasecmp(host, "localhost")) return true;
    return ls_head_list_has(allowed, "*", 1) || ls_head_list_has(allowed, host, strlen(host));
}

/* Whether origin is this server's own: its host and port are the
 * request's Host (whatever the scheme, as a TLS proxy in front changes
 * it), or the list allows it. */
static bool ls_head_origin_allowed(const char *origin, const char *host, const char *allowed) {
    if (ls_head_list_has(allowed, "*", 1) || ls_head_list_has(allowed, origin, strlen(origin))) return true;
    const char *sep = strstr(origin, "://");
    return sep && host && *host && !strcasecmp(sep + 3, host);
}

/* One header given more than once: a proxy may read another copy than
 * the server does. */
static ls_status ls_head_once(const char *name, int n, ls_error *err) {
    if (n <= 1) return LS_OK;
    return ls_error_set(err, LS_INVALID_REQUEST, "send the header once",
                        "the header %s is given %d times: a proxy in front may read another one than this server", name,
                        n);
}

/* RFC 9110's token: what a header name is made of. */
static bool ls_head_token(const char *s) {
    if (!*s) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              strchr("!#$%&'*+-.^_`|~", *s)))
            return false;
    return true;
}

void ls_http_head_name(ls_http_head *h, const char *key) {
    if (!h->bad_name && !ls_head_token(key)) h->bad_name = key;
    if (!h->unknown_own && !strncasecmp(key, "X-Lorasink-", 11) && strcasecmp(key, LS_FORWARD_ADAPTER_HEADER))
        h->unknown_own = key;
}

/* Header names a proxy in front could read as other headers than this
 * server does. */
static ls_status ls_head_names(const ls_http_head *h, ls_error *err) {
    if (h->bad_name)
        return ls_error_set(err, LS_INVALID_REQUEST, "send each header as Name: value on a line of its own",
                            "the header name \"%.64s\" is not a token (a blank before its colon, or a line folded "
                            "onto it): a proxy in front may read it as another header than this server",
                            h->bad_name);
    if (h->unknown_own)
        return ls_error_set(err, LS_INVALID_REQUEST,
                            "name the adapter with " LS_FORWARD_ADAPTER_HEADER " on one line (a folded line is "
                            "appended to the header's name)",
                            "the header %.64s is not one this server reads (" LS_FORWARD_ADAPTER_HEADER " is)",
                            h->unknown_own);
    return LS_OK;
}

/* How the body is framed, and the headers that must be unambiguous. */
static ls_status ls_head_framing(const ls_http_head *h, ls_error *err) {
    ls_status st = ls_head_names(h, err);
    if (st != LS_OK) return st;
    if ((st = ls_head_once("Host", h->n_host, err)) != LS_OK) return st;
    if ((st = ls_head_once("Content-Length", h->n_content_length, err)) != LS_OK) return st;
    if ((st = ls_head_once("Transfer-Encoding", h->n_transfer_encoding, err)) != LS_OK) return st;
    if ((st = ls_head_once(LS_FORWARD_ADAPTER_HEADER, h->n_adapter, err)) != LS_OK) return st;
    if (h->transfer_encoding && h->n_content_length)
        return ls_error_set(err, LS_INVALID_REQUEST, "send either Content-Length or Transfer-Encoding: chunked",
                            "Transfer-Encoding and Content-Length together: a proxy in front and this server could "
                            "read different bodies");
    if (h->transfer_encoding && h->http10)
        return ls_error_set(err, LS_INVALID_REQUEST, "send HTTP/1.1 with Transfer-Encoding: chunked, or a Content-Length",
                            "Transfer-Encoding on an HTTP/1.0 request: HTTP/1.0 has no chunked bodies, and a proxy in "
                            "front may frame the body otherwise");
    if (h->transfer_encoding && strcasecmp(h->transfer_encoding, "chunked"))
        return ls_error_set(err, LS_INVALID_REQUEST, "send Transfer-Encoding: chunked or a Content-Length",
                            "Transfer-Encoding \"%.64s\" is not supported", h->transfer_encoding);
    if (h->adapter && strchr(h->adapter, ','))
        return ls_error_set(err, LS_INVALID_REQUEST, "name one adapter in the header",
                            "the header %s holds a list (\"%.140s\"): a proxy hashing it reads one element of it",
                            LS_FORWARD_ADAPTER_HEADER, h->adapter);
    return LS_OK;
}

ls_status ls_http_head_check(const ls_http_head *h, const ls_http_head_policy *p, bool open, ls_error *err) {
    ls_status st = ls_head_framing(h, err);
    if (st != LS_OK) return st;
    if (!h->host && !h->http10 && !open)
        return ls_error_set(err, LS_INVALID_REQUEST, "send the Host header (HTTP/1.1 requires it)",
                            "an HTTP/1.1 request without Host");
    if (h->host && !open && !ls_http_host_allowed(h->host, p->allowed_hosts))
        return ls_error_set(err, LS_FORBIDDEN_HOST, NULL,
                            "Host \"%.200s\" is neither an IP address, localhost nor a name in --allowed-hosts",
                            h->host);
    if ((st = ls_head_once("Origin", h->n_origin, err)) != LS_OK) return st;
    if (h->origin && !ls_head_origin_allowed(h->origin, h->host, p->allowed_origins))
        return ls_error_set(err, LS_FORBIDDEN_ORIGIN, NULL,
                            "a page of the origin \"%.200s\" may not send requests to this server", h->origin);
    /* A no-cors GET (an image, a script) carries no Origin, only this. */
    if (!h->origin && !open && h->sec_fetch_site && !strcasecmp(h->sec_fetch_site, "cross-site") &&
        !ls_head_list_has(p->allowed_origins, "*", 1))
        return ls_error_set(err, LS_FORBIDDEN_ORIGIN, NULL,
                            "a page of another site may not send requests to this server (Sec-Fetch-Site: "
                            "cross-site)");
    return LS_OK;
}

const char *ls_http_target_read(const char *raw, ls_http_target *t) {
    *t = (ls_http_target){0};
    const size_t scheme = !strncasecmp(raw, "http://", 7) ? 7 : !strncasecmp(raw, "https://", 8) ? 8 : 0;
    if (!scheme) return NULL;
    t->absolute = true;
    const char *auth = raw + scheme;
    const size_t n = strcspn(auth, "/?#");
    if (n >= sizeof t->host) t->why = "is longer than 255 bytes";
    else if (memchr(auth, '@', n)) t->why = "holds userinfo (NAME@), which HTTP does not send";
    else if (memchr(auth, '%', n)) t->why = "holds a percent escape";
    else snprintf(t->host, sizeof t->host, "%.*s", (int)n, auth);
    return auth + n;
}

/* Every answer describes live state (or holds data behind the key), so
 * none may be stored by a cache or a browser; none may be framed (the
 * page's key form could be clickjacked), sniffed into another type, or
 * leak its URL to another site. */
const char *const ls_http_hardening[][2] = {
    {"X-Content-Type-Options", "nosniff"},
    {"X-Frame-Options", "DENY"},
    {"Cache-Control", "no-store"},
    {"Referrer-Policy", "no-referrer"},
};
const size_t ls_http_hardening_count = sizeof ls_http_hardening / sizeof ls_http_hardening[0];

const char *ls_http_csp(bool page) {
    return page ? "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
                  "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
                : "default-src 'none'; frame-ancestors 'none'";
}
