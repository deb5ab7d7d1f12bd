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
    LS_AN_OTHER,   /* a LoRA factor of another module: ignored, or an error when strict */
    LS_AN_PEFT,    /* model.layers.{l}.mlp.shared_experts.{gate_up,down}_proj.lora_{A,B}.weight */
    LS_AN_POOL,    /* model.layers.{l}.mlp.shared_experts.{gate_up,down}_lora_{a,b} */
} ls_adapter_name_kind;

/* Why an UNKNOWN name was refused; picks the message and the hint. */
typedef enum {
    LS_AN_WHY_NOT_LORA,    /* no LoRA factor at all */
    LS_AN_WHY_BAD_INDEX,   /* shared-experts name whose layer index is not plain digits */
    LS_AN_WHY_SHARED_FORM, /* names the shared experts in no form we know */
    LS_AN_WHY_UNFUSED,     /* gate_proj / up_proj factors of the shared experts */
    LS_AN_WHY_DORA,        /* a DoRA magnitude vector */
} ls_adapter_name_why;

/* Slots of a layer, in the order of the factor layout. PEFT: gate_up A,
 * gate_up B, down A, down B. Pool: gate_up_lora_a, gate_up_lora_b,
 * down_lora_a, down_lora_b. */
enum {
    LS_AD_GU_A = LS_FACTOR_GU_A,
    LS_AD_GU_B = LS_FACTOR_GU_B,
    LS_AD_D_A = LS_FACTOR_D_A,
    LS_AD_D_B = LS_FACTOR_D_B,
    LS_AD_SLOTS = LS_FACTORS
};

typedef struct {
    ls_adapter_name_kind kind;
    ls_adapter_name_why why; /* UNKNOWN only */
    bool prefixed;           /* carried base_model.model. */
    int64_t layer;           /* PEFT/POOL: the parsed index (may be >= L) */
    int slot;                /* PEFT/POOL: LS_AD_* */
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
} ls_adapter_in;

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
    double scale;             /* folded into the B factors */
} ls_adapter_ctx;

static inline ls_adapter_in *ls_adapter_at(const ls_adapter_ctx *c, int layer, int slot) {
    return &c->in[(size_t)layer * LS_AD_SLOTS + (size_t)slot];
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
 * zeroed by the caller), scale folded into the B factors. */
void ls_adapter_peft_fill(const ls_adapter_ctx *c, int l, float *dst);
void ls_adapter_pool_fill(const ls_adapter_ctx *c, int l, float *dst);

#endif
