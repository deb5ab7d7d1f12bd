/* Whole files in memory: read-only mappings of the base weights (the
 * operator's own file, read once at start-up), copies of adapter files
 * (read, never mapped: a file rewritten in place while mapped would kill
 * the process with SIGBUS), and files opened beneath a directory without
 * any check-then-open gap. */
#ifndef LS_COMMON_FILE_H
#define LS_COMMON_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include "common/error.h"

typedef struct {
    uint8_t *data;
    size_t len;
    bool mapped; /* mmap'd (else malloc'd, e.g. for an empty file) */
} ls_file_map;

/* Maps path read-only. Fails with code (the caller's choice of status)
 * and a message naming the path and errno's text. */
ls_status ls_file_map_open(const char *path, ls_file_map *m, ls_status code, ls_error *err);
void ls_file_map_close(ls_file_map *m);

/* Reads a small text file (at most max bytes) into a NUL-terminated
 * malloc'd buffer owned by the caller. */
ls_status ls_file_read_text(const char *path, size_t max, char **out, ls_status code, ls_error *err);

/* Opens rel (relative; "" or "." is the directory itself) beneath the
 * directory dirfd with open(2) flags, resolving every component in the
 * kernel so that nothing ('..', a symbolic link, a component swapped
 * meanwhile) can lead out of it: openat2 with RESOLVE_BENEATH, or where
 * the kernel lacks it a walk that refuses '..' and every link. Returns
 * the descriptor, or -1 with errno set (EXDEV: the path leaves the
 * directory; ELOOP: a link the walk refused). */
int ls_file_open_beneath(int dirfd, const char *rel, int flags);
/* The same, following no link at all on the way (RESOLVE_NO_SYMLINKS). */
int ls_file_open_beneath_nolinks(int dirfd, const char *rel, int flags);

/* What tells one version of a file from the next without reading it:
 * changed when the file is replaced, rewritten or touched. No padding,
 * so a record of it that was zeroed first compares with memcmp. Every
 * watcher of a file (the loader's memo, auto-load, --api-keys, the TLS
 * files) keys on it. */
typedef struct {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
} ls_file_stamp;

ls_file_stamp ls_file_stamp_of(const struct stat *st);
bool ls_file_stamp_same(const ls_file_stamp *a, const ls_file_stamp *b);

/* True for an errno that says the server ran short (descriptors,
 * memory, buffers) or the disk failed: nothing in the file or its path
 * to fix, nothing to remember against it; a retry may pass. */
bool ls_file_errno_transient(int e);

/* What a file of this mode is, for a message ("a directory", "a FIFO",
 * ... "not a regular file"); only for modes that are not regular. */
const char *ls_file_kind(mode_t mode);

/* Reads fd (a regular file, checked) from its start into a malloc'd
 * buffer (*data, *len; caller frees *data). More than max bytes is
 * refused, also when the file grows while read; a file cut short while
 * read simply gives fewer bytes (which the format checks then refuse).
 * what names the file in messages, which never hold its bytes. What is
 * wrong with the file is code; out of memory, and a read the disk failed
 * (EIO, say), are LS_INTERNAL, with errno ENOMEM or the read's: nothing
 * in the file to fix, and a retry may pass. */
ls_status ls_file_read_fd(int fd, size_t max, uint8_t **data, size_t *len, const char *what, ls_status code,
                          ls_error *err);

#endif
