/* The fast float32 JSON formatter: every value must read back (as a JSON
 * number parsed to double, then float) as exactly the same float, be a
 * valid JSON number, and be what snprintf("%.9g") writes (its exponent
 * without the leading zero); checked on edge values and millions of
 * random bit patterns. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "api/json_tensor.h"

/* snprintf("%.9g") with the exponent written as ours is: e-7, e20. */
static void reference_text(float v, char *out, size_t len) {
    char ref[40];
    snprintf(ref, sizeof ref, "%.9g", (double)v);
    char *e = strchr(ref, 'e');
    if (!e) {
        snprintf(out, len, "%s", ref);
        return;
    }
    *e = '\0';
    snprintf(out, len, "%se%d", ref, atoi(e + 1));
}

static void check_roundtrip(float v) {
    char buf[40];
    size_t n = ls_json_format_f32(v, buf);
    assert_int_equal(n, strlen(buf));
    assert_true(n < 20);
    json_error_t jerr;
    json_t *j = json_loadb(buf, n, JSON_DECODE_ANY, &jerr);
    if (!j) fprintf(stderr, "not JSON: %s (from %a)\n", buf, (double)v);
    assert_non_null(j);
    float back = (float)json_number_value(j);
    if (memcmp(&back, &v, 4) && !(v == 0 && back == 0)) fprintf(stderr, "%a -> %s -> %a\n", (double)v, buf, (double)back);
    assert_true(back == v);
    json_decref(j);
    char want[48];
    reference_text(v, want, sizeof want);
    if (v != 0 && strcmp(buf, want)) fprintf(stderr, "%a: ours %s, %%.9g %s\n", (double)v, buf, want);
    assert_true(v == 0 || !strcmp(buf, want));
}

static void test_edges(void **state) {
    (void)state;
    const float edges[] = {0.0f, 1.0f, -1.0f, 0.1f, 0.5f, 123.456f, 1e-5f, 9.99999e-6f, 1e9f, 123456789.0f,
                           999999999.0f, 1e10f, FLT_MAX, -FLT_MAX, FLT_MIN, FLT_TRUE_MIN, -FLT_TRUE_MIN,
                           1.17549421e-38f, 3.0e38f, 16777216.0f, 16777217.0f, 0.3f, 2.0f / 3.0f, 1e-45f};
    for (size_t i = 0; i < sizeof edges / sizeof *edges; i++) check_roundtrip(edges[i]);
    for (int k = -45; k <= 38; k++) {
        check_roundtrip((float)pow(10.0, k));
        check_roundtrip(nextafterf((float)pow(10.0, k), 0.0f));
        check_roundtrip(nextafterf((float)pow(10.0, k), INFINITY));
    }
    char buf[40];
    ls_json_format_f32(-0.0f, buf);
    assert_string_equal(buf, "-0");
    ls_json_format_f32(0.5f, buf);
    assert_string_equal(buf, "0.5");
    ls_json_format_f32(100.0f, buf);
    assert_string_equal(buf, "100");
    ls_json_format_f32(1.5e-7f, buf);
    assert_string_equal(buf, "1.50000005e-7");
}

static void test_random_bit_patterns(void **state) {
    (void)state;
    uint64_t s = 0x9e3779b97f4a7c15ull;
    /* Ties (2026169.125 at nine digits) are where a half-away rounding
     * and %.9g's half-to-even part: draw enough patterns to meet many. */
    for (int i = 0; i < 4000000; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint32_t bits = (uint32_t)(s >> 16);
        float v;
        memcpy(&v, &bits, 4);
        if (!isfinite(v)) continue;
        check_roundtrip(v);
    }
}

static void test_nested_text(void **state) {
    (void)state;
    const float v[6] = {1, -2.5f, 0, 3e-8f, 1e20f, 0.1f};
    ls_buf b;
    ls_buf_init(&b);
    assert_true(ls_json_tensor_f32_text(&b, v, 2, 3));
    char *text = ls_buf_take(&b, NULL);
    assert_string_equal(text, "[[1,-2.5,0],[2.99999989e-8,1.00000002e20,0.100000001]]");
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_random_bit_patterns),
        cmocka_unit_test(test_nested_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
