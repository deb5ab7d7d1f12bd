/* The pool operations of the fault sweeps (fault_cases.h): the worlds they
 * start from, the call, its retry and its outputs. */
#include "tests/fault/fault_cases.h"

#include <string.h>

#include "tests/util/pool_fixture.h"
#include "tests/util/testutil.h"

/* Tokens of the forward and the names they ask for (NULL: base only). */
#define FC_T 7
/* The tokens' adapters B, A, base, C, B, D, A as the request parser
 * builds them: each distinct name once, an index per token. */
static const char *fc_adapters[] = {"B", "A", "C", "D"};
static int fc_of_token[FC_T] = {0, 1, -1, 2, 0, 3, 1};
static const ls_token_names fc_names = {.T = FC_T, .n = 4, .names = fc_adapters, .of_token = fc_of_token, .borrow = true};

static char *fc_adapter_dir;  /* peft1/ and bare.safetensors */
static char *fc_restore_tmpl; /* the state directory every restore starts from */

typedef struct {
    const fc_spec *spec;
    fx_world *w;
    char *state_copy; /* FC_RESTORE: this attempt's copy of the template */
    ls_adapter a;     /* the adapter a load registers (the caller's until it succeeds) */
    char a_sha[65];
    ls_adapter_info info;
    float x[FC_T * 8], g[FC_T * 2], y[FC_T * 8]; /* fx_dims: H = 8, n = 2 */
    ls_pool_used used[FC_T];
    int n_used;
    int restored;
} fc_ctx;

/* ---- worlds -------------------------------------------------------------------- */

/* B read from the adapter directory's PEFT files and registered with its
 * source, as POST /adapters with a path does. */
static void fc_load_from_source(fx_world *w, const char *name) {
    ls_adapter_source src = {.path = "peft1"};
    ls_adapter a;
    ls_adapter_origin origin;
    ls_adapter_info info;
    ls_error err;
    ls_error_init(&err);
    if (ls_loader_load(&w->ld, &src, &a, &origin, &err) != LS_OK) fail_msg("loader: %s", err.message);
    fx_catalog_add(&a);
    ls_pool_load_opts o = {.source_path = origin.path, .params = origin.params};
    if (ls_pool_load(w->p, name, &a, &o, &info, &err) != LS_OK) fail_msg("load %s: %s", name, err.message);
    ls_adapter_free(&a);
    ls_error_free(&err);
}

/* Copies the template state directory (flat: it has no subdirectory) to
 * a new temp dir. */
static char *fc_copy_state(void) {
    char *dir = ls_test_mkdtemp();
    assert_non_null(dir);
    fx_state files;
    memset(&files, 0, sizeof files);
    fx_read_files(fc_restore_tmpl, &files);
    for (size_t i = 0; i < files.n_files; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", dir, files.files[i].path);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(files.files[i].data, 1, files.files[i].len, f), files.files[i].len);
        assert_int_equal(fclose(f), 0);
    }
    fx_state_free(&files);
    return dir;
}

static void *fc_setup(void *arg) {
    const fc_spec *spec = arg;
    fc_ctx *c = calloc(1, sizeof *c);
    assert_non_null(c);
    c->spec = spec;
    fx_opts o = {.slots = 3, .state = spec->where == FC_STATE};
    if (spec->op == FC_FORWARD && spec->where != FC_PLAIN) o.host_cache = 3; /* B's copy goes */
    if (spec->where == FC_SOURCE) o.adapter_dir = fc_adapter_dir;
    if (spec->op == FC_RESTORE) {
        c->state_copy = fc_copy_state();
        o.state = true;
        o.state_dir = c->state_copy;
    }
    fx_world *w = c->w = fx_world_new(&o);

    switch (spec->op) {
    case FC_LOAD_NEW:
    case FC_LOAD_PINNED:
    case FC_LOAD_REPLACE:
    case FC_REPLACE_PINNED:
    case FC_DELETE:
        fx_load(w, "A", 3, 1, spec->op == FC_REPLACE_PINNED, false);
        fx_load(w, "B", 2, 2, false, false);
        break;
    case FC_LOAD_EVICT:
        fx_load(w, "A", 3, 1, false, false);
        fx_load(w, "B", 2, 2, false, false);
        fx_load(w, "C", 4, 3, false, false);
        break;
    case FC_FORWARD: {
        fx_load(w, "A", 3, 1, true, false);
        if (spec->where == FC_SOURCE) fc_load_from_source(w, "B");
        else fx_load(w, "B", 2, 2, false, false);
        fx_load(w, "C", 4, 3, false, false);
        fx_load(w, "D", 3, 5, false, false); /* evicts B, the least recently used unpinned one */
        ls_adapter_info b;
        ls_error err;
        ls_error_init(&err);
        assert_int_equal(ls_pool_describe(w->p, "B", &b, &err), LS_OK);
        ls_error_free(&err);
        assert_int_equal(b.slot, -1);
        assert_int_equal(b.host_data, spec->where == FC_PLAIN); /* dropped from the host tier */
        uint64_t s = 99;
        for (size_t i = 0; i < sizeof c->x / sizeof *c->x; i++) c->x[i] = pt_uniform(&s, 1.0f);
        for (size_t i = 0; i < sizeof c->g / sizeof *c->g; i++) c->g[i] = 1.0f + pt_uniform(&s, 0.5f);
        break;
    }
    case FC_RESTORE:
        break;
    }
    switch (spec->op) {
    case FC_LOAD_NEW:
    case FC_LOAD_PINNED:
        fx_adapter(4, 3, &c->a);
        break;
    case FC_LOAD_REPLACE:
    case FC_REPLACE_PINNED:
        fx_adapter(3, 4, &c->a);
        break;
    case FC_LOAD_EVICT:
        fx_adapter(2, 8, &c->a);
        break;
    default:
        break;
    }
    snprintf(c->a_sha, sizeof c->a_sha, "%s", c->a.meta.sha256);
    return c;
}

static void fc_teardown(void *ctx) {
    fc_ctx *c = ctx;
    ls_adapter_free(&c->a);
    fx_world_free(c->w);
    if (c->state_copy) ls_test_rmtree(c->state_copy);
    free(c->state_copy);
    free(c);
}

static fx_world *fc_world(void *ctx) { return ((fc_ctx *)ctx)->w; }

/* ---- the calls --------------------------------------------------------------------- */

static ls_status fc_op_run(void *ctx, ls_error *err) {
    fc_ctx *c = ctx;
    ls_pool *p = c->w->p;
    ls_pool_load_opts o = {0};
    switch (c->spec->op) {
    case FC_LOAD_NEW:
    case FC_LOAD_PINNED:
        o.pinned = c->spec->op == FC_LOAD_PINNED;
        o.source_path = "elsewhere/c.safetensors";
        o.params.has_alpha = true, o.params.lora_alpha = 8, o.params.r = 4;
        return ls_pool_load(p, "C", &c->a, &o, &c->info, err);
    case FC_LOAD_REPLACE:
    case FC_REPLACE_PINNED:
        o.replace = true;
        o.pinned = c->spec->op == FC_REPLACE_PINNED;
        return ls_pool_load(p, "A", &c->a, &o, &c->info, err);
    case FC_LOAD_EVICT:
        return ls_pool_load(p, "D", &c->a, &o, &c->info, err);
    case FC_DELETE:
        return ls_pool_delete(p, "A", NULL, err);
    case FC_FORWARD:
        return ls_pool_forward(p, 0, FC_T, c->x, c->g, &fc_names, c->y, c->used, &c->n_used, err);
    case FC_RESTORE:
        return ls_pool_restore(p, &c->restored, err);
    }
    return LS_INTERNAL;
}

/* A restore is retried on a new pool, as the server's next start would. */
static ls_status fc_restore_again(void *ctx, ls_error *err) {
    fc_ctx *c = ctx;
    fx_world_free(c->w);
    fx_opts o = {.slots = 3, .state = true, .state_dir = c->state_copy};
    c->w = fx_world_new(&o);
    return ls_pool_restore(c->w->p, &c->restored, err);
}

/* A failed load leaves the caller its adapter, untouched. */
static void fc_after_fail(void *ctx) {
    fc_ctx *c = ctx;
    if (c->spec->op > FC_LOAD_EVICT) return;
    if (!c->a.data) fail_msg("a failed load took the caller's adapter");
    char sha[65];
    ls_adapter_digest(c->a.data, (size_t)c->a.layers * c->a.layer_floats, sha);
    if (strcmp(sha, c->a_sha)) fail_msg("a failed load changed the caller's adapter");
}

static void fc_outputs(void *ctx, fx_blob *out) {
    fc_ctx *c = ctx;
    switch (c->spec->op) {
    case FC_LOAD_NEW:
    case FC_LOAD_PINNED:
    case FC_LOAD_REPLACE:
    case FC_REPLACE_PINNED:
    case FC_LOAD_EVICT: {
        if (c->a.data) fail_msg("a successful load left the caller its adapter");
        bool resident = c->info.slot >= 0;
        fx_blob_add(out, c->info.name, sizeof c->info.name);
        fx_blob_add(out, &c->info.version, sizeof c->info.version);
        fx_blob_meta(out, &c->info.meta);
        fx_blob_add(out, &c->info.pinned, sizeof c->info.pinned);
        fx_blob_add(out, &resident, sizeof resident);
        fx_blob_add(out, c->info.source_path, sizeof c->info.source_path);
        break;
    }
    case FC_FORWARD:
        fx_blob_add(out, c->y, sizeof c->y);
        fx_blob_add(out, &c->n_used, sizeof c->n_used);
        for (int i = 0; i < c->n_used; i++) {
            fx_blob_add(out, c->used[i].name, strlen(c->used[i].name) + 1);
            fx_blob_add(out, &c->used[i].version, sizeof c->used[i].version);
        }
        break;
    case FC_DELETE:
    case FC_RESTORE: {
        if (c->spec->op == FC_RESTORE) fx_blob_add(out, &c->restored, sizeof c->restored);
        /* Versions are never reused: the deleted name's next load goes on
         * from its last version, whatever the delete or restore met. */
        const char *gone = c->spec->op == FC_DELETE ? "A" : "D";
        uint64_t v = fx_load(c->w, gone, 2, 11, false, false);
        fx_blob_add(out, &v, sizeof v);
        break;
    }
    }
}

fx_case fc_case(const fc_spec *spec) {
    return (fx_case){.what = spec->what,
                     .setup = fc_setup,
                     .arg = (void *)spec,
                     .world = fc_world,
                     .op = fc_op_run,
                     .retry = spec->op == FC_RESTORE ? fc_restore_again : NULL,
                     .after_fail = fc_after_fail,
                     .outputs = fc_outputs,
                     .teardown = fc_teardown};
}

/* ---- once per program ------------------------------------------------------------ */

void fc_init(void) {
    assert_true(fx_dims.H == 8 && fx_dims.n == 2); /* fc_ctx's arrays */
    fc_adapter_dir = ls_test_mkdtemp();
    assert_non_null(fc_adapter_dir);
    fx_write_adapter_dir(fc_adapter_dir);
    /* The restore's directory: what a server that loaded, replaced,
     * pinned and deleted left behind. */
    fc_restore_tmpl = ls_test_mkdtemp();
    assert_non_null(fc_restore_tmpl);
    fx_opts o = {.slots = 3, .state = true, .state_dir = fc_restore_tmpl};
    fx_world *w = fx_world_new(&o);
    fx_load(w, "A", 3, 1, true, false);
    fx_load(w, "B", 2, 2, false, false);
    fx_load(w, "B", 4, 6, false, true);
    fx_load(w, "C", 3, 3, false, false);
    fx_load(w, "D", 2, 5, false, false);
    ls_adapter e;
    fx_adapter(2, 7, &e);
    ls_pool_load_opts eo = {.source_path = "peft1", .params = {.r = 2, .has_alpha = true, .lora_alpha = 4}};
    ls_error err;
    ls_error_init(&err);
    if (ls_pool_load(w->p, "E", &e, &eo, NULL, &err) != LS_OK) fail_msg("load E: %s", err.message);
    ls_adapter_free(&e);
    if (ls_pool_delete(w->p, "D", NULL, &err) != LS_OK) fail_msg("delete D: %s", err.message);
    ls_error_free(&err);
    fx_world_free(w);
}

void fc_fini(void) {
    ls_test_rmtree(fc_adapter_dir);
    ls_test_rmtree(fc_restore_tmpl);
    free(fc_adapter_dir);
    free(fc_restore_tmpl);
}

int fc_group_setup(void **state) {
    (void)state;
    fc_init();
    return 0;
}

int fc_group_teardown(void **state) {
    (void)state;
    fc_fini();
    return 0;
}

const fc_spec fc_specs[] = {
    {"pool load: new name", FC_LOAD_NEW, FC_PLAIN},
    {"pool load: new name, state dir", FC_LOAD_NEW, FC_STATE},
    {"pool load: new pinned, state dir", FC_LOAD_PINNED, FC_STATE},
    {"pool load: replace", FC_LOAD_REPLACE, FC_PLAIN},
    {"pool load: replace, state dir", FC_LOAD_REPLACE, FC_STATE},
    {"pool load: replace pinned", FC_REPLACE_PINNED, FC_PLAIN},
    {"pool load: replace pinned, state dir", FC_REPLACE_PINNED, FC_STATE},
    {"pool load: evicting, state dir", FC_LOAD_EVICT, FC_STATE},
    {"pool delete", FC_DELETE, FC_PLAIN},
    {"pool delete, state dir", FC_DELETE, FC_STATE},
    {"pool forward: mix, regroup, evict", FC_FORWARD, FC_PLAIN},
    {"pool forward: read back from state dir", FC_FORWARD, FC_STATE},
    {"pool forward: read back from its file", FC_FORWARD, FC_SOURCE},
    {"pool restore from a state dir", FC_RESTORE, FC_STATE},
};
const size_t fc_n_specs = sizeof fc_specs / sizeof *fc_specs;
