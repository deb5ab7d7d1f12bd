/* Helpers shared by every kind of test: the conformance example, JSON
 * arrays to doubles, temp dirs, /proc/PID/status. Links ls_common, jansson and cmocka only;
 * driving a real server is tests/util/server_driver.h. */
#ifndef LS_TESTS_TESTUTIL_H
#define LS_TESTS_TESTUTIL_H

#include <jansson.h>
#include <stddef.h>

/* 1 in an ASan or TSan build: its allocator and shadow memory change
 * every RSS, and its checks make the work many times slower. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LS_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define LS_TEST_SANITIZED 1
#endif
#endif
#ifndef LS_TEST_SANITIZED
#define LS_TEST_SANITIZED 0
#endif

/* tests/data/tiny.json (a copy of shared/conformance/tiny.json), parsed;
 * the caller owns the reference. Aborts the test when missing. */
json_t *ls_test_load_tiny(void);

/* Flattens nested JSON arrays of numbers into a malloc'd double array;
 * *count receives the number of values. */
double *ls_test_json_doubles(const json_t *nested, long *count);

/* Path of a file under tests/data. */
const char *ls_test_data_path(const char *name, char *buf, size_t len);

/* calloc that aborts the test when memory runs out (count 0 allocates
 * one element, so the result is never NULL). */
void *ls_test_calloc(size_t count, size_t size);

/* Writes data[len] to path (created or truncated); aborts the test when
 * it cannot. */
void ls_test_write_file(const char *path, const void *data, size_t len);

/* The whole file at path, NUL-terminated (malloc'd; *len its bytes when
 * len is non-NULL); aborts the test when it cannot be read. */
char *ls_test_read_file(const char *path, size_t *len);

/* A field of /proc/PID/status in KiB (VmRSS, VmHWM: the peak resident
 * set); pid 0 is this process. Aborts the test when it cannot be read. */
long ls_test_proc_kib(int pid, const char *field);

/* A temporary directory, created fresh; removed with ls_test_rmtree. */
char *ls_test_mkdtemp(void);
void ls_test_rmtree(const char *path);
/* Makes each of the n directories subs[i] beneath base, in order (a
 * parent before its children); aborts the test when one cannot be. */
void ls_test_mkdirs(const char *base, const char *const *subs, size_t n);

#endif
