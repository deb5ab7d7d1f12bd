/* safetensors read and write (docs/safetensors.md). The reader checks every
 * length, offset and product against the buffer before trusting it and
 * allocates nothing from a header size before that size is checked. */
#ifndef LS_FORMAT_SAFETENSORS_H
#define LS_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/tensor.h"

#define LS_SAFETENSORS_MAX_HEADER 100000000u

/* Parses buf[len] into out (which must be initialised and empty). The
 * tensors borrow their data from buf (owned = false): buf must outlive
 * out. __metadata__ string values go to out's metadata. Any breach is
 * LS_SAFETENSORS_INVALID with a message naming the rule and the tensor.
 * Dtypes other than F32/F16/BF16 are accepted here (refused later). On
 * failure out is left empty. */
ls_status ls_safetensors_parse(const uint8_t *buf, size_t len, ls_tensor_set *out, ls_error *err);
/* The same, refusing a header of more than max_tensors tensors with
 * LS_PAYLOAD_TOO_LARGE before any of them is kept (what a tensor costs
 * beyond its bytes is some 200 bytes of entries and names). */
ls_status ls_safetensors_parse_max(const uint8_t *buf, size_t len, size_t max_tensors, ls_tensor_set *out,
                                   ls_error *err);

/* A file checked before its data is read, in two steps and with the
 * messages ls_safetensors_parse gives. First the length field: first
 * holds min(file_len, 8) bytes of a file of file_len bytes; on success
 * *header_len is N, the header's length, within the limit and the file. */
ls_status ls_safetensors_header_len(const uint8_t *first, uint64_t file_len, size_t *header_len, ls_error *err);
/* Then the header: head holds the file's first head_len >= 8 + N bytes;
 * its JSON, every entry and the tiling of the data section (file_len -
 * 8 - N bytes) are checked, every violation in err. Nothing of the data
 * section is needed. */
ls_status ls_safetensors_check_header(const uint8_t *head, size_t head_len, uint64_t file_len, size_t max_tensors,
                                      ls_error *err);

/* One tensor of a safetensors file as its header describes it: where its
 * bytes lie in the file (none are read). */
typedef struct {
    char *name; /* owned */
    ls_dtype dtype;
    int ndim;
    int64_t shape[LS_MAX_DIMS];
    uint64_t offset; /* of its first byte, from the start of the file */
    size_t nbytes;
} ls_st_info;

/* A file's header: its tensors in the header's order and __metadata__
 * (in meta's metadata; meta holds no tensors). */
typedef struct {
    ls_st_info *items; /* owned */
    size_t n;
    ls_tensor_set meta;
    uint64_t file_len;
} ls_st_header;

/* Reads the header of the file open at fd (8 + N bytes, nothing of the
 * data section) and checks it by every rule of ls_safetensors_parse,
 * offsets against the file's size. what names the file in messages. On
 * success out is the caller's (ls_st_header_free); on failure it is
 * empty. */
ls_status ls_safetensors_read_header(int fd, const char *what, ls_st_header *out, ls_error *err);
void ls_st_header_free(ls_st_header *h);
/* Borrowed entry, or NULL. */
const ls_st_info *ls_st_header_find(const ls_st_header *h, const char *name);
/* Reads tensor t's bytes (t->nbytes at t->offset) into dst; a file that
 * ends before them (cut after its header was read) is
 * LS_SAFETENSORS_INVALID naming the tensor. */
ls_status ls_safetensors_read_range(int fd, const char *what, const ls_st_info *t, void *dst, ls_error *err);

/* Serialises s (its tensors in order, its metadata as __metadata__) into a
 * new buffer *out of *len bytes, owned by the caller (free()). */
ls_status ls_safetensors_write(const ls_tensor_set *s, uint8_t **out, size_t *len, ls_error *err);
/* The same file without copying the data: the tensors' bytes already lie
 * back to back, in s's order, from buf + room; the length field and the
 * header (the bytes ls_safetensors_write gives) are written just before,
 * ending at buf + room. The file is *len bytes from buf + *start.
 * LS_INTERNAL when the tensors do not lie there or the header does not
 * fit in room (nothing written), or out of memory. */
ls_status ls_safetensors_write_before(const ls_tensor_set *s, uint8_t *buf, size_t room, size_t *start, size_t *len,
                                      ls_error *err);

#endif
