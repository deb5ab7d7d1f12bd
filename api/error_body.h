/* The JSON error body of docs/api.md: code, status, message, hint and every
 * violation. */
#ifndef LS_API_ERROR_BODY_H
#define LS_API_ERROR_BODY_H

#include <jansson.h>

#include "common/error.h"

/* New reference to {"error": {...}} for err (LS_INTERNAL when err has no
 * code); status is the HTTP status the body goes with (the server's:
 * server/http_status.h). */
json_t *ls_error_body(const ls_error *err, int status);
/* The same as compact text, malloc'd (caller frees); never NULL unless
 * out of memory. */
char *ls_error_body_text(const ls_error *err, int status);

#endif
