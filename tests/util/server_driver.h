/* A real lorasink server on an ephemeral port, driven with libcurl: what
 * the integration tests talk to. They run the binary, so this links no
 * server code. */
#ifndef LS_TESTS_SERVER_DRIVER_H
#define LS_TESTS_SERVER_DRIVER_H

#include <jansson.h>
#include <stdbool.h>
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
/* Sends SIGKILL at once, waits and frees s: a crash, not a shutdown. */
void ls_test_server_kill(ls_test_server *s);
/* What the server printed so far (stdout and stderr, the last MiB),
 * malloc'd; the caller frees it. */
char *ls_test_server_output(ls_test_server *s);
/* How often text is in the server's output, once it is there at all:
 * waits up to 5 s for the first occurrence (0 if it never comes). The
 * server logs before it replies, but its output reaches the test through
 * a pipe drained by a thread of its own, which may not have read the
 * line yet when the reply is in. */
int ls_test_server_wait_output(ls_test_server *s, const char *text);

/* A JSON forward body: T tokens of H copies of value (a JSON number as
 * text), then gammas with gamma_row for every token and "adapter" when
 * they are given (NULL: left out); malloc'd, the caller frees it. */
char *ls_test_forward_json(int T, int H, const char *value, const char *gamma_row, const char *adapter);
/* The server's process id (for signals and /proc). */
int ls_test_server_pid(const ls_test_server *s);

/* Runs the binary with args (NULL-terminated) to its end; out receives
 * its stdout and stderr (cap bytes at most). Returns the exit status. */
int ls_test_run_binary(const char *const *args, char *out, size_t cap);

/* A TCP connection to the server (receive timeout 3 s), for bytes curl
 * will not send; -1 when refused. */
int ls_test_raw_connect(const ls_test_server *s);
/* Reads until the server closes (true) or the timeout or cap (false);
 * buf is NUL-terminated. */
bool ls_test_raw_read_all(int fd, char *buf, size_t cap, size_t *len);
/* The value of the unlabelled sample name in /metrics; -1 when the
 * scrape fails or has no such line. The server must have no API key. */
double ls_test_metric(const ls_test_server *s, const char *name);
/* A /forward whose headers are sent and whose body never comes, once the
 * server counts it in lorasink_forwards_receiving: while it is open the
 * batcher holds each batch open (up to --batch-wait-us) for it. The
 * server must have no API key. Returns the descriptor (the caller closes
 * it), -1 on failure. */
int ls_test_open_receiving_forward(const ls_test_server *s);
/* Waits (10 s at most) until lorasink_forwards_receiving is want: every
 * forward the server has begun to read is counted out again once it is
 * queued, refused or abandoned. */
bool ls_test_wait_receiving(const ls_test_server *s, long want);
/* Waits (10 s at most) until the unlabelled sample name in /metrics is
 * want: for a state the server reaches on its own threads (a forward
 * queued in the batcher, a body being read), which a reply to another
 * request does not wait for. The server must have no API key. */
bool ls_test_wait_metric(const ls_test_server *s, const char *name, double want);

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
/* ls_test_http without its 120 s limit on the exchange (the test's own
 * ctest timeout still bounds it): for a request that waits on work sized
 * to keep the backend busy, which a sanitizer or a busy machine
 * stretches to minutes. */
int ls_test_http_long(const ls_test_server *s, const char *method, const char *path, const char *content_type,
                      const void *body, size_t len, const char *const *extra_headers, ls_test_response *out);
void ls_test_response_free(ls_test_response *r);
/* The value of header name (any case) in raw response headers, into buf;
 * "" when there is none. Returns buf. */
const char *ls_test_header(const char *headers, const char *name, char *buf, size_t len);

/* Parses the response body as JSON (NULL when it is not). */
json_t *ls_test_response_json(const ls_test_response *r);
/* The "error"."code" of an error body, or "" (borrowed from j). */
const char *ls_test_error_code(const json_t *j);

#endif
