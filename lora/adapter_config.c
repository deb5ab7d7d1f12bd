/* adapter_config.json and the inline "config" object (r, lora_alpha,
 * use_rslora; every bad key reported, the many other keys a PEFT config
 * carries ignored), parameters as text, and the merge of stated over own
 * parameters. */
#include "lora/adapter_config.h"

#include "common/text.h"
#include "format/json.h"
#include "lora/adapter_rules.h"
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

/* Reports key's bad value v. A config read from a file (from_file)
 * quotes a number or boolean it found but only names the kind of a
 * string, array or object: an error never shows a file's text. */
static void ls_config_bad(ls_error *err, const char *key, const char *want, const json_t *v, bool from_file) {
    char shown[48], hint[128];
    /* The status's default hint speaks of r and lora_alpha only; a bad
     * optional key gets a hint about that key instead. */
    const bool required_key = !strcmp(key, "r") || !strcmp(key, "lora_alpha");
    snprintf(hint, sizeof hint, "\"%s\" is optional; when given it must be %s", key, want);
    const char *h = required_key ? NULL : hint;
    if (!v && !strcmp(key, "lora_alpha"))
        h = "state lora_alpha in the config: PEFT's save_pretrained always writes it, and LoraConfig's default is 8 "
            "(state 8 if the adapter was trained without setting it)";
    if (!v) {
        ls_error_add(err, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA, h,
                     "adapter config: \"%s\" is missing; it must be %s", key, want);
        return;
    }
    if (from_file && (json_is_string(v) || json_is_array(v) || json_is_object(v))) {
        ls_error_add(err, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA, h,
                     "adapter config: \"%s\" must be %s, found %s", key, want, ls_json_kind(v));
        return;
    }
    ls_json_show(v, shown, sizeof shown);
    ls_error_add(err, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA, h,
                 "adapter config: \"%s\" must be %s, found %s (%s)", key, want, shown, ls_json_kind(v));
}

static void ls_config_refuse(ls_error *err, const char *key, const char *hint, const char *fmt, const char *what) {
    char msg[256];
    snprintf(msg, sizeof msg, fmt, what);
    ls_error_add(err, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA, hint, "adapter config: \"%s\" %s",
                 key, msg);
}

/* A value a config key has when it asks for nothing: absent, null,
 * false, 0, "" or an empty list or object. */
static bool ls_config_unset(const json_t *v) {
    return !v || json_is_null(v) || json_is_false(v) || (json_is_integer(v) && !json_integer_value(v)) ||
           (json_is_string(v) && !*json_string_value(v)) || (json_is_array(v) && !json_array_size(v)) ||
           (json_is_object(v) && !json_object_size(v));
}

/* LoRA variants and options whose forward is not W + s*B*A on unchanged
 * base weights (PEFT's tuners/lora: config.py, layer.py, variants.py). */
static const struct {
    const char *key, *why;
} ls_config_variants[] = {
    {"use_dora", "DoRA rescales the adapted weight by a learned magnitude vector"},
    {"lora_bias", "the factors carry a bias on lora_B"},
    {"use_qalora", "QA-LoRA pools the input before lora_A"},
    {"alora_invocation_tokens", "activated LoRA applies the delta only after its invocation tokens"},
    {"arrow_config", "Arrow routes each token among several adapters"},
    {"use_bdlora", "BD-LoRA stores block-diagonal factors"},
    {"monteclora_config", "MonteCLoRA samples the factors"},
    {"kasa_config", "KaSA truncates the base weights and adds a diagonal between the factors"},
    {"layer_replication", "the adapter's layers are a replicated stack, not the model's"},
};

/* init_lora_weights values whose initialisation changed the base weights
 * (PiSSA, OLoRA, CorDA, LoftQ, LoRA-GA). PEFT's save_pretrained with
 * path_initial_model_for_weight_conversion turns such an adapter into a
 * plain LoRA delta and then writes init_lora_weights true. */
static const char *ls_config_init_mutates(const char *v) {
    if (!strncmp(v, "pissa", 5)) return "PiSSA";
    if (!strncmp(v, "corda", 5)) return "CorDA";
    if (!strcasecmp(v, "olora")) return "OLoRA";
    if (!strcmp(v, "loftq")) return "LoftQ";
    if (!strcmp(v, "lora_ga")) return "LoRA-GA";
    return NULL;
}

/* The keys that would make the factors mean something else than this
 * server computes: each is refused with its reason. */
static bool ls_config_refusals(const json_t *obj, ls_error *err) {
    bool ok = true;
    for (size_t i = 0; i < sizeof ls_config_variants / sizeof *ls_config_variants; i++) {
        const json_t *v = json_object_get(obj, ls_config_variants[i].key);
        if (ls_config_unset(v)) continue;
        ls_config_refuse(err, ls_config_variants[i].key, "train a plain LoRA adapter (leave this option unset)",
                         "is set: %s, which this server does not compute", ls_config_variants[i].why);
        ok = false;
    }
    const json_t *init = json_object_get(obj, "init_lora_weights");
    const char *how = json_is_string(init) ? ls_config_init_mutates(json_string_value(init)) : NULL;
    if (how) {
        ls_config_refuse(err, "init_lora_weights",
                         "save the adapter with save_pretrained(..., path_initial_model_for_weight_conversion=...) so "
                         "that PEFT converts it to a plain LoRA delta on the original weights",
                         "is %s: that initialisation changed the base weights, so the factors are not a delta on the "
                         "checkpoint's weights",
                         how);
        ok = false;
    } else if (init && !json_is_null(init) && !json_is_boolean(init) &&
               !(json_is_string(init) && (!strcmp(json_string_value(init), "gaussian") ||
                                          !strcmp(json_string_value(init), "eva") ||
                                          !strcmp(json_string_value(init), "orthogonal") ||
                                          !strcmp(json_string_value(init), "mica")))) {
        ls_config_refuse(err, "init_lora_weights", NULL, "is %s, not one of PEFT's initialisations",
                         "an unknown value");
        ok = false;
    }
    const json_t *save = json_object_get(obj, "modules_to_save");
    size_t i;
    json_t *e;
    if (save && !json_is_null(save) && !json_is_array(save)) {
        ls_config_refuse(err, "modules_to_save", NULL, "must be a list of module names, found %s", ls_json_kind(save));
        ok = false;
    }
    /* Which modules an entry replaces is read from the tensors, which
     * name exactly what PEFT saved: a copy inside the shared block is
     * refused there (adapter_names.c), one elsewhere is skipped. */
    json_array_foreach(save, i, e) {
        if (json_is_string(e)) continue;
        char what[64];
        snprintf(what, sizeof what, "entry %zu", i + 1);
        ls_config_refuse(err, "modules_to_save", NULL, "%s must be a module name", what);
        ok = false;
    }
    return ok;
}

/* PEFT's other adapter types (PeftType of peft 0.21), which a file's
 * message may name: a fixed word of PEFT's, not the file's text. */
static const char *const ls_peft_types[] = {
    "PROMPT_TUNING", "MULTITASK_PROMPT_TUNING", "P_TUNING", "PREFIX_TUNING", "ADALORA", "ADAMSS", "BOFT",
    "ADAPTION_PROMPT", "IA3", "BEFT", "LILY", "LOHA", "LOKR", "OFT", "POLY", "LN_TUNING", "VERA", "FROD", "PVERA",
    "FOURIERFT", "GLORA", "XLORA", "HRA", "VBLORA", "UNILORA", "CPT", "MISS", "RANDLORA", "ROAD", "TRAINABLE_TOKENS",
    "HIRA", "SHIRA", "C3A", "WAVEFT", "OSF", "DELORA", "GRALORA", "CARTRIDGE", "TINYLORA", "PSOFT", "PEANUT",
    "SHADOW", "SUPERTUNING", "DEFT"
};

/* A peft_type other than LORA: the adapter's tensors mean something else,
 * so its r or lora_alpha (often absent) are not worth a word. */
static bool ls_config_other_type(const json_t *obj, bool from_file, ls_error *err) {
    const json_t *type = json_object_get(obj, "peft_type");
    if (!type || json_is_null(type) || (json_is_string(type) && !strcmp(json_string_value(type), "LORA")))
        return false;
    const char *shown = "not \"LORA\"";
    for (size_t i = 0; json_is_string(type) && i < sizeof ls_peft_types / sizeof *ls_peft_types; i++)
        if (!strcmp(json_string_value(type), ls_peft_types[i])) shown = ls_peft_types[i];
    if (json_is_string(type) && !from_file) shown = json_string_value(type);
    ls_config_refuse(err, "peft_type", "train a LoRA adapter (peft_type \"LORA\"): its delta is s*B*A, which "
                     "this server computes; other types' tensors mean something else",
                     "is %s; this server serves LoRA adapters only", shown);
    return true;
}

/* LoraConfig's keys (every one peft 0.21's save_pretrained writes, and
 * ours): one of them is never a near miss (use_bdlora is two edits from
 * use_rslora). */
static const char *const ls_lora_config_keys[] = {
    "peft_type", "peft_version", "task_type", "base_model_name_or_path", "revision", "inference_mode", "auto_mapping",
    "r", "target_modules", "exclude_modules", "target_parameters", "lora_alpha", "lora_dropout", "fan_in_fan_out",
    "bias", "use_rslora", "modules_to_save", "init_lora_weights", "layers_to_transform", "layers_pattern",
    "rank_pattern", "alpha_pattern", "megatron_config", "megatron_core", "trainable_token_indices", "loftq_config",
    "eva_config", "corda_config", "lora_ga_config", "velora_config", "monteclora_config", "kasa_config", "use_dora",
    "use_bdlora", "use_qalora", "qalora_group_size", "layer_replication", "runtime_config", "lora_bias",
    "alora_invocation_tokens", "arrow_config", "ensure_weight_tying", "gate_up_order", "scale", NULL};

/* The keys that change the numbers this server computes. */
static const char *const ls_math_keys[] = {"lora_alpha",          "use_rslora",     "rank_pattern",
                                           "alpha_pattern",       "target_modules", "exclude_modules",
                                           "layers_to_transform", "layers_pattern", "target_parameters",
                                           "gate_up_order",       NULL};

/* The first key of obj that is no LoraConfig key but within two edits of
 * a math key: PEFT ignores it too (with a warning), so the load stands,
 * but a misspelt alpha_pattern would change every output without a
 * word. A file's key is named by its place, a request's quoted. */
static void ls_config_near_miss(const json_t *obj, bool from_file, char *note, size_t len) {
    note[0] = '\0';
    const char *key;
    const json_t *v;
    size_t place = 0;
    json_object_foreach((json_t *)obj, key, v) {
        place++;
        bool known = false;
        for (size_t i = 0; ls_lora_config_keys[i] && !known; i++) known = !strcmp(key, ls_lora_config_keys[i]);
        if (known || strlen(key) < 4) continue;
        ls_text_near n;
        ls_text_near_init(&n, key);
        for (size_t i = 0; ls_math_keys[i]; i++) ls_text_near_offer(&n, ls_math_keys[i]);
        if (!n.best[0]) continue;
        char who[96];
        if (from_file) snprintf(who, sizeof who, "key %zu of adapter_config.json", place);
        else snprintf(who, sizeof who, "config key \"%.64s\"", key);
        snprintf(note, len, "%s is no LoraConfig key, so it changes nothing (PEFT ignores it too); did you mean "
                 "\"%s\"?", who, n.best);
        return;
    }
}

/* Writes into p only when every key is valid (p's other fields, such as
 * format and strict, are left as the caller set them). */
static ls_status ls_config_parse(const json_t *obj, bool require_alpha, bool from_file, ls_adapter_params *p,
                                 ls_error *err) {
    if (!obj || !json_is_object(obj))
        return ls_error_add(err, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA, NULL,
                            "adapter config must be a JSON object, found %s", obj ? ls_json_kind(obj) : "nothing");
    if (ls_config_other_type(obj, from_file, err)) return LS_ADAPTER_CONFIG_INVALID;
    bool ok = true;

    /* A JSON null reads as an absent key. */
    const json_t *r = json_object_get(obj, "r");
    if (r && json_is_null(r)) r = NULL;
    if (!r || !json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > INT_MAX) {
        ls_config_bad(err, "r", "a positive integer", r, from_file);
        ok = false;
    }

    const json_t *alpha = json_object_get(obj, "lora_alpha");
    if (alpha && json_is_null(alpha)) alpha = NULL;
    if (alpha ? !json_is_number(alpha) || !isfinite(json_number_value(alpha)) : require_alpha) {
        ls_config_bad(err, "lora_alpha", "a number", alpha, from_file);
        ok = false;
    }

    const json_t *rs = json_object_get(obj, "use_rslora");
    if (rs && json_is_null(rs)) rs = NULL;
    if (rs && !json_is_boolean(rs)) {
        ls_config_bad(err, "use_rslora", "true or false", rs, from_file);
        ok = false;
    }

    const json_t *order = json_object_get(obj, "gate_up_order");
    if (order && json_is_null(order)) order = NULL;
    ls_gate_up_order order_value = LS_GATE_UP_ORDER_GATE_UP;
    if (order && (!json_is_string(order) || !ls_gate_up_order_parse(json_string_value(order), &order_value))) {
        ls_config_bad(err, "gate_up_order", "\"gate_up\" or \"interleaved\"", order, from_file);
        ok = false;
    }

    ok &= ls_config_refusals(obj, err);
    char *peft = malloc(LS_ADAPTER_PEFT_TEXT);
    if (!peft) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    if (ls_peft_rules_from_config(obj, from_file, peft, LS_ADAPTER_PEFT_TEXT, err) != LS_OK) ok = false;
    if (!ok) {
        free(peft);
        return err->code == LS_INTERNAL ? LS_INTERNAL : LS_ADAPTER_CONFIG_INVALID;
    }
    memcpy(p->peft, peft, strlen(peft) + 1);
    free(peft);
    p->has_peft = false;
    p->has_order = order != NULL;
    p->gate_up_order = order_value;
    p->r = (int)json_integer_value(r);
    p->has_alpha = alpha != NULL;
    p->lora_alpha = alpha ? json_number_value(alpha) : 0.0;
    p->has_rslora = rs != NULL;
    p->use_rslora = rs && json_is_true(rs);
    p->whole_config = true;
    ls_config_near_miss(obj, from_file, p->config_note, sizeof p->config_note);
    return LS_OK;
}

ls_status ls_adapter_config_parse(const json_t *obj, bool require_alpha, ls_adapter_params *p, ls_error *err) {
    return ls_config_parse(obj, require_alpha, false, p, err);
}

/* The text of an adapter_config.json; PEFT always writes lora_alpha, so
 * it is required here. */
ls_status ls_adapter_config_parse_text(const char *text, ls_adapter_params *p, ls_error *err) {
    json_error_t jerr;
    char why[160];
    json_t *obj = text ? json_loads(text, JSON_REJECT_DUPLICATES, &jerr) : NULL;
    if (!obj)
        return ls_error_add(err, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA, NULL,
                            "adapter_config.json is not valid JSON: %s (line %d, column %d)",
                            text ? ls_json_error_reason(&jerr, why, sizeof why) : "no text", text ? jerr.line : 0,
                            text ? jerr.column : 0);
    ls_status st = ls_config_parse(obj, true, true, p, err);
    json_decref(obj);
    return st;
}

/* What a message calls a bad value: "key=value" for the client's own,
 * "key in WHERE" for a file's (see ls_adapter_text_params.where). */
static const char *ls_params_subject(char *buf, size_t len, const char *key, const char *v, const char *where) {
    if (where) snprintf(buf, len, "%s in %s", key, where);
    else snprintf(buf, len, "%s=%.32s", key, v);
    return buf;
}

static ls_status ls_params_bool(const char *v, const char *key, const char *where, bool *out, ls_error *err) {
    char subject[160];
    if (!ls_text_bool_py(v, out))
        return ls_error_set(err, LS_INVALID_REQUEST, "give true or false (1 or 0, or Python's True or False)",
                            "%s is not true or false",
                            ls_params_subject(subject, sizeof subject, key, v, where));
    return LS_OK;
}

/* A finite decimal number: strtod also reads hexadecimal ("0x10" is 16),
 * infinities and NaN, none of which a client means by alpha or scale. */
static ls_status ls_params_double(const char *v, const char *key, const char *where, double *out, ls_error *err) {
    char subject[160];
    bool decimal = *v != '\0';
    for (const char *c = v; *c && decimal; c++)
        decimal = (*c >= '0' && *c <= '9') || *c == '.' || *c == '-' || *c == '+' || *c == 'e' || *c == 'E';
    char *end;
    errno = 0;
    double d = decimal ? strtod(v, &end) : 0.0;
    if (!decimal || errno || end == v || *end || !isfinite(d))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s is not a finite decimal number",
                            ls_params_subject(subject, sizeof subject, key, v, where));
    *out = d;
    return LS_OK;
}

ls_status ls_adapter_params_rules_from_meta(const ls_tensor_set *t, const char *where, ls_adapter_params *p,
                                            ls_error *err) {
    static const char *const keys[] = {"rank_pattern", "alpha_pattern", "layers_to_transform", "layers_pattern"};
    bool any = false;
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) any |= ls_tensor_set_meta(t, keys[k]) != NULL;
    if (!any) return LS_OK;
    char *text = malloc(LS_ADAPTER_PEFT_TEXT);
    if (!text) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    memcpy(text, p->peft, strlen(p->peft) + 1);
    ls_status st = LS_OK;
    for (size_t k = 0; k < sizeof keys / sizeof *keys && st == LS_OK; k++) {
        const char *v = ls_tensor_set_meta(t, keys[k]);
        if (v) st = ls_peft_rules_from_text(keys[k], v, where, text, LS_ADAPTER_PEFT_TEXT, err);
    }
    if (st == LS_OK) {
        memcpy(p->peft, text, strlen(text) + 1);
        p->has_peft = true;
    }
    free(text);
    return st;
}

/* The framework markers safetensors writers put in __metadata__
 * "format" (transformers' and PEFT's save_pretrained write "pt" into
 * every file): the writer's word, not our format option. */
static const char *const ls_writer_formats[] = {"pt", "tf", "flax", "mlx", "np", NULL};

/* The file's own "format", unless it is a writer's marker. */
static const char *ls_meta_format(const ls_tensor_set *t) {
    const char *v = ls_tensor_set_meta(t, "format");
    for (int k = 0; v && ls_writer_formats[k]; k++)
        if (!strcmp(v, ls_writer_formats[k])) return NULL;
    return v;
}

ls_adapter_text_params ls_adapter_text_params_meta(const ls_tensor_set *t, const char *where) {
    return (ls_adapter_text_params){ls_tensor_set_meta(t, "lora_alpha"), ls_tensor_set_meta(t, "use_rslora"),
                                    ls_meta_format(t),                   ls_tensor_set_meta(t, "r"),
                                    ls_tensor_set_meta(t, "scale"),      ls_tensor_set_meta(t, "gate_up_order"),
                                    where};
}

ls_status ls_adapter_params_from_text(const ls_adapter_text_params *t, ls_adapter_params *p, ls_error *err) {
    ls_status st = LS_OK;
    const char *w = t->where;
    char subject[160];
    if (t->lora_alpha && (st = ls_params_double(t->lora_alpha, "lora_alpha", w, &p->lora_alpha, err)) == LS_OK)
        p->has_alpha = true;
    if (st == LS_OK && t->use_rslora &&
        (st = ls_params_bool(t->use_rslora, "use_rslora", w, &p->use_rslora, err)) == LS_OK)
        p->has_rslora = true;
    if (st == LS_OK && t->format && !ls_adapter_format_parse(t->format, &p->format))
        st = ls_error_set(err, LS_INVALID_REQUEST,
                          "format names the adapter's layout: peft, pool or auto (a safetensors writer's own mark "
                          "there, such as PEFT's \"pt\", is not read as this option)",
                          "%s is not peft, pool or auto",
                          ls_params_subject(subject, sizeof subject, "format", t->format, w));
    if (st == LS_OK && t->r) {
        long long v;
        if (!ls_text_int(t->r, 1, INT_MAX, &v))
            st = ls_error_set(err, LS_ADAPTER_CONFIG_INVALID,
                              "r states the factors' rank: a positive integer, or leave it out (the factors tell it)",
                              "%s is not a positive integer",
                              ls_params_subject(subject, sizeof subject, "r", t->r, w));
        else p->r = (int)v;
    }
    if (st == LS_OK && t->scale && (st = ls_params_double(t->scale, "scale", w, &p->scale, err)) == LS_OK)
        p->has_scale = true;
    if (st == LS_OK && t->gate_up_order) {
        if (ls_gate_up_order_parse(t->gate_up_order, &p->gate_up_order))
            p->has_order = true;
        else
            st = ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s is not gate_up or interleaved",
                              ls_params_subject(subject, sizeof subject, "gate_up_order", t->gate_up_order, w));
    }
    return st;
}

ls_adapter_params ls_adapter_params_merge(const ls_adapter_params *own, const ls_adapter_params *given) {
    ls_adapter_params m = *own;
    if (given->whole_config) {
        m.r = given->r;
        m.has_alpha = given->has_alpha, m.lora_alpha = given->lora_alpha;
        m.has_rslora = given->has_rslora, m.use_rslora = given->use_rslora;
    }
    if (given->format != LS_ADAPTER_FORMAT_AUTO) m.format = given->format;
    if (given->r) m.r = given->r;
    if (given->has_alpha) m.has_alpha = true, m.lora_alpha = given->lora_alpha;
    if (given->has_rslora) m.has_rslora = true, m.use_rslora = given->use_rslora;
    if (given->has_scale) m.has_scale = true, m.scale = given->scale;
    if (given->has_order) m.has_order = true, m.gate_up_order = given->gate_up_order;
    if (given->whole_config || given->has_peft) {
        m.has_peft = given->has_peft;
        memcpy(m.peft, given->peft, strlen(given->peft) + 1);
    }
    if (given->whole_config) memcpy(m.config_note, given->config_note, sizeof m.config_note);
    m.strict = given->strict;
    return m;
}
