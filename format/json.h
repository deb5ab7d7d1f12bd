/* What the JSON readers of several folders say the same way. */
#ifndef LS_FORMAT_JSON_H
#define LS_FORMAT_JSON_H

#include <jansson.h>

/* "an object", "an array", "a string", "an integer", "a real number",
 * "a boolean" or "null": a JSON value's kind, as an error message names it. */
const char *ls_json_kind(const json_t *v);

/* jansson's reason for a parse error without the text it quotes ("near
 * '...'") or its own flag names, written into buf (len bytes), which is
 * returned: a message about a file read from disk must not carry the
 * file's bytes. */
const char *ls_json_error_reason(const json_error_t *e, char *buf, size_t len);

#endif
