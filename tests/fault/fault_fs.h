/* The file-system failure hook of the state sweeps: fails the Nth call,
 * counted from fs_arm, of the calls that write the state directory or
 * open its files (openat, write, fsync, renameat, unlinkat), as a disk
 * that refuses would (ENOSPC from openat with O_CREAT and from write,
 * EIO from a plain openat and from fsync, EPERM from renameat and
 * unlinkat, as for a file made immutable); or, as a crash does, fails
 * that call and every one after it until fs_disarm, so that nothing the
 * process does after that moment reaches the disk.
 *
 * How: only tests/fault/test_fault_state is linked with
 * -Wl,--wrap=openat,--wrap=write,--wrap=fsync,--wrap=renameat,
 * --wrap=unlinkat; the calls of our own objects (lora/state.c and
 * lora/state_restore.c make every call the state directory sees) reach
 * the __wrap_* functions of fault_fs.c, which call the real ones unless
 * this is a call to fail. libc's own calls (stdio) and the shared
 * libraries' are not counted. */
#ifndef LS_TESTS_FAULT_FS_H
#define LS_TESTS_FAULT_FS_H

#include <stdbool.h>

/* Starts counting from zero; the nth call from now (1-based) fails, and
 * with crash every call after it too. n = 0 counts without failing. */
void fs_arm(long n, bool crash);
/* Stops counting (and failing). */
void fs_disarm(void);
/* Calls seen since the last fs_arm. */
long fs_count(void);
/* True when the armed failure happened since the last fs_arm; what the
 * failed call was ("renameat n0.adapter"), for messages. */
bool fs_fired(void);
const char *fs_fired_call(void);
/* The errno the armed failure set (ENOSPC, EIO, EPERM); 0 before it. */
int fs_fired_errno(void);

#endif
