/* libFuzzer harness for the --api-keys parser (config/api_keys.c). Any
 * input must be either
 *  - refused: false, nothing kept, and a non-empty one-line reason (no
 *    control character: the server logs it as one line); or
 *  - accepted: every key within the file's rules (a valid tenant, or
 *    none for an admin; a known role; the id the first 12 hex digits of
 *    the hash; quotas in their ranges; no hash twice), and the keys
 *    written back as a key file parse to the very same keys.
 * Nothing is allocated that outlives the call (ASan's leak check).
 * Built only with clang (tests/fuzz/CMakeLists.txt). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sha256.h"
#include "common/text.h"
#include "config/api_keys.h"

#define FUZZ_CHECK(cond)                                                                                          \
    do {                                                                                                           \
        if (!(cond)) abort();                                                                                      \
    } while (0)

static void check_key(const ls_api_key *k) {
    static const char hexd[] = "0123456789abcdef";
    FUZZ_CHECK(k->role == LS_ROLE_ADMIN || k->role == LS_ROLE_TENANT || k->role == LS_ROLE_VIEWER);
    FUZZ_CHECK(memchr(k->tenant, '\0', sizeof k->tenant));
    FUZZ_CHECK(k->tenant[0] ? ls_tenant_name_valid(k->tenant) : k->role == LS_ROLE_ADMIN);
    for (int b = 0; b < LS_KEY_ID_LEN / 2; b++)
        FUZZ_CHECK(k->id[2 * b] == hexd[k->sha256[b] >> 4] && k->id[2 * b + 1] == hexd[k->sha256[b] & 15]);
    FUZZ_CHECK(k->id[LS_KEY_ID_LEN] == '\0');
    FUZZ_CHECK(k->max_adapters >= -1 && k->max_adapters <= 1000000);
    FUZZ_CHECK(k->rate == 0 || (k->rate > 0 && k->rate <= 1e6));
    FUZZ_CHECK(k->max_pins >= 0 && k->max_pins <= 1024);
}

/* The keys as a key file again (malloc'd text). */
static char *write_back(const ls_api_keys *keys) {
    json_t *arr = json_array();
    for (size_t i = 0; i < keys->n; i++) {
        const ls_api_key *k = &keys->keys[i];
        char hex[65];
        ls_sha256_hex_digest(k->sha256, hex);
        json_t *e = json_pack("{s:s, s:s, s:i}", "sha256", hex, "role", ls_role_name(k->role), "max_pins", k->max_pins);
        FUZZ_CHECK(e);
        if (k->tenant[0]) json_object_set_new(e, "tenant", json_string(k->tenant));
        if (k->max_adapters >= 0) json_object_set_new(e, "max_adapters", json_integer(k->max_adapters));
        if (k->rate > 0) json_object_set_new(e, "rate", json_real(k->rate));
        json_array_append_new(arr, e);
    }
    json_t *doc = json_pack("{s:o}", "keys", arr);
    char *text = json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(doc);
    FUZZ_CHECK(text);
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ls_api_keys keys;
    char why[512];
    memset(why, 0x5a, sizeof why);
    const bool ok = ls_api_keys_parse((const char *)data, size, &keys, why, sizeof why);
    FUZZ_CHECK(memchr(why, '\0', sizeof why));
    if (!ok) {
        FUZZ_CHECK(why[0] && !keys.keys && keys.n == 0);
        for (const char *c = why; *c; c++) FUZZ_CHECK((unsigned char)*c >= 0x20 && *c != 0x7f);
        return 0;
    }
    FUZZ_CHECK(keys.n <= LS_API_KEYS_MAX);
    for (size_t i = 0; i < keys.n; i++) {
        check_key(&keys.keys[i]);
        for (size_t j = 0; j < i; j++) FUZZ_CHECK(memcmp(keys.keys[i].sha256, keys.keys[j].sha256, 32));
    }
    char *text = write_back(&keys);
    ls_api_keys back;
    FUZZ_CHECK(ls_api_keys_parse(text, strlen(text), &back, why, sizeof why));
    FUZZ_CHECK(back.n == keys.n);
    for (size_t i = 0; i < keys.n; i++) {
        const ls_api_key *a = &keys.keys[i], *b = &back.keys[i];
        FUZZ_CHECK(!memcmp(a->sha256, b->sha256, 32) && !strcmp(a->id, b->id) && !strcmp(a->tenant, b->tenant));
        FUZZ_CHECK(a->role == b->role && a->max_adapters == b->max_adapters && a->rate == b->rate &&
                   a->max_pins == b->max_pins);
    }
    free(text);
    ls_api_keys_free(&back);
    ls_api_keys_free(&keys);
    return 0;
}
