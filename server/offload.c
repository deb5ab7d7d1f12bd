/* The offload workers: a FIFO of jobs and a fixed set of threads that
 * run them. Stopping drains the queue first, since every queued job owns
 * a suspended connection that must be resumed before the daemon stops. */
#include "server/offload.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

struct ls_offload {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    ls_offload_job *head, *tail;
    bool stop;
    int threads;
    pthread_t *workers;
    atomic_llong *waiting; /* jobs queued, not yet taken by a worker (NULL: not counted) */
};

static void *ls_offload_worker(void *arg) {
    ls_offload *o = arg;
    pthread_mutex_lock(&o->lock);
    for (;;) {
        while (!o->head && !o->stop) pthread_cond_wait(&o->cond, &o->lock);
        ls_offload_job *job = o->head;
        if (!job) break; /* stopping, and nothing left */
        o->head = job->next;
        if (!o->head) o->tail = NULL;
        if (o->waiting) atomic_fetch_sub(o->waiting, 1);
        pthread_mutex_unlock(&o->lock);
        job->run(job->ctx);
        pthread_mutex_lock(&o->lock);
    }
    pthread_mutex_unlock(&o->lock);
    return NULL;
}

/* Stops and joins the first started workers, frees o. */
static void ls_offload_destroy(ls_offload *o, int started) {
    pthread_mutex_lock(&o->lock);
    o->stop = true;
    pthread_cond_broadcast(&o->cond);
    pthread_mutex_unlock(&o->lock);
    for (int i = 0; i < started; i++) pthread_join(o->workers[i], NULL);
    pthread_cond_destroy(&o->cond);
    pthread_mutex_destroy(&o->lock);
    free(o->workers);
    free(o);
}

ls_status ls_offload_create(int threads, atomic_llong *waiting, ls_offload **out, ls_error *err) {
    *out = NULL;
    if (threads < 1) threads = 1;
    ls_offload *o = calloc(1, sizeof *o);
    pthread_t *w = calloc((size_t)threads, sizeof *w);
    if (!o || !w) {
        free(o);
        free(w);
        return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    }
    pthread_mutex_init(&o->lock, NULL);
    pthread_cond_init(&o->cond, NULL);
    o->workers = w;
    o->threads = threads;
    o->waiting = waiting;
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&o->workers[i], NULL, ls_offload_worker, o)) {
            ls_offload_destroy(o, i);
            return ls_error_set(err, LS_INTERNAL, NULL, "cannot start offload worker %d of %d", i + 1, threads);
        }
    }
    *out = o;
    return LS_OK;
}

void ls_offload_free(ls_offload *o) {
    if (o) ls_offload_destroy(o, o->threads);
}

void ls_offload_submit(ls_offload *o, ls_offload_job *job) {
    job->next = NULL;
    pthread_mutex_lock(&o->lock);
    if (o->tail) o->tail->next = job;
    else o->head = job;
    o->tail = job;
    if (o->waiting) atomic_fetch_add(o->waiting, 1);
    pthread_cond_signal(&o->cond);
    pthread_mutex_unlock(&o->lock);
}
