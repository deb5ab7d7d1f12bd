/* What the JSON and safetensors readers of /forward share: checks
 * forward.c defines and forward_json.c uses too, and the reading of a
 * names list forward_json.c defines and forward.c uses too. Internal to
 * api/. */
#ifndef LS_API_FORWARD_INTERNAL_H
#define LS_API_FORWARD_INTERNAL_H

#include "api/forward.h"
#include "common/dims.h"
#include "common/error.h"
#include "common/tensor.h"

/* Takes a parsed tensor as [rows, cols] fp32 into *dst (owned; rows -1 =
 * any count of 1 or more) and *rows_out; values must be finite. */
ls_status ls_forward_take_matrix(ls_tensor *t, const char *what, int want_rows, int want_cols, float **dst,
                                 int *rows_out, ls_error *err);
/* The served index (*index) of the checkpoint's layer; a dense layer of
 * the checkpoint and one past it are LS_INVALID_REQUEST, each said so. */
ls_status ls_forward_check_layer(long long layer, const ls_dims *dims, int *index, ls_error *err);

/* The safetensors body's metadata "adapters", JSON text, read by the
 * JSON body's rules for its "adapters" (forward_json.c, one pass: a list
 * far longer than req->T costs no memory): null is no list, else an
 * array of exactly req->T names or nulls, each name checked first. Into
 * req->names, which must be empty (req->T set). */
ls_status ls_forward_names_text(const char *text, ls_forward_req *req, ls_error *err);

#endif
