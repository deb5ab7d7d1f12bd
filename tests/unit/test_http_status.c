/* server/http_status: every status of the table has one HTTP number, its
 * kind (common/status.h) agrees with it, and no HTTP number lives below
 * server/: none in common/status.{h,c}, and no product code outside
 * server/ compares anything with one. */
#include <ctype.h>
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/http_status.h"

#ifndef LS_SOURCE_DIR
#error "LS_SOURCE_DIR must name the source tree (tests/CMakeLists.txt sets it)"
#endif

/* The kinds are what the HTTP classes of a client error said before they
 * moved here: content 422, form 400, size 413; every other status is no
 * fault of the input's. */
static void test_kinds_agree_with_statuses(void **state) {
    (void)state;
    for (int s = 0; s < LS_STATUS_COUNT; s++) {
        const int h = ls_http_status((ls_status)s);
        if (h < 200 || h > 599) fail_msg("%s has HTTP %d", ls_status_code((ls_status)s), h);
        if (ls_status_is_input((ls_status)s) != (h == 400 || h == 413 || h == 422))
            fail_msg("%s: HTTP %d but is_input %d", ls_status_code((ls_status)s), h,
                     ls_status_is_input((ls_status)s));
        if (ls_status_is_validation((ls_status)s) != (h == 422))
            fail_msg("%s: HTTP %d but is_validation %d", ls_status_code((ls_status)s), h,
                     ls_status_is_validation((ls_status)s));
    }
    assert_int_equal(ls_http_status(LS_OK), 200);
    assert_int_equal(ls_http_status(LS_STATUS_COUNT), 500);
}

/* The pool's answers whose status a client acts on: a conflict is no
 * reason to retry, a full pool is. */
static void test_pool_outcomes(void **state) {
    (void)state;
    assert_int_equal(ls_http_status(LS_ADAPTER_EXISTS), 409);
    assert_int_equal(ls_http_status(LS_ADAPTER_STALE), 409);
    assert_int_equal(ls_http_status(LS_PIN_LIMIT), 409);
    assert_int_equal(ls_http_status(LS_VERSIONS_EXHAUSTED), 409);
    assert_int_equal(ls_http_status(LS_ADAPTER_NOT_FOUND), 404);
    assert_int_equal(ls_http_status(LS_POOL_EXHAUSTED), 503);
    assert_int_equal(ls_http_status(LS_OVERLOADED), 429);
    /* A full state disk is the operator's to fix, not a bug. */
    assert_int_equal(ls_http_status(LS_INSUFFICIENT_STORAGE), 507);
    assert_int_equal(ls_http_status(LS_INTERNAL), 500);
}

static bool is_http_number(long v) {
    for (int s = 0; s < LS_STATUS_COUNT; s++)
        if (ls_http_status((ls_status)s) == v) return true;
    return false;
}

/* The whole file, NUL-terminated (caller frees); NULL when unreadable. */
static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
    size_t got = text ? fread(text, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!text || got != (size_t)n) {
        free(text);
        return NULL;
    }
    text[n] = '\0';
    return text;
}

/* Counts (and prints) the numbers of text that are HTTP statuses of the
 * table: any of them (compared_only false), or only those right after
 * == or != (a branch on one). */
static int http_numbers_in(const char *rel, const char *text, bool compared_only) {
    int found = 0, line = 1;
    for (const char *p = text; *p; p++) {
        if (*p == '\n') line++;
        if (!isdigit((unsigned char)*p) || (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_'))) continue;
        char *end;
        long v = strtol(p, &end, 10);
        bool number = !isalnum((unsigned char)*end) && *end != '_' && *end != '.';
        const char *q = p;
        while (q > text && q[-1] == ' ') q--;
        bool compared = q - text >= 2 && (q[-1] == '=' && (q[-2] == '=' || q[-2] == '!'));
        if (number && is_http_number(v) && (!compared_only || compared)) {
            fprintf(stderr, "%s:%d: HTTP %ld\n", rel, line, v);
            found++;
        }
        p = end - 1;
    }
    return found;
}

/* Every .c and .h of a product folder below server/, for branches on an
 * HTTP number. */
static int http_branches_in_folder(const char *folder) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", LS_SOURCE_DIR, folder);
    DIR *d = opendir(dir);
    if (!d) fail_msg("cannot open %s", dir);
    int found = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        size_t len = strlen(ent->d_name);
        if (len < 3 || (strcmp(ent->d_name + len - 2, ".c") && strcmp(ent->d_name + len - 2, ".h"))) continue;
        char path[2048], rel[512];
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        snprintf(rel, sizeof rel, "%s/%s", folder, ent->d_name);
        char *text = read_file(path);
        if (!text) fail_msg("cannot read %s", path);
        found += http_numbers_in(rel, text, true);
        free(text);
    }
    closedir(d);
    return found;
}

static void test_no_http_below_server(void **state) {
    (void)state;
    int found = 0;
    static const char *const table[] = {"common/status.h", "common/status.c"};
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", LS_SOURCE_DIR, table[i]);
        char *text = read_file(path);
        if (!text) fail_msg("cannot read %s", path);
        found += http_numbers_in(table[i], text, false);
        free(text);
    }
    static const char *const folders[] = {"common", "format", "config", "gpu", "gpu/cpu", "model", "lora", "api"};
    for (size_t i = 0; i < sizeof folders / sizeof *folders; i++) found += http_branches_in_folder(folders[i]);
    assert_int_equal(found, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kinds_agree_with_statuses),
        cmocka_unit_test(test_pool_outcomes),
        cmocka_unit_test(test_no_http_below_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
