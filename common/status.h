/* The status table: every outcome a lorasink operation can have, with its
 * wire code, HTTP status and the default hint a client sees. One X-macro
 * list so the enum, the strings and the statuses can never drift apart.
 * The HTTP column is the server's: only server/http_status.c turns it
 * into a number; code outside server/ asks what kind of failure a status
 * is (ls_status_is_input, ls_status_is_validation), never its HTTP
 * status. */
#ifndef LS_COMMON_STATUS_H
#define LS_COMMON_STATUS_H

/* X(ENUM, "wire_code", http_status, "default hint") */
#define LS_STATUS_LIST(X)                                                                          \
    X(OK, "ok", 200, "")                                                                           \
    X(LORA_NOT_4D, "lora_not_4d", 422,                                                             \
      "upload the four pool buffers as 4D tensors [1, O, rows, cols]")                             \
    X(LORA_OUTER_DIM_INVALID, "lora_outer_dim_invalid", 422,                                       \
      "the expert axis (axis 1) of gate_up_lora_a and down_lora_b must be 1 (shared) or n")        \
    X(LORA_EXPERT_LAYOUT_MISMATCH, "lora_expert_layout_mismatch", 422,                             \
      "give gate_up_lora_a and down_lora_b the same expert axis: both 1 or both n")                \
    X(LORA_EXPERT_COUNT_MISMATCH, "lora_expert_count_mismatch", 422,                               \
      "gate_up_lora_b and down_lora_a need one entry per shared expert on axis 1")                 \
    X(LORA_RANK_MISMATCH, "lora_rank_mismatch", 422,                                               \
      "fuse the gate and up A matrices along the rank axis (2*r rows) before upload")              \
    X(LORA_RANK_TOO_LARGE, "lora_rank_too_large", 422,                                             \
      "restart the server with a larger --max-rank or upload a lower-rank adapter")                \
    X(LORA_HIDDEN_MISMATCH, "lora_hidden_mismatch", 422,                                           \
      "the adapter was trained for another hidden size; use one made for this model")              \
    X(LORA_INTERMEDIATE_MISMATCH, "lora_intermediate_mismatch", 422,                               \
      "the adapter was trained for another intermediate size; use one made for this model")        \
    X(LORA_EXTENT_NOT_DIVISIBLE, "lora_extent_not_divisible", 422,                                 \
      "expert-major axes hold n blocks of equal size; check the expert count of the adapter")      \
    X(LORA_LAYOUT_UNSUPPORTED, "lora_layout_unsupported", 422,                                     \
      "restart with --lora-layout per-expert, or upload outer factors with expert axis 1")         \
    X(LORA_SLOT_AXIS_INVALID, "lora_slot_axis_invalid", 422,                                       \
      "pool-format buffers hold one adapter: axis 0 must be 1")                                    \
    X(LORA_MISSING_TENSOR, "lora_missing_tensor", 422,                                             \
      "upload each lora_A with its lora_B (and every pool buffer of a layer together)")            \
    X(LORA_UNKNOWN_TENSOR, "lora_unknown_tensor", 422,                                             \
      "remove tensors that are not LoRA factors of the shared experts")                            \
    X(LORA_EMPTY, "lora_empty", 422,                                                               \
      "the adapter must carry at least one factor of the shared experts")                          \
    X(LORA_LAYER_OUT_OF_RANGE, "lora_layer_out_of_range", 422,                                     \
      "layer indices run from 0 to layers-1 of the served model")                                  \
    X(LORA_DTYPE_UNSUPPORTED, "lora_dtype_unsupported", 422,                                       \
      "convert the factors to bf16, f16 or f32")                                                   \
    X(LORA_NONFINITE, "lora_nonfinite", 422,                                                       \
      "the factors hold NaN or Inf: the adapter is corrupt or diverged in training")               \
    X(SAFETENSORS_INVALID, "safetensors_invalid", 422,                                             \
      "the file is not valid safetensors; write it with the safetensors library")                  \
    X(ADAPTER_CONFIG_INVALID, "adapter_config_invalid", 422,                                       \
      "adapter_config.json needs a positive integer \"r\" and a number \"lora_alpha\"")            \
    X(INVALID_JSON, "invalid_json", 400, "send a well-formed JSON object")                         \
    X(INVALID_REQUEST, "invalid_request", 400,                                                     \
      "check the request against the API reference: GET /openapi.json, or docs/api.md")            \
    X(UNAUTHORIZED, "unauthorized", 401, "send the header Authorization: Bearer <api key>")        \
    X(FORBIDDEN_HOST, "forbidden_host", 403,                                                       \
      "reach the server by IP address or localhost, or list the names clients use in "             \
      "--allowed-hosts (LORASINK_ALLOWED_HOSTS; * for any)")                                       \
    X(FORBIDDEN_ORIGIN, "forbidden_origin", 403,                                                   \
      "browsers may call this server from its own pages only; list other origins in "              \
      "--allowed-origins (LORASINK_ALLOWED_ORIGINS)")                                              \
    X(FORBIDDEN, "forbidden", 403,                                                                 \
      "this key's role may not do this: a viewer key reads (GET) only; ask for a tenant key")       \
    X(ADAPTER_QUOTA, "adapter_quota", 403,                                                         \
      "the tenant holds max_adapters adapters (its key's entry in --api-keys): delete one, or "    \
      "replace one of the same name")                                                              \
    X(ADAPTER_NOT_FOUND, "adapter_not_found", 404, "load it first with POST /adapters")            \
    X(NOT_FOUND, "not_found", 404,                                                                 \
      "see the routes in GET /openapi.json (the server names them in its reply)")               \
    X(METHOD_NOT_ALLOWED, "method_not_allowed", 405, "see the Allow header")                       \
    X(REQUEST_TIMEOUT, "request_timeout", 408,                                                     \
      "send the head within --request-timeout seconds of its first byte and the body within "      \
      "--body-timeout of the head")                                                                \
    X(ADAPTER_EXISTS, "adapter_exists", 409,                                                       \
      "pick another name, DELETE the old adapter, or send \"replace\": true")                      \
    X(ADAPTER_STALE, "adapter_stale", 409,                                                         \
      "the adapter's file changed or went away since it was loaded: load it again with "           \
      "\"replace\": true, or restore the file")                                                    \
    X(VERSIONS_EXHAUSTED, "versions_exhausted", 409,                                               \
      "the name has had its last version (2^63-1): upload the adapter under another name")        \
    X(PIN_LIMIT, "pin_limit", 409,                                                                 \
      "at most slots-1 adapters can be pinned: unpin one (load it again with replace and pinned "   \
      "false) or delete one, or load this one unpinned")                                           \
    X(TENANT_PIN_LIMIT, "tenant_pin_limit", 409,                                                   \
      "the tenant holds max_pins pinned adapters (its key's entry in --api-keys): unpin or delete "  \
      "one, or load this one unpinned")                                                            \
    X(PAYLOAD_TOO_LARGE, "payload_too_large", 413,                                                 \
      "send a smaller body or restart with a larger --max-body-mb")                                \
    X(URI_TOO_LONG, "uri_too_long", 414,                                                           \
      "send at most 64 query parameters and 8192 bytes of path and query; send data in the body")  \
    X(UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", 415,                                       \
      "send application/json or application/octet-stream (safetensors)")                           \
    X(INVALID_SHAPE, "invalid_shape", 422, "check the tensor shapes against the model dimensions") \
    X(OVERLOADED, "overloaded", 429, "the request queue is full; retry after a short wait")       \
    X(RATE_LIMITED, "rate_limited", 429,                                                           \
      "this key sends more requests a second than its rate in --api-keys: wait Retry-After seconds") \
    X(TOO_MANY_CONNECTIONS, "too_many_connections", 429,                                           \
      "this address holds --per-ip-connections connections (or the server --max-connections): "    \
      "close some or reuse them; past the cap a connection serves only /health and /ready")        \
    X(POOL_EXHAUSTED, "pool_exhausted", 503,                                                       \
      "every slot is pinned or in use; retry later, unpin or delete an adapter")                   \
    X(DEVICE_ERROR, "device_error", 503, "the compute device failed; check /ready and the log")    \
    X(SHUTTING_DOWN, "shutting_down", 503,                                                         \
      "the server is stopping; send new requests to another replica")                              \
    X(INTERNAL, "internal", 500, "this is a bug in lorasink; the log has details")

typedef enum {
#define LS_X_ENUM(e, code, http, hint) LS_##e,
    LS_STATUS_LIST(LS_X_ENUM)
#undef LS_X_ENUM
        LS_STATUS_COUNT
} ls_status;

#include <stdbool.h>

const char *ls_status_code(ls_status s);
const char *ls_status_hint(ls_status s);
/* The input itself is wrong (its content, its size or its form), not the
 * server's state or resources: an answer that holds until the input
 * changes. */
bool ls_status_is_input(ls_status s);
/* The content failed validation (a tensor, a shape, a config). */
bool ls_status_is_validation(ls_status s);
/* For server/http_status.c only: the table's HTTP column. */
int ls_status_table_http(ls_status s);

#endif
