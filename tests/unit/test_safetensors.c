/* api/safetensors.c and common/file.c: valid files (including one written
 * by the safetensors library), each rule of docs/safetensors.md on its own,
 * int64 edge cases, the writer's round trip, and the file helpers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "format/safetensors.h"
#include "tests/util/testutil.h"
#include "common/file.h"

/* Length field + header + body in a buffer of exactly that size, so that
 * AddressSanitizer sees any read past the end. */
static uint8_t *mk_file(const char *header, size_t hlen, const void *body, size_t blen, size_t *len) {
    *len = 8 + hlen + blen;
    uint8_t *b = malloc(*len);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(b + 8, header, hlen);
    if (blen) {
        if (body)
            memcpy(b + 8 + hlen, body, blen);
        else
            memset(b + 8 + hlen, 0xab, blen);
    }
    return b;
}

typedef struct {
    uint8_t *buf;
    size_t len;
    ls_tensor_set set;
    ls_error err;
    ls_status st;
} parsed;

static void parse_buf(parsed *p, uint8_t *buf, size_t len) {
    p->buf = buf;
    p->len = len;
    ls_tensor_set_init(&p->set);
    ls_error_init(&p->err);
    p->st = ls_safetensors_parse(buf, len, &p->set, &p->err);
}

static void parse_hdr(parsed *p, const char *header, size_t blen) {
    size_t len;
    uint8_t *b = mk_file(header, strlen(header), NULL, blen, &len);
    parse_buf(p, b, len);
}

static void parsed_free(parsed *p) {
    ls_tensor_set_free(&p->set);
    ls_error_free(&p->err);
    free(p->buf);
}

static void assert_set_empty(const ls_tensor_set *s) {
    assert_int_equal(s->n, 0);
    assert_int_equal(s->n_meta, 0);
    assert_null(s->items);
    assert_null(s->meta);
}

/* The parse failed with LS_SAFETENSORS_INVALID, every violation carries
 * that code, and one of them mentions needle and names tensor (in its
 * tensor field and its message), or no tensor when tensor is NULL. */
static void assert_invalid(const parsed *p, const char *tensor, const char *needle) {
    if (p->st != LS_SAFETENSORS_INVALID) fail_msg("expected safetensors_invalid, got %s", ls_status_code(p->st));
    assert_int_equal(p->err.code, LS_SAFETENSORS_INVALID);
    assert_true(p->err.n_violations >= 1);
    assert_int_equal(strncmp(p->err.message, "safetensors: ", 13), 0);
    char quoted[256];
    snprintf(quoted, sizeof quoted, "tensor \"%s\"", tensor ? tensor : "");
    bool found = false;
    for (size_t i = 0; i < p->err.n_violations; i++) {
        const ls_violation *v = &p->err.violations[i];
        assert_int_equal(v->code, LS_SAFETENSORS_INVALID);
        if (!strstr(v->message, needle)) continue;
        if (tensor ? !strcmp(v->tensor, tensor) && strstr(v->message, quoted) != NULL : v->tensor[0] == '\0')
            found = true;
    }
    if (!found)
        fail_msg("no violation mentions \"%s\" for tensor \"%s\"; first: %s", needle, tensor ? tensor : "(none)",
                 p->err.message);
    assert_set_empty(&p->set);
}

static void expect_invalid(const char *header, size_t blen, const char *tensor, const char *needle) {
    parsed p;
    parse_hdr(&p, header, blen);
    assert_invalid(&p, tensor, needle);
    parsed_free(&p);
}

static void expect_valid(const char *header, size_t blen, size_t n_tensors) {
    parsed p;
    parse_hdr(&p, header, blen);
    if (p.st != LS_OK) fail_msg("%s: %s", header, p.err.message);
    assert_int_equal(p.set.n, n_tensors);
    parsed_free(&p);
}

/* ---- valid files -------------------------------------------------------- */

static void test_float_dtypes(void **state) {
    (void)state;
    /* The data section holds bf16, then f32, then f16; the header lists
     * them in another order, which the result keeps. */
    const float f32v[4] = {1.0f, -2.0f, 0.5f, 3.0f};
    uint8_t body[4 + 16 + 6];
    const uint8_t bf16[4] = {0x80, 0x3f, 0x40, 0xc0};      /* 1.0, -3.0 */
    const uint8_t f16[6] = {0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38}; /* 1.0, -2.0, 0.5 */
    memcpy(body, bf16, 4);
    memcpy(body + 4, f32v, 16);
    memcpy(body + 20, f16, 6);
    const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[4,20]},"
                    "\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[20,26]},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[0,4]}}";
    size_t len;
    uint8_t *buf = mk_file(h, strlen(h), body, sizeof body, &len);
    parsed p;
    parse_buf(&p, buf, len);
    assert_int_equal(p.st, LS_OK);
    assert_int_equal(p.err.code, LS_OK);
    assert_int_equal(p.set.n, 3);
    assert_string_equal(p.set.items[0].name, "w");
    assert_string_equal(p.set.items[1].name, "h");
    assert_string_equal(p.set.items[2].name, "b");

    const ls_tensor *w = ls_tensor_set_find(&p.set, "w");
    assert_int_equal(w->dtype, LS_DTYPE_F32);
    assert_int_equal(w->ndim, 2);
    assert_int_equal(w->shape[0], 2);
    assert_int_equal(w->shape[1], 2);
    assert_int_equal(w->nbytes, 16);
    assert_false(w->owned);
    size_t hl = strlen(h);
    assert_ptr_equal(w->data, buf + 8 + hl + 4); /* borrowed from buf */
    float out[4];
    assert_true(ls_tensor_to_f32(w, out));
    assert_memory_equal(out, f32v, sizeof f32v);

    const ls_tensor *t = ls_tensor_set_find(&p.set, "h");
    assert_int_equal(t->dtype, LS_DTYPE_F16);
    assert_ptr_equal(t->data, buf + 8 + hl + 20);
    assert_true(ls_tensor_to_f32(t, out));
    assert_true(out[0] == 1.0f && out[1] == -2.0f && out[2] == 0.5f);

    t = ls_tensor_set_find(&p.set, "b");
    assert_int_equal(t->dtype, LS_DTYPE_BF16);
    assert_int_equal(t->ndim, 2);
    assert_ptr_equal(t->data, buf + 8 + hl);
    assert_true(ls_tensor_to_f32(t, out));
    assert_true(out[0] == 1.0f && out[1] == -3.0f);
    parsed_free(&p);
}

/* Bytes the safetensors library (0.8, safetensors.numpy.save) wrote for
 * w = [[1.5, -2], [0.25, 8]] (F32), h = [1, -0.5, 65504] (F16),
 * e = zeros(0, 3) (F32), i = [7, -1] (I64), with two metadata strings. */
static void test_library_file(void **state) {
    (void)state;
    const char *h = "{\"__metadata__\":{\"w13_layout\":\"contiguous\",\"format\":\"np\"},"
                    "\"i\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
                    "\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[16,16]},"
                    "\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,32]},"
                    "\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[32,38]}}       ";
    const uint8_t body[38] = {0x07, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                              0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x00, 0xc0, 0x00, 0x00, 0x80, 0x3e,
                              0x00, 0x00, 0x00, 0x41, 0x00, 0x3c, 0x00, 0xb8, 0xff, 0x7b};
    assert_int_equal(strlen(h), 0x120); /* the library's length field */
    size_t len;
    uint8_t *buf = mk_file(h, strlen(h), body, sizeof body, &len);
    parsed p;
    parse_buf(&p, buf, len);
    if (p.st != LS_OK) fail_msg("%s", p.err.message);
    assert_int_equal(p.set.n, 4);
    assert_string_equal(ls_tensor_set_meta(&p.set, "format"), "np");
    assert_string_equal(ls_tensor_set_meta(&p.set, "w13_layout"), "contiguous");
    const ls_tensor *e = ls_tensor_set_find(&p.set, "e");
    assert_int_equal(e->nbytes, 0);
    assert_int_equal(e->shape[0], 0);
    assert_int_equal(e->shape[1], 3);
    float out[4];
    assert_true(ls_tensor_to_f32(ls_tensor_set_find(&p.set, "w"), out));
    assert_true(out[0] == 1.5f && out[1] == -2.0f && out[2] == 0.25f && out[3] == 8.0f);
    assert_true(ls_tensor_to_f32(ls_tensor_set_find(&p.set, "h"), out));
    assert_true(out[0] == 1.0f && out[1] == -0.5f && out[2] == 65504.0f);
    const ls_tensor *i = ls_tensor_set_find(&p.set, "i");
    assert_int_equal(i->dtype, LS_DTYPE_I64);
    int64_t iv[2];
    memcpy(iv, i->data, 16);
    assert_int_equal(iv[0], 7);
    assert_int_equal(iv[1], -1);
    parsed_free(&p);
}

static void test_metadata(void **state) {
    (void)state;
    parsed p;
    parse_hdr(&p,
              "{\"x\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
              "\"__metadata__\":{\"format\":\"pt\",\"w13_layout\":\"interleaved\",\"empty\":\"\"}}",
              3);
    assert_int_equal(p.st, LS_OK);
    assert_int_equal(p.set.n, 1);
    assert_int_equal(p.set.n_meta, 3);
    assert_string_equal(ls_tensor_set_meta(&p.set, "format"), "pt");
    assert_string_equal(ls_tensor_set_meta(&p.set, "w13_layout"), "interleaved");
    assert_string_equal(ls_tensor_set_meta(&p.set, "empty"), "");
    assert_null(ls_tensor_set_meta(&p.set, "other"));
    assert_null(ls_tensor_set_find(&p.set, "__metadata__"));
    parsed_free(&p);
    /* Metadata only, and an empty metadata object. */
    expect_valid("{\"__metadata__\":{\"a\":\"b\"}}", 0, 0);
    expect_valid("{\"__metadata__\":{}}", 0, 0);
}

static void test_zero_size_and_scalars(void **state) {
    (void)state;
    /* Zero-size tensors at the start, between and at the end, and a scalar
     * (shape []) of one element. */
    parsed p;
    parse_hdr(&p,
              "{\"z0\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]},"
              "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"z1\":{\"dtype\":\"BF16\",\"shape\":[4,0],\"data_offsets\":[8,8]},"
              "\"s\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[8,12]},"
              "\"z2\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[12,12]}}",
              12);
    if (p.st != LS_OK) fail_msg("%s", p.err.message);
    assert_int_equal(p.set.n, 5);
    const ls_tensor *s = ls_tensor_set_find(&p.set, "s");
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->nbytes, 4);
    assert_int_equal(ls_tensor_numel(s), 1);
    assert_int_equal(ls_tensor_set_find(&p.set, "z2")->nbytes, 0);
    parsed_free(&p);
    /* Only zero-size tensors and no data at all. */
    expect_valid("{\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, 1);
}

static void test_empty_and_padding(void **state) {
    (void)state;
    expect_valid("{}", 0, 0);
    expect_valid("{}      ", 0, 0);
    expect_valid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}   ", 4, 1);
    /* Every safetensors dtype is parsed (the caller refuses the ones it
     * cannot compute with). */
    expect_valid("{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[8,16]},"
                 "\"c\":{\"dtype\":\"U64\",\"shape\":[1],\"data_offsets\":[16,24]},"
                 "\"d\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[24,28]},"
                 "\"e\":{\"dtype\":\"U32\",\"shape\":[1],\"data_offsets\":[28,32]},"
                 "\"f\":{\"dtype\":\"I16\",\"shape\":[1],\"data_offsets\":[32,34]},"
                 "\"g\":{\"dtype\":\"U16\",\"shape\":[1],\"data_offsets\":[34,36]},"
                 "\"h\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[36,37]},"
                 "\"i\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[37,38]},"
                 "\"j\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[38,39]},"
                 "\"k\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[39,40]},"
                 "\"l\":{\"dtype\":\"F8_E5M2\",\"shape\":[1],\"data_offsets\":[40,41]}}",
                 41, 12);
    /* A name may be any UTF-8 text. */
    expect_valid("{\"\xc3\xa9t\xc3\xa9 \\u00e9\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, 1);
}

/* ---- the length field and the header's framing -------------------------- */

static void expect_invalid_raw(const uint8_t *bytes, size_t len, const char *needle) {
    uint8_t *b = len ? malloc(len) : NULL;
    if (len) memcpy(b, bytes, len);
    parsed p;
    parse_buf(&p, b, len);
    assert_invalid(&p, NULL, needle);
    parsed_free(&p);
}

static void test_length_field(void **state) {
    (void)state;
    expect_invalid_raw(NULL, 0, "shorter than the 8-byte header length");
    expect_invalid_raw((const uint8_t *)"\x02\x00\x00", 3, "shorter than the 8-byte header length");
    expect_invalid_raw((const uint8_t *)"\0\0\0\0\0\0\0", 7, "shorter than the 8-byte header length");
    expect_invalid_raw((const uint8_t *)"\0\0\0\0\0\0\0\0", 8, "header length is 0");
    expect_invalid_raw((const uint8_t *)"\0\0\0\0\0\0\0\0{}", 10, "header length is 0");
    /* 100,000,001 = 0x05f5e101; the file holds far less, but the limit is
     * reported first. */
    expect_invalid_raw((const uint8_t *)"\x01\xe1\xf5\x05\0\0\0\0{}", 10, "exceeds the limit");
    expect_invalid_raw((const uint8_t *)"\xff\xff\xff\xff\xff\xff\xff\xff{}", 10, "exceeds the limit");
    expect_invalid_raw((const uint8_t *)"\x03\0\0\0\0\0\0\0{}", 10, "runs past the end of the file");
    expect_invalid_raw((const uint8_t *)"\x00\xe1\xf5\x05\0\0\0\0{}", 10, "runs past the end of the file");
    /* PyTorch's formats given for safetensors (adapter_model.bin) are
     * named, and a pickle is never read; so is a Git LFS pointer. */
    expect_invalid_raw((const uint8_t *)"PK\x03\x04\x14\0\0\0\0\0archive/data.pkl", 26, "a zip archive, as torch.save");
    expect_invalid_raw((const uint8_t *)"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20", 10, "a pickle");
    const char *lfs = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 1024\n";
    expect_invalid_raw((const uint8_t *)lfs, strlen(lfs), "a Git LFS pointer");
    /* A real header of 640 bytes begins 0x80 0x02 too: it is read. */
    uint8_t *b = malloc(8 + 640);
    memcpy(b, "\x80\x02\0\0\0\0\0\0{}", 10);
    memset(b + 10, ' ', 638);
    /* ... and such a file cut short is a cut file, not a pickle. */
    expect_invalid_raw(b, 600, "runs past the end of the file");
    parsed p;
    parse_buf(&p, b, 8 + 640); /* p owns b */
    assert_int_equal(p.st, LS_OK);
    parsed_free(&p);
}

/* A header of exactly the limit is accepted: the bound is inclusive. */
static void test_header_at_limit(void **state) {
    (void)state;
    size_t n = LS_SAFETENSORS_MAX_HEADER, len;
    char *h = malloc(n);
    assert_non_null(h);
    memset(h, ' ', n);
    memcpy(h, "{}", 2);
    uint8_t *buf = mk_file(h, n, NULL, 0, &len);
    free(h);
    parsed p;
    parse_buf(&p, buf, len);
    assert_int_equal(p.st, LS_OK);
    parsed_free(&p);
}

static void test_header_framing(void **state) {
    (void)state;
    expect_invalid(" {}", 0, NULL, "does not start with '{'");
    expect_invalid("[]", 0, NULL, "does not start with '{'");
    expect_invalid("\"s\"", 0, NULL, "does not start with '{'");
    expect_invalid("{not json}", 0, NULL, "not valid JSON");
    expect_invalid("{} x", 0, NULL, "not valid JSON");
    expect_invalid("{}{}", 0, NULL, "not valid JSON");
    expect_invalid("{", 0, NULL, "not valid JSON");
    expect_invalid("{\"\xff\":{}}", 0, NULL, "not valid JSON");   /* invalid UTF-8 */
    expect_invalid("{\"\xc0\xaf\":{}}", 0, NULL, "not valid JSON"); /* overlong */
    expect_invalid("{\"\\ud800\":{}}", 0, NULL, "not valid JSON");  /* lone surrogate */
    expect_invalid("{\"a\\u0000\":{}}", 0, NULL, "not valid JSON"); /* escaped NUL */
    size_t len;
    uint8_t *b = mk_file("{}\0     ", 8, NULL, 0, &len);
    parsed p;
    parse_buf(&p, b, len);
    assert_invalid(&p, NULL, "NUL byte at offset 2");
    parsed_free(&p);
}

static void test_duplicates(void **state) {
    (void)state;
    const char *e = "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}";
    char h[256];
    snprintf(h, sizeof h, "{\"x\":%s,\"x\":%s}", e, e);
    expect_invalid(h, 1, NULL, "duplicate");
    expect_invalid("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", 0, NULL, "duplicate");
    expect_invalid("{\"x\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, NULL,
                   "duplicate");
}

static void test_metadata_rules(void **state) {
    (void)state;
    expect_invalid("{\"__metadata__\":\"pt\"}", 0, NULL, "__metadata__ is a string");
    expect_invalid("{\"__metadata__\":[]}", 0, NULL, "__metadata__ is an array");
    expect_invalid("{\"__metadata__\":{\"k\":1}}", 0, NULL, "value of \"k\" is an integer");
    expect_invalid("{\"__metadata__\":{\"k\":null}}", 0, NULL, "value of \"k\" is null");
    expect_invalid("{\"__metadata__\":{\"k\":{\"a\":\"b\"}}}", 0, NULL, "value of \"k\" is an object");
}

/* ---- entries ----------------------------------------------------------- */

static void test_entry_fields(void **state) {
    (void)state;
    expect_invalid("{\"x\":[1,2]}", 0, "x", "entry is an array");
    expect_invalid("{\"x\":{}}", 0, "x", "missing dtype");
    expect_invalid("{\"x\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "x", "missing dtype");
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "x", "missing shape");
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "x", "missing data_offsets");
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", 4, "x",
                   "unknown field \"extra\"");
    expect_invalid("{\"x\":{\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "x",
                   "unknown dtype \"F128\"");
    expect_invalid("{\"x\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "x", "unknown dtype \"f32\"");
    expect_invalid("{\"x\":{\"dtype\":\"\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "x", "unknown dtype");
    expect_invalid("{\"x\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "x", "dtype is an integer");
    expect_invalid("{\"x\":{\"dtype\":null,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "x", "dtype is null");
    /* A tensor named like the metadata key must follow the metadata rules. */
    expect_invalid("{\"__metadata__\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, NULL,
                   "value of \"shape\" is an array");
}

static void test_shape_rules(void **state) {
    (void)state;
    parsed p;
    parse_hdr(&p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,4]}}", 4);
    assert_invalid(&p, "x", "shape axis 1 is -1");
    assert_int_equal(p.err.violations[0].axis, 1);
    parsed_free(&p);
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "x",
                   "shape axis 0 is a real number");
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[true],\"data_offsets\":[0,4]}}", 4, "x",
                   "shape axis 0 is a boolean");
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[[1]],\"data_offsets\":[0,4]}}", 4, "x",
                   "shape axis 0 is an array");
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", 4, "x", "shape is an integer");
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "x",
                   "shape has 9 dimensions, at most 8");
    expect_valid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, 1);
}

static void test_offset_rules(void **state) {
    (void)state;
    const char *needle = "two non-negative integers";
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, "x", needle);
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 4, "x", needle);
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.0,4.0]}}", 4, "x", needle);
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, "x", needle);
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", 4, "x", needle);
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",\"4\"]}}", 4, "x", needle);
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":null}}", 4, "x", needle);
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "x",
                   "[4, 0] end before they begin");
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 2, "x",
                   "run past the 2-byte data section");
}

/* The size rule, with the exact message of the contract. */
static void test_size_rule(void **state) {
    (void)state;
    parsed p;
    parse_hdr(&p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 12);
    assert_invalid(&p, "x", "hold 12 bytes");
    assert_string_equal(p.err.message,
                        "safetensors: tensor \"x\": data_offsets [0, 12] hold 12 bytes, shape [2, 2] of F32 needs 16");
    assert_int_equal(p.err.n_violations, 1);
    assert_int_equal(p.err.violations[0].expected, 16);
    assert_int_equal(p.err.violations[0].got, 12);
    parsed_free(&p);
    expect_invalid("{\"x\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "x",
                   "shape [4] of BF16 needs 8");
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,4]}}", 4, "x", "needs 0");
}

static void test_layout_rules(void **state) {
    (void)state;
    const char *a = "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}";
    char h[512];
    snprintf(h, sizeof h, "{%s,\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[20,36]}}", a);
    expect_invalid(h, 36, "b", "gap of 4 bytes after tensor \"a\"");
    snprintf(h, sizeof h, "{\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]},%s}", a);
    expect_invalid(h, 24, "b", "overlap tensor \"a\"");
    /* Two entries with the same range: either may be the one reported. */
    snprintf(h, sizeof h, "{%s,\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", a);
    parsed p;
    parse_hdr(&p, h, 16);
    assert_int_equal(p.st, LS_SAFETENSORS_INVALID);
    assert_int_equal(p.err.n_violations, 1);
    assert_true(!strcmp(p.err.violations[0].tensor, "a") || !strcmp(p.err.violations[0].tensor, "b"));
    assert_non_null(strstr(p.err.message, "overlap tensor"));
    assert_set_empty(&p.set);
    parsed_free(&p);
    snprintf(h, sizeof h, "{%s,\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}", a);
    expect_invalid(h, 16, "z", "overlap tensor \"a\"");
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "x", "begins at 4, not 0");
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 5, NULL, "1 trailing bytes");
    expect_invalid("{}", 3, NULL, "trailing bytes");
    expect_invalid("{\"__metadata__\":{\"a\":\"b\"}}", 1, NULL, "trailing bytes");
}

/* Every broken entry is reported, not only the first; the set is emptied
 * even when it held tensors before the call. */
static void test_every_violation(void **state) {
    (void)state;
    parsed p;
    parse_hdr(&p,
              "{\"a\":{\"dtype\":\"F99\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"ok\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[8,4]},"
              "\"__metadata__\":{\"k\":false}}",
              8);
    assert_invalid(&p, "a", "unknown dtype");
    assert_invalid(&p, "b", "end before they begin");
    assert_invalid(&p, "b", "shape axis 0 is -1");
    assert_invalid(&p, NULL, "value of \"k\" is a boolean");
    assert_int_equal(p.err.n_violations, 4);
    parsed_free(&p);
}

static void test_int64_edges(void **state) {
    (void)state;
    /* Offsets at and beyond int64. */
    expect_invalid("{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,9223372036854775807]}}", 1, "x",
                   "run past the 1-byte data section");
    expect_invalid("{\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[9223372036854775807,"
                   "9223372036854775807]}}",
                   0, "x", "run past");
    expect_invalid("{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,9223372036854775808]}}", 1, NULL,
                   "not valid JSON");
    expect_invalid("{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1e400]}}", 1, NULL, "not valid JSON");
    /* A dim of INT64_MAX of a 1-byte dtype fits int64: a plain mismatch. */
    parsed p;
    parse_hdr(&p, "{\"x\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807],\"data_offsets\":[0,16]}}", 16);
    assert_invalid(&p, "x", "needs 9223372036854775807");
    assert_int_equal(p.err.violations[0].expected, INT64_MAX);
    parsed_free(&p);
    /* Element counts that overflow. */
    expect_invalid("{\"x\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807,2],\"data_offsets\":[0,16]}}", 16, "x",
                   "more elements than int64");
    expect_invalid("{\"x\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,16]}}", 16, "x",
                   "more elements than int64");
    expect_invalid("{\"x\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807,2,0],\"data_offsets\":[0,0]}}", 0, "x",
                   "more elements than int64");
    /* Element counts that fit but whose byte count overflows. */
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[2305843009213693952],\"data_offsets\":[0,16]}}", 16, "x",
                   "more bytes than int64");
    expect_invalid("{\"x\":{\"dtype\":\"F64\",\"shape\":[1152921504606846976],\"data_offsets\":[0,16]}}", 16, "x",
                   "more bytes than int64");
    /* One element less: 2^63 - 4 bytes fits, a mismatch. */
    expect_invalid("{\"x\":{\"dtype\":\"F32\",\"shape\":[2305843009213693951],\"data_offsets\":[0,16]}}", 16, "x",
                   "needs 9223372036854775804");
    /* A zero dim makes the product 0 whatever follows (as the safetensors
     * library computes it, left to right with overflow checks). */
    expect_valid("{\"x\":{\"dtype\":\"U8\",\"shape\":[0,9223372036854775807],\"data_offsets\":[0,0]}}", 0, 1);
    expect_invalid("{\"x\":{\"dtype\":\"U8\",\"shape\":[9223372036854775808],\"data_offsets\":[0,0]}}", 0, NULL,
                   "not valid JSON");
}

/* ---- writer ------------------------------------------------------------ */

static void add(ls_tensor_set *s, const char *name, ls_dtype dt, const int64_t *shape, int ndim, void *data,
                size_t nbytes) {
    ls_tensor t = {0};
    t.dtype = dt;
    t.ndim = ndim;
    if (ndim) memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    t.data = data;
    t.nbytes = nbytes;
    t.owned = false;
    assert_true(ls_tensor_set_add(s, name, &t));
}

static void test_writer_round_trip(void **state) {
    (void)state;
    float w[6] = {1, 2, 3, 4, 5, -6.5f};
    uint16_t h[4] = {0x3c00, 0xc000, 0x7bff, 0x0001};
    uint16_t b[2] = {0x3f80, 0xff80};
    int64_t sc = -42;
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    add(&s, "w", LS_DTYPE_F32, (int64_t[]){2, 3}, 2, w, sizeof w);
    add(&s, "z", LS_DTYPE_U8, (int64_t[]){0}, 1, NULL, 0);
    add(&s, "h", LS_DTYPE_F16, (int64_t[]){4}, 1, h, sizeof h);
    add(&s, "scalar", LS_DTYPE_I64, NULL, 0, &sc, sizeof sc);
    add(&s, "b", LS_DTYPE_BF16, (int64_t[]){1, 2}, 2, b, sizeof b);
    assert_true(ls_tensor_set_add_meta(&s, "format", "pt"));
    assert_true(ls_tensor_set_add_meta(&s, "w13_layout", "contiguous"));

    uint8_t *out;
    size_t len;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_safetensors_write(&s, &out, &len, &err), LS_OK);

    /* Layout checked from the bytes: the length field is a multiple of 8,
     * the header is JSON padded with spaces, metadata first, offsets
     * consecutive in the set's order. */
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)out[i] << (8 * i);
    assert_int_equal(n % 8, 0);
    assert_int_equal(len, 8 + n + sizeof w + sizeof h + sizeof sc + sizeof b);
    const char *first = "{\"__metadata__\":{\"format\":\"pt\",\"w13_layout\":\"contiguous\"},\"w\":";
    assert_int_equal(strncmp((const char *)out + 8, first, strlen(first)), 0);
    size_t jl = n;
    while (jl > 0 && out[8 + jl - 1] == ' ') jl--;
    assert_int_equal(out[8 + jl - 1], '}');
    assert_true(n - jl < 8);
    json_error_t je;
    json_t *root = json_loadb((const char *)out + 8, jl, JSON_REJECT_DUPLICATES, &je);
    assert_non_null(root);
    const char *names[] = {"w", "z", "h", "scalar", "b"};
    const int64_t ends[] = {24, 24, 32, 40, 44};
    int64_t at = 0;
    for (int i = 0; i < 5; i++) {
        json_t *offs = json_object_get(json_object_get(root, names[i]), "data_offsets");
        assert_int_equal(json_integer_value(json_array_get(offs, 0)), at);
        assert_int_equal(json_integer_value(json_array_get(offs, 1)), ends[i]);
        at = ends[i];
    }
    assert_int_equal(json_array_size(json_object_get(json_object_get(root, "scalar"), "shape")), 0);
    json_decref(root);

    parsed p;
    parse_buf(&p, out, len);
    if (p.st != LS_OK) fail_msg("%s", p.err.message);
    assert_int_equal(p.set.n, 5);
    for (size_t i = 0; i < 5; i++) {
        const ls_tensor *x = &s.items[i].t, *y = &p.set.items[i].t;
        assert_string_equal(p.set.items[i].name, s.items[i].name);
        assert_int_equal(y->dtype, x->dtype);
        assert_int_equal(y->ndim, x->ndim);
        assert_memory_equal(y->shape, x->shape, (size_t)x->ndim * sizeof *x->shape);
        assert_int_equal(y->nbytes, x->nbytes);
        if (x->nbytes) assert_memory_equal(y->data, x->data, x->nbytes);
    }
    assert_string_equal(ls_tensor_set_meta(&p.set, "w13_layout"), "contiguous");

    /* Writing what was read gives the same bytes. */
    uint8_t *again;
    size_t len2;
    assert_int_equal(ls_safetensors_write(&p.set, &again, &len2, &err), LS_OK);
    assert_int_equal(len2, len);
    assert_memory_equal(again, out, len);
    free(again);
    parsed_free(&p); /* frees out */
    ls_tensor_set_free(&s);
    ls_error_free(&err);
}

/* ls_safetensors_write_before writes the bytes ls_safetensors_write
 * does, in front of data already in place, and refuses (writing
 * nothing) data that is not where the set says or a header that does not
 * fit. */
static void test_writer_before(void **state) {
    (void)state;
    enum { ROOM = 256 };
    uint8_t buf[ROOM + 24 + 8];
    memset(buf, 0x5a, sizeof buf);
    float *w = (float *)(void *)(buf + ROOM);
    for (int i = 0; i < 6; i++) w[i] = (float)i - 2.5f;
    memcpy(buf + ROOM + 24, (uint16_t[]){0x3f80, 0xc000, 0x4040, 0x7f80}, 8);
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    add(&s, "y", LS_DTYPE_F32, (int64_t[]){2, 3}, 2, buf + ROOM, 24);
    add(&s, "b", LS_DTYPE_BF16, (int64_t[]){4}, 1, buf + ROOM + 24, 8);
    assert_true(ls_tensor_set_add_meta(&s, "layer", "3"));
    uint8_t *out;
    size_t len, start = 0, len2 = 0;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_safetensors_write(&s, &out, &len, &err), LS_OK);
    assert_int_equal(ls_safetensors_write_before(&s, buf, ROOM, &start, &len2, &err), LS_OK);
    assert_int_equal(len2, len);
    assert_int_equal(start + len, sizeof buf);
    assert_memory_equal(buf + start, out, len);
    assert_int_equal(buf[start - 1], 0x5a); /* nothing before the file */

    /* A header that does not fit, or data elsewhere: refused, untouched. */
    uint8_t copy[sizeof buf];
    memcpy(copy, buf, sizeof buf);
    assert_int_equal(ls_safetensors_write_before(&s, buf + ROOM - 16, 16, &start, &len2, &err), LS_INTERNAL);
    assert_non_null(strstr(err.message, "does not fit"));
    ls_error_free(&err);
    ls_error_init(&err);
    assert_int_equal(ls_safetensors_write_before(&s, buf + 8, ROOM - 8 - 4, &start, &len2, &err), LS_INTERNAL);
    assert_non_null(strstr(err.message, "\"y\" is not where"));
    assert_memory_equal(buf, copy, sizeof buf);
    free(out);
    ls_tensor_set_free(&s);
    ls_error_free(&err);
}

static void test_writer_empty(void **state) {
    (void)state;
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    uint8_t *out;
    size_t len;
    assert_int_equal(ls_safetensors_write(&s, &out, &len, NULL), LS_OK);
    assert_int_equal(len, 16);
    assert_memory_equal(out, "\x08\0\0\0\0\0\0\0{}      ", 16);
    parsed p;
    parse_buf(&p, out, len);
    assert_int_equal(p.st, LS_OK);
    assert_int_equal(p.set.n, 0);
    parsed_free(&p);
}

static void expect_write_fails(ls_tensor_set *s, const char *needle) {
    uint8_t *out = (uint8_t *)1;
    size_t len = 1;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_safetensors_write(s, &out, &len, &err), LS_INTERNAL);
    assert_null(out);
    assert_int_equal(len, 0);
    if (!strstr(err.message, needle)) fail_msg("\"%s\" lacks \"%s\"", err.message, needle);
    ls_error_free(&err);
    ls_tensor_set_free(s);
}

static void test_writer_refuses(void **state) {
    (void)state;
    float v[2] = {1, 2};
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    add(&s, "x", LS_DTYPE_F32, (int64_t[]){2}, 1, v, sizeof v);
    add(&s, "x", LS_DTYPE_F32, (int64_t[]){2}, 1, v, sizeof v);
    expect_write_fails(&s, "repeated");
    ls_tensor_set_init(&s);
    add(&s, "__metadata__", LS_DTYPE_F32, (int64_t[]){2}, 1, v, sizeof v);
    expect_write_fails(&s, "reserved");
    ls_tensor_set_init(&s);
    add(&s, "x", LS_DTYPE_F32, (int64_t[]){3}, 1, v, sizeof v);
    expect_write_fails(&s, "inconsistent");
    ls_tensor_set_init(&s);
    add(&s, "x", LS_DTYPE_F32, (int64_t[]){-2}, 1, v, sizeof v);
    expect_write_fails(&s, "inconsistent");
    ls_tensor_set_init(&s);
    add(&s, "x", LS_DTYPE_F32, (int64_t[]){2}, 1, NULL, sizeof v);
    expect_write_fails(&s, "inconsistent");
    ls_tensor_set_init(&s);
    add(&s, "\xff", LS_DTYPE_F32, (int64_t[]){2}, 1, v, sizeof v);
    expect_write_fails(&s, "UTF-8");
    ls_tensor_set_init(&s);
    assert_true(ls_tensor_set_add_meta(&s, "k", "a"));
    assert_true(ls_tensor_set_add_meta(&s, "k", "b"));
    expect_write_fails(&s, "twice");
}

/* ---- file helpers ------------------------------------------------------- */

static char *tmpdir; /* ls_test_mkdtemp's; removed whole afterwards */

static int make_tmpdir(void **state) {
    (void)state;
    tmpdir = ls_test_mkdtemp();
    return tmpdir ? 0 : -1;
}

static int remove_tmpdir(void **state) {
    (void)state;
    ls_test_rmtree(tmpdir);
    free(tmpdir);
    tmpdir = NULL;
    return 0;
}

static void write_file(const char *name, const void *data, size_t len, char *path, size_t plen) {
    snprintf(path, plen, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (len) assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void test_file_map(void **state) {
    (void)state;
    char path[128];
    const char *h = "{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}";
    size_t len;
    uint8_t *bytes = mk_file(h, strlen(h), "hi", 2, &len);
    write_file("data", bytes, len, path, sizeof path);
    ls_file_map m;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_file_map_open(path, &m, LS_SAFETENSORS_INVALID, &err), LS_OK);
    assert_true(m.mapped);
    assert_int_equal(m.len, len);
    assert_memory_equal(m.data, bytes, len);
    free(bytes);
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    assert_int_equal(ls_safetensors_parse(m.data, m.len, &s, &err), LS_OK);
    assert_memory_equal(ls_tensor_set_find(&s, "x")->data, "hi", 2);
    ls_tensor_set_free(&s);
    ls_file_map_close(&m);
    assert_null(m.data);
    ls_file_map_close(&m); /* twice is harmless */

    /* A 0-byte file maps to nothing, and is then invalid safetensors. */
    write_file("empty", NULL, 0, path, sizeof path);
    assert_int_equal(ls_file_map_open(path, &m, LS_SAFETENSORS_INVALID, &err), LS_OK);
    assert_null(m.data);
    assert_int_equal(m.len, 0);
    assert_false(m.mapped);
    ls_tensor_set_init(&s);
    assert_int_equal(ls_safetensors_parse(m.data, m.len, &s, &err), LS_SAFETENSORS_INVALID);
    ls_file_map_close(&m);
    ls_error_free(&err);

    /* Not regular files, and a missing one: the caller's code, the path
     * and the reason in the message. */
    struct {
        const char *path, *needle;
    } bad[] = {{tmpdir, "a directory"}, {"/dev/null", "a character device"}, {NULL, "a FIFO"},
               {"/nonexistent/x.safetensors", "No such file"}};
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/fifo", tmpdir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    bad[2].path = fifo;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ls_error_init(&err);
        m.data = (uint8_t *)1;
        assert_int_equal(ls_file_map_open(bad[i].path, &m, LS_INVALID_REQUEST, &err), LS_INVALID_REQUEST);
        assert_int_equal(err.code, LS_INVALID_REQUEST);
        assert_null(m.data);
        assert_non_null(strstr(err.message, bad[i].path));
        if (!strstr(err.message, bad[i].needle)) fail_msg("\"%s\" lacks \"%s\"", err.message, bad[i].needle);
        ls_error_free(&err);
    }
}

static void test_file_read_text(void **state) {
    (void)state;
    char path[128];
    write_file("text", "{\"r\": 8}", 8, path, sizeof path);
    ls_error err;
    ls_error_init(&err);
    char *text;
    assert_int_equal(ls_file_read_text(path, 8, &text, LS_ADAPTER_CONFIG_INVALID, &err), LS_OK);
    assert_string_equal(text, "{\"r\": 8}");
    free(text);
    text = (char *)1;
    assert_int_equal(ls_file_read_text(path, 7, &text, LS_ADAPTER_CONFIG_INVALID, &err), LS_ADAPTER_CONFIG_INVALID);
    assert_null(text);
    assert_non_null(strstr(err.message, "larger than the limit of 7"));
    ls_error_free(&err);

    write_file("empty", NULL, 0, path, sizeof path);
    assert_int_equal(ls_file_read_text(path, 0, &text, LS_ADAPTER_CONFIG_INVALID, &err), LS_OK);
    assert_string_equal(text, "");
    free(text);

    ls_error_init(&err);
    assert_int_equal(ls_file_read_text(tmpdir, 100, &text, LS_INVALID_REQUEST, &err), LS_INVALID_REQUEST);
    assert_null(text);
    assert_non_null(strstr(err.message, "a directory"));
    ls_error_free(&err);
    ls_error_init(&err);
    assert_int_equal(ls_file_read_text("/nonexistent/adapter_config.json", 100, &text, LS_INVALID_REQUEST, &err),
                     LS_INVALID_REQUEST);
    assert_non_null(strstr(err.message, "/nonexistent/adapter_config.json"));
    ls_error_free(&err);
}

/* A header of more tensors than the caller takes is refused from its
 * count (LS_PAYLOAD_TOO_LARGE), before any entry is kept, by the parse
 * and the header check alike; at the limit it reads. */
static void test_tensor_limit(void **state) {
    (void)state;
    const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"__metadata__\":{\"k\":\"v\"},"
                    "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]},"
                    "\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}";
    size_t len;
    uint8_t *b = mk_file(h, strlen(h), "xyz", 3, &len);
    for (size_t max = 1; max <= 4; max++) {
        ls_tensor_set set;
        ls_tensor_set_init(&set);
        ls_error err;
        ls_error_init(&err);
        ls_status st = ls_safetensors_parse_max(b, len, max, &set, &err);
        ls_error cerr;
        ls_error_init(&cerr);
        ls_status ch = ls_safetensors_check_header(b, len, len, max, &cerr);
        ls_error_free(&cerr);
        if (max < 3) {
            assert_int_equal(st, LS_PAYLOAD_TOO_LARGE);
            assert_int_equal(ch, LS_PAYLOAD_TOO_LARGE);
            assert_non_null(strstr(err.message, "more than the limit of"));
            assert_set_empty(&set);
        } else {
            assert_int_equal(st, LS_OK);
            assert_int_equal(ch, LS_OK);
            assert_int_equal(set.n, 3);
            assert_string_equal(ls_tensor_set_meta(&set, "k"), "v");
        }
        ls_tensor_set_free(&set);
        ls_error_free(&err);
    }
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float_dtypes),
        cmocka_unit_test(test_library_file),
        cmocka_unit_test(test_metadata),
        cmocka_unit_test(test_zero_size_and_scalars),
        cmocka_unit_test(test_empty_and_padding),
        cmocka_unit_test(test_length_field),
        cmocka_unit_test(test_header_at_limit),
        cmocka_unit_test(test_header_framing),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_metadata_rules),
        cmocka_unit_test(test_entry_fields),
        cmocka_unit_test(test_shape_rules),
        cmocka_unit_test(test_offset_rules),
        cmocka_unit_test(test_size_rule),
        cmocka_unit_test(test_layout_rules),
        cmocka_unit_test(test_every_violation),
        cmocka_unit_test(test_int64_edges),
        cmocka_unit_test(test_tensor_limit),
        cmocka_unit_test(test_writer_round_trip),
        cmocka_unit_test(test_writer_before),
        cmocka_unit_test(test_writer_empty),
        cmocka_unit_test(test_writer_refuses),
        cmocka_unit_test(test_file_map),
        cmocka_unit_test(test_file_read_text),
    };
    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
