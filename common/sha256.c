/* SHA-256 as FIPS 180-4 §6.2 describes it: 512-bit blocks, a 64-word
 * message schedule, eight working variables, big-endian words. */
#include "common/sha256.h"

#include <string.h>

/* K: the first 32 bits of the fractional parts of the cube roots of the
 * first 64 primes (FIPS 180-4 §4.2.2). */
static const uint32_t ls_sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t ls_rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

/* The six logical functions of §4.1.2. */
static inline uint32_t ls_ch(uint32_t x, uint32_t y, uint32_t z) { return (x & y) ^ (~x & z); }
static inline uint32_t ls_maj(uint32_t x, uint32_t y, uint32_t z) { return (x & y) ^ (x & z) ^ (y & z); }
static inline uint32_t ls_bsig0(uint32_t x) { return ls_rotr(x, 2) ^ ls_rotr(x, 13) ^ ls_rotr(x, 22); }
static inline uint32_t ls_bsig1(uint32_t x) { return ls_rotr(x, 6) ^ ls_rotr(x, 11) ^ ls_rotr(x, 25); }
static inline uint32_t ls_ssig0(uint32_t x) { return ls_rotr(x, 7) ^ ls_rotr(x, 18) ^ (x >> 3); }
static inline uint32_t ls_ssig1(uint32_t x) { return ls_rotr(x, 17) ^ ls_rotr(x, 19) ^ (x >> 10); }

static void ls_sha256_block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 |
               (uint32_t)p[4 * t + 3];
    for (int t = 16; t < 64; t++) w[t] = ls_ssig1(w[t - 2]) + w[t - 7] + ls_ssig0(w[t - 15]) + w[t - 16];

    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = hh + ls_bsig1(e) + ls_ch(e, f, g) + ls_sha256_k[t] + w[t];
        uint32_t t2 = ls_bsig0(a) + ls_maj(a, b, c);
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
}

/* Resets the caller-owned context; nothing is allocated. */
void ls_sha256_init(ls_sha256_ctx *c) {
    /* H(0): the first 32 bits of the fractional parts of the square roots
     * of the first eight primes (§5.3.3). */
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->bytes = 0;
    c->used = 0;
}

/* data is borrowed; the context keeps at most one partial block. */
void ls_sha256_update(ls_sha256_ctx *c, const void *data, size_t len) {
    const uint8_t *p = data;
    c->bytes += len;
    if (c->used) {
        size_t take = 64 - c->used < len ? 64 - c->used : len;
        memcpy(c->block + c->used, p, take);
        c->used += take;
        p += take;
        len -= take;
        if (c->used < 64) return;
        ls_sha256_block(c->h, c->block);
        c->used = 0;
    }
    for (; len >= 64; p += 64, len -= 64) ls_sha256_block(c->h, p);
    memcpy(c->block, p, len);
    c->used = len;
}

/* Writes 32 bytes into the caller's out. */
void ls_sha256_final(ls_sha256_ctx *c, uint8_t out[32]) {
    /* §5.1.1: a 1 bit, zeros up to 56 mod 64 bytes, the bit length as a
     * 64-bit big-endian integer. */
    uint64_t bits = c->bytes * 8;
    c->block[c->used++] = 0x80;
    if (c->used > 56) {
        memset(c->block + c->used, 0, 64 - c->used);
        ls_sha256_block(c->h, c->block);
        c->used = 0;
    }
    memset(c->block + c->used, 0, 56 - c->used);
    for (int i = 0; i < 8; i++) c->block[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    ls_sha256_block(c->h, c->block);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->h[i];
    }
    c->used = 0;
}

/* Writes 65 bytes (64 hex digits and a NUL) into the caller's hex. */
void ls_sha256_hex_digest(const uint8_t digest[32], char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[digest[i] >> 4];
        hex[2 * i + 1] = digits[digest[i] & 15];
    }
    hex[64] = '\0';
}

/* data is borrowed; hex is the caller's (65 bytes). */
void ls_sha256_hex(const void *data, size_t len, char hex[65]) {
    ls_sha256_ctx c;
    uint8_t d[32];
    ls_sha256_init(&c);
    ls_sha256_update(&c, data, len);
    ls_sha256_final(&c, d);
    ls_sha256_hex_digest(d, hex);
}
