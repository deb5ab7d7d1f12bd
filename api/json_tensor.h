/* Tensors in JSON (docs/api.md): nested arrays of numbers, or
 * {"dtype": "f32"|"f16"|"bf16", "shape": [...], "data": "<base64>"}. */
#ifndef LS_API_JSON_TENSOR_H
#define LS_API_JSON_TENSOR_H

#include <jansson.h>

#include "format/json_reader.h"
#include "common/buf.h"
#include "common/error.h"
#include "common/tensor.h"

/* Parses j into an owned tensor (*out, free with ls_tensor_free): nested
 * arrays become F32, base64 keeps its dtype. what names the field in
 * errors ("x", "tensors[\"...\"]"). Ragged arrays and non-numbers are
 * LS_INVALID_REQUEST (LS_INVALID_SHAPE for a ragged array); a base64
 * payload whose size disagrees with its shape is LS_INVALID_SHAPE. */
ls_status ls_json_tensor_parse(const json_t *j, const char *what, ls_tensor *out, ls_error *err);

/* The same read from the text at r (one JSON value), with no JSON value
 * built: a nested array's numbers go straight into the tensor's floats,
 * a base64 object's data is decoded from the text (api/
 * json_tensor_read.c). For any value it gives what ls_json_tensor_parse
 * gives for that value parsed by jansson with JSON_REJECT_DUPLICATES:
 * the same tensor into *out, or the same first problem (status and
 * message) into err with *out empty and r past the value. False only
 * when r failed: the text is not JSON as jansson reads it (a key given
 * twice, an integer past 64 bits), or memory ran out (r->oom); *out is
 * then empty. */
bool ls_json_tensor_read(ls_jr *r, const char *what, ls_tensor *out, ls_error *err);

/* Dumps j compactly and drops the reference: the caller frees the text.
 * NULL when j is NULL or on out of memory. */
char *ls_json_take_text(json_t *j);

/* Checks that root is an object whose keys are all in known (a NULL-
 * terminated list); what names the body in the message. An unknown key is
 * LS_INVALID_REQUEST whose hint lists the known ones. */
ls_status ls_json_check_keys(const json_t *root, const char *const *known, const char *what, ls_error *err);

/* Writes v (finite) as a JSON number that reads back as the same float32:
 * what snprintf("%.9g") writes (nine significant digits, trailing zeros
 * dropped), exponents without a leading zero. buf holds at least 20
 * bytes; returns the length written. */
size_t ls_json_format_f32(float v, char *buf);

/* Appends rows x cols fp32 as nested JSON arrays of such numbers (much
 * faster than building json_t values). False when b failed. */
bool ls_json_tensor_f32_text(ls_buf *b, const float *v, int rows, int cols);
/* Appends them as a base64 object {"dtype":"f32","shape":[rows,cols],
 * "data":"..."}, written straight into b. False when b failed. */
bool ls_json_tensor_f32_base64_text(ls_buf *b, const float *v, int rows, int cols);

#endif
