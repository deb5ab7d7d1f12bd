/* The lorasink binary (LS_SERVER_BIN) as a child process on an ephemeral
 * port, and one HTTP request to it over libcurl. */
#include "tests/util/server_driver.h"

#include "common/buf.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

struct ls_test_server {
    pid_t pid;
    int port;
    int out_fd; /* the server's stdout+stderr */
    /* A thread reads out_fd to its end, so the server never blocks on a
     * full pipe (its access log writes a line per request); out keeps the
     * last LS_TEST_OUT_CAP bytes. */
    pthread_t reader;
    pthread_mutex_t mu;
    char *out;
    size_t out_len;
};

#define LS_TEST_OUT_CAP (1u << 20)

int ls_test_server_port(const ls_test_server *s) { return s->port; }

/* Appends n bytes to s->out, dropping the oldest past the cap. */
static void ls_test_server_keep(ls_test_server *s, const char *buf, size_t n) {
    pthread_mutex_lock(&s->mu);
    if (n >= LS_TEST_OUT_CAP) {
        buf += n - (LS_TEST_OUT_CAP - 1);
        n = LS_TEST_OUT_CAP - 1;
    }
    if (s->out_len + n >= LS_TEST_OUT_CAP) {
        size_t drop = s->out_len + n - (LS_TEST_OUT_CAP - 1);
        memmove(s->out, s->out + drop, s->out_len - drop);
        s->out_len -= drop;
    }
    memcpy(s->out + s->out_len, buf, n);
    s->out_len += n;
    s->out[s->out_len] = '\0';
    pthread_mutex_unlock(&s->mu);
}

static void *ls_test_server_read(void *arg) {
    ls_test_server *s = arg;
    char buf[4096];
    for (;;) {
        ssize_t n = read(s->out_fd, buf, sizeof buf);
        if (n > 0) ls_test_server_keep(s, buf, (size_t)n);
        else if (n == 0 || errno != EINTR) break;
    }
    return NULL;
}

char *ls_test_server_output(ls_test_server *s) {
    pthread_mutex_lock(&s->mu);
    char *copy = strdup(s->out);
    pthread_mutex_unlock(&s->mu);
    assert(copy);
    return copy;
}

int ls_test_server_wait_output(ls_test_server *s, const char *text) {
    int n = 0;
    for (int tries = 0; n == 0 && tries < 500; tries++) {
        if (tries) usleep(10 * 1000);
        char *out = ls_test_server_output(s);
        for (const char *p = out; (p = strstr(p, text)); p += strlen(text)) n++;
        free(out);
    }
    return n;
}

char *ls_test_forward_json(int T, int H, const char *value, const char *gamma_row, const char *adapter) {
    ls_buf b;
    ls_buf_init(&b);
    ls_buf_append(&b, "{\"x\": [", 7);
    for (int t = 0; t < T; t++) {
        ls_buf_append(&b, t ? ",[" : "[", t ? 2 : 1);
        for (int h = 0; h < H; h++) ls_buf_printf(&b, "%s%s", h ? "," : "", value);
        ls_buf_append(&b, "]", 1);
    }
    ls_buf_append(&b, "]", 1);
    if (gamma_row) {
        ls_buf_append(&b, ", \"gammas\": [", 13);
        for (int t = 0; t < T; t++) ls_buf_printf(&b, "%s%s", t ? "," : "", gamma_row);
        ls_buf_append(&b, "]", 1);
    }
    if (adapter) ls_buf_printf(&b, ", \"adapter\": \"%s\"", adapter);
    ls_buf_append(&b, "}", 1);
    char *text = ls_buf_take(&b, NULL);
    assert(text);
    return text;
}

/* After the process ended: waits for the reader to see the pipe's end. */
static void ls_test_server_join(ls_test_server *s) {
    pthread_join(s->reader, NULL);
    close(s->out_fd);
}

/* Frees s once joined. */
static void ls_test_server_free(ls_test_server *s) {
    pthread_mutex_destroy(&s->mu);
    free(s->out);
    free(s);
}

ls_test_server *ls_test_server_start_env(const char *const *args, const char *const *env) {
    int fds[2];
    if (pipe(fds)) return NULL;
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return NULL;
    if (pid == 0) {
        /* A failed assertion ends the test program without stopping its
         * servers: they go with it instead of lingering on the machine.
         * (The signal follows the forking thread; tests start servers
         * from their main thread.) */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
        const char *argv[64];
        int a = 0;
        argv[a++] = LS_SERVER_BIN;
        argv[a++] = "--port";
        argv[a++] = "0";
        argv[a++] = "--host";
        argv[a++] = "127.0.0.1";
        for (int i = 0; args && args[i] && a < 62; i++) argv[a++] = args[i];
        argv[a] = NULL;
        execv(LS_SERVER_BIN, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    ls_test_server *s = calloc(1, sizeof *s);
    assert(s);
    s->out = malloc(LS_TEST_OUT_CAP);
    assert(s->out);
    s->out[0] = '\0';
    s->pid = pid;
    s->out_fd = fds[0];
    pthread_mutex_init(&s->mu, NULL);
    if (pthread_create(&s->reader, NULL, ls_test_server_read, s)) abort();
    for (int waited = 0; waited < 60000; waited += 20) {
        usleep(20000);
        pthread_mutex_lock(&s->mu);
        const char *m = strstr(s->out, "listening on http://127.0.0.1:");
        if (m) s->port = atoi(m + strlen("listening on http://127.0.0.1:"));
        pthread_mutex_unlock(&s->mu);
        if (s->port) return s;
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            ls_test_server_join(s);
            fprintf(stderr, "server exited early (status %d):\n%s\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                    s->out);
            ls_test_server_free(s);
            return NULL;
        }
    }
    fprintf(stderr, "server did not start in 60 s:\n%s\n", s->out);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    ls_test_server_join(s);
    ls_test_server_free(s);
    return NULL;
}

ls_test_server *ls_test_server_start(const char *const *args) { return ls_test_server_start_env(args, NULL); }

int ls_test_server_stop(ls_test_server *s) {
    if (!s) return -1;
    kill(s->pid, SIGTERM);
    int status = -1;
    for (int i = 0; i < 3000; i++) {
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) break;
        usleep(10000);
        if (i == 2999) {
            fprintf(stderr, "server did not stop in 30 s after SIGTERM; killing it\n");
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &status, 0);
        }
    }
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    ls_test_server_join(s);
    if (rc != 0) {
        if (WIFSIGNALED(status)) fprintf(stderr, "server died of signal %d on shutdown\n", WTERMSIG(status));
        else fprintf(stderr, "server exited with %d on shutdown\n", rc);
        fprintf(stderr, "its last output:\n%s\n", s->out_len > 4000 ? s->out + s->out_len - 4000 : s->out);
    }
    ls_test_server_free(s);
    return rc;
}

void ls_test_server_kill(ls_test_server *s) {
    if (!s) return;
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    ls_test_server_join(s);
    ls_test_server_free(s);
}

int ls_test_server_pid(const ls_test_server *s) { return (int)s->pid; }

int ls_test_run_binary(const char *const *args, char *out, size_t cap) {
    char cmd[4096];
    size_t o = (size_t)snprintf(cmd, sizeof cmd, "'%s'", LS_SERVER_BIN);
    for (int i = 0; args[i] && o < sizeof cmd; i++) o += (size_t)snprintf(cmd + o, sizeof cmd - o, " '%s'", args[i]);
    if (o < sizeof cmd) snprintf(cmd + o, sizeof cmd - o, " 2>&1");
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int ls_test_raw_connect(const ls_test_server *s) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = 3};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

bool ls_test_raw_read_all(int fd, char *buf, size_t cap, size_t *len) {
    *len = 0;
    for (;;) {
        ssize_t n = recv(fd, buf + *len, cap - 1 - *len, 0);
        if (n <= 0) {
            buf[*len] = '\0';
            return n == 0;
        }
        *len += (size_t)n;
        if (*len == cap - 1) {
            buf[*len] = '\0';
            return false;
        }
    }
}

double ls_test_metric(const ls_test_server *s, const char *name) {
    ls_test_response r;
    if (ls_test_http(s, "GET", "/metrics", NULL, NULL, 0, NULL, &r) != 0) return -1;
    char key[160];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = r.status == 200 && r.body ? strstr(r.body, key) : NULL;
    double v = p ? strtod(p + strlen(key), NULL) : -1;
    ls_test_response_free(&r);
    return v;
}

static long ls_test_receiving(const ls_test_server *s) {
    return (long)ls_test_metric(s, "lorasink_forwards_receiving");
}

int ls_test_open_receiving_forward(const ls_test_server *s) {
    const char *head = "POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       "Content-Length: 100\r\n\r\n{\"x\": ";
    const long before = ls_test_receiving(s);
    int fd = ls_test_raw_connect(s);
    if (fd < 0 || before < 0) goto fail;
    if (send(fd, head, strlen(head), 0) != (ssize_t)strlen(head)) goto fail;
    for (int i = 0; i < 1000; i++) { /* 10 s at most */
        if (ls_test_receiving(s) > before) return fd;
        usleep(10000);
    }
fail:
    if (fd >= 0) close(fd);
    return -1;
}

bool ls_test_wait_metric(const ls_test_server *s, const char *name, double want) {
    for (int i = 0; i < 1000; i++) {
        if (ls_test_metric(s, name) == want) return true;
        usleep(10000);
    }
    return false;
}

bool ls_test_wait_receiving(const ls_test_server *s, long want) {
    return ls_test_wait_metric(s, "lorasink_forwards_receiving", (double)want);
}

typedef struct {
    char *data;
    size_t len, cap;
} ls_test_buf;

static size_t ls_test_write(char *ptr, size_t size, size_t nmemb, void *ud) {
    ls_test_buf *b = ud;
    size_t n = size * nmemb;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        b->data = realloc(b->data, cap);
        b->cap = cap;
    }
    memcpy(b->data + b->len, ptr, n);
    b->len += n;
    b->data[b->len] = '\0';
    return n;
}

/* ls_test_http with timeout_s seconds for the whole exchange (0: no
 * limit of its own). */
static int ls_test_http_within(const ls_test_server *s, const char *method, const char *path,
                               const char *content_type, const void *body, size_t len,
                               const char *const *extra_headers, long timeout_s, ls_test_response *out) {
    memset(out, 0, sizeof *out);
    CURL *c = curl_easy_init();
    if (!c) return -1;
    char url[1024];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", s->port, path);
    ls_test_buf bb = {0}, hb = {0};
    struct curl_slist *h = NULL;
    char ct[256];
    if (body) {
        snprintf(ct, sizeof ct, "Content-Type: %s", content_type ? content_type : "application/json");
        h = curl_slist_append(h, ct);
    }
    bool expect = false;
    for (int i = 0; extra_headers && extra_headers[i]; i++) {
        h = curl_slist_append(h, extra_headers[i]);
        expect |= !strncasecmp(extra_headers[i], "Expect:", 7);
    }
    /* no 100-continue round trip unless the test asks for one */
    if (!expect) h = curl_slist_append(h, "Expect:");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, ls_test_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &bb);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, ls_test_write);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &hb);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, timeout_s);
    if (!strcmp(method, "HEAD")) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK) {
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->status);
        char *ctype = NULL;
        curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ctype);
        out->content_type = strdup(ctype ? ctype : "");
    }
    out->body = bb.data ? bb.data : strdup("");
    out->len = bb.len;
    out->headers = hb.data ? hb.data : strdup("");
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return rc == CURLE_OK ? 0 : -1;
}

int ls_test_http(const ls_test_server *s, const char *method, const char *path, const char *content_type,
                 const void *body, size_t len, const char *const *extra_headers, ls_test_response *out) {
    return ls_test_http_within(s, method, path, content_type, body, len, extra_headers, 120L, out);
}

int ls_test_http_long(const ls_test_server *s, const char *method, const char *path, const char *content_type,
                      const void *body, size_t len, const char *const *extra_headers, ls_test_response *out) {
    return ls_test_http_within(s, method, path, content_type, body, len, extra_headers, 0L, out);
}

const char *ls_test_header(const char *headers, const char *name, char *buf, size_t len) {
    buf[0] = '\0';
    const size_t k = strlen(name);
    for (const char *h = headers; h && *h;) {
        const char *eol = strstr(h, "\r\n");
        const size_t n = eol ? (size_t)(eol - h) : strlen(h);
        if (n > k + 1 && !strncasecmp(h, name, k) && h[k] == ':') {
            const char *v = h + k + 1;
            while (*v == ' ') v++;
            snprintf(buf, len, "%.*s", (int)(n - (size_t)(v - h)), v);
            return buf;
        }
        h = eol ? eol + 2 : h + n;
    }
    return buf;
}

void ls_test_response_free(ls_test_response *r) {
    free(r->body);
    free(r->headers);
    free(r->content_type);
    memset(r, 0, sizeof *r);
}

json_t *ls_test_response_json(const ls_test_response *r) {
    json_error_t jerr;
    return json_loadb(r->body, r->len, 0, &jerr);
}

const char *ls_test_error_code(const json_t *j) {
    const char *c = json_string_value(json_object_get(json_object_get(j, "error"), "code"));
    return c ? c : "";
}
