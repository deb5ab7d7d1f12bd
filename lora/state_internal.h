/* What lora/state.c (opening, the lock, writing) and lora/state_restore.c
 * (reading back, the restore scan) share: the state itself, the names of
 * its files, and the few file operations both sides use. */
#ifndef LS_LORA_STATE_INTERNAL_H
#define LS_LORA_STATE_INTERNAL_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "lora/state.h"

#define LS_STATE_FORMAT "1"
#define LS_STATE_MAX_NAME 128
/* What stands for the '/' of a tenant's TENANT/NAME in its files' names. */
#define LS_STATE_TENANT_SEP '@'
/* A tombstone or a floor: a decimal version and a newline. */
#define LS_STATE_VERSION_FILE_MAX 64

struct ls_state {
    int dirfd;
    int lockfd;     /* DIR/.lock, flock'ed for the state's life */
    int corrupt_fd; /* DIR/corrupt once opened; -1 before, -2 when it is not a directory */
    char dir[PATH_MAX];
    unsigned long tmp_seq; /* names of temporary files; callers serialise writes */
    int unrestored;        /* records the restore did not register (ls_state_unrestored) */
    size_t max_record;     /* bytes (ls_state_fit); SIZE_MAX until set */
    bool fitted;           /* dims and pd are the pool's (ls_state_fit) */
    ls_dims dims;          /* its sizes only: layer_ids is not kept */
    ls_pool_dims pd;
};

/* file as NAME.suffix; false (and *out empty) when it would not fit or
 * name breaks the adapter name rule (ls_adapter_name_valid), which keeps
 * every file it names inside the state directory. */
bool ls_state_file_name(char *out, size_t len, const char *name, const char *suffix);

/* Sets err from errno: "state directory: <what> <file>: <errno text>".
 * Returns LS_INSUFFICIENT_STORAGE for ENOSPC or EDQUOT, else LS_INTERNAL. */
ls_status ls_state_fail(ls_error *err, const char *what, const char *file);

/* A file written under a temporary name, synced, waiting to be renamed
 * into place: the space it takes is taken before anything is in place,
 * so that a save can stage every file it writes before its first rename. */
typedef struct {
    char file[LS_STATE_MAX_NAME + 16];
    char tmp[LS_STATE_MAX_NAME + 64]; /* "" once placed or dropped */
} ls_state_staged;

/* Writes data[len] to a new temporary file for file and syncs it; on
 * failure nothing is left. */
ls_status ls_state_stage(ls_state *s, const char *file, const void *data, size_t len, ls_state_staged *t,
                         ls_error *err);
/* Drops a staged file that will not be placed (none: nothing to do). */
void ls_state_unstage(ls_state *s, ls_state_staged *t);
/* Renames t into place, then syncs the directory. *placed says whether
 * the rename happened (on a failure then only the sync failed: the new
 * file is what the disk says). */
ls_status ls_state_place(ls_state *s, ls_state_staged *t, bool *placed, ls_error *err);
/* Both: data[len] becomes file in one step. */
ls_status ls_state_write_atomic(ls_state *s, const char *file, const void *data, size_t len, bool *placed,
                                ls_error *err);
/* version as the text of file (a tombstone or a floor), as
 * ls_state_write_atomic writes. */
ls_status ls_state_write_version(ls_state *s, const char *file, uint64_t version, bool *placed, ls_error *err);
/* Removes file if it is there, then syncs the directory. */
ls_status ls_state_remove(ls_state *s, const char *file, ls_error *err);

/* Opens file of the directory to read it when it is a regular file,
 * never following a link and never blocking; *sb is what fstat says. -1
 * with errno when it cannot be opened, and -1 with errno 0 (*sb then
 * saying what it is) when it is not a regular file: that is never opened
 * at all. */
int ls_state_open_file(const ls_state *s, const char *file, struct stat *sb);

/* The version a tombstone or a floor file holds (a regular file of at
 * most LS_STATE_VERSION_FILE_MAX bytes: a decimal in [1,
 * LS_STATE_VERSION_MAX] ending the file or its first line); false when
 * it is missing or holds none. */
bool ls_state_version_read(const ls_state *s, const char *file, uint64_t *version);

/* v, a decimal number and nothing else, into *out. */
bool ls_state_u64_text(const char *v, uint64_t *out);

#endif
