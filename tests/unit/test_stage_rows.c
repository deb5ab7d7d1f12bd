/* gpu/stage_rows.h: each staged row is its token's row of x, every element
 * rounded exactly as ls_f32_to_bf16 / ls_f32_to_f16 round it (ties, NaN,
 * infinities, denormals, values that overflow), by every way of rounding
 * this CPU runs, on one thread and split over several; y's rows go back
 * to their tokens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/text.h"
#include "gpu/stage_rows.h"

/* Bit patterns that round differently: ties to even both ways, the
 * largest finite floats (bf16 and f16 overflow), denormals, NaN, Inf. */
static const uint32_t special[] = {
    0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x7f7fffffu, 0xff7fffffu,
    0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu, 0x00000001u, 0x807fffffu, 0x00008000u,
    0x477fe000u, 0x477ff000u, 0x38800000u, 0x387fffffu, 0x33800000u, 0x33000000u, 0x3f801000u, 0x3f803000u,
};

/* T x H floats: the special patterns first, then random bits (any
 * float, NaN included). */
static float *make_x(size_t T, size_t H, uint64_t seed) {
    float *x = malloc(T * H * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < T * H; i++) {
        const size_t ns = sizeof special / sizeof special[0];
        uint32_t u = i < ns ? special[i] : (uint32_t)ls_splitmix64(&seed);
        memcpy(&x[i], &u, sizeof u);
    }
    return x;
}

/* order: a permutation of 0..T-1 (reversed, then turned by one) that
 * moves every row but one. */
static int *make_order(size_t T) {
    int *order = malloc(T * sizeof *order);
    assert_non_null(order);
    for (size_t i = 0; i < T; i++) order[i] = (int)((T - i) % T);
    return order;
}

static uint16_t want16(ls_dtype dt, float v) { return dt == LS_DTYPE_BF16 ? ls_f32_to_bf16(v) : ls_f32_to_f16(v); }

/* The rows staged from src_off floats into a buffer and to dst_off
 * elements into another (so no vector load or store is aligned), with
 * guard bytes after the rows that must stay untouched. */
#define GUARD 64
static void check_staged_at(ls_dtype dt, size_t T, size_t H, ls_stage_isa isa, size_t src_off, size_t dst_off) {
    float *x0 = make_x(T * H + src_off, 1, T * 1000003u + H), *x = x0 + src_off;
    int *order = make_order(T);
    const size_t esz = ls_dtype_size(dt);
    unsigned char *dst0 = malloc((T * H + dst_off) * esz + GUARD), *dst = dst0 + dst_off * esz;
    assert_non_null(dst0);
    memset(dst0, 0xa5, (T * H + dst_off) * esz + GUARD);
    ls_stage_rows_isa(dst, dt, x, order, T, H, isa);
    for (size_t i = 0; i < GUARD; i++) assert_int_equal(dst[T * H * esz + i], 0xa5);
    for (size_t i = 0; i < T; i++)
        for (size_t k = 0; k < H; k++) {
            const float v = x[(size_t)order[i] * H + k];
            const unsigned char *got = dst + (i * H + k) * esz;
            if (dt == LS_DTYPE_F32) {
                assert_memory_equal(got, &v, sizeof v);
            } else {
                const uint16_t w = want16(dt, v), g = (uint16_t)(got[0] | got[1] << 8);
                if (g != w)
                    fail_msg("%s (way %d) row %zu col %zu: staged 0x%04x, expected 0x%04x", ls_dtype_name(dt), (int)isa,
                             i, k, g, w);
            }
        }
    free(dst0);
    free(order);
    free(x0);
}

static void check_staged_isa(ls_dtype dt, size_t T, size_t H, ls_stage_isa isa) {
    check_staged_at(dt, T, H, isa, 0, 0);
    check_staged_at(dt, T, H, isa, 1, 3);
}

static const char *const isa_names[] = {"auto", "avx512", "avx2", "scalar"};

/* Every way this CPU runs; one it cannot is said so, not run. */
static void check_staged(ls_dtype dt, size_t T, size_t H) {
    for (int isa = LS_STAGE_AUTO; isa <= LS_STAGE_SCALAR; isa++) {
        if (ls_stage_isa_supported((ls_stage_isa)isa)) {
            check_staged_isa(dt, T, H, (ls_stage_isa)isa);
        } else if (dt == LS_DTYPE_BF16 && T == 1) {
            print_message("stage_rows: this CPU does not run the %s way: not tested here\n", isa_names[isa]);
        }
    }
}

static void test_one_thread(void **state) {
    (void)state;
    const ls_dtype dts[] = {LS_DTYPE_BF16, LS_DTYPE_F16, LS_DTYPE_F32};
    for (size_t d = 0; d < 3; d++) {
        check_staged(dts[d], 1, 24);
        check_staged(dts[d], 5, 13);
        check_staged(dts[d], 64, 257);
    }
}

/* Past LS_STAGE_ROWS_THREADED elements the rows are split over threads. */
static void test_threaded(void **state) {
    (void)state;
    const size_t H = 4096, T = LS_STAGE_ROWS_THREADED / H + 37;
    check_staged(LS_DTYPE_BF16, T, H);
    check_staged(LS_DTYPE_F16, T, H);
}

/* y's rows go back to their tokens, on one thread and on several. */
static void test_unstage(void **state) {
    (void)state;
    const size_t sizes[][2] = {{3, 5}, {LS_STAGE_ROWS_THREADED / 1024 + 5, 1024}};
    for (size_t c = 0; c < 2; c++) {
        const size_t T = sizes[c][0], H = sizes[c][1];
        float *staged = make_x(T, H, 99 + c), *y = calloc(T * H, sizeof *y);
        int *order = make_order(T);
        assert_non_null(y);
        ls_unstage_rows(y, staged, order, T, H);
        for (size_t i = 0; i < T; i++) assert_memory_equal(y + (size_t)order[i] * H, staged + i * H, H * sizeof(float));
        free(order);
        free(y);
        free(staged);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_thread),
        cmocka_unit_test(test_threaded),
        cmocka_unit_test(test_unstage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
