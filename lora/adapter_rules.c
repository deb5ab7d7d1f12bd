/* PEFT's per-module config rules, as huggingface/peft applies them:
 * get_pattern_key (rank_pattern, alpha_pattern: first matching key wins),
 * check_target_module_exists (layers_to_transform, layers_pattern, full
 * names in target_modules). Validated from a config, kept as compact JSON text,
 * compiled when an adapter is normalised. */
#include "lora/adapter_rules.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "format/json.h"
#include "lora/adapter_regex.h"

#define LS_RULES_MAX_LAYERS 4096 /* entries of layers_to_transform kept */

/* target_modules or exclude_modules as PEFT's check_target_module_exists
 * reads them: an expression the whole name must match, or names that
 * are the module's or its end after a '.'. */
typedef struct {
    bool given;
    ls_regex *re; /* (expression)\Z; NULL: names */
    char **names;
    size_t n_names;
} ls_rule_scope;

typedef struct {
    char *key;
    ls_regex *re; /* (.*\.)?(key)$ */
    double value;
    size_t index; /* its place in adapter_config.json's pattern (1..), 0 when the request stated it */
} ls_rule;

struct ls_peft_rules {
    ls_rule *rank, *alpha;
    size_t n_rank, n_alpha;
    long long *layers; /* layers_to_transform; NULL: no list */
    size_t n_layers;
    char **patterns; /* layers_pattern (plain names); none: any */
    size_t n_patterns;
    char **names; /* target_modules entries that are full module names */
    size_t n_names;
    char **params; /* target_parameters entries that can name a shared expert's weight */
    size_t n_params;
    char **other_params; /* the others (the routed experts' fused gate_up_proj): what pattern keys may be for */
    size_t n_other_params;
    ls_rule_scope targets, excludes; /* target_modules, exclude_modules */
};

/* Ends a key may have to concern a shared expert: a leaf, or the weight
 * of one (PEFT matches target_parameters' patterns against
 * "{module}.weight"). */
static const char *const ls_key_ends[] = {"gate_proj",     "up_proj",       "down_proj",          "gate_up_proj",
                                          "input_linear",  "output_linear", "shared_expert_gate", "weight"};

static bool ls_ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !memcmp(s + n - m, suffix, m);
}

static bool ls_is_word_char(char c) {
    return c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Whether key can match the name of a shared-expert module (which ends
 * in gate_proj, up_proj, down_proj or gate_up_proj; Granite's in
 * input_linear or output_linear; Qwen's gate is shared_expert_gate). Without a top-level '|', a key ending in plain
 * word characters T only matches names ending in T; T must then be the
 * end of a leaf. Anything less plain is kept. */
static bool ls_key_may_concern(const char *key) {
    if (strchr(key, '|')) return true;
    size_t n = strlen(key), t = n;
    while (t > 0 && ls_is_word_char(key[t - 1])) t--;
    if (t > 0 && key[t - 1] == '\\') t++; /* \d, \w: the letter is no literal */
    if (t >= n) return true;
    for (size_t i = 0; i < sizeof ls_key_ends / sizeof *ls_key_ends; i++)
        if (ls_ends_with(ls_key_ends[i], key + t)) return true;
    return false;
}

/* PEFT inserts the key into its pattern as text: so does this. */
static ls_regex *ls_key_compile(const char *key, char *why, size_t why_len) {
    size_t n = strlen(key);
    char *pat = malloc(n + 16);
    if (!pat) {
        snprintf(why, why_len, "out of memory");
        return NULL;
    }
    snprintf(pat, n + 16, "(.*\\.)?(%s)$", key);
    ls_regex *re = NULL;
    ls_regex_compile(pat, &re, why, why_len);
    free(pat);
    return re;
}

static void ls_rules_bad(ls_error *err, const char *key, const char *hint, const char *msg) {
    ls_error_add(err, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA, hint, "adapter config: \"%s\" %s",
                 key, msg);
}

/* A pattern object (rank_pattern: positive integers; alpha_pattern:
 * finite numbers) into canonical [[key, value], ...] pairs. */
static bool ls_rules_pattern(const json_t *obj, const char *name, bool from_file, json_t *out, ls_error *err) {
    const json_t *v = json_object_get(obj, name);
    if (!v || json_is_null(v)) return true;
    if (!json_is_object(v)) {
        ls_rules_bad(err, name, NULL,
                     strcmp(name, "rank_pattern") ? "must be an object mapping module patterns to lora_alpha values"
                                                  : "must be an object mapping module patterns to ranks");
        return false;
    }
    const bool rank = !strcmp(name, "rank_pattern");
    json_t *pairs = json_array();
    const char *key;
    json_t *val;
    bool ok = pairs != NULL;
    size_t index = 0;
    json_object_foreach((json_t *)v, key, val) {
        /* A file's bytes are never echoed: its keys are named by position. */
        char shown[64], why[160], msg[300];
        index++;
        if (from_file) snprintf(shown, sizeof shown, "key %zu", index);
        else snprintf(shown, sizeof shown, "key \"%.40s%s\"", key, strlen(key) > 40 ? "..." : "");
        const bool good = rank ? json_is_integer(val) && json_integer_value(val) >= 1 && json_integer_value(val) <= INT_MAX
                               : json_is_number(val) && isfinite(json_number_value(val));
        if (!good) {
            snprintf(msg, sizeof msg, "%s: %s", shown,
                     rank ? "the rank must be a positive integer" : "lora_alpha must be a finite number");
            ls_rules_bad(err, name, NULL, msg);
            ok = false;
            continue;
        }
        ls_regex *re = ls_key_compile(key, why, sizeof why);
        if (!re) {
            snprintf(msg, sizeof msg, "%s cannot be evaluated exactly as PEFT matches it: %s", shown, why);
            ls_rules_bad(err, name,
                         "write the key as a Python regular expression of plain characters, '.', sets, groups, "
                         "alternation and quantifiers (PEFT matches re.match(rf\"(.*\\.)?({key})$\", module))",
                         msg);
            ok = false;
            continue;
        }
        ls_regex_free(re);
        if (ok && ls_key_may_concern(key))
            ok = !json_array_append_new(pairs, json_pack("[s, O, I]", key, val, (json_int_t)(from_file ? index : 0)));
    }
    if (ok && json_array_size(pairs)) ok = !json_object_set(out, name, pairs);
    json_decref(pairs);
    return ok;
}

/* obj's key as a list in out: one value or a list of at most max, each
 * as fit says (an empty list is not kept: PEFT reads it as none given).
 * *fits is false when the value is not of that form. Ownership: out
 * takes a new list of references. */
static bool ls_rules_list(const json_t *obj, const char *key, bool (*fit)(const json_t *), size_t max, json_t *out,
                          bool *fits) {
    *fits = true;
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return true;
    json_t *list = json_array();
    bool ok = list != NULL;
    if (!json_is_array(v)) {
        ok = ok && fit(v) && !json_array_append(list, (json_t *)v);
    } else if (json_array_size(v) <= max) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) ok = ok && fit(e) && !json_array_append(list, e);
    } else {
        ok = false;
    }
    *fits = ok;
    if (ok && json_array_size(list) && json_object_set(out, key, list)) ok = false;
    json_decref(list);
    return ok;
}

static bool ls_layer_index(const json_t *v) { return json_is_integer(v) && json_integer_value(v) >= 0; }

/* layers_to_transform: a non-negative integer or a list of them. */
static bool ls_rules_layers(const json_t *obj, json_t *out, ls_error *err) {
    bool fits;
    const bool ok = ls_rules_list(obj, "layers_to_transform", ls_layer_index, LS_RULES_MAX_LAYERS, out, &fits);
    if (!fits)
        ls_rules_bad(err, "layers_to_transform", NULL,
                     "must be a non-negative layer index or a list of at most 4096 of them");
    return ok;
}

static bool ls_plain_name(const json_t *v) {
    if (!json_is_string(v)) return false;
    const char *s = json_string_value(v);
    if (!*s) return false;
    for (; *s; s++)
        if (!ls_is_word_char(*s)) return false;
    return true;
}

/* layers_pattern: a name or a list of names; PEFT inserts each into
 * rf".*?\.{pattern}\.(\d+)\." — taken exactly for plain names only. An
 * empty name is none given. */
static bool ls_rules_layers_pattern(const json_t *obj, json_t *out, ls_error *err) {
    const json_t *v = json_object_get(obj, "layers_pattern");
    if (json_is_string(v) && !*json_string_value(v)) return true;
    bool fits;
    const bool ok = ls_rules_list(obj, "layers_pattern", ls_plain_name, SIZE_MAX, out, &fits);
    if (!fits)
        ls_rules_bad(err, "layers_pattern",
                     "name the module list that holds the layers, as the model does (\"layers\")",
                     "must be a name of letters, digits and '_' or a list of such names (a pattern in it cannot be "
                     "evaluated exactly)");
    return ok;
}

/* The strings of list v that keep accepts, as out's key (none: the key
 * is not set). False only when out of memory. Ownership: out takes a new
 * list of references. */
static bool ls_rules_keep_names(const json_t *v, bool (*keep)(const char *), const char *key, json_t *out) {
    json_t *names = json_array();
    size_t i;
    json_t *e;
    bool ok = names != NULL;
    json_array_foreach(v, i, e) {
        if (ok && json_is_string(e) && keep(json_string_value(e))) ok = !json_array_append(names, e);
    }
    if (ok && json_array_size(names)) ok = !json_object_set(out, key, names);
    json_decref(names);
    return ok;
}

static bool ls_shared_module(const char *s) {
    return (strstr(s, "shared_expert") || strstr(s, "shared_mlp")) && ls_key_may_concern(s);
}

static bool ls_projection_weight(const char *s) {
    return ls_ends_with(s, ".weight") && (strstr(s, "proj") || strstr(s, "_linear"));
}

/* A target_parameters entry of another module, short enough to keep: a
 * pattern key written for it (PEFT's conversion of target_modules for the
 * routed experts writes ".*\\.gate_up_proj") is no unmatched key. */
static bool ls_other_param(const char *s) { return !ls_projection_weight(s) && strlen(s) <= 64; }

/* re.fullmatch(expr, name) as re.match("(expr)\Z", name); NULL when
 * this engine cannot evaluate expr exactly. */
static ls_regex *ls_full_compile(const char *expr) {
    size_t n = strlen(expr);
    char *pat = malloc(n + 8), why[160];
    if (!pat) return NULL;
    snprintf(pat, n + 8, "(%s)\\Z", expr);
    ls_regex *re = NULL;
    ls_regex_compile(pat, &re, why, sizeof why);
    free(pat);
    return re;
}

/* Most bytes a scope takes in the compact text: a longer list of names
 * (one per layer, say) is not kept, and its factors go unchecked. */
#define LS_RULES_SCOPE_MAX 2048

/* target_modules or exclude_modules (key) as out's as: an expression, or
 * the names that can end a shared expert's module name (kept even when
 * none can: then no factor is targeted). Not kept, so that every factor
 * stays as before: "all-linear" (which the shared experts are), an
 * expression this engine cannot evaluate exactly, a list too long. */
static bool ls_rules_scope(const json_t *obj, const char *key, const char *as, json_t *out) {
    json_t *v = json_object_get(obj, key);
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        ls_regex *re = strcasecmp(s, "all-linear") ? ls_full_compile(s) : NULL; /* PEFT lowercases it */
        const bool keep = re != NULL;
        ls_regex_free(re);
        return !keep || !json_object_set(out, as, v);
    }
    if (!json_is_array(v) || (!json_array_size(v) && strcmp(key, "target_modules"))) return true;
    json_t *names = json_array();
    if (!names) return false;
    size_t i;
    json_t *e;
    bool ok = true;
    json_array_foreach(v, i, e) {
        if (ok && json_is_string(e) && ls_key_may_concern(json_string_value(e))) ok = !json_array_append(names, e);
    }
    char *text = ok ? json_dumps(names, JSON_COMPACT) : NULL;
    ok = ok && text;
    if (ok && strlen(text) <= LS_RULES_SCOPE_MAX && (json_array_size(names) || !strcmp(key, "target_modules")))
        ok = !json_object_set(out, as, names);
    free(text);
    json_decref(names);
    return ok;
}

/* target_modules: its kind decides whether layers_to_transform applies,
 * and its full module names bypass it. Only names that can be a shared
 * expert's are kept. */
static bool ls_rules_targets(const json_t *obj, json_t *out, ls_error *err) {
    const json_t *v = json_object_get(obj, "target_modules");
    const bool layers = json_object_get(obj, "layers_to_transform") &&
                        !json_is_null(json_object_get(obj, "layers_to_transform"));
    const bool pattern = json_object_get(obj, "layers_pattern") && !json_is_null(json_object_get(obj, "layers_pattern"));
    if (json_is_string(v) && (layers || pattern)) {
        ls_rules_bad(err, layers ? "layers_to_transform" : "layers_pattern",
                     "give target_modules as a list of module names, or leave layers_to_transform out",
                     "cannot be used when target_modules is a string (PEFT refuses this config too)");
        return false;
    }
    if (pattern && !layers) {
        ls_rules_bad(err, "layers_pattern", "give layers_to_transform with it, or leave it out",
                     "is given without layers_to_transform (PEFT refuses this config too)");
        return false;
    }
    if (!json_is_array(v) || !json_object_get(out, "layers_to_transform")) return true;
    return ls_rules_keep_names(v, ls_shared_module, "target_modules", out);
}

/* target_parameters: PEFT wraps the parameter "{module}.weight" and
 * matches rank_pattern and alpha_pattern against that name. */
static bool ls_rules_params(const json_t *obj, json_t *out, ls_error *err) {
    const json_t *v = json_object_get(obj, "target_parameters");
    if (!v || json_is_null(v)) return true;
    if (!json_is_array(v)) {
        ls_rules_bad(err, "target_parameters", NULL, "must be a list of parameter names (PEFT refuses a string too)");
        return false;
    }
    return ls_rules_keep_names(v, ls_projection_weight, "target_parameters", out) &&
           ls_rules_keep_names(v, ls_other_param, "other_params", out);
}

/* out as compact text into text (len bytes). The scopes only check and
 * the other parameters only quiet a warning: they are dropped rather than
 * make a config too long to keep. */
static ls_status ls_rules_write(json_t *out, char *text, size_t len, ls_error *err) {
    text[0] = '\0';
    if (!json_object_size(out)) return LS_OK;
    char *s = json_dumps(out, JSON_COMPACT);
    if (!s) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    size_t n = strlen(s);
    /* What quiets a warning goes first, then what only checks. */
    static const char *const optional[][2] = {{"other_params", NULL}, {"targets", "excludes"}};
    for (size_t i = 0; n >= len && i < sizeof optional / sizeof *optional; i++) {
        if (!json_object_get(out, optional[i][0]) && !(optional[i][1] && json_object_get(out, optional[i][1])))
            continue;
        json_object_del(out, optional[i][0]);
        if (optional[i][1]) json_object_del(out, optional[i][1]);
        free(s);
        if (!json_object_size(out)) return LS_OK;
        if (!(s = json_dumps(out, JSON_COMPACT))) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
        n = strlen(s);
    }
    ls_status st = LS_OK;
    if (n >= len)
        st = ls_error_add(err, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, (int64_t)len - 1, (int64_t)n,
                          "write rank_pattern and alpha_pattern keys that cover several modules (a regular "
                          "expression such as \"layers\\\\.(1|2)\\\\..*gate_proj\") instead of one key per module",
                          "adapter config: rank_pattern, alpha_pattern, layers_to_transform and target_modules take "
                          "%zu bytes for the shared experts; this server keeps at most %zu",
                          n, len - 1);
    else
        memcpy(text, s, n + 1);
    free(s);
    return st;
}

ls_status ls_peft_rules_from_config(const json_t *obj, bool from_file, char *text, size_t len, ls_error *err) {
    json_t *out = json_object();
    if (!out) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    /* A step that failed without a violation ran out of memory. */
    const size_t said = err->n_violations + (size_t)err->dropped;
    bool ok = ls_rules_pattern(obj, "rank_pattern", from_file, out, err);
    ok &= ls_rules_pattern(obj, "alpha_pattern", from_file, out, err);
    ok &= ls_rules_layers(obj, out, err);
    ok &= ls_rules_layers_pattern(obj, out, err);
    ok &= ls_rules_targets(obj, out, err);
    ok &= ls_rules_params(obj, out, err);
    ok &= ls_rules_scope(obj, "target_modules", "targets", out) && ls_rules_scope(obj, "exclude_modules", "excludes", out);
    ls_status st = ok                                                ? ls_rules_write(out, text, len, err)
                   : err->n_violations + (size_t)err->dropped > said ? LS_ADAPTER_CONFIG_INVALID
                                                                     : ls_error_set(err, LS_INTERNAL, NULL,
                                                                                    "out of memory reading the config");
    json_decref(out);
    return st;
}

/* The compact text back as a config-like object (pairs as objects). */
static json_t *ls_rules_as_config(const char *text) {
    json_t *c = *text ? json_loads(text, 0, NULL) : json_object();
    if (!c) return NULL;
    const char *names[2] = {"rank_pattern", "alpha_pattern"};
    for (int k = 0; k < 2; k++) {
        json_t *pairs = json_object_get(c, names[k]), *obj = json_object();
        size_t i;
        json_t *p;
        json_array_foreach(pairs, i, p) json_object_set(obj, json_string_value(json_array_get(p, 0)), json_array_get(p, 1));
        if (pairs) json_object_set(c, names[k], obj);
        json_decref(obj);
    }
    /* The scopes back under the config's names: a merge parses this again. */
    const char *scope[2][2] = {{"targets", "target_modules"}, {"excludes", "exclude_modules"}};
    for (int k = 0; k < 2; k++) {
        json_t *v = json_object_get(c, scope[k][0]);
        if (v) json_object_set(c, scope[k][1], v);
        json_object_del(c, scope[k][0]);
    }
    return c;
}

ls_status ls_peft_rules_from_text(const char *key, const char *value, const char *where, char *text, size_t len,
                                  ls_error *err) {
    json_t *v = json_loads(value, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
    if (!v)
        return ls_error_add(err, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA,
                            "give it as JSON text, as adapter_config.json writes it",
                            "%s in %s is not valid JSON", key, where);
    json_t *c = ls_rules_as_config(text);
    ls_status st = c && !json_object_set_new(c, key, v) ? ls_peft_rules_from_config(c, true, text, len, err)
                                                          : ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    if (!c) json_decref(v);
    json_decref(c);
    return st;
}

static void ls_rules_free_list(char **l, size_t n) {
    for (size_t i = 0; l && i < n; i++) free(l[i]);
    free(l);
}

void ls_peft_rules_free(ls_peft_rules *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n_rank; i++) free(r->rank[i].key), ls_regex_free(r->rank[i].re);
    for (size_t i = 0; i < r->n_alpha; i++) free(r->alpha[i].key), ls_regex_free(r->alpha[i].re);
    free(r->rank);
    free(r->alpha);
    free(r->layers);
    ls_rules_free_list(r->patterns, r->n_patterns);
    ls_rules_free_list(r->names, r->n_names);
    ls_rules_free_list(r->params, r->n_params);
    ls_rules_free_list(r->other_params, r->n_other_params);
    ls_regex_free(r->targets.re);
    ls_rules_free_list(r->targets.names, r->targets.n_names);
    ls_regex_free(r->excludes.re);
    ls_rules_free_list(r->excludes.names, r->excludes.n_names);
    free(r);
}

static bool ls_rules_load_pairs(const json_t *pairs, ls_rule **out, size_t *n) {
    *n = 0;
    *out = calloc(json_array_size(pairs) + 1, sizeof **out);
    if (!*out) return false;
    size_t i;
    json_t *p;
    json_array_foreach(pairs, i, p) {
        char why[160];
        ls_rule *r = &(*out)[*n];
        r->key = strdup(json_string_value(json_array_get(p, 0)));
        r->value = json_number_value(json_array_get(p, 1));
        r->index = (size_t)json_integer_value(json_array_get(p, 2)); /* absent in older records: 0 */
        r->re = r->key ? ls_key_compile(r->key, why, sizeof why) : NULL;
        if (r->key) (*n)++;
        if (!r->re) return false;
    }
    return true;
}

static bool ls_rules_load_strings(const json_t *arr, char ***out, size_t *n) {
    *n = 0;
    *out = calloc(json_array_size(arr) + 1, sizeof **out);
    if (!*out) return false;
    size_t i;
    json_t *s;
    json_array_foreach(arr, i, s) if (!((*out)[(*n)++] = strdup(json_string_value(s)))) return false;
    return true;
}

/* A scope from the compact text (v: absent, an expression or names). */
static bool ls_rules_load_scope(const json_t *v, ls_rule_scope *s) {
    s->given = v != NULL;
    if (json_is_string(v)) return (s->re = ls_full_compile(json_string_value(v))) != NULL;
    return !v || ls_rules_load_strings(v, &s->names, &s->n_names);
}

ls_status ls_peft_rules_load(const char *text, ls_peft_rules **out, ls_error *err) {
    *out = NULL;
    if (!text || !*text) return LS_OK;
    json_t *c = json_loads(text, 0, NULL);
    ls_peft_rules *r = calloc(1, sizeof *r);
    bool ok = c && r && ls_rules_load_pairs(json_object_get(c, "rank_pattern"), &r->rank, &r->n_rank) &&
              ls_rules_load_pairs(json_object_get(c, "alpha_pattern"), &r->alpha, &r->n_alpha) &&
              ls_rules_load_strings(json_object_get(c, "layers_pattern"), &r->patterns, &r->n_patterns) &&
              ls_rules_load_strings(json_object_get(c, "target_modules"), &r->names, &r->n_names) &&
              ls_rules_load_strings(json_object_get(c, "target_parameters"), &r->params, &r->n_params) &&
              ls_rules_load_strings(json_object_get(c, "other_params"), &r->other_params, &r->n_other_params) &&
              ls_rules_load_scope(json_object_get(c, "targets"), &r->targets) &&
              ls_rules_load_scope(json_object_get(c, "excludes"), &r->excludes);
    const json_t *layers = ok ? json_object_get(c, "layers_to_transform") : NULL;
    if (layers) {
        r->layers = calloc(json_array_size(layers) + 1, sizeof *r->layers);
        ok = r->layers != NULL;
        size_t i;
        json_t *e;
        json_array_foreach(layers, i, e) if (ok) r->layers[r->n_layers++] = json_integer_value(e);
    }
    json_decref(c);
    if (!ok) {
        ls_peft_rules_free(r);
        return ls_error_set(err, LS_INTERNAL, NULL, "out of memory reading an adapter's rank_pattern");
    }
    *out = r;
    return LS_OK;
}

/* Whether PEFT put module's factors on its weight parameter
 * (target_parameters: the key or its end after a '.'). */
static bool ls_rules_is_param(const ls_peft_rules *r, const char *module) {
    char key[256];
    snprintf(key, sizeof key, "%s.weight", module);
    for (size_t i = 0; i < r->n_params; i++) {
        const char *e = r->params[i];
        size_t n = strlen(key), m = strlen(e);
        if (!strcmp(key, e) || (n > m && key[n - m - 1] == '.' && !strcmp(key + n - m, e))) return true;
    }
    return false;
}

/* The name PEFT matched patterns against: the module's, or for a
 * target_parameters adapter its weight's. */
static void ls_rules_matched_name(const ls_peft_rules *r, const char *module, char key[256]) {
    snprintf(key, 256, ls_rules_is_param(r, module) ? "%s.weight" : "%s", module);
}

/* The first rule matching that name. */
static const ls_rule *ls_rules_first(const ls_peft_rules *r, const ls_rule *rules, size_t n, const char *module) {
    char key[256];
    ls_rules_matched_name(r, module, key);
    for (size_t i = 0; i < n; i++)
        if (ls_regex_match(rules[i].re, key) == 1) return &rules[i];
    return NULL;
}

size_t ls_peft_rules_keys(const ls_peft_rules *r, size_t max) {
    const size_t n = r ? r->n_rank + r->n_alpha : 0;
    return n < max ? n : max;
}

/* Key i of the rank keys then the alpha keys. */
static const ls_rule *ls_rules_at(const ls_peft_rules *r, size_t i) {
    return i < r->n_rank ? &r->rank[i] : &r->alpha[i - r->n_rank];
}

void ls_peft_rules_hits(const ls_peft_rules *r, const char *module, bool *hit, size_t n) {
    char key[256];
    ls_rules_matched_name(r, module, key);
    for (size_t i = 0; i < n; i++)
        if (!hit[i] && ls_regex_match(ls_rules_at(r, i)->re, key) == 1) hit[i] = true;
}

void ls_peft_rules_hits_params(const ls_peft_rules *r, const char *module, bool *hit, size_t n) {
    /* PEFT nests one wrapper per parameter: "experts.base_layer" is
     * "experts" once its wrappers are taken off. */
    char base[256];
    size_t len = 0;
    for (const char *p = module; *p && len < sizeof base - 1;) {
        if (!strncmp(p, ".base_layer", 11) && (p[11] == '.' || !p[11])) {
            p += 11;
            continue;
        }
        base[len++] = *p++;
    }
    base[len] = '\0';
    for (size_t k = 0; r && k < r->n_other_params; k++) {
        /* PEFT takes an entry as the parameter's name or its end after a
         * '.': "mlp.experts.gate_up_proj" is experts' gate_up_proj. */
        const char *e = r->other_params[k], *leaf = strrchr(e, '.');
        const size_t lead = leaf ? (size_t)(leaf - e) : 0, blen = strlen(base);
        if (leaf && !(blen >= lead && !strncmp(base + blen - lead, e, lead) &&
                      (blen == lead || base[blen - lead - 1] == '.')))
            continue;
        char name[384];
        snprintf(name, sizeof name, "%s.%s", base, leaf ? leaf + 1 : e);
        for (size_t i = 0; i < n; i++)
            if (!hit[i] && ls_regex_match(ls_rules_at(r, i)->re, name) == 1) hit[i] = true;
    }
}

ls_peft_key ls_peft_rules_key(const ls_peft_rules *r, size_t i, const char **pattern) {
    const ls_rule *k = ls_rules_at(r, i);
    *pattern = i < r->n_rank ? "rank_pattern" : "alpha_pattern";
    return (ls_peft_key){k->key, k->value, k->index};
}

int ls_peft_rules_rank(const ls_peft_rules *r, const char *module, const char **key) {
    const ls_rule *hit = r ? ls_rules_first(r, r->rank, r->n_rank, module) : NULL;
    if (key) *key = hit ? hit->key : NULL;
    return hit ? (int)hit->value : 0;
}

bool ls_peft_rules_alpha(const ls_peft_rules *r, const char *module, double *alpha, const char **key) {
    const ls_rule *hit = r ? ls_rules_first(r, r->alpha, r->n_alpha, module) : NULL;
    if (key) *key = hit ? hit->key : NULL;
    if (hit) *alpha = hit->value;
    return hit != NULL;
}

const char *ls_peft_rules_scaling(const ls_peft_rules *r) {
    return !r ? NULL : r->n_alpha ? "alpha_pattern" : r->n_rank ? "rank_pattern" : NULL;
}

bool ls_peft_rules_alpha_shadowed(const ls_peft_rules *r, const char *module, ls_peft_key *first, ls_peft_key *later) {
    const ls_rule *hit = r ? ls_rules_first(r, r->alpha, r->n_alpha, module) : NULL;
    if (!hit) return false;
    char key[256];
    ls_rules_matched_name(r, module, key);
    for (const ls_rule *k = hit + 1; k < r->alpha + r->n_alpha; k++)
        if (k->value != hit->value && ls_regex_match(k->re, key) == 1) {
            *first = (ls_peft_key){hit->key, hit->value, hit->index};
            *later = (ls_peft_key){k->key, k->value, k->index};
            return true;
        }
    return false;
}

/* The digits after the first ".{seg}." of module where seg is pattern
 * (NULL: any segment without dots) and a '.' follows them: PEFT's
 * re.match(r".*?\.{pattern}\.(\d+)\.", key). */
static long long ls_rules_index(const char *module, const char *pattern) {
    for (const char *p = strchr(module, '.'); p; p = strchr(p + 1, '.')) {
        const char *seg = p + 1, *end;
        if (pattern) {
            size_t m = strlen(pattern);
            if (strncmp(seg, pattern, m) || seg[m] != '.') continue;
            end = seg + m;
        } else {
            end = strchr(seg, '.');
            if (!end) break;
        }
        const char *d = end + 1;
        size_t nd = 0;
        while (d[nd] >= '0' && d[nd] <= '9') nd++;
        if (nd == 0 || nd > 18 || d[nd] != '.') continue;
        return strtoll(d, NULL, 10);
    }
    return -1;
}

/* Whether module is in scope s: matched whole by its expression, or
 * named, in full or as its end after a '.'. */
static bool ls_rules_in_scope(const ls_rule_scope *s, const char *module) {
    if (s->re) return ls_regex_match(s->re, module) == 1;
    const size_t n = strlen(module);
    for (size_t i = 0; i < s->n_names; i++) {
        const size_t m = strlen(s->names[i]);
        if (!strcmp(module, s->names[i]) || (n > m && module[n - m - 1] == '.' && !strcmp(module + n - m, s->names[i])))
            return true;
    }
    return false;
}

const char *ls_peft_rules_left_out(const ls_peft_rules *r, const char *module) {
    /* A weight PEFT wrapped as a parameter is targeted by that list. */
    if (!r || ls_rules_is_param(r, module)) return NULL;
    if (r->excludes.given && ls_rules_in_scope(&r->excludes, module)) return "exclude_modules";
    if (r->targets.given && !ls_rules_in_scope(&r->targets, module)) return "target_modules";
    return NULL;
}

bool ls_peft_rules_layer_ok(const ls_peft_rules *r, const char *module, long long *index) {
    *index = -1;
    /* PEFT applies layers_to_transform to target_modules only. */
    if (!r || !r->layers || ls_rules_is_param(r, module)) return true;
    for (size_t i = 0; i < r->n_names; i++)
        if (!strcmp(r->names[i], module)) return true;
    if (!r->n_patterns) *index = ls_rules_index(module, NULL);
    for (size_t i = 0; i < r->n_patterns && *index < 0; i++) *index = ls_rules_index(module, r->patterns[i]);
    for (size_t i = 0; *index >= 0 && i < r->n_layers; i++)
        if (r->layers[i] == *index) return true;
    return false;
}

void ls_peft_rules_layers_str(const ls_peft_rules *r, char *buf, size_t len) {
    buf[0] = '\0';
    if (!r || !r->layers || len < 8) return;
    size_t used = (size_t)snprintf(buf, len, "[");
    for (size_t i = 0; i < r->n_layers && used < len - 6; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", r->layers[i]);
    snprintf(buf + (used < len ? used : len - 1), len - (used < len ? used : len - 1), "%s",
             used >= len - 6 ? "...]" : "]");
}
