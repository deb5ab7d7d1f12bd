/* The strict parser of the --api-keys file: every key of every object is
 * known, every value of its type and range, every hash 64 hex digits and
 * given once. A bad file is refused whole with the first reason. */
#include "config/api_keys.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/text.h"

static const char *const ls_role_names[] = {"viewer", "tenant", "admin", NULL};

const char *ls_role_name(ls_role r) { return (unsigned)r < 3 ? ls_role_names[r] : "?"; }

static bool ls_keys_fail(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool ls_keys_fail(char *why, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return false;
}

static int ls_hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* 64 hex digits (either case) into 32 bytes. */
static bool ls_hex_sha256(const char *s, uint8_t out[32]) {
    if (strlen(s) != 64) return false;
    for (int i = 0; i < 32; i++) {
        const int hi = ls_hex_digit(s[2 * i]), lo = ls_hex_digit(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return false;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

/* An integer in [lo, hi] at key of entry i into *out. */
static bool ls_keys_int(json_t *v, size_t i, const char *key, long long lo, long long hi, long long *out, char *why,
                        size_t len) {
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return ls_keys_fail(why, len, "keys[%zu].%s must be an integer from %lld to %lld", i, key, lo, hi);
    *out = json_integer_value(v);
    return true;
}

/* A string value at key of entry i, or NULL with why filled. */
static const char *ls_keys_str(json_t *v, size_t i, const char *key, char *why, size_t len) {
    if (!json_is_string(v)) {
        ls_keys_fail(why, len, "keys[%zu].%s must be a string", i, key);
        return NULL;
    }
    return json_string_value(v);
}

static bool ls_keys_role(json_t *v, size_t i, ls_role *role, char *why, size_t len) {
    const char *s = ls_keys_str(v, i, "role", why, len);
    for (int r = 0; s && ls_role_names[r]; r++)
        if (!strcmp(s, ls_role_names[r])) {
            *role = (ls_role)r;
            return true;
        }
    if (!s) return false;
    char shown[64];
    ls_text_log_field(s, false, shown, sizeof shown);
    return ls_keys_fail(why, len, "keys[%zu].role \"%s\" is not a role: admin, tenant or viewer", i, shown);
}

static bool ls_keys_hash(json_t *v, size_t i, ls_api_key *k, char *why, size_t len) {
    const char *s = ls_keys_str(v, i, "sha256", why, len);
    if (!s) return false;
    if (!ls_hex_sha256(s, k->sha256))
        return ls_keys_fail(why, len,
                            "keys[%zu].sha256 must be the 64 hex digits of the key's SHA-256 (sha256sum of the key, "
                            "without a newline), not the key itself",
                            i);
    static const char hexd[] = "0123456789abcdef";
    for (int b = 0; b < LS_KEY_ID_LEN / 2; b++) {
        k->id[2 * b] = hexd[k->sha256[b] >> 4];
        k->id[2 * b + 1] = hexd[k->sha256[b] & 15];
    }
    k->id[LS_KEY_ID_LEN] = '\0';
    return true;
}

/* One value of entry i by its key; unknown keys are refused with a did-you-mean. */
static bool ls_keys_field(const char *key, json_t *v, size_t i, ls_api_key *k, char *why, size_t len) {
    static const char *const known[] = {"sha256", "tenant", "role", "max_adapters", "rate", "max_pins", NULL};
    long long n = 0;
    if (!strcmp(key, "sha256")) return ls_keys_hash(v, i, k, why, len);
    if (!strcmp(key, "role")) return ls_keys_role(v, i, &k->role, why, len);
    if (!strcmp(key, "tenant")) {
        const char *s = ls_keys_str(v, i, "tenant", why, len);
        if (!s) return false;
        if (!ls_tenant_name_valid(s))
            return ls_keys_fail(why, len,
                                "keys[%zu].tenant must be 1 to %d of a-z, 0-9, '_' and '-', starting with a letter or "
                                "digit",
                                i, LS_TENANT_NAME_MAX);
        snprintf(k->tenant, sizeof k->tenant, "%s", s);
        return true;
    }
    if (!strcmp(key, "max_adapters")) {
        if (!ls_keys_int(v, i, key, 0, 1000000, &n, why, len)) return false;
        k->max_adapters = n;
        return true;
    }
    if (!strcmp(key, "max_pins")) {
        if (!ls_keys_int(v, i, key, 0, 1024, &n, why, len)) return false;
        k->max_pins = (int)n;
        return true;
    }
    if (!strcmp(key, "rate")) {
        const double r = json_is_number(v) ? json_number_value(v) : -1;
        if (!(r > 0 && r <= 1e6))
            return ls_keys_fail(why, len, "keys[%zu].rate must be a number of requests per second above 0, at most 1e6",
                                i);
        k->rate = r;
        return true;
    }
    char hint[160], near[160], shown[64];
    ls_text_unknown_key(key, known, hint, sizeof hint, near, sizeof near);
    ls_text_log_field(key, false, shown, sizeof shown);
    return ls_keys_fail(why, len, "keys[%zu] has an unknown key \"%s\"%s (%s)", i, shown, near, hint);
}

/* Entry i into k: an object with sha256 and role, and a tenant unless an admin. */
static bool ls_keys_entry(json_t *e, size_t i, ls_api_key *k, char *why, size_t len) {
    if (!json_is_object(e)) return ls_keys_fail(why, len, "keys[%zu] must be an object", i);
    *k = (ls_api_key){.max_adapters = -1, .max_pins = LS_API_KEYS_DEFAULT_PINS, .role = LS_ROLE_TENANT};
    const char *key;
    json_t *v;
    json_object_foreach(e, key, v) if (!ls_keys_field(key, v, i, k, why, len)) return false;
    if (!json_object_get(e, "sha256")) return ls_keys_fail(why, len, "keys[%zu] has no sha256", i);
    if (!json_object_get(e, "role")) return ls_keys_fail(why, len, "keys[%zu] has no role (admin, tenant or viewer)", i);
    if (k->role != LS_ROLE_ADMIN && !k->tenant[0])
        return ls_keys_fail(why, len, "keys[%zu] has no tenant (a %s key needs one)", i, ls_role_name(k->role));
    return true;
}

/* The keys array into out; a hash given twice is refused (which entry would win?). */
static bool ls_keys_array(json_t *arr, ls_api_keys *out, char *why, size_t len) {
    const size_t n = json_array_size(arr);
    if (n > LS_API_KEYS_MAX) return ls_keys_fail(why, len, "keys has %zu entries: at most %d", n, LS_API_KEYS_MAX);
    out->keys = n ? calloc(n, sizeof *out->keys) : NULL;
    if (n && !out->keys) return ls_keys_fail(why, len, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (!ls_keys_entry(json_array_get(arr, i), i, &out->keys[i], why, len)) return false;
        for (size_t j = 0; j < i; j++)
            if (!memcmp(out->keys[j].sha256, out->keys[i].sha256, 32))
                return ls_keys_fail(why, len, "keys[%zu].sha256 is keys[%zu]'s too: each key is given once", i, j);
        out->n = i + 1;
    }
    return true;
}

bool ls_api_keys_parse(const char *text, size_t len, ls_api_keys *out, char *why, size_t why_len) {
    memset(out, 0, sizeof *out);
    if (why_len) why[0] = '\0';
    if (len > LS_API_KEYS_FILE_MAX)
        return ls_keys_fail(why, why_len, "the file is %zu bytes: at most %u", len, LS_API_KEYS_FILE_MAX);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    bool ok;
    if (!root) {
        char shown[3 * sizeof jerr.text];
        ls_text_log_field(jerr.text, true, shown, sizeof shown);
        ok = ls_keys_fail(why, why_len, "not JSON: line %d column %d: %s", jerr.line, jerr.column, shown);
    } else if (!json_is_object(root)) {
        ok = ls_keys_fail(why, why_len, "must be a JSON object {\"keys\": [...]}");
    } else {
        static const char *const known[] = {"keys", NULL};
        const char *key;
        json_t *v;
        ok = true;
        json_object_foreach(root, key, v) {
            if (!strcmp(key, "keys")) continue;
            char hint[64], near[160], shown[64];
            ls_text_unknown_key(key, known, hint, sizeof hint, near, sizeof near);
            ls_text_log_field(key, false, shown, sizeof shown);
            ok = ls_keys_fail(why, why_len, "unknown key \"%s\"%s (%s)", shown, near, hint);
            break;
        }
        json_t *arr = json_object_get(root, "keys");
        if (ok && !json_is_array(arr)) ok = ls_keys_fail(why, why_len, "\"keys\" must be an array of key objects");
        if (ok) ok = ls_keys_array(arr, out, why, why_len);
    }
    json_decref(root);
    if (!ok) ls_api_keys_free(out);
    return ok;
}

void ls_api_keys_free(ls_api_keys *k) {
    free(k->keys);
    k->keys = NULL;
    k->n = 0;
}
