/* POST /adapters and /adapters/validate bodies (SPEC §3, §5): a path to a
 * PEFT directory or .safetensors file under --adapter-dir, inline JSON
 * tensors, or a raw safetensors body with parameters in the query string
 * or __metadata__. Produces the tensors and parameters lora/ validates. */
#ifndef LS_API_ADAPTER_UPLOAD_H
#define LS_API_ADAPTER_UPLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/file.h"
#include "common/tensor.h"
#include "lora/adapter.h"

typedef struct {
    char name[129];
    bool pinned, replace;
    ls_adapter_params params;
    ls_tensor_set tensors; /* owned; may borrow from map */
    ls_file_map map;       /* backing of a file read by path */
    char source_path[4096]; /* resolved path, "" for inline uploads */
} ls_adapter_upload;

/* Looks a query-string key up (NULL when absent). */
typedef const char *(*ls_query_fn)(void *ctx, const char *key);

/* JSON body: {"name", "path"} or {"name", "format", "config", "tensors"}
 * plus pinned/strict/replace/scale. require_name false for validate. */
ls_status ls_adapter_upload_parse_json(const char *body, size_t len, const char *adapter_dir, bool strict_default,
                                       bool require_name, ls_adapter_upload *up, ls_error *err);

/* Raw safetensors body; body must outlive up (tensors borrow from it). */
ls_status ls_adapter_upload_parse_raw(const uint8_t *body, size_t len, ls_query_fn query, void *query_ctx,
                                      bool strict_default, bool require_name, ls_adapter_upload *up, ls_error *err);

/* Reads an already-resolved path (PEFT directory or .safetensors file):
 * fills tensors (borrowing from map) and the file's params. Used for
 * uploads by path and to reload adapters dropped from the host tier. */
ls_status ls_adapter_read_path(const char *path, ls_adapter_params *params, ls_tensor_set *tensors, ls_file_map *map,
                               ls_error *err);

/* Resolves rel under dir (realpath both; "" dir = working directory); a
 * result outside dir, or one that does not exist, is LS_INVALID_REQUEST. */
ls_status ls_adapter_resolve_path(const char *dir, const char *rel, char *out, size_t out_len, ls_error *err);

void ls_adapter_upload_free(ls_adapter_upload *up);

#endif
