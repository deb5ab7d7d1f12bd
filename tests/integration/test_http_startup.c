/* Adapters loaded at start-up (--adapter NAME=PATH[,pinned], its
 * LORASINK_ADAPTERS twin and the config file's "adapters"): served with
 * the right factors before the server listens, pinned when asked; a bad
 * one stops start-up with exit 1 and its structured error; with a state
 * directory a restart keeps the restored version unless the file changed,
 * and a record damaged on disk does not let its name's versions go back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sha256.h"
#include "tests/util/testutil.h"
#include "tests/util/tiny_server.h"

static tiny_server ts;

/* The tiny server's command line with extra appended (NULL-terminated),
 * into args (capacity 48). */
static void args_with(const char **args, const char *const *extra) {
    int a = 0;
    for (; ts.args[a] && a < 40; a++) args[a] = ts.args[a];
    for (int i = 0; extra && extra[i] && a < 47; i++) args[a++] = extra[i];
    args[a] = NULL;
}

/* Starts the tiny server, writes the example adapter as a PEFT directory
 * "peft" (and a broken one, "bad", whose config says r = 3 for rank-2
 * factors), and stops it: each test starts its own command line. */
static int setup(void **state) {
    (void)state;
    if (!tiny_server_start(&ts, "interleaved", NULL)) return -1;
    tiny_write_peft_dir(&ts, "peft", "{\"r\": 2, \"lora_alpha\": 4}");
    tiny_write_peft_dir(&ts, "bad", "{\"r\": 3, \"lora_alpha\": 4}");
    assert_int_equal(ls_test_server_stop(ts.srv), 0);
    ts.srv = NULL;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ts.srv = ls_test_server_start((const char *const *)ts.args);
    tiny_server_stop(&ts);
    return 0;
}

/* GET /adapters/name as JSON (status asserted). */
static json_t *adapter_get(const char *name, long want) {
    char path[256];
    snprintf(path, sizeof path, "/adapters/%s", name);
    return tiny_get_json(&ts, path, want);
}

static void expect_adapter(const char *name, bool pinned, long long version) {
    json_t *j = adapter_get(name, 200);
    assert_int_equal(json_is_true(json_object_get(j, "pinned")), pinned);
    assert_int_equal(json_integer_value(json_object_get(j, "version")), version);
    assert_string_equal(json_string_value(json_object_get(j, "source")), "peft");
    json_decref(j);
}

static void test_flags_good_and_pinned(void **state) {
    (void)state;
    const char *args[48];
    const char *extra[] = {"--adapter", "good=peft,pinned", "--adapter", "plain=peft", NULL};
    args_with(args, extra);
    ts.srv = ls_test_server_start(args);
    assert_non_null(ts.srv);
    expect_adapter("good", true, 1);
    expect_adapter("plain", false, 1);
    json_t *j = adapter_get("good", 200);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "resident");
    json_decref(j);
    /* The factors are the example's: the forward matches its expected y. */
    tiny_check_forward(&ts, "good", "interleaved");
    tiny_check_forward(&ts, "plain", "interleaved");
    assert_int_equal(ls_test_server_stop(ts.srv), 0);
    ts.srv = NULL;
}

/* Each failure: exit 1, the structured error body with its code on the
 * output, and the server never listened. */
static void expect_start_fails(const char *entry, const char *code) {
    const char *args[48];
    const char *extra[] = {"--adapter", "ok=peft", "--adapter", entry, NULL};
    args_with(args, extra);
    char out[16384];
    assert_int_equal(ls_test_run_binary(args, out, sizeof out), 1);
    char want[96];
    snprintf(want, sizeof want, "{\"error\":{\"code\":\"%s\"", code);
    if (!strstr(out, want)) fprintf(stderr, "%s\n", out);
    assert_non_null(strstr(out, want));
    assert_null(strstr(out, "listening on"));
}

static void test_bad_adapter_stops_start(void **state) {
    (void)state;
    expect_start_fails("missing=nowhere", "invalid_request");
    expect_start_fails("bad=bad", "lora_rank_mismatch");
    expect_start_fails("up=../peft", "invalid_request");
    /* A malformed entry, or a name no adapter may have, is a bad flag:
     * exit 2 before anything starts. */
    const char *const bad[] = {"no-path=", ".hidden=peft", "bad name=peft"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *args[48];
        const char *extra[] = {"--adapter", bad[i], NULL};
        args_with(args, extra);
        char out[4096];
        assert_int_equal(ls_test_run_binary(args, out, sizeof out), 2);
        assert_non_null(strstr(out, "--adapter"));
        assert_null(strstr(out, "starting on"));
    }
}

static void test_environment_and_file(void **state) {
    (void)state;
    const char *env[] = {"LORASINK_ADAPTERS=e1=peft;e2=peft,pinned", NULL};
    ts.srv = ls_test_server_start_env((const char *const *)ts.args, env);
    assert_non_null(ts.srv);
    expect_adapter("e1", false, 1);
    expect_adapter("e2", true, 1);
    assert_int_equal(ls_test_server_stop(ts.srv), 0);

    /* The file's list; a flag replaces it rather than adding to it. */
    char path[1024];
    snprintf(path, sizeof path, "%s/lorasink.json", ts.dir);
    const char *cfg = "{\"adapters\": [\"c1=peft\", {\"name\": \"c2\", \"path\": \"peft\", \"pinned\": true}]}";
    ls_test_write_file(path, cfg, strlen(cfg));
    const char *args[48];
    const char *extra[] = {"--config", path, NULL};
    args_with(args, extra);
    ts.srv = ls_test_server_start(args);
    assert_non_null(ts.srv);
    expect_adapter("c1", false, 1);
    expect_adapter("c2", true, 1);
    assert_int_equal(ls_test_server_stop(ts.srv), 0);

    const char *over[] = {"--config", path, "--adapter", "f1=peft", NULL};
    args_with(args, over);
    ts.srv = ls_test_server_start(args);
    assert_non_null(ts.srv);
    expect_adapter("f1", false, 1);
    json_decref(adapter_get("c1", 404));
    assert_int_equal(ls_test_server_stop(ts.srv), 0);
    ts.srv = NULL;
}

/* TENANT/NAME at start-up is that tenant's adapter, as an admin's upload
 * of that name is: the tenant's key sees it as NAME, pinned as asked, and
 * no adapter of no tenant; the path is beneath --adapter-dir. */
static void test_tenants_adapter(void **state) {
    (void)state;
    char keys[1024], hex[65], text[256];
    snprintf(keys, sizeof keys, "%s/keys.json", ts.dir);
    ls_sha256_hex("acme-key", strlen("acme-key"), hex);
    snprintf(text, sizeof text, "{\"keys\": [{\"sha256\": \"%s\", \"tenant\": \"acme\", \"role\": \"tenant\"}]}",
             hex);
    ls_test_write_file(keys, text, strlen(text));
    const char *args[48];
    const char *extra[] = {"--api-keys", keys, "--adapter", "acme/t=peft,pinned", "--adapter", "plain=peft", NULL};
    args_with(args, extra);
    ts.srv = ls_test_server_start(args);
    assert_non_null(ts.srv);
    const char *auth[] = {"Authorization: Bearer acme-key", NULL};
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "GET", "/adapters/t", NULL, NULL, 0, auth, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = ls_test_response_json(&r);
    assert_string_equal(json_string_value(json_object_get(j, "name")), "t");
    assert_true(json_is_true(json_object_get(j, "pinned")));
    json_decref(j);
    ls_test_response_free(&r);
    assert_int_equal(ls_test_http(ts.srv, "GET", "/adapters/plain", NULL, NULL, 0, auth, &r), 0);
    assert_int_equal(r.status, 404);
    ls_test_response_free(&r);
    assert_int_equal(ls_test_server_stop(ts.srv), 0);
    ts.srv = NULL;
}

/* With --state-dir a restart finds the adapter restored: same factors,
 * same version; a changed file is loaded as the next version. */
static void test_state_dir_restart(void **state) {
    (void)state;
    char sdir[1024];
    snprintf(sdir, sizeof sdir, "%s/state", ts.dir);
    const char *args[48];
    const char *extra[] = {"--state-dir", sdir, "--adapter", "s=peft", NULL};
    args_with(args, extra);
    for (int round = 0; round < 2; round++) {
        ts.srv = ls_test_server_start(args);
        assert_non_null(ts.srv);
        expect_adapter("s", false, 1);
        assert_int_equal(ls_test_server_stop(ts.srv), 0);
    }
    tiny_write_peft_dir(&ts, "peft", "{\"r\": 2, \"lora_alpha\": 8}");
    ts.srv = ls_test_server_start(args);
    assert_non_null(ts.srv);
    expect_adapter("s", false, 2);
    assert_int_equal(ls_test_server_stop(ts.srv), 0);
    /* The same bytes under another path: the entry's source is not the
     * restored one's, so it is loaded as the next version, not kept. */
    tiny_write_peft_dir(&ts, "peft-copy", "{\"r\": 2, \"lora_alpha\": 8}");
    const char *moved[] = {"--state-dir", sdir, "--adapter", "s=peft-copy", NULL};
    args_with(args, moved);
    ts.srv = ls_test_server_start(args);
    assert_non_null(ts.srv);
    json_t *j = adapter_get("s", 200);
    assert_int_equal(json_integer_value(json_object_get(j, "version")), 3);
    assert_string_equal(json_string_value(json_object_get(j, "source")), "peft-copy");
    json_decref(j);
    assert_int_equal(ls_test_server_stop(ts.srv), 0);
    tiny_write_peft_dir(&ts, "peft", "{\"r\": 2, \"lora_alpha\": 4}");
    ts.srv = NULL;
}

/* Uploads the example adapter as name (replace: a new version) and
 * returns the version the server gave it. */
static long long upload(const char *name, bool replace) {
    json_t *a = tiny_adapter_inline(&ts, name, NULL);
    if (replace) json_object_set_new(a, "replace", json_true());
    json_t *r = tiny_post_json(&ts, "/adapters", a, 201);
    long long v = json_integer_value(json_object_get(r, "version"));
    json_decref(r);
    json_decref(a);
    return v;
}

/* A record damaged on disk is set aside at the next start, and its name
 * goes on after the version the record held: after a changed factor byte
 * (the header still says version 2), and after a destroyed header (the
 * name's floor file says 3). Another restart keeps what followed. */
static void test_state_dir_damaged_record(void **state) {
    (void)state;
    char sdir[1024];
    snprintf(sdir, sizeof sdir, "%s/state-damaged", ts.dir);
    const char *args[48];
    const char *extra[] = {"--state-dir", sdir, NULL};
    args_with(args, extra);
    ts.srv = ls_test_server_start(args);
    assert_non_null(ts.srv);
    assert_int_equal(upload("b", false), 1);
    assert_int_equal(upload("b", true), 2);
    assert_int_equal(upload("h", false), 1);
    assert_int_equal(upload("h", true), 2);
    assert_int_equal(upload("h", true), 3);
    assert_int_equal(ls_test_server_stop(ts.srv), 0);

    char path[1200];
    snprintf(path, sizeof path, "%s/b.adapter", sdir);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, -5, SEEK_END), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, -5, SEEK_END), 0);
    assert_int_not_equal(fputc(c ^ 0x40, f), EOF);
    assert_int_equal(fclose(f), 0);
    snprintf(path, sizeof path, "%s/h.adapter", sdir);
    f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fwrite("garbage garbage garbage garbage!", 1, 32, f), 32);
    assert_int_equal(fclose(f), 0);

    ts.srv = ls_test_server_start(args);
    assert_non_null(ts.srv);
    json_decref(adapter_get("b", 404));
    json_decref(adapter_get("h", 404));
    assert_int_equal(upload("b", false), 3);
    assert_int_equal(upload("h", false), 4);
    assert_int_equal(ls_test_server_stop(ts.srv), 0);
    ts.srv = ls_test_server_start(args);
    assert_non_null(ts.srv);
    json_t *j = adapter_get("b", 200);
    assert_int_equal(json_integer_value(json_object_get(j, "version")), 3);
    json_decref(j);
    j = adapter_get("h", 200);
    assert_int_equal(json_integer_value(json_object_get(j, "version")), 4);
    json_decref(j);
    assert_int_equal(ls_test_server_stop(ts.srv), 0);
    ts.srv = NULL;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flags_good_and_pinned),
        cmocka_unit_test(test_bad_adapter_stops_start),
        cmocka_unit_test(test_environment_and_file),
        cmocka_unit_test(test_tenants_adapter),
        cmocka_unit_test(test_state_dir_restart),
        cmocka_unit_test(test_state_dir_damaged_record),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
