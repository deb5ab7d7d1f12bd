/* What the JSON readers of several folders say the same way. */
#ifndef LS_FORMAT_JSON_H
#define LS_FORMAT_JSON_H

#include <jansson.h>

/* "an object", "an array", "a string", "an integer", "a real number",
 * "a boolean" or "null": a JSON value's kind, as an error message names it. */
const char *ls_json_kind(const json_t *v);

#endif
