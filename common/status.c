/* Lookups into the status table of status.h. */
#include "common/status.h"

static const struct {
    const char *code;
    int http;
    const char *hint;
} ls_status_table[LS_STATUS_COUNT] = {
#define LS_X_ROW(e, code, http, hint) [LS_##e] = {code, http, hint},
    LS_STATUS_LIST(LS_X_ROW)
#undef LS_X_ROW
};

const char *ls_status_code(ls_status s) {
    return (unsigned)s < LS_STATUS_COUNT ? ls_status_table[s].code : "internal";
}

int ls_status_table_http(ls_status s) {
    return (unsigned)s < LS_STATUS_COUNT ? ls_status_table[s].http : 500;
}

/* The classes are the table's own: a client error of content (422), size
 * (413) or form (400). */
bool ls_status_is_input(ls_status s) {
    const int h = ls_status_table_http(s);
    return h == 400 || h == 413 || h == 422;
}

bool ls_status_is_validation(ls_status s) { return ls_status_table_http(s) == 422; }

const char *ls_status_hint(ls_status s) {
    return (unsigned)s < LS_STATUS_COUNT ? ls_status_table[s].hint : "";
}
