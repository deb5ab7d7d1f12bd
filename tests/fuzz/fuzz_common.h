/* What the parser harnesses of tests/fuzz/ check the same way: FUZZ_CHECK
 * (an abort is what libFuzzer records as a finding) and the shape of a
 * clean reject: the status is the error's code, the message is a
 * non-empty, terminated string, and the error turns into the JSON error
 * body the server would send. Header-only: each harness is one program. */
#ifndef LS_TESTS_FUZZ_COMMON_H
#define LS_TESTS_FUZZ_COMMON_H

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "api/error_body.h"
#include "common/error.h"

#define FUZZ_CHECK(cond)                                                                                          \
    do {                                                                                                           \
        if (!(cond)) abort();                                                                                      \
    } while (0)

/* A bounded string: a NUL inside its buffer. */
#define FUZZ_TERMINATED(buf) (memchr((buf), '\0', sizeof(buf)) != NULL)

/* st is a failure that err describes, and err becomes an error body whose
 * code is st's wire code. */
static inline void fuzz_check_error(ls_status st, const ls_error *err) {
    FUZZ_CHECK(st != LS_OK && err->code == st);
    FUZZ_CHECK(FUZZ_TERMINATED(err->message) && err->message[0] && FUZZ_TERMINATED(err->hint));
    for (size_t i = 0; i < err->n_violations; i++)
        FUZZ_CHECK(FUZZ_TERMINATED(err->violations[i].message) && err->violations[i].message[0] &&
                   FUZZ_TERMINATED(err->violations[i].tensor));
    /* Any status will do: the body's text is what is checked (the HTTP
     * numbers are the server's, server/http_status.c). */
    char *text = ls_error_body_text(err, 400);
    FUZZ_CHECK(text);
    json_error_t je;
    json_t *body = json_loads(text, 0, &je);
    FUZZ_CHECK(body);
    const char *code = NULL;
    FUZZ_CHECK(!json_unpack(body, "{s:{s:s}}", "error", "code", &code) && !strcmp(code, ls_status_code(st)));
    json_decref(body);
    free(text);
}

#endif
