/* GET /health, /ready, /metrics and /pool. */
#include <jansson.h>
#include <stdlib.h>

#include "server/describe.h"
#include "server/handlers.h"
#include "server/tenant_routes.h"

void ls_handle_health(const ls_request *req, ls_reply *r) {
    (void)req;
    ls_reply_json(r, 200, ls_json_take_text(json_pack("{s:s}", "status", "ok")));
}

void ls_handle_ready(const ls_request *req, ls_reply *r) {
    /* The backend says whether it can still serve, whatever path (a
     * forward, an adapter load) hit the device error. */
    if (!ls_backend_usable(req->srv->backend)) {
        ls_reply_fail(r, LS_DEVICE_ERROR, "restart the server; the device error is in the log",
                      "the %s backend hit an unrecoverable device error", ls_backend_name(req->srv->backend));
        return;
    }
    /* A probe on a connection kept alive through the drain must not read
     * "ready": new connections are refused by then, and a load balancer
     * that reuses its probe's connection would keep sending traffic. */
    if (atomic_load(&req->srv->stopping)) {
        ls_reply_fail(r, LS_SHUTTING_DOWN, NULL,
                      "the server is stopping: it finishes the requests it has begun and takes no new connections");
        return;
    }
    const ls_backend *be = req->srv->backend;
    json_t *j = json_pack("{s:s, s:s}", "status", "ready", "backend", ls_backend_name(be));
    /* The CPU's kernel path: every path gives the same bits, but an
     * operator comparing machines' speed wants to know which ran. */
    if (j && ls_backend_isa(be)) json_object_set_new(j, "isa", json_string(ls_backend_isa(be)));
    /* The arithmetic, which (unlike the path) changes the numbers. */
    if (j && ls_backend_isa(be)) json_object_set_new(j, "compute", json_string(ls_cpu_compute_name(req->srv->cfg.compute)));
    ls_reply_json(r, 200, ls_json_take_text(j));
}

void ls_handle_metrics(const ls_request *req, ls_reply *r) {
    char *text = ls_tenant_metrics_view(req->who, ls_metrics_render(&req->srv->metrics, req->srv->pool, req->srv->backend));
    if (!text) {
        ls_reply_fail(r, LS_INTERNAL, NULL, "out of memory rendering metrics");
        return;
    }
    ls_reply_json(r, 200, text);
    r->content_type = "text/plain; version=0.0.4; charset=utf-8";
}

void ls_handle_model(const ls_request *req, ls_reply *r) {
    ls_error err;
    ls_error_init(&err);
    json_t *j = ls_describe_model(req->srv, &err);
    if (!j) ls_reply_error(r, &err);
    else ls_reply_json(r, 200, ls_json_take_text(j));
    ls_error_free(&err);
}

void ls_handle_pool(const ls_request *req, ls_reply *r) {
    ls_error err;
    ls_error_init(&err);
    json_t *j = ls_describe_pool(req->srv, &err);
    if (j) ls_tenant_pool_view(req->who, j);
    if (!j) ls_reply_error(r, &err);
    else ls_reply_json(r, 200, ls_json_take_text(j));
    ls_error_free(&err);
}
