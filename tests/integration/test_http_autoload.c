/* --auto-load and the adapter named beside the body: a forward naming an
 * unregistered adapter found in the adapter directory (NAME/ or
 * NAME.safetensors) loads it once however many ask at once, says so in
 * GET /adapters, gives a bad file's error without reading it again until
 * it changes, refuses names that leave the directory; the adapter may be
 * named by the query or X-Lorasink-Adapter, and a body naming another is
 * a 400; a forward whose adapter is deleted between its load and its
 * batch loads it again. */
#include <pthread.h>
#include <sys/stat.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/testutil.h"
#include "tests/util/tiny_server.h"

static tiny_server ts;

static int setup(void **state) {
    (void)state;
    const char *extra[] = {"--auto-load", NULL};
    return tiny_server_start(&ts, "interleaved", extra) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tiny_server_stop(&ts);
    return 0;
}

/* The example's forward (x and gammas), with adapter_json spliced in
 * (e.g. "\"adapter\": \"a\"", or "" for none); the caller frees it. */
static char *forward_body(const char *adapter_json) {
    json_t *req = json_pack("{s:O, s:O}", "x", json_object_get(ts.tiny, "x"), "gammas",
                            json_object_get(ts.tiny, "gammas"));
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!adapter_json[0]) return text;
    size_t n = strlen(text) + strlen(adapter_json) + 2;
    char *out = malloc(n);
    assert_non_null(out);
    snprintf(out, n, "%.*s,%s}", (int)strlen(text) - 1, text, adapter_json);
    free(text);
    return out;
}

/* POST /forward; returns the status, the body in *out when out is given. */
static long forward(const char *path, const char *adapter_json, const char *const *headers, ls_test_response *out) {
    char *body = forward_body(adapter_json);
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "POST", path, NULL, body, strlen(body), headers, &r), 0);
    free(body);
    long st = r.status;
    if (out) *out = r;
    else ls_test_response_free(&r);
    return st;
}

static json_t *adapter_json(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "/adapters/%s", name);
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "GET", path, NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = ls_test_response_json(&r);
    ls_test_response_free(&r);
    return j;
}

static void test_loads_directory_and_file(void **state) {
    (void)state;
    tiny_write_peft_dir(&ts, "auto-dir", "{\"r\": 2, \"lora_alpha\": 4}");
    tiny_write_adapter_file(&ts, "auto-file.safetensors", "4");
    /* The first forward naming each loads it; the result is the example's. */
    tiny_check_forward(&ts, "auto-dir", "interleaved");
    tiny_check_forward(&ts, "auto-file", "interleaved");
    json_t *j = adapter_json("auto-dir");
    assert_true(json_is_true(json_object_get(j, "auto_loaded")));
    assert_string_equal(json_string_value(json_object_get(j, "source")), "auto-dir");
    assert_int_equal(json_integer_value(json_object_get(j, "version")), 1);
    assert_string_equal(json_string_value(json_object_get(j, "gate_up_order")), "gate_up");
    json_decref(j);
    /* The directory's config declares its row order; GET says which was used. */
    tiny_write_peft_dir(&ts, "auto-inter", "{\"r\": 2, \"lora_alpha\": 4, \"gate_up_order\": \"interleaved\"}");
    assert_int_equal(forward("/forward", "\"adapter\": \"auto-inter\"", NULL, NULL), 200);
    j = adapter_json("auto-inter");
    assert_string_equal(json_string_value(json_object_get(j, "gate_up_order")), "interleaved");
    json_decref(j);
    j = adapter_json("auto-file");
    assert_string_equal(json_string_value(json_object_get(j, "source")), "auto-file.safetensors");
    json_decref(j);
    assert_int_equal(ls_test_server_wait_output(ts.srv, "auto-load: adapter auto-dir v1 loaded"), 1);

    /* Nothing by that name: 404 that says where it looked. */
    ls_test_response r;
    assert_int_equal(forward("/forward", "\"adapter\": \"nowhere\"", NULL, &r), 404);
    assert_non_null(strstr(r.body, "adapter_not_found"));
    assert_non_null(strstr(r.body, "nowhere.safetensors"));
    assert_null(strstr(r.body, "did you mean"));
    ls_test_response_free(&r);
    /* A typo of a loaded adapter's name says which one was meant. */
    assert_int_equal(forward("/forward", "\"adapter\": \"auto_dir\"", NULL, &r), 404);
    assert_non_null(strstr(r.body, "auto_dir.safetensors; did you mean 'auto-dir'?"));
    ls_test_response_free(&r);
    /* Without tenants a name with a '/' is a subfolder of the directory,
     * no tenant's. */
    assert_int_equal(forward("/forward", "\"adapter\": \"org/nowhere\"", NULL, &r), 404);
    assert_non_null(strstr(r.body, "the adapter directory holds neither org/nowhere/"));
    assert_null(strstr(r.body, "tenant"));
    ls_test_response_free(&r);
    /* A deleted name whose file is gone says it was deleted, and offers
     * no live name in its place (a typo's "did you mean" would be
     * auto-dir). */
    char path[1024];
    snprintf(path, sizeof path, "%s/auto-file.safetensors", ts.dir);
    assert_int_equal(ls_test_http(ts.srv, "DELETE", "/adapters/auto-file", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    char moved[1040];
    snprintf(moved, sizeof moved, "%s.away", path);
    assert_int_equal(rename(path, moved), 0);
    assert_int_equal(forward("/forward", "\"adapter\": \"auto-file\"", NULL, &r), 404);
    assert_non_null(strstr(r.body, "it was deleted, or not restored at start-up; its last version was 1"));
    assert_null(strstr(r.body, "did you mean"));
    ls_test_response_free(&r);
    assert_int_equal(rename(moved, path), 0);
}

/* A bad file answers its validation error; the next request gets it again
 * without the file being read; once the file changes it is read again. */
static void test_bad_file_remembered(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/broken.safetensors", ts.dir);
    ls_test_write_file(path, "not safetensors at all", 22);
    for (int i = 0; i < 3; i++) {
        ls_test_response r;
        assert_int_equal(forward("/forward", "\"adapter\": \"broken\"", NULL, &r), 422);
        assert_non_null(strstr(r.body, "safetensors_invalid"));
        ls_test_response_free(&r);
    }
    assert_int_equal(ls_test_server_wait_output(ts.srv, "auto-load: adapter broken from broken.safetensors failed"), 1);
    tiny_write_adapter_file(&ts, "broken.safetensors", "4");
    tiny_check_forward(&ts, "broken", "interleaved");
    assert_int_equal(ls_test_server_wait_output(ts.srv, "auto-load: adapter broken from broken.safetensors failed"), 1);
}

/* A link out of the directory is refused like a path upload's. */
static void test_escape_refused(void **state) {
    (void)state;
    tiny_make_escape_link(&ts, "evil");
    assert_int_equal(forward("/forward", "\"adapter\": \"evil\"", NULL, NULL), 400);
    assert_int_equal(forward("/forward", "\"adapter\": \"../evil\"", NULL, NULL), 400);
}

/* A NAME that is a link out (or dangling) does not hide
 * NAME.safetensors: the file is what loads. */
static void test_link_out_does_not_hide_the_file(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/shadow", ts.dir);
    assert_int_equal(symlink("/nonexistent/dangling", path), 0);
    tiny_write_adapter_file(&ts, "shadow.safetensors", "4");
    tiny_check_forward(&ts, "shadow", "interleaved");
}

/* NAME.safetensors that is no regular file (a FIFO, a link to a device)
 * is refused as a path upload of it is, not answered as absent ("holds
 * neither"); reading it never hangs the server. */
static void test_not_a_regular_file(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/pipe.safetensors", ts.dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    snprintf(path, sizeof path, "%s/zero.safetensors", ts.dir);
    assert_int_equal(symlink("/dev/zero", path), 0);
    const char *names[] = {"pipe", "zero"};
    for (int i = 0; i < 2; i++) {
        char adapter[64];
        snprintf(adapter, sizeof adapter, "\"adapter\": \"%s\"", names[i]);
        ls_test_response r;
        const long st = forward("/forward", adapter, NULL, &r);
        if (st != 400) fail_msg("%s: %ld %s", names[i], st, r.body);
        assert_null(strstr(r.body, "holds neither"));
        ls_test_response_free(&r);
    }
}

static void *forward_thread(void *arg) {
    long *status = arg;
    *status = forward("/forward", "\"adapter\": \"busy\"", NULL, NULL);
    return NULL;
}

/* Eight requests at once for one unloaded adapter: one load, all served. */
static void test_concurrent_requests_one_load(void **state) {
    (void)state;
    tiny_write_peft_dir(&ts, "busy", "{\"r\": 2, \"lora_alpha\": 4}");
    pthread_t th[8];
    long status[8];
    for (int i = 0; i < 8; i++) assert_int_equal(pthread_create(&th[i], NULL, forward_thread, &status[i]), 0);
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(status[i], 200);
    }
    assert_int_equal(ls_test_server_wait_output(ts.srv, "auto-load: adapter busy v1 loaded"), 1);
    json_t *j = adapter_json("busy");
    assert_int_equal(json_integer_value(json_object_get(j, "version")), 1);
    json_decref(j);
}

/* The y of a forward as text, to compare forms of one request. */
static char *y_of(const ls_test_response *r) {
    json_t *j = ls_test_response_json(r);
    assert_non_null(j);
    char *y = json_dumps(json_object_get(j, "y"), JSON_COMPACT);
    json_decref(j);
    return y;
}

static void test_adapter_beside_the_body(void **state) {
    (void)state;
    tiny_write_peft_dir(&ts, "routed", "{\"r\": 2, \"lora_alpha\": 4}");
    ls_test_response r;
    assert_int_equal(forward("/forward", "\"adapter\": \"routed\"", NULL, &r), 200);
    char *want = y_of(&r);
    ls_test_response_free(&r);

    const char *hdr[] = {"X-Lorasink-Adapter: routed", NULL};
    assert_int_equal(forward("/forward", "", hdr, &r), 200);
    char *got = y_of(&r);
    assert_string_equal(got, want);
    free(got);
    ls_test_response_free(&r);
    assert_int_equal(forward("/forward?adapter=routed", "", NULL, &r), 200);
    got = y_of(&r);
    assert_string_equal(got, want);
    free(got);
    ls_test_response_free(&r);
    /* The same name twice is fine; a body token on the base model too. */
    assert_int_equal(forward("/forward", "\"adapter\": \"routed\"", hdr, NULL), 200);
    assert_int_equal(forward("/forward", "\"adapters\": [\"routed\", null, \"routed\"]", hdr, NULL), 200);
    free(want);

    /* Disagreements are refused, naming both. */
    assert_int_equal(forward("/forward", "\"adapter\": \"auto-dir\"", hdr, &r), 400);
    assert_non_null(strstr(r.body, "X-Lorasink-Adapter"));
    assert_non_null(strstr(r.body, "auto-dir"));
    ls_test_response_free(&r);
    assert_int_equal(forward("/forward?adapter=auto-dir", "", hdr, &r), 400);
    assert_non_null(strstr(r.body, "different adapters"));
    ls_test_response_free(&r);
    const char *empty[] = {"X-Lorasink-Adapter;", NULL}; /* curl's way to send an empty header */
    assert_int_equal(forward("/forward", "", empty, NULL), 400);
}

/* Without --auto-load a file in the directory is not a registration. */
static void test_off_by_default(void **state) {
    (void)state;
    const char *args[] = {"--hidden", "8", "--intermediate", "4", "--layers", "1", "--adapter-dir", ts.dir, NULL};
    ls_test_server *s = ls_test_server_start(args);
    assert_non_null(s);
    const char *body = "{\"x\": [[1, 2, 3, 4, 5, 6, 7, 8]], \"adapter\": \"auto-dir\"}";
    ls_test_response r;
    assert_int_equal(ls_test_http(s, "POST", "/forward", NULL, body, strlen(body), NULL, &r), 0);
    assert_int_equal(r.status, 404);
    ls_test_response_free(&r);
    assert_int_equal(ls_test_server_stop(s), 0);
}

/* With --state-dir an auto-loaded adapter comes back after a restart as
 * what it was: auto-loaded, same version. */
static void test_state_dir_keeps_auto_loaded(void **state) {
    (void)state;
    tiny_write_peft_dir(&ts, "kept", "{\"r\": 2, \"lora_alpha\": 4}");
    char sdir[1024];
    snprintf(sdir, sizeof sdir, "%s/state", ts.dir);
    const char *args[48];
    int a = 0;
    for (; ts.args[a] && a < 40; a++) args[a] = ts.args[a];
    args[a++] = "--state-dir";
    args[a++] = sdir;
    args[a] = NULL;
    ls_test_server *keep = ts.srv;
    for (int round = 0; round < 2; round++) {
        ts.srv = ls_test_server_start(args);
        assert_non_null(ts.srv);
        if (round == 0) assert_int_equal(forward("/forward", "\"adapter\": \"kept\"", NULL, NULL), 200);
        json_t *j = adapter_json("kept");
        assert_true(json_is_true(json_object_get(j, "auto_loaded")));
        assert_int_equal(json_integer_value(json_object_get(j, "version")), 1);
        json_decref(j);
        assert_int_equal(ls_test_server_stop(ts.srv), 0);
    }
    ts.srv = keep;
}

/* A forward whose auto-loaded adapter is deleted after its load and
 * before its batch looks it up loads it again, as a forward after a
 * delete does (it answered 404 "not registered; load it first"). The
 * batch is held open by a client still sending a forward, so the delete
 * lands in that window every time. */
typedef struct {
    const ls_test_server *srv;
    const char *body;
    long status;
    long long version;
    char reply[600]; /* the start of the body */
} held_forward;

static void *held_forward_run(void *arg) {
    held_forward *h = arg;
    ls_test_response r;
    if (ls_test_http(h->srv, "POST", "/forward", NULL, h->body, strlen(h->body), NULL, &r) != 0) return NULL;
    h->status = r.status;
    snprintf(h->reply, sizeof h->reply, "%s", r.body ? r.body : "");
    json_t *j = ls_test_response_json(&r);
    json_t *used = j ? json_array_get(json_object_get(j, "adapters"), 0) : NULL;
    h->version = used ? json_integer_value(json_object_get(used, "version")) : -1;
    if (h->status != 200) fprintf(stderr, "forward: %ld %s\n", r.status, r.body);
    json_decref(j);
    ls_test_response_free(&r);
    return NULL;
}

/* A server that auto-loads, waits up to a second to fill a batch, and
 * has raced.safetensors; the body of a forward naming it (the caller's
 * to free). */
static char *raced_server(tiny_server *held) {
    const char *extra[] = {"--auto-load", "--batch-wait-us", "1000000", NULL};
    assert_true(tiny_server_start(held, "interleaved", extra));
    tiny_write_adapter_file(held, "raced.safetensors", "4");
    json_t *req = json_pack("{s:O, s:O, s:s}", "x", json_object_get(held->tiny, "x"), "gammas",
                            json_object_get(held->tiny, "gammas"), "adapter", "raced");
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    return body;
}

/* One round: registered is whether the adapter is already registered
 * when the forward arrives (then it goes straight to the batch) or is
 * auto-loaded by it; either way the delete lands before its batch. */
static void delete_before_the_batch(bool registered) {
    tiny_server held;
    char *body = raced_server(&held);
    if (registered) {
        held_forward first = {.srv = held.srv, .body = body, .status = -1};
        held_forward_run(&first); /* auto-loads it: version 1 */
        assert_int_equal(first.status, 200);
    }
    int slow = ls_test_open_receiving_forward(held.srv);
    assert_true(slow >= 0);
    held_forward h = {.srv = held.srv, .body = body, .status = -1};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, held_forward_run, &h), 0);
    /* Loaded and queued: the batch waits for the slow client. */
    assert_true(ls_test_wait_metric(held.srv, "lorasink_queue_depth", 1));
    ls_test_response r;
    assert_int_equal(ls_test_http(held.srv, "DELETE", "/adapters/raced", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    close(slow);
    pthread_join(t, NULL);
    assert_int_equal(h.status, 200);
    assert_int_equal(h.version, 2); /* loaded again, as the next version */
    free(body);
    tiny_server_stop(&held);
}

static void test_delete_before_the_batch_loads_again(void **state) {
    (void)state;
    delete_before_the_batch(false);
    delete_before_the_batch(true);
}

/* Deleted before its batch every time it is loaded again: after its
 * last try the forward answers 404 saying so, not a name to correct.
 * A client still sending a forward makes each try's batch wait
 * --batch-wait-us, the window each delete lands in. */
static void test_deleted_every_time(void **state) {
    (void)state;
    tiny_server held;
    char *body = raced_server(&held);
    int slow = ls_test_open_receiving_forward(held.srv);
    assert_true(slow >= 0);
    held_forward h = {.srv = held.srv, .body = body, .status = -1};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, held_forward_run, &h), 0);
    for (int k = 0; k < 4; k++) {
        ls_test_response r;
        long got = 404;
        for (int wait = 0; got != 200 && wait < 500; wait++) { /* until this try has loaded it */
            assert_int_equal(ls_test_http(held.srv, "DELETE", "/adapters/raced", NULL, NULL, 0, NULL, &r), 0);
            got = r.status;
            ls_test_response_free(&r);
            if (got != 200) usleep(2000);
        }
        if (got != 200) fprintf(stderr, "delete %d: %ld\n", k, got);
        assert_int_equal(got, 200);
    }
    pthread_join(t, NULL);
    close(slow);
    assert_int_equal(h.status, 404);
    assert_non_null(strstr(h.reply, "was deleted while it ran, 4 times after --auto-load loaded it"));
    free(body);
    tiny_server_stop(&held);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loads_directory_and_file),
        cmocka_unit_test(test_bad_file_remembered),
        cmocka_unit_test(test_escape_refused),
        cmocka_unit_test(test_link_out_does_not_hide_the_file),
        cmocka_unit_test(test_not_a_regular_file),
        cmocka_unit_test(test_concurrent_requests_one_load),
        cmocka_unit_test(test_adapter_beside_the_body),
        cmocka_unit_test(test_off_by_default),
        cmocka_unit_test(test_state_dir_keeps_auto_loaded),
        cmocka_unit_test(test_delete_before_the_batch_loads_again),
        cmocka_unit_test(test_deleted_every_time),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
