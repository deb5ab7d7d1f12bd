/* Standard base64 (RFC 4648, with padding) for tensor payloads. */
#ifndef LS_API_BASE64_H
#define LS_API_BASE64_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes that decoding len characters yields at most. */
size_t ls_base64_decoded_max(size_t len);
/* Decodes src[len] into dst (ls_base64_decoded_max bytes); whitespace is
 * not allowed. Returns false on a bad character or bad padding. */
bool ls_base64_decode(const char *src, size_t len, uint8_t *dst, size_t *out_len);
/* Characters that encoding len bytes yields. */
size_t ls_base64_encoded_len(size_t len);
/* Writes exactly ls_base64_encoded_len(len) characters to out (no NUL). */
void ls_base64_encode_to(const uint8_t *src, size_t len, char *out);
/* Encodes into a NUL-terminated malloc'd string owned by the caller. */
char *ls_base64_encode(const uint8_t *src, size_t len);

#endif
