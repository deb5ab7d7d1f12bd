/* GET /openapi.json: the OpenAPI document (docs/openapi.json, compiled in
 * by ls_embed), so that a client reads the description of the very
 * binary it talks to. Behind --api-key like /metrics: only /health and
 * /ready are open, and a client that may call the API holds the key. */
#include <stdlib.h>
#include <string.h>

#include "server/request.h"

/* Defined by the file ls_embed generates from docs/openapi.json. */
extern const unsigned char ls_openapi_json[];
extern const size_t ls_openapi_json_len;

/* r->body receives a malloc'd copy of the document: http.c frees every
 * reply body, so the static bytes cannot be handed over as they are. */
void ls_handle_openapi(const ls_request *req, ls_reply *r) {
    (void)req;
    char *body = malloc(ls_openapi_json_len + 1);
    if (!body) {
        ls_reply_fail(r, LS_INTERNAL, NULL, "out of memory serving the OpenAPI document");
        return;
    }
    memcpy(body, ls_openapi_json, ls_openapi_json_len + 1); /* with the NUL ls_embed adds */
    r->status = 200;
    r->body = body;
    r->len = ls_openapi_json_len;
    r->content_type = "application/json";
}
