/* A hostile or failing state directory against the real server: FIFOs,
 * a 64 GiB sparse record, a record with a scale that is not finite and
 * one with a name an upload would refuse (the server starts, serves what
 * reads, and sets the rest aside); versions that would wrap; a second
 * server on the same directory (refused, naming the holder); a tombstone
 * and a record made immutable (chattr +i, where root may) and a full
 * state disk (a small tmpfs, where root may mount one): what a client is
 * told is what a restart finds; and a start-up adapter path that is not
 * UTF-8 (refused up front, with or without a state directory). */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/state_files.h"
#include "tests/util/testutil.h"
#include "tests/util/tiny_server.h"

static tiny_server ts;
static char *state_dir;
static uint8_t *body;
static size_t body_len;

/* A tiny server over state_dir, and the example adapter as an upload
 * body. */
static void start(void) {
    const char *extra[] = {"--state-dir", state_dir, "--log-level", "warn", NULL};
    assert_true(tiny_server_start(&ts, "interleaved", extra));
    body = tiny_adapter_safetensors(&ts, NULL, &body_len);
}

static void stop(void) {
    tiny_server_stop(&ts);
    free(body);
    body = NULL;
}

static int setup(void **state) {
    (void)state;
    state_dir = ls_test_mkdtemp();
    return state_dir ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    /* What a failed test may have left: the files it made immutable, the
     * tmpfs it mounted (EINVAL where none is). */
    const char *immutable[] = {"t.deleted", "r.adapter"};
    for (int i = 0; i < 2; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", state_dir, immutable[i]);
        int fd = open(path, O_RDONLY | O_NONBLOCK);
        int flags = 0;
        if (fd >= 0 && ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0 && (flags & FS_IMMUTABLE_FL)) {
            flags &= ~FS_IMMUTABLE_FL;
            ioctl(fd, FS_IOC_SETFLAGS, &flags);
        }
        if (fd >= 0) close(fd);
    }
    umount2(state_dir, MNT_DETACH);
    ls_test_rmtree(state_dir);
    free(state_dir);
    state_dir = NULL;
    return 0;
}

static long upload(const char *name, bool replace, json_t **reply) {
    char path[256];
    snprintf(path, sizeof path, "/adapters?name=%s&lora_alpha=4%s", name, replace ? "&replace=true" : "");
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "POST", path, "application/octet-stream", body, body_len, NULL, &r), 0);
    if (reply) *reply = ls_test_response_json(&r);
    const long status = r.status;
    ls_test_response_free(&r);
    return status;
}

static long del(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "/adapters/%s", name);
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "DELETE", path, NULL, NULL, 0, NULL, &r), 0);
    const long status = r.status;
    ls_test_response_free(&r);
    return status;
}

/* GET /adapters/name: its version, or -1 when the status is not 200
 * (*status receives it). */
static long long version_of(const char *name, long *status) {
    char path[256];
    snprintf(path, sizeof path, "/adapters/%s", name);
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "GET", path, NULL, NULL, 0, NULL, &r), 0);
    json_t *j = ls_test_response_json(&r);
    long long v = r.status == 200 ? (long long)json_integer_value(json_object_get(j, "version")) : -1;
    if (status) *status = r.status;
    json_decref(j);
    ls_test_response_free(&r);
    return v;
}

static void state_path(char *out, size_t len, const char *file) { snprintf(out, len, "%s/%s", state_dir, file); }

static void restart(void) { assert_true(tiny_server_restart(&ts, false)); }

/* The server starts over a directory of hostile files and serves what
 * reads: FIFOs named *.adapter, *.deleted and *.floor blocked the start
 * in open() forever; a 64 GiB sparse record made it exit 1 (out of
 * memory); a record with scale nan served but was missing from GET
 * /adapters, and GET /adapters/NAME answered 500; a record named
 * "nl\nname" registered. */
static void test_hostile_files_do_not_stop_start_up(void **state) {
    (void)state;
    start();
    assert_int_equal(upload("good", false, NULL), 201);
    assert_int_equal(upload("nanscale", false, NULL), 201);
    assert_int_equal(upload("tmpl", false, NULL), 201);
    assert_int_equal(ls_test_server_stop(ts.srv), 0);
    char path[1024], to[1024];
    state_path(path, sizeof path, "nanscale.adapter");
    ls_test_set_meta(path, "scale", "nan");
    state_path(path, sizeof path, "tmpl.adapter");
    state_path(to, sizeof to, "nl\nname.adapter");
    assert_int_equal(rename(path, to), 0);
    ls_test_set_meta(to, "name", "nl\nname");
    const char *fifos[] = {"fifo.adapter", "fifo.deleted", "fifo.floor"};
    for (int i = 0; i < 3; i++) {
        state_path(path, sizeof path, fifos[i]);
        assert_int_equal(mkfifo(path, 0600), 0);
    }
    state_path(path, sizeof path, "sparse.adapter");
    ls_test_sparse_file(path, (int64_t)64 << 30, NULL, 0);

    ts.srv = ls_test_server_start((const char *const *)ts.args);
    assert_non_null(ts.srv);
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "GET", "/adapters", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = ls_test_response_json(&r);
    json_t *list = json_object_get(j, "adapters");
    /* good alone: tmpl's record moved under another name, its floor
     * says a deleted name */
    assert_int_equal(json_array_size(list), 1);
    json_decref(j);
    ls_test_response_free(&r);
    long status;
    assert_int_equal(version_of("good", &status), 1);
    version_of("nanscale", &status);
    assert_int_equal(status, 404);
    /* The versions of what was set aside go on. */
    assert_int_equal(upload("nanscale", false, &j), 201);
    assert_int_equal(json_integer_value(json_object_get(j, "version")), 2);
    json_decref(j);
    int n = 0;
    for (int i = 0; i < 3; i++) n += ls_test_server_wait_output(ts.srv, fifos[i]) > 0;
    assert_int_equal(n, 3);
    assert_true(ls_test_server_wait_output(ts.srv, "sparse.adapter is 68719476736 bytes") > 0);
    assert_true(ls_test_server_wait_output(ts.srv, "nl\\x0aname.adapter is not named by the adapter name rule") > 0);
    /* Four acknowledged adapters are not served (nanscale, the badly
     * named one, the FIFO and the sparse file): said in the log and kept
     * in /metrics, where a replica's monitoring can see it. */
    assert_true(ls_test_server_wait_output(ts.srv, "4 record(s) not restored") > 0);
    assert_true(ls_test_wait_metric(ts.srv, "lorasink_state_records_unrestored", 4));
    stop();
}

/* Versions never wrap: a restored 2^63 - 1 is shown as such and its
 * replace is 409 versions_exhausted; a record that says 2^64 - 1 (shown
 * as -1 before, its replace given version 0) is set aside. */
static void test_versions_do_not_wrap(void **state) {
    (void)state;
    start();
    assert_int_equal(upload("top", false, NULL), 201);
    assert_int_equal(upload("wrap", false, NULL), 201);
    assert_int_equal(ls_test_server_stop(ts.srv), 0);
    char path[1024];
    state_path(path, sizeof path, "top.adapter");
    ls_test_set_meta(path, "version", "9223372036854775807");
    state_path(path, sizeof path, "wrap.adapter");
    ls_test_set_meta(path, "version", "18446744073709551615");
    ts.srv = ls_test_server_start((const char *const *)ts.args);
    assert_non_null(ts.srv);
    long status;
    assert_true(version_of("top", &status) == 9223372036854775807LL);
    version_of("wrap", &status);
    assert_int_equal(status, 404);
    json_t *j = NULL;
    assert_int_equal(upload("top", true, &j), 409);
    assert_string_equal(ls_test_error_code(j), "versions_exhausted");
    json_decref(j);
    assert_true(version_of("top", &status) == 9223372036854775807LL);
    assert_int_equal(upload("wrap", false, &j), 201);
    assert_int_equal(json_integer_value(json_object_get(j, "version")), 2);
    json_decref(j);
    stop();
}

/* A second server on the same --state-dir exits 1, naming the directory
 * and the pid of the one that holds it. (Its start-up adapter cannot
 * load, so that without the lock it would exit too, for that reason.) */
static void test_second_server_is_refused(void **state) {
    (void)state;
    start();
    const char *args[48];
    int a = 0;
    args[a++] = "--port";
    args[a++] = "0";
    for (int i = 0; ts.args[i] && a < 44; i++) args[a++] = ts.args[i];
    args[a++] = "--adapter";
    args[a++] = "x=missing.safetensors";
    args[a] = NULL;
    char out[8192], pid[32];
    assert_int_equal(ls_test_run_binary(args, out, sizeof out), 1);
    snprintf(pid, sizeof pid, "pid %d", ls_test_server_pid(ts.srv));
    if (!strstr(out, "is in use by another lorasink server") || !strstr(out, pid) || !strstr(out, state_dir))
        fail_msg("the second server's output does not name the directory and %s:\n%s", pid, out);
    stop();
}

/* FS_IMMUTABLE_FL on or off (chattr +i / -i); false when the file
 * system or the process cannot. */
static bool set_immutable(const char *path, bool on) {
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return false;
    int flags = 0;
    bool ok = ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0;
    flags = on ? flags | FS_IMMUTABLE_FL : flags & ~FS_IMMUTABLE_FL;
    ok = ok && ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0;
    close(fd);
    return ok;
}

/* What the client is told is what a restart finds, when the disk refuses
 * a step: a tombstone that cannot be removed no longer fails the
 * re-upload that outdates it (it answered 500, and the adapter came back
 * at version 2 after a restart), and a record that cannot be removed
 * fails its DELETE with the adapter still there after a restart (it
 * answered 500, kept serving, and was gone after a restart). */
static void test_refused_steps_agree_with_the_disk(void **state) {
    (void)state;
    start();
    assert_int_equal(upload("t", false, NULL), 201);
    assert_int_equal(del("t"), 200);
    char tomb[1024], record[1024];
    state_path(tomb, sizeof tomb, "t.deleted");
    if (!set_immutable(tomb, true)) {
        print_message("skipped: cannot make a file immutable here (%s)\n", strerror(errno));
        stop();
        skip();
    }
    json_t *j = NULL;
    const long st = upload("t", false, &j);
    assert_int_equal(st, 201);
    assert_int_equal(json_integer_value(json_object_get(j, "version")), 2);
    json_decref(j);
    assert_int_equal(upload("r", false, NULL), 201);
    state_path(record, sizeof record, "r.adapter");
    assert_true(set_immutable(record, true));
    assert_int_equal(del("r"), 500);
    long status;
    assert_int_equal(version_of("r", &status), 1);
    restart();
    assert_int_equal(version_of("t", &status), 2);
    assert_int_equal(version_of("r", &status), 1);
    assert_true(set_immutable(tomb, false));
    assert_true(set_immutable(record, false));
    assert_int_equal(del("r"), 200);
    stop();
}

/* On a full state disk DELETE succeeds (it answered 500: the tombstone
 * was written first, so the API could not free space) and an upload
 * fails leaving nothing behind, with 507 insufficient_storage (it was
 * 500 internal, "a bug"), which the same request passes once there is
 * room. */
static void test_full_disk_can_delete(void **state) {
    (void)state;
    if (mount("lorasink-test", state_dir, "tmpfs", 0, "size=256k,mode=0700") != 0) {
        print_message("skipped: cannot mount a tmpfs here (%s)\n", strerror(errno));
        skip();
    }
    start();
    assert_int_equal(upload("a", false, NULL), 201);
    char filler[1024], block[4096];
    memset(block, 'f', sizeof block);
    state_path(filler, sizeof filler, "filler");
    int fd = open(filler, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    while (write(fd, block, sizeof block) > 0) {
    }
    close(fd);
    json_t *j = NULL;
    assert_int_equal(upload("b", false, &j), 507);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                        "insufficient_storage");
    json_decref(j);
    assert_int_equal(del("a"), 200);
    restart();
    long status;
    version_of("a", &status);
    assert_int_equal(status, 404);
    version_of("b", &status);
    assert_int_equal(status, 404);
    assert_int_equal(unlink(filler), 0);
    assert_int_equal(upload("b", false, NULL), 201);
    assert_int_equal(upload("a", false, &j), 201);
    assert_int_equal(json_integer_value(json_object_get(j, "version")), 2);
    json_decref(j);
    stop();
    assert_int_equal(umount(state_dir), 0);
}

/* A start-up adapter path that is not UTF-8 cannot be shown in GET
 * /adapters (JSON strings are UTF-8) nor saved as a record's source: it
 * is refused up front, exit 2 naming --adapter, with or without a state
 * directory (without one the server started and its source went missing
 * from GET /adapters; with one, start-up failed with "this is a bug"). */
static void test_non_utf8_adapter_path_is_refused(void **state) {
    (void)state;
    start();
    tiny_write_adapter_file(&ts, "\xff.safetensors", "4");
    assert_int_equal(ls_test_server_stop(ts.srv), 0);
    ts.srv = NULL;
    for (int with_state = 0; with_state < 2; with_state++) {
        const char *args[48];
        int a = 0;
        for (int i = 0; ts.args[i] && a < 40; i++) {
            if (!with_state && !strcmp(ts.args[i], "--state-dir")) {
                i++;
                continue;
            }
            args[a++] = ts.args[i];
        }
        args[a++] = "--adapter";
        args[a++] = "a=\xff.safetensors";
        args[a] = NULL;
        ls_test_server *s = ls_test_server_start(args);
        if (s) {
            ls_test_server_stop(s);
            fail_msg("the server started with a start-up adapter path that is not UTF-8 (state dir: %d)", with_state);
        }
        char out[8192];
        assert_int_equal(ls_test_run_binary(args, out, sizeof out), 2);
        if (!strstr(out, "--adapter") || !strstr(out, "UTF-8")) fail_msg("the refusal does not say why:\n%s", out);
    }
    ts.srv = ls_test_server_start((const char *const *)ts.args);
    stop();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_hostile_files_do_not_stop_start_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_versions_do_not_wrap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_second_server_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_steps_agree_with_the_disk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_disk_can_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_non_utf8_adapter_path_is_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
