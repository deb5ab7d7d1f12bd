/* vLLM's runtime adapter routes, POST /v1/load_lora_adapter and
 * POST /v1/unload_lora_adapter, mapped onto POST /adapters (by path)
 * and DELETE /adapters/{name}: the same loader and rules, vLLM's status
 * codes and plain-text success replies, our structured error bodies; and
 * GET /v1/models, the list by which tools see that a load took. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/json_tensor.h"
#include "server/handlers.h"
#include "server/peer_routes.h"
#include "server/tenant_routes.h"

/* vLLM answers 400 for any adapter it cannot load (but 404 for one not
 * found) and for a name already loaded; 409 and 422 become 400, with
 * our error body (its code says which). A name already loaded is
 * replaced on this route with load_inplace, not POST /adapters' replace:
 * the hint says so. */
static void ls_vllm_status(ls_reply *r) {
    if (r->status != 409 && r->status != 422) return;
    /* The body's status says what the status line does. */
    json_t *j = ls_peer_reply_json(r);
    json_t *e = json_object_get(j, "error");
    bool ok = e && !json_object_set_new(e, "status", json_integer(400));
    const char *code_text = json_string_value(json_object_get(e, "code"));
    if (ok && code_text && !strcmp(code_text, "adapter_exists"))
        ok = !json_object_set_new(e, "hint", json_string("send \"load_inplace\": true to replace it (a new version), "
                                                         "or choose another lora_name"));
    /* Out of memory: the old body, whose code still says which. */
    ls_peer_rebody(r, 400, ok ? json_dumps(j, JSON_COMPACT) : NULL);
    r->status = 400;
    json_decref(j);
}

/* A vLLM success reply: 200 and one sentence of plain text. */
static void ls_vllm_success(ls_reply *r, const char *name, const char *what) {
    char text[256];
    int n = snprintf(text, sizeof text, "Success: LoRA adapter '%.128s' %s successfully.", name, what);
    free(r->body);
    memset(r, 0, sizeof *r);
    ls_reply_copy(r, 200, text, (size_t)n, "text/plain; charset=utf-8");
}

/* {"lora_name", "lora_path", "load_inplace"}: POST /adapters {"name",
 * "path", "replace"}. Without load_inplace a loaded name is 400, as in
 * vLLM; with it the adapter is replaced (a new version). vLLM's
 * is_3d_lora_weight declares how MoE factors are laid out on disk; the
 * loader reads that from the files (as vLLM does unless its mixed-format
 * switch is on), so it is taken, a boolean, and changes nothing. */
void ls_handle_vllm_load(const ls_request *req, ls_reply *r) {
    static const char *const known[] = {"lora_name", "lora_path", "load_inplace", "is_3d_lora_weight", NULL};
    json_t *j = ls_peer_body(req, r);
    if (!j) return;
    const char *hint = "send {\"lora_name\": NAME, \"lora_path\": PATH} and optionally \"load_inplace\": true";
    const char *name = NULL, *path = NULL;
    const json_t *inplace = json_object_get(j, "load_inplace"), *is3d = json_object_get(j, "is_3d_lora_weight");
    if (ls_peer_keys(j, known, hint, r) && (name = ls_peer_string(j, "lora_name", r)) &&
        (path = ls_peer_string(j, "lora_path", r))) {
        if (inplace && !json_is_boolean(inplace)) {
            ls_reply_fail(r, LS_INVALID_REQUEST, hint, "load_inplace must be true or false");
        } else if (is3d && !json_is_boolean(is3d)) {
            ls_reply_fail(r, LS_INVALID_REQUEST, hint, "is_3d_lora_weight must be true or false");
        } else if (!*name || !*path) {
            ls_reply_fail(r, LS_INVALID_REQUEST, hint, "both lora_name and lora_path must be given");
        } else {
            json_t *up = json_pack("{s:s, s:s, s:b}", "name", name, "path", path, "replace",
                                   inplace && json_is_true(inplace));
            char *text = up ? json_dumps(up, JSON_COMPACT) : NULL;
            json_decref(up);
            if (!text) {
                ls_reply_fail(r, LS_INTERNAL, NULL, "out of memory");
            } else {
                ls_request sub = ls_peer_request(req, text, NULL);
                ls_handle_adapter_load(&sub, r);
                free(text);
                if (r->status == 201) ls_vllm_success(r, name, "added");
                else ls_vllm_status(r);
            }
        }
    }
    json_decref(j);
}

/* {"lora_name"}: DELETE /adapters/{lora_name}. vLLM also takes
 * lora_int_id, but looks the adapter up by lora_name alone; lorasink
 * has no integer ids, so lora_int_id is taken only beside lora_name. */
void ls_handle_vllm_unload(const ls_request *req, ls_reply *r) {
    static const char *const known[] = {"lora_name", "lora_int_id", NULL};
    json_t *j = ls_peer_body(req, r);
    if (!j) return;
    const char *hint = "send {\"lora_name\": NAME}";
    const char *name = NULL;
    const json_t *id = json_object_get(j, "lora_int_id");
    if (ls_peer_keys(j, known, hint, r) && (name = ls_peer_string(j, "lora_name", r))) {
        if (id && !json_is_null(id) && !json_is_integer(id)) {
            ls_reply_fail(r, LS_INVALID_REQUEST, hint, "lora_int_id must be an integer");
        } else if (!*name && id && !json_is_null(id)) {
            ls_reply_fail(r, LS_INVALID_REQUEST, hint,
                          "lorasink names adapters, it has no integer ids: lora_int_id alone cannot name one");
        } else if (!*name) {
            ls_reply_fail(r, LS_INVALID_REQUEST, hint, "lora_name must be given");
        } else {
            ls_request sub = ls_peer_request(req, NULL, name);
            ls_handle_adapter_delete(&sub, r);
            if (r->status == 200) ls_vllm_success(r, name, "removed");
            else ls_vllm_status(r);
        }
    }
    json_decref(j);
}

/* One card of GET /v1/models in vLLM's shape. New reference. */
static json_t *ls_vllm_card(const char *id, json_t *root, const char *parent, json_int_t created) {
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", id, "object", "model", "created", created, "owned_by",
                     "lorasink", "root", root ? root : json_null(), "parent", parent ? json_string(parent) : json_null());
}

/* vLLM's model list: the base model (its --weights as given, "demo" for
 * the demo), then each adapter the caller may see, by the name it uses,
 * with its source path as root (null for an upload) and the base as
 * parent. */
void ls_handle_vllm_models(const ls_request *req, ls_reply *r) {
    ls_error err;
    ls_error_init(&err);
    const char *base = req->srv->cfg.weights[0] ? req->srv->cfg.weights : "demo";
    const json_int_t now = (json_int_t)time(NULL);
    json_t *list = ls_peer_adapters(req, &err);
    if (!list) {
        ls_reply_error(r, &err);
    } else {
        json_t *data = json_array();
        if (data) json_array_append_new(data, ls_vllm_card(base, json_string(base), NULL, now));
        size_t i;
        json_t *d;
        json_array_foreach(list, i, d) {
            const char *id = json_string_value(json_object_get(d, "name"));
            json_t *src = json_object_get(d, "source");
            if (id && data)
                json_array_append_new(data, ls_vllm_card(id, json_is_string(src) ? json_incref(src) : NULL, base, now));
        }
        json_decref(list);
        ls_reply_json(r, 200, ls_json_take_text(json_pack("{s:s, s:o}", "object", "list", "data", data)));
    }
    ls_error_free(&err);
}
