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

/* Serialises s (its tensors in order, its metadata as __metadata__) into a
 * new buffer *out of *len bytes, owned by the caller (free()). */
ls_status ls_safetensors_write(const ls_tensor_set *s, uint8_t **out, size_t *len, ls_error *err);

#endif
