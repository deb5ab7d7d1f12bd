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
 * no gap between a check and the open), checked from their size and
 * header, then read whole into memory (never mapped: rewriting a file
 * while it is read must not kill the server),
 * and named in messages and in the registry by their path relative to the
 * directory, never by the server's absolute path nor by their bytes. */
#ifndef LS_LORA_LOADER_H
#define LS_LORA_LOADER_H

#include <stddef.h>
#include <sys/stat.h>

#include "common/dims.h"
#include "common/error.h"
#include "common/tensor.h"
#include "lora/adapter.h"

#define LS_LOADER_PATH_MAX 4096

/* --max-adapter-mb's default: the largest adapter file read, MiB. */
#define LS_LOADER_MAX_FILE_MB_DEFAULT 4096
/* The most tensors an adapter upload or file may name: what a tensor
 * costs beyond its bytes (its entry in a set, its name, ~200 bytes) is
 * bounded by it. A PEFT adapter of every routed expert of Kimi-K2 (61
 * layers, 384 experts) has 141,000. */
#define LS_LOADER_MAX_TENSORS 262144
/* A failed file is remembered only once its change time is this old:
 * one being written now may have been read half written. */
#define LS_LOADER_MEMO_SETTLE_MS 2000

struct ls_loader_memo;

typedef struct {
    int dirfd;                       /* the adapter directory; -1 until ls_loader_open */
    char root[LS_LOADER_PATH_MAX];   /* its real path, to accept absolute paths inside it */
    char given[LS_LOADER_PATH_MAX];  /* as the operator spelled it when absolute (a link, a mount): also taken */
    ls_dims dims;
    ls_pool_dims pool;
    size_t max_file_bytes;           /* a larger safetensors file is refused from its size (--max-adapter-mb) */
    struct ls_loader_memo *memo;     /* owned: files that failed, by identity (lora/loader_memo.h) */
    int memo_settle_ms;              /* a file changed more recently is not remembered (tests lower it) */
    /* A path of several components resolves beneath its first (a
     * tenant's directory): set when the server has API keys, whose
     * tenants' paths are TENANT/... (links never cross top-level
     * directories anyway). */
    bool scoped;
} ls_loader;

/* Opens the adapter directory (adapter_dir, "" = the working directory)
 * for loads into a model of dims and a pool of pool, with files up to
 * LS_LOADER_MAX_FILE_MB_DEFAULT MiB (set max_file_bytes after it to
 * change that). A directory that cannot be opened is LS_INVALID_REQUEST
 * naming it: the server refuses to start rather than fail every later
 * upload. Release with ls_loader_close. */
ls_status ls_loader_open(ls_loader *ld, const char *adapter_dir, const ls_dims *dims, const ls_pool_dims *pool,
                         ls_error *err);
void ls_loader_close(ls_loader *ld);

typedef struct {
    const char *path;             /* beneath the adapter directory; NULL: tensors */
    const ls_tensor_set *tensors; /* with path NULL: the adapter's tensors (borrowed) */
    ls_adapter_params own;        /* with path NULL: what the tensors say of themselves */
    ls_adapter_params given;      /* what the request states */
    bool tenant;                  /* a tenant's path (TENANT/...): never a Hugging Face repo id */
} ls_adapter_source;

/* Where a loaded adapter came from: enough to read it again. */
typedef struct {
    char path[LS_LOADER_PATH_MAX]; /* relative to the adapter directory; "" for tensors */
    ls_adapter_params params;      /* the merged parameters */
    bool absent; /* on failure: the path itself did not exist when it was opened */
} ls_adapter_origin;

/* Reads, merges and normalises src into out (the caller's,
 * ls_adapter_free) and fills origin. A path that is absent, unreadable
 * or not beneath the adapter directory is LS_INVALID_REQUEST; a
 * safetensors file over max_file_bytes LS_PAYLOAD_TOO_LARGE, from its
 * size before any read; a bad file or adapter the status of what is
 * wrong (every violation in err), its header checked before its data is
 * read. A failure of the file itself (ls_status_is_input) is remembered once
 * the file has not changed for memo_settle_ms: the same path with the
 * same parameters, while its files keep their identity (device, inode,
 * size, times), gets the same error without a read. On failure out is
 * empty. */
ls_status ls_loader_load(const ls_loader *ld, const ls_adapter_source *src, ls_adapter *out, ls_adapter_origin *origin,
                         ls_error *err);

/* stat(2) of rel (relative to the adapter directory) resolved as
 * ls_loader_load opens it: links followed only as far as that open
 * follows them, with ld->scoped a path of several components beneath
 * its top-level directory. 0, or -1 with errno. */
int ls_loader_stat(const ls_loader *ld, const char *rel, struct stat *st);

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

/* Safetensors files whose bytes were read (their header at least) since
 * the loader was opened: what the memory of failures saves. */
unsigned long long ls_loader_file_reads(const ls_loader *ld);

#endif
