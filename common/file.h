/* Whole files in memory: read-only mappings of weights and adapters. */
#ifndef LS_COMMON_FILE_H
#define LS_COMMON_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

typedef struct {
    uint8_t *data;
    size_t len;
    bool mapped; /* mmap'd (else malloc'd, e.g. for an empty file) */
} ls_file_map;

/* Maps path read-only. Fails with code (the caller's choice of status)
 * and a message naming the path and errno's text. */
ls_status ls_file_map_open(const char *path, ls_file_map *m, ls_status code, ls_error *err);
void ls_file_map_close(ls_file_map *m);

/* Reads a small text file (at most max bytes) into a NUL-terminated
 * malloc'd buffer owned by the caller. */
ls_status ls_file_read_text(const char *path, size_t max, char **out, ls_status code, ls_error *err);

#endif
