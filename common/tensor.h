/* Host tensors: dtypes and their conversion to and from fp32, one tensor
 * (shape + bytes, owned or borrowed), and a named set of tensors with
 * string metadata, the common currency of safetensors, JSON tensors and
 * adapter uploads. */
#ifndef LS_COMMON_TENSOR_H
#define LS_COMMON_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

struct ls_error;

/* Every dtype safetensors names. Only F32, F16 and BF16 are computed with;
 * the rest are parsed (so the file can be checked) and refused later. */
typedef enum {
    LS_DTYPE_F32,
    LS_DTYPE_F16,
    LS_DTYPE_BF16,
    LS_DTYPE_F64,
    LS_DTYPE_I64,
    LS_DTYPE_I32,
    LS_DTYPE_I16,
    LS_DTYPE_I8,
    LS_DTYPE_U64,
    LS_DTYPE_U32,
    LS_DTYPE_U16,
    LS_DTYPE_U8,
    LS_DTYPE_BOOL,
    LS_DTYPE_F8_E4M3,
    LS_DTYPE_F8_E5M2,
    LS_DTYPE_COUNT
} ls_dtype;

#define LS_MAX_DIMS 8

/* "F32", "BF16", ... as safetensors spells them. */
const char *ls_dtype_name(ls_dtype dt);
size_t ls_dtype_size(ls_dtype dt);
/* Case-insensitive: accepts "F32" and "f32". Returns false when unknown. */
bool ls_dtype_parse(const char *s, ls_dtype *out);
/* True for the dtypes lorasink computes with (F32, F16, BF16). */
bool ls_dtype_is_float(ls_dtype dt);

float ls_bf16_to_f32(uint16_t v);
uint16_t ls_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */
float ls_f16_to_f32(uint16_t v);
uint16_t ls_f32_to_f16(float f); /* round to nearest even, overflow to Inf */

/* Converts count values of a float dtype (little-endian bytes) to fp32.
 * Returns false for a dtype that is not F32/F16/BF16. */
bool ls_convert_to_f32(ls_dtype dt, const void *src, size_t count, float *dst);
/* Converts fp32 to a float dtype (little-endian bytes). */
bool ls_convert_from_f32(ls_dtype dt, const float *src, size_t count, void *dst);
/* Rounds fp32 values in place to the precision of dt (identity for F32). */
void ls_round_to_dtype(ls_dtype dt, float *v, size_t count);
/* Converts count values between float dtypes (little-endian bytes): the
 * same dtype is a copy of the bytes, a wider one is exact, a narrower one
 * rounds to nearest even. False for a dtype that is not F32/F16/BF16. */
bool ls_convert_dtype(ls_dtype from, const void *src, ls_dtype to, void *dst, size_t count);
/* True when some value of a float dtype is NaN or Inf; *at is then the
 * first one's index. False for other dtypes too (nothing to say). */
bool ls_find_nonfinite(ls_dtype dt, const void *v, size_t count, size_t *at);
/* True when some finite value of dtype from rounds to Inf in dtype to
 * (an f32 weight of 1e5 served as f16); *at is then the first one's
 * index and *value its value. False when to holds every value of from. */
bool ls_find_overflow(ls_dtype from, const void *v, size_t count, ls_dtype to, size_t *at, float *value);
/* FP8 E4M3 as deep-learning checkpoints store it (the "fn" variant: no
 * infinities, 0x7f and 0xff are NaN), widened exactly to fp32. */
float ls_f8e4m3_to_f32(uint8_t v);

typedef struct {
    ls_dtype dtype;
    int ndim;
    int64_t shape[LS_MAX_DIMS];
    void *data;    /* little-endian values, row-major */
    size_t nbytes; /* numel * dtype size */
    bool owned;    /* data is freed with the tensor */
} ls_tensor;

/* numel of a shape, or -1 when it overflows int64 or a dim is negative. */
int64_t ls_shape_numel(const int64_t *shape, int ndim);
static inline int64_t ls_tensor_numel(const ls_tensor *t) { return ls_shape_numel(t->shape, t->ndim); }
/* Formats "[2, 3, 4]" into buf. */
const char *ls_shape_str(const int64_t *shape, int ndim, char *buf, size_t len);

/* Allocates an owned fp32 tensor of the given shape, zeroed. NULL on OOM. */
bool ls_tensor_alloc_f32(ls_tensor *t, const int64_t *shape, int ndim);
void ls_tensor_free(ls_tensor *t);
/* Copies the tensor's values into dst as fp32 (dst holds numel floats). */
bool ls_tensor_to_f32(const ls_tensor *t, float *dst);

typedef struct {
    char *name; /* owned */
    ls_tensor t;
} ls_named_tensor;

typedef struct {
    char *key; /* owned */
    char *value;
} ls_meta_entry;

/* An ordered set of named tensors plus string metadata. Owns the names,
 * the metadata and those tensors whose owned flag is set. */
typedef struct {
    ls_named_tensor *items;
    size_t n, cap;
    ls_meta_entry *meta;
    size_t n_meta, cap_meta;
} ls_tensor_set;

void ls_tensor_set_init(ls_tensor_set *s);
void ls_tensor_set_free(ls_tensor_set *s);
/* Appends a tensor under a copy of name; the set takes ownership of t's
 * data when t->owned. Returns false on OOM (t is then left to the caller). */
bool ls_tensor_set_add(ls_tensor_set *s, const char *name, const ls_tensor *t);
/* Makes room for n more tensors at once (no doubling as they come); false
 * on OOM (the set is unchanged). */
bool ls_tensor_set_reserve(ls_tensor_set *s, size_t n);
/* Borrowed pointer, or NULL. */
const ls_tensor *ls_tensor_set_find(const ls_tensor_set *s, const char *name);
bool ls_tensor_set_add_meta(ls_tensor_set *s, const char *key, const char *value);
/* Borrowed string, or NULL. */
const char *ls_tensor_set_meta(const ls_tensor_set *s, const char *key);

#endif
