/* The fusion of PEFT factors into one slot as sglang's fused layer reads
 * it (docs/math.md, block structure): with the slot's rank R (the largest
 * module rank), gate's A fills gate_up_lora_a rows 0..r_g-1 and up's A
 * rows R..R+r_u-1; gate's B (scaled by s_g) fills each expert's F gate
 * rows of gate_up_lora_b in columns 0..r_g-1, up's B its F up rows in
 * columns 0..r_u-1; down's A and B land as they are. A fused gate_up_proj
 * A feeds both halves. Everything else stays zero, so gate rows see only
 * gate's A and up rows only up's A. The shared-expert gate's factors fold
 * into one vector after the four (ls_fuse_shared_gate). */
#include <stdio.h>
#include <string.h>

#include "lora/adapter_internal.h"

/* buf is the caller's; in is borrowed. */
const char *ls_adapter_module_name(const ls_adapter_in *in, char *buf, size_t len) {
    const char *s = in->name + (in->prefixed ? strlen(LS_ADAPTER_PREFIX) : 0);
    snprintf(buf, len, "%.*s", (int)in->module_len, s);
    return buf;
}

typedef struct {
    const ls_adapter_ctx *c;
    size_t n, H, F, R;
    float *gu_a, *gu_b, *d_a, *d_b;
} ls_fuse;

/* A of a module [r, H] into gu_a rows from..from+r-1. */
static void ls_fuse_a(const ls_fuse *f, const ls_tensor *a, size_t r, size_t from) {
    for (size_t i = 0; i < r * f->H; i++) f->gu_a[from * f->H + i] = ls_adapter_value(a, i);
}

/* B of gate or up [n*F, r], scaled, into each expert's rows from..from+F-1
 * of gu_b [n, 2F, R]. */
static void ls_fuse_b(const ls_fuse *f, const ls_tensor *b, size_t r, double s, size_t from) {
    for (size_t e = 0; e < f->n; e++)
        for (size_t j = 0; j < f->F; j++)
            for (size_t k = 0; k < r; k++)
                f->gu_b[(e * 2 * f->F + from + j) * f->R + k] = (float)(s * ls_adapter_value(b, (e * f->F + j) * r + k));
}

/* A fused gate_up_proj: one A feeds gate and up; B [n*2F, r] expert-major
 * holds each expert's gate rows then up rows (or interleaved). */
static void ls_fuse_gate_up(const ls_fuse *f, int l) {
    const ls_adapter_ctx *c = f->c;
    const ls_adapter_mod *md = ls_adapter_mod_at(c, l, LS_MOD_GATE_UP);
    const size_t r = (size_t)md->rank, F = f->F;
    ls_fuse_a(f, ls_adapter_at(c, l, LS_AD_GU_A)->t, r, 0);
    ls_fuse_a(f, ls_adapter_at(c, l, LS_AD_GU_A)->t, r, f->R);
    const ls_tensor *b = ls_adapter_at(c, l, LS_AD_GU_B)->t;
    const bool interleaved = c->params->gate_up_order == LS_GATE_UP_ORDER_INTERLEAVED;
    for (size_t e = 0; e < f->n; e++)
        for (size_t row = 0; row < 2 * F; row++) {
            /* interleaved: source row 2j is gate j, 2j+1 is up j */
            const size_t src = interleaved ? (row < F ? 2 * row : 2 * (row - F) + 1) : row;
            for (size_t k = 0; k < r; k++)
                f->gu_b[(e * 2 * F + row) * f->R + k] =
                    (float)(md->scale * ls_adapter_value(b, (e * 2 * F + src) * r + k));
        }
}

/* down_proj: A [r, n*F] with expert-major columns becomes [n, R, F]; B
 * [H, r], scaled, becomes [H, R]. */
static void ls_fuse_down(const ls_fuse *f, int l) {
    const ls_adapter_ctx *c = f->c;
    const ls_adapter_mod *md = ls_adapter_mod_at(c, l, LS_MOD_DOWN);
    const size_t r = (size_t)md->rank, n = f->n, F = f->F, R = f->R;
    const ls_tensor *a = ls_adapter_at(c, l, LS_AD_D_A)->t, *b = ls_adapter_at(c, l, LS_AD_D_B)->t;
    for (size_t e = 0; e < n; e++)
        for (size_t k = 0; k < r; k++)
            for (size_t j = 0; j < F; j++) f->d_a[(e * R + k) * F + j] = ls_adapter_value(a, k * n * F + e * F + j);
    for (size_t h = 0; h < f->H; h++)
        for (size_t k = 0; k < r; k++) f->d_b[h * R + k] = (float)(md->scale * ls_adapter_value(b, h * r + k));
}

/* The shared-expert gate's A [r, H] and B [1, r] folded into the delta
 * of its weight, dst[h] = s * sum_k B[0, k] * A[k, h], summed in double
 * and rounded once: PEFT adds s * B(A x) to the gate's logit, and that
 * is dst . x. */
static void ls_fuse_shared_gate(const ls_adapter_ctx *c, int l, float *dst) {
    const ls_adapter_mod *md = ls_adapter_mod_at(c, l, LS_MOD_SGATE);
    const ls_tensor *a = ls_adapter_at(c, l, LS_AD_SG_A)->t, *b = ls_adapter_at(c, l, LS_AD_SG_B)->t;
    const size_t r = (size_t)md->rank, H = (size_t)c->dims->H;
    for (size_t h = 0; h < H; h++) {
        double sum = 0;
        for (size_t k = 0; k < r; k++) sum += (double)ls_adapter_value(b, k) * ls_adapter_value(a, k * H + h);
        dst[h] = (float)(md->scale * sum);
    }
}

bool ls_adapter_has_gate(const ls_adapter_ctx *c) {
    for (int l = 0; c->format == LS_ADAPTER_FORMAT_PEFT && l < c->dims->L; l++)
        if (ls_adapter_at(c, l, LS_AD_SG_A)->name) return true;
    return false;
}

/* dst is the caller's (a layer of ls_adapter.data, zeroed); c is borrowed. */
void ls_adapter_peft_fill(const ls_adapter_ctx *c, int l, float *dst) {
    const ls_factor_layout lay = ls_factor_layout_of(c->dims, 1, c->rank); /* PEFT outer factors are shared */
    const ls_fuse f = {c,
                       (size_t)c->dims->n,
                       (size_t)c->dims->H,
                       (size_t)c->dims->F,
                       (size_t)c->rank,
                       dst + lay.off[LS_FACTOR_GU_A],
                       dst + lay.off[LS_FACTOR_GU_B],
                       dst + lay.off[LS_FACTOR_D_A],
                       dst + lay.off[LS_FACTOR_D_B]};
    if (ls_adapter_at(c, l, LS_AD_GU_A)->name) ls_fuse_gate_up(&f, l);
    if (ls_adapter_at(c, l, LS_AD_D_A)->name) ls_fuse_down(&f, l);
    const ls_adapter_mod *g = ls_adapter_mod_at(c, l, LS_MOD_GATE), *u = ls_adapter_mod_at(c, l, LS_MOD_UP);
    if (ls_adapter_at(c, l, LS_AD_G_A)->name) {
        ls_fuse_a(&f, ls_adapter_at(c, l, LS_AD_G_A)->t, (size_t)g->rank, 0);
        ls_fuse_b(&f, ls_adapter_at(c, l, LS_AD_G_B)->t, (size_t)g->rank, g->scale, 0);
    }
    if (ls_adapter_at(c, l, LS_AD_U_A)->name) {
        ls_fuse_a(&f, ls_adapter_at(c, l, LS_AD_U_A)->t, (size_t)u->rank, f.R);
        ls_fuse_b(&f, ls_adapter_at(c, l, LS_AD_U_B)->t, (size_t)u->rank, u->scale, f.F);
    }
    if (ls_adapter_at(c, l, LS_AD_SG_A)->name) ls_fuse_shared_gate(c, l, dst + lay.total);
}

/* The original tensor behind element i of factor k in layer l's compact
 * layout (adapter rank R): the fused factor when there is one, else gate's
 * or up's by the half the element is in. Static or borrowed from c. */
const char *ls_adapter_source_of(const ls_adapter_ctx *c, int l, int k, size_t i) {
    if (c->format == LS_ADAPTER_FORMAT_POOL || k == LS_FACTOR_D_A || k == LS_FACTOR_D_B)
        return ls_adapter_at(c, l, k)->name;
    const ls_adapter_in *fused = ls_adapter_at(c, l, k);
    if (fused->name) return fused->name;
    const size_t R = (size_t)c->rank, H = (size_t)c->dims->H, F = (size_t)c->dims->F;
    const bool up = k == LS_FACTOR_GU_A ? (i / H) % (2 * R) >= R : (i / R) % (2 * F) >= F;
    const int slot = (up ? LS_AD_U_A : LS_AD_G_A) + (k == LS_FACTOR_GU_B);
    return ls_adapter_at(c, l, slot)->name;
}
