/* The API reference against the status table: docs/api.md names every
 * wire code (as `code`), docs/server.md's table of codes names each under
 * its status, and docs/openapi.json's ErrorCode enum is exactly the
 * table's codes, with each ErrorNNN response listing exactly the codes
 * of status NNN (server/http_status.c), and every operation the statuses
 * the head rules give on any route. So a code added to common/status.h
 * fails here until the documents say what it is. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "server/http_status.h"
#include "tests/util/testutil.h"

#ifndef LS_SOURCE_DIR
#error "LS_SOURCE_DIR must name the source tree (tests/CMakeLists.txt sets it)"
#endif

/* The whole file, NUL-terminated; the caller frees it. Fails the test
 * when it cannot be read. */
static char *read_doc(const char *rel) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", LS_SOURCE_DIR, rel);
    return ls_test_read_file(path, NULL);
}

/* The parsed OpenAPI document; the caller owns the reference. */
static json_t *load_openapi(void) {
    char *text = read_doc("docs/openapi.json");
    json_error_t jerr;
    json_t *doc = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!doc) fail_msg("docs/openapi.json: %s (line %d)", jerr.text, jerr.line);
    free(text);
    return doc;
}

static bool enum_has(const json_t *arr, const char *code) {
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) if (json_is_string(v) && !strcmp(json_string_value(v), code)) return true;
    return false;
}

/* The error.code enum an ErrorNNN response narrows its body to (the
 * second schema of its allOf), or NULL. Borrowed from resp. */
static const json_t *response_codes(const json_t *resp) {
    const json_t *schema =
        json_object_get(json_object_get(json_object_get(resp, "content"), "application/json"), "schema");
    const json_t *narrow = json_array_get(json_object_get(schema, "allOf"), 1);
    const json_t *error = json_object_get(json_object_get(narrow, "properties"), "error");
    return json_object_get(json_object_get(json_object_get(error, "properties"), "code"), "enum");
}

static void test_api_md_names_every_code(void **state) {
    (void)state;
    char *md = read_doc("docs/api.md");
    int missing = 0;
    for (int s = 0; s < LS_STATUS_COUNT; s++) {
        if (s == LS_OK) continue;
        char quoted[96];
        snprintf(quoted, sizeof quoted, "`%s`", ls_status_code((ls_status)s));
        if (!strstr(md, quoted)) {
            fprintf(stderr, "docs/api.md does not name %s (HTTP %d)\n", quoted, ls_http_status((ls_status)s));
            missing++;
        }
    }
    free(md);
    assert_int_equal(missing, 0);
}

/* server.md's "| NNN | codes |" rows: each code in the row of its
 * status (it lacked eleven, 403 and 408 whole). */
static void test_server_md_table_names_every_code(void **state) {
    (void)state;
    char *md = read_doc("docs/server.md");
    int missing = 0;
    for (int s = 0; s < LS_STATUS_COUNT; s++) {
        if (s == LS_OK) continue;
        char row[16], quoted[96];
        snprintf(row, sizeof row, "\n| %d | ", ls_http_status((ls_status)s));
        snprintf(quoted, sizeof quoted, "`%s`", ls_status_code((ls_status)s));
        const char *at = strstr(md, row), *end = at ? strchr(at + 1, '\n') : NULL;
        const char *hit = at ? strstr(at, quoted) : NULL;
        if (!at || !hit || (end && hit > end)) {
            fprintf(stderr, "docs/server.md's row %d does not name %s\n", ls_http_status((ls_status)s), quoted);
            missing++;
        }
    }
    free(md);
    assert_int_equal(missing, 0);
}

/* Every operation can get the head rules' answers (400, 403 host or
 * origin, 408, 414) and 500, whatever it serves: GET /model listed none
 * of the first four. */
static void test_openapi_operations_list_head_statuses(void **state) {
    (void)state;
    json_t *doc = load_openapi();
    const char *const every[] = {"400", "403", "408", "414", "500"};
    const char *path, *method;
    json_t *ops, *op;
    int bad = 0;
    json_object_foreach(json_object_get(doc, "paths"), path, ops) {
        json_object_foreach(ops, method, op) {
            const json_t *resp = json_object_get(op, "responses");
            if (!resp) continue;
            for (size_t i = 0; i < sizeof every / sizeof *every; i++)
                if (!json_object_get(resp, every[i])) {
                    fprintf(stderr, "%s %s does not list %s\n", method, path, every[i]);
                    bad++;
                }
        }
    }
    assert_int_equal(bad, 0);
    json_decref(doc);
}

static void test_openapi_enum_is_the_table(void **state) {
    (void)state;
    json_t *doc = load_openapi();
    const json_t *en = json_object_get(json_object_get(json_object_get(json_object_get(doc, "components"), "schemas"),
                                                       "ErrorCode"),
                                       "enum");
    assert_true(json_is_array(en));
    int bad = 0;
    for (int s = 0; s < LS_STATUS_COUNT; s++) {
        if (s == LS_OK) continue;
        if (!enum_has(en, ls_status_code((ls_status)s))) {
            fprintf(stderr, "ErrorCode lacks %s\n", ls_status_code((ls_status)s));
            bad++;
        }
    }
    /* No more entries than the table has codes besides ok, and none twice:
     * with every code present, equal sizes mean equal sets. */
    assert_int_equal(json_array_size(en), (size_t)LS_STATUS_COUNT - 1);
    assert_int_equal(bad, 0);
    json_decref(doc);
}

/* Each components.responses.ErrorNNN narrows error.code to the codes of
 * HTTP status NNN, and every status the table uses has such a response. */
static void test_openapi_error_responses_follow_the_table(void **state) {
    (void)state;
    json_t *doc = load_openapi();
    const json_t *responses = json_object_get(json_object_get(doc, "components"), "responses");
    assert_true(json_is_object(responses));
    int bad = 0;
    for (int s = 0; s < LS_STATUS_COUNT; s++) {
        if (s == LS_OK) continue;
        char key[16];
        snprintf(key, sizeof key, "Error%d", ls_http_status((ls_status)s));
        const json_t *codes = response_codes(json_object_get(responses, key));
        if (!json_is_array(codes) || !enum_has(codes, ls_status_code((ls_status)s))) {
            fprintf(stderr, "%s does not list %s\n", key, ls_status_code((ls_status)s));
            bad++;
        }
    }
    /* And no ErrorNNN lists a code of another status. */
    const char *key;
    json_t *resp;
    json_object_foreach((json_t *)responses, key, resp) {
        int http = 0;
        if (sscanf(key, "Error%d", &http) != 1) continue;
        const json_t *codes = response_codes(resp);
        size_t i;
        json_t *v;
        json_array_foreach(codes, i, v) {
            bool found = false;
            for (int s = 1; s < LS_STATUS_COUNT && !found; s++)
                found = !strcmp(json_string_value(v), ls_status_code((ls_status)s)) && ls_http_status((ls_status)s) == http;
            if (!found) {
                fprintf(stderr, "%s lists %s, which is not a code of HTTP %d\n", key, json_string_value(v), http);
                bad++;
            }
        }
    }
    assert_int_equal(bad, 0);
    json_decref(doc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_api_md_names_every_code),
        cmocka_unit_test(test_server_md_table_names_every_code),
        cmocka_unit_test(test_openapi_operations_list_head_statuses),
        cmocka_unit_test(test_openapi_enum_is_the_table),
        cmocka_unit_test(test_openapi_error_responses_follow_the_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
