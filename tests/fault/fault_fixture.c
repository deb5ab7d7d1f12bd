/* The fault sweeps' fixture (fault_fixture.h): worlds, the catalogue of
 * adapters, capturing and comparing a world's observable state, and the
 * sweep that checks the contract for every N. */
#include "tests/fault/fault_fixture.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "format/safetensors.h"
#include "tests/util/adapter_fixture.h"
#include "tests/util/pool_fixture.h"
#include "tests/util/testutil.h"

const ls_dims fx_dims = {.n = 2, .H = 8, .F = 4, .L = 2, .w13_layout = LS_W13_INTERLEAVED};

void (*fx_after_sticky)(fx_world *w);

void fx_init(void) {
    fa_init();
    /* Above every level: the pool logs each failure it recovers from. */
    if (!getenv("FAULT_LOG")) ls_log_set_level((ls_log_level)(LS_LOG_ERROR + 1));
}

/* ---- worlds ------------------------------------------------------------------ */

fx_world *fx_world_new(const fx_opts *o) {
    fx_world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    w->d = fx_dims;
    w->ld.dirfd = -1;
    double *w13, *w2;
    /* One seed for the base weights: forwards compare across worlds. */
    ls_backend *cpu = pt_cpu_create(fx_dims, o->slots, FX_RMAX, FX_TOKENS, 7, &w13, &w2);
    free(w13);
    free(w2);
    w->fb = fb_wrap(cpu);
    w->pd = *ls_backend_pool_dims(cpu);
    ls_error err;
    ls_error_init(&err);
    if (o->state) {
        w->own_state_dir = !o->state_dir;
        w->state_dir = o->state_dir ? strdup(o->state_dir) : ls_test_mkdtemp();
        assert_non_null(w->state_dir);
        if (ls_state_open(w->state_dir, &w->state, &err) != LS_OK) fail_msg("state dir: %s", err.message);
    }
    if (o->adapter_dir && ls_loader_open(&w->ld, o->adapter_dir, &w->d, &w->pd, &err) != LS_OK)
        fail_msg("adapter dir: %s", err.message);
    ls_pool_config cfg = {.host_cache = o->host_cache ? o->host_cache : 64,
                          .reload = o->adapter_dir ? ls_loader_reload : NULL,
                          .reload_ctx = &w->ld,
                          .state = w->state};
    if (ls_pool_create(fb_be(w->fb), &cfg, &w->p, &err) != LS_OK) fail_msg("pool: %s", err.message);
    ls_error_free(&err);
    return w;
}

void fx_world_free(fx_world *w) {
    if (!w) return;
    ls_pool_free(w->p); /* first: it borrows the backend */
    ls_state_close(w->state);
    fb_free(w->fb);
    ls_loader_close(&w->ld);
    if (w->own_state_dir) ls_test_rmtree(w->state_dir);
    free(w->state_dir);
    free(w);
}

/* ---- the catalogue -------------------------------------------------------------
 * Static storage: entries made during an attempt must not count as its
 * allocations. */
#define FX_CAT_MAX 128
#define FX_CAT_FLOATS 4096
static struct {
    ls_adapter a;
    float data[FX_CAT_FLOATS];
    bool present[8];
} fx_cat[FX_CAT_MAX];
static int fx_cat_n;

void fx_catalog_add(const ls_adapter *a) {
    for (int i = 0; i < fx_cat_n; i++)
        if (!strcmp(fx_cat[i].a.meta.sha256, a->meta.sha256)) return;
    size_t count = (size_t)a->layers * a->layer_floats;
    assert_true(fx_cat_n < FX_CAT_MAX);
    assert_true(count <= FX_CAT_FLOATS && a->layers <= 8);
    fx_cat[fx_cat_n].a = *a;
    fx_cat[fx_cat_n].a.data = fx_cat[fx_cat_n].data;
    fx_cat[fx_cat_n].a.layer_present = fx_cat[fx_cat_n].present;
    fx_cat[fx_cat_n].a.ignored = NULL;
    fx_cat[fx_cat_n].a.meta.n_ignored = 0;
    fx_cat[fx_cat_n].a.modules = NULL; /* the caller's, not kept */
    memcpy(fx_cat[fx_cat_n].data, a->data, count * sizeof(float));
    memcpy(fx_cat[fx_cat_n].present, a->layer_present, (size_t)a->layers * sizeof(bool));
    fx_cat_n++;
}

static const ls_adapter *fx_catalog_find(const char *sha256) {
    for (int i = 0; i < fx_cat_n; i++)
        if (!strcmp(fx_cat[i].a.meta.sha256, sha256)) return &fx_cat[i].a;
    return NULL;
}

void fx_adapter(int rank, uint64_t seed, ls_adapter *a) {
    pt_adapter(&fx_dims, rank, seed, a);
    fx_catalog_add(a);
}

uint64_t fx_load(fx_world *w, const char *name, int rank, uint64_t seed, bool pinned, bool replace) {
    ls_adapter a;
    fx_adapter(rank, seed, &a);
    ls_pool_load_opts o = {.pinned = pinned, .replace = replace};
    ls_adapter_info info;
    ls_error err;
    ls_error_init(&err);
    if (ls_pool_load(w->p, name, &a, &o, &info, &err) != LS_OK) fail_msg("load %s: %s", name, err.message);
    ls_error_free(&err);
    ls_adapter_free(&a);
    return info.version;
}

/* ---- adapter files ------------------------------------------------------------ */

void fx_peft_tensors(ls_tensor_set *s) {
    ls_tensor_set_init(s);
    for (int l = 0; l < fx_dims.L; l++) tu_add_peft_layer(s, "base_model.model.", &fx_dims, l, 2, 0);
    const int64_t q[2] = {2, fx_dims.H};
    tu_add_pattern(s, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", LS_DTYPE_F32, q, 2, 9);
}

static void fx_write(const char *dir, const char *name, const void *data, size_t len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ls_test_write_file(path, data, len);
}

void fx_write_adapter_dir(const char *dir) {
    ls_tensor_set s;
    fx_peft_tensors(&s);
    uint8_t *bytes;
    size_t len;
    ls_error err;
    ls_error_init(&err);
    char sub[1024];
    snprintf(sub, sizeof sub, "%s/peft1", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    if (ls_safetensors_write(&s, &bytes, &len, &err) != LS_OK) fail_msg("write: %s", err.message);
    fx_write(dir, "peft1/adapter_model.safetensors", bytes, len);
    free(bytes);
    const char *config = "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4.0, "
                         "\"target_modules\": [\"gate_up_proj\", \"down_proj\", \"q_proj\"]}";
    fx_write(dir, "peft1/adapter_config.json", config, strlen(config));
    assert_true(ls_tensor_set_add_meta(&s, "lora_alpha", "4") && ls_tensor_set_add_meta(&s, "r", "2") &&
                ls_tensor_set_add_meta(&s, "format", "peft"));
    if (ls_safetensors_write(&s, &bytes, &len, &err) != LS_OK) fail_msg("write: %s", err.message);
    fx_write(dir, "bare.safetensors", bytes, len);
    free(bytes);
    ls_tensor_set_free(&s);
    ls_error_free(&err);
}

/* ---- observable state ------------------------------------------------------------ */

static void fx_add_file(fx_state *s, const char *rel, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    fx_file f;
    memset(&f, 0, sizeof f);
    snprintf(f.path, sizeof f.path, "%s", rel);
    f.len = (size_t)sb.st_size;
    f.data = malloc(f.len ? f.len : 1);
    assert_non_null(f.data);
    for (size_t got = 0; got < f.len;) {
        ssize_t r = read(fd, f.data + got, f.len - got);
        assert_true(r > 0);
        got += (size_t)r;
    }
    close(fd);
    fx_file *v = realloc(s->files, (s->n_files + 1) * sizeof *v);
    assert_non_null(v);
    s->files = v;
    s->files[s->n_files++] = f;
}

static void fx_walk(const char *root, const char *rel, fx_state *s) {
    char dir[1200];
    snprintf(dir, sizeof dir, "%s%s%s", root, *rel ? "/" : "", rel);
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char child[600], path[1900];
        snprintf(child, sizeof child, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        snprintf(path, sizeof path, "%s/%s", root, child);
        struct stat sb;
        assert_int_equal(lstat(path, &sb), 0);
        if (S_ISDIR(sb.st_mode)) fx_walk(root, child, s);
        else fx_add_file(s, child, path);
    }
    closedir(d);
}

static int fx_file_cmp(const void *a, const void *b) {
    return strcmp(((const fx_file *)a)->path, ((const fx_file *)b)->path);
}

void fx_read_files(const char *dir, fx_state *s) {
    fx_walk(dir, "", s);
    if (s->n_files) qsort(s->files, s->n_files, sizeof *s->files, fx_file_cmp);
}

void fx_capture(fx_world *w, fx_state *s) {
    memset(s, 0, sizeof *s);
    ls_error err;
    ls_error_init(&err);
    if (ls_pool_list(w->p, &s->reg, &s->n_reg, &err) != LS_OK) fail_msg("list: %s", err.message);
    ls_pool_stats st;
    if (ls_pool_snapshot(w->p, &s->slots, &st, &err) != LS_OK) fail_msg("snapshot: %s", err.message);
    s->S = st.slots;
    ls_error_free(&err);
    if (w->state_dir) fx_read_files(w->state_dir, s);
    fx_check_slots(w, s);
}

void fx_state_free(fx_state *s) {
    free(s->reg);
    free(s->slots);
    for (size_t i = 0; i < s->n_files; i++) free(s->files[i].data);
    free(s->files);
    memset(s, 0, sizeof *s);
}

void fx_expect_registry(const fx_state *a, const fx_state *b, const char *when) {
    if (a->n_reg != b->n_reg) fail_msg("%s: %zu adapters registered, expected %zu", when, b->n_reg, a->n_reg);
    for (size_t i = 0; i < a->n_reg; i++) {
        const ls_adapter_info *x = &a->reg[i], *y = &b->reg[i];
        if (strcmp(x->name, y->name) || x->version != y->version || strcmp(x->meta.sha256, y->meta.sha256) ||
            x->pinned != y->pinned || strcmp(x->source_path, y->source_path) || x->meta.rank != y->meta.rank ||
            x->meta.outer != y->meta.outer || x->meta.format != y->meta.format || x->meta.scale != y->meta.scale ||
            x->meta.bytes != y->meta.bytes || x->meta.n_ignored != y->meta.n_ignored)
            fail_msg("%s: adapter %zu is '%s' v%llu%s sha %.12s (source '%s'), expected '%s' v%llu%s sha %.12s "
                     "(source '%s')",
                     when, i, y->name, (unsigned long long)y->version, y->pinned ? " pinned" : "", y->meta.sha256,
                     y->source_path, x->name, (unsigned long long)x->version, x->pinned ? " pinned" : "",
                     x->meta.sha256, x->source_path);
        if (y->in_flight != 0) fail_msg("%s: adapter '%s' is still held by %d request(s)", when, y->name, y->in_flight);
    }
}

static bool fx_slot_same(const ls_slot_info *x, const ls_slot_info *y) {
    return x->state == y->state && !strcmp(x->adapter, y->adapter) && x->version == y->version &&
           x->pinned == y->pinned && x->rank == y->rank && x->in_flight == y->in_flight;
}

static bool fx_slots_same(const fx_state *a, const fx_state *b) {
    for (int s = 0; s < a->S; s++)
        if (!fx_slot_same(&a->slots[s], &b->slots[s])) return false;
    return a->S == b->S;
}

void fx_expect_slots(const fx_state *a, const fx_state *b, const char *when) {
    assert_int_equal(a->S, b->S);
    for (int s = 0; s < a->S; s++) {
        const ls_slot_info *x = &a->slots[s], *y = &b->slots[s];
        if (!fx_slot_same(x, y))
            fail_msg("%s: slot %d holds '%s' v%llu (state %d), expected '%s' v%llu (state %d)", when, s, y->adapter,
                     (unsigned long long)y->version, (int)y->state, x->adapter, (unsigned long long)x->version,
                     (int)x->state);
    }
}

void fx_expect_files(const fx_state *a, const fx_state *b, const char *when) {
    size_t i = 0, j = 0;
    while (i < a->n_files || j < b->n_files) {
        int c = i == a->n_files ? 1 : j == b->n_files ? -1 : strcmp(a->files[i].path, b->files[j].path);
        if (c < 0) fail_msg("%s: state directory: %s is gone", when, a->files[i].path);
        if (c > 0) fail_msg("%s: state directory: %s appeared", when, b->files[j].path);
        if (a->files[i].len != b->files[j].len || memcmp(a->files[i].data, b->files[j].data, a->files[i].len)) {
            if (getenv("FAULT_VERBOSE"))
                printf("  was %zu bytes: %.*s\n  now %zu bytes: %.*s\n", a->files[i].len, (int)a->files[i].len - 8,
                       (const char *)a->files[i].data + 8, b->files[j].len, (int)b->files[j].len - 8,
                       (const char *)b->files[j].data + 8);
            fail_msg("%s: state directory: %s changed", when, a->files[i].path);
        }
        i++, j++;
    }
}

static const ls_adapter_info *fx_registered(const fx_state *s, const char *name) {
    for (size_t i = 0; i < s->n_reg; i++)
        if (!strcmp(s->reg[i].name, name)) return &s->reg[i];
    return NULL;
}

/* The backend's slot against the catalogue's factors, every layer. */
static void fx_check_slot_content(fx_world *w, int slot, const ls_adapter_info *info) {
    const ls_adapter *a = fx_catalog_find(info->meta.sha256);
    if (!a) fail_msg("slot %d: adapter '%s' (sha %.12s) is not one the tests made", slot, info->name, info->meta.sha256);
    size_t len[4] = {ls_pool_gu_a_len(&w->d, &w->pd), ls_pool_gu_b_len(&w->d, &w->pd),
                     ls_pool_d_a_len(&w->d, &w->pd), ls_pool_d_b_len(&w->d, &w->pd)};
    float *want[4], *got[4];
    for (int b = 0; b < 4; b++) {
        want[b] = malloc(len[b] * sizeof(float));
        got[b] = malloc(len[b] * sizeof(float));
        assert_true(want[b] && got[b]);
    }
    ls_error err;
    ls_error_init(&err);
    for (int l = 0; l < w->d.L; l++) {
        ls_adapter_expand(a, l, &w->d, &w->pd, want[0], want[1], want[2], want[3]);
        if (ls_backend_slot_read(fb_inner(w->fb), slot, l, got[0], got[1], got[2], got[3], &err) != LS_OK)
            fail_msg("slot read: %s", err.message);
        for (int b = 0; b < 4; b++)
            if (memcmp(want[b], got[b], len[b] * sizeof(float)))
                fail_msg("slot %d layer %d: the backend does not hold the factors of '%s' v%llu (buffer %d)", slot, l,
                         info->name, (unsigned long long)info->version, b);
    }
    ls_error_free(&err);
    for (int b = 0; b < 4; b++) {
        free(want[b]);
        free(got[b]);
    }
}

void fx_check_slots(fx_world *w, const fx_state *s) {
    for (int i = 0; i < s->S; i++) {
        const ls_slot_info *sl = &s->slots[i];
        if (sl->state == LS_SLOT_LOADING) fail_msg("slot %d is left LOADING ('%s')", i, sl->adapter);
        if (sl->state != LS_SLOT_RESIDENT) continue;
        const ls_adapter_info *info = fx_registered(s, sl->adapter);
        if (!info || info->version != sl->version)
            fail_msg("slot %d holds '%s' v%llu, which is not registered", i, sl->adapter,
                     (unsigned long long)sl->version);
        if (info->slot != i) fail_msg("slot %d holds '%s', which says it is in slot %d", i, sl->adapter, info->slot);
        fx_check_slot_content(w, i, info);
    }
    for (size_t i = 0; i < s->n_reg; i++) {
        const ls_adapter_info *info = &s->reg[i];
        if (info->slot >= 0 &&
            (s->slots[info->slot].state != LS_SLOT_RESIDENT || strcmp(s->slots[info->slot].adapter, info->name)))
            fail_msg("'%s' says it is in slot %d, which does not hold it", info->name, info->slot);
        /* (A dead device cannot hold anything: there the pin is moot.) */
        if (info->pinned && info->slot < 0 && ls_backend_usable(fb_be(w->fb)))
            fail_msg("pinned adapter '%s' is not resident", info->name);
    }
}

/* ---- the sweep ------------------------------------------------------------------- */

void fx_blob_add(fx_blob *b, const void *data, size_t len) {
    if (b->n + len > b->cap) {
        size_t cap = (b->n + len) * 2;
        uint8_t *p = realloc(b->p, cap);
        assert_non_null(p);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, len);
    b->n += len;
}

void fx_blob_free(fx_blob *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

void fx_blob_meta(fx_blob *b, const ls_adapter_meta *m) {
    fx_blob_add(b, &m->format, sizeof m->format);
    fx_blob_add(b, &m->rank, sizeof m->rank);
    fx_blob_add(b, &m->outer, sizeof m->outer);
    fx_blob_add(b, &m->scale, sizeof m->scale);
    fx_blob_add(b, m->sha256, sizeof m->sha256);
    fx_blob_add(b, &m->bytes, sizeof m->bytes);
    fx_blob_add(b, &m->n_ignored, sizeof m->n_ignored);
}

void fx_blob_params(fx_blob *b, const ls_adapter_params *p) {
    const double num[3] = {p->lora_alpha, p->scale, (double)p->r};
    const bool flags[6] = {p->has_alpha, p->has_rslora, p->use_rslora, p->whole_config, p->has_scale, p->strict};
    fx_blob_add(b, &p->format, sizeof p->format);
    fx_blob_add(b, num, sizeof num);
    fx_blob_add(b, flags, sizeof flags);
}

static const char *fx_kind_name(fx_kind k) {
    return k == FX_ALLOC ? "allocation" : k == FX_DEVICE ? "device call" : "sticky device";
}

/* Arms the kind's counter at n (0: count only). Allocation sweeps also
 * count backend calls, to know whether a failed call wrote a slot. */
static void fx_arm(fx_kind kind, fx_world *w, long n) {
    if (kind == FX_ALLOC) {
        if (w) fb_arm(w->fb, 0, false);
        fa_arm(n);
    } else {
        if (!w) fail_msg("a device sweep needs a world");
        fb_arm(w->fb, n, kind == FX_DEVICE_STICKY);
    }
}

static void fx_disarm(fx_kind kind, fx_world *w) {
    if (kind == FX_ALLOC) fa_disarm();
    if (w) fb_disarm(w->fb);
}

static bool fx_fired(fx_kind kind, fx_world *w) { return kind == FX_ALLOC ? fa_fired() : fb_fired(w->fb); }

static long fx_count(fx_kind kind, fx_world *w) { return kind == FX_ALLOC ? fa_count() : fb_calls(w->fb); }

/* What a successful call left: the world's registry and files, and its
 * outputs. */
typedef struct {
    fx_state state;
    fx_blob out;
} fx_result;

static void fx_result_take(const fx_case *c, void *ctx, fx_result *r) {
    memset(r, 0, sizeof *r);
    fx_world *w = c->world ? c->world(ctx) : NULL;
    if (w) fx_capture(w, &r->state);
    if (c->outputs) c->outputs(ctx, &r->out);
}

static void fx_result_free(fx_result *r) {
    fx_state_free(&r->state);
    fx_blob_free(&r->out);
}

static void fx_expect_result(const fx_result *ref, const fx_result *r, const char *when) {
    fx_expect_registry(&ref->state, &r->state, when);
    fx_expect_files(&ref->state, &r->state, when);
    if (ref->out.n != r->out.n || memcmp(ref->out.p, r->out.p, ref->out.n))
        fail_msg("%s: the outputs differ from those of a run that never failed", when);
}

fx_report fx_sweep(const fx_case *c, fx_kind kind) {
    fx_report rep = {0};
    char when[256];
    ls_error err;

    /* The run that never fails: what every retry must give. */
    void *ctx = c->setup(c->arg);
    fx_world *w = c->world ? c->world(ctx) : NULL;
    ls_error_init(&err);
    fx_arm(kind, w, 0);
    ls_status st = c->op(ctx, &err);
    rep.ops_total = fx_count(kind, w);
    fx_disarm(kind, w);
    if (st != LS_OK) fail_msg("%s: the run without injection failed: %s", c->what, err.message);
    ls_error_free(&err);
    fx_result ref;
    fx_result_take(c, ctx, &ref);
    c->teardown(ctx);

    /* Every N: the slowest sweep here (a restore, ~200 allocations) runs
     * in seconds under ASan. */
    for (long n = 1;; n++) {
        if (n > 1000000) fail_msg("%s: still meeting failures at N=%ld", c->what, n);
        snprintf(when, sizeof when, "%s, %s failure N=%ld", c->what, fx_kind_name(kind), n);
        const long live = fa_live();
        ctx = c->setup(c->arg);
        w = c->world ? c->world(ctx) : NULL;
        fx_state before;
        memset(&before, 0, sizeof before);
        if (w) fx_capture(w, &before);
        ls_error_init(&err);
        fx_arm(kind, w, n);
        st = c->op(ctx, &err);
        const bool fired = fx_fired(kind, w);
        const long slot_changes = w ? fb_slot_changes(w->fb) : 0;
        fx_disarm(kind, w);
        fx_result res;
        memset(&res, 0, sizeof res);

        if (getenv("FAULT_VERBOSE"))
            printf("  %s: %s%s%s\n", when, fired ? "" : "not met, ", ls_status_code(st), st ? err.message : "");
        if (!fired) {
            /* The call made fewer than n allocations or calls: done. */
            if (st != LS_OK) fail_msg("%s: failed without an injected failure: %s", when, err.message);
            fx_result_take(c, ctx, &res);
            fx_expect_result(&ref, &res, when);
            rep.last_n = n;
        } else if (st == LS_OK) {
            /* Absorbed (a cache that did not grow, say): the result must
             * still be the one of a run that never failed. */
            rep.injected++;
            fx_result_take(c, ctx, &res);
            fx_expect_result(&ref, &res, when);
        } else {
            rep.injected++;
            rep.failed++;
            const ls_status want = kind == FX_ALLOC ? LS_INTERNAL : LS_DEVICE_ERROR;
            if (st != want)
                fail_msg("%s: status %s (%s), expected %s", when, ls_status_code(st), err.message,
                         ls_status_code(want));
            if (err.code != st || !err.message[0])
                fail_msg("%s: status %s with error %s \"%s\"", when, ls_status_code(st), ls_status_code(err.code),
                         err.message);
            if (c->after_fail) c->after_fail(ctx);
            if (w) {
                fx_state mid;
                fx_capture(w, &mid); /* also checks every resident slot */
                fx_expect_registry(&before, &mid, when);
                fx_expect_files(&before, &mid, when);
                /* Untouched slots must read the same; written ones must
                 * at least hold what the pool says (checked by capture). */
                if (slot_changes == 0) fx_expect_slots(&before, &mid, when);
                rep.strict += fx_slots_same(&before, &mid);
                fx_state_free(&mid);
            }
            if (kind == FX_DEVICE_STICKY) {
                if (ls_backend_usable(fb_be(w->fb))) fail_msg("%s: the backend is still usable", when);
                if (fx_after_sticky) fx_after_sticky(w);
            } else {
                ls_error again;
                ls_error_init(&again);
                st = (c->retry ? c->retry : c->op)(ctx, &again);
                if (st != LS_OK) fail_msg("%s: the retry failed: %s", when, again.message);
                ls_error_free(&again);
                fx_result_take(c, ctx, &res);
                fx_expect_result(&ref, &res, when);
            }
        }
        fx_result_free(&res);
        fx_state_free(&before);
        ls_error_free(&err);
        c->teardown(ctx);
        const long left = fa_live() - live;
        if (left != 0) fail_msg("%s: %ld allocation(s) not given back", when, left);
        if (!fired) break;
    }
    fx_result_free(&ref);
    if (rep.injected < 1 || rep.last_n < 2) fail_msg("%s: no %s failure was ever injected", c->what, fx_kind_name(kind));
    char slots[64] = "";
    if (c->world) snprintf(slots, sizeof slots, " (%ld left the slots as they were)", rep.strict);
    printf("[ sweep    ] %-40s %-13s N=1..%-4ld %4ld injected: %4ld failed cleanly%s, %ld absorbed; %ld in a clean "
           "run\n",
           c->what, fx_kind_name(kind), rep.last_n, rep.injected, rep.failed, slots, rep.injected - rep.failed,
           rep.ops_total);
    fflush(stdout);
    return rep;
}
