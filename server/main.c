/* lorasink's entry point: settings, start-up, serve until SIGTERM, SIGINT
 * or SIGHUP, then a graceful shutdown (stop accepting, finish requests in
 * flight, free everything, exit 0). Exit 2 for bad settings, 1 when the
 * server cannot start. */
#include <errno.h>
#include <malloc.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "config/config.h"
#include "server/http_head.h"
#include "server/probe.h"
#include "server/server.h"
#include "server/tls.h"
#include "server/tenant.h"

extern char **environ;

static int ls_stop_pipe[2] = {-1, -1};

/* Async-signal-safe: hands the signal number to main through the pipe. */
static void ls_main_on_signal(int sig) {
    int saved = errno;
    unsigned char c = (unsigned char)sig;
    ssize_t w = write(ls_stop_pipe[1], &c, 1);
    (void)w;
    errno = saved;
}

/* Whether flag is one of the arguments (flags only: no variable or
 * file key means it). */
static bool ls_argv_has(int argc, char **argv, const char *flag) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], flag)) return true;
    return false;
}

int main(int argc, char **argv) {
#ifdef M_MMAP_THRESHOLD
    /* A request's large buffers (bodies, tensors, adapters) are mapped
     * and unmapped whole, so RSS goes back down after a large request.
     * The threshold is held: glibc raises it after the first large free
     * (up to 32 MiB), and the worker threads' arenas then kept the peak
     * of past requests resident. It is 1 MiB, not glibc's 128 KiB: a
     * small forward's body and y (T=16 of H=2048: 128 KiB and a header)
     * are then reused from the arenas instead of mapped and faulted in
     * anew by every request, which cost a T=16 forward some 6% over HTTP
     * (docs/perf.md, "HTTP against in-process"). */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
    static ls_config cfg;
    char errbuf[512];
    switch (ls_config_load(&cfg, argc, argv, environ, stdout, errbuf, sizeof errbuf)) {
    case LS_CONFIG_EXIT: return 0;
    case LS_CONFIG_ERROR:
        /* A health check answers 0 or 1: Docker reserves 2. */
        if (ls_argv_has(argc, argv, "--probe")) {
            fprintf(stderr, "lorasink --probe: %s\n", errbuf);
            return 1;
        }
        fprintf(stderr, "lorasink: %s\n", errbuf);
        return 2;
    case LS_CONFIG_RUN: break;
    }
    if (cfg.probe) return ls_probe_run(&cfg);
    ls_log_set_level(cfg.log_level);
    /* A peer's flag name works as ours; the log says it was read so, as
     * the meaning differs in places (docs/configuration.md, Aliases). */
    if (cfg.aliases_used[0]) ls_log_info("peers' flag names read as lorasink's: %s", cfg.aliases_used);
    if (cfg.env_unread[0]) ls_log_warn("environment: not read, as no setting has these names: %s", cfg.env_unread);

    /* SIGTERM and SIGINT are caught by a handler, not blocked for sigwait:
     * libraries start threads before main (OpenBLAS does), and a blocked-
     * signal scheme would let the kernel deliver the signal to one of
     * those, killing the process. The handler only writes to a pipe. */
    if (pipe(ls_stop_pipe)) {
        perror("lorasink: pipe");
        return 1;
    }
    /* No SA_RESTART: the read below must return EINTR, which is also where
     * ThreadSanitizer runs a handler it deferred. */
    struct sigaction sa = {.sa_handler = ls_main_on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* SIGHUP (a closed terminal, an operator's reload habit) killed the
     * process on the spot, cutting requests in flight; nothing waits for
     * it to reload (the TLS files are watched, server/tls.h), so it stops
     * gracefully like the others. */
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* A bad key file is the operator's mistake, as a bad flag is. */
    struct ls_tenants *tenants = NULL;
    if (cfg.api_keys[0] && !ls_tenants_open(cfg.api_keys, &tenants, errbuf, sizeof errbuf)) {
        fprintf(stderr, "lorasink: %s\n", errbuf);
        return 2;
    }
    static ls_server srv;
    if (!ls_http_probe(&cfg)) {
        ls_tenants_free(tenants);
        return 1;
    }
    if (!ls_server_init(&srv, &cfg)) {
        ls_tenants_free(tenants);
        return 1;
    }
    srv.tenants = tenants;
    if (!ls_http_start(&srv)) {
        ls_server_free(&srv);
        return 1;
    }
    const char *scheme = srv.tls ? "https" : "http";
    if (strchr(cfg.host, ':')) printf("listening on %s://[%s]:%d\n", scheme, cfg.host, srv.port);
    else printf("listening on %s://%s:%d\n", scheme, cfg.host, srv.port);
    fflush(stdout);
    ls_log_info("listening on %s:%d%s%s", cfg.host, srv.port, srv.tls ? ls_tls_describe(srv.tls) : "",
                cfg.api_key[0] || tenants ? " (API key required)" : "");
    /* Reachable from other machines with no key: said once, plainly. */
    if (!cfg.api_key[0] && !tenants && !cfg.tls_client_ca[0] && !ls_http_bind_loopback(cfg.host))
        ls_log_warn("no --api-key or --api-keys, and %s is reachable from other machines: anyone who reaches port %d "
                    "can load, replace and delete adapters, load files beneath --adapter-dir and run forwards",
                    cfg.host, srv.port);

    unsigned char sig = 0;
    while (read(ls_stop_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    ls_log_info("%s: stopping: no new connections, finishing requests in flight",
                sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM");
    ls_http_stop(&srv);
    ls_server_free(&srv);
    ls_log_info("stopped");
    return 0;
}
