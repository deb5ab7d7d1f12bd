/* POST /forward: parse, run through the batcher (or the pool directly),
 * answer in the encoding the request came in. */
#include <stdlib.h>
#include <string.h>

#include "api/forward.h"
#include "common/log.h"
#include "server/request.h"

/* Runs the forward; owns nothing. */
static ls_status ls_forward_run(ls_server *srv, const ls_forward_req *fr, float *y, ls_pool_used *used, int *n_used,
                                ls_error *err) {
    return ls_pool_forward(srv->pool, fr->layer, fr->T, fr->x, fr->gammas, (const char *const *)fr->names, y, used,
                           n_used, err);
}

void ls_handle_forward(const ls_request *req, ls_reply *r) {
    ls_server *srv = req->srv;
    ls_error err;
    ls_error_init(&err);
    ls_forward_req fr;
    float *y = NULL;
    ls_pool_used *used = NULL;
    ls_forward_used *wire = NULL;
    ls_status st;
    if (req->kind == LS_BODY_SAFETENSORS)
        st = ls_forward_req_parse_safetensors(req->body, req->len, ls_request_query(req, "layer"),
                                              ls_request_query(req, "adapter"), &srv->dims, &fr, &err);
    else
        st = ls_forward_req_parse_json((const char *)req->body, req->len, &srv->dims, &fr, &err);
    if (st != LS_OK) goto done_noreq;

    y = malloc((size_t)fr.T * (size_t)srv->dims.H * sizeof *y);
    used = calloc((size_t)fr.T, sizeof *used);
    if (!y || !used) {
        st = ls_error_set(&err, LS_INTERNAL, NULL, "out of memory for %d tokens", fr.T);
        goto done;
    }
    int n_used = 0;
    st = ls_forward_run(srv, &fr, y, used, &n_used, &err);
    if (st == LS_DEVICE_ERROR && ls_backend_poisoned(srv->backend)) {
        atomic_store(&srv->poisoned, true);
        ls_log_error("device error poisoned the backend: %s; /ready now answers 503", err.message);
    }
    if (st != LS_OK) goto done;
    ls_metrics_add_tokens(&srv->metrics, (uint64_t)fr.T);

    wire = calloc((size_t)(n_used ? n_used : 1), sizeof *wire);
    if (!wire) {
        st = ls_error_set(&err, LS_INTERNAL, NULL, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_used; i++) wire[i] = (ls_forward_used){used[i].name, used[i].version, used[i].slot};
    if (req->kind == LS_BODY_SAFETENSORS) {
        uint8_t *out = NULL;
        size_t len = 0;
        st = ls_forward_resp_safetensors(&fr, srv->dims.H, y, wire, n_used, &out, &len, &err);
        if (st == LS_OK) {
            r->status = 200;
            r->body = (char *)out;
            r->len = len;
            r->content_type = "application/octet-stream";
        }
    } else {
        ls_reply_json(r, 200, ls_forward_resp_json(&fr, srv->dims.H, y, wire, n_used));
    }
done:
    ls_forward_req_free(&fr);
done_noreq:
    if (st != LS_OK) ls_reply_error(r, &err);
    free(wire);
    free(used);
    free(y);
    ls_error_free(&err);
}
