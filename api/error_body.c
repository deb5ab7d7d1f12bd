/* ls_error -> {"error": {"code", "status", "message", "hint", "violations"}}. */
#include "api/error_body.h"

static json_t *ls_violation_json(const ls_violation *v) {
    json_t *o = json_pack("{s:s, s:s, s:s}", "code", ls_status_code(v->code), "message", v->message, "hint", v->hint);
    if (!o) return NULL;
    if (v->layer != LS_NA) json_object_set_new(o, "layer", json_integer(v->layer));
    if (v->tensor[0]) json_object_set_new(o, "tensor", json_string(v->tensor));
    if (v->axis != LS_NA) json_object_set_new(o, "axis", json_integer(v->axis));
    if (v->expected != LS_NA) json_object_set_new(o, "expected", json_integer(v->expected));
    if (v->got != LS_NA) json_object_set_new(o, "got", json_integer(v->got));
    return o;
}

json_t *ls_error_body(const ls_error *err) {
    ls_status code = err->code == LS_OK ? LS_INTERNAL : err->code;
    json_t *list = json_array();
    for (size_t i = 0; list && i < err->n_violations; i++) json_array_append_new(list, ls_violation_json(&err->violations[i]));
    json_t *e = json_pack("{s:s, s:i, s:s, s:s, s:o?}", "code", ls_status_code(code), "status", ls_status_http(code),
                          "message", err->message[0] ? err->message : ls_status_code(code), "hint",
                          err->hint[0] ? err->hint : ls_status_hint(code), "violations", list);
    if (e && err->dropped) json_object_set_new(e, "violations_dropped", json_integer(err->dropped));
    return e ? json_pack("{s:o}", "error", e) : NULL;
}

char *ls_error_body_text(const ls_error *err) {
    json_t *b = ls_error_body(err);
    if (!b) return NULL;
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}
