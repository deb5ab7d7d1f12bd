/* The base weights of the shared sink on the host: read from a safetensors
 * file (docs/math.md) or built deterministically as the demo model, then handed
 * to a backend. */
#ifndef LS_MODEL_MODEL_H
#define LS_MODEL_MODEL_H

#include <stdint.h>

#include "common/dims.h"
#include "common/error.h"
#include "common/tensor.h"
#include "gpu/backend.h"

typedef struct {
    ls_dims dims;
    ls_dtype dtype; /* the dtype the values were stored in (or rounded to) */
    float **w13;    /* owned; per layer [n, 2F, H] fp32 */
    float **w2;     /* owned; per layer [n, H, F] fp32 */
} ls_model;

/* Reads a weights file. layout_override NULL means: __metadata__ key
 * w13_layout, else interleaved. Errors name the tensor at fault. */
ls_status ls_model_load(const char *path, const ls_w13_layout *layout_override, ls_model *out, ls_error *err);

/* Builds the demo model: values from a fixed PRNG seeded by seed, scaled so
 * activations stay O(1), rounded to dtype. dims->L etc. must be positive. */
ls_status ls_model_demo(const ls_dims *dims, uint64_t seed, ls_dtype dtype, ls_model *out, ls_error *err);

/* Uploads every layer to the backend. */
ls_status ls_model_upload(const ls_model *m, ls_backend *be, ls_error *err);

void ls_model_free(ls_model *m);

#endif
