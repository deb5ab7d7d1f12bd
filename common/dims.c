/* Names of the layouts, for flags, metadata and responses, and the map
 * between the checkpoint's layer numbers and the layers served. */
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

int ls_dims_layer_index(const ls_dims *d, long long id) {
    if (!d->layer_ids) return id >= 0 && id < d->L ? (int)id : -1;
    int lo = 0, hi = d->L - 1;
    while (lo <= hi) { /* ascending: a binary search */
        const int mid = lo + (hi - lo) / 2;
        if (d->layer_ids[mid] == id) return mid;
        if (d->layer_ids[mid] < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

int ls_dims_layer_id(const ls_dims *d, int index) {
    return d->layer_ids && index >= 0 && index < d->L ? d->layer_ids[index] : index;
}
