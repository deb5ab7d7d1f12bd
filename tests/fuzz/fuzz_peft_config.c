/* libFuzzer harness for the PEFT adapter_config.json reader
 * (ls_adapter_config_parse_text: lora/adapter_config.c, format/json.c).
 * Any text must be either
 *  - accepted: r >= 1, lora_alpha given and finite, a whole config, and
 *    nothing else of the params touched; or
 *  - rejected as adapter_config_invalid with a message per bad key or
 *    pattern entry, params untouched, and messages that do not echo the
 *    file (its text is not the client's to see; a string of the file
 *    that a message holds must still be said when the file is parsed
 *    again without it, as words the server says anyway): invalid JSON gets exactly
 *    "adapter_config.json is not valid JSON: REASON (line L, column C)"
 *    with jansson's reason less its "near '...'" quote of the input; a bad
 *    r, lora_alpha or use_rslora of valid JSON gets one of the messages
 *    message_shape_ok lists, whose only part taken from the input is the
 *    value shown (ls_json_show, by design: the unit tests expect "1.5",
 *    "\"yes\""), at most 40 characters; a refused or bad PEFT key
 *    (peft_type, use_dora, rank_pattern, ...) is named as one of RULE_KEYS
 *    and its message holds no string of the file (no_echo).
 * Built only with clang (tests/fuzz/CMakeLists.txt). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "lora/adapter_config.h"

enum { SHOWN_MAX = 40 }; /* ls_json_show: a value's rendering, cut at 37 characters plus "..." */

static const char *const KINDS[] = {"an object", "an array", "a string", "an integer", "a real number", "a boolean",
                                    "null", NULL};
static const char *const KEYS[][2] = {{"r", "a positive integer"},
                                      {"lora_alpha", "a number"},
                                      {"use_rslora", "true or false"},
                                      {"gate_up_order", "\"gate_up\" or \"interleaved\""},
                                      {NULL, NULL}};

/* The keys whose refusals and rules name the key and never the file's
 * text (lora/adapter_config.c, lora/adapter_rules.c). */
static const char *const RULE_KEYS[] = {"peft_type", "use_dora", "lora_bias", "use_qalora", "alora_invocation_tokens",
                                        "arrow_config", "use_bdlora", "monteclora_config", "kasa_config",
                                        "layer_replication", "init_lora_weights", "modules_to_save", "rank_pattern",
                                        "alpha_pattern", "layers_to_transform", "layers_pattern", "target_parameters",
                                        NULL};

/* Keys the messages name in their own words about other keys ("... when
 * target_modules is a string"): a key name, not the file's text. */
static const char *const NAMED_KEYS[] = {"target_modules", NULL};

/* s starts with prefix: s past it, or NULL. */
static const char *skip(const char *s, const char *prefix) {
    size_t n = strlen(prefix);
    return strncmp(s, prefix, n) ? NULL : s + n;
}

/* A message about valid JSON is one of
 *   adapter config must be a JSON object, found KIND
 *   adapter config: "KEY" is missing; it must be WANT
 *   adapter config: "KEY" must be WANT, found KIND        (a string, array or object)
 *   adapter config: "KEY" must be WANT, found SHOWN (KIND) (a number, boolean or null)
 * where SHOWN, the only part taken from the input, has 1 to SHOWN_MAX
 * characters: a file's text is never quoted. (No coverage here: the
 * fuzzer is not to learn the words.) */
__attribute__((no_sanitize("coverage"))) static bool message_shape_ok(const char *m) {
    char want[160];
    for (int k = 0; KINDS[k]; k++) {
        snprintf(want, sizeof want, "adapter config must be a JSON object, found %s", KINDS[k]);
        if (!strcmp(m, want)) return true;
    }
    for (int i = 0; KEYS[i][0]; i++) {
        snprintf(want, sizeof want, "adapter config: \"%s\" is missing; it must be %s", KEYS[i][0], KEYS[i][1]);
        if (!strcmp(m, want)) return true;
        snprintf(want, sizeof want, "adapter config: \"%s\" must be %s, found ", KEYS[i][0], KEYS[i][1]);
        const char *shown = skip(m, want);
        if (!shown) continue;
        if (!strcmp(shown, "a string") || !strcmp(shown, "an array") || !strcmp(shown, "an object")) return true;
        size_t n = strlen(shown);
        for (int k = 0; KINDS[k]; k++) {
            if (!strcmp(KINDS[k], "a string") || !strcmp(KINDS[k], "an array") || !strcmp(KINDS[k], "an object"))
                continue; /* their text is never shown */
            snprintf(want, sizeof want, " (%s)", KINDS[k]);
            size_t w = strlen(want);
            if (n > w && n - w <= SHOWN_MAX && !strcmp(shown + n - w, want)) return true;
        }
    }
    return false;
}

/* "adapter config: \"KEY\" ..." with KEY one of RULE_KEYS, or a message
 * that names those keys together (the rules' size limit). */
__attribute__((no_sanitize("coverage"))) static bool rule_message_ok(const char *m) {
    if (skip(m, "adapter config: rank_pattern, alpha_pattern, layers_to_transform and target_modules take ")) return true;
    const char *k = skip(m, "adapter config: \"");
    if (!k) return false;
    for (int i = 0; RULE_KEYS[i]; i++) {
        size_t n = strlen(RULE_KEYS[i]);
        if (!strncmp(k, RULE_KEYS[i], n) && k[n] == '"' && k[n + 1] == ' ') return true;
    }
    return false;
}

/* needle in hay, by hand: the library's strstr would teach the fuzzer the
 * messages' words. */
__attribute__((no_sanitize("coverage"))) static bool contains(const char *hay, const char *needle) {
    const size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] == needle[i]) i++;
        if (i == n) return true;
    }
    return false;
}

/* s with every occurrence of cut overwritten by '~' (no message holds
 * one). Ownership: the caller frees the result. */
__attribute__((no_sanitize("coverage"))) static char *overwrite(const char *s, const char *cut) {
    char *out = strdup(s);
    FUZZ_CHECK(out);
    const size_t n = strlen(cut);
    for (char *p = out; n && *p; p++)
        if (!strncmp(p, cut, n)) memset(p, '~', n), p += n - 1;
    return out;
}

/* A copy of v whose strings and keys, at any depth, no longer hold cut.
 * Ownership: the caller owns the new value. */
__attribute__((no_sanitize("coverage"))) static json_t *without(const json_t *v, const char *cut) {
    if (json_is_string(v)) {
        char *s = overwrite(json_string_value(v), cut);
        json_t *r = json_string(s);
        free(s);
        return r;
    }
    const char *key;
    json_t *e, *r = NULL;
    size_t i;
    if (json_is_object(v)) {
        r = json_object();
        json_object_foreach((json_t *)v, key, e) {
            char *k = overwrite(key, cut);
            json_object_set_new(r, k, without(e, cut));
            free(k);
        }
    } else if (json_is_array(v)) {
        r = json_array();
        json_array_foreach(v, i, e) json_array_append_new(r, without(e, cut));
    } else {
        r = json_copy((json_t *)v);
    }
    FUZZ_CHECK(r);
    return r;
}

/* s is the server's own words, not the file's: the messages of the same
 * document without s (each occurrence overwritten) still say it. */
__attribute__((no_sanitize("coverage"))) static bool said_anyway(const json_t *doc, const char *s) {
    json_t *other = without(doc, s);
    char *text = json_dumps(other, JSON_ENCODE_ANY);
    json_decref(other);
    FUZZ_CHECK(text);
    ls_adapter_params p;
    memset(&p, 0, sizeof p);
    p.format = LS_ADAPTER_FORMAT_POOL, p.strict = true, p.has_scale = true, p.scale = 0.25; /* as the first parse */
    ls_error err;
    ls_error_init(&err);
    bool said = false;
    if (ls_adapter_config_parse_text(text, &p, &err) != LS_OK)
        for (size_t i = 0; i < err.n_violations && !said; i++) said = contains(err.violations[i].message, s);
    ls_error_free(&err);
    free(text);
    return said;
}

/* No string of the document (a key or a string value, at any depth) of 8
 * or more characters appears in m unless it is a key name the messages
 * use or words the messages say anyway. (Shorter ones could be any word
 * of a message.) */
__attribute__((no_sanitize("coverage"))) static bool no_echo(const json_t *doc, const json_t *v, const char *m) {
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    if (s && strlen(s) >= 8 && contains(m, s)) {
        bool known = false;
        for (int i = 0; RULE_KEYS[i] && !known; i++) known = contains(RULE_KEYS[i], s);
        for (int i = 0; KEYS[i][0] && !known; i++) known = contains(KEYS[i][0], s);
        for (int i = 0; NAMED_KEYS[i] && !known; i++) known = contains(NAMED_KEYS[i], s);
        if (!known && !said_anyway(doc, s)) return false;
    }
    const char *key;
    json_t *e;
    size_t i;
    if (json_is_object(v)) {
        json_object_foreach((json_t *)v, key, e) {
            json_t *k = json_string(key);
            bool ok = !k || no_echo(doc, k, m);
            json_decref(k);
            if (!ok || !no_echo(doc, e, m)) return false;
        }
    }
    if (json_is_array(v))
        json_array_foreach(v, i, e) if (!no_echo(doc, e, m)) return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    FUZZ_CHECK(text);
    memcpy(text, data, size);
    text[size] = '\0'; /* the reader sees the text up to its first NUL */

    ls_adapter_params p, before;
    memset(&p, 0, sizeof p); /* padding too: compared with memcmp below */
    p.format = LS_ADAPTER_FORMAT_POOL, p.strict = true, p.has_scale = true, p.scale = 0.25;
    p.r = -7, p.lora_alpha = -3.5, p.has_rslora = true; /* none a parse would write */
    before = p;
    ls_error err;
    ls_error_init(&err);
    ls_status st = ls_adapter_config_parse_text(text, &p, &err);

    json_error_t je;
    json_t *doc = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (st == LS_OK) {
        FUZZ_CHECK(doc && json_is_object(doc) && err.code == LS_OK && err.n_violations == 0);
        FUZZ_CHECK(p.r >= 1 && p.has_alpha && isfinite(p.lora_alpha) && p.whole_config);
        FUZZ_CHECK(p.has_rslora || !p.use_rslora);
        FUZZ_CHECK(p.format == before.format && p.strict == before.strict && p.has_scale == before.has_scale &&
                   p.scale == before.scale);
    } else {
        fuzz_check_error(st, &err);
        FUZZ_CHECK(st == LS_ADAPTER_CONFIG_INVALID && err.n_violations >= 1);
        FUZZ_CHECK(!memcmp(&p, &before, sizeof p));
        if (doc) {
            for (size_t i = 0; i < err.n_violations; i++) {
                const char *m = err.violations[i].message;
                FUZZ_CHECK(message_shape_ok(m) || (rule_message_ok(m) && no_echo(doc, doc, m)));
            }
        } else {
            /* Exactly jansson's reason, without its quote of the input
             * (" near '...'", the escape after "invalid Unicode") or its
             * flag names. */
            char reason[sizeof je.text], want[sizeof err.message];
            snprintf(reason, sizeof reason, "%s", je.text);
            char *near = strstr(reason, " near ");
            if (near) *near = '\0';
            char *flag = strstr(reason, " without JSON_ALLOW_NUL");
            if (flag) snprintf(flag, sizeof reason - (size_t)(flag - reason), " in a string");
            if (!strncmp(reason, "invalid Unicode ", 16)) reason[15] = '\0';
            snprintf(want, sizeof want, "adapter_config.json is not valid JSON: %s (line %d, column %d)", reason,
                     je.line, je.column);
            FUZZ_CHECK(err.n_violations == 1 && !strcmp(err.violations[0].message, want));
        }
        FUZZ_CHECK(!strcmp(err.message, err.violations[0].message));
    }
    json_decref(doc);
    ls_error_free(&err);
    free(text);
    return 0;
}
