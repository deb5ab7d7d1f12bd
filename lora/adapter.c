/* Adapter normalisation, the driver: sorts the uploaded names (docs/api.md, adapter formats),
 * runs the format's checks (adapter_peft.c, adapter_pool.c), the checks
 * common to both formats, and on success builds the compact host copy,
 * its digest and the padding into pool slots (ls_adapter_expand). */
#include "lora/adapter.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sha256.h"
#include "common/text.h"
#include "lora/adapter_internal.h"
#include "lora/adapter_rules.h"

/* Static string; never freed. */
const char *ls_adapter_format_name(ls_adapter_format f) {
    switch (f) {
    case LS_ADAPTER_FORMAT_PEFT:
        return "peft";
    case LS_ADAPTER_FORMAT_POOL:
        return "pool";
    default:
        return "auto";
    }
}

/* Writes *out only on success; s is borrowed. */
bool ls_adapter_format_parse(const char *s, ls_adapter_format *out) {
    if (!s) return false;
    if (!strcmp(s, "peft"))
        *out = LS_ADAPTER_FORMAT_PEFT;
    else if (!strcmp(s, "pool"))
        *out = LS_ADAPTER_FORMAT_POOL;
    else if (!strcmp(s, "auto"))
        *out = LS_ADAPTER_FORMAT_AUTO;
    else
        return false;
    return true;
}

/* Static string; never freed. */
const char *ls_gate_up_order_name(ls_gate_up_order o) {
    return o == LS_GATE_UP_ORDER_INTERLEAVED ? "interleaved" : "gate_up";
}

/* Writes *out only on success; s is borrowed. */
bool ls_gate_up_order_parse(const char *s, ls_gate_up_order *out) {
    if (!s) return false;
    if (!strcmp(s, "gate_up"))
        *out = LS_GATE_UP_ORDER_GATE_UP;
    else if (!strcmp(s, "interleaved"))
        *out = LS_GATE_UP_ORDER_INTERLEAVED;
    else
        return false;
    return true;
}

/* Copies tensor and the message into c->err (owned by the caller). */
/* Appends the violation (msg already formatted). With map, layer is an
 * index of the layer table: the checks write "layer %d: " with it, and
 * users know the checkpoint's numbers, so the field and that prefix are
 * given in them (unchanged without a checkpoint's numbers). */
static void ls_adapter_add(ls_adapter_ctx *c, bool map, ls_status code, int layer, const char *tensor, int axis,
                           int64_t expected, int64_t got, const char *hint, char *msg, size_t msg_len) {
    if (map && layer != LS_NA && c->dims->layer_ids) {
        const int id = ls_dims_layer_id(c->dims, layer);
        char prefix[32], text[320];
        int plen = snprintf(prefix, sizeof prefix, "layer %d: ", layer);
        if (plen > 0 && !strncmp(msg, prefix, (size_t)plen)) {
            snprintf(text, sizeof text, "layer %d: %s", id, msg + plen);
            snprintf(msg, msg_len, "%s", text);
        }
        layer = id;
    }
    ls_error_add(c->err, code, layer, tensor, axis, expected, got, hint, "%s", msg);
    if (!c->bad) c->first = code;
    c->bad++;
}

void ls_adapter_violation(ls_adapter_ctx *c, ls_status code, int layer, const char *tensor, int axis, int64_t expected,
                          int64_t got, const char *hint, const char *fmt, ...) {
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ls_adapter_add(c, true, code, layer, tensor, axis, expected, got, hint, msg, sizeof msg);
}

/* t is borrowed; i must be below its numel. */
float ls_adapter_value(const ls_tensor *t, size_t i) {
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case LS_DTYPE_F32: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    case LS_DTYPE_BF16:
        return ls_bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    case LS_DTYPE_F16:
        return ls_f16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    default:
        return 0.0f;
    }
}

/* vals is borrowed; nothing allocated. */
int64_t ls_adapter_mode(const int64_t *vals, size_t n) {
    int64_t best = 0;
    size_t best_count = 0;
    for (size_t i = 0; i < n; i++) {
        size_t count = 0;
        for (size_t j = 0; j < n; j++) count += vals[j] == vals[i];
        if (count > best_count) {
            best = vals[i];
            best_count = count;
        }
    }
    return best;
}

static const char *ls_other_format(ls_adapter_format f) { return f == LS_ADAPTER_FORMAT_POOL ? "peft" : "pool"; }

/* A name that is no factor we can take: say why, and how to fix it. */
static void ls_adapter_unknown(ls_adapter_ctx *c, const char *name, const ls_adapter_name *nm) {
    switch (nm->why) {
    case LS_AN_WHY_BAD_INDEX:
        ls_adapter_violation(c, LS_LORA_UNKNOWN_TENSOR, LS_NA, name, LS_NA, LS_NA, LS_NA,
                             "write the layer index as plain decimal digits: model.layers.{l}.mlp.shared_experts...",
                             "%s: the layer index is not a plain non-negative integer", name);
        break;
    case LS_AN_WHY_DORA:
        ls_adapter_violation(c, LS_LORA_UNKNOWN_TENSOR, LS_NA, name, LS_NA, LS_NA, LS_NA,
                             "train a plain LoRA adapter (use_dora false)",
                             "%s is a DoRA magnitude vector; DoRA adapters are not supported", name);
        break;
    case LS_AN_WHY_BIAS:
        ls_adapter_violation(c, LS_LORA_UNKNOWN_TENSOR, LS_NA, name, LS_NA, LS_NA, LS_NA,
                             "train the adapter without lora_bias: a LoRA delta here is B*A alone",
                             "%s is a bias of a LoRA factor (lora_bias); this server serves factors without bias",
                             name);
        break;
    case LS_AN_WHY_GATE:
        ls_adapter_violation(c, LS_LORA_UNKNOWN_TENSOR, LS_NA, name, LS_NA, LS_NA, LS_NA,
                             "save the adapter with PEFT's save_pretrained, which names the gate's factors "
                             "model.layers.{l}.mlp.shared_expert_gate.lora_A.weight [r, H] and lora_B.weight [1, r]",
                             "%s is a LoRA factor of the shared-expert gate in no form this server reads", name);
        break;
    case LS_AN_WHY_COPY:
        ls_adapter_violation(c, LS_LORA_UNKNOWN_TENSOR, LS_NA, name, LS_NA, LS_NA, LS_NA,
                             "train the shared experts with LoRA factors only: keep modules_to_save to modules "
                             "outside the shared-expert block (lm_head, embed_tokens, the router), or drop the "
                             "tensor if the module was not trained",
                             "%s is a trained copy of a shared-expert module's weight (PEFT saves one for a "
                             "modules_to_save entry that matches the module); this server loads LoRA factors only",
                             name);
        break;
    case LS_AN_WHY_SHARED_FORM:
        ls_adapter_violation(c, LS_LORA_UNKNOWN_TENSOR, LS_NA, name, LS_NA, LS_NA, LS_NA,
                             "name the factors model.layers.{l}.mlp.shared_experts.{gate_proj,up_proj,down_proj,"
                             "gate_up_proj}.lora_{A,B}.weight (PEFT; shared_expert for Qwen) or ...shared_experts."
                             "{gate_up_lora_a,gate_up_lora_b,down_lora_a,down_lora_b} (pool format)",
                             "%s names the shared experts but is not one of their LoRA factors", name);
        break;
    default:
        ls_adapter_violation(c, LS_LORA_UNKNOWN_TENSOR, LS_NA, name, LS_NA, LS_NA, LS_NA, NULL,
                             "%s is not a LoRA factor (expected model.layers.{l}.mlp.shared_experts."
                             "{gate_proj,up_proj,down_proj}.lora_{A,B}.weight or a pool buffer)",
                             name);
        break;
    }
}

/* Which format the names follow: the one most names use; on a tie, the
 * one the first such name uses. */
static ls_adapter_format ls_adapter_pick_format(const ls_tensor_set *s, ls_adapter_format asked, size_t *n_peft,
                                                size_t *n_pool) {
    ls_adapter_format first = LS_ADAPTER_FORMAT_AUTO;
    *n_peft = *n_pool = 0;
    for (size_t i = 0; i < s->n; i++) {
        ls_adapter_name nm;
        ls_adapter_name_parse(s->items[i].name, &nm);
        if (nm.kind == LS_AN_PEFT)
            (*n_peft)++;
        else if (nm.kind == LS_AN_POOL)
            (*n_pool)++;
        else
            continue;
        if (first == LS_ADAPTER_FORMAT_AUTO)
            first = nm.kind == LS_AN_PEFT ? LS_ADAPTER_FORMAT_PEFT : LS_ADAPTER_FORMAT_POOL;
    }
    if (asked != LS_ADAPTER_FORMAT_AUTO) return asked;
    if (*n_peft != *n_pool) return *n_peft > *n_pool ? LS_ADAPTER_FORMAT_PEFT : LS_ADAPTER_FORMAT_POOL;
    return first == LS_ADAPTER_FORMAT_AUTO ? LS_ADAPTER_FORMAT_PEFT : first;
}

/* A factor named for a layer that is not served: a dense layer of the
 * checkpoint (no shared experts), or one past the model. The layer is
 * given as named (the checkpoint's number), not as a served index. */
static void ls_adapter_layer_not_served(ls_adapter_ctx *c, const char *name, int64_t layer) {
    const ls_dims *d = c->dims;
    const int total = ls_dims_layers_total(d), as = layer <= INT32_MAX ? (int)layer : LS_NA;
    char served[128], hint[256], msg[320];
    ls_dims_layers_str(d, served, sizeof served);
    snprintf(hint, sizeof hint, "train the adapter on layers with shared experts (%s), or drop this factor", served);
    if (layer < total)
        snprintf(msg, sizeof msg,
                 "%s names layer %lld, a dense layer of the checkpoint (no shared experts); the layers with shared "
                 "experts are %s",
                 name, (long long)layer, served);
    else if (d->layer_ids)
        snprintf(msg, sizeof msg, "%s names layer %lld, but the checkpoint has %d layers (0..%d); those with shared "
                 "experts are %s", name, (long long)layer, total, total - 1, served);
    else
        snprintf(msg, sizeof msg, "%s names layer %lld, but the model has %d layers (0..%d)", name, (long long)layer,
                 total, total - 1);
    /* expected is the limit a layer number must stay under; a dense layer
     * is under it, and refused for another reason: no expected then. */
    ls_adapter_add(c, false, LS_LORA_LAYER_OUT_OF_RANGE, as, name, LS_NA, layer < total ? LS_NA : total, layer,
                   d->layer_ids ? hint : NULL, msg, sizeof msg);
}

/* See adapter_internal.h. */
bool ls_adapter_other_module(const char *name, int max, char *buf, size_t len) {
    const char *f = strstr(name, ".lora_");
    if (!f) return false;
    /* Cut on a character boundary: the text goes into JSON. */
    const int keep = f - name > max ? (int)ls_text_utf8_cut(name, (size_t)max) : (int)(f - name);
    snprintf(buf, len, "%.*s%s", keep, name, f - name > max ? "..." : "");
    return true;
}

/* A LoRA factor of another MLP than the shared experts (a dense layer's,
 * the routed experts'): skipped here like any other module's, but the
 * one a user most expects this server to apply, so the load says so. */
static void ls_adapter_note_mlp(ls_adapter_ctx *c, const char *name) {
    static const char *const mlps[] = {".mlp.", ".feed_forward.", ".block_sparse_moe."};
    bool mlp = false;
    for (size_t k = 0; k < sizeof mlps / sizeof *mlps; k++) mlp |= strstr(name, mlps[k]) != NULL;
    char *w = c->warnings[LS_WARN_SKIPPED_MLP], module[168];
    if (!mlp || w[0] || !ls_adapter_other_module(name, 160, module, sizeof module)) return;
    snprintf(w, sizeof c->warnings[LS_WARN_SKIPPED_MLP],
             "factors of MLP modules other than the shared experts (such as %s, a dense layer's or the routed "
             "experts') are skipped and listed in ignored: this server computes the shared experts only, so the "
             "engine must apply them",
             module);
}

/* Sorts every name: places the shared experts' factors of the chosen
 * format in the layer table, reports the rest. Returns how many names
 * are other modules' tensors (ignored unless strict). */
static size_t ls_adapter_place(ls_adapter_ctx *c, const ls_tensor_set *s, size_t n_peft, size_t n_pool) {
    size_t n_other = 0;
    const bool strict = c->params->strict;
    const bool asked = c->params->format != LS_ADAPTER_FORMAT_AUTO;
    const char *fname = ls_adapter_format_name(c->format);
    for (size_t i = 0; i < s->n; i++) {
        const char *name = s->items[i].name;
        ls_adapter_name nm;
        ls_adapter_name_parse(name, &nm);
        if (nm.kind == LS_AN_UNKNOWN) {
            ls_adapter_unknown(c, name, &nm);
            continue;
        }
        if (nm.kind == LS_AN_OTHER) {
            n_other++;
            if (nm.lora && !strict) ls_adapter_note_mlp(c, name);
            if (strict)
                ls_adapter_violation(c, LS_LORA_UNKNOWN_TENSOR, LS_NA, name, LS_NA, LS_NA, LS_NA,
                                     "remove it, or load without strict to have it skipped and listed in ignored",
                                     "%s is a %s of another module than the shared experts; strict mode refuses it",
                                     name, nm.lora ? "LoRA factor" : "saved tensor (not a LoRA factor)");
            continue;
        }
        ls_adapter_format f = nm.kind == LS_AN_PEFT ? LS_ADAPTER_FORMAT_PEFT : LS_ADAPTER_FORMAT_POOL;
        if (f != c->format) {
            char hint[256];
            if (asked) {
                snprintf(hint, sizeof hint, "drop it, or send format \"%s\" if the whole upload is in that format",
                         ls_other_format(c->format));
                ls_adapter_violation(c, LS_LORA_UNKNOWN_TENSOR, LS_NA, name, LS_NA, LS_NA, LS_NA, hint,
                                     "%s is a %s-format name, but the upload says format \"%s\"", name,
                                     ls_adapter_format_name(f), fname);
            } else {
                snprintf(hint, sizeof hint,
                         "upload one format at a time: convert the %s-format tensors to %s or "
                         "leave them out",
                         ls_adapter_format_name(f), fname);
                if (n_peft != n_pool)
                    ls_adapter_violation(c, LS_LORA_UNKNOWN_TENSOR, LS_NA, name, LS_NA, LS_NA, LS_NA, hint,
                                         "%s is a %s-format name in an upload that mixes formats; it is the minority "
                                         "(%zu peft names, %zu pool names), so the upload is taken as %s",
                                         name, ls_adapter_format_name(f), n_peft, n_pool, fname);
                else
                    ls_adapter_violation(c, LS_LORA_UNKNOWN_TENSOR, LS_NA, name, LS_NA, LS_NA, LS_NA, hint,
                                         "%s is a %s-format name in an upload that mixes formats (%zu names of "
                                         "each); the first factor name decides, so the upload is taken as %s",
                                         name, ls_adapter_format_name(f), n_peft, fname);
            }
            continue;
        }
        const int index = ls_dims_layer_index(c->dims, nm.layer);
        if (index < 0) {
            ls_adapter_layer_not_served(c, name, nm.layer);
            continue;
        }
        ls_adapter_in *slot = ls_adapter_at(c, index, nm.slot);
        if (slot->name) {
            ls_adapter_violation(c, LS_LORA_UNKNOWN_TENSOR, index, name, LS_NA, LS_NA, LS_NA,
                                 "upload each factor once, with or without the base_model.model. prefix",
                                 "%s names the same factor as %s", name, slot->name);
            continue;
        }
        slot->name = name;
        slot->t = &s->items[i].t;
        slot->prefixed = nm.prefixed;
        slot->module_len = nm.module_len;
    }
    return n_other;
}

/* dtype and byte count of every placed factor; marks the usable ones. */
static void ls_adapter_check_data(ls_adapter_ctx *c) {
    for (int l = 0; l < c->dims->L; l++) {
        for (int k = 0; k < LS_AD_SLOTS; k++) {
            const ls_adapter_in *in = ls_adapter_at(c, l, k);
            if (!in->name) continue;
            const ls_tensor *t = in->t;
            bool ok = true;
            if (!ls_dtype_is_float(t->dtype)) {
                ls_adapter_violation(c, LS_LORA_DTYPE_UNSUPPORTED, l, in->name, LS_NA, LS_NA, LS_NA, NULL,
                                     "layer %d: %s has dtype %s; LoRA factors must be F32, F16 or BF16", l, in->name,
                                     ls_dtype_name(t->dtype));
                ok = false;
            }
            int64_t numel = t->ndim >= 0 && t->ndim <= LS_MAX_DIMS ? ls_tensor_numel(t) : -1;
            size_t esize = ls_dtype_size(t->dtype);
            if (numel < 0) {
                ls_adapter_violation(c, LS_INVALID_SHAPE, l, in->name, LS_NA, LS_NA, LS_NA, NULL,
                                     "layer %d: %s has an invalid shape (negative or overflowing extents)", l,
                                     in->name);
                ok = false;
            } else if (esize) {
                /* need stays LS_NA when the byte count itself overflows */
                int64_t need = numel <= INT64_MAX / (int64_t)esize ? numel * (int64_t)esize : LS_NA;
                if (need == LS_NA || (uint64_t)need != (uint64_t)t->nbytes || (numel > 0 && !t->data)) {
                    ls_adapter_violation(c, LS_INVALID_SHAPE, l, in->name, LS_NA, need, (int64_t)t->nbytes, NULL,
                                         "layer %d: %s holds %zu bytes, but its shape and dtype need %lld", l, in->name,
                                         t->nbytes, (long long)need);
                    ok = false;
                }
            }
            c->sane[(size_t)l * LS_AD_SLOTS + (size_t)k] = ok;
        }
    }
}

/* NaN and Inf in the uploaded values (each usable factor, first index). */
static void ls_adapter_check_finite(ls_adapter_ctx *c) {
    for (int l = 0; l < c->dims->L; l++) {
        for (int k = 0; k < LS_AD_SLOTS; k++) {
            if (!ls_adapter_is_sane(c, l, k)) continue;
            const ls_adapter_in *in = ls_adapter_at(c, l, k);
            size_t numel = (size_t)ls_tensor_numel(in->t), bad = 0, first = 0;
            for (size_t i = 0; i < numel; i++) {
                if (!isfinite(ls_adapter_value(in->t, i))) {
                    if (!bad) first = i;
                    bad++;
                }
            }
            if (bad)
                ls_adapter_violation(c, LS_LORA_NONFINITE, l, in->name, LS_NA, LS_NA, LS_NA, NULL,
                                     "layer %d: %s holds %s at flat index %zu (%zu non-finite of %zu values)", l,
                                     in->name, isnan(ls_adapter_value(in->t, first)) ? "NaN" : "Inf", first, bad,
                                     numel);
        }
    }
}

/* The digest covers the data array as little-endian fp32 bytes, layer
 * after layer in the compact layout, so two uploads that normalise to the
 * same factors (PEFT or pool, any dtype) share a digest. */
void ls_adapter_digest(const float *data, size_t count, char hex[65]) {
    ls_sha256_ctx h;
    ls_sha256_init(&h);
    uint8_t buf[1024];
    size_t used = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t u;
        memcpy(&u, &data[i], 4);
        buf[used++] = (uint8_t)u;
        buf[used++] = (uint8_t)(u >> 8);
        buf[used++] = (uint8_t)(u >> 16);
        buf[used++] = (uint8_t)(u >> 24);
        if (used == sizeof buf) {
            ls_sha256_update(&h, buf, used);
            used = 0;
        }
    }
    ls_sha256_update(&h, buf, used);
    uint8_t digest[32];
    ls_sha256_final(&h, digest);
    ls_sha256_hex_digest(digest, hex);
}

size_t ls_adapter_host_bytes(const ls_adapter *a) {
    size_t bytes = (size_t)a->layers * a->layer_floats * sizeof(float) + (size_t)a->layers * sizeof(bool) +
                   (a->meta.n_ignored ? a->meta.n_ignored : 1) * sizeof(char *);
    for (size_t i = 0; i < a->meta.n_ignored; i++) bytes += strlen(a->ignored[i]) + 1;
    return bytes;
}

/* Each PEFT module's rank and scale per layer, as the checks settled
 * them; NULL when out of memory. */
static ls_adapter_modules *ls_adapter_modules_of(const ls_adapter_ctx *c) {
    const size_t L = (size_t)c->dims->L;
    ls_adapter_modules *m = calloc(1, sizeof *m);
    if (m) {
        m->rank = calloc(L * LS_MODS, sizeof *m->rank);
        m->scale = calloc(L * LS_MODS, sizeof *m->scale);
    }
    if (!m || !m->rank || !m->scale) {
        if (m) free(m->rank), free(m->scale);
        free(m);
        return NULL;
    }
    for (size_t l = 0; l < L; l++)
        for (int k = 0; k < LS_MODS; k++) {
            const ls_adapter_in *in = ls_adapter_at(c, (int)l, 2 * k);
            if (!in->name) in++;
            if (!in->name) continue;
            const ls_adapter_mod *md = ls_adapter_mod_at(c, (int)l, k);
            m->rank[l * LS_MODS + (size_t)k] = md->rank;
            m->scale[l * LS_MODS + (size_t)k] = md->scale;
            if (m->name[k][0]) continue;
            char module[192];
            const char *leaf = strrchr(ls_adapter_module_name(in, module, sizeof module), '.');
            snprintf(m->name[k], sizeof m->name[k], "%.31s", leaf ? leaf + 1 : module);
        }
    return m;
}

/* Writes the compact factors of every layer into a; false on a value
 * the scale pushed past the fp32 range (reported) or out of memory. */
static bool ls_adapter_build(ls_adapter_ctx *c, const ls_tensor_set *s, size_t n_other, ls_adapter *a) {
    const size_t L = (size_t)c->dims->L;
    if (c->rank < 1 || c->outer < 1) {
        ls_error_set(c->err, LS_INTERNAL, NULL, "adapter passed validation without a rank or outer layout");
        return false;
    }
    const ls_factor_layout lay = ls_factor_layout_of(c->dims, c->outer, c->rank);
    const bool gate = ls_adapter_has_gate(c);
    const size_t lf = ls_adapter_layer_floats(c->dims, c->outer, c->rank, gate);
    a->meta.format = c->format;
    a->meta.gate = gate;
    a->meta.rank = c->rank;
    a->meta.outer = c->outer;
    a->layers = (int)L;
    a->meta.scale = c->scale;
    a->layer_floats = lf;
    if (L > SIZE_MAX / sizeof(float) / lf) goto oom;
    a->data = calloc(L * lf, sizeof(float));
    a->layer_present = calloc(L, sizeof(bool));
    a->ignored = calloc(n_other ? n_other : 1, sizeof(char *));
    if (!a->data || !a->layer_present || !a->ignored) goto oom;

    bool overflow = false;
    for (size_t l = 0; l < L; l++) {
        bool any = false;
        for (int k = 0; k < LS_AD_SLOTS; k++) any |= ls_adapter_at(c, (int)l, k)->name != NULL;
        if (!any) continue;
        a->layer_present[l] = true;
        float *dst = a->data + l * lf;
        if (c->format == LS_ADAPTER_FORMAT_POOL)
            ls_adapter_pool_fill(c, (int)l, dst);
        else
            ls_adapter_peft_fill(c, (int)l, dst);
        /* The inputs were finite, so a value that is not came from the
         * scale pushing a B factor past the fp32 range. */
        for (int k = 0; k < LS_FACTORS; dst += lay.len[k], k++) {
            size_t i = 0;
            while (i < lay.len[k] && isfinite(dst[i])) i++;
            if (i == lay.len[k]) continue;
            const char *name = ls_adapter_source_of(c, (int)l, k, i);
            ls_adapter_violation(c, LS_LORA_NONFINITE, (int)l, name, LS_NA, LS_NA, LS_NA,
                                 "lower lora_alpha (or scale), or the magnitude of the B factors",
                                 "layer %zu: %s overflows fp32 once scaled", l, name);
            overflow = true;
        }
        /* dst is past the four factors: the gate's delta, when any. */
        for (size_t h = 0; gate && h < (size_t)c->dims->H; h++) {
            if (isfinite(dst[h])) continue;
            const char *name = ls_adapter_at(c, (int)l, LS_AD_SG_B)->name;
            ls_adapter_violation(c, LS_LORA_NONFINITE, (int)l, name, LS_NA, LS_NA, LS_NA,
                                 "lower lora_alpha (or scale), or the magnitude of the gate's factors",
                                 "layer %zu: %s times its lora_A overflows fp32 once scaled", l, name);
            overflow = true;
            break;
        }
    }
    if (overflow) return false;

    for (size_t i = 0; i < s->n; i++) {
        ls_adapter_name nm;
        ls_adapter_name_parse(s->items[i].name, &nm);
        if (nm.kind != LS_AN_OTHER) continue;
        char *copy = strdup(s->items[i].name);
        if (!copy) goto oom;
        a->ignored[a->meta.n_ignored++] = copy;
    }
    ls_adapter_digest(a->data, L * lf, a->meta.sha256);
    a->meta.bytes = ls_adapter_host_bytes(a);
    if (c->format == LS_ADAPTER_FORMAT_PEFT && !(a->modules = ls_adapter_modules_of(c))) goto oom;
    memcpy(a->warnings, c->warnings, sizeof a->warnings);
    if (c->params && c->params->config_note[0])
        snprintf(a->warnings[LS_WARN_CONFIG_KEY], sizeof a->warnings[LS_WARN_CONFIG_KEY], "%s", c->params->config_note);
    /* Names cut to fit (a module's, a key's) may end inside a character;
     * every reply and the state record carry these as JSON strings. */
    for (int k = 0; k < LS_ADAPTER_WARNINGS; k++) ls_text_utf8_repair(a->warnings[k]);
    return true;

oom:
    ls_error_set(c->err, LS_INTERNAL, NULL, "out of memory normalising an adapter of %zu layers", L);
    return false;
}

/* No factor of the shared experts: an upload of nothing we know, or
 * factors of other modules only, most often PEFT's target_modules sent
 * to the routed experts' fused parameters (transformers 5). The message
 * names one module the file does train; the hint how PEFT reaches this
 * model's shared experts, when its family says. */
static void ls_adapter_report_empty(ls_adapter_ctx *c, const ls_tensor_set *s, const ls_dims *dims, size_t n_other) {
    char example[160] = "", module[128], hint[512];
    for (size_t i = 0; i < s->n && !example[0]; i++) {
        ls_adapter_name nm;
        ls_adapter_name_parse(s->items[i].name, &nm);
        if (nm.kind == LS_AN_OTHER && nm.lora && ls_adapter_other_module(s->items[i].name, 120, module, sizeof module))
            snprintf(example, sizeof example, ", such as %s", module);
    }
    if (!n_other)
        snprintf(hint, sizeof hint,
                 "upload factors named model.layers.{l}.mlp.shared_experts.gate_proj.lora_A.weight (and lora_B, "
                 "up_proj, down_proj; or the fused gate_up_proj) or the four pool buffers of a layer");
    else if (dims->peft_targets)
        snprintf(hint, sizeof hint,
                 "train on the shared experts: on this model PEFT reaches them with LoraConfig(%s) "
                 "(docs/adapters.md lists each family's)",
                 dims->peft_targets);
    else
        snprintf(hint, sizeof hint,
                 "train on the shared experts: where target_modules=[\"gate_proj\", \"up_proj\", \"down_proj\"] "
                 "reaches the routed experts (DeepSeek, GLM, Qwen3-Next and others), use "
                 "target_parameters=[\"mlp.shared_experts.gate_proj.weight\", ...] (docs/adapters.md lists each "
                 "family's)");
    ls_adapter_violation(c, LS_LORA_EMPTY, LS_NA, NULL, LS_NA, LS_NA, LS_NA, hint,
                         "the upload holds no LoRA factor of the shared experts (%zu tensors: %zu tensors of other "
                         "modules%s%s)",
                         s->n, n_other, n_other && !c->params->strict ? ", skipped" : "", example);
}

/* tensors, params, dims and pool are borrowed and not kept: out owns copies
 * of everything it needs (free with ls_adapter_free); err is the caller's. */
ls_status ls_adapter_normalise(const ls_tensor_set *tensors, const ls_adapter_params *params, const ls_dims *dims,
                               const ls_pool_dims *pool, ls_adapter *out, ls_error *err) {
    if (out) memset(out, 0, sizeof *out);
    if (!tensors || !dims || !pool || !out)
        return ls_error_set(err, LS_INTERNAL, NULL, "ls_adapter_normalise: missing argument");
    if (dims->n < 1 || dims->H < 1 || dims->F < 1 || dims->L < 1 || pool->max_rank < 1)
        return ls_error_set(err, LS_INTERNAL, NULL, "ls_adapter_normalise: invalid model or pool dimensions");
    static const ls_adapter_params defaults = {0};
    if (!params) params = &defaults;

    ls_adapter_ctx c = {.params = params, .dims = dims, .pool = pool, .err = err, .tensors = tensors};
    if (params->r < 0)
        ls_adapter_violation(&c, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, params->r, NULL,
                             "r is %d; it must be a positive integer", params->r);
    if (params->has_alpha && !isfinite(params->lora_alpha))
        ls_adapter_violation(&c, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA, NULL,
                             "lora_alpha is not a finite number");
    if (params->has_scale && !isfinite(params->scale))
        ls_adapter_violation(&c, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA,
                             "give scale as a finite number, or leave it out for factors already scaled",
                             "scale is not a finite number");

    c.in = calloc((size_t)dims->L * LS_AD_SLOTS, sizeof *c.in);
    c.sane = calloc((size_t)dims->L * LS_AD_SLOTS, sizeof *c.sane);
    c.mods = calloc((size_t)dims->L * LS_MODS, sizeof *c.mods);
    ls_peft_rules *rules = NULL;
    if (!c.in || !c.sane || !c.mods || ls_peft_rules_load(params->peft, &rules, err) != LS_OK) {
        free(c.in);
        free(c.sane);
        free(c.mods);
        return ls_error_set(err, LS_INTERNAL, NULL, "out of memory validating an adapter");
    }
    c.rules = rules;

    size_t n_peft, n_pool;
    c.format = ls_adapter_pick_format(tensors, params->format, &n_peft, &n_pool);
    size_t n_other = ls_adapter_place(&c, tensors, n_peft, n_pool);
    if (c.format == LS_ADAPTER_FORMAT_POOL)
        ls_adapter_pool_check(&c);
    else
        ls_adapter_peft_check(&c);
    /* A PEFT upload's scale (lora_alpha, or scale instead) is settled
     * with its ranks, in lora/adapter_peft.c. */
    /* Pool buffers have one fixed order; a stated other one means the
     * client expects a reordering that would not happen. */
    if (c.format == LS_ADAPTER_FORMAT_POOL && params->has_order && params->gate_up_order != LS_GATE_UP_ORDER_GATE_UP)
        ls_adapter_violation(&c, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA,
                             "pool-format gate_up_lora_b holds each expert's F gate rows then its F up rows; "
                             "reorder the rows before upload, or drop gate_up_order",
                             "gate_up_order \"%s\" applies to PEFT factors only",
                             ls_gate_up_order_name(params->gate_up_order));
    /* Pool buffers are used as they are, times scale: PEFT's scale terms
     * stated with them would be dropped without a word. */
    const char *peft_term = params->has_alpha ? "lora_alpha"
                            : params->has_rslora && params->use_rslora ? "use_rslora"
                                                                        : ls_peft_rules_scaling(rules);
    if (c.format == LS_ADAPTER_FORMAT_POOL && peft_term)
        ls_adapter_violation(&c, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA,
                             "pool-format factors are used as they are, times scale (1 when not given): fold the "
                             "scale into gate_up_lora_b and down_lora_b, or send scale = lora_alpha / r (/ sqrt(r) "
                             "with rsLoRA) in place of PEFT's terms",
                             "%s applies to PEFT factors only, and these are pool-format", peft_term);
    ls_adapter_check_data(&c);
    ls_adapter_check_finite(&c);
    if (n_peft + n_pool == 0) ls_adapter_report_empty(&c, tensors, dims, n_other);

    ls_status st = LS_OK;
    if (c.bad || !ls_adapter_build(&c, tensors, n_other, out)) {
        st = c.bad ? c.first : LS_INTERNAL;
        ls_adapter_free(out);
    }
    free(c.in);
    free(c.sane);
    free(c.mods);
    ls_peft_rules_free(rules);
    return st;
}

/* a is borrowed; the caller owns the four buffers, each fully written
 * (zeros past the adapter's rank and for absent layers). */
void ls_adapter_expand(const ls_adapter *a, int layer, const ls_dims *dims, const ls_pool_dims *pool, float *gu_a,
                       float *gu_b, float *d_a, float *d_b) {
    memset(gu_a, 0, ls_pool_gu_a_len(dims, pool) * sizeof(float));
    memset(gu_b, 0, ls_pool_gu_b_len(dims, pool) * sizeof(float));
    memset(d_a, 0, ls_pool_d_a_len(dims, pool) * sizeof(float));
    memset(d_b, 0, ls_pool_d_b_len(dims, pool) * sizeof(float));
    const size_t R = (size_t)pool->max_rank, O = (size_t)ls_pool_outer(dims, pool);
    assert(!a || a->meta.rank <= pool->max_rank);
    assert(!a || a->meta.outer <= 1 || (size_t)a->meta.outer == O);
    if (!a || !a->data || layer < 0 || layer >= a->layers || a->meta.rank < 1 || (size_t)a->meta.rank > R) return;

    const size_t n = (size_t)dims->n, H = (size_t)dims->H, F = (size_t)dims->F;
    const size_t r = (size_t)a->meta.rank, Os = (size_t)a->meta.outer;
    const ls_factor_layout lay = ls_factor_layout_of(dims, a->meta.outer, a->meta.rank);
    const float *s = a->data + (size_t)layer * a->layer_floats;
    const float *s_gu_a = s + lay.off[LS_FACTOR_GU_A], *s_gu_b = s + lay.off[LS_FACTOR_GU_B];
    const float *s_d_a = s + lay.off[LS_FACTOR_D_A], *s_d_b = s + lay.off[LS_FACTOR_D_B];

    for (size_t o = 0; o < O; o++) {
        /* Shared outer factors (O' = 1) are broadcast to every expert. */
        size_t so = Os == 1 ? 0 : (o < Os ? o : Os - 1);
        for (size_t k = 0; k < r; k++) {
            memcpy(gu_a + (o * 2 * R + k) * H, s_gu_a + (so * 2 * r + k) * H, H * sizeof(float));
            memcpy(gu_a + (o * 2 * R + R + k) * H, s_gu_a + (so * 2 * r + r + k) * H, H * sizeof(float));
        }
        for (size_t h = 0; h < H; h++) memcpy(d_b + (o * H + h) * R, s_d_b + (so * H + h) * r, r * sizeof(float));
    }
    for (size_t row = 0; row < n * 2 * F; row++) memcpy(gu_b + row * R, s_gu_b + row * r, r * sizeof(float));
    for (size_t e = 0; e < n; e++) memcpy(d_a + e * R * F, s_d_a + e * r * F, r * F * sizeof(float));
}

size_t ls_adapter_layer_floats(const ls_dims *dims, int outer, int rank, bool gate) {
    return ls_factor_layout_of(dims, outer, rank).total + (gate ? (size_t)dims->H : 0);
}

/* Borrowed from a. */
const float *ls_adapter_gate(const ls_adapter *a, int layer, const ls_dims *dims) {
    if (!a || !a->meta.gate || !a->data || layer < 0 || layer >= a->layers) return NULL;
    const size_t H = (size_t)dims->H;
    const float *g = a->data + (size_t)layer * a->layer_floats + a->layer_floats - H;
    for (size_t h = 0; h < H; h++)
        if (g[h] != 0.0f) return g;
    return NULL;
}

/* Frees what a owns and zeroes it; safe on a zeroed or freed adapter. */
void ls_adapter_free(ls_adapter *a) {
    if (!a) return;
    free(a->data);
    free(a->layer_present);
    for (size_t i = 0; i < a->meta.n_ignored; i++) free(a->ignored[i]);
    free(a->ignored);
    if (a->modules) free(a->modules->rank), free(a->modules->scale);
    free(a->modules);
    memset(a, 0, sizeof *a);
}
