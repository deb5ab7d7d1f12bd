/* Host tensors: dtype table, fp32 conversions and the named tensor set. */
#include "common/tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *name;
    size_t size;
} ls_dtype_table[LS_DTYPE_COUNT] = {
    [LS_DTYPE_F32] = {"F32", 4},   [LS_DTYPE_F16] = {"F16", 2},         [LS_DTYPE_BF16] = {"BF16", 2},
    [LS_DTYPE_F64] = {"F64", 8},   [LS_DTYPE_I64] = {"I64", 8},         [LS_DTYPE_I32] = {"I32", 4},
    [LS_DTYPE_I16] = {"I16", 2},   [LS_DTYPE_I8] = {"I8", 1},           [LS_DTYPE_U64] = {"U64", 8},
    [LS_DTYPE_U32] = {"U32", 4},   [LS_DTYPE_U16] = {"U16", 2},         [LS_DTYPE_U8] = {"U8", 1},
    [LS_DTYPE_BOOL] = {"BOOL", 1}, [LS_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [LS_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
};

const char *ls_dtype_name(ls_dtype dt) { return (unsigned)dt < LS_DTYPE_COUNT ? ls_dtype_table[dt].name : "?"; }

size_t ls_dtype_size(ls_dtype dt) { return (unsigned)dt < LS_DTYPE_COUNT ? ls_dtype_table[dt].size : 0; }

bool ls_dtype_parse(const char *s, ls_dtype *out) {
    for (int i = 0; i < LS_DTYPE_COUNT; i++) {
        if (!strcasecmp(s, ls_dtype_table[i].name)) {
            *out = (ls_dtype)i;
            return true;
        }
    }
    return false;
}

bool ls_dtype_is_float(ls_dtype dt) { return dt == LS_DTYPE_F32 || dt == LS_DTYPE_F16 || dt == LS_DTYPE_BF16; }

static inline uint32_t ls_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float ls_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float ls_bf16_to_f32(uint16_t v) { return ls_bits_f32((uint32_t)v << 16); }

uint16_t ls_f32_to_bf16(float f) {
    uint32_t u = ls_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

float ls_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return ls_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        /* subnormal: man * 2^-24, exact in fp32 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    return ls_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t ls_f32_to_f16(float f) {
    uint32_t u = ls_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return sign | 0x7e00u; /* NaN */
    if (abs >= 0x477ff000u) return sign | 0x7c00u; /* rounds to >= 65520: Inf */
    if (abs < 0x38800000u) {
        /* below the smallest normal (2^-14): round to a multiple of 2^-24 */
        float a = ls_bits_f32(abs);
        float q = a * 16777216.0f; /* exact scaling by 2^24 */
        return sign | (uint16_t)lrintf(q); /* lrintf rounds to even by default */
    }
    uint32_t m = abs + 0xfffu + ((abs >> 13) & 1u);
    return sign | (uint16_t)((m - (112u << 23)) >> 13);
}

bool ls_convert_to_f32(ls_dtype dt, const void *src, size_t count, float *dst) {
    const uint8_t *p = src;
    switch (dt) {
    case LS_DTYPE_F32:
        memcpy(dst, src, count * 4);
        return true;
    case LS_DTYPE_BF16:
        for (size_t i = 0; i < count; i++) dst[i] = ls_bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        return true;
    case LS_DTYPE_F16:
        for (size_t i = 0; i < count; i++) dst[i] = ls_f16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        return true;
    default:
        return false;
    }
}

bool ls_convert_from_f32(ls_dtype dt, const float *src, size_t count, void *dst) {
    uint8_t *p = dst;
    switch (dt) {
    case LS_DTYPE_F32:
        memcpy(dst, src, count * 4);
        return true;
    case LS_DTYPE_BF16:
    case LS_DTYPE_F16:
        for (size_t i = 0; i < count; i++) {
            uint16_t v = dt == LS_DTYPE_BF16 ? ls_f32_to_bf16(src[i]) : ls_f32_to_f16(src[i]);
            p[2 * i] = (uint8_t)(v & 0xff);
            p[2 * i + 1] = (uint8_t)(v >> 8);
        }
        return true;
    default:
        return false;
    }
}

void ls_round_to_dtype(ls_dtype dt, float *v, size_t count) {
    if (dt == LS_DTYPE_BF16)
        for (size_t i = 0; i < count; i++) v[i] = ls_bf16_to_f32(ls_f32_to_bf16(v[i]));
    else if (dt == LS_DTYPE_F16)
        for (size_t i = 0; i < count; i++) v[i] = ls_f16_to_f32(ls_f32_to_f16(v[i]));
}

/* One value of a float dtype at index i, widened (exact). */
static float ls_load_float(ls_dtype dt, const uint8_t *p, size_t i) {
    if (dt == LS_DTYPE_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
    return dt == LS_DTYPE_BF16 ? ls_bf16_to_f32(h) : ls_f16_to_f32(h);
}

bool ls_convert_dtype(ls_dtype from, const void *src, ls_dtype to, void *dst, size_t count) {
    if (!ls_dtype_is_float(from) || !ls_dtype_is_float(to)) return false;
    if (from == to) {
        memcpy(dst, src, count * ls_dtype_size(from));
        return true;
    }
    if (from == LS_DTYPE_F32) return ls_convert_from_f32(to, src, count, dst);
    uint8_t *out = dst;
    for (size_t i = 0; i < count; i++) {
        float f = ls_load_float(from, src, i);
        if (to == LS_DTYPE_F32) {
            memcpy(out + 4 * i, &f, 4);
        } else {
            uint16_t h = to == LS_DTYPE_BF16 ? ls_f32_to_bf16(f) : ls_f32_to_f16(f);
            out[2 * i] = (uint8_t)(h & 0xff);
            out[2 * i + 1] = (uint8_t)(h >> 8);
        }
    }
    return true;
}

/* F32: scanned in blocks with no branch per value, which the compiler
 * vectorises (a T=2048 forward body holds 4 Mi values, and a branch each
 * took some 5 ms of the HTTP thread); only a block holding a bad value is
 * searched for the first. */
static bool ls_find_nonfinite_f32(const uint8_t *p, size_t count, size_t *at) {
    enum { BLOCK = 4096 };
    for (size_t b = 0; b < count; b += BLOCK) {
        const size_t n = count - b < BLOCK ? count - b : BLOCK;
        uint32_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, p + 4 * (b + i), 4);
            bad |= (u & 0x7f800000u) == 0x7f800000u; /* exponent all ones: Inf or NaN */
        }
        for (size_t i = b; bad && i < b + n; i++) {
            uint32_t u;
            memcpy(&u, p + 4 * i, 4);
            if ((u & 0x7f800000u) == 0x7f800000u) {
                *at = i;
                return true;
            }
        }
    }
    return false;
}

/* By the bits: an all-ones exponent is Inf or NaN in each of the three. */
bool ls_find_nonfinite(ls_dtype dt, const void *v, size_t count, size_t *at) {
    const uint8_t *p = v;
    if (dt == LS_DTYPE_F32) return ls_find_nonfinite_f32(p, count, at);
    for (size_t i = 0; i < count; i++) {
        bool bad;
        if (dt == LS_DTYPE_BF16 || dt == LS_DTYPE_F16) {
            uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            bad = dt == LS_DTYPE_BF16 ? (h & 0x7f80u) == 0x7f80u : (h & 0x7c00u) == 0x7c00u;
        } else {
            return false;
        }
        if (bad) {
            *at = i;
            return true;
        }
    }
    return false;
}

/* The rounding the backends store with decides: a finite value whose
 * round trip through to is infinite does not fit. */
bool ls_find_overflow(ls_dtype from, const void *v, size_t count, ls_dtype to, size_t *at, float *value) {
    /* Every value of a dtype fits itself and f32, and f16's fit bf16. */
    if (!ls_dtype_is_float(from) || !ls_dtype_is_float(to) || from == to || to == LS_DTYPE_F32 || from == LS_DTYPE_F16)
        return false;
    const uint8_t *p = v;
    for (size_t i = 0; i < count; i++) {
        float f;
        if (from == LS_DTYPE_F32) memcpy(&f, p + 4 * i, 4);
        else f = ls_bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        const float narrowed = to == LS_DTYPE_F16 ? ls_f16_to_f32(ls_f32_to_f16(f)) : ls_bf16_to_f32(ls_f32_to_bf16(f));
        if (isfinite(f) && isinf(narrowed)) {
            *at = i;
            *value = f;
            return true;
        }
    }
    return false;
}

/* 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
 * subnormal (m * 2^-9). Every value is exact in fp32. */
float ls_f8e4m3_to_f32(uint8_t v) {
    const int exp = (v >> 3) & 0xf, man = v & 7;
    float mag;
    if (exp == 0xf && man == 7) mag = NAN;
    else if (exp == 0) mag = (float)man * (1.0f / 512.0f);
    else mag = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return v & 0x80 ? -mag : mag;
}

int64_t ls_shape_numel(const int64_t *shape, int ndim) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

const char *ls_shape_str(const int64_t *shape, int ndim, char *buf, size_t len) {
    size_t off = 0;
    int w = snprintf(buf, len, "[");
    off = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < ndim && off < len; i++) {
        w = snprintf(buf + off, len - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (w > 0) off += (size_t)w;
    }
    if (off < len) snprintf(buf + off, len - off, "]");
    return buf;
}

bool ls_tensor_alloc_f32(ls_tensor *t, const int64_t *shape, int ndim) {
    memset(t, 0, sizeof *t);
    if (ndim < 0 || ndim > LS_MAX_DIMS) return false;
    int64_t n = ls_shape_numel(shape, ndim);
    if (n < 0 || (uint64_t)n > SIZE_MAX / 4) return false;
    t->dtype = LS_DTYPE_F32;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->nbytes = (size_t)n * 4;
    t->data = calloc(n ? (size_t)n : 1, 4);
    t->owned = true;
    return t->data != NULL;
}

void ls_tensor_free(ls_tensor *t) {
    if (t->owned) free(t->data);
    memset(t, 0, sizeof *t);
}

bool ls_tensor_to_f32(const ls_tensor *t, float *dst) {
    int64_t n = ls_tensor_numel(t);
    if (n < 0 || (size_t)n * ls_dtype_size(t->dtype) != t->nbytes) return false;
    return ls_convert_to_f32(t->dtype, t->data, (size_t)n, dst);
}

void ls_tensor_set_init(ls_tensor_set *s) { memset(s, 0, sizeof *s); }

void ls_tensor_set_free(ls_tensor_set *s) {
    for (size_t i = 0; i < s->n; i++) {
        free(s->items[i].name);
        ls_tensor_free(&s->items[i].t);
    }
    for (size_t i = 0; i < s->n_meta; i++) {
        free(s->meta[i].key);
        free(s->meta[i].value);
    }
    free(s->items);
    free(s->meta);
    memset(s, 0, sizeof *s);
}

bool ls_tensor_set_add(ls_tensor_set *s, const char *name, const ls_tensor *t) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        ls_named_tensor *items = realloc(s->items, cap * sizeof *items);
        if (!items) return false;
        s->items = items;
        s->cap = cap;
    }
    char *copy = strdup(name);
    if (!copy) return false;
    s->items[s->n].name = copy;
    s->items[s->n].t = *t;
    s->n++;
    return true;
}

bool ls_tensor_set_reserve(ls_tensor_set *s, size_t n) {
    if (n <= s->cap - s->n) return true;
    if (n > SIZE_MAX / sizeof *s->items - s->n) return false;
    ls_named_tensor *items = realloc(s->items, (s->n + n) * sizeof *items);
    if (!items) return false;
    s->items = items;
    s->cap = s->n + n;
    return true;
}

const ls_tensor *ls_tensor_set_find(const ls_tensor_set *s, const char *name) {
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->items[i].name, name)) return &s->items[i].t;
    return NULL;
}

bool ls_tensor_set_add_meta(ls_tensor_set *s, const char *key, const char *value) {
    if (s->n_meta == s->cap_meta) {
        size_t cap = s->cap_meta ? s->cap_meta * 2 : 4;
        ls_meta_entry *meta = realloc(s->meta, cap * sizeof *meta);
        if (!meta) return false;
        s->meta = meta;
        s->cap_meta = cap;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return false;
    }
    s->meta[s->n_meta].key = k;
    s->meta[s->n_meta].value = v;
    s->n_meta++;
    return true;
}

const char *ls_tensor_set_meta(const ls_tensor_set *s, const char *key) {
    for (size_t i = 0; i < s->n_meta; i++)
        if (!strcmp(s->meta[i].key, key)) return s->meta[i].value;
    return NULL;
}
