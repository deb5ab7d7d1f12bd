/* PEFT's rules for which entry of an adapter config applies to a module:
 * rank_pattern and alpha_pattern (a key matches module name m when
 * re.match(rf"(.*\.)?({key})$", m); the first matching key wins),
 * layers_to_transform with layers_pattern (the layer index PEFT reads
 * from the name; full names in target_modules bypass it). For factors
 * PEFT put on a weight parameter (target_parameters) the patterns are
 * matched against "{module}.weight", as PEFT does, and
 * layers_to_transform does not apply. Kept as compact
 * JSON text in ls_adapter_params.peft, so that parameters stay plain values;
 * read back into compiled rules when an adapter is normalised. */
#ifndef LS_LORA_ADAPTER_RULES_H
#define LS_LORA_ADAPTER_RULES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"

typedef struct ls_peft_rules ls_peft_rules;

/* Validates the keys of config obj that decide per-module ranks, scales
 * and layers (rank_pattern, alpha_pattern, layers_to_transform,
 * layers_pattern, target_modules when it names modules in full,
 * target_parameters) and
 * writes their compact form into text[len] ("" when none applies). Every
 * pattern is compiled: one this server cannot evaluate exactly, a value of
 * the wrong kind or a form PEFT itself refuses is LS_ADAPTER_CONFIG_INVALID
 * naming the key (every bad key reported). Entries that can never concern
 * a shared-expert module (a key ending in q_proj, say) are dropped; a
 * text longer than len is refused. from_file: never quote the file's
 * strings in a message. */
ls_status ls_peft_rules_from_config(const json_t *obj, bool from_file, char *text, size_t len, ls_error *err);

/* The same for one key given as JSON text (a safetensors __metadata__
 * value), merged into text; where names the carrier in messages. */
ls_status ls_peft_rules_from_text(const char *key, const char *value, const char *where, char *text, size_t len,
                                  ls_error *err);

/* Compiles text (from the functions above) into *out, NULL when text is
 * "". The caller frees with ls_peft_rules_free. */
ls_status ls_peft_rules_load(const char *text, ls_peft_rules **out, ls_error *err);
void ls_peft_rules_free(ls_peft_rules *r);

/* rank_pattern's value for module (0: no key matches); *key (when given)
 * the key that matched, borrowed from r. r may be NULL. */
int ls_peft_rules_rank(const ls_peft_rules *r, const char *module, const char **key);
/* alpha_pattern's value for module into *alpha; false when no key matches. */
bool ls_peft_rules_alpha(const ls_peft_rules *r, const char *module, double *alpha, const char **key);
/* The pattern that gives some module its own scale: "rank_pattern",
 * "alpha_pattern", or NULL when r has neither. */
const char *ls_peft_rules_scaling(const ls_peft_rules *r);

/* A pattern key as the rules hold it: its text and value (borrowed), and
 * its place in adapter_config.json's pattern (1..), 0 when the request
 * stated it. A file's keys are named by place, never echoed. */
typedef struct {
    const char *key;
    double value;
    size_t index;
} ls_peft_key;

/* Pattern keys, rank_pattern's first: how many (at most max), whether
 * key i matches module as PEFT matches it (*hit set, never cleared),
 * and key i itself. */
size_t ls_peft_rules_keys(const ls_peft_rules *r, size_t max);
void ls_peft_rules_hits(const ls_peft_rules *r, const char *module, bool *hit, size_t n);
/* The same for the parameters of another module that target_parameters
 * names ("{module}.gate_up_proj" of a skipped routed experts' factor,
 * PEFT's wrappers' ".base_layer" taken off). */
void ls_peft_rules_hits_params(const ls_peft_rules *r, const char *module, bool *hit, size_t n);
ls_peft_key ls_peft_rules_key(const ls_peft_rules *r, size_t i, const char **pattern);

/* Whether a later alpha_pattern key than the one that applies to module
 * matches it too, with another value: the first in the file's order
 * wins, as in PEFT's loader, but save_pretrained writes the keys sorted,
 * so the order the adapter was trained with may have been the other.
 * Fills the two keys when true. */
bool ls_peft_rules_alpha_shadowed(const ls_peft_rules *r, const char *module, ls_peft_key *first, ls_peft_key *later);

/* Which of target_modules and exclude_modules keeps PEFT from creating a
 * LoRA layer at module (so that it would not load its factors either):
 * "exclude_modules", "target_modules", or NULL when neither does (also
 * when neither is known: "all-linear", an expression this engine cannot
 * evaluate exactly, a list of names too long to keep). */
const char *ls_peft_rules_left_out(const ls_peft_rules *r, const char *module);

/* Whether PEFT's layers_to_transform lets module have an adapter: true
 * when there is no such list, when module is named in full in
 * target_modules, or when the layer index PEFT reads from the name (into
 * *index, -1 when it finds none) is in the list. */
bool ls_peft_rules_layer_ok(const ls_peft_rules *r, const char *module, long long *index);
/* layers_to_transform as text for messages ("[0, 2]"); "" without one. */
void ls_peft_rules_layers_str(const ls_peft_rules *r, char *buf, size_t len);

#endif
