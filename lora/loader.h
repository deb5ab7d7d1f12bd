/* The one adapter loader: from where an adapter comes to a normalised
 * ls_adapter. A source is a path beneath the adapter directory (a PEFT
 * directory or a .safetensors file, read here with what it says about
 * itself) or tensors already parsed (with what they say about
 * themselves); what the request states goes over what the adapter says
 * (ls_adapter_params_merge). Uploads and the host tier's reload both come
 * through here, so the rules are the same for every way in. */
#ifndef LS_LORA_LOADER_H
#define LS_LORA_LOADER_H

#include <stddef.h>

#include "common/dims.h"
#include "common/error.h"
#include "common/tensor.h"
#include "lora/adapter.h"

#define LS_LOADER_PATH_MAX 4096

typedef struct {
    char adapter_dir[LS_LOADER_PATH_MAX]; /* "" = the working directory */
    ls_dims dims;
    ls_pool_dims pool;
} ls_loader;

typedef struct {
    const char *path;             /* beneath the adapter directory; NULL: tensors */
    const ls_tensor_set *tensors; /* with path NULL: the adapter's tensors (borrowed) */
    ls_adapter_params own;        /* with path NULL: what the tensors say of themselves */
    ls_adapter_params given;      /* what the request states */
} ls_adapter_source;

/* Where a loaded adapter came from: enough to read it again. */
typedef struct {
    char path[LS_LOADER_PATH_MAX]; /* the resolved file or directory; "" for tensors */
    ls_adapter_params params;      /* the merged parameters */
} ls_adapter_origin;

/* Resolves, reads, merges and normalises src into out (the caller's,
 * ls_adapter_free) and fills origin. A path outside the adapter
 * directory or one that cannot be read is LS_INVALID_REQUEST; a bad file
 * or adapter the status of what is wrong (every violation in err). On
 * failure out is empty. */
ls_status ls_loader_load(const ls_loader *ld, const ls_adapter_source *src, ls_adapter *out, ls_adapter_origin *origin,
                         ls_error *err);

/* Resolves rel (relative to dir, or absolute) beneath dir ("" = the
 * working directory) into out; a result outside dir, or one that does
 * not exist, is LS_INVALID_REQUEST. */
ls_status ls_loader_resolve(const char *dir, const char *rel, char *out, size_t out_len, ls_error *err);

/* Reads a resolved path again with the parameters it was loaded with: the
 * host tier's reload, in the shape of ls_pool_reload_fn (ctx is the
 * ls_loader). */
ls_status ls_loader_reload(void *ctx, const char *path, const ls_adapter_params *params, ls_adapter *out,
                           ls_error *err);

#endif
