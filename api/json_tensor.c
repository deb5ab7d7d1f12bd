/* JSON tensors: nested arrays walked twice (shape, then values) and the
 * base64 object form, both checked against their declared shape. */
#include "api/json_tensor.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/base64.h"

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
        double v = json_number_value(j);
        if (!isfinite(v) || fabs(v) > FLT_MAX)
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s: %g does not fit in float32", what, v);
        if (dst) *(*dst)++ = (float)v;
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

json_t *ls_json_tensor_f32(const float *v, int rows, int cols, int base64) {
    if (base64) {
        char *data = ls_base64_encode((const uint8_t *)v, (size_t)rows * (size_t)cols * 4);
        if (!data) return NULL;
        json_t *o = json_pack("{s:s, s:[i, i], s:s}", "dtype", "f32", "shape", rows, cols, "data", data);
        free(data);
        return o;
    }
    json_t *outer = json_array();
    for (int r = 0; outer && r < rows; r++) {
        json_t *row = json_array();
        if (!row || json_array_append_new(outer, row)) {
            json_decref(outer);
            return NULL;
        }
        for (int c = 0; c < cols; c++) {
            if (json_array_append_new(row, json_real((double)v[(size_t)r * cols + c]))) {
                json_decref(outer);
                return NULL;
            }
        }
    }
    return outer;
}
