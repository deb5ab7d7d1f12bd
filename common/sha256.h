/* SHA-256 (FIPS 180-4): streaming context and one-shot helpers, used for
 * the digest of an adapter's normalised factors. */
#ifndef LS_COMMON_SHA256_H
#define LS_COMMON_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[8];     /* working hash value H(i) */
    uint64_t bytes;    /* message length so far */
    uint8_t block[64]; /* bytes of the block not yet compressed */
    size_t used;       /* how many of block are filled */
} ls_sha256_ctx;

void ls_sha256_init(ls_sha256_ctx *c);
void ls_sha256_update(ls_sha256_ctx *c, const void *data, size_t len);
/* Pads, writes the 32-byte digest into out and leaves c unusable until
 * the next ls_sha256_init. */
void ls_sha256_final(ls_sha256_ctx *c, uint8_t out[32]);

/* Lower-case hex of a digest: 64 characters and a NUL into hex. */
void ls_sha256_hex_digest(const uint8_t digest[32], char hex[65]);
/* One shot: hex digest of len bytes of data. */
void ls_sha256_hex(const void *data, size_t len, char hex[65]);

#endif
