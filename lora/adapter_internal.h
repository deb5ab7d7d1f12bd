/* Private to lora/adapter*.c: the name grammar, the per-layer table of
 * uploaded factors, and the validation context the format checkers share
 * (adapter.c drives, adapter_peft.c and adapter_pool.c check and fill). */
#ifndef LS_LORA_ADAPTER_INTERNAL_H
#define LS_LORA_ADAPTER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lora/adapter.h"

#define LS_ADAPTER_PREFIX "base_model.model."

/* What one uploaded name is. */
typedef enum {
    LS_AN_UNKNOWN, /* not a LoRA factor this server can take: always an error */
    LS_AN_OTHER,   /* a tensor of another module: ignored, or an error when strict */
    LS_AN_PEFT,    /* ...layers.{l}.{mlp,feed_forward}.shared_expert[s].{gate_up,gate,up,down}_proj.lora_{A,B}.weight */
    LS_AN_POOL,    /* model.layers.{l}.mlp.shared_experts.{gate_up,down}_lora_{a,b} */
} ls_adapter_name_kind;

/* Why an UNKNOWN name was refused; picks the message and the hint. */
typedef enum {
    LS_AN_WHY_NOT_LORA,    /* no LoRA factor at all */
    LS_AN_WHY_BAD_INDEX,   /* shared-experts name whose layer index is not plain digits */
    LS_AN_WHY_SHARED_FORM, /* names the shared experts in no form we know */
    LS_AN_WHY_DORA,        /* a DoRA magnitude vector */
    LS_AN_WHY_BIAS,        /* a lora_B bias (lora_bias) */
    LS_AN_WHY_GATE,        /* a factor of Qwen's shared_expert_gate in no form we know */
    LS_AN_WHY_COPY,        /* a weight or bias of a shared-expert module: a modules_to_save copy */
} ls_adapter_name_why;

/* Slots of a layer: first the four in the order of the factor layout
 * (PEFT: gate_up A, gate_up B, down A, down B; pool: gate_up_lora_a,
 * gate_up_lora_b, down_lora_a, down_lora_b), then PEFT's separate gate
 * and up projections, which the fusion (adapter_fuse.c) places into the
 * gate_up factors, then Qwen's shared_expert_gate (A [r, H], B [1, r]),
 * folded into one vector beside the factors (ls_adapter_gate). A and B
 * of one module sit side by side (B = A + 1). */
enum {
    LS_AD_GU_A = LS_FACTOR_GU_A,
    LS_AD_GU_B = LS_FACTOR_GU_B,
    LS_AD_D_A = LS_FACTOR_D_A,
    LS_AD_D_B = LS_FACTOR_D_B,
    LS_AD_G_A = LS_FACTORS,
    LS_AD_G_B,
    LS_AD_U_A,
    LS_AD_U_B,
    LS_AD_SG_A,
    LS_AD_SG_B,
    LS_AD_SLOTS
};

/* PEFT modules of a layer, each an (A, B) pair of slots 2m, 2m+1. */
enum { LS_MOD_GATE_UP, LS_MOD_DOWN, LS_MOD_GATE, LS_MOD_UP, LS_MOD_SGATE, LS_MODS };
_Static_assert(LS_MODS == LS_ADAPTER_MODULE_KINDS, "ls_adapter_modules has one kind per module");

typedef struct {
    ls_adapter_name_kind kind;
    ls_adapter_name_why why; /* UNKNOWN only */
    bool prefixed;           /* carried base_model.model. */
    bool lora;               /* OTHER: a LoRA factor (else a saved module's weight, a bias, trainable tokens) */
    int64_t layer;           /* PEFT/POOL: the parsed index (may be >= L) */
    int slot;                /* PEFT/POOL: LS_AD_* */
    size_t module_len;       /* PEFT: the module's name is the module_len bytes after the prefix */
} ls_adapter_name;

/* Classifies name by the grammar of docs/api.md (the prefix is optional; the
 * layer index is 1-18 plain digits without a leading zero). */
void ls_adapter_name_parse(const char *name, ls_adapter_name *out);
/* Writes the canonical name of (format, layer, slot) with or without the
 * prefix, e.g. to name a missing partner. */
void ls_adapter_name_build(char *buf, size_t len, ls_adapter_format format, bool prefixed, int layer, int slot);
/* Short label of a slot for messages: "gate_up_proj.lora_A", "down_lora_b". */
const char *ls_adapter_slot_label(ls_adapter_format format, int slot);

/* One uploaded factor placed in the layer table; name NULL when absent. */
typedef struct {
    const char *name; /* borrowed from the tensor set */
    const ls_tensor *t;
    bool prefixed;
    size_t module_len; /* PEFT: see ls_adapter_name */
} ls_adapter_in;

/* What the checks settle for one PEFT module of one layer. */
typedef struct {
    int rank;          /* its factors' rank once agreed, else 0 */
    double scale;      /* folded into its B factor */
    const char *r_key; /* the rank_pattern key that set its rank, NULL: r */
} ls_adapter_mod;

typedef struct {
    const ls_adapter_params *params;
    const ls_dims *dims;
    const ls_pool_dims *pool;
    ls_error *err;
    int bad;                  /* violations added by this call */
    ls_status first;          /* code of the first of them */
    ls_adapter_format format; /* resolved: PEFT or POOL */
    ls_adapter_in *in;        /* [L][LS_AD_SLOTS] */
    bool *sane;               /* [L][LS_AD_SLOTS]: present, float dtype, bytes match the shape */
    int rank;                 /* the adapter's r once known, else 0 */
    const char *rank_from;    /* name of a tensor that shows r */
    int outer;                /* O' once known, else 0 */
    double scale;             /* folded into the B factors (PEFT: of modules no pattern matches) */
    ls_adapter_mod *mods;     /* PEFT: [L][LS_MODS] */
    const struct ls_peft_rules *rules; /* PEFT: the config's per-module rules, NULL: none */
    const ls_tensor_set *tensors;       /* the upload, borrowed */
    char warnings[LS_ADAPTER_WARNINGS][512]; /* what the load should say though it stands; "" none */
} ls_adapter_ctx;

static inline ls_adapter_in *ls_adapter_at(const ls_adapter_ctx *c, int layer, int slot) {
    return &c->in[(size_t)layer * LS_AD_SLOTS + (size_t)slot];
}
static inline ls_adapter_mod *ls_adapter_mod_at(const ls_adapter_ctx *c, int layer, int mod) {
    return &c->mods[(size_t)layer * LS_MODS + (size_t)mod];
}
static inline bool ls_adapter_is_sane(const ls_adapter_ctx *c, int layer, int slot) {
    return c->sane[(size_t)layer * LS_AD_SLOTS + (size_t)slot];
}

/* ls_error_add that also counts the violation in c. */
void ls_adapter_violation(ls_adapter_ctx *c, ls_status code, int layer, const char *tensor, int axis, int64_t expected,
                          int64_t got, const char *hint, const char *fmt, ...) __attribute__((format(printf, 9, 10)));

/* Value i (flat, row-major) of a float tensor as fp32. */
float ls_adapter_value(const ls_tensor *t, size_t i);

/* The most frequent of vals[0..n) (ties: the earliest); 0 when n is 0. */
int64_t ls_adapter_mode(const int64_t *vals, size_t n);

/* Per-format checks of every layer (structure, axes, ranks), then the
 * adapter-wide rank (and, for the pool format, outer layout). They fill
 * c->rank, c->outer. */
void ls_adapter_peft_check(ls_adapter_ctx *c);
void ls_adapter_pool_check(ls_adapter_ctx *c);

/* Writes layer l of a valid upload into dst (a->layer_floats floats,
 * zeroed by the caller), scale folded into the B factors: the PEFT form
 * fuses separate gate and up factors (adapter_fuse.c). */
void ls_adapter_peft_fill(const ls_adapter_ctx *c, int l, float *dst);
/* The module's name (without the prefix) of a placed PEFT factor into buf. */
const char *ls_adapter_module_name(const ls_adapter_in *in, char *buf, size_t len);
/* adapter.c: the module of name, a LoRA factor ("....q_proj" of
 * "....q_proj.lora_A.weight"), into buf, its first max bytes and "..."
 * when longer; false when name is no such factor. */
bool ls_adapter_other_module(const char *name, int max, char *buf, size_t len);
/* The uploaded factor (name) that fills element i of factor k of layer l's
 * compact layout: the original tensor to name in a message. */
const char *ls_adapter_source_of(const ls_adapter_ctx *c, int l, int k, size_t i);
void ls_adapter_pool_fill(const ls_adapter_ctx *c, int l, float *dst);
/* Whether any layer of the upload has a factor of the shared-expert gate. */
bool ls_adapter_has_gate(const ls_adapter_ctx *c);

#endif
