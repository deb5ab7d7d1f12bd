/* See state_files.h. */
#include "tests/util/state_files.h"

#include <fcntl.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static uint8_t *ls_test_read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    uint8_t *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

void ls_test_set_meta(const char *path, const char *key, const char *value) {
    size_t len;
    uint8_t *buf = ls_test_read_all(path, &len);
    assert_true(len >= 8);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)buf[i] << (8 * i);
    assert_true(n <= len - 8);
    json_error_t jerr;
    json_t *h = json_loadb((const char *)buf + 8, (size_t)n, 0, &jerr);
    assert_non_null(h);
    json_t *m = json_object_get(h, "__metadata__");
    assert_non_null(m);
    /* Any bytes: a name on disk need not be UTF-8. */
    assert_int_equal(json_object_set_new(m, key, json_stringn_nocheck(value, strlen(value))), 0);
    char *text = json_dumps(h, JSON_COMPACT);
    assert_non_null(text);
    const size_t tl = strlen(text);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t field[8];
    for (int i = 0; i < 8; i++) field[i] = (uint8_t)((uint64_t)tl >> (8 * i));
    assert_int_equal(fwrite(field, 1, 8, f), 8);
    assert_int_equal(fwrite(text, 1, tl, f), tl);
    assert_int_equal(fwrite(buf + 8 + n, 1, len - 8 - n, f), len - 8 - n);
    assert_int_equal(fclose(f), 0);
    free(text);
    json_decref(h);
    free(buf);
}

void ls_test_sparse_file(const char *path, int64_t size, const void *head, size_t len) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    if (len) assert_int_equal(write(fd, head, len), (ssize_t)len);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    assert_int_equal(close(fd), 0);
}
