/* Repo ids to hub cache snapshots: the cache's layout is
 * models--ORG--NAME/refs/main (a commit) and snapshots/COMMIT/, whose
 * files link to ../../blobs. Read beneath the adapter directory only. */
#include "common/hub.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/file.h"

/* The hub's own limit on a repo id's length. */
#define LS_HUB_REPO_ID_MAX 96

static bool ls_hub_name_ok(const char *s, size_t n) {
    if (n == 0 || s[0] == '.' || s[0] == '-' || s[n - 1] == '.' || s[n - 1] == '-') return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!isalnum(c) && c != '-' && c != '_' && c != '.') return false;
        if (i && (c == '-' || c == '.') && s[i - 1] == c) return false;
    }
    return true;
}

bool ls_hub_repo_id(const char *rel) {
    const char *slash = strchr(rel, '/');
    size_t len = strlen(rel);
    if (!slash || strchr(slash + 1, '/') || len > LS_HUB_REPO_ID_MAX) return false;
    return ls_hub_name_ok(rel, (size_t)(slash - rel)) && ls_hub_name_ok(slash + 1, len - (size_t)(slash - rel) - 1);
}

/* The commit refs/main names (40 hex digits) into commit; false if none. */
static bool ls_hub_read_ref(int dirfd, const char *repo_dir, char commit[41]) {
    char path[256];
    snprintf(path, sizeof path, "%s/refs/main", repo_dir);
    int fd = ls_file_open_beneath(dirfd, path, O_RDONLY | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) return false;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) { /* a FIFO, a device: no ref */
        close(fd);
        return false;
    }
    char buf[64];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 40) return false;
    buf[n] = '\0';
    while (n > 40 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = '\0';
    if (n != 40) return false;
    for (int i = 0; i < 40; i++)
        if (!isxdigit((unsigned char)buf[i])) return false;
    memcpy(commit, buf, 41);
    return true;
}

ls_status ls_hub_snapshot(int dirfd, const char *rel, char *out, size_t len, ls_error *err) {
    out[0] = '\0';
    if (!ls_hub_repo_id(rel)) return LS_OK;
    /* Only a path that is not there (looked up beneath dirfd: a link out
     * of it is not followed to tell) is a repo id. */
    int there = ls_file_open_beneath(dirfd, rel, O_PATH);
    if (there >= 0) close(there);
    if (there >= 0 || errno != ENOENT) return LS_OK;
    const char *slash = strchr(rel, '/');
    char repo_dir[128];
    snprintf(repo_dir, sizeof repo_dir, "models--%.*s--%s", (int)(slash - rel), rel, slash + 1);
    int fd = ls_file_open_beneath(dirfd, repo_dir, O_RDONLY | O_DIRECTORY | O_NOCTTY);
    if (fd < 0) return LS_OK;
    close(fd);
    char commit[41];
    if (!ls_hub_read_ref(dirfd, repo_dir, commit))
        return ls_error_set(err, LS_INVALID_REQUEST,
                            "give the path of one of its snapshots (models--ORG--NAME/snapshots/COMMIT), or download "
                            "it again",
                            "the hub cache holds %s for \"%s\", but its refs/main is missing or names no commit (40 hex "
                            "digits)",
                            repo_dir, rel);
    if ((size_t)snprintf(out, len, "%s/snapshots/%s", repo_dir, commit) >= len) {
        out[0] = '\0';
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "the snapshot path of \"%s\" is too long", rel);
    }
    /* A snapshot is a directory: a file there is no adapter the hub wrote. */
    fd = ls_file_open_beneath(dirfd, out, O_RDONLY | O_DIRECTORY | O_NOCTTY);
    if (fd >= 0) {
        close(fd);
        return LS_OK;
    }
    out[0] = '\0';
    return ls_error_set(err, LS_INVALID_REQUEST,
                        "download it again (hf download ORG/NAME), or give the path of a snapshot the cache holds",
                        "the hub cache's refs/main for \"%s\" names a snapshot that is not a directory there", rel);
}

void ls_hub_cache_dir(char *out, size_t len) {
    const char *v;
    if ((v = getenv("HF_HUB_CACHE")) && *v) snprintf(out, len, "%s", v);
    else if ((v = getenv("HUGGINGFACE_HUB_CACHE")) && *v) snprintf(out, len, "%s", v); /* its older name */
    else if ((v = getenv("HF_HOME")) && *v) snprintf(out, len, "%s/hub", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v) snprintf(out, len, "%s/huggingface/hub", v);
    else snprintf(out, len, "%s/.cache/huggingface/hub", (v = getenv("HOME")) && *v ? v : "");
}
