/* Test helpers every kind of test may use: the conformance example, JSON
 * arrays as doubles, temp dirs and /proc/PID/status. */
#include "tests/util/testutil.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

long ls_test_proc_kib(int pid, const char *field) {
    char path[64], line[256];
    if (pid) snprintf(path, sizeof path, "/proc/%d/status", pid);
    else snprintf(path, sizeof path, "/proc/self/status");
    FILE *f = fopen(path, "r");
    long v = -1;
    const size_t fl = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, fl) && line[fl] == ':') v = atol(line + fl + 1);
    if (f) fclose(f);
    if (v < 0) {
        fprintf(stderr, "no %s in %s\n", field, path);
        abort();
    }
    return v;
}

const char *ls_test_data_path(const char *name, char *buf, size_t len) {
    snprintf(buf, len, "%s/%s", LS_TEST_DATA, name);
    return buf;
}

json_t *ls_test_load_tiny(void) {
    char path[1024];
    json_error_t jerr;
    json_t *j = json_load_file(ls_test_data_path("tiny.json", path, sizeof path), 0, &jerr);
    if (!j) {
        fprintf(stderr, "cannot load %s: %s\n", path, jerr.text);
        abort();
    }
    return j;
}

static void ls_test_collect(const json_t *j, double *out, long *n) {
    if (json_is_array(j)) {
        for (size_t i = 0; i < json_array_size(j); i++) ls_test_collect(json_array_get(j, i), out, n);
    } else {
        if (out) out[*n] = json_number_value(j);
        (*n)++;
    }
}

double *ls_test_json_doubles(const json_t *nested, long *count) {
    long n = 0;
    ls_test_collect(nested, NULL, &n);
    double *v = calloc(n ? (size_t)n : 1, sizeof *v);
    long k = 0;
    ls_test_collect(nested, v, &k);
    *count = n;
    return v;
}

char *ls_test_mkdtemp(void) {
    char tmpl[] = "/tmp/lorasink-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

static int ls_test_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void ls_test_mkdirs(const char *base, const char *const *subs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", base, subs[i]);
        if (mkdir(path, 0700) != 0) {
            perror(path);
            abort();
        }
    }
}

void ls_test_rmtree(const char *path) {
    if (path) nftw(path, ls_test_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void *ls_test_calloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size);
    if (!p) {
        fprintf(stderr, "out of memory (%zu x %zu bytes)\n", count, size);
        abort();
    }
    return p;
}

char *ls_test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    char *text = n >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)n + 1) : NULL;
    if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "cannot read %s\n", path);
        abort();
    }
    fclose(f);
    text[n] = '\0';
    if (len) *len = (size_t)n;
    return text;
}

void ls_test_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        abort();
    }
}
