/* Adapter uploads in their three ways in, reduced to one ls_adapter_upload:
 * a path or tensors, and parameters; nothing read from disk and nothing
 * validated beyond the wire format (lora/loader does both). */
#include "api/adapter_upload.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/forward.h"
#include "api/json_tensor.h"
#include "common/text.h"
#include "format/json.h"
#include "format/safetensors.h"
#include "lora/adapter_config.h"

void ls_adapter_upload_free(ls_adapter_upload *up) {
    ls_tensor_set_free(&up->tensors);
    memset(up, 0, sizeof *up);
}

ls_adapter_source ls_adapter_upload_source(const ls_adapter_upload *up) {
    return (ls_adapter_source){.path = up->path[0] ? up->path : NULL,
                               .tensors = &up->tensors,
                               .own = up->own,
                               .given = up->given};
}

static ls_status ls_upload_set_name(ls_adapter_upload *up, const char *name, bool require, ls_error *err) {
    if (!name) {
        if (!require) return LS_OK;
        return ls_error_set(err, LS_INVALID_REQUEST, "give the adapter a \"name\"", "the upload has no name");
    }
    if (!ls_adapter_name_valid(name))
        return ls_error_set(err, LS_INVALID_REQUEST,
                            "names are 1-128 letters, digits, '.', '_' or '-', not starting with '.'",
                            "\"%.140s\" is not a valid adapter name", name);
    snprintf(up->name, sizeof up->name, "%s", name);
    return LS_OK;
}

static ls_status ls_upload_parse_bool_text(const char *v, const char *key, bool *out, ls_error *err) {
    if (!ls_text_bool(v, out))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s=%.32s is not true or false", key, v);
    return LS_OK;
}

/* *out from root[key] when it is given (absent or null: not given, *out
 * unchanged); *given, when not NULL, says which. */
static ls_status ls_upload_json_bool(json_t *root, const char *key, bool *out, bool *given, ls_error *err) {
    json_t *v = json_object_get(root, key);
    if (given) *given = v && !json_is_null(v);
    if (!v || json_is_null(v)) return LS_OK;
    if (!json_is_boolean(v)) return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"%s\" must be true or false", key);
    *out = json_is_true(v);
    return LS_OK;
}

/* root[key], or NULL when it is absent or null. */
static json_t *ls_upload_json_given(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return v && !json_is_null(v) ? v : NULL;
}

static ls_status ls_upload_json_tensors(json_t *jt, ls_tensor_set *set, ls_error *err) {
    if (!json_is_object(jt))
        return ls_error_set(err, LS_INVALID_REQUEST, "\"tensors\" maps each tensor name to a tensor",
                            "\"tensors\" must be an object");
    const char *key;
    json_t *val;
    json_object_foreach(jt, key, val) {
        char what[256];
        snprintf(what, sizeof what, "tensors[\"%.200s\"]", key);
        ls_tensor t;
        ls_status st = ls_json_tensor_parse(val, what, &t, err);
        if (st != LS_OK) return st;
        if (!ls_tensor_set_add(set, key, &t)) {
            ls_tensor_free(&t);
            return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
        }
    }
    return LS_OK;
}

static ls_status ls_upload_from_json(json_t *root, bool require_name, ls_adapter_upload *up, ls_error *err) {
    static const char *const known[] = {"name", "path", "format", "config", "tensors",
                                        "pinned", "strict", "replace", "scale", "gate_up_order", NULL};
    ls_status st = ls_json_check_keys(root, known, "adapter upload", err);
    if (st != LS_OK) return st;
    /* null is "not given" for every key, these three too: a client that
     * writes each field of its struct must not be refused for the empty ones. */
    json_t *jname = ls_upload_json_given(root, "name");
    if (jname && !json_is_string(jname))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"name\" must be a string");
    st = ls_upload_set_name(up, json_string_value(jname), require_name, err);
    if (st == LS_OK) st = ls_upload_json_bool(root, "pinned", &up->pinned, &up->pinned_given, err);
    if (st == LS_OK) st = ls_upload_json_bool(root, "strict", &up->given.strict, NULL, err);
    if (st == LS_OK) st = ls_upload_json_bool(root, "replace", &up->replace, NULL, err);
    if (st != LS_OK) return st;

    json_t *jpath = ls_upload_json_given(root, "path"), *jtensors = ls_upload_json_given(root, "tensors");
    json_t *jformat = json_object_get(root, "format"), *jconfig = json_object_get(root, "config");
    json_t *jscale = json_object_get(root, "scale"), *jorder = json_object_get(root, "gate_up_order");
    if (!!jpath == !!jtensors)
        return ls_error_set(err, LS_INVALID_REQUEST, "send {\"name\", \"path\"} or {\"name\", \"config\", \"tensors\"}",
                            "the upload needs exactly one of \"path\" and \"tensors\"");
    if (jpath) {
        if (!json_is_string(jpath)) return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"path\" must be a string");
        const char *path = json_string_value(jpath);
        if (!*path || strlen(path) >= sizeof up->path)
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"path\" must be 1 to %zu bytes",
                                sizeof up->path - 1);
        snprintf(up->path, sizeof up->path, "%s", path);
    } else {
        st = ls_upload_json_tensors(jtensors, &up->tensors, err);
        if (st != LS_OK) return st;
    }
    /* What the request states; the loader puts it over what a file says. */
    if (jconfig && !json_is_null(jconfig)) {
        if (!json_is_object(jconfig))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"config\" must be an object");
        if ((st = ls_adapter_config_parse(jconfig, false, &up->given, err)) != LS_OK) return st;
    }
    if (jformat && !json_is_null(jformat)) {
        if (!json_is_string(jformat) || !ls_adapter_format_parse(json_string_value(jformat), &up->given.format))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"format\" is \"peft\", \"pool\" or \"auto\"");
    }
    if (jscale && !json_is_null(jscale)) {
        if (!json_is_number(jscale) || !isfinite(json_number_value(jscale)))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"scale\" must be a finite number");
        up->given.has_scale = true;
        up->given.scale = json_number_value(jscale);
    }
    if (jorder && !json_is_null(jorder)) {
        if (!json_is_string(jorder) || !ls_gate_up_order_parse(json_string_value(jorder), &up->given.gate_up_order))
            return ls_error_set(err, LS_INVALID_REQUEST,
                                "\"gate_up\": each expert's F gate rows, then its F up rows (sglang); "
                                "\"interleaved\": gate and up rows alternate",
                                "\"gate_up_order\" is \"gate_up\" or \"interleaved\"");
        up->given.has_order = true;
    }
    return LS_OK;
}

ls_status ls_adapter_upload_parse_json(const char *body, size_t len, bool strict_default, bool require_name,
                                       ls_adapter_upload *up, ls_error *err) {
    memset(up, 0, sizeof *up);
    ls_tensor_set_init(&up->tensors);
    up->given.strict = strict_default;
    json_error_t jerr;
    char why[sizeof jerr.text];
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ls_error_set(err, LS_INVALID_JSON, NULL, "the body is not valid JSON: %s (line %d, column %d)",
                            ls_json_error_reason(&jerr, why, sizeof why), jerr.line, jerr.column);
    ls_status st = ls_upload_from_json(root, require_name, up, err);
    json_decref(root);
    if (st != LS_OK) ls_adapter_upload_free(up);
    return st;
}

ls_status ls_adapter_upload_parse_raw(const uint8_t *body, size_t len, ls_query_fn query, void *query_ctx,
                                      bool strict_default, bool require_name, ls_adapter_upload *up, ls_error *err) {
    memset(up, 0, sizeof *up);
    ls_tensor_set_init(&up->tensors);
    up->given.strict = strict_default;
    ls_status st = ls_safetensors_parse(body, len, &up->tensors, err);
    if (st == LS_OK) {
        ls_adapter_text_params meta = ls_adapter_text_params_meta(&up->tensors, "the body's __metadata__");
        st = ls_adapter_params_from_text(&meta, &up->own, err);
    }
    if (st == LS_OK) {
        ls_adapter_text_params q = {query(query_ctx, "lora_alpha"), query(query_ctx, "use_rslora"),
                                    query(query_ctx, "format"), query(query_ctx, "r"), query(query_ctx, "scale"),
                                    query(query_ctx, "gate_up_order"), NULL};
        st = ls_adapter_params_from_text(&q, &up->given, err);
    }
    const char *name = query(query_ctx, "name");
    if (!name) name = ls_tensor_set_meta(&up->tensors, "name");
    if (st == LS_OK) st = ls_upload_set_name(up, name, require_name, err);
    const char *v;
    if (st == LS_OK && (v = query(query_ctx, "pinned"))) {
        st = ls_upload_parse_bool_text(v, "pinned", &up->pinned, err);
        up->pinned_given = true;
    }
    if (st == LS_OK && (v = query(query_ctx, "strict")))
        st = ls_upload_parse_bool_text(v, "strict", &up->given.strict, err);
    if (st == LS_OK && (v = query(query_ctx, "replace")))
        st = ls_upload_parse_bool_text(v, "replace", &up->replace, err);
    if (st != LS_OK) ls_adapter_upload_free(up);
    return st;
}
