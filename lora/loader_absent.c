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

#include "common/text.h"

/* Entries looked at, at most: a directory of thousands is no adapter. */
#define LS_ABSENT_SCAN_MAX 4096
/* The longest subfolder name suggested: with a path shown by
 * ls_text_tail the message and its hint stay whole within 512 bytes. */
#define LS_ABSENT_NAME_MAX 64

/* A name that can be quoted as it is: printable ASCII, no quote or
 * backslash (others are not suggested). */
static bool ls_absent_plain(const char *name) {
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p < 0x20 || *p >= 0x7f || *p == '"' || *p == '\\') return false;
    return true;
}


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
        if (e->d_name[0] == '.' || strlen(e->d_name) >= len || strlen(e->d_name) > LS_ABSENT_NAME_MAX ||
            !ls_absent_plain(e->d_name))
            continue;
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
    char sub[LS_ABSENT_NAME_MAX + 1], hint[800];
    bool pickle = false;
    /* The adapter directory itself holds the adapters: one of them is no
     * answer to a path that names them all. */
    const bool root = !strcmp(rel, ".") || !strcmp(rel, "./");
    int n = root ? 0 : ls_absent_subfolders(dir_fd, sub, sizeof sub, &pickle);
    const bool whole = strlen(rel) <= LS_TEXT_TAIL;
    const ls_text_cut shown = ls_text_tail(rel);
    if (n > 0) {
        const char *others = n > 1 ? " (or another subfolder that holds an adapter)" : "";
        const char *resave = pickle ? ", once its adapter_model.bin is saved again in safetensors (save_pretrained "
                                      "with safe_serialization=True)"
                                    : "";
        if (whole) snprintf(hint, sizeof hint, "give the path \"%s/%s\"%s%s", rel, sub, others, resave);
        else snprintf(hint, sizeof hint, "give the path you gave with \"/%s\" after it%s%s", sub, others, resave);
        ls_error_set(err, LS_INVALID_REQUEST, hint,
                     "path \"%s\" holds no adapter_config.json, but its subfolder \"%s\" does%s: PEFT saves an "
                     "adapter not named \"default\" in a subfolder of its name%s",
                     shown.s, sub, n > 1 ? " (and others)" : "",
                     pickle ? "; its model is a pickled adapter_model.bin, which this server never reads" : "");
        return true;
    }
    if (ls_absent_has(dir_fd, "adapter_model.safetensors")) {
        if (whole) snprintf(hint, sizeof hint,
                 "put the adapter_config.json PEFT saved beside it, or give the path \"%s/"
                 "adapter_model.safetensors\" with lora_alpha and r stated in the request",
                 rel);
        else snprintf(hint, sizeof hint, "put the adapter_config.json PEFT saved beside it, or give the file's path "
                      "with lora_alpha and r stated in the request");
        ls_error_set(err, LS_INVALID_REQUEST, hint,
                     "path \"%s\" holds adapter_model.safetensors but no adapter_config.json, which a PEFT "
                     "directory needs for its r and lora_alpha",
                     shown.s);
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
                 "path \"%s\" holds adapter_model.bin, a pickled PyTorch file, and no "
                 "adapter_model.safetensors; this server reads safetensors only (a pickle can run code)",
                 ls_text_tail(rel).s);
    return true;
}
