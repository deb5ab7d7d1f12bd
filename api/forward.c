/* /forward wire formats: parse and check the request, build the reply. */
#include "api/forward.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/forward_internal.h"
#include "api/json_tensor.h"
#include "common/buf.h"
#include "common/text.h"
#include "format/safetensors.h"

void ls_forward_req_free(ls_forward_req *req) {
    if (!req->x_borrowed) free(req->x);
    free(req->gammas);
    ls_token_names_free(&req->names);
    memset(req, 0, sizeof *req);
}

/* Whether t is a [rows, cols] float tensor as a forward takes it
 * (want_rows < 0: any rows from 1). */
static ls_status ls_forward_check_matrix(const ls_tensor *t, const char *what, int want_rows, int want_cols,
                                         ls_error *err) {
    if (t->ndim != 2 || t->shape[0] < 1 || (want_rows >= 0 && t->shape[0] != want_rows) || t->shape[1] != want_cols) {
        char buf[96];
        if (want_rows >= 0)
            return ls_error_set(err, LS_INVALID_SHAPE, NULL, "%s has shape %s, expected [%d, %d] (tokens x %s)", what,
                                ls_shape_str(t->shape, t->ndim, buf, sizeof buf), want_rows, want_cols,
                                !strcmp(what, "x") ? "hidden" : "experts");
        return ls_error_set(err, LS_INVALID_SHAPE, NULL, "%s has shape %s, expected [T, %d] with T >= 1 (hidden size %d)",
                            what, ls_shape_str(t->shape, t->ndim, buf, sizeof buf), want_cols, want_cols);
    }
    if (t->shape[0] > (1 << 24))
        return ls_error_set(err, LS_INVALID_SHAPE, NULL, "%s has %lld rows, at most %d", what,
                            (long long)t->shape[0], 1 << 24);
    if (!ls_dtype_is_float(t->dtype))
        return ls_error_set(err, LS_INVALID_REQUEST, "send f32, f16 or bf16", "%s has dtype %s", what,
                            ls_dtype_name(t->dtype));
    return LS_OK;
}

/* LS_OK when every value of v is finite (ls_find_nonfinite's scan). */
static ls_status ls_forward_check_finite(const float *v, size_t count, const char *what, int cols, ls_error *err) {
    size_t i;
    if (!ls_find_nonfinite(LS_DTYPE_F32, v, count, &i)) return LS_OK;
    return ls_error_set(err, LS_INVALID_REQUEST, "send finite values", "%s[%zu][%zu] is not finite", what,
                        i / (size_t)cols, i % (size_t)cols);
}

/* Takes a parsed tensor as [rows, cols] fp32 into *dst (owned). */
ls_status ls_forward_take_matrix(ls_tensor *t, const char *what, int want_rows, int want_cols, float **dst,
                                        int *rows_out, ls_error *err) {
    ls_status st = ls_forward_check_matrix(t, what, want_rows, want_cols, err);
    if (st != LS_OK) return st;
    size_t count = (size_t)t->shape[0] * (size_t)want_cols;
    float *v = malloc(count * sizeof *v);
    if (!v) return ls_error_set(err, LS_INTERNAL, NULL, "%s: out of memory", what);
    ls_tensor_to_f32(t, v);
    if ((st = ls_forward_check_finite(v, count, what, want_cols, err)) != LS_OK) {
        free(v);
        return st;
    }
    *dst = v;
    *rows_out = (int)t->shape[0];
    return LS_OK;
}

/* x as the body holds it, when that is already what the engine reads
 * (little-endian F32, aligned): *x then points into the body (whose
 * owner keeps it for the request's life), saving a copy as large as the
 * body. Otherwise the copy ls_forward_take_matrix makes. */
static ls_status ls_forward_take_x(ls_tensor *t, int H, ls_forward_req *req, ls_error *err) {
    const bool little = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
    if (!little || t->dtype != LS_DTYPE_F32 || (uintptr_t)t->data % _Alignof(float))
        return ls_forward_take_matrix(t, "x", -1, H, &req->x, &req->T, err);
    ls_status st = ls_forward_check_matrix(t, "x", -1, H, err);
    if (st == LS_OK) st = ls_forward_check_finite(t->data, (size_t)t->shape[0] * (size_t)H, "x", H, err);
    if (st != LS_OK) return st;
    req->x = t->data;
    req->x_borrowed = true;
    req->T = (int)t->shape[0];
    return LS_OK;
}

/* Layers are the checkpoint's numbers; only those with shared experts
 * are served. */
ls_status ls_forward_check_layer(long long layer, const ls_dims *dims, int *index, ls_error *err) {
    *index = ls_dims_layer_index(dims, layer);
    if (*index >= 0) return LS_OK;
    const int total = ls_dims_layers_total(dims);
    char served[128], hint[256];
    ls_dims_layers_str(dims, served, sizeof served);
    if (layer >= 0 && layer < total) {
        snprintf(hint, sizeof hint, "send a layer with shared experts: %s", served);
        return ls_error_set(err, LS_INVALID_REQUEST, hint,
                            "layer %lld is a dense layer of the checkpoint (no shared experts); the layers with shared "
                            "experts are %s",
                            layer, served);
    }
    if (dims->layer_ids) {
        snprintf(hint, sizeof hint, "send a layer with shared experts: %s", served);
        return ls_error_set(err, LS_INVALID_REQUEST, hint,
                            "layer %lld is out of range: the checkpoint has %d layers (0..%d), those with shared "
                            "experts are %s",
                            layer, total, total - 1, served);
    }
    return ls_error_set(err, LS_INVALID_REQUEST, "layer runs from 0 to layers-1 of the served model",
                        "layer %lld is out of range: the model has %d layer%s (0..%d)", layer, dims->L,
                        dims->L == 1 ? "" : "s", dims->L - 1);
}

ls_status ls_adapter_name_check(const char *name, const char *what, ls_error *err) {
    if (!ls_adapter_pool_name_valid(name))
        return ls_error_set(err, LS_INVALID_REQUEST,
                            "names are 1-128 letters, digits, '.', '_' or '-', not starting with '.' (an admin "
                            "names a tenant's adapter TENANT/NAME)",
                            "%s: \"%.140s\" is not a valid adapter name", what, name);
    return LS_OK;
}

/* The keys a forward body's __metadata__ may hold: "adapters", a name or
 * null per token as JSON text, and "format", which writers such as
 * transformers add and nothing here reads. Any other key is refused: one
 * the server ignored would run the request otherwise than its sender
 * meant. */
static const char *const ls_forward_meta_known[] = {"adapters", "format", NULL};

static ls_status ls_forward_meta_check(const ls_tensor_set *set, ls_error *err) {
    for (size_t i = 0; i < set->n_meta; i++) {
        const char *key = set->meta[i].key;
        size_t k = 0;
        while (ls_forward_meta_known[k] && strcmp(key, ls_forward_meta_known[k])) k++;
        if (ls_forward_meta_known[k]) continue;
        if (!strcmp(key, "layer") || !strcmp(key, "adapter"))
            return ls_error_set(err, LS_INVALID_REQUEST, "give it in the query: ?layer=1&adapter=NAME",
                                "the body's metadata holds \"%s\", which a safetensors forward takes from the query",
                                key);
        char hint[192], near[192];
        ls_text_unknown_key(key, ls_forward_meta_known, hint, sizeof hint, near, sizeof near);
        return ls_error_set(err, LS_INVALID_REQUEST, hint, "unknown key \"%.64s\" in the body's metadata%s", key,
                            near);
    }
    return LS_OK;
}

ls_status ls_forward_req_parse_safetensors(const uint8_t *body, size_t len, const char *q_layer,
                                           const char *q_adapter, const ls_dims *dims, int max_tokens,
                                           ls_forward_req *req, ls_error *err) {
    memset(req, 0, sizeof *req);
    ls_status st = LS_OK;
    long long layer = 0; /* the default: the checkpoint's layer 0 */
    if (q_layer) {
        if (!ls_text_int(q_layer, LLONG_MIN, LLONG_MAX, &layer))
            return ls_error_set(err, LS_INVALID_REQUEST, "write the layer in decimal digits: ?layer=1",
                                "query layer=%.32s is not an integer", q_layer);
    }
    if ((st = ls_forward_check_layer(layer, dims, &req->layer_index, err)) != LS_OK) return st;
    req->layer = (int)layer;
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    if ((st = ls_safetensors_parse(body, len, &set, err)) != LS_OK) return st;
    for (size_t i = 0; i < set.n && st == LS_OK; i++)
        if (strcmp(set.items[i].name, "x") && strcmp(set.items[i].name, "gammas"))
            st = ls_error_set(err, LS_INVALID_REQUEST, "send tensors \"x\" and optionally \"gammas\"",
                              "unexpected tensor \"%.64s\" in the forward body", set.items[i].name);
    ls_tensor *tx = (ls_tensor *)ls_tensor_set_find(&set, "x");
    ls_tensor *tg = (ls_tensor *)ls_tensor_set_find(&set, "gammas");
    if (st == LS_OK && !tx)
        st = ls_error_set(err, LS_INVALID_REQUEST, NULL, "the safetensors body has no tensor \"x\"");
    if (st == LS_OK && max_tokens > 0 && tx->ndim >= 1 && tx->shape[0] > max_tokens)
        st = ls_error_set(err, LS_PAYLOAD_TOO_LARGE,
                          "send fewer tokens per request or restart with a larger --max-request-tokens",
                          "x has %lld rows, more than the %d one request may carry", (long long)tx->shape[0],
                          max_tokens);
    if (st == LS_OK) st = ls_forward_meta_check(&set, err);
    if (st == LS_OK) st = ls_forward_take_x(tx, dims->H, req, err);
    int rows;
    if (st == LS_OK && tg) st = ls_forward_take_matrix(tg, "gammas", req->T, dims->n, &req->gammas, &rows, err);
    const char *names = ls_tensor_set_meta(&set, "adapters");
    if (st == LS_OK && names) st = ls_forward_names_text(names, req, err);
    ls_tensor_set_free(&set);
    if (st == LS_OK) st = ls_forward_req_route(req, q_adapter, "adapter", err);
    if (st != LS_OK) ls_forward_req_free(req);
    return st;
}

ls_status ls_forward_routed_name(const char *q_adapter, const char *h_adapter, const char **name, const char **what,
                                 ls_error *err) {
    *name = q_adapter ? q_adapter : h_adapter;
    *what = q_adapter ? "adapter" : LS_FORWARD_ADAPTER_HEADER;
    if (q_adapter && h_adapter && strcmp(q_adapter, h_adapter))
        return ls_error_set(err, LS_INVALID_REQUEST, "name one adapter, in the query, the header or the body",
                            "the query's adapter=%.140s and the header %s: %.140s name different adapters", q_adapter,
                            LS_FORWARD_ADAPTER_HEADER, h_adapter);
    return LS_OK;
}

/* An empty name names no adapter, which is not the base model: refused as
 * the JSON form refuses "", never served as base. */
ls_status ls_forward_req_route(ls_forward_req *req, const char *name, const char *what, ls_error *err) {
    if (!name) return LS_OK;
    ls_status st = ls_adapter_name_check(name, what, err);
    if (st != LS_OK) return st;
    ls_token_names *tn = &req->names;
    if (tn->of_token) {
        /* The body named adapters too: each must be this one (or none,
         * the base model), or the proxy routed on a lie. Names are in
         * order of first use, so the first other one is the one the first
         * token naming another names. */
        int k = 0;
        while (k < tn->n && !strcmp(tn->names[k], name)) k++;
        if (k == tn->n) return LS_OK;
        int t = 0;
        while (tn->of_token[t] != k) t++;
        return ls_error_set(err, LS_INVALID_REQUEST,
                            "name one adapter: the body's must match the query's or the header's",
                            "token %d of the body names adapter \"%.140s\", but %s names \"%.140s\"", t,
                            tn->names[k], what, name);
    }
    if (!ls_token_names_fill(tn, name, req->T)) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    return LS_OK;
}

static json_t *ls_forward_used_json(const ls_pool_used *used, int n_used) {
    json_t *arr = json_array();
    for (int i = 0; arr && i < n_used; i++)
        json_array_append_new(arr, json_pack("{s:s, s:I, s:i}", "name", used[i].name, "version",
                                             (json_int_t)used[i].version, "slot", used[i].slot));
    return arr;
}

char *ls_forward_resp_json(const ls_forward_req *req, int H, const float *y, const ls_pool_used *used, int n_used) {
    /* Written as text: y can be megabytes of numbers, and a json_t per
     * value made formatting the dominant cost of a small forward. */
    char *adapters = ls_json_take_text(ls_forward_used_json(used, n_used));
    if (!adapters) return NULL;
    ls_buf b;
    ls_buf_init(&b);
    ls_buf_append(&b, "{\"y\":", 5);
    if (req->base64) ls_json_tensor_f32_base64_text(&b, y, req->T, H);
    else ls_json_tensor_f32_text(&b, y, req->T, H);
    /* The reply's closing newline here, in the buffer's slack: added
     * later it would copy a reply that can be the largest thing held. */
    ls_buf_printf(&b, ",\"layer\":%d,\"tokens\":%d,\"adapters\":%s}\n", req->layer, req->T, adapters);
    free(adapters);
    return ls_buf_take(&b, NULL);
}

/* The reply's tensor set: y and the metadata (meta owned by the caller). */
static ls_status ls_forward_resp_set(const ls_forward_req *req, int H, const float *y, const ls_pool_used *used,
                                     int n_used, ls_tensor_set *set, char **meta, ls_error *err) {
    ls_tensor_set_init(set);
    ls_tensor t = {.dtype = LS_DTYPE_F32, .ndim = 2, .shape = {req->T, H}, .data = (void *)y,
                   .nbytes = (size_t)req->T * (size_t)H * 4, .owned = false};
    *meta = ls_json_take_text(ls_forward_used_json(used, n_used));
    char layer[16];
    snprintf(layer, sizeof layer, "%d", req->layer);
    if (!*meta || !ls_tensor_set_add(set, "y", &t) || !ls_tensor_set_add_meta(set, "adapters", *meta) ||
        !ls_tensor_set_add_meta(set, "layer", layer))
        return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    return LS_OK;
}

ls_status ls_forward_resp_safetensors(const ls_forward_req *req, int H, const float *y, const ls_pool_used *used,
                                      int n_used, uint8_t **out, size_t *len, ls_error *err) {
    ls_tensor_set set;
    char *meta = NULL;
    ls_status st = ls_forward_resp_set(req, H, y, used, n_used, &set, &meta, err);
    if (st == LS_OK) st = ls_safetensors_write(&set, out, len, err);
    free(meta);
    ls_tensor_set_free(&set);
    return st;
}

ls_status ls_forward_resp_safetensors_before(const ls_forward_req *req, int H, uint8_t *buf, size_t room,
                                             const ls_pool_used *used, int n_used, size_t *start, size_t *len,
                                             ls_error *err) {
    ls_tensor_set set;
    char *meta = NULL;
    ls_status st = ls_forward_resp_set(req, H, (const float *)(buf + room), used, n_used, &set, &meta, err);
    if (st == LS_OK) st = ls_safetensors_write_before(&set, buf, room, start, len, err);
    free(meta);
    ls_tensor_set_free(&set);
    return st;
}
