/* lorasink --probe against servers that misbehave, each a thread of this
 * test on a loopback port: one that never answers, one that answers a
 * byte at a time, replies that are not a whole 200, and a configuration
 * the probe cannot read. A health check must say no within its deadline
 * (2.5 s, under the images' HEALTHCHECK --timeout=3s) and exit 0 or 1,
 * never the 2 Docker reserves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/util/server_driver.h"

/* One connection's worth of a fake server: what it answers, one byte
 * every delay_ms (0: all at once), then it closes. */
typedef struct {
    int listen_fd, port;
    const char *reply;
    int delay_ms;
    pthread_t thread;
} fake_server;

static void *fake_serve(void *arg) {
    fake_server *f = arg;
    int fd = accept(f->listen_fd, NULL, NULL);
    if (fd < 0) return NULL;
    char req[1024];
    (void)recv(fd, req, sizeof req, 0);
    const size_t len = strlen(f->reply);
    for (size_t i = 0; i < len; i++) {
        const size_t n = f->delay_ms ? 1 : len;
        if (send(fd, f->reply + i, n, MSG_NOSIGNAL) != (ssize_t)n) break; /* the probe gave up */
        if (!f->delay_ms) break;
        struct timespec ts = {f->delay_ms / 1000, (long)(f->delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (!len) { /* says nothing until the probe leaves */
        char c;
        (void)recv(fd, &c, 1, 0);
    }
    close(fd);
    return NULL;
}

static void fake_start(fake_server *f, const char *reply, int delay_ms) {
    f->reply = reply;
    f->delay_ms = delay_ms;
    f->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(f->listen_fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(f->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(f->listen_fd, 1), 0);
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(f->listen_fd, (struct sockaddr *)&a, &al), 0);
    f->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&f->thread, NULL, fake_serve, f), 0);
}

static void fake_stop(fake_server *f) {
    pthread_join(f->thread, NULL);
    close(f->listen_fd);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Runs the probe against f; its exit status, its output in out and its
 * wall time in *ms. */
static int probe(const fake_server *f, char *out, size_t cap, double *ms) {
    char port[16];
    snprintf(port, sizeof port, "%d", f->port);
    const char *args[] = {"--probe", "--port", port, NULL};
    const double t0 = now_ms();
    const int rc = ls_test_run_binary(args, out, cap);
    *ms = now_ms() - t0;
    return rc;
}

/* A reply that is not a whole 200 is a no, said with the reply's first
 * line (bytes that are not printable shown as '?'), at once. */
static void test_probe_reply_not_ok(void **state) {
    (void)state;
    static const struct {
        const char *reply, *says;
        int want;
    } cases[] = {
        {"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"status\":\"ok\"}", "{\"status\":\"ok\"}", 0},
        {"HTTP/1.1 +0200 Bogus\r\n\r\n", "answered HTTP/1.1 +0200 Bogus", 1},
        {"HTTP/1.1 2000 OK\r\n\r\n", "answered HTTP/1.1 2000 OK", 1},
        {"HTTP/1.1 200 OK", "answered HTTP/1.1 200 OK (cut short)", 1},
        {"HTTP/1.1 503 \x1b[31mred\r\n\r\n", "answered HTTP/1.1 503 ?[31mred", 1},
    };
    char out[4096];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fake_server f;
        fake_start(&f, cases[i].reply, 0);
        double ms;
        const int rc = probe(&f, out, sizeof out, &ms);
        fake_stop(&f);
        if (rc != cases[i].want || !strstr(out, cases[i].says)) fprintf(stderr, "case %zu: %d %s\n", i, rc, out);
        assert_int_equal(rc, cases[i].want);
        assert_non_null(strstr(out, cases[i].says));
        assert_null(strchr(out, '\x1b'));
    }
}

/* A server that never answers, or answers a byte every 400 ms (a whole
 * reply would take a minute), is a no within the deadline. The bound
 * checked is the deadline with seconds to spare, for a loaded machine
 * and a sanitizer build: what it catches is a probe without one. */
#define SLACK_MS 6000
static void test_probe_deadline(void **state) {
    (void)state;
    char out[4096];
    static const char trickle[] = "HTTP/1.0 200 OK\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                                  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n{}";
    fake_server f;
    fake_start(&f, "", 0);
    double ms;
    assert_int_equal(probe(&f, out, sizeof out, &ms), 1);
    fake_stop(&f);
    assert_non_null(strstr(out, "no reply from 127.0.0.1:"));
    assert_non_null(strstr(out, "within 2500 ms"));
    assert_true(ms < SLACK_MS);

    fake_start(&f, trickle, 400);
    assert_int_equal(probe(&f, out, sizeof out, &ms), 1);
    fake_stop(&f);
    assert_non_null(strstr(out, "(cut short)"));
    assert_true(ms < SLACK_MS);
}

/* A configuration the probe cannot read is a no (1), not exit 2. */
static void test_probe_bad_config(void **state) {
    (void)state;
    char out[4096];
    const char *args[] = {"--probe", "--port", "99999", NULL};
    assert_int_equal(ls_test_run_binary(args, out, sizeof out), 1);
    assert_non_null(strstr(out, "lorasink --probe: "));
    assert_non_null(strstr(out, "port"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_reply_not_ok),
        cmocka_unit_test(test_probe_deadline),
        cmocka_unit_test(test_probe_bad_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
