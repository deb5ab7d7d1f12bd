/* The CUDA forward's host side of the copies: a batch's token rows, in
 * the token plan's order, into pinned staging in the compute dtype,
 * rounded in the same pass (so the device is sent half the bytes of fp32
 * and runs no conversion of its own), and y's rows back out of staging
 * into token order. */
#ifndef LS_GPU_STAGE_ROWS_H
#define LS_GPU_STAGE_ROWS_H

#include <stdbool.h>
#include <stddef.h>

#include "common/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the rows are rounded to bf16, fastest first; AUTO is the fastest
 * this CPU runs. Every way gives the same bits (tests name each). */
typedef enum { LS_STAGE_AUTO, LS_STAGE_AVX512, LS_STAGE_AVX2, LS_STAGE_SCALAR } ls_stage_isa;

/* Whether this CPU runs isa (AUTO and SCALAR always). */
bool ls_stage_isa_supported(ls_stage_isa isa);

/* Row i of dst (H elements of dt: F32, BF16 or F16, little-endian) is row
 * order[i] of src (fp32 [*, H]) for i < T, rounded to nearest even as
 * ls_f32_to_bf16 and ls_f32_to_f16 round (NaN stays NaN). Batches of
 * LS_STAGE_ROWS_THREADED elements or more are split over a few threads
 * (gpu/parallel_rows.h). src and dst must not overlap; both are the
 * caller's. isa must be supported. */
void ls_stage_rows_isa(void *dst, ls_dtype dt, const float *src, const int *order, size_t T, size_t H,
                       ls_stage_isa isa);
void ls_stage_rows(void *dst, ls_dtype dt, const float *src, const int *order, size_t T, size_t H);

/* Row order[i] of y is row i of staged (both fp32 [*, H], the caller's),
 * for i < T; threaded as ls_stage_rows. */
void ls_unstage_rows(float *y, const float *staged, const int *order, size_t T, size_t H);

#define LS_STAGE_ROWS_THREADED (1u << 20)

#ifdef __cplusplus
}
#endif

#endif
