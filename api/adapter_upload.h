/* POST /adapters and /adapters/validate bodies: a path to a PEFT directory
 * or .safetensors file under --adapter-dir, inline JSON tensors, or a raw
 * safetensors body with parameters in the query string or __metadata__.
 * Bytes to structures only: lora/loader reads paths, merges parameters
 * and validates. */
#ifndef LS_API_ADAPTER_UPLOAD_H
#define LS_API_ADAPTER_UPLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/tensor.h"
#include "lora/loader.h"

typedef struct {
    char name[129];
    bool pinned, replace;
    bool pinned_given;             /* pinned was stated (a replace without it keeps the old version's pin) */
    char path[LS_LOADER_PATH_MAX]; /* as the client wrote it; "" when the tensors came with the request */
    ls_tensor_set tensors;         /* owned; inline JSON, or borrowing from a raw body */
    ls_adapter_params own;         /* what a raw body's __metadata__ says of it */
    ls_adapter_params given;       /* what the request states */
} ls_adapter_upload;

/* Looks a query-string key up (NULL when absent). */
typedef const char *(*ls_query_fn)(void *ctx, const char *key);

/* JSON body: {"name", "path"} or {"name", "format", "config", "tensors"}
 * plus pinned/strict/replace/scale. require_name false for validate. */
ls_status ls_adapter_upload_parse_json(const char *body, size_t len, bool strict_default, bool require_name,
                                       ls_adapter_upload *up, ls_error *err);

/* Raw safetensors body; body must outlive up (tensors borrow from it). */
ls_status ls_adapter_upload_parse_raw(const uint8_t *body, size_t len, ls_query_fn query, void *query_ctx,
                                      bool strict_default, bool require_name, ls_adapter_upload *up, ls_error *err);

/* The loader's view of up (borrowing from it). */
ls_adapter_source ls_adapter_upload_source(const ls_adapter_upload *up);

void ls_adapter_upload_free(ls_adapter_upload *up);

#endif
