/* JSON descriptions of adapters and the pool for the handlers. */
#ifndef LS_SERVER_DESCRIBE_H
#define LS_SERVER_DESCRIBE_H

#include <jansson.h>

#include "api/json_tensor.h"
#include "lora/pool.h"
#include "server/server.h"

/* New reference: the non-empty ones of a load's warnings (ls_adapter.warnings). */
json_t *ls_describe_warnings(const char (*warnings)[512]);
/* New reference describing one adapter (docs/api.md, GET /adapters). */
json_t *ls_describe_adapter(const ls_server *srv, const ls_adapter_info *info);
/* New reference for GET /pool, or NULL with err set. */
json_t *ls_describe_pool(ls_server *srv, ls_error *err);
/* New reference for GET /model (what was loaded), or NULL with err set. */
json_t *ls_describe_model(const ls_server *srv, ls_error *err);
/* ISO 8601 UTC of unix ms into buf ("" for 0). */
const char *ls_describe_time(int64_t ms, char *buf, size_t len);

#endif
