/* The base weights of the shared sink: what was found where (a weights
 * file, a Hugging Face checkpoint directory or its index, or the
 * deterministic demo model), checked from the headers alone, then read
 * layer by layer at the tensors' own dtypes and handed to a backend. The
 * model owns the checkpoint's layer numbers that its dims point at. */
#ifndef LS_MODEL_MODEL_H
#define LS_MODEL_MODEL_H

#include <stdint.h>

#include "common/dims.h"
#include "common/error.h"
#include "common/tensor.h"
#include "gpu/backend.h"

typedef struct ls_model_source ls_model_source;

/* One layer's weights at their storage dtypes (see ls_base_layer); the
 * buffers are owned. */
typedef struct {
    void *w13, *w2, *gate;
    ls_dtype dt13, dt2, dtg;
} ls_model_layer;

typedef struct {
    ls_dims dims;   /* layer_ids points at this model's ids (NULL: served layer i is layer i) */
    int *layer_ids; /* owned [L]; NULL for the weights file and the demo */
    ls_dtype dtype; /* the dtype to serve: the tensors' own, the widest when they differ */
    /* What was loaded, for GET /model and the start-up log. */
    char source[16];        /* "checkpoint", "file" or "demo" */
    char family[32];        /* "deepseek_v3", ... ; "fused" for the file, "demo" */
    char model_type[64];    /* config.json's; "" otherwise */
    char architecture[96];  /* config.json's first architectures entry; "" otherwise */
    char path[4096];        /* as given, or the hub cache snapshot a repo id names ("" for the demo) */
    char rule[160];         /* which layers have shared experts, in words */
    bool fp8;               /* FP8 block-quantized weights, dequantized to bf16 at load */
    char **files;           /* owned: the files read, relative to path's directory */
    int n_files;
    uint64_t bytes;         /* the shared-expert tensors' bytes as stored */
    ls_model_source *src;   /* owned: where each layer's tensors lie; NULL for the demo */
    ls_model_layer *held;   /* owned [L]: the demo's layers (NULL otherwise) */
} ls_model;

/* Opens path: a safetensors weights file (model.layers.{l}.mlp.
 * shared_experts.w13_weight / w2_weight; layout_override NULL means the
 * header's __metadata__ w13_layout, else interleaved), a Hugging Face
 * checkpoint directory (config.json with model.safetensors or
 * model.safetensors.index.json and its shards), or such an index file.
 * Reads config.json, the index and the headers of the files it needs,
 * nothing more, and checks every name, shape and dtype there; errors name
 * the file and the tensor. On failure out is zeroed. */
ls_status ls_model_open(const char *path, const ls_w13_layout *layout_override, ls_model *out, ls_error *err);

/* Builds the demo model: values from a fixed PRNG seeded by seed, scaled so
 * activations stay O(1), rounded to dtype. dims->L etc. must be positive. */
ls_status ls_model_demo(const ls_dims *dims, uint64_t seed, ls_dtype dtype, ls_model *out, ls_error *err);

/* Reads served layer index (0..L-1) at its storage dtypes: only that
 * layer's byte ranges of its files (FP8 dequantized to bf16); a NaN or Inf
 * is an error naming the tensor. On success out is the caller's
 * (ls_model_layer_free). */
ls_status ls_model_read_layer(ls_model *m, int index, ls_model_layer *out, ls_error *err);
void ls_model_layer_free(ls_model_layer *l);

/* Reads and uploads every layer to the backend, one at a time, so the
 * host holds one layer beside what the backend keeps. */
ls_status ls_model_upload(ls_model *m, ls_backend *be, ls_error *err);

/* Closes the files and drops the demo's layers; the description (dims,
 * layer numbers, files) stays. */
void ls_model_release(ls_model *m);
void ls_model_free(ls_model *m);

#endif
