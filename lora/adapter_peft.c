/* PEFT-format adapters (docs/api.md, adapter formats): the checks of each
 * module's lora_A/lora_B pair (fused gate_up_proj, or separate gate_proj
 * and up_proj, down_proj, and Qwen's shared_expert_gate) against the model, and each module's rank
 * and scale from r, lora_alpha, use_rslora, rank_pattern and
 * alpha_pattern, as PEFT sets them; layers_to_transform checked against
 * the factors present. The fill is in adapter_fuse.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lora/adapter_internal.h"
#include "lora/adapter_rules.h"

/* Module of a slot, and whether the slot is its A factor. */
static int ls_peft_mod_of(int slot) { return slot / 2; }
static bool ls_peft_is_a(int slot) { return slot % 2 == 0; }

/* The rank a 2D factor shows: axis 0 of lora_A, axis 1 of lora_B. */
static int64_t ls_peft_rank_of(const ls_adapter_ctx *c, size_t i) {
    const ls_adapter_in *in = &c->in[i];
    if (!in->name || in->t->ndim != 2) return -1;
    return ls_peft_is_a((int)(i % LS_AD_SLOTS)) ? in->t->shape[0] : in->t->shape[1];
}

/* The rank rank_pattern gives factor i's module; 0 when no key does. */
static int ls_peft_pattern_rank(const ls_adapter_ctx *c, size_t i) {
    return ls_adapter_mod_at(c, (int)(i / LS_AD_SLOTS), ls_peft_mod_of((int)(i % LS_AD_SLOTS)))->r_key
               ? ls_adapter_mod_at(c, (int)(i / LS_AD_SLOTS), ls_peft_mod_of((int)(i % LS_AD_SLOTS)))->rank
               : 0;
}

/* The adapter's r, for the modules no rank_pattern key matches: the rank
 * most of their factors show, so that one odd factor (say, a transposed
 * one) is the one reported, not all the others. */
static void ls_peft_find_rank(ls_adapter_ctx *c) {
    const size_t total = (size_t)c->dims->L * LS_AD_SLOTS;
    size_t best_count = 0;
    for (size_t i = 0; i < total; i++) {
        int64_t v = ls_peft_rank_of(c, i);
        if (v <= 0 || v > INT32_MAX || ls_peft_pattern_rank(c, i)) continue;
        size_t count = 0;
        for (size_t j = 0; j < total; j++) count += ls_peft_rank_of(c, j) == v && !ls_peft_pattern_rank(c, j);
        if (count > best_count) {
            best_count = count;
            c->rank = (int)v;
            c->rank_from = c->in[i].name;
        }
    }
}

/* A module's rank_pattern key and rank, for every module present. */
static void ls_peft_patterns(ls_adapter_ctx *c) {
    for (int l = 0; l < c->dims->L; l++)
        for (int m = 0; m < LS_MODS; m++) {
            const ls_adapter_in *a = ls_adapter_at(c, l, 2 * m), *b = a + 1;
            const ls_adapter_in *in = a->name ? a : b;
            if (!in->name || !c->rules) continue;
            char module[192];
            ls_adapter_mod *md = ls_adapter_mod_at(c, l, m);
            md->rank = ls_peft_rules_rank(c->rules, ls_adapter_module_name(in, module, sizeof module), &md->r_key);
        }
}

static void ls_peft_missing(ls_adapter_ctx *c, int l, int slot, const ls_adapter_in *partner) {
    /* Named as the partner is, in its family's spelling: only the factor
     * letter differs. */
    char name[192], hint[256];
    snprintf(name, sizeof name, "%s", partner->name);
    size_t n = strlen(name);
    if (n >= 8) name[n - 8] = ls_peft_is_a(slot) ? 'A' : 'B';
    const char *label = ls_adapter_slot_label(LS_ADAPTER_FORMAT_PEFT, slot);
    snprintf(hint, sizeof hint, "upload %s together with %s, or leave both out",
             ls_adapter_slot_label(LS_ADAPTER_FORMAT_PEFT, slot ^ 1), label);
    ls_adapter_violation(c, LS_LORA_MISSING_TENSOR, l, name, LS_NA, LS_NA, LS_NA, hint,
                         "layer %d: %s is missing; %s was uploaded without it", l, name, partner->name);
}

static bool ls_peft_is_2d(ls_adapter_ctx *c, int l, const ls_adapter_in *in, bool is_a) {
    const ls_tensor *t = in->t;
    if (t->ndim == 2) return true;
    char shape[96];
    ls_shape_str(t->shape, t->ndim >= 0 && t->ndim <= LS_MAX_DIMS ? t->ndim : 0, shape, sizeof shape);
    ls_adapter_violation(c, LS_INVALID_SHAPE, l, in->name, LS_NA, 2, t->ndim,
                         "PEFT factors are 2D: lora_A [r, in_features], lora_B [out_features, r]",
                         "layer %d: %s has %d dimensions %s; a PEFT %s factor is 2D", l, in->name, t->ndim, shape,
                         is_a ? "lora_A" : "lora_B");
    return false;
}

/* Checks an expert-major axis of n blocks of `per` each (docs/api.md, errors:
 * divisible by n first, then the block size against the model). */
static void ls_peft_expert_axis(ls_adapter_ctx *c, int l, const ls_adapter_in *in, int axis, int per,
                                const char *per_name, const char *what, const char *hint) {
    const int64_t got = in->t->shape[axis], n = c->dims->n, want = n * per;
    if (got == want) return;
    /* Whole blocks of the served F: most likely trained for a model with
     * another count of shared experts (the axis alone cannot tell that
     * from another F, so both are said). */
    char other_f[80] = "";
    if (got % per == 0 && (got / n) % (per / c->dims->F) == 0)
        snprintf(other_f, sizeof other_f, "; or one for an intermediate size of %lld per expert",
                 (long long)(got / n / (per / c->dims->F)));
    if (got % per == 0)
        ls_adapter_violation(c, LS_LORA_EXPERT_COUNT_MISMATCH, l, in->name, axis, want, got,
                             "use an adapter trained for this model: GET /model shows its n and F",
                             "layer %d: %s has %lld %s (axis %d) = %lld * %s: an adapter for %lld shared experts of F "
                             "= %d, and this server serves n = %lld (expected n * %s = %lld, expert-major)%s",
                             l, in->name, (long long)got, what, axis, (long long)(got / per), per_name,
                             (long long)(got / per), c->dims->F, (long long)n, per_name, (long long)want, other_f);
    else if (got % n != 0)
        ls_adapter_violation(c, LS_LORA_EXTENT_NOT_DIVISIBLE, l, in->name, axis, want, got, hint,
                             "layer %d: %s has %lld %s (axis %d), not divisible by the n = %lld shared experts; "
                             "expected n * %s = %lld * %d = %lld, expert-major",
                             l, in->name, (long long)got, what, axis, (long long)n, per_name, (long long)n, per,
                             (long long)want);
    else
        ls_adapter_violation(c, LS_LORA_INTERMEDIATE_MISMATCH, l, in->name, axis, want, got, hint,
                             "layer %d: %s has %lld %s (axis %d) = n * %lld, expected n * %s = %lld * %d = %lld", l,
                             in->name, (long long)got, what, axis, (long long)(got / n), per_name, (long long)n, per,
                             (long long)want);
}

static const char *ls_peft_rank_hint =
    "every lora_A and lora_B of an adapter has one rank r (or the one rank_pattern gives its module): lora_A is "
    "[r, in_features], lora_B is [out_features, r]; re-export the factors, or state rank_pattern (in "
    "adapter_config.json, a JSON upload's config, or a raw body's __metadata__)";

/* The rank a module's factors must show: rank_pattern's, else r's. */
static int ls_peft_want(const ls_adapter_ctx *c, int l, int m) {
    const ls_adapter_mod *md = ls_adapter_mod_at(c, l, m);
    return md->r_key ? md->rank : c->rank;
}

static void ls_peft_rank_axis(ls_adapter_ctx *c, int l, int m, const ls_adapter_in *in, int axis, const char *hint) {
    const int64_t got = in->t->shape[axis];
    const int want = ls_peft_want(c, l, m);
    const ls_adapter_mod *md = ls_adapter_mod_at(c, l, m);
    if (want < 1 || got == want) return;
    if (md->r_key)
        ls_adapter_violation(c, LS_LORA_RANK_MISMATCH, l, in->name, axis, want, got, hint,
                             "layer %d: %s rank axis (%d) is %lld, expected r = %d (rank_pattern key \"%.60s\")", l,
                             in->name, axis, (long long)got, want, md->r_key);
    else
        ls_adapter_violation(c, LS_LORA_RANK_MISMATCH, l, in->name, axis, want, got, hint,
                             "layer %d: %s rank axis (%d) is %lld, expected r = %d (the rank of %s)", l, in->name,
                             axis, (long long)got, want, c->rank_from);
}

/* in_features of a module's lora_A and out_features of its lora_B. */
static int64_t ls_peft_in_features(const ls_adapter_ctx *c, int m) {
    return m == LS_MOD_DOWN ? (int64_t)c->dims->n * c->dims->F : c->dims->H;
}
static int64_t ls_peft_out_features(const ls_adapter_ctx *c, int m) {
    const int64_t nF = (int64_t)c->dims->n * c->dims->F;
    return m == LS_MOD_DOWN ? c->dims->H : m == LS_MOD_GATE_UP ? 2 * nF : m == LS_MOD_SGATE ? 1 : nF;
}

/* lora_A [r, in_features]: H for gate_up, gate, up and the shared-expert
 * gate; n*F for down. */
static void ls_peft_check_a(ls_adapter_ctx *c, int l, int m, const ls_adapter_in *in) {
    if (!ls_peft_is_2d(c, l, in, true)) return;
    const ls_tensor *t = in->t;
    const int64_t in_features = ls_peft_in_features(c, m);
    const int want = ls_peft_want(c, l, m);
    char hint[256];
    const char *rank_hint = ls_peft_rank_hint, *feat_hint = NULL;
    if (want > 0 && in_features != want && t->shape[0] == in_features && t->shape[1] == want) {
        snprintf(hint, sizeof hint, "the tensor looks transposed: PEFT stores lora_A as [r, in_features] = [%d, %lld]",
                 want, (long long)in_features);
        rank_hint = feat_hint = hint;
    }
    ls_peft_rank_axis(c, l, m, in, 0, rank_hint);
    if (m != LS_MOD_DOWN) {
        if (t->shape[1] != c->dims->H)
            ls_adapter_violation(c, LS_LORA_HIDDEN_MISMATCH, l, in->name, 1, c->dims->H, t->shape[1], feat_hint,
                                 "layer %d: %s input axis (1) is %lld, expected the hidden size H = %d", l, in->name,
                                 (long long)t->shape[1], c->dims->H);
    } else {
        ls_peft_expert_axis(c, l, in, 1, c->dims->F, "F", "columns", feat_hint);
    }
}

/* lora_B [out_features, r]: n*2F for gate_up, n*F for gate and up, H for
 * down, 1 for the shared-expert gate. */
static void ls_peft_check_b(ls_adapter_ctx *c, int l, int m, const ls_adapter_in *in) {
    if (!ls_peft_is_2d(c, l, in, false)) return;
    const ls_tensor *t = in->t;
    const int64_t out_features = ls_peft_out_features(c, m);
    const int want = ls_peft_want(c, l, m);
    char hint[256];
    const char *rank_hint = ls_peft_rank_hint, *feat_hint = NULL;
    if (want > 0 && out_features != want && t->shape[0] == want && t->shape[1] == out_features) {
        snprintf(hint, sizeof hint, "the tensor looks transposed: PEFT stores lora_B as [out_features, r] = [%lld, %d]",
                 (long long)out_features, want);
        rank_hint = feat_hint = hint;
    }
    ls_peft_rank_axis(c, l, m, in, 1, rank_hint);
    if (m == LS_MOD_GATE_UP)
        ls_peft_expert_axis(c, l, in, 0, 2 * c->dims->F, "2F", "rows", feat_hint);
    else if (m == LS_MOD_SGATE) {
        if (t->shape[0] != 1)
            ls_adapter_violation(c, LS_INVALID_SHAPE, l, in->name, 0, 1, t->shape[0],
                                 feat_hint ? feat_hint : "PEFT stores the gate's lora_B as [1, r]",
                                 "layer %d: %s output axis (0) is %lld, expected 1 (the gate is one value a token)",
                                 l, in->name, (long long)t->shape[0]);
    } else if (m != LS_MOD_DOWN)
        ls_peft_expert_axis(c, l, in, 0, c->dims->F, "F", "rows", feat_hint);
    else if (t->shape[0] != c->dims->H)
        ls_adapter_violation(c, LS_LORA_HIDDEN_MISMATCH, l, in->name, 0, c->dims->H, t->shape[0], feat_hint,
                             "layer %d: %s output axis (0) is %lld, expected the hidden size H = %d", l, in->name,
                             (long long)t->shape[0], c->dims->H);
}

/* A factor of Qwen's shared_expert_gate needs a model with that gate,
 * whose value the server computes, and a backend that applies it. */
static void ls_peft_check_gate(ls_adapter_ctx *c, int l, const ls_adapter_in *in) {
    if (!c->dims->gate)
        ls_adapter_violation(c, LS_LORA_UNKNOWN_TENSOR, l, in->name, LS_NA, LS_NA, LS_NA,
                             "load it on a server of a model with a shared-expert gate (Qwen2-MoE, Qwen3-Next, "
                             "Qwen3.5-MoE), or leave the gate's factors out",
                             "layer %d: %s is a factor of the shared-expert gate, and this server's model has none "
                             "(GET /model shows \"gate\": false)",
                             l, in->name);
    else if (c->pool->no_gate_lora)
        ls_adapter_violation(c, LS_LORA_UNKNOWN_TENSOR, l, in->name, LS_NA, LS_NA, LS_NA,
                             "serve it with --device cpu, or train it without the gate (exclude_modules "
                             "[\"shared_expert_gate\"]): the CUDA backend does not apply the gate's factors yet",
                             "layer %d: %s is a factor of the shared-expert gate, which the CUDA backend does not "
                             "apply",
                             l, in->name);
}

/* Factors of one layer: pairs, shapes, one form of gate and up, and
 * whether layers_to_transform lets PEFT have created them. */
static void ls_peft_check_layer(ls_adapter_ctx *c, int l) {
    for (int m = 0; m < LS_MODS; m++) {
        const ls_adapter_in *a = ls_adapter_at(c, l, 2 * m), *b = a + 1;
        if (!a->name && !b->name) continue;
        if (!a->name) ls_peft_missing(c, l, 2 * m, b);
        if (!b->name) ls_peft_missing(c, l, 2 * m + 1, a);
        if (a->name) ls_peft_check_a(c, l, m, a);
        if (b->name) ls_peft_check_b(c, l, m, b);
        const ls_adapter_in *in = a->name ? a : b;
        if (m == LS_MOD_SGATE) ls_peft_check_gate(c, l, in);
        char module[192], layers[96];
        long long index;
        const char *scope = ls_peft_rules_left_out(c->rules, ls_adapter_module_name(in, module, sizeof module));
        if (scope) {
            ls_adapter_violation(c, LS_ADAPTER_CONFIG_INVALID, l, in->name, LS_NA, LS_NA, LS_NA,
                                 "correct target_modules and exclude_modules in the config, or leave out the factors "
                                 "of the modules they leave out",
                                 "layer %d: %s is a factor of %s, which the config's %s %s: PEFT would neither create "
                                 "nor load it",
                                 l, in->name, module, scope,
                                 strcmp(scope, "exclude_modules") ? "does not name" : "names");
            continue;
        }
        if (ls_peft_rules_layer_ok(c->rules, module, &index)) continue;
        ls_peft_rules_layers_str(c->rules, layers, sizeof layers);
        if (index >= 0)
            ls_adapter_violation(c, LS_ADAPTER_CONFIG_INVALID, l, in->name, LS_NA, LS_NA, index,
                                 "correct layers_to_transform, or leave out the factors of the layers it excludes",
                                 "layer %d: %s is a factor of layer %lld, which layers_to_transform %s leaves out: "
                                 "PEFT would neither create nor load it",
                                 l, in->name, index, layers);
        else
            ls_adapter_violation(c, LS_ADAPTER_CONFIG_INVALID, l, in->name, LS_NA, LS_NA, LS_NA,
                                 "correct layers_pattern: the name of the module list that holds the layers",
                                 "layer %d: PEFT finds no layer index in %s with the config's layers_pattern, so "
                                 "layers_to_transform %s would leave it out",
                                 l, in->name, layers);
    }
    const ls_adapter_in *fused = ls_adapter_at(c, l, LS_AD_GU_A);
    if (!fused->name) fused = fused + 1;
    for (int k = LS_AD_G_A; fused->name && k <= LS_AD_U_B; k++) {
        const ls_adapter_in *sep = ls_adapter_at(c, l, k);
        if (!sep->name) continue;
        ls_adapter_violation(c, LS_LORA_UNKNOWN_TENSOR, l, sep->name, LS_NA, LS_NA, LS_NA,
                             "give gate and up either fused (gate_up_proj) or separate (gate_proj, up_proj), not both",
                             "layer %d: %s is a separate factor of gate or up, but %s gives them fused: the delta "
                             "would be added twice",
                             l, sep->name, fused->name);
        break;
    }
}

/* Refuses PEFT factors whose lora_alpha is stated nowhere (PEFT scales
 * them by lora_alpha / r, and a default of 1 would change every output
 * without a word) unless a scale is given instead, and a scale given
 * beside an alpha (one of them would be ignored). */
static void ls_peft_scale_refused(ls_adapter_ctx *c, const char *module, bool both) {
    if (both) {
        ls_adapter_violation(c, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA,
                             "PEFT factors are scaled by lora_alpha / r (with use_rslora, lora_alpha / sqrt(r)), or "
                             "by a scale given instead: give one of lora_alpha and scale",
                             "scale and lora_alpha (or alpha_pattern, for %s) are both given; each sets the scale",
                             module);
        return;
    }
    ls_adapter_violation(c, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA,
                         "state lora_alpha: ?lora_alpha= on a raw safetensors body, \"config\": {\"lora_alpha\"} in "
                         "a JSON upload, __metadata__ lora_alpha in the file, or lora_alpha in the PEFT directory's "
                         "adapter_config.json (PEFT's LoraConfig default is 8: state 8 if the adapter was trained "
                         "without setting it); or give scale to set the scale itself",
                         "lora_alpha is stated nowhere (%s): PEFT scales the factors by lora_alpha / r", module);
}

/* A pattern key for a message: a file's by its place, a request's
 * quoted, control bytes as '?', cut at 48 bytes with "...". Returns buf. */
static const char *ls_peft_key_shown(const ls_peft_key *k, char *buf, size_t len) {
    if (k->index) {
        snprintf(buf, len, "key %zu of adapter_config.json", k->index);
        return buf;
    }
    char text[49];
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)k->key; *p && n < sizeof text - 1; p++)
        text[n++] = *p < 0x20 || *p == 0x7f ? '?' : (char)*p;
    text[n] = '\0';
    snprintf(buf, len, "key \"%s%s\"", text, strlen(k->key) > n ? "..." : "");
    return buf;
}

/* Two alpha_pattern keys that both match a module with different
 * values: the file's first applies, as in PEFT's loader, but PEFT's
 * save_pretrained sorts the keys, so the order trained with is not
 * known. The load stands (it computes what PEFT loads) and says so. */
static void ls_peft_note_shadowed(ls_adapter_ctx *c, const char *module) {
    ls_peft_key first, later;
    if (!ls_peft_rules_alpha_shadowed(c->rules, module, &first, &later)) return;
    char a[96], b[96];
    snprintf(c->warnings[LS_WARN_ALPHA_ORDER], sizeof c->warnings[LS_WARN_ALPHA_ORDER],
             "alpha_pattern %s (%.17g) and %s (%.17g) both match %.96s: the first in the file's order applies, as "
             "in PEFT's loader, but PEFT saves the keys sorted, so the adapter may have been trained with the other; "
             "make the keys match disjoint modules",
             ls_peft_key_shown(&first, a, sizeof a), first.value, ls_peft_key_shown(&later, b, sizeof b), later.value,
             module);
}

/* The modules of the LoRA factors the upload holds for other modules
 * (skipped here, applied by PEFT): each pattern key they match is hit. */
static void ls_peft_hit_skipped(const ls_adapter_ctx *c, bool *hit, size_t n) {
    const size_t prefix = strlen(LS_ADAPTER_PREFIX);
    for (size_t i = 0; c->tensors && i < c->tensors->n; i++) {
        const char *name = c->tensors->items[i].name;
        ls_adapter_name nm;
        ls_adapter_name_parse(name, &nm);
        char module[256];
        if (nm.kind == LS_AN_OTHER && nm.lora &&
            ls_adapter_other_module(name + (nm.prefixed ? prefix : 0), (int)sizeof module - 4, module, sizeof module)) {
            ls_peft_rules_hits(c->rules, module, hit, n);
            ls_peft_rules_hits_params(c->rules, module, hit, n);
        }
    }
}

/* After the modules' keys were hit (hit, n of them): the first pattern
 * key that matches none of the modules the upload has factors of. It
 * changes nothing, as in PEFT, but a key written for target_modules'
 * names ("up_proj") beside target_parameters' ("up_proj.weight"), or
 * misspelt, looks as if it did. A key for a module whose factors are
 * skipped (a dense layer's) is PEFT's to apply there, and says nothing. */
static void ls_peft_note_unmatched(ls_adapter_ctx *c, bool *hit, size_t n) {
    if (n) ls_peft_hit_skipped(c, hit, n);
    for (size_t i = 0; i < n; i++) {
        if (hit[i]) continue;
        const char *pattern;
        const ls_peft_key k = ls_peft_rules_key(c->rules, i, &pattern);
        char shown[96];
        snprintf(c->warnings[LS_WARN_UNMATCHED_KEY], sizeof c->warnings[LS_WARN_UNMATCHED_KEY],
                 "%s %s matches none of the modules this adapter has factors of, so it changes "
                 "nothing (PEFT matches a key against the module's whole name, (.*\\.)?(key)$, and for "
                 "target_parameters against \"{module}.weight\")",
                 pattern, ls_peft_key_shown(&k, shown, sizeof shown));
        return;
    }
}

/* The rank and scale of every module present, once the shapes agree:
 * scale = lora_alpha / r (rsLoRA: / sqrt(r)) with the module's own r
 * and lora_alpha (alpha_pattern's, else the config's), or the scale
 * given instead of any alpha; neither is refused. The adapter's rank is
 * the largest but the gate's (1 when the gate is alone). */
static void ls_peft_settle(ls_adapter_ctx *c, const char **largest) {
    const ls_adapter_params *p = c->params;
    int max = 0, gate_rank = 0;
    const char *gate_name = NULL;
    bool refused = false, any = false, all_zero = true;
    bool hit[256] = {false}; /* the pattern keys some module matches */
    const size_t keys = ls_peft_rules_keys(c->rules, sizeof hit / sizeof *hit);
    for (int l = 0; l < c->dims->L; l++)
        for (int m = 0; m < LS_MODS; m++) {
            const ls_adapter_in *a = ls_adapter_at(c, l, 2 * m);
            ls_adapter_mod *md = ls_adapter_mod_at(c, l, m);
            if (!a->name && !a[1].name) continue;
            md->rank = ls_peft_want(c, l, m);
            double alpha = p->lora_alpha;
            char module[192];
            ls_adapter_module_name(a->name ? a : a + 1, module, sizeof module);
            bool has = ls_peft_rules_alpha(c->rules, module, &alpha, NULL) || p->has_alpha;
            if (!c->warnings[LS_WARN_ALPHA_ORDER][0]) ls_peft_note_shadowed(c, module);
            if (keys) ls_peft_rules_hits(c->rules, module, hit, keys);
            const double r = md->rank > 0 ? md->rank : 1;
            md->scale = has ? (p->use_rslora ? alpha / sqrt(r) : alpha / r) : p->scale;
            any = true;
            all_zero = all_zero && md->scale == 0;
            if (!refused && has == p->has_scale) ls_peft_scale_refused(c, module, has), refused = true;
            /* The gate's factors fold into one vector: its rank takes no
             * room in a slot. */
            if (m == LS_MOD_SGATE) {
                gate_rank = md->rank > gate_rank ? md->rank : gate_rank;
                if (!gate_name) gate_name = a->name ? a->name : a[1].name;
            } else if (md->rank > max) {
                max = md->rank;
                *largest = a->name ? a->name : a[1].name;
            }
        }
    if (!max && gate_rank) { /* the gate alone: a slot of rank 1 holding zeros */
        max = 1;
        *largest = gate_name;
    }
    /* The scale reported is that of the modules no pattern matches. */
    const int r0 = c->rank > 0 ? c->rank : p->r;
    c->scale = p->has_scale ? p->scale : 1.0;
    if (p->has_alpha && r0 > 0) c->scale = p->use_rslora ? p->lora_alpha / sqrt((double)r0) : p->lora_alpha / (double)r0;
    c->rank = max;
    ls_peft_note_unmatched(c, hit, keys);
    /* PEFT takes lora_alpha 0 too; a load that adds nothing is worth a word. */
    if (any && all_zero)
        snprintf(c->warnings[LS_WARN_ZERO_SCALE], sizeof c->warnings[LS_WARN_ZERO_SCALE],
                 "every module's scale is 0 (lora_alpha, alpha_pattern or scale 0): the adapter changes no output");
}

/* gate_up_order orders the rows of a fused gate_up_proj.lora_B: stated
 * for an upload without one, it would be ignored. */
static void ls_peft_check_order(ls_adapter_ctx *c) {
    const ls_adapter_params *p = c->params;
    if (!p->has_order || p->gate_up_order != LS_GATE_UP_ORDER_INTERLEAVED) return;
    bool fused = false, separate = false;
    for (int l = 0; l < c->dims->L; l++) {
        fused |= ls_adapter_at(c, l, LS_AD_GU_B)->name != NULL;
        separate |= ls_adapter_at(c, l, LS_AD_G_B)->name || ls_adapter_at(c, l, LS_AD_U_B)->name;
    }
    if (!fused && separate)
        ls_adapter_violation(c, LS_ADAPTER_CONFIG_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA,
                             "drop gate_up_order: separate gate_proj and up_proj factors have no row order to state",
                             "gate_up_order \"interleaved\" orders the rows of a fused gate_up_proj.lora_B, and this "
                             "upload has none");
}

/* Reports into c; allocates nothing. */
/* The sizes one factor shows: its hidden size (*h) or its width n*F
 * (*w), -1 for the one it does not show. */
static void ls_peft_sizes(int slot, const ls_tensor *t, int64_t *h, int64_t *w) {
    *h = *w = -1;
    if (t->ndim != 2) return;
    if (slot == LS_AD_GU_A || slot == LS_AD_G_A || slot == LS_AD_U_A || slot == LS_AD_SG_A) *h = t->shape[1];
    else if (slot == LS_AD_D_B) *h = t->shape[0];
    else if (slot == LS_AD_D_A) *w = t->shape[1];
    else if (slot == LS_AD_G_B || slot == LS_AD_U_B) *w = t->shape[0];
    else if (slot == LS_AD_GU_B && t->shape[0] % 2 == 0) *w = t->shape[0] / 2;
}

/* Every factor agreeing on one hidden size (and one width) that is not
 * the model's: the adapter was trained on another model, which says more
 * than its first wrong axis (its violations stay, each). */
static void ls_peft_other_model(ls_adapter_ctx *c) {
    int64_t H = -1, W = -1;
    for (size_t i = 0; i < (size_t)c->dims->L * LS_AD_SLOTS; i++) {
        if (!c->in[i].name || !c->in[i].t) continue;
        int64_t h, w;
        ls_peft_sizes((int)(i % LS_AD_SLOTS), c->in[i].t, &h, &w);
        if ((h >= 0 && H >= 0 && h != H) || (w >= 0 && W >= 0 && w != W)) return; /* no one model */
        if (h >= 0) H = h;
        if (w >= 0) W = w;
    }
    const int64_t nF = (int64_t)c->dims->n * c->dims->F;
    /* Only the width wrong: the first violation says it better (another
     * count of experts, or another F). */
    if (H < 0 || W < 0 || H == c->dims->H) return;
    ls_error_headline(c->err, "load an adapter trained on the model this server serves (GET /model gives its sizes)",
                      "the adapter was made for another model: its factors give hidden size %lld and a shared-expert "
                      "width n*F of %lld, this server's model has H = %d and n*F = %d*%d = %lld",
                      (long long)H, (long long)W, c->dims->H, c->dims->n, c->dims->F, (long long)nF);
    /* The headline's code too when the first violation is a width's,
     * which would label another hidden size as another expert count. */
    if (c->first == LS_LORA_EXPERT_COUNT_MISMATCH || c->first == LS_LORA_INTERMEDIATE_MISMATCH)
        c->first = c->err->code = LS_LORA_HIDDEN_MISMATCH;
}

void ls_adapter_peft_check(ls_adapter_ctx *c) {
    ls_peft_patterns(c);
    ls_peft_find_rank(c);
    /* No 2D factor shows a rank of 1 or more (each has an empty rank
     * axis), so the per-factor checks below have nothing to compare
     * against. As the pool format answers it: an invalid shape, named on a
     * 2D factor: one that is not 2D shows no rank at all and is reported
     * as such below, so a rank problem on it would only be a consequence. */
    const size_t total = (size_t)c->dims->L * LS_AD_SLOTS;
    bool any_rank = c->rank > 0;
    for (size_t i = 0; !any_rank && i < total; i++) any_rank = ls_peft_pattern_rank(c, i) > 0;
    for (size_t i = 0; !any_rank && i < total; i++) {
        const int64_t r = ls_peft_rank_of(c, i);
        if (r < 0) continue;
        ls_adapter_violation(c, LS_INVALID_SHAPE, (int)(i / LS_AD_SLOTS), c->in[i].name, LS_NA, LS_NA, r,
                             "an adapter has a rank r from 1 to the pool's max rank: lora_A is [r, in_features], "
                             "lora_B [out_features, r]",
                             "%s has rank %lld: no factor of the adapter has a usable rank of 1 or more",
                             c->in[i].name, (long long)r);
        break;
    }
    for (int l = 0; l < c->dims->L; l++) ls_peft_check_layer(c, l);
    ls_peft_check_order(c);
    c->outer = 1;
    const ls_adapter_params *p = c->params;
    if (c->rank > 0 && p->r > 0 && p->r != c->rank) {
        char hint[256];
        snprintf(hint, sizeof hint, "set \"r\": %d in the adapter config, or upload the factors of rank %d it names",
                 c->rank, p->r);
        ls_adapter_violation(c, LS_LORA_RANK_MISMATCH, LS_NA, c->rank_from, LS_NA, p->r, c->rank, hint,
                             "the adapter config says r = %d, but the factors have rank %d (e.g. %s)", p->r, c->rank,
                             c->rank_from);
    }
    if (!any_rank) return;
    const char *largest = c->rank_from;
    ls_peft_settle(c, &largest);
    if (c->rank > c->pool->max_rank) {
        char hint[256];
        snprintf(hint, sizeof hint,
                 "restart the server with --max-rank %d (or larger), or upload an adapter of rank <= %d", c->rank,
                 c->pool->max_rank);
        ls_adapter_violation(c, LS_LORA_RANK_TOO_LARGE, LS_NA, largest, LS_NA, c->pool->max_rank, c->rank, hint,
                             "the adapter's rank r = %d (its largest module's, %s) exceeds the pool's max rank R = %d",
                             c->rank, largest, c->pool->max_rank);
    }
    ls_peft_other_model(c);
}
