/* The route handlers (server/routes.c's table): each reads req and fills
 * r, on the thread its route's entry says. */
#ifndef LS_SERVER_HANDLERS_H
#define LS_SERVER_HANDLERS_H

#include "server/request.h"

void ls_handle_health(const ls_request *req, ls_reply *r);
void ls_handle_ready(const ls_request *req, ls_reply *r);
void ls_handle_metrics(const ls_request *req, ls_reply *r);
void ls_handle_openapi(const ls_request *req, ls_reply *r);
void ls_handle_pool(const ls_request *req, ls_reply *r);
void ls_handle_model(const ls_request *req, ls_reply *r);
void ls_handle_dashboard(const ls_request *req, ls_reply *r);
void ls_handle_forward(const ls_request *req, ls_reply *r);
void ls_handle_adapter_load(const ls_request *req, ls_reply *r);
void ls_handle_adapter_validate(const ls_request *req, ls_reply *r);
void ls_handle_adapter_list(const ls_request *req, ls_reply *r);
void ls_handle_adapter_get(const ls_request *req, ls_reply *r);
void ls_handle_adapter_delete(const ls_request *req, ls_reply *r);
/* vLLM's names for a load by path and a delete (server/handlers_vllm.c). */
void ls_handle_vllm_load(const ls_request *req, ls_reply *r);
void ls_handle_vllm_unload(const ls_request *req, ls_reply *r);
/* vLLM's GET /v1/models: the base model and the adapters (server/handlers_vllm.c). */
void ls_handle_vllm_models(const ls_request *req, ls_reply *r);
/* sglang's names for a load by path and a delete (server/handlers_sglang.c). */
void ls_handle_sglang_load(const ls_request *req, ls_reply *r);
void ls_handle_sglang_unload(const ls_request *req, ls_reply *r);

#endif
