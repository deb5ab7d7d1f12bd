/* Private to model/: where each served layer's tensors lie in the files of
 * a model (model.c reads them), how a Hugging Face family names its shared
 * experts and which layers have them (families.c), and the two readers
 * that fill a source: the single weights file (inkling.c) and the
 * checkpoint directory (checkpoint.c). */
#ifndef LS_MODEL_MODEL_INTERNAL_H
#define LS_MODEL_MODEL_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>

#include "format/safetensors.h"
#include "model/model.h"

/* Returns the status of call unless it is LS_OK. */
#define LS_MODEL_TRY(call)                \
    do {                                  \
        ls_status ls_try_ = (call);       \
        if (ls_try_ != LS_OK) return ls_try_; \
    } while (0)

/* The tensors of one served layer. The fused file has W13 [n, 2F, H] and
 * W2 [n, H, F]; a checkpoint has W13 = gate_proj [F, H], UP = up_proj
 * [F, H] (stacked below it: contiguous rows), W2 = down_proj [H, F] and,
 * in the Qwen families, GATE = shared_expert_gate [1, H]. */
enum { LS_MT_W13, LS_MT_UP, LS_MT_W2, LS_MT_GATE, LS_MT_COUNT };

/* One tensor's bytes: file (index into the source's fds, -1 = absent)
 * and its header entry (name owned). An FP8 weight also has its
 * weight_scale_inv. */
typedef struct {
    int file;
    ls_st_info info;
    int scale_file; /* -1: not block-quantized */
    ls_st_info scale;
} ls_model_tensor;

struct ls_model_source {
    int *fds;         /* [n_fds], each open for reading */
    char **names;     /* [n_fds] owned: each file's name in messages */
    int n_fds;
    ls_model_tensor *t; /* [L][LS_MT_COUNT] */
    size_t n_t;
    int block[2];     /* FP8 block of weight_scale_inv (rows, columns) */
};

/* Frees the source: every descriptor closed, every name freed. */
void ls_model_source_free(ls_model_source *s);
/* Allocates a source for L layers (every tensor absent). */
ls_model_source *ls_model_source_new(int L);
/* Takes fd (closed with the source); its index, or -1 when out of memory
 * (fd is then closed). name (copied) names it in messages. */
int ls_model_source_add_fd(ls_model_source *s, int fd, const char *name);
static inline ls_model_tensor *ls_model_tensor_at(ls_model_source *s, int layer, int which) {
    return &s->t[(size_t)layer * LS_MT_COUNT + (size_t)which];
}
/* Copies a header entry (name duplicated); false when out of memory. */
bool ls_model_info_copy(ls_st_info *dst, const ls_st_info *src);
/* Appends a file's name (relative to the model's path) to m->files. */
bool ls_model_add_file(ls_model *m, const char *name);

/* The dtype a tensor is served from: BF16 for an FP8 weight (dequantized
 * at load), else its own. */
ls_dtype ls_model_served_dtype(const ls_model_tensor *t);

/* ---- the single weights file (inkling.c) -------------------------------- */

/* Reads the header of the fused-layout file open at fd and fills m. */
ls_status ls_model_open_fused(int fd, const char *path, const ls_w13_layout *layout_override, ls_model *m,
                              ls_error *err);

/* ---- Hugging Face families (families.c) --------------------------------- */

/* Which projection of a shared-expert MLP a tensor name holds. */
enum { LS_PROJ_GATE, LS_PROJ_UP, LS_PROJ_DOWN, LS_PROJ_SCALAR_GATE, LS_PROJ_COUNT };

typedef struct ls_family ls_family;

/* A checkpoint's family with what its config.json says of the shared
 * experts: layers_total (num_hidden_layers), H, the MLP's width F, and
 * which layers have them. */
typedef struct {
    const ls_family *family;
    const char *name;      /* the family's name ("deepseek_v3", "qwen2_moe", ...) */
    char model_type[64];   /* as config.json spells it */
    char architecture[96]; /* its first architectures entry, or "" */
    int layers_total, H, F;
    bool *moe;             /* owned [layers_total]: the layer has shared experts */
    char rule[160];        /* the layer rule in words, for messages */
    /* DeepSeek's moe_layer_freq when it is not 1: the layers of
     * transformers' reading, which ignores it (owned; NULL when the two
     * readings agree). The checkpoint's tensors choose (checkpoint.c). */
    bool *moe_alt;
    char rule_alt[160];
    bool gate;             /* the block has a shared-expert gate */
    bool fused;            /* gate and up are one tensor [2F, H] (LS_PROJ_GATE's; LS_PROJ_UP has none) */
    const char *peft_targets; /* the LoraConfig keys that reach the shared experts (static), NULL: unknown */
} ls_family_plan;

/* Chooses the family from config.json (model_type, then architectures;
 * the keys come from text_config when the config nests one), reads its
 * keys and applies its layer rule. Any other family, a missing or
 * malformed key, or no layer with shared experts is an error that names
 * what was found and what is expected. */
ls_status ls_family_plan_from_config(const json_t *config, ls_family_plan *out, ls_error *err);
void ls_family_plan_free(ls_family_plan *p);
/* Takes transformers' reading of the layers (moe_alt) in place of the
 * rule's; p->moe_alt must be set. */
void ls_family_plan_take_alt(ls_family_plan *p);

/* The name of projection proj's tensor in the module ("gate_proj.weight");
 * NULL for LS_PROJ_UP when the family fuses it into LS_PROJ_GATE's. */
const char *ls_family_proj(const ls_family_plan *p, int proj);
/* The tensor of projection proj of layer under prefix ("model.layers."). */
void ls_family_name(const ls_family_plan *p, const char *prefix, int layer, int proj, char *buf, size_t len);
/* The layer prefixes the families are saved under, NULL-terminated:
 * "model.layers." and those of vision-language checkpoints. */
extern const char *const ls_family_prefixes[];
/* When name lies in a layer's shared-expert module under prefix, its
 * layer (*layer) and the rest after the module ("gate_proj.weight"). */
bool ls_family_in_module(const ls_family_plan *p, const char *prefix, const char *name, long *layer,
                         const char **rest);

/* ---- the checkpoint directory (checkpoint.c) ---------------------------- */

/* Opens a Hugging Face checkpoint: dir_path (a directory holding
 * config.json) and, when the index itself was given, index_name inside it
 * (NULL: model.safetensors, else model.safetensors.index.json). */
ls_status ls_model_open_checkpoint(const char *dir_path, const char *index_name, ls_model *m, ls_error *err);

/* ---- FP8 block quantization (checkpoint.c) ------------------------------ */

/* Dequantizes an FP8 E4M3 weight [rows, cols] with its scale [ceil(rows /
 * b0), ceil(cols / b1)] (float dtype) into dst at dtype (each value
 * rounded to bf16 first, then stored at dtype: BF16 or F32). */
void ls_model_dequant_fp8(const uint8_t *q, const void *scale, ls_dtype scale_dt, int64_t rows, int64_t cols,
                          const int *block, ls_dtype dtype, void *dst);

#endif
