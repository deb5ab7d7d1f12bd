/* The plumbing of routes named after a peer's (server/peer_routes.h). */
#include "server/peer_routes.h"

#include <stdlib.h>
#include <string.h>

#include "common/text.h"
#include "server/handlers.h"
#include "server/tenant_routes.h"

json_t *ls_peer_body(const ls_request *req, ls_reply *r) {
    if (req->kind != LS_BODY_JSON) {
        ls_reply_fail(r, LS_UNSUPPORTED_MEDIA_TYPE, "send Content-Type: application/json", "%s takes a JSON body",
                      req->path);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadb((const char *)req->body, req->len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        ls_reply_fail(r, LS_INVALID_JSON, NULL, "invalid JSON at line %d: %s", je.line, je.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        ls_reply_fail(r, LS_INVALID_JSON, NULL, "the body must be a JSON object");
        return NULL;
    }
    return j;
}

bool ls_peer_keys(const json_t *j, const char *const *known, const char *hint, ls_reply *r) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)j, key, v) {
        bool ok = false;
        for (size_t i = 0; known[i] && !ok; i++) ok = !strcmp(key, known[i]);
        if (!ok) {
            char known_hint[256], near[96];
            ls_text_unknown_key(key, known, known_hint, sizeof known_hint, near, sizeof near);
            ls_reply_fail(r, LS_INVALID_REQUEST, hint, "unknown key \"%.64s\"%s (%s)", key, near, known_hint);
            return false;
        }
    }
    return true;
}

const char *ls_peer_string(const json_t *j, const char *key, ls_reply *r) {
    const json_t *v = json_object_get(j, key);
    if (!v || json_is_null(v)) return "";
    if (!json_is_string(v)) {
        ls_reply_fail(r, LS_INVALID_REQUEST, NULL, "%s must be a string", key);
        return NULL;
    }
    return json_string_value(v);
}

ls_request ls_peer_request(const ls_request *req, const char *body, const char *param) {
    ls_request sub = *req;
    sub.body = (const uint8_t *)body;
    sub.len = body ? strlen(body) : 0;
    sub.kind = LS_BODY_JSON;
    sub.param = param;
    return sub;
}

json_t *ls_peer_adapters(const ls_request *req, ls_error *err) {
    ls_adapter_info *infos = NULL;
    size_t n = 0;
    if (ls_pool_list(req->srv->pool, &infos, &n, err) != LS_OK) return NULL;
    json_t *out = json_array();
    for (size_t i = 0; out && i < n; i++) {
        json_t *d = ls_tenant_describe(req->srv, req->who, &infos[i]);
        if (d) json_array_append_new(out, d);
    }
    free(infos);
    if (!out) ls_error_set(err, LS_INTERNAL, NULL, "out of memory listing adapters");
    return out;
}

json_t *ls_peer_reply_json(const ls_reply *r) {
    if (!r->body || !r->content_type || strcmp(r->content_type, "application/json")) return NULL;
    return json_loadb(r->body + r->skip, r->len, 0, NULL);
}

void ls_peer_rebody(ls_reply *r, int status, char *text) {
    if (!text) return;
    const ls_status code = r->code;
    free(r->body);
    r->body = NULL;
    ls_reply_json(r, status, text); /* its newline, as every JSON reply ends */
    r->code = code;
}
