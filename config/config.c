/* The sources of settings and their precedence (README, Command line): the JSON file
 * (--config or LORASINK_CONFIG), then LORASINK_* variables, then flags, each
 * overriding the one before; values are parsed by the table in settings.c. */
#include "config/config.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/text.h"
#include "config/settings.h"
#include "format/json.h"

/* A value given by a source (not a default): parsed, its mark raised, and
 * noted in the source's seen[] for the cross-setting rules. */
static bool apply(const ls_setting *s, const char *text, ls_config *cfg, const char *origin, bool *seen, char *err,
                  size_t errlen) {
    /* A list's first entry from a source replaces what lower sources gave;
     * the source's further entries add to it. */
    if (s->type == LS_SET_LIST && !seen[s - ls_settings]) ls_setting_list_clear(s, cfg);
    if (!ls_setting_parse(s, text, cfg, origin, err, errlen)) return false;
    if (s->marks) *(bool *)((char *)cfg + s->mark_offset) = true;
    seen[s - ls_settings] = true;
    return true;
}

typedef enum { SRC_FILE, SRC_ENV, SRC_FLAG } source;

static const char *origin_of(source src, const char *path, const ls_setting *s, char *buf, size_t len) {
    char k[64];
    switch (src) {
    case SRC_FILE: ls_setting_json_key(s, k, sizeof k); snprintf(buf, len, "%s: %s", path, k); break;
    case SRC_ENV: ls_setting_env_name(s, buf, len); break;
    case SRC_FLAG: snprintf(buf, len, "--%s", s->name); break;
    }
    return buf;
}

/* The demo/weights rule, applied once per source after all its values:
 * - within one source, demo=true together with a non-empty weights path is
 *   an error ("--demo and --weights exclude each other");
 * - across sources the higher one wins: a source giving weights sets demo
 *   to weights == "" (a path turns the demo off, "" turns it back on); a
 *   source giving demo=true (without weights) clears weights from a lower one;
 * - after all sources, demo=false needs a weights path (checked in load). */
static bool finish_source(ls_config *cfg, const bool *seen, source src, const char *path, char *err,
                          size_t errlen) {
    const ls_setting *demo = ls_setting_find_flag("demo", 4), *weights = ls_setting_find_flag("weights", 7);
    bool demo_seen = seen[demo - ls_settings], weights_seen = seen[weights - ls_settings];
    if (demo_seen && weights_seen) {
        if (cfg->demo && cfg->weights[0]) {
            char a[80], b[80];
            if (src == SRC_FILE)
                snprintf(err, errlen, "%s: demo and weights exclude each other", path);
            else
                snprintf(err, errlen, "%s and %s exclude each other", origin_of(src, path, demo, a, sizeof a),
                         origin_of(src, path, weights, b, sizeof b));
            return false;
        }
    } else if (weights_seen) {
        cfg->demo = cfg->weights[0] == '\0';
    } else if (demo_seen && cfg->demo) {
        cfg->weights[0] = '\0';
    }
    return true;
}

/* Whether a name and a path given apart (a file's object, vLLM's JSON
 * entry) survive as one "NAME=PATH" entry: the entry syntax would split
 * or pin them otherwise, so they are refused, never split. */
static bool entry_fits(const char *name, const char *path) {
    const size_t pl = strlen(path), sl = strlen(",pinned");
    return !strpbrk(name, "=;\n") && !strpbrk(path, ";\n") && !(pl >= sl && !strcmp(path + pl - sl, ",pinned"));
}

#define LS_ENTRY_RULE "a name may not hold '=', ';' or a newline, a path ';', a newline or a final \",pinned\""

/* Where each setting's value came from: 0 (its default) or the source
 * + 1 whose value stands (a higher source's replaces a lower one's). */
typedef unsigned char given_from;

/* Adds one source's seen[] to what every source gave. */
static void note_given(given_from *given, const bool *seen, source src) {
    for (size_t i = 0; i < ls_settings_count; i++)
        if (seen[i]) given[i] = (given_from)(src + 1);
}

/* The name of s as the source whose value stands gave it ("--hidden",
 * "LORASINK_HIDDEN", "FILE: hidden"); "--NAME" for a default. */
static const char *given_origin(const ls_config *cfg, const given_from *given, const ls_setting *s, char *buf,
                                size_t len) {
    const given_from g = given[s - ls_settings];
    return origin_of(g ? (source)(g - 1) : SRC_FLAG, cfg->config_file, s, buf, len);
}

/* Every way to give s: "--tls-key, LORASINK_TLS_KEY or the file's \"tls_key\"". */
static const char *every_name(const ls_setting *s, char *buf, size_t len) {
    char env[64], key[64];
    ls_setting_env_name(s, env, sizeof env);
    ls_setting_json_key(s, key, sizeof key);
    snprintf(buf, len, "--%s, %s or the file's \"%s\"", s->name, env, key);
    return buf;
}

/* The demo model's sizes mean nothing for a checkpoint, whose sizes come
 * from its config.json: a value given for one while weights are served is
 * a mistake, refused rather than ignored. */
static bool check_demo_only(const ls_config *cfg, const given_from *given, char *err, size_t errlen) {
    if (cfg->demo) return true;
    const ls_setting *weights = ls_setting_find_flag("weights", 7);
    for (size_t i = 0; i < ls_settings_count; i++) {
        const ls_setting *s = &ls_settings[i];
        if (!ls_setting_demo_only(s) || !given[i]) continue;
        char from[LS_CONFIG_PATH_MAX + 80], wfrom[LS_CONFIG_PATH_MAX + 80], names[160];
        const bool file = given[i] == SRC_FILE + 1;
        snprintf(err, errlen,
                 "%s sets the demo model, and %s serves a checkpoint whose sizes come from its config.json "
                 "(GET /model shows them): drop it (%s)%s",
                 given_origin(cfg, given, s, from, sizeof from), given_origin(cfg, given, weights, wfrom, sizeof wfrom),
                 every_name(s, names, sizeof names), file ? ", or give it in the file as null" : "");
        return false;
    }
    return true;
}

/* TLS takes a certificate and its key together, and client certificates
 * are asked for only over TLS: half of it given is a mistake, refused
 * rather than served as plain HTTP. */
static bool check_tls(const ls_config *cfg, const given_from *given, char *err, size_t errlen) {
    const ls_setting *cert = ls_setting_find_flag("tls-cert", 8), *key = ls_setting_find_flag("tls-key", 7);
    char from[LS_CONFIG_PATH_MAX + 80], names[160];
    if (!cfg->tls_cert[0] != !cfg->tls_key[0]) {
        const ls_setting *has = cfg->tls_cert[0] ? cert : key, *lacks = cfg->tls_cert[0] ? key : cert;
        snprintf(err, errlen, "%s is given without --%s (%s): TLS needs both the certificate and its key (PEM files)",
                 given_origin(cfg, given, has, from, sizeof from), lacks->name, every_name(lacks, names, sizeof names));
        return false;
    }
    if (cfg->tls_client_ca[0] && !cfg->tls_cert[0]) {
        snprintf(err, errlen, "%s is given without --tls-cert and --tls-key: client certificates are asked for only "
                              "over TLS",
                 given_origin(cfg, given, ls_setting_find_flag("tls-client-ca", 13), from, sizeof from));
        return false;
    }
    return true;
}

static bool load_file_list(const ls_setting *s, const json_t *v, ls_config *cfg, const char *origin, bool *seen,
                           char *err, size_t errlen) {
    if (json_is_string(v)) return apply(s, json_string_value(v), cfg, origin, seen, err, errlen);
    if (!json_is_array(v)) {
        snprintf(err, errlen, "%s: expected an array, got %s", origin, ls_json_kind(v));
        return false;
    }
    if (json_array_size(v) == 0) {
        ls_setting_list_clear(s, cfg);
        seen[s - ls_settings] = true;
        return true;
    }
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e) {
        char entry[LS_CONFIG_PATH_MAX + 160];
        const char *name = NULL, *path = NULL;
        int pinned = 0;
        if (json_is_string(e)) {
            /* As it is: one string may hold several ';'-separated entries. */
            if (!apply(s, json_string_value(e), cfg, origin, seen, err, errlen)) return false;
            continue;
        } else if (json_is_object(e) && !json_unpack((json_t *)e, "{s:s, s:s, s?b !}", "name", &name, "path", &path,
                                                     "pinned", &pinned)) {
            if (!entry_fits(name, path)) {
                snprintf(err, errlen, "%s[%zu]: " LS_ENTRY_RULE, origin, i);
                return false;
            }
            int n = snprintf(entry, sizeof entry, "%s=%s%s", name, path, pinned ? ",pinned" : "");
            if (n < 0 || (size_t)n >= sizeof entry) {
                snprintf(err, errlen, "%s[%zu]: the name and path are too long", origin, i);
                return false;
            }
        } else {
            snprintf(err, errlen, "%s[%zu]: expected \"NAME=PATH[,pinned]\" or {\"name\", \"path\", \"pinned\"}",
                     origin, i);
            return false;
        }
        if (!apply(s, entry, cfg, origin, seen, err, errlen)) return false;
    }
    return true;
}

/* "PATH: unknown key", with the nearest key; a vLLM flag name written as
 * a key gets the key that is ours for it. */
static void file_unknown_key(const char *path, const char *key, char *err, size_t errlen) {
    char k[64], near[96], q[48];
    ls_text_near n;
    ls_text_near_init(&n, key);
    for (size_t i = 0; i < ls_settings_count; i++) {
        ls_setting_json_key(&ls_settings[i], k, sizeof k);
        ls_text_near_offer(&n, k);
    }
    for (size_t i = 0; i < ls_flag_aliases_count; i++) {
        snprintf(k, sizeof k, "%s", ls_flag_aliases[i].name);
        for (char *p = k; *p; p++)
            if (*p == '-') *p = '_';
        if (!strcmp(k, key)) {
            const ls_setting *t = ls_setting_find_flag(ls_flag_aliases[i].target, strlen(ls_flag_aliases[i].target));
            ls_setting_json_key(t, k, sizeof k);
            snprintf(n.best, sizeof n.best, "%s", k);
        }
    }
    snprintf(err, errlen, "%s: unknown key \"%s\"%s", path, ls_setting_quote(key, q, sizeof q),
             ls_text_near_clause(&n, "; did you mean \"", "\"?", near, sizeof near));
}

/* A scalar JSON value of setting s as the text its flag would take, so
 * bounds and messages are the same as for flags: the text (v's string or
 * num, which it fills), or NULL with *want set to the JSON type s needs. */
static const char *file_value_text(const ls_setting *s, const json_t *v, char *num, size_t num_len,
                                   const char **want) {
    *want = NULL;
    switch (s->type) {
    case LS_SET_INT:
        if (!json_is_integer(v)) break;
        snprintf(num, num_len, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return num;
    case LS_SET_U64: /* a string reaches seeds above 2^63-1, which JSON parsers reject as integers */
        if (json_is_string(v)) return json_string_value(v);
        if (!json_is_integer(v)) {
            *want = "an unsigned integer (or a string of digits)";
            return NULL;
        }
        snprintf(num, num_len, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return num;
    case LS_SET_BOOL:
        if (json_is_boolean(v)) return json_is_true(v) ? "true" : "false";
        *want = "true or false";
        return NULL;
    case LS_SET_STR:
    case LS_SET_ENUM:
        if (json_is_string(v)) return json_string_value(v);
        *want = "a string";
        return NULL;
    case LS_SET_LIST:
        break;
    }
    *want = "an integer";
    return NULL;
}

/* The config file opened for reading past a UTF-8 byte-order mark (RFC
 * 8259 lets a reader skip one; editors on Windows write it), or NULL with
 * err: a directory, a FIFO (which would block start-up until a writer
 * came) or an empty file is named as such, not as bad JSON at 1:0. */
static FILE *open_config(const char *path, char *err, size_t errlen) {
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return NULL;
    }
    const char *what = S_ISDIR(st.st_mode) ? "a directory" : !S_ISREG(st.st_mode) ? "not a regular file"
                       : st.st_size == 0 ? "empty (a config file holds one JSON object; {} sets nothing)" : NULL;
    FILE *f = what ? NULL : fdopen(fd, "rb");
    if (!f) {
        if (what) snprintf(err, errlen, "%s: the config file is %s", path, what);
        else snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    unsigned char bom[3];
    if (fread(bom, 1, 3, f) != 3 || memcmp(bom, "\xef\xbb\xbf", 3)) rewind(f);
    return f;
}

static bool load_file(ls_config *cfg, const char *path, given_from *given, char *err, size_t errlen) {
    FILE *f = open_config(path, err, errlen);
    if (!f) return false;
    json_error_t jerr;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
    fclose(f);
    if (!root) {
        /* jansson's reason without its quote of the file ("near '...'"):
         * raw bytes would break the one-line error and could be the API key. */
        char why[sizeof jerr.text];
        snprintf(err, errlen, "%s:%d:%d: %s", path, jerr.line, jerr.column,
                 ls_json_error_reason(&jerr, why, sizeof why));
        return false;
    }
    bool ok = json_is_object(root), seen[LS_SETTINGS_MAX] = {0};
    if (!ok) snprintf(err, errlen, "%s: the config file must hold a JSON object", path);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!ok) break;
        const ls_setting *s = ls_setting_find_key(key);
        if (!s) {
            file_unknown_key(path, key, err, errlen);
            ok = false;
            break;
        }
        /* null = not given here (the default, or a lower source, stays): it
         * lets the example file list w13_layout without overriding the
         * weights file's metadata, which any value would. */
        if (json_is_null(v)) continue;
        char origin[LS_CONFIG_PATH_MAX + 64], num[32];
        origin_of(SRC_FILE, path, s, origin, sizeof origin);
        if (s->type == LS_SET_LIST) {
            ok = load_file_list(s, v, cfg, origin, seen, err, errlen);
            continue;
        }
        const char *want, *text = file_value_text(s, v, num, sizeof num, &want);
        if (!text) snprintf(err, errlen, "%s: expected %s, got %s", origin, want, ls_json_kind(v));
        ok = text && apply(s, text, cfg, origin, seen, err, errlen);
    }
    if (ok) ok = finish_source(cfg, seen, SRC_FILE, path, err, errlen);
    if (ok) note_given(given, seen, SRC_FILE);
    json_decref(root);
    return ok;
}

/* getenv's rule: the first entry for a name counts. */
static const char *env_lookup(char **envp, const char *name) {
    size_t n = strlen(name);
    for (char **e = envp; e && *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=') return *e + n + 1;
    return NULL;
}

/* A LORASINK_* variable of envp that no setting reads, noted in
 * cfg->env_unread when it looks meant for one: near a setting's variable
 * (LORASINK_PROT), or a peer's flag written as one (LORASINK_MAX_LORAS).
 * Others are left alone: scripts and tools share the prefix. */
static void note_unread_env(ls_config *cfg, const char *entry) {
    char name[64], env[64], near[96];
    const size_t n = strcspn(entry, "=");
    if (n >= sizeof name || !strncmp(entry, "LORASINK_CONFIG=", 16)) return;
    snprintf(name, sizeof name, "%.*s", (int)n, entry);
    ls_text_near nr;
    ls_text_near_init(&nr, name);
    for (size_t i = 0; i < ls_settings_count; i++) {
        ls_setting_env_name(&ls_settings[i], env, sizeof env);
        if (!strcmp(env, name)) return; /* read */
        ls_text_near_offer(&nr, env);
    }
    for (size_t i = 0; i < ls_flag_aliases_count; i++) {
        ls_env_name_of(ls_flag_aliases[i].name, env, sizeof env);
        if (strcmp(env, name)) continue;
        ls_setting_env_name(ls_setting_find_flag(ls_flag_aliases[i].target, strlen(ls_flag_aliases[i].target)), env,
                            sizeof env);
        snprintf(nr.best, sizeof nr.best, "%s", env); /* a peer's name is a flag only */
    }
    if (!nr.best[0]) return;
    const size_t len = strlen(cfg->env_unread);
    snprintf(cfg->env_unread + len, sizeof cfg->env_unread - len, "%s%s%s", len ? ", " : "", name,
             ls_text_near_clause(&nr, " (did you mean ", "?)", near, sizeof near));
}

/* Unknown LORASINK_* variables are not refused: the environment is shared
 * with other tools, unlike the command line and the file, which are ours;
 * the ones that look like a mistake are noted for a warning. */
static bool load_env(ls_config *cfg, char **envp, given_from *given, char *err, size_t errlen) {
    for (char **e = envp; e && *e; e++)
        if (!strncmp(*e, "LORASINK_", 9)) note_unread_env(cfg, *e);
    bool seen[LS_SETTINGS_MAX] = {0};
    for (size_t i = 0; i < ls_settings_count; i++) {
        char name[64];
        ls_setting_env_name(&ls_settings[i], name, sizeof name);
        const char *v = env_lookup(envp, name);
        if (v && !apply(&ls_settings[i], v, cfg, name, seen, err, errlen)) return false;
    }
    note_given(given, seen, SRC_ENV);
    return finish_source(cfg, seen, SRC_ENV, NULL, err, errlen);
}

typedef struct {
    const ls_setting *s;
    const char *value;
    const char *alias; /* the peer's name it was given by, or NULL: errors name what was typed */
    char *owned;       /* value when this file wrote it (vLLM's JSON entry): freed with the list */
} flag_value;

/* A peer's JSON entry as the NAME=PATH text --adapter takes. vLLM's
 * base_model_name only names the parent in vLLM's /v1/models, where this
 * server always names the model it serves, and is_3d_lora_weight
 * declares a layout the loader reads from the files: both are taken (a
 * string, a boolean) and change nothing. NULL with the reason in err.
 * Ownership: the caller frees the result. */
static char *lora_module_json(const ls_flag_alias *alias, const char *text, char *err, size_t errlen) {
    const char *flag = alias->name;
    const ls_peer_entry *pe = alias->entry;
    json_error_t je;
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    const char *key, *name = NULL, *path = NULL;
    json_t *v;
    char *out = NULL;
    if (!json_is_object(o)) {
        char q[sizeof je.text]; /* jansson's reason may quote the text near it */
        snprintf(err, errlen, "--%s: an entry that starts with '{' must be a JSON object (%s's {\"%s\": ..., "
                 "\"%s\": ...}): %s", flag, alias->peer, pe->name_key, pe->path_key,
                 o ? "found another JSON value" : ls_setting_quote(je.text, q, sizeof q));
        goto done;
    }
    json_object_foreach(o, key, v) {
        bool is_known = false;
        for (int k = 0; pe->known[k]; k++) is_known |= !strcmp(key, pe->known[k]);
        if (!is_known) {
            char hint[160], near[96], q[48];
            const char *dym = ls_text_unknown_key(key, pe->known, hint, sizeof hint, near, sizeof near);
            snprintf(err, errlen, "--%s: unknown key \"%s\" in a JSON entry%s (%s)", flag,
                     ls_setting_quote(key, q, sizeof q), dym, hint);
            goto done;
        }
        if (!strcmp(key, "base_model_name") && json_is_null(v)) continue; /* vLLM's default */
        if (!strcmp(key, "is_3d_lora_weight") || !strcmp(key, "pinned")) {
            if (!json_is_boolean(v)) {
                snprintf(err, errlen, "--%s: \"%s\" of a JSON entry must be true or false", flag, key);
                goto done;
            }
        } else if (!json_is_string(v) || !json_string_length(v)) {
            snprintf(err, errlen, "--%s: \"%s\" of a JSON entry must be a non-empty string", flag, key);
            goto done;
        }
    }
    name = json_string_value(json_object_get(o, pe->name_key));
    path = json_string_value(json_object_get(o, pe->path_key));
    if (!name || !path) {
        snprintf(err, errlen, "--%s: a JSON entry needs \"%s\"", flag, name ? pe->path_key : pe->name_key);
        goto done;
    }
    if (!entry_fits(name, path)) {
        snprintf(err, errlen, "--%s: in a JSON entry " LS_ENTRY_RULE " (pin with \"pinned\": true)", flag);
        goto done;
    }
    const bool pinned = json_is_true(json_object_get(o, "pinned"));
    size_t len = strlen(name) + strlen(path) + sizeof ",pinned" + 1;
    out = malloc(len);
    if (out) snprintf(out, len, "%s=%s%s", name, path, pinned ? ",pinned" : "");
    else snprintf(err, errlen, "out of memory");
done:
    json_decref(o);
    return out;
}

/* sglang's bare --lora-paths entry: a path that is also the adapter's
 * name. A plain NAME beneath --adapter-dir is NAME=NAME; a path with a
 * '/' would make a name the API cannot spell, so it is refused. NULL
 * with the reason in err; the caller frees the result. */
static char *lora_path_bare(const ls_flag_alias *alias, const char *value, char *err, size_t errlen) {
    char q[96];
    const char *shown = ls_setting_quote(value, q, sizeof q);
    const char *why = !*value                          ? "is empty"
                      : strchr(value, '/')             ? "is a path with '/', which lorasink's adapter names never hold"
                      : !ls_adapter_name_valid(value) ? "is no adapter name lorasink takes (1-128 of letters, digits, "
                                                        "'.', '_', '-'; not starting with '.')"
                                                      : NULL;
    if (why) {
        snprintf(err, errlen, "--%s: \"%s\" %s; a bare entry is sglang's path that is also the adapter's name: "
                 "write NAME=PATH (PATH beneath --adapter-dir)", alias->name, shown, why);
        return NULL;
    }
    size_t len = 2 * strlen(value) + 2;
    char *out = malloc(len);
    if (out) snprintf(out, len, "%s=%s", value, value);
    else snprintf(err, errlen, "out of memory");
    return out;
}

/* One value of a flag into vals: a peer's JSON entry (vLLM's
 * --lora-modules, sglang's --lora-paths) or sglang's bare path becomes
 * NAME=PATH first. */
static bool add_value(flag_value *vals, int *nvals, const ls_setting *s, const char *value, const ls_flag_alias *alias,
                      char *err, size_t errlen) {
    flag_value *f = &vals[(*nvals)++];
    *f = (flag_value){s, value, alias ? alias->name : NULL, NULL};
    if (!alias || !alias->entry) return true;
    if (value[0] == '{') f->owned = lora_module_json(alias, value, err, errlen);
    else if (alias->entry->bare_is_name && !strchr(value, '=')) f->owned = lora_path_bare(alias, value, err, errlen);
    else return true;
    f->value = f->owned;
    return f->owned != NULL;
}

/* "unknown flag --NAME", with the nearest flag or alias when one is near. */
static void unknown_flag(const char *name, size_t len, char *err, size_t errlen) {
    char nm[64], q[48], near[96];
    snprintf(nm, sizeof nm, "%.*s", (int)len, name);
    for (size_t k = 0; k < ls_peer_flags_count; k++)
        if (!strcmp(nm, ls_peer_flags[k].name)) {
            snprintf(err, errlen, "unknown flag --%s (%s flag): %s", nm, ls_peer_flags[k].whose, ls_peer_flags[k].instead);
            return;
        }
    ls_text_near n;
    ls_text_near_init(&n, nm);
    for (size_t k = 0; k < ls_settings_count; k++) ls_text_near_offer(&n, ls_settings[k].name);
    for (size_t k = 0; k < ls_flag_aliases_count; k++) ls_text_near_offer(&n, ls_flag_aliases[k].name);
    ls_text_near_offer(&n, "config");
    ls_text_near_offer(&n, "help");
    ls_text_near_offer(&n, "version");
    ls_text_near_offer(&n, "probe");
    snprintf(err, errlen, "unknown flag --%s%s (see lorasink --help)", ls_setting_quote(nm, q, sizeof q),
             ls_text_near_clause(&n, "; did you mean --", "?", near, sizeof near));
}

/* A boolean's value as written: ours (true, false, 1, 0) as it is, the
 * spellings other tools take (yes, no, on, off) as ours; NULL for neither. */
static const char *bool_spelling(const char *arg) {
    bool v;
    if (ls_text_bool(arg, &v)) return arg;
    static const char *const yes[] = {"yes", "on", NULL}, *const no[] = {"no", "off", NULL};
    for (int k = 0; yes[k]; k++) {
        if (!strcasecmp(arg, yes[k])) return "true";
        if (!strcasecmp(arg, no[k])) return "false";
    }
    return NULL;
}

/* argv[i] is not a flag. After a boolean flag given alone it is most
 * likely that flag's value, which only "--NAME=VALUE" gives. */
static void unexpected_argument(char **argv, int i, char *err, size_t errlen) {
    char q[48], q2[48];
    const char *prev = i > 1 ? argv[i - 1] : "", *spelled = bool_spelling(argv[i]);
    const ls_setting *b = NULL;
    if (!strncmp(prev, "--", 2) && !strchr(prev, '=') && spelled) b = ls_setting_find_flag(prev + 2, strlen(prev + 2));
    if (b && b->type == LS_SET_BOOL)
        snprintf(err, errlen, "unexpected argument \"%s\": a boolean flag alone means true; write --%s=%s",
                 ls_setting_quote(argv[i], q, sizeof q), b->name, ls_setting_quote(spelled, q2, sizeof q2));
    else
        snprintf(err, errlen, "unexpected argument \"%s\" (see lorasink --help)", ls_setting_quote(argv[i], q, sizeof q));
}

/* The flags that take no value and are not settings. */
static bool lone_flag(const char *name, size_t len) {
    static const char *const lone[] = {"probe", "help", "version", NULL};
    for (int k = 0; lone[k]; k++)
        if (len == strlen(lone[k]) && !memcmp(name, lone[k], len)) return true;
    return false;
}

/* Whether arg is one of our flags ("--NAME" or "--NAME=VALUE", "-h",
 * "-V"): the value a flag takes from the next argument never is. */
static bool names_flag(const char *arg) {
    if (!strcmp(arg, "-h") || !strcmp(arg, "-V")) return true;
    if (strncmp(arg, "--", 2)) return false;
    const char *name = arg + 2, *eq = strchr(name, '=');
    const size_t len = eq ? (size_t)(eq - name) : strlen(name);
    return (len == 6 && !memcmp(name, "config", 6)) || lone_flag(name, len) || ls_setting_find_flag(name, len) ||
           ls_flag_alias_find(name, len);
}

/* First pass over argv: syntax only. Handles --help and --version where
 * they stand (so "--help --bogus" prints help), finds --config, and lists
 * the (ls_setting, text) pairs to apply after the file and the environment. */
static ls_config_result scan_flags(int argc, char **argv, flag_value *vals, int *nvals, const char **config,
                                   bool *probe, FILE *out, char *err, size_t errlen) {
    *nvals = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--probe")) {
            *probe = true;
            continue;
        }
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            ls_settings_help(out);
            return LS_CONFIG_EXIT;
        }
        if (!strcmp(arg, "--version") || !strcmp(arg, "-V")) {
            fprintf(out, "lorasink %s\n", LS_VERSION);
            return LS_CONFIG_EXIT;
        }
        if (strncmp(arg, "--", 2) || !arg[2]) {
            unexpected_argument(argv, i, err, errlen);
            return LS_CONFIG_ERROR;
        }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        if (eq && lone_flag(name, len)) {
            snprintf(err, errlen, "--%.*s takes no value", (int)len, name);
            return LS_CONFIG_ERROR;
        }
        bool is_config = len == 6 && !memcmp(name, "config", 6);
        const ls_setting *s = is_config ? NULL : ls_setting_find_flag(name, len);
        const ls_flag_alias *alias = is_config || s ? NULL : ls_flag_alias_find(name, len);
        if (alias) s = ls_setting_find_flag(alias->target, strlen(alias->target));
        if (!is_config && !s) {
            unknown_flag(name, len, err, errlen);
            return LS_CONFIG_ERROR;
        }
        const char *value, *flag = is_config ? "config" : alias ? alias->name : s->name;
        if (eq) value = eq + 1;
        else if (s && s->type == LS_SET_BOOL) value = "true";
        else if (i + 1 < argc && !names_flag(argv[i + 1])) value = argv[++i];
        else if (i + 1 < argc) {
            /* "--api-key --probe": the key forgotten, not a key "--probe". */
            char q[48];
            snprintf(err, errlen, "--%s needs a value, and %s is a flag (write --%s=%s if the value is that)", flag,
                     ls_setting_quote(argv[i + 1], q, sizeof q), flag, ls_setting_quote(argv[i + 1], q, sizeof q));
            return LS_CONFIG_ERROR;
        } else {
            snprintf(err, errlen, "--%s needs a value", flag);
            return LS_CONFIG_ERROR;
        }
        if (is_config) *config = value;
        else if (!add_value(vals, nvals, s, value, alias, err, errlen)) return LS_CONFIG_ERROR;
        /* --lora-modules a=x b=y (vLLM's, sglang's --lora-paths too): every argument up to the next flag. */
        while (alias && alias->several && !eq && i + 1 < argc && strncmp(argv[i + 1], "--", 2) &&
               !names_flag(argv[i + 1]))
            if (!add_value(vals, nvals, s, argv[++i], alias, err, errlen)) return LS_CONFIG_ERROR;
    }
    return LS_CONFIG_RUN;
}

/* A peer's name and ours for one setting on one command line: which
 * stands would depend on their order, and the log would name an alias
 * that lost. Refused (a flag given twice under one name: the last wins). */
static bool check_alias_twice(const flag_value *vals, int nvals, char *err, size_t errlen) {
    for (int i = 0; i < nvals; i++) {
        if (!vals[i].alias) continue;
        for (int j = 0; j < nvals; j++) {
            const char *other = vals[j].alias ? vals[j].alias : vals[j].s->name;
            if (vals[j].s != vals[i].s || !strcmp(other, vals[i].alias)) continue;
            const ls_flag_alias *a = ls_flag_alias_find(vals[i].alias, strlen(vals[i].alias));
            snprintf(err, errlen, "--%s is %s's name for --%s, and --%s is given too: give one of them", vals[i].alias,
                     a ? a->peer : "a peer", vals[i].s->name, other);
            return false;
        }
    }
    return true;
}

/* Adds "--ALIAS as --NAME" to cfg->aliases_used, once per alias (a cut
 * note when it would overflow: it is only for the log). */
static void note_alias(ls_config *cfg, const char *alias, const char *name) {
    char item[96];
    snprintf(item, sizeof item, "--%s as --%s", alias, name);
    if (strstr(cfg->aliases_used, item)) return;
    size_t len = strlen(cfg->aliases_used);
    snprintf(cfg->aliases_used + len, sizeof cfg->aliases_used - len, "%s%s", len ? ", " : "", item);
}

/* cfg is the caller's (plain values, nothing to free); argv and envp are only
 * read, and no pointer into them is kept. --help / --version go to out
 * (stdout when NULL); an error is one line in errbuf. */
ls_config_result ls_config_load(ls_config *cfg, int argc, char **argv, char **envp, FILE *out, char *errbuf,
                                size_t errlen) {
    if (!out) out = stdout;
    if (!ls_setting_defaults(cfg, errbuf, errlen)) return LS_CONFIG_ERROR;
    flag_value *vals = calloc(argc > 0 ? (size_t)argc : 1, sizeof *vals);
    if (!vals) {
        snprintf(errbuf, errlen, "out of memory");
        return LS_CONFIG_ERROR;
    }
    const char *config = NULL, *origin = "--config";
    int nvals = 0;
    bool seen[LS_SETTINGS_MAX] = {0};
    given_from given[LS_SETTINGS_MAX] = {0};
    bool probe = false;
    ls_config_result res = scan_flags(argc, argv, vals, &nvals, &config, &probe, out, errbuf, errlen);
    if (res != LS_CONFIG_RUN) goto done;
    if (!check_alias_twice(vals, nvals, errbuf, errlen)) {
        res = LS_CONFIG_ERROR;
        goto done;
    }

    res = LS_CONFIG_ERROR;
    if (!config) {
        config = env_lookup(envp, "LORASINK_CONFIG");
        origin = "LORASINK_CONFIG";
    }
    if (config && config[0]) {
        if (strlen(config) >= sizeof cfg->config_file) {
            snprintf(errbuf, errlen, "%s: value is longer than %zu bytes", origin, sizeof cfg->config_file - 1);
            goto done;
        }
        strcpy(cfg->config_file, config);
        if (!load_file(cfg, cfg->config_file, given, errbuf, errlen)) goto done;
    }
    if (!load_env(cfg, envp, given, errbuf, errlen)) goto done;

    for (int i = 0; i < nvals; i++) {
        char o[80];
        if (vals[i].alias) snprintf(o, sizeof o, "--%s", vals[i].alias);
        else origin_of(SRC_FLAG, NULL, vals[i].s, o, sizeof o);
        if (!apply(vals[i].s, vals[i].value, cfg, o, seen, errbuf, errlen))
            goto done;
        if (vals[i].alias) note_alias(cfg, vals[i].alias, vals[i].s->name);
    }
    if (!finish_source(cfg, seen, SRC_FLAG, NULL, errbuf, errlen)) goto done;
    note_given(given, seen, SRC_FLAG);
    if (!cfg->demo && !cfg->weights[0]) {
        snprintf(errbuf, errlen, "demo is off but no weights file is given (--weights FILE)");
        goto done;
    }
    if (!check_demo_only(cfg, given, errbuf, errlen)) goto done;
    if (!check_tls(cfg, given, errbuf, errlen)) goto done;
    cfg->probe = probe;
    res = LS_CONFIG_RUN;
done:
    for (int i = 0; i < nvals; i++) free(vals[i].owned);
    free(vals);
    return res;
}

