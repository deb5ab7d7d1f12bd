/* adapter_config.json and the inline "config" object: r, lora_alpha and
 * use_rslora into ls_adapter_params. Every bad key is reported; the many
 * other keys a PEFT config carries are ignored. */
#include "api/adapter_config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *ls_json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

/* Writes a short rendering of v for a message ("8.0", "\"8\"", "true"). */
static void ls_json_show(const json_t *v, char *buf, size_t len) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!s) {
        snprintf(buf, len, "%s", ls_json_kind(v));
        return;
    }
    if (strlen(s) > 40)
        snprintf(buf, len, "%.37s...", s);
    else
        snprintf(buf, len, "%s", s);
    free(s);
}

static void ls_config_bad(ls_error *err, const char *key, const char *want, const json_t *v) {
    char shown[48];
    if (!v) {
        ls_error_add(err, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA, NULL,
                     "adapter config: \"%s\" is missing; it must be %s", key, want);
        return;
    }
    ls_json_show(v, shown, sizeof shown);
    ls_error_add(err, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA, NULL,
                 "adapter config: \"%s\" must be %s, found %s (%s)", key, want, shown, ls_json_kind(v));
}

/* Writes into p only when every key is valid (p's other fields, such as
 * format and strict, are left as the caller set them). */
ls_status ls_adapter_config_parse(const json_t *obj, bool require_alpha, ls_adapter_params *p, ls_error *err) {
    if (!obj || !json_is_object(obj))
        return ls_error_add(err, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA, NULL,
                            "adapter config must be a JSON object, found %s", obj ? ls_json_kind(obj) : "nothing");
    bool ok = true;

    /* A JSON null reads as an absent key. */
    const json_t *r = json_object_get(obj, "r");
    if (r && json_is_null(r)) r = NULL;
    if (!r || !json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > INT_MAX) {
        ls_config_bad(err, "r", "a positive integer", r);
        ok = false;
    }

    const json_t *alpha = json_object_get(obj, "lora_alpha");
    if (alpha && json_is_null(alpha)) alpha = NULL;
    if (alpha ? !json_is_number(alpha) || !isfinite(json_number_value(alpha)) : require_alpha) {
        ls_config_bad(err, "lora_alpha", "a number", alpha);
        ok = false;
    }

    const json_t *rs = json_object_get(obj, "use_rslora");
    if (rs && json_is_null(rs)) rs = NULL;
    if (rs && !json_is_boolean(rs)) {
        ls_config_bad(err, "use_rslora", "true or false", rs);
        ok = false;
    }

    if (!ok) return LS_ADAPTER_CONFIG_INVALID;
    p->r = (int)json_integer_value(r);
    p->has_alpha = alpha != NULL;
    p->lora_alpha = alpha ? json_number_value(alpha) : 0.0;
    p->use_rslora = rs && json_is_true(rs);
    return LS_OK;
}

/* The text of an adapter_config.json; PEFT always writes lora_alpha, so
 * it is required here. */
ls_status ls_adapter_config_parse_text(const char *text, ls_adapter_params *p, ls_error *err) {
    json_error_t jerr;
    json_t *obj = text ? json_loads(text, JSON_REJECT_DUPLICATES, &jerr) : NULL;
    if (!obj)
        return ls_error_add(err, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA, NULL,
                            "adapter_config.json is not valid JSON: %s at line %d", text ? jerr.text : "no text",
                            text ? jerr.line : 0);
    ls_status st = ls_adapter_config_parse(obj, true, p, err);
    json_decref(obj);
    return st;
}
