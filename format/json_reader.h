/* A strict one-pass JSON reader (RFC 8259, as jansson reads it: UTF-8
 * strings without NUL, duplicate keys left to the caller or refused by
 * the strict helpers below) for bodies too large to hold as a tree of
 * JSON values: the caller pulls one token at a time and keeps only what
 * it needs (a number costs it 4 bytes as a float, not a JSON value). */
#ifndef LS_FORMAT_JSON_READER_H
#define LS_FORMAT_JSON_READER_H

#include <stdbool.h>
#include <stddef.h>

#define LS_JR_MAX_DEPTH 2048 /* jansson's nesting limit */

typedef struct {
    const char *start, *p, *end;
    int depth;         /* arrays and objects the caller has entered itself (ls_jr_skip counts from there) */
    bool failed;       /* a syntax error was met; every call after it fails */
    bool oom;          /* with failed: memory ran out (not the text's fault) */
    char message[160]; /* what it was */
    size_t at;         /* its byte offset */
} ls_jr;

void ls_jr_init(ls_jr *r, const char *text, size_t len);

/* The next token's first character after whitespace: '{', '}', '[', ']',
 * ',', ':', '"', '-' or a digit (a number), 't', 'f', 'n'; 0 at the end
 * of the text or after a failure. Consumes nothing. */
char ls_jr_peek(ls_jr *r);

/* Consumes the punctuation c ('{', '}', '[', ']', ',', ':') or fails. */
bool ls_jr_punct(ls_jr *r, char c);

/* Reads a string into buf (cap bytes with the NUL; longer strings are
 * decoded but cut, *len still giving the whole length). Escapes are
 * decoded, UTF-8 is checked, NUL (\u0000) is refused. */
bool ls_jr_string(ls_jr *r, char *buf, size_t cap, size_t *len);

/* Reads a number. *is_int: it had no fraction and no exponent, and
 * *ival holds it (when it fits a long long; otherwise *is_int is false). */
bool ls_jr_number(ls_jr *r, double *val, bool *is_int, long long *ival);

/* Reads true, false or null; *which receives 't', 'f' or 'n'. */
bool ls_jr_literal(ls_jr *r, char *which);

/* Reads and discards any one value (checked all the same), refusing
 * nesting past LS_JR_MAX_DEPTH counted from the top of the text: depth
 * is the caller's. */
bool ls_jr_skip(ls_jr *r);

/* True when only whitespace is left. */
bool ls_jr_at_end(ls_jr *r);

/* Marks a syntax error at the current position (first one wins). */
bool ls_jr_fail(ls_jr *r, const char *what);
/* Marks running out of memory: the read stops as on a syntax error,
 * with oom set. */
bool ls_jr_fail_oom(ls_jr *r);

/* ---- as jansson reads it, for bodies that must be refused exactly as a
 * jansson parse with JSON_REJECT_DUPLICATES refused them ---------------- */

/* ls_jr_number, and an integer (no fraction, no exponent) past 64 bits
 * is a syntax error ("too big integer"), as jansson has it. *val is
 * the number as jansson gives it: an integer's exact value (so -0 is 0). */
bool ls_jr_number_strict(ls_jr *r, double *val, bool *is_int, long long *ival);

/* A set of strings (object keys), to refuse a key given twice. */
typedef struct {
    char **keys;   /* owned, open addressing; NULL = empty slot */
    size_t *lens;
    size_t cap, n;
} ls_jr_keys;

void ls_jr_keys_init(ls_jr_keys *k);
void ls_jr_keys_free(ls_jr_keys *k);
/* Adds key[len] (copied): 1 when new, 0 when already there, -1 when out
 * of memory. */
int ls_jr_keys_add(ls_jr_keys *k, const char *key, size_t len);

/* The string at r decoded into a new buffer of *len bytes and a NUL
 * (the caller's to free). NULL when r failed (bad syntax, or out of
 * memory: oom set). */
char *ls_jr_string_dup(ls_jr *r, size_t *len);

/* ls_jr_skip that reads numbers with ls_jr_number_strict and refuses a
 * key given twice in any object ("duplicate object key"); the nesting
 * limit counts containers only, from depth. */
bool ls_jr_skip_strict(ls_jr *r);

#endif
