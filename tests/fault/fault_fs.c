/* The file-system failure hook (fault_fs.h): the __wrap_* functions the
 * linker substitutes for five calls in the objects of test_fault_state,
 * and the counter that fails the Nth of them. Single-threaded use: the
 * state directory is written under the pool's state lock. */
#include "tests/fault/fault_fs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

int __real_openat(int dirfd, const char *path, int flags, ...);
ssize_t __real_write(int fd, const void *buf, size_t n);
int __real_fsync(int fd);
int __real_renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath);
int __real_unlinkat(int dirfd, const char *path, int flags);

int __wrap_openat(int dirfd, const char *path, int flags, ...);
ssize_t __wrap_write(int fd, const void *buf, size_t n);
int __wrap_fsync(int fd);
int __wrap_renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath);
int __wrap_unlinkat(int dirfd, const char *path, int flags);

static bool fs_counting, fs_crash, fs_did_fire;
static long fs_n, fs_fail_at;
static int fs_errno;
static char fs_call[320];

void fs_arm(long n, bool crash) {
    fs_n = 0;
    fs_fail_at = n;
    fs_crash = crash;
    fs_did_fire = false;
    fs_errno = 0;
    fs_call[0] = '\0';
    fs_counting = true;
}

void fs_disarm(void) { fs_counting = false; }
long fs_count(void) { return fs_n; }
bool fs_fired(void) { return fs_did_fire; }
const char *fs_fired_call(void) { return fs_call; }
int fs_fired_errno(void) { return fs_errno; }

/* True when this call is to fail (errno then set to e). */
static bool fs_fail(const char *what, const char *path, int e) {
    if (!fs_counting) return false;
    fs_n++;
    const bool fail = fs_fail_at > 0 && (fs_n == fs_fail_at || (fs_crash && fs_n > fs_fail_at));
    if (fail && !fs_did_fire) {
        fs_did_fire = true;
        fs_errno = e;
        snprintf(fs_call, sizeof fs_call, "%s %s", what, path ? path : "");
    }
    if (fail) errno = e;
    return fail;
}

int __wrap_openat(int dirfd, const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    if (fs_fail("openat", path, flags & O_CREAT ? ENOSPC : EIO)) return -1;
    return __real_openat(dirfd, path, flags, mode);
}

ssize_t __wrap_write(int fd, const void *buf, size_t n) {
    if (fs_fail("write", NULL, ENOSPC)) return -1;
    return __real_write(fd, buf, n);
}

int __wrap_fsync(int fd) {
    if (fs_fail("fsync", NULL, EIO)) return -1;
    return __real_fsync(fd);
}

int __wrap_renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath) {
    if (fs_fail("renameat", newpath, EPERM)) return -1;
    return __real_renameat(olddirfd, oldpath, newdirfd, newpath);
}

int __wrap_unlinkat(int dirfd, const char *path, int flags) {
    if (fs_fail("unlinkat", path, EPERM)) return -1;
    return __real_unlinkat(dirfd, path, flags);
}
