/* See json.h. */
#include "format/json.h"

#include <stdio.h>
#include <string.h>

const char *ls_json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

const char *ls_json_error_reason(const json_error_t *e, char *buf, size_t len) {
    snprintf(buf, len, "%s", e->text);
    char *near = strstr(buf, " near ");
    if (near) *near = '\0';
    /* jansson names its own flag; the client needs the rule. */
    char *flag = strstr(buf, " without JSON_ALLOW_NUL");
    if (flag) snprintf(flag, len - (size_t)(flag - buf), " in a string");
    /* "invalid Unicode '\uDEAD'" quotes the text too. */
    if (!strncmp(buf, "invalid Unicode ", 16)) buf[15] = '\0';
    return buf;
}
