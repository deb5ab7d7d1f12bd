/* Uploads with --state-dir on a disk whose syncs are slow (the slow_fsync
 * shim, LD_PRELOAD'ed into the server) do not hold forwards: while an
 * upload's sync is known to be in progress (the shim holds it and says
 * so), forwards naming resident adapters, base tokens and the very
 * adapter being replaced complete, and the upload still gets its 201
 * once its syncs are done. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/tiny_server.h"

static tiny_server ts;
static char *state_dir, *shim_dir;

/* Bytes in shim_dir/file: how many syncs have entered or left a hold. */
static long shim_count(const char *file) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", shim_dir, file);
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : 0;
}

static void shim_hold(bool on) {
    char path[4096];
    snprintf(path, sizeof path, "%s/hold", shim_dir);
    if (on) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fclose(f);
    } else {
        assert_int_equal(unlink(path), 0);
    }
}

typedef struct {
    json_t *body;
    long status;
} upload_job;

static void *upload_run(void *arg) {
    upload_job *j = arg;
    char *text = json_dumps(j->body, JSON_COMPACT);
    ls_test_response r;
    j->status = ls_test_http(ts.srv, "POST", "/adapters", NULL, text, strlen(text), NULL, &r) == 0 ? r.status : -1;
    if (j->status >= 0) ls_test_response_free(&r);
    free(text);
    return NULL;
}

/* Starts an upload of name (a replace when asked) while the shim holds
 * syncs, waits (bounded) until one of its syncs is held, then runs
 * forwards: each must complete with that sync still held. */
static void upload_while_forwarding(const char *name, bool replace, const char *resident) {
    const long entered = shim_count("entered"), released = shim_count("released");
    upload_job job = {.body = tiny_adapter_inline(&ts, name, NULL)};
    if (replace) json_object_set_new(job.body, "replace", json_true());
    shim_hold(true);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, upload_run, &job), 0);
    for (int i = 0; i < 1000 && shim_count("entered") == entered; i++) usleep(10000);
    assert_true(shim_count("entered") > entered);
    tiny_check_forward(&ts, resident, "interleaved");
    if (replace) tiny_check_forward(&ts, name, "interleaved"); /* the old version */
    /* Still inside the upload's sync: the forwards did not wait for it. */
    assert_int_equal(shim_count("released"), released);
    shim_hold(false);
    pthread_join(th, NULL);
    json_decref(job.body);
    assert_int_equal(job.status, 201);
    tiny_check_forward(&ts, name, "interleaved");
}

static void test_forwards_not_held_by_upload_syncs(void **state) {
    (void)state;
    char preload[4096], shim_env[4096];
    snprintf(preload, sizeof preload, "LD_PRELOAD=%s", LS_SLOW_FSYNC_LIB);
    snprintf(shim_env, sizeof shim_env, "LS_SLOW_FSYNC_DIR=%s", shim_dir);
    /* A sanitizer runtime wants to come first in the link order; the shim
     * only wraps two calls its checks do not need. */
    char asan[4096];
    const char *was = getenv("ASAN_OPTIONS");
    snprintf(asan, sizeof asan, "ASAN_OPTIONS=%s%sverify_asan_link_order=0", was ? was : "", was ? ":" : "");
    const char *env[] = {preload, shim_env, asan, NULL};
    const char *extra[] = {"--state-dir", state_dir, "--slots", "4", "--log-level", "warn", NULL};
    assert_true(tiny_server_start_env(&ts, "interleaved", extra, env));
    json_t *a = tiny_adapter_inline(&ts, "warm", NULL);
    json_decref(tiny_post_json(&ts, "/adapters", a, 201));
    json_decref(a);
    tiny_check_forward(&ts, "warm", "interleaved");
    /* A new name, then a replace of it: the replace writes its new version
     * into the old one's slot, which forwards naming the old version must
     * not be served from while the sync runs. */
    upload_while_forwarding("fresh", false, "warm");
    upload_while_forwarding("fresh", true, "warm");
    tiny_server_stop(&ts);
}

static int setup(void **state) {
    (void)state;
    state_dir = ls_test_mkdtemp();
    shim_dir = ls_test_mkdtemp();
    return state_dir && shim_dir ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ls_test_rmtree(state_dir);
    ls_test_rmtree(shim_dir);
    free(state_dir);
    free(shim_dir);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forwards_not_held_by_upload_syncs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
