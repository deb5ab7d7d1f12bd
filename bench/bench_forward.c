/* In-process forward timing for bench/bench_http_cost.py: the server's
 * own model, backend and pool, built from the server's command line by
 * ls_server_init (no HTTP started), and the call the batcher makes for a
 * lone request (ls_pool_forward), timed on buffers allocated once.
 *   bench_forward SERVER-ARGS...
 * then one command a line on stdin: "T NAME REPS [GAP_US]" (NAME "-":
 * the base model), answered with one line of REPS times in milliseconds;
 * x is the same values the HTTP client sends. GAP_US > 0 sleeps that
 * long before each forward, as the gap between requests leaves the
 * engine's threads idle (asleep past their spin). A line "quit" (or EOF)
 * ends. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "server/server.h"
#include "bench_util.h"

extern char **environ;

/* Runs reps forwards of T tokens of name (NULL: base) and prints their
 * times; false when a forward fails. */
static bool ls_bench_run(ls_server *srv, int T, const char *name, int reps, int gap_us, float *x, float *y) {
    ls_token_names names;
    ls_token_names_init(&names, true);
    if (name && !ls_token_names_fill(&names, name, T)) return false;
    ls_pool_used used[1];
    bool ok = true;
    for (int r = 0; r < reps && ok; r++) {
        ls_error err;
        ls_error_init(&err);
        int n_used = 0;
        if (gap_us > 0) nanosleep(&(struct timespec){gap_us / 1000000, (long)(gap_us % 1000000) * 1000}, NULL);
        double t0 = bench_now_ms();
        ok = ls_pool_forward(srv->pool, 0, T, x, NULL, name ? &names : NULL, y, used, &n_used, &err) == LS_OK;
        double ms = bench_now_ms() - t0;
        if (!ok) fprintf(stderr, "bench_forward: %s\n", err.message);
        else printf("%s%.4f", r ? " " : "", ms);
        ls_error_free(&err);
    }
    printf("\n");
    fflush(stdout);
    ls_token_names_free(&names);
    return ok;
}

int main(int argc, char **argv) {
    static ls_config cfg;
    char errbuf[512];
    if (ls_config_load(&cfg, argc, argv, environ, stderr, errbuf, sizeof errbuf) != LS_CONFIG_RUN) {
        fprintf(stderr, "bench_forward: %s\n", errbuf);
        return 2;
    }
    ls_log_set_level(LS_LOG_WARN);
    static ls_server srv;
    if (!ls_server_init(&srv, &cfg)) return 1;
    const size_t cap = (size_t)cfg.max_batch_tokens * (size_t)srv.dims.H;
    float *x = malloc(cap * sizeof *x), *y = malloc(cap * sizeof *y);
    if (!x || !y) return 1;
    for (size_t i = 0; i < cap; i++) x[i] = (float)((int)((i % (size_t)srv.dims.H) * 7 % 13) - 6) / 8.0f;
    printf("ready\n");
    fflush(stdout);
    char line[256], name[160];
    int T, reps, gap_us, rc = 0;
    while (fgets(line, sizeof line, stdin) && strncmp(line, "quit", 4)) {
        gap_us = 0;
        if (sscanf(line, "%d %159s %d %d", &T, name, &reps, &gap_us) < 3 || T < 1 || (size_t)T * srv.dims.H > cap) {
            fprintf(stderr, "bench_forward: bad command %s", line);
            rc = 2;
            break;
        }
        if (!ls_bench_run(&srv, T, strcmp(name, "-") ? name : NULL, reps, gap_us, x, y)) {
            rc = 1;
            break;
        }
    }
    free(x);
    free(y);
    ls_server_free(&srv);
    return rc;
}
