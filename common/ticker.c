/* The ticker thread of ticker.h: a timed wait on a condition variable of
 * the monotonic clock, so that stopping wakes it at once and a change of
 * the wall clock does not. */
#include "common/ticker.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

struct ls_ticker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop; /* under mu */
    int period_ms;
    void (*fn)(void *ctx);
    void *ctx;
    pthread_t thread;
};

static void ls_ticker_deadline(int ms, struct timespec *until) {
    clock_gettime(CLOCK_MONOTONIC, until);
    until->tv_sec += ms / 1000;
    until->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until->tv_nsec >= 1000000000L) until->tv_sec++, until->tv_nsec -= 1000000000L;
}

static void *ls_ticker_run(void *arg) {
    ls_ticker *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        struct timespec until;
        ls_ticker_deadline(t->period_ms, &until);
        /* A spurious wake-up waits again for the rest of the period. */
        while (!t->stop && pthread_cond_timedwait(&t->cv, &t->mu, &until) == 0) {
        }
        if (t->stop) break;
        pthread_mutex_unlock(&t->mu);
        t->fn(t->ctx);
        pthread_mutex_lock(&t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* Owns nothing on failure. */
ls_ticker *ls_ticker_start(int period_ms, void (*fn)(void *ctx), void *ctx) {
    ls_ticker *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->period_ms = period_ms, t->fn = fn, t->ctx = ctx;
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&t->thread, NULL, ls_ticker_run, t) != 0) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return NULL;
    }
    return t;
}

void ls_ticker_stop(ls_ticker *t) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
}
