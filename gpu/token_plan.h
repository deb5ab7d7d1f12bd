/* The token plan: how one forward's tokens are grouped by slot, made once
 * above the backends (ls_backend_forward, gpu/backend.c) and read by each
 * of them, so every backend runs its LoRA on the same contiguous rows.
 *
 * Rows are the tokens in plan order: slot 0's tokens first, then slot
 * 1's, ... slot S-1's, each slot's in token order, and the base-only
 * tokens (slot -1) last. The adapted rows are therefore 0..n_lora-1,
 * slot s holds rows [start[s], start[s + 1]), and the base rows are
 * [n_lora, T) (start[S] == n_lora, start[S + 1] == T). The order changes
 * no number: every backend gives a token the same bits wherever its row
 * is (tests/unit/test_batch_invariance.c checks the CPU's). */
#ifndef LS_GPU_TOKEN_PLAN_H
#define LS_GPU_TOKEN_PLAN_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int T;                    /* tokens of this forward */
    const int *slot_of_token; /* the caller's [T] (NULL: every token base only), borrowed for the call */
    int *order;               /* [max_tokens] order[row] = the token at that row */
    int *start;               /* [S + 2] first row of slot s; start[S] = n_lora, start[S + 1] = T */
    int n_lora;               /* tokens with a slot */
    int n_slots;              /* distinct slots among them */
    int single_slot;          /* that slot when n_slots == 1, else -1 */
    bool identity;            /* order[row] == row for every row: nothing to gather or scatter */
    int S, max_tokens;        /* the room, fixed at init */
    int *cursor;              /* [S + 1] build's scratch */
} ls_token_plan;

/* Allocates the room for plans of up to max_tokens tokens over S slots.
 * Returns false when out of memory (*p then needs no free, but
 * ls_token_plan_free is safe on it). */
bool ls_token_plan_init(ls_token_plan *p, int S, int max_tokens);
/* Frees what init allocated; a zeroed plan is a no-op. */
void ls_token_plan_free(ls_token_plan *p);
/* Groups T tokens (0 <= T <= max_tokens; every slot_of_token[t] in
 * -1..S-1, as ls_backend_check_forward makes sure): a stable counting
 * sort, O(T + S). slot_of_token is borrowed until the next build. */
void ls_token_plan_build(ls_token_plan *p, int T, const int *slot_of_token);

#ifdef __cplusplus
}
#endif

#endif
