/* --auto-load: registering an adapter a forward named, from the adapter
 * directory, once per name however many requests ask at the same time,
 * and remembering a file that failed so that a bad file is not read and
 * validated again on every request. A load has two halves that run on
 * different threads: reading and validating the files (the disk) and
 * registering the adapter (which may wait for the backend). */
#include "lora/autoload.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "lora/loader_memo.h"

/* Remembered names at most: past it, the oldest settled ones are dropped
 * (a dropped failure is only read again once). */
#define LS_AUTOLOAD_MAX_ENTRIES 4096

/* Where the load of a name stands. Only READING and LOADING are waited
 * for, and each is held by a thread that is running (never queued), so a
 * waiter cannot wait on a job queued behind it. */
typedef enum {
    LS_AUTOLOAD_IDLE,    /* no load */
    LS_AUTOLOAD_READING, /* a thread reads and validates the files now (never waits for the backend) */
    LS_AUTOLOAD_STAGED,  /* read and valid, in staged: the next thread that may wait on the backend registers it */
    LS_AUTOLOAD_LOADING, /* a thread registers it now (or reads and registers it) */
} ls_autoload_state;

typedef struct ls_autoload_entry {
    char name[129];
    ls_autoload_state state;
    int waiters;         /* requests waiting for the load to end */
    uint64_t generation; /* bumped when a load ends */
    ls_status outcome;   /* of the last load */
    ls_error err;        /* its error when it failed */
    bool remembered;     /* the failure is the file's: given again until print changes */
    ls_loader_print print;
    ls_adapter staged; /* STAGED: the adapter read, and where from */
    ls_adapter_origin origin;
    struct ls_autoload_entry *next;
} ls_autoload_entry;

struct ls_autoload {
    const ls_loader *ld;
    ls_pool *pool;
    ls_autoload_gauge gauge; /* the loads gauge; fn NULL when none */
    ls_autoload_registrar registrar; /* fn NULL when none */
    bool strict;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ls_autoload_entry *head; /* newest first */
    size_t count;
    atomic_ullong attempts;
};

ls_status ls_autoload_create(const ls_loader *ld, ls_pool *pool, const ls_autoload_gauge *gauge, bool strict,
                             ls_autoload **out, ls_error *err) {
    ls_autoload *al = calloc(1, sizeof *al);
    if (!al) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    al->ld = ld;
    al->pool = pool;
    if (gauge) al->gauge = *gauge;
    al->strict = strict;
    pthread_mutex_init(&al->mu, NULL);
    pthread_cond_init(&al->cv, NULL);
    *out = al;
    return LS_OK;
}

static void ls_autoload_entry_free(ls_autoload_entry *e) {
    ls_error_free(&e->err);
    ls_adapter_free(&e->staged);
    free(e);
}

void ls_autoload_free(ls_autoload *al) {
    if (!al) return;
    for (ls_autoload_entry *e = al->head, *next; e; e = next) {
        next = e->next;
        ls_autoload_entry_free(e);
    }
    pthread_cond_destroy(&al->cv);
    pthread_mutex_destroy(&al->mu);
    free(al);
}

unsigned long long ls_autoload_attempts(const ls_autoload *al) { return atomic_load(&al->attempts); }

static void ls_autoload_count(ls_autoload *al, int delta) {
    if (al->gauge.fn) al->gauge.fn(al->gauge.ctx, delta);
}

/* Stats resolve rel as the loader opens it (ls_loader_stat): links
 * followed only as far as an upload of that path follows them, a
 * tenant's path beneath its own directory. */
static void ls_autoload_stat(const ls_loader *ld, const char *rel, int i, ls_loader_print *p) {
    struct stat st;
    if (ls_loader_stat(ld, rel, &st)) p->f[i].missing = 1;
    else ls_loader_print_set(p, i, &st);
}

/* 1 when rel is there (a directory, when dir), 0 when not, -1 when that
 * cannot be told (a link that leads out, a server out of descriptors):
 * the loader's open then answers with the error an upload of that path
 * gets, where "holds neither" would send the client looking. */
static int ls_autoload_there(const ls_loader *ld, const char *rel, bool dir) {
    struct stat st;
    if (!ls_loader_stat(ld, rel, &st)) return !dir || S_ISDIR(st.st_mode);
    return errno == ENOENT || errno == ENOTDIR ? 0 : -1;
}

/* Finds name's files: NAME/ (a PEFT directory, first) or NAME.safetensors,
 * into path (relative to the adapter directory) and print; false when the
 * directory holds neither. name is a valid pool name (no part starting
 * with '.'; a tenant's TENANT/NAME is found in the tenant's directory
 * TENANT/), so these stay in the directory; the loader's open checks links. */
static bool ls_autoload_find(const ls_autoload *al, const char *name, char *path, size_t len, ls_loader_print *p) {
    memset(p, 0, sizeof *p);
    char rel[192];
    const int dir = ls_autoload_there(al->ld, name, true);
    /* Whatever NAME.safetensors is (a FIFO, a link to a device) is the
     * file asked for: the loader's open refuses what is not a regular
     * file beneath the directory. It goes before a NAME that cannot be
     * told to be a directory (a link out, say). */
    snprintf(rel, sizeof rel, "%s.safetensors", name);
    if (dir != 1 && ls_autoload_there(al->ld, rel, false) != 0) {
        snprintf(path, len, "%s", rel);
        ls_autoload_stat(al->ld, rel, 0, p);
        return true;
    }
    if (dir == 0) return false;
    snprintf(path, len, "%s", name);
    snprintf(rel, sizeof rel, "%s/adapter_model.safetensors", name);
    ls_autoload_stat(al->ld, rel, 0, p);
    snprintf(rel, sizeof rel, "%s/adapter_config.json", name);
    ls_autoload_stat(al->ld, rel, 1, p);
    return true;
}

/* The answer for a name the adapter directory has no files for, with the
 * nearest registered name when one is near (a typo of a loaded adapter). */
static ls_status ls_autoload_not_found(const ls_autoload *al, const char *name, ls_error *err) {
    char near[136] = "", was[96] = "";
    const uint64_t last = ls_pool_nearest(al->pool, name, near, sizeof near);
    if (last)
        snprintf(was, sizeof was, " (it was deleted, or not restored at start-up; its last version was %" PRIu64 ")",
                 last);
    /* A tenant's TENANT/NAME is looked for in its own directory (the
     * reply loses every "TENANT/", so the text never spells it). */
    const bool tenant = al->ld->scoped && strchr(name, '/') != NULL;
    return ls_error_set(err, LS_ADAPTER_NOT_FOUND,
                        tenant ? "load it with POST /adapters, or put NAME/ (PEFT) or NAME.safetensors in the tenant's "
                                 "own directory of --adapter-dir (named as the tenant)"
                               : "load it with POST /adapters, or put NAME/ (PEFT) or NAME.safetensors in the adapter "
                                 "directory",
                        "adapter '%s' is not registered%s, and %s holds neither %s/ nor %s.safetensors%s%s%s", name,
                        was, tenant ? "the tenant's directory" : "the adapter directory", name, name,
                        near[0] ? "; did you mean '" : "", near, near[0] ? "'?" : "");
}

/* With mu held: name's entry, or NULL. */
static ls_autoload_entry *ls_autoload_entry_find(const ls_autoload *al, const char *name) {
    ls_autoload_entry *e = al->head;
    while (e && strcmp(e->name, name)) e = e->next;
    return e;
}

/* With mu held: whether nothing holds e: no load in any stage, nobody
 * waiting. */
static bool ls_autoload_entry_idle(const ls_autoload_entry *e) {
    return e->state == LS_AUTOLOAD_IDLE && !e->waiters;
}

/* With mu held: name's entry, created when absent (NULL when out of
 * memory). Idle entries past the cap go, oldest first. */
static ls_autoload_entry *ls_autoload_entry_get(ls_autoload *al, const char *name) {
    ls_autoload_entry *found = ls_autoload_entry_find(al, name);
    if (found) return found;
    if (al->count >= LS_AUTOLOAD_MAX_ENTRIES) {
        ls_autoload_entry **last = NULL;
        for (ls_autoload_entry **pe = &al->head; *pe; pe = &(*pe)->next)
            if (ls_autoload_entry_idle(*pe)) last = pe;
        if (last) {
            ls_autoload_entry *old = *last;
            *last = old->next;
            ls_autoload_entry_free(old);
            al->count--;
        }
    }
    ls_autoload_entry *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    snprintf(e->name, sizeof e->name, "%s", name);
    ls_error_init(&e->err);
    e->next = al->head;
    al->head = e;
    al->count++;
    return e;
}

/* With mu held: drops e when nothing needs it any more (a success, once
 * its waiters have read it). */
static void ls_autoload_entry_settle(ls_autoload *al, ls_autoload_entry *e) {
    if (!ls_autoload_entry_idle(e) || e->remembered) return;
    for (ls_autoload_entry **pe = &al->head; *pe; pe = &(*pe)->next)
        if (*pe == e) {
            *pe = e->next;
            ls_autoload_entry_free(e);
            al->count--;
            return;
        }
}

/* With mu held: e's outcome for a caller, its error copied into err. */
static ls_status ls_autoload_outcome(const ls_autoload_entry *e, ls_error *err) {
    if (e->outcome != LS_OK && err) ls_error_copy(err, &e->err);
    return e->outcome;
}

/* With mu held: ends e's load with st (mine its error): waiters wake and
 * share it, and a failure of the files themselves is remembered against
 * their print. The loads gauge counted the load from its claim. */
static void ls_autoload_end(ls_autoload *al, ls_autoload_entry *e, ls_status st, const ls_error *mine) {
    ls_autoload_count(al, -1);
    e->state = LS_AUTOLOAD_IDLE;
    e->generation++;
    e->outcome = st;
    ls_error_clear(&e->err);
    if (st != LS_OK) {
        ls_error_copy(&e->err, mine);
        /* Only what the file itself got wrong is remembered (its content,
         * its size, its path: ls_status_is_input); a full pool, a device
         * error or a server short of descriptors may pass, so the next
         * request tries again. */
        e->remembered = ls_status_is_input(st);
        ls_log_warn("auto-load: adapter %s from %s failed: %s", e->name, e->origin.path, mine->message);
    }
    pthread_cond_broadcast(&al->cv);
}

/* With mu held, state just set to READING or LOADING by this thread: reads
 * and validates e's files into e->staged (the lock is let go meanwhile).
 * LS_OK leaves the adapter there; a failure ends the load. */
static ls_status ls_autoload_read_files(ls_autoload *al, ls_autoload_entry *e, ls_error *err) {
    e->remembered = false;
    ls_autoload_count(al, +1);
    atomic_fetch_add(&al->attempts, 1);
    pthread_mutex_unlock(&al->mu);
    ls_adapter a;
    ls_adapter_origin origin;
    /* A tenant's adapter ("TENANT/NAME") is found in its directory only. */
    ls_adapter_source src = {.path = e->origin.path, .given = {.strict = al->strict},
                             .tenant = strchr(e->origin.path, '/') != NULL};
    ls_error mine;
    ls_error_init(&mine);
    ls_status st = ls_loader_load(al->ld, &src, &a, &origin, &mine);
    if (st != LS_OK && origin.absent) {
        /* The files went away between finding and opening them: the
         * answer is the one a request a moment later gets (looking again
         * is no test: the files may be back by then). */
        ls_error_clear(&mine);
        st = ls_autoload_not_found(al, e->name, &mine);
    }
    pthread_mutex_lock(&al->mu);
    if (st == LS_OK) {
        e->staged = a;
        e->origin = origin;
    } else {
        ls_autoload_end(al, e, st, &mine);
        if (err) ls_error_copy(err, &mine);
    }
    ls_error_free(&mine);
    return st;
}

/* With mu held and e STAGED, now LOADING by this thread: registers the
 * staged adapter (the lock is let go meanwhile, as it may wait for the
 * backend) and ends the load. */
static ls_status ls_autoload_register(ls_autoload *al, ls_autoload_entry *e, const void *actor, ls_error *err) {
    ls_adapter a = e->staged;
    memset(&e->staged, 0, sizeof e->staged);
    const ls_adapter_origin origin = e->origin;
    pthread_mutex_unlock(&al->mu);
    ls_pool_load_opts opts = {.source_path = origin.path, .params = origin.params, .auto_loaded = true};
    ls_adapter_info info;
    ls_error mine;
    ls_error_init(&mine);
    ls_status st = al->registrar.fn ? al->registrar.fn(al->registrar.ctx, actor, e->name, &a, &opts, &info, &mine)
                                    : ls_pool_load(al->pool, e->name, &a, &opts, &info, &mine);
    if (st == LS_OK) {
        ls_log_info("auto-load: adapter %s v%llu loaded from %s: rank %d, %s", e->name,
                    (unsigned long long)info.version, origin.path, info.meta.rank,
                    ls_adapter_format_name(info.meta.format));
    } else {
        ls_adapter_free(&a);
        /* A client registered the name meanwhile: the forward runs on that. */
        if (st == LS_ADAPTER_EXISTS) st = LS_OK;
    }
    pthread_mutex_lock(&al->mu);
    ls_autoload_end(al, e, st, &mine);
    if (st != LS_OK && err) ls_error_copy(err, &mine);
    ls_error_free(&mine);
    return st;
}

/* Registers name's staged adapter when one is: true with *st its outcome,
 * false (nothing done) when none is staged. */
static bool ls_autoload_register_staged(ls_autoload *al, const char *name, const void *actor, ls_status *st,
                                        ls_error *err) {
    pthread_mutex_lock(&al->mu);
    ls_autoload_entry *e = ls_autoload_entry_find(al, name);
    const bool staged = e && e->state == LS_AUTOLOAD_STAGED;
    if (staged) {
        e->state = LS_AUTOLOAD_LOADING;
        *st = ls_autoload_register(al, e, actor, err);
        ls_autoload_entry_settle(al, e);
    }
    pthread_mutex_unlock(&al->mu);
    return staged;
}

/* How far ls_autoload_step may go. */
typedef enum {
    LS_AUTOLOAD_LOOK, /* neither read nor wait */
    LS_AUTOLOAD_DISK, /* read and validate, never wait */
    LS_AUTOLOAD_ALL,  /* whatever it takes: read, wait, register */
} ls_autoload_reach;

/* The one path of the three entry points: what name needs, found in one
 * look under the lock (so nothing changes between looking and acting),
 * and done as far as reach allows. need says what is left for a thread of
 * longer reach (LS_AUTOLOAD_READY: nothing); an error is the request's
 * answer. Longer than 80 lines on purpose: every state a name can be in
 * and what each reach does with it are read in one place, under one
 * lock; split, the transitions would hide in helpers that each need the
 * lock held and the entry pinned. */
static ls_status ls_autoload_step(ls_autoload *al, const char *name, ls_autoload_reach reach, const void *actor,
                                  ls_autoload_need *need, ls_error *err) {
    *need = LS_AUTOLOAD_READY;
    /* A staged adapter first, before the pool or the directory is looked
     * at: its reader's forward counts on this call to end that load (the
     * loads gauge counts it until then). Left staged because a client
     * uploaded the name or its file went away meanwhile, it stayed
     * forever, and once the name was free again a later request
     * registered it in place of the files as they had become. */
    ls_status staged_st;
    if (reach == LS_AUTOLOAD_ALL && ls_autoload_register_staged(al, name, actor, &staged_st, err)) return staged_st;
    if (ls_pool_describe(al->pool, name, NULL, NULL) == LS_OK) return LS_OK;
    char path[LS_LOADER_PATH_MAX];
    ls_loader_print print;
    if (!ls_autoload_find(al, name, path, sizeof path, &print))
        return ls_autoload_not_found(al, name, err);

    pthread_mutex_lock(&al->mu);
    ls_autoload_entry *e = ls_autoload_entry_get(al, name);
    if (!e) {
        pthread_mutex_unlock(&al->mu);
        return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    }
    ls_status st = LS_OK;
    bool waited = false;
    uint64_t gen = 0;
    for (;;) {
        if (waited && e->generation != gen) {
            st = ls_autoload_outcome(e, err); /* the load waited for ended: its outcome is ours */
            break;
        }
        if (e->state == LS_AUTOLOAD_READING || e->state == LS_AUTOLOAD_LOADING) {
            /* One load per name: wait for the one running and share its
             * end (or take it over once it is staged). */
            *need = LS_AUTOLOAD_WAIT;
            if (reach != LS_AUTOLOAD_ALL) break;
            if (!waited) {
                waited = true;
                gen = e->generation;
                e->waiters++;
            }
            pthread_cond_wait(&al->cv, &al->mu);
            continue;
        }
        if (e->state == LS_AUTOLOAD_STAGED) {
            *need = LS_AUTOLOAD_WAIT; /* read by another request */
            if (reach == LS_AUTOLOAD_ALL) {
                e->state = LS_AUTOLOAD_LOADING;
                st = ls_autoload_register(al, e, actor, err);
                *need = LS_AUTOLOAD_READY;
            }
            break;
        }
        if (e->remembered && !memcmp(&e->print, &print, sizeof print)) {
            st = ls_autoload_outcome(e, err); /* the same files failed before */
            break;
        }
        /* A load that ended between the first look and this lock
         * registered it: one load per name, not one per unlucky request. */
        if (ls_pool_describe(al->pool, name, NULL, NULL) == LS_OK) break;
        *need = LS_AUTOLOAD_READ;
        if (reach == LS_AUTOLOAD_LOOK) break;
        e->state = reach == LS_AUTOLOAD_ALL ? LS_AUTOLOAD_LOADING : LS_AUTOLOAD_READING;
        e->print = print;
        snprintf(e->origin.path, sizeof e->origin.path, "%s", path);
        st = ls_autoload_read_files(al, e, err);
        if (st != LS_OK) {
            *need = LS_AUTOLOAD_READY;
        } else if (reach == LS_AUTOLOAD_ALL) {
            st = ls_autoload_register(al, e, actor, err);
            *need = LS_AUTOLOAD_READY;
        } else {
            e->state = LS_AUTOLOAD_STAGED;
            *need = LS_AUTOLOAD_LOAD;
            pthread_cond_broadcast(&al->cv); /* a waiter may take it over */
        }
        break;
    }
    if (waited) e->waiters--;
    ls_autoload_entry_settle(al, e);
    pthread_mutex_unlock(&al->mu);
    return st;
}

ls_status ls_autoload_check(ls_autoload *al, const char *name, ls_autoload_need *need, ls_error *err) {
    return ls_autoload_step(al, name, LS_AUTOLOAD_LOOK, NULL, need, err);
}

ls_status ls_autoload_read(ls_autoload *al, const char *name, ls_autoload_need *need, ls_error *err) {
    return ls_autoload_step(al, name, LS_AUTOLOAD_DISK, NULL, need, err);
}

ls_status ls_autoload_ensure_by(ls_autoload *al, const char *name, const void *actor, ls_error *err) {
    ls_autoload_need need;
    return ls_autoload_step(al, name, LS_AUTOLOAD_ALL, actor, &need, err);
}

ls_status ls_autoload_ensure(ls_autoload *al, const char *name, ls_error *err) {
    return ls_autoload_ensure_by(al, name, NULL, err);
}

ls_status ls_autoload_finish_by(ls_autoload *al, const char *name, const void *actor, ls_error *err) {
    ls_status st = LS_OK;
    ls_autoload_register_staged(al, name, actor, &st, err);
    return st;
}

ls_status ls_autoload_finish(ls_autoload *al, const char *name, ls_error *err) {
    return ls_autoload_finish_by(al, name, NULL, err);
}

void ls_autoload_set_registrar(ls_autoload *al, const ls_autoload_registrar *registrar) {
    al->registrar = registrar ? *registrar : (ls_autoload_registrar){0};
}
