/* What an adapter says about itself, from each of its carriers: the
 * adapter_config.json of a PEFT directory or an inline "config" object
 * (JSON), a safetensors __metadata__ or a query string (text); and the one
 * rule that puts what a request states over what the file says. */
#ifndef LS_LORA_ADAPTER_CONFIG_H
#define LS_LORA_ADAPTER_CONFIG_H

#include <jansson.h>

#include "common/error.h"
#include "lora/adapter.h"

/* Reads r (positive integer), lora_alpha (number), use_rslora (bool,
 * optional), gate_up_order ("gate_up" or "interleaved", optional) and the
 * per-module rules (rank_pattern, alpha_pattern, layers_to_transform,
 * layers_pattern: lora/adapter_rules.h) from obj into p. A missing or bad
 * r or lora_alpha is LS_ADAPTER_CONFIG_INVALID naming the key;
 * require_alpha false lets an inline config omit lora_alpha (scale 1).
 * Keys that make the factors mean something this server does not compute
 * (use_dora, lora_bias, a base-modifying init_lora_weights, LoRA
 * variants, a peft_type other than LORA) are refused, each with its reason. */
ls_status ls_adapter_config_parse(const json_t *obj, bool require_alpha, ls_adapter_params *p, ls_error *err);

/* Same, from the text of an adapter_config.json file: a bad string,
 * array or object value is named by its kind, never quoted. */
ls_status ls_adapter_config_parse_text(const char *text, ls_adapter_params *p, ls_error *err);

/* Parameters as text, NULL where absent: a query string's or a
 * safetensors __metadata__'s values. */
typedef struct {
    const char *lora_alpha, *use_rslora, *format, *r, *scale, *gate_up_order;
    /* NULL: the values are the client's (a query), and a bad one is
     * quoted in the error. Else where they come from in a file ("the
     * file's __metadata__"), named instead: an error never shows a
     * file's bytes. */
    const char *where;
} ls_adapter_text_params;

/* The parameters a safetensors file's __metadata__ carries, named as
 * coming from where ("the file's __metadata__"). */
ls_adapter_text_params ls_adapter_text_params_meta(const ls_tensor_set *t, const char *where);

/* Sets in p each parameter t carries (and its has_ flag). A bad value is
 * LS_INVALID_REQUEST (LS_ADAPTER_CONFIG_INVALID for r and the rules)
 * naming the key. */
ls_status ls_adapter_params_from_text(const ls_adapter_text_params *t, ls_adapter_params *p, ls_error *err);

/* The per-module rules a safetensors __metadata__ holds (rank_pattern,
 * alpha_pattern, layers_to_transform, layers_pattern: JSON text each, as
 * adapter_config.json writes them) into p->peft, named as coming from
 * where. A bad one is LS_ADAPTER_CONFIG_INVALID naming the key. */
ls_status ls_adapter_params_rules_from_meta(const ls_tensor_set *t, const char *where, ls_adapter_params *p,
                                            ls_error *err);

/* own with every parameter given states put over it: a whole config
 * (given->whole_config: r, lora_alpha and use_rslora together, an absent
 * alpha meaning none), then format unless AUTO, r unless 0, lora_alpha,
 * use_rslora, scale, gate_up_order and the rules (peft) when given's has_ flags say so; strict is always
 * given's (a file cannot ask for it). */
ls_adapter_params ls_adapter_params_merge(const ls_adapter_params *own, const ls_adapter_params *given);

#endif
