/* What the /forward harnesses check alike: an accepted request's buffers
 * are whole allocations, and its adapter table keeps its rule. Header-only,
 * as fuzz_common.h. */
#ifndef LS_TESTS_FUZZ_FORWARD_COMMON_H
#define LS_TESTS_FUZZ_FORWARD_COMMON_H

#include <sanitizer/allocator_interface.h>
#include <string.h>

#include "api/forward.h"
#include "fuzz_common.h"

/* p holds at least n bytes of one allocation. */
static inline void check_alloc(const void *p, size_t n) {
    FUZZ_CHECK(p && __sanitizer_get_ownership(p) && __sanitizer_get_allocated_size(p) >= n);
}

/* Token t's adapter name, NULL for the base model. */
static inline const char *token_name(const ls_forward_req *req, int t) {
    const ls_token_names *tn = &req->names;
    return tn->of_token && tn->of_token[t] >= 0 ? tn->names[tn->of_token[t]] : NULL;
}

/* The table's rule: valid names, each once, each first named by a token
 * in the order of the table (so every one is named). */
static inline void check_names(const ls_forward_req *req) {
    const ls_token_names *tn = &req->names;
    FUZZ_CHECK(tn->n >= 0 && tn->n <= req->T && (tn->n == 0 || tn->of_token));
    if (!tn->of_token) return;
    FUZZ_CHECK(tn->T == req->T);
    check_alloc(tn->of_token, (size_t)req->T * sizeof *tn->of_token);
    for (int k = 0; k < tn->n; k++) {
        FUZZ_CHECK(ls_adapter_pool_name_valid(tn->names[k]));
        for (int j = 0; j < k; j++) FUZZ_CHECK(strcmp(tn->names[j], tn->names[k]));
    }
    int seen = 0;
    for (int t = 0; t < req->T; t++) {
        const int k = tn->of_token[t];
        FUZZ_CHECK(k >= -1 && k < tn->n && k <= seen);
        if (k == seen) seen++;
    }
    FUZZ_CHECK(seen == tn->n);
}

#endif
