/* struct ls_error: what went wrong, filled by whichever layer finds it.
 * Carries the first code, a message and a hint, and the list of every
 * violation found (layer, tensor, axis, expected, got, hint) so a client
 * learns every problem of an upload from one response. */
#ifndef LS_COMMON_ERROR_H
#define LS_COMMON_ERROR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define LS_NA (-1) /* an absent layer, axis, expected or got */

typedef struct {
    ls_status code;
    int layer;        /* LS_NA when the problem is not tied to a layer */
    char tensor[192]; /* "" when not tied to a tensor */
    int axis;         /* LS_NA when not tied to an axis */
    int64_t expected; /* LS_NA when no size applies */
    int64_t got;
    char message[320];
    char hint[512]; /* as the top-level hint's: a family's names fit */
} ls_violation;

typedef struct ls_error {
    ls_status code; /* LS_OK until something fails; then the first code */
    char message[512];
    char hint[512]; /* a path or two fit: "give the path ..." */
    ls_violation *violations; /* owned; every problem found, in order */
    size_t n_violations;
    size_t cap_violations;
    int dropped; /* violations not stored because the list was full */
} ls_error;

/* Caps the violation list so a hostile upload cannot make the reply huge. */
#define LS_ERROR_MAX_VIOLATIONS 256

void ls_error_init(ls_error *err);
/* Frees the violation list; the struct can be reused after ls_error_init. */
void ls_error_free(ls_error *err);
/* Makes dst (initialised, empty) a copy of src with its own violation
 * list; false when out of memory (dst then has src's top-level fields and
 * counts the violations it could not keep as dropped). */
bool ls_error_copy(ls_error *dst, const ls_error *src);
/* Forgets everything, keeping the allocation. */
void ls_error_clear(ls_error *err);

/* Sets the top-level code, message and hint when none is set yet (the first
 * failure wins). hint NULL means the status table's default. Returns code. */
ls_status ls_error_set(ls_error *err, ls_status code, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Rewrites the top-level message (and hint, when not NULL) of an error
 * already set, keeping its code and violations: for a summary that says
 * more than the first violation (an adapter made for another model). */
void ls_error_headline(ls_error *err, const char *hint, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Appends one violation; the first one also sets the top-level fields.
 * tensor may be NULL, hint NULL means the default. Returns code. */
ls_status ls_error_add(ls_error *err, ls_status code, int layer, const char *tensor, int axis,
                       int64_t expected, int64_t got, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));

#endif
