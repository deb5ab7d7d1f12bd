/* Dtype table and the bf16/f16 <-> fp32 conversions of common/tensor.c,
 * checked against references built here from the IEEE definitions (ldexp
 * and nearest-value search in double), never against the code under test. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/tensor.h"

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The value of an f16 bit pattern from its fields (IEEE 754 binary16). */
static double ref_f16_value(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0x1f)
        v = man ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(man, -24);
    else
        v = ldexp(1024 + man, exp - 25);
    return sign ? -v : v;
}

static double ref_bf16_value(uint16_t b) {
    int sign = b >> 15, exp = (b >> 7) & 0xff, man = b & 0x7f;
    double v;
    if (exp == 0xff)
        v = man ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(man, -133);
    else
        v = ldexp(128 + man, exp - 134);
    return sign ? -v : v;
}

/* Non-negative finite f16 values in increasing order: patterns 0..0x7bff. */
#define F16_FINITE 0x7c00

/* The f16 nearest to |x| (ties to the even pattern), by binary search over
 * the ordered finite values; past the largest finite value plus half an
 * ulp the answer is Inf, as IEEE round-to-nearest-even overflows. */
static uint16_t ref_f32_to_f16(float f) {
    double x = fabs((double)f);
    uint16_t sign = (f32_bits(f) >> 31) ? 0x8000 : 0;
    if (isnan(f)) return sign | 0x7e00;
    double max = ref_f16_value(0x7bff), half_ulp = ldexp(1, 4); /* ulp at the top binade is 32 */
    if (x >= max + half_ulp) return sign | 0x7c00;
    if (x >= max) return sign | 0x7bff;
    int lo = 0, hi = 0x7bff; /* value(lo) <= x < value(hi) */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (ref_f16_value((uint16_t)mid) <= x)
            lo = mid;
        else
            hi = mid;
    }
    double dlo = x - ref_f16_value((uint16_t)lo), dhi = ref_f16_value((uint16_t)hi) - x;
    int pick = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
    return sign | (uint16_t)pick;
}

/* Non-NaN f32 to bf16: of the two neighbours (truncation and the next
 * pattern up), the nearer in double; ties to the even pattern. */
static uint16_t ref_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    if ((u & 0xffff) == 0) return lo;
    double x = (double)f;
    double vlo = ref_bf16_value(lo);
    /* hi of the largest finite magnitude is the Inf pattern: treat it as
     * 2^128 so the distance test follows IEEE overflow. */
    double vhi = ((hi & 0x7fff) == 0x7f80) ? copysign(ldexp(1, 128), x) : ref_bf16_value(hi);
    double dlo = fabs(x - vlo), dhi = fabs(vhi - x);
    return dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
}

static void test_dtype_table(void **state) {
    (void)state;
    const char *names[] = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8",
                           "U64", "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2"};
    const size_t sizes[] = {8, 4, 2, 2, 8, 4, 2, 1, 8, 4, 2, 1, 1, 1, 1};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        ls_dtype dt;
        assert_true(ls_dtype_parse(names[i], &dt));
        assert_string_equal(ls_dtype_name(dt), names[i]);
        assert_int_equal(ls_dtype_size(dt), sizes[i]);
        assert_int_equal(ls_dtype_is_float(dt),
                         !strcmp(names[i], "F32") || !strcmp(names[i], "F16") || !strcmp(names[i], "BF16"));
    }
    ls_dtype dt;
    assert_true(ls_dtype_parse("bf16", &dt));
    assert_int_equal(dt, LS_DTYPE_BF16);
    assert_false(ls_dtype_parse("F128", &dt));
    assert_false(ls_dtype_parse("", &dt));
    assert_false(ls_dtype_parse("F32 ", &dt));
    assert_int_equal(ls_dtype_size(LS_DTYPE_COUNT), 0);
    assert_string_equal(ls_dtype_name((ls_dtype)-1), "?");
}

/* Every f16 pattern: to fp32 matches the field-by-field value, and back to
 * f16 gives the same pattern; a NaN comes back as a NaN of the same sign. */
static void test_f16_exhaustive(void **state) {
    (void)state;
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = ls_f16_to_f32((uint16_t)h);
        double want = ref_f16_value((uint16_t)h);
        uint16_t back = ls_f32_to_f16(f);
        if (isnan(want)) {
            assert_true(isnan(f));
            assert_int_equal(f32_bits(f) >> 31, h >> 15);
            assert_int_equal(back & 0x7c00, 0x7c00);
            assert_int_not_equal(back & 0x03ff, 0);
            assert_int_equal(back & 0x8000, h & 0x8000);
            continue;
        }
        if ((double)f != want || (f32_bits(f) >> 31) != (h >> 15)) fail_msg("f16 0x%04x -> %a, want %a", h, f, want);
        if (back != h) fail_msg("f16 0x%04x -> %a -> 0x%04x", h, f, back);
    }
}

static void test_bf16_exhaustive(void **state) {
    (void)state;
    for (uint32_t b = 0; b <= 0xffff; b++) {
        float f = ls_bf16_to_f32((uint16_t)b);
        double want = ref_bf16_value((uint16_t)b);
        uint16_t back = ls_f32_to_bf16(f);
        if (isnan(want)) {
            assert_true(isnan(f));
            assert_int_equal(back & 0x7f80, 0x7f80);
            assert_int_not_equal(back & 0x7f, 0);
            assert_int_equal(back & 0x8000, b & 0x8000);
            continue;
        }
        if ((double)f != want) fail_msg("bf16 0x%04x -> %a, want %a", b, f, want);
        if (back != b) fail_msg("bf16 0x%04x -> %a -> 0x%04x", b, f, back);
    }
}

/* Round to nearest even at every f16 midpoint: the midpoint of two
 * neighbours (exact in fp32) goes to the even pattern, one fp32 ulp either
 * side goes to the nearer neighbour. Covers subnormals and the top binade. */
static void test_f16_rounding_midpoints(void **state) {
    (void)state;
    for (uint16_t lo = 0; lo < 0x7bff; lo++) {
        double mid = (ref_f16_value(lo) + ref_f16_value((uint16_t)(lo + 1))) / 2;
        float m = (float)mid;
        assert_true((double)m == mid);
        uint16_t even = (lo % 2 == 0) ? lo : (uint16_t)(lo + 1);
        for (int s = 0; s < 2; s++) {
            float x = s ? -m : m;
            uint16_t sg = s ? 0x8000 : 0;
            if (ls_f32_to_f16(x) != (sg | even))
                fail_msg("midpoint %a -> 0x%04x, want 0x%04x", x, ls_f32_to_f16(x), sg | even);
            assert_int_equal(ls_f32_to_f16(nextafterf(x, 0.0f)), sg | lo);
            assert_int_equal(ls_f32_to_f16(nextafterf(x, s ? -INFINITY : INFINITY)), sg | (lo + 1));
        }
    }
}

static void test_f16_overflow_and_specials(void **state) {
    (void)state;
    assert_int_equal(ls_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(ls_f32_to_f16(65519.996f), 0x7bff);       /* just under the midpoint to 65536 */
    assert_int_equal(ls_f32_to_f16(65520.0f), 0x7c00);         /* the tie rounds to even: Inf */
    assert_int_equal(ls_f32_to_f16(1e10f), 0x7c00);
    assert_int_equal(ls_f32_to_f16(-1e10f), 0xfc00);
    assert_int_equal(ls_f32_to_f16(3.4028235e38f), 0x7c00);
    assert_int_equal(ls_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(ls_f32_to_f16(-INFINITY), 0xfc00);
    assert_int_equal(ls_f32_to_f16(0.0f), 0x0000);
    assert_int_equal(ls_f32_to_f16(-0.0f), 0x8000);
    /* Subnormal f16: the smallest is 2^-24; half of it ties to 0 (even). */
    assert_int_equal(ls_f32_to_f16(ldexpf(1, -24)), 0x0001);
    assert_int_equal(ls_f32_to_f16(ldexpf(1, -25)), 0x0000);
    assert_int_equal(ls_f32_to_f16(nextafterf(ldexpf(1, -25), 1)), 0x0001);
    assert_int_equal(ls_f32_to_f16(ldexpf(3, -25)), 0x0002); /* 1.5 ulp ties to even 2 */
    assert_int_equal(ls_f32_to_f16(ldexpf(1023, -24)), 0x03ff);
    assert_int_equal(ls_f32_to_f16(ldexpf(1, -14)), 0x0400); /* smallest normal */
    /* fp32 subnormals are far below f16's range: signed zero. */
    assert_int_equal(ls_f32_to_f16(bits_f32(0x00000001)), 0x0000);
    assert_int_equal(ls_f32_to_f16(bits_f32(0x80400000)), 0x8000);
    /* NaNs of every kind stay NaN with their sign. */
    const uint32_t nans[] = {0x7fc00000, 0x7f800001, 0x7fbfffff, 0xffc00000, 0xff800001, 0x7fffffff};
    for (size_t i = 0; i < sizeof nans / sizeof *nans; i++) {
        uint16_t h = ls_f32_to_f16(bits_f32(nans[i]));
        assert_int_equal(h & 0x7c00, 0x7c00);
        assert_int_not_equal(h & 0x3ff, 0);
        assert_int_equal(h >> 15, nans[i] >> 31);
    }
    assert_true(isinf(ls_f16_to_f32(0x7c00)) && ls_f16_to_f32(0x7c00) > 0);
    assert_true(isinf(ls_f16_to_f32(0xfc00)) && ls_f16_to_f32(0xfc00) < 0);
    assert_true(ls_f16_to_f32(0x0001) == ldexpf(1, -24));
    assert_int_equal(f32_bits(ls_f16_to_f32(0x8000)), 0x80000000u);
}

static void test_bf16_rounding_and_specials(void **state) {
    (void)state;
    /* Every bf16 midpoint (an exact fp32 pattern ending 0x8000) ties to
     * even; one fp32 ulp either side goes to the nearer neighbour. */
    for (uint32_t lo = 0; lo < 0x7f7f; lo++) {
        for (uint32_t sg = 0; sg <= 0x8000; sg += 0x8000) {
            uint32_t mid = ((sg | lo) << 16) | 0x8000;
            uint16_t even = (uint16_t)(sg | ((lo % 2 == 0) ? lo : lo + 1));
            assert_int_equal(ls_f32_to_bf16(bits_f32(mid)), even);
            assert_int_equal(ls_f32_to_bf16(bits_f32(mid - 1)), sg | lo);
            assert_int_equal(ls_f32_to_bf16(bits_f32(mid + 1)), sg | (lo + 1));
        }
    }
    assert_int_equal(ls_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(ls_f32_to_bf16(-0.0f), 0x8000);
    assert_int_equal(ls_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(ls_f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(ls_f32_to_bf16(3.4028235e38f), 0x7f80); /* FLT_MAX is past bf16's max + half ulp */
    assert_int_equal(ls_f32_to_bf16(bits_f32(0x7f7f7fff)), 0x7f7f);
    assert_int_equal(ls_f32_to_bf16(bits_f32(0x00000001)), 0x0000); /* fp32 subnormals */
    assert_int_equal(ls_f32_to_bf16(bits_f32(0x00018000)), 0x0002);
    /* NaN stays NaN, including payloads only in the low 16 bits that a
     * plain truncation or rounding would turn into Inf. */
    const uint32_t nans[] = {0x7fc00000, 0x7f800001, 0x7f80ffff, 0x7fffffff, 0xff800001, 0xffc00000};
    for (size_t i = 0; i < sizeof nans / sizeof *nans; i++) {
        uint16_t b = ls_f32_to_bf16(bits_f32(nans[i]));
        assert_int_equal(b & 0x7f80, 0x7f80);
        assert_int_not_equal(b & 0x7f, 0);
        assert_int_equal(b >> 15, nans[i] >> 31);
        assert_true(isnan(ls_bf16_to_f32(b)));
    }
}

/* A stride through all 2^32 fp32 patterns against the references. */
static void test_f32_sweep(void **state) {
    (void)state;
    uint64_t checked = 0;
    for (uint64_t u = 0; u <= 0xffffffffu; u += 1009) {
        float f = bits_f32((uint32_t)u);
        uint16_t h = ls_f32_to_f16(f), rh = ref_f32_to_f16(f);
        if (isnan(f)) {
            assert_true(isnan(ls_f16_to_f32(h)));
            assert_true(isnan(ls_bf16_to_f32(ls_f32_to_bf16(f))));
            continue;
        }
        if (h != rh) fail_msg("f16 of %a (0x%08x): 0x%04x, want 0x%04x", f, (uint32_t)u, h, rh);
        uint16_t b = ls_f32_to_bf16(f), rb = ref_f32_to_bf16(f);
        if (b != rb) fail_msg("bf16 of %a (0x%08x): 0x%04x, want 0x%04x", f, (uint32_t)u, b, rb);
        checked++;
    }
    assert_true(checked > 4000000);
}

static void test_buffers(void **state) {
    (void)state;
    const float src[6] = {1.0f, -2.5f, 65504.0f, 1e-8f, 0.1f, -0.0f};
    uint8_t bytes[24];
    float back[6];
    /* f16 little-endian bytes: 1.0 is 0x3c00, -2.5 is 0xc100. */
    assert_true(ls_convert_from_f32(LS_DTYPE_F16, src, 6, bytes));
    assert_int_equal(bytes[0], 0x00);
    assert_int_equal(bytes[1], 0x3c);
    assert_int_equal(bytes[2], 0x00);
    assert_int_equal(bytes[3], 0xc1);
    assert_true(ls_convert_to_f32(LS_DTYPE_F16, bytes, 6, back));
    for (int i = 0; i < 6; i++) assert_true(back[i] == ls_f16_to_f32(ref_f32_to_f16(src[i])));
    /* bf16: 1.0 is 0x3f80, -2.5 is 0xc020. */
    assert_true(ls_convert_from_f32(LS_DTYPE_BF16, src, 6, bytes));
    assert_int_equal(bytes[0], 0x80);
    assert_int_equal(bytes[1], 0x3f);
    assert_int_equal(bytes[2], 0x20);
    assert_int_equal(bytes[3], 0xc0);
    assert_true(ls_convert_to_f32(LS_DTYPE_BF16, bytes, 6, back));
    for (int i = 0; i < 6; i++) assert_true(back[i] == ls_bf16_to_f32(ref_f32_to_bf16(src[i])));
    assert_true(ls_convert_from_f32(LS_DTYPE_F32, src, 6, bytes));
    assert_true(ls_convert_to_f32(LS_DTYPE_F32, bytes, 6, back));
    assert_memory_equal(back, src, sizeof src);
    assert_false(ls_convert_to_f32(LS_DTYPE_I32, bytes, 1, back));
    assert_false(ls_convert_from_f32(LS_DTYPE_U8, src, 1, bytes));

    float v[6];
    memcpy(v, src, sizeof v);
    ls_round_to_dtype(LS_DTYPE_F16, v, 6);
    for (int i = 0; i < 6; i++) assert_true(v[i] == (float)ref_f16_value(ref_f32_to_f16(src[i])));
    memcpy(v, src, sizeof v);
    ls_round_to_dtype(LS_DTYPE_BF16, v, 6);
    for (int i = 0; i < 6; i++) assert_true(v[i] == (float)ref_bf16_value(ref_f32_to_bf16(src[i])));
    memcpy(v, src, sizeof v);
    ls_round_to_dtype(LS_DTYPE_F32, v, 6);
    assert_memory_equal(v, src, sizeof src);
}

static void test_shape_numel(void **state) {
    (void)state;
    int64_t s[4] = {2, 3, 4, 5};
    assert_int_equal(ls_shape_numel(s, 4), 120);
    assert_int_equal(ls_shape_numel(s, 0), 1);
    int64_t neg[2] = {2, -1};
    assert_int_equal(ls_shape_numel(neg, 2), -1);
    int64_t big[2] = {INT64_MAX, 2};
    assert_int_equal(ls_shape_numel(big, 2), -1);
    int64_t edge[2] = {INT64_MAX, 1};
    assert_int_equal(ls_shape_numel(edge, 2), INT64_MAX);
    int64_t two32[2] = {(int64_t)1 << 32, (int64_t)1 << 31};
    assert_int_equal(ls_shape_numel(two32, 2), -1); /* 2^63 does not fit */
    int64_t zero[3] = {0, INT64_MAX, INT64_MAX};
    assert_int_equal(ls_shape_numel(zero, 3), 0);
    char buf[64];
    assert_string_equal(ls_shape_str(s, 3, buf, sizeof buf), "[2, 3, 4]");
    assert_string_equal(ls_shape_str(s, 0, buf, sizeof buf), "[]");
}

/* ls_find_overflow names exactly the values that round to Inf in the
 * narrower dtype, at the rounding's own boundary (checked against the
 * converters), and nothing when the target holds every value. */
static void test_find_overflow(void **state) {
    (void)state;
    const uint32_t edge_bits = 0x7f7f8000u; /* halfway from bf16's largest to the next step */
    float bf16_edge;
    memcpy(&bf16_edge, &edge_bits, 4);
    const float f16_edge = 65520.0f;
    const float below[] = {nextafterf(f16_edge, 0), nextafterf(bf16_edge, 0)};
    const float at[] = {f16_edge, bf16_edge};
    const ls_dtype to[] = {LS_DTYPE_F16, LS_DTYPE_BF16};
    for (int k = 0; k < 2; k++) {
        float v[4] = {1.0f, -below[k], INFINITY, -at[k]}, got;
        uint16_t h[4];
        assert_true(ls_convert_from_f32(to[k], v, 4, h));
        size_t where;
        assert_true(ls_find_overflow(LS_DTYPE_F32, v, 4, to[k], &where, &got));
        assert_int_equal(where, 3);
        assert_true(got == -at[k]);
        /* The converters agree: the value before it is finite there, this one not. */
        size_t nf;
        assert_true(ls_find_nonfinite(to[k], h, 4, &nf) && nf == 2);
        assert_false(ls_find_nonfinite(to[k], h, 2, &nf));
        assert_true(ls_find_nonfinite(to[k], h + 3, 1, &nf));
        assert_false(ls_find_overflow(LS_DTYPE_F32, v, 2, to[k], &where, &got));
    }
    const uint16_t b[2] = {ls_f32_to_bf16(1.0f), ls_f32_to_bf16(7e4f)};
    size_t where;
    float got;
    assert_true(ls_find_overflow(LS_DTYPE_BF16, b, 2, LS_DTYPE_F16, &where, &got) && where == 1);
    assert_false(ls_find_overflow(LS_DTYPE_BF16, b, 2, LS_DTYPE_F32, &where, &got));
    assert_false(ls_find_overflow(LS_DTYPE_F16, b, 2, LS_DTYPE_BF16, &where, &got));
    assert_false(ls_find_overflow(LS_DTYPE_F32, &bf16_edge, 1, LS_DTYPE_F32, &where, &got));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_f16_exhaustive),
        cmocka_unit_test(test_bf16_exhaustive),
        cmocka_unit_test(test_f16_rounding_midpoints),
        cmocka_unit_test(test_f16_overflow_and_specials),
        cmocka_unit_test(test_bf16_rounding_and_specials),
        cmocka_unit_test(test_f32_sweep),
        cmocka_unit_test(test_buffers),
        cmocka_unit_test(test_shape_numel),
        cmocka_unit_test(test_find_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
