/* Adapter uploads in their three ways in, reduced to one ls_adapter_upload:
 * tensors + parameters, nothing validated beyond the wire format (lora/
 * checks the invariants). */
#include "api/adapter_upload.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/adapter_config.h"
#include "api/forward.h"
#include "api/json_tensor.h"
#include "api/safetensors.h"

void ls_adapter_upload_free(ls_adapter_upload *up) {
    ls_tensor_set_free(&up->tensors);
    ls_file_map_close(&up->map);
    memset(up, 0, sizeof *up);
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

/* Parses "true"/"false"/"1"/"0" from a query string or metadata value. */
static ls_status ls_upload_parse_bool_text(const char *v, const char *key, bool *out, ls_error *err) {
    if (!strcmp(v, "true") || !strcmp(v, "1")) *out = true;
    else if (!strcmp(v, "false") || !strcmp(v, "0")) *out = false;
    else return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s=%.32s is not true or false", key, v);
    return LS_OK;
}

static ls_status ls_upload_parse_double_text(const char *v, const char *key, double *out, ls_error *err) {
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(d))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s=%.32s is not a finite number", key, v);
    *out = d;
    return LS_OK;
}

/* Applies textual parameters (query string, or __metadata__) to params. */
static ls_status ls_upload_apply_text_params(const char *alpha, const char *rslora, const char *format, const char *r,
                                             const char *scale, ls_adapter_params *p, ls_error *err) {
    ls_status st = LS_OK;
    if (alpha && (st = ls_upload_parse_double_text(alpha, "lora_alpha", &p->lora_alpha, err)) == LS_OK)
        p->has_alpha = true;
    if (st == LS_OK && rslora) st = ls_upload_parse_bool_text(rslora, "use_rslora", &p->use_rslora, err);
    if (st == LS_OK && format && !ls_adapter_format_parse(format, &p->format))
        st = ls_error_set(err, LS_INVALID_REQUEST, NULL, "format=%.32s is not peft, pool or auto", format);
    if (st == LS_OK && r) {
        char *end;
        errno = 0;
        long v = strtol(r, &end, 10);
        if (errno || end == r || *end || v <= 0 || v > INT_MAX)
            st = ls_error_set(err, LS_ADAPTER_CONFIG_INVALID, NULL, "r=%.32s is not a positive integer", r);
        else p->r = (int)v;
    }
    if (st == LS_OK && scale && (st = ls_upload_parse_double_text(scale, "scale", &p->scale, err)) == LS_OK)
        p->has_scale = true;
    return st;
}

static ls_status ls_upload_apply_metadata(const ls_tensor_set *s, ls_adapter_params *p, ls_error *err) {
    return ls_upload_apply_text_params(ls_tensor_set_meta(s, "lora_alpha"), ls_tensor_set_meta(s, "use_rslora"),
                                       ls_tensor_set_meta(s, "format"), ls_tensor_set_meta(s, "r"),
                                       ls_tensor_set_meta(s, "scale"), p, err);
}

ls_status ls_adapter_resolve_path(const char *dir, const char *rel, char *out, size_t out_len, ls_error *err) {
    char base[PATH_MAX], joined[PATH_MAX * 2], real[PATH_MAX];
    if (!realpath(dir && *dir ? dir : ".", base))
        return ls_error_set(err, LS_INTERNAL, "check --adapter-dir", "the adapter directory %.200s cannot be resolved: %s",
                            dir && *dir ? dir : ".", strerror(errno));
    /* A cut path could resolve to another file than the one named. */
    int jl = rel[0] == '/' ? snprintf(joined, sizeof joined, "%s", rel)
                           : snprintf(joined, sizeof joined, "%s/%s", base, rel);
    if (jl < 0 || (size_t)jl >= sizeof joined)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "path \"%.200s...\" is too long", rel);
    if (!realpath(joined, real))
        return ls_error_set(err, LS_INVALID_REQUEST, "paths are taken relative to --adapter-dir",
                            "path \"%.200s\" cannot be read: %s", rel, strerror(errno));
    size_t bl = strlen(base);
    bool inside = !strcmp(base, "/") || (!strncmp(real, base, bl) && (real[bl] == '/' || real[bl] == '\0'));
    if (!inside)
        return ls_error_set(err, LS_INVALID_REQUEST, "adapters must live under --adapter-dir (no '..' or symlinks out)",
                            "path \"%.200s\" resolves outside the adapter directory %.200s", rel, base);
    if (strlen(real) >= out_len)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "path \"%.200s\" is too long", rel);
    snprintf(out, out_len, "%s", real);
    return LS_OK;
}

ls_status ls_adapter_read_path(const char *path, ls_adapter_params *params, ls_tensor_set *tensors, ls_file_map *map,
                               ls_error *err) {
    struct stat sb;
    if (stat(path, &sb))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%.200s cannot be read: %s", path, strerror(errno));
    char file[PATH_MAX + 64];
    ls_status st;
    bool peft_dir = S_ISDIR(sb.st_mode);
    if (peft_dir) {
        char cfgpath[PATH_MAX + 64], *text = NULL;
        snprintf(cfgpath, sizeof cfgpath, "%s/adapter_config.json", path);
        st = ls_file_read_text(cfgpath, 1 << 20, &text, LS_ADAPTER_CONFIG_INVALID, err);
        if (st != LS_OK) return st;
        st = ls_adapter_config_parse_text(text, params, err);
        free(text);
        if (st != LS_OK) return st;
        params->format = LS_ADAPTER_FORMAT_PEFT;
        snprintf(file, sizeof file, "%s/adapter_model.safetensors", path);
        if (stat(file, &sb))
            return ls_error_set(err, LS_INVALID_REQUEST, "a PEFT directory holds adapter_model.safetensors",
                                "%.200s has no adapter_model.safetensors: %s", path, strerror(errno));
    } else {
        snprintf(file, sizeof file, "%s", path);
    }
    if ((st = ls_file_map_open(file, map, LS_INVALID_REQUEST, err)) != LS_OK) return st;
    st = ls_safetensors_parse(map->data, map->len, tensors, err);
    /* A PEFT directory's config wins; a bare file carries its own. */
    if (st == LS_OK && !peft_dir) st = ls_upload_apply_metadata(tensors, params, err);
    if (st != LS_OK) {
        ls_tensor_set_free(tensors);
        ls_file_map_close(map);
    }
    return st;
}

static ls_status ls_upload_json_bool(json_t *root, const char *key, bool *out, ls_error *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return LS_OK;
    if (!json_is_boolean(v)) return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"%s\" must be true or false", key);
    *out = json_is_true(v);
    return LS_OK;
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

static ls_status ls_upload_from_json(json_t *root, const char *adapter_dir, bool require_name, ls_adapter_upload *up,
                                     ls_error *err) {
    static const char *const known[] = {"name", "path", "format", "config", "tensors",
                                        "pinned", "strict", "replace", "scale", NULL};
    ls_status st = ls_json_check_keys(root, known, "adapter upload", err);
    if (st != LS_OK) return st;
    json_t *jname = json_object_get(root, "name");
    if (jname && !json_is_string(jname))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"name\" must be a string");
    st = ls_upload_set_name(up, json_string_value(jname), require_name, err);
    if (st == LS_OK) st = ls_upload_json_bool(root, "pinned", &up->pinned, err);
    if (st == LS_OK) st = ls_upload_json_bool(root, "strict", &up->params.strict, err);
    if (st == LS_OK) st = ls_upload_json_bool(root, "replace", &up->replace, err);
    if (st != LS_OK) return st;

    json_t *jpath = json_object_get(root, "path"), *jtensors = json_object_get(root, "tensors");
    json_t *jformat = json_object_get(root, "format"), *jconfig = json_object_get(root, "config");
    json_t *jscale = json_object_get(root, "scale");
    if (!!jpath == !!jtensors)
        return ls_error_set(err, LS_INVALID_REQUEST, "send {\"name\", \"path\"} or {\"name\", \"config\", \"tensors\"}",
                            "the upload needs exactly one of \"path\" and \"tensors\"");
    if (jpath) {
        if (!json_is_string(jpath)) return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"path\" must be a string");
        st = ls_adapter_resolve_path(adapter_dir, json_string_value(jpath), up->source_path, sizeof up->source_path, err);
        if (st == LS_OK) st = ls_adapter_read_path(up->source_path, &up->params, &up->tensors, &up->map, err);
        if (st != LS_OK) return st;
    } else {
        st = ls_upload_json_tensors(jtensors, &up->tensors, err);
        if (st != LS_OK) return st;
    }
    /* Inline parameters override what a file said about itself. */
    if (jconfig && !json_is_null(jconfig)) {
        if (!json_is_object(jconfig))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"config\" must be an object");
        if ((st = ls_adapter_config_parse(jconfig, false, &up->params, err)) != LS_OK) return st;
    }
    if (jformat && !json_is_null(jformat)) {
        if (!json_is_string(jformat) || !ls_adapter_format_parse(json_string_value(jformat), &up->params.format))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"format\" is \"peft\", \"pool\" or \"auto\"");
    }
    if (jscale && !json_is_null(jscale)) {
        if (!json_is_number(jscale) || !isfinite(json_number_value(jscale)))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"scale\" must be a finite number");
        up->params.has_scale = true;
        up->params.scale = json_number_value(jscale);
    }
    return LS_OK;
}

ls_status ls_adapter_upload_parse_json(const char *body, size_t len, const char *adapter_dir, bool strict_default,
                                       bool require_name, ls_adapter_upload *up, ls_error *err) {
    memset(up, 0, sizeof *up);
    ls_tensor_set_init(&up->tensors);
    up->params.strict = strict_default;
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ls_error_set(err, LS_INVALID_JSON, NULL, "the body is not valid JSON: %s (line %d, column %d)",
                            jerr.text, jerr.line, jerr.column);
    ls_status st = ls_upload_from_json(root, adapter_dir, require_name, up, err);
    json_decref(root);
    if (st != LS_OK) ls_adapter_upload_free(up);
    return st;
}

ls_status ls_adapter_upload_parse_raw(const uint8_t *body, size_t len, ls_query_fn query, void *query_ctx,
                                      bool strict_default, bool require_name, ls_adapter_upload *up, ls_error *err) {
    memset(up, 0, sizeof *up);
    ls_tensor_set_init(&up->tensors);
    up->params.strict = strict_default;
    ls_status st = ls_safetensors_parse(body, len, &up->tensors, err);
    if (st == LS_OK) st = ls_upload_apply_metadata(&up->tensors, &up->params, err);
    if (st == LS_OK)
        st = ls_upload_apply_text_params(query(query_ctx, "lora_alpha"), query(query_ctx, "use_rslora"),
                                         query(query_ctx, "format"), query(query_ctx, "r"), query(query_ctx, "scale"),
                                         &up->params, err);
    const char *name = query(query_ctx, "name");
    if (!name) name = ls_tensor_set_meta(&up->tensors, "name");
    if (st == LS_OK) st = ls_upload_set_name(up, name, require_name, err);
    const char *v;
    if (st == LS_OK && (v = query(query_ctx, "pinned"))) st = ls_upload_parse_bool_text(v, "pinned", &up->pinned, err);
    if (st == LS_OK && (v = query(query_ctx, "strict")))
        st = ls_upload_parse_bool_text(v, "strict", &up->params.strict, err);
    if (st == LS_OK && (v = query(query_ctx, "replace")))
        st = ls_upload_parse_bool_text(v, "replace", &up->replace, err);
    if (st != LS_OK) ls_adapter_upload_free(up);
    return st;
}
