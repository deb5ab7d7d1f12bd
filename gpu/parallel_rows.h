/* Host work over rows split across a few threads: the CUDA backend's
 * weight upload converts tens of GB this way while the previous chunk is
 * copied to the device. */
#ifndef LS_GPU_PARALLEL_ROWS_H
#define LS_GPU_PARALLEL_ROWS_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* fn(ctx, r0, r1) handles rows r0 <= r < r1; ranges never overlap. */
typedef void (*ls_rows_fn)(void *ctx, size_t r0, size_t r1);

/* Runs fn over rows 0..rows-1 on up to `threads` threads (the caller's
 * among them), in contiguous ranges; returns when all are done. Falls
 * back to the calling thread alone when a thread cannot start, so it
 * always completes. */
void ls_parallel_rows(size_t rows, int threads, ls_rows_fn fn, void *ctx);

/* Threads worth using for host conversion here: the online CPUs, at most 8. */
int ls_parallel_rows_threads(void);

#ifdef __cplusplus
}
#endif

#endif
