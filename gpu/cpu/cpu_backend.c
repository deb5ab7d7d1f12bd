/* The CPU backend's lifecycle and memory: create (every buffer allocated
 * and the engine's threads started once), free, packing of the base
 * weights and of the slots' factors into the panels the tiles read, slot
 * clear and read-back, host memory report. The forward is cpu_forward.c. */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/cpu/cpu.h"
#include "gpu/slot_rank.h"

static ls_cpu *ls_cpu_ctx(ls_backend *be) { return (ls_cpu *)be->ctx; }

/* a * b * c * size bytes, 64-byte aligned and zeroed; NULL on overflow or
 * OOM. Freed with free(). */
static void *ls_cpu_alloc(size_t a, size_t b, size_t c, size_t size) {
    size_t n = a;
    if (b && n > SIZE_MAX / b) return NULL;
    n *= b;
    if (c && n > SIZE_MAX / c) return NULL;
    n *= c;
    if (size && n > (SIZE_MAX - 63) / size) return NULL;
    size_t bytes = (n * size + 63) & ~(size_t)63;
    if (bytes == 0) bytes = 64;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    memset(p, 0, bytes);
    return p;
}

static size_t ls_cpu_wbytes(ls_dtype dt) { return dt == LS_DTYPE_F32 ? 4 : 2; }

/* The dtype the base weights are packed at: bf16 pairs under bf16 compute. */
static ls_dtype ls_cpu_wdtype(const ls_cpu *c) { return c->bf16 ? LS_DTYPE_BF16 : c->dtype; }

ls_cpu_mat ls_cpu_w13(const ls_cpu *c, int layer) {
    size_t at = (size_t)layer * c->w13_len;
    return (ls_cpu_mat){(const char *)c->w13 + at * ls_cpu_wbytes(ls_cpu_wdtype(c)), ls_cpu_wdtype(c), c->H, c->zw,
                        c->bf16};
}

ls_cpu_mat ls_cpu_w2(const ls_cpu *c, int layer) {
    size_t at = (size_t)layer * c->w2_len;
    return (ls_cpu_mat){(const char *)c->w2 + at * ls_cpu_wbytes(ls_cpu_wdtype(c)), ls_cpu_wdtype(c), c->n * c->F,
                        c->H, c->bf16};
}

ls_cpu_mat ls_cpu_gate(const ls_cpu *c, int layer) {
    return (ls_cpu_mat){c->gate + (size_t)layer * c->gate_len, LS_DTYPE_F32, c->H, 1, false};
}

ls_cpu_mat ls_cpu_gate_delta(const ls_cpu *c, int slot, int layer) {
    const size_t at = (size_t)slot * (size_t)c->L + (size_t)layer;
    const float *p = c->form[at].gate_d ? c->gdelta + at * c->gate_len : NULL;
    return (ls_cpu_mat){p, LS_DTYPE_F32, c->H, 1, false};
}

static float *ls_cpu_slot_base(const ls_cpu *c, int slot, int layer) {
    return c->pool + ((size_t)slot * (size_t)c->L + (size_t)layer) * c->slot.len;
}

static ls_cpu_form *ls_cpu_form_of(const ls_cpu *c, int slot, int layer) {
    return &c->form[(size_t)slot * (size_t)c->L + (size_t)layer];
}

int ls_cpu_rank(const ls_cpu *c, int slot, int layer) { return ls_cpu_form_of(c, slot, layer)->rank; }

/* The four factors' indices in ls_cpu_form.dt. */
enum { LS_CPU_GU_A, LS_CPU_GU_B, LS_CPU_D_A, LS_CPU_D_B };

/* A slot's pair-packed copies (bf16 compute): the block of dslot.len
 * values of slot and layer in dpool. */
static uint16_t *ls_cpu_dslot_base(const ls_cpu *c, int slot, int layer) {
    return c->dpool + ((size_t)slot * (size_t)c->L + (size_t)layer) * c->dslot.len;
}

/* The exact factors (the forward's under f32 compute, slot_read's
 * always) and, with pairs, the bf16 copies the forward reads under bf16
 * compute. */
static ls_cpu_mat ls_cpu_gu_a_of(const ls_cpu *c, int slot, int layer, bool pairs) {
    const ls_cpu_form *f = ls_cpu_form_of(c, slot, layer);
    if (pairs) return (ls_cpu_mat){ls_cpu_dslot_base(c, slot, layer), LS_DTYPE_BF16, c->H, c->O * 2 * f->rank, true};
    return (ls_cpu_mat){ls_cpu_slot_base(c, slot, layer), f->dt[LS_CPU_GU_A], c->H, c->O * 2 * f->rank, false};
}

static ls_cpu_mat ls_cpu_gu_b_of(const ls_cpu *c, int slot, int layer, int e, int half, bool pairs) {
    const ls_cpu_form *f = ls_cpu_form_of(c, slot, layer);
    const size_t i = (size_t)(2 * e + half);
    if (pairs)
        return (ls_cpu_mat){ls_cpu_dslot_base(c, slot, layer) + c->dslot.off_gu_b + i * c->dslot.gu_b, LS_DTYPE_BF16,
                            f->rank, c->F, true};
    const float *p = ls_cpu_slot_base(c, slot, layer) + c->slot.off_gu_b + i * c->slot.gu_b;
    return (ls_cpu_mat){p, f->dt[LS_CPU_GU_B], f->rank, c->F, false};
}

static ls_cpu_mat ls_cpu_d_a_of(const ls_cpu *c, int slot, int layer, int e, bool pairs) {
    const ls_cpu_form *f = ls_cpu_form_of(c, slot, layer);
    if (pairs)
        return (ls_cpu_mat){ls_cpu_dslot_base(c, slot, layer) + c->dslot.off_d_a + (size_t)e * c->dslot.d_a, LS_DTYPE_BF16,
                            c->F, f->rank, true};
    const float *p = ls_cpu_slot_base(c, slot, layer) + c->slot.off_d_a + (size_t)e * c->slot.d_a;
    return (ls_cpu_mat){p, f->dt[LS_CPU_D_A], c->F, f->rank, false};
}

static ls_cpu_mat ls_cpu_d_b_of(const ls_cpu *c, int slot, int layer, int o, bool pairs) {
    const ls_cpu_form *f = ls_cpu_form_of(c, slot, layer);
    if (pairs)
        return (ls_cpu_mat){ls_cpu_dslot_base(c, slot, layer) + c->dslot.off_d_b + (size_t)o * c->dslot.d_b, LS_DTYPE_BF16,
                            f->rank, c->H, true};
    const float *p = ls_cpu_slot_base(c, slot, layer) + c->slot.off_d_b + (size_t)o * c->slot.d_b;
    return (ls_cpu_mat){p, f->dt[LS_CPU_D_B], f->rank, c->H, false};
}

ls_cpu_mat ls_cpu_gu_a(const ls_cpu *c, int slot, int layer) { return ls_cpu_gu_a_of(c, slot, layer, c->bf16); }
ls_cpu_mat ls_cpu_gu_b(const ls_cpu *c, int slot, int layer, int e, int half) {
    return ls_cpu_gu_b_of(c, slot, layer, e, half, c->bf16);
}
ls_cpu_mat ls_cpu_d_a(const ls_cpu *c, int slot, int layer, int e) { return ls_cpu_d_a_of(c, slot, layer, e, c->bf16); }
ls_cpu_mat ls_cpu_d_b(const ls_cpu *c, int slot, int layer, int o) { return ls_cpu_d_b_of(c, slot, layer, o, c->bf16); }

/* Frees the context (whatever part of it create made); backend.c frees
 * the rest. */
static void ls_cpu_free(ls_backend *be) {
    ls_cpu *c = ls_cpu_ctx(be);
    if (c) {
        ls_cpu_threads_free(c->threads);
        free(c->w13);
        free(c->w2);
        free(c->gate);
        free(c->gs);
        free(c->gdelta);
        free(c->pool);
        free(c->dpool);
        free(c->form);
        free(c->gather);
        free(c->xs);
        free(c->zs);
        free(c->as);
        free(c->ys);
        free(c->st);
        free(c->pt);
        free(c->apack);
        free(c);
    }
    be->ctx = NULL;
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

/* Packs one layer from its stored dtypes to the backend's (exact when
 * that is at least as wide; else round to nearest even): W13[e] rows are
 * gate j at 2j (interleaved) or j (contiguous) and up j at 2j+1 or F+j;
 * value (h, j) of expert e's gate is W13[e][gate row j][h], its panels
 * interleaved with the other experts' and the ups' (see cpu.h). W2 value
 * (e*F + j, h) is W2[e][h][j]. The gate's value (h, 0) is gate[h]. */
static ls_status ls_cpu_upload_base(ls_backend *be, int layer, const ls_base_layer *w, ls_error *err) {
    (void)err;
    ls_cpu *c = ls_cpu_ctx(be);
    const size_t H = (size_t)c->H, F = (size_t)c->F, wb = ls_cpu_wbytes(ls_cpu_wdtype(c));
    const size_t b13 = ls_dtype_size(w->w13.dtype), b2 = ls_dtype_size(w->w2.dtype);
    const bool inter = c->w13_layout == LS_W13_INTERLEAVED;
    ls_cpu_mat m13 = ls_cpu_w13(c, layer), m2 = ls_cpu_w2(c, layer);
    /* Values of one panel of w13: H rows, or H's pairs. */
    const size_t panel = c->bf16 ? ls_cpu_pairs_len(c->H, 1) : H * LS_CPU_NR;
    for (int e = 0; e < c->n; e++) {
        for (int half = 0; half < 2; half++) {
            const size_t row0 = (size_t)e * 2 * F * H + (inter ? (size_t)half * H : (size_t)half * F * H);
            char *first = (char *)m13.p + (size_t)(2 * e + half) * panel * wb;
            const void *src = (const char *)w->w13.data + row0 * b13;
            if (c->bf16)
                ls_cpu_pack_pairs_typed((uint16_t *)first, c->H, 0, 2 * c->n, src, w->w13.dtype, 1, inter ? 2 * H : H,
                                        c->H, c->F);
            else
                ls_cpu_pack_b_typed(first, c->dtype, c->H, 0, 2 * c->n, src, w->w13.dtype, 1, inter ? 2 * H : H, c->H,
                                    c->F);
        }
        const void *src2 = (const char *)w->w2.data + (size_t)e * H * F * b2;
        if (c->bf16)
            ls_cpu_pack_pairs_typed((uint16_t *)m2.p, c->n * c->F, e * c->F, 1, src2, w->w2.dtype, 1, F, c->F, c->H);
        else
            ls_cpu_pack_b_typed((void *)m2.p, c->dtype, c->n * c->F, e * c->F, 1, src2, w->w2.dtype, 1, F, c->F, c->H);
    }
    if (c->gated) {
        ls_cpu_mat g = ls_cpu_gate(c, layer);
        ls_cpu_pack_b_typed((void *)g.p, LS_DTYPE_F32, c->H, 0, 1, w->gate.data, w->gate.dtype, 1, 1, c->H, 1);
    }
    return LS_OK;
}

/* BF16 when every value is a bf16 number (its low 16 bits are zero),
 * else F16 when every value is an f16 number, else F32: the narrowest
 * dtype that holds them all exactly. An adapter saved in bf16 or f16
 * keeps that property through the pool's scale when the scale is a power
 * of two (alpha = 2r, say). */
static ls_dtype ls_cpu_exact_dtype(const float *v, size_t count) {
    bool bf16 = true, f16 = true;
    for (size_t i = 0; i < count && (bf16 || f16); i++) {
        uint32_t bits, back;
        memcpy(&bits, &v[i], sizeof bits);
        if (bits & 0xFFFFu) bf16 = false;
        if (f16) {
            float w = ls_f16_to_f32(ls_f32_to_f16(v[i]));
            memcpy(&back, &w, sizeof back);
            f16 = back == bits;
        }
    }
    return bf16 ? LS_DTYPE_BF16 : f16 ? LS_DTYPE_F16 : LS_DTYPE_F32;
}

/* bf16 compute's copies of a slot's factors at its rank r (already in
 * form), from the same layout as slot_write's, gu_a from c->gather (its
 * shrinks r apart, as slot_write left them). */
static void ls_cpu_slot_write_pairs(ls_cpu *c, int slot, int layer, const ls_slot_factors *f) {
    const size_t H = (size_t)c->H, F = (size_t)c->F, R = (size_t)c->R;
    ls_cpu_mat m = ls_cpu_gu_a_of(c, slot, layer, true);
    ls_cpu_pack_pairs((uint16_t *)m.p, m.k, 0, 1, c->gather, 1, H, m.k, m.n);
    for (int e = 0; e < c->n; e++) {
        for (int half = 0; half < 2; half++) {
            m = ls_cpu_gu_b_of(c, slot, layer, e, half, true);
            ls_cpu_pack_pairs((uint16_t *)m.p, m.k, 0, 1, f->gu_b + ((size_t)e * 2 * F + (size_t)half * F) * R, 1, R,
                              m.k, m.n);
        }
        m = ls_cpu_d_a_of(c, slot, layer, e, true);
        ls_cpu_pack_pairs((uint16_t *)m.p, m.k, 0, 1, f->d_a + (size_t)e * R * F, 1, F, m.k, m.n);
    }
    for (int o = 0; o < c->O; o++) {
        m = ls_cpu_d_b_of(c, slot, layer, o, true);
        ls_cpu_pack_pairs((uint16_t *)m.p, m.k, 0, 1, f->d_b + (size_t)o * H * R, 1, R, m.k, m.n);
    }
}

/* Packs the four R-padded factors from the docs/math.md layout, cut to
 * the slot's rank r, each at its exact dtype (cpu.h): gu_a [O, 2R, H]
 * (value (h, o*2r + k) of the shrink is gu_a[o][k][h], value
 * (h, o*2r + r + k) is gu_a[o][R + k][h]), gu_b [n, 2F, R] (value (k, j)
 * of expert e's gate expand is gu_b[e][j][k], of its up expand
 * gu_b[e][F + j][k]), d_a [n, R, F] (value (j, k) is d_a[e][k][j]), d_b
 * [O, H, R] (value (k, h) is d_b[o][h][k]). These are the only operands
 * the forward reads, so nothing else needs a refresh. */
static ls_status ls_cpu_slot_write(ls_backend *be, int slot, int layer, const ls_slot_factors *f, ls_error *err) {
    (void)err;
    ls_cpu *c = ls_cpu_ctx(be);
    const size_t H = (size_t)c->H, F = (size_t)c->F, R = (size_t)c->R, n = (size_t)c->n, O = (size_t)c->O;
    const int r = ls_slot_factors_rank(&be->dims, &be->pool, f);
    ls_cpu_form *form = ls_cpu_form_of(c, slot, layer);
    form->rank = r;
    form->gate_d = f->gate_d != NULL;
    if (f->gate_d) {
        float *g = c->gdelta + ((size_t)slot * (size_t)c->L + (size_t)layer) * c->gate_len;
        ls_cpu_pack_b(g, LS_DTYPE_F32, c->H, 0, 1, f->gate_d, 1, H, c->H, 1);
    }
    form->dt[LS_CPU_GU_A] = ls_cpu_exact_dtype(f->gu_a, O * 2 * R * H);
    form->dt[LS_CPU_GU_B] = ls_cpu_exact_dtype(f->gu_b, n * 2 * F * R);
    form->dt[LS_CPU_D_A] = ls_cpu_exact_dtype(f->d_a, n * R * F);
    form->dt[LS_CPU_D_B] = ls_cpu_exact_dtype(f->d_b, O * H * R);
    if (r == 0) return LS_OK;
    /* gu_a's shrinks sit r apart in the operand and R apart in the pool's
     * layout: gather their rows first, so one pack lays whole panels. */
    for (size_t b = 0; b < 2 * O; b++)
        memcpy(c->gather + b * (size_t)r * H, f->gu_a + b * R * H, (size_t)r * H * sizeof(float));
    ls_cpu_mat m = ls_cpu_gu_a_of(c, slot, layer, false);
    ls_cpu_pack_b((void *)m.p, m.dt, m.k, 0, 1, c->gather, 1, H, m.k, m.n);
    for (int e = 0; e < c->n; e++) {
        for (int half = 0; half < 2; half++) {
            m = ls_cpu_gu_b_of(c, slot, layer, e, half, false);
            ls_cpu_pack_b((void *)m.p, m.dt, m.k, 0, 1, f->gu_b + ((size_t)e * 2 * F + (size_t)half * F) * R, 1, R, m.k,
                          m.n);
        }
        m = ls_cpu_d_a_of(c, slot, layer, e, false);
        ls_cpu_pack_b((void *)m.p, m.dt, m.k, 0, 1, f->d_a + (size_t)e * R * F, 1, F, m.k, m.n);
    }
    for (int o = 0; o < c->O; o++) {
        m = ls_cpu_d_b_of(c, slot, layer, o, false);
        ls_cpu_pack_b((void *)m.p, m.dt, m.k, 0, 1, f->d_b + (size_t)o * H * R, 1, R, m.k, m.n);
    }
    if (c->bf16) ls_cpu_slot_write_pairs(c, slot, layer, f);
    return LS_OK;
}

static ls_status ls_cpu_slot_clear(ls_backend *be, int slot, ls_error *err) {
    (void)err;
    ls_cpu *c = ls_cpu_ctx(be);
    memset(ls_cpu_slot_base(c, slot, 0), 0, (size_t)c->L * c->slot.len * sizeof(float));
    for (int l = 0; l < c->L; l++) {
        ls_cpu_form_of(c, slot, l)->rank = 0;
        ls_cpu_form_of(c, slot, l)->gate_d = false;
    }
    return LS_OK;
}

/* Unpacks back to the docs/math.md layout (the inverse of slot_write),
 * zero past the slot's rank. A NULL destination skips that buffer. */
static ls_status ls_cpu_slot_read(ls_backend *be, int slot, int layer, float *gu_a, float *gu_b, float *d_a,
                                  float *d_b, ls_error *err) {
    (void)err;
    ls_cpu *c = ls_cpu_ctx(be);
    const size_t H = (size_t)c->H, F = (size_t)c->F, R = (size_t)c->R, n = (size_t)c->n, O = (size_t)c->O;
    const int r = ls_cpu_rank(c, slot, layer);
    if (gu_a) memset(gu_a, 0, O * 2 * R * H * sizeof(float));
    if (gu_b) memset(gu_b, 0, n * 2 * F * R * sizeof(float));
    if (d_a) memset(d_a, 0, n * R * F * sizeof(float));
    if (d_b) memset(d_b, 0, O * H * R * sizeof(float));
    if (r == 0) return LS_OK;
    ls_cpu_mat m;
    if (gu_a) {
        m = ls_cpu_gu_a_of(c, slot, layer, false);
        ls_cpu_unpack_b(m.p, m.dt, m.k, 0, c->gather, 1, H, m.k, m.n);
        for (size_t b = 0; b < 2 * O; b++)
            memcpy(gu_a + b * R * H, c->gather + b * (size_t)r * H, (size_t)r * H * sizeof(float));
    }
    for (int e = 0; e < c->n; e++) {
        for (int half = 0; gu_b && half < 2; half++) {
            m = ls_cpu_gu_b_of(c, slot, layer, e, half, false);
            ls_cpu_unpack_b(m.p, m.dt, m.k, 0, gu_b + ((size_t)e * 2 * F + (size_t)half * F) * R, 1, R, m.k, m.n);
        }
        if (d_a) {
            m = ls_cpu_d_a_of(c, slot, layer, e, false);
            ls_cpu_unpack_b(m.p, m.dt, m.k, 0, d_a + (size_t)e * R * F, 1, F, m.k, m.n);
        }
    }
    for (int o = 0; d_b && o < c->O; o++) {
        m = ls_cpu_d_b_of(c, slot, layer, o, false);
        ls_cpu_unpack_b(m.p, m.dt, m.k, 0, d_b + (size_t)o * H * R, 1, R, m.k, m.n);
    }
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
    /* .utilization = */ NULL, /* the engine's threads are the server's own */
};

/* What only the CPU backend checks (backend.c checks the rest). */
static ls_status ls_cpu_check_settings(const ls_cpu_settings *cpu, ls_error *err) {
    if (cpu->isa < LS_CPU_ISA_AUTO || cpu->isa > LS_CPU_ISA_GENERIC)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "cpu backend: unknown kernel path %d", (int)cpu->isa);
    if (cpu->compute != LS_CPU_COMPUTE_F32 && cpu->compute != LS_CPU_COMPUTE_BF16)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "cpu backend: unknown compute mode %d", (int)cpu->compute);
    /* Under bf16 compute avx512 means the VDPBF16PS tiles, which need
     * AVX512-BF16 (AVX-512F alone lacks it): nothing here fakes them. */
    if (cpu->compute == LS_CPU_COMPUTE_BF16 && cpu->isa == LS_CPU_ISA_AVX512 && !ls_cpu_has_avx512bf16())
        return ls_error_set(err, LS_INVALID_REQUEST,
                            "use --cpu-isa auto (the fastest bf16 tiles this CPU runs), or --compute f32",
                            "cpu backend: this CPU has no AVX512-BF16, which --compute bf16 on the %s kernels "
                            "needs (VDPBF16PS)",
                            ls_cpu_isa_name(cpu->isa));
    if (!ls_cpu_isa_supported(cpu->isa))
        return ls_error_set(err, LS_INVALID_REQUEST, "use --cpu-isa auto, or a path this CPU has",
                            "cpu backend: this CPU does not run the %s kernels", ls_cpu_isa_name(cpu->isa));
    return LS_OK;
}

/* CPUs this process may run on (its affinity mask), at least 1. */
static int ls_cpu_online(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* A slot and layer's block at rank R, each operand packed to len(k, n)
 * values (fp32 panels, or bf16 pairs). */
static ls_cpu_slot_layout ls_cpu_slot_layout_of(size_t (*len)(int k, int n), int n, int H, int F, int R, int O) {
    ls_cpu_slot_layout l = {.gu_a = len(H, O * 2 * R), .gu_b = len(R, F), .d_a = len(F, R), .d_b = len(R, H)};
    l.off_gu_b = l.gu_a;
    l.off_d_a = l.off_gu_b + (size_t)2 * n * l.gu_b;
    l.off_d_b = l.off_d_a + (size_t)n * l.d_a;
    l.len = l.off_d_b + (size_t)O * l.d_b;
    return l;
}

/* The shapes and the packed layout of c's weights and slots, from cfg;
 * the kernels of cpu's path. */
static void ls_cpu_layout(ls_cpu *c, const ls_backend_config *cfg, const ls_cpu_settings *cpu) {
    const ls_dims *d = &cfg->dims;
    const ls_pool_dims *p = &cfg->pool;
    c->n = d->n, c->H = d->H, c->F = d->F, c->L = d->L;
    c->S = p->slots, c->R = p->max_rank, c->O = ls_pool_outer(d, p);
    c->max_tokens = p->max_tokens;
    c->w13_layout = d->w13_layout;
    c->dtype = cfg->dtype;
    c->kr = ls_cpu_kernels_for(cpu->isa);
    c->bf16 = cpu->compute == LS_CPU_COMPUTE_BF16;
    c->kb = c->bf16 ? ls_cpu_kernels_bf16_for(cpu->isa) : NULL;
    const int n = c->n, H = c->H, F = c->F, R = c->R, O = c->O;
    c->zw = ls_cpu_panel_count(F) * 2 * n * LS_CPU_NR;
    c->w13_len = c->bf16 ? ls_cpu_pairs_len(H, c->zw) : ls_cpu_packed_len(H, c->zw);
    c->w2_len = c->bf16 ? ls_cpu_pairs_len(n * F, H) : ls_cpu_packed_len(n * F, H);
    c->slot = ls_cpu_slot_layout_of(ls_cpu_packed_len, n, H, F, R, O);
    if (c->bf16) c->dslot = ls_cpu_slot_layout_of(ls_cpu_pairs_len, n, H, F, R, O);
}

/* Allocates the pool for every slot and layer, room for every layer's
 * packed base weights (zero until upload_base), the forward's scratch,
 * and starts the engine's threads. On success *out belongs to the caller
 * (ls_backend_free). */
ls_status ls_backend_cpu_create(const ls_backend_config *cfg, const ls_cpu_settings *cpu, ls_backend **out,
                                ls_error *err) {
    static const ls_cpu_settings defaults = {0};
    if (!cpu) cpu = &defaults;
    *out = NULL;
    ls_backend *be = NULL;
    ls_status st = ls_cpu_check_settings(cpu, err);
    if (st == LS_OK) st = ls_backend_new(&ls_cpu_ops, cfg, &be, err);
    if (st != LS_OK) return st;
    ls_cpu *c = calloc(1, sizeof *c);
    if (!c) {
        ls_backend_free(be);
        return ls_error_set(err, LS_DEVICE_ERROR, NULL, "cpu backend: out of host memory");
    }
    be->ctx = c;

    ls_cpu_layout(c, cfg, cpu);
    be->isa = c->bf16 ? c->kb->name : c->kr->name;
    const ls_dims *d = &cfg->dims;
    const ls_pool_dims *p = &cfg->pool;
    const int n = c->n, H = c->H, F = c->F, R = c->R, O = c->O;
    const size_t L = (size_t)c->L, S = (size_t)c->S, T = (size_t)c->max_tokens;

    const int cpus = ls_cpu_online(), threads = cpu->threads > 0 ? cpu->threads : cpus;
    /* K of every GEMM: H (w13, gate/up shrink), n*F (w2), F (down
     * shrink) or at most R (the expands). */
    int kmax = H > n * F ? H : n * F;
    if (R > kmax) kmax = R;
    c->apack_len = ls_cpu_apack_len(kmax);
    const size_t wb = ls_cpu_wbytes(ls_cpu_wdtype(c));
    c->w13 = ls_cpu_alloc(L, 1, c->w13_len, wb);
    c->w2 = ls_cpu_alloc(L, 1, c->w2_len, wb);
    c->gated = d->gate;
    c->gate_len = ls_cpu_packed_len(H, 1);
    c->gate = ls_cpu_alloc(c->gated ? L : 0, 1, c->gate_len, sizeof(float));
    c->gs = ls_cpu_alloc(c->gated ? T : 0, 1, 1, sizeof(float));
    c->gdelta = ls_cpu_alloc(c->gated ? S * L : 0, 1, c->gate_len, sizeof(float));
    /* S = 0 leaves a pool of nothing; keep the pointer valid anyway. */
    c->pool = ls_cpu_alloc(S, L, c->slot.len, sizeof(float));
    c->dpool = ls_cpu_alloc(c->bf16 ? S : 0, L, c->dslot.len, sizeof *c->dpool);
    c->form = ls_cpu_alloc(S, L, 1, sizeof *c->form);
    c->gather = ls_cpu_alloc((size_t)O * 2, (size_t)R, (size_t)H, sizeof(float));
    c->xs = ls_cpu_alloc(T, (size_t)H, 1, sizeof(float));
    c->zs = ls_cpu_alloc(T, (size_t)c->zw, 1, sizeof(float));
    c->as = ls_cpu_alloc(T, (size_t)n, (size_t)F, sizeof(float));
    c->ys = ls_cpu_alloc(T, (size_t)H, 1, sizeof(float));
    c->st = ls_cpu_alloc(T, (size_t)O * 2, (size_t)R, sizeof(float));
    c->pt = ls_cpu_alloc(T, (size_t)O, (size_t)R, sizeof(float));
    c->apack = ls_cpu_alloc((size_t)threads, c->apack_len, 1, sizeof(float));
    if (!c->w13 || !c->w2 || !c->gate || !c->gs || !c->gdelta || !c->pool || !c->dpool || !c->form || !c->gather || !c->xs || !c->zs || !c->as ||
        !c->ys || !c->st || !c->pt || !c->apack) {
        ls_backend_free(be);
        return ls_error_set(err, LS_DEVICE_ERROR, "lower --slots, --max-rank, --max-batch-tokens or the model size",
                            "cpu backend: cannot allocate the weights, the pool (%zu slots x %zu layers, rank %d) "
                            "or the scratch",
                            S, L, R);
    }
    if ((st = ls_cpu_threads_create(threads, cpus, &c->threads, err)) != LS_OK) {
        ls_backend_free(be);
        return st;
    }
    be->threads = threads;
    /* The four fp32 buffers of every slot and layer, under bf16 compute
     * the pair copies its tiles read beside them, and on a gated model
     * the gate's delta. */
    be->pool_bytes = S * L *
                     ((ls_pool_gu_a_len(d, p) + ls_pool_gu_b_len(d, p) + ls_pool_d_a_len(d, p) +
                       ls_pool_d_b_len(d, p)) *
                          sizeof(float) +
                      (c->bf16 ? c->dslot.len * sizeof *c->dpool : 0) + (c->gated ? c->gate_len * sizeof(float) : 0));
    *out = be;
    return LS_OK;
}
