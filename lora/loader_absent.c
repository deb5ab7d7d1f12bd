/* Why a PEFT directory lacks adapter_config.json or
 * adapter_model.safetensors, said from what the directory holds. Only
 * names beneath the adapter directory are read; no link is followed. */
#include "lora/loader_absent.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Entries looked at, at most: a directory of thousands is no adapter. */
#define LS_ABSENT_SCAN_MAX 4096

/* Any entry of that name, a link too: then the plain open decides. */
static bool ls_absent_exists(int dir_fd, const char *name) {
    struct stat sb;
    return fstatat(dir_fd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT;
}

static bool ls_absent_has(int dir_fd, const char *name) {
    struct stat sb;
    return fstatat(dir_fd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode);
}

/* The first subfolder (by name) of dir_fd holding adapter_config.json
 * into best, and whether its model is only a pickle (*pickle); how many
 * hold a config. Links are skipped. */
static int ls_absent_subfolders(int dir_fd, char *best, size_t len, bool *pickle) {
    int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return 0;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return 0;
    }
    int found = 0, seen = 0;
    struct dirent *e;
    while ((e = readdir(d)) && seen++ < LS_ABSENT_SCAN_MAX) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= len) continue;
        struct stat sb;
        if (fstatat(fd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sb.st_mode)) continue;
        int sub = openat(fd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) continue;
        bool has = ls_absent_has(sub, "adapter_config.json");
        bool only_bin = !ls_absent_exists(sub, "adapter_model.safetensors") && ls_absent_has(sub, "adapter_model.bin");
        close(sub);
        if (!has) continue;
        if (!found++ || strcmp(e->d_name, best) < 0) {
            snprintf(best, len, "%s", e->d_name);
            *pickle = only_bin;
        }
    }
    closedir(d);
    return found;
}

/* err is set only when true is returned. */
bool ls_loader_explain_no_config(int dir_fd, const char *rel, ls_error *err) {
    if (ls_absent_exists(dir_fd, "adapter_config.json")) return false;
    char sub[256], hint[800];
    bool pickle = false;
    int n = ls_absent_subfolders(dir_fd, sub, sizeof sub, &pickle);
    if (n > 0) {
        snprintf(hint, sizeof hint, "give the path \"%.200s/%s\"%s%s", rel, sub,
                 n > 1 ? " (or another subfolder that holds an adapter)" : "",
                 pickle ? ", once its adapter_model.bin is saved again in safetensors (save_pretrained with "
                          "safe_serialization=True)"
                        : "");
        ls_error_set(err, LS_INVALID_REQUEST, hint,
                     "path \"%.200s\" holds no adapter_config.json, but its subfolder \"%s\" does%s: PEFT saves an "
                     "adapter not named \"default\" in a subfolder of its name%s",
                     rel, sub, n > 1 ? " (and others)" : "",
                     pickle ? "; its model is a pickled adapter_model.bin, which this server never reads" : "");
        return true;
    }
    if (ls_absent_has(dir_fd, "adapter_model.safetensors")) {
        snprintf(hint, sizeof hint,
                 "put the adapter_config.json PEFT saved beside it, or give the path \"%.200s/"
                 "adapter_model.safetensors\" with lora_alpha and r stated in the request",
                 rel);
        ls_error_set(err, LS_INVALID_REQUEST, hint,
                     "path \"%.200s\" holds adapter_model.safetensors but no adapter_config.json, which a PEFT "
                     "directory needs for its r and lora_alpha",
                     rel);
        return true;
    }
    return false;
}

bool ls_loader_explain_no_model(int dir_fd, const char *rel, ls_error *err) {
    if (ls_absent_exists(dir_fd, "adapter_model.safetensors") || !ls_absent_has(dir_fd, "adapter_model.bin"))
        return false;
    ls_error_set(err, LS_INVALID_REQUEST,
                 "save it again in safetensors (PEFT's save_pretrained writes safetensors unless "
                 "safe_serialization=False), or convert the file with safetensors.torch.save_file",
                 "path \"%.200s\" holds adapter_model.bin, a pickled PyTorch file, and no "
                 "adapter_model.safetensors; this server reads safetensors only (a pickle can run code)",
                 rel);
    return true;
}
