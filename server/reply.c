/* Building replies: JSON bodies and the one way errors are answered. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "api/error_body.h"
#include "common/text.h"
#include "server/http_status.h"
#include "server/request.h"

const char *ls_request_query(const ls_request *req, const char *key) {
    return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, key);
}

typedef struct {
    const char *const *known;
    const char *hint;
    const char *seen[16]; /* known keys met so far (a key is met at most once) */
    int n_seen;
    ls_error *err;
    ls_status st;
} ls_query_check;

static enum MHD_Result ls_query_visit(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    ls_query_check *q = cls;
    /* "a=1&&b=2" holds an empty argument: nothing is said there. */
    if (!key[0] && (!value || !value[0])) return MHD_YES;
    int i = 0;
    while (q->known && q->known[i] && strcmp(key, q->known[i])) i++;
    if (!q->known || !q->known[i]) {
        char list[256] = "", near[96];
        ls_text_near n;
        ls_text_near_init(&n, key);
        for (int k = 0; q->known && q->known[k]; k++) {
            size_t l = strlen(list);
            snprintf(list + l, sizeof list - l, "%s%s", k ? ", " : "", q->known[k]);
            ls_text_near_offer(&n, q->known[k]);
        }
        char hint[512];
        snprintf(hint, sizeof hint, "%s%s%s", list[0] ? "known query parameters: " : "this request takes no query "
                                                                                    "parameters",
                 list, q->hint);
        q->st = ls_error_set(q->err, LS_INVALID_REQUEST, hint, "unknown query parameter \"%.64s\"%s", key,
                             ls_text_near_clause(&n, "; did you mean \"", "\"?", near, sizeof near));
        return MHD_NO;
    }
    for (int k = 0; k < q->n_seen; k++)
        if (q->seen[k] == q->known[i]) {
            q->st = ls_error_set(q->err, LS_INVALID_REQUEST, "give each query parameter once",
                                 "query parameter \"%s\" is given more than once", key);
            return MHD_NO;
        }
    if (q->n_seen < (int)(sizeof q->seen / sizeof q->seen[0])) q->seen[q->n_seen++] = q->known[i];
    if (!value) {
        /* "?adapter" without "=": the readers would take it as absent,
         * so a forward would run the base model. */
        q->st = ls_error_set(q->err, LS_INVALID_REQUEST, "write NAME=VALUE",
                             "query parameter \"%s\" has no value", key);
        return MHD_NO;
    }
    return MHD_YES;
}

ls_status ls_request_check_query(const ls_request *req, const char *const *known, const char *hint, ls_error *err) {
    ls_query_check q = {.known = known, .hint = hint, .err = err, .st = LS_OK};
    MHD_get_connection_values(req->conn, MHD_GET_ARGUMENT_KIND, ls_query_visit, &q);
    return q.st;
}

const char *ls_request_header(const ls_request *req, const char *name) {
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

/* Text replies end with a newline, so that curl's output and a shell
 * prompt do not run together; takes text and returns it, grown by one
 * byte unless it ends with one (NULL when out of memory, text freed), its
 * length in *len (a forward's reply can be megabytes: measured once). */
static char *ls_reply_newline(char *text, size_t *len) {
    size_t n = strlen(text);
    *len = n;
    if (n && text[n - 1] == '\n') return text;
    char *t = realloc(text, n + 2);
    if (!t) {
        free(text);
        return NULL;
    }
    t[n] = '\n';
    t[n + 1] = '\0';
    *len = n + 1;
    return t;
}

void ls_reply_json(ls_reply *r, int status, char *text) {
    size_t len = 0;
    if (text) text = ls_reply_newline(text, &len);
    if (!text) {
        ls_reply_fail(r, LS_INTERNAL, NULL, "out of memory building the response");
        return;
    }
    r->status = status;
    r->body = text;
    r->skip = 0;
    r->len = len;
    r->content_type = "application/json";
    r->code = LS_OK;
}

void ls_reply_copy(ls_reply *r, int status, const void *bytes, size_t len, const char *content_type) {
    char *body = malloc(len + 1);
    if (!body) {
        ls_reply_fail(r, LS_INTERNAL, NULL, "out of memory copying a reply of %zu bytes", len);
        return;
    }
    memcpy(body, bytes, len);
    body[len] = '\0';
    r->status = status;
    r->body = body;
    r->skip = 0;
    r->len = len;
    r->content_type = content_type;
    r->code = LS_OK;
}

void ls_reply_error(ls_reply *r, const ls_error *err) {
    ls_status code = err->code == LS_OK ? LS_INTERNAL : err->code;
    free(r->body);
    r->body = ls_error_body_text(err, ls_http_status(code));
    r->skip = 0;
    r->len = 0;
    if (r->body) r->body = ls_reply_newline(r->body, &r->len);
    if (!r->body) r->len = 0;
    r->status = ls_http_status(code);
    r->content_type = "application/json";
    r->code = code;
    /* Retry-After where waiting helps: a full pool or queue, an address
     * at its connection cap. */
    if (code == LS_POOL_EXHAUSTED || code == LS_OVERLOADED || code == LS_TOO_MANY_CONNECTIONS) r->retry_after = 1;
    if (code == LS_UNAUTHORIZED) r->www_authenticate = true;
}

void ls_reply_fail(ls_reply *r, ls_status code, const char *hint, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ls_error err;
    ls_error_init(&err);
    ls_error_set(&err, code, hint, "%s", msg);
    ls_reply_error(r, &err);
    ls_error_free(&err);
}
