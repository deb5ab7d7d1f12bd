/* The lorasink binary (LS_SERVER_BIN) as a child process on an ephemeral
 * port, and one HTTP request to it over libcurl. */
#include "tests/util/server_driver.h"

#include <arpa/inet.h>
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
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

struct ls_test_server {
    pid_t pid;
    int port;
    int out_fd; /* the server's stdout+stderr */
};

int ls_test_server_port(const ls_test_server *s) { return s->port; }

/* Reads what the server printed so far (non-blocking) and echoes it. */
static void ls_test_server_drain(ls_test_server *s, char *acc, size_t cap, size_t *len) {
    char buf[4096];
    ssize_t n;
    while ((n = read(s->out_fd, buf, sizeof buf)) > 0) {
        if (*len + (size_t)n < cap) {
            memcpy(acc + *len, buf, (size_t)n);
            *len += (size_t)n;
            acc[*len] = '\0';
        }
    }
}

ls_test_server *ls_test_server_start_env(const char *const *args, const char *const *env) {
    int fds[2];
    if (pipe(fds)) return NULL;
    pid_t pid = fork();
    if (pid < 0) return NULL;
    if (pid == 0) {
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
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    ls_test_server *s = calloc(1, sizeof *s);
    s->pid = pid;
    s->out_fd = fds[0];
    static char acc[1 << 16];
    size_t len = 0;
    acc[0] = '\0';
    for (int waited = 0; waited < 60000; waited += 20) {
        struct pollfd p = {.fd = s->out_fd, .events = POLLIN};
        poll(&p, 1, 20);
        ls_test_server_drain(s, acc, sizeof acc, &len);
        const char *m = strstr(acc, "listening on http://127.0.0.1:");
        if (m) {
            s->port = atoi(m + strlen("listening on http://127.0.0.1:"));
            return s;
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            ls_test_server_drain(s, acc, sizeof acc, &len);
            fprintf(stderr, "server exited early (status %d):\n%s\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                    acc);
            close(s->out_fd);
            free(s);
            return NULL;
        }
    }
    fprintf(stderr, "server did not start in 60 s:\n%s\n", acc);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(s->out_fd);
    free(s);
    return NULL;
}

ls_test_server *ls_test_server_start(const char *const *args) { return ls_test_server_start_env(args, NULL); }

int ls_test_server_stop(ls_test_server *s) {
    if (!s) return -1;
    kill(s->pid, SIGTERM);
    int status = -1;
    static char tail[1 << 16];
    size_t len = 0;
    tail[0] = '\0';
    for (int i = 0; i < 3000; i++) {
        /* keep the pipe drained so the server never blocks on its log */
        ls_test_server_drain(s, tail, sizeof tail, &len);
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) break;
        usleep(10000);
        if (i == 2999) {
            fprintf(stderr, "server did not stop in 30 s after SIGTERM; killing it\n");
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &status, 0);
        }
    }
    ls_test_server_drain(s, tail, sizeof tail, &len);
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (rc != 0) {
        if (WIFSIGNALED(status)) fprintf(stderr, "server died of signal %d on shutdown\n", WTERMSIG(status));
        else fprintf(stderr, "server exited with %d on shutdown\n", rc);
        fprintf(stderr, "its last output:\n%s\n", len > 4000 ? tail + len - 4000 : tail);
    }
    close(s->out_fd);
    free(s);
    return rc;
}

void ls_test_server_kill(ls_test_server *s) {
    if (!s) return;
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    close(s->out_fd);
    free(s);
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

int ls_test_http(const ls_test_server *s, const char *method, const char *path, const char *content_type,
                 const void *body, size_t len, const char *const *extra_headers, ls_test_response *out) {
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
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
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
