/* The Hugging Face families whose shared experts lorasink serves: how each
 * is recognised in config.json (model_type, architectures), which keys
 * give the width of its shared-expert MLP, which layers have one (each
 * family's own rule, as its modeling code builds the decoder layers), and
 * how the tensors are named. docs/api.md lists them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/json.h"
#include "model/model_internal.h"

typedef enum {
    LS_RULE_DEEPSEEK,     /* first_k_dense_replace, moe_layer_freq */
    LS_RULE_DEEPSEEK_ALL, /* every layer, DeepSeek's width keys */
    LS_RULE_BAILING,
    LS_RULE_ERNIE,
    LS_RULE_QWEN,       /* decoder_sparse_step, mlp_only_layers */
    LS_RULE_EVERY,      /* every layer, Qwen's width key */
    LS_RULE_LLAMA4,
    LS_RULE_GRANITE,    /* every layer, shared_intermediate_size */
    LS_RULE_ERNIE_VL    /* mlp_layer_types, moe_intermediate_size[0] */
} ls_rule;

struct ls_family {
    const char *name;
    const char *model_types[3];
    const char *architectures[3];
    ls_rule rule;
    const char *module; /* the shared-expert MLP under a layer: "mlp.shared_experts." */
    bool gate;          /* mlp.shared_expert_gate.weight [1, H] */
    /* DeepSeek's rules: the key counting the shared experts (NULL:
     * n_shared_experts), and whether config.json's mlp_layer_types, when
     * given, says which layers are MoE ("sparse"): transformers 5 writes
     * it for the newer families, whose modeling code reads only it. */
    const char *count_key;
    bool layer_types;
    /* The projections' tensors, LS_PROJ_GATE to LS_PROJ_DOWN (NULL:
     * gate_proj, up_proj, down_proj); a NULL up means gate and up are one
     * fused tensor [2F, H], gate rows first. */
    const char *const *projs;
    const char *peft_targets; /* see LS_MODULES */
    /* The key giving one shared expert's width (NULL: the rule's own,
     * moe_intermediate_size or shared_expert_intermediate_size), and for
     * DeepSeek's rule the key counting the leading dense layers when it
     * is not first_k_dense_replace (then moe_layer_freq is not read: the
     * family's code has none). */
    const char *width_key;
    const char *first_key;
};

/* What reaches each family's shared experts in PEFT 0.21 with
 * transformers 5 (docs/adapters.md's table, held by check-hf): where
 * PEFT rewrites gate_proj/up_proj/down_proj into the routed experts'
 * fused parameters, only target_parameters does. */
#define LS_PARAMS_PLURAL                                                                                              \
    "target_modules=None, target_parameters=[\"mlp.shared_experts.gate_proj.weight\", "                              \
    "\"mlp.shared_experts.up_proj.weight\", \"mlp.shared_experts.down_proj.weight\"]"
#define LS_PARAMS_SINGULAR                                                                                            \
    "target_modules=None, target_parameters=[\"mlp.shared_expert.gate_proj.weight\", "                               \
    "\"mlp.shared_expert.up_proj.weight\", \"mlp.shared_expert.down_proj.weight\"]"
#define LS_MODULES "target_modules=[\"gate_proj\", \"up_proj\", \"down_proj\"]"
#define LS_PARAMS_MLP_SHARED_MLP                                                                                      \
    "target_modules=None, target_parameters=[\"mlp.shared_mlp.gate_proj.weight\", "                                 \
    "\"mlp.shared_mlp.up_proj.weight\", \"mlp.shared_mlp.down_proj.weight\"]"

/* Granite's shared_mlp: input_linear [2F, H], chunked gate then up. */
static const char *const ls_granite_projs[LS_PROJ_COUNT] = {"input_linear.weight", NULL, "output_linear.weight", NULL};
/* HY-V4's checkpoints name the gate projection linear_gate (transformers
 * reads it as gate_proj and writes it back so; PEFT's modules say
 * gate_proj). */
static const char *const ls_hyv4_projs[LS_PROJ_COUNT] = {"linear_gate.weight", "up_proj.weight", "down_proj.weight",
                                                         NULL};

static const ls_family ls_families[] = {
    {"deepseek_v2", {"deepseek_v2"}, {"DeepseekV2ForCausalLM"}, LS_RULE_DEEPSEEK, "mlp.shared_experts.", false, NULL,
     false, NULL, LS_PARAMS_PLURAL, NULL, NULL},
    {"deepseek_v3", {"deepseek_v3", "kimi_k2"}, {"DeepseekV3ForCausalLM"}, LS_RULE_DEEPSEEK, "mlp.shared_experts.",
     false, NULL, false, NULL, LS_PARAMS_PLURAL, NULL, NULL},
    {"deepseek_v32", {"deepseek_v32"}, {"DeepseekV32ForCausalLM"}, LS_RULE_DEEPSEEK, "mlp.shared_experts.", false,
     NULL, true, NULL, LS_PARAMS_PLURAL, NULL, NULL},
    /* A.X-K1: DeepSeek-V3's MoE with a post_mlp_layernorm on its output
     * (routed + shared), which is the engine's, like the next layer's. */
    {"axk1", {"axk1"}, {"AXK1ForCausalLM"}, LS_RULE_DEEPSEEK, "mlp.shared_experts.", false, NULL, true, NULL,
     LS_MODULES, NULL, NULL},
    {"bailing_hybrid", {"bailing_hybrid"}, {"BailingHybridForCausalLM"}, LS_RULE_DEEPSEEK, "mlp.shared_experts.", false,
     "num_shared_experts", true, NULL, LS_MODULES, NULL, NULL},
    {"dots3_note", {"dots3_note", "dots3_note_text"}, {"Dots3NoteForConditionalGeneration", "Dots3NoteForCausalLM"},
     LS_RULE_DEEPSEEK, "mlp.shared_experts.", false, NULL, true, NULL, LS_MODULES, "shared_experts_intermediate_size",
     NULL},
    {"hy_v4", {"hy_v4"}, {"HYV4ForCausalLM"}, LS_RULE_DEEPSEEK, "mlp.shared_experts.", false, NULL, true,
     ls_hyv4_projs, LS_MODULES, NULL, NULL},
    {"afmoe", {"afmoe"}, {"AfmoeForCausalLM"}, LS_RULE_DEEPSEEK, "mlp.shared_experts.", false, "num_shared_experts",
     false, NULL, LS_PARAMS_PLURAL, NULL, "num_dense_layers"},
    {"aria", {"aria", "aria_text"}, {"AriaForConditionalGeneration", "AriaTextForCausalLM"}, LS_RULE_DEEPSEEK_ALL,
     "mlp.shared_experts.", false, "moe_num_shared_experts", false, NULL, LS_MODULES, "intermediate_size", NULL},
    {"glm4_moe", {"glm4_moe"}, {"Glm4MoeForCausalLM"}, LS_RULE_DEEPSEEK, "mlp.shared_experts.", false, NULL, false,
     NULL, LS_PARAMS_PLURAL, NULL, NULL},
    {"glm4v_moe", {"glm4v_moe", "glm4v_moe_text"}, {"Glm4vMoeForConditionalGeneration"}, LS_RULE_DEEPSEEK,
     "mlp.shared_experts.", false, NULL, false, NULL, LS_PARAMS_PLURAL, NULL, NULL},
    {"glm4_moe_lite", {"glm4_moe_lite"}, {"Glm4MoeLiteForCausalLM"}, LS_RULE_DEEPSEEK, "mlp.shared_experts.", false,
     NULL, true, NULL, LS_PARAMS_PLURAL, NULL, NULL},
    {"glm_moe_dsa", {"glm_moe_dsa"}, {"GlmMoeDsaForCausalLM"}, LS_RULE_DEEPSEEK, "mlp.shared_experts.", false, NULL,
     true, NULL, LS_PARAMS_PLURAL, NULL, NULL},
    {"dots1", {"dots1"}, {"Dots1ForCausalLM"}, LS_RULE_DEEPSEEK, "mlp.shared_experts.", false, NULL, false, NULL,
     LS_PARAMS_PLURAL, NULL, NULL},
    {"ernie4_5_moe", {"ernie4_5_moe"}, {"Ernie4_5_MoeForCausalLM"}, LS_RULE_ERNIE, "mlp.shared_experts.", false, NULL,
     false, NULL, LS_PARAMS_PLURAL, NULL, NULL},
    {"ernie4_5_vl_moe", {"ernie4_5_vl_moe", "ernie4_5_vl_moe_text"}, {"Ernie4_5_VLMoeForConditionalGeneration",
     "Ernie4_5_VL_MoeForConditionalGeneration"}, LS_RULE_ERNIE_VL, "mlp.shared_experts.", false, NULL, false, NULL,
     LS_MODULES, NULL, NULL},
    {"bailing_moe", {"bailing_moe"}, {"BailingMoeForCausalLM"}, LS_RULE_BAILING, "mlp.shared_experts.", false, NULL,
     false, NULL, NULL, NULL, NULL},
    {"exaone_moe", {"exaone_moe"}, {"ExaoneMoeForCausalLM"}, LS_RULE_DEEPSEEK, "mlp.shared_experts.", false,
     "num_shared_experts", true, NULL, LS_PARAMS_PLURAL, NULL, NULL},
    {"axk2", {"axk2"}, {"AXK2ForCausalLM"}, LS_RULE_DEEPSEEK, "mlp.shared_experts.", false, NULL, true, NULL,
     LS_MODULES, NULL, NULL},
    {"mistral4", {"mistral4"}, {"Mistral4ForCausalLM"}, LS_RULE_DEEPSEEK, "mlp.shared_experts.", false, NULL, false,
     NULL, LS_MODULES, NULL, NULL},
    {"solar_open", {"solar_open"}, {"SolarOpenForCausalLM"}, LS_RULE_DEEPSEEK_ALL, "mlp.shared_experts.", false, NULL,
     false, NULL, LS_PARAMS_PLURAL, NULL, NULL},
    {"qwen2_moe", {"qwen2_moe"}, {"Qwen2MoeForCausalLM"}, LS_RULE_QWEN, "mlp.shared_expert.", true, NULL, false,
     NULL, LS_MODULES, NULL, NULL},
    {"qwen3_next", {"qwen3_next"}, {"Qwen3NextForCausalLM"}, LS_RULE_QWEN, "mlp.shared_expert.", true, NULL, false,
     NULL, LS_PARAMS_SINGULAR, NULL, NULL},
    {"qwen3_5_moe", {"qwen3_5_moe", "qwen3_5_moe_text"},
     {"Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"}, LS_RULE_EVERY, "mlp.shared_expert.", true, NULL,
     false, NULL, LS_MODULES, NULL, NULL},
    /* Qwen's shared expert without its gate. */
    {"flint", {"flint"}, {"FlintForCausalLM"}, LS_RULE_QWEN, "mlp.shared_expert.", false, NULL, false, NULL,
     LS_MODULES, NULL, NULL},
    {"lara_mini", {"lara_mini"}, {"LaraMiniForCausalLM"}, LS_RULE_EVERY, "mlp.shared_expert.", false, NULL, false,
     NULL, LS_MODULES, NULL, NULL},
    /* DeepSeek's module name over Qwen's width key, every layer. */
    {"kolibri1", {"kolibri1"}, {"Kolibri1ForCausalLM"}, LS_RULE_EVERY, "mlp.shared_experts.", false, NULL, false, NULL,
     LS_MODULES, NULL, NULL},
    /* HunYuan-MoE's shared MLP, in its MoE block, of intermediate_size. */
    {"hunyuan_v1_moe", {"hunyuan_v1_moe"}, {"HunYuanMoEV1ForCausalLM"}, LS_RULE_EVERY, "mlp.shared_mlp.", false, NULL,
     false, NULL, LS_PARAMS_MLP_SHARED_MLP, "intermediate_size", NULL},
    {"llama4", {"llama4", "llama4_text"}, {"Llama4ForConditionalGeneration", "Llama4ForCausalLM"}, LS_RULE_LLAMA4,
     "feed_forward.shared_expert.", false, NULL, false, NULL, LS_MODULES, NULL, NULL},
    /* The shared MLP sits beside the MoE block, under the layer. */
    {"granitemoeshared", {"granitemoeshared"}, {"GraniteMoeSharedForCausalLM"}, LS_RULE_GRANITE, "shared_mlp.", false,
     NULL, false, ls_granite_projs, "target_modules=[\"input_linear\", \"output_linear\"]", NULL, NULL},
    {"granitemoehybrid", {"granitemoehybrid"}, {"GraniteMoeHybridForCausalLM"}, LS_RULE_GRANITE, "shared_mlp.", false,
     NULL, false, ls_granite_projs, "target_modules=[\"input_linear\", \"output_linear\"]", NULL, NULL},
    {"granitemoe_swa", {"granitemoe_swa"}, {"GraniteMoeSWAForCausalLM"}, LS_RULE_GRANITE, "shared_mlp.", false, NULL,
     false, ls_granite_projs, "target_modules=[\"input_linear\", \"output_linear\"]", NULL, NULL},
};
#define LS_N_FAMILIES (sizeof ls_families / sizeof *ls_families)

const char *const ls_family_prefixes[] = {"model.layers.", "model.language_model.layers.", "language_model.model.layers.",
                                          NULL};

static const char *const ls_proj_names[LS_PROJ_COUNT] = {"gate_proj.weight", "up_proj.weight", "down_proj.weight",
                                                         NULL};

const char *ls_family_proj(const ls_family_plan *p, int proj) {
    return (p->family->projs ? p->family->projs : ls_proj_names)[proj];
}

void ls_family_name(const ls_family_plan *p, const char *prefix, int layer, int proj, char *buf, size_t len) {
    if (proj == LS_PROJ_SCALAR_GATE) /* beside the MLP, not in it */
        snprintf(buf, len, "%s%d.mlp.shared_expert_gate.weight", prefix, layer);
    else snprintf(buf, len, "%s%d.%s%s", prefix, layer, p->family->module, ls_family_proj(p, proj));
}

bool ls_family_in_module(const ls_family_plan *p, const char *prefix, const char *name, long *layer,
                         const char **rest) {
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl) != 0) return false;
    const char *q = name + pl;
    if (*q < '0' || *q > '9') return false;
    char *end;
    long l = strtol(q, &end, 10);
    if (*end != '.' || l < 0 || l > 1000000) return false;
    const char *after = end + 1, *mod = p->family->module;
    if (!strncmp(after, mod, strlen(mod))) {
        *rest = after + strlen(mod);
    } else if (!strncmp(after, "mlp.shared_expert_gate.", 23)) { /* a gateless family's is refused, not skipped */
        *rest = after + 4; /* "shared_expert_gate...." */
    } else {
        return false;
    }
    *layer = l;
    return true;
}

/* ---- reading keys --------------------------------------------------------- */

/* The family's keys: text_config's when config nests one. */
static const json_t *ls_family_keys(const json_t *config) {
    const json_t *t = json_object_get(config, "text_config");
    return json_is_object(t) ? t : config;
}

/* An integer key >= min; absent (or null) gives dflt when dflt >= min,
 * else an error that names the key. */
static ls_status ls_key_int(const json_t *keys, const char *key, long long min, long long dflt, long long *out,
                            ls_error *err) {
    const json_t *v = json_object_get(keys, key);
    if (!v || json_is_null(v)) {
        if (dflt >= min) {
            *out = dflt;
            return LS_OK;
        }
        return ls_error_set(err, LS_INVALID_REQUEST, "a checkpoint saved by transformers has every key of its config",
                            "config.json has no \"%s\", which lorasink needs and will not assume", key);
    }
    if (!json_is_integer(v) || json_integer_value(v) < min)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "config.json's \"%s\" is %s, expected an integer >= %lld", key,
                            json_is_integer(v) ? "too small" : ls_json_kind(v), min);
    *out = json_integer_value(v);
    return LS_OK;
}

/* ERNIE's start and end indices may be per modality: the text trunk takes
 * the smallest start and the largest end. */
static ls_status ls_key_int_or_list(const json_t *keys, const char *key, bool smallest, long long dflt,
                                    long long *out, ls_error *err) {
    const json_t *v = json_object_get(keys, key);
    if (!json_is_array(v)) return ls_key_int(keys, key, -1, dflt, out, err);
    if (json_array_size(v) == 0)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "config.json's \"%s\" is an empty list", key);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "config.json's \"%s\" holds %s, expected integers", key,
                                ls_json_kind(e));
        long long x = json_integer_value(e);
        if (i == 0 || (smallest ? x < *out : x > *out)) *out = x;
    }
    return LS_OK;
}

/* ---- the layer rules -------------------------------------------------------- */

/* transformers 5's mlp_layer_types: "sparse" (a MoE block, with shared
 * experts) or "dense" for each of the num_hidden_layers. */
static ls_status ls_rule_layer_types(const json_t *types, bool none, ls_family_plan *p, ls_error *err) {
    if (!json_is_array(types))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL,
                            "config.json's mlp_layer_types is %s, expected a list of num_hidden_layers (%d) entries",
                            ls_json_kind(types), p->layers_total);
    if (json_array_size(types) != (size_t)p->layers_total)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL,
                            "config.json's mlp_layer_types is a list of %zu entries, expected num_hidden_layers (%d)",
                            json_array_size(types), p->layers_total);
    int sparse = 0;
    size_t i;
    json_t *e;
    json_array_foreach(types, i, e) {
        const char *t = json_string_value(e);
        if (!t || (strcmp(t, "sparse") && strcmp(t, "dense")))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL,
                                "config.json's mlp_layer_types[%zu] is not \"sparse\" or \"dense\"", i);
        p->moe[i] = !none && !strcmp(t, "sparse");
        sparse += !strcmp(t, "sparse");
    }
    snprintf(p->rule, sizeof p->rule, "mlp_layer_types[l] is \"sparse\" (%d of %d layers)%s", sparse,
             p->layers_total, none ? ", but the config has no routed experts" : "");
    return LS_OK;
}

/* DeepSeek-V2/V3 and the models built on them: a layer has shared experts
 * from first_k_dense_replace on, every moe_layer_freq-th (absent: 1); no
 * layer when n_routed_experts is null or 0. That is DeepSeek's own code
 * (and vLLM's, sglang's); transformers' ignores moe_layer_freq, so when it
 * is not 1 the other reading is kept beside it for the tensors to choose.
 * Bailing names the count num_shared_experts and may give the width of
 * one. The newer families' own code reads mlp_layer_types instead (when
 * config.json has it), or builds every layer so. */
static ls_status ls_rule_deepseek(const json_t *k, const ls_family *f, ls_family_plan *p, ls_error *err) {
    const bool bailing = f->rule == LS_RULE_BAILING;
    long long first = 0, freq = 1, shared = 0, inter = 0;
    const json_t *routed = json_object_get(k, bailing ? "num_experts" : "n_routed_experts");
    const bool none = routed && (json_is_null(routed) || (json_is_integer(routed) && json_integer_value(routed) == 0));
    const char *wkey = f->width_key ? f->width_key : "moe_intermediate_size";
    const json_t *sw = json_object_get(k, "moe_shared_expert_intermediate_size");
    if (bailing && sw && !json_is_null(sw)) wkey = "moe_shared_expert_intermediate_size";
    const char *count = f->count_key ? f->count_key : bailing ? "num_shared_experts" : "n_shared_experts";
    const json_t *types = json_object_get(k, "mlp_layer_types");
    const bool by_types = f->layer_types && types && !json_is_null(types);
    const char *first_key = f->first_key ? f->first_key : "first_k_dense_replace";
    if (!by_types && f->rule != LS_RULE_DEEPSEEK_ALL) {
        LS_MODEL_TRY(ls_key_int(k, first_key, 0, -1, &first, err));
        if (!f->first_key) LS_MODEL_TRY(ls_key_int(k, "moe_layer_freq", 1, 1, &freq, err));
    }
    LS_MODEL_TRY(ls_key_int(k, count, 1, -1, &shared, err));
    LS_MODEL_TRY(ls_key_int(k, wkey, 1, -1, &inter, err));
    if (shared * inter > 1 << 24)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "config.json: the shared experts' width %lld x %lld is too "
                            "large", shared, inter);
    p->F = (int)(shared * inter);
    if (by_types) return ls_rule_layer_types(types, none, p, err);
    if (f->rule == LS_RULE_DEEPSEEK_ALL) {
        for (int l = 0; l < p->layers_total; l++) p->moe[l] = !none;
        snprintf(p->rule, sizeof p->rule, "every layer%s", none ? ", but n_routed_experts is none" : "");
        return LS_OK;
    }
    for (int l = 0; l < p->layers_total; l++) p->moe[l] = !none && l >= first && l % freq == 0;
    if (f->first_key)
        snprintf(p->rule, sizeof p->rule, "l >= %s (%lld)", first_key, first);
    else
        snprintf(p->rule, sizeof p->rule, "l >= first_k_dense_replace (%lld) and l %% moe_layer_freq (%lld) == 0%s",
                 first, freq, none ? ", but n_routed_experts is none" : "");
    if (freq == 1 || none) return LS_OK;
    if (!(p->moe_alt = calloc((size_t)p->layers_total, sizeof *p->moe_alt)))
        return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    for (int l = 0; l < p->layers_total; l++) p->moe_alt[l] = l >= first;
    snprintf(p->rule_alt, sizeof p->rule_alt, "l >= first_k_dense_replace (%lld), moe_layer_freq (%lld) not applied, "
             "as transformers builds the layers", first, freq);
    return LS_OK;
}

/* ERNIE's shared MLP: moe_num_shared_experts of inter each, none when 0. */
static ls_status ls_ernie_width(long long shared, long long inter, ls_family_plan *p, ls_error *err) {
    if (shared == 0)
        return ls_error_set(err, LS_INVALID_REQUEST, "lorasink serves shared experts; this model has none",
                            "config.json's moe_num_shared_experts is 0: the checkpoint has no shared experts");
    if (shared * inter > 1 << 24)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "config.json: the shared experts' width is too large");
    p->F = (int)(shared * inter);
    return LS_OK;
}

/* ERNIE 4.5: (l + 1) % moe_layer_interval == 0 and moe_layer_start_index
 * <= l <= moe_layer_end_index (-1 or absent: the last layer). */
static ls_status ls_rule_ernie(const json_t *k, ls_family_plan *p, ls_error *err) {
    long long start = 0, end = 0, interval = 1, shared = 0, inter = 0;
    LS_MODEL_TRY(ls_key_int_or_list(k, "moe_layer_start_index", true, -2, &start, err));
    if (start < 0) return ls_error_set(err, LS_INVALID_REQUEST, NULL, "config.json's moe_layer_start_index is negative");
    LS_MODEL_TRY(ls_key_int_or_list(k, "moe_layer_end_index", false, -1, &end, err));
    if (end < 0) end = p->layers_total - 1;
    LS_MODEL_TRY(ls_key_int(k, "moe_layer_interval", 1, 1, &interval, err));
    LS_MODEL_TRY(ls_key_int(k, "moe_num_shared_experts", 0, -1, &shared, err));
    LS_MODEL_TRY(ls_key_int(k, "moe_intermediate_size", 1, -1, &inter, err));
    LS_MODEL_TRY(ls_ernie_width(shared, inter, p, err));
    for (int l = 0; l < p->layers_total; l++) p->moe[l] = (l + 1) % interval == 0 && l >= start && l <= end;
    snprintf(p->rule, sizeof p->rule, "moe_layer_start_index (%lld) <= l <= moe_layer_end_index (%lld) and (l + 1) %% "
             "moe_layer_interval (%lld) == 0", start, end, interval);
    return LS_OK;
}

/* ERNIE 4.5 VL's text model: the layers mlp_layer_types makes "sparse"
 * (transformers 5's code reads only it), one shared MLP of
 * moe_num_shared_experts x the text experts' width, moe_intermediate_size[0]
 * (a list: text, then vision; a plain integer is both); none when
 * moe_num_shared_experts is 0. */
static ls_status ls_rule_ernie_vl(const json_t *k, ls_family_plan *p, ls_error *err) {
    long long shared = 0, inter = 0;
    LS_MODEL_TRY(ls_key_int(k, "moe_num_shared_experts", 0, -1, &shared, err));
    const json_t *w = json_object_get(k, "moe_intermediate_size");
    if (json_is_array(w)) {
        const json_t *first = json_array_get(w, 0);
        if (!json_is_integer(first) || json_integer_value(first) < 1)
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "config.json's moe_intermediate_size[0] is %s, "
                                "expected an integer >= 1", first ? ls_json_kind(first) : "absent (an empty list)");
        inter = json_integer_value(first);
    } else {
        LS_MODEL_TRY(ls_key_int(k, "moe_intermediate_size", 1, -1, &inter, err));
    }
    LS_MODEL_TRY(ls_ernie_width(shared, inter, p, err));
    const json_t *types = json_object_get(k, "mlp_layer_types");
    if (!types || json_is_null(types))
        return ls_error_set(err, LS_INVALID_REQUEST, "a checkpoint saved by transformers has every key of its config",
                            "config.json has no \"mlp_layer_types\", which decides this family's MoE layers and "
                            "which lorasink will not assume");
    return ls_rule_layer_types(types, false, p, err);
}

/* Qwen2-MoE, Qwen3-Next and Flint: (l + 1) % decoder_sparse_step == 0
 * and l not in mlp_only_layers; Qwen3.5-MoE, Qwen4-Exp and Lara-Mini:
 * every layer. One shared expert of
 * shared_expert_intermediate_size. */
static ls_status ls_rule_qwen(const json_t *k, const ls_family *f, ls_family_plan *p, ls_error *err) {
    const ls_rule rule = f->rule;
    const char *wkey = f->width_key ? f->width_key : "shared_expert_intermediate_size";
    long long step = 1, inter = 0;
    LS_MODEL_TRY(ls_key_int(k, wkey, 1, -1, &inter, err));
    if (inter > 1 << 24) return ls_error_set(err, LS_INVALID_REQUEST, NULL, "config.json: %s is too large", wkey);
    p->F = (int)inter;
    if (rule == LS_RULE_EVERY) {
        for (int l = 0; l < p->layers_total; l++) p->moe[l] = true;
        snprintf(p->rule, sizeof p->rule, "every layer");
        return LS_OK;
    }
    LS_MODEL_TRY(ls_key_int(k, "decoder_sparse_step", 1, 1, &step, err));
    const json_t *routed = json_object_get(k, "num_experts");
    const bool none = json_is_integer(routed) && json_integer_value(routed) == 0;
    for (int l = 0; l < p->layers_total; l++) p->moe[l] = !none && (l + 1) % step == 0;
    const json_t *only = json_object_get(k, "mlp_only_layers");
    size_t i;
    json_t *e;
    if (only && !json_is_null(only) && !json_is_array(only))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "config.json's mlp_only_layers is %s, expected a list",
                            ls_json_kind(only));
    char listed[64] = "";
    json_array_foreach(only, i, e) {
        if (!json_is_integer(e))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "config.json's mlp_only_layers holds %s",
                                ls_json_kind(e));
        long long l = json_integer_value(e);
        if (l >= 0 && l < p->layers_total) p->moe[l] = false;
        size_t at = strlen(listed);
        if (at < sizeof listed - 8) snprintf(listed + at, sizeof listed - at, "%s%lld", i ? ", " : "", l);
        else if (at < sizeof listed - 4) snprintf(listed + at, sizeof listed - at, "...");
    }
    snprintf(p->rule, sizeof p->rule, "(l + 1) %% decoder_sparse_step (%lld) == 0 and l not in mlp_only_layers [%s]%s",
             step, listed, none ? ", but num_experts is 0" : "");
    return LS_OK;
}

/* Llama 4: the layers moe_layers lists, else every
 * interleave_moe_layer_step-th (l % step == step - 1); the shared expert
 * has intermediate_size. */
static ls_status ls_rule_llama4(const json_t *k, ls_family_plan *p, ls_error *err) {
    long long step = 1, inter = 0;
    LS_MODEL_TRY(ls_key_int(k, "intermediate_size", 1, -1, &inter, err));
    if (inter > 1 << 24) return ls_error_set(err, LS_INVALID_REQUEST, NULL, "config.json: intermediate_size is too large");
    p->F = (int)inter;
    const json_t *list = json_object_get(k, "moe_layers");
    if (list && !json_is_null(list)) {
        if (!json_is_array(list))
            return ls_error_set(err, LS_INVALID_REQUEST, NULL, "config.json's moe_layers is %s, expected a list",
                                ls_json_kind(list));
        size_t i;
        json_t *e;
        json_array_foreach(list, i, e) {
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= p->layers_total)
                return ls_error_set(err, LS_INVALID_REQUEST, NULL,
                                    "config.json's moe_layers holds %s, expected layers 0..%d", ls_json_kind(e),
                                    p->layers_total - 1);
            p->moe[json_integer_value(e)] = true;
        }
        snprintf(p->rule, sizeof p->rule, "l in moe_layers (%zu listed)", json_array_size(list));
        return LS_OK;
    }
    LS_MODEL_TRY(ls_key_int(k, "interleave_moe_layer_step", 1, 1, &step, err));
    for (int l = 0; l < p->layers_total; l++) p->moe[l] = l % step == step - 1;
    snprintf(p->rule, sizeof p->rule, "l %% interleave_moe_layer_step (%lld) == %lld", step, step - 1);
    return LS_OK;
}

/* Granite's MoE families: every layer has the shared MLP of
 * shared_intermediate_size beside its MoE block; none when that is 0
 * (GraniteMoeShared builds none; GraniteMoeHybrid an empty one) or when
 * num_local_experts is 0 (the shared MLP is then the dense model's only
 * MLP, no shared expert). */
static ls_status ls_rule_granite(const json_t *k, ls_family_plan *p, ls_error *err) {
    long long inter = 0, experts = 0;
    LS_MODEL_TRY(ls_key_int(k, "shared_intermediate_size", 0, -1, &inter, err));
    LS_MODEL_TRY(ls_key_int(k, "num_local_experts", 0, -1, &experts, err));
    if (inter > 1 << 24)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "config.json: shared_intermediate_size is too large");
    p->F = (int)inter;
    const bool none = inter == 0 || experts == 0;
    for (int l = 0; l < p->layers_total; l++) p->moe[l] = !none;
    snprintf(p->rule, sizeof p->rule, "every layer%s",
             inter == 0 ? ", but shared_intermediate_size is 0" : experts == 0 ? ", but num_local_experts is 0" : "");
    return LS_OK;
}

/* Every family's shared-expert MLP is down(act(gate(x)) * up(x)) with
 * act = ACT2FN[hidden_act]; the engine computes SiLU (swish is its other
 * name), so another activation would serve wrong numbers. Absent: every
 * family's default, silu. */
static ls_status ls_family_act(const json_t *k, ls_error *err) {
    const json_t *v = json_object_get(k, "hidden_act");
    if (!v || json_is_null(v)) return LS_OK;
    const char *a = json_string_value(v);
    if (a && (!strcmp(a, "silu") || !strcmp(a, "swish"))) return LS_OK;
    char got[80];
    if (a) snprintf(got, sizeof got, "\"%.64s\"", a);
    else snprintf(got, sizeof got, "%s", ls_json_kind(v));
    return ls_error_set(err, LS_INVALID_REQUEST,
                        "lorasink computes silu(gate_proj x) * up_proj x; serve a checkpoint whose hidden_act is silu",
                        "config.json's hidden_act is %s: lorasink's shared-expert block is SwiGLU (hidden_act \"silu\" "
                        "or \"swish\") and would give other numbers than this model", got);
}

/* ---- choosing the family ------------------------------------------------------ */

static const ls_family *ls_family_by_type(const char *t) {
    for (size_t f = 0; t && f < LS_N_FAMILIES; f++)
        for (int i = 0; i < 3 && ls_families[f].model_types[i]; i++)
            if (!strcmp(ls_families[f].model_types[i], t)) return &ls_families[f];
    return NULL;
}

static const ls_family *ls_family_by_arch(const char *a) {
    for (size_t f = 0; a && f < LS_N_FAMILIES; f++)
        for (int i = 0; i < 3 && ls_families[f].architectures[i]; i++)
            if (!strcmp(ls_families[f].architectures[i], a)) return &ls_families[f];
    return NULL;
}

/* The family config names: by model_type (or text_config's), else by an
 * architectures entry. An architecture of another known family beside a
 * known model_type is a contradiction, not a choice to make. */
static ls_status ls_family_pick(const json_t *config, ls_family_plan *p, ls_error *err) {
    const json_t *mt = json_object_get(config, "model_type"), *arch = json_object_get(config, "architectures");
    const json_t *tmt = json_object_get(ls_family_keys(config), "model_type");
    snprintf(p->model_type, sizeof p->model_type, "%s", json_is_string(mt) ? json_string_value(mt) : "");
    const ls_family *by_type = ls_family_by_type(json_string_value(mt));
    if (!by_type) by_type = ls_family_by_type(json_string_value(tmt));
    const ls_family *by_arch = NULL;
    char archs[160] = "";
    size_t i;
    json_t *a;
    json_array_foreach(arch, i, a) {
        const char *s = json_string_value(a);
        if (!s) continue;
        if (!p->architecture[0]) snprintf(p->architecture, sizeof p->architecture, "%s", s);
        size_t l = strlen(archs);
        snprintf(archs + l, sizeof archs - l, "%s%s", l ? ", " : "", s);
        const ls_family *f = ls_family_by_arch(s);
        if (f && (!by_arch || f == by_type)) by_arch = f;
    }
    if (by_type && by_arch && by_arch != by_type)
        return ls_error_set(err, LS_INVALID_REQUEST, "fix config.json: its model_type and architectures must agree",
                            "config.json's model_type \"%s\" is the %s family, but its architectures [%s] are %s",
                            p->model_type, by_type->name, archs, by_arch->name);
    p->family = by_type ? by_type : by_arch;
    if (p->family) return LS_OK;
    /* The list is the hint's, made from the table so it cannot fall
     * behind it: the message holds the config's own names too and would
     * cut it (both are 512 bytes). */
    char hint[sizeof err->hint];
    size_t n = (size_t)snprintf(hint, sizeof hint, "served:");
    for (size_t f = 0; f < LS_N_FAMILIES; f++) {
        const char *name = ls_families[f].name;
        if (n + strlen(name) + 2 + 40 > sizeof hint) { /* room for the end, always */
            snprintf(hint + n, sizeof hint - n, " and more (docs/api.md lists them)");
            break;
        }
        n += (size_t)snprintf(hint + n, sizeof hint - n, "%s %s", f ? "," : "", name);
    }
    return ls_error_set(err, LS_INVALID_REQUEST, hint,
                        "config.json names model_type \"%s\" and architectures [%s]: not a family whose shared experts "
                        "lorasink serves (the hint lists them); another family's load as the fused weights file "
                        "(docs/api.md, \"The model\")",
                        p->model_type, archs);
}

ls_status ls_family_plan_from_config(const json_t *config, ls_family_plan *p, ls_error *err) {
    memset(p, 0, sizeof *p);
    if (!json_is_object(config))
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "config.json is %s, expected an object", ls_json_kind(config));
    LS_MODEL_TRY(ls_family_pick(config, p, err));
    p->name = p->family->name;
    p->gate = p->family->gate;
    p->fused = p->family->projs && !p->family->projs[LS_PROJ_UP];
    p->peft_targets = p->family->peft_targets;
    const json_t *k = ls_family_keys(config);
    long long L = 0, H = 0;
    ls_status st = ls_key_int(k, "num_hidden_layers", 1, -1, &L, err);
    if (st == LS_OK) st = ls_key_int(k, "hidden_size", 1, -1, &H, err);
    if (st == LS_OK && (L > 100000 || H > 1 << 20))
        st = ls_error_set(err, LS_INVALID_REQUEST, NULL, "config.json: num_hidden_layers %lld or hidden_size %lld is "
                          "too large", L, H);
    if (st == LS_OK) st = ls_family_act(k, err);
    if (st != LS_OK) return st;
    p->layers_total = (int)L;
    p->H = (int)H;
    if (!(p->moe = calloc((size_t)L, sizeof *p->moe))) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    switch (p->family->rule) {
    case LS_RULE_DEEPSEEK:
    case LS_RULE_DEEPSEEK_ALL:
    case LS_RULE_BAILING: st = ls_rule_deepseek(k, p->family, p, err); break;
    case LS_RULE_ERNIE: st = ls_rule_ernie(k, p, err); break;
    case LS_RULE_QWEN:
    case LS_RULE_EVERY: st = ls_rule_qwen(k, p->family, p, err); break;
    case LS_RULE_LLAMA4: st = ls_rule_llama4(k, p, err); break;
    case LS_RULE_GRANITE: st = ls_rule_granite(k, p, err); break;
    case LS_RULE_ERNIE_VL: st = ls_rule_ernie_vl(k, p, err); break;
    }
    bool any = false;
    for (int l = 0; st == LS_OK && l < p->layers_total; l++) any |= p->moe[l] || (p->moe_alt && p->moe_alt[l]);
    if (st == LS_OK && !any)
        st = ls_error_set(err, LS_INVALID_REQUEST, "lorasink serves shared experts; this model has none",
                          "config.json (%s family, %s) gives no layer shared experts", p->name, p->rule);
    if (st != LS_OK) ls_family_plan_free(p);
    return st;
}

void ls_family_plan_free(ls_family_plan *p) {
    free(p->moe);
    free(p->moe_alt);
    memset(p, 0, sizeof *p);
}

void ls_family_plan_take_alt(ls_family_plan *p) {
    bool *m = p->moe;
    p->moe = p->moe_alt;
    p->moe_alt = m;
    char r[sizeof p->rule];
    memcpy(r, p->rule, sizeof r);
    memcpy(p->rule, p->rule_alt, sizeof r);
    memcpy(p->rule_alt, r, sizeof r);
}
