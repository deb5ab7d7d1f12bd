/* /forward wire formats: parse and check the request, build the reply. */
#include "api/forward.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/json_tensor.h"
#include "common/buf.h"
#include "format/safetensors.h"

bool ls_adapter_name_valid(const char *name) {
    size_t n = strlen(name);
    if (n < 1 || n > 128 || name[0] == '.') return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return false;
    }
    return true;
}

void ls_forward_req_free(ls_forward_req *req) {
    free(req->x);
    free(req->gammas);
    if (req->names) {
        for (int t = 0; t < req->T; t++) free(req->names[t]);
        free(req->names);
    }
    memset(req, 0, sizeof *req);
}

/* Takes a parsed tensor as [rows, cols] fp32 into *dst (owned). */
static ls_status ls_forward_take_matrix(ls_tensor *t, const char *what, int want_rows, int want_cols, float **dst,
                                        int *rows_out, ls_error *err) {
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
    size_t count = (size_t)t->shape[0] * (size_t)want_cols;
    float *v = malloc(count * sizeof *v);
    if (!v) return ls_error_set(err, LS_INTERNAL, NULL, "%s: out of memory", what);
    ls_tensor_to_f32(t, v);
    for (size_t i = 0; i < count; i++) {
        if (!isfinite(v[i])) {
            free(v);
            return ls_error_set(err, LS_INVALID_REQUEST, "send finite values", "%s[%zu][%zu] is not finite", what,
                                i / (size_t)want_cols, i % (size_t)want_cols);
        }
    }
    *dst = v;
    *rows_out = (int)t->shape[0];
    return LS_OK;
}

static ls_status ls_forward_check_layer(long long layer, const ls_dims *dims, ls_error *err) {
    if (layer < 0 || layer >= dims->L)
        return ls_error_set(err, LS_INVALID_REQUEST, "layer runs from 0 to layers-1 of the served model",
                            "layer %lld is out of range: the model has %d layer%s (0..%d)", layer, dims->L,
                            dims->L == 1 ? "" : "s", dims->L - 1);
    return LS_OK;
}

static ls_status ls_forward_check_name(const char *name, const char *what, ls_error *err) {
    if (!ls_adapter_name_valid(name))
        return ls_error_set(err, LS_INVALID_REQUEST,
                            "names are 1-128 letters, digits, '.', '_' or '-', not starting with '.'",
                            "%s: \"%.140s\" is not a valid adapter name", what, name);
    return LS_OK;
}

/* Fills req->names from "adapter" or "adapters" (either may be absent). */
static ls_status ls_forward_parse_names(json_t *jadapter, json_t *jadapters, ls_forward_req *req, ls_error *err) {
    if (jadapter && !json_is_null(jadapter) && jadapters && !json_is_null(jadapters))
        return ls_error_set(err, LS_INVALID_REQUEST, "send \"adapter\" for all tokens or \"adapters\" per token",
                            "give either \"adapter\" or \"adapters\", not both");
    if (jadapter && !json_is_null(jadapter)) {
        if (!json_is_string(jadapter))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"adapter\" must be a string or null");
        ls_status st = ls_forward_check_name(json_string_value(jadapter), "adapter", err);
        if (st != LS_OK) return st;
        req->names = calloc((size_t)req->T, sizeof *req->names);
        if (!req->names) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
        for (int t = 0; t < req->T; t++)
            if (!(req->names[t] = strdup(json_string_value(jadapter))))
                return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
        return LS_OK;
    }
    if (!jadapters || json_is_null(jadapters)) return LS_OK;
    if (!json_is_array(jadapters))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"adapters\" must be an array (a name or null per token)");
    if ((int)json_array_size(jadapters) != req->T)
        return ls_error_set(err, LS_INVALID_SHAPE, "send one adapter name or null per row of x",
                            "\"adapters\" has %zu entries for %d tokens", json_array_size(jadapters), req->T);
    req->names = calloc((size_t)req->T, sizeof *req->names);
    if (!req->names) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    for (int t = 0; t < req->T; t++) {
        json_t *e = json_array_get(jadapters, (size_t)t);
        if (json_is_null(e)) continue;
        if (!json_is_string(e))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "adapters[%d] must be a string or null", t);
        char what[32];
        snprintf(what, sizeof what, "adapters[%d]", t);
        ls_status st = ls_forward_check_name(json_string_value(e), what, err);
        if (st != LS_OK) return st;
        if (!(req->names[t] = strdup(json_string_value(e)))) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    }
    return LS_OK;
}

static ls_status ls_forward_parse_json_obj(json_t *root, const ls_dims *dims, ls_forward_req *req, ls_error *err) {
    static const char *const known[] = {"layer", "x", "gammas", "adapter", "adapters", "encoding", NULL};
    ls_status st = ls_json_check_keys(root, known, "forward request", err);
    if (st != LS_OK) return st;
    json_t *jlayer = json_object_get(root, "layer");
    if (jlayer && !json_is_null(jlayer)) {
        if (!json_is_integer(jlayer))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"layer\" must be an integer");
        ls_status st = ls_forward_check_layer(json_integer_value(jlayer), dims, err);
        if (st != LS_OK) return st;
        req->layer = (int)json_integer_value(jlayer);
    }
    json_t *jenc = json_object_get(root, "encoding");
    if (jenc && !json_is_null(jenc)) {
        const char *e = json_string_value(jenc);
        if (e && !strcmp(e, "base64")) req->base64 = true;
        else if (!e || strcmp(e, "json"))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"encoding\" is \"json\" or \"base64\"");
    }
    json_t *jx = json_object_get(root, "x");
    if (!jx) return ls_error_set(err, LS_INVALID_REQUEST, "send \"x\": [T][H]", "the request has no \"x\"");
    ls_tensor t;
    st = ls_json_tensor_parse(jx, "x", &t, err);
    if (st != LS_OK) return st;
    st = ls_forward_take_matrix(&t, "x", -1, dims->H, &req->x, &req->T, err);
    ls_tensor_free(&t);
    if (st != LS_OK) return st;
    json_t *jg = json_object_get(root, "gammas");
    if (jg && !json_is_null(jg)) {
        int rows;
        st = ls_json_tensor_parse(jg, "gammas", &t, err);
        if (st != LS_OK) return st;
        st = ls_forward_take_matrix(&t, "gammas", req->T, dims->n, &req->gammas, &rows, err);
        ls_tensor_free(&t);
        if (st != LS_OK) return st;
    }
    return ls_forward_parse_names(json_object_get(root, "adapter"), json_object_get(root, "adapters"), req, err);
}

ls_status ls_forward_req_parse_json(const char *body, size_t len, const ls_dims *dims, ls_forward_req *req,
                                    ls_error *err) {
    memset(req, 0, sizeof *req);
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ls_error_set(err, LS_INVALID_JSON, NULL, "the body is not valid JSON: %s (line %d, column %d)",
                            jerr.text, jerr.line, jerr.column);
    ls_status st = ls_forward_parse_json_obj(root, dims, req, err);
    json_decref(root);
    if (st != LS_OK) ls_forward_req_free(req);
    return st;
}

ls_status ls_forward_req_parse_safetensors(const uint8_t *body, size_t len, const char *q_layer,
                                           const char *q_adapter, const ls_dims *dims, ls_forward_req *req,
                                           ls_error *err) {
    memset(req, 0, sizeof *req);
    ls_status st = LS_OK;
    if (q_layer) {
        char *end;
        errno = 0;
        long long layer = strtoll(q_layer, &end, 10);
        if (errno || end == q_layer || *end)
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "query layer=%.32s is not an integer", q_layer);
        if ((st = ls_forward_check_layer(layer, dims, err)) != LS_OK) return st;
        req->layer = (int)layer;
    }
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
    if (st == LS_OK) st = ls_forward_take_matrix(tx, "x", -1, dims->H, &req->x, &req->T, err);
    int rows;
    if (st == LS_OK && tg) st = ls_forward_take_matrix(tg, "gammas", req->T, dims->n, &req->gammas, &rows, err);
    ls_tensor_set_free(&set);
    if (st == LS_OK && q_adapter && *q_adapter) {
        st = ls_forward_check_name(q_adapter, "adapter", err);
        if (st == LS_OK && !(req->names = calloc((size_t)req->T, sizeof *req->names)))
            st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
        for (int t = 0; st == LS_OK && t < req->T; t++)
            if (!(req->names[t] = strdup(q_adapter))) st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    }
    if (st != LS_OK) ls_forward_req_free(req);
    return st;
}

static json_t *ls_forward_used_json(const ls_forward_used *used, int n_used) {
    json_t *arr = json_array();
    for (int i = 0; arr && i < n_used; i++)
        json_array_append_new(arr, json_pack("{s:s, s:I, s:i}", "name", used[i].name, "version",
                                             (json_int_t)used[i].version, "slot", used[i].slot));
    return arr;
}

char *ls_forward_resp_json(const ls_forward_req *req, int H, const float *y, const ls_forward_used *used,
                           int n_used) {
    /* Written as text: y can be megabytes of numbers, and a json_t per
     * value made formatting the dominant cost of a small forward. */
    char *adapters = ls_json_take_text(ls_forward_used_json(used, n_used));
    if (!adapters) return NULL;
    ls_buf b;
    ls_buf_init(&b);
    ls_buf_append(&b, "{\"y\":", 5);
    if (req->base64) {
        char *t = ls_json_take_text(ls_json_tensor_f32_base64(y, req->T, H));
        if (t) ls_buf_append(&b, t, strlen(t));
        else b.failed = true;
        free(t);
    } else {
        ls_json_tensor_f32_text(&b, y, req->T, H);
    }
    ls_buf_printf(&b, ",\"layer\":%d,\"tokens\":%d,\"adapters\":%s}", req->layer, req->T, adapters);
    free(adapters);
    return ls_buf_take(&b, NULL);
}

ls_status ls_forward_resp_safetensors(const ls_forward_req *req, int H, const float *y, const ls_forward_used *used,
                                      int n_used, uint8_t **out, size_t *len, ls_error *err) {
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    ls_tensor t = {.dtype = LS_DTYPE_F32, .ndim = 2, .shape = {req->T, H}, .data = (void *)y,
                   .nbytes = (size_t)req->T * (size_t)H * 4, .owned = false};
    char *meta = ls_json_take_text(ls_forward_used_json(used, n_used));
    char layer[16];
    snprintf(layer, sizeof layer, "%d", req->layer);
    ls_status st = LS_OK;
    if (!meta || !ls_tensor_set_add(&set, "y", &t) || !ls_tensor_set_add_meta(&set, "adapters", meta) ||
        !ls_tensor_set_add_meta(&set, "layer", layer))
        st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    if (st == LS_OK) st = ls_safetensors_write(&set, out, len, err);
    free(meta);
    ls_tensor_set_free(&set);
    return st;
}
