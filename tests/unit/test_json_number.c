/* JSON numbers both ways. The fast float32 formatter: every value must
 * read back (as a JSON number parsed to double, then float) as exactly
 * the same float, be a valid JSON number, and be what snprintf("%.9g")
 * writes (its exponent without the leading zero); checked on edge values
 * and millions of random bit patterns. The reader's number: the same bits
 * as strtod (and the same integer as strtoll) on every form a client
 * writes, whichever of its two paths reads it. */
#include <errno.h>
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

#include "format/json_reader.h"
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
                           1.17549421e-38f, 3.0e38f, 16777216.0f, 16777217.0f, 0.3f, 2.0f / 3.0f, 1e-45f,
                           /* d * 10^k in double lands on the wrong side of a half for these */
                           0x1.8918dep-19f, 0x1.7025c2p+75f, 0x1.b14e44p-112f, 0x1.177dacp-43f, 0x1.a7b2a2p-44f};
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

/* ls_jr_number on text against strtod and strtoll on the same text. */
static void check_read(const char *text) {
    ls_jr r;
    ls_jr_init(&r, text, strlen(text));
    double got = 0;
    bool is_int = false;
    long long iv = 0;
    bool ok = ls_jr_number(&r, &got, &is_int, &iv);
    if (!ok) fprintf(stderr, "%s: %s\n", text, r.message);
    assert_true(ok);
    assert_true(ls_jr_at_end(&r));
    double want = strtod(text, NULL);
    if (memcmp(&got, &want, sizeof got)) fprintf(stderr, "%s: ours %a, strtod %a\n", text, got, want);
    assert_memory_equal(&got, &want, sizeof got);
    const bool integral = !strpbrk(text, ".eE");
    errno = 0;
    long long want_int = strtoll(text, NULL, 10);
    const bool fits = integral && errno != ERANGE;
    assert_int_equal(is_int, fits);
    if (fits) assert_true(iv == want_int);
}

/* Digits from the generator: n of them, the first nonzero when lead. */
static char *put_digits(char *p, int n, bool lead, uint64_t *s) {
    for (int i = 0; i < n; i++) {
        *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
        int d = (int)(*s % 10);
        if (i == 0 && lead && d == 0) d = 1;
        *p++ = (char)('0' + d);
    }
    return p;
}

static void test_reader_matches_strtod(void **state) {
    (void)state;
    const char *edges[] = {"0", "-0", "0.0", "-0.0", "0e5", "1", "-1", "9007199254740992", "9007199254740993",
                           "9007199254740993.0", "18446744073709551615", "9223372036854775807",
                           "9223372036854775808", "-9223372036854775808", "1e22", "1e23", "1e-22", "1e-23",
                           "123456789012345678", "1234567890123456789", "12345678901234567890", "0.1", "0.3",
                           "2.5e-7", "1.50000005e-7", "1E+2", "1e-0", "4.9e-324", "2.2250738585072014e-308",
                           "1.7976931348623157e308", "0.10000000149011612", "100000000000000000000000",
                           "0.000000000000000000000001", "3.4028234663852886e38", "-1.17549435e-38"};
    for (size_t i = 0; i < sizeof edges / sizeof *edges; i++) check_read(edges[i]);
    uint64_t s = 0x2545f4914f6cdd1dull;
    char text[128];
    for (int i = 0; i < 300000; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint64_t bits = s;
        double d;
        memcpy(&d, &bits, 8);
        float f;
        uint32_t fbits = (uint32_t)(s >> 11);
        memcpy(&f, &fbits, 4);
        switch (i % 5) {
        case 0: /* what this server and most clients write for a float */
            if (!isfinite(f)) continue;
            snprintf(text, sizeof text, "%.9g", (double)f);
            break;
        case 1: /* a double's round-trip text (Python's repr of one) */
            if (!isfinite(d)) continue;
            snprintf(text, sizeof text, "%.17g", d);
            break;
        case 2: /* fixed point with every count of decimals */
            snprintf(text, sizeof text, "%.*f", (int)(s % 21), (double)f);
            if (!isfinite(f) || strlen(text) > 60) continue;
            break;
        default: { /* random digits: sign, integer, fraction, exponent */
            char *p = text;
            if (s & 1) *p++ = '-';
            int ni = (int)((s >> 8) % 22), nf = (int)((s >> 16) % 22);
            if (ni == 0) *p++ = '0';
            else p = put_digits(p, ni, true, &s);
            if (nf) *p++ = '.', p = put_digits(p, nf, false, &s);
            if ((s >> 24) & 1) {
                *p++ = (s >> 25) & 1 ? 'e' : 'E';
                if ((s >> 26) & 1) *p++ = (s >> 27) & 1 ? '-' : '+';
                p += sprintf(p, "%d", (int)((s >> 28) % 40));
            }
            *p = '\0';
        }
        }
        check_read(text);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_random_bit_patterns),
        cmocka_unit_test(test_nested_text),
        cmocka_unit_test(test_reader_matches_strtod),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
