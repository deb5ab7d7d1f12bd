/* An LD_PRELOAD shim for tests: a disk whose syncs are slow (a network
 * volume), and a sync the test can hold while it checks what the server
 * does meanwhile. Set LS_SLOW_FSYNC_DIR to turn it on; without it every
 * call goes straight to the C library. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Each sync first takes LS_SLOW_FSYNC_MS (100 by default). While the file
 * DIR/hold exists, a sync appends a byte to DIR/entered, waits for hold
 * to go (20 s at most, so that a test that fails cannot hang), then
 * appends a byte to DIR/released: a test that sees entered grow and
 * released stay empty knows a sync is in progress. */
static void ls_slow_note(const char *dir, const char *file) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) return;
    ssize_t n = write(fd, "x", 1);
    (void)n;
    close(fd);
}

static void ls_slow_sleep_ms(long ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void ls_slow_wait(void) {
    const int saved = errno;
    const char *dir = getenv("LS_SLOW_FSYNC_DIR");
    if (!dir) return;
    const char *ms = getenv("LS_SLOW_FSYNC_MS");
    ls_slow_sleep_ms(ms ? atol(ms) : 100);
    char hold[4096];
    snprintf(hold, sizeof hold, "%s/hold", dir);
    struct stat sb;
    if (stat(hold, &sb) == 0) {
        ls_slow_note(dir, "entered");
        for (int i = 0; i < 2000 && stat(hold, &sb) == 0; i++) ls_slow_sleep_ms(10);
        ls_slow_note(dir, "released");
    }
    errno = saved;
}

/* Looked up once, before any thread of the program runs. */
static int (*ls_real_fsync)(int), (*ls_real_fdatasync)(int);

__attribute__((constructor)) static void ls_slow_init(void) {
    *(void **)&ls_real_fsync = dlsym(RTLD_NEXT, "fsync");
    *(void **)&ls_real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
}

int fsync(int fd) {
    ls_slow_wait();
    return ls_real_fsync ? ls_real_fsync(fd) : (errno = ENOSYS, -1);
}

int fdatasync(int fd) {
    ls_slow_wait();
    return ls_real_fdatasync ? ls_real_fdatasync(fd) : (errno = ENOSYS, -1);
}
