/* The live table of --api-keys: read at start, watched by a thread that
 * re-reads the file when its inode, size or times change (a bad new file
 * keeps the keys in force and says why in the log), and the lookup of a
 * bearer token with each key's request-rate bucket. */
#include "server/tenant.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/file.h"
#include "common/log.h"
#include "common/ticker.h"
#include "common/sha256.h"

/* A token bucket: rate a second, holding at most one second's worth (and
 * at least one request). */
typedef struct {
    double tokens;
    struct timespec last;
} ls_bucket;


struct ls_tenants {
    char path[4096];
    pthread_mutex_t mu; /* guards keys, buckets and id */
    ls_api_keys keys;
    ls_bucket *buckets; /* one per key */
    ls_file_stamp id;
    ls_ticker *watcher;
    bool gone; /* the file was not there at the last look (the watcher's own) */
};

/* Reads and parses path; *id is the version read. keys is the caller's
 * to free on success; on failure why says what (the file's name first). */
static bool ls_tenants_read(const char *path, ls_api_keys *keys, ls_file_stamp *id, char *why, size_t len) {
    memset(keys, 0, sizeof *keys);
    memset(id, 0, sizeof *id);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat s;
    if (fd < 0 || fstat(fd, &s) != 0) {
        char ebuf[128]; /* strerror_r: the watcher thread reads this file too */
        snprintf(why, len, "--api-keys %s: %s", path, strerror_r(errno, ebuf, sizeof ebuf));
        if (fd >= 0) close(fd);
        return false;
    }
    if (!S_ISREG(s.st_mode) || s.st_size > (off_t)LS_API_KEYS_FILE_MAX) {
        snprintf(why, len, "--api-keys %s: not a regular file of at most %u bytes", path, LS_API_KEYS_FILE_MAX);
        close(fd);
        return false;
    }
    char *text = malloc((size_t)s.st_size + 1);
    size_t got = 0;
    while (text && got < (size_t)s.st_size) {
        ssize_t n = read(fd, text + got, (size_t)s.st_size - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    bool ok = text && got == (size_t)s.st_size;
    char reason[400] = "could not read it whole";
    if (ok) ok = ls_api_keys_parse(text, got, keys, reason, sizeof reason);
    if (!ok) snprintf(why, len, "--api-keys %s: %s", path, reason);
    free(text);
    *id = ls_file_stamp_of(&s);
    return ok;
}

/* Puts a new table in force. A key kept from the old table keeps its
 * bucket, so rewriting the file does not refill a client's quota. */
static void ls_tenants_swap(ls_tenants *t, ls_api_keys *keys, ls_bucket *buckets) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    for (size_t i = 0; i < keys->n; i++) {
        buckets[i] = (ls_bucket){fmax(1.0, keys->keys[i].rate), now};
        for (size_t j = 0; j < t->keys.n; j++)
            if (!memcmp(t->keys.keys[j].sha256, keys->keys[i].sha256, 32)) buckets[i] = t->buckets[j];
    }
    ls_api_keys_free(&t->keys);
    free(t->buckets);
    t->keys = *keys;
    t->buckets = buckets;
}

/* The key ids in a and not in b (by hash), appended to out as " id id"
 * (the first 8; then how many more); how many. */
static size_t ls_tenants_only_in(const ls_api_keys *a, const ls_api_keys *b, char *out, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < a->n; i++) {
        bool found = false;
        for (size_t j = 0; j < b->n && !found; j++) found = !memcmp(a->keys[i].sha256, b->keys[j].sha256, 32);
        if (found) continue;
        const size_t at = strlen(out);
        if (n < 8) snprintf(out + at, len - at, " %s", a->keys[i].id);
        n++;
    }
    if (n > 8) {
        const size_t at = strlen(out);
        snprintf(out + at, len - at, " and %zu more", n - 8);
    }
    return n;
}

/* What a re-read changed, for its log line: "; added ID...; removed
 * ID..." by key id (a hash prefix, never a key), or "". */
static void ls_tenants_diff(const ls_api_keys *before, const ls_api_keys *after, char *out, size_t len) {
    char added[160] = "", removed[160] = "";
    const size_t a = ls_tenants_only_in(after, before, added, sizeof added);
    const size_t r = ls_tenants_only_in(before, after, removed, sizeof removed);
    snprintf(out, len, "%s%s%s%s", a ? "; added" : "", added, r ? "; removed" : "", removed);
}

/* One look at the file, every LS_TENANTS_POLL_MS on the watcher's thread:
 * re-read when it changed. */
static void ls_tenants_poll(void *arg) {
    ls_tenants *t = arg;
    struct stat s;
    if (stat(t->path, &s) != 0) {
        /* Deleted or moved away (a rename over it never leaves it gone):
         * the keys stay, which an operator revoking them must hear. */
        if (!t->gone) {
            const int e = errno;
            char ebuf[128];
            pthread_mutex_lock(&t->mu);
            const size_t n = t->keys.n;
            pthread_mutex_unlock(&t->mu);
            ls_log_warn("--api-keys %s: %s; keeping the %zu keys read before (to revoke keys, write the file without "
                        "them)",
                        t->path, strerror_r(e, ebuf, sizeof ebuf), n);
        }
        t->gone = true;
        return;
    }
    if (t->gone) ls_log_info("--api-keys %s: the file is there again", t->path);
    t->gone = false;
    const ls_file_stamp now = ls_file_stamp_of(&s);
    pthread_mutex_lock(&t->mu);
    const bool same = ls_file_stamp_same(&now, &t->id);
    pthread_mutex_unlock(&t->mu);
    if (same) return;
    ls_api_keys keys;
    ls_file_stamp id;
    char why[600];
    if (!ls_tenants_read(t->path, &keys, &id, why, sizeof why)) {
        pthread_mutex_lock(&t->mu);
        t->id = id.ino ? id : now; /* said once per version of the file */
        const size_t n = t->keys.n;
        pthread_mutex_unlock(&t->mu);
        ls_log_warn("%s; keeping the %zu keys read before", why, n);
        return;
    }
    ls_bucket *b = calloc(keys.n ? keys.n : 1, sizeof *b);
    if (!b) {
        ls_api_keys_free(&keys);
        return; /* out of memory: the next look tries again */
    }
    char diff[360];
    pthread_mutex_lock(&t->mu);
    ls_tenants_diff(&t->keys, &keys, diff, sizeof diff);
    ls_tenants_swap(t, &keys, b);
    t->id = id;
    pthread_mutex_unlock(&t->mu);
    ls_log_info("--api-keys %s: read %zu keys%s", t->path, keys.n, diff);
}

/* Owns nothing on failure. */
bool ls_tenants_open(const char *path, ls_tenants **out, char *why, size_t len) {
    *out = NULL;
    ls_tenants *t = calloc(1, sizeof *t);
    if (!t || strlen(path) >= sizeof t->path) {
        snprintf(why, len, "--api-keys: %s", t ? "the path is too long" : "out of memory");
        free(t);
        return false;
    }
    snprintf(t->path, sizeof t->path, "%s", path);
    ls_api_keys keys;
    ls_bucket *b = NULL;
    if (!ls_tenants_read(path, &keys, &t->id, why, len) || !(b = calloc(keys.n ? keys.n : 1, sizeof *b))) {
        if (!b && keys.keys) snprintf(why, len, "--api-keys: out of memory");
        ls_api_keys_free(&keys);
        free(t);
        return false;
    }
    ls_tenants_swap(t, &keys, b);
    pthread_mutex_init(&t->mu, NULL);
    if (!(t->watcher = ls_ticker_start(LS_TENANTS_POLL_MS, ls_tenants_poll, t))) {
        snprintf(why, len, "--api-keys: could not start the thread that watches the file");
        ls_tenants_free(t);
        return false;
    }
    ls_log_info("--api-keys %s: read %zu keys; re-read when it changes", path, t->keys.n);
    *out = t;
    return true;
}

void ls_tenants_free(ls_tenants *t) {
    if (!t) return;
    ls_ticker_stop(t->watcher);
    pthread_mutex_destroy(&t->mu);
    ls_api_keys_free(&t->keys);
    free(t->buckets);
    free(t);
}

size_t ls_tenants_count(ls_tenants *t) {
    pthread_mutex_lock(&t->mu);
    const size_t n = t->keys.n;
    pthread_mutex_unlock(&t->mu);
    return n;
}

/* Takes one request from bucket b of rate r; false (with the seconds to
 * wait) when it is empty. */
static bool ls_bucket_take(ls_bucket *b, double r, int *retry_after) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const double dt = (double)(now.tv_sec - b->last.tv_sec) + (double)(now.tv_nsec - b->last.tv_nsec) * 1e-9;
    b->tokens = fmin(fmax(1.0, r), b->tokens + (dt > 0 ? dt : 0) * r);
    b->last = now;
    if (b->tokens >= 1.0) {
        b->tokens -= 1.0;
        return true;
    }
    const double wait = ceil((1.0 - b->tokens) / r);
    *retry_after = wait < 1 ? 1 : wait > 86400 ? 86400 : (int)wait;
    return false;
}

/* Equal in time independent of where a and b differ. */
static bool ls_same_bytes(const uint8_t *a, const uint8_t *b, size_t n) {
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(a[i] ^ b[i]);
    return diff == 0;
}

/* The --api-key comparison: the token's length and bytes both. */
static bool ls_same_key(const char *key, const char *tok) {
    const size_t tl = strlen(tok), kl = strlen(key);
    unsigned char diff = (unsigned char)(tl != kl);
    for (size_t i = 0; i < kl; i++) diff |= (unsigned char)(key[i] ^ (i < tl ? tok[i] : 0));
    return diff == 0;
}

static ls_principal ls_admin(const char *key_id) {
    ls_principal p = {.role = LS_ROLE_ADMIN, .max_adapters = -1, .max_pins = -1};
    snprintf(p.key_id, sizeof p.key_id, "%s", key_id);
    return p;
}

ls_auth ls_tenants_authorize(ls_tenants *t, const char *api_key, const char *token, ls_principal *who,
                             int *retry_after) {
    if (!api_key[0] && !t) {
        *who = ls_admin("none");
        return LS_AUTH_OK;
    }
    if (!token) return LS_AUTH_DENIED;
    if (api_key[0] && ls_same_key(api_key, token)) {
        *who = ls_admin("api-key");
        return LS_AUTH_OK;
    }
    if (!t) return LS_AUTH_DENIED;
    uint8_t h[32];
    ls_sha256_ctx c;
    ls_sha256_init(&c);
    ls_sha256_update(&c, token, strlen(token));
    ls_sha256_final(&c, h);
    ls_auth res = LS_AUTH_DENIED;
    pthread_mutex_lock(&t->mu);
    size_t found = t->keys.n;
    for (size_t i = 0; i < t->keys.n; i++)
        if (ls_same_bytes(t->keys.keys[i].sha256, h, 32) && found == t->keys.n) found = i;
    if (found < t->keys.n) {
        const ls_api_key *k = &t->keys.keys[found];
        *who = (ls_principal){.role = k->role, .max_adapters = k->max_adapters, .max_pins = k->max_pins};
        snprintf(who->tenant, sizeof who->tenant, "%s", k->tenant);
        snprintf(who->key_id, sizeof who->key_id, "%s", k->id);
        if (k->role == LS_ROLE_ADMIN) who->max_pins = -1;
        res = k->rate > 0 && !ls_bucket_take(&t->buckets[found], k->rate, retry_after) ? LS_AUTH_RATE : LS_AUTH_OK;
    }
    pthread_mutex_unlock(&t->mu);
    return res;
}
