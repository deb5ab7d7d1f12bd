/* The CPU backend's lifecycle and memory: create (every buffer allocated
 * once), free, base-weight upload, slot write/clear/read, host memory
 * report. The forward itself is in cpu_forward.c. */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/cpu/cpu.h"

static ls_cpu *ls_cpu_ctx(ls_backend *be) { return (ls_cpu *)be->ctx; }

/* 64-byte aligned, zeroed; NULL on overflow or OOM. */
static float *ls_cpu_alloc_floats(size_t a, size_t b, size_t c) {
    if (a && b > SIZE_MAX / a) return NULL;
    size_t n = a * b;
    if (n && c > SIZE_MAX / n) return NULL;
    n *= c;
    if (n > (SIZE_MAX - 63) / sizeof(float)) return NULL;
    size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
    if (bytes == 0) bytes = 64;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    memset(p, 0, bytes);
    return p;
}

static void ls_cpu_free(ls_backend *be) {
    ls_cpu *c = ls_cpu_ctx(be);
    if (c) {
        free(c->w13);
        free(c->w2);
        free(c->uploaded);
        free(c->gu_a);
        free(c->gu_b);
        free(c->d_a);
        free(c->d_b);
        free(c->order);
        free(c->group);
        free(c->xs);
        free(c->zs);
        free(c->as);
        free(c->lin);
        free(c->lout);
        free(c->st);
        free(c->pt);
        free(c);
    }
    free(be);
}

/* Reads "Key:   N kB" from /proc/meminfo; falls back to sysconf. */
static ls_status ls_cpu_memory(ls_backend *be, size_t *free_bytes, size_t *total_bytes, ls_error *err) {
    (void)be;
    unsigned long long avail_kb = 0, total_kb = 0;
    int found = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            unsigned long long v;
            if (sscanf(line, "MemAvailable: %llu kB", &v) == 1) avail_kb = v, found |= 1;
            else if (sscanf(line, "MemTotal: %llu kB", &v) == 1) total_kb = v, found |= 2;
        }
        fclose(f);
    }
    if (found == 3) {
        if (free_bytes) *free_bytes = (size_t)(avail_kb * 1024ull);
        if (total_bytes) *total_bytes = (size_t)(total_kb * 1024ull);
        return LS_OK;
    }
    long page = sysconf(_SC_PAGESIZE), phys = sysconf(_SC_PHYS_PAGES), av = sysconf(_SC_AVPHYS_PAGES);
    if (page <= 0 || phys <= 0 || av < 0)
        return ls_error_set(err, LS_INTERNAL, NULL, "cpu backend: cannot read the host memory size");
    if (free_bytes) *free_bytes = (size_t)av * (size_t)page;
    if (total_bytes) *total_bytes = (size_t)phys * (size_t)page;
    return LS_OK;
}

/* dst[c * ld_dst + r] = src[r * ld_src + c] for a rows x cols source, in
 * 32 x 32 blocks so both sides stay in cache for large layers. */
static void ls_cpu_transpose(const float *src, size_t rows, size_t cols, size_t ld_src, float *dst, size_t ld_dst) {
    const size_t B = 32;
    for (size_t r0 = 0; r0 < rows; r0 += B) {
        size_t r1 = r0 + B < rows ? r0 + B : rows;
        for (size_t c0 = 0; c0 < cols; c0 += B) {
            size_t c1 = c0 + B < cols ? c0 + B : cols;
            for (size_t r = r0; r < r1; r++)
                for (size_t c = c0; c < c1; c++) dst[c * ld_dst + r] = src[r * ld_src + c];
        }
    }
}

/* Stores one layer transposed, rounded to the backend's dtype (the CPU
 * keeps fp32 of the rounded values, so it computes what a bf16 device
 * would hold): w13t[h, e*2F + c] with c in the contiguous order whatever
 * the model's layout, w2t[e*F + j, h]. */
static ls_status ls_cpu_upload_base(ls_backend *be, int layer, const float *w13, const float *w2, ls_error *err) {
    ls_cpu *c = ls_cpu_ctx(be);
    if (layer < 0 || layer >= c->L)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "upload_base: layer %d out of range [0, %d)", layer,
                            c->L);
    if (!w13 || !w2) return ls_error_set(err, LS_INTERNAL, NULL, "upload_base: NULL weights for layer %d", layer);
    const size_t n = (size_t)c->n, H = (size_t)c->H, F = (size_t)c->F, W = 2 * n * F;
    const bool inter = c->w13_layout == LS_W13_INTERLEAVED;
    float *dst13 = c->w13 + (size_t)layer * W * H;
    float *dst2 = c->w2 + (size_t)layer * H * n * F;
    for (size_t e = 0; e < n; e++) {
        /* Interleaved: gate j is row 2j, up j row 2j+1 (stride 2H). */
        const float *gate = w13 + e * 2 * F * H, *up = gate + (inter ? H : F * H);
        const size_t ld = inter ? 2 * H : H;
        ls_cpu_transpose(gate, F, H, ld, dst13 + e * 2 * F, W);
        ls_cpu_transpose(up, F, H, ld, dst13 + e * 2 * F + F, W);
        ls_cpu_transpose(w2 + e * H * F, H, F, F, dst2 + e * F * H, H);
    }
    ls_round_to_dtype(c->dtype, dst13, W * H);
    ls_round_to_dtype(c->dtype, dst2, H * n * F);
    c->uploaded[layer] = true;
    return LS_OK;
}

static ls_status ls_cpu_check_slot(const ls_cpu *c, const char *what, int slot, int layer, ls_error *err) {
    if (slot < 0 || slot >= c->S)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s: slot %d out of range [0, %d)", what, slot, c->S);
    if (layer < 0 || layer >= c->L)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s: layer %d out of range [0, %d)", what, layer, c->L);
    return LS_OK;
}

static size_t ls_cpu_slot_at(const ls_cpu *c, int slot, int layer, size_t len) {
    return ((size_t)slot * (size_t)c->L + (size_t)layer) * len;
}

/* Pointers to one slot-layer's four stored factors. */
static void ls_cpu_slot_ptrs(const ls_cpu *c, int slot, int layer, float **ga, float **gb, float **da, float **db) {
    *ga = c->gu_a + ls_cpu_slot_at(c, slot, layer, c->gu_a_len);
    *gb = c->gu_b + ls_cpu_slot_at(c, slot, layer, c->gu_b_len);
    *da = c->d_a + ls_cpu_slot_at(c, slot, layer, c->d_a_len);
    *db = c->d_b + ls_cpu_slot_at(c, slot, layer, c->d_b_len);
}

/* Stores the four R-padded factors transposed (see cpu.h); they are the
 * only operands the forward reads, so nothing else needs a refresh. */
static ls_status ls_cpu_slot_write(ls_backend *be, int slot, int layer, const ls_slot_factors *f, ls_error *err) {
    ls_cpu *c = ls_cpu_ctx(be);
    ls_status st = ls_cpu_check_slot(c, "slot_write", slot, layer, err);
    if (st != LS_OK) return st;
    if (!f || !f->gu_a || !f->gu_b || !f->d_a || !f->d_b)
        return ls_error_set(err, LS_INTERNAL, NULL, "slot_write: NULL factor for slot %d layer %d", slot, layer);
    const size_t n = (size_t)c->n, H = (size_t)c->H, F = (size_t)c->F, R = (size_t)c->R, O = (size_t)c->O;
    float *ga, *gb, *da, *db;
    ls_cpu_slot_ptrs(c, slot, layer, &ga, &gb, &da, &db);
    ls_cpu_transpose(f->gu_a, O * 2 * R, H, H, ga, O * 2 * R);
    for (size_t e = 0; e < n; e++) {
        for (size_t half = 0; half < 2; half++)
            ls_cpu_transpose(f->gu_b + (e * 2 + half) * F * R, F, R, R, gb + (e * 2 + half) * R * F, F);
        ls_cpu_transpose(f->d_a + e * R * F, R, F, F, da + e * F * R, R);
    }
    for (size_t o = 0; o < O; o++) ls_cpu_transpose(f->d_b + o * H * R, H, R, R, db + o * R * H, H);
    return LS_OK;
}

static ls_status ls_cpu_slot_clear(ls_backend *be, int slot, ls_error *err) {
    ls_cpu *c = ls_cpu_ctx(be);
    ls_status st = ls_cpu_check_slot(c, "slot_clear", slot, 0, err);
    if (st != LS_OK) return st;
    size_t L = (size_t)c->L;
    memset(c->gu_a + ls_cpu_slot_at(c, slot, 0, c->gu_a_len), 0, L * c->gu_a_len * sizeof(float));
    memset(c->gu_b + ls_cpu_slot_at(c, slot, 0, c->gu_b_len), 0, L * c->gu_b_len * sizeof(float));
    memset(c->d_a + ls_cpu_slot_at(c, slot, 0, c->d_a_len), 0, L * c->d_a_len * sizeof(float));
    memset(c->d_b + ls_cpu_slot_at(c, slot, 0, c->d_b_len), 0, L * c->d_b_len * sizeof(float));
    return LS_OK;
}

/* Converts back to the SPEC §2 layout. A NULL destination skips that
 * buffer. */
static ls_status ls_cpu_slot_read(ls_backend *be, int slot, int layer, float *gu_a, float *gu_b, float *d_a,
                                  float *d_b, ls_error *err) {
    ls_cpu *c = ls_cpu_ctx(be);
    ls_status st = ls_cpu_check_slot(c, "slot_read", slot, layer, err);
    if (st != LS_OK) return st;
    const size_t n = (size_t)c->n, H = (size_t)c->H, F = (size_t)c->F, R = (size_t)c->R, O = (size_t)c->O;
    float *ga, *gb, *da, *db;
    ls_cpu_slot_ptrs(c, slot, layer, &ga, &gb, &da, &db);
    if (gu_a) ls_cpu_transpose(ga, H, O * 2 * R, O * 2 * R, gu_a, H);
    for (size_t e = 0; e < n; e++) {
        for (size_t half = 0; gu_b && half < 2; half++)
            ls_cpu_transpose(gb + (e * 2 + half) * R * F, R, F, F, gu_b + (e * 2 + half) * F * R, R);
        if (d_a) ls_cpu_transpose(da + e * F * R, F, R, R, d_a + e * R * F, F);
    }
    for (size_t o = 0; d_b && o < O; o++) ls_cpu_transpose(db + o * R * H, R, H, H, d_b + o * H * R, R);
    return LS_OK;
}

/* Every call has finished when it returns. */
static ls_status ls_cpu_synchronize(ls_backend *be, ls_error *err) {
    (void)be;
    (void)err;
    return LS_OK;
}

static const ls_backend_ops ls_cpu_ops = {
    /* .name        = */ "cpu",
    /* .free        = */ ls_cpu_free,
    /* .memory      = */ ls_cpu_memory,
    /* .upload_base = */ ls_cpu_upload_base,
    /* .slot_write  = */ ls_cpu_slot_write,
    /* .slot_clear  = */ ls_cpu_slot_clear,
    /* .slot_read   = */ ls_cpu_slot_read,
    /* .forward     = */ ls_cpu_forward,
    /* .synchronize = */ ls_cpu_synchronize,
    /* .poisoned    = */ NULL, /* host memory cannot be poisoned */
};

/* Dimensions a forward can index with int and size_t without overflow. */
static ls_status ls_cpu_check_config(const ls_backend_config *cfg, ls_error *err) {
    const ls_dims *d = &cfg->dims;
    const ls_pool_dims *p = &cfg->pool;
    if (d->n <= 0 || d->H <= 0 || d->F <= 0 || d->L <= 0)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL,
                            "cpu backend: dimensions must be positive (n=%d H=%d F=%d L=%d)", d->n, d->H, d->F,
                            d->L);
    if (p->slots < 0 || p->max_rank <= 0 || p->max_tokens <= 0 || p->max_tokens > INT32_MAX - LS_CPU_TILE ||
        p->slots > INT32_MAX - 2)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL,
                            "cpu backend: need slots >= 0, max_rank > 0, max_tokens > 0 (got %d, %d, %d)",
                            p->slots, p->max_rank, p->max_tokens);
    if (d->w13_layout != LS_W13_INTERLEAVED && d->w13_layout != LS_W13_CONTIGUOUS)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "cpu backend: unknown W13 layout %d", (int)d->w13_layout);
    if (p->layout != LS_LORA_SHARED && p->layout != LS_LORA_PER_EXPERT)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "cpu backend: unknown pool layout %d", (int)p->layout);
    if (!ls_dtype_is_float(cfg->dtype))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "cpu backend: weight dtype %s is not F32, F16 or BF16",
                            ls_dtype_name(cfg->dtype));
    /* Row widths handed to BLAS as int. */
    int64_t widest = (int64_t)d->n * 2 * d->F;
    if ((int64_t)d->n * 2 * p->max_rank > widest) widest = (int64_t)d->n * 2 * p->max_rank;
    if (widest > INT32_MAX / 2)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "cpu backend: n*2F or n*2R too large for BLAS");
    return LS_OK;
}

/* Allocates the pool for every slot and layer, room for every layer's
 * base weights (zero until upload_base) and the forward's scratch. On
 * success *out belongs to the caller (ls_backend_free). */
ls_status ls_backend_cpu_create(const ls_backend_config *cfg, ls_backend **out, ls_error *err) {
    *out = NULL;
    ls_status st = ls_cpu_check_config(cfg, err);
    if (st != LS_OK) return st;
    ls_backend *be = calloc(1, sizeof *be);
    ls_cpu *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return ls_error_set(err, LS_DEVICE_ERROR, NULL, "cpu backend: out of host memory");
    }
    be->ops = &ls_cpu_ops;
    be->ctx = c;
    be->dims = cfg->dims;
    be->pool = cfg->pool;
    be->dtype = cfg->dtype;

    const ls_dims *d = &cfg->dims;
    const ls_pool_dims *p = &cfg->pool;
    c->n = d->n, c->H = d->H, c->F = d->F, c->L = d->L;
    c->S = p->slots, c->R = p->max_rank, c->O = ls_pool_outer(d, p);
    c->max_tokens = p->max_tokens;
    c->w13_layout = d->w13_layout;
    c->dtype = cfg->dtype;
    c->gu_a_len = ls_pool_gu_a_len(d, p);
    c->gu_b_len = ls_pool_gu_b_len(d, p);
    c->d_a_len = ls_pool_d_a_len(d, p);
    c->d_b_len = ls_pool_d_b_len(d, p);

    const size_t n = (size_t)c->n, H = (size_t)c->H, F = (size_t)c->F, L = (size_t)c->L;
    const size_t S = (size_t)c->S, R = (size_t)c->R, O = (size_t)c->O;
    c->w13 = ls_cpu_alloc_floats(L, n * 2 * F, H);
    c->w2 = ls_cpu_alloc_floats(L, H, n * F);
    c->uploaded = calloc(L, sizeof *c->uploaded);
    /* S = 0 leaves a pool of nothing; keep the pointers valid anyway. */
    c->gu_a = ls_cpu_alloc_floats(S, L, c->gu_a_len);
    c->gu_b = ls_cpu_alloc_floats(S, L, c->gu_b_len);
    c->d_a = ls_cpu_alloc_floats(S, L, c->d_a_len);
    c->d_b = ls_cpu_alloc_floats(S, L, c->d_b_len);
    c->order = malloc((size_t)c->max_tokens * sizeof *c->order);
    c->group = malloc((S + 2) * sizeof *c->group);
    c->rows = (c->max_tokens + LS_CPU_TILE - 1) / LS_CPU_TILE * LS_CPU_TILE;
    const size_t rows = (size_t)c->rows, lt = LS_CPU_LORA_TILE;
    c->xs = ls_cpu_alloc_floats(rows, H, 1);
    c->zs = ls_cpu_alloc_floats(rows, n * 2, F);
    c->as = ls_cpu_alloc_floats(rows, n, F);
    c->lin = ls_cpu_alloc_floats(lt, H > n * F ? H : n * F, 1);
    c->lout = ls_cpu_alloc_floats(lt, H > n * 2 * F ? H : n * 2 * F, 1);
    c->st = ls_cpu_alloc_floats(lt, O * 2, R);
    c->pt = ls_cpu_alloc_floats(lt, O, R);
    if (!c->w13 || !c->w2 || !c->uploaded || !c->gu_a || !c->gu_b || !c->d_a || !c->d_b || !c->order ||
        !c->group || !c->xs || !c->zs || !c->as || !c->lin || !c->lout || !c->st || !c->pt) {
        ls_cpu_free(be);
        return ls_error_set(err, LS_DEVICE_ERROR, "lower --slots, --max-rank or the model size",
                            "cpu backend: cannot allocate the weights, the pool (%zu slots x %zu layers, rank %zu) "
                            "or the scratch",
                            S, L, R);
    }
    be->pool_bytes = S * L * (c->gu_a_len + c->gu_b_len + c->d_a_len + c->d_b_len) * sizeof(float);
    if (cfg->threads > 0) openblas_set_num_threads(cfg->threads);
    *out = be;
    return LS_OK;
}
