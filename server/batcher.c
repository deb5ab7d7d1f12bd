/* The batcher's worker: take the oldest job, wait until the batch is full
 * or the oldest job has waited --batch-wait-us (only while companions are
 * likely), gather every queued job of that layer (FIFO) up to the token
 * cap into one call of ls_pool_forward, and scatter the results. The CPU
 * backend is batch-invariant, so a token's y is bitwise what it would be
 * served alone. */
#include "server/batcher.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

struct ls_batcher {
    ls_pool *pool;
    ls_metrics *metrics;
    int H, n, max_tokens, wait_us, max_queue_tokens;
    bool gate; /* the model's gate: jobs without gammas cannot share a call with jobs that send them */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    ls_batch_job *head, *tail;
    int queued_tokens, queued_jobs;
    int arriving;              /* forwards being read, not yet submitted */
    int last_jobs;             /* requests in the last batch */
    struct timespec last_end;  /* when it had run */
    bool stop;
    pthread_t worker;
    /* scratch for one merged call, allocated once (max_tokens rows) */
    float *x, *gammas, *y;
    ls_token_names names; /* borrows the jobs' names */
    int *map;             /* per job, its names' indices in names, jobs one after another */
    int *map_at;          /* [job] where its indices start in map */
    ls_pool_used *used;
    ls_batch_job **batch;
    double *queued_s; /* [k] batch[k]'s time in the queue, taken before it runs (it may be freed after) */
    bool *served;     /* [k] whether batch[k] was answered with y */
};

static void ls_batcher_finish(ls_batch_job *job, ls_status st) {
    job->status = st;
    job->done(job->done_ctx); /* last touch: the job may be freed by done() */
}

/* Runs one job on its own buffers (a job over the cap, a lone job, or the
 * fall-back when a merged call failed for one job's sake); whether it was
 * served. A refused one (an unknown adapter, say) ran no batch. */
static bool ls_batcher_run_alone(ls_batcher *b, ls_batch_job *job) {
    ls_status st = ls_pool_forward(b->pool, job->layer, job->T, job->x, job->gammas, job->names, job->y, job->used,
                                   &job->n_used, &job->err);
    if (st == LS_OK) ls_metrics_observe_batch(b->metrics, 1, job->T);
    ls_batcher_finish(job, st);
    return st == LS_OK;
}

/* Whether a job's tokens name adapters. */
static bool ls_batcher_named(const ls_batch_job *job) { return job->names && job->names->of_token; }

/* The merged call's names: each job's distinct names once (borrowed from
 * the jobs), its tokens' indices mapped into them; a name is hashed once
 * a job, never compared per token. False when out of memory. */
static bool ls_batcher_merge_names(ls_batcher *b, ls_batch_job **jobs, int count) {
    ls_token_names *m = &b->names;
    ls_token_names_reset(m);
    int at = 0;
    for (int j = 0; j < count; j++) {
        const ls_token_names *tn = jobs[j]->names;
        const bool named = ls_batcher_named(jobs[j]);
        int *map = b->map + at;
        b->map_at[j] = at;
        for (int k = 0; named && k < tn->n; k++)
            if ((map[k] = ls_token_names_index(m, tn->names[k])) < 0) return false;
        for (int t = 0; t < jobs[j]->T; t++)
            if (!ls_token_names_push(m, named && tn->of_token[t] >= 0 ? map[tn->of_token[t]] : -1)) return false;
        at += named ? tn->n : 0;
    }
    return true;
}

/* Job j's entries of the merged call's used[]: its names' own, in their
 * order (as a call of its own would list them), named by its own strings
 * (another job's may be freed first). */
static void ls_batcher_used_of(const ls_batcher *b, int j, ls_batch_job *job) {
    job->n_used = 0;
    if (!ls_batcher_named(job)) return;
    const int *map = b->map + b->map_at[j];
    for (int k = 0; k < job->names->n; k++) {
        job->used[k] = b->used[map[k]];
        job->used[k].name = job->names->names[k];
    }
    job->n_used = job->names->n;
}

/* Runs jobs in one call, or each alone when that call fails; served[k]
 * says which were answered with y. */
static void ls_batcher_run_merged(ls_batcher *b, ls_batch_job **jobs, int count, bool *served) {
    const int H = b->H, n = b->n;
    int T = 0;
    bool any_names = false, any_gammas = false;
    for (int j = 0; j < count; j++) {
        any_names |= ls_batcher_named(jobs[j]);
        any_gammas |= jobs[j]->gammas != NULL;
    }
    for (int j = 0; j < count; j++) {
        ls_batch_job *job = jobs[j];
        memcpy(b->x + (size_t)T * H, job->x, sizeof(float) * (size_t)job->T * H);
        if (any_gammas) {
            if (job->gammas) memcpy(b->gammas + (size_t)T * n, job->gammas, sizeof(float) * (size_t)job->T * n);
            else
                for (size_t i = 0; i < (size_t)job->T * n; i++) b->gammas[(size_t)T * n + i] = 1.0f;
        }
        T += job->T;
    }
    ls_error err;
    ls_error_init(&err);
    int n_used = 0;
    ls_status st = any_names && !ls_batcher_merge_names(b, jobs, count)
                       ? ls_error_set(&err, LS_INTERNAL, NULL, "out of memory merging adapter names")
                       : ls_pool_forward(b->pool, jobs[0]->layer, T, b->x, any_gammas ? b->gammas : NULL,
                                         any_names ? &b->names : NULL, b->y, b->used, &n_used, &err);
    if (st != LS_OK) {
        /* A merged call fails for one job's sake as often as for all of
         * them (an adapter gone, one that cannot be read back, a group
         * that finds no slot): serve each alone, so a job answers with
         * its own outcome and never with another's error (and a merge
         * short of memory costs only the merge). */
        ls_error_free(&err);
        for (int j = 0; j < count; j++) served[j] = ls_batcher_run_alone(b, jobs[j]);
        return;
    }
    ls_metrics_observe_batch(b->metrics, count, T);
    for (int j = 0; j < count; j++) served[j] = true;
    int off = 0;
    for (int j = 0; j < count; j++) {
        ls_batch_job *job = jobs[j];
        memcpy(job->y, b->y + (size_t)off * H, sizeof(float) * (size_t)job->T * H);
        ls_batcher_used_of(b, j, job);
        off += job->T;
        ls_batcher_finish(job, st);
    }
    ls_error_free(&err);
}

/* Microseconds from a to b (negative when b is earlier). */
static double ls_batcher_us_between(const struct timespec *a, const struct timespec *b) {
    return (double)(b->tv_sec - a->tv_sec) * 1e6 + (double)(b->tv_nsec - a->tv_nsec) / 1e3;
}

static double ls_batcher_age_us(const struct timespec *t0) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return ls_batcher_us_between(t0, &now);
}

/* Whether job j may run in one call with the batch head leads: the same
 * layer and, on a gated model, gammas sent by both or by neither (a call
 * has gammas for every token or for none, and a token without them takes
 * the gate, which only the engine computes). */
static bool ls_batcher_joins(const ls_batcher *b, const ls_batch_job *head, const ls_batch_job *j) {
    return j->layer == head->layer && (!b->gate || (j->gammas != NULL) == (head->gammas != NULL));
}

/* Tokens queued that the head job's batch would take. */
static int ls_batcher_tokens_for(const ls_batcher *b, const ls_batch_job *head) {
    int tokens = 0;
    for (const ls_batch_job *j = b->head; j; j = j->next)
        if (ls_batcher_joins(b, head, j)) tokens += j->T;
    return tokens;
}

/* Whether holding the batch open is likely to gather more: another
 * forward is being read, or the server is under load (the last batch
 * merged several and the head came within --batch-wait-us of its end)
 * and fewer are queued than that batch took. A request that finds the
 * server idle is never held: waiting would only add to its latency. */
static bool ls_batcher_worth_waiting(const ls_batcher *b) {
    if (b->arriving > 0) return true;
    const bool loaded = b->last_jobs > 1 && ls_batcher_us_between(&b->last_end, &b->head->enqueued) <= b->wait_us;
    return loaded && b->queued_jobs < b->last_jobs;
}

static void *ls_batcher_main(void *arg) {
    ls_batcher *b = arg;
    pthread_mutex_lock(&b->lock);
    for (;;) {
        while (!b->head && !b->stop) pthread_cond_wait(&b->cond, &b->lock);
        if (!b->head) break; /* stopping with an empty queue */
        /* Fill the batch until the cap or the head's deadline. */
        struct timespec wait0;
        bool waited = false;
        while (!b->stop && ls_batcher_tokens_for(b, b->head) < b->max_tokens && ls_batcher_worth_waiting(b)) {
            double left = b->wait_us - ls_batcher_age_us(&b->head->enqueued);
            if (left <= 0) break;
            if (!waited) clock_gettime(CLOCK_MONOTONIC, &wait0);
            waited = true;
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            long long ns = until.tv_nsec + (long long)(left * 1e3);
            until.tv_sec += (time_t)(ns / 1000000000LL);
            until.tv_nsec = (long)(ns % 1000000000LL);
            pthread_cond_timedwait(&b->cond, &b->lock, &until);
        }
        if (waited) ls_metrics_observe_batch_wait(b->metrics, ls_batcher_age_us(&wait0) * 1e-6);
        /* Take the jobs that join the head, FIFO, up to the cap. */
        ls_batch_job *head = b->head;
        int count = 0, tokens = 0;
        ls_batch_job **link = &b->head, *prev = NULL;
        while (*link) {
            ls_batch_job *j = *link;
            if (ls_batcher_joins(b, head, j) && (count == 0 || tokens + j->T <= b->max_tokens)) {
                *link = j->next;
                if (b->tail == j) b->tail = prev;
                b->batch[count++] = j;
                tokens += j->T;
                b->queued_tokens -= j->T;
                b->queued_jobs--;
                if (tokens >= b->max_tokens) break;
            } else {
                prev = j;
                link = &j->next;
            }
        }
        b->last_jobs = count;
        ls_metrics_set_queue_depth(b->metrics, b->queued_jobs);
        pthread_mutex_unlock(&b->lock);
        /* Queue and compute times per request served, as Triton reports
         * them (a refused request ran nothing); a job may be freed once
         * run, so its queue time is taken first. */
        struct timespec start;
        clock_gettime(CLOCK_MONOTONIC, &start);
        for (int k = 0; k < count; k++) b->queued_s[k] = ls_batcher_us_between(&b->batch[k]->enqueued, &start) * 1e-6;
        if (count == 1) b->served[0] = ls_batcher_run_alone(b, b->batch[0]);
        else ls_batcher_run_merged(b, b->batch, count, b->served);
        const double compute_s = ls_batcher_age_us(&start) * 1e-6;
        int served = 0;
        for (int k = 0; k < count; k++) {
            if (!b->served[k]) continue;
            ls_metrics_observe_forward_queue(b->metrics, b->queued_s[k]);
            served++;
        }
        if (served) ls_metrics_observe_forward_compute(b->metrics, compute_s, served);
        pthread_mutex_lock(&b->lock);
        clock_gettime(CLOCK_MONOTONIC, &b->last_end);
    }
    pthread_mutex_unlock(&b->lock);
    return NULL;
}

ls_status ls_batcher_create(ls_pool *pool, ls_metrics *metrics, const ls_dims *dims, int max_batch_tokens, int wait_us,
                            int max_queue_tokens, ls_batcher **out, ls_error *err) {
    ls_batcher *b = calloc(1, sizeof *b);
    if (!b) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory for the batcher");
    *b = (ls_batcher){.pool = pool, .metrics = metrics, .H = dims->H, .n = dims->n, .gate = dims->gate,
                      .max_tokens = max_batch_tokens, .wait_us = wait_us, .max_queue_tokens = max_queue_tokens};
    size_t T = (size_t)max_batch_tokens;
    b->x = malloc(sizeof(float) * T * (size_t)b->H);
    b->y = malloc(sizeof(float) * T * (size_t)b->H);
    b->gammas = malloc(sizeof(float) * T * (size_t)b->n);
    ls_token_names_init(&b->names, true);
    b->names.of_token = malloc(sizeof(int) * T);
    b->names.tokens_cap = max_batch_tokens;
    b->map = malloc(sizeof(int) * T);
    b->map_at = malloc(sizeof(int) * T);
    b->used = malloc(sizeof(ls_pool_used) * T);
    b->batch = malloc(sizeof(ls_batch_job *) * T);
    b->queued_s = malloc(sizeof(double) * T);
    b->served = malloc(sizeof(bool) * T);
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, NULL);
    if (!b->x || !b->y || !b->gammas || !b->names.of_token || !b->map || !b->map_at || !b->used || !b->batch ||
        !b->queued_s || !b->served || pthread_create(&b->worker, NULL, ls_batcher_main, b)) {
        b->stop = true; /* no worker to join */
        free(b->x), free(b->y), free(b->gammas), free(b->map), free(b->map_at), free(b->used), free(b->batch);
        free(b->queued_s), free(b->served);
        ls_token_names_free(&b->names);
        pthread_mutex_destroy(&b->lock);
        pthread_cond_destroy(&b->cond);
        free(b);
        return ls_error_set(err, LS_INTERNAL, NULL, "cannot start the batcher (%d-token buffers)", max_batch_tokens);
    }
    *out = b;
    return LS_OK;
}

void ls_batcher_free(ls_batcher *b) {
    if (!b) return;
    pthread_mutex_lock(&b->lock);
    b->stop = true;
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
    pthread_join(b->worker, NULL);
    free(b->x);
    free(b->y);
    free(b->gammas);
    ls_token_names_free(&b->names);
    free(b->map);
    free(b->map_at);
    free(b->used);
    free(b->batch);
    free(b->queued_s);
    free(b->served);
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->cond);
    free(b);
}

void ls_batcher_arriving(ls_batcher *b) {
    pthread_mutex_lock(&b->lock);
    b->arriving++;
    ls_metrics_set_receiving(b->metrics, b->arriving);
    pthread_mutex_unlock(&b->lock);
}

/* The caller holds the lock. A batch held open only for this one must
 * not wait on past its arrival. */
static void ls_batcher_uncount(ls_batcher *b) {
    if (--b->arriving == 0) pthread_cond_signal(&b->cond);
    ls_metrics_set_receiving(b->metrics, b->arriving);
}

void ls_batcher_arrived(ls_batcher *b) {
    pthread_mutex_lock(&b->lock);
    ls_batcher_uncount(b);
    pthread_mutex_unlock(&b->lock);
}

ls_status ls_batcher_submit(ls_batcher *b, ls_batch_job *job, ls_error *err) {
    ls_error_init(&job->err);
    /* A job of no tokens would never fill a batch's cap: the batch array
     * (sized in tokens) could overflow. */
    if (job->T < 1) {
        if (job->arriving) ls_batcher_arrived(b);
        return ls_error_set(err, LS_INTERNAL, NULL, "a batch job needs at least one token");
    }
    job->n_used = 0;
    job->next = NULL;
    clock_gettime(CLOCK_MONOTONIC, &job->enqueued);
    pthread_mutex_lock(&b->lock);
    /* Enqueued (or refused) and uncounted in one step, so the worker never
     * sees this job both queued and still arriving. */
    if (job->arriving) ls_batcher_uncount(b);
    /* A request bigger than the whole queue still runs when it is alone. */
    if (b->stop || (b->queued_tokens > 0 && b->queued_tokens + job->T > b->max_queue_tokens)) {
        int queued = b->queued_tokens;
        pthread_mutex_unlock(&b->lock);
        ls_metrics_overload(b->metrics);
        return ls_error_set(err, LS_OVERLOADED, NULL, "the forward queue is full (%d tokens waiting, limit %d)",
                            queued, b->max_queue_tokens);
    }
    if (b->tail) b->tail->next = job;
    else b->head = job;
    b->tail = job;
    b->queued_tokens += job->T;
    b->queued_jobs++;
    ls_metrics_set_queue_depth(b->metrics, b->queued_jobs);
    pthread_cond_signal(&b->cond);
    pthread_mutex_unlock(&b->lock);
    return LS_OK;
}

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
} ls_batcher_waiter;

static void ls_batcher_wake(void *ctx) {
    ls_batcher_waiter *w = ctx;
    pthread_mutex_lock(&w->lock);
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

ls_status ls_batcher_run(ls_batcher *b, ls_batch_job *job) {
    ls_batcher_waiter w = {.done = false};
    pthread_mutex_init(&w.lock, NULL);
    pthread_cond_init(&w.cond, NULL);
    job->done = ls_batcher_wake;
    job->done_ctx = &w;
    ls_status st = ls_batcher_submit(b, job, &job->err);
    if (st == LS_OK) {
        pthread_mutex_lock(&w.lock);
        while (!w.done) pthread_cond_wait(&w.cond, &w.lock);
        pthread_mutex_unlock(&w.lock);
        st = job->status;
    } else {
        job->status = st;
    }
    pthread_mutex_destroy(&w.lock);
    pthread_cond_destroy(&w.cond);
    return st;
}
