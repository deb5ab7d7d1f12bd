/* The allocation hook (fault_alloc.h): the __wrap_* functions the linker
 * substitutes for the allocator in every object of a fault program, the
 * counter that fails the Nth allocation, and the set of live pointers.
 *
 * This file is linked with --wrap too, so it never calls the allocator by
 * its plain name: its own storage comes from __real_calloc/__real_free.
 * One mutex guards everything (the CPU engine's threads allocate nothing
 * while they run, but a forward's threads could; pthread_mutex_lock does
 * not allocate). */
#include "tests/fault/fault_alloc.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void __real_free(void *p);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
int __real_posix_memalign(void **out, size_t align, size_t size);
void *__real_aligned_alloc(size_t align, size_t size);

void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t size);
void __wrap_free(void *p);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
int __wrap_posix_memalign(void **out, size_t align, size_t size);
void *__wrap_aligned_alloc(size_t align, size_t size);

static pthread_mutex_t fa_mu = PTHREAD_MUTEX_INITIALIZER;
static bool fa_counting, fa_did_fire, fa_parse_faults;
/* Inside json_loads/json_loadb/json_loadf on this thread (see fault_alloc.h). */
static _Thread_local int fa_parsing;
static long fa_n, fa_fail_at;

/* ---- the live set -----------------------------------------------------------
 * Open addressing with linear probing and backward-shift deletion. Slots
 * hold ~pointer, not the pointer: LeakSanitizer scans this table, and
 * plain pointers in it would make every leaked block look reachable. */
static uintptr_t *fa_tab;
static size_t fa_cap, fa_used;

static size_t fa_hash(uintptr_t p) {
    uint64_t h = (uint64_t)p;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (size_t)h;
}

static void fa_put(uintptr_t key);

static void fa_grow(void) {
    size_t old_cap = fa_cap, cap = fa_cap ? fa_cap * 2 : 1 << 14;
    uintptr_t *old = fa_tab;
    fa_tab = __real_calloc(cap, sizeof *fa_tab);
    if (!fa_tab) {
        fputs("fault_alloc: cannot grow the live set\n", stderr);
        abort();
    }
    fa_cap = cap;
    fa_used = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i]) fa_put(old[i]);
    __real_free(old);
}

static void fa_put(uintptr_t key) {
    if ((fa_used + 1) * 2 > fa_cap) fa_grow();
    size_t m = fa_cap - 1, i = fa_hash(key) & m;
    while (fa_tab[i]) {
        if (fa_tab[i] == key) return;
        i = (i + 1) & m;
    }
    fa_tab[i] = key;
    fa_used++;
}

static void fa_track(void *p) {
    if (p) fa_put(~(uintptr_t)p);
}

/* True when p was in the set (it is not any more). */
static bool fa_untrack(void *p) {
    if (!p || !fa_cap) return false;
    const uintptr_t key = ~(uintptr_t)p;
    size_t m = fa_cap - 1, i = fa_hash(key) & m;
    while (fa_tab[i] && fa_tab[i] != key) i = (i + 1) & m;
    if (!fa_tab[i]) return false;
    for (size_t j = i;;) {
        j = (j + 1) & m;
        if (!fa_tab[j]) break;
        size_t k = fa_hash(fa_tab[j]) & m;
        /* The entry at j may move to the hole at i unless its home k lies
         * cyclically in (i, j]. */
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) continue;
        fa_tab[i] = fa_tab[j];
        i = j;
    }
    fa_tab[i] = 0;
    fa_used--;
    return true;
}

/* ---- counting ---------------------------------------------------------------- */

/* Under fa_mu: counts one allocation; true when it is the one to fail. */
static bool fa_fail_now(void) {
    if (!fa_counting) return false;
    if (++fa_n != fa_fail_at) return false;
    fa_did_fire = true;
    return true;
}

void fa_arm(long n) {
    pthread_mutex_lock(&fa_mu);
    fa_counting = true;
    fa_n = 0;
    fa_fail_at = n;
    fa_did_fire = false;
    pthread_mutex_unlock(&fa_mu);
}

void fa_disarm(void) {
    pthread_mutex_lock(&fa_mu);
    fa_counting = false;
    fa_fail_at = 0;
    pthread_mutex_unlock(&fa_mu);
}

long fa_count(void) {
    pthread_mutex_lock(&fa_mu);
    long n = fa_n;
    pthread_mutex_unlock(&fa_mu);
    return n;
}

bool fa_fired(void) {
    pthread_mutex_lock(&fa_mu);
    bool f = fa_did_fire;
    pthread_mutex_unlock(&fa_mu);
    return f;
}

long fa_live(void) {
    pthread_mutex_lock(&fa_mu);
    long n = (long)fa_used;
    pthread_mutex_unlock(&fa_mu);
    return n;
}

/* ---- the wrappers ------------------------------------------------------------ */

void *__wrap_malloc(size_t size) {
    pthread_mutex_lock(&fa_mu);
    void *p = NULL;
    if (fa_fail_now()) errno = ENOMEM;
    else fa_track(p = __real_malloc(size));
    pthread_mutex_unlock(&fa_mu);
    return p;
}

void *__wrap_calloc(size_t n, size_t size) {
    pthread_mutex_lock(&fa_mu);
    void *p = NULL;
    if (fa_fail_now()) errno = ENOMEM;
    else fa_track(p = __real_calloc(n, size));
    pthread_mutex_unlock(&fa_mu);
    return p;
}

/* A failed realloc leaves p as it was, like the real one. A block the
 * hook never saw (from inside a shared library) stays unknown after it
 * moves, so the live count stays balanced. */
void *__wrap_realloc(void *p, size_t size) {
    pthread_mutex_lock(&fa_mu);
    void *q = NULL;
    if (fa_fail_now()) {
        errno = ENOMEM;
    } else {
        bool known = !p || fa_untrack(p);
        q = __real_realloc(p, size);
        if (!q && p && size) { /* the real one failed: p is still live */
            if (known) fa_track(p);
        } else if (known) {
            fa_track(q);
        }
    }
    pthread_mutex_unlock(&fa_mu);
    return q;
}

void __wrap_free(void *p) {
    if (!p) return;
    pthread_mutex_lock(&fa_mu);
    fa_untrack(p);
    __real_free(p);
    pthread_mutex_unlock(&fa_mu);
}

char *__wrap_strdup(const char *s) {
    pthread_mutex_lock(&fa_mu);
    char *p = NULL;
    if (fa_fail_now()) errno = ENOMEM;
    else fa_track(p = __real_strdup(s));
    pthread_mutex_unlock(&fa_mu);
    return p;
}

char *__wrap_strndup(const char *s, size_t n) {
    pthread_mutex_lock(&fa_mu);
    char *p = NULL;
    if (fa_fail_now()) errno = ENOMEM;
    else fa_track(p = __real_strndup(s, n));
    pthread_mutex_unlock(&fa_mu);
    return p;
}

/* posix_memalign reports failure by its return value, not errno. */
int __wrap_posix_memalign(void **out, size_t align, size_t size) {
    pthread_mutex_lock(&fa_mu);
    int rc = ENOMEM;
    if (!fa_fail_now() && (rc = __real_posix_memalign(out, align, size)) == 0) fa_track(*out);
    pthread_mutex_unlock(&fa_mu);
    return rc;
}

void *__wrap_aligned_alloc(size_t align, size_t size) {
    pthread_mutex_lock(&fa_mu);
    void *p = NULL;
    if (fa_fail_now()) errno = ENOMEM;
    else fa_track(p = __real_aligned_alloc(align, size));
    pthread_mutex_unlock(&fa_mu);
    return p;
}

/* jansson's allocator: the same counter and live set, except inside its
 * parser, which is not counted (nor failed) unless FAULT_JANSSON_PARSE is
 * set. */
static void *fa_json_malloc(size_t size) {
    pthread_mutex_lock(&fa_mu);
    void *p = NULL;
    if ((!fa_parsing || fa_parse_faults) && fa_fail_now()) errno = ENOMEM;
    else fa_track(p = __real_malloc(size));
    pthread_mutex_unlock(&fa_mu);
    return p;
}

/* The parser's entry points our code calls, wrapped to mark the thread
 * as parsing. */
json_t *__real_json_loads(const char *input, size_t flags, json_error_t *error);
json_t *__real_json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error);
json_t *__real_json_loadf(FILE *input, size_t flags, json_error_t *error);
json_t *__wrap_json_loads(const char *input, size_t flags, json_error_t *error);
json_t *__wrap_json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error);
json_t *__wrap_json_loadf(FILE *input, size_t flags, json_error_t *error);

json_t *__wrap_json_loads(const char *input, size_t flags, json_error_t *error) {
    fa_parsing++;
    json_t *j = __real_json_loads(input, flags, error);
    fa_parsing--;
    return j;
}

json_t *__wrap_json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error) {
    fa_parsing++;
    json_t *j = __real_json_loadb(buffer, buflen, flags, error);
    fa_parsing--;
    return j;
}

json_t *__wrap_json_loadf(FILE *input, size_t flags, json_error_t *error) {
    fa_parsing++;
    json_t *j = __real_json_loadf(input, flags, error);
    fa_parsing--;
    return j;
}
static void fa_json_free(void *p) { __wrap_free(p); }

void fa_fail_parser(bool on) {
    pthread_mutex_lock(&fa_mu);
    fa_parse_faults = on;
    pthread_mutex_unlock(&fa_mu);
}

void fa_init(void) {
    fa_parse_faults = getenv("FAULT_JANSSON_PARSE") != NULL;
    json_set_alloc_funcs(fa_json_malloc, fa_json_free);
}
