/* The durable registry (lora/state.c, lora/state_restore.c) and the pool
 * over it: records read back exactly, tombstones, the restore scan that
 * sets aside what it cannot read and removes cut-short writes, hostile
 * files (FIFOs, links, directories, sparse giants, names and scales an
 * upload would refuse, versions that would wrap, corrupt/ as a link), a
 * pool restored from the directory (versions, sha256, pins, forwards),
 * the lock that keeps a second server out, and a disk that refuses a
 * write, or is full, leaving the pool as the disk says. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "lora/pool.h"
#include "lora/state.h"
#include "lora/state_internal.h"
#include "tests/util/pool_cases.h"
#include "tests/util/state_files.h"
#include "tests/util/testutil.h"

static ls_state *open_state(const char *dir) {
    ls_state *s = NULL;
    ls_error err;
    ls_error_init(&err);
    if (ls_state_open(dir, &s, &err) != LS_OK) fail_msg("ls_state_open: %s", err.message);
    ls_error_free(&err);
    return s;
}

static bool file_exists(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Files of dir/sub (sub NULL: dir itself) whose name starts with prefix. */
static int count_files(const char *dir, const char *sub, const char *prefix) {
    char path[1024];
    snprintf(path, sizeof path, "%s%s%s", dir, sub ? "/" : "", sub ? sub : "");
    DIR *d = opendir(path);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.' && !strncmp(e->d_name, prefix, strlen(prefix))) n++;
    closedir(d);
    return n;
}

static void write_file(const char *dir, const char *name, const void *data, size_t len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ls_test_write_file(path, data, len);
}

/* Changes one byte of dir/file, at off from its end (a factor byte: the
 * header before the factors still reads). */
static void flip_byte(const char *dir, const char *file, off_t off) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    unsigned char c;
    assert_int_equal(pread(fd, &c, 1, sb.st_size - off), 1);
    c ^= 0x40;
    assert_int_equal(pwrite(fd, &c, 1, sb.st_size - off), 1);
    close(fd);
}

/* Overwrites the first 64 bytes of dir/file: the header's length field
 * and its start are gone, so nothing in the file names its version. */
static void destroy_header(const char *dir, const char *file) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    char junk[64];
    memset(junk, 'x', sizeof junk);
    assert_int_equal(pwrite(fd, junk, sizeof junk, 0), (ssize_t)sizeof junk);
    close(fd);
}

/* The text of dir/file ("" when it is missing), in a static buffer. */
static const char *file_text(const char *dir, const char *file) {
    static char text[128];
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    text[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return text;
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    return text;
}

static void save(ls_state *s, const char *name, uint64_t version, bool pinned, const char *source, uint64_t seed) {
    ls_adapter a;
    pt_adapter(&pc_dims, PC_RK, seed, &a);
    snprintf(a.warnings[LS_WARN_SKIPPED_MLP], sizeof a.warnings[0], "warned of %s", name);
    ls_state_record rec = {.name = name, .version = version, .pinned = pinned, .source_path = source, .a = &a};
    rec.params.has_alpha = true;
    rec.params.lora_alpha = 6.5;
    rec.params.strict = true;
    /* The per-module rules' text is carried as it is, whatever it says. */
    rec.params.has_peft = true;
    snprintf(rec.params.peft, sizeof rec.params.peft, "rules of %s", name);
    ls_error err;
    ls_error_init(&err);
    bool made;
    if (ls_state_save(s, &rec, &made, &err) != LS_OK) fail_msg("ls_state_save: %s", err.message);
    ls_error_free(&err);
    ls_adapter_free(&a);
}

static void assert_same_adapter(const ls_adapter *a, const ls_adapter *b) {
    assert_string_equal(a->meta.sha256, b->meta.sha256);
    assert_int_equal(a->meta.rank, b->meta.rank);
    assert_int_equal(a->meta.outer, b->meta.outer);
    assert_int_equal(a->layers, b->layers);
    assert_int_equal(a->layer_floats, b->layer_floats);
    assert_memory_equal(a->data, b->data, (size_t)a->layers * a->layer_floats * sizeof(float));
    for (int l = 0; l < a->layers; l++) assert_int_equal(a->layer_present[l], b->layer_present[l]);
}

/* The name rule is enforced where the state files are named: a name that
 * could leave the directory, or hide a file, names none. */
static void test_file_names_keep_the_name_rule(void **state) {
    (void)state;
    char out[64];
    assert_true(ls_state_file_name(out, sizeof out, "a-b.c_1", ".adapter"));
    assert_string_equal(out, "a-b.c_1.adapter");
    /* A tenant's TENANT/NAME is one file, TENANT@NAME, in the directory. */
    assert_true(ls_state_file_name(out, sizeof out, "acme/a-b", ".adapter"));
    assert_string_equal(out, "acme@a-b.adapter");
    const char *bad[] = {"../x", "a/../b", "A/b", "a/.b", "/a", "a/", "a/b/c", "a@b", ".hidden", "..", "", "a b", "x\ny"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_false(ls_state_file_name(out, sizeof out, bad[i], ".adapter"));
        assert_string_equal(out, "");
    }
    assert_false(ls_state_file_name(out, sizeof out, NULL, ".floor"));
}

static void test_record_reads_back_exactly(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ls_state *s = open_state(dir);
    save(s, "alpha", 3, false, NULL, 41);
    assert_true(file_exists(dir, "alpha.adapter"));
    assert_string_equal(file_text(dir, "alpha.floor"), "3\n"); /* written first */
    assert_int_equal(count_files(dir, NULL, ".tmp"), 0);

    ls_adapter want, got;
    pt_adapter(&pc_dims, PC_RK, 41, &want);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_state_read(s, "alpha", 3, &got, &err), LS_OK);
    assert_same_adapter(&want, &got);
    /* The load's warnings come back with it (texts, for GET). */
    assert_string_equal(got.warnings[0], "warned of alpha");
    for (int k = 1; k < LS_ADAPTER_WARNINGS; k++) assert_string_equal(got.warnings[k], "");
    ls_adapter_free(&got);
    /* Another version than the file holds is refused, never served. */
    assert_int_equal(ls_state_read(s, "alpha", 2, &got, &err), LS_INTERNAL);
    assert_non_null(strstr(err.message, "holds version 3"));
    ls_error_clear(&err);
    assert_int_equal(ls_state_read(s, "nobody", 1, &got, &err), LS_INTERNAL);
    ls_error_free(&err);
    ls_adapter_free(&want);
    ls_state_close(s);
    ls_test_rmtree(dir);
    free(dir);
}

/* What restore hands the pool, gathered. */
typedef struct {
    char names[8][32];
    uint64_t versions[8];
    bool pinned[8];
    char sources[8][64];
    double alpha[8];
    char peft[8][64];
    char sha[8][65];
    int n;
    char tomb_names[8][32];
    uint64_t tomb_versions[8];
    int n_tomb;
} gathered;

static ls_status gather_one(void *ctx, const ls_state_record *rec, ls_adapter *a, ls_error *err) {
    (void)err;
    gathered *g = ctx;
    assert_true(g->n < 8);
    snprintf(g->names[g->n], 32, "%s", rec->name);
    g->versions[g->n] = rec->version;
    g->pinned[g->n] = rec->pinned;
    snprintf(g->sources[g->n], 64, "%s", rec->source_path ? rec->source_path : "");
    g->alpha[g->n] = rec->params.lora_alpha;
    assert_true(rec->params.has_peft);
    snprintf(g->peft[g->n], 64, "%.63s", rec->params.peft);
    snprintf(g->sha[g->n], 65, "%s", a->meta.sha256);
    g->n++;
    return LS_OK;
}

static void gather_tomb(void *ctx, const char *name, uint64_t version) {
    gathered *g = ctx;
    assert_true(g->n_tomb < 8);
    snprintf(g->tomb_names[g->n_tomb], 32, "%s", name);
    g->tomb_versions[g->n_tomb++] = version;
}

static gathered restore(ls_state *s) {
    gathered g;
    memset(&g, 0, sizeof g);
    ls_error err;
    ls_error_init(&err);
    if (ls_state_restore(s, gather_one, gather_tomb, &g, &err) != LS_OK) fail_msg("restore: %s", err.message);
    ls_error_free(&err);
    return g;
}

static void test_restore_gives_records_and_tombstones(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ls_state *s = open_state(dir);
    save(s, "b", 1, true, "peft/b", 7);
    save(s, "a", 4, false, NULL, 8);
    save(s, "gone", 2, false, NULL, 9);
    ls_error err;
    ls_error_init(&err);
    bool made;
    assert_int_equal(ls_state_forget(s, "gone", 2, &made, &err), LS_OK);
    assert_false(file_exists(dir, "gone.adapter"));
    assert_true(file_exists(dir, "gone.deleted"));
    /* A new version of a deleted name drops its tombstone. */
    save(s, "back", 1, false, NULL, 10);
    assert_int_equal(ls_state_forget(s, "back", 1, &made, &err), LS_OK);
    save(s, "back", 2, false, NULL, 11);
    assert_false(file_exists(dir, "back.deleted"));
    ls_error_free(&err);

    gathered g = restore(s);
    assert_int_equal(g.n, 3); /* in name order */
    assert_string_equal(g.names[0], "a");
    assert_int_equal(g.versions[0], 4);
    assert_false(g.pinned[0]);
    assert_string_equal(g.sources[0], "");
    assert_string_equal(g.names[1], "b");
    assert_int_equal(g.versions[1], 1);
    assert_true(g.pinned[1]);
    assert_string_equal(g.sources[1], "peft/b");
    assert_true(g.alpha[1] == 6.5);
    assert_string_equal(g.peft[1], "rules of b"); /* rank_pattern and the like survive a restart */
    assert_string_equal(g.names[2], "back");
    assert_int_equal(g.versions[2], 2);
    ls_adapter want;
    pt_adapter(&pc_dims, PC_RK, 8, &want);
    assert_string_equal(g.sha[0], want.meta.sha256);
    ls_adapter_free(&want);
    assert_int_equal(g.n_tomb, 1);
    assert_string_equal(g.tomb_names[0], "gone");
    assert_int_equal(g.tomb_versions[0], 2);
    ls_state_close(s);
    ls_test_rmtree(dir);
    free(dir);
}

/* Every way a file can be damaged is set aside with the others restored
 * (a record whose header still reads leaves its version as its name's
 * tombstone: test_set_aside_records_keep_their_versions); what a crash
 * cut short before its rename is removed. */
static void test_damaged_files_are_set_aside(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ls_state *s = open_state(dir);
    save(s, "good", 1, false, NULL, 1);
    save(s, "trunc", 1, false, NULL, 2);
    save(s, "flip", 1, false, NULL, 3);
    /* Truncated: the last 100 bytes gone. */
    char path[1024];
    snprintf(path, sizeof path, "%s/trunc.adapter", dir);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(truncate(path, sb.st_size - 100), 0);
    /* One factor byte changed: the sha256 no longer matches. */
    flip_byte(dir, "flip.adapter", 5);
    write_file(dir, "junk.adapter", "not safetensors", 15);
    write_file(dir, "empty.adapter", "", 0);
    write_file(dir, "bad.deleted", "seven\n", 6);
    /* Not 2^64 - 1, which no name could go on from. */
    write_file(dir, "neg.deleted", "-1\n", 3);
    write_file(dir, ".tmp.9.good.adapter", "half", 4);
    /* A record under another name than its file's is not that name's. */
    snprintf(path, sizeof path, "%s/good.adapter", dir);
    char other[1024];
    snprintf(other, sizeof other, "%s/alias.adapter", dir);
    assert_int_equal(link(path, other), 0);

    gathered g = restore(s);
    assert_int_equal(g.n, 1);
    assert_string_equal(g.names[0], "good");
    assert_int_equal(g.n_tomb, 2);
    assert_string_equal(g.tomb_names[0], "flip");
    assert_string_equal(g.tomb_names[1], "trunc");
    assert_string_equal(file_text(dir, "trunc.deleted"), "1\n");
    assert_int_equal(count_files(dir, "corrupt", ""), 7);
    assert_int_equal(count_files(dir, "corrupt", "neg.deleted"), 1);
    assert_int_equal(count_files(dir, "corrupt", "trunc.adapter"), 1);
    assert_int_equal(count_files(dir, "corrupt", "flip.adapter"), 1);
    assert_int_equal(count_files(dir, "corrupt", "bad.deleted"), 1);
    assert_int_equal(count_files(dir, NULL, ".tmp"), 0);
    assert_false(file_exists(dir, ".tmp.9.good.adapter"));
    /* A second restore finds only what is good. */
    g = restore(s);
    assert_int_equal(g.n, 1);
    ls_state_close(s);
    ls_test_rmtree(dir);
    free(dir);
}

/* A record set aside keeps its name's versions: the version in its
 * header where that still reads (a factor byte changed, the file cut
 * short), else the name's floor (NAME.floor, written before every
 * record). Either becomes the name's tombstone, so every later start
 * knows it once the record is gone; a tombstone already higher stays.
 * Only a record whose header is destroyed and that has no floor (one
 * written before floors existed) tells nothing. */
static void test_set_aside_records_keep_their_versions(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ls_state *s = open_state(dir);
    save(s, "flip", 2, false, NULL, 1);
    save(s, "head", 5, false, NULL, 2);
    save(s, "lost", 4, false, NULL, 3);
    save(s, "old", 3, false, NULL, 4);
    save(s, "tomb", 6, false, NULL, 5);
    save(s, "gone", 7, false, NULL, 6);
    flip_byte(dir, "flip.adapter", 5);
    destroy_header(dir, "head.adapter");
    destroy_header(dir, "lost.adapter");
    char path[1024];
    snprintf(path, sizeof path, "%s/lost.floor", dir);
    assert_int_equal(unlink(path), 0);
    snprintf(path, sizeof path, "%s/old.floor", dir);
    assert_int_equal(unlink(path), 0);
    snprintf(path, sizeof path, "%s/old.adapter", dir);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(truncate(path, sb.st_size - 100), 0);
    /* An older tombstone (a crash before a new version dropped it) gives
     * way to the record's version; a newer one (a crash before a delete
     * removed the record) stays. */
    write_file(dir, "tomb.deleted", "4\n", 2);
    flip_byte(dir, "tomb.adapter", 5);
    write_file(dir, "gone.deleted", "9\n", 2);
    flip_byte(dir, "gone.adapter", 5);

    gathered g = restore(s);
    assert_int_equal(g.n, 0);
    assert_int_equal(count_files(dir, "corrupt", ""), 6);
    assert_int_equal(count_files(dir, NULL, ""), 4 + 5 + 1); /* floors (not lost's, old's), tombstones, corrupt/ */
    assert_string_equal(file_text(dir, "flip.deleted"), "2\n");
    assert_string_equal(file_text(dir, "head.deleted"), "5\n");
    assert_false(file_exists(dir, "lost.deleted"));
    assert_string_equal(file_text(dir, "old.deleted"), "3\n");
    assert_string_equal(file_text(dir, "tomb.deleted"), "6\n");
    assert_string_equal(file_text(dir, "gone.deleted"), "9\n");
    /* Tombstones first, then what each record set aside could have held. */
    assert_int_equal(g.n_tomb, 6);
    const char *names[6] = {"gone", "tomb", "flip", "head", "old", "tomb"};
    const uint64_t versions[6] = {9, 4, 2, 5, 3, 6};
    for (int i = 0; i < 6; i++) {
        assert_string_equal(g.tomb_names[i], names[i]);
        assert_int_equal(g.tomb_versions[i], versions[i]);
    }
    /* The next start reads them back from the tombstones. */
    g = restore(s);
    assert_int_equal(g.n, 0);
    assert_int_equal(g.n_tomb, 5);
    assert_string_equal(g.tomb_names[4], "tomb");
    assert_int_equal(g.tomb_versions[4], 6);
    ls_state_close(s);
    ls_test_rmtree(dir);
    free(dir);
}

/* A pool over a fake backend and a state directory. */
typedef struct {
    pt_fake *fk;
    ls_state *s;
    ls_pool *p;
} sfx;

static sfx sfx_make_tier(const char *dir, int S, int host_cache) {
    sfx f;
    f.fk = pt_fake_create(pc_dims, S, PC_RMAX, 64);
    f.s = open_state(dir);
    ls_pool_config cfg = {.host_cache = host_cache, .state = f.s};
    ls_error err;
    ls_error_init(&err);
    if (ls_pool_create(f.fk->be, &cfg, &f.p, &err) != LS_OK) fail_msg("ls_pool_create: %s", err.message);
    ls_error_free(&err);
    return f;
}

static sfx sfx_make(const char *dir, int S) { return sfx_make_tier(dir, S, 8); }

static void sfx_free(sfx *f) {
    ls_pool_free(f->p);
    ls_backend_free(f->fk->be);
    ls_state_close(f->s);
}

static int sfx_restore(sfx *f) {
    int n = -1;
    ls_error err;
    ls_error_init(&err);
    if (ls_pool_restore(f->p, &n, &err) != LS_OK) fail_msg("ls_pool_restore: %s", err.message);
    ls_error_free(&err);
    return n;
}

static void del_ok(ls_pool *p, const char *name) {
    ls_error err;
    ls_error_init(&err);
    if (ls_pool_delete(p, name, NULL, &err) != LS_OK) fail_msg("delete %s: %s", name, err.message);
    ls_error_free(&err);
}

static void test_pool_restores_what_it_acknowledged(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    sfx f = sfx_make(dir, 3);
    pc_load_ok(f.p, "a", 1, false, false);
    pc_load_ok(f.p, "a", 2, false, true);
    pc_load_ok(f.p, "b", 1, true, false);
    pc_load_ok(f.p, "c", 1, false, false);
    del_ok(f.p, "c");
    pc_load_ok(f.p, "d", 1, false, false);
    ls_adapter_info a_before = pc_describe(f.p, "a"), b_before = pc_describe(f.p, "b");
    sfx_free(&f);

    /* A new server over the same directory. */
    f = sfx_make(dir, 3);
    assert_int_equal(sfx_restore(&f), 3);
    ls_adapter_info a = pc_describe(f.p, "a"), b = pc_describe(f.p, "b");
    assert_int_equal(a.version, 2);
    assert_string_equal(a.meta.sha256, a_before.meta.sha256);
    assert_int_equal(b.version, 1);
    assert_true(b.pinned);
    assert_string_equal(b.meta.sha256, b_before.meta.sha256);
    assert_int_equal(pc_describe(f.p, "d").version, 1);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_pool_describe(f.p, "c", &a, &err), LS_ADAPTER_NOT_FOUND);
    ls_error_clear(&err);
    /* Forwards use the restored factors (pc_fwd checks every token
     * against the factors of the version the pool reports). */
    const char *names[4] = {"a", "b", NULL, "d"};
    pc_fwd_ok(f.p, 4, names);
    /* Versions continue: the deleted c comes back as 2, a goes to 3. */
    pc_load_ok(f.p, "c", 2, false, false);
    pc_load_ok(f.p, "a", 3, false, true);
    del_ok(f.p, "a");
    sfx_free(&f);

    f = sfx_make(dir, 3);
    assert_int_equal(sfx_restore(&f), 3); /* b, c, d */
    assert_int_equal(ls_pool_describe(f.p, "a", &a, &err), LS_ADAPTER_NOT_FOUND);
    ls_error_clear(&err);
    assert_int_equal(pc_describe(f.p, "c").version, 2);
    pc_load_ok(f.p, "a", 4, false, false);
    ls_error_free(&err);
    sfx_free(&f);
    ls_test_rmtree(dir);
    free(dir);
}

/* The audit's case: a name at version 2 whose record is damaged goes on
 * at version 3 after a restart, not at 1 again; so does a name whose
 * record's header is destroyed too (from its floor); and a start between
 * (nothing uploaded) still knows both. */
static void test_damaged_record_keeps_its_versions(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    sfx f = sfx_make(dir, 3);
    pc_load_ok(f.p, "b", 1, false, false);
    pc_load_ok(f.p, "b", 2, false, true);
    pc_load_ok(f.p, "h", 1, false, false);
    pc_load_ok(f.p, "h", 2, false, true);
    pc_load_ok(f.p, "h", 3, false, true);
    pc_load_ok(f.p, "k", 1, false, false);
    sfx_free(&f);
    flip_byte(dir, "b.adapter", 5);
    destroy_header(dir, "h.adapter");

    for (int start = 0; start < 2; start++) {
        f = sfx_make(dir, 3);
        assert_int_equal(sfx_restore(&f), 1); /* k */
        ls_adapter_info info;
        ls_error err;
        ls_error_init(&err);
        assert_int_equal(ls_pool_describe(f.p, "b", &info, &err), LS_ADAPTER_NOT_FOUND);
        ls_error_free(&err);
        assert_int_equal(count_files(dir, "corrupt", ""), 2);
        if (start == 1) {
            pc_load_ok(f.p, "b", 3, false, false);
            pc_load_ok(f.p, "h", 4, false, false);
        }
        sfx_free(&f);
    }
    f = sfx_make(dir, 3);
    assert_int_equal(sfx_restore(&f), 3);
    assert_int_equal(pc_describe(f.p, "b").version, 3);
    assert_int_equal(pc_describe(f.p, "h").version, 4);
    assert_false(file_exists(dir, "b.deleted"));
    assert_false(file_exists(dir, "h.deleted"));
    sfx_free(&f);
    ls_test_rmtree(dir);
    free(dir);
}

/* A damaged record that cannot be moved aside (here corrupt/ is a file,
 * so the rename fails) stays where it is, and so must the name's
 * tombstone as it was: one at the record's version would make a later
 * start that reads the record cleanly finish it as a delete. */
static void test_unmovable_record_keeps_its_tombstone(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ls_state *s = open_state(dir);
    save(s, "b", 2, false, NULL, pc_seed_of("b", 2));
    write_file(dir, "b.deleted", "1\n", 2); /* an older delete's, outdated by version 2 */
    write_file(dir, "corrupt", "x", 1);
    flip_byte(dir, "b.adapter", 5);
    gathered g = restore(s);
    assert_int_equal(g.n, 0);
    assert_true(file_exists(dir, "b.adapter"));
    assert_string_equal(file_text(dir, "b.deleted"), "1\n");
    /* The record reads again: it comes back at its version. */
    flip_byte(dir, "b.adapter", 5);
    g = restore(s);
    assert_int_equal(g.n, 1);
    assert_int_equal(g.versions[0], 2);
    ls_state_close(s);
    ls_test_rmtree(dir);
    free(dir);
}

/* A crash between the tombstone and the removal of the record leaves
 * both: the delete wins at restore and is finished. A crash between a
 * new version's record and the removal of an older tombstone: the
 * record wins. */
static void test_restore_finishes_a_cut_delete(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ls_state *s = open_state(dir);
    save(s, "x", 3, false, NULL, pc_seed_of("x", 3));
    write_file(dir, "x.deleted", "3\n", 2);
    ls_state_close(s);
    sfx f = sfx_make(dir, 2);
    assert_int_equal(sfx_restore(&f), 0);
    assert_false(file_exists(dir, "x.adapter"));
    pc_load_ok(f.p, "x", 4, false, false);
    sfx_free(&f);
    /* A crash between writing a new version and dropping the tombstone of
     * the name's delete: the record wins, the tombstone goes. */
    s = open_state(dir);
    save(s, "y", 5, false, NULL, pc_seed_of("y", 5));
    write_file(dir, "y.deleted", "4\n", 2);
    ls_state_close(s);
    f = sfx_make(dir, 2);
    assert_int_equal(sfx_restore(&f), 2); /* x and y */
    assert_int_equal(pc_describe(f.p, "y").version, 5);
    assert_false(file_exists(dir, "y.deleted"));
    sfx_free(&f);
    ls_test_rmtree(dir);
    free(dir);
}

/* A record of name at version for a model of another shape (H + 2), as
 * another server on the directory would have saved it. */
static void save_other_shape(const char *dir, const char *name, uint64_t version) {
    ls_state *s = open_state(dir);
    ls_adapter odd;
    ls_dims other = pc_dims;
    other.H = pc_dims.H + 2;
    pt_adapter(&other, PC_RK, 5, &odd);
    ls_state_record rec = {.name = name, .version = version, .a = &odd};
    ls_error err;
    ls_error_init(&err);
    bool made;
    assert_int_equal(ls_state_save(s, &rec, &made, &err), LS_OK);
    ls_error_free(&err);
    ls_adapter_free(&odd);
    ls_state_close(s);
}

/* A pin that no longer fits (fewer slots now) comes back unpinned rather
 * than lost; a record for another model shape is kept on disk, skipped,
 * and its version stays taken. */
static void test_restore_into_a_smaller_pool(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    sfx f = sfx_make(dir, 4);
    pc_load_ok(f.p, "p1", 1, true, false);
    pc_load_ok(f.p, "p2", 1, true, false);
    pc_load_ok(f.p, "p3", 1, true, false);
    sfx_free(&f);
    save_other_shape(dir, "odd", 7);
    ls_error err;
    ls_error_init(&err);

    f = sfx_make(dir, 2); /* S-1 = 1 pin */
    assert_int_equal(sfx_restore(&f), 3);
    int pinned = pc_describe(f.p, "p1").pinned + pc_describe(f.p, "p2").pinned + pc_describe(f.p, "p3").pinned;
    assert_int_equal(pinned, 1);
    ls_adapter_info info;
    assert_int_equal(ls_pool_describe(f.p, "odd", &info, &err), LS_ADAPTER_NOT_FOUND);
    ls_error_clear(&err);
    assert_true(file_exists(dir, "odd.adapter"));
    pc_load_ok(f.p, "odd", 8, false, false);
    ls_error_free(&err);
    sfx_free(&f);
    ls_test_rmtree(dir);
    free(dir);
}

/* When the disk refuses, the load or delete fails and the pool is as it
 * was (the directory removed under the server: even root cannot write). */
static void test_refused_write_changes_nothing(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    sfx f = sfx_make(dir, 3);
    pc_load_ok(f.p, "keep", 1, false, false);
    char before[512];
    snprintf(before, sizeof before, "%s", pc_slots(f.p));
    ls_test_rmtree(dir);

    ls_error err;
    ls_error_init(&err);
    assert_int_equal(pc_load(f.p, "new", 1, false, false, NULL, NULL, &err), LS_INTERNAL);
    assert_non_null(strstr(err.message, "state directory"));
    ls_error_clear(&err);
    assert_int_equal(ls_pool_delete(f.p, "keep", NULL, &err), LS_INTERNAL);
    ls_error_clear(&err);
    ls_adapter_info info;
    assert_int_equal(ls_pool_describe(f.p, "new", &info, &err), LS_ADAPTER_NOT_FOUND);
    ls_error_clear(&err);
    assert_string_equal(pc_slots(f.p), before);
    /* A refused replace keeps version 1 registered and resident (its
     * slot, written with the new factors first, gets its own back). */
    ls_adapter_info keep1 = pc_describe(f.p, "keep");
    assert_int_equal(pc_load(f.p, "keep", 2, false, true, NULL, NULL, &err), LS_INTERNAL);
    ls_error_free(&err);
    assert_int_equal(pc_describe(f.p, "keep").version, 1);
    assert_string_equal(pc_describe(f.p, "keep").meta.sha256, keep1.meta.sha256);
    assert_int_equal(pc_stats(f.p).registered, 1);
    assert_string_equal(pc_slots(f.p), before);
    const char *names[2] = {"keep", NULL};
    pc_fwd_ok(f.p, 2, names);
    sfx_free(&f);
    free(dir);
}

/* ---- hostile state directories ---------------------------------------------- */

static void path_of(char *out, size_t len, const char *dir, const char *file) {
    snprintf(out, len, "%s/%s", dir, file);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "the restore blocked (a FIFO opened without O_NONBLOCK waits for a writer)\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

/* restore, failing the test instead of hanging it when the restore
 * blocks. */
static gathered restore_bounded(ls_state *s) {
    signal(SIGALRM, on_alarm);
    alarm(60);
    gathered g = restore(s);
    alarm(0);
    return g;
}

/* A FIFO, a directory or a link named like a state file is refused
 * before anything reads it (opening a FIFO for reading blocks until a
 * writer comes), and set aside; the start goes on. */
static void test_hostile_files_never_block(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ls_state *s = open_state(dir);
    save(s, "good", 1, false, NULL, 1);
    char path[1024];
    const char *fifos[] = {"fifo.adapter", "tomb.deleted", "lone.floor", "good.floor"};
    for (int i = 0; i < 4; i++) {
        path_of(path, sizeof path, dir, fifos[i]);
        unlink(path);
        assert_int_equal(mkfifo(path, 0600), 0);
    }
    path_of(path, sizeof path, dir, "dir.adapter");
    assert_int_equal(mkdir(path, 0700), 0);
    path_of(path, sizeof path, dir, "link.adapter");
    assert_int_equal(symlink("/etc/passwd", path), 0);
    path_of(path, sizeof path, dir, "link.deleted");
    assert_int_equal(symlink("/etc/hostname", path), 0);

    gathered g = restore_bounded(s);
    assert_int_equal(g.n, 1);
    assert_string_equal(g.names[0], "good");
    assert_int_equal(g.n_tomb, 0);
    assert_int_equal(count_files(dir, "corrupt", ""), 7);
    assert_int_equal(count_files(dir, "corrupt", "fifo.adapter"), 1);
    assert_int_equal(count_files(dir, "corrupt", "dir.adapter"), 1);
    /* The record's floor, a FIFO set aside, is written again. */
    assert_string_equal(file_text(dir, "good.floor"), "1\n");
    ls_state_close(s);
    ls_test_rmtree(dir);
    free(dir);
}

/* Nothing larger than the largest record the pool could hold is read: a
 * 64 GiB sparse file of zeros is set aside (its name's floor keeps its
 * versions), and so is a record of this pool's shape that grew to 64 GiB;
 * a record of another shape that large is kept for a server that fits
 * it, its version taken. Read whole, each was 64 GiB of memory (the
 * restore failed out of memory, and the server with it). */
static void test_huge_records_are_never_read(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    sfx f = sfx_make(dir, 3);
    pc_load_ok(f.p, "big", 1, false, false);
    pc_load_ok(f.p, "big", 2, false, true);
    pc_load_ok(f.p, "grown", 1, false, false);
    pc_load_ok(f.p, "keep", 1, false, false);
    sfx_free(&f);
    save_other_shape(dir, "other", 7);
    ls_error err;
    ls_error_init(&err);
    const int64_t huge = (int64_t)64 << 30;
    char path[1024];
    path_of(path, sizeof path, dir, "big.adapter");
    ls_test_sparse_file(path, huge, NULL, 0);
    path_of(path, sizeof path, dir, "grown.adapter");
    assert_int_equal(truncate(path, huge), 0);
    path_of(path, sizeof path, dir, "other.adapter");
    assert_int_equal(truncate(path, huge), 0);

    f = sfx_make(dir, 3);
    assert_int_equal(sfx_restore(&f), 1);
    assert_int_equal(pc_describe(f.p, "keep").version, 1);
    assert_int_equal(count_files(dir, "corrupt", "big.adapter"), 1);
    assert_int_equal(count_files(dir, "corrupt", "grown.adapter"), 1);
    assert_true(file_exists(dir, "other.adapter"));
    pc_load_ok(f.p, "big", 3, false, false);
    pc_load_ok(f.p, "grown", 2, false, false);
    pc_load_ok(f.p, "other", 8, false, false);
    ls_error_free(&err);
    sfx_free(&f);
    ls_test_rmtree(dir);
    free(dir);
}

/* A copy of src.adapter's record as file, renamed name inside. */
static void forge_record(const char *dir, const char *src, const char *file, const char *name) {
    char from[1024], to[1024];
    path_of(from, sizeof from, dir, src);
    path_of(to, sizeof to, dir, file);
    assert_int_equal(rename(from, to), 0);
    ls_test_set_meta(to, "name", name);
}

/* Names are checked on restore as on upload: a record or a tombstone
 * whose name breaks the rule (markup, a newline that would split log
 * lines, a right-to-left override that spoofs the page) is set aside,
 * and no tombstone is written for it (no upload can use the name). And
 * no file name is made from such a name: a save under "../x" would
 * write outside the directory. */
static void test_restored_names_follow_the_rule(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ls_state *s = open_state(dir);
    save(s, "good", 1, false, NULL, 1);
    const char *bad[] = {"<img src=x onerror=alert(1)>", "nl\nname", "\xe2\x80\xae" "evil", "sp ace"};
    char path[1024], file[256];
    for (int i = 0; i < 4; i++) {
        save(s, "tmpl", 3, false, NULL, 2 + (uint64_t)i);
        path_of(path, sizeof path, dir, "tmpl.floor");
        assert_int_equal(unlink(path), 0);
        snprintf(file, sizeof file, "%s.adapter", bad[i]);
        forge_record(dir, "tmpl.adapter", file, bad[i]);
    }
    write_file(dir, "<b>.deleted", "3\n", 2);
    write_file(dir, "x y.floor", "2\n", 2);

    gathered g = restore(s);
    assert_int_equal(g.n, 1);
    assert_string_equal(g.names[0], "good");
    assert_int_equal(g.n_tomb, 0);
    assert_int_equal(count_files(dir, "corrupt", ""), 6);
    assert_int_equal(count_files(dir, NULL, ""), 3); /* good.adapter, good.floor, corrupt/ */

    ls_adapter a;
    pt_adapter(&pc_dims, PC_RK, 9, &a);
    ls_state_record rec = {.name = "../x", .version = 1, .a = &a};
    ls_error err;
    ls_error_init(&err);
    bool made = true;
    assert_int_equal(ls_state_save(s, &rec, &made, &err), LS_INVALID_REQUEST);
    assert_false(made);
    ls_error_clear(&err);
    assert_int_equal(ls_state_forget(s, "../x", 1, &made, &err), LS_INVALID_REQUEST);
    assert_false(file_exists(dir, "../x.adapter"));
    assert_false(file_exists(dir, "../x.floor"));
    ls_error_free(&err);
    ls_adapter_free(&a);
    ls_state_close(s);
    ls_test_rmtree(dir);
    free(dir);
}

/* Saves names[i] at version (seeds from seed) and then sets its record's
 * __metadata__[key] to values[i]. */
static void save_with_meta(ls_state *s, const char *dir, const char *const *names, int n, uint64_t version,
                           const char *key, const char *const *values, uint64_t seed) {
    char path[1024], file[64];
    for (int i = 0; i < n; i++) {
        save(s, names[i], version, false, NULL, seed + (uint64_t)i);
        snprintf(file, sizeof file, "%s.adapter", names[i]);
        path_of(path, sizeof path, dir, file);
        ls_test_set_meta(path, key, values[i]);
    }
}

/* A scale that is not finite (an upload refuses one) makes a record
 * corrupt: restored, it served but could not be listed (JSON has no NaN)
 * and GET /adapters/NAME answered 500. Its version is kept. */
static void test_nonfinite_scale_is_corrupt(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ls_state *s = open_state(dir);
    const char *names[] = {"n", "p", "m", "x"}, *scales[] = {"nan", "inf", "-inf", "0.5x"};
    char file[64];
    save_with_meta(s, dir, names, 4, 4, "scale", scales, 1);
    save(s, "good", 2, false, NULL, 9);
    gathered g = restore(s);
    assert_int_equal(g.n, 1);
    assert_string_equal(g.names[0], "good");
    assert_int_equal(count_files(dir, "corrupt", ""), 4);
    for (int i = 0; i < 4; i++) {
        snprintf(file, sizeof file, "%s.deleted", names[i]);
        assert_string_equal(file_text(dir, file), "4\n");
    }
    ls_state_close(s);
    ls_test_rmtree(dir);
    free(dir);
}

/* A record's warnings are only shown: six of them (a later version's
 * kinds), a non-string, bad JSON or none restore the adapter all the
 * same, with what can be read of them. */
static void test_warnings_never_lose_a_record(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ls_state *s = open_state(dir);
    const char *names[] = {"six", "odd", "bad", "none"};
    const char *texts[] = {"[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\"]", "[1,\"kept\"]", "[\"cut", "[]"};
    save_with_meta(s, dir, names, 4, 3, "warnings", texts, 20);
    gathered g = restore(s);
    assert_int_equal(g.n, 4);
    assert_int_equal(count_files(dir, "corrupt", ""), 0);
    ls_adapter a;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_state_read(s, "six", 3, &a, &err), LS_OK);
    assert_string_equal(a.warnings[0], "a");
    assert_string_equal(a.warnings[LS_ADAPTER_WARNINGS - 1], "e"); /* the first five */
    ls_adapter_free(&a);
    assert_int_equal(ls_state_read(s, "odd", 3, &a, &err), LS_OK);
    assert_string_equal(a.warnings[0], "kept");
    ls_adapter_free(&a);
    assert_int_equal(ls_state_read(s, "bad", 3, &a, &err), LS_OK);
    assert_string_equal(a.warnings[0], "");
    ls_adapter_free(&a);
    ls_error_free(&err);
    ls_state_close(s);
    ls_test_rmtree(dir);
    free(dir);
}

/* Versions cannot wrap: one above 2^63 - 1 (which a client would read as
 * negative, and whose next one was 0) makes its record or tombstone
 * corrupt; a name at 2^63 - 1 is restored there, and its replace is
 * refused (409 versions_exhausted) with nothing changed. */
static void test_versions_cannot_wrap(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ls_state *s = open_state(dir);
    char path[1024];
    save(s, "top", 5, false, NULL, pc_seed_of("top", 5));
    path_of(path, sizeof path, dir, "top.adapter");
    ls_test_set_meta(path, "version", "9223372036854775807");
    save(s, "wrap", 5, false, NULL, 2);
    path_of(path, sizeof path, dir, "wrap.adapter");
    ls_test_set_meta(path, "version", "18446744073709551615");
    save(s, "over", 5, false, NULL, 3);
    path_of(path, sizeof path, dir, "over.adapter");
    ls_test_set_meta(path, "version", "9223372036854775808");
    write_file(dir, "tomb.deleted", "18446744073709551615\n", 21);
    write_file(dir, "last.deleted", "9223372036854775807\n", 20);
    ls_state_close(s);

    sfx f = sfx_make(dir, 3);
    assert_int_equal(sfx_restore(&f), 1);
    ls_adapter_info top = pc_describe(f.p, "top");
    assert_true(top.version == LS_STATE_VERSION_MAX);
    assert_int_equal(count_files(dir, "corrupt", ""), 3);
    assert_int_equal(count_files(dir, "corrupt", "tomb.deleted"), 1);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(pc_load(f.p, "top", 6, false, true, NULL, NULL, &err), LS_VERSIONS_EXHAUSTED);
    assert_non_null(strstr(err.message, "9223372036854775807"));
    ls_error_clear(&err);
    assert_int_equal(pc_load(f.p, "last", 1, false, false, NULL, NULL, &err), LS_VERSIONS_EXHAUSTED);
    ls_error_free(&err);
    assert_true(pc_describe(f.p, "top").version == LS_STATE_VERSION_MAX);
    assert_string_equal(pc_describe(f.p, "top").meta.sha256, top.meta.sha256);
    /* The records set aside keep the versions their floors give. */
    pc_load_ok(f.p, "wrap", 6, false, false);
    pc_load_ok(f.p, "over", 6, false, false);
    pc_load_ok(f.p, "tomb", 1, false, false);
    sfx_free(&f);
    ls_test_rmtree(dir);
    free(dir);
}

/* corrupt/ as a link (to a directory outside, or to nothing) is never
 * followed: what cannot be read stays where it is, and a log line says
 * why. */
static void test_corrupt_link_is_not_followed(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp(), *outside = ls_test_mkdtemp();
    ls_state *s = open_state(dir);
    save(s, "flip", 2, false, NULL, 1);
    flip_byte(dir, "flip.adapter", 5);
    char path[1024];
    path_of(path, sizeof path, dir, "corrupt");
    assert_int_equal(symlink(outside, path), 0);
    gathered g = restore(s);
    assert_int_equal(g.n, 0);
    assert_true(file_exists(dir, "flip.adapter"));
    assert_int_equal(count_files(outside, NULL, ""), 0);
    assert_false(file_exists(dir, "flip.deleted")); /* the record stays, so its tombstone must not be written */
    /* A dangling link: nothing is made through it either. */
    ls_test_rmtree(outside);
    g = restore(s);
    assert_int_equal(g.n, 0);
    assert_true(file_exists(dir, "flip.adapter"));
    struct stat sb;
    assert_true(stat(outside, &sb) != 0);
    ls_state_close(s);
    ls_test_rmtree(dir);
    free(dir);
    free(outside);
}

/* One server per state directory: a second open is refused, naming the
 * directory and the holder's pid, until the first closes. */
static void test_second_server_is_refused(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ls_state *a = open_state(dir), *b = NULL;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_state_open(dir, &b, &err), LS_INVALID_REQUEST);
    assert_null(b);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
    assert_non_null(strstr(err.message, dir));
    assert_non_null(strstr(err.message, pid));
    ls_error_free(&err);
    ls_state_close(a);
    b = open_state(dir);
    ls_state_close(b);
    ls_test_rmtree(dir);
    free(dir);
}

/* ---- a full disk ------------------------------------------------------------ */

/* Writes dir/filler until the disk is full. */
static void fill_disk(const char *dir) {
    char path[1024], block[4096];
    memset(block, 'f', sizeof block);
    path_of(path, sizeof path, dir, "filler");
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    assert_true(fd >= 0);
    while (write(fd, block, sizeof block) > 0) {
    }
    assert_int_equal(errno, ENOSPC);
    close(fd);
}

/* Frees one page of the filler: room for one small file, not two. */
static void free_one_page(const char *dir) {
    char path[1024];
    path_of(path, sizeof path, dir, "filler");
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(truncate(path, (sb.st_size / 4096 - 1) * 4096), 0);
    struct statvfs vs;
    assert_int_equal(statvfs(dir, &vs), 0);
    assert_int_equal(vs.f_bavail * vs.f_frsize, 4096);
}

/* The files a failed upload of name could have left. */
static int litter(const char *dir, const char *name) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s.", name);
    return count_files(dir, NULL, prefix) + count_files(dir, NULL, ".tmp");
}

/* On a full state disk (a small tmpfs, where root may mount one) a load
 * or a replace fails and leaves nothing behind (a floor staged for a
 * failed upload used to stay), and a DELETE succeeds: it removes the
 * record first, which frees the space its tombstone takes. The next
 * start agrees. */
static void test_full_disk(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    if (mount("lorasink-test", dir, "tmpfs", 0, "size=256k,mode=0700") != 0) {
        print_message("skipped: cannot mount a tmpfs here (%s); tests/fault/test_fault_state refuses every write "
                      "with ENOSPC instead\n",
                      strerror(errno));
        ls_test_rmtree(dir);
        free(dir);
        skip();
    }
    sfx f = sfx_make(dir, 3);
    pc_load_ok(f.p, "a", 1, false, false);
    pc_load_ok(f.p, "b", 1, false, false);
    fill_disk(dir);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(pc_load(f.p, "c", 1, false, false, NULL, NULL, &err), LS_INSUFFICIENT_STORAGE);
    assert_int_equal(litter(dir, "c"), 0);
    ls_error_clear(&err);
    assert_int_equal(pc_load(f.p, "a", 2, false, true, NULL, NULL, &err), LS_INSUFFICIENT_STORAGE);
    assert_int_equal(pc_describe(f.p, "a").version, 1);
    ls_error_clear(&err);
    free_one_page(dir);
    assert_int_equal(pc_load(f.p, "c", 1, false, false, NULL, NULL, &err), LS_INSUFFICIENT_STORAGE);
    assert_int_equal(litter(dir, "c"), 0);
    ls_error_clear(&err);
    fill_disk(dir);
    if (ls_pool_delete(f.p, "a", NULL, &err) != LS_OK) fail_msg("DELETE on a full disk: %s", err.message);
    ls_error_free(&err);
    sfx_free(&f);

    char path[1024];
    path_of(path, sizeof path, dir, "filler");
    assert_int_equal(unlink(path), 0);
    f = sfx_make(dir, 3);
    assert_int_equal(sfx_restore(&f), 1);
    assert_int_equal(pc_describe(f.p, "b").version, 1);
    pc_load_ok(f.p, "a", 2, false, false);
    pc_load_ok(f.p, "c", 1, false, false);
    sfx_free(&f);
    assert_int_equal(umount(dir), 0);
    ls_test_rmtree(dir);
    free(dir);
}

/* A forward run on another thread (no cmocka asserts there): deterministic
 * inputs, its status, y and the versions it used. */
typedef struct {
    ls_pool *p;
    const char *const *names;
    int T;
    float x[4 * 6], g[4 * 2], y[4 * 6];
    ls_pool_used used[4];
    int n_used;
    ls_status st;
    ls_error err;
} fwd_job;

static void *fwd_run(void *arg) {
    fwd_job *j = arg;
    ls_error_init(&j->err);
    pc_fill_inputs(j->T, j->x, j->g, 7);
    j->st = pc_pool_forward(j->p, 0, j->T, j->x, j->g, j->names, j->y, j->used, &j->n_used, &j->err);
    return NULL;
}

/* Every token of j as the fake computes it with the versions j used. */
static void fwd_check(fwd_job *j) {
    if (j->st != LS_OK) fail_msg("forward: %s", j->err.message);
    for (int t = 0; t < j->T; t++) {
        int i = 0;
        while (i < j->n_used && strcmp(j->used[i].name, j->names[t])) i++;
        assert_true(i < j->n_used);
        ls_adapter a;
        pt_adapter(&pc_dims, PC_RK, pc_seed_of(j->names[t], j->used[i].version), &a);
        float want[6];
        pt_expect_token(&pc_dims, &a, 0, j->x + t * 6, j->g + t * 2, want);
        assert_memory_equal(j->y + t * 6, want, sizeof want);
        ls_adapter_free(&a);
    }
    ls_error_free(&j->err);
}

/* Three inline uploads into one slot and a host tier of one: "a" and "e"
 * keep no host copy (the state directory holds them), "c" is resident. */
static sfx sfx_dropped(const char *dir) {
    sfx f = sfx_make_tier(dir, 1, 1);
    pc_load_ok(f.p, "a", 1, false, false);
    pc_load_ok(f.p, "e", 1, false, false);
    pc_load_ok(f.p, "c", 1, false, false);
    assert_false(pc_describe(f.p, "a").host_data);
    assert_false(pc_describe(f.p, "e").host_data);
    return f;
}

/* A forward that named "e" before its DELETE finishes with it, though its
 * host copy was dropped and the delete removed the record it would have
 * been read back from (it answered 409 adapter_stale, or 500 when the
 * record went while it was read). The forward's first group ("a") is
 * held in the backend while "e" is deleted. */
static void test_delete_under_a_forward_keeps_its_copy(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    sfx f = sfx_dropped(dir);
    static const char *const names[2] = {"a", "e"};
    fwd_job j = {.p = f.p, .names = names, .T = 2};
    pthread_t th;
    pt_fake_gate(f.fk, true);
    assert_int_equal(pthread_create(&th, NULL, fwd_run, &j), 0);
    pt_fake_wait_blocked(f.fk, 1);
    del_ok(f.p, "e");
    assert_false(file_exists(dir, "e.adapter"));
    pt_fake_gate(f.fk, false);
    assert_int_equal(pthread_join(th, NULL), 0);
    fwd_check(&j);
    assert_int_equal(j.used[1].version, 1);
    /* Its copy went with its last release: the tier is within its size. */
    assert_true(pc_stats(f.p).host_used <= 1);
    sfx_free(&f);
    ls_test_rmtree(dir);
    free(dir);
}

/* The same for a replace: the version a request holds is read back with
 * its own factors after the record holds the next version's. */
static void test_replace_under_a_hold_keeps_its_copy(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    sfx f = sfx_dropped(dir);
    ls_pool_hold *h = NULL;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_pool_debug_hold(f.p, "e", &h, &err), LS_OK);
    pc_load_ok(f.p, "e", 2, false, true);
    if (ls_pool_debug_read_back(f.p, h, &err) != LS_OK) fail_msg("read back: %s", err.message);
    ls_pool_debug_release(f.p, h);
    /* The new version reads back as itself. */
    static const char *const names[2] = {"e", "a"};
    fwd_job j = {.p = f.p, .names = names, .T = 2};
    fwd_run(&j);
    fwd_check(&j);
    assert_int_equal(j.used[0].version, 2);
    ls_error_free(&err);
    sfx_free(&f);
    ls_test_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_names_keep_the_name_rule),
        cmocka_unit_test(test_record_reads_back_exactly),
        cmocka_unit_test(test_restore_gives_records_and_tombstones),
        cmocka_unit_test(test_damaged_files_are_set_aside),
        cmocka_unit_test(test_set_aside_records_keep_their_versions),
        cmocka_unit_test(test_pool_restores_what_it_acknowledged),
        cmocka_unit_test(test_damaged_record_keeps_its_versions),
        cmocka_unit_test(test_restore_finishes_a_cut_delete),
        cmocka_unit_test(test_unmovable_record_keeps_its_tombstone),
        cmocka_unit_test(test_restore_into_a_smaller_pool),
        cmocka_unit_test(test_refused_write_changes_nothing),
        cmocka_unit_test(test_hostile_files_never_block),
        cmocka_unit_test(test_huge_records_are_never_read),
        cmocka_unit_test(test_restored_names_follow_the_rule),
        cmocka_unit_test(test_nonfinite_scale_is_corrupt),
        cmocka_unit_test(test_warnings_never_lose_a_record),
        cmocka_unit_test(test_versions_cannot_wrap),
        cmocka_unit_test(test_corrupt_link_is_not_followed),
        cmocka_unit_test(test_second_server_is_refused),
        cmocka_unit_test(test_full_disk),
        cmocka_unit_test(test_delete_under_a_forward_keeps_its_copy),
        cmocka_unit_test(test_replace_under_a_hold_keeps_its_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
