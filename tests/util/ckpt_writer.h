/* Hugging Face checkpoints for the tests, in each family's own layout:
 * config.json with the family's real keys, the shared experts under the
 * family's names (and prefix, for the vision-language ones), the other
 * tensors a checkpoint has (attention, router, routed experts, dense MLPs,
 * embeddings, multi-token-prediction layers) as decoys, written as one
 * model.safetensors or as shards with model.safetensors.index.json. The
 * safetensors files are written here, independently of format/; decoys
 * of any size are file holes (zeros that take no disk). */
#ifndef LS_TESTS_CKPT_WRITER_H
#define LS_TESTS_CKPT_WRITER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/tensor.h"

typedef enum {
    CK_DEEPSEEK_V3,
    CK_KIMI_K2,
    CK_DEEPSEEK_V2,
    CK_GLM4_MOE,
    CK_DOTS1,
    CK_ERNIE4_5_MOE,
    CK_BAILING_MOE,
    CK_QWEN2_MOE,
    CK_QWEN3_NEXT,
    CK_QWEN3_5_MOE,
    CK_LLAMA4,
    CK_GRANITEMOEHYBRID,
    CK_FAMILIES
} ck_family;

#define CK_MAX_LAYERS 16

typedef struct {
    ck_family family;
    int H, F;              /* hidden size and the shared MLP's width (n_shared x moe_intermediate_size) */
    ls_dtype dtype;        /* F32, F16 or BF16 (the served tensors) */
    int shards;            /* 0: a single model.safetensors, else that many shards and an index */
    bool fp8;              /* e4m3 weights with weight_scale_inv (DeepSeek's official form) */
    int fp8_block[2];      /* weight_block_size */
    uint64_t decoy_bytes;  /* added to the routed experts of each MoE layer, as zeros */
    int layers;            /* DeepSeek-V3 only: num_hidden_layers (0: the family's 4); layer 0 stays dense */
    uint64_t seed;
} ck_spec;

/* What was written: the family's names, the layers with shared experts
 * (the checkpoint's numbers) and, per served layer, the values as the
 * server must see them: w13 [2F, H] (gate_proj's rows, then up_proj's),
 * w2 [H, F], gate [H] (NULL without a gate). */
typedef struct {
    const char *family;     /* as GET /model names it */
    const char *model_type;
    const char *prefix;     /* "model.layers." or a vision-language one */
    const char *module;     /* "mlp.shared_experts." ... */
    bool fused;             /* gate and up in one tensor (Granite's input_linear), down is output_linear */
    int layers_total;
    int L, ids[CK_MAX_LAYERS];
    int dense;              /* a layer without shared experts, -1 when every layer has them */
    bool gate;
    int n_files;            /* safetensors files written */
    uint64_t shared_bytes;  /* the served tensors' bytes as stored (scales included) */
    double *w13[CK_MAX_LAYERS], *w2[CK_MAX_LAYERS], *gatew[CK_MAX_LAYERS];
} ck_model;

/* Writes the checkpoint into dir (which exists) and fills out; aborts the
 * test when it cannot. */
void ck_write(const char *dir, const ck_spec *spec, ck_model *out);
void ck_model_free(ck_model *m);
/* The family's name for a test's messages. */
const char *ck_family_name(ck_family f);

/* ---- a safetensors file for the hostile cases ---------------------------- */

typedef struct {
    char name[200];
    ls_dtype dtype;
    int ndim;
    int64_t shape[4];
    const void *data; /* NULL: zeros (a hole) */
} ck_tensor;

/* Writes the tensors, in order, as one safetensors file at path. */
void ck_write_safetensors(const char *path, const ck_tensor *t, int n);

#endif
