/* One HTTP request as the handlers see it (body already read whole) and
 * the reply they fill; server/http.c turns the reply into a response. */
#ifndef LS_SERVER_REQUEST_H
#define LS_SERVER_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "server/server.h"
#include "server/tenant.h"

struct MHD_Connection;

typedef enum { LS_BODY_NONE, LS_BODY_JSON, LS_BODY_SAFETENSORS } ls_body_kind;

/* Longest X-Request-Id taken from a client (longer ones are replaced). */
#define LS_REQUEST_ID_MAX 128

/* A new request id (16 hex digits) into id (LS_REQUEST_ID_MAX + 1 bytes),
 * different on every call of this process and from other processes'. */
void ls_http_new_request_id(char *id);

typedef struct {
    ls_server *srv;
    struct MHD_Connection *conn;
    const char *method;
    const char *path;  /* without the query string */
    const char *param; /* the {name} of /adapters/{name}, else NULL */
    const uint8_t *body;
    size_t len;
    ls_body_kind kind;
    const ls_principal *who; /* the caller: what it may see and change (server/tenant.h) */
    /* The body's bytes server/http.c counted in srv->metrics.queue_bytes
     * as it arrived (a /forward's; else 0): the handler gives them back,
     * or hands them to what it keeps of the request. */
    size_t held;
} ls_request;

typedef struct {
    int status;
    char *body; /* owned (malloc) */
    size_t skip; /* the reply is len bytes from body + skip (a buffer with room in front) */
    size_t len;
    const char *content_type; /* static */
    int retry_after;          /* seconds; 0 = no header */
    const char *allow;        /* static; Allow header for 405 */
    bool www_authenticate;
    ls_status code; /* the error code when status >= 400 */
} ls_reply;

/* Query-string value (borrowed from MHD) or NULL. */
const char *ls_request_query(const ls_request *req, const char *key);
/* LS_OK when every query parameter is one of known (NULL-terminated;
 * NULL: none is known), has a value ("?adapter" alone has none) and none
 * is given twice; else 400 invalid_request naming the parameter, with
 * hint after the known list ("" for none). An empty argument ("&&") is
 * skipped. A
 * parameter the server would not read is refused, never ignored: a typo
 * such as ?adaptor=x must not run the base model. */
ls_status ls_request_check_query(const ls_request *req, const char *const *known, const char *hint, ls_error *err);
/* Header value (borrowed from MHD) or NULL. */
const char *ls_request_header(const ls_request *req, const char *name);

/* Fills r with a JSON body (takes ownership of text; NULL = out of
 * memory, answered as 500). */
void ls_reply_json(ls_reply *r, int status, char *text);
/* Fills r with a copy of len bytes (static data: http.c frees every reply
 * body, so they cannot be handed over as they are); content_type static. */
void ls_reply_copy(ls_reply *r, int status, const void *bytes, size_t len, const char *content_type);
/* Fills r with the error body of err (and its Retry-After etc.). */
void ls_reply_error(ls_reply *r, const ls_error *err);
/* Shortcut: one error with a formatted message. */
void ls_reply_fail(ls_reply *r, ls_status code, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
