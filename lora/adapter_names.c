/* The tensor-name grammar of docs/api.md: which uploaded names are factors of
 * the shared experts (PEFT: fused gate_up_proj or separate gate_proj and
 * up_proj, and down_proj, in each family's spelling, Granite's
 * input_linear and output_linear, Qwen's shared_expert_gate; or the pool
 * format),
 * which belong to other modules, and which are nothing we know. */
#include <stdio.h>
#include <string.h>

#include "lora/adapter_internal.h"

static const char *const ls_peft_suffix[LS_AD_SLOTS] = {
    "gate_up_proj.lora_A.weight", "gate_up_proj.lora_B.weight", "down_proj.lora_A.weight", "down_proj.lora_B.weight",
    "gate_proj.lora_A.weight",    "gate_proj.lora_B.weight",    "up_proj.lora_A.weight",   "up_proj.lora_B.weight",
    "lora_A.weight",              "lora_B.weight",
};
static const char *const ls_pool_suffix[LS_FACTORS] = {
    "gate_up_lora_a",
    "gate_up_lora_b",
    "down_lora_a",
    "down_lora_b",
};
static const char *const ls_peft_label[LS_AD_SLOTS] = {
    "gate_up_proj.lora_A", "gate_up_proj.lora_B", "down_proj.lora_A", "down_proj.lora_B",
    "gate_proj.lora_A",    "gate_proj.lora_B",    "up_proj.lora_A",   "up_proj.lora_B",
    "shared_expert_gate.lora_A", "shared_expert_gate.lora_B",
};

/* Granite's shared MLP, under the layer beside its MoE block: the fused
 * input_linear (gate rows, then up rows) and output_linear, read as the
 * slots of gate_up_proj and down_proj. */
#define LS_GRANITE_SHARED "shared_mlp."
static const char *const ls_granite_suffix[LS_FACTORS] = {
    "input_linear.lora_A.weight",
    "input_linear.lora_B.weight",
    "output_linear.lora_A.weight",
    "output_linear.lora_B.weight",
};

#define LS_SHARED_INFIX "mlp.shared_experts."

/* Where the decoder layers sit in the families with shared experts
 * (causal LMs; the language model of vision-language checkpoints, in
 * transformers 5's and 4's spelling), the block that holds the shared
 * experts, and their module's name (DeepSeek's plural, Qwen's and
 * Llama 4's singular, HunYuan-MoE's shared_mlp in its MoE block). */
static const char *const ls_layer_roots[] = {"model.layers.", "model.language_model.layers.",
                                             "language_model.model.layers."};
static const char *const ls_blocks[] = {"mlp.", "feed_forward."};
static const char *const ls_shared[] = {"shared_experts.", "shared_expert.", "shared_mlp."};

static bool ls_starts(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static bool ls_ends(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

/* PEFT spells factors lora_A/lora_B (lora_embedding_A/B for embeddings);
 * any such name is a LoRA factor of some module. */
static bool ls_is_lora_factor(const char *s) {
    return strstr(s, ".lora_A.") || strstr(s, ".lora_B.") || ls_ends(s, ".lora_A") || ls_ends(s, ".lora_B") ||
           strstr(s, "lora_embedding_A") || strstr(s, "lora_embedding_B");
}

/* What PEFT saves beside the factors, of modules other than the shared
 * experts: modules_to_save copies and save_embedding_layers (.weight),
 * bias="all" or "lora_only" (.bias), trainable tokens. None changes the
 * shared experts' output. (In a layer, ls_is_layer_tensor takes any.) */
static bool ls_is_module_tensor(const char *s) {
    const char *dot = strrchr(s, '.');
    if (!dot || dot == s) return false;
    const char *last = dot + 1;
    return !strcmp(last, "weight") || !strcmp(last, "bias") || ls_starts(last, "trainable_tokens_");
}

/* Digits only, no sign, no leading zero (PyTorch never writes one, and
 * "01" next to "1" would name one layer twice), at most 18 so it fits. */
static bool ls_parse_index(const char *s, size_t len, int64_t *out) {
    if (len == 0 || len > 18) return false;
    if (len > 1 && s[0] == '0') return false;
    int64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return true;
}

/* Whether s lies under a decoder layer ("model.layers.{l}." and the other
 * roots): there PEFT's modules_to_save copies keep their parameters'
 * own names (the routed experts' gate_up_proj, DeepSeek's router's
 * e_score_correction_bias), not only .weight and .bias. */
static bool ls_is_layer_tensor(const char *s) {
    for (size_t r = 0; r < sizeof ls_layer_roots / sizeof *ls_layer_roots; r++) {
        if (!ls_starts(s, ls_layer_roots[r])) continue;
        const char *idx = s + strlen(ls_layer_roots[r]), *dot = strchr(idx, '.');
        int64_t layer;
        return dot && dot[1] && ls_parse_index(idx, (size_t)(dot - idx), &layer);
    }
    return false;
}

/* The part of s after "{block}.{shared}." when s starts so; NULL else. */
static const char *ls_after_shared(const char *s) {
    if (ls_starts(s, LS_GRANITE_SHARED)) return s + strlen(LS_GRANITE_SHARED);
    for (size_t b = 0; b < sizeof ls_blocks / sizeof *ls_blocks; b++) {
        if (!ls_starts(s, ls_blocks[b])) continue;
        const char *t = s + strlen(ls_blocks[b]);
        for (size_t k = 0; k < sizeof ls_shared / sizeof *ls_shared; k++)
            if (ls_starts(t, ls_shared[k])) return t + strlen(ls_shared[k]);
    }
    return NULL;
}

/* Qwen's shared-expert gate, a Linear beside the shared expert in the
 * MoE block: the slot of "mlp.shared_expert_gate.lora_{A,B}.weight" (s
 * after the layer index's dot), else -1. */
#define LS_GATE_INFIX "mlp.shared_expert_gate."
static int ls_gate_slot(const char *s) {
    if (!ls_starts(s, LS_GATE_INFIX)) return -1;
    for (int k = LS_AD_SG_A; k <= LS_AD_SG_B; k++)
        if (!strcmp(s + strlen(LS_GATE_INFIX), ls_peft_suffix[k])) return k;
    return -1;
}

/* Sorts a shared-expert name that is no factor we take by why. */
static void ls_adapter_name_why_not(const char *s, ls_adapter_name *out) {
    if (strstr(s, "lora_magnitude_vector"))
        out->why = LS_AN_WHY_DORA;
    else if (strstr(s, ".lora_B.bias") || strstr(s, ".lora_A.bias"))
        out->why = LS_AN_WHY_BIAS;
    else if (strstr(s, "shared_expert_gate.lora_"))
        out->why = LS_AN_WHY_GATE;
    else if (!strstr(s, "lora_") && (ls_ends(s, ".weight") || ls_ends(s, ".bias")))
        out->why = LS_AN_WHY_COPY;
    else
        out->why = LS_AN_WHY_SHARED_FORM;
}

/* name is borrowed; out holds no pointers into it. */
void ls_adapter_name_parse(const char *name, ls_adapter_name *out) {
    memset(out, 0, sizeof *out);
    out->kind = LS_AN_UNKNOWN;
    out->why = LS_AN_WHY_NOT_LORA;
    out->slot = -1;

    const char *s = name;
    if (ls_starts(s, LS_ADAPTER_PREFIX)) {
        s += strlen(LS_ADAPTER_PREFIX);
        out->prefixed = true;
    }
    for (size_t r = 0; r < sizeof ls_layer_roots / sizeof *ls_layer_roots; r++) {
        if (!ls_starts(s, ls_layer_roots[r])) continue;
        const char *idx = s + strlen(ls_layer_roots[r]);
        const char *dot = strchr(idx, '.');
        const char *rest = dot ? ls_after_shared(dot + 1) : NULL;
        const int gate = dot ? ls_gate_slot(dot + 1) : -1;
        if (!rest && gate < 0) break;
        int64_t layer;
        if (!ls_parse_index(idx, (size_t)(dot - idx), &layer)) {
            out->why = LS_AN_WHY_BAD_INDEX;
            return;
        }
        out->layer = layer;
        if (gate >= 0) {
            out->kind = LS_AN_PEFT;
            out->slot = gate;
            out->module_len = strlen(s) - strlen(".lora_A.weight");
            return;
        }
        const bool granite = ls_starts(dot + 1, LS_GRANITE_SHARED);
        for (int k = 0; k < (granite ? LS_FACTORS : LS_AD_SG_A); k++) {
            if (strcmp(rest, granite ? ls_granite_suffix[k] : ls_peft_suffix[k])) continue;
            out->kind = LS_AN_PEFT;
            out->slot = k;
            out->module_len = strlen(s) - strlen(".lora_A.weight");
            return;
        }
        /* The pool buffers keep the one spelling they always had. */
        const bool pool_form = r == 0 && ls_starts(dot + 1, LS_SHARED_INFIX);
        for (int k = 0; pool_form && k < LS_FACTORS; k++) {
            if (strcmp(rest, ls_pool_suffix[k])) continue;
            out->kind = LS_AN_POOL;
            out->slot = k;
            return;
        }
        break;
    }
    /* Never skip a factor of the shared experts silently: serving the
     * adapter without it would change its output. */
    if (strstr(s, "shared_expert") || strstr(s, "." LS_GRANITE_SHARED)) {
        ls_adapter_name_why_not(s, out);
        return;
    }
    if (ls_is_lora_factor(s)) {
        out->kind = LS_AN_OTHER;
        out->lora = true;
    } else if (ls_is_module_tensor(s) || ls_is_layer_tensor(s)) {
        out->kind = LS_AN_OTHER;
    }
}

/* Writes into the caller's buf (truncated to len). */
void ls_adapter_name_build(char *buf, size_t len, ls_adapter_format format, bool prefixed, int layer, int slot) {
    const char *suffix = format == LS_ADAPTER_FORMAT_POOL ? ls_pool_suffix[slot & 3] : ls_peft_suffix[slot];
    snprintf(buf, len, "%smodel.layers.%d." LS_SHARED_INFIX "%s", prefixed ? LS_ADAPTER_PREFIX : "", layer, suffix);
}

/* Static string; never freed. */
const char *ls_adapter_slot_label(ls_adapter_format format, int slot) {
    if (slot < 0 || slot >= LS_AD_SLOTS) return "?";
    if (format == LS_ADAPTER_FORMAT_POOL) return slot < LS_FACTORS ? ls_pool_suffix[slot] : "?";
    return ls_peft_label[slot];
}
