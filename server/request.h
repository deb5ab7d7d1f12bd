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
} ls_request;

typedef struct {
    int status;
    char *body; /* owned (malloc) */
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

/* The asynchronous form of /forward used with the batcher: prepare parses
 * and admits the request (NULL with r filled on error), the batch job
 * runs, complete fills r and frees the job's tensors (its bytes leave
 * --max-queue-mb's budget). The job is owned by the caller until
 * ls_forward_job_free. With --auto-load an adapter the forward names may
 * have to be loaded first, which never happens on the thread that
 * prepared it: *next says what is left, each step on a thread that may do
 * it, in this order:
 *   LS_FORWARD_READ   ls_forward_read: read and validate adapter files (the disk)
 *   LS_FORWARD_LOAD   ls_forward_load: register them, or wait for another
 *                     request's load (the backend)
 *   LS_FORWARD_BATCH  ready for the batch
 * A step that answers (an error) fills r and gives LS_FORWARD_ANSWERED. */
typedef enum { LS_FORWARD_ANSWERED, LS_FORWARD_BATCH, LS_FORWARD_READ, LS_FORWARD_LOAD } ls_forward_step;
typedef struct ls_forward_job ls_forward_job;
struct ls_batch_job;
ls_forward_job *ls_forward_prepare(const ls_request *req, ls_forward_step *next, ls_reply *r);
ls_forward_step ls_forward_read(ls_forward_job *fj, ls_reply *r);
ls_forward_step ls_forward_load(ls_forward_job *fj, ls_reply *r);
struct ls_batch_job *ls_forward_batch_job(ls_forward_job *fj);
void ls_forward_complete(ls_server *srv, ls_forward_job *fj, ls_reply *r);
void ls_forward_job_free(ls_forward_job *fj);

/* POST /adapters in two steps, so that an upload's errors never wait for
 * the backend: prepare parses and validates (it may read the disk; NULL
 * with r filled on error), commit registers it (it may wait for the
 * forward on the backend), fills r and frees the job. Counted in the
 * loads gauge from prepare until the job is freed. */
typedef struct ls_adapter_load_job ls_adapter_load_job;
ls_adapter_load_job *ls_adapter_load_prepare(const ls_request *req, ls_reply *r);
void ls_adapter_load_commit(ls_adapter_load_job *j, ls_reply *r);
void ls_adapter_load_job_free(ls_adapter_load_job *j);

/* Handlers: each reads req and fills r. */
void ls_handle_health(const ls_request *req, ls_reply *r);
void ls_handle_ready(const ls_request *req, ls_reply *r);
void ls_handle_metrics(const ls_request *req, ls_reply *r);
void ls_handle_openapi(const ls_request *req, ls_reply *r);
void ls_handle_pool(const ls_request *req, ls_reply *r);
void ls_handle_model(const ls_request *req, ls_reply *r);
void ls_handle_dashboard(const ls_request *req, ls_reply *r);
void ls_handle_forward(const ls_request *req, ls_reply *r);
void ls_handle_adapter_load(const ls_request *req, ls_reply *r);
void ls_handle_adapter_validate(const ls_request *req, ls_reply *r);
void ls_handle_adapter_list(const ls_request *req, ls_reply *r);
void ls_handle_adapter_get(const ls_request *req, ls_reply *r);
void ls_handle_adapter_delete(const ls_request *req, ls_reply *r);
/* vLLM's names for a load by path and a delete (server/handlers_vllm.c). */
void ls_handle_vllm_load(const ls_request *req, ls_reply *r);
void ls_handle_vllm_unload(const ls_request *req, ls_reply *r);

#endif
