/* adapter_config.json (PEFT) and the inline "config" object into
 * ls_adapter_params. */
#ifndef LS_API_ADAPTER_CONFIG_H
#define LS_API_ADAPTER_CONFIG_H

#include <jansson.h>

#include "common/error.h"
#include "lora/adapter.h"

/* Reads r (positive integer), lora_alpha (number), use_rslora (bool,
 * optional) from obj into p. A missing or bad r or lora_alpha is
 * LS_ADAPTER_CONFIG_INVALID naming the key; require_alpha false lets an
 * inline config omit lora_alpha (scale 1). */
ls_status ls_adapter_config_parse(const json_t *obj, bool require_alpha, ls_adapter_params *p, ls_error *err);

/* Same, from the text of an adapter_config.json. */
ls_status ls_adapter_config_parse_text(const char *text, ls_adapter_params *p, ls_error *err);

#endif
