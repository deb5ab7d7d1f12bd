/* The "did you mean" helper of common/text.c: edit distances (swaps count
 * one), the cap, and which candidate a mistyped name is offered. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/text.h"

static void test_distance(void **state) {
    (void)state;
    assert_int_equal(ls_text_distance("tenant_a", "tenant-a", 5), 1);
    assert_int_equal(ls_text_distance("gamma", "gammas", 5), 1);
    assert_int_equal(ls_text_distance("slost", "slots", 5), 1); /* a swap is one edit */
    assert_int_equal(ls_text_distance("", "abc", 5), 3);
    assert_int_equal(ls_text_distance("kitten", "sitting", 5), 3);
    assert_int_equal(ls_text_distance("kitten", "sitting", 2), 3); /* past the cap: cap + 1 */
    assert_int_equal(ls_text_distance("same", "same", 0), 0);
}

static const char *nearest(const char *word, const char *const *cands, char *buf, size_t len) {
    ls_text_near n;
    ls_text_near_init(&n, word);
    for (int i = 0; cands[i]; i++) ls_text_near_offer(&n, cands[i]);
    return ls_text_near_clause(&n, "did you mean ", "?", buf, len);
}

static void test_nearest(void **state) {
    (void)state;
    const char *const flags[] = {"port", "slots", "max-rank", "host-cache", "hidden", NULL};
    char buf[64];
    assert_string_equal(nearest("max_rank", flags, buf, sizeof buf), "did you mean max-rank?");
    assert_string_equal(nearest("slot", flags, buf, sizeof buf), "did you mean slots?");
    assert_string_equal(nearest("hostcache", flags, buf, sizeof buf), "did you mean host-cache?");
    /* Too far, or a short word two edits away: nothing offered. */
    assert_string_equal(nearest("threads", flags, buf, sizeof buf), "");
    assert_string_equal(nearest("pt", flags, buf, sizeof buf), "");
    /* The word itself is never its own suggestion. */
    const char *const names[] = {"tenant-a", "tenant-b", NULL};
    assert_string_equal(nearest("tenant_a", names, buf, sizeof buf), "did you mean tenant-a?");
    assert_string_equal(nearest("tenant-a", names, buf, sizeof buf), "did you mean tenant-b?");
}

/* Bytes JSON could not carry become '?', whole characters stay; a cut
 * never ends inside a character. */
static void test_utf8(void **state) {
    (void)state;
    char s[64];
    snprintf(s, sizeof s, "ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    ls_text_utf8_repair(s);
    assert_string_equal(s, "ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    snprintf(s, sizeof s, "cut \xc3"); /* a sequence cut short */
    ls_text_utf8_repair(s);
    assert_string_equal(s, "cut ?");
    snprintf(s, sizeof s, "\xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80 \x80"); /* overlong, surrogate, > U+10FFFF, lone */
    ls_text_utf8_repair(s);
    assert_string_equal(s, "?? ??? ???? ?");
    const char *e = "a\xc3\xa9" "b"; /* a, e-acute (2 bytes), b */
    assert_int_equal(ls_text_utf8_cut(e, 2), 1);
    assert_int_equal(ls_text_utf8_cut(e, 3), 3);
    assert_int_equal(ls_text_utf8_cut(e, 1), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_distance), cmocka_unit_test(test_nearest),
                                       cmocka_unit_test(test_utf8)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
