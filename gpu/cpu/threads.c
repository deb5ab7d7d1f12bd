/* A fixed pool of worker threads for the CPU engine. A job is published
 * by bumping a generation counter; workers spin on it for a short while
 * (a forward runs its phases back to back) and then sleep on a condition
 * variable, so an idle server burns no CPU. */
#include "gpu/cpu/threads.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LS_CPU_PAUSE() _mm_pause()
#else
#define LS_CPU_PAUSE() ((void)0)
#endif

/* Polls before sleeping: some tens of microseconds, longer than the gap
 * between the jobs of one forward, far shorter than an idle period. With
 * more threads than CPUs a poll only takes the CPU from the thread it is
 * waiting for, so such a pool never polls. */
#define LS_CPU_SPIN 2000

struct ls_cpu_threads {
    int count;
    int spin; /* polls before sleeping: LS_CPU_SPIN, or 0 when oversubscribed */
    pthread_t *tids;
    int started; /* workers running, for the join */
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    atomic_uint gen;     /* bumped once per job */
    atomic_int pending;  /* workers still in the current job */
    atomic_bool stop;
    ls_cpu_job_fn fn;    /* the job: written before gen is bumped */
    void *ctx;
};

typedef struct {
    ls_cpu_threads *tp;
    int index;
} ls_cpu_worker_arg;

/* Waits until gen differs from seen or stop is set. */
static void ls_cpu_threads_await_job(ls_cpu_threads *tp, unsigned seen) {
    for (int i = 0; i < tp->spin; i++) {
        if (atomic_load_explicit(&tp->gen, memory_order_acquire) != seen || atomic_load(&tp->stop)) return;
        LS_CPU_PAUSE();
    }
    pthread_mutex_lock(&tp->mu);
    while (atomic_load_explicit(&tp->gen, memory_order_acquire) == seen && !atomic_load(&tp->stop))
        pthread_cond_wait(&tp->wake, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
}

static void *ls_cpu_worker(void *p) {
    ls_cpu_worker_arg arg = *(ls_cpu_worker_arg *)p;
    free(p);
    ls_cpu_threads *tp = arg.tp;
    unsigned seen = 0;
    for (;;) {
        ls_cpu_threads_await_job(tp, seen);
        if (atomic_load(&tp->stop)) break;
        seen = atomic_load_explicit(&tp->gen, memory_order_acquire);
        tp->fn(tp->ctx, arg.index, tp->count);
        if (atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&tp->mu);
            pthread_cond_signal(&tp->done);
            pthread_mutex_unlock(&tp->mu);
        }
    }
    return NULL;
}

ls_status ls_cpu_threads_create(int count, int cpus, ls_cpu_threads **out, ls_error *err) {
    *out = NULL;
    if (count < 1) count = 1;
    ls_cpu_threads *tp = calloc(1, sizeof *tp);
    if (!tp) return ls_error_set(err, LS_DEVICE_ERROR, NULL, "cpu backend: out of host memory for threads");
    tp->count = count;
    tp->spin = count <= cpus ? LS_CPU_SPIN : 0;
    tp->tids = calloc((size_t)count, sizeof *tp->tids);
    if (!tp->tids) {
        free(tp);
        return ls_error_set(err, LS_DEVICE_ERROR, NULL, "cpu backend: out of host memory for threads");
    }
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->wake, NULL);
    pthread_cond_init(&tp->done, NULL);
    atomic_init(&tp->gen, 0);
    atomic_init(&tp->pending, 0);
    atomic_init(&tp->stop, false);

    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = 0;
    for (int i = 1; i < count; i++) {
        ls_cpu_worker_arg *arg = malloc(sizeof *arg);
        if (!arg) {
            rc = -1;
            break;
        }
        *arg = (ls_cpu_worker_arg){tp, i};
        if ((rc = pthread_create(&tp->tids[i], NULL, ls_cpu_worker, arg)) != 0) {
            free(arg);
            break;
        }
        tp->started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        ls_cpu_threads_free(tp);
        return ls_error_set(err, LS_DEVICE_ERROR, "lower --threads",
                            "cpu backend: cannot start %d engine threads", count - 1);
    }
    *out = tp;
    return LS_OK;
}

void ls_cpu_threads_run(ls_cpu_threads *tp, ls_cpu_job_fn fn, void *ctx) {
    if (tp->count == 1) {
        fn(ctx, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store_explicit(&tp->pending, tp->count - 1, memory_order_relaxed);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add_explicit(&tp->gen, 1, memory_order_release);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    fn(ctx, 0, tp->count);
    for (int i = 0; i < tp->spin; i++) {
        if (atomic_load_explicit(&tp->pending, memory_order_acquire) == 0) return;
        LS_CPU_PAUSE();
    }
    pthread_mutex_lock(&tp->mu);
    while (atomic_load_explicit(&tp->pending, memory_order_acquire) != 0) pthread_cond_wait(&tp->done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
}

int ls_cpu_threads_count(const ls_cpu_threads *tp) { return tp->count; }

void ls_cpu_threads_free(ls_cpu_threads *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, true);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i <= tp->started; i++) pthread_join(tp->tids[i], NULL);
    pthread_cond_destroy(&tp->wake);
    pthread_cond_destroy(&tp->done);
    pthread_mutex_destroy(&tp->mu);
    free(tp->tids);
    free(tp);
}
