/* The loader's memory of failed adapter files (loader_memo.h): a small
 * table under a mutex, searched by path, file identity and the
 * parameters the request stated (a stated alpha or strict can turn a
 * failure into a success, so each set of them is its own entry). */
#include "lora/loader_memo.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *path; /* owned; NULL for a free entry */
    ls_loader_print print;
    ls_adapter_params given;
    bool merge;
    ls_error err;
    uint64_t stamp; /* when it was remembered: the oldest goes first */
} ls_loader_memo_entry;

struct ls_loader_memo {
    pthread_mutex_t mu;
    ls_loader_memo_entry e[LS_LOADER_MEMO_MAX];
    uint64_t clock;
    atomic_ullong reads;
};

ls_loader_memo *ls_loader_memo_create(void) {
    ls_loader_memo *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    for (int i = 0; i < LS_LOADER_MEMO_MAX; i++) ls_error_init(&m->e[i].err);
    return m;
}

void ls_loader_memo_free(ls_loader_memo *m) {
    if (!m) return;
    for (int i = 0; i < LS_LOADER_MEMO_MAX; i++) {
        free(m->e[i].path);
        ls_error_free(&m->e[i].err);
    }
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void ls_loader_memo_count_read(ls_loader_memo *m) { atomic_fetch_add(&m->reads, 1); }

unsigned long long ls_loader_memo_reads(const ls_loader_memo *m) {
    return atomic_load(&((ls_loader_memo *)m)->reads);
}

void ls_loader_print_set(ls_loader_print *p, int i, const struct stat *st) {
    p->f[i].stamp = ls_file_stamp_of(st);
}

/* Field by field: the struct has padding that memcmp would compare. */
static bool ls_loader_params_equal(const ls_adapter_params *a, const ls_adapter_params *b) {
    return a->format == b->format && a->r == b->r && a->has_alpha == b->has_alpha && a->lora_alpha == b->lora_alpha &&
           a->has_rslora == b->has_rslora && a->use_rslora == b->use_rslora && a->whole_config == b->whole_config &&
           a->has_scale == b->has_scale && a->scale == b->scale && a->strict == b->strict &&
           a->has_order == b->has_order && a->gate_up_order == b->gate_up_order;
}

/* With mu held: the entry for the key, or NULL. */
static ls_loader_memo_entry *ls_loader_memo_at(ls_loader_memo *m, const char *path, const ls_loader_print *print,
                                               const ls_adapter_params *given, bool merge) {
    for (int i = 0; i < LS_LOADER_MEMO_MAX; i++) {
        ls_loader_memo_entry *e = &m->e[i];
        if (e->path && e->merge == merge && !strcmp(e->path, path) && !memcmp(&e->print, print, sizeof *print) &&
            ls_loader_params_equal(&e->given, given))
            return e;
    }
    return NULL;
}

bool ls_loader_memo_find(ls_loader_memo *m, const char *path, const ls_loader_print *print,
                         const ls_adapter_params *given, bool merge, ls_status *code, ls_error *err) {
    pthread_mutex_lock(&m->mu);
    const ls_loader_memo_entry *e = ls_loader_memo_at(m, path, print, given, merge);
    if (e) {
        *code = e->err.code;
        ls_error_copy(err, &e->err); /* out of memory keeps the message, drops violations */
    }
    pthread_mutex_unlock(&m->mu);
    return e != NULL;
}

void ls_loader_memo_put(ls_loader_memo *m, const char *path, const ls_loader_print *print,
                        const ls_adapter_params *given, bool merge, const ls_error *err) {
    char *copy = strdup(path);
    if (!copy) return;
    pthread_mutex_lock(&m->mu);
    /* The same key again, else a free entry, else the oldest. */
    ls_loader_memo_entry *e = ls_loader_memo_at(m, path, print, given, merge);
    for (int i = 0; !e && i < LS_LOADER_MEMO_MAX; i++)
        if (!m->e[i].path) e = &m->e[i];
    if (!e) {
        e = &m->e[0];
        for (int i = 1; i < LS_LOADER_MEMO_MAX; i++)
            if (m->e[i].stamp < e->stamp) e = &m->e[i];
    }
    free(e->path);
    ls_error_free(&e->err);
    ls_error_init(&e->err);
    e->path = copy;
    e->print = *print;
    e->given = *given;
    e->merge = merge;
    e->stamp = ++m->clock;
    if (!ls_error_copy(&e->err, err)) { /* half a copy is not the answer the file gave */
        free(e->path);
        e->path = NULL;
        ls_error_free(&e->err);
        ls_error_init(&e->err);
    }
    pthread_mutex_unlock(&m->mu);
}
