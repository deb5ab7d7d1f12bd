/* libFuzzer harness for the streaming JSON /forward parser
 * (ls_forward_req_parse_json: api/forward_json.c, format/json_reader.c,
 * api/forward.c) on a small fixed model (n=2, H=4, L=2) with at most
 * MAX_TOKENS rows. Any body must be either
 *  - rejected cleanly: a status with a message, an error body, req empty;
 *    and LS_INVALID_JSON whenever jansson rejects the body, never when
 *    jansson accepts it (the reader's promise: strict JSON as jansson
 *    reads it, less the few cases reader_stricter lists); or
 *  - accepted as a request jansson agrees with: T in [1, MAX_TOKENS], a
 *    valid layer, x [T, H] and gammas [T, n] of finite floats equal to
 *    the body's numbers, names NULL or T valid names; and its response
 *    (JSON, base64 or safetensors, with x as y) reads back as x (through
 *    ls_json_tensor_parse, as an adapter upload's tensors are read).
 * Everything is freed with the module's own functions (ASan's leak check).
 * Built only with clang (tests/fuzz/CMakeLists.txt). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/forward.h"
#include "api/json_tensor.h"
#include "format/safetensors.h"
#include "fuzz_common.h"
#include "fuzz_forward_common.h"

enum { MAX_TOKENS = 8 };
static const ls_dims DIMS = {.n = 2, .H = 4, .F = 3, .L = 2, .w13_layout = LS_W13_INTERLEAVED};

static bool same_float(float a, float b) { return !memcmp(&a, &b, sizeof a); }

/* The accepted field j (jansson's reading of the body) against the rows x
 * cols floats v: nested arrays value by value, a base64 object by shape. */
static void check_tensor(const json_t *j, const float *v, int rows, int cols) {
    if (json_is_object(j)) {
        /* read with JSON_DECODE_INT_AS_REAL: the sizes are reals here */
        const json_t *shape = json_object_get(j, "shape");
        FUZZ_CHECK(json_array_size(shape) == 2 && json_number_value(json_array_get(shape, 0)) == rows &&
                   json_number_value(json_array_get(shape, 1)) == cols);
        return;
    }
    FUZZ_CHECK(json_is_array(j) && json_array_size(j) == (size_t)rows);
    for (int i = 0; i < rows; i++) {
        const json_t *row = json_array_get(j, (size_t)i);
        FUZZ_CHECK(json_is_array(row) && json_array_size(row) == (size_t)cols);
        for (int k = 0; k < cols; k++) {
            const json_t *num = json_array_get(row, (size_t)k);
            FUZZ_CHECK(json_is_number(num) && same_float((float)json_number_value(num), v[(size_t)i * cols + k]));
        }
    }
}

/* y of a response is v: bit for bit as base64, value for value as numbers. */
static void check_y(const json_t *y, const float *v, int rows, int cols) {
    ls_tensor t;
    ls_error err;
    ls_error_init(&err);
    FUZZ_CHECK(ls_json_tensor_parse(y, "y", &t, &err) == LS_OK);
    FUZZ_CHECK(t.ndim == 2 && t.shape[0] == rows && t.shape[1] == cols && t.dtype == LS_DTYPE_F32);
    if (json_is_object(y)) {
        FUZZ_CHECK(!memcmp(t.data, v, (size_t)rows * cols * sizeof *v));
    } else {
        /* == rather than the bits: "-0" reads back as the integer 0 */
        for (size_t i = 0; i < (size_t)rows * cols; i++) FUZZ_CHECK(((float *)t.data)[i] == v[i]);
    }
    ls_tensor_free(&t);
    ls_error_free(&err);
}

static void check_accepted(const ls_forward_req *req, const json_t *doc) {
    const int T = req->T, H = DIMS.H, n = DIMS.n;
    FUZZ_CHECK(T >= 1 && T <= MAX_TOKENS && req->layer >= 0 && req->layer < DIMS.L);
    check_alloc(req->x, (size_t)T * H * sizeof(float));
    for (size_t i = 0; i < (size_t)T * H; i++) FUZZ_CHECK(isfinite(req->x[i]));
    if (req->gammas) {
        check_alloc(req->gammas, (size_t)T * n * sizeof(float));
        for (size_t i = 0; i < (size_t)T * n; i++) FUZZ_CHECK(isfinite(req->gammas[i]));
    }
    check_names(req);

    /* jansson's reading of the same body says the same. */
    FUZZ_CHECK(json_is_object(doc));
    const json_t *layer = json_object_get(doc, "layer"), *g = json_object_get(doc, "gammas");
    const json_t *one = json_object_get(doc, "adapter"), *list = json_object_get(doc, "adapters");
    const json_t *enc = json_object_get(doc, "encoding");
    FUZZ_CHECK(json_is_number(layer) ? json_number_value(layer) == req->layer : req->layer == 0);
    FUZZ_CHECK(req->base64 == (json_is_string(enc) && !strcmp(json_string_value(enc), "base64")));
    check_tensor(json_object_get(doc, "x"), req->x, T, H);
    FUZZ_CHECK(!req->gammas == (!g || json_is_null(g)));
    if (req->gammas) check_tensor(g, req->gammas, T, n);
    if (json_is_array(list)) {
        FUZZ_CHECK(req->names.of_token && json_array_size(list) == (size_t)T);
        for (int t = 0; t < T; t++) {
            const json_t *e = json_array_get(list, (size_t)t);
            FUZZ_CHECK(json_is_null(e) ? !token_name(req, t) : !strcmp(json_string_value(e), token_name(req, t)));
        }
    } else if (json_is_string(one)) {
        FUZZ_CHECK(req->names.of_token && req->names.n == 1);
        for (int t = 0; t < T; t++) FUZZ_CHECK(token_name(req, t) && !strcmp(token_name(req, t), json_string_value(one)));
    } else {
        FUZZ_CHECK(!req->names.of_token);
    }

    /* The responses carry x (as y) back unchanged. */
    const ls_pool_used used[] = {{"a", 1, 0}, {"b.c-d_e", UINT64_MAX, 7}};
    char *text = ls_forward_resp_json(req, H, req->x, used, 2);
    FUZZ_CHECK(text);
    json_error_t je;
    json_t *resp = json_loads(text, 0, &je);
    FUZZ_CHECK(resp);
    json_int_t rl = -1, rt = -1;
    json_t *y = NULL, *adapters = NULL;
    FUZZ_CHECK(!json_unpack(resp, "{s:o, s:I, s:I, s:o}", "y", &y, "layer", &rl, "tokens", &rt, "adapters", &adapters));
    FUZZ_CHECK(rl == req->layer && rt == T && json_array_size(adapters) == 2);
    FUZZ_CHECK(json_is_object(y) == req->base64);
    check_y(y, req->x, T, H);
    json_decref(resp);
    free(text);

    uint8_t *st_body = NULL;
    size_t st_len = 0;
    ls_error err;
    ls_error_init(&err);
    FUZZ_CHECK(ls_forward_resp_safetensors(req, H, req->x, used, 2, &st_body, &st_len, &err) == LS_OK);
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    FUZZ_CHECK(ls_safetensors_parse(st_body, st_len, &set, &err) == LS_OK);
    const ls_tensor *ty = ls_tensor_set_find(&set, "y");
    FUZZ_CHECK(ty && ty->dtype == LS_DTYPE_F32 && ty->ndim == 2 && ty->shape[0] == T && ty->shape[1] == H);
    FUZZ_CHECK(!memcmp(ty->data, req->x, (size_t)T * H * sizeof(float)));
    ls_tensor_set_free(&set);
    free(st_body);
    ls_error_free(&err);
}

/* Where the reader refuses what the reference reading below accepts, by
 * design: a number of 512 characters or more; a NUL byte, which jansson
 * 2.14 drops after a number or a literal ("[1\0]" loads); an integer past
 * json_int_t in a base64 tensor object, which the reader hands to jansson
 * as it is (the reference reads every number as a real). */
static bool reader_stricter(const char *body, size_t size, const ls_error *err) {
    /* jansson says "too big integer" or "too big negative integer" */
    return strstr(err->message, "number too long") || strstr(err->message, "too big") || memchr(body, '\0', size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* An exact-size copy: the body is not NUL-terminated, and ASan sees a
     * read one past its end. */
    char *body = malloc(size ? size : 1);
    FUZZ_CHECK(body);
    if (size) memcpy(body, data, size);

    ls_forward_req req;
    memset(&req, 0xA5, sizeof req); /* the parser must not read it */
    ls_error err;
    ls_error_init(&err);
    ls_status st = ls_forward_req_parse_json(body, size, &DIMS, MAX_TOKENS, &req, &err);

    /* jansson as the reference reader: any top-level value, integers as
     * reals (the reader takes numbers of any size as floats), duplicate keys
     * left to the check below (the reader refuses them as it meets them). */
    json_error_t je;
    const size_t flags = JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL;
    json_t *doc = json_loadb(body, size, flags, &je);
    if (!doc) FUZZ_CHECK(st == LS_INVALID_JSON);

    if (st != LS_OK) {
        fuzz_check_error(st, &err);
        static const ls_forward_req empty;
        FUZZ_CHECK(!memcmp(&req, &empty, sizeof req));
        if (st == LS_INVALID_JSON && !reader_stricter(body, size, &err)) {
            json_t *strict = json_loadb(body, size, flags | JSON_REJECT_DUPLICATES, &je);
            FUZZ_CHECK(!strict);
        }
    } else {
        FUZZ_CHECK(err.code == LS_OK && doc);
        check_accepted(&req, doc);
        ls_forward_req_free(&req);
    }
    json_decref(doc);
    ls_error_free(&err);
    free(body);
    return 0;
}
