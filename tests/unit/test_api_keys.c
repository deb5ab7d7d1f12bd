/* The --api-keys parser (config/api_keys.c): a good file gives every
 * entry's fields; each kind of bad file is refused whole with a reason
 * naming the entry and the key, never echoing a key's text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config/api_keys.h"

#define H1 "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" /* sha256("test") */
#define H2 "2CF24DBA5FB0A30E26E83B2AC5B9E29E1B161E5C1FA7425E73043362938B9824" /* sha256("hello"), upper case */

static void test_good_file(void **state) {
    (void)state;
    const char *t = "{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"acme\", \"role\": \"tenant\", "
                    "\"max_adapters\": 10, \"rate\": 2.5, \"max_pins\": 3},"
                    "{\"sha256\": \"" H2 "\", \"role\": \"admin\"},"
                    "{\"sha256\": \"" H1 "0\", \"tenant\": \"x\", \"role\": \"viewer\"}]}";
    ls_api_keys k;
    char why[512];
    /* The third hash has 65 digits: refused. */
    assert_false(ls_api_keys_parse(t, strlen(t), &k, why, sizeof why));
    assert_non_null(strstr(why, "keys[2].sha256"));
    assert_null(k.keys);
    const char *good = "{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"acme\", \"role\": \"tenant\", "
                       "\"max_adapters\": 10, \"rate\": 2.5, \"max_pins\": 3},"
                       "{\"sha256\": \"" H2 "\", \"role\": \"admin\"},"
                       "{\"sha256\": \"" H2 "\"}]}";
    assert_false(ls_api_keys_parse(good, strlen(good), &k, why, sizeof why));
    assert_non_null(strstr(why, "keys[2]"));
    const char *ok = "{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"acme\", \"role\": \"tenant\", "
                     "\"max_adapters\": 10, \"rate\": 2.5, \"max_pins\": 3},"
                     "{\"sha256\": \"" H2 "\", \"role\": \"admin\"},"
                     "{\"sha256\": \"" H1 "\", \"tenant\": \"b-2\", \"role\": \"viewer\"}]}";
    assert_false(ls_api_keys_parse(ok, strlen(ok), &k, why, sizeof why));
    assert_non_null(strstr(why, "keys[2].sha256 is keys[0]'s too"));
    const char *fine = "{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"acme\", \"role\": \"tenant\", "
                       "\"max_adapters\": 10, \"rate\": 2.5, \"max_pins\": 3},"
                       "{\"sha256\": \"" H2 "\", \"role\": \"admin\"}]}";
    assert_true(ls_api_keys_parse(fine, strlen(fine), &k, why, sizeof why));
    assert_int_equal(k.n, 2);
    assert_string_equal(k.keys[0].tenant, "acme");
    assert_int_equal(k.keys[0].role, LS_ROLE_TENANT);
    assert_int_equal(k.keys[0].max_adapters, 10);
    assert_true(k.keys[0].rate == 2.5);
    assert_int_equal(k.keys[0].max_pins, 3);
    assert_string_equal(k.keys[0].id, "9f86d081884c");
    assert_int_equal(k.keys[0].sha256[31], 0x08);
    assert_int_equal(k.keys[1].role, LS_ROLE_ADMIN);
    assert_string_equal(k.keys[1].tenant, "");
    assert_int_equal(k.keys[1].max_adapters, -1);
    assert_true(k.keys[1].rate == 0);
    assert_int_equal(k.keys[1].max_pins, LS_API_KEYS_DEFAULT_PINS);
    assert_string_equal(k.keys[1].id, "2cf24dba5fb0");
    ls_api_keys_free(&k);
}

/* Each bad file and a piece its reason must carry. */
static void test_bad_files(void **state) {
    (void)state;
    static const struct {
        const char *text, *why;
    } cases[] = {
        {"", "not JSON"},
        {"[]", "must be a JSON object"},
        {"{\"key\": []}", "did you mean \"keys\""},
        {"{\"keys\": {}}", "must be an array"},
        {"{\"keys\": [1]}", "keys[0] must be an object"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"a\", \"rol\": \"tenant\"}]}", "did you mean \"role\""},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"a\"}]}", "keys[0] has no role"},
        {"{\"keys\": [{\"tenant\": \"a\", \"role\": \"tenant\"}]}", "keys[0] has no sha256"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"role\": \"tenant\"}]}", "has no tenant"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"role\": \"viewer\"}]}", "has no tenant"},
        {"{\"keys\": [{\"sha256\": \"my-secret\", \"tenant\": \"a\", \"role\": \"tenant\"}]}", "64 hex digits"},
        {"{\"keys\": [{\"sha256\": \"" "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a0g"
         "\", \"tenant\": \"a\", \"role\": \"tenant\"}]}",
         "64 hex digits"},
        {"{\"keys\": [{\"sha256\": 5, \"tenant\": \"a\", \"role\": \"tenant\"}]}", "keys[0].sha256 must be a string"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"a\", \"role\": \"owner\"}]}", "\"owner\" is not a role"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"Acme\", \"role\": \"tenant\"}]}", "keys[0].tenant must be"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"a/b\", \"role\": \"tenant\"}]}", "keys[0].tenant must be"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"-a\", \"role\": \"tenant\"}]}", "keys[0].tenant must be"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"\", \"role\": \"tenant\"}]}", "keys[0].tenant must be"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\", \"role\": \"tenant\"}]}",
         "keys[0].tenant must be"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"a\", \"role\": \"tenant\", \"max_adapters\": -1}]}",
         "keys[0].max_adapters must be an integer"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"a\", \"role\": \"tenant\", \"max_adapters\": 1.5}]}",
         "keys[0].max_adapters must be an integer"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"a\", \"role\": \"tenant\", \"rate\": 0}]}",
         "keys[0].rate must be"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"a\", \"role\": \"tenant\", \"rate\": \"5\"}]}",
         "keys[0].rate must be"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"tenant\": \"a\", \"role\": \"tenant\", \"max_pins\": 2000}]}",
         "keys[0].max_pins must be"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"sha256\": \"" H2 "\", \"role\": \"admin\"}]}", "not JSON"},
        {"{\"keys\": [{\"sha256\": \"" H1 "\", \"role\": \"admin\"}, {\"sha256\": \"" H1 "\", \"role\": \"admin\"}]}",
         "keys[1].sha256 is keys[0]'s too"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ls_api_keys k;
        char why[512];
        const bool ok = ls_api_keys_parse(cases[i].text, strlen(cases[i].text), &k, why, sizeof why);
        if (ok || !strstr(why, cases[i].why)) fail_msg("case %zu: %s: got \"%s\"", i, cases[i].text, why);
        assert_null(k.keys);
        assert_int_equal(k.n, 0);
        assert_null(strstr(why, "my-secret")); /* a key given as its text is never echoed */
    }
}

static void test_empty_list_and_names(void **state) {
    (void)state;
    ls_api_keys k;
    char why[256];
    assert_true(ls_api_keys_parse("{\"keys\": []}", 12, &k, why, sizeof why));
    assert_int_equal(k.n, 0);
    ls_api_keys_free(&k);
    assert_true(ls_tenant_name_valid("acme"));
    assert_true(ls_tenant_name_valid("0-a_b"));
    assert_false(ls_tenant_name_valid("_a"));
    assert_false(ls_tenant_name_valid("a.b"));
    assert_string_equal(ls_role_name(LS_ROLE_VIEWER), "viewer");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_file),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_empty_list_and_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
