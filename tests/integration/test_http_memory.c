/* The memory a request makes the server hold, over HTTP against the real
 * binary, each bound measured as peak RSS (VmHWM): adapter files checked
 * from their size and header before they are read (sparse files of
 * 2 GiB and 1 TiB); the host tier's cap held within one forward that
 * names more adapters than it holds, and those adapters' bytes counted
 * in --max-queue-mb; JSON adapter uploads read without a tree of JSON
 * values (docs/api.md states each bound). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/tiny_server.h"

/* A /proc/PID/status field in KiB (VmRSS, VmHWM). */
static long proc_kib(int pid, const char *field) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    long v = -1;
    size_t fl = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, fl) && line[fl] == ':') v = atol(line + fl + 1);
    fclose(f);
    assert_true(v >= 0);
    return v;
}

/* dir/name as a sparse file of size bytes: holes, read as zeros, that
 * take no disk. */
static void write_sparse(const char *dir, const char *name, long long size) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    if (ftruncate(fd, (off_t)size) != 0) fprintf(stderr, "ftruncate %s to %lld: %s\n", path, size, strerror(errno));
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    close(fd);
}

/* One request on a thread of its own. */
typedef struct {
    const ls_test_server *srv;
    const char *path, *body;
    long status;
    char code[64];
    char *reply; /* owned */
} call;

static void *call_thread(void *arg) {
    call *c = arg;
    ls_test_response r;
    assert_int_equal(ls_test_http(c->srv, "POST", c->path, NULL, c->body, strlen(c->body), NULL, &r), 0);
    c->status = r.status;
    json_t *j = ls_test_response_json(&r);
    snprintf(c->code, sizeof c->code, "%s", j ? ls_test_error_code(j) : "");
    json_decref(j);
    c->reply = r.body;
    r.body = NULL;
    ls_test_response_free(&r);
    return NULL;
}

/* Runs the n calls at once and waits for all of them. */
static void run_calls(call *calls, int n) {
    pthread_t th[16];
    assert_true(n <= 16);
    for (int i = 0; i < n; i++) assert_int_equal(pthread_create(&th[i], NULL, call_thread, &calls[i]), 0);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

/* calls[i] answered status with code, and a message holding want. */
static void expect_call(const call *c, long status, const char *code, const char *want) {
    if (c->status != status || strcmp(c->code, code) || !strstr(c->reply, want))
        fprintf(stderr, "POST %s %s -> %ld: %s\n", c->path, c->body, c->status, c->reply);
    assert_int_equal(c->status, status);
    assert_string_equal(c->code, code);
    assert_non_null(strstr(c->reply, want));
}

/* Adapter files were read whole before their header was checked, with
 * no size cap: four 2 GiB sparse files named by auto-loading forwards
 * took 7.65 GB to answer "header length is 0", a path upload of one
 * read it again every time, and a 1 TiB sparse file answered 500 "out of
 * memory". The size is checked from fstat before any read (413 naming
 * --max-adapter-mb past it) and the header before the data: every way
 * in answers at once, and the server's peak RSS does not grow. */
static void test_large_adapter_files(void **state) {
    (void)state;
    const char *extra[] = {"--auto-load", NULL};
    tiny_server ts;
    assert_true(tiny_server_start(&ts, "interleaved", extra));
    const long long two_gib = 2LL << 30;
    const char *names[4] = {"z0", "z1", "z2", "z3"};
    for (int i = 0; i < 4; i++) {
        char file[64];
        snprintf(file, sizeof file, "%s.safetensors", names[i]);
        write_sparse(ts.dir, file, two_gib);
    }
    write_sparse(ts.dir, "tib.safetensors", 1LL << 40);
    const int pid = ls_test_server_pid(ts.srv);
    const long before = proc_kib(pid, "VmHWM");
    /* One path upload first: alone it read the whole 2 GiB. */
    call one = {.srv = ts.srv, .path = "/adapters", .body = "{\"name\": \"z\", \"path\": \"z0.safetensors\"}"};
    call_thread(&one);
    expect_call(&one, 422, "safetensors_invalid", "header length is 0");
    free(one.reply);
    assert_true(proc_kib(pid, "VmHWM") - before < 64 * 1024);
    /* Four auto-loading forwards, four path uploads and four validations
     * at once, and each again (a failed file is not read again). */
    char bodies[12][160];
    call calls[12];
    for (int i = 0; i < 4; i++) {
        snprintf(bodies[i], sizeof bodies[i], "{\"x\": [[0.5, -0.25, 0.125, 1.0]], \"adapter\": \"%s\"}", names[i]);
        snprintf(bodies[4 + i], sizeof bodies[4 + i], "{\"name\": \"p%d\", \"path\": \"%s.safetensors\"}", i, names[i]);
        snprintf(bodies[8 + i], sizeof bodies[8 + i], "{\"path\": \"%s.safetensors\"}", names[i]);
    }
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 12; i++)
            calls[i] = (call){.srv = ts.srv, .path = i < 4 ? "/forward" : i < 8 ? "/adapters" : "/adapters/validate",
                              .body = bodies[i]};
        run_calls(calls, 12);
        for (int i = 0; i < 12; i++) {
            expect_call(&calls[i], 422, "safetensors_invalid", "header length is 0");
            free(calls[i].reply);
        }
    }
    /* The 1 TiB file: 413 from its size, by every way in. */
    const char *tib[3][2] = {{"/adapters", "{\"name\": \"t\", \"path\": \"tib.safetensors\"}"},
                             {"/adapters/validate", "{\"path\": \"tib.safetensors\"}"},
                             {"/forward", "{\"x\": [[0.5, -0.25, 0.125, 1.0]], \"adapter\": \"tib\"}"}};
    for (int i = 0; i < 3; i++) {
        call c = {.srv = ts.srv, .path = tib[i][0], .body = tib[i][1]};
        call_thread(&c);
        expect_call(&c, 413, "payload_too_large", "over the limit of 4096 MiB (--max-adapter-mb)");
        assert_null(strstr(c.reply, ts.dir)); /* the path as the client knows it */
        free(c.reply);
    }
    const long grew = proc_kib(pid, "VmHWM") - before;
    print_message("25 requests for 2 GiB and 1 TiB adapter files: peak RSS grew by %ld KiB\n", grew);
    assert_true(grew < 64 * 1024);
    /* Nothing was registered; a good adapter still loads. */
    tiny_write_adapter_file(&ts, "good.safetensors", "4");
    json_t *req = json_pack("{s:s, s:s}", "name", "good", "path", "good.safetensors");
    json_decref(tiny_post_json(&ts, "/adapters", req, 201));
    json_decref(req);
    tiny_server_stop(&ts);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_large_adapter_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
