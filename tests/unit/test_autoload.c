/* lora/autoload in-process, where HTTP cannot reach: many requests
 * racing for one unloaded adapter read its file once, round after round;
 * a server short of file descriptors answers 500 and is not remembered
 * against the file, which loads once descriptors are back; the check an
 * HTTP thread makes never reads a file nor loads one; a load split in
 * its two halves (read on one thread, registered on another) reads the
 * file once, also when racing requests take either path, and what the
 * first half read is registered by the second whatever happened between
 * them (or by ls_autoload_finish, which reads nothing). */
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "format/safetensors.h"
#include "lora/autoload.h"
#include "server/http_status.h"
#include "server/server.h"
#include "tests/util/adapter_fixture.h"
#include "tests/util/testutil.h"

static char *dir;
static ls_config cfg;
static ls_server srv;

/* A valid adapter of the tiny model as dir/NAME.safetensors. */
static int write_good(const char *name) {
    ls_dims d = tu_tiny_dims(1);
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    tu_add_peft_layer(&s, NULL, &d, 0, 2, 0);
    ls_tensor_set_add_meta(&s, "lora_alpha", "2"); /* an alpha must be stated */
    uint8_t *bytes;
    size_t len;
    const ls_status st = ls_safetensors_write(&s, &bytes, &len, NULL);
    ls_tensor_set_free(&s);
    if (st != LS_OK) return -1;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, name);
    ls_test_write_file(path, bytes, len);
    free(bytes);
    return 0;
}

/* A server on the tiny model (n=2, H=4, F=3, one layer) with --auto-load
 * over a temporary adapter directory holding c.safetensors. */
static int setup(void **state) {
    (void)state;
    dir = ls_test_mkdtemp();
    if (write_good("c")) return -1;
    char *argv[] = {"lorasink", "--experts", "2", "--hidden", "4", "--intermediate", "3", "--layers", "1",
                    "--max-rank", "4", "--slots", "4", "--threads", "1", "--adapter-dir", dir, "--auto-load", NULL};
    char *envp[] = {NULL};
    char err[512];
    if (ls_config_load(&cfg, 18, argv, envp, stdout, err, sizeof err) != LS_CONFIG_RUN) return -1;
    return ls_server_init(&srv, &cfg) && srv.autoload ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ls_server_free(&srv);
    ls_test_rmtree(dir);
    free(dir);
    return 0;
}

enum { RACERS = 16 };
static pthread_barrier_t start;
static ls_status outcome[RACERS];

static void *racer(void *arg) {
    int i = (int)(intptr_t)arg;
    pthread_barrier_wait(&start);
    ls_error err;
    ls_error_init(&err);
    outcome[i] = ls_autoload_ensure(srv.autoload, "c", &err);
    ls_error_free(&err);
    return NULL;
}

/* As a forward does: the first half where it may read, then ensure. */
static void *split_racer(void *arg) {
    int i = (int)(intptr_t)arg;
    pthread_barrier_wait(&start);
    ls_error err;
    ls_error_init(&err);
    ls_autoload_need need;
    outcome[i] = ls_autoload_read(srv.autoload, "c", &need, &err);
    if (outcome[i] == LS_OK && need != LS_AUTOLOAD_READY) outcome[i] = ls_autoload_ensure(srv.autoload, "c", &err);
    ls_error_free(&err);
    return NULL;
}

/* 40 rounds: the adapter is deleted, 16 threads ask for it at once (with
 * split, every other one in two halves); all succeed, the file is read
 * exactly once, and the adapter ends registered. */
static void race_rounds(bool split) {
    for (int round = 0; round < 40; round++) {
        ls_pool_delete(srv.pool, "c", NULL, NULL);
        const unsigned long long before = ls_autoload_attempts(srv.autoload);
        pthread_barrier_init(&start, NULL, RACERS);
        pthread_t th[RACERS];
        for (int i = 0; i < RACERS; i++)
            assert_int_equal(
                pthread_create(&th[i], NULL, split && i % 2 ? split_racer : racer, (void *)(intptr_t)i), 0);
        for (int i = 0; i < RACERS; i++) pthread_join(th[i], NULL);
        pthread_barrier_destroy(&start);
        for (int i = 0; i < RACERS; i++) assert_int_equal(outcome[i], LS_OK);
        if (ls_autoload_attempts(srv.autoload) != before + 1)
            fail_msg("round %d: %llu reads of one file", round, ls_autoload_attempts(srv.autoload) - before);
        assert_int_equal(ls_pool_describe(srv.pool, "c", NULL, NULL), LS_OK);
    }
}

static void test_one_read_per_round(void **state) {
    (void)state;
    race_rounds(false);
}

/* Whoever finds the adapter read registers it; nobody waits for a
 * registration that is not running. */
static void test_split_loads_race(void **state) {
    (void)state;
    race_rounds(true);
}

/* With the descriptor table full the load is the server's failure (500),
 * not the file's: the next request reads the file and succeeds. */
static void test_out_of_descriptors_not_remembered(void **state) {
    (void)state;
    ls_pool_delete(srv.pool, "c", NULL, NULL);
    struct rlimit saved;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &saved), 0);
    struct rlimit low = {.rlim_cur = 256, .rlim_max = saved.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    int fds[256], n = 0;
    for (int fd; n < 256 && (fd = dup(0)) >= 0;) fds[n++] = fd;
    ls_error err;
    ls_error_init(&err);
    const ls_status st = ls_autoload_ensure(srv.autoload, "c", &err);
    for (int i = 0; i < n; i++) close(fds[i]);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved), 0);
    assert_int_equal(st, LS_INTERNAL);
    assert_int_equal(ls_http_status(st), 500);
    ls_error_free(&err);
    ls_error_init(&err);
    const unsigned long long before = ls_autoload_attempts(srv.autoload);
    assert_int_equal(ls_autoload_ensure(srv.autoload, "c", &err), LS_OK);
    assert_int_equal(ls_autoload_attempts(srv.autoload), before + 1);
    ls_error_free(&err);
}

/* ls_autoload_check, what an HTTP thread asks: a load is needed (not
 * done), a missing file is 404 and a remembered bad file its 422, and no
 * file is read for any of them. */
static void test_check_never_loads(void **state) {
    (void)state;
    ls_pool_delete(srv.pool, "c", NULL, NULL);
    char path[1024];
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    ls_test_write_file(path, "not a safetensors file", 22);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_http_status(ls_autoload_ensure(srv.autoload, "bad", &err)), 422);
    ls_error_free(&err);

    const unsigned long long before = ls_autoload_attempts(srv.autoload);
    ls_autoload_need need = LS_AUTOLOAD_READY;
    ls_error_init(&err);
    assert_int_equal(ls_autoload_check(srv.autoload, "c", &need, &err), LS_OK);
    assert_int_equal(need, LS_AUTOLOAD_READ);
    assert_int_not_equal(ls_pool_describe(srv.pool, "c", NULL, NULL), LS_OK);

    assert_int_equal(ls_http_status(ls_autoload_check(srv.autoload, "bad", &need, &err)), 422);
    assert_int_equal(need, LS_AUTOLOAD_READY);
    ls_error_free(&err);
    ls_error_init(&err);
    assert_int_equal(ls_autoload_check(srv.autoload, "absent", &need, &err), LS_ADAPTER_NOT_FOUND);
    assert_int_equal(ls_autoload_attempts(srv.autoload), before);
    ls_error_free(&err);

    ls_error_init(&err);
    assert_int_equal(ls_autoload_ensure(srv.autoload, "c", &err), LS_OK);
    assert_int_equal(ls_autoload_check(srv.autoload, "c", &need, &err), LS_OK);
    assert_int_equal(need, LS_AUTOLOAD_READY);
    assert_int_equal(ls_autoload_attempts(srv.autoload), before + 1);
    ls_error_free(&err);
}

/* The first half reads and validates but registers nothing; the second
 * registers what was read without reading again. A bad file is answered
 * by the first half and remembered. */
static void test_read_then_register(void **state) {
    (void)state;
    ls_pool_delete(srv.pool, "c", NULL, NULL);
    const unsigned long long before = ls_autoload_attempts(srv.autoload);
    ls_autoload_need need = LS_AUTOLOAD_READY;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_autoload_read(srv.autoload, "c", &need, &err), LS_OK);
    assert_int_equal(need, LS_AUTOLOAD_LOAD);
    assert_int_equal(ls_autoload_attempts(srv.autoload), before + 1);
    assert_int_not_equal(ls_pool_describe(srv.pool, "c", NULL, NULL), LS_OK);
    /* Read already: a second reader leaves it to the registration. */
    assert_int_equal(ls_autoload_read(srv.autoload, "c", &need, &err), LS_OK);
    assert_int_equal(need, LS_AUTOLOAD_WAIT);
    assert_int_equal(ls_autoload_check(srv.autoload, "c", &need, &err), LS_OK);
    assert_int_equal(need, LS_AUTOLOAD_WAIT);
    assert_int_equal(ls_autoload_ensure(srv.autoload, "c", &err), LS_OK);
    assert_int_equal(ls_pool_describe(srv.pool, "c", NULL, NULL), LS_OK);
    assert_int_equal(ls_autoload_attempts(srv.autoload), before + 1);

    char path[1024];
    snprintf(path, sizeof path, "%s/bad2.safetensors", dir);
    ls_test_write_file(path, "also not a safetensors file", 27);
    assert_int_equal(ls_http_status(ls_autoload_read(srv.autoload, "bad2", &need, &err)), 422);
    assert_int_equal(need, LS_AUTOLOAD_READY);
    ls_error_free(&err);
    ls_error_init(&err);
    assert_int_equal(ls_http_status(ls_autoload_check(srv.autoload, "bad2", &need, &err)), 422);
    assert_int_equal(ls_autoload_attempts(srv.autoload), before + 2);
    ls_error_free(&err);
}

static int64_t loads_running(void) {
    pthread_mutex_lock(&srv.metrics.lock);
    const int64_t n = srv.metrics.loads;
    pthread_mutex_unlock(&srv.metrics.lock);
    return n;
}

/* A read adapter is registered by the next ensure whatever happened
 * between the halves: a client registered the name (its adapter stays),
 * or the file went away (what was read is registered). Either way the
 * load ends, the loads gauge is back to 0, and nothing stays read to be
 * registered later in place of the files as they are by then. (Both
 * used to make ensure answer before it looked at the entry.) */
static void test_read_adapter_never_left(void **state) {
    (void)state;
    ls_autoload_need need;
    ls_error err;
    ls_error_init(&err);
    char path[1024];

    /* A client registers the name between the halves. */
    assert_int_equal(write_good("up"), 0);
    assert_int_equal(ls_autoload_read(srv.autoload, "up", &need, &err), LS_OK);
    assert_int_equal(need, LS_AUTOLOAD_LOAD);
    assert_int_equal(loads_running(), 1);
    ls_adapter a;
    ls_adapter_origin origin;
    ls_adapter_source src = {.path = "up.safetensors"};
    assert_int_equal(ls_loader_load(&srv.loader, &src, &a, &origin, &err), LS_OK);
    ls_adapter_info info;
    assert_int_equal(ls_pool_load(srv.pool, "up", &a, NULL, &info, &err), LS_OK);
    assert_int_equal(ls_autoload_ensure(srv.autoload, "up", &err), LS_OK);
    assert_int_equal(loads_running(), 0);
    ls_adapter_info now;
    assert_int_equal(ls_pool_describe(srv.pool, "up", &now, &err), LS_OK);
    assert_int_equal(now.version, info.version);
    assert_false(now.auto_loaded);
    /* Deleted, and its file bad now: the file is read again and refused. */
    assert_int_equal(ls_pool_delete(srv.pool, "up", NULL, &err), LS_OK);
    snprintf(path, sizeof path, "%s/up.safetensors", dir);
    ls_test_write_file(path, "not a safetensors file", 22);
    assert_int_equal(ls_http_status(ls_autoload_ensure(srv.autoload, "up", &err)), 422);
    ls_error_free(&err);
    ls_error_init(&err);

    /* The file goes away between the halves. */
    assert_int_equal(write_good("gone"), 0);
    assert_int_equal(ls_autoload_read(srv.autoload, "gone", &need, &err), LS_OK);
    assert_int_equal(loads_running(), 1);
    snprintf(path, sizeof path, "%s/gone.safetensors", dir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(ls_autoload_ensure(srv.autoload, "gone", &err), LS_OK);
    assert_int_equal(loads_running(), 0);
    assert_int_equal(ls_pool_describe(srv.pool, "gone", &now, &err), LS_OK);
    assert_true(now.auto_loaded);
    ls_error_free(&err);
}

/* ls_autoload_finish registers a read adapter and does nothing else: no
 * file is read for a name that was not, and nothing is waited for. */
static void test_finish_registers_only_what_was_read(void **state) {
    (void)state;
    ls_autoload_need need;
    ls_error err;
    ls_error_init(&err);
    ls_pool_delete(srv.pool, "c", NULL, NULL);
    const unsigned long long before = ls_autoload_attempts(srv.autoload);
    assert_int_equal(ls_autoload_finish(srv.autoload, "c", &err), LS_OK);
    assert_int_not_equal(ls_pool_describe(srv.pool, "c", NULL, NULL), LS_OK);
    assert_int_equal(ls_autoload_attempts(srv.autoload), before);
    assert_int_equal(ls_autoload_read(srv.autoload, "c", &need, &err), LS_OK);
    assert_int_equal(need, LS_AUTOLOAD_LOAD);
    assert_int_equal(ls_autoload_finish(srv.autoload, "c", &err), LS_OK);
    assert_int_equal(ls_pool_describe(srv.pool, "c", NULL, NULL), LS_OK);
    assert_int_equal(ls_autoload_attempts(srv.autoload), before + 1);
    assert_int_equal(loads_running(), 0);
    ls_error_free(&err);
}

static atomic_bool toggling;

/* Writes and removes dir/flicker.safetensors until told to stop. */
static void *flicker(void *arg) {
    (void)arg;
    char path[1024];
    snprintf(path, sizeof path, "%s/flicker.safetensors", dir);
    while (atomic_load(&toggling)) {
        assert_int_equal(write_good("flicker"), 0);
        unlink(path);
    }
    return NULL;
}

/* A file that goes away between being found and being opened is 404, as
 * for a request a moment later (it was 400 invalid_request, "the path
 * does not exist", about a path the client never gave). */
static void test_vanishing_file_is_404(void **state) {
    (void)state;
    atomic_store(&toggling, true);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, flicker, NULL), 0);
    int ok = 0, missing = 0;
    for (int i = 0; i < 30000; i++) { /* the window is hit a few times in ten thousand */
        ls_error err;
        ls_error_init(&err);
        const ls_status st = ls_autoload_ensure(srv.autoload, "flicker", &err);
        if (st != LS_OK && st != LS_ADAPTER_NOT_FOUND && ls_http_status(st) != 422)
            fail_msg("round %d: %s (%s)", i, ls_status_code(st), err.message);
        ok += st == LS_OK;
        missing += st == LS_ADAPTER_NOT_FOUND;
        if (st == LS_OK) ls_pool_delete(srv.pool, "flicker", NULL, NULL);
        ls_error_free(&err);
    }
    atomic_store(&toggling, false);
    pthread_join(th, NULL);
    assert_true(ok + missing > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_read_per_round),
        cmocka_unit_test(test_out_of_descriptors_not_remembered),
        cmocka_unit_test(test_check_never_loads),
        cmocka_unit_test(test_read_then_register),
        cmocka_unit_test(test_split_loads_race),
        cmocka_unit_test(test_read_adapter_never_left),
        cmocka_unit_test(test_vanishing_file_is_404),
        cmocka_unit_test(test_finish_registers_only_what_was_read),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
