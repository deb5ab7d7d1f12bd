/* Rows split over a few threads (gpu/parallel_rows.h). */
#include "gpu/parallel_rows.h"

#include <pthread.h>
#include <unistd.h>

#define LS_ROWS_MAX_THREADS 8

typedef struct {
    ls_rows_fn fn;
    void *ctx;
    size_t r0, r1;
} rows_job;

static void *rows_main(void *arg) {
    rows_job *j = (rows_job *)arg;
    j->fn(j->ctx, j->r0, j->r1);
    return NULL;
}

void ls_parallel_rows(size_t rows, int threads, ls_rows_fn fn, void *ctx) {
    if (threads > LS_ROWS_MAX_THREADS) threads = LS_ROWS_MAX_THREADS;
    if (threads < 1) threads = 1;
    if ((size_t)threads > rows) threads = rows > 0 ? (int)rows : 1;
    rows_job jobs[LS_ROWS_MAX_THREADS];
    pthread_t tid[LS_ROWS_MAX_THREADS];
    bool started[LS_ROWS_MAX_THREADS] = {false};
    for (int i = 0; i < threads; i++) {
        jobs[i] = (rows_job){fn, ctx, rows * (size_t)i / (size_t)threads, rows * (size_t)(i + 1) / (size_t)threads};
        /* Job 0 is the caller's; a thread that cannot start leaves its job to the caller too. */
        if (i > 0) started[i] = pthread_create(&tid[i], NULL, rows_main, &jobs[i]) == 0;
    }
    for (int i = 0; i < threads; i++)
        if (!started[i]) rows_main(&jobs[i]);
    for (int i = 1; i < threads; i++)
        if (started[i]) pthread_join(tid[i], NULL);
}

int ls_parallel_rows_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) return 1;
    return n > LS_ROWS_MAX_THREADS ? LS_ROWS_MAX_THREADS : (int)n;
}
