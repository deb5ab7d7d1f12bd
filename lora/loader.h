/* The one adapter loader: from where an adapter comes to a normalised
 * ls_adapter. A source is a path beneath the adapter directory (a PEFT
 * directory or a .safetensors file, read here with what it says about
 * itself) or tensors already parsed (with what they say about
 * themselves); what the request states goes over what the adapter says
 * (ls_adapter_params_merge). Uploads and the host tier's reload both come
 * through here, so the rules are the same for every way in.
 *
 * Files are opened beneath the adapter directory's descriptor, every
 * component resolved by the kernel (no '..' above it, no link out of it,
 * no gap between a check and the open), read whole into memory (never
 * mapped: rewriting a file while it is read must not kill the server),
 * and named in messages and in the registry by their path relative to the
 * directory, never by the server's absolute path nor by their bytes. */
#ifndef LS_LORA_LOADER_H
#define LS_LORA_LOADER_H

#include <stddef.h>

#include "common/dims.h"
#include "common/error.h"
#include "common/tensor.h"
#include "lora/adapter.h"

#define LS_LOADER_PATH_MAX 4096

typedef struct {
    int dirfd;                       /* the adapter directory; -1 until ls_loader_open */
    char root[LS_LOADER_PATH_MAX];   /* its real path, to accept absolute paths inside it */
    ls_dims dims;
    ls_pool_dims pool;
} ls_loader;

/* Opens the adapter directory (adapter_dir, "" = the working directory)
 * for loads into a model of dims and a pool of pool. A directory that
 * cannot be opened is LS_INVALID_REQUEST naming it: the server refuses to
 * start rather than fail every later upload. Release with
 * ls_loader_close. */
ls_status ls_loader_open(ls_loader *ld, const char *adapter_dir, const ls_dims *dims, const ls_pool_dims *pool,
                         ls_error *err);
void ls_loader_close(ls_loader *ld);

typedef struct {
    const char *path;             /* beneath the adapter directory; NULL: tensors */
    const ls_tensor_set *tensors; /* with path NULL: the adapter's tensors (borrowed) */
    ls_adapter_params own;        /* with path NULL: what the tensors say of themselves */
    ls_adapter_params given;      /* what the request states */
} ls_adapter_source;

/* Where a loaded adapter came from: enough to read it again. */
typedef struct {
    char path[LS_LOADER_PATH_MAX]; /* relative to the adapter directory; "" for tensors */
    ls_adapter_params params;      /* the merged parameters */
    bool absent; /* on failure: the path itself did not exist when it was opened */
} ls_adapter_origin;

/* Reads, merges and normalises src into out (the caller's,
 * ls_adapter_free) and fills origin. A path that is absent, unreadable
 * or not beneath the adapter directory is LS_INVALID_REQUEST; a bad file
 * or adapter the status of what is wrong (every violation in err). On
 * failure out is empty. */
ls_status ls_loader_load(const ls_loader *ld, const ls_adapter_source *src, ls_adapter *out, ls_adapter_origin *origin,
                         ls_error *err);

/* path as a client gave it, made relative to the adapter directory into
 * out (an absolute path must name something inside it; ".." segments are
 * left for the kernel's resolution to refuse). LS_INVALID_REQUEST when
 * it is empty, too long or absolute outside the directory. */
ls_status ls_loader_relative(const ls_loader *ld, const char *path, char *out, size_t out_len, ls_error *err);

/* Reads a relative path again with the parameters it was loaded with: the
 * host tier's reload, in the shape of ls_pool_reload_fn (ctx is the
 * ls_loader). */
ls_status ls_loader_reload(void *ctx, const char *path, const ls_adapter_params *params, ls_adapter *out,
                           ls_error *err);

#endif
