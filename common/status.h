/* The status table: every outcome a lorasink operation can have, with its
 * wire code, its kind and the default hint a client sees. One X-macro
 * list so the enum, the strings and the kinds can never drift apart. No
 * protocol lives here: the HTTP status of each is the server's
 * (server/http_status.c); code below server/ asks what kind of failure a
 * status is (ls_status_is_input, ls_status_is_validation). */
#ifndef LS_COMMON_STATUS_H
#define LS_COMMON_STATUS_H

/* X(ENUM, "wire_code", KIND, "default hint"). KIND is what the failure
 * says about the input: CONTENT, its content failed validation (a tensor,
 * a shape, a config); INPUT, its form or size is wrong; NONE, nothing (a
 * success, or the server's state, resources, access or routing). */
#define LS_STATUS_LIST(X)                                                                          \
    X(OK, "ok", NONE, "")                                                                          \
    X(LORA_NOT_4D, "lora_not_4d", CONTENT,                                                         \
      "upload the four pool buffers as 4D tensors [1, O, rows, cols]")                             \
    X(LORA_OUTER_DIM_INVALID, "lora_outer_dim_invalid", CONTENT,                                   \
      "the expert axis (axis 1) of gate_up_lora_a and down_lora_b must be 1 (shared) or n")        \
    X(LORA_EXPERT_LAYOUT_MISMATCH, "lora_expert_layout_mismatch", CONTENT,                         \
      "give gate_up_lora_a and down_lora_b the same expert axis: both 1 or both n")                \
    X(LORA_EXPERT_COUNT_MISMATCH, "lora_expert_count_mismatch", CONTENT,                           \
      "gate_up_lora_b and down_lora_a need one entry per shared expert on axis 1")                 \
    X(LORA_RANK_MISMATCH, "lora_rank_mismatch", CONTENT,                                           \
      "fuse the gate and up A matrices along the rank axis (2*r rows) before upload")              \
    X(LORA_RANK_TOO_LARGE, "lora_rank_too_large", CONTENT,                                         \
      "restart the server with a larger --max-rank or upload a lower-rank adapter")                \
    X(LORA_HIDDEN_MISMATCH, "lora_hidden_mismatch", CONTENT,                                       \
      "the adapter was trained for another hidden size; use one made for this model")              \
    X(LORA_INTERMEDIATE_MISMATCH, "lora_intermediate_mismatch", CONTENT,                           \
      "the adapter was trained for another intermediate size; use one made for this model")        \
    X(LORA_EXTENT_NOT_DIVISIBLE, "lora_extent_not_divisible", CONTENT,                             \
      "expert-major axes hold n blocks of equal size; check the expert count of the adapter")      \
    X(LORA_LAYOUT_UNSUPPORTED, "lora_layout_unsupported", CONTENT,                                 \
      "restart with --lora-layout per-expert, or upload outer factors with expert axis 1")         \
    X(LORA_SLOT_AXIS_INVALID, "lora_slot_axis_invalid", CONTENT,                                   \
      "pool-format buffers hold one adapter: axis 0 must be 1")                                    \
    X(LORA_MISSING_TENSOR, "lora_missing_tensor", CONTENT,                                         \
      "upload each lora_A with its lora_B (and every pool buffer of a layer together)")            \
    X(LORA_UNKNOWN_TENSOR, "lora_unknown_tensor", CONTENT,                                         \
      "remove tensors that are not LoRA factors of the shared experts")                            \
    X(LORA_EMPTY, "lora_empty", CONTENT,                                                           \
      "the adapter must carry at least one factor of the shared experts")                          \
    X(LORA_LAYER_OUT_OF_RANGE, "lora_layer_out_of_range", CONTENT,                                 \
      "layer indices run from 0 to layers-1 of the served model")                                  \
    X(LORA_DTYPE_UNSUPPORTED, "lora_dtype_unsupported", CONTENT,                                   \
      "convert the factors to bf16, f16 or f32")                                                   \
    X(LORA_NONFINITE, "lora_nonfinite", CONTENT,                                                   \
      "the factors hold NaN or Inf: the adapter is corrupt or diverged in training")               \
    X(SAFETENSORS_INVALID, "safetensors_invalid", CONTENT,                                         \
      "the file is not valid safetensors; write it with the safetensors library")                  \
    X(ADAPTER_CONFIG_INVALID, "adapter_config_invalid", CONTENT,                                   \
      "adapter_config.json needs a positive integer \"r\" and a number \"lora_alpha\"")            \
    X(INVALID_JSON, "invalid_json", INPUT, "send a well-formed JSON object")                       \
    X(INVALID_REQUEST, "invalid_request", INPUT,                                                   \
      "check the request against the API reference: GET /openapi.json, or docs/api.md")            \
    X(UNAUTHORIZED, "unauthorized", NONE, "send the header Authorization: Bearer <api key>")       \
    X(FORBIDDEN_HOST, "forbidden_host", NONE,                                                      \
      "reach the server by IP address or localhost, or list the names clients use in "             \
      "--allowed-hosts (LORASINK_ALLOWED_HOSTS; * for any)")                                       \
    X(FORBIDDEN_ORIGIN, "forbidden_origin", NONE,                                                  \
      "browsers may call this server from its own pages only; list other origins in "              \
      "--allowed-origins (LORASINK_ALLOWED_ORIGINS)")                                              \
    X(FORBIDDEN, "forbidden", NONE,                                                                \
      "this key's role may not do this: a viewer key reads (GET) only; ask for a tenant key")       \
    X(ADAPTER_QUOTA, "adapter_quota", NONE,                                                        \
      "the tenant holds max_adapters adapters (its key's entry in --api-keys): delete one, or "    \
      "replace one of the same name")                                                              \
    X(ADAPTER_NOT_FOUND, "adapter_not_found", NONE,                                                \
      "load it first with POST /adapters on this server (each replica behind a load balancer "     \
      "has its own pool: load it on every one, or name it with --auto-load and a shared "          \
      "--adapter-dir)")                                                                            \
    X(NOT_FOUND, "not_found", NONE,                                                                \
      "see the routes in GET /openapi.json (the server names them in its reply)")                  \
    X(METHOD_NOT_ALLOWED, "method_not_allowed", NONE, "see the Allow header")                      \
    X(REQUEST_TIMEOUT, "request_timeout", NONE,                                                    \
      "send the head within --request-timeout seconds of its first byte and the body within "      \
      "--body-timeout of the head")                                                                \
    X(ADAPTER_EXISTS, "adapter_exists", NONE,                                                      \
      "pick another name, DELETE the old adapter, or send \"replace\": true")                      \
    X(ADAPTER_STALE, "adapter_stale", NONE,                                                        \
      "the adapter's file changed or went away since it was loaded: load it again with "           \
      "\"replace\": true, or restore the file")                                                    \
    X(VERSIONS_EXHAUSTED, "versions_exhausted", NONE,                                              \
      "the name has had its last version (2^63-1): upload the adapter under another name")         \
    X(PIN_LIMIT, "pin_limit", NONE,                                                                \
      "at most slots-1 adapters can be pinned: unpin one (load it again with replace and pinned "  \
      "false) or delete one, or load this one unpinned")                                           \
    X(TENANT_PIN_LIMIT, "tenant_pin_limit", NONE,                                                  \
      "the tenant holds max_pins pinned adapters (its key's entry in --api-keys): unpin or delete "  \
      "one, or load this one unpinned")                                                            \
    X(PAYLOAD_TOO_LARGE, "payload_too_large", INPUT,                                               \
      "send a smaller body or restart with a larger --max-body-mb")                                \
    X(URI_TOO_LONG, "uri_too_long", NONE,                                                          \
      "send at most 64 query parameters and 8192 bytes of path and query; send data in the body")  \
    X(UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", NONE,                                      \
      "send application/json or application/octet-stream (safetensors)")                           \
    X(INVALID_SHAPE, "invalid_shape", CONTENT, "check the tensor shapes against the model dimensions") \
    X(OVERLOADED, "overloaded", NONE, "the request queue is full; retry after a short wait")       \
    X(RATE_LIMITED, "rate_limited", NONE,                                                          \
      "this key sends more requests a second than its rate in --api-keys: wait Retry-After seconds") \
    X(TOO_MANY_CONNECTIONS, "too_many_connections", NONE,                                          \
      "this address holds --per-ip-connections connections (or the server --max-connections): "    \
      "close some or reuse them; past the cap a connection serves only /health and /ready")        \
    X(POOL_EXHAUSTED, "pool_exhausted", NONE,                                                      \
      "every slot is pinned or in use; retry later, unpin or delete an adapter")                   \
    X(DEVICE_ERROR, "device_error", NONE, "the compute device failed; check /ready and the log")   \
    X(SHUTTING_DOWN, "shutting_down", NONE,                                                        \
      "the server is stopping; send new requests to another replica")                              \
    X(INSUFFICIENT_STORAGE, "insufficient_storage", NONE,                                          \
      "free space on the disk of --state-dir (or raise its quota), then send the request again")    \
    X(INTERNAL, "internal", NONE, "this is a bug in lorasink; the log has details")

typedef enum {
#define LS_X_ENUM(e, code, kind, hint) LS_##e,
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

#endif
