/* Names of the layouts, for flags, metadata and responses, and the map
 * between the checkpoint's layer numbers and the layers served. */
#include "common/dims.h"

#include <stdio.h>
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

/* Appends text to buf at *off, keeping it NUL-terminated; false (and
 * the buffer ending in "...") once it does not fit. */
static bool ls_dims_append(char *buf, size_t len, size_t *off, const char *text) {
    size_t n = strlen(text);
    if (*off + n + 1 > len) {
        if (len > 4) snprintf(buf + (*off + 4 <= len ? *off : len - 4), 4, "...");
        return false;
    }
    memcpy(buf + *off, text, n + 1);
    *off += n;
    return true;
}

static const char *ls_dims_ordinal(int k) { return k == 2 ? "nd" : k == 3 ? "rd" : "th"; }

const char *ls_dims_layers_str(const ls_dims *d, char *buf, size_t len) {
    if (!len) return buf;
    buf[0] = '\0';
    const int L = d->L;
    if (L <= 0) return buf;
    const int first = ls_dims_layer_id(d, 0), last = ls_dims_layer_id(d, L - 1);
    /* An even step (every layer, every k-th) reads best as its rule. */
    const int step = L > 1 ? ls_dims_layer_id(d, 1) - first : 1;
    bool even = true;
    for (int i = 1; i < L && even; i++) even = ls_dims_layer_id(d, i) - ls_dims_layer_id(d, i - 1) == step;
    if (L == 1) snprintf(buf, len, "%d", first);
    else if (even && step == 1) snprintf(buf, len, "%d-%d", first, last);
    else if (even && L == 2) snprintf(buf, len, "%d, %d", first, last);
    else if (even && L == 3) snprintf(buf, len, "%d, %d, %d", first, first + step, last);
    else if (even)
        snprintf(buf, len, "%d, %d, %d, ..., %d (every %d%s)", first, first + step, first + 2 * step, last, step,
                 ls_dims_ordinal(step));
    if (buf[0]) return buf;
    /* Otherwise runs of consecutive layers, cut when the buffer is full. */
    size_t off = 0;
    for (int i = 0; i < L;) {
        int j = i;
        while (j + 1 < L && ls_dims_layer_id(d, j + 1) == ls_dims_layer_id(d, j) + 1) j++;
        char run[48];
        const int a = ls_dims_layer_id(d, i), b = ls_dims_layer_id(d, j);
        if (j == i) snprintf(run, sizeof run, "%s%d", i ? ", " : "", a);
        else snprintf(run, sizeof run, j == i + 1 ? "%s%d, %d" : "%s%d-%d", i ? ", " : "", a, b);
        if (!ls_dims_append(buf, len, &off, run)) break;
        i = j + 1;
    }
    return buf;
}
