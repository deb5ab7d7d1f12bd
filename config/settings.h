/* Internal to config/: the settings table that drives every source, and
 * the per-value parsing shared by the flag, environment and file loaders. */
#ifndef LS_CONFIG_SETTINGS_H
#define LS_CONFIG_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "config/config.h"

/* Bound of the per-source "seen" arrays; settings.c checks the table fits. */
#define LS_SETTINGS_MAX 64

/* LS_SET_LIST: a repeatable flag whose entries are appended, one per
 * line, to a text field; a source that gives any replaces what lower
 * sources gave. */
typedef enum { LS_SET_INT, LS_SET_U64, LS_SET_BOOL, LS_SET_STR, LS_SET_ENUM, LS_SET_LIST } ls_setting_type;

/* The sections of --help, in the order printed. */
typedef enum {
    LS_GROUP_MODEL,
    LS_GROUP_POOL,
    LS_GROUP_ADAPTERS,
    LS_GROUP_HTTP,
    LS_GROUP_LIMITS,
    LS_GROUP_OPS,
    LS_GROUP_COUNT
} ls_setting_group;

typedef struct {
    const char *name; /* the flag without "--"; the JSON key and env var derive from it */
    ls_setting_group group; /* its section of --help */
    const char *key;  /* when set, the JSON key and env var derive from this instead ("adapters") */
    ls_setting_type type;
    size_t offset, size;        /* the field in ls_config */
    long long min, max;         /* LS_SET_INT: bounds; LS_SET_STR: min length */
    const char *const *choices; /* LS_SET_ENUM: names by enum value; LS_SET_STR: allowed values or NULL */
    const char *def;            /* the default, as the text a flag would carry */
    const char *meta;           /* the value's placeholder in --help */
    const char *help;
    /* LS_SET_STR: checks a value (NULL: any); false with why, one
     * clause that follows the quoted value. */
    bool (*check)(const char *text, char *why, size_t len);
    bool secret;      /* masked in the dump */
    bool marks;       /* raises the bool at mark_offset when any source gives it */
    size_t mark_offset;
} ls_setting;

extern const ls_setting ls_settings[];
extern const size_t ls_settings_count;

/* A peer's JSON form of one --adapter entry: vLLM's --lora-modules
 * {"name", "path", "base_model_name", "is_3d_lora_weight"}, sglang's
 * --lora-paths {"lora_name", "lora_path", "pinned"}; "pinned" (a
 * boolean) pins in both, as ",pinned" does after NAME=PATH. */
typedef struct {
    const char *name_key, *path_key;
    const char *const *known; /* every key taken, NULL-terminated */
    bool bare_is_name;        /* a value with no '=' is a path that is also the name (sglang) */
} ls_peer_entry;

/* A peer's flag name taken for one of ours (flags only: the environment
 * and the file keep our names). docs/configuration.md says where the
 * peer's flag means something else. */
typedef struct {
    const char *name;   /* without "--" */
    const char *target; /* our flag's name */
    const char *meta;
    const char *note; /* its line of --help */
    bool several;     /* takes every following argument up to the next "--" (vLLM's nargs='+') */
    const char *peer; /* whose name it is: "vLLM", "sglang" */
    const ls_peer_entry *entry; /* its JSON entry, for an alias of --adapter; NULL else */
} ls_flag_alias;

/* A peer's flag this server has no counterpart for, and what to do. */
typedef struct {
    const char *name; /* without "--" */
    const char *whose; /* "vLLM's" */
    const char *instead;
} ls_peer_flag;

extern const ls_peer_flag ls_peer_flags[];
extern const size_t ls_peer_flags_count;

extern const ls_flag_alias ls_flag_aliases[];
extern const size_t ls_flag_aliases_count;
/* By name (len bytes, not NUL-terminated); static, NULL when none. */
const ls_flag_alias *ls_flag_alias_find(const char *name, size_t len);

/* "LORASINK_MAX_RANK" and "max_rank" for "max-rank", written into buf. */
void ls_setting_env_name(const ls_setting *s, char *buf, size_t len);
/* The variable a flag named name would have ("LORASINK_MAX_LORAS" for
 * "max-loras"), written into buf. */
void ls_env_name_of(const char *name, char *buf, size_t len);
void ls_setting_json_key(const ls_setting *s, char *buf, size_t len);
/* Lookups by flag name (len bytes of name, not NUL-terminated) and by JSON
 * key; NULL when no setting has that name. Entries are static. */
const ls_setting *ls_setting_find_flag(const char *name, size_t len);
/* A setting of the demo model's own (its sizes and seed), which means
 * nothing, and is refused, while a checkpoint is served. */
bool ls_setting_demo_only(const ls_setting *s);
const ls_setting *ls_setting_find_key(const char *key);
/* A user's text made fit to quote in a one-line error, written into buf
 * (len >= 8), which is returned. */
const char *ls_setting_quote(const char *text, char *buf, size_t len);
/* Empties a list setting's field (before the first entry of a source). */
void ls_setting_list_clear(const ls_setting *s, ls_config *cfg);
/* Parses text for s into its field of cfg. origin names the source in the
 * error ("--slots", "LORASINK_SLOTS", "file.json: slots"). */
bool ls_setting_parse(const ls_setting *s, const char *text, ls_config *cfg, const char *origin, char *err,
                      size_t errlen);
/* Zeroes cfg and sets every default. False only for a broken table. */
bool ls_setting_defaults(ls_config *cfg, char *err, size_t errlen);
/* The --help text: usage, then the settings by section, each wrapped to
 * 100 columns, an alias's line after the setting it names. */
void ls_settings_help(FILE *out);

#endif
