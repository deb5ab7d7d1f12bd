/* sglang's runtime adapter routes, POST /load_lora_adapter and
 * POST /unload_lora_adapter, mapped onto POST /adapters (by path) and
 * DELETE /adapters/{name}: the same loader and rules, sglang's reply
 * {"success", "error_message", "loaded_adapters"} with sglang's status
 * codes, and our error object beside it on a failure. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/handlers.h"
#include "server/peer_routes.h"

/* sglang's own keys that name its request rather than the adapter: its
 * LoRA id, the request id, the tokenizer worker's address. Taken (a
 * string, or null) and not used: lorasink names adapters. */
static const char *const ls_sglang_passthrough[] = {"lora_id", "rid", "http_worker_ipc"};

/* name -> source (the path as given; null for an upload) of every
 * adapter the caller may see, as sglang lists its loaded adapters. New
 * reference; NULL when it cannot be listed. */
static json_t *ls_sglang_loaded(const ls_request *req) {
    ls_error err;
    ls_error_init(&err);
    json_t *list = ls_peer_adapters(req, &err);
    ls_error_free(&err);
    json_t *out = list ? json_object() : NULL;
    size_t i;
    json_t *d;
    json_array_foreach(list, i, d) {
        const char *name = json_string_value(json_object_get(d, "name"));
        json_t *src = json_object_get(d, "source");
        if (out && name) json_object_set_new(out, name, json_is_string(src) ? json_incref(src) : json_null());
    }
    json_decref(list);
    return out;
}

/* sglang answers 400 for every failure it reports; the statuses that say
 * something a client acts on differently (who may ask, how much, when
 * to retry, a fault of the server) are kept. */
static int ls_sglang_status(int status) {
    switch (status) {
    case 401: case 403: case 413: case 429: case 500: case 503: case 507: return status;
    default: return 400;
    }
}

/* Rewrites our handler's reply in r (ok_status: its success) into
 * sglang's shape: 200 {"success": true, "error_message": "",
 * "loaded_adapters"}, or {"success": false, "error_message": our message,
 * "loaded_adapters", "error": our error object} with sglang's status. */
static void ls_sglang_reply(const ls_request *req, ls_reply *r, int ok_status) {
    const bool ok = r->status == ok_status;
    const int status = ok ? 200 : ls_sglang_status(r->status);
    json_t *ours = ok ? NULL : ls_peer_reply_json(r);
    json_t *error = json_object_get(ours, "error");
    if (error) json_object_set_new(error, "status", json_integer(status));
    const char *message = json_string_value(json_object_get(error, "message"));
    json_t *loaded = ls_sglang_loaded(req);
    json_t *j = json_pack("{s:b, s:s, s:o}", "success", ok, "error_message", message ? message : "",
                          "loaded_adapters", loaded ? loaded : json_null());
    if (j && error) json_object_set(j, "error", error);
    ls_peer_rebody(r, status, j ? json_dumps(j, JSON_COMPACT) : NULL);
    json_decref(j);
    json_decref(ours);
}

/* The passthrough keys, when given, must be a string or null. */
static bool ls_sglang_passthrough_ok(const json_t *j, ls_reply *r) {
    for (size_t i = 0; i < sizeof ls_sglang_passthrough / sizeof *ls_sglang_passthrough; i++)
        if (!ls_peer_string(j, ls_sglang_passthrough[i], r)) return false;
    return true;
}

/* The load's body into POST /adapters' JSON text (malloc'd), or NULL
 * with r filled. */
static char *ls_sglang_load_body(const json_t *j, ls_reply *r) {
    static const char *const known[] = {"lora_name", "lora_path", "pinned", "lora_id", "rid", "http_worker_ipc", NULL};
    const char *hint = "send {\"lora_name\": NAME, \"lora_path\": PATH} and optionally \"pinned\": true";
    const char *name = NULL, *path = NULL;
    const json_t *pinned = json_object_get(j, "pinned");
    if (!ls_peer_keys(j, known, hint, r) || !(name = ls_peer_string(j, "lora_name", r)) ||
        !(path = ls_peer_string(j, "lora_path", r)) || !ls_sglang_passthrough_ok(j, r))
        return NULL;
    if (pinned && !json_is_null(pinned) && !json_is_boolean(pinned)) {
        ls_reply_fail(r, LS_INVALID_REQUEST, hint, "pinned must be true or false");
        return NULL;
    }
    if (!*name || !*path) {
        ls_reply_fail(r, LS_INVALID_REQUEST, hint, "both lora_name and lora_path must be given");
        return NULL;
    }
    /* No replace: sglang refuses a name already loaded. */
    json_t *up = json_pack("{s:s, s:s, s:b}", "name", name, "path", path, "pinned", pinned && json_is_true(pinned));
    char *text = up ? json_dumps(up, JSON_COMPACT) : NULL;
    json_decref(up);
    if (!text) ls_reply_fail(r, LS_INTERNAL, NULL, "out of memory");
    return text;
}

/* {"lora_name", "lora_path", "pinned"}: POST /adapters {"name", "path",
 * "pinned"}. A loaded name is refused (409 adapter_exists, answered 400),
 * as in sglang: unload it first. */
void ls_handle_sglang_load(const ls_request *req, ls_reply *r) {
    json_t *j = ls_peer_body(req, r);
    char *text = j ? ls_sglang_load_body(j, r) : NULL;
    json_decref(j);
    if (text) {
        ls_request sub = ls_peer_request(req, text, NULL);
        ls_handle_adapter_load(&sub, r);
        free(text);
    }
    ls_sglang_reply(req, r, 201);
}

/* {"lora_name"}: DELETE /adapters/{lora_name}; a name not loaded is 404
 * adapter_not_found, answered 400 as sglang does. */
void ls_handle_sglang_unload(const ls_request *req, ls_reply *r) {
    static const char *const known[] = {"lora_name", "lora_id", "rid", "http_worker_ipc", NULL};
    json_t *j = ls_peer_body(req, r);
    const char *name = NULL;
    if (j && ls_peer_keys(j, known, "send {\"lora_name\": NAME}", r) && (name = ls_peer_string(j, "lora_name", r)) &&
        ls_sglang_passthrough_ok(j, r)) {
        if (!*name) {
            ls_reply_fail(r, LS_INVALID_REQUEST, "send {\"lora_name\": NAME}", "lora_name must be given");
        } else {
            ls_request sub = ls_peer_request(req, NULL, name);
            ls_handle_adapter_delete(&sub, r);
        }
    }
    json_decref(j);
    ls_sglang_reply(req, r, 200);
}
