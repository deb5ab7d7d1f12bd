/* Adapter uploads in their three ways in, reduced to one ls_adapter_upload:
 * a path or tensors, and parameters; nothing read from disk and nothing
 * validated beyond the wire format (lora/loader does both). A JSON body
 * is read in one pass (format/json_reader.h), its tensors straight into
 * their buffers: no tree of JSON values is built of it. */
#include "api/adapter_upload.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/forward.h"
#include "format/json_reader.h"
#include "api/json_tensor.h"
#include "common/text.h"
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
    if (!ls_adapter_pool_name_valid(name))
        return ls_error_set(err, LS_INVALID_REQUEST,
                            "names are 1-128 letters, digits, '.', '_' or '-', not starting with '.' (an admin "
                            "names a tenant's adapter TENANT/NAME)",
                            "\"%.140s\" is not a valid adapter name", name);
    memcpy(up->name, name, strlen(name) + 1); /* a valid name fits: at most 128 bytes */
    return LS_OK;
}

static ls_status ls_upload_parse_bool_text(const char *v, const char *key, bool *out, ls_error *err) {
    if (!ls_text_bool_py(v, out))
        return ls_error_set(err, LS_INVALID_REQUEST, "give true or false (1 or 0, or Python's True or False)",
                            "%s=%.32s is not true or false", key, v);
    return LS_OK;
}

/* A key of the body as it was written: whether it was given, as what,
 * and its value when it is a small one. */
typedef enum { LS_UF_ABSENT, LS_UF_NULL, LS_UF_STRING, LS_UF_BOOL, LS_UF_NUMBER, LS_UF_OBJECT, LS_UF_OTHER } ls_uf_kind;

typedef struct {
    ls_uf_kind kind;
    size_t len;            /* a string's whole length (text may hold less) */
    bool b;                /* a boolean */
    double num;            /* a number */
    const char *from, *to; /* an object's text in the body (config) */
} ls_uf;

/* The keys of an upload body as one read found them. The tensors go
 * straight into the upload; only the first tensor's problem is kept. */
typedef struct {
    ls_uf name, path, format, config, tensors, pinned, strict, replace, scale, order;
    char name_text[256], path_text[LS_LOADER_PATH_MAX], format_text[32], order_text[32];
    bool has_unknown;
    char unknown[80]; /* with has_unknown: the first key that is none of these */
    ls_error tensor_err;
} ls_ub;

static const char *const ls_upload_known[] = {"name",   "path",   "format",  "config", "tensors", "pinned",
                                              "strict", "replace", "scale", "gate_up_order", NULL};

/* A string-valued key (into text, cap bytes; longer ones are cut, len
 * keeps their length) or anything else, skipped. */
static bool ls_ub_string(ls_jr *r, ls_uf *f, char *text, size_t cap) {
    const char c = ls_jr_peek(r);
    char w;
    if (c == 'n') return f->kind = LS_UF_NULL, ls_jr_literal(r, &w);
    if (c != '"') return f->kind = LS_UF_OTHER, ls_jr_skip_strict(r);
    f->kind = LS_UF_STRING;
    return ls_jr_string(r, text, cap, &f->len);
}

/* A boolean-valued key, or anything else, skipped. */
static bool ls_ub_bool(ls_jr *r, ls_uf *f) {
    const char c = ls_jr_peek(r);
    char w;
    if (c != 't' && c != 'f' && c != 'n') return f->kind = LS_UF_OTHER, ls_jr_skip_strict(r);
    if (!ls_jr_literal(r, &w)) return false;
    f->kind = w == 'n' ? LS_UF_NULL : LS_UF_BOOL;
    f->b = w == 't';
    return true;
}

/* "scale": a number, or anything else, skipped. */
static bool ls_ub_number(ls_jr *r, ls_uf *f) {
    const char c = ls_jr_peek(r);
    char w;
    if (c == 'n') return f->kind = LS_UF_NULL, ls_jr_literal(r, &w);
    if (c != '-' && !(c >= '0' && c <= '9')) return f->kind = LS_UF_OTHER, ls_jr_skip_strict(r);
    bool is_int;
    long long iv;
    f->kind = LS_UF_NUMBER;
    return ls_jr_number_strict(r, &f->num, &is_int, &iv);
}

/* "config": an object's text, kept to be parsed once the body is known
 * to be well formed, or anything else, skipped. */
static bool ls_ub_span(ls_jr *r, ls_uf *f) {
    const char c = ls_jr_peek(r);
    char w;
    if (c == 'n') return f->kind = LS_UF_NULL, ls_jr_literal(r, &w);
    f->kind = c == '{' ? LS_UF_OBJECT : LS_UF_OTHER;
    f->from = r->p;
    bool ok = ls_jr_skip_strict(r);
    f->to = r->p;
    return ok;
}

/* "tensors": each tensor read straight into the set, until one has a
 * problem (kept in ub->tensor_err); the rest are only read. */
static bool ls_ub_tensors(ls_jr *r, ls_ub *ub, ls_tensor_set *set) {
    const char c = ls_jr_peek(r);
    char w;
    if (c == 'n') return ub->tensors.kind = LS_UF_NULL, ls_jr_literal(r, &w);
    if (c != '{') return ub->tensors.kind = LS_UF_OTHER, ls_jr_skip_strict(r);
    ub->tensors.kind = LS_UF_OBJECT;
    ls_jr_keys names;
    ls_jr_keys_init(&names);
    bool ok = ls_jr_punct(r, '{');
    r->depth++;
    if (ok && ls_jr_peek(r) != '}') {
        do {
            size_t len;
            char *key = ls_jr_string_dup(r, &len);
            int added = key ? ls_jr_keys_add(&names, key, len) : 1;
            if (!key || !ls_jr_punct(r, ':')) ok = false;
            else if (added < 0) ok = ls_jr_fail_oom(r);
            else if (added == 0) ok = ls_jr_fail(r, "duplicate object key");
            else if (ub->tensor_err.code != LS_OK) ok = ls_jr_skip_strict(r);
            else if (set->n == LS_LOADER_MAX_TENSORS) {
                /* Each tensor kept costs some 200 bytes beyond its
                 * numbers: past the limit nothing more is kept. */
                ls_error_set(&ub->tensor_err, LS_PAYLOAD_TOO_LARGE, "send an adapter that holds fewer tensors",
                             "tensors: more than %d tensors, the most an adapter may hold", LS_LOADER_MAX_TENSORS);
                ok = ls_jr_skip_strict(r);
            } else {
                char what[256];
                snprintf(what, sizeof what, "tensors[\"%.200s\"]", key);
                ls_tensor t;
                ok = ls_json_tensor_read(r, what, &t, &ub->tensor_err);
                if (ok && ub->tensor_err.code == LS_OK && !ls_tensor_set_add(set, key, &t)) {
                    ls_tensor_free(&t);
                    ok = ls_jr_fail_oom(r);
                }
            }
            free(key);
        } while (ok && ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
    }
    ls_jr_keys_free(&names);
    r->depth--;
    return ok && ls_jr_punct(r, '}');
}

/* One key of the body and its value. */
static bool ls_ub_member(ls_jr *r, const char *key, ls_ub *ub, ls_adapter_upload *up) {
    if (!strcmp(key, "name")) return ls_ub_string(r, &ub->name, ub->name_text, sizeof ub->name_text);
    if (!strcmp(key, "path")) return ls_ub_string(r, &ub->path, ub->path_text, sizeof ub->path_text);
    if (!strcmp(key, "format")) return ls_ub_string(r, &ub->format, ub->format_text, sizeof ub->format_text);
    if (!strcmp(key, "gate_up_order")) return ls_ub_string(r, &ub->order, ub->order_text, sizeof ub->order_text);
    if (!strcmp(key, "pinned")) return ls_ub_bool(r, &ub->pinned);
    if (!strcmp(key, "strict")) return ls_ub_bool(r, &ub->strict);
    if (!strcmp(key, "replace")) return ls_ub_bool(r, &ub->replace);
    if (!strcmp(key, "scale")) return ls_ub_number(r, &ub->scale);
    if (!strcmp(key, "config")) return ls_ub_span(r, &ub->config);
    if (!strcmp(key, "tensors")) return ls_ub_tensors(r, ub, &up->tensors);
    if (!ub->has_unknown) snprintf(ub->unknown, sizeof ub->unknown, "%s", key);
    ub->has_unknown = true;
    return ls_jr_skip_strict(r);
}

/* The whole body in one pass: the top object's keys (a key given twice
 * refused), each value read by its key. A body that is an array is
 * well formed but not an upload (noted in *not_object). */
static void ls_ub_read(ls_jr *r, ls_ub *ub, ls_adapter_upload *up, bool *not_object) {
    *not_object = false;
    const char c = ls_jr_peek(r);
    if (c == '[') {
        if (ls_jr_skip_strict(r) && !ls_jr_at_end(r)) ls_jr_fail(r, "end of input expected");
        *not_object = true;
        return;
    }
    if (c != '{') {
        ls_jr_fail(r, "'[' or '{' expected");
        return;
    }
    ls_jr_keys keys;
    ls_jr_keys_init(&keys);
    r->p++;
    r->depth = 1;
    bool ok = true;
    if (ls_jr_peek(r) != '}') {
        do {
            size_t len;
            char *key = ls_jr_string_dup(r, &len);
            int added = key ? ls_jr_keys_add(&keys, key, len) : 1;
            if (!key || !ls_jr_punct(r, ':')) ok = false;
            else if (added < 0) ok = ls_jr_fail_oom(r);
            else if (added == 0) ok = ls_jr_fail(r, "duplicate object key");
            else ok = ls_ub_member(r, key, ub, up);
            free(key);
        } while (ok && ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
    }
    ls_jr_keys_free(&keys);
    if (ok && ls_jr_punct(r, '}') && !ls_jr_at_end(r)) ls_jr_fail(r, "end of input expected");
}
/* A config object of more text than this is not one (adapter_config.json
 * has the same limit): it is the one part of a body parsed by jansson. */
#define LS_UPLOAD_CONFIG_MAX (1u << 20)

/* "config": its text parsed by jansson (small, checked well formed) and
 * read as adapter_config.json is, into up->given. */
static ls_status ls_ub_config(const ls_uf *f, ls_adapter_upload *up, ls_error *err) {
    const size_t len = (size_t)(f->to - f->from);
    if (len > LS_UPLOAD_CONFIG_MAX)
        return ls_error_set(err, LS_INVALID_REQUEST, "adapter_config.json holds r, lora_alpha and a few more keys",
                            "\"config\" is %zu bytes of JSON, more than the %u an adapter config may take", len,
                            LS_UPLOAD_CONFIG_MAX);
    json_error_t jerr;
    json_t *jconfig = json_loadb(f->from, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!jconfig) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory reading \"config\"");
    ls_status st = ls_adapter_config_parse(jconfig, false, &up->given, err);
    json_decref(jconfig);
    return st;
}

/* adapter_config.json's keys, which a JSON upload gives inside "config"
 * (PEFT writes them there; at the top they would be a second place for
 * one number). */
static const char *const ls_upload_config_keys[] = {
    "r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern", "target_modules", "layers_to_transform",
    "layers_pattern", "lora_dropout", "bias", "fan_in_fan_out", "peft_type", "base_model_name_or_path", NULL};

/* The answer for an unknown top-level key: where a config key belongs,
 * else the nearest known key. */
static ls_status ls_ub_unknown_key(const char *key, ls_error *err) {
    for (size_t i = 0; ls_upload_config_keys[i]; i++)
        if (!strcmp(key, ls_upload_config_keys[i]))
            return ls_error_set(err, LS_INVALID_REQUEST,
                                "put it in config, as adapter_config.json has it: {\"name\", \"config\": {\"r\": 16, "
                                "\"lora_alpha\": 32}, \"tensors\"}",
                                "unknown key \"%s\" in the adapter upload: \"%s\" is a key of \"config\"", key, key);
    char hint[256], near[96];
    ls_text_unknown_key(key, ls_upload_known, hint, sizeof hint, near, sizeof near);
    return ls_error_set(err, LS_INVALID_REQUEST, hint, "unknown key \"%.64s\" in the adapter upload%s", key, near);
}

/* The keys as found, checked in the order a parse of the whole body
 * checked them, the first problem answered: unknown key, name, pinned,
 * strict, replace, path or tensors, config, format, scale,
 * gate_up_order. */
static ls_status ls_ub_check(ls_ub *ub, bool require_name, ls_adapter_upload *up, ls_error *err) {
    if (ub->has_unknown) return ls_ub_unknown_key(ub->unknown, err);
    /* null is "not given" for every key, these three too: a client that
     * writes each field of its struct must not be refused for the empty ones. */
    if (ub->name.kind == LS_UF_OTHER) return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"name\" must be a string");
    ls_status st = ls_upload_set_name(up, ub->name.kind == LS_UF_STRING ? ub->name_text : NULL, require_name, err);
    const struct {
        const ls_uf *f;
        const char *key;
        bool *out;
    } bools[] = {{&ub->pinned, "pinned", &up->pinned}, {&ub->strict, "strict", &up->given.strict},
                 {&ub->replace, "replace", &up->replace}};
    for (size_t i = 0; st == LS_OK && i < 3; i++) {
        if (bools[i].f->kind == LS_UF_OTHER)
            st = ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"%s\" must be true or false", bools[i].key);
        else if (bools[i].f->kind == LS_UF_BOOL)
            *bools[i].out = bools[i].f->b;
    }
    up->pinned_given = ub->pinned.kind == LS_UF_BOOL;
    if (st != LS_OK) return st;
    const bool has_path = ub->path.kind > LS_UF_NULL, has_tensors = ub->tensors.kind > LS_UF_NULL;
    if (has_path == has_tensors)
        return ls_error_set(err, LS_INVALID_REQUEST, "send {\"name\", \"path\"} or {\"name\", \"config\", \"tensors\"}",
                            "the upload needs exactly one of \"path\" and \"tensors\"");
    if (has_path) {
        if (ub->path.kind != LS_UF_STRING)
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"path\" must be a string");
        if (!ub->path.len || ub->path.len >= sizeof up->path)
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"path\" must be 1 to %zu bytes", sizeof up->path - 1);
        snprintf(up->path, sizeof up->path, "%s", ub->path_text);
    } else if (ub->tensors.kind != LS_UF_OBJECT) {
        return ls_error_set(err, LS_INVALID_REQUEST, "\"tensors\" maps each tensor name to a tensor",
                            "\"tensors\" must be an object");
    } else if (ub->tensor_err.code != LS_OK) {
        ls_error_copy(err, &ub->tensor_err);
        return ub->tensor_err.code;
    }
    /* What the request states; the loader puts it over what a file says. */
    if (ub->config.kind == LS_UF_OTHER)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"config\" must be an object");
    if (ub->config.kind == LS_UF_OBJECT && (st = ls_ub_config(&ub->config, up, err)) != LS_OK) return st;
    if (ub->format.kind > LS_UF_NULL &&
        (ub->format.kind != LS_UF_STRING || ub->format.len >= sizeof ub->format_text ||
         !ls_adapter_format_parse(ub->format_text, &up->given.format)))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"format\" is \"peft\", \"pool\" or \"auto\"");
    if (ub->scale.kind > LS_UF_NULL) {
        if (ub->scale.kind != LS_UF_NUMBER || !isfinite(ub->scale.num))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "\"scale\" must be a finite number");
        up->given.has_scale = true;
        up->given.scale = ub->scale.num;
    }
    if (ub->order.kind > LS_UF_NULL) {
        if (ub->order.kind != LS_UF_STRING || ub->order.len >= sizeof ub->order_text ||
            !ls_gate_up_order_parse(ub->order_text, &up->given.gate_up_order))
            return ls_error_set(err, LS_INVALID_REQUEST,
                                "\"gate_up\": each expert's F gate rows, then its F up rows (sglang); "
                                "\"interleaved\": gate and up rows alternate",
                                "\"gate_up_order\" is \"gate_up\" or \"interleaved\"");
        up->given.has_order = true;
    }
    return LS_OK;
}

/* One pass over the body (format/json_reader.h), no tree of JSON values:
 * tensors are read straight into their buffers as they come, every other
 * key kept as the few bytes it takes; a body that is not JSON as jansson
 * reads it is refused first, as when it was parsed whole. */
ls_status ls_adapter_upload_parse_json(const char *body, size_t len, bool strict_default, bool require_name,
                                       ls_adapter_upload *up, ls_error *err) {
    memset(up, 0, sizeof *up);
    ls_tensor_set_init(&up->tensors);
    up->given.strict = strict_default;
    ls_ub *ub = calloc(1, sizeof *ub);
    if (!ub) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory reading the upload");
    ls_error_init(&ub->tensor_err);
    ls_jr r;
    ls_jr_init(&r, body, len);
    bool not_object;
    ls_ub_read(&r, ub, up, &not_object);
    ls_status st;
    if (r.oom) st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory reading the upload");
    else if (r.failed)
        st = ls_error_set(err, LS_INVALID_JSON, NULL, "the body is not valid JSON: %s (at byte %zu)", r.message, r.at);
    else if (not_object) st = ls_error_set(err, LS_INVALID_REQUEST, NULL, "the body must be a JSON object");
    else st = ls_ub_check(ub, require_name, up, err);
    ls_error_free(&ub->tensor_err);
    free(ub);
    if (st != LS_OK) ls_adapter_upload_free(up);
    return st;
}

ls_status ls_adapter_upload_parse_raw(const uint8_t *body, size_t len, ls_query_fn query, void *query_ctx,
                                      bool strict_default, bool require_name, ls_adapter_upload *up, ls_error *err) {
    memset(up, 0, sizeof *up);
    ls_tensor_set_init(&up->tensors);
    up->given.strict = strict_default;
    ls_status st = ls_safetensors_parse_max(body, len, LS_LOADER_MAX_TENSORS, &up->tensors, err);
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
