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

/* A file checked before its data is read, in two steps and with the
 * messages ls_safetensors_parse gives. First the length field: first
 * holds min(file_len, 8) bytes of a file of file_len bytes; on success
 * *header_len is N, the header's length, within the limit and the file. */
ls_status ls_safetensors_header_len(const uint8_t *first, uint64_t file_len, size_t *header_len, ls_error *err);
/* Then the header: head holds the file's first head_len >= 8 + N bytes;
 * its JSON, every entry and the tiling of the data section (file_len -
 * 8 - N bytes) are checked, every violation in err. Nothing of the data
 * section is needed. */
ls_status ls_safetensors_check_header(const uint8_t *head, size_t head_len, uint64_t file_len, ls_error *err);

/* Serialises s (its tensors in order, its metadata as __metadata__) into a
 * new buffer *out of *len bytes, owned by the caller (free()). */
ls_status ls_safetensors_write(const ls_tensor_set *s, uint8_t **out, size_t *len, ls_error *err);

#endif
