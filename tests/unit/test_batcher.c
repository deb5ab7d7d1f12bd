/* server/batcher over a pool on the fake backend: queued jobs of a layer
 * are coalesced into fewer backend calls, each job's y and used[] equal
 * the job run alone, one job's unknown adapter fails only that job, a
 * full queue answers LS_OVERLOADED without calling done(), done() runs
 * exactly once per accepted job, and freeing the batcher runs what is
 * queued and refuses what comes after. On a model with a shared-expert
 * gate, jobs that send gammas and jobs that do not never share a call. */
#include "tests/util/pool_cases.h"
#include "tests/util/pool_fixture.h"

#include "server/batcher.h"
#include "server/http_status.h"
#include "server/metrics.h"

#define BT_S 4
#define BT_R 4
#define BT_RANK 3
static const ls_dims D = {.n = 2, .H = 6, .F = 3, .L = 2, .w13_layout = LS_W13_INTERLEAVED};

/* Counts done() calls: per job, and in all (with a condition to wait on). */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int total;
} bt_tracker;

/* One job with its own buffers. */
typedef struct {
    ls_batch_job job;
    bt_tracker *tr;
    atomic_int done_calls;
    float *x, *g, *y;
    const char **names;   /* a string per token, or NULL */
    ls_token_names table; /* names as the job carries them */
    ls_pool_used *used;
} bt_job;

static void bt_done(void *ctx) {
    bt_job *j = ctx;
    atomic_fetch_add(&j->done_calls, 1);
    pthread_mutex_lock(&j->tr->mu);
    j->tr->total++;
    pthread_cond_broadcast(&j->tr->cv);
    pthread_mutex_unlock(&j->tr->mu);
}

static void bt_tracker_init(bt_tracker *tr) {
    pthread_mutex_init(&tr->mu, NULL);
    pthread_cond_init(&tr->cv, NULL);
    tr->total = 0;
}
static void bt_tracker_free(bt_tracker *tr) {
    pthread_mutex_destroy(&tr->mu);
    pthread_cond_destroy(&tr->cv);
}
static void bt_wait_done(bt_tracker *tr, int count) {
    pthread_mutex_lock(&tr->mu);
    while (tr->total < count) pthread_cond_wait(&tr->cv, &tr->mu);
    pthread_mutex_unlock(&tr->mu);
}

/* A job of T tokens on layer, inputs from seed; names[t] cycles through
 * names (n_names 0: all base, names NULL); gammas NULL when !with_gammas.
 * Freed with bt_job_free. */
static void bt_job_init(bt_job *j, bt_tracker *tr, int layer, int T, const char *const *names, int n_names,
                        bool with_gammas, uint64_t seed) {
    memset(j, 0, sizeof *j);
    j->tr = tr;
    j->x = malloc(sizeof(float) * (size_t)T * D.H);
    j->y = calloc((size_t)T * D.H, sizeof(float));
    j->g = with_gammas ? malloc(sizeof(float) * (size_t)T * D.n) : NULL;
    j->names = n_names ? calloc((size_t)T, sizeof *j->names) : NULL;
    j->used = calloc((size_t)T, sizeof *j->used);
    assert_true(j->x && j->y && j->used && (!with_gammas || j->g) && (!n_names || j->names));
    for (int i = 0; i < T * D.H; i++) j->x[i] = pt_uniform(&seed, 1.0f);
    for (int i = 0; with_gammas && i < T * D.n; i++) j->g[i] = 1.0f + pt_uniform(&seed, 0.5f);
    for (int t = 0; n_names && t < T; t++) j->names[t] = names[t % n_names];
    pc_names(&j->table, T, j->names);
    j->job = (ls_batch_job){.layer = layer,
                            .T = T,
                            .x = j->x,
                            .gammas = j->g,
                            .names = j->names ? &j->table : NULL,
                            .y = j->y,
                            .used = j->used,
                            .done = bt_done,
                            .done_ctx = j};
}

static void bt_job_free(bt_job *j) {
    ls_error_free(&j->job.err);
    free(j->x);
    free(j->y);
    free(j->g);
    free(j->names);
    ls_token_names_free(&j->table);
    free(j->used);
}

static ls_status bt_submit(ls_batcher *b, bt_job *j) {
    ls_error err;
    ls_error_init(&err);
    ls_status st = ls_batcher_submit(b, &j->job, &err);
    if (st != LS_OK) assert_int_equal(err.code, st);
    ls_error_free(&err);
    return st;
}

/* The job run alone, straight through the pool: y and used[] (names and
 * versions, in order) must equal what the batcher gave it. */
static void bt_expect_alone(ls_pool *p, const bt_job *j) {
    const ls_batch_job *job = &j->job;
    assert_int_equal(job->status, LS_OK);
    float *y = calloc((size_t)job->T * D.H, sizeof(float));
    ls_pool_used *used = calloc((size_t)job->T, sizeof *used);
    assert_true(y && used);
    int n_used = -1;
    ls_error err;
    ls_error_init(&err);
    if (pc_pool_forward(p, job->layer, job->T, job->x, job->gammas, j->names, y, used, &n_used, &err) != LS_OK)
        fail_msg("alone: %s", err.message);
    assert_memory_equal(y, job->y, sizeof(float) * (size_t)job->T * D.H);
    assert_int_equal(n_used, job->n_used);
    for (int u = 0; u < n_used; u++) {
        assert_string_equal(used[u].name, job->used[u].name);
        assert_int_equal(used[u].version, job->used[u].version);
    }
    /* and the fake's formula, token by token */
    for (int t = 0; t < job->T; t++) {
        ls_adapter a, *ap = NULL;
        const char *name = j->names ? j->names[t] : NULL;
        if (name) {
            pt_adapter(&D, BT_RANK, ls_fnv1a64(name), &a);
            ap = &a;
        }
        float want[16];
        pt_expect_token(&D, ap, job->layer, job->x + (size_t)t * D.H,
                        job->gammas ? job->gammas + (size_t)t * D.n : NULL, want);
        assert_memory_equal(job->y + (size_t)t * D.H, want, sizeof(float) * D.H);
        if (ap) ls_adapter_free(ap);
    }
    ls_error_free(&err);
    free(y);
    free(used);
}

/* A fake backend with BT_S slots, a pool and adapters "a".."d" at rank
 * BT_RANK seeded by their names' hash. */
typedef struct {
    pt_fake *fk;
    ls_pool *p;
    ls_metrics m;
    ls_batcher *b;
    bt_tracker tr;
} bt_fx;

/* gate: the batcher is told the model has a shared-expert gate (the fake
 * backend computes without one: only the grouping is under test). */
static void bt_fx_make_gate(bt_fx *f, int max_batch_tokens, int wait_us, int max_queue_tokens, bool gate) {
    f->fk = pt_fake_create(D, BT_S, BT_R, 64);
    f->p = pt_pool(f->fk->be, 16, NULL, NULL);
    const char *ids[] = {"a", "b", "c", "d"};
    ls_error err;
    ls_error_init(&err);
    for (int i = 0; i < 4; i++)
        if (pt_load(f->p, &D, ids[i], BT_RANK, ls_fnv1a64(ids[i]), false, false, NULL, NULL, &err) != LS_OK)
            fail_msg("load %s: %s", ids[i], err.message);
    ls_metrics_init(&f->m);
    bt_tracker_init(&f->tr);
    ls_dims d = D;
    d.gate = gate;
    if (ls_batcher_create(f->p, &f->m, &d, max_batch_tokens, wait_us, max_queue_tokens, &f->b, &err) != LS_OK)
        fail_msg("batcher: %s", err.message);
    ls_error_free(&err);
}

static void bt_fx_make(bt_fx *f, int max_batch_tokens, int wait_us, int max_queue_tokens) {
    bt_fx_make_gate(f, max_batch_tokens, wait_us, max_queue_tokens, false);
}

/* The batcher first (it borrows the pool and metrics), the backend last. */
static void bt_fx_free(bt_fx *f) {
    ls_batcher_free(f->b);
    ls_metrics_free(&f->m);
    bt_tracker_free(&f->tr);
    ls_pool_free(f->p);
    ls_backend_free(f->fk->be);
}

/* The slot of name, -1 when it is not resident. */
static int bt_slot_of(ls_pool *p, const char *name) {
    ls_adapter_info info;
    assert_int_equal(ls_pool_describe(p, name, &info, NULL), LS_OK);
    return info.slot;
}

/* Jobs queued behind a blocked one, with the batch cap reached, go out in
 * one backend call; each gets exactly its own rows and adapters. */
static void test_coalesces_queued_jobs(void **state) {
    (void)state;
    bt_fx f;
    bt_fx_make(&f, 8, 5 * 1000 * 1000, 1000);
    const char *ab[] = {"a", "b"}, *c[] = {"c"}, *bd[] = {"b", NULL, "d"};
    bt_job blocker, j[4];
    bt_job_init(&blocker, &f.tr, 0, 8, NULL, 0, false, 1);
    bt_job_init(&j[0], &f.tr, 0, 2, ab, 2, true, 2);
    bt_job_init(&j[1], &f.tr, 0, 1, c, 1, false, 3);
    bt_job_init(&j[2], &f.tr, 0, 3, bd, 3, true, 4);
    bt_job_init(&j[3], &f.tr, 0, 2, NULL, 0, true, 5);

    /* The blocker fills a batch on its own: the worker takes it at once
     * and waits inside the backend while the others queue. */
    pt_fake_gate(f.fk, true);
    assert_int_equal(bt_submit(f.b, &blocker), LS_OK);
    pt_fake_wait_blocked(f.fk, 1);
    for (int i = 0; i < 4; i++) assert_int_equal(bt_submit(f.b, &j[i]), LS_OK);
    assert_int_equal(f.m.queue_depth, 4);
    pt_fake_gate(f.fk, false);
    bt_wait_done(&f.tr, 5);

    /* 2 + 1 + 3 + 2 = 8 tokens: one merged call after the blocker's. */
    assert_int_equal(atomic_load(&f.fk->forwards), 2);
    assert_int_equal(f.m.batches, 2);
    assert_int_equal(f.m.batch_requests_sum, 1 + 4);
    assert_int_equal(f.m.batch_tokens_sum, 8 + 8);
    assert_int_equal(f.m.queue_depth, 0);
    assert_int_equal(j[0].job.n_used, 2);
    assert_string_equal(j[0].job.used[0].name, "a");
    assert_string_equal(j[0].job.used[1].name, "b");
    assert_int_equal(j[2].job.n_used, 2); /* its own b and d, not a or c */
    assert_string_equal(j[2].job.used[0].name, "b");
    assert_string_equal(j[2].job.used[1].name, "d");
    assert_int_equal(j[3].job.n_used, 0);
    /* Stop the worker before counting: no done() can come after. */
    ls_batcher_free(f.b);
    f.b = NULL;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(atomic_load(&j[i].done_calls), 1);
        bt_expect_alone(f.p, &j[i]);
    }
    assert_int_equal(atomic_load(&blocker.done_calls), 1);
    bt_expect_alone(f.p, &blocker);
    bt_fx_free(&f);
    for (int i = 0; i < 4; i++) bt_job_free(&j[i]);
    bt_job_free(&blocker);
}

/* With a gate, a call carries gammas for every token or for none (a token
 * without them takes the gate, which only the engine computes): the
 * queued jobs go out in two calls, those with gammas and those without,
 * each in arrival order, where an ungated model merges all four. */
static void test_gated_keeps_gammas_apart(void **state) {
    (void)state;
    for (int gate = 0; gate < 2; gate++) {
        bt_fx f;
        bt_fx_make_gate(&f, 16, 5 * 1000 * 1000, 1000, gate);
        const char *a[] = {"a"}, *b[] = {"b"};
        bt_job blocker, j[4];
        bt_job_init(&blocker, &f.tr, 0, 16, NULL, 0, false, 20);
        bt_job_init(&j[0], &f.tr, 0, 2, a, 1, true, 21);
        bt_job_init(&j[1], &f.tr, 0, 3, b, 1, false, 22);
        bt_job_init(&j[2], &f.tr, 0, 1, NULL, 0, true, 23);
        bt_job_init(&j[3], &f.tr, 0, 2, a, 1, false, 24);
        pt_fake_gate(f.fk, true);
        assert_int_equal(bt_submit(f.b, &blocker), LS_OK);
        pt_fake_wait_blocked(f.fk, 1);
        for (int i = 0; i < 4; i++) assert_int_equal(bt_submit(f.b, &j[i]), LS_OK);
        pt_fake_gate(f.fk, false);
        bt_wait_done(&f.tr, 5);
        assert_int_equal(atomic_load(&f.fk->forwards), gate ? 3 : 2);
        assert_int_equal(f.m.batch_requests_sum, gate ? 1 + 2 + 2 : 1 + 4);
        ls_batcher_free(f.b);
        f.b = NULL;
        for (int i = 0; i < 4; i++) {
            assert_int_equal(atomic_load(&j[i].done_calls), 1);
            bt_expect_alone(f.p, &j[i]);
        }
        bt_fx_free(&f);
        for (int i = 0; i < 4; i++) bt_job_free(&j[i]);
        bt_job_free(&blocker);
    }
}

/* A batch holds one layer, up to the token cap; the rest waits for the
 * next batch. */
static void test_layers_and_cap(void **state) {
    (void)state;
    bt_fx f;
    bt_fx_make(&f, 6, 20 * 1000, 1000);
    const char *a[] = {"a"}, *b[] = {"b"};
    bt_job blocker, j[4];
    bt_job_init(&blocker, &f.tr, 1, 6, NULL, 0, false, 10);
    bt_job_init(&j[0], &f.tr, 0, 3, a, 1, true, 11); /* batch 1 */
    bt_job_init(&j[1], &f.tr, 1, 2, b, 1, true, 12); /* batch 2: another layer */
    bt_job_init(&j[2], &f.tr, 0, 3, b, 1, false, 13); /* batch 1: 3 + 3 = the cap */
    bt_job_init(&j[3], &f.tr, 0, 1, a, 1, true, 14); /* batch 3: past the cap */
    pt_fake_gate(f.fk, true);
    assert_int_equal(bt_submit(f.b, &blocker), LS_OK);
    pt_fake_wait_blocked(f.fk, 1);
    for (int i = 0; i < 4; i++) assert_int_equal(bt_submit(f.b, &j[i]), LS_OK);
    pt_fake_gate(f.fk, false);
    bt_wait_done(&f.tr, 5);
    assert_int_equal(atomic_load(&f.fk->forwards), 4);
    assert_int_equal(f.m.batches, 4);
    assert_int_equal(f.m.batch_requests_sum, 1 + 2 + 1 + 1);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(atomic_load(&j[i].done_calls), 1);
        bt_expect_alone(f.p, &j[i]);
    }
    bt_fx_free(&f);
    for (int i = 0; i < 4; i++) bt_job_free(&j[i]);
    bt_job_free(&blocker);
}

/* One job names an adapter that does not exist: the merged call fails, so
 * every job runs alone and only that one gets LS_ADAPTER_NOT_FOUND. */
static void test_unknown_adapter_fails_one_job(void **state) {
    (void)state;
    bt_fx f;
    bt_fx_make(&f, 6, 5 * 1000 * 1000, 1000);
    const char *a[] = {"a"}, *bad[] = {"b", "zzz"}, *c[] = {"c"};
    bt_job blocker, j[3];
    bt_job_init(&blocker, &f.tr, 0, 6, NULL, 0, false, 20);
    bt_job_init(&j[0], &f.tr, 0, 2, a, 1, true, 21);
    bt_job_init(&j[1], &f.tr, 0, 2, bad, 2, true, 22);
    bt_job_init(&j[2], &f.tr, 0, 2, c, 1, true, 23);
    pt_fake_gate(f.fk, true);
    assert_int_equal(bt_submit(f.b, &blocker), LS_OK);
    pt_fake_wait_blocked(f.fk, 1);
    for (int i = 0; i < 3; i++) assert_int_equal(bt_submit(f.b, &j[i]), LS_OK);
    pt_fake_gate(f.fk, false);
    bt_wait_done(&f.tr, 4);
    assert_int_equal(j[1].job.status, LS_ADAPTER_NOT_FOUND);
    assert_int_equal(j[1].job.err.code, LS_ADAPTER_NOT_FOUND);
    assert_non_null(strstr(j[1].job.err.message, "zzz"));
    bt_expect_alone(f.p, &j[0]);
    bt_expect_alone(f.p, &j[2]);
    for (int i = 0; i < 3; i++) assert_int_equal(atomic_load(&j[i].done_calls), 1);
    bt_fx_free(&f);
    for (int i = 0; i < 3; i++) bt_job_free(&j[i]);
    bt_job_free(&blocker);
}

/* A merged call that fails (a slot write fails while it loads one job's
 * adapter) is served again job by job: no job answers with an error that
 * was not its own, and a passing fault costs nobody anything. */
static void test_failed_batch_isolates_the_job(void **state) {
    (void)state;
    bt_fx f;
    bt_fx_make(&f, 4, 5 * 1000 * 1000, 1000);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(pt_load(f.p, &D, "e", BT_RANK, ls_fnv1a64("e"), false, false, NULL, NULL, &err), LS_OK);
    const char *a[] = {"a"}, *e[] = {"e"};
    bt_job blocker, j[2];
    bt_job_init(&blocker, &f.tr, 0, 4, NULL, 0, false, 30);
    bt_job_init(&j[0], &f.tr, 0, 2, a, 1, true, 31);
    bt_job_init(&j[1], &f.tr, 0, 2, e, 1, true, 32);
    /* Loading e evicted one of a..d; a forward of all four evicts e. */
    const char *others[] = {"a", "b", "c", "d"};
    float x[4 * 6] = {0}, y[4 * 6];
    ls_pool_used used[4];
    int n_used;
    assert_int_equal(pc_pool_forward(f.p, 0, 4, x, NULL, others, y, used, &n_used, &err), LS_OK);
    assert_int_equal(bt_slot_of(f.p, "e"), -1);
    pt_fake_gate(f.fk, true);
    assert_int_equal(bt_submit(f.b, &blocker), LS_OK);
    pt_fake_wait_blocked(f.fk, 1);
    for (int i = 0; i < 2; i++) assert_int_equal(bt_submit(f.b, &j[i]), LS_OK);
    /* The merged call's write of e fails; e's own retry writes it. */
    const int writes = atomic_load(&f.fk->slot_writes);
    atomic_store(&f.fk->fail_write_in, 1);
    pt_fake_gate(f.fk, false);
    bt_wait_done(&f.tr, 3);
    assert_int_equal(blocker.job.status, LS_OK);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(j[i].job.status, LS_OK);
        assert_int_equal(j[i].job.err.code, LS_OK);
        assert_int_equal(atomic_load(&j[i].done_calls), 1);
    }
    assert_true(atomic_load(&f.fk->slot_writes) >= writes + 1 + D.L); /* the failed write, then the retry of every layer */
    ls_error_free(&err);
    bt_fx_free(&f);
    for (int i = 0; i < 2; i++) bt_job_free(&j[i]);
    bt_job_free(&blocker);
}

/* The queue holds at most max_queue_tokens: a job that would go over is
 * refused with LS_OVERLOADED and done() is not called; one bigger than
 * the whole queue still runs when the queue is empty. */
static void test_queue_limit(void **state) {
    (void)state;
    bt_fx f;
    bt_fx_make(&f, 1, 0, 4);
    bt_job blocker, j[5];
    const char *a[] = {"a"};
    bt_job_init(&blocker, &f.tr, 0, 1, NULL, 0, false, 40);
    bt_job_init(&j[0], &f.tr, 0, 3, a, 1, true, 41); /* queued: 3 */
    bt_job_init(&j[1], &f.tr, 0, 2, a, 1, true, 42); /* 3 + 2 > 4: refused */
    bt_job_init(&j[2], &f.tr, 0, 1, a, 1, true, 43); /* 3 + 1 = 4: queued */
    bt_job_init(&j[3], &f.tr, 0, 1, NULL, 0, true, 44); /* full: refused */
    bt_job_init(&j[4], &f.tr, 0, 9, a, 1, true, 45); /* alone in an empty queue: runs */
    pt_fake_gate(f.fk, true);
    assert_int_equal(bt_submit(f.b, &blocker), LS_OK);
    pt_fake_wait_blocked(f.fk, 1);
    assert_int_equal(bt_submit(f.b, &j[0]), LS_OK);
    assert_int_equal(bt_submit(f.b, &j[1]), LS_OVERLOADED);
    assert_int_equal(ls_http_status(LS_OVERLOADED), 429);
    assert_int_equal(bt_submit(f.b, &j[2]), LS_OK);
    assert_int_equal(bt_submit(f.b, &j[3]), LS_OVERLOADED);
    assert_int_equal(f.m.rejected_overload, 2);
    assert_int_equal(f.m.queue_depth, 2);
    pt_fake_gate(f.fk, false);
    bt_wait_done(&f.tr, 3);

    /* The queue is empty again: a job over the whole limit is taken. */
    assert_int_equal(bt_submit(f.b, &j[4]), LS_OK);
    bt_wait_done(&f.tr, 4);
    ls_batcher_free(f.b);
    f.b = NULL;
    assert_int_equal(atomic_load(&j[0].done_calls), 1);
    assert_int_equal(atomic_load(&j[1].done_calls), 0);
    assert_int_equal(atomic_load(&j[2].done_calls), 1);
    assert_int_equal(atomic_load(&j[3].done_calls), 0);
    assert_int_equal(atomic_load(&j[4].done_calls), 1);
    bt_expect_alone(f.p, &j[0]);
    bt_expect_alone(f.p, &j[2]);
    bt_expect_alone(f.p, &j[4]);
    bt_fx_free(&f);
    for (int i = 0; i < 5; i++) bt_job_free(&j[i]);
    bt_job_free(&blocker);
}

/* ls_batcher_run: submit and wait. */
static void test_run_blocking(void **state) {
    (void)state;
    bt_fx f;
    bt_fx_make(&f, 16, 1000, 64);
    const char *names[] = {"d", NULL, "a"};
    bt_job j;
    bt_job_init(&j, &f.tr, 1, 5, names, 3, true, 50);
    assert_int_equal(ls_batcher_run(f.b, &j.job), LS_OK);
    assert_int_equal(atomic_load(&j.done_calls), 0); /* run replaces done() with its own */
    bt_expect_alone(f.p, &j);
    bt_fx_free(&f);
    bt_job_free(&j);
}

/* Submits a then, 50 ms later, b: merged only if the batcher held a open. */
static void bt_submit_apart(bt_fx *f, bt_job *a, bt_job *b) {
    const int done = f->tr.total + 2; /* nothing else is in flight */
    assert_int_equal(bt_submit(f->b, a), LS_OK);
    usleep(50000);
    assert_int_equal(atomic_load(&a->done_calls), 0); /* still held */
    assert_int_equal(bt_submit(f->b, b), LS_OK);
    bt_wait_done(&f->tr, done);
}

/* When a batch is held open for more (--batch-wait-us, here 5 s): a job
 * that finds the server idle runs at once; one announced as arriving
 * holds the batch until it is submitted (or given up); right after a
 * merged batch the next waits until as many are queued again. */
static void test_waits_only_for_company(void **state) {
    (void)state;
    bt_fx f;
    bt_fx_make(&f, 64, 5 * 1000 * 1000, 1000);
    const char *a[] = {"a"}, *b[] = {"b"};
    bt_job lone[2], j[4];
    for (int i = 0; i < 2; i++) bt_job_init(&lone[i], &f.tr, 0, 2, a, 1, true, 70 + (uint64_t)i);
    for (int i = 0; i < 4; i++) bt_job_init(&j[i], &f.tr, 0, 1 + i % 2, i % 2 ? b : a, 1, i < 2, 72 + (uint64_t)i);
    assert_int_equal(ls_batcher_run(f.b, &lone[0].job), LS_OK);
    ls_batcher_arriving(f.b);
    assert_int_equal(f.m.receiving, 1);
    ls_batcher_arrived(f.b); /* its client went away */
    assert_int_equal(f.m.receiving, 0);
    assert_int_equal(ls_batcher_run(f.b, &lone[1].job), LS_OK);
    assert_int_equal(f.m.batches, 2);
    assert_int_equal(f.m.batch_waits, 0);

    ls_batcher_arriving(f.b); /* j[1]'s body is being read */
    j[1].job.arriving = true;
    bt_submit_apart(&f, &j[0], &j[1]);
    assert_int_equal(f.m.receiving, 0);
    assert_int_equal(f.m.batches, 3);
    assert_int_equal(f.m.batch_requests_sum, 1 + 1 + 2);
    assert_int_equal(f.m.batch_waits, 1);

    bt_submit_apart(&f, &j[2], &j[3]); /* under load: as many as last time */
    assert_int_equal(f.m.batches, 4);
    assert_int_equal(f.m.batch_requests_sum, 1 + 1 + 2 + 2);
    assert_int_equal(f.m.batch_waits, 2);
    for (int i = 0; i < 2; i++) bt_expect_alone(f.p, &lone[i]);
    for (int i = 0; i < 4; i++) bt_expect_alone(f.p, &j[i]);
    bt_fx_free(&f);
    for (int i = 0; i < 2; i++) bt_job_free(&lone[i]);
    for (int i = 0; i < 4; i++) bt_job_free(&j[i]);

    /* Load is forgotten --batch-wait-us (here 100 ms) after the last
     * merged batch: a job after that finds the server idle. The merged
     * batch is made by holding the backend while two jobs queue, not by
     * bt_submit_apart: its 50 ms sleep, overrun on a busy machine,
     * outlasted a 100 ms hold and the first job ran alone. */
    bt_fx_make(&f, 64, 100 * 1000, 1000);
    bt_job held, k[3];
    bt_job_init(&held, &f.tr, 0, 2, NULL, 0, false, 79);
    for (int i = 0; i < 3; i++) bt_job_init(&k[i], &f.tr, 0, 1, a, 1, false, 80 + (uint64_t)i);
    pt_fake_gate(f.fk, true);
    assert_int_equal(bt_submit(f.b, &held), LS_OK);
    pt_fake_wait_blocked(f.fk, 1);
    assert_int_equal(bt_submit(f.b, &k[0]), LS_OK);
    assert_int_equal(bt_submit(f.b, &k[1]), LS_OK);
    pt_fake_gate(f.fk, false);
    bt_wait_done(&f.tr, 3);
    assert_int_equal(f.m.batches, 2);
    assert_int_equal(f.m.batch_requests_sum, 1 + 2);
    usleep(150000);
    assert_int_equal(ls_batcher_run(f.b, &k[2].job), LS_OK);
    assert_int_equal(f.m.batches, 3);
    assert_int_equal(f.m.batch_waits, 0); /* neither the merged batch nor k[2] was held open */
    bt_expect_alone(f.p, &held);
    for (int i = 0; i < 3; i++) bt_expect_alone(f.p, &k[i]);
    bt_fx_free(&f);
    bt_job_free(&held);
    for (int i = 0; i < 3; i++) bt_job_free(&k[i]);
}

/* Frees the batcher from another thread (it blocks until the queue has
 * run). */
static void *bt_free_thread(void *arg) {
    ls_batcher_free(arg);
    return NULL;
}

/* Freeing the batcher runs every queued job (done() once each) and
 * refuses submissions once it has begun. */
static void test_free_runs_pending(void **state) {
    (void)state;
    bt_fx f;
    bt_fx_make(&f, 2, 5 * 1000 * 1000, 1 << 20);
    const char *a[] = {"a"}, *b[] = {"b"};
    bt_job blocker, j[3];
    bt_job_init(&blocker, &f.tr, 0, 2, NULL, 0, false, 60);
    bt_job_init(&j[0], &f.tr, 0, 1, a, 1, true, 61);
    bt_job_init(&j[1], &f.tr, 1, 2, b, 1, true, 62);
    bt_job_init(&j[2], &f.tr, 0, 1, b, 1, false, 63);
    pt_fake_gate(f.fk, true);
    assert_int_equal(bt_submit(f.b, &blocker), LS_OK);
    pt_fake_wait_blocked(f.fk, 1);
    for (int i = 0; i < 3; i++) assert_int_equal(bt_submit(f.b, &j[i]), LS_OK);

    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, bt_free_thread, f.b), 0);
    /* Probe until the free has begun: probes accepted before that are
     * queued work like any other and must run too. The worker is held
     * inside the backend, so the batcher is still alive meanwhile. */
    enum { MAX_PROBES = 4096 };
    bt_job *probes = calloc(MAX_PROBES, sizeof *probes);
    assert_non_null(probes);
    int accepted = 0;
    for (;;) {
        assert_true(accepted < MAX_PROBES);
        bt_job_init(&probes[accepted], &f.tr, 0, 1, NULL, 0, false, 1000 + (uint64_t)accepted);
        if (bt_submit(f.b, &probes[accepted]) != LS_OK) break;
        accepted++;
        usleep(200);
    }
    pt_fake_gate(f.fk, false);
    assert_int_equal(pthread_join(th, NULL), 0);
    f.b = NULL; /* freed by the thread */

    assert_int_equal(atomic_load(&blocker.done_calls), 1);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(atomic_load(&j[i].done_calls), 1);
        bt_expect_alone(f.p, &j[i]);
    }
    for (int i = 0; i < accepted; i++) assert_int_equal(atomic_load(&probes[i].done_calls), 1);
    assert_int_equal(atomic_load(&probes[accepted].done_calls), 0); /* the refused one */
    assert_int_equal(f.tr.total, 4 + accepted);
    bt_fx_free(&f);
    for (int i = 0; i <= accepted; i++) bt_job_free(&probes[i]);
    free(probes);
    for (int i = 0; i < 3; i++) bt_job_free(&j[i]);
    bt_job_free(&blocker);
}

/* Jobs from many threads at once, through ls_batcher_run: every result is
 * the job run alone. */
typedef struct {
    ls_batcher *b;
    bt_job *jobs;
    int count;
    int failures;
} bt_thread_arg;

static void *bt_run_thread(void *arg) {
    bt_thread_arg *a = arg;
    for (int i = 0; i < a->count; i++)
        if (ls_batcher_run(a->b, &a->jobs[i].job) != LS_OK) a->failures++;
    return NULL;
}

static void test_concurrent_submitters(void **state) {
    (void)state;
    bt_fx f;
    bt_fx_make(&f, 16, 2000, 1 << 20);
    enum { THREADS = 4, PER = 25 };
    const char *mix[] = {"a", NULL, "b", "c", "d"};
    bt_job *jobs = calloc(THREADS * PER, sizeof *jobs);
    assert_non_null(jobs);
    bt_thread_arg args[THREADS];
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        for (int i = 0; i < PER; i++) {
            int k = t * PER + i;
            bt_job_init(&jobs[k], &f.tr, k % D.L, 1 + k % 4, mix + k % 5, 5 - k % 5, k % 3 != 0, 100 + (uint64_t)k);
        }
        args[t] = (bt_thread_arg){.b = f.b, .jobs = jobs + t * PER, .count = PER};
        assert_int_equal(pthread_create(&th[t], NULL, bt_run_thread, &args[t]), 0);
    }
    for (int t = 0; t < THREADS; t++) {
        assert_int_equal(pthread_join(th[t], NULL), 0);
        assert_int_equal(args[t].failures, 0);
    }
    assert_int_equal(atomic_load(&f.fk->overlaps), 0);
    assert_true((int)f.m.batches <= THREADS * PER);
    for (int k = 0; k < THREADS * PER; k++) bt_expect_alone(f.p, &jobs[k]);
    bt_fx_free(&f);
    for (int k = 0; k < THREADS * PER; k++) bt_job_free(&jobs[k]);
    free(jobs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_coalesces_queued_jobs),
        cmocka_unit_test(test_layers_and_cap),
        cmocka_unit_test(test_gated_keeps_gammas_apart),
        cmocka_unit_test(test_unknown_adapter_fails_one_job),
        cmocka_unit_test(test_failed_batch_isolates_the_job),
        cmocka_unit_test(test_queue_limit),
        cmocka_unit_test(test_run_blocking),
        cmocka_unit_test(test_waits_only_for_company),
        cmocka_unit_test(test_free_runs_pending),
        cmocka_unit_test(test_concurrent_submitters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
