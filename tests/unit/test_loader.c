/* The adapter loader (lora/loader.c): paths opened beneath the adapter
 * directory and nowhere else (also while another process swaps a
 * directory for a link out of it), files rewritten in place while read
 * (as cp does) answered cleanly, messages that name paths relative to the
 * directory, the merge of stated over own parameters, and one adapter
 * loaded from a PEFT directory, from a bare .safetensors file, from
 * tensors in memory and by the host tier's reload giving the same factors
 * whenever the parameters agree; a file the server may not read, and a
 * read the disk fails, answered as what they are. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <grp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/file.h"
#include "format/safetensors.h"
#include "lora/adapter_config.h"
#include "lora/loader.h"
#include "tests/util/testutil.h"

#define LN 2
#define LH 4
#define LF 3
#define LR 2

static const char *const NAMES[4] = {
    "model.layers.0.mlp.shared_experts.gate_up_proj.lora_A.weight",
    "model.layers.0.mlp.shared_experts.gate_up_proj.lora_B.weight",
    "model.layers.0.mlp.shared_experts.down_proj.lora_A.weight",
    "model.layers.0.mlp.shared_experts.down_proj.lora_B.weight",
};

/* A PEFT adapter of rank LR for n=LN, LH, LF: the four factors, f32. */
static void make_tensors(ls_tensor_set *set) {
    const int64_t shapes[4][2] = {{LR, LH}, {LN * 2 * LF, LR}, {LR, LN * LF}, {LH, LR}};
    ls_tensor_set_init(set);
    for (int k = 0; k < 4; k++) {
        ls_tensor t;
        assert_true(ls_tensor_alloc_f32(&t, shapes[k], 2));
        float *v = t.data;
        for (int64_t i = 0; i < shapes[k][0] * shapes[k][1]; i++) v[i] = (float)((i * 7 + k * 3) % 11 - 5) / 8.0f;
        assert_true(ls_tensor_set_add(set, NAMES[k], &t));
    }
}

/* dir/peft/ (adapter_config.json r=LR alpha=4) and dir/bare.safetensors
 * (lora_alpha 4 in its metadata), both holding make_tensors. */
static void write_adapters(const char *dir) {
    ls_tensor_set set;
    make_tensors(&set);
    uint8_t *bytes;
    size_t len;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_safetensors_write(&set, &bytes, &len, &err), LS_OK);
    char path[4200];
    snprintf(path, sizeof path, "%s/peft", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/peft/adapter_model.safetensors", dir);
    ls_test_write_file(path, bytes, len);
    snprintf(path, sizeof path, "%s/peft/adapter_config.json", dir);
    const char *cfg = "{\"r\": 2, \"lora_alpha\": 4, \"target_modules\": [\"gate_up_proj\", \"down_proj\"]}";
    ls_test_write_file(path, cfg, strlen(cfg));
    free(bytes);
    assert_true(ls_tensor_set_add_meta(&set, "lora_alpha", "4"));
    assert_int_equal(ls_safetensors_write(&set, &bytes, &len, &err), LS_OK);
    snprintf(path, sizeof path, "%s/bare.safetensors", dir);
    ls_test_write_file(path, bytes, len);
    free(bytes);
    ls_tensor_set_free(&set);
    ls_error_free(&err);
}

static ls_loader make_loader(const char *dir) {
    const ls_dims d = {.n = LN, .H = LH, .F = LF, .L = 1, .w13_layout = LS_W13_INTERLEAVED};
    const ls_pool_dims pd = {.slots = 2, .max_rank = 4, .layout = LS_LORA_SHARED, .max_tokens = 8};
    ls_loader ld;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_loader_open(&ld, dir, &d, &pd, &err), LS_OK);
    ls_error_free(&err);
    return ld;
}

/* Loads src; returns its sha256 (static buffer) and the origin. */
static const char *load_sha(const ls_loader *ld, const ls_adapter_source *src, ls_adapter_origin *origin,
                            double *scale) {
    static char sha[65];
    ls_adapter a;
    ls_error err;
    ls_error_init(&err);
    ls_status st = ls_loader_load(ld, src, &a, origin, &err);
    if (st != LS_OK) fprintf(stderr, "load: %s\n", err.message);
    assert_int_equal(st, LS_OK);
    snprintf(sha, sizeof sha, "%s", a.meta.sha256);
    if (scale) *scale = a.meta.scale;
    ls_adapter_free(&a);
    ls_error_free(&err);
    return sha;
}

static void test_every_way_in_gives_the_same_factors(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    write_adapters(dir);
    ls_loader ld = make_loader(dir);
    ls_adapter_origin o1, o2, o3;
    double s1, s2, s3;
    char want[65];

    ls_adapter_source peft = {.path = "peft"};
    snprintf(want, sizeof want, "%s", load_sha(&ld, &peft, &o1, &s1));
    assert_true(s1 == 2.0); /* alpha 4 / r 2 */
    assert_string_equal(o1.path, "peft"); /* relative to the adapter directory */
    assert_int_equal(o1.params.format, LS_ADAPTER_FORMAT_PEFT);

    ls_adapter_source bare = {.path = "bare.safetensors"};
    assert_string_equal(load_sha(&ld, &bare, &o2, &s2), want);

    ls_tensor_set set;
    make_tensors(&set);
    ls_adapter_source inline_src = {.tensors = &set, .given = {.has_alpha = true, .lora_alpha = 4}};
    assert_string_equal(load_sha(&ld, &inline_src, &o3, &s3), want);
    assert_string_equal(o3.path, "");
    ls_tensor_set_free(&set);

    /* The reload reads the path with the stored parameters. */
    ls_adapter again;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_loader_reload(&ld, o1.path, &o1.params, &again, &err), LS_OK);
    assert_string_equal(again.meta.sha256, want);
    ls_adapter_free(&again);

    /* What the request states wins: a whole config without alpha means
     * scale 1, and the factors change with it. */
    ls_adapter_source stated = {.path = "peft"};
    ls_error_clear(&err);
    assert_int_equal(ls_adapter_config_parse_text("{\"r\": 2, \"lora_alpha\": 1}", &stated.given, &err), LS_OK);
    double s4;
    assert_string_not_equal(load_sha(&ld, &stated, &o1, &s4), want);
    assert_true(s4 == 0.5);
    ls_error_free(&err);
    ls_loader_close(&ld);
    ls_test_rmtree(dir);
    free(dir);
}

static void test_merge_rules(void **state) {
    (void)state;
    ls_adapter_params own = {.format = LS_ADAPTER_FORMAT_PEFT, .r = 8, .has_alpha = true, .lora_alpha = 16,
                             .has_rslora = true, .use_rslora = true, .has_scale = true, .scale = 3};
    ls_adapter_params given = {.strict = true};
    ls_adapter_params m = ls_adapter_params_merge(&own, &given);
    /* nothing stated: the file's, strict from the request */
    assert_int_equal(m.format, LS_ADAPTER_FORMAT_PEFT);
    assert_int_equal(m.r, 8);
    assert_true(m.has_alpha && m.lora_alpha == 16 && m.use_rslora && m.has_scale && m.scale == 3 && m.strict);
    /* single values stated (a query string): those alone change */
    given = (ls_adapter_params){.has_alpha = true, .lora_alpha = 4, .format = LS_ADAPTER_FORMAT_POOL};
    m = ls_adapter_params_merge(&own, &given);
    assert_true(m.lora_alpha == 4 && m.format == LS_ADAPTER_FORMAT_POOL && m.r == 8 && m.use_rslora && !m.strict);
    /* a whole config replaces r, alpha and rslora together */
    given = (ls_adapter_params){.whole_config = true, .r = 4};
    m = ls_adapter_params_merge(&own, &given);
    assert_true(m.r == 4 && !m.has_alpha && !m.has_rslora && !m.use_rslora && m.has_scale);
    /* text parameters set exactly what they carry */
    ls_adapter_params p = {0};
    ls_adapter_text_params t = {.use_rslora = "false", .r = "3"};
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_adapter_params_from_text(&t, &p, &err), LS_OK);
    assert_true(p.has_rslora && !p.use_rslora && p.r == 3 && !p.has_alpha && !p.has_scale);
    t = (ls_adapter_text_params){.lora_alpha = "nan"};
    assert_int_equal(ls_adapter_params_from_text(&t, &p, &err), LS_INVALID_REQUEST);
    ls_error_free(&err);
}

static void test_paths_stay_beneath_the_directory(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    write_adapters(dir);
    ls_loader ld = make_loader(dir);
    const char *outside[] = {"../", "/etc/passwd", "peft/../../", "missing"};
    for (size_t i = 0; i < sizeof outside / sizeof *outside; i++) {
        ls_adapter_source src = {.path = outside[i]};
        ls_adapter a;
        ls_adapter_origin o;
        ls_error err;
        ls_error_init(&err);
        assert_int_equal(ls_loader_load(&ld, &src, &a, &o, &err), LS_INVALID_REQUEST);
        assert_null(a.data);
        assert_string_equal(o.path, "");
        ls_error_free(&err);
    }
    ls_loader_close(&ld);
    ls_test_rmtree(dir);
    free(dir);
}
/* Loads path and expects a refusal whose message names path and not the
 * server's directory, and whose hint says hint (NULL: anything). */
static void expect_refused_hint(const ls_loader *ld, const char *path, const char *why, const char *hint) {
    ls_adapter_source src = {.path = path};
    ls_adapter a;
    ls_adapter_origin o;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_loader_load(ld, &src, &a, &o, &err), LS_INVALID_REQUEST);
    assert_null(a.data);
    if (!strstr(err.message, why)) fprintf(stderr, "%s: %s\n", path, err.message);
    assert_non_null(strstr(err.message, why));
    assert_null(strstr(err.message, ld->root));
    if (hint) assert_non_null(strstr(err.hint, hint));
    ls_error_free(&err);
}

static void expect_refused(const ls_loader *ld, const char *path, const char *why) {
    expect_refused_hint(ld, path, why, NULL);
}

static void test_paths_and_messages(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    write_adapters(dir);
    ls_loader ld = make_loader(dir);
    char path[4400];
    /* A PEFT directory's config given for the adapter: read as
     * safetensors it failed on a "header length"; the hint names the
     * directory to give. */
    expect_refused_hint(&ld, "peft/adapter_config.json", "is a PEFT directory's adapter_config.json, not an adapter file",
                        "give the path of its directory, \"peft\"");
    /* A link out of the directory, one inside it, and a long path of
     * slashes that climbs out (cut at a buffer's end it would not). */
    snprintf(path, sizeof path, "%s/out", dir);
    assert_int_equal(symlink("/etc", path), 0);
    snprintf(path, sizeof path, "%s/in", dir);
    assert_int_equal(symlink("peft", path), 0);
    expect_refused(&ld, "out/passwd", "leads out of the adapter directory");
    expect_refused(&ld, "../../../../etc/passwd", "leads out of the adapter directory");
    expect_refused(&ld, "peft/../../", "leads out of the adapter directory");
    expect_refused(&ld, "missing", "does not exist in the adapter directory");
    /* A long path is shown by its end, marked as cut: it names the file. */
    char longp[400];
    memset(longp, 'a', 300);
    longp[150] = '/';
    strcpy(longp + 300, "/the-end-é");
    expect_refused(&ld, longp, "\"...aaa");
    expect_refused(&ld, longp, "aaa/the-end-é\" does not exist");
    expect_refused(&ld, "/etc/passwd", "is not beneath the adapter directory");
    expect_refused(&ld, "", "1 to");
    size_t n = 9000;
    char *rel = malloc(n + 32);
    assert_non_null(rel);
    rel[0] = 'd';
    memset(rel + 1, '/', n);
    strcpy(rel + 1 + n, "../../../../etc");
    expect_refused(&ld, rel, "1 to");
    free(rel);
    /* Inside: a link that stays in, and the directory's own absolute path;
     * the registry keeps the path relative. */
    ls_adapter_origin o;
    ls_adapter_source in = {.path = "in"};
    char want[65];
    snprintf(want, sizeof want, "%s", load_sha(&ld, &in, &o, NULL));
    assert_string_equal(o.path, "in");
    snprintf(path, sizeof path, "%s/peft", ld.root);
    ls_adapter_source abs = {.path = path};
    assert_string_equal(load_sha(&ld, &abs, &o, NULL), want);
    assert_string_equal(o.path, "peft");
    ls_loader_close(&ld);

    /* An --adapter-dir given through a link (or a mount): absolute paths
     * spelled under it as given, slashes doubled or final, are inside
     * too; the real path still is. */
    char link_dir[4200];
    snprintf(link_dir, sizeof link_dir, "%s-link", dir);
    assert_int_equal(symlink(dir, link_dir), 0);
    char given[4300];
    snprintf(given, sizeof given, "%s//", link_dir);
    ld = make_loader(given);
    snprintf(path, sizeof path, "%s/peft", link_dir);
    abs.path = path;
    assert_string_equal(load_sha(&ld, &abs, &o, NULL), want);
    assert_string_equal(o.path, "peft");
    snprintf(path, sizeof path, "%s//peft", link_dir);
    assert_string_equal(load_sha(&ld, &abs, &o, NULL), want);
    snprintf(path, sizeof path, "%s/peft", ld.root);
    assert_string_equal(load_sha(&ld, &abs, &o, NULL), want);
    snprintf(path, sizeof path, "%s-linkx/peft", dir); /* a name that only begins like it */
    char rel_out[64];
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_loader_relative(&ld, path, rel_out, sizeof rel_out, &err), LS_INVALID_REQUEST);
    assert_non_null(strstr(err.message, "is not beneath the adapter directory"));
    ls_error_free(&err);
    ls_loader_close(&ld);
    assert_int_equal(unlink(link_dir), 0);
    ls_test_rmtree(dir);
    free(dir);
}

/* A Hugging Face hub cache snapshot: its files are links to
 * ../../blobs/<hash>, out of the snapshot but beneath a --adapter-dir at
 * the hub cache, so they load as the directory they link from would, by
 * path or by repo id (refs/main's snapshot, kept as the source). A link
 * in a PEFT directory out of the adapter directory is still refused,
 * and with the snapshot itself as --adapter-dir the hint says what to
 * give instead. */
#define COMMIT "0123456789abcdef0123456789abcdef01234567"
static void test_hub_cache_snapshot(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    write_adapters(dir);
    char path[4400], to[4400];
    const char *files[2] = {"adapter_config.json", "adapter_model.safetensors"};
    const char *dirs[] = {"models--org--a", "models--org--a/blobs", "models--org--a/snapshots",
                          "models--org--a/snapshots/" COMMIT, "models--org--a/refs", "models--org--noref", "abs",
                          "abs/real", "abs/x", "escape", "cross", "cross2", "cross2/peft"};
    ls_test_mkdirs(dir, dirs, sizeof dirs / sizeof *dirs);
    snprintf(path, sizeof path, "%s/models--org--a/refs/main", dir);
    ls_test_write_file(path, COMMIT, 40);
    const char *gone[] = {"models--org--gone", "models--org--gone/refs", "models--org--gone/snapshots"};
    ls_test_mkdirs(dir, gone, 3);
    snprintf(path, sizeof path, "%s/models--org--gone/refs/main", dir); /* its snapshot a file, not a directory */
    ls_test_write_file(path, COMMIT, 40);
    snprintf(path, sizeof path, "%s/models--org--gone/snapshots/" COMMIT, dir);
    ls_test_write_file(path, "x", 1);
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/peft/%s", dir, files[i]);
        snprintf(to, sizeof to, "%s/models--org--a/blobs/b%d", dir, i);
        assert_int_equal(link(path, to), 0);
        snprintf(path, sizeof path, "%s/models--org--a/snapshots/" COMMIT "/%s", dir, files[i]);
        snprintf(to, sizeof to, "../../blobs/b%d", i);
        assert_int_equal(symlink(to, path), 0);
        snprintf(path, sizeof path, "%s/peft/%s", dir, files[i]);
        snprintf(to, sizeof to, "%s/abs/real/%s", dir, files[i]);
        assert_int_equal(link(path, to), 0);
        snprintf(path, sizeof path, "%s/abs/x/%s", dir, files[i]); /* absolute, in its top-level directory */
        snprintf(to, sizeof to, "%s/abs/real/%s", dir, files[i]);
        assert_int_equal(symlink(to, path), 0);
        snprintf(path, sizeof path, "%s/cross/%s", dir, files[i]); /* absolute, into another one */
        snprintf(to, sizeof to, "%s/peft/%s", dir, files[i]);
        assert_int_equal(symlink(to, path), 0);
        snprintf(path, sizeof path, "%s/cross2/peft/%s", dir, files[i]); /* relative, into another one */
        snprintf(to, sizeof to, "../../peft/%s", files[i]);
        assert_int_equal(symlink(to, path), 0);
    }
    snprintf(path, sizeof path, "%s/models--org--a/alias", dir); /* absolute, to its own snapshot */
    snprintf(to, sizeof to, "%s/models--org--a/snapshots/" COMMIT, dir);
    assert_int_equal(symlink(to, path), 0);
    snprintf(path, sizeof path, "%s/hubalias", dir); /* a top-level directory's other name */
    assert_int_equal(symlink("models--org--a", path), 0);
    snprintf(path, sizeof path, "%s/escape/adapter_config.json", dir);
    assert_int_equal(symlink("../../../../../../etc/hostname", path), 0);
    snprintf(path, sizeof path, "%s/escape/adapter_model.safetensors", dir);
    snprintf(to, sizeof to, "%s/peft/adapter_model.safetensors", dir);
    assert_int_equal(link(to, path), 0);

    ls_loader ld = make_loader(dir);
    ls_adapter_origin o;
    ls_adapter_source src = {.path = "peft"};
    char want[65];
    snprintf(want, sizeof want, "%s", load_sha(&ld, &src, &o, NULL));
    const char *same[] = {"models--org--a/snapshots/" COMMIT,
                          "models--org--a/snapshots/" COMMIT "/adapter_model.safetensors", "abs/x",
                          "abs/x/adapter_model.safetensors", "org/a", "models--org--a/alias",
                          "hubalias/snapshots/" COMMIT, "./models--org--a/snapshots/" COMMIT};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        double scale = 0;
        src.path = same[i];
        assert_string_equal(load_sha(&ld, &src, &o, &scale), want);
        assert_true(scale == 2.0); /* the config was read: alpha 4 / r 2 */
        if (!strcmp(same[i], "org/a")) assert_string_equal(o.path, "models--org--a/snapshots/" COMMIT);
    }
    expect_refused(&ld, "org/missing", "does not exist in the adapter directory");
    expect_refused(&ld, "org/noref", "refs/main is missing");
    expect_refused(&ld, "org/gone", "names a snapshot that is not a directory there");
    expect_refused(&ld, "escape", "leads out of the adapter directory");
    expect_refused(&ld, "escape/adapter_model.safetensors", "leads out of the adapter directory");
    /* A link is never followed into another top-level directory. */
    expect_refused(&ld, "cross", "leads out of the adapter directory");
    expect_refused(&ld, "cross/adapter_model.safetensors", "leads out of the adapter directory");
    expect_refused(&ld, "cross2/peft", "leads out of the adapter directory");
    /* A tenant's TENANT/NAME is a path, never a repo id. */
    ls_adapter_source tenant = {.path = "org/a", .tenant = true};
    ls_adapter a;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_loader_load(&ld, &tenant, &a, &o, &err), LS_INVALID_REQUEST);
    assert_non_null(strstr(err.message, "does not exist in the adapter directory"));
    assert_null(strstr(err.hint, "repo id"));
    assert_non_null(strstr(err.hint, "tenant's own directory"));
    ls_error_free(&err);
    ls_loader_close(&ld);

    snprintf(path, sizeof path, "%s/models--org--a/snapshots/" COMMIT, dir);
    ld = make_loader(path);
    const char *snap[] = {".", "adapter_model.safetensors"};
    for (size_t i = 0; i < 2; i++) {
        ls_adapter a;
        ls_error err;
        ls_error_init(&err);
        src.path = snap[i];
        assert_int_equal(ls_loader_load(&ld, &src, &a, &o, &err), LS_INVALID_REQUEST);
        assert_non_null(strstr(err.message, "leads out of the adapter directory"));
        assert_non_null(strstr(err.hint, "hub cache"));
        ls_error_free(&err);
    }
    ls_loader_close(&ld);
    ls_test_rmtree(dir);
    free(dir);
}

/* A path that climbs out and comes back through a link outside, or a
 * /proc magic link to the directory, is refused without the server
 * reading links outside it. With scoped (a server with tenants) a path
 * of several components resolves beneath its top-level directory, which
 * must itself be a directory, not a link. */
static void test_no_way_out_and_back(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    write_adapters(dir);
    char path[4400], to[4400];
    snprintf(path, sizeof path, "%s-out", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s-out/backin", dir);
    snprintf(to, sizeof to, "%s/peft", dir);
    assert_int_equal(symlink(to, path), 0);
    const char *mkd[] = {"t1", "t1/real", "t2"};
    ls_test_mkdirs(dir, mkd, 3);
    const char *files[2] = {"adapter_config.json", "adapter_model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/peft/%s", dir, files[i]);
        snprintf(to, sizeof to, "%s/t1/real/%s", dir, files[i]);
        assert_int_equal(link(path, to), 0);
    }
    snprintf(path, sizeof path, "%s/t1/own", dir); /* within t1 */
    assert_int_equal(symlink("real", path), 0);
    snprintf(path, sizeof path, "%s/t1/other", dir); /* into t2's neighbour */
    assert_int_equal(symlink("../peft", path), 0);
    snprintf(path, sizeof path, "%s/tl", dir); /* a top-level link to t1 */
    assert_int_equal(symlink("t1", path), 0);

    ls_loader ld = make_loader(dir);
    const char *base = strrchr(ld.root, '/') + 1;
    snprintf(path, sizeof path, "../%s-out/backin", base);
    expect_refused(&ld, path, "leads out of the adapter directory");
    snprintf(path, sizeof path, "../../../../../../../proc/self/fd/%d", ld.dirfd);
    expect_refused(&ld, path, "leads out of the adapter directory");
    ls_adapter_origin o;
    ls_adapter_source src = {.path = "peft"};
    char want[65];
    snprintf(want, sizeof want, "%s", load_sha(&ld, &src, &o, NULL));
    src.path = "t1/other"; /* unscoped: beneath the directory, as before */
    assert_string_equal(load_sha(&ld, &src, &o, NULL), want);
    ld.scoped = true;
    src.path = "t1/own";
    assert_string_equal(load_sha(&ld, &src, &o, NULL), want);
    src.path = "./t1/own"; /* "./" is no top-level directory */
    assert_string_equal(load_sha(&ld, &src, &o, NULL), want);
    src.path = "./peft";
    assert_string_equal(load_sha(&ld, &src, &o, NULL), want);
    expect_refused(&ld, "t1/other", "leads out of the adapter directory");
    expect_refused(&ld, "tl/own", "leads out of the adapter directory");
    expect_refused(&ld, "t2/nothing", "does not exist");
    expect_refused(&ld, "t3/nothing", "does not exist");
    ls_loader_close(&ld);
    snprintf(path, sizeof path, "%s-out", dir);
    ls_test_rmtree(path);
    ls_test_rmtree(dir);
    free(dir);
}

/* A file in the adapter tree that is not an adapter: its bytes never
 * reach a message (the header length field, the JSON of a config). */
static void test_file_bytes_stay_private(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    char path[4200];
    snprintf(path, sizeof path, "%s/secret.safetensors", dir);
    ls_test_write_file(path, "root:x:0:0:SECRETVALUE\n", 23);
    assert_int_equal(mkdir(strcat(strcpy(path, dir), "/cfg"), 0700), 0);
    snprintf(path, sizeof path, "%s/cfg/adapter_config.json", dir);
    ls_test_write_file(path, "SECRETVALUE = 1", 15);
    ls_loader ld = make_loader(dir);
    const char *paths[] = {"secret.safetensors", "cfg"};
    for (int i = 0; i < 2; i++) {
        ls_adapter_source src = {.path = paths[i]};
        ls_adapter a;
        ls_adapter_origin o;
        ls_error err;
        ls_error_init(&err);
        assert_int_not_equal(ls_loader_load(&ld, &src, &a, &o, &err), LS_OK);
        assert_null(strstr(err.message, "SECRET"));
        assert_null(strstr(err.message, "root:x"));
        for (size_t v = 0; v < err.n_violations; v++) {
            assert_null(strstr(err.violations[v].message, "root:x"));
            assert_true(err.violations[v].got == LS_NA || err.violations[v].got < 100);
        }
        ls_error_free(&err);
    }
    ls_loader_close(&ld);
    ls_test_rmtree(dir);
    free(dir);
}

/* A new directory (*dir, the caller's to free) with write_adapters' files,
 * in.safetensors (a link to bare.safetensors), out.safetensors (a link
 * out) and up (a link to ".."); returns it open. */
static int links_dir(char **dir) {
    *dir = ls_test_mkdtemp();
    write_adapters(*dir);
    const char *links[][2] = {{"in.safetensors", "bare.safetensors"}, {"out.safetensors", "/etc/hostname"}, {"up", ".."}};
    for (size_t i = 0; i < 3; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", *dir, links[i][0]);
        assert_int_equal(symlink(links[i][1], path), 0);
    }
    int dfd = open(*dir, O_RDONLY | O_DIRECTORY);
    assert_true(dfd >= 0);
    return dfd;
}

/* ls_loader_stat, auto-load's lookup: links followed as far as the
 * loader's open follows them (a hub snapshot's file, an absolute link in
 * the same top-level directory), none out of the directory, and with
 * scoped none out of the path's top-level directory (another tenant's). */
static void test_stat_as_the_loader_opens(void **state) {
    (void)state;
    char *dir;
    int dfd = links_dir(&dir);
    char path[4200], target[4200];
    const char *dirs[] = {"acme", "acme/blobs", "zeta"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, dirs[i]);
        assert_int_equal(mkdir(path, 0700), 0);
    }
    const char *files[] = {"acme/blobs/m", "zeta/secret"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        ls_test_write_file(path, "x", 1);
    }
    snprintf(path, sizeof path, "%s/acme/abs", dir);
    snprintf(target, sizeof target, "%s/acme/blobs/m", dir);
    assert_int_equal(symlink(target, path), 0);
    snprintf(path, sizeof path, "%s/acme/peek", dir);
    assert_int_equal(symlink("../zeta/secret", path), 0);
    ls_loader ld = make_loader(dir);
    struct stat sb;
    const char *found[] = {"in.safetensors", "bare.safetensors", "acme/abs", "acme/peek"};
    for (int scoped = 0; scoped < 2; scoped++) {
        ld.scoped = scoped;
        for (size_t i = 0; i < sizeof found / sizeof *found; i++) {
            const bool crosses = scoped && !strcmp(found[i], "acme/peek");
            errno = 0;
            const int rc = ls_loader_stat(&ld, found[i], &sb);
            if (crosses ? rc != -1 || errno != EXDEV : rc != 0 || !S_ISREG(sb.st_mode))
                fail_msg("scoped %d, %s: %d errno %d", scoped, found[i], rc, errno);
        }
        assert_int_equal(ls_loader_stat(&ld, "peft", &sb), 0);
        assert_true(S_ISDIR(sb.st_mode));
        const char *out[] = {"out.safetensors", "up", "up/x", "../x"};
        for (size_t i = 0; i < sizeof out / sizeof *out; i++) {
            errno = 0;
            assert_int_equal(ls_loader_stat(&ld, out[i], &sb), -1);
            if (errno != EXDEV && errno != ELOOP) fail_msg("%s: errno %d", out[i], errno);
        }
        assert_int_equal(ls_loader_stat(&ld, "nothing", &sb), -1);
        assert_int_equal(errno, ENOENT);
    }
    ls_loader_close(&ld);
    close(dfd);
    ls_test_rmtree(dir);
    free(dir);
}

/* fstat of rel opened O_PATH beneath dfd: 0, or -1 with errno. */
static int stat_beneath(int dfd, const char *rel, struct stat *sb) {
    int fd = ls_file_open_beneath(dfd, rel, O_PATH);
    if (fd < 0) return -1;
    int rc = fstat(fd, sb);
    close(fd);
    return rc;
}

/* Without tenants a path resolves beneath the whole directory: a PEFT
 * directory's model file named by its path loads through a link into
 * another top-level directory, with the config beside the link (and
 * without one, as a bare file), as before the checks after the open
 * stopped following links in the kernel. */
static void test_file_path_through_a_link(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    write_adapters(dir);
    char path[4200];
    const char *subs[] = {"a", "b"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, subs[i]);
        assert_int_equal(mkdir(path, 0700), 0);
        snprintf(path, sizeof path, "%s/%s/adapter_model.safetensors", dir, subs[i]);
        assert_int_equal(symlink("../bare.safetensors", path), 0);
    }
    snprintf(path, sizeof path, "%s/a/adapter_config.json", dir);
    const char *cfg = "{\"r\": 2, \"lora_alpha\": 8}";
    ls_test_write_file(path, cfg, strlen(cfg));
    ls_loader ld = make_loader(dir);
    ls_adapter_source src = {.path = "a/adapter_model.safetensors"};
    ls_adapter_origin o;
    double scale = 0;
    load_sha(&ld, &src, &o, &scale);
    assert_true(scale == 4.0); /* a's config: alpha 8 / r 2 */
    src.path = "b/adapter_model.safetensors";
    load_sha(&ld, &src, &o, &scale);
    assert_true(scale == 2.0); /* the file's own lora_alpha 4 / r 2 */
    ls_loader_close(&ld);
    ls_test_rmtree(dir);
    free(dir);
}

/* Makes openat2 fail with ENOSYS in this process, as on a kernel
 * without it: ls_file_open_beneath then walks the path itself. */
static int hide_openat2(void) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat2, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof *f, .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

/* The walk that stands in for openat2 refuses '..' and every link, the
 * last component's too (an O_PATH open of a link would be the link). */
static void test_walk_without_openat2(void **state) {
    (void)state;
    char *dir;
    int dfd = links_dir(&dir);
    fflush(NULL);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        /* Plain checks, no cmocka, in the child: its exit code says which failed. */
        struct stat sb;
        if (hide_openat2()) _exit(10);
        if (stat_beneath(dfd, "bare.safetensors", &sb) || !S_ISREG(sb.st_mode)) _exit(11);
        if (stat_beneath(dfd, "peft", &sb) || !S_ISDIR(sb.st_mode)) _exit(12);
        int fd = ls_file_open_beneath(dfd, "peft/adapter_config.json", O_RDONLY);
        if (fd < 0) _exit(13);
        close(fd);
        const char *refused[] = {"in.safetensors", "out.safetensors", "up/x", "../x", "peft/../bare.safetensors"};
        for (int i = 0; i < 5; i++) {
            errno = 0;
            if (stat_beneath(dfd, refused[i], &sb) == 0 || (errno != ELOOP && errno != EXDEV)) _exit(20 + i);
            if ((fd = ls_file_open_beneath(dfd, refused[i], O_RDONLY)) >= 0 || (errno != ELOOP && errno != EXDEV))
                _exit(30 + i);
        }
        if (stat_beneath(dfd, "nothing", &sb) == 0 || errno != ENOENT) _exit(40);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status)) fail_msg("the walk's check %d failed", WEXITSTATUS(status));
    close(dfd);
    ls_test_rmtree(dir);
    free(dir);
}

/* Another process swaps a directory of the tree for a link out of it as
 * fast as it can while loads run: every load gives the adapter inside or
 * a clean refusal, never what lies outside. */
static void test_swap_for_a_link_out(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp(), *outside = ls_test_mkdtemp();
    write_adapters(dir);
    write_adapters(outside);
    /* The outside adapter differs (another alpha), so reading it shows. */
    char p1[4200], p2[4200];
    snprintf(p1, sizeof p1, "%s/peft/adapter_config.json", outside);
    ls_test_write_file(p1, "{\"r\": 2, \"lora_alpha\": 64}", 27);
    ls_loader ld = make_loader(dir);
    ls_adapter_source src = {.path = "peft"};
    ls_adapter_origin o;
    char want[65];
    snprintf(want, sizeof want, "%s", load_sha(&ld, &src, &o, NULL));
    snprintf(p1, sizeof p1, "%s/peft", dir);
    snprintf(p2, sizeof p2, "%s/peft.real", dir);
    char link_to[4200];
    snprintf(link_to, sizeof link_to, "%s/peft", outside);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        for (;;) {
            if (rename(p1, p2) == 0) {
                if (symlink(link_to, p1) == 0) unlink(p1);
                rename(p2, p1);
            }
        }
    }
    int ok = 0, refused = 0;
    for (int i = 0; i < 3000; i++) {
        ls_adapter a;
        ls_error err;
        ls_error_init(&err);
        ls_status st = ls_loader_load(&ld, &src, &a, &o, &err);
        if (st == LS_OK) {
            assert_string_equal(a.meta.sha256, want);
            ls_adapter_free(&a);
            ok++;
        } else {
            assert_int_equal(st, LS_INVALID_REQUEST);
            refused++;
        }
        ls_error_free(&err);
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    struct stat sb;
    if (lstat(p2, &sb) == 0) { /* killed mid-swap: put the tree back */
        unlink(p1);
        assert_int_equal(rename(p2, p1), 0);
    }
    printf("swap: %d loads of the inside adapter, %d refused, none from outside\n", ok, refused);
    /* The swaps raced the loads (how many loads won depends on how the
     * two processes were scheduled), and with the tree whole again the
     * adapter loads. */
    assert_true(refused > 0);
    assert_string_equal(load_sha(&ld, &src, &o, NULL), want);
    ls_loader_close(&ld);
    ls_test_rmtree(dir);
    ls_test_rmtree(outside);
    free(dir);
    free(outside);
}

/* Another process rewrites the adapter file in place (truncate, then
 * write, as cp does) while loads read it: no signal kills the reader;
 * every load gives the adapter or a clean error. */
static void test_rewritten_while_read(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    write_adapters(dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/bare.safetensors", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t content[8192];
    size_t len = fread(content, 1, sizeof content, f);
    fclose(f);
    assert_true(len > 0 && len < sizeof content);
    ls_loader ld = make_loader(dir);
    ls_adapter_source src = {.path = "bare.safetensors"};
    ls_adapter_origin o;
    char want[65];
    snprintf(want, sizeof want, "%s", load_sha(&ld, &src, &o, NULL));
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        for (;;) {
            int fd = open(path, O_WRONLY | O_TRUNC);
            if (fd < 0) continue;
            for (size_t off = 0; off < len; off += 64) {
                ssize_t w = write(fd, content + off, len - off < 64 ? len - off : 64);
                (void)w;
            }
            close(fd);
        }
    }
    int ok = 0, failed = 0;
    for (int i = 0; i < 3000; i++) {
        ls_adapter a;
        ls_error err;
        ls_error_init(&err);
        if (ls_loader_load(&ld, &src, &a, &o, &err) == LS_OK) {
            assert_string_equal(a.meta.sha256, want);
            ls_adapter_free(&a);
            ok++;
        } else {
            failed++;
        }
        ls_error_free(&err);
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    printf("rewrite: %d loads whole, %d cleanly refused mid-write\n", ok, failed);
    ls_loader_close(&ld);
    ls_test_rmtree(dir);
    free(dir);
}

/* dir/name as a sparse file of size bytes (holes read as zeros), with
 * head (when given) written at its start. */
static void write_sparse(const char *dir, const char *name, long long size, const void *head, size_t head_len) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    if (head) assert_int_equal(write(fd, head, head_len), (ssize_t)head_len);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    close(fd);
}

/* Loads path, expects code and a message holding want; returns nothing
 * loaded. */
static void expect_load(const ls_loader *ld, const ls_adapter_source *src, ls_status code, const char *want) {
    ls_adapter a;
    ls_adapter_origin o;
    ls_error err;
    ls_error_init(&err);
    ls_status st = ls_loader_load(ld, src, &a, &o, &err);
    if (st != code || !strstr(err.message, want)) fprintf(stderr, "%s: %s\n", src->path, err.message);
    assert_int_equal(st, code);
    assert_non_null(strstr(err.message, want));
    assert_null(a.data);
    ls_error_free(&err);
}

/* Adapter files were read whole before their header was looked at, with
 * no size cap: a 2 GiB sparse file took 2 GiB to answer "header length
 * is 0", a 1 TiB one answered 500 out of memory. Now the size is checked
 * from fstat before any read (413 naming --max-adapter-mb) and the header
 * (length, JSON, offsets against the size) before the data: neither file
 * is read whole, and the peak memory does not grow. */
static void test_files_checked_before_read(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    const long long two_gib = 2LL << 30;
    write_sparse(dir, "zeros.safetensors", two_gib, NULL, 0);
    /* A sound header of one 4-byte tensor, in a file 2 GiB long: the
     * tensors do not tile the data section. */
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    ls_tensor t;
    const int64_t one[1] = {1};
    assert_true(ls_tensor_alloc_f32(&t, one, 1));
    assert_true(ls_tensor_set_add(&set, NAMES[0], &t));
    uint8_t *bytes;
    size_t len;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_safetensors_write(&set, &bytes, &len, &err), LS_OK);
    write_sparse(dir, "trailing.safetensors", two_gib, bytes, len);
    assert_int_equal(mkdir(strcat(strcpy((char[4200]){0}, dir), "/peft"), 0700), 0);
    write_sparse(dir, "peft/adapter_model.safetensors", two_gib, NULL, 0);
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/peft/adapter_config.json", dir);
    ls_test_write_file(cfg, "{\"r\": 2, \"lora_alpha\": 4}", 25);
    write_sparse(dir, "tib.safetensors", 1LL << 40, bytes, len);
    free(bytes);
    ls_tensor_set_free(&set);
    ls_error_free(&err);
    ls_loader ld = make_loader(dir);
    const long before = ls_test_proc_kib(0, "VmHWM");
    ls_adapter_source zeros = {.path = "zeros.safetensors"}, trailing = {.path = "trailing.safetensors"},
                      peft = {.path = "peft"}, tib = {.path = "tib.safetensors"};
    expect_load(&ld, &zeros, LS_SAFETENSORS_INVALID, "header length is 0");
    expect_load(&ld, &trailing, LS_SAFETENSORS_INVALID, "trailing bytes");
    expect_load(&ld, &peft, LS_SAFETENSORS_INVALID, "header length is 0");
    expect_load(&ld, &tib, LS_PAYLOAD_TOO_LARGE, "over the limit of 4096 MiB (--max-adapter-mb)");
    /* The cap is the loader's setting: a smaller one refuses the 2 GiB
     * file from its size, before its header is read. */
    const unsigned long long reads = ls_loader_file_reads(&ld);
    ld.max_file_bytes = 1u << 30;
    expect_load(&ld, &zeros, LS_PAYLOAD_TOO_LARGE, "2048.0 MiB, over the limit of 1024 MiB (--max-adapter-mb)");
    assert_int_equal(ls_loader_file_reads(&ld), reads);
    const long grew = ls_test_proc_kib(0, "VmHWM") - before;
    printf("four files of 2 GiB and one of 1 TiB refused; peak RSS grew by %ld KiB\n", grew);
    assert_true(grew < 64 * 1024);
    ls_loader_close(&ld);
    ls_test_rmtree(dir);
    free(dir);
}

/* A path upload of a bad file read it again on every request. A failure
 * of the file itself is remembered by the file's identity and the
 * parameters stated: the same request is answered without a read until
 * the file changes; other parameters, another file or a file changed a
 * moment ago (it may have been read half written) are read again. */
static void test_failures_remembered(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    write_adapters(dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    ls_test_write_file(path, "\x02\0\0\0\0\0\0\0{}  ", 12); /* two trailing bytes */
    ls_loader ld = make_loader(dir);
    ls_adapter_source bad = {.path = "bad.safetensors"};
    /* Written a moment ago: not remembered yet. */
    expect_load(&ld, &bad, LS_SAFETENSORS_INVALID, "trailing bytes");
    expect_load(&ld, &bad, LS_SAFETENSORS_INVALID, "trailing bytes");
    assert_int_equal(ls_loader_file_reads(&ld), 2);
    ld.memo_settle_ms = 0;
    expect_load(&ld, &bad, LS_SAFETENSORS_INVALID, "trailing bytes");
    expect_load(&ld, &bad, LS_SAFETENSORS_INVALID, "trailing bytes");
    expect_load(&ld, &bad, LS_SAFETENSORS_INVALID, "trailing bytes");
    assert_int_equal(ls_loader_file_reads(&ld), 3);
    /* Other parameters are another request: read once, then remembered. */
    ls_adapter_source strict = {.path = "bad.safetensors", .given = {.strict = true}};
    expect_load(&ld, &strict, LS_SAFETENSORS_INVALID, "trailing bytes");
    expect_load(&ld, &strict, LS_SAFETENSORS_INVALID, "trailing bytes");
    assert_int_equal(ls_loader_file_reads(&ld), 4);
    /* The file rewritten: read again. */
    ls_test_write_file(path, "\x02\0\0\0\0\0\0\0{}", 10);
    expect_load(&ld, &bad, LS_LORA_EMPTY, "no LoRA factor");
    assert_int_equal(ls_loader_file_reads(&ld), 5);
    /* A PEFT directory whose factors do not fit the model (rank 8 > 4):
     * remembered, until its config changes. */
    snprintf(path, sizeof path, "%s/peft/adapter_config.json", dir);
    ls_test_write_file(path, "{\"r\": 8, \"lora_alpha\": 4}", 25);
    ls_adapter_source peft = {.path = "peft"};
    expect_load(&ld, &peft, LS_LORA_RANK_MISMATCH, "rank");
    expect_load(&ld, &peft, LS_LORA_RANK_MISMATCH, "rank");
    assert_int_equal(ls_loader_file_reads(&ld), 6);
    ls_test_write_file(path, "{\"r\": 2, \"lora_alpha\": 4}", 25);
    load_sha(&ld, &peft, &(ls_adapter_origin){0}, NULL);
    assert_int_equal(ls_loader_file_reads(&ld), 7);
    /* Successes are never remembered: each load reads. */
    load_sha(&ld, &peft, &(ls_adapter_origin){0}, NULL);
    assert_int_equal(ls_loader_file_reads(&ld), 8);
    ls_loader_close(&ld);
    ls_test_rmtree(dir);
    free(dir);
}

/* A read the disk fails (EIO) was answered with the caller's code: 400
 * for an adapter file, 422 for its adapter_config.json, both remembered
 * against a file with nothing wrong in it. It is LS_INTERNAL now, with a
 * hint to retry, and errno says why. /proc/self/mem is a regular file
 * whose first page, unmapped, reads as EIO. */
static void test_read_error_is_not_the_files(void **state) {
    (void)state;
    int fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        print_message("skipped: /proc/self/mem cannot be opened here (%s)\n", strerror(errno));
        skip();
    }
    uint8_t *data = NULL;
    size_t len = 0;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_file_read_fd(fd, 1 << 20, &data, &len, "mem", LS_ADAPTER_CONFIG_INVALID, &err), LS_INTERNAL);
    assert_int_equal(errno, EIO);
    assert_null(data);
    assert_non_null(strstr(err.message, "cannot read mem: Input/output error"));
    assert_non_null(strstr(err.hint, "retry, and check the disk"));
    ls_error_free(&err);
    close(fd);
}

/* In a child as uid and gid 65534 (as root) or as this user: loading
 * path gives LS_INVALID_REQUEST, "Permission denied" and a hint naming
 * the uid and what to grant. The exit status says which failed. */
static int load_unreadable(const ls_loader *ld, const char *path) {
    if (geteuid() == 0 && (setgroups(0, NULL) != 0 || setresgid(65534, 65534, 65534) != 0 ||
                           setresuid(65534, 65534, 65534) != 0))
        return 2;
    char uid[64];
    snprintf(uid, sizeof uid, "runs as uid %u", (unsigned)geteuid());
    ls_adapter a;
    ls_adapter_origin o;
    ls_error err;
    ls_error_init(&err);
    const ls_adapter_source src = {.path = path};
    const ls_status st = ls_loader_load(ld, &src, &a, &o, &err);
    fprintf(stderr, "  %s: %s (%s)\n", path, err.message, err.hint);
    if (st != LS_INVALID_REQUEST) return 3;
    if (!strstr(err.message, "Permission denied")) return 4;
    if (!strstr(err.hint, uid) || !strstr(err.hint, "read access")) return 5;
    return 0;
}

/* A file the server's user may not read (fetched as root into a
 * container, say) was 400 with the hint to read the API reference; the
 * hint now names the server's uid and what it needs. Root reads every
 * file, so the loader runs in a child that gives that up. */
static void test_unreadable_file(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    write_adapters(dir);
    char path[4200];
    assert_int_equal(chmod(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/peft", dir);
    assert_int_equal(chmod(path, 0755), 0);
    snprintf(path, sizeof path, "%s/peft/adapter_config.json", dir);
    assert_int_equal(chmod(path, 0), 0);
    snprintf(path, sizeof path, "%s/bare.safetensors", dir);
    assert_int_equal(chmod(path, 0), 0);
    ls_loader ld = make_loader(dir);
    const char *const paths[] = {"bare.safetensors", "peft"};
    for (int i = 0; i < 2; i++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) _exit(load_unreadable(&ld, paths[i]));
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        if (WEXITSTATUS(status) == 2) fail_msg("cannot become uid 65534 to test an unreadable file");
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    ls_loader_close(&ld);
    ls_test_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_way_in_gives_the_same_factors),
        cmocka_unit_test(test_merge_rules),
        cmocka_unit_test(test_paths_stay_beneath_the_directory),
        cmocka_unit_test(test_paths_and_messages),
        cmocka_unit_test(test_hub_cache_snapshot),
        cmocka_unit_test(test_no_way_out_and_back),
        cmocka_unit_test(test_file_bytes_stay_private),
        cmocka_unit_test(test_stat_as_the_loader_opens),
        cmocka_unit_test(test_walk_without_openat2),
        cmocka_unit_test(test_file_path_through_a_link),
        cmocka_unit_test(test_swap_for_a_link_out),
        cmocka_unit_test(test_rewritten_while_read),
        cmocka_unit_test(test_files_checked_before_read),
        cmocka_unit_test(test_failures_remembered),
        cmocka_unit_test(test_unreadable_file),
        cmocka_unit_test(test_read_error_is_not_the_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
