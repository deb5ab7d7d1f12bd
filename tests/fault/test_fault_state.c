/* Refused and cut-short writes of the state directory (fault_fs.h): a
 * load of a new name, a replace, a load of a deleted name, a delete, and
 * a delete of a record saved before floors, each with its Nth
 * file-system call failing, N = 1, 2, ... until the operation meets no
 * failure; then again with the Nth call and every one after it failing,
 * as a crash at that moment would leave the disk.
 *
 * What every attempt must satisfy (docs/reliability.md, "When the disk
 * refuses a write"):
 * - a refused call: the registry in memory is what a restart restores
 *   from the disk; LS_OK means the change was made (and comes back), an
 *   error means it was not, or, when the message says the change stands,
 *   that it was; a change not made leaves the files as they were (no
 *   floor or temporary file of a failed upload stays behind); a
 *   refusal with ENOSPC that stopped the change is
 *   LS_INSUFFICIENT_STORAGE (507), every other failure LS_INTERNAL;
 * - a crash: a restart restores the registry from before the operation
 *   or from after it, never a mix, and a deleted adapter never comes
 *   back;
 * - both: the next load of the name gets the version after the last one
 *   the restored registry knows, never one given before.
 * And a read the disk refuses, at a restore or a read-back: never taken
 * for a damaged record, so nothing acknowledged is set aside. */
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/fault/fault_fixture.h"
#include "tests/fault/fault_fs.h"
#include "tests/util/testutil.h"

typedef struct {
    const char *what;
    const char *name;                  /* the name the operation changes */
    void (*setup)(fx_world *w, const char *dir); /* beyond A v1 and B v1 */
    ls_status (*op)(fx_world *w, ls_error *err);
} fs_case;

/* The version the operation under test left in its info: after a
 * failure nonzero exactly when the change stands (lora/pool.h), which is
 * what the server's audit line follows. */
static uint64_t fs_info_version;

static ls_status fs_load(fx_world *w, const char *name, uint64_t seed, bool replace, uint64_t *version,
                         ls_error *err) {
    ls_adapter a;
    fx_adapter(2, seed, &a);
    ls_pool_load_opts o = {.replace = replace};
    ls_adapter_info info;
    memset(&info, 0xa5, sizeof info); /* the pool must set version either way */
    ls_status st = ls_pool_load(w->p, name, &a, &o, &info, err);
    fs_info_version = info.version;
    if (version) *version = st == LS_OK ? info.version : 0;
    ls_adapter_free(&a);
    return st;
}

static void fs_nothing(fx_world *w, const char *dir) { (void)w, (void)dir; }

static void fs_deleted_d(fx_world *w, const char *dir) {
    (void)dir;
    fx_load(w, "D", 2, 3, false, false);
    fx_load(w, "D", 2, 4, false, true);
    ls_error err;
    ls_error_init(&err);
    if (ls_pool_delete(w->p, "D", NULL, &err) != LS_OK) fail_msg("delete D: %s", err.message);
    ls_error_free(&err);
}

/* A record saved by a server from before floors: none beside it. */
static void fs_no_floor(fx_world *w, const char *dir) {
    (void)w;
    char path[1024];
    snprintf(path, sizeof path, "%s/A.floor", dir);
    assert_int_equal(unlink(path), 0);
}

static ls_status fs_op_new(fx_world *w, ls_error *err) { return fs_load(w, "C", 5, false, NULL, err); }
static ls_status fs_op_replace(fx_world *w, ls_error *err) { return fs_load(w, "A", 6, true, NULL, err); }
static ls_status fs_op_deleted(fx_world *w, ls_error *err) { return fs_load(w, "D", 7, false, NULL, err); }
static ls_status fs_op_delete(fx_world *w, ls_error *err) {
    ls_adapter_info info;
    memset(&info, 0xa5, sizeof info);
    const ls_status st = ls_pool_delete(w->p, "A", &info, err);
    fs_info_version = info.version;
    return st;
}

static const fs_case fs_cases[] = {
    {"load a new name", "C", fs_nothing, fs_op_new},
    {"replace", "A", fs_nothing, fs_op_replace},
    {"load a deleted name", "D", fs_deleted_d, fs_op_deleted},
    {"delete", "A", fs_nothing, fs_op_delete},
    {"delete a record saved before floors", "A", fs_no_floor, fs_op_delete},
};

/* A world over dir (kept) as the case starts from. */
static fx_world *fs_world(const fs_case *c, const char *dir) {
    fx_opts o = {.slots = 3, .state = true, .state_dir = dir};
    fx_world *w = fx_world_new(&o);
    fx_load(w, "A", 3, 1, false, false);
    fx_load(w, "B", 2, 2, false, false);
    c->setup(w, dir);
    return w;
}

/* A restart over dir: a new world with what it restores (the caller
 * frees it). */
static fx_world *fs_restored(const char *dir) {
    fx_opts o = {.slots = 3, .state = true, .state_dir = dir};
    fx_world *w = fx_world_new(&o);
    int n = 0;
    ls_error err;
    ls_error_init(&err);
    if (ls_pool_restore(w->p, &n, &err) != LS_OK) fail_msg("restore: %s", err.message);
    ls_error_free(&err);
    return w;
}

/* The registry a restart over dir restores (files too), in *s. */
static void fs_restart(const char *dir, fx_state *s) {
    fx_world *w = fs_restored(dir);
    fx_capture(w, s);
    fx_world_free(w);
}

/* The version the next load of name gets after a restart over dir (a
 * replace when it is registered); the load is undone by nothing, so call
 * it last. */
static uint64_t fs_next_version(const char *dir, const char *name) {
    fx_world *w = fs_restored(dir);
    ls_error err;
    ls_error_init(&err);
    const bool registered = ls_pool_describe(w->p, name, NULL, NULL) == LS_OK;
    uint64_t v = 0;
    if (fs_load(w, name, 99, registered, &v, &err) != LS_OK) fail_msg("load %s after: %s", name, err.message);
    ls_error_free(&err);
    fx_world_free(w);
    return v;
}

static bool fs_same_registry(const fx_state *a, const fx_state *b) {
    if (a->n_reg != b->n_reg) return false;
    for (size_t i = 0; i < a->n_reg; i++)
        if (strcmp(a->reg[i].name, b->reg[i].name) || a->reg[i].version != b->reg[i].version ||
            strcmp(a->reg[i].meta.sha256, b->reg[i].meta.sha256))
            return false;
    return true;
}

/* True when file y of a change not made is a NAME.floor that holds the
 * version NAME has in before: a delete writes one first where it was
 * missing (a floor at the record's version deletes nothing). */
static bool fs_floor_at_version(const fx_state *before, const fx_file *y) {
    const size_t len = strlen(y->path);
    if (len <= 6 || strcmp(y->path + len - 6, ".floor")) return false;
    for (size_t k = 0; k < before->n_reg; k++) {
        char text[32];
        snprintf(text, sizeof text, "%llu\n", (unsigned long long)before->reg[k].version);
        if (strlen(before->reg[k].name) == len - 6 && !strncmp(before->reg[k].name, y->path, len - 6) &&
            y->len == strlen(text) && !memcmp(y->data, text, y->len))
            return true;
    }
    return false;
}

/* The files of a change not made: those before it, but for such a floor
 * (no temporary file, no floor of a failed upload left behind). */
static void fs_expect_files_unchanged(const fx_state *before, const fx_state *now, const char *when) {
    size_t i = 0, j = 0;
    while (i < before->n_files || j < now->n_files) {
        const fx_file *x = i < before->n_files ? &before->files[i] : NULL;
        const fx_file *y = j < now->n_files ? &now->files[j] : NULL;
        const int cmp = !x ? 1 : !y ? -1 : strcmp(x->path, y->path);
        if (cmp == 0 && x->len == y->len && !memcmp(x->data, y->data, x->len)) {
            i++, j++;
        } else if (cmp > 0 && fs_floor_at_version(before, y)) {
            j++;
        } else {
            fail_msg("%s: the change was not made, yet the state directory's %s differs", when,
                     cmp <= 0 ? x->path : y->path);
        }
    }
}

/* The reference: the registries before and after the operation, and the
 * version the next load of the name gets in either case. */
typedef struct {
    fx_state before, done;
    uint64_t next_before, next_done;
} fs_ref;

static void fs_reference(const fs_case *c, fs_ref *r) {
    char *dir = ls_test_mkdtemp();
    fx_world *w = fs_world(c, dir);
    fx_world_free(w);
    fs_restart(dir, &r->before);
    r->next_before = fs_next_version(dir, c->name);
    ls_test_rmtree(dir);
    free(dir);
    dir = ls_test_mkdtemp();
    w = fs_world(c, dir);
    ls_error err;
    ls_error_init(&err);
    if (c->op(w, &err) != LS_OK) fail_msg("%s: the run without failures failed: %s", c->what, err.message);
    ls_error_free(&err);
    fx_world_free(w);
    fs_restart(dir, &r->done);
    r->next_done = fs_next_version(dir, c->name);
    ls_test_rmtree(dir);
    free(dir);
}

/* One attempt: false when the operation ran through without meeting
 * the Nth call. */
static bool fs_attempt(const fs_case *c, const fs_ref *r, long n, bool crash) {
    char when[256];
    snprintf(when, sizeof when, "%s, %s at call %ld", c->what, crash ? "a crash" : "a refusal", n);
    char *dir = ls_test_mkdtemp();
    fx_world *w = fs_world(c, dir);
    fx_state before, mem, disk;
    fx_capture(w, &before);
    ls_error err;
    ls_error_init(&err);
    fs_arm(n, crash);
    const ls_status st = c->op(w, &err);
    const bool fired = fs_fired();
    fs_disarm();
    if (getenv("FAULT_VERBOSE"))
        printf("  %s (%s): %s %s\n", when, fired ? fs_fired_call() : "not met", ls_status_code(st), err.message);
    fx_capture(w, &mem);
    fx_world_free(w);
    fx_state files; /* as the operation left them, before a restart tidies anything */
    memset(&files, 0, sizeof files);
    fx_read_files(dir, &files);
    fs_restart(dir, &disk);
    const bool was_before = fs_same_registry(&disk, &r->before), was_done = fs_same_registry(&disk, &r->done);
    if (!was_before && !was_done) fail_msg("%s: a restart restores neither the registry before nor after", when);
    if (!crash) {
        if (!fs_same_registry(&mem, &disk)) fail_msg("%s: memory and disk disagree after %s", when, err.message);
        if (st == LS_OK && !was_done) fail_msg("%s: LS_OK, but the change is not on disk", when);
        if (st != LS_OK && !err.message[0]) fail_msg("%s: failed with %s and no message", when, ls_status_code(st));
        /* A full disk that stopped the change is the operator's to fix
         * and the client's to retry (507); any other refusal, or one that
         * came after the change stood, is 500. */
        const ls_status want_st =
            fs_fired_errno() == ENOSPC && !was_done ? LS_INSUFFICIENT_STORAGE : LS_INTERNAL;
        if (st != LS_OK && st != want_st)
            fail_msg("%s: failed with %s, not %s: %s", when, ls_status_code(st), ls_status_code(want_st),
                     err.message);
        if (st != LS_OK && was_done != !!strstr(err.message, "its durability is not confirmed"))
            fail_msg("%s: the change was%s made, but the error says otherwise: %s", when, was_done ? "" : " not",
                     err.message);
        if (st != LS_OK && !was_done) fs_expect_files_unchanged(&before, &files, when);
        if (st != LS_OK && (fs_info_version > 0) != was_done)
            fail_msg("%s: the change was%s made, but info.version is %llu", when, was_done ? "" : " not",
                     (unsigned long long)fs_info_version);
    }
    const uint64_t next = fs_next_version(dir, c->name), want = was_done ? r->next_done : r->next_before;
    if (next != want) fail_msg("%s: the next version of %s is %llu, not %llu", when, c->name,
                               (unsigned long long)next, (unsigned long long)want);
    ls_error_free(&err);
    fx_state_free(&before);
    fx_state_free(&mem);
    fx_state_free(&files);
    fx_state_free(&disk);
    ls_test_rmtree(dir);
    free(dir);
    return fired;
}

static void fs_sweep(bool crash) {
    for (size_t i = 0; i < sizeof fs_cases / sizeof *fs_cases; i++) {
        const fs_case *c = &fs_cases[i];
        fs_ref r;
        memset(&r, 0, sizeof r);
        fs_reference(c, &r);
        long n = 1;
        while (fs_attempt(c, &r, n, crash)) n++;
        print_message("%s, %s: %ld file-system calls, each %s in turn\n", c->what, crash ? "crash" : "refusal", n - 1,
                      crash ? "the moment of a crash" : "refused");
        fx_state_free(&r.before);
        fx_state_free(&r.done);
    }
}

static void test_refused_calls(void **state) {
    (void)state;
    fs_sweep(false);
}

static void test_crash_at_every_call(void **state) {
    (void)state;
    fs_sweep(true);
}

/* A read of the state directory the disk refuses (EIO from a plain
 * openat, as fault_fs fails one): a record that cannot be read now was
 * taken as damaged, set aside into corrupt/ at a restore (its adapter
 * gone from the next start) and blamed on "the state directory was
 * changed behind the server" when read back for a forward. Now the
 * restore fails, naming the file and what to check, and loses nothing;
 * the read-back says to retry. */
static void test_refused_reads(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    fx_world_free(fs_world(&fs_cases[0], dir));
    fx_state before;
    fs_restart(dir, &before);
    fx_world *w = fs_restored(dir);
    long n = 1;
    for (bool fired = true; fired; n++) {
        ls_adapter a;
        ls_error err;
        ls_error_init(&err);
        fs_arm(n, false);
        const ls_status st = ls_state_read(w->state, "A", 1, &a, &err);
        fired = fs_fired();
        fs_disarm();
        if (st == LS_OK) ls_adapter_free(&a);
        if (fired && (st != LS_INTERNAL || !strstr(err.message, "cannot be read back now") ||
                      !strstr(err.hint, "retry")))
            fail_msg("a read-back refused at call %ld: %s %s (%s)", n, ls_status_code(st), err.message, err.hint);
        if (!fired && st != LS_OK) fail_msg("a read-back without a refusal: %s", err.message);
        ls_error_free(&err);
    }
    fx_world_free(w);
    long restores = 0;
    for (bool fired = true; fired; restores++) {
        fx_opts o = {.slots = 3, .state = true, .state_dir = dir};
        w = fx_world_new(&o);
        int count = 0;
        ls_error err;
        ls_error_init(&err);
        fs_arm(restores + 1, false);
        const ls_status st = ls_pool_restore(w->p, &count, &err);
        fired = fs_fired();
        fs_disarm();
        if (st != LS_OK && (st != LS_INTERNAL || !strstr(err.hint, "move the file out")))
            fail_msg("a restore with call %ld refused (%s): %s %s", restores + 1, fs_fired_call(),
                     ls_status_code(st), err.message);
        ls_error_free(&err);
        fx_world_free(w);
        /* Whatever the refusal did, a clean start finds every adapter. */
        fx_state after;
        fs_restart(dir, &after);
        if (!fs_same_registry(&before, &after))
            fail_msg("a restore with call %ld refused (%s) lost an adapter: %zu of %zu come back", restores + 1,
                     fs_fired_call(), after.n_reg, before.n_reg);
        fx_state_free(&after);
    }
    print_message("read-back: %ld file-system calls, restore: %ld, each refused in turn\n", n - 2, restores - 1);
    fx_state_free(&before);
    ls_test_rmtree(dir);
    free(dir);
}

int main(void) {
    fx_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_calls),
        cmocka_unit_test(test_crash_at_every_call),
        cmocka_unit_test(test_refused_reads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
