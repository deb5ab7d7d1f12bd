/* Advice on a request's large buffers (bodies, y): each is a mapping of
 * its own (server/main.c holds the mmap threshold), and first touching
 * one in 4 KiB pages took more time than the copies into it. */
#ifndef LS_COMMON_MEM_H
#define LS_COMMON_MEM_H

#include <stddef.h>

/* Buffers from this size on are advised. */
#define LS_MEM_LARGE ((size_t)4 << 20)

/* Asks the kernel to back the n bytes at p with transparent huge pages
 * (madvise MADV_HUGEPAGE, which the kernel's default "madvise" mode
 * honours) when n >= LS_MEM_LARGE; a no-op below that, where the advice
 * is not there or the kernel refuses it. p stays the caller's (free()). */
void ls_mem_advise_large(void *p, size_t n);

#endif
