/* The token plan (gpu/token_plan.h): tokens grouped by slot in ascending
 * slot order, each slot's in token order, base-only tokens last; the
 * facts the backends read (first rows, adapted count, distinct slots, the
 * lone slot, identity); and that ls_backend_forward hands every backend
 * that plan, made once above it (a recording test double of the backend
 * table, as tests/util/pool_fixture.c's fake). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/text.h"
#include "gpu/backend_impl.h"
#include "gpu/token_plan.h"

/* What the plan must be, by a route of its own: for each slot in turn,
 * then for the base, every token of it in token order. */
static void expect_plan(const ls_token_plan *p, int S, int T, const int *slot_of_token) {
    int row = 0, n_slots = 0, last = -1;
    assert_int_equal(p->T, T);
    assert_ptr_equal(p->slot_of_token, slot_of_token);
    for (int b = 0; b <= S; b++) {
        const int want = b < S ? b : -1;
        assert_int_equal(p->start[b], row);
        int count = 0;
        for (int t = 0; t < T; t++)
            if ((slot_of_token ? slot_of_token[t] : -1) == want) {
                assert_int_equal(p->order[row], t);
                row++, count++;
            }
        if (b < S && count) n_slots++, last = b;
    }
    assert_int_equal(p->start[S + 1], T);
    assert_int_equal(p->n_lora, p->start[S]);
    assert_int_equal(p->n_slots, n_slots);
    assert_int_equal(p->single_slot, n_slots == 1 ? last : -1);
    bool identity = true;
    for (int r = 0; r < T; r++) identity = identity && p->order[r] == r;
    assert_int_equal(p->identity, identity);
}

static void test_groups_by_slot_base_last(void **state) {
    (void)state;
    ls_token_plan p;
    assert_true(ls_token_plan_init(&p, 4, 8));
    const int slots[8] = {-1, 2, 0, 2, -1, 3, 0, 2};
    ls_token_plan_build(&p, 8, slots);
    const int order[8] = {2, 6, 1, 3, 7, 5, 0, 4};
    const int start[6] = {0, 2, 2, 5, 6, 8};
    assert_memory_equal(p.order, order, sizeof order);
    assert_memory_equal(p.start, start, sizeof start);
    assert_int_equal(p.n_lora, 6);
    assert_int_equal(p.n_slots, 3);
    assert_int_equal(p.single_slot, -1);
    assert_false(p.identity);
    expect_plan(&p, 4, 8, slots);
    ls_token_plan_free(&p);
}

/* No slots (NULL), one slot, adapted tokens before base ones: each is
 * already in plan order. */
static void test_identity_and_single_slot(void **state) {
    (void)state;
    ls_token_plan p;
    assert_true(ls_token_plan_init(&p, 3, 5));
    ls_token_plan_build(&p, 5, NULL);
    expect_plan(&p, 3, 5, NULL);
    assert_true(p.identity);
    assert_int_equal(p.n_lora, 0);
    const int one[5] = {1, 1, 1, 1, 1};
    ls_token_plan_build(&p, 5, one);
    expect_plan(&p, 3, 5, one);
    assert_true(p.identity);
    assert_int_equal(p.single_slot, 1);
    const int lora_first[4] = {0, 2, -1, -1};
    ls_token_plan_build(&p, 4, lora_first);
    expect_plan(&p, 3, 4, lora_first);
    assert_true(p.identity);
    const int base_first[2] = {-1, 0};
    ls_token_plan_build(&p, 2, base_first);
    expect_plan(&p, 3, 2, base_first);
    assert_false(p.identity);
    assert_int_equal(p.single_slot, 0);
    ls_token_plan_build(&p, 0, base_first);
    expect_plan(&p, 3, 0, base_first);
    ls_token_plan_free(&p);
}

static void test_random_plans(void **state) {
    (void)state;
    uint64_t seed = 11;
    for (int round = 0; round < 200; round++) {
        const int S = 1 + (int)(ls_splitmix64(&seed) % 9), T = 1 + (int)(ls_splitmix64(&seed) % 64);
        ls_token_plan p;
        assert_true(ls_token_plan_init(&p, S, T));
        int slots[64];
        for (int t = 0; t < T; t++) slots[t] = (int)(ls_splitmix64(&seed) % (uint64_t)(S + 1)) - 1;
        ls_token_plan_build(&p, T, slots);
        expect_plan(&p, S, T, slots);
        ls_token_plan_free(&p);
    }
}

/* ---- the plan a backend is handed ---------------------------------------- */

typedef struct {
    int calls;
    int order[16], start[6], T, n_lora;
} rec;

static rec seen;

static void rec_free(ls_backend *be) { be->ctx = NULL; }
static ls_status rec_forward(ls_backend *be, int layer, const float *x, const float *gammas,
                             const ls_token_plan *plan, float *y, ls_error *err) {
    (void)be, (void)layer, (void)x, (void)gammas, (void)y, (void)err;
    seen.calls++;
    seen.T = plan->T;
    seen.n_lora = plan->n_lora;
    memcpy(seen.order, plan->order, (size_t)plan->T * sizeof(int));
    memcpy(seen.start, plan->start, sizeof seen.start);
    return LS_OK;
}
static const ls_backend_ops rec_ops = {.name = "recording", .free = rec_free, .forward = rec_forward};

static void test_forward_hands_the_plan(void **state) {
    (void)state;
    ls_backend_config cfg = {.dims = {.n = 1, .H = 2, .F = 2, .L = 1},
                             .pool = {.slots = 4, .max_rank = 2, .max_tokens = 16},
                             .dtype = LS_DTYPE_F32};
    ls_backend *be;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_backend_new(&rec_ops, &cfg, &be, &err), LS_OK);
    be->uploaded[0] = true;
    const int slots[5] = {3, -1, 1, 3, -1};
    float x[10] = {0}, y[10];
    memset(&seen, 0, sizeof seen);
    assert_int_equal(ls_backend_forward(be, 0, 5, x, NULL, slots, y, &err), LS_OK);
    assert_int_equal(seen.calls, 1);
    assert_int_equal(seen.T, 5);
    assert_int_equal(seen.n_lora, 3);
    const int order[5] = {2, 0, 3, 1, 4}, start[6] = {0, 0, 1, 1, 3, 5};
    assert_memory_equal(seen.order, order, sizeof order);
    assert_memory_equal(seen.start, start, sizeof start);
    /* A rejected call reaches no backend. */
    const int bad[1] = {4};
    assert_int_equal(ls_backend_forward(be, 0, 1, x, NULL, bad, y, &err), LS_INTERNAL);
    assert_int_equal(seen.calls, 1);
    ls_backend_free(be);
    ls_error_free(&err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_groups_by_slot_base_last),
        cmocka_unit_test(test_identity_and_single_slot),
        cmocka_unit_test(test_random_plans),
        cmocka_unit_test(test_forward_hands_the_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
