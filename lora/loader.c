/* Adapter sources to normalised adapters: paths opened beneath the
 * adapter directory's descriptor, PEFT directories and .safetensors files
 * read whole, the merge of stated over own parameters, normalisation. */
#include "lora/loader.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/file.h"
#include "format/safetensors.h"
#include "lora/adapter_config.h"

/* adapter_config.json is small; anything larger is not one. */
#define LS_LOADER_CONFIG_MAX (1u << 20)

ls_status ls_loader_open(ls_loader *ld, const char *adapter_dir, const ls_dims *dims, const ls_pool_dims *pool,
                         ls_error *err) {
    memset(ld, 0, sizeof *ld);
    ld->dirfd = -1;
    ld->dims = *dims;
    ld->pool = *pool;
    const char *dir = adapter_dir && *adapter_dir ? adapter_dir : ".";
    char ebuf[128];
    int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return ls_error_set(err, LS_INVALID_REQUEST, "give --adapter-dir an existing directory",
                            "the adapter directory %.200s cannot be opened: %s", dir,
                            strerror_r(errno, ebuf, sizeof ebuf));
    char real[PATH_MAX];
    if (!realpath(dir, real) || strlen(real) >= sizeof ld->root) {
        close(fd);
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "the adapter directory %.200s cannot be resolved", dir);
    }
    snprintf(ld->root, sizeof ld->root, "%s", real);
    ld->dirfd = fd;
    return LS_OK;
}

void ls_loader_close(ls_loader *ld) {
    if (ld->dirfd >= 0) close(ld->dirfd);
    ld->dirfd = -1;
}

ls_status ls_loader_relative(const ls_loader *ld, const char *path, char *out, size_t out_len, ls_error *err) {
    const char *rel = path;
    if (path[0] == '/') {
        size_t rl = strlen(ld->root);
        bool at_root = !strcmp(ld->root, "/");
        if (!at_root && (strncmp(path, ld->root, rl) || (path[rl] != '/' && path[rl] != '\0')))
            return ls_error_set(err, LS_INVALID_REQUEST, "paths are taken relative to --adapter-dir",
                                "path \"%.200s\" is not beneath the adapter directory", path);
        rel = path + (at_root ? 1 : rl);
        while (*rel == '/') rel++;
    }
    if (!*path || strlen(rel) >= out_len)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "the adapter path must be 1 to %zu bytes", out_len - 1);
    snprintf(out, out_len, "%s", *rel ? rel : ".");
    return LS_OK;
}

/* Opens rel beneath dirfd (a directory of the adapter tree), answering
 * every failure as the client's path, never the server's; *absent (when
 * given) is set when rel does not exist. */
static int ls_loader_open_at(int dirfd, const char *rel, const char *shown, int flags, bool *absent, ls_error *err) {
    int fd = ls_file_open_beneath(dirfd, rel, flags | O_NOCTTY | O_NONBLOCK);
    if (fd >= 0) return fd;
    char ebuf[128];
    if (errno == EXDEV || errno == ELOOP)
        ls_error_set(err, LS_INVALID_REQUEST, "adapters must live under --adapter-dir (no '..' above it, no links out)",
                     "path \"%.200s\" leads out of the adapter directory", shown);
    else if (errno == ENOENT || errno == ENOTDIR) {
        if (absent) *absent = true;
        ls_error_set(err, LS_INVALID_REQUEST, "paths are taken relative to --adapter-dir",
                     "path \"%.200s\" does not exist in the adapter directory", shown);
    } else if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == EIO || errno == EAGAIN ||
             errno == EINTR || errno == ENOBUFS)
        /* The server ran short (descriptors, memory) or the disk failed:
         * nothing the client can fix in its path, and nothing to remember
         * against the file. */
        ls_error_set(err, LS_INTERNAL, "the server is short of a resource now; retry, and check its limits (ulimit -n)",
                     "path \"%.200s\" cannot be opened now: %s", shown, strerror_r(errno, ebuf, sizeof ebuf));
    else
        ls_error_set(err, LS_INVALID_REQUEST, NULL, "path \"%.200s\" cannot be opened: %s", shown,
                     strerror_r(errno, ebuf, sizeof ebuf));
    return -1;
}

/* Reads name (a regular file) beneath dirfd whole into *bytes. */
static ls_status ls_loader_read_file(int dirfd, const char *name, const char *shown, size_t max, ls_status code,
                                     uint8_t **bytes, size_t *len, ls_error *err) {
    int fd = ls_loader_open_at(dirfd, name, shown, O_RDONLY, NULL, err);
    if (fd < 0) return err->code;
    ls_status st = ls_file_read_fd(fd, max, bytes, len, shown, code, err);
    close(fd);
    return st;
}

/* Reads rel (PEFT directory or .safetensors file) beneath the adapter
 * directory: fills tensors (borrowing from *bytes, the caller's to free
 * after them) and what the adapter says of itself. *absent as for
 * ls_adapter_origin. */
static ls_status ls_loader_read(const ls_loader *ld, const char *rel, ls_adapter_params *own, ls_tensor_set *tensors,
                                uint8_t **bytes, bool *absent, ls_error *err) {
    *bytes = NULL;
    int fd = ls_loader_open_at(ld->dirfd, rel, rel, O_RDONLY, absent, err);
    if (fd < 0) return err->code;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "path \"%.200s\" cannot be read", rel);
    }
    size_t len = 0;
    ls_status st;
    const bool peft_dir = S_ISDIR(sb.st_mode);
    char shown[LS_LOADER_PATH_MAX + 64];
    if (peft_dir) {
        /* Both files are opened beneath the directory just opened, so a
         * directory swapped after that cannot redirect them. */
        uint8_t *text = NULL;
        size_t tlen = 0;
        snprintf(shown, sizeof shown, "%s/adapter_config.json", rel);
        st = ls_loader_read_file(fd, "adapter_config.json", shown, LS_LOADER_CONFIG_MAX, LS_ADAPTER_CONFIG_INVALID,
                                 &text, &tlen, err);
        if (st == LS_OK) {
            char *nul = realloc(text, tlen + 1); /* as text: NUL-terminated */
            if (nul) {
                nul[tlen] = '\0';
                text = (uint8_t *)nul;
                st = ls_adapter_config_parse_text(nul, own, err);
            } else {
                st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory reading %s", shown);
            }
            free(text);
        }
        own->format = LS_ADAPTER_FORMAT_PEFT;
        snprintf(shown, sizeof shown, "%s/adapter_model.safetensors", rel);
        if (st == LS_OK)
            st = ls_loader_read_file(fd, "adapter_model.safetensors", shown, SIZE_MAX, LS_INVALID_REQUEST, bytes,
                                     &len, err);
    } else {
        snprintf(shown, sizeof shown, "%s", rel);
        st = ls_file_read_fd(fd, SIZE_MAX, bytes, &len, shown, LS_INVALID_REQUEST, err);
    }
    close(fd);
    if (st == LS_OK) st = ls_safetensors_parse(*bytes, len, tensors, err);
    /* A PEFT directory's config wins; a bare file carries its own. */
    if (st == LS_OK && !peft_dir) {
        ls_adapter_text_params t = ls_adapter_text_params_meta(tensors, "the file's __metadata__");
        st = ls_adapter_params_from_text(&t, own, err);
        if (st == LS_OK) st = ls_adapter_params_rules_from_meta(tensors, "the file's __metadata__", own, err);
    }
    if (st != LS_OK) {
        ls_tensor_set_free(tensors);
        free(*bytes);
        *bytes = NULL;
    }
    return st;
}

/* Reads rel and normalises it into out with *used: given merged over what
 * the file says (merge), or given as it is (a reload: given already holds
 * what the file said when it was loaded). */
static ls_status ls_loader_from_path(const ls_loader *ld, const char *rel, const ls_adapter_params *given, bool merge,
                                     ls_adapter_params *used, ls_adapter *out, bool *absent, ls_error *err) {
    ls_adapter_params own = {0};
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    uint8_t *bytes = NULL;
    ls_status st = ls_loader_read(ld, rel, &own, &set, &bytes, absent, err);
    if (st != LS_OK) return st;
    *used = merge ? ls_adapter_params_merge(&own, given) : *given;
    st = ls_adapter_normalise(&set, used, &ld->dims, &ld->pool, out, err);
    ls_tensor_set_free(&set);
    free(bytes);
    return st;
}

ls_status ls_loader_load(const ls_loader *ld, const ls_adapter_source *src, ls_adapter *out, ls_adapter_origin *origin,
                         ls_error *err) {
    memset(out, 0, sizeof *out);
    memset(origin, 0, sizeof *origin);
    if (!src->path) {
        /* A raw body's per-module rules travel in its __metadata__ (inline
         * JSON tensors have none): read here, beside its other keys. */
        ls_adapter_params own = src->own;
        ls_status st = ls_adapter_params_rules_from_meta(src->tensors, "the body's __metadata__", &own, err);
        if (st != LS_OK) return st;
        origin->params = ls_adapter_params_merge(&own, &src->given);
        return ls_adapter_normalise(src->tensors, &origin->params, &ld->dims, &ld->pool, out, err);
    }
    ls_status st = ls_loader_relative(ld, src->path, origin->path, sizeof origin->path, err);
    if (st == LS_OK)
        st = ls_loader_from_path(ld, origin->path, &src->given, true, &origin->params, out, &origin->absent, err);
    if (st != LS_OK) origin->path[0] = '\0';
    return st;
}

ls_status ls_loader_reload(void *ctx, const char *path, const ls_adapter_params *params, ls_adapter *out,
                           ls_error *err) {
    ls_adapter_params used;
    memset(out, 0, sizeof *out);
    return ls_loader_from_path(ctx, path, params, false, &used, out, NULL, err);
}
