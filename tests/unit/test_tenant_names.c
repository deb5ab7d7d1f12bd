/* The name mapping between callers and the pool (server/tenant_names.c):
 * a scoped caller's bare names become TENANT/NAME and only its own come
 * back out; an admin's pool names pass as they are; paths stay in the
 * tenant's directory; an error body loses only the caller's prefix. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/tenant.h"

static const ls_principal acme = {.role = LS_ROLE_TENANT, .tenant = "acme", .max_adapters = -1};
static const ls_principal viewer = {.role = LS_ROLE_VIEWER, .tenant = "acme", .max_adapters = -1};
static const ls_principal admin = {.role = LS_ROLE_ADMIN, .max_adapters = -1};

static void test_names_in(void **state) {
    (void)state;
    char out[130];
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_tenant_name_in(&acme, "a", out, sizeof out, &err), LS_OK);
    assert_string_equal(out, "acme/a");
    assert_int_equal(ls_tenant_name_in(&viewer, "a.b-c_d", out, sizeof out, &err), LS_OK);
    assert_string_equal(out, "acme/a.b-c_d");
    assert_int_equal(ls_tenant_name_in(&admin, "bob/a", out, sizeof out, &err), LS_OK);
    assert_string_equal(out, "bob/a");
    assert_int_equal(ls_tenant_name_in(&admin, "plain", out, sizeof out, &err), LS_OK);
    assert_string_equal(out, "plain");
    /* A tenant never reaches a pool name; 123 bytes of name and "acme/" is 128. */
    const char *bad_tenant[] = {"bob/a", "", ".a", "a b", NULL};
    for (int i = 0; bad_tenant[i]; i++) {
        ls_error_clear(&err);
        assert_int_equal(ls_tenant_name_in(&acme, bad_tenant[i], out, sizeof out, &err), LS_INVALID_REQUEST);
    }
    char longest[130];
    memset(longest, 'x', 123);
    longest[123] = '\0';
    assert_int_equal(ls_tenant_name_in(&acme, longest, out, sizeof out, &err), LS_OK);
    longest[123] = 'x';
    longest[124] = '\0';
    ls_error_clear(&err);
    assert_int_equal(ls_tenant_name_in(&acme, longest, out, sizeof out, &err), LS_INVALID_REQUEST);
    const char *bad_admin[] = {"a/b/c", "A/b", "/b", "a/", "a/.b", "-a/b", NULL};
    for (int i = 0; bad_admin[i]; i++) {
        ls_error_clear(&err);
        assert_int_equal(ls_tenant_name_in(&admin, bad_admin[i], out, sizeof out, &err), LS_INVALID_REQUEST);
    }
    ls_error_free(&err);
}

static void test_names_out(void **state) {
    (void)state;
    assert_string_equal(ls_tenant_name_out(&acme, "acme/a"), "a");
    assert_null(ls_tenant_name_out(&acme, "acmex/a"));
    assert_null(ls_tenant_name_out(&acme, "acm/a"));
    assert_null(ls_tenant_name_out(&acme, "bob/a"));
    assert_null(ls_tenant_name_out(&acme, "a"));
    assert_string_equal(ls_tenant_name_out(&admin, "bob/a"), "bob/a");
    char t[40];
    ls_tenant_of("bob/a", t, sizeof t);
    assert_string_equal(t, "bob");
    ls_tenant_of("plain", t, sizeof t);
    assert_string_equal(t, "");
}

static void test_paths_and_forward(void **state) {
    (void)state;
    ls_error err;
    ls_error_init(&err);
    char path[4096] = "dir/x.safetensors";
    assert_int_equal(ls_tenant_path_in(&acme, path, sizeof path, &err), LS_OK);
    assert_string_equal(path, "acme/dir/x.safetensors");
    const char *bad[] = {"../bob/x", "a/../../bob", "/abs", "..", NULL};
    for (int i = 0; bad[i]; i++) {
        snprintf(path, sizeof path, "%s", bad[i]);
        ls_error_clear(&err);
        assert_int_equal(ls_tenant_path_in(&acme, path, sizeof path, &err), LS_INVALID_REQUEST);
        assert_string_equal(path, bad[i]);
    }
    snprintf(path, sizeof path, "/abs");
    assert_int_equal(ls_tenant_path_in(&admin, path, sizeof path, &err), LS_OK);
    assert_string_equal(path, "/abs");
    /* A bad name among the tokens changes none of them; good ones keep
     * each token's index (a, base, b, a). */
    ls_token_names tn;
    ls_token_names_init(&tn, false);
    const int of[4] = {0, -1, 1, 0};
    assert_int_equal(ls_token_names_index(&tn, "a"), 0);
    assert_int_equal(ls_token_names_index(&tn, "b/c"), 1);
    for (int t = 0; t < 4; t++) assert_true(ls_token_names_push(&tn, of[t]));
    ls_error_clear(&err);
    assert_int_equal(ls_tenant_forward_names(&acme, &tn, &err), LS_INVALID_REQUEST);
    assert_string_equal(tn.names[0], "a");
    assert_string_equal(tn.names[1], "b/c");
    ls_token_names_free(&tn);
    ls_token_names_init(&tn, false);
    assert_int_equal(ls_token_names_index(&tn, "a"), 0);
    assert_int_equal(ls_token_names_index(&tn, "b"), 1);
    for (int t = 0; t < 4; t++) assert_true(ls_token_names_push(&tn, of[t]));
    ls_error_clear(&err);
    assert_int_equal(ls_tenant_forward_names(&acme, &tn, &err), LS_OK);
    assert_int_equal(tn.n, 2);
    assert_int_equal(tn.T, 4);
    assert_string_equal(tn.names[0], "acme/a");
    assert_string_equal(tn.names[1], "acme/b");
    for (int t = 0; t < 4; t++) assert_int_equal(tn.of_token[t], of[t]);
    /* An admin's names pass as they are when they are pool names. */
    assert_int_equal(ls_tenant_forward_names(&admin, &tn, &err), LS_OK);
    assert_string_equal(tn.names[0], "acme/a");
    ls_token_names_free(&tn);
    ls_error_free(&err);
}

static void test_strip_body(void **state) {
    (void)state;
    char body[] = "{\"message\":\"adapter 'acme/a' is not registered; did you mean 'acme/b'?\",\"x\":\"xacme/c\"}";
    size_t n = ls_tenant_strip_body(&acme, body, strlen(body));
    body[n] = '\0';
    assert_string_equal(body, "{\"message\":\"adapter 'a' is not registered; did you mean 'b'?\",\"x\":\"xacme/c\"}");
    char same[] = "adapter 'acme/a'";
    assert_int_equal(ls_tenant_strip_body(&admin, same, strlen(same)), strlen(same));
    /* A reply before authorization has a caller of no tenant: its "/" stays. */
    const ls_principal nobody = {0};
    char route[] = "no route GET /nope; the routes are /health, /ready";
    assert_int_equal(ls_tenant_strip_body(&nobody, route, strlen(route)), strlen(route));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_in),
        cmocka_unit_test(test_names_out),
        cmocka_unit_test(test_paths_and_forward),
        cmocka_unit_test(test_strip_body),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
