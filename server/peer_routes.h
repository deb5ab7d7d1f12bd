/* What routes named after a peer's (vLLM's) share: a strict JSON body,
 * its string members, and the sub-request that hands them to our own
 * handler. */
#ifndef LS_SERVER_PEER_ROUTES_H
#define LS_SERVER_PEER_ROUTES_H

#include <jansson.h>
#include <stdbool.h>

#include "server/request.h"

/* The body as a JSON object (an unknown key is the caller's to refuse);
 * NULL with r filled on error. New reference. */
json_t *ls_peer_body(const ls_request *req, ls_reply *r);
/* Checks that j holds only keys of known (NULL-terminated); else 400
 * invalid_request naming the key, with hint. */
bool ls_peer_keys(const json_t *j, const char *const *known, const char *hint, ls_reply *r);
/* A string member: "" when absent or null, NULL (r filled) when not a
 * string. Borrowed from j. */
const char *ls_peer_string(const json_t *j, const char *key, ls_reply *r);
/* req's fields with another JSON body (text, borrowed) and {name} param. */
ls_request ls_peer_request(const ls_request *req, const char *body, const char *param);
#endif
