/* The CPU engine's own threads: a fixed set started with the backend,
 * each running the same job with its index, the caller being index 0.
 * Jobs split work by index alone (columns or rows, never K), so which
 * thread computes an element never matters to its value. */
#ifndef LS_GPU_CPU_THREADS_H
#define LS_GPU_CPU_THREADS_H

#include "common/error.h"

typedef struct ls_cpu_threads ls_cpu_threads;

/* fn(ctx, index, count) runs once per thread. */
typedef void (*ls_cpu_job_fn)(void *ctx, int index, int count);

/* Starts count - 1 threads (count >= 1), every signal blocked in them so
 * signals reach the process's own threads; cpus is how many CPUs the
 * process may use (threads wait by polling only when they all fit). On
 * success *out is the
 * caller's, released with ls_cpu_threads_free. */
ls_status ls_cpu_threads_create(int count, int cpus, ls_cpu_threads **out, ls_error *err);
/* Runs fn on every thread and returns when all have finished. Calls must
 * not overlap (the backend's caller serialises forwards). */
void ls_cpu_threads_run(ls_cpu_threads *tp, ls_cpu_job_fn fn, void *ctx);
int ls_cpu_threads_count(const ls_cpu_threads *tp);
/* Stops and joins the threads. NULL is a no-op. */
void ls_cpu_threads_free(ls_cpu_threads *tp);

#endif
