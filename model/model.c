/* The model's life: which reader a path goes to (model_internal.h), the
 * demo model, reading one layer's byte ranges at their storage dtypes
 * (FP8 dequantized, every value checked finite), the upload that streams
 * the layers to a backend one at a time, and freeing. */
#include "model/model.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/hub.h"
#include "common/text.h"
#include "model/model_internal.h"

/* ---- the source ------------------------------------------------------------ */

ls_model_source *ls_model_source_new(int L) {
    ls_model_source *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n_t = (size_t)(L > 0 ? L : 1) * LS_MT_COUNT;
    if (!(s->t = calloc(s->n_t, sizeof *s->t))) {
        free(s);
        return NULL;
    }
    for (size_t i = 0; i < s->n_t; i++) s->t[i].file = s->t[i].scale_file = -1;
    s->block[0] = s->block[1] = 128;
    return s;
}

int ls_model_source_add_fd(ls_model_source *s, int fd, const char *name) {
    int *fds = realloc(s->fds, (size_t)(s->n_fds + 1) * sizeof *fds);
    if (fds) s->fds = fds;
    char **names = fds ? realloc(s->names, (size_t)(s->n_fds + 1) * sizeof *names) : NULL;
    if (names) s->names = names;
    char *copy = names ? strdup(name) : NULL;
    if (!copy) {
        close(fd);
        return -1;
    }
    s->fds[s->n_fds] = fd;
    s->names[s->n_fds] = copy;
    return s->n_fds++;
}

void ls_model_source_free(ls_model_source *s) {
    if (!s) return;
    for (int i = 0; i < s->n_fds; i++) {
        close(s->fds[i]);
        free(s->names[i]);
    }
    for (size_t i = 0; i < s->n_t; i++) {
        free(s->t[i].info.name);
        free(s->t[i].scale.name);
    }
    free(s->fds);
    free(s->names);
    free(s->t);
    free(s);
}

bool ls_model_info_copy(ls_st_info *dst, const ls_st_info *src) {
    free(dst->name);
    *dst = *src;
    dst->name = strdup(src->name);
    return dst->name != NULL;
}

bool ls_model_add_file(ls_model *m, const char *name) {
    char **files = realloc(m->files, (size_t)(m->n_files + 1) * sizeof *files);
    if (!files) return false;
    m->files = files;
    if (!(m->files[m->n_files] = strdup(name))) return false;
    m->n_files++;
    return true;
}

ls_dtype ls_model_served_dtype(const ls_model_tensor *t) {
    return t->scale_file >= 0 ? LS_DTYPE_BF16 : t->info.dtype;
}

/* ---- opening ------------------------------------------------------------------ */

static const char *ls_model_base(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* A regular file: an index (".json") or the fused weights file. */
static ls_status ls_model_open_file(const char *path, const ls_w13_layout *override, ls_model *m, ls_error *err) {
    size_t len = strlen(path);
    if (len > 5 && !strcmp(path + len - 5, ".json")) {
        char dir[4096];
        const char *base = ls_model_base(path);
        snprintf(dir, sizeof dir, "%.*s", base > path ? (int)(base - path - 1) : 1, base > path ? path : ".");
        if (!dir[0]) snprintf(dir, sizeof dir, "/");
        snprintf(m->source, sizeof m->source, "checkpoint");
        return ls_model_open_checkpoint(dir, base, m, err);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        char ebuf[128];
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "cannot open %s: %s", path,
                            strerror_r(errno, ebuf, sizeof ebuf));
    }
    snprintf(m->source, sizeof m->source, "file");
    snprintf(m->family, sizeof m->family, "fused");
    snprintf(m->rule, sizeof m->rule, "every layer of the file");
    ls_status st = ls_model_open_fused(fd, path, override, m, err);
    if (st == LS_OK && (ls_model_source_add_fd(m->src, fd, path) != 0 || !ls_model_add_file(m, ls_model_base(path))))
        st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    else if (st != LS_OK) close(fd);
    return st;
}

/* See model.h. */
/* --weights ORG/NAME that is no path: the snapshot of the hub cache
 * (where huggingface_hub keeps it) that its refs/main names, into found
 * as a path; found "" when the cache lacks it. */
static ls_status ls_model_hub_snapshot(const char *repo, char *found, size_t len, ls_error *err) {
    found[0] = '\0';
    char cache[PATH_MAX], snap[PATH_MAX];
    ls_hub_cache_dir(cache, sizeof cache);
    int fd = open(cache, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return LS_OK;
    ls_status st = ls_hub_snapshot(fd, repo, snap, sizeof snap, err);
    close(fd);
    if (st == LS_OK && snap[0] && (size_t)snprintf(found, len, "%s/%s", cache, snap) >= len) {
        found[0] = '\0';
        st = ls_error_set(err, LS_INVALID_REQUEST, NULL, "the hub cache path of %s is too long", repo);
    }
    return st;
}

ls_status ls_model_open(const char *path, const ls_w13_layout *layout_override, ls_model *out, ls_error *err) {
    memset(out, 0, sizeof *out);
    struct stat sb;
    ls_status st = LS_OK;
    char snapshot[PATH_MAX] = "";
    if (stat(path, &sb) != 0 && errno == ENOENT && ls_hub_repo_id(path)) {
        st = ls_model_hub_snapshot(path, snapshot, sizeof snapshot, err);
        if (st != LS_OK) return st;
    }
    if (snapshot[0]) path = snapshot;
    snprintf(out->path, sizeof out->path, "%.*s", (int)(sizeof out->path - 1), path);
    if (stat(path, &sb) != 0) {
        char ebuf[128], cache[PATH_MAX];
        int e = errno;
        ls_hub_cache_dir(cache, sizeof cache);
        /* A snapshot found is a directory (ls_hub_snapshot checks it):
         * what is not there is a path, or a repo id the cache lacks. */
        char hint[sizeof err->hint];
        snprintf(hint, sizeof hint,
                 "a Hugging Face repo id is found only in the hub cache (%.200s: HF_HUB_CACHE or HF_HOME), never "
                 "downloaded: hf download %.150s",
                 cache, path);
        st = ls_error_set(err, LS_INVALID_REQUEST, e == ENOENT && ls_hub_repo_id(path) ? hint : NULL,
                          "cannot open %s: %s", path, strerror_r(e, ebuf, sizeof ebuf));
    } else if (S_ISDIR(sb.st_mode)) {
        snprintf(out->source, sizeof out->source, "checkpoint");
        st = ls_model_open_checkpoint(path, NULL, out, err);
    } else if (S_ISREG(sb.st_mode)) {
        st = ls_model_open_file(path, layout_override, out, err);
    } else {
        st = ls_error_set(err, LS_INVALID_REQUEST, NULL,
                          "cannot read %s: it is neither a regular file nor a directory", path);
    }
    /* A checkpoint's W13 is gate_proj's rows, then up_proj's. */
    if (st == LS_OK && layout_override && !strcmp(out->source, "checkpoint") && *layout_override != LS_W13_CONTIGUOUS)
        st = ls_error_set(err, LS_INVALID_REQUEST, "drop --w13-layout: it is the fused file's row order",
                          "--w13-layout %s does not apply to a checkpoint: its gate_proj and up_proj are separate "
                          "tensors, served gate rows first",
                          ls_w13_layout_name(*layout_override));
    if (st != LS_OK) ls_model_free(out);
    return st;
}

/* ---- reading a layer ----------------------------------------------------------- */

/* Reads tensor t into dst at dtype (count values): straight into place
 * when it is stored at that dtype, else through one buffer of its own
 * bytes (FP8: dequantized with its scale). */
static ls_status ls_model_read_tensor(const ls_model_source *s, const ls_model_tensor *t, ls_dtype dtype, void *dst,
                                      ls_error *err) {
    const int fd = s->fds[t->file];
    const char *what = s->names[t->file];
    const size_t count = t->info.nbytes / ls_dtype_size(t->info.dtype);
    if (t->scale_file < 0 && t->info.dtype == dtype) return ls_safetensors_read_range(fd, what, &t->info, dst, err);
    void *raw = malloc(t->info.nbytes ? t->info.nbytes : 1);
    void *scale = t->scale_file >= 0 ? malloc(t->scale.nbytes ? t->scale.nbytes : 1) : NULL;
    ls_status st = raw && (t->scale_file < 0 || scale) ? LS_OK
                                                       : ls_error_set(err, LS_INTERNAL, NULL, "out of memory reading %s",
                                                                      t->info.name);
    if (st == LS_OK) st = ls_safetensors_read_range(fd, what, &t->info, raw, err);
    if (st == LS_OK && scale) st = ls_safetensors_read_range(s->fds[t->scale_file], s->names[t->scale_file], &t->scale, scale, err);
    if (st == LS_OK && scale)
        ls_model_dequant_fp8(raw, scale, t->scale.dtype, t->info.shape[0], t->info.shape[1], s->block, dtype, dst);
    else if (st == LS_OK)
        ls_convert_dtype(t->info.dtype, raw, dtype, dst, count);
    free(raw);
    free(scale);
    return st;
}

/* Refuses a NaN or Inf among the count values just read. */
static ls_status ls_model_check_finite(const ls_model_tensor *t, int layer, ls_dtype dtype, const void *v,
                                       size_t count, ls_error *err) {
    size_t at;
    if (!ls_find_nonfinite(dtype, v, count, &at)) return LS_OK;
    return ls_error_add(err, LS_SAFETENSORS_INVALID, layer, t->info.name, LS_NA, LS_NA, LS_NA,
                        "the weights file is corrupt or came from a diverged run",
                        "weights: %s holds a non-finite value at flat index %zu", t->info.name, at);
}

/* One tensor (or W13 = gate_proj then up_proj) into a new buffer. */
static ls_status ls_model_read_part(ls_model *m, int index, int which, void **out, ls_dtype *dt, ls_error *err) {
    ls_model_tensor *a = ls_model_tensor_at(m->src, index, which);
    ls_model_tensor *up = ls_model_tensor_at(m->src, index, LS_MT_UP);
    ls_model_tensor *b = which == LS_MT_W13 && up->file >= 0 ? up : NULL; /* a checkpoint's W13 is two tensors */
    *dt = ls_model_served_dtype(a);
    if (b && ls_model_served_dtype(b) != *dt) *dt = LS_DTYPE_F32; /* neither holds the other */
    const size_t ca = a->info.nbytes / ls_dtype_size(a->info.dtype);
    const size_t cb = b ? b->info.nbytes / ls_dtype_size(b->info.dtype) : 0, es = ls_dtype_size(*dt);
    char *buf = malloc((ca + cb) * es + 1);
    if (!buf) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory for layer %d", ls_dims_layer_id(&m->dims, index));
    const int id = ls_dims_layer_id(&m->dims, index);
    ls_status st = ls_model_read_tensor(m->src, a, *dt, buf, err);
    if (st == LS_OK) st = ls_model_check_finite(a, id, *dt, buf, ca, err);
    if (st == LS_OK && b) st = ls_model_read_tensor(m->src, b, *dt, buf + ca * es, err);
    if (st == LS_OK && b) st = ls_model_check_finite(b, id, *dt, buf + ca * es, cb, err);
    if (st != LS_OK) free(buf);
    else *out = buf;
    return st;
}

static void *ls_model_dup(const void *p, size_t bytes) {
    void *q = malloc(bytes ? bytes : 1);
    if (q) memcpy(q, p, bytes);
    return q;
}

ls_status ls_model_read_layer(ls_model *m, int index, ls_model_layer *out, ls_error *err) {
    memset(out, 0, sizeof *out);
    if (index < 0 || index >= m->dims.L)
        return ls_error_set(err, LS_INTERNAL, NULL, "model: layer index %d of %d", index, m->dims.L);
    if (m->held) { /* the demo */
        const ls_model_layer *h = &m->held[index];
        const size_t c13 = (size_t)m->dims.n * 2 * m->dims.F * m->dims.H, c2 = (size_t)m->dims.n * m->dims.H * m->dims.F;
        *out = (ls_model_layer){ls_model_dup(h->w13, c13 * ls_dtype_size(h->dt13)), ls_model_dup(h->w2, c2 * ls_dtype_size(h->dt2)),
                                NULL, h->dt13, h->dt2, h->dtg};
        if (!out->w13 || !out->w2) {
            ls_model_layer_free(out);
            return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
        }
        return LS_OK;
    }
    if (!m->src) return ls_error_set(err, LS_INTERNAL, NULL, "model: the files were already closed");
    ls_status st = ls_model_read_part(m, index, LS_MT_W13, &out->w13, &out->dt13, err);
    if (st == LS_OK) st = ls_model_read_part(m, index, LS_MT_W2, &out->w2, &out->dt2, err);
    if (st == LS_OK && m->dims.gate) st = ls_model_read_part(m, index, LS_MT_GATE, &out->gate, &out->dtg, err);
    if (st != LS_OK) ls_model_layer_free(out);
    return st;
}

void ls_model_layer_free(ls_model_layer *l) {
    free(l->w13);
    free(l->w2);
    free(l->gate);
    memset(l, 0, sizeof *l);
}

/* Reads layer by layer into be: the host holds one layer at a time. */
/* The name of the tensor that holds value *at of part which (W13 or W2)
 * of served layer index, *at made its index there: a checkpoint's W13 is
 * its gate_proj, then its up_proj. */
static const char *ls_model_part_name(ls_model *m, int index, int which, size_t *at) {
    if (!m->src) return which == LS_MT_W13 ? "the demo model's w13" : "the demo model's w2";
    const ls_model_tensor *a = ls_model_tensor_at(m->src, index, which);
    const ls_model_tensor *up = ls_model_tensor_at(m->src, index, LS_MT_UP);
    const size_t ca = a->info.nbytes / ls_dtype_size(a->info.dtype);
    if (which == LS_MT_W13 && up->file >= 0 && *at >= ca) {
        *at -= ca;
        return up->info.name;
    }
    return a->info.name;
}

/* Refuses a layer with a value the backend's dtype cannot hold: stored
 * there it would be Inf, and every forward through it non-finite. */
static ls_status ls_model_check_fits(ls_model *m, int index, const ls_model_layer *layer, ls_dtype to,
                                     ls_error *err) {
    const size_t c = (size_t)m->dims.n * m->dims.F * m->dims.H;
    const struct {
        ls_dtype dt;
        const void *v;
        size_t count;
        int which;
    } part[2] = {{layer->dt13, layer->w13, 2 * c, LS_MT_W13}, {layer->dt2, layer->w2, c, LS_MT_W2}};
    for (int k = 0; k < 2; k++) {
        size_t at;
        float v;
        if (!ls_find_overflow(part[k].dt, part[k].v, part[k].count, to, &at, &v)) continue;
        const char *name = ls_model_part_name(m, index, part[k].which, &at);
        return ls_error_set(err, LS_INVALID_REQUEST,
                            "serve with --dtype f32 or bf16 (by default the checkpoint's own dtype), or fix the weights",
                            "weights: %s holds %g at flat index %zu, past %s's largest value %g: stored as %s it would "
                            "be infinite, and so would every forward through it",
                            name, (double)v, at, ls_dtype_name(to), to == LS_DTYPE_F16 ? 65504.0 : 3.3895314e38,
                            ls_dtype_name(to));
    }
    return LS_OK;
}

ls_status ls_model_upload(ls_model *m, ls_backend *be, ls_error *err) {
    const ls_dims *a = &m->dims, *b = ls_backend_dims(be);
    if (a->n != b->n || a->H != b->H || a->F != b->F || a->L != b->L || a->w13_layout != b->w13_layout ||
        a->gate != b->gate)
        return ls_error_set(err, LS_INTERNAL, NULL,
                            "model (n=%d H=%d F=%d L=%d %s%s) and backend (n=%d H=%d F=%d L=%d %s%s) disagree", a->n,
                            a->H, a->F, a->L, ls_w13_layout_name(a->w13_layout), a->gate ? " gated" : "", b->n, b->H,
                            b->F, b->L, ls_w13_layout_name(b->w13_layout), b->gate ? " gated" : "");
    for (int l = 0; l < a->L; l++) {
        ls_model_layer layer;
        ls_status st = LS_OK;
        if (m->held) layer = m->held[l];
        else st = ls_model_read_layer(m, l, &layer, err);
        if (st != LS_OK) return st;
        const ls_base_layer bl = {{layer.dt13, layer.w13}, {layer.dt2, layer.w2}, {layer.dtg, layer.gate}};
        st = ls_model_check_fits(m, l, &layer, ls_backend_dtype(be), err);
        if (st == LS_OK) st = ls_backend_upload_base(be, l, &bl, err);
        if (!m->held) ls_model_layer_free(&layer);
        if (st != LS_OK) return st;
    }
    return LS_OK;
}

/* ---- the demo model ---------------------------------------------------------------- */

/* Uniform in [-scale, scale) from splitmix64 (a fixed integer recurrence,
 * so the demo model is the same on every machine and compiler): 24 random
 * bits make an exact float in [0, 1), and every later step is one
 * correctly rounded fp32 operation. */
static void ls_model_fill(float *v, size_t count, float scale, uint64_t *state) {
    for (size_t i = 0; i < count; i++) {
        float u = (float)(ls_splitmix64(state) >> 40) * (1.0f / 16777216.0f);
        v[i] = (2.0f * u - 1.0f) * scale;
    }
}

/* count values drawn into scratch, then stored at dtype in a new buffer. */
static void *ls_model_draw(float *scratch, size_t count, float scale, uint64_t *state, ls_dtype dtype) {
    ls_model_fill(scratch, count, scale, state);
    void *v = malloc(count * ls_dtype_size(dtype));
    if (v) ls_convert_from_f32(dtype, scratch, count, v);
    return v;
}

/* Builds the demo model (see model.h). Uniform weights with variance
 * 1/fan_in (bound sqrt(3/fan_in)) keep z = W13·x at the scale of x, and
 * W2 over all n*F inputs keeps y = O(1) whatever n. Draw order: layer by
 * layer, w13 then w2, row-major. The layers are held at dtype (bf16 and
 * f16 round to nearest even). */
ls_status ls_model_demo(const ls_dims *dims, uint64_t seed, ls_dtype dtype, ls_model *out, ls_error *err) {
    memset(out, 0, sizeof *out);
    if (dims->n <= 0 || dims->H <= 0 || dims->F <= 0 || dims->L <= 0)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL,
                            "demo model: dimensions must be positive (n=%d H=%d F=%d L=%d)", dims->n, dims->H,
                            dims->F, dims->L);
    if (!ls_dtype_is_float(dtype))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "demo model: dtype %s is not F32, F16 or BF16",
                            ls_dtype_name(dtype));
    const size_t n = (size_t)dims->n, H = (size_t)dims->H, F = (size_t)dims->F;
    if (n * 2 * F > SIZE_MAX / sizeof(float) / H)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "demo model: dimensions too large");
    out->dims = *dims;
    out->dims.gate = false;
    out->dims.layer_ids = NULL;
    out->dtype = dtype;
    snprintf(out->source, sizeof out->source, "demo");
    snprintf(out->family, sizeof out->family, "demo");
    snprintf(out->rule, sizeof out->rule, "every layer");
    float *scratch = malloc(n * 2 * F * H * sizeof *scratch);
    out->held = calloc((size_t)dims->L, sizeof *out->held);
    ls_status st = scratch && out->held ? LS_OK : ls_error_set(err, LS_INTERNAL, NULL, "demo model: out of memory");
    uint64_t state = seed;
    const float s13 = sqrtf(3.0f / (float)H), s2 = sqrtf(3.0f / (float)(n * F));
    for (int l = 0; st == LS_OK && l < dims->L; l++) {
        ls_model_layer *h = &out->held[l];
        h->dt13 = h->dt2 = h->dtg = dtype;
        h->w13 = ls_model_draw(scratch, n * 2 * F * H, s13, &state, dtype);
        h->w2 = ls_model_draw(scratch, n * H * F, s2, &state, dtype);
        if (!h->w13 || !h->w2) st = ls_error_set(err, LS_INTERNAL, NULL, "demo model: out of memory for layer %d", l);
        out->bytes += (n * 2 * F * H + n * H * F) * ls_dtype_size(dtype);
    }
    free(scratch);
    if (st != LS_OK) ls_model_free(out);
    return st;
}

/* ---- releasing ---------------------------------------------------------------------- */

void ls_model_release(ls_model *m) {
    ls_model_source_free(m->src);
    m->src = NULL;
    for (int l = 0; m->held && l < m->dims.L; l++) ls_model_layer_free(&m->held[l]);
    free(m->held);
    m->held = NULL;
}

void ls_model_free(ls_model *m) {
    if (!m) return;
    ls_model_release(m);
    for (int i = 0; i < m->n_files; i++) free(m->files[i]);
    free(m->files);
    free(m->layer_ids);
    memset(m, 0, sizeof *m);
}
