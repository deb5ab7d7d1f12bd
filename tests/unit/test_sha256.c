/* SHA-256 against the FIPS 180-2 appendix vectors, and streaming updates
 * split at every awkward boundary agreeing with the one-shot digest. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sha256.h"

static void test_empty(void **state) {
    (void)state;
    char hex[65];
    ls_sha256_hex("", 0, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

static void test_abc(void **state) {
    (void)state;
    char hex[65];
    ls_sha256_hex("abc", 3, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

static void test_448_bits(void **state) {
    (void)state;
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    assert_int_equal(strlen(m), 56); /* 448 bits: the padding spills into a second block */
    char hex[65];
    ls_sha256_hex(m, strlen(m), hex);
    assert_string_equal(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

static void test_million_a(void **state) {
    (void)state;
    /* Fed in uneven pieces so the block buffer is exercised as well. */
    char piece[997];
    memset(piece, 'a', sizeof piece);
    ls_sha256_ctx c;
    ls_sha256_init(&c);
    size_t left = 1000000;
    while (left) {
        size_t n = left < sizeof piece ? left : sizeof piece;
        ls_sha256_update(&c, piece, n);
        left -= n;
    }
    uint8_t d[32];
    char hex[65];
    ls_sha256_final(&c, d);
    ls_sha256_hex_digest(d, hex);
    assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* Every length around the 55/56/64-byte padding edges, hashed whole and
 * in two parts split at every point, must give one digest. */
static void test_split_updates(void **state) {
    (void)state;
    uint8_t msg[200];
    for (size_t i = 0; i < sizeof msg; i++) msg[i] = (uint8_t)(i * 37 + 11);
    for (size_t len = 0; len <= 130; len++) {
        char whole[65];
        ls_sha256_hex(msg, len, whole);
        for (size_t cut = 0; cut <= len; cut++) {
            ls_sha256_ctx c;
            uint8_t d[32];
            char hex[65];
            ls_sha256_init(&c);
            ls_sha256_update(&c, msg, cut);
            ls_sha256_update(&c, msg + cut, len - cut);
            ls_sha256_final(&c, d);
            ls_sha256_hex_digest(d, hex);
            assert_string_equal(hex, whole);
        }
    }
    /* and a length change must change the digest */
    char a[65], b[65];
    ls_sha256_hex(msg, 55, a);
    ls_sha256_hex(msg, 56, b);
    assert_string_not_equal(a, b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),     cmocka_unit_test(test_abc),           cmocka_unit_test(test_448_bits),
        cmocka_unit_test(test_million_a), cmocka_unit_test(test_split_updates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
