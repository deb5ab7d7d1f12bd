/* lora/token_names: each distinct name once in order of first use, an
 * index per token (-1 = base), copies or borrowed strings, a hash that
 * grows past many names, reuse after a reset, and fill. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "lora/token_names.h"

static void test_first_use_order(void **state) {
    (void)state;
    const char *tokens[] = {"b", "a", NULL, "b", "c", "a", NULL};
    ls_token_names tn;
    ls_token_names_init(&tn, false);
    assert_null(tn.of_token);
    assert_true(ls_token_names_any_base(&tn)); /* no token names one */
    for (int t = 0; t < 7; t++)
        assert_true(ls_token_names_push(&tn, tokens[t] ? ls_token_names_index(&tn, tokens[t]) : -1));
    assert_int_equal(tn.T, 7);
    assert_int_equal(tn.n, 3);
    assert_string_equal(tn.names[0], "b");
    assert_string_equal(tn.names[1], "a");
    assert_string_equal(tn.names[2], "c");
    const int want[] = {0, 1, -1, 0, 2, 1, -1};
    assert_memory_equal(tn.of_token, want, sizeof want);
    assert_int_equal(tn.name_bytes, 6);
    assert_true(ls_token_names_any_base(&tn));
    ls_token_names_free(&tn);
    assert_int_equal(tn.n, 0);
    assert_null(tn.of_token);
}

/* A copying table keeps its own strings; a borrowing one points at the
 * caller's. */
static void test_copy_and_borrow(void **state) {
    (void)state;
    char name[8] = "tenant";
    ls_token_names copy, borrow;
    ls_token_names_init(&copy, false);
    ls_token_names_init(&borrow, true);
    assert_int_equal(ls_token_names_index(&copy, name), 0);
    assert_int_equal(ls_token_names_index(&borrow, name), 0);
    assert_ptr_not_equal(copy.names[0], name);
    assert_ptr_equal(borrow.names[0], name);
    name[0] = 'T';
    assert_string_equal(copy.names[0], "tenant");
    assert_int_equal(ls_token_names_index(&copy, "tenant"), 0);
    ls_token_names_free(&copy);
    ls_token_names_free(&borrow);
}

/* Thousands of names, interleaved: every repeat finds its index (the
 * hash grows and rehashes on the way). */
static void test_many_names(void **state) {
    (void)state;
    enum { N = 3000 };
    static char names[N][16];
    ls_token_names tn;
    ls_token_names_init(&tn, false);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "adapter-%d", i);
        assert_int_equal(ls_token_names_index(&tn, names[i]), i);
    }
    for (int round = 0; round < 2; round++)
        for (int i = N - 1; i >= 0; i--) assert_int_equal(ls_token_names_index(&tn, names[i]), i);
    assert_int_equal(tn.n, N);
    ls_token_names_free(&tn);
}

/* A reset table starts again from index 0 with its buffers kept, as the
 * batcher reuses its merged one. */
static void test_reset_reuses(void **state) {
    (void)state;
    ls_token_names tn;
    ls_token_names_init(&tn, true);
    assert_true(ls_token_names_push(&tn, ls_token_names_index(&tn, "x")));
    assert_true(ls_token_names_push(&tn, ls_token_names_index(&tn, "y")));
    const int *buf = tn.of_token;
    ls_token_names_reset(&tn);
    assert_int_equal(tn.n, 0);
    assert_int_equal(tn.T, 0);
    assert_int_equal(tn.name_bytes, 0);
    assert_int_equal(ls_token_names_index(&tn, "y"), 0); /* x is gone from the hash too */
    assert_true(ls_token_names_push(&tn, 0));
    assert_ptr_equal(tn.of_token, buf);
    assert_false(ls_token_names_any_base(&tn));
    ls_token_names_free(&tn);
}

static void test_fill(void **state) {
    (void)state;
    ls_token_names tn;
    ls_token_names_init(&tn, false);
    assert_true(ls_token_names_fill(&tn, "one", 5));
    assert_int_equal(tn.T, 5);
    assert_int_equal(tn.n, 1);
    assert_string_equal(tn.names[0], "one");
    for (int t = 0; t < 5; t++) assert_int_equal(tn.of_token[t], 0);
    assert_false(ls_token_names_any_base(&tn));
    ls_token_names_free(&tn);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_use_order), cmocka_unit_test(test_copy_and_borrow),
        cmocka_unit_test(test_many_names),      cmocka_unit_test(test_reset_reuses),
        cmocka_unit_test(test_fill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
