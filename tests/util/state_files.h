/* Hostile state directories made by hand: a record's metadata rewritten
 * (its digest covers the factors only, so the record still reads), and
 * sparse files that claim gigabytes without taking them. */
#ifndef LS_TESTS_STATE_FILES_H
#define LS_TESTS_STATE_FILES_H

#include <stddef.h>
#include <stdint.h>

/* Sets __metadata__[key] = value in the safetensors file at path (the
 * header is rewritten with its new length; the data after it stays). */
void ls_test_set_meta(const char *path, const char *key, const char *value);

/* Makes path a sparse file of size bytes whose first len bytes are head
 * (NULL: none). */
void ls_test_sparse_file(const char *path, int64_t size, const void *head, size_t len);

#endif
