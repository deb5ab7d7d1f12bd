/* Packing of B operands and the blocked GEMM driver over the register
 * tiles of kernels.h. The loops only choose which tile computes which
 * elements and how far along K it goes before C is stored and picked up
 * again; fp32 stores are exact, so the chain of every element is the same
 * whatever M, the blocking or the caller's share of the columns. */
#include "gpu/cpu/gemm.h"

#include <stdint.h>
#include <string.h>

static size_t ls_cpu_dtype_bytes(ls_dtype dt) { return dt == LS_DTYPE_F32 ? 4 : 2; }

/* Source value at element i of a float dtype, widened (exact). */
static inline float ls_cpu_src_value(const void *src, ls_dtype sdt, size_t i) {
    if (sdt == LS_DTYPE_F32) return ((const float *)src)[i];
    uint16_t h;
    memcpy(&h, (const char *)src + 2 * i, 2); /* little-endian host */
    return sdt == LS_DTYPE_BF16 ? ls_bf16_to_f32(h) : ls_f16_to_f32(h);
}

void ls_cpu_pack_b_typed(void *dst, ls_dtype dt, int kdst, int k0, int pstep, const void *src, ls_dtype sdt,
                         size_t ld_k, size_t ld_n, int k, int n) {
    const int panels = ls_cpu_panel_count(n);
    for (int p = 0; p < panels; p++) {
        for (int kk = 0; kk < k; kk++) {
            size_t at = ((size_t)p * (size_t)pstep * kdst + (size_t)(k0 + kk)) * LS_CPU_NR;
            for (int l = 0; l < LS_CPU_NR; l++) {
                int j = p * LS_CPU_NR + l;
                float v = j < n ? ls_cpu_src_value(src, sdt, (size_t)kk * ld_k + (size_t)j * ld_n) : 0.0f;
                if (dt == LS_DTYPE_F32) ((float *)dst)[at + l] = v;
                else ((uint16_t *)dst)[at + l] = dt == LS_DTYPE_BF16 ? ls_f32_to_bf16(v) : ls_f32_to_f16(v);
            }
        }
    }
}

void ls_cpu_pack_b(void *dst, ls_dtype dt, int kdst, int k0, int pstep, const float *src, size_t ld_k, size_t ld_n,
                   int k, int n) {
    ls_cpu_pack_b_typed(dst, dt, kdst, k0, pstep, src, LS_DTYPE_F32, ld_k, ld_n, k, n);
}

uint16_t ls_cpu_bf16_operand(float v) {
    uint16_t h = ls_f32_to_bf16(v);
    return (h & 0x7F80u) == 0 ? (uint16_t)(h & 0x8000u) : h;
}

void ls_cpu_pack_pairs_typed(uint16_t *dst, int kdst, int k0, int pstep, const void *src, ls_dtype sdt, size_t ld_k,
                             size_t ld_n, int k, int n) {
    const int panels = ls_cpu_panel_count(n), rows = (kdst + 1) / 2;
    const bool pad = (kdst & 1) && k0 + k == kdst; /* this call reaches the padding row */
    for (int p = 0; p < panels; p++) {
        uint16_t *panel = dst + (size_t)p * (size_t)pstep * rows * 2 * LS_CPU_NR;
        for (int kk = 0; kk < k + (pad ? 1 : 0); kk++) {
            const int row = k0 + kk;
            uint16_t *at = panel + (size_t)(row / 2) * 2 * LS_CPU_NR + (row & 1);
            for (int l = 0; l < LS_CPU_NR; l++) {
                int j = p * LS_CPU_NR + l;
                bool real = j < n && kk < k;
                at[2 * l] = real ? ls_cpu_bf16_operand(ls_cpu_src_value(src, sdt, (size_t)kk * ld_k + (size_t)j * ld_n))
                                 : 0;
            }
        }
    }
}

void ls_cpu_pack_pairs(uint16_t *dst, int kdst, int k0, int pstep, const float *src, size_t ld_k, size_t ld_n, int k,
                       int n) {
    ls_cpu_pack_pairs_typed(dst, kdst, k0, pstep, src, LS_DTYPE_F32, ld_k, ld_n, k, n);
}

void ls_cpu_unpack_b(const void *src, ls_dtype dt, int ksrc, int k0, float *dst, size_t ld_k, size_t ld_n, int k,
                     int n) {
    for (int j = 0; j < n; j++) {
        size_t base = (size_t)(j / LS_CPU_NR) * ksrc * LS_CPU_NR + (size_t)(j % LS_CPU_NR);
        for (int kk = 0; kk < k; kk++) {
            size_t at = base + (size_t)(k0 + kk) * LS_CPU_NR;
            float v;
            if (dt == LS_DTYPE_F32) v = ((const float *)src)[at];
            else if (dt == LS_DTYPE_BF16) v = ls_bf16_to_f32(((const uint16_t *)src)[at]);
            else v = ls_f16_to_f32(((const uint16_t *)src)[at]);
            dst[(size_t)kk * ld_k + (size_t)j * ld_n] = v;
        }
    }
}

/* Rows [i0, i0 + mc) and columns [k0, k0 + kc) of A into ap, in row
 * groups of h rows interleaved at stride as >= h: value (i, kk) of group
 * g at ap[g * kc * as + kk * as + i]. */
static void ls_cpu_pack_a(float *ap, int as, int h, const float *a, size_t lda, int i0, int mc, int k0, int kc) {
    for (int g = 0; g * h < mc; g++) {
        int rows = mc - g * h < h ? mc - g * h : h;
        float *dst = ap + (size_t)g * kc * as;
        for (int i = 0; i < rows; i++) {
            const float *src = a + (size_t)(i0 + g * h + i) * lda + k0;
            for (int kk = 0; kk < kc; kk++) dst[(size_t)kk * as + i] = src[kk];
        }
    }
}

void ls_cpu_pack_a_pairs(uint32_t *dst, int as, int rows, const float *a, size_t lda, int K, int s0, int sc) {
    for (int i = 0; i < rows; i++) {
        const float *src = a + (size_t)i * lda;
        for (int p = 0; p < sc; p++) {
            const int k = 2 * (s0 + p);
            uint16_t lo = ls_cpu_bf16_operand(src[k]), hi = k + 1 < K ? ls_cpu_bf16_operand(src[k + 1]) : 0;
            dst[(size_t)p * as + i] = (uint32_t)lo | (uint32_t)hi << 16;
        }
    }
}

/* bf16 compute's A: rows [i0, i0 + mc) and k steps (pairs) [s0, s0 + sc)
 * of A, each value through ls_cpu_bf16_operand, k past K zero. As fp32
 * values (no a_pairs: value (i, kk) of group g at ap[g * 2sc * as +
 * kk * as + i], kk counted from 2s0) or as pair dwords (value (i, p) at
 * ap[g * sc * as + p * as + i], by the path's own packer where it has
 * one). */
static void ls_cpu_pack_a_bf16(const ls_cpu_kernels *kr, float *ap, int as, int h, const float *a, size_t lda, int K,
                               int i0, int mc, int s0, int sc) {
    const bool pairs = kr->a_pairs;
    for (int g = 0; g * h < mc; g++) {
        int rows = mc - g * h < h ? mc - g * h : h;
        float *dst = ap + (size_t)g * sc * (pairs ? 1 : 2) * as;
        const float *src = a + (size_t)(i0 + g * h) * lda;
        if (pairs) {
            (kr->pack_a_pairs ? kr->pack_a_pairs : ls_cpu_pack_a_pairs)((uint32_t *)(void *)dst, as, rows, src, lda, K,
                                                                        s0, sc);
            continue;
        }
        for (int i = 0; i < rows; i++, src += lda) {
            for (int p = 0; p < sc; p++) {
                const int k = 2 * (s0 + p);
                uint16_t lo = ls_cpu_bf16_operand(src[k]), hi = k + 1 < K ? ls_cpu_bf16_operand(src[k + 1]) : 0;
                dst[(size_t)(2 * p) * as + i] = ls_bf16_to_f32(lo);
                dst[(size_t)(2 * p + 1) * as + i] = ls_bf16_to_f32(hi);
            }
        }
    }
}

/* k steps of b: K, or K's pairs. */
static int ls_cpu_steps(const ls_cpu_mat *b) { return b->pairs ? (b->k + 1) / 2 : b->k; }
/* Bytes of one panel's k step: 16 values, or 16 pairs. */
static size_t ls_cpu_step_bytes(const ls_cpu_mat *b) {
    return LS_CPU_NR * (b->pairs ? 4 : ls_cpu_dtype_bytes(b->dt));
}

/* Step k of panel p of b: the first B value a tile of that panel block reads. */
static const char *ls_cpu_panel_row(const ls_cpu_mat *b, int p, int k) {
    return (const char *)b->p + ((size_t)p * ls_cpu_steps(b) + (size_t)k) * ls_cpu_step_bytes(b);
}

/* The first B value of the block the tiles after this panel block's will
 * read: the next np panels over the same K rows, else the first panel of
 * the next K block; NULL after the last. */
static const char *ls_cpu_next_block(const ls_cpu_mat *b, int p, int np, int p0, int p1, int k0, int kc) {
    if (p + np < p1) return ls_cpu_panel_row(b, p + np, k0);
    if (k0 + kc < ls_cpu_steps(b)) return ls_cpu_panel_row(b, p0, k0 + kc);
    return NULL;
}

/* What tile g of the block's `groups` row groups prefetches. A lone group
 * streams its own panels from memory, so it reads LS_CPU_PREFETCH values
 * ahead of itself. Where several groups share the block, the first would
 * wait on memory while the others compute from cache; so each instead
 * brings in its 1/groups share of the next block's rows while it
 * computes, and the next block's first tile finds them in cache. On the
 * CI machine (n=2, H=2048, F=1024, 2 threads) this took T=16 from 2.66 to
 * 2.35 ms on the avx2 path (bf16; f32 3.3 to 2.65) and T=32 on avx512
 * f32 from 4.5 to 3.9 ms; T >= 256 gained 2-7%. */
static void ls_cpu_prefetch_plan(ls_cpu_tile *t, size_t esz, int groups, int g, const char *next, int kc) {
    /* The last block has no next one: its tiles read ahead in their own
     * panels, which is harmless once they are in cache. */
    if (groups == 1 || !next) {
        t->pf = ls_cpu_ahead(t->b, (size_t)LS_CPU_PREFETCH * esz);
        t->pf_step = LS_CPU_NR * esz;
        return;
    }
    /* The next block has at most kc rows; the share is rounded up so the
     * groups cover it, and spread over this tile's kc steps. */
    const size_t rows = ((size_t)kc + (size_t)groups - 1) / (size_t)groups, bytes = rows * LS_CPU_NR * esz;
    t->pf = ls_cpu_ahead(next, (size_t)g * bytes);
    t->pf_step = (bytes + (size_t)kc - 1) / (size_t)kc;
}

static ls_cpu_tile_fn ls_cpu_tile_for(const ls_cpu_kernels *kr, const ls_cpu_mat *b) {
    if (b->pairs) return kr->tile_pairs;
    return b->dt == LS_DTYPE_F32 ? kr->tile_f32 : b->dt == LS_DTYPE_BF16 ? kr->tile_bf16 : kr->tile_f16;
}

void ls_cpu_gemm(const ls_cpu_kernels *kr, float *apack, int m, const float *a, size_t lda, const ls_cpu_mat *b,
                 int p0, int p1, float *c, size_t ldc, size_t cstride, bool acc) {
    const int mr = kr->mr, K = ls_cpu_steps(b);
    if (m <= 0 || p1 <= p0) return;
    if (K == 0) {
        /* An empty sum: C = C or 0. */
        for (int i = 0; !acc && i < m; i++)
            for (int p = p0; p < p1; p++) {
                int w = b->n - p * LS_CPU_NR < LS_CPU_NR ? b->n - p * LS_CPU_NR : LS_CPU_NR;
                memset(c + (size_t)i * ldc + (size_t)p * cstride, 0, (size_t)w * sizeof(float));
            }
        return;
    }
    const ls_cpu_tile_fn tile = ls_cpu_tile_for(kr, b);
    const size_t esz = ls_cpu_step_bytes(b) / LS_CPU_NR, pstride = (size_t)K * LS_CPU_NR;
    /* fp32 A values a k step of a pairs tile takes: its pair's two. */
    const int aw = b->pairs && !kr->a_pairs ? 2 : 1;
    /* With a single row group nothing reuses a B block, so K is not cut:
     * each panel streams from memory once, start to end. */
    const int kc_max = m <= mr ? K : b->pairs ? LS_CPU_KC / 2 : LS_CPU_KC;
    for (int i0 = 0; i0 < m; i0 += LS_CPU_MC) {
        const int mc = m - i0 < LS_CPU_MC ? m - i0 : LS_CPU_MC;
        /* One group of up to mr rows, or the block's rows in as few
         * groups of at most mr_reuse as fit, of equal height h (the last
         * may be shorter): 20 rows are 7 + 7 + 6, not 8 + 8 + 4, whose
         * 4-row tile would do fewer multiply-adds a B load. Every tile of
         * the block takes the panel count of h rows. */
        const int hmax = m <= mr ? mr : kr->mr_reuse;
        const int groups = (mc + hmax - 1) / hmax, h = (mc + groups - 1) / groups, np = kr->np[h];
        const int as = ls_cpu_a_stride(mr, kr->mr_reuse, h);
        for (int k0 = 0; k0 < K; k0 += kc_max) {
            const int kc = K - k0 < kc_max ? K - k0 : kc_max;
            if (b->pairs) ls_cpu_pack_a_bf16(kr, apack, as, h, a, lda, b->k, i0, mc, k0, kc);
            else ls_cpu_pack_a(apack, as, h, a, lda, i0, mc, k0, kc);
            for (int p = p0; p < p1; p += np) {
                ls_cpu_tile t;
                t.np = p1 - p < np ? p1 - p : np;
                t.ncols = b->n - p * LS_CPU_NR;
                if (t.ncols > t.np * LS_CPU_NR) t.ncols = t.np * LS_CPU_NR;
                t.k = kc;
                t.acc = acc || k0 > 0;
                t.b = ls_cpu_panel_row(b, p, k0);
                t.bstride = pstride;
                t.ldc = ldc;
                t.cstride = cstride;
                const char *next = ls_cpu_next_block(b, p, np, p0, p1, k0, kc);
                for (int i = 0; i < mc; i += h) {
                    t.m = mc - i < h ? mc - i : h;
                    t.a = apack + (size_t)(i / h) * kc * aw * as;
                    t.c = c + (size_t)(i0 + i) * ldc + (size_t)p * cstride;
                    ls_cpu_prefetch_plan(&t, esz, groups, i / h, next, kc);
                    tile(&t);
                }
            }
        }
    }
}
