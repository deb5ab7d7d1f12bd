/* Logging to stderr with a timestamp and a level; thread-safe (one write
 * per line). */
#ifndef LS_COMMON_LOG_H
#define LS_COMMON_LOG_H

typedef enum { LS_LOG_DEBUG, LS_LOG_INFO, LS_LOG_WARN, LS_LOG_ERROR } ls_log_level;

/* "debug", "info", "warn", "error", by level, then NULL (the choices of
 * --log-level). */
extern const char *const ls_log_level_names[];

void ls_log_set_level(ls_log_level level);
void ls_log(ls_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One access-log line, labelled "access": written whatever the level, as
 * --access-log alone turns it off. */
void ls_log_access(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define ls_log_info(...) ls_log(LS_LOG_INFO, __VA_ARGS__)
#define ls_log_warn(...) ls_log(LS_LOG_WARN, __VA_ARGS__)
#define ls_log_error(...) ls_log(LS_LOG_ERROR, __VA_ARGS__)
#define ls_log_debug(...) ls_log(LS_LOG_DEBUG, __VA_ARGS__)

#endif
