/* Names of the layouts, for flags, metadata and responses. */
#include "common/dims.h"

#include <string.h>

const char *ls_w13_layout_name(ls_w13_layout l) {
    return l == LS_W13_CONTIGUOUS ? "contiguous" : "interleaved";
}

bool ls_w13_layout_parse(const char *s, ls_w13_layout *out) {
    if (!s) return false;
    if (!strcmp(s, "interleaved")) *out = LS_W13_INTERLEAVED;
    else if (!strcmp(s, "contiguous")) *out = LS_W13_CONTIGUOUS;
    else return false;
    return true;
}

const char *ls_lora_layout_name(ls_lora_layout l) {
    return l == LS_LORA_PER_EXPERT ? "per-expert" : "shared";
}

bool ls_lora_layout_parse(const char *s, ls_lora_layout *out) {
    if (!s) return false;
    if (!strcmp(s, "shared")) *out = LS_LORA_SHARED;
    else if (!strcmp(s, "per-expert") || !strcmp(s, "per_expert")) *out = LS_LORA_PER_EXPERT;
    else return false;
    return true;
}
