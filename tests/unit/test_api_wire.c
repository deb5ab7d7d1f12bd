/* Hostile inputs to the api/ wire formats: error bodies quoting bytes
 * that are not UTF-8, nested JSON tensors whose first elements promise
 * more than the body holds, base64 payloads that disagree with their
 * shape (alone and inside a /forward body), and adapter paths too long to
 * join. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "api/adapter_upload.h"
#include "api/base64.h"
#include "api/error_body.h"
#include "api/forward.h"
#include "api/json_tensor.h"
#include "common/buf.h"
#include "tests/util/testutil.h"

/* The error body of err with the HTTP status the server would give it
 * (server/http_status.c owns the numbers), parsed back (so it must be
 * valid JSON). */
static json_t *error_body_roundtrip(const ls_error *err, int http) {
    char *text = ls_error_body_text(err, http);
    assert_non_null(text);
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    if (!j) fprintf(stderr, "not JSON: %s\n", text);
    assert_non_null(j);
    free(text);
    return j;
}

static void test_error_body_invalid_utf8(void **state) {
    (void)state;
    ls_error err;
    ls_error_init(&err);
    /* A percent-decoded URL byte, as in "no route GET /%FF". */
    ls_error_set(&err, LS_NOT_FOUND, "hint \xfe", "no route GET /\xff");
    json_t *j = error_body_roundtrip(&err, 404);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "not_found");
    assert_int_equal(json_integer_value(json_object_get(e, "status")), 404);
    assert_string_equal(json_string_value(json_object_get(e, "message")), "no route GET /?");
    assert_string_equal(json_string_value(json_object_get(e, "hint")), "hint ?");
    json_decref(j);
    ls_error_free(&err);
}

static void test_error_body_cut_character(void **state) {
    (void)state;
    ls_error err;
    ls_error_init(&err);
    /* "%.4s" of "€€" keeps one whole euro sign and one byte of the next:
     * the whole one stays, the cut one becomes '?'. */
    ls_error_add(&err, LS_LORA_UNKNOWN_TENSOR, 0, "t\xe2\x82\xac\xe2\x82", LS_NA, LS_NA, LS_NA, NULL, "key %.4s",
                 "\xe2\x82\xac\xe2\x82\xac");
    json_t *j = error_body_roundtrip(&err, 422);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "message")), "key \xe2\x82\xac?");
    json_t *v = json_array_get(json_object_get(e, "violations"), 0);
    assert_non_null(v);
    assert_string_equal(json_string_value(json_object_get(v, "message")), "key \xe2\x82\xac?");
    /* two bytes of a three-byte sequence: one '?' each */
    assert_string_equal(json_string_value(json_object_get(v, "tensor")), "t\xe2\x82\xac??");
    json_decref(j);
    ls_error_free(&err);
}

static void test_error_body_overlong_and_surrogate(void **state) {
    (void)state;
    ls_error err;
    ls_error_init(&err);
    /* overlong '/' (C0 AF), a UTF-16 surrogate (ED A0 80), then a valid
     * four-byte character (U+1F600) */
    ls_error_set(&err, LS_INVALID_REQUEST, NULL, "a\xc0\xaf"
                                                 "b\xed\xa0\x80"
                                                 "c\xf0\x9f\x98\x80");
    json_t *j = error_body_roundtrip(&err, 400);
    const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    assert_string_equal(m, "a??b???c\xf0\x9f\x98\x80");
    json_decref(j);
    ls_error_free(&err);
}

static json_t *load(const char *text) {
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    assert_non_null(j);
    return j;
}

/* [[[n zeros], 0, ... n-1 zeros], 0, ... n-1 zeros] for levels levels:
 * the first elements promise n^levels values, the body holds levels*n. */
static char *amplifying_array(int levels, int n) {
    ls_buf b;
    ls_buf_init(&b);
    for (int l = 0; l < levels; l++) ls_buf_append(&b, "[", 1);
    ls_buf_append(&b, "0", 1);
    for (int i = 1; i < n; i++) ls_buf_append(&b, ",0", 2);
    ls_buf_append(&b, "]", 1);
    for (int l = 1; l < levels; l++) {
        for (int i = 1; i < n; i++) ls_buf_append(&b, ",0", 2);
        ls_buf_append(&b, "]", 1);
    }
    char *s = ls_buf_take(&b, NULL);
    assert_non_null(s);
    return s;
}

static void test_nested_tensor_cannot_amplify(void **state) {
    (void)state;
    /* 3 levels of 100000: 1e15 promised floats from a 600 kB body. The
     * whole array is checked before anything is allocated, so this is a
     * ragged-array error, not an allocation of petabytes (out of memory,
     * or an abort under ASan). */
    char *text = amplifying_array(3, 100000);
    json_t *j = load(text);
    free(text);
    ls_error err;
    ls_error_init(&err);
    ls_tensor t;
    assert_int_equal(ls_json_tensor_parse(j, "x", &t, &err), LS_INVALID_SHAPE);
    assert_null(t.data);
    assert_non_null(strstr(err.message, "ragged"));
    json_decref(j);
    ls_error_free(&err);
}

static void test_nested_tensor_values_and_errors(void **state) {
    (void)state;
    ls_error err;
    ls_error_init(&err);
    ls_tensor t;
    json_t *j = load("[[1, 2, 3], [4, 5, 6.5]]");
    assert_int_equal(ls_json_tensor_parse(j, "x", &t, &err), LS_OK);
    assert_int_equal(t.ndim, 2);
    assert_int_equal(t.shape[0], 2);
    assert_int_equal(t.shape[1], 3);
    const float *v = t.data;
    assert_true(v[0] == 1.0f && v[2] == 3.0f && v[5] == 6.5f);
    ls_tensor_free(&t);
    json_decref(j);

    /* a non-number deep inside, a value past float32, a ragged row */
    const char *bad[] = {"[[1, 2], [3, \"4\"]]", "[[1, 1e39]]", "[[1, 2], [3]]", "[[1], [[2]]]"};
    const ls_status want[] = {LS_INVALID_REQUEST, LS_INVALID_REQUEST, LS_INVALID_SHAPE, LS_INVALID_REQUEST};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ls_error_init(&err);
        j = load(bad[i]);
        assert_int_equal(ls_json_tensor_parse(j, "x", &t, &err), want[i]);
        assert_null(t.data);
        json_decref(j);
        ls_error_free(&err);
    }
}

static void test_base64_tensor_sizes(void **state) {
    (void)state;
    ls_error err;
    ls_tensor t;
    /* 2 f32 = 8 bytes = 12 characters with one '=' */
    float two[2] = {1.5f, -2.0f};
    char *data = ls_base64_encode((const uint8_t *)two, sizeof two);
    char text[256];
    snprintf(text, sizeof text, "{\"dtype\": \"f32\", \"shape\": [1, 2], \"data\": \"%s\"}", data);
    json_t *j = load(text);
    ls_error_init(&err);
    assert_int_equal(ls_json_tensor_parse(j, "x", &t, &err), LS_OK);
    assert_true(((float *)t.data)[0] == 1.5f && ((float *)t.data)[1] == -2.0f);
    ls_tensor_free(&t);
    json_decref(j);
    ls_error_free(&err);

    /* the same data under shapes that do not fit it, one whose element
     * count overflows, a negative axis; then bad characters and padding */
    const char *shapes[] = {"[1, 3]", "[1, 1]", "[4294967296, 4294967296, 4]", "[-1, 2]", "[2, 0]"};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        snprintf(text, sizeof text, "{\"dtype\": \"f32\", \"shape\": %s, \"data\": \"%s\"}", shapes[i], data);
        j = load(text);
        ls_error_init(&err);
        assert_int_equal(ls_json_tensor_parse(j, "x", &t, &err), LS_INVALID_SHAPE);
        assert_null(t.data);
        json_decref(j);
        ls_error_free(&err);
    }
    free(data);
    const char *datas[] = {"AAAA AAAAAA=", "AAAAAAAA=AA=", "AAAAAAAAAA==", "AAAAAAA!AAA="};
    const ls_status want[] = {LS_INVALID_REQUEST, LS_INVALID_REQUEST, LS_INVALID_SHAPE, LS_INVALID_REQUEST};
    for (size_t i = 0; i < sizeof datas / sizeof *datas; i++) {
        snprintf(text, sizeof text, "{\"dtype\": \"f32\", \"shape\": [2], \"data\": \"%s\"}", datas[i]);
        j = load(text);
        ls_error_init(&err);
        assert_int_equal(ls_json_tensor_parse(j, "x", &t, &err), want[i]);
        assert_null(t.data);
        json_decref(j);
        ls_error_free(&err);
    }
}

/* use_rslora in the query of a raw body: Python's str(True) ("True") was
 * 400 with the hint to read the API reference; it is taken now, and
 * anything else says what a boolean is. */
static const char *query_rslora(void *ctx, const char *key) {
    return !strcmp(key, "use_rslora") ? ctx : NULL;
}

static void test_upload_bool_spellings(void **state) {
    (void)state;
    static const uint8_t raw[] = {2, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    const char *const yes[] = {"true", "1", "True"}, *const no[] = {"false", "0", "False"};
    for (int i = 0; i < 3; i++) {
        ls_adapter_upload up;
        ls_error err;
        ls_error_init(&err);
        assert_int_equal(ls_adapter_upload_parse_raw(raw, sizeof raw, query_rslora, (void *)yes[i], false, false,
                                                     &up, &err),
                         LS_OK);
        assert_true(up.given.has_rslora && up.given.use_rslora);
        ls_adapter_upload_free(&up);
        assert_int_equal(ls_adapter_upload_parse_raw(raw, sizeof raw, query_rslora, (void *)no[i], false, false, &up,
                                                     &err),
                         LS_OK);
        assert_true(up.given.has_rslora && !up.given.use_rslora);
        ls_adapter_upload_free(&up);
        ls_error_free(&err);
    }
    ls_adapter_upload up;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_adapter_upload_parse_raw(raw, sizeof raw, query_rslora, "yes", false, false, &up, &err),
                     LS_INVALID_REQUEST);
    assert_non_null(strstr(err.message, "use_rslora=yes is not true or false"));
    assert_non_null(strstr(err.hint, "give true or false"));
    ls_error_free(&err);
}

/* gate_up_order as a JSON field and as a query parameter of a raw body:
 * stated, it reaches the loader; a bad value is 400 naming the key. */
static const char *query_order(void *ctx, const char *key) {
    return !strcmp(key, "gate_up_order") ? ctx : NULL;
}

static void test_upload_gate_up_order(void **state) {
    (void)state;
    ls_adapter_upload up;
    ls_error err;
    ls_error_init(&err);
    const char *ok = "{\"name\": \"a\", \"path\": \"p\", \"gate_up_order\": \"interleaved\"}";
    assert_int_equal(ls_adapter_upload_parse_json(ok, strlen(ok), false, true, &up, &err), LS_OK);
    assert_true(up.given.has_order);
    assert_int_equal(up.given.gate_up_order, LS_GATE_UP_ORDER_INTERLEAVED);
    ls_adapter_upload_free(&up);
    const char *bad = "{\"name\": \"a\", \"path\": \"p\", \"gate_up_order\": \"up_gate\"}";
    assert_int_equal(ls_adapter_upload_parse_json(bad, strlen(bad), false, true, &up, &err), LS_INVALID_REQUEST);
    assert_non_null(strstr(err.message, "gate_up_order"));
    ls_error_free(&err);

    /* The smallest safetensors file: an empty header. */
    static const uint8_t raw[] = {2, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    ls_error_init(&err);
    assert_int_equal(ls_adapter_upload_parse_raw(raw, sizeof raw, query_order, "gate_up", false, false, &up, &err),
                     LS_OK);
    assert_true(up.given.has_order);
    assert_int_equal(up.given.gate_up_order, LS_GATE_UP_ORDER_GATE_UP);
    ls_adapter_upload_free(&up);
    assert_int_equal(ls_adapter_upload_parse_raw(raw, sizeof raw, query_order, "both", false, false, &up, &err),
                     LS_INVALID_REQUEST);
    assert_non_null(strstr(err.message, "gate_up_order"));
    ls_error_free(&err);
}

/* null stands for "not given" for name, path and tensors too, as for
 * every other key of an upload. */
static void test_upload_null_is_not_given(void **state) {
    (void)state;
    ls_adapter_upload up;
    ls_error err;
    ls_error_init(&err);
    const char *validate = "{\"name\": null, \"path\": \"p\", \"tensors\": null}";
    assert_int_equal(ls_adapter_upload_parse_json(validate, strlen(validate), false, false, &up, &err), LS_OK);
    assert_string_equal(up.name, "");
    assert_string_equal(up.path, "p");
    ls_adapter_upload_free(&up);
    const char *inline_body = "{\"name\": \"a\", \"path\": null, \"tensors\": {}}";
    assert_int_equal(ls_adapter_upload_parse_json(inline_body, strlen(inline_body), false, true, &up, &err), LS_OK);
    assert_string_equal(up.name, "a");
    assert_string_equal(up.path, "");
    ls_adapter_upload_free(&up);
    const char *load = "{\"name\": null, \"path\": \"p\"}";
    assert_int_equal(ls_adapter_upload_parse_json(load, strlen(load), false, true, &up, &err), LS_INVALID_REQUEST);
    assert_non_null(strstr(err.message, "no name"));
    ls_error_free(&err);
}

/* A tensor read from the text in one pass (as uploads read theirs now)
 * against the same text parsed by jansson and given to
 * ls_json_tensor_parse (as uploads read them before): the same tensor,
 * bit for bit, or the same status and message; text jansson refuses is
 * refused as a syntax error. The cases are the orders a one-pass read
 * could get wrong: an array checked before its elements, a non-array
 * among arrays, escaped base64, -0 (an integer to jansson), keys given
 * twice deep inside, integers past 64 bits, levels past the limit. */
static void test_tensor_read_matches_parse(void **state) {
    (void)state;
    const char *cases[] = {
        "[[1, 2], [3, \"x\", 5]]", "[[1, 2], [3, \"x\"]]", "[[1, 1e39], [2]]", "[[[1], [2]], 5]", "[[[1], [2]], [[3]]]",
        "[[], [1]]", "[[]]", "[]", "[1, [2]]", "[[1], [[2]]]", "[[1, {\"a\": 1}], [2, 3]]", "[[-0, 0.0, -0.0]]",
        "[[1, {\"a\": 1, \"a\": 2}]]", "[[99999999999999999999]]", "[[[[[[[[[1]]]]]]]]]", "[[[[[[[[1]]]]]]]]",
        "[[1, null], [true, 2]]", "[3.4028235e38, 1e-46]", "\"abc\"", "null", "7",
        "{\"dtype\": \"f32\", \"shape\": [1, 2], \"data\": \"AADAPwAAAMA=\"}",
        "{\"data\": \"AADAPwAAAMA\\u003d\", \"shape\": [2], \"dtype\": \"f32\"}",
        "{\"dtype\": \"f32\", \"shape\": [1], \"data\": \"AA\\/A\"}", "{\"dtype\": \"f32\", \"shape\": [1], \"data\": \"AAA\\u00e9\"}",
        "{\"dtype\": \"f32\", \"shape\": [2, 1.0], \"data\": \"\"}", "{\"dtype\": \"f32\", \"shape\": [1,2,3,4,5,6,7,8,9]}",
        "{\"dtype\": \"f32\", \"shape\": [-1], \"data\": \"\", \"x\": 1}", "{\"dtype\": 1, \"shape\": [0], \"data\": \"\"}",
        "{\"dtype\": \"f64\", \"shape\": [0], \"data\": \"\"}", "{\"dtype\": \"f32\", \"shape\": [0], \"data\": \"\", \"dtype\": \"x\"}",
        "{\"dtype\": \"f32\", \"shape\": [4294967296, 4294967296, 4], \"data\": \"\"}",
        "{\"dtype\": \"bf16\", \"shape\": [2], \"data\": \"AAA=\"}", "{\"dtype\": \"f32\", \"shape\": [1], \"data\": \"AA=A\"}",
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *text = cases[i];
        json_error_t jerr;
        json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
        ls_jr r;
        ls_jr_init(&r, text, strlen(text));
        ls_tensor got, want;
        ls_error e_got, e_want;
        ls_error_init(&e_got);
        ls_error_init(&e_want);
        bool read = ls_json_tensor_read(&r, "t", &got, &e_got) && ls_jr_at_end(&r);
        if (!j) {
            if (read) fprintf(stderr, "case %zu: jansson refuses %s (%s), the reader took it\n", i, text, jerr.text);
            assert_false(read);
            assert_null(got.data);
            continue;
        }
        if (!read) fprintf(stderr, "case %zu: the reader refused %s: %s\n", i, text, r.message);
        assert_true(read);
        ls_status st = ls_json_tensor_parse(j, "t", &want, &e_want);
        json_decref(j);
        if (e_got.code != st || strcmp(e_got.message, e_want.message))
            fprintf(stderr, "case %zu %s:\n  read:  %s %s\n  parse: %s %s\n", i, text, ls_status_code(e_got.code),
                    e_got.message, ls_status_code(st), e_want.message);
        assert_int_equal(e_got.code, st);
        assert_string_equal(e_got.message, e_want.message);
        if (st == LS_OK) {
            assert_int_equal(got.dtype, want.dtype);
            assert_int_equal(got.ndim, want.ndim);
            assert_memory_equal(got.shape, want.shape, sizeof got.shape);
            assert_int_equal(got.nbytes, want.nbytes);
            if (got.nbytes) assert_memory_equal(got.data, want.data, got.nbytes);
            ls_tensor_free(&want);
        } else {
            assert_null(got.data);
        }
        ls_tensor_free(&got);
        ls_error_free(&e_got);
        ls_error_free(&e_want);
    }
}

/* An upload's JSON errors are those of a whole parse: a key given twice
 * anywhere (inside a value no key reads, too) is invalid_json before the
 * unknown key; an integer past 64 bits likewise; then the first problem
 * in the order of the keys' checks, whatever order the body has them in. */
static void test_upload_errors_of_a_whole_parse(void **state) {
    (void)state;
    const struct {
        const char *body;
        ls_status code;
        const char *says;
    } cases[] = {
        {"{\"name\": \"a\", \"path\": \"p\", \"x\": {\"k\": 1, \"k\": 2}}", LS_INVALID_JSON, "duplicate object key"},
        {"{\"name\": \"a\", \"path\": \"p\", \"x\": [99999999999999999999]}", LS_INVALID_JSON, "too big integer"},
        {"{\"name\": \"a\", \"tensors\": {\"t\": [1], \"t\": [2]}}", LS_INVALID_JSON, "duplicate object key"},
        {"{\"tensors\": {\"t\": [[1], [1, 2]]}, \"x\": 1, \"name\": \".bad\"}", LS_INVALID_REQUEST, "unknown key \"x\""},
        {"{\"tensors\": {\"t\": [[1], [1, 2]]}, \"name\": \".bad\"}", LS_INVALID_REQUEST, "not a valid adapter name"},
        {"{\"scale\": \"1\", \"tensors\": {\"t\": [[1], [1, 2]]}, \"name\": \"a\"}", LS_INVALID_SHAPE, "ragged"},
        {"{\"config\": [1], \"tensors\": {\"t\": [[1]]}, \"name\": \"a\"}", LS_INVALID_REQUEST, "\"config\" must be"},
        {"{\"name\": \"a\", \"path\": \"p\", \"format\": \"lora\", \"scale\": \"1\"}", LS_INVALID_REQUEST, "\"format\""},
        {"[1, 2]", LS_INVALID_REQUEST, "must be a JSON object"},
        {"{\"name\": \"a\", \"path\": \"p\"} x", LS_INVALID_JSON, "not valid JSON"},
        {"{\"name\": \"a\", \"path\": \"p\"}", LS_OK, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ls_adapter_upload up;
        ls_error err;
        ls_error_init(&err);
        ls_status st = ls_adapter_upload_parse_json(cases[i].body, strlen(cases[i].body), false, true, &up, &err);
        if (st != cases[i].code || !strstr(err.message, cases[i].says))
            fprintf(stderr, "case %zu: %s %s\n", i, ls_status_code(st), err.message);
        assert_int_equal(st, cases[i].code);
        assert_non_null(strstr(err.message, cases[i].says));
        ls_adapter_upload_free(&up);
        ls_error_free(&err);
    }
}

/* A /forward body whose x is a base64 tensor object: read key by key
 * (its strings copied, not lexed by jansson), then checked as any. */
static void test_forward_base64_object(void **state) {
    (void)state;
    const ls_dims dims = {.n = 2, .H = 4, .F = 2, .L = 1};
    const float xv[4] = {1.5f, -2.0f, 0.25f, 3.0f};
    char *data = ls_base64_encode((const uint8_t *)xv, sizeof xv);
    assert_non_null(data);
    /* data with its slashes escaped, as some JSON writers do: decoded first */
    char escaped[64] = "", *o = escaped;
    for (const char *c = data; *c; c++) {
        if (*c == '/') *o++ = '\\';
        *o++ = *c;
    }
    *o = '\0';
    char body[512];
    const char *forms[] = {"{\"x\": {\"dtype\": \"f32\", \"shape\": [1, 4], \"data\": \"%s\"}}",
                           "{\"x\" : { \"data\" :\"%s\" , \"shape\":[ 1,4 ],\"dtype\":\"f32\" } ,\"layer\":0}"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(body, sizeof body, forms[i], i ? escaped : data);
        ls_forward_req req;
        ls_error err;
        ls_error_init(&err);
        assert_int_equal(ls_forward_req_parse_json(body, strlen(body), &dims, 0, &req, &err), LS_OK);
        assert_int_equal(req.T, 1);
        assert_memory_equal(req.x, xv, sizeof xv);
        ls_forward_req_free(&req);
        ls_error_free(&err);
    }
    /* each refused with its code, and nothing kept */
    struct {
        const char *fmt;
        ls_status want;
        const char *says;
    } bad[] = {
        {"{\"x\": {\"dtype\": \"f32\", \"dtype\": \"f32\", \"shape\": [1, 4], \"data\": \"%s\"}}", LS_INVALID_JSON,
         "duplicate"},
        {"{\"x\": {\"dtype\": \"f32\", \"shape\": [1, 4], \"data\": \"%s\", \"extra\": {\"a\": 1, \"a\": 2}}}",
         LS_INVALID_JSON, "duplicate"},
        {"{\"x\": {\"dtype\": \"f32\", \"shape\": [1, 99999999999999999999], \"data\": \"%s\"}}",
         LS_INVALID_JSON, "integer"},
        {"{\"x\": {\"dtype\": \"f32\", \"shape\": [1, 4], \"data\": \"%s\", \"extra\": 1}}", LS_INVALID_REQUEST,
         "exactly"},
        {"{\"x\": {\"dtype\": \"f32\", \"shape\": [2, 4], \"data\": \"%s\"}}", LS_INVALID_SHAPE, NULL},
        {"{\"x\": {\"dtype\": \"f32\", \"shape\": [1, 4], \"data\": \"%s\"", LS_INVALID_JSON, NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(body, sizeof body, bad[i].fmt, data);
        ls_forward_req req;
        ls_error err;
        ls_error_init(&err);
        ls_status st = ls_forward_req_parse_json(body, strlen(body), &dims, 0, &req, &err);
        if (st != bad[i].want || (bad[i].says && !strstr(err.message, bad[i].says)))
            fprintf(stderr, "%s: %s\n", body, err.message);
        assert_int_equal(st, bad[i].want);
        assert_null(req.x);
        if (bad[i].says) assert_non_null(strstr(err.message, bad[i].says));
        ls_error_free(&err);
    }
    free(data);
}

/* "adapter" is one name for the request: a list there is refused with a
 * hint that names "adapters", the per-token key. */
static void test_forward_adapter_list_hint(void **state) {
    (void)state;
    const ls_dims dims = {.n = 2, .H = 4, .F = 2, .L = 1};
    const char *body = "{\"x\": [[1, 2, 3, 4]], \"adapter\": [\"a\"]}";
    ls_forward_req req;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_forward_req_parse_json(body, strlen(body), &dims, 0, &req, &err), LS_INVALID_REQUEST);
    assert_non_null(strstr(err.message, "adapter must be a string or null"));
    assert_non_null(strstr(err.hint, "\"adapters\""));
    ls_error_free(&err);
}

/* A safetensors file of the JSON header text and data_len zero bytes
 * after it, the data `shift` bytes past an 8-aligned offset (header
 * padding); the data are the last data_len bytes of the *len. */
static uint8_t *st_body(const char *header, int shift, size_t data_len, size_t *len) {
    size_t n = strlen(header);
    while ((n + 8) % 8 != (size_t)shift) n++; /* padded with spaces */
    *len = 8 + n + data_len;
    uint8_t *b = calloc(1, *len);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memset(b + 8, ' ', n);
    memcpy(b + 8, header, strlen(header));
    return b;
}

/* A safetensors /forward body of x [2, 4] F32 (with x[1][2] = bad),
 * its data `shift` bytes past an 8-aligned offset (header padding). */
static uint8_t *forward_body(int shift, float bad, size_t *len) {
    uint8_t *b = st_body("{\"x\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[0,32]}}", shift, 32, len);
    for (int i = 0; i < 8; i++) {
        float v = i == 6 ? bad : (float)i * 0.5f - 1.0f;
        memcpy(b + *len - 32 + 4 * i, &v, 4);
    }
    return b;
}

/* An aligned F32 x is read where the body holds it; a misaligned one is
 * copied; either way a value that is not finite is refused by name. */
static void test_forward_x_in_body(void **state) {
    (void)state;
    const ls_dims dims = {.n = 2, .H = 4, .F = 2, .L = 1};
    for (int shift = 0; shift < 2; shift++) {
        size_t len;
        uint8_t *body = forward_body(shift, 2.0f, &len);
        ls_forward_req req;
        ls_error err;
        ls_error_init(&err);
        assert_int_equal(ls_forward_req_parse_safetensors(body, len, NULL, NULL, &dims, 0, &req, &err), LS_OK);
        assert_int_equal(req.T, 2);
        assert_int_equal(req.x_borrowed, shift == 0);
        assert_int_equal((const uint8_t *)req.x == body + len - 32, shift == 0);
        for (int i = 0; i < 8; i++) assert_true(req.x[i] == (i == 6 ? 2.0f : (float)i * 0.5f - 1.0f));
        ls_forward_req_free(&req);
        free(body);
        body = forward_body(shift, INFINITY, &len);
        assert_int_equal(ls_forward_req_parse_safetensors(body, len, NULL, NULL, &dims, 0, &req, &err),
                         LS_INVALID_REQUEST);
        assert_string_equal(err.message, "x[1][2] is not finite");
        assert_null(req.x);
        free(body);
        ls_error_free(&err);
    }
}

/* A safetensors /forward body of x [3, 4] F32 whose __metadata__ is
 * meta (a JSON object's members, "" for none). */
static uint8_t *forward_body_meta(const char *meta, size_t *len) {
    char h[400];
    const char *x = "\"x\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,48]}";
    if (meta[0]) snprintf(h, sizeof h, "{\"__metadata__\":{%s},%s}", meta, x);
    else snprintf(h, sizeof h, "{%s}", x);
    return st_body(h, 0, 48, len);
}

static const ls_dims META_DIMS = {.n = 2, .H = 4, .F = 2, .L = 1};

/* Parses the body of forward_body_meta(meta) with the query's adapter
 * q_adapter (NULL: none) at META_DIMS. */
static ls_status parse_meta(const char *meta, const char *q_adapter, ls_forward_req *req, ls_error *err) {
    size_t len;
    uint8_t *body = forward_body_meta(meta, &len);
    ls_status st = ls_forward_req_parse_safetensors(body, len, NULL, q_adapter, &META_DIMS, 0, req, err);
    free(body);
    return st;
}

/* Per-token adapters ride in the body's metadata: each token's name (or
 * null) is kept by index, the query's adapter must agree with them, and
 * a key the server does not read is refused, never ignored. */
static void test_forward_metadata_adapters(void **state) {
    (void)state;
    ls_forward_req req;
    ls_error err;
    ls_error_init(&err);
    const char *meta = "\"adapters\":\"[\\\"a1\\\", null, \\\"b2\\\"]\",\"format\":\"pt\"";
    assert_int_equal(parse_meta(meta, NULL, &req, &err), LS_OK);
    assert_int_equal(req.names.n, 2);
    assert_string_equal(req.names.names[0], "a1");
    assert_string_equal(req.names.names[1], "b2");
    assert_non_null(req.names.of_token);
    assert_int_equal(req.names.of_token[0], 0);
    assert_int_equal(req.names.of_token[1], -1);
    assert_int_equal(req.names.of_token[2], 1);
    ls_forward_req_free(&req);
    /* The query names a1 for every token, the metadata b2 for token 2. */
    assert_int_equal(parse_meta(meta, "a1", &req, &err), LS_INVALID_REQUEST);
    assert_non_null(strstr(err.message, "token 2"));
    ls_error_free(&err);
    /* No metadata: no token names an adapter. */
    assert_int_equal(parse_meta("", NULL, &req, &err), LS_OK);
    assert_null(req.names.of_token);
    ls_forward_req_free(&req);

    static const struct {
        const char *meta;
        ls_status want;
        const char *says;
    } bad[] = {
        {"\"adapters\":\"[\\\"a1\\\", null]\"", LS_INVALID_SHAPE, "2 entries for 3 tokens"},
        {"\"adapters\":\"[\\\"a1\\\", 7, null]\"", LS_INVALID_REQUEST, "adapters[1] must be a string or null"},
        {"\"adapters\":\"[\\\"a1\\\", \\\"\\\", null]\"", LS_INVALID_REQUEST, "not a valid adapter name"},
        {"\"adapters\":\"a1\"", LS_INVALID_REQUEST, "not JSON"},
        {"\"adapters\":\"{}\"", LS_INVALID_REQUEST, "must be an array"},
        {"\"adaptors\":\"[]\"", LS_INVALID_REQUEST, "did you mean \"adapters\""},
        {"\"layer\":\"1\"", LS_INVALID_REQUEST, "from the query"},
        /* As in a JSON body: a bad name is said before a wrong count. */
        {"\"adapters\":\"[\\\"bad name!\\\"]\"", LS_INVALID_REQUEST, "not a valid adapter name"},
        {"\"adapters\":\"[null, null, null] x\"", LS_INVALID_REQUEST, "not JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ls_status st = parse_meta(bad[i].meta, NULL, &req, &err);
        if (st != bad[i].want || !strstr(err.message, bad[i].says)) fprintf(stderr, "%s: %s\n", bad[i].meta, err.message);
        assert_int_equal(st, bad[i].want);
        assert_non_null(strstr(err.message, bad[i].says));
        assert_null(req.x);
        assert_null(req.names.of_token);
        ls_error_free(&err);
    }
}

/* The metadata's "adapters" follows the JSON body's "adapters": null is
 * no list, a single name points at the query, and a list far longer
 * than the tokens is counted, not kept. */
static void test_forward_metadata_like_json(void **state) {
    (void)state;
    ls_forward_req req;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(parse_meta("\"adapters\":\"null\"", "a1", &req, &err), LS_OK);
    assert_non_null(req.names.of_token); /* the query's a1, for every token */
    assert_int_equal(req.names.n, 1);
    ls_forward_req_free(&req);

    assert_int_equal(parse_meta("\"adapters\":\"\\\"a1\\\"\"", NULL, &req, &err), LS_INVALID_REQUEST);
    assert_non_null(strstr(err.message, "must be an array"));
    assert_non_null(strstr(err.hint, "?adapter=NAME"));
    ls_error_free(&err);

    const int entries = 200000;
    const char *x = "\"x\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,48]}";
    char *h = malloc((size_t)entries * 6 + 200);
    assert_non_null(h);
    size_t at = (size_t)sprintf(h, "{\"__metadata__\":{\"adapters\":\"[");
    for (int i = 0; i < entries; i++) at += (size_t)sprintf(h + at, i ? ",null" : "null");
    sprintf(h + at, "]\"},%s}", x);
    size_t len;
    uint8_t *body = st_body(h, 0, 48, &len);
    assert_int_equal(ls_forward_req_parse_safetensors(body, len, NULL, NULL, &META_DIMS, 0, &req, &err),
                     LS_INVALID_SHAPE);
    assert_non_null(strstr(err.message, "200000 entries for 3 tokens"));
    ls_error_free(&err);
    free(body);
    free(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_x_in_body),
        cmocka_unit_test(test_forward_adapter_list_hint),
        cmocka_unit_test(test_forward_metadata_adapters),
        cmocka_unit_test(test_forward_metadata_like_json),
        cmocka_unit_test(test_upload_gate_up_order),
        cmocka_unit_test(test_upload_bool_spellings),
        cmocka_unit_test(test_upload_null_is_not_given),
        cmocka_unit_test(test_error_body_invalid_utf8),
        cmocka_unit_test(test_error_body_cut_character),
        cmocka_unit_test(test_error_body_overlong_and_surrogate),
        cmocka_unit_test(test_nested_tensor_cannot_amplify),
        cmocka_unit_test(test_nested_tensor_values_and_errors),
        cmocka_unit_test(test_base64_tensor_sizes),
        cmocka_unit_test(test_forward_base64_object),
        cmocka_unit_test(test_tensor_read_matches_parse),
        cmocka_unit_test(test_upload_errors_of_a_whole_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
