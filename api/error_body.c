/* ls_error -> {"error": {"code", "status", "message", "hint", "violations"}}. */
#include "api/error_body.h"

#include <stdlib.h>
#include <string.h>

#include "api/json_tensor.h"

/* Length of the well-formed UTF-8 sequence at s (RFC 3629: no overlong
 * forms, surrogates or code points past U+10FFFF), 0 when there is none. */
static size_t ls_utf8_seq(const unsigned char *s) {
    unsigned c = s[0];
    size_t n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F) || (c == 0xF0 && s[1] < 0x90) ||
        (c == 0xF4 && s[1] > 0x8F))
        return 0;
    return n;
}

/* A JSON string of s. Messages quote client bytes (a percent-decoded URL,
 * a query value, a name cut at a byte limit) that need not be UTF-8, and
 * jansson refuses those: each byte that is not part of a well-formed
 * sequence becomes '?', so the body is still JSON. */
static json_t *ls_error_text(const char *s) {
    json_t *j = json_string(s);
    if (j) return j;
    size_t len = strlen(s);
    char *clean = malloc(len + 1);
    if (!clean) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t n = ls_utf8_seq((const unsigned char *)s + i);
        if (n == 0) {
            clean[o++] = '?';
            i++;
        } else {
            for (size_t k = 0; k < n; k++) clean[o++] = s[i++];
        }
    }
    clean[o] = '\0';
    j = json_string(clean);
    free(clean);
    return j;
}

static json_t *ls_violation_json(const ls_violation *v) {
    json_t *o = json_pack("{s:s, s:o, s:o}", "code", ls_status_code(v->code), "message", ls_error_text(v->message),
                          "hint", ls_error_text(v->hint));
    if (!o) return NULL;
    if (v->layer != LS_NA) json_object_set_new(o, "layer", json_integer(v->layer));
    if (v->tensor[0]) json_object_set_new(o, "tensor", ls_error_text(v->tensor));
    if (v->axis != LS_NA) json_object_set_new(o, "axis", json_integer(v->axis));
    if (v->expected != LS_NA) json_object_set_new(o, "expected", json_integer(v->expected));
    if (v->got != LS_NA) json_object_set_new(o, "got", json_integer(v->got));
    return o;
}

json_t *ls_error_body(const ls_error *err, int status) {
    ls_status code = err->code == LS_OK ? LS_INTERNAL : err->code;
    json_t *list = json_array();
    for (size_t i = 0; list && i < err->n_violations; i++) json_array_append_new(list, ls_violation_json(&err->violations[i]));
    json_t *e = json_pack("{s:s, s:i, s:o, s:o, s:o?}", "code", ls_status_code(code), "status", status,
                          "message", ls_error_text(err->message[0] ? err->message : ls_status_code(code)), "hint",
                          ls_error_text(err->hint[0] ? err->hint : ls_status_hint(code)), "violations", list);
    if (e && err->dropped) json_object_set_new(e, "violations_dropped", json_integer(err->dropped));
    return e ? json_pack("{s:o}", "error", e) : NULL;
}

char *ls_error_body_text(const ls_error *err, int status) {
    return ls_json_take_text(ls_error_body(err, status));
}
