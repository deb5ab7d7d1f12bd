/* An adapter normalised for the pool: PEFT or pool-format tensors checked
 * against every invariant of docs/api.md (all violations collected), scaled,
 * and kept on the host at the adapter's own rank. ls_adapter_expand pads
 * one layer to the pool's max rank for a slot write. */
#ifndef LS_LORA_ADAPTER_H
#define LS_LORA_ADAPTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dims.h"
#include "common/error.h"
#include "common/tensor.h"

typedef enum { LS_ADAPTER_FORMAT_AUTO, LS_ADAPTER_FORMAT_PEFT, LS_ADAPTER_FORMAT_POOL } ls_adapter_format;

const char *ls_adapter_format_name(ls_adapter_format f);
bool ls_adapter_format_parse(const char *s, ls_adapter_format *out);

/* The row order of a PEFT gate_up_proj.lora_B [n*2F, r] within each
 * expert's 2F rows: GATE_UP is F gate rows then F up rows (sglang's
 * fused module), INTERLEAVED alternates gate, up, gate, up. Nothing in a
 * PEFT file says which, so the trainer's module decides and the upload
 * states it; the pool keeps gate then up. */
typedef enum { LS_GATE_UP_ORDER_GATE_UP, LS_GATE_UP_ORDER_INTERLEAVED } ls_gate_up_order;

const char *ls_gate_up_order_name(ls_gate_up_order o);
bool ls_gate_up_order_parse(const char *s, ls_gate_up_order *out);

/* Room for the per-module rules of a PEFT config (ls_adapter_params.peft). */
#define LS_ADAPTER_PEFT_TEXT 8192

/* What the upload says about itself besides its tensors. */
typedef struct {
    ls_adapter_format format; /* AUTO: follow the tensor names */
    int r;                    /* 0 = not given; else must agree with the shapes */
    bool has_alpha;           /* without alpha the scale is 1 */
    double lora_alpha;
    bool has_rslora;          /* use_rslora was stated */
    bool use_rslora;
    bool whole_config;        /* r, alpha and rslora come as one config: merged as a whole */
    bool has_scale; /* pool format: multiply the B factors by scale */
    double scale;
    bool strict; /* tensors of other modules are errors, not ignored */
    bool has_order; /* gate_up_order was stated */
    ls_gate_up_order gate_up_order; /* PEFT only */
    /* rank_pattern, alpha_pattern, layers_to_transform (with layers_pattern
     * and target_modules' full names) of the config, in the compact form
     * of lora/adapter_rules.h; "" when none. Part of a whole config. */
    bool has_peft; /* stated apart from a whole config (a __metadata__ key) */
    char peft[LS_ADAPTER_PEFT_TEXT];
    /* A config key that is no LoraConfig key but a near miss of one that
     * changes the math: the load's warning (LS_WARN_CONFIG_KEY); "" none.
     * Part of a whole config. */
    char config_note[384];
} ls_adapter_params;

/* What describes an adapter whoever holds it: the adapter itself, the
 * pool's entry (also while its factors are dropped from the host tier)
 * and a client's snapshot embed it, so it is copied as one. */
typedef struct {
    ls_adapter_format format;
    int rank;
    int outer; /* O' of the upload: 1 or n */
    double scale;
    char sha256[65]; /* hex SHA-256 of the factors as little-endian fp32 bytes, all layers */
    size_t bytes;    /* host bytes the factors take */
    size_t n_ignored; /* tensors of other modules that were skipped */
    bool gate;        /* factors of the shared-expert gate: each layer's block ends in its delta [H] */
} ls_adapter_meta;

/* A normalised adapter (host, fp32, own rank r). For every layer l < L the
 * factors are stored compact in the layout ls_factor_layout_of(dims,
 * outer, rank), zeros where the upload has no factor, scale already
 * folded into the B factors; with meta.gate the block then holds the
 * shared-expert gate's delta s * B * A [H] (zeros on a layer without). */
/* The kinds of warning a load that stands may carry. */
enum {
    LS_WARN_ALPHA_ORDER,
    LS_WARN_SKIPPED_MLP,
    LS_WARN_CONFIG_KEY,
    LS_WARN_UNMATCHED_KEY,
    LS_WARN_ZERO_SCALE,
    LS_ADAPTER_WARNINGS
};

/* What each kind of PEFT module got, layer by layer: the rank and scale
 * its factors were read with (r, lora_alpha, use_rslora and the
 * patterns), for the replies of validate and load to show. Kinds: fused
 * gate_up, down, gate, up, and Qwen's shared_expert_gate. */
#define LS_ADAPTER_MODULE_KINDS 5
typedef struct {
    char name[LS_ADAPTER_MODULE_KINDS][32]; /* the module's own name ("gate_proj", "input_linear"); "" absent */
    int *rank;                              /* [layers][kinds]: 0 where the module has no factors */
    double *scale;                          /* [layers][kinds] */
} ls_adapter_modules;

typedef struct {
    ls_adapter_meta meta;
    int layers;
    float *data;         /* owned; layers * layer_floats floats */
    size_t layer_floats; /* the layout's total */
    bool *layer_present; /* owned; layer carries at least one factor */
    char **ignored;      /* owned; meta.n_ignored names skipped as other modules' tensors */
    /* owned; NULL for the pool format and for copies read back from the
     * state directory. Not counted in meta.bytes. */
    ls_adapter_modules *modules;
    /* What its load should tell the client though it stands, one kind
     * each (LS_WARN_*): "" when nothing. */
    char warnings[LS_ADAPTER_WARNINGS][512];
} ls_adapter;

/* Validates tensors completely (every violation goes into err) and, when
 * valid, fills out (owned by the caller, ls_adapter_free). On failure out
 * is zeroed and nothing is allocated. */
ls_status ls_adapter_normalise(const ls_tensor_set *tensors, const ls_adapter_params *params, const ls_dims *dims,
                               const ls_pool_dims *pool, ls_adapter *out, ls_error *err);

/* Writes layer `layer` of a padded to the pool's R and broadcast to its O
 * into caller buffers of ls_pool_*_len floats each. */
void ls_adapter_expand(const ls_adapter *a, int layer, const ls_dims *dims, const ls_pool_dims *pool, float *gu_a,
                       float *gu_b, float *d_a, float *d_b);

/* Layer `layer`'s delta of the shared-expert gate [H] inside a's data, NULL
 * when the adapter has none there (no gate factors, or all zeros). */
const float *ls_adapter_gate(const ls_adapter *a, int layer, const ls_dims *dims);
/* The floats of one layer's block: the factor layout's, and H more with
 * the gate's delta. */
size_t ls_adapter_layer_floats(const ls_dims *dims, int outer, int rank, bool gate);
void ls_adapter_free(ls_adapter *a);

/* Hex SHA-256 of count floats as little-endian fp32 bytes: an adapter's
 * digest is that of its data, every layer in the compact layout. */
void ls_adapter_digest(const float *data, size_t count, char hex[65]);
/* The host bytes a holds (its data, layer flags and ignored names). */
size_t ls_adapter_host_bytes(const ls_adapter *a);

#endif
