/* Fixtures of the adapter tests (test_adapter*.c): tensor sets built from
 * tests/data/tiny.json or from a fill pattern, in PEFT or pool format and
 * any dtype, and assertions on the violations an upload produces.
 * Compiled once (tests/util/adapter_fixture.c). */
#ifndef LS_TESTS_ADAPTER_FIXTURE_H
#define LS_TESTS_ADAPTER_FIXTURE_H

/* What every adapter test uses besides the fixture: cmocka, jansson and
 * the adapter module. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/error.h"
#include "common/tensor.h"
#include "lora/adapter.h"

/* PEFT tensor names of one layer (printf formats of the layer index). */
#define TU_SHARED "model.layers.%d.mlp.shared_experts."
#define TU_GU_A TU_SHARED "gate_up_proj.lora_A.weight"
#define TU_GU_B TU_SHARED "gate_up_proj.lora_B.weight"
#define TU_D_A TU_SHARED "down_proj.lora_A.weight"
#define TU_D_B TU_SHARED "down_proj.lora_B.weight"

/* The tiny example's dimensions: n=2, H=4, F=3, the given layers. */
ls_dims tu_tiny_dims(int layers);
/* A pool of 4 slots and 64 tokens at max_rank with layout. */
ls_pool_dims tu_pool(int max_rank, ls_lora_layout layout);

/* tests/data/tiny.json, parsed (caller owns the reference); fails the
 * test when it cannot be read. */
json_t *tu_load_tiny(void);

/* Flattens nested arrays of numbers into a malloc'd float array (caller
 * frees); *count (when given) receives the number of values. */
float *tu_flatten(const json_t *v, size_t *count);

/* Adds an owned tensor of dtype dt holding vals (fp32) converted. */
void tu_add(ls_tensor_set *s, const char *name, ls_dtype dt, const int64_t *shape, int ndim, const float *vals);
/* Adds a tensor of a deterministic pattern exact in bf16 (multiples of
 * 1/16), varied by salt. */
void tu_add_pattern(ls_tensor_set *s, const char *name, ls_dtype dt, const int64_t *shape, int ndim, int salt);

/* prefix followed by fmt of layer, written into buf (returned). */
const char *tu_name(char *buf, size_t len, const char *prefix, const char *fmt, int layer);

/* A valid PEFT layer of rank r for dims d; skip bit k leaves out factor k
 * (0 gate_up A, 1 gate_up B, 2 down A, 3 down B). */
void tu_add_peft_layer(ls_tensor_set *s, const char *prefix, const ls_dims *d, int l, int r, unsigned skip);
/* A valid pool-format layer: O' outer blocks, rank r; skip as above. */
void tu_add_pool_layer(ls_tensor_set *s, const ls_dims *d, int l, int outer, int r, unsigned skip);

/* Replaces the tensor called name (shape and values) in place; fails the
 * test when there is none. */
void tu_replace(ls_tensor_set *s, const char *name, ls_dtype dt, const int64_t *shape, int ndim);
/* Drops the tensor called name from the set; fails the test when there
 * is none. */
void tu_remove(ls_tensor_set *s, const char *name);
/* The data of the f32 tensor called name (borrowed from s). */
float *tu_f32_data(ls_tensor_set *s, const char *name);

/* PEFT factors taken as they are: a scale of 1 stated (without one, or
 * a lora_alpha, an upload is refused). */
extern const ls_adapter_params tu_scale1;

/* Prints every violation of e. */
void tu_dump(const ls_error *e);
/* Number of violations with this code. */
size_t tu_count(const ls_error *e, ls_status code);
/* The violation with this code and tensor (NULL: any tensor); fails the
 * test (after printing every violation) when there is none. */
const ls_violation *tu_find(const ls_error *e, ls_status code, const char *tensor);
/* Asserts one violation's fields, and that it carries a hint. */
const ls_violation *tu_expect(const ls_error *e, ls_status code, int layer, const char *tensor, int axis,
                              int64_t expected, int64_t got);
/* Normalises s expecting failure with top-level code want; the adapter
 * must come back zeroed. The caller frees err. */
void tu_expect_fail(const ls_tensor_set *s, const ls_adapter_params *p, const ls_dims *d, const ls_pool_dims *pool,
                    ls_status want, ls_error *err);

/* The fixture of the error tests: n=2, H=4, F=3, two layers, pool R=4;
 * uploads of rank 2. */
typedef struct {
    ls_dims d;
    ls_pool_dims p;
    ls_tensor_set s;
    ls_error err;
    char name[192];
} tu_fx;

/* cmocka setup and teardown: *state receives a tu_fx (freed by the
 * teardown, with its tensor set and error). */
int tu_fx_setup(void **state);
int tu_fx_teardown(void **state);

#endif
