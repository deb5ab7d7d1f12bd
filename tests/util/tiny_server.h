/* A lorasink server on the conformance example's model (tests/data/
 * tiny.json: n=2, H=4, F=3, one layer, pool max rank 4), with an adapter
 * directory, and the example's adapter in every upload form. */
#ifndef LS_TESTS_TINY_SERVER_H
#define LS_TESTS_TINY_SERVER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/util/server_driver.h"

typedef struct {
    ls_test_server *srv;
    char *dir; /* temp dir: weights file and --adapter-dir */
    json_t *tiny;
    char **args; /* the command line it was started with (owned), for restarts */
} tiny_server;

/* Starts the server with the given W13 layout and extra arguments
 * (NULL-terminated, may be NULL). */
bool tiny_server_start(tiny_server *ts, const char *layout, const char *const *extra);
/* Same with extra environment entries "KEY=VALUE" for the server only
 * (NULL-terminated, may be NULL); a restart does not repeat them. */
bool tiny_server_start_env(tiny_server *ts, const char *layout, const char *const *extra, const char *const *env);
void tiny_server_stop(tiny_server *ts);
/* Ends the server (SIGKILL when crash, else SIGTERM and exit status 0
 * asserted) and starts it again with the same command line and files. */
bool tiny_server_restart(tiny_server *ts, bool crash);

/* The example adapter as an inline JSON upload (PEFT, config r=2 alpha=4):
 * dtype NULL = nested f32 arrays, "bf16"/"f16"/"f32" = base64 objects. */
json_t *tiny_adapter_inline(tiny_server *ts, const char *name, const char *dtype);
/* The example adapter in pool format (scaled factors at rank 2). */
json_t *tiny_adapter_pool_format(tiny_server *ts, const char *name);
/* The example adapter's PEFT tensors as a safetensors body (malloc'd),
 * its __metadata__ "format": "pt" as PEFT writes it; alpha_meta non-NULL
 * puts lora_alpha there too. */
uint8_t *tiny_adapter_safetensors(tiny_server *ts, const char *alpha_meta, size_t *len);
/* Writes sub/adapter_config.json (config_json) and
 * sub/adapter_model.safetensors under the adapter dir. */
void tiny_write_peft_dir(tiny_server *ts, const char *sub, const char *config_json);
/* Writes a bare .safetensors adapter file under the adapter dir. */
void tiny_write_adapter_file(tiny_server *ts, const char *file, const char *alpha_meta);
/* A symlink under the adapter dir that points outside it. */
void tiny_make_escape_link(tiny_server *ts, const char *name);

/* POSTs body and asserts the status; returns the response JSON. */
/* Upload bodies of the given factor shapes (layer 0, values that vary by
 * position) for the shape checks: PEFT factors (r 2, lora_alpha 4) and the
 * pool format. A shape is TINY_SHAPE(a, b, ...). The caller owns them. */
#define TINY_SHAPE(...) (int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int))
/* A nested array of the given shape, values v + 0.0625 * (i % 3). */
json_t *tiny_filled(const int *shape, int nd, double v);
json_t *tiny_shaped_peft(const int *ga, int nga, const int *gb, int ngb, const int *da, int nda, const int *db,
                         int ndb);
json_t *tiny_shaped_pool(const int *ga, int nga, const int *gb, int ngb, const int *da, int nda, const int *db,
                         int ndb);
json_t *tiny_post_json(tiny_server *ts, const char *path, const json_t *body, long want_status);
/* Sends method to path with a JSON text body (NULL: none) and headers
 * (NULL-terminated, may be NULL); asserts the status, printing the reply
 * when it differs. Returns the reply's body (owned, malloc'd). */
char *tiny_request(tiny_server *ts, const char *method, const char *path, const char *body,
                   const char *const *headers, long want_status);
/* GET path; asserts the status; the reply as JSON (owned). */
json_t *tiny_get_json(tiny_server *ts, const char *path, long want_status);
/* Forward of the example's x and gammas with adapters [name, null, name];
 * asserts y matches the example's expected y for layout (rel 1e-5). */
void tiny_check_forward(tiny_server *ts, const char *name, const char *layout);
/* GET /pool and GET /adapters as one string (malloc'd), to compare. */
char *tiny_state_snapshot(tiny_server *ts);

#endif
