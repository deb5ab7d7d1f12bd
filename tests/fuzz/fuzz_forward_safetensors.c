/* libFuzzer harness for the safetensors /forward body
 * (ls_forward_req_parse_safetensors: api/forward.c, format/safetensors.c)
 * on the JSON harness's model (n=2, H=4, L=2, at most MAX_TOKENS rows).
 *
 * Input: when it starts with '?', the bytes up to the next NUL are the
 * query's adapter (the name routed beside the body); the rest is the
 * body. Any other input is all body, so plain safetensors files are
 * seeds as they are.
 *
 * Any body must be either rejected cleanly (a status with a message, an
 * error body, req empty) or accepted as a request the file's own reading
 * agrees with: T in [1, MAX_TOKENS], x [T, H] equal to the file's x as
 * f32 and finite, gammas likewise, no metadata key but "adapters" and
 * "format", and each token's adapter the metadata's entry (JSON text of T
 * names or nulls) or else the query's, which must agree with every name
 * the metadata gives. Built only with clang (tests/fuzz/CMakeLists.txt). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/forward.h"
#include "common/tensor.h"
#include "format/safetensors.h"
#include "fuzz_common.h"
#include "fuzz_forward_common.h"

enum { MAX_TOKENS = 8, NAME_MAX_BYTES = 200 };
static const ls_dims DIMS = {.n = 2, .H = 4, .F = 3, .L = 2, .w13_layout = LS_W13_INTERLEAVED};

/* v (rows x cols) is the file's tensor t, as f32, bit for bit. */
static void check_matrix(const ls_tensor *t, const float *v, int rows, int cols) {
    FUZZ_CHECK(t && t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols);
    float *want = malloc((size_t)rows * cols * sizeof *want);
    FUZZ_CHECK(want);
    ls_tensor_to_f32(t, want);
    for (size_t i = 0; i < (size_t)rows * cols; i++) FUZZ_CHECK(isfinite(v[i]) && !memcmp(&v[i], &want[i], 4));
    free(want);
}

/* Token t's adapter as the metadata's JSON says it (list, or NULL), else
 * the query's. */
static const char *want_name(const json_t *list, const char *q_adapter, int t) {
    if (!list) return q_adapter;
    const json_t *e = json_array_get(list, (size_t)t);
    FUZZ_CHECK(e && (json_is_null(e) || json_is_string(e)));
    const char *name = json_string_value(e);
    if (name && q_adapter) FUZZ_CHECK(!strcmp(name, q_adapter));
    return name;
}

static void check_accepted(const ls_forward_req *req, const uint8_t *body, size_t len, const char *q_adapter) {
    const int T = req->T;
    FUZZ_CHECK(T >= 1 && T <= MAX_TOKENS && req->layer == 0 && req->layer_index == 0);
    if (!req->x_borrowed) check_alloc(req->x, (size_t)T * DIMS.H * sizeof(float));
    if (req->gammas) check_alloc(req->gammas, (size_t)T * DIMS.n * sizeof(float));
    check_names(req);

    /* The file as the safetensors reader alone reads it. */
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    ls_error err;
    ls_error_init(&err);
    FUZZ_CHECK(ls_safetensors_parse(body, len, &set, &err) == LS_OK);
    check_matrix(ls_tensor_set_find(&set, "x"), req->x, T, DIMS.H);
    const ls_tensor *g = ls_tensor_set_find(&set, "gammas");
    FUZZ_CHECK(!g == !req->gammas);
    if (g) check_matrix(g, req->gammas, T, DIMS.n);
    for (size_t i = 0; i < set.n_meta; i++)
        FUZZ_CHECK(!strcmp(set.meta[i].key, "adapters") || !strcmp(set.meta[i].key, "format"));
    const char *text = ls_tensor_set_meta(&set, "adapters");
    json_error_t je;
    json_t *list = text ? json_loads(text, 0, &je) : NULL;
    FUZZ_CHECK(!text || (json_is_array(list) && json_array_size(list) == (size_t)T));
    FUZZ_CHECK(!req->names.of_token == (!list && !q_adapter));
    for (int t = 0; t < T; t++) {
        const char *want = want_name(list, q_adapter, t), *got = token_name(req, t);
        FUZZ_CHECK(!want == !got && (!want || !strcmp(want, got)));
    }
    json_decref(list);
    ls_tensor_set_free(&set);
    ls_error_free(&err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char q[NAME_MAX_BYTES + 1];
    const char *q_adapter = NULL;
    size_t off = 0;
    if (size && data[0] == '?') {
        const uint8_t *nul = memchr(data + 1, '\0', size - 1 < NAME_MAX_BYTES ? size - 1 : NAME_MAX_BYTES);
        if (!nul) return 0; /* no query block: not an input of this harness */
        off = (size_t)(nul - data) + 1;
        memcpy(q, data + 1, off - 2);
        q[off - 2] = '\0';
        q_adapter = q;
    }
    /* An exact-size copy: ASan sees a read past the body. */
    const size_t len = size - off;
    uint8_t *body = malloc(len ? len : 1);
    FUZZ_CHECK(body);
    if (len) memcpy(body, data + off, len);

    ls_forward_req req;
    memset(&req, 0xA5, sizeof req); /* the parser must not read it */
    ls_error err;
    ls_error_init(&err);
    ls_status st = ls_forward_req_parse_safetensors(body, len, NULL, q_adapter, &DIMS, MAX_TOKENS, &req, &err);
    if (st != LS_OK) {
        fuzz_check_error(st, &err);
        static const ls_forward_req empty;
        FUZZ_CHECK(!memcmp(&req, &empty, sizeof req));
    } else {
        FUZZ_CHECK(err.code == LS_OK);
        check_accepted(&req, body, len, q_adapter);
        ls_forward_req_free(&req);
    }
    ls_error_free(&err);
    free(body);
    return 0;
}
