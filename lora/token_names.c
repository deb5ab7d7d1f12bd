/* The table of a forward's adapter names and its per-token index
 * (token_names.h): names found through a small open-addressed hash, so
 * building it costs one hash a token, whatever the mix of names. */
#include "lora/token_names.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/text.h"

void ls_token_names_init(ls_token_names *tn, bool borrow) {
    memset(tn, 0, sizeof *tn);
    tn->borrow = borrow;
}

void ls_token_names_reset(ls_token_names *tn) {
    if (!tn->borrow)
        for (int k = 0; k < tn->n; k++) free((char *)tn->names[k]);
    if (tn->slot) memset(tn->slot, 0, (size_t)tn->slot_cap * sizeof *tn->slot);
    tn->T = tn->n = 0;
    tn->name_bytes = 0;
}

void ls_token_names_free(ls_token_names *tn) {
    ls_token_names_reset(tn);
    free(tn->names);
    free(tn->of_token);
    free(tn->slot);
    ls_token_names_init(tn, tn->borrow);
}

/* The hash slot of name: where it is, or the empty one it would take. */
static int ls_token_names_slot(const ls_token_names *tn, const char *name) {
    const unsigned mask = (unsigned)tn->slot_cap - 1;
    unsigned i = (unsigned)ls_fnv1a64(name) & mask;
    while (tn->slot[i] && strcmp(tn->names[tn->slot[i] - 1], name)) i = (i + 1) & mask;
    return (int)i;
}

/* Room for one more name: the names array and a hash kept under half full. */
static bool ls_token_names_grow(ls_token_names *tn) {
    if (tn->n == tn->names_cap) {
        int cap = tn->names_cap ? tn->names_cap * 2 : 8;
        const char **names = realloc(tn->names, (size_t)cap * sizeof *names);
        if (!names) return false;
        tn->names = names, tn->names_cap = cap;
    }
    if (2 * (tn->n + 1) <= tn->slot_cap) return true;
    int cap = tn->slot_cap ? tn->slot_cap * 2 : 16;
    int *slot = calloc((size_t)cap, sizeof *slot);
    if (!slot) return false;
    free(tn->slot);
    tn->slot = slot, tn->slot_cap = cap;
    for (int k = 0; k < tn->n; k++) tn->slot[ls_token_names_slot(tn, tn->names[k])] = k + 1;
    return true;
}

int ls_token_names_index(ls_token_names *tn, const char *name) {
    if (tn->slot_cap) {
        int i = ls_token_names_slot(tn, name);
        if (tn->slot[i]) return tn->slot[i] - 1;
    }
    if (!ls_token_names_grow(tn)) return -1;
    const char *kept = tn->borrow ? name : strdup(name);
    if (!kept) return -1;
    tn->names[tn->n] = kept;
    tn->slot[ls_token_names_slot(tn, name)] = tn->n + 1;
    tn->name_bytes += strlen(name) + 1;
    return tn->n++;
}

bool ls_token_names_push(ls_token_names *tn, int index) {
    if (tn->T == tn->tokens_cap) {
        int cap = tn->tokens_cap ? tn->tokens_cap * 2 : 64;
        int *of = realloc(tn->of_token, (size_t)cap * sizeof *of);
        if (!of) return false;
        tn->of_token = of, tn->tokens_cap = cap;
    }
    tn->of_token[tn->T++] = index;
    return true;
}

bool ls_token_names_fill(ls_token_names *tn, const char *name, int T) {
    if (T > tn->tokens_cap) {
        int *of = realloc(tn->of_token, (size_t)(T > 0 ? T : 1) * sizeof *of);
        if (!of) return false;
        tn->of_token = of, tn->tokens_cap = T;
    }
    if (!tn->of_token && !(tn->of_token = malloc(sizeof *tn->of_token))) return false;
    const int k = ls_token_names_index(tn, name);
    if (k < 0) return false;
    for (int t = 0; t < T; t++) tn->of_token[t] = k;
    tn->T = T;
    return true;
}

bool ls_token_names_any_base(const ls_token_names *tn) {
    if (!tn->of_token) return true;
    for (int t = 0; t < tn->T; t++)
        if (tn->of_token[t] < 0) return true;
    return false;
}
