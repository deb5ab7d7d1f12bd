/* Whole files in memory: read-only mappings of the base weights, copies
 * of adapter files read whole, small text files such as
 * adapter_config.json, and opening beneath a directory. Only regular
 * files are read; FIFOs, devices and directories are refused before any
 * read. */
#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

const char *ls_file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "not a regular file";
}

/* Opens path and checks it is a regular file. O_NONBLOCK keeps open() from
 * waiting for a writer when path names a FIFO; it changes nothing for
 * regular files. Returns the descriptor, or -1 with err set. */
static int ls_file_open_regular(const char *path, struct stat *st, ls_status code, ls_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        char ebuf[128];
        ls_error_set(err, code, NULL, "cannot open %s: %s", path, strerror_r(errno, ebuf, sizeof ebuf));
        return -1;
    }
    if (fstat(fd, st) != 0) {
        char ebuf[128];
        ls_error_set(err, code, NULL, "cannot stat %s: %s", path, strerror_r(errno, ebuf, sizeof ebuf));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        ls_error_set(err, code, NULL, "cannot read %s: it is %s, not a regular file", path,
                     ls_file_kind(st->st_mode));
        close(fd);
        return -1;
    }
    return fd;
}

/* Fills *m with a private read-only mapping of path; the caller releases it
 * with ls_file_map_close. A 0-byte file gives data NULL, len 0, mapped
 * false (mmap refuses length 0), which the safetensors reader rejects as
 * too short. On failure *m is zeroed and err names the path. */
ls_status ls_file_map_open(const char *path, ls_file_map *m, ls_status code, ls_error *err) {
    memset(m, 0, sizeof *m);
    struct stat st;
    int fd = ls_file_open_regular(path, &st, code, err);
    if (fd < 0) return code;
    if (st.st_size == 0) {
        close(fd);
        return LS_OK;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        ls_error_set(err, code, NULL, "cannot map %s: %lld bytes do not fit the address space", path,
                     (long long)st.st_size);
        close(fd);
        return code;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int saved = errno;
    close(fd); /* the mapping keeps the file alive */
    if (p == MAP_FAILED) {
        char ebuf[128];
        ls_error_set(err, code, NULL, "cannot map %s: %s", path, strerror_r(saved, ebuf, sizeof ebuf));
        return code;
    }
    m->data = p;
    m->len = (size_t)st.st_size;
    m->mapped = true;
    return LS_OK;
}

/* Releases what ls_file_map_open gave; safe on a zeroed map and twice. */
void ls_file_map_close(ls_file_map *m) {
    if (m->mapped)
        munmap(m->data, m->len);
    else
        free(m->data);
    memset(m, 0, sizeof *m);
}

/* Reads path whole into a NUL-terminated malloc'd *out (caller frees). A
 * file over max bytes is refused from its size, before any read; reading
 * stops at max + 1 bytes so a file that grows meanwhile is refused too.
 * On failure *out is NULL. */
ls_status ls_file_read_text(const char *path, size_t max, char **out, ls_status code, ls_error *err) {
    *out = NULL;
    if (max > SIZE_MAX / 4) max = SIZE_MAX / 4; /* keeps max + 1 and the doubling below from wrapping */
    struct stat st;
    int fd = ls_file_open_regular(path, &st, code, err);
    if (fd < 0) return code;
    if ((uint64_t)st.st_size > max) {
        ls_error_set(err, code, NULL, "%s is %lld bytes, larger than the limit of %zu", path, (long long)st.st_size,
                     max);
        close(fd);
        return code;
    }
    /* Regular files ignore O_NONBLOCK, so read() below blocks as usual. */
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        ls_error_set(err, LS_INTERNAL, NULL, "out of memory reading %s", path);
        close(fd);
        return LS_INTERNAL;
    }
    for (;;) {
        if (n == cap) {
            if (n > max) break;
            size_t grow = cap * 2 > max + 1 ? max + 1 : cap * 2;
            char *nb = realloc(buf, grow + 1);
            if (!nb) {
                free(buf);
                close(fd);
                ls_error_set(err, LS_INTERNAL, NULL, "out of memory reading %s", path);
                return LS_INTERNAL;
            }
            buf = nb;
            cap = grow;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            char ebuf[128];
            ls_error_set(err, code, NULL, "cannot read %s: %s", path, strerror_r(errno, ebuf, sizeof ebuf));
            free(buf);
            close(fd);
            return code;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (n > max) {
        ls_error_set(err, code, NULL, "%s grew past the limit of %zu bytes while being read", path, max);
        free(buf);
        return code;
    }
    buf[n] = '\0';
    *out = buf;
    return LS_OK;
}

/* The walk for kernels without openat2: one component at a time, each
 * opened relative to the last without following links, '..' refused. */
static int ls_file_walk_beneath(int dirfd, const char *rel, int flags) {
    char buf[4096];
    if (strlen(rel) >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", rel);
    int cur = dup(dirfd);
    if (cur < 0) return -1;
    char *save = NULL, *comp = strtok_r(buf, "/", &save);
    if (!comp) { /* the directory itself */
        int fd = openat(cur, ".", flags);
        close(cur);
        return fd;
    }
    while (comp) {
        char *next = strtok_r(NULL, "/", &save);
        if (!strcmp(comp, "..")) {
            close(cur);
            errno = EXDEV;
            return -1;
        }
        if (!strcmp(comp, ".") && next) {
            comp = next;
            continue;
        }
        int fd = next ? openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                      : openat(cur, comp, flags | O_NOFOLLOW);
        int saved = errno;
        close(cur);
        if (fd < 0) {
            /* O_NOFOLLOW on a link: ELOOP (or ENOTDIR for O_DIRECTORY). */
            errno = saved == ENOTDIR && next ? ELOOP : saved;
            return -1;
        }
        /* O_PATH | O_NOFOLLOW opens a final link itself: refused too. */
        struct stat sb;
        if (!next && (flags & O_PATH) && (fstat(fd, &sb) != 0 || S_ISLNK(sb.st_mode))) {
            close(fd);
            errno = ELOOP;
            return -1;
        }
        cur = fd;
        comp = next;
    }
    return cur;
}

static int ls_file_open_how(int dirfd, const char *rel, int flags, unsigned long long resolve);

int ls_file_open_beneath(int dirfd, const char *rel, int flags) {
    return ls_file_open_how(dirfd, rel, flags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS);
}

int ls_file_open_beneath_nolinks(int dirfd, const char *rel, int flags) {
    return ls_file_open_how(dirfd, rel, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS);
}

static int ls_file_open_how(int dirfd, const char *rel, int flags, unsigned long long resolve) {
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = (unsigned long long)(flags | O_CLOEXEC);
    how.resolve = resolve;
    const char *path = rel && *rel ? rel : ".";
    /* EAGAIN: a rename or mount somewhere raced the lookup of a path with
     * "..", and the kernel asks for a retry (openat2(2)); a few do. */
    long fd = -1;
    for (int tries = 0; tries < 8; tries++) {
        fd = syscall(SYS_openat2, dirfd, path, &how, sizeof how);
        if (fd >= 0 || errno != EAGAIN) break;
    }
    if (fd >= 0) return (int)fd;
    /* No openat2 here (kernel before 5.6, or a seccomp filter that hides it). */
    if (errno == ENOSYS || errno == EPERM) return ls_file_walk_beneath(dirfd, path, flags | O_CLOEXEC);
    return -1;
}

ls_status ls_file_read_fd(int fd, size_t max, uint8_t **data, size_t *len, const char *what, ls_status code,
                          ls_error *err) {
    *data = NULL;
    *len = 0;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return ls_error_set(err, code, NULL, "%s is not a regular file", what);
    if (max > SIZE_MAX / 4) max = SIZE_MAX / 4;
    if ((uint64_t)st.st_size > max)
        return ls_error_set(err, code, NULL, "%s is %lld bytes, more than the limit of %zu", what,
                            (long long)st.st_size, max);
    /* The size may change while read: read to the end, capped at max + 1. */
    size_t cap = (size_t)st.st_size + 1, n = 0;
    uint8_t *buf = malloc(cap);
    if (!buf) {
        ls_error_set(err, LS_INTERNAL, NULL, "out of memory reading %s", what);
        errno = ENOMEM;
        return LS_INTERNAL;
    }
    for (;;) {
        if (n == cap) {
            if (n > max) break;
            size_t grow = cap * 2 > max + 1 ? max + 1 : cap * 2;
            uint8_t *nb = realloc(buf, grow);
            if (!nb) {
                free(buf);
                ls_error_set(err, LS_INTERNAL, NULL, "out of memory reading %s", what);
                errno = ENOMEM;
                return LS_INTERNAL;
            }
            buf = nb;
            cap = grow;
        }
        ssize_t r = pread(fd, buf + n, cap - n, (off_t)n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            const int e = errno;
            char ebuf[128];
            ls_error_set(err, LS_INTERNAL, "the file could not be read now; retry, and check the disk (its errors are in "
                         "the kernel log)", "cannot read %s: %s", what, strerror_r(e, ebuf, sizeof ebuf));
            free(buf);
            errno = e;
            return LS_INTERNAL;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    if (n > max) {
        free(buf);
        return ls_error_set(err, code, NULL, "%s grew past the limit of %zu bytes while it was read", what, max);
    }
    *data = buf;
    *len = n;
    return LS_OK;
}

bool ls_file_errno_transient(int e) {
    return e == EMFILE || e == ENFILE || e == ENOMEM || e == ENOBUFS || e == EIO;
}

ls_file_stamp ls_file_stamp_of(const struct stat *st) {
    return (ls_file_stamp){st->st_dev, st->st_ino, st->st_size, st->st_mtim, st->st_ctim};
}

bool ls_file_stamp_same(const ls_file_stamp *a, const ls_file_stamp *b) {
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtime.tv_sec == b->mtime.tv_sec &&
           a->mtime.tv_nsec == b->mtime.tv_nsec && a->ctime.tv_sec == b->ctime.tv_sec &&
           a->ctime.tv_nsec == b->ctime.tv_nsec;
}
