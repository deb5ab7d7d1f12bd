/* What routes named after a peer's (vLLM's, sglang's) share: a strict
 * JSON body, its string members, the sub-request that hands them to our
 * own handler, and the rewriting of its reply into the peer's shape. */
#ifndef LS_SERVER_PEER_ROUTES_H
#define LS_SERVER_PEER_ROUTES_H

#include <jansson.h>
#include <stdbool.h>

#include "common/error.h"
#include "server/request.h"

/* The body as a JSON object (an unknown key is the caller's to refuse);
 * NULL with r filled on error. New reference. */
json_t *ls_peer_body(const ls_request *req, ls_reply *r);
/* Checks that j holds only keys of known (NULL-terminated); else 400
 * invalid_request naming the key, the known ones and a near one, with
 * hint. */
bool ls_peer_keys(const json_t *j, const char *const *known, const char *hint, ls_reply *r);
/* A string member: "" when absent or null, NULL (r filled) when not a
 * string. Borrowed from j. */
const char *ls_peer_string(const json_t *j, const char *key, ls_reply *r);
/* req's fields with another JSON body (text, borrowed) and {name} param. */
ls_request ls_peer_request(const ls_request *req, const char *body, const char *param);
/* The adapters req's caller may see, each as GET /adapters describes it
 * to that caller: a JSON array (new reference); NULL with err set. */
json_t *ls_peer_adapters(const ls_request *req, ls_error *err);
/* r's body as JSON (new reference); NULL when it is not JSON. */
json_t *ls_peer_reply_json(const ls_reply *r);
/* Puts text (taken; JSON) in place of r's body with status, keeping
 * r's error code and headers (Retry-After, WWW-Authenticate). text NULL:
 * out of memory, r keeps its old body and status. */
void ls_peer_rebody(ls_reply *r, int status, char *text);
#endif
