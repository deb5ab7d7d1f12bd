/* Test checkpoints in each family's layout (ckpt_writer.h). The config
 * keys and names follow each family's modeling code; the layer rules give
 * each family at least one dense layer where it has dense layers. */
#include "tests/util/ckpt_writer.h"

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/text.h"
#include "tests/util/testutil.h"

typedef struct {
    const char *name, *model_type, *arch, *prefix, *module;
    bool gate, vl;
    int layers;
    int ids[CK_MAX_LAYERS], L, dense;
} ck_desc;

/* The families, their layouts, and the layers their config below gives
 * shared experts. */
static const ck_desc CK[CK_FAMILIES] = {
    [CK_DEEPSEEK_V3] = {"deepseek_v3", "deepseek_v3", "DeepseekV3ForCausalLM", "model.layers.", "mlp.shared_experts.",
                        false, false, 4, {1, 2, 3}, 3, 0},
    [CK_KIMI_K2] = {"deepseek_v3", "kimi_k2", "DeepseekV3ForCausalLM", "model.layers.", "mlp.shared_experts.", false,
                    false, 4, {1, 2, 3}, 3, 0},
    [CK_DEEPSEEK_V2] = {"deepseek_v2", "deepseek_v2", "DeepseekV2ForCausalLM", "model.layers.", "mlp.shared_experts.",
                        false, false, 5, {2, 4}, 2, 3},
    [CK_GLM4_MOE] = {"glm4_moe", "glm4_moe", "Glm4MoeForCausalLM", "model.layers.", "mlp.shared_experts.", false, false,
                     4, {2, 3}, 2, 1},
    [CK_DOTS1] = {"dots1", "dots1", "Dots1ForCausalLM", "model.layers.", "mlp.shared_experts.", false, false, 3, {1, 2},
                  2, 0},
    [CK_ERNIE4_5_MOE] = {"ernie4_5_moe", "ernie4_5_moe", "Ernie4_5_MoeForCausalLM", "model.layers.",
                         "mlp.shared_experts.", false, false, 5, {1, 3}, 2, 2},
    [CK_BAILING_MOE] = {"bailing_moe", "bailing_moe", "BailingMoeForCausalLM", "model.layers.", "mlp.shared_experts.",
                        false, false, 3, {1, 2}, 2, 0},
    [CK_QWEN2_MOE] = {"qwen2_moe", "qwen2_moe", "Qwen2MoeForCausalLM", "model.layers.", "mlp.shared_expert.", true,
                      false, 4, {0, 1, 3}, 3, 2},
    [CK_QWEN3_NEXT] = {"qwen3_next", "qwen3_next", "Qwen3NextForCausalLM", "model.layers.", "mlp.shared_expert.", true,
                       false, 4, {1, 3}, 2, 0},
    [CK_QWEN3_5_MOE] = {"qwen3_5_moe", "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration",
                        "model.language_model.layers.", "mlp.shared_expert.", true, true, 2, {0, 1}, 2, -1},
    [CK_LLAMA4] = {"llama4", "llama4", "Llama4ForConditionalGeneration", "language_model.model.layers.",
                   "feed_forward.shared_expert.", false, true, 4, {1, 3}, 2, 0},
    [CK_GRANITEMOEHYBRID] = {"granitemoehybrid", "granitemoehybrid", "GraniteMoeHybridForCausalLM", "model.layers.",
                             "shared_mlp.", false, false, 3, {0, 1, 2}, 3, -1},
};

const char *ck_family_name(ck_family f) { return CK[f].model_type; }

/* ---- config.json ------------------------------------------------------------- */

static void ck_set(json_t *o, const char *key, json_t *v) { assert_int_equal(json_object_set_new(o, key, v), 0); }

/* The family's own keys, as its configuration class names them. */
static void ck_family_keys(ck_family f, const ck_spec *s, json_t *k) {
    const int F = s->F;
    switch (f) {
    case CK_DEEPSEEK_V3:
    case CK_KIMI_K2:
        ck_set(k, "n_shared_experts", json_integer(2));
        ck_set(k, "moe_intermediate_size", json_integer(F / 2));
        ck_set(k, "n_routed_experts", json_integer(4));
        ck_set(k, "first_k_dense_replace", json_integer(1));
        ck_set(k, "moe_layer_freq", json_integer(1));
        ck_set(k, "num_nextn_predict_layers", json_integer(1));
        break;
    case CK_DEEPSEEK_V2:
        ck_set(k, "n_shared_experts", json_integer(1));
        ck_set(k, "moe_intermediate_size", json_integer(F));
        ck_set(k, "n_routed_experts", json_integer(4));
        ck_set(k, "first_k_dense_replace", json_integer(1));
        ck_set(k, "moe_layer_freq", json_integer(2));
        break;
    case CK_GLM4_MOE:
        ck_set(k, "n_shared_experts", json_integer(1));
        ck_set(k, "moe_intermediate_size", json_integer(F));
        ck_set(k, "n_routed_experts", json_integer(4));
        ck_set(k, "first_k_dense_replace", json_integer(2));
        break;
    case CK_DOTS1:
        ck_set(k, "n_shared_experts", json_integer(2));
        ck_set(k, "moe_intermediate_size", json_integer(F / 2));
        ck_set(k, "n_routed_experts", json_integer(4));
        ck_set(k, "first_k_dense_replace", json_integer(1));
        break;
    case CK_ERNIE4_5_MOE:
        ck_set(k, "moe_num_shared_experts", json_integer(2));
        ck_set(k, "moe_intermediate_size", json_integer(F / 2));
        ck_set(k, "moe_num_experts", json_integer(4));
        ck_set(k, "moe_layer_start_index", json_integer(1));
        ck_set(k, "moe_layer_end_index", json_integer(3));
        ck_set(k, "moe_layer_interval", json_integer(2));
        break;
    case CK_BAILING_MOE:
        ck_set(k, "num_shared_experts", json_integer(1));
        ck_set(k, "moe_intermediate_size", json_integer(F));
        ck_set(k, "num_experts", json_integer(4));
        ck_set(k, "first_k_dense_replace", json_integer(1));
        break;
    case CK_QWEN2_MOE:
        ck_set(k, "shared_expert_intermediate_size", json_integer(F));
        ck_set(k, "num_experts", json_integer(4));
        ck_set(k, "decoder_sparse_step", json_integer(1));
        ck_set(k, "mlp_only_layers", json_pack("[i]", 2));
        break;
    case CK_QWEN3_NEXT:
        ck_set(k, "shared_expert_intermediate_size", json_integer(F));
        ck_set(k, "num_experts", json_integer(4));
        ck_set(k, "decoder_sparse_step", json_integer(2));
        ck_set(k, "mlp_only_layers", json_array());
        break;
    case CK_QWEN3_5_MOE:
        ck_set(k, "shared_expert_intermediate_size", json_integer(F));
        ck_set(k, "num_experts", json_integer(4));
        ck_set(k, "model_type", json_string("qwen3_5_moe_text"));
        break;
    case CK_GRANITEMOEHYBRID:
        ck_set(k, "shared_intermediate_size", json_integer(F));
        ck_set(k, "num_local_experts", json_integer(4));
        ck_set(k, "layer_types", json_pack("[s, s, s]", "mamba", "attention", "mamba"));
        break;
    case CK_LLAMA4:
        ck_set(k, "intermediate_size", json_integer(F));
        ck_set(k, "intermediate_size_mlp", json_integer(2 * F));
        ck_set(k, "num_local_experts", json_integer(4));
        ck_set(k, "interleave_moe_layer_step", json_integer(2));
        ck_set(k, "model_type", json_string("llama4_text"));
        break;
    default: fail();
    }
}

/* The family's layout, with spec's layer count where it may differ. */
static ck_desc ck_desc_of(const ck_spec *s) {
    ck_desc d = CK[s->family];
    if (s->layers > 0 && s->family == CK_DEEPSEEK_V3) {
        assert_true(s->layers <= CK_MAX_LAYERS);
        d.layers = s->layers;
        d.L = s->layers - 1;
        for (int i = 0; i < d.L; i++) d.ids[i] = i + 1;
    }
    return d;
}

static void ck_write_config(const char *dir, const ck_spec *s) {
    const ck_desc dd = ck_desc_of(s), *d = &dd;
    json_t *c = json_object(), *k = d->vl ? json_object() : c;
    assert_non_null(c);
    assert_non_null(k);
    ck_set(c, "model_type", json_string(d->model_type));
    ck_set(c, "architectures", json_pack("[s]", d->arch));
    ck_set(k, "hidden_size", json_integer(s->H));
    ck_set(k, "num_hidden_layers", json_integer(d->layers));
    ck_set(k, "num_attention_heads", json_integer(2));
    ck_set(k, "vocab_size", json_integer(64));
    if (s->family != CK_LLAMA4) ck_set(k, "intermediate_size", json_integer(2 * s->F));
    ck_set(k, "torch_dtype", json_string(s->dtype == LS_DTYPE_BF16 ? "bfloat16" : s->dtype == LS_DTYPE_F16 ? "float16"
                                                                                                             : "float32"));
    ck_family_keys(s->family, s, k);
    if (d->vl) {
        ck_set(c, "text_config", k);
        ck_set(c, "vision_config", json_pack("{s:i}", "hidden_size", 32));
    }
    if (s->fp8)
        ck_set(c, "quantization_config",
               json_pack("{s:s, s:s, s:s, s:[i, i]}", "quant_method", "fp8", "fmt", "e4m3", "activation_scheme",
                         "dynamic", "weight_block_size", s->fp8_block[0], s->fp8_block[1]));
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(json_dump_file(c, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER), 0);
    json_decref(c);
}

/* ---- the tensors ---------------------------------------------------------------- */

/* Every tensor of the checkpoint, in the order it is written. */
typedef struct {
    ck_tensor *t;
    int n, cap;
    void **owned; /* data buffers to free */
    int n_owned;
} ck_list;

static ck_tensor *ck_add(ck_list *l, ls_dtype dt, int ndim, int64_t a, int64_t b, const void *data, const char *fmt,
                         ...) __attribute__((format(printf, 7, 8)));
static ck_tensor *ck_add(ck_list *l, ls_dtype dt, int ndim, int64_t a, int64_t b, const void *data, const char *fmt,
                         ...) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->t = realloc(l->t, (size_t)l->cap * sizeof *l->t);
        l->owned = realloc(l->owned, (size_t)l->cap * sizeof *l->owned);
        assert_true(l->t && l->owned);
    }
    ck_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->dtype = dt;
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = b;
    t->data = data;
    if (data) l->owned[l->n_owned++] = (void *)data;
    return t;
}

/* An independent decoding of FP8 E4M3 (no infinities; 0x7f is NaN). */
static double ck_e4m3(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? m / 8.0 * pow(2, -6) : (1 + m / 8.0) * pow(2, e - 7);
    return b & 0x80 ? -v : v;
}

/* Rounds v (fp32) to bf16, by its bits, round to nearest even. */
static double ck_bf16(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A served [rows, cols] tensor with random values at the spec's dtype (or
 * FP8 with its scale); vals receives them as the server must see them. */
static void ck_served(ck_list *l, const ck_spec *s, int64_t rows, int64_t cols, double scale, uint64_t *st,
                      double *vals, uint64_t *bytes, const char *name) {
    const size_t count = (size_t)(rows * cols);
    if (s->fp8) {
        uint8_t *q = ls_test_calloc(count, 1);
        const int64_t sr = (rows + s->fp8_block[0] - 1) / s->fp8_block[0], sc = (cols + s->fp8_block[1] - 1) / s->fp8_block[1];
        float *sv = ls_test_calloc((size_t)(sr * sc), sizeof(float));
        for (size_t i = 0; i < (size_t)(sr * sc); i++) sv[i] = (float)((1 + (ls_splitmix64(st) >> 61)) * scale / 64.0);
        for (size_t i = 0; i < count; i++) {
            do q[i] = (uint8_t)ls_splitmix64(st);
            while ((q[i] & 0x7f) == 0x7f || ((q[i] >> 3) & 15) > 11); /* no NaN; |q| < 32 */
            const int64_t r = (int64_t)i / cols, c = (int64_t)i % cols;
            if (vals) vals[i] = ck_bf16((float)(ck_e4m3(q[i]) * sv[(r / s->fp8_block[0]) * sc + c / s->fp8_block[1]]));
        }
        ck_add(l, LS_DTYPE_F8_E4M3, 2, rows, cols, q, "%s", name);
        ck_add(l, LS_DTYPE_F32, 2, sr, sc, sv, "%s_scale_inv", name);
        *bytes += count + (uint64_t)(sr * sc) * 4;
        return;
    }
    float *f = ls_test_calloc(count, sizeof(float));
    for (size_t i = 0; i < count; i++)
        f[i] = (float)(((double)(ls_splitmix64(st) >> 11) / 9007199254740992.0 * 2 - 1) * scale);
    ls_round_to_dtype(s->dtype, f, count);
    for (size_t i = 0; vals && i < count; i++) vals[i] = f[i];
    void *data = ls_test_calloc(count, ls_dtype_size(s->dtype));
    ls_convert_from_f32(s->dtype, f, count, data);
    free(f);
    ck_add(l, s->dtype, 2, rows, cols, data, "%s", name);
    *bytes += count * ls_dtype_size(s->dtype);
}

static bool ck_fused(ck_family f) { return f == CK_GRANITEMOEHYBRID; }

/* Layer l's shared experts: gate_proj and up_proj into w13 [2F, H], down_proj
 * into w2, the gate when the family has one. */
static void ck_shared(ck_list *lst, const ck_spec *s, int l, int i, uint64_t *st, ck_model *m) {
    const ck_desc *d = &CK[s->family];
    const int H = s->H, F = s->F;
    double *w13 = m && i >= 0 ? (m->w13[i] = ls_test_calloc((size_t)2 * F * H, sizeof(double))) : NULL;
    double *w2 = m && i >= 0 ? (m->w2[i] = ls_test_calloc((size_t)H * F, sizeof(double))) : NULL;
    char name[256];
    uint64_t bytes = 0;
    if (ck_fused(s->family)) { /* one [2F, H]: gate rows, then up rows */
        snprintf(name, sizeof name, "%s%d.%sinput_linear.weight", d->prefix, l, d->module);
        ck_served(lst, s, 2 * F, H, 1.0 / sqrt(H), st, w13, &bytes, name);
    } else {
        snprintf(name, sizeof name, "%s%d.%sgate_proj.weight", d->prefix, l, d->module);
        ck_served(lst, s, F, H, 1.0 / sqrt(H), st, w13, &bytes, name);
        snprintf(name, sizeof name, "%s%d.%sup_proj.weight", d->prefix, l, d->module);
        ck_served(lst, s, F, H, 1.0 / sqrt(H), st, w13 ? w13 + (size_t)F * H : NULL, &bytes, name);
    }
    snprintf(name, sizeof name, "%s%d.%s%s.weight", d->prefix, l, d->module,
             ck_fused(s->family) ? "output_linear" : "down_proj");
    ck_served(lst, s, H, F, 1.0 / sqrt(F), st, w2, &bytes, name);
    if (d->gate) {
        ck_spec plain = *s;
        plain.fp8 = false; /* the gate is never block-quantized */
        double *g = m && i >= 0 ? (m->gatew[i] = ls_test_calloc((size_t)H, sizeof(double))) : NULL;
        snprintf(name, sizeof name, "%s%d.mlp.shared_expert_gate.weight", d->prefix, l);
        ck_served(lst, &plain, 1, H, 3.0 / sqrt(H), st, g, &bytes, name);
    }
    if (m && i >= 0) m->shared_bytes += bytes;
}

/* One decoder layer: what every checkpoint has, then the MLP. */
static void ck_layer(ck_list *lst, const ck_spec *s, int l, int i, uint64_t *st, ck_model *m) {
    const ck_desc dd = ck_desc_of(s), *d = &dd;
    const ls_dtype dt = s->dtype;
    const int H = s->H, F = s->F;
    const char *p = d->prefix;
    const char *mlp = s->family == CK_LLAMA4 ? "feed_forward" : "mlp";
    ck_add(lst, dt, 1, H, 0, NULL, "%s%d.input_layernorm.weight", p, l);
    ck_add(lst, dt, 2, H / 2, H, NULL, "%s%d.self_attn.q_proj.weight", p, l);
    ck_add(lst, dt, 2, H, H / 2, NULL, "%s%d.self_attn.o_proj.weight", p, l);
    ck_add(lst, dt, 1, H, 0, NULL, "%s%d.post_attention_layernorm.weight", p, l);
    if (ck_fused(s->family)) { /* Granite's MoE block, its experts fused, beside the shared MLP */
        ck_add(lst, dt, 2, 4, H, NULL, "%s%d.block_sparse_moe.router.layer.weight", p, l);
        ck_add(lst, dt, 2, 4 * F, H, NULL, "%s%d.block_sparse_moe.input_linear.weight", p, l);
        ck_add(lst, dt, 2, 4 * H, F / 2, NULL, "%s%d.block_sparse_moe.output_linear.weight", p, l);
        ck_shared(lst, s, l, i, st, m);
        return;
    }
    if (i < 0 && l < d->layers) { /* a dense layer */
        ck_add(lst, dt, 2, 2 * F, H, NULL, "%s%d.%s.gate_proj.weight", p, l, mlp);
        ck_add(lst, dt, 2, 2 * F, H, NULL, "%s%d.%s.up_proj.weight", p, l, mlp);
        ck_add(lst, dt, 2, H, 2 * F, NULL, "%s%d.%s.down_proj.weight", p, l, mlp);
        return;
    }
    ck_add(lst, dt, 2, 4, H, NULL, "%s%d.%s.%s.weight", p, l, mlp, s->family == CK_LLAMA4 ? "router" : "gate");
    for (int e = 0; e < 2; e++) {
        ck_add(lst, dt, 2, F / 2, H, NULL, "%s%d.%s.experts.%d.gate_proj.weight", p, l, mlp, e);
        ck_add(lst, dt, 2, F / 2, H, NULL, "%s%d.%s.experts.%d.up_proj.weight", p, l, mlp, e);
        ck_add(lst, dt, 2, H, F / 2, NULL, "%s%d.%s.experts.%d.down_proj.weight", p, l, mlp, e);
    }
    if (s->decoy_bytes)
        ck_add(lst, dt, 2, (int64_t)(s->decoy_bytes / ((uint64_t)H * ls_dtype_size(dt))), H, NULL,
               "%s%d.%s.experts.gate_up_proj", p, l, mlp);
    ck_shared(lst, s, l, i, st, m);
}

/* ---- writing ----------------------------------------------------------------------- */

void ck_write_safetensors(const char *path, const ck_tensor *t, int n) {
    json_t *h = json_object();
    ck_set(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int a = 0; a < t[i].ndim; a++) json_array_append_new(shape, json_integer(t[i].shape[a]));
        uint64_t nb = ls_dtype_size(t[i].dtype);
        for (int a = 0; a < t[i].ndim; a++) nb *= (uint64_t)t[i].shape[a];
        ck_set(h, t[i].name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", ls_dtype_name(t[i].dtype), "shape", shape,
                                       "data_offsets", (json_int_t)off, (json_int_t)(off + nb)));
        off += nb;
    }
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    assert_non_null(text);
    size_t hl = strlen(text), padded = (hl + 7) & ~(size_t)7;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    char *hdr = ls_test_calloc(padded, 1);
    memset(hdr, ' ', padded);
    memcpy(hdr, text, hl);
    assert_int_equal(pwrite(fd, len8, 8, 0), 8);
    assert_int_equal(pwrite(fd, hdr, padded, 8), (ssize_t)padded);
    off = 8 + padded;
    for (int i = 0; i < n; i++) {
        uint64_t nb = ls_dtype_size(t[i].dtype);
        for (int a = 0; a < t[i].ndim; a++) nb *= (uint64_t)t[i].shape[a];
        if (t[i].data) assert_int_equal(pwrite(fd, t[i].data, nb, (off_t)off), (ssize_t)nb);
        off += nb;
    }
    assert_int_equal(ftruncate(fd, (off_t)off), 0); /* zeros past the last write stay holes */
    close(fd);
    free(hdr);
    free(text);
}

static uint64_t ck_bytes(const ck_tensor *t) {
    uint64_t nb = ls_dtype_size(t->dtype);
    for (int a = 0; a < t->ndim; a++) nb *= (uint64_t)t->shape[a];
    return nb;
}

/* The tensors in order into spec->shards files of about equal size (a
 * layer may straddle two), with the index; or one model.safetensors. */
static void ck_write_files(const char *dir, const ck_spec *s, const ck_list *lst, ck_model *m) {
    char path[4300];
    if (s->shards == 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        ck_write_safetensors(path, lst->t, lst->n);
        m->n_files = 1;
        return;
    }
    uint64_t total = 0, at = 0;
    for (int i = 0; i < lst->n; i++) total += ck_bytes(&lst->t[i]);
    json_t *map = json_object();
    int first = 0;
    for (int k = 0; k < s->shards; k++) {
        int end = first;
        while (end < lst->n && (k == s->shards - 1 || at < total / (uint64_t)s->shards * (uint64_t)(k + 1)))
            at += ck_bytes(&lst->t[end++]);
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, s->shards);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        ck_write_safetensors(path, lst->t + first, end - first);
        for (int i = first; i < end; i++) ck_set(map, lst->t[i].name, json_string(name));
        first = end;
    }
    m->n_files = s->shards;
    /* metadata as save_pretrained writes it, empty, or absent */
    json_t *index = json_object();
    if (s->shards % 3 == 1) ck_set(index, "metadata", json_pack("{s:I}", "total_size", (json_int_t)total));
    else if (s->shards % 3 == 2) ck_set(index, "metadata", json_object());
    ck_set(index, "weight_map", map);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    assert_int_equal(json_dump_file(index, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER), 0);
    json_decref(index);
}

void ck_write(const char *dir, const ck_spec *s, ck_model *m) {
    const ck_desc dd = ck_desc_of(s), *d = &dd;
    memset(m, 0, sizeof *m);
    *m = (ck_model){.family = d->name, .model_type = d->model_type, .prefix = d->prefix, .module = d->module,
                    .fused = ck_fused(s->family), .layers_total = d->layers, .L = d->L, .dense = d->dense,
                    .gate = d->gate};
    memcpy(m->ids, d->ids, sizeof m->ids);
    ck_write_config(dir, s);
    ck_list lst = {0};
    uint64_t st = s->seed;
    const char *root = !strcmp(d->prefix, "model.layers.") ? "model." : !strcmp(d->prefix, "model.language_model.layers.")
                                                                           ? "model.language_model."
                                                                           : "language_model.model.";
    ck_add(&lst, s->dtype, 2, 64, s->H, NULL, "%sembed_tokens.weight", root);
    for (int l = 0; l < d->layers; l++) {
        int i = -1;
        for (int k = 0; k < d->L; k++)
            if (d->ids[k] == l) i = k;
        ck_layer(&lst, s, l, i, &st, m);
    }
    /* DeepSeek-V3's multi-token-prediction layer, past num_hidden_layers */
    if (s->family == CK_DEEPSEEK_V3 || s->family == CK_KIMI_K2) {
        ck_add(&lst, s->dtype, 2, s->H, 2 * s->H, NULL, "model.layers.%d.eh_proj.weight", d->layers);
        ck_layer(&lst, s, d->layers, -1, &st, NULL);
    }
    ck_add(&lst, s->dtype, 1, s->H, 0, NULL, "%snorm.weight", root);
    ck_add(&lst, s->dtype, 2, 64, s->H, NULL, "lm_head.weight");
    ck_write_files(dir, s, &lst, m);
    for (int i = 0; i < lst.n_owned; i++) free(lst.owned[i]);
    free(lst.owned);
    free(lst.t);
}

void ck_model_free(ck_model *m) {
    for (int i = 0; i < CK_MAX_LAYERS; i++) {
        free(m->w13[i]);
        free(m->w2[i]);
        free(m->gatew[i]);
    }
    memset(m, 0, sizeof *m);
}
