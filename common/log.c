/* stderr logger: one line per call, formatted into a buffer first and
 * written with one fprintf (stdio locks the stream for the call), so
 * lines from threads never interleave, and no control byte in it. */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

const char *const ls_log_level_names[] = {"debug", "info", "warn", "error", NULL};

static ls_log_level ls_log_min = LS_LOG_INFO;

void ls_log_set_level(ls_log_level level) { ls_log_min = level; }

/* Writes one line: timestamp, label, then fmt. */
static void ls_log_emit(const char *label, const char *fmt, va_list ap) {
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, label);
    if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    /* Messages quote what clients and files sent: a control byte would
     * forge a line or drive the terminal. */
    for (char *c = line; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    fprintf(stderr, "%s\n", line);
}

void ls_log(ls_log_level level, const char *fmt, ...) {
    if (level < ls_log_min) return;
    va_list ap;
    va_start(ap, fmt);
    ls_log_emit(ls_log_level_names[level], fmt, ap);
    va_end(ap);
}

void ls_log_access(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ls_log_emit("access", fmt, ap);
    va_end(ap);
}
