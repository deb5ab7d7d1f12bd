/* A real lorasink server on an ephemeral port, driven with libcurl: what
 * the integration tests talk to. They run the binary, so this links no
 * server code. */
#ifndef LS_TESTS_SERVER_DRIVER_H
#define LS_TESTS_SERVER_DRIVER_H

#include <jansson.h>
#include <stddef.h>

#include "tests/util/testutil.h"

typedef struct ls_test_server ls_test_server;

/* Starts the lorasink binary with --port 0 and the given extra arguments
 * (NULL-terminated), waits for "listening on http://127.0.0.1:PORT".
 * Returns NULL (after printing the server's output) when it fails. */
ls_test_server *ls_test_server_start(const char *const *args);
/* Same with extra environment entries "KEY=VALUE" (NULL-terminated). */
ls_test_server *ls_test_server_start_env(const char *const *args, const char *const *env);
int ls_test_server_port(const ls_test_server *s);
/* Sends SIGTERM, waits, returns the exit status (or -1). */
int ls_test_server_stop(ls_test_server *s);

typedef struct {
    long status;
    char *body; /* NUL-terminated, owned */
    size_t len;
    char *headers; /* raw response headers, owned */
    char *content_type;
} ls_test_response;

/* One HTTP request to the server. content_type NULL = application/json
 * when body is given. extra_headers: NULL-terminated "Name: value" list.
 * Returns 0 on transport success. */
int ls_test_http(const ls_test_server *s, const char *method, const char *path, const char *content_type,
                 const void *body, size_t len, const char *const *extra_headers, ls_test_response *out);
void ls_test_response_free(ls_test_response *r);

/* Parses the response body as JSON (NULL when it is not). */
json_t *ls_test_response_json(const ls_test_response *r);
/* The "error"."code" of an error body, or "" (borrowed from j). */
const char *ls_test_error_code(const json_t *j);

#endif
