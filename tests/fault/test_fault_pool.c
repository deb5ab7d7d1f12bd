/* Allocation failures in the pool (fault_cases.h): every allocation of
 * ls_pool_load (a new name, pinned, a replace, a load that evicts; with
 * and without a state directory), ls_pool_delete, ls_pool_forward over a
 * mix of adapters (one read back from the state directory or from its
 * file and made resident again, evicting another) and ls_pool_restore,
 * failed in turn, N = 1, 2, ... each (fault_fixture.h says what every
 * attempt must satisfy). */
#include "tests/fault/fault_cases.h"

/* Sweeps every spec whose operation is first..last. */
static void run(fc_op first, fc_op last) {
    for (size_t i = 0; i < fc_n_specs; i++) {
        if (fc_specs[i].op < first || fc_specs[i].op > last) continue;
        fx_case c = fc_case(&fc_specs[i]);
        fx_sweep(&c, FX_ALLOC);
    }
}

static void test_load_new(void **state) {
    (void)state;
    run(FC_LOAD_NEW, FC_LOAD_PINNED);
}

static void test_load_replace(void **state) {
    (void)state;
    run(FC_LOAD_REPLACE, FC_REPLACE_PINNED);
}

static void test_load_evict(void **state) {
    (void)state;
    run(FC_LOAD_EVICT, FC_LOAD_EVICT);
}

static void test_delete(void **state) {
    (void)state;
    run(FC_DELETE, FC_DELETE);
}

static void test_forward(void **state) {
    (void)state;
    run(FC_FORWARD, FC_FORWARD);
}

static void test_restore(void **state) {
    (void)state;
    run(FC_RESTORE, FC_RESTORE);
}

int main(void) {
    fx_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_new), cmocka_unit_test(test_load_replace), cmocka_unit_test(test_load_evict),
        cmocka_unit_test(test_delete),   cmocka_unit_test(test_forward),      cmocka_unit_test(test_restore),
    };
    return cmocka_run_group_tests(tests, fc_group_setup, fc_group_teardown);
}
