/* The hostile corpus (tests/data/hostile, written by tests/fuzz/make_hostile.py):
 * every file is safetensors_invalid with a message and leaves the set
 * empty, read both mapped and from an exact-size heap copy (so that
 * AddressSanitizer catches a read one byte past the end). Every prefix of
 * every file is parsed too, as is and with its header cut to fit, which
 * must never crash, leak or leave a half-filled set. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "format/safetensors.h"
#include "common/file.h"

#define HOSTILE_DIR LS_TEST_DATA "/hostile"
#define MIN_FILES 30

static bool has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Parses buf and asserts the outcome; returns the status. When must_fail,
 * anything but LS_SAFETENSORS_INVALID fails the test. Either way a failure
 * carries a message and leaves the set empty, a success leaves no error. */
static ls_status parse_one(const char *name, const uint8_t *buf, size_t len, bool must_fail) {
    ls_tensor_set s;
    ls_error err;
    ls_tensor_set_init(&s);
    ls_error_init(&err);
    ls_status st = ls_safetensors_parse(buf, len, &s, &err);
    if (must_fail && st != LS_SAFETENSORS_INVALID)
        fail_msg("%s: expected safetensors_invalid, got %s (%zu tensors)", name, ls_status_code(st), s.n);
    if (st == LS_OK) {
        assert_int_equal(err.code, LS_OK);
        assert_int_equal(err.n_violations, 0);
    } else {
        assert_int_equal(st, LS_SAFETENSORS_INVALID);
        assert_int_equal(err.code, LS_SAFETENSORS_INVALID);
        assert_true(err.n_violations >= 1);
        if (strlen(err.message) <= strlen("safetensors: ")) fail_msg("%s: empty message", name);
        if (s.n || s.n_meta || s.items || s.meta) fail_msg("%s: set not empty after failure", name);
    }
    ls_tensor_set_free(&s);
    ls_error_free(&err);
    return st;
}

static void test_hostile_corpus(void **state) {
    (void)state;
    DIR *d = opendir(HOSTILE_DIR);
    if (!d) fail_msg("cannot open %s (run tests/fuzz/make_hostile.py)", HOSTILE_DIR);
    int seen = 0;
    long prefixes_ok = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!has_suffix(de->d_name, ".safetensors")) continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", HOSTILE_DIR, de->d_name);
        ls_file_map m;
        ls_error err;
        ls_error_init(&err);
        if (ls_file_map_open(path, &m, LS_SAFETENSORS_INVALID, &err) != LS_OK) fail_msg("%s", err.message);
        ls_error_free(&err);

        parse_one(de->d_name, m.data, m.len, true);

        uint8_t *copy = m.len ? malloc(m.len) : NULL;
        if (m.len) {
            assert_non_null(copy);
            memcpy(copy, m.data, m.len);
        }
        parse_one(de->d_name, copy, m.len, true);
        /* A prefix of a hostile file may happen to be valid (cutting the
         * trailing bytes off, say); it only has to be handled cleanly. */
        for (size_t n = 0; n < m.len; n++) {
            uint8_t *p = n ? malloc(n) : NULL;
            if (n) memcpy(p, copy, n);
            if (parse_one(de->d_name, p, n, false) == LS_OK) prefixes_ok++;
            /* The same prefix with the length field rewritten to cover it
             * all: the JSON parser then meets every truncation. */
            if (n > 8) {
                for (int i = 0; i < 8; i++) p[i] = (uint8_t)((uint64_t)(n - 8) >> (8 * i));
                if (parse_one(de->d_name, p, n, false) == LS_OK) prefixes_ok++;
            }
            free(p);
        }
        free(copy);
        ls_file_map_close(&m);
        seen++;
    }
    closedir(d);
    print_message("%d hostile files rejected, %ld of their prefixes valid\n", seen, prefixes_ok);
    if (seen < MIN_FILES) fail_msg("only %d files in %s, expected at least %d", seen, HOSTILE_DIR, MIN_FILES);
}

/* Single-byte corruptions of a valid file: every byte of its header and
 * length field set to a few hostile values. Most results are invalid,
 * some are valid; none may crash, leak or leave a half-filled set. */
static void test_valid_file_mutations(void **state) {
    (void)state;
    const char *h = "{\"__metadata__\":{\"k\":\"v\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[1,3],\"data_offsets\":[8,14]}}";
    size_t hl = strlen(h), len = 8 + hl + 14;
    uint8_t *base = malloc(len);
    assert_non_null(base);
    for (int i = 0; i < 8; i++) base[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(base + 8, h, hl);
    memset(base + 8 + hl, 0x41, 14);
    assert_int_equal(parse_one("base", base, len, false), LS_OK);
    const uint8_t values[] = {0x00, 0x01, 0x7f, 0x80, 0xff, '"', '-', '9', '[', '{', '}', ',', ' ', '\\'};
    int invalid = 0;
    for (size_t at = 0; at < 8 + hl; at++) {
        for (size_t k = 0; k < sizeof values; k++) {
            uint8_t *b = malloc(len);
            memcpy(b, base, len);
            if (b[at] == values[k]) {
                free(b);
                continue;
            }
            b[at] = values[k];
            if (parse_one("mutation", b, len, false) != LS_OK) invalid++;
            free(b);
        }
    }
    assert_true(invalid > 0);
    free(base);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostile_corpus),
        cmocka_unit_test(test_valid_file_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
