/* Huge-page advice for large buffers (common/mem.h). */
#include "common/mem.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

void ls_mem_advise_large(void *p, size_t n) {
#ifdef MADV_HUGEPAGE
    if (!p || n < LS_MEM_LARGE) return;
    const long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return;
    /* madvise takes whole pages: the ones inside the buffer. */
    const uintptr_t a = ((uintptr_t)p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    const uintptr_t e = ((uintptr_t)p + n) & ~((uintptr_t)page - 1);
    /* Advice only: a kernel without it (or refusing it) faults the
     * buffer in as before. */
    if (e > a) (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}
