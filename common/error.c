/* ls_error: first-failure-wins top level plus the list of every violation. */
#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ls_error_init(ls_error *err) { memset(err, 0, sizeof *err); }

void ls_error_free(ls_error *err) {
    free(err->violations);
    memset(err, 0, sizeof *err);
}

void ls_error_clear(ls_error *err) {
    err->code = LS_OK;
    err->message[0] = err->hint[0] = '\0';
    err->n_violations = 0;
    err->dropped = 0;
}

static void ls_error_set_top(ls_error *err, ls_status code, const char *hint, const char *msg) {
    if (err->code != LS_OK) return;
    err->code = code;
    snprintf(err->message, sizeof err->message, "%s", msg);
    snprintf(err->hint, sizeof err->hint, "%s", hint ? hint : ls_status_hint(code));
}

void ls_error_headline(ls_error *err, const char *hint, const char *fmt, ...) {
    if (!err || err->code == LS_OK) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    if (hint) snprintf(err->hint, sizeof err->hint, "%s", hint);
}

ls_status ls_error_set(ls_error *err, ls_status code, const char *hint, const char *fmt, ...) {
    if (!err) return code;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ls_error_set_top(err, code, hint, msg);
    return code;
}

bool ls_error_copy(ls_error *dst, const ls_error *src) {
    ls_violation *keep = dst->violations;
    *dst = *src;
    dst->violations = keep;
    dst->n_violations = dst->cap_violations = 0;
    if (src->n_violations == 0) return true;
    ls_violation *v = realloc(keep, src->n_violations * sizeof *v);
    if (!v) {
        dst->dropped += (int)src->n_violations;
        return false;
    }
    memcpy(v, src->violations, src->n_violations * sizeof *v);
    dst->violations = v;
    dst->n_violations = dst->cap_violations = src->n_violations;
    return true;
}

ls_status ls_error_add(ls_error *err, ls_status code, int layer, const char *tensor, int axis,
                       int64_t expected, int64_t got, const char *hint, const char *fmt, ...) {
    if (!err) return code;
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ls_error_set_top(err, code, hint, msg);

    if (err->n_violations == err->cap_violations) {
        if (err->cap_violations >= LS_ERROR_MAX_VIOLATIONS) {
            err->dropped++;
            return code;
        }
        size_t cap = err->cap_violations ? err->cap_violations * 2 : 8;
        ls_violation *v = realloc(err->violations, cap * sizeof *v);
        if (!v) {
            err->dropped++; /* the top-level code still tells the client */
            return code;
        }
        err->violations = v;
        err->cap_violations = cap;
    }
    ls_violation *v = &err->violations[err->n_violations++];
    v->code = code;
    v->layer = layer;
    snprintf(v->tensor, sizeof v->tensor, "%s", tensor ? tensor : "");
    v->axis = axis;
    v->expected = expected;
    v->got = got;
    snprintf(v->message, sizeof v->message, "%s", msg);
    snprintf(v->hint, sizeof v->hint, "%s", hint ? hint : ls_status_hint(code));
    return code;
}
