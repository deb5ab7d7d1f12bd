/* JSON tensors: nested arrays walked twice (shape, then values) and the
 * base64 object form, both checked against their declared shape. */
#include "api/json_tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/base64.h"
#include "common/text.h"

/* Shape from the first element at every depth. */
static int ls_json_tensor_shape(const json_t *j, int64_t *shape) {
    int nd = 0;
    while (json_is_array(j)) {
        if (nd == LS_MAX_DIMS) return -1;
        shape[nd++] = (int64_t)json_array_size(j);
        if (json_array_size(j) == 0) break;
        j = json_array_get(j, 0);
    }
    return nd;
}

/* Copies values in row-major order, checking every sub-array has the
 * shape the first elements promised. With dst NULL it only checks. */
static ls_status ls_json_tensor_fill(const json_t *j, const int64_t *shape, int nd, int depth, float **dst,
                                     const char *what, ls_error *err) {
    if (depth == nd) {
        if (!json_is_number(j))
            return ls_error_set(err, LS_INVALID_REQUEST, "tensor values must be JSON numbers",
                                "%s: expected a number at depth %d, found a JSON %s", what, depth,
                                json_is_array(j) ? "array (the array is deeper than its first element)"
                                : json_is_string(j) ? "string"
                                : json_is_null(j)   ? "null"
                                                    : "value");
        /* What rounds to a finite float fits: 3.4028235e38, FLT_MAX as
         * float32 is printed, is a little above FLT_MAX as a double. */
        double v = json_number_value(j);
        float f = (float)v;
        if (!isfinite(f))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s: %g does not fit in float32", what, v);
        if (dst) *(*dst)++ = f;
        return LS_OK;
    }
    if (!json_is_array(j) || (int64_t)json_array_size(j) != shape[depth])
        return ls_error_set(err, LS_INVALID_SHAPE, "every row of a nested array must have the same length",
                            "%s: ragged array: axis %d has %lld elements in the first row but %lld elsewhere",
                            what, depth, (long long)shape[depth],
                            json_is_array(j) ? (long long)json_array_size(j) : -1LL);
    for (size_t i = 0; i < json_array_size(j); i++) {
        ls_status st = ls_json_tensor_fill(json_array_get(j, i), shape, nd, depth + 1, dst, what, err);
        if (st != LS_OK) return st;
    }
    return LS_OK;
}

static ls_status ls_json_tensor_parse_nested(const json_t *j, const char *what, ls_tensor *out, ls_error *err) {
    int64_t shape[LS_MAX_DIMS];
    int nd = ls_json_tensor_shape(j, shape);
    if (nd < 0)
        return ls_error_set(err, LS_INVALID_SHAPE, NULL, "%s: more than %d nested levels", what, LS_MAX_DIMS);
    /* Check the whole array before allocating: the first elements alone
     * can promise a shape far larger than the body (a hostile [[1e5
     * numbers], 0, 0, ...] would ask for gigabytes). Once checked, the
     * element count is bounded by the numbers actually sent. */
    ls_status st = ls_json_tensor_fill(j, shape, nd, 0, NULL, what, err);
    if (st != LS_OK) return st;
    if (!ls_tensor_alloc_f32(out, shape, nd))
        return ls_error_set(err, LS_INTERNAL, NULL, "%s: out of memory", what);
    float *p = out->data;
    st = ls_json_tensor_fill(j, shape, nd, 0, &p, what, err);
    if (st != LS_OK) ls_tensor_free(out);
    return st;
}

static ls_status ls_json_tensor_parse_base64(const json_t *j, const char *what, ls_tensor *out, ls_error *err) {
    json_t *jdtype = json_object_get(j, "dtype"), *jshape = json_object_get(j, "shape"),
           *jdata = json_object_get(j, "data");
    if (!json_is_string(jdtype) || !json_is_array(jshape) || !json_is_string(jdata) || json_object_size(j) != 3)
        return ls_error_set(err, LS_INVALID_REQUEST, "send {\"dtype\", \"shape\", \"data\"} and nothing else",
                            "%s: a tensor object needs exactly \"dtype\" (string), \"shape\" (array) and "
                            "\"data\" (base64 string)",
                            what);
    ls_dtype dt;
    if (!ls_dtype_parse(json_string_value(jdtype), &dt))
        return ls_error_set(err, LS_INVALID_REQUEST, "dtype is one of f32, f16, bf16", "%s: unknown dtype \"%s\"",
                            what, json_string_value(jdtype));
    size_t nd = json_array_size(jshape);
    if (nd > LS_MAX_DIMS)
        return ls_error_set(err, LS_INVALID_SHAPE, NULL, "%s: shape has %zu axes, at most %d", what, nd, LS_MAX_DIMS);
    int64_t shape[LS_MAX_DIMS];
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(jshape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return ls_error_set(err, LS_INVALID_SHAPE, NULL, "%s: shape[%zu] is not a non-negative integer", what, i);
        shape[i] = json_integer_value(d);
    }
    int64_t numel = ls_shape_numel(shape, (int)nd);
    size_t esize = ls_dtype_size(dt);
    size_t slen = json_string_length(jdata);
    if (numel < 0 || (uint64_t)numel > SIZE_MAX / esize)
        return ls_error_set(err, LS_INVALID_SHAPE, NULL, "%s: shape is too large", what);
    size_t want = (size_t)numel * esize;
    /* Check the declared size against the text before allocating. */
    if (slen % 4 || ls_base64_decoded_max(slen) < want || slen / 4 * 3 > want + 2)
        return ls_error_set(err, LS_INVALID_SHAPE, NULL,
                            "%s: %zu base64 characters cannot hold %zu bytes (shape of %lld %s values)", what, slen,
                            want, (long long)numel, ls_dtype_name(dt));
    memset(out, 0, sizeof *out);
    out->data = malloc(ls_base64_decoded_max(slen));
    if (!out->data) return ls_error_set(err, LS_INTERNAL, NULL, "%s: out of memory", what);
    size_t got = 0;
    if (!ls_base64_decode(json_string_value(jdata), slen, out->data, &got)) {
        free(out->data);
        out->data = NULL;
        return ls_error_set(err, LS_INVALID_REQUEST, "data is standard base64 with padding, no whitespace",
                            "%s: data is not valid base64", what);
    }
    if (got != want) {
        free(out->data);
        out->data = NULL;
        return ls_error_set(err, LS_INVALID_SHAPE, NULL, "%s: data holds %zu bytes, shape needs %zu", what, got,
                            want);
    }
    out->dtype = dt;
    out->ndim = (int)nd;
    memcpy(out->shape, shape, nd * sizeof *shape);
    out->nbytes = want;
    out->owned = true;
    return LS_OK;
}

ls_status ls_json_tensor_parse(const json_t *j, const char *what, ls_tensor *out, ls_error *err) {
    memset(out, 0, sizeof *out);
    if (json_is_array(j)) return ls_json_tensor_parse_nested(j, what, out, err);
    if (json_is_object(j)) return ls_json_tensor_parse_base64(j, what, out, err);
    return ls_error_set(err, LS_INVALID_REQUEST, "send nested arrays or {\"dtype\", \"shape\", \"data\"}",
                        "%s: a tensor must be an array or an object", what);
}

char *ls_json_take_text(json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return s;
}

ls_status ls_json_check_keys(const json_t *root, const char *const *known, const char *what, ls_error *err) {
    if (!json_is_object(root)) return ls_error_set(err, LS_INVALID_REQUEST, NULL, "the body must be a JSON object");
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)root, key, val) {
        size_t i = 0;
        while (known[i] && strcmp(key, known[i])) i++;
        if (known[i]) continue;
        char hint[256], near[96];
        ls_text_unknown_key(key, known, hint, sizeof hint, near, sizeof near);
        return ls_error_set(err, LS_INVALID_REQUEST, hint, "unknown key \"%.64s\" in the %s%s", key, what, near);
    }
    return LS_OK;
}

/* Writes what snprintf("%.9g") writes, with the exponent as e-7 rather
 * than e-07, about 14x faster: measured on the CI machine (2026-11-30),
 * 16 ns a value against 230 ns, so a T=1 /forward on H=1024 spends 16 us
 * instead of 236 us writing y, which was the largest server cost of a
 * lone token. tests/unit/test_json_number.c compares the two on 20
 * million values. llrint rounds half to even in the default rounding
 * mode, as snprintf does; the server never changes that mode. */
size_t ls_json_format_f32(float v, char *buf) {
    char *p = buf;
    double d = v;
    if (signbit(v)) {
        *p++ = '-';
        d = -d;
    }
    if (d == 0.0 || !isfinite(d)) { /* non-finite never reaches JSON: callers check */
        *p++ = '0';
        *p = '\0';
        return (size_t)(p - buf);
    }
    /* nine significant digits always round-trip a float32. The decimal
     * exponent e (10^e <= d < 10^(e+1)) from the binary one: with
     * 2^e2 <= d < 2^(e2+1), floor(e2 log10 2) is e or e - 1 ((e2 * 78913)
     * >> 18 is that floor for |e2| < 1650); libm's log10 cost a fifth of
     * the formatting. Subnormals, rare, keep log10. */
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    const int be = (int)((bits >> 23) & 0xFF);
    int e;
    if (be == 0) e = (int)floor(log10(d));
    else {
        e = ((be - 127) * 78913) >> 18;
        if (d >= ls_pow10(e + 1)) e++;
    }
    /* t = d * 10^(8-e) has nine digits before the point; m is t rounded
     * half to even, as snprintf rounds the exact decimal value of d. */
    double t = d * ls_pow10(8 - e);
    if (t >= 999999999.5) t = d * ls_pow10(8 - ++e);
    else if (t < 99999999.5) t = d * ls_pow10(8 - --e);
    long long m = llrint(t);
    if (fabs(t - (double)m) > 0.4999 || m < 100000000LL || m >= 1000000000LL) {
        /* The product rounded to double is within a few 1e-7 of the
         * exact one, so only when it lands this near a half can its last
         * bits pick the wrong digit (27 floats in 713 million, checked
         * against every third float): there the C library, which rounds
         * the exact value, decides. */
        char sci[32];
        snprintf(sci, sizeof sci, "%.8e", d); /* d.dddddddde±x */
        m = sci[0] - '0';
        for (int i = 2; i < 10; i++) m = m * 10 + (sci[i] - '0');
        e = atoi(sci + 11);
    }
    /* the nine digits two at a time: four independent pairs and a lead */
    static const char pairs[] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                "8081828384858687888990919293949596979899";
    char digits[10];
    const uint32_t hi = (uint32_t)(m / 10000), lo = (uint32_t)(m % 10000);
    digits[0] = (char)('0' + hi / 10000);
    memcpy(digits + 1, pairs + 2 * (hi / 100 % 100), 2);
    memcpy(digits + 3, pairs + 2 * (hi % 100), 2);
    memcpy(digits + 5, pairs + 2 * (lo / 100), 2);
    memcpy(digits + 7, pairs + 2 * (lo % 100), 2);
    int nd = 9;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (e >= 0 && e < 9) { /* 123.456 */
        for (int i = 0; i <= e; i++) *p++ = i < nd ? digits[i] : '0';
        if (nd > e + 1) {
            *p++ = '.';
            for (int i = e + 1; i < nd; i++) *p++ = digits[i];
        }
    } else if (e < 0 && e >= -4) { /* 0.000123, as %g would */
        *p++ = '0';
        *p++ = '.';
        for (int i = -1; i > e; i--) *p++ = '0';
        for (int i = 0; i < nd; i++) *p++ = digits[i];
    } else { /* 1.23e-07 */
        *p++ = digits[0];
        if (nd > 1) {
            *p++ = '.';
            for (int i = 1; i < nd; i++) *p++ = digits[i];
        }
        p += sprintf(p, "e%d", e);
    }
    *p = '\0';
    return (size_t)(p - buf);
}

bool ls_json_tensor_f32_text(ls_buf *b, const float *v, int rows, int cols) {
    char num[32];
    ls_buf_append(b, "[", 1);
    for (int r = 0; r < rows; r++) {
        ls_buf_append(b, r ? ",[" : "[", r ? 2 : 1);
        for (int c = 0; c < cols; c++) {
            size_t n = ls_json_format_f32(v[(size_t)r * cols + c], num + 1);
            num[0] = ',';
            ls_buf_append(b, c ? num : num + 1, c ? n + 1 : n);
        }
        ls_buf_append(b, "]", 1);
    }
    return ls_buf_append(b, "]", 1);
}

bool ls_json_tensor_f32_base64_text(ls_buf *b, const float *v, int rows, int cols) {
    const size_t bytes = (size_t)rows * (size_t)cols * 4;
    ls_buf_printf(b, "{\"dtype\":\"f32\",\"shape\":[%d,%d],\"data\":\"", rows, cols);
    char *at = ls_buf_extend(b, ls_base64_encoded_len(bytes));
    if (at) ls_base64_encode_to((const uint8_t *)v, bytes, at);
    return ls_buf_append(b, "\"}", 2);
}
