/* Checks the JSON and safetensors readers of /forward share (forward.c
 * defines them, forward_json.c uses them too). Internal to api/. */
#ifndef LS_API_FORWARD_INTERNAL_H
#define LS_API_FORWARD_INTERNAL_H

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

#endif
