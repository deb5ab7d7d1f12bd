/* The /forward request and response (docs/api.md): JSON (nested arrays or
 * base64) or a safetensors body, checked against the model's shapes. */
#ifndef LS_API_FORWARD_H
#define LS_API_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dims.h"
#include "common/error.h"
#include "common/text.h" /* ls_adapter_name_valid */
#include "lora/token_names.h"

typedef struct {
    int layer;       /* the checkpoint's number, as the client gave it (default 0) */
    int layer_index; /* the served layer it is (0..L-1), for the pool and the backend */
    int T;
    float *x;      /* owned [T, H], unless x_borrowed */
    bool x_borrowed; /* x points into the safetensors body parsed (its owner keeps it) */
    float *gammas; /* owned [T, n]; NULL = all ones */
    /* owned, copies: each distinct adapter once and per token its index;
     * of_token NULL = all base (no name given in the body, the query or
     * the header) */
    ls_token_names names;
    bool base64; /* answer y as a base64 tensor */
} ls_forward_req;

/* Parses a JSON body in one pass, x and gammas straight into floats (peak
 * memory: the body plus 4 bytes a number). max_tokens > 0 caps the rows
 * of x (payload_too_large past it). On failure req is empty and err says
 * why: invalid_json, invalid_request (unknown key, bad layer, bad
 * names), invalid_shape (x or gammas of the wrong width). */
ls_status ls_forward_req_parse_json(const char *body, size_t len, const ls_dims *dims, int max_tokens,
                                    ls_forward_req *req, ls_error *err);

/* Parses a safetensors body holding x [T, H] (and optionally gammas
 * [T, n]), and in its metadata optionally "adapters" (JSON text: a name
 * or null per token); layer and adapter come from the query (NULL =
 * absent; an empty adapter is refused, never the base model; with
 * "adapters" every name must be that one). max_tokens > 0 caps T
 * (payload_too_large past it). An F32 x that is aligned in body is
 * borrowed, not copied (x_borrowed): body must outlive req. */
ls_status ls_forward_req_parse_safetensors(const uint8_t *body, size_t len, const char *q_layer,
                                           const char *q_adapter, const ls_dims *dims, int max_tokens,
                                           ls_forward_req *req, ls_error *err);

void ls_forward_req_free(ls_forward_req *req);

/* The header that names a forward's adapter, so that a proxy can route
 * on it without reading the body. */
#define LS_FORWARD_ADAPTER_HEADER "X-Lorasink-Adapter"

/* The adapter a request is routed to: the query's adapter= or the header
 * (NULL when neither is given; *what names the one used, for messages).
 * Both given and different is LS_INVALID_REQUEST. */
ls_status ls_forward_routed_name(const char *q_adapter, const char *h_adapter, const char **name, const char **what,
                                 ls_error *err);

/* Gives every token of a parsed req the adapter name (NULL: nothing to
 * do). A body that named adapters keeps them when each is name or none
 * (checked per distinct name, not per token); another name is
 * LS_INVALID_REQUEST, as is an invalid name. On failure req is left for
 * the caller to free. */
ls_status ls_forward_req_route(ls_forward_req *req, const char *name, const char *what, ls_error *err);

/* The JSON response body (malloc'd string, caller frees). */
char *ls_forward_resp_json(const ls_forward_req *req, int H, const float *y, const ls_pool_used *used, int n_used);

/* The safetensors response body holding y (malloc'd, caller frees); the
 * adapters used go to __metadata__ "adapters" as JSON text. */
ls_status ls_forward_resp_safetensors(const ls_forward_req *req, int H, const float *y, const ls_pool_used *used,
                                      int n_used, uint8_t **out, size_t *len, ls_error *err);
/* The same body without copying y: y [T, H] lies at buf + room and the
 * head is written just before it (ls_safetensors_write_before); the body
 * is *len bytes from buf + *start. LS_INTERNAL when the head does not fit
 * in room (then the copy above is the way). */
ls_status ls_forward_resp_safetensors_before(const ls_forward_req *req, int H, uint8_t *buf, size_t room,
                                             const ls_pool_used *used, int n_used, size_t *start, size_t *len,
                                             ls_error *err);

/* The same, as an error: LS_INVALID_REQUEST naming what (the key, flag or
 * header the name came in) and the rule. */
ls_status ls_adapter_name_check(const char *name, const char *what, ls_error *err);

#endif
