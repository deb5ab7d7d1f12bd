/* HTTP statuses of the status table (common/status.h) and the route
 * hint of a 404: what the server answers, kept here so that no code
 * outside server/ holds or branches on an HTTP number. */
#include "server/http_status.h"

/* X(ENUM, http_status): one row per status of the table, in its order.
 * The count is checked below and a row given twice is an initializer
 * override (-Wextra warns of it), so every status has exactly one. */
#define LS_HTTP_STATUS_LIST(X)                              \
    X(OK, 200)                                              \
    X(LORA_NOT_4D, 422)                                     \
    X(LORA_OUTER_DIM_INVALID, 422)                          \
    X(LORA_EXPERT_LAYOUT_MISMATCH, 422)                     \
    X(LORA_EXPERT_COUNT_MISMATCH, 422)                      \
    X(LORA_RANK_MISMATCH, 422)                              \
    X(LORA_RANK_TOO_LARGE, 422)                             \
    X(LORA_HIDDEN_MISMATCH, 422)                            \
    X(LORA_INTERMEDIATE_MISMATCH, 422)                      \
    X(LORA_EXTENT_NOT_DIVISIBLE, 422)                       \
    X(LORA_LAYOUT_UNSUPPORTED, 422)                         \
    X(LORA_SLOT_AXIS_INVALID, 422)                          \
    X(LORA_MISSING_TENSOR, 422)                             \
    X(LORA_UNKNOWN_TENSOR, 422)                             \
    X(LORA_EMPTY, 422)                                      \
    X(LORA_LAYER_OUT_OF_RANGE, 422)                         \
    X(LORA_DTYPE_UNSUPPORTED, 422)                          \
    X(LORA_NONFINITE, 422)                                  \
    X(SAFETENSORS_INVALID, 422)                             \
    X(ADAPTER_CONFIG_INVALID, 422)                          \
    X(INVALID_JSON, 400)                                    \
    X(INVALID_REQUEST, 400)                                 \
    X(UNAUTHORIZED, 401)                                    \
    X(FORBIDDEN_HOST, 403)                                  \
    X(FORBIDDEN_ORIGIN, 403)                                \
    X(FORBIDDEN, 403)                                       \
    X(ADAPTER_QUOTA, 403)                                   \
    X(ADAPTER_NOT_FOUND, 404)                               \
    X(NOT_FOUND, 404)                                       \
    X(METHOD_NOT_ALLOWED, 405)                              \
    X(REQUEST_TIMEOUT, 408)                                 \
    X(ADAPTER_EXISTS, 409)                                  \
    X(ADAPTER_STALE, 409)                                   \
    X(VERSIONS_EXHAUSTED, 409)                              \
    X(PIN_LIMIT, 409)                                       \
    X(TENANT_PIN_LIMIT, 409)                                \
    X(PAYLOAD_TOO_LARGE, 413)                               \
    X(URI_TOO_LONG, 414)                                    \
    X(UNSUPPORTED_MEDIA_TYPE, 415)                          \
    X(INVALID_SHAPE, 422)                                   \
    X(OVERLOADED, 429)                                      \
    X(RATE_LIMITED, 429)                                    \
    X(TOO_MANY_CONNECTIONS, 429)                            \
    X(POOL_EXHAUSTED, 503)                                  \
    X(DEVICE_ERROR, 503)                                    \
    X(SHUTTING_DOWN, 503)                                   \
    X(INSUFFICIENT_STORAGE, 507)                            \
    X(INTERNAL, 500)

static const int ls_http_table[LS_STATUS_COUNT] = {
#define LS_X_ROW(e, http) [LS_##e] = http,
    LS_HTTP_STATUS_LIST(LS_X_ROW)
#undef LS_X_ROW
};

#define LS_X_COUNT(e, http) +1
_Static_assert(0 LS_HTTP_STATUS_LIST(LS_X_COUNT) == LS_STATUS_COUNT,
               "server/http_status.c needs one row per status of common/status.h");
#undef LS_X_COUNT

int ls_http_status(ls_status s) { return (unsigned)s < LS_STATUS_COUNT ? ls_http_table[s] : 500; }

const char ls_http_routes_hint[] =
    "the routes are /health, /ready, /forward, /adapters, /pool, /model, /metrics, /dashboard, /openapi.json, "
    "/v1/load_lora_adapter, /v1/unload_lora_adapter, /v1/models (vLLM's), /load_lora_adapter, "
    "/unload_lora_adapter (sglang's)";
