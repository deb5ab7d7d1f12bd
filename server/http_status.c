/* HTTP statuses of the status table, and the route hint of a 404. */
#include "server/http_status.h"

int ls_http_status(ls_status s) { return ls_status_table_http(s); }

const char ls_http_routes_hint[] =
    "the routes are /health, /ready, /forward, /adapters, /pool, /model, /metrics, /dashboard, /openapi.json, /v1/load_lora_adapter, /v1/unload_lora_adapter";
