/* Slow clients against the real server: a head or a body trickled a byte
 * at a time used to hold its connection forever (--connection-timeout is
 * an idle timeout, which every byte resets), and an address holding its
 * --per-ip-connections of them got no /health. Now the head and the body
 * have deadlines (--request-timeout, --body-timeout: 408, then closed,
 * counted and logged once), an idle kept-alive connection is left to the
 * idle timeout, and a reserve past the cap answers the probes. Raw
 * sockets from threads, one per slow client. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/server_driver.h"

#define CAP 4          /* --per-ip-connections */
#define HEAD_S 2       /* --request-timeout */
#define BODY_S 3       /* --body-timeout */
#define RESERVE_S 5    /* a reserve connection's head deadline: test_reserve_bound's --request-timeout */

static ls_test_server *srv;

static ls_test_server *start_server(const char *request_timeout) {
    const char *args[] = {"--demo", "--experts", "2", "--hidden", "8", "--intermediate", "4", "--layers", "1",
                          "--per-ip-connections", "4", "--request-timeout", request_timeout, "--body-timeout", "3",
                          "--connection-timeout", "120", NULL};
    return ls_test_server_start(args);
}

static int setup(void **state) {
    (void)state;
    srv = start_server("2");
    return srv ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    assert_int_equal(ls_test_server_stop(srv), 0);
    return 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A TCP connection to the server from the loopback address src (another
 * one than the slow clients' 127.0.0.1 is another client to the
 * server's per-address count). */
static int connect_from(const char *src) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, src, &a.sin_addr);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    a.sin_port = htons((uint16_t)ls_test_server_port(srv));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Reads until the server closes or 5 s pass; NUL-terminated. */
static size_t read_to_close(int fd, char *buf, size_t cap) {
    size_t len = 0;
    const double end = now_s() + 5;
    while (len + 1 < cap && now_s() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t n = recv(fd, buf + len, cap - 1 - len, 0);
        if (n <= 0) break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    return len;
}

/* The sample name of /metrics as a client from 127.0.0.2 sees it (never
 * counted against the slow clients' address); -1 when the scrape fails. */
static double metric(const char *name) {
    int fd = connect_from("127.0.0.2");
    const char *req = "GET /metrics HTTP/1.0\r\n\r\n";
    assert_int_equal(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    static char buf[1 << 16];
    read_to_close(fd, buf, sizeof buf);
    close(fd);
    char key[160];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(buf, key);
    return p ? strtod(p + strlen(key), NULL) : -1;
}

/* Waits (5 s at most) for the sample to be want. */
static void wait_metric(const char *name, double want) {
    for (int i = 0; i < 500; i++) {
        if (metric(name) == want) return;
        usleep(10000);
    }
    fail_msg("%s never was %g (last %g)", name, want, metric(name));
}

/* The scrape's own connection counts too. */
static void wait_open_connections(double want) { wait_metric("lorasink_http_connections", want + 1); }

/* Waits (5 s at most) until text is in the server's output n times. */
static void wait_logged(const char *text, int n) {
    int seen = 0;
    for (int i = 0; i < 500 && seen != n; i++) {
        char *out = ls_test_server_output(srv);
        seen = 0;
        for (const char *p = out; (p = strstr(p, text)); p++) seen++;
        free(out);
        if (seen != n) usleep(10000);
    }
    if (seen != n) fail_msg("\"%s\" logged %d times, expected %d", text, seen, n);
}

/* A slow client: its first bytes, then one byte every 200 ms until the
 * server closes (at most 10 s); what it read and when it was closed. */
typedef struct {
    const char *first;
    const char *drip;
    int fd;
    double opened, closed;
    char reply[4096];
} slow_client;

static void *slow_run(void *arg) {
    slow_client *c = arg;
    char buf[4096];
    size_t len = 0;
    while (now_s() - c->opened < 10) {
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, 200) > 0) {
            ssize_t n = recv(c->fd, buf + len, sizeof buf - 1 - len, 0);
            if (n <= 0) break;
            len += (size_t)n;
            continue;
        }
        if (send(c->fd, c->drip, strlen(c->drip), MSG_NOSIGNAL) < 0 && errno != EAGAIN) break;
    }
    c->closed = now_s();
    buf[len] = '\0';
    memcpy(c->reply, buf, len + 1);
    return NULL;
}

static void slow_start(slow_client *c, pthread_t *t, const char *first, const char *drip) {
    c->first = first;
    c->drip = drip;
    c->fd = ls_test_raw_connect(srv);
    assert_true(c->fd >= 0);
    c->opened = now_s();
    assert_int_equal(send(c->fd, first, strlen(first), MSG_NOSIGNAL), (ssize_t)strlen(first));
    assert_int_equal(pthread_create(t, NULL, slow_run, c), 0);
}

/* Each slow client was answered 408 request_timeout and closed, not
 * before its deadline and within a bound of it. */
static void expect_reaped(const slow_client *c, double deadline_s) {
    const double held = c->closed - c->opened;
    if (strncmp(c->reply, "HTTP/1.1 408", 12) || !strstr(c->reply, "\"request_timeout\"") || held < deadline_s - 0.1 ||
        held > deadline_s + 4)
        fprintf(stderr, "held %.2f s (deadline %g s): %s\n", held, deadline_s, c->reply);
    assert_memory_equal(c->reply, "HTTP/1.1 408", 12);
    assert_non_null(strstr(c->reply, "\"request_timeout\""));
    assert_non_null(strstr(c->reply, "X-Request-Id: "));
    assert_true(held >= deadline_s - 0.1);
    assert_true(held <= deadline_s + 4);
}

/* CAP connections from one address: one kept alive and idle, the rest
 * trickling a head. /health from that address answers meanwhile (the
 * reserve), other routes there are 429; the heads are reaped at their
 * deadline; the idle connection is not (it waits for no head) and serves
 * its next request. */
static void test_head_trickle(void **state) {
    (void)state;
    int idle = ls_test_raw_connect(srv);
    assert_true(idle >= 0);
    const char *get = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    char buf[4096];
    assert_int_equal(send(idle, get, strlen(get), MSG_NOSIGNAL), (ssize_t)strlen(get));
    assert_true(recv(idle, buf, sizeof buf, 0) > 0);
    assert_memory_equal(buf, "HTTP/1.1 200", 12);

    slow_client c[CAP - 1];
    pthread_t t[CAP - 1];
    const char *heads[CAP - 1] = {"GET /pool HTTP/1.1\r\nHost: 127.0.0.1\r\n", "GET /po", ""};
    for (int i = 0; i < CAP - 1; i++) slow_start(&c[i], &t[i], heads[i], i == 1 ? "o" : "X");
    wait_open_connections(CAP);

    ls_test_response r;
    assert_int_equal(ls_test_http(srv, "GET", "/health", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    assert_int_equal(ls_test_http(srv, "GET", "/ready", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    assert_int_equal(ls_test_http(srv, "GET", "/pool", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 429);
    json_t *j = ls_test_response_json(&r);
    assert_string_equal(ls_test_error_code(j), "too_many_connections");
    json_decref(j);
    ls_test_response_free(&r);

    for (int i = 0; i < CAP - 1; i++) {
        pthread_join(t[i], NULL);
        close(c[i].fd);
    }
    /* The empty one sent its first byte with its first drip, 200 ms in. */
    for (int i = 0; i < CAP - 1; i++) expect_reaped(&c[i], HEAD_S + (i == 2 ? 0.2 : 0));
    wait_logged("request timeout: 127.0.0.1 (no complete head): the request's head did not arrive within 2 s", CAP - 1);
    wait_metric("lorasink_request_timeouts_total{phase=\"head\"}", CAP - 1);
    /* Each 408 has its access log line, like every other answer: no
     * method or path for a head that never came whole. */
    wait_logged(" - - 408 ", CAP - 1);

    /* Idle since before the slow heads came: still served. */
    assert_int_equal(send(idle, get, strlen(get), MSG_NOSIGNAL), (ssize_t)strlen(get));
    ssize_t n = recv(idle, buf, sizeof buf - 1, 0);
    assert_true(n > 0);
    assert_memory_equal(buf, "HTTP/1.1 200", 12);
    close(idle);
}

/* A body trickled after a whole head: 408 at --body-timeout, counted
 * under its route. */
static void test_body_trickle(void **state) {
    (void)state;
    /* The last test's connections are closed on our side; until the
     * server has seen them close they count against this address's cap
     * (a slow machine under TSan got 429 here). */
    wait_open_connections(0);
    slow_client c;
    pthread_t t;
    slow_start(&c, &t,
               "POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               "X-Request-Id: slow-body\r\nContent-Length: 100000\r\n\r\n{\"x\": [[",
               "0,");
    pthread_join(t, NULL);
    close(c.fd);
    expect_reaped(&c, BODY_S);
    assert_non_null(strstr(c.reply, "X-Request-Id: slow-body"));
    wait_logged("request timeout: 127.0.0.1 POST /forward: the request's body did not arrive within 3 s "
                "(--body-timeout)",
                1);
    wait_metric("lorasink_request_timeouts_total{phase=\"body\"}", 1);
    wait_metric("lorasink_requests_total{route=\"/forward\",status=\"408\"}", 1);
    /* Its access log line carries the id its reply did. */
    wait_logged(" access slow-body POST /forward 408 ", 1);
    /* One warning only: libmicrohttpd's word on the socket closed after
     * the linger (about 1 s on) is the client's doing, logged as info. */
    bool said = false;
    for (int i = 0; i < 300 && !said; i++) {
        char *out = ls_test_server_output(srv);
        said = strstr(out, " info  microhttpd: ") != NULL;
        if (strstr(out, " warn  microhttpd: ")) fail_msg("a second warning for one timeout:\n%s", out);
        free(out);
        if (!said) usleep(10000);
    }
    assert_true(said);
}

/* Past the cap and the reserve a connection is closed at accept, as
 * libmicrohttpd's own limit closed the one past the cap. Idle
 * connections within the cap are left to --connection-timeout; the
 * reserve's are not, or idle ones would keep the probes out: each has
 * 5 s for its head from its accept (--request-timeout when shorter). */
static void test_reserve_bound(void **state) {
    (void)state;
    /* Its own server, whose reserve keeps the longest head deadline
     * (5 s): the reserve must still be full when the extra connection
     * comes, and on a loaded machine the scrapes before it took over the
     * 2 s of the others' --request-timeout. */
    assert_int_equal(ls_test_server_stop(srv), 0);
    srv = start_server("5");
    assert_non_null(srv);
    int fds[CAP + 4];
    for (int i = 0; i < CAP + 4; i++) fds[i] = ls_test_raw_connect(srv);
    const double opened = now_s();
    wait_open_connections(CAP + 4);
    wait_metric("lorasink_http_connections_reserved", 4);
    int extra = ls_test_raw_connect(srv);
    assert_true(extra >= 0);
    char buf[512];
    assert_int_equal(read_to_close(extra, buf, sizeof buf), 0);
    close(extra);
    wait_metric("lorasink_http_connections_refused_total", 1);
    /* Which four are the reserve's depends on the order of accepts. */
    int answered = 0;
    bool done[CAP + 4] = {false};
    while (answered < 4 && now_s() - opened < RESERVE_S + 8) {
        for (int i = 0; i < CAP + 4; i++) {
            struct pollfd p = {.fd = fds[i], .events = POLLIN};
            if (done[i] || poll(&p, 1, 10) <= 0) continue;
            read_to_close(fds[i], buf, sizeof buf);
            assert_memory_equal(buf, "HTTP/1.1 408", 12);
            done[i] = true;
            answered++;
        }
    }
    assert_int_equal(answered, 4);
    assert_true(now_s() - opened >= RESERVE_S - 0.1);
    wait_metric("lorasink_http_connections_reserved", 0);
    wait_logged(" - - 408 ", 4);
    wait_open_connections(CAP);
    for (int i = 0; i < CAP + 4; i++) close(fds[i]);
    wait_open_connections(0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_head_trickle),
        cmocka_unit_test(test_body_trickle),
        cmocka_unit_test(test_reserve_bound),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
