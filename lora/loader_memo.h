/* The loader's memory of adapter files that failed: a file is known by
 * its identity (device, inode, size, modification and change times), so
 * a request for the same bytes is answered with the same error without
 * reading them again, and a file that changes is read afresh. Private to
 * lora/loader.c. */
#ifndef LS_LORA_LOADER_MEMO_H
#define LS_LORA_LOADER_MEMO_H

#include <stdbool.h>
#include <sys/stat.h>

#include "common/error.h"
#include "common/file.h"
#include "lora/adapter.h"

/* Failures remembered at most; past it the oldest goes. */
#define LS_LOADER_MEMO_MAX 64

/* What identifies the files of one adapter path, changed when one is
 * replaced, rewritten or touched: [0] the safetensors file, [1] a PEFT
 * directory's adapter_config.json (zero for a bare file). Zeroed whole
 * before it is filled, so it compares with memcmp. The loader and
 * auto-load's lookup (lora/autoload.c) both key on it. */
typedef struct {
    struct {
        ls_file_stamp stamp;
        int missing; /* auto-load's lookup: the file was not there */
    } f[2];
} ls_loader_print;

typedef struct ls_loader_memo ls_loader_memo;

/* NULL when out of memory. */
ls_loader_memo *ls_loader_memo_create(void);
void ls_loader_memo_free(ls_loader_memo *m);

/* Counts one read of a file's bytes; and the count so far. */
void ls_loader_memo_count_read(ls_loader_memo *m);
unsigned long long ls_loader_memo_reads(const ls_loader_memo *m);

/* Fills slot i of p from st (p zeroed by the caller). */
void ls_loader_print_set(ls_loader_print *p, int i, const struct stat *st);

/* The failure remembered for path read as print with these parameters:
 * true with err (initialised) a copy of it and *code its status. */
bool ls_loader_memo_find(ls_loader_memo *m, const char *path, const ls_loader_print *print,
                         const ls_adapter_params *given, bool merge, ls_status *code, ls_error *err);
/* Remembers err (a failure of the file itself) for that key; out of
 * memory forgets it. */
void ls_loader_memo_put(ls_loader_memo *m, const char *path, const ls_loader_print *print,
                        const ls_adapter_params *given, bool merge, const ls_error *err);

#endif
