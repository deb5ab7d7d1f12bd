/* base64 encode and strict decode. */
#include "api/base64.h"

#include <stdlib.h>

static const char ls_b64_chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int ls_b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

size_t ls_base64_decoded_max(size_t len) { return len / 4 * 3 + 3; }

bool ls_base64_decode(const char *src, size_t len, uint8_t *dst, size_t *out_len) {
    if (len % 4) return false;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)src[i + k];
            if (c == '=' && i + 4 == len && k >= 2) {
                v[k] = 0;
                pad++;
            } else {
                if (pad) return false; /* data after '=' */
                v[k] = ls_b64_value(c);
                if (v[k] < 0) return false;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        dst[o++] = (uint8_t)(w >> 16);
        if (pad < 2) dst[o++] = (uint8_t)(w >> 8);
        if (pad < 1) dst[o++] = (uint8_t)w;
    }
    *out_len = o;
    return true;
}

size_t ls_base64_encoded_len(size_t len) { return (len + 2) / 3 * 4; }

void ls_base64_encode_to(const uint8_t *src, size_t len, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t w = (uint32_t)src[i] << 16;
        if (i + 1 < len) w |= (uint32_t)src[i + 1] << 8;
        if (i + 2 < len) w |= src[i + 2];
        out[o++] = ls_b64_chars[(w >> 18) & 63];
        out[o++] = ls_b64_chars[(w >> 12) & 63];
        out[o++] = i + 1 < len ? ls_b64_chars[(w >> 6) & 63] : '=';
        out[o++] = i + 2 < len ? ls_b64_chars[w & 63] : '=';
    }
}

char *ls_base64_encode(const uint8_t *src, size_t len) {
    size_t n = ls_base64_encoded_len(len);
    char *out = malloc(n + 1);
    if (!out) return NULL;
    ls_base64_encode_to(src, len, out);
    out[n] = '\0';
    return out;
}
