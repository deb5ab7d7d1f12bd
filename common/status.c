/* Lookups into the status table of status.h. */
#include "common/status.h"

typedef enum { LS_KIND_NONE, LS_KIND_INPUT, LS_KIND_CONTENT } ls_status_kind;

static const struct {
    const char *code;
    ls_status_kind kind;
    const char *hint;
} ls_status_table[LS_STATUS_COUNT] = {
#define LS_X_ROW(e, code, kind, hint) [LS_##e] = {code, LS_KIND_##kind, hint},
    LS_STATUS_LIST(LS_X_ROW)
#undef LS_X_ROW
};

const char *ls_status_code(ls_status s) {
    return (unsigned)s < LS_STATUS_COUNT ? ls_status_table[s].code : "internal";
}

static ls_status_kind ls_status_kind_of(ls_status s) {
    return (unsigned)s < LS_STATUS_COUNT ? ls_status_table[s].kind : LS_KIND_NONE;
}

bool ls_status_is_input(ls_status s) { return ls_status_kind_of(s) != LS_KIND_NONE; }

bool ls_status_is_validation(ls_status s) { return ls_status_kind_of(s) == LS_KIND_CONTENT; }

const char *ls_status_hint(ls_status s) {
    return (unsigned)s < LS_STATUS_COUNT ? ls_status_table[s].hint : "";
}
