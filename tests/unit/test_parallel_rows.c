/* gpu/parallel_rows.h: every row handled exactly once, in contiguous
 * ranges, for any row and thread count, the caller's thread included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "gpu/parallel_rows.h"

typedef struct {
    int *hits;
} hits_ctx;

/* Counts each row; the ranges of different threads never overlap, so
 * the plain increments do not race. */
static void count_rows(void *ctx, size_t r0, size_t r1) {
    hits_ctx *h = (hits_ctx *)ctx;
    for (size_t r = r0; r < r1; r++) h->hits[r]++;
}

static void test_every_row_once(void **state) {
    (void)state;
    const size_t rows_list[] = {0, 1, 2, 7, 8, 9, 1000};
    const int threads_list[] = {-1, 0, 1, 2, 3, 8, 64};
    for (size_t i = 0; i < sizeof rows_list / sizeof rows_list[0]; i++)
        for (size_t k = 0; k < sizeof threads_list / sizeof threads_list[0]; k++) {
            const size_t rows = rows_list[i];
            hits_ctx h = {calloc(rows + 1, sizeof(int))};
            assert_non_null(h.hits);
            ls_parallel_rows(rows, threads_list[k], count_rows, &h);
            for (size_t r = 0; r < rows; r++) assert_int_equal(h.hits[r], 1);
            assert_int_equal(h.hits[rows], 0);
            free(h.hits);
        }
}

static void test_threads_bounded(void **state) {
    (void)state;
    const int t = ls_parallel_rows_threads();
    assert_true(t >= 1 && t <= 8);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_row_once),
        cmocka_unit_test(test_threads_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
