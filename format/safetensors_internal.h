/* What format/safetensors.c (the length field, parse, files, write) and
 * format/safetensors_header.c (the header read and checked) share. */
#ifndef LS_FORMAT_SAFETENSORS_INTERNAL_H
#define LS_FORMAT_SAFETENSORS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/tensor.h"

/* One header entry once its fields have been checked. */
typedef struct {
    char *name; /* owned */
    ls_dtype dtype;
    int ndim;
    int64_t shape[LS_MAX_DIMS];
    int64_t begin, end;
} ls_st_entry;

/* Appends one LS_SAFETENSORS_INVALID violation, prefixed with the tensor's
 * name when the problem belongs to one. */
void ls_st_violation(ls_error *err, const char *tensor, int axis, int64_t expected, int64_t got, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Checks the header's n bytes at h (already bounded by the file) by every
 * rule of docs/safetensors.md: its JSON, each entry, and the tiling of a
 * data section of body_len bytes. On success *ents (ls_st_entries_free)
 * holds *n_out entries in the header's order, and the __metadata__
 * strings went to meta's metadata (when meta is given; the caller's to
 * free on failure too). Read from the text in two passes, never as a
 * tree of JSON values (a header held as one took 17 times its size).
 * More than max_tensors entries is LS_PAYLOAD_TOO_LARGE from the first
 * pass's count, before any entry is kept. */
ls_status ls_st_collect(const char *h, size_t n, uint64_t body_len, size_t max_tensors, ls_st_entry **ents,
                        size_t *n_out, ls_tensor_set *meta, ls_error *err);
void ls_st_entries_free(ls_st_entry *ents, size_t n);

#endif
