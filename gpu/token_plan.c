/* The token plan (token_plan.h): a stable counting sort of a forward's
 * tokens by slot, base-only tokens last, with each slot's first row. */
#include "gpu/token_plan.h"

#include <stdlib.h>
#include <string.h>

bool ls_token_plan_init(ls_token_plan *p, int S, int max_tokens) {
    memset(p, 0, sizeof *p);
    p->S = S;
    p->max_tokens = max_tokens;
    p->order = malloc((size_t)(max_tokens > 0 ? max_tokens : 1) * sizeof *p->order);
    p->start = malloc((size_t)(S + 2) * sizeof *p->start);
    p->cursor = malloc((size_t)(S + 1) * sizeof *p->cursor);
    if (p->order && p->start && p->cursor) return true;
    ls_token_plan_free(p);
    return false;
}

void ls_token_plan_free(ls_token_plan *p) {
    free(p->order);
    free(p->start);
    free(p->cursor);
    p->order = p->start = p->cursor = NULL;
}

/* Bucket s for slot s, bucket S for base-only tokens: base rows last. */
static int ls_token_plan_bucket(const ls_token_plan *p, int t) {
    const int s = p->slot_of_token ? p->slot_of_token[t] : -1;
    return s < 0 ? p->S : s;
}

void ls_token_plan_build(ls_token_plan *p, int T, const int *slot_of_token) {
    const int S = p->S;
    int *start = p->start, *cursor = p->cursor;
    p->T = T;
    p->slot_of_token = slot_of_token;
    memset(start, 0, (size_t)(S + 2) * sizeof *start);
    for (int t = 0; t < T; t++) start[ls_token_plan_bucket(p, t) + 1]++;
    p->n_slots = 0;
    p->single_slot = -1;
    for (int b = 0; b <= S; b++) {
        if (b < S && start[b + 1] > 0) {
            p->n_slots++;
            p->single_slot = p->n_slots == 1 ? b : -1;
        }
        start[b + 1] += start[b]; /* the count of bucket b becomes the first row of bucket b + 1 */
        cursor[b] = start[b];
    }
    p->n_lora = start[S];
    p->identity = true;
    for (int t = 0; t < T; t++) {
        const int row = cursor[ls_token_plan_bucket(p, t)]++;
        p->order[row] = t;
        p->identity = p->identity && row == t;
    }
}
