/* The --api-keys file: API keys scoped to tenants, each stored only as
 * the SHA-256 of the key, with its role and quotas (docs/api.md, "API
 * keys and tenants"). This is the strict parser; the live table, its
 * re-reading and the lookups are server/tenant.c's. */
#ifndef LS_CONFIG_API_KEYS_H
#define LS_CONFIG_API_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/text.h" /* ls_tenant_name_valid */

/* A file holds at most this many keys and is at most this many bytes. */
#define LS_API_KEYS_MAX 4096
#define LS_API_KEYS_FILE_MAX (4u << 20)
/* A tenant name: 1 to 32 of a-z 0-9 _ -, starting with a letter or digit. */
#define LS_TENANT_NAME_MAX 32
/* The key id shown in logs: the first 12 hex digits of the key's hash. */
#define LS_KEY_ID_LEN 12

/* The zero value is the least privileged: a principal never set sees nothing. */
typedef enum { LS_ROLE_VIEWER, LS_ROLE_TENANT, LS_ROLE_ADMIN } ls_role;

typedef struct {
    uint8_t sha256[32];
    char id[LS_KEY_ID_LEN + 1];
    char tenant[LS_TENANT_NAME_MAX + 1]; /* "" only for an admin without one */
    ls_role role;
    long long max_adapters; /* -1 = no quota */
    double rate;            /* requests per second; 0 = no quota */
    int max_pins;           /* pinned adapters of the tenant this key may hold */
} ls_api_key;

typedef struct {
    ls_api_key *keys; /* owned */
    size_t n;
} ls_api_keys;

/* Pins a tenant key may hold when its entry gives no max_pins. */
#define LS_API_KEYS_DEFAULT_PINS 1

/* Static strings, never freed. */
const char *ls_role_name(ls_role r);

/* Parses len bytes of text (need not be terminated) into out, which the
 * caller frees with ls_api_keys_free. On a bad file returns false with
 * out empty and a one-line reason (the entry, the key and what is wrong;
 * never a key's text) in why. */
bool ls_api_keys_parse(const char *text, size_t len, ls_api_keys *out, char *why, size_t why_len);
void ls_api_keys_free(ls_api_keys *k);

#endif
