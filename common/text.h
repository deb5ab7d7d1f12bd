/* Small pieces of plain-text parsing and hashing that several folders
 * need the same way: booleans as flags, query strings and metadata spell
 * them, the splitmix64 stream the demo model and the tests draw from, the
 * FNV-1a hash of names, the adapter name rule, plain integers, fields of
 * log lines, the powers of ten that decimal numbers are read and
 * written with, and the "did you mean" of a name a user mistyped. */
#ifndef LS_COMMON_TEXT_H
#define LS_COMMON_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* 10^k for k in [-60, 60], each correctly rounded: exact for 0..22, the
 * powers a double holds exactly (the JSON reader's fast path relies on
 * that); the JSON writer scales by the others. */
extern const double ls_pow10_table[121];
static inline double ls_pow10(int k) { return ls_pow10_table[60 + k]; }

/* Checks an adapter name (docs/api.md: 1-128 of [A-Za-z0-9._-], not
 * starting with '.'): the API's rule, and --adapter's. */
bool ls_adapter_name_valid(const char *name);
/* A tenant's name (--api-keys): 1-32 of [a-z0-9_-], starting with a
 * letter or digit. */
bool ls_tenant_name_valid(const char *name);
/* A name in the pool: an adapter name, or TENANT/NAME (a tenant's
 * adapter, docs/api.md) with both parts valid and 128 bytes in all. */
bool ls_adapter_pool_name_valid(const char *name);

/* "true" or "1", "false" or "0"; false (out untouched) for anything else. */
bool ls_text_bool(const char *text, bool *out);
/* The same, and Python's str() of a bool ("True", "False"), as a client
 * or a safetensors writer in Python sends an adapter's parameters. */
bool ls_text_bool_py(const char *text, bool *out);

/* A decimal integer written plainly: an optional '-' and digits, nothing
 * else (no blank, '+', hex or trailing byte, as strtoll would take),
 * within [min, max]. False (out untouched) otherwise. The reader of every
 * integer a query string or a text parameter carries. */
bool ls_text_int(const char *text, long long min, long long max, long long *out);

/* Replaces, in place, every byte of s that is not part of a well-formed
 * UTF-8 sequence (RFC 3629: no overlong form, surrogate or code point
 * past U+10FFFF; a sequence cut short by a truncation included) with
 * '?', so that JSON can carry s. */
void ls_text_utf8_repair(char *s);
/* The number of bytes of s's first n that end on a character boundary:
 * n, or less when byte n would be inside a UTF-8 sequence. */
size_t ls_text_utf8_cut(const char *s, size_t n);

/* text as a log line shows it, into out (len bytes, always terminated,
 * cut short when it does not fit): bytes outside printable ASCII and '%'
 * written as %XX, and spaces too unless keep_spaces, so a field a client
 * chose stays one field of one line and never reaches a terminal raw. */
void ls_text_log_field(const char *text, bool keep_spaces, char *out, size_t len);

/* s for a message: whole when it has at most LS_TEXT_TAIL bytes, else
 * "..." and its end, cut at a character's start (the end of a path names
 * its file, which is what tells). Use .s within the call it is made for. */
#define LS_TEXT_TAIL 200
typedef struct {
    char s[LS_TEXT_TAIL + 1];
} ls_text_cut;
ls_text_cut ls_text_tail(const char *s);

/* The nearest of a set of known names to a word a user gave, for a "did
 * you mean" in the error about it (flags, config and JSON keys, query
 * parameters, adapter names). Offer each candidate; best holds a copy of
 * the nearest within a small edit distance (adjacent swaps count one), ""
 * when none is near enough. Nothing to free. */
typedef struct {
    const char *word; /* the caller's, read while offering */
    char best[136];
    int dist;
} ls_text_near;

/* Edit distance of a and b (insert, delete, substitute, swap of two
 * neighbours), counted up to cap: cap + 1 means "more than cap". */
int ls_text_distance(const char *a, const char *b, int cap);
void ls_text_near_init(ls_text_near *n, const char *word);
void ls_text_near_offer(ls_text_near *n, const char *candidate);
/* "; did you mean \"BEST\"?" (prefix and suffix around BEST) into buf
 * when a candidate was near, "" otherwise; returns buf. */
const char *ls_text_near_clause(const ls_text_near *n, const char *prefix, const char *suffix, char *buf,
                                size_t len);
/* For a key that is none of known (NULL-terminated): "known keys: a, b"
 * into hint and "; did you mean \"b\"?" (or "") into near, which it
 * returns. Every unknown-key error of a JSON body says both. */
const char *ls_text_unknown_key(const char *key, const char *const *known, char *hint, size_t hint_len, char *near,
                                size_t near_len);

/* The next value of a splitmix64 stream whose state is *state. */
static inline uint64_t ls_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* 64-bit FNV-1a of a NUL-terminated string. */
static inline uint64_t ls_fnv1a64(const char *s) {
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

#endif
