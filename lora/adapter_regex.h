/* The part of Python's `re` that PEFT's adapter configs use, evaluated
 * exactly: whether re.match(pattern, s) finds a match. Literals, escapes,
 * `.`, sets, groups, alternation, greedy and lazy quantifiers, `^`, `$`,
 * `\A`, `\Z`, on ASCII text. What it cannot evaluate the way Python would
 * (back-references, lookarounds, possessive quantifiers, inline flags,
 * word boundaries, non-ASCII text) is refused with a reason, never guessed. */
#ifndef LS_LORA_ADAPTER_REGEX_H
#define LS_LORA_ADAPTER_REGEX_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ls_regex ls_regex;

/* Compiles pattern (NUL-terminated, Python syntax) into *out (the
 * caller's, ls_regex_free). On failure *out is NULL and why receives the
 * reason ("unbalanced parenthesis at 3", "look-ahead is not supported").
 * Patterns whose program would exceed a fixed size are refused too. */
bool ls_regex_compile(const char *pattern, ls_regex **out, char *why, size_t why_len);

/* What re.match(pattern, s) says: 1 a match (anchored at the start, at any
 * end), 0 none, -1 s is not ASCII (Python counts characters, this engine
 * bytes: refused rather than guessed). */
int ls_regex_match(const ls_regex *re, const char *s);

void ls_regex_free(ls_regex *re);

#endif
