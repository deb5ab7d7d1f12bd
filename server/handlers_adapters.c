/* POST /adapters, POST /adapters/validate, GET /adapters[/{name}],
 * DELETE /adapters/{name}: parse the upload (api/), validate and
 * normalise it (lora/adapter), register it (lora/pool). A rejected upload
 * changes nothing: the pool is touched only by a complete, valid adapter. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "api/adapter_upload.h"
#include "common/log.h"
#include "common/text.h"
#include "server/describe.h"
#include "server/handlers.h"
#include "server/jobs.h"
#include "server/tenant_routes.h"

static const char *ls_query_mhd(void *ctx, const char *key) {
    return MHD_lookup_connection_value(ctx, MHD_GET_ARGUMENT_KIND, key);
}

/* Counts a rejected upload once per distinct code among its violations. */
static void ls_count_validation_failure(ls_server *srv, const ls_error *err) {
    bool seen[LS_STATUS_COUNT] = {false};
    if (err->n_violations == 0 && (unsigned)err->code < LS_STATUS_COUNT) seen[err->code] = true;
    for (size_t i = 0; i < err->n_violations; i++)
        if ((unsigned)err->violations[i].code < LS_STATUS_COUNT) seen[err->violations[i].code] = true;
    for (int c = 0; c < LS_STATUS_COUNT; c++)
        if (seen[c] && ls_status_is_validation((ls_status)c)) ls_metrics_validation_failure(&srv->metrics, (ls_status)c);
}

/* A parameter of the raw form on a body read as JSON: most likely a
 * safetensors file sent without its Content-Type (curl --data-binary
 * sends application/x-www-form-urlencoded, which is read as JSON). */
static ls_status ls_adapter_raw_query_on_json(const ls_request *req, const char *const *raw_query, ls_error *err) {
    for (int i = 0; raw_query[i]; i++) {
        if (!ls_request_query(req, raw_query[i])) continue;
        const char *type = ls_request_header(req, MHD_HTTP_HEADER_CONTENT_TYPE);
        char shown[80];
        ls_text_log_field(type ? type : "none", true, shown, sizeof shown);
        return ls_error_set(err, LS_INVALID_REQUEST,
                            "send a safetensors file with -H 'Content-Type: application/octet-stream' --data-binary "
                            "@FILE; a JSON body gives its parameters as keys of the body",
                            "query parameter \"%s\" belongs to a raw safetensors upload, but this body was read as "
                            "JSON (Content-Type: %s)",
                            raw_query[i], shown);
    }
    return LS_OK;
}

/* Parses an upload and loads it (lora/loader). On success *up, *a and
 * *origin are the caller's (up and a to free); on failure all are empty. */
static ls_status ls_adapter_prepare(const ls_request *req, bool require_name, ls_adapter_upload *up, ls_adapter *a,
                                    ls_adapter_origin *origin, ls_error *err) {
    /* The query parameters a raw body reads; a JSON body reads none. */
    static const char *const raw_query[] = {"name",          "format", "r",      "lora_alpha", "use_rslora", "scale",
                                            "gate_up_order", "pinned", "strict", "replace",    NULL};
    ls_server *srv = req->srv;
    const bool raw = req->kind == LS_BODY_SAFETENSORS;
    memset(up, 0, sizeof *up);
    ls_status st = raw ? LS_OK : ls_adapter_raw_query_on_json(req, raw_query, err);
    if (st == LS_OK)
        st = ls_request_check_query(req, raw ? raw_query : NULL,
                                    raw ? "" : "; a JSON body gives its parameters as keys of the body", err);
    if (st != LS_OK) {
        ls_count_validation_failure(srv, err);
        return st;
    }
    if (raw)
        st = ls_adapter_upload_parse_raw(req->body, req->len, ls_query_mhd, req->conn, srv->cfg.strict_adapters,
                                         require_name, up, err);
    else
        st = ls_adapter_upload_parse_json((const char *)req->body, req->len, srv->cfg.strict_adapters, require_name,
                                          up, err);
    /* The caller's names and paths become the pool's (server/tenant.h). */
    char name[130];
    if (st == LS_OK && up->name[0] && (st = ls_tenant_name_in(req->who, up->name, name, sizeof name, err)) == LS_OK)
        memcpy(up->name, name, strlen(name) + 1);
    if (st == LS_OK) st = ls_tenant_path_in(req->who, up->path, sizeof up->path, err);
    if (st != LS_OK) ls_adapter_upload_free(up);
    if (st == LS_OK) {
        ls_adapter_source src = ls_adapter_upload_source(up);
        src.tenant = ls_principal_scoped(req->who);
        if ((st = ls_loader_load(&srv->loader, &src, a, origin, err)) != LS_OK) ls_adapter_upload_free(up);
        /* Normalised: the uploaded tensors are not needed any more (a
         * registration may wait for the backend a while). */
        else ls_tensor_set_free(&up->tensors);
    }
    if (st != LS_OK) ls_count_validation_failure(srv, err);
    return st;
}

static json_t *ls_names_json(char *const *names, size_t n) {
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) json_array_append_new(arr, json_string(names[i]));
    return arr;
}

static json_t *ls_ignored_json(const ls_adapter *a) { return ls_names_json(a->ignored, a->meta.n_ignored); }

/* The layers (the checkpoint's numbers) whose flag is set. New reference. */
static json_t *ls_layers_json(const bool *present, int n, const ls_dims *dims) {
    json_t *arr = json_array();
    for (int l = 0; arr && present && l < n; l++)
        if (present[l]) json_array_append_new(arr, json_integer(ls_dims_layer_id(dims, l)));
    return arr;
}

/* What each kind of PEFT module was read with: one entry per module and
 * distinct (rank, scale), with the layers (the checkpoint's numbers)
 * that have it, in layer order; [] for the pool format. New reference. */
static json_t *ls_modules_json(const ls_adapter *a, const ls_dims *dims) {
    json_t *arr = json_array();
    const ls_adapter_modules *m = a->modules;
    const size_t K = LS_ADAPTER_MODULE_KINDS;
    bool *done = m && a->layers > 0 ? calloc((size_t)a->layers, sizeof *done) : NULL;
    for (size_t k = 0; arr && done && k < K; k++) {
        if (!m->name[k][0]) continue;
        memset(done, 0, (size_t)a->layers * sizeof *done);
        for (int l = 0; l < a->layers; l++) {
            const size_t at = (size_t)l * K + k;
            if (done[l] || !m->rank[at]) continue;
            json_t *layers = json_array();
            for (int o = l; layers && o < a->layers; o++) {
                const size_t ot = (size_t)o * K + k;
                if (done[o] || m->rank[ot] != m->rank[at] || m->scale[ot] != m->scale[at]) continue;
                done[o] = true;
                json_array_append_new(layers, json_integer(ls_dims_layer_id(dims, o)));
            }
            json_array_append_new(arr, json_pack("{s:s, s:i, s:f, s:o}", "module", m->name[k], "rank", m->rank[at],
                                                 "scale", m->scale[at], "layers", layers ? layers : json_array()));
        }
    }
    free(done);
    return arr;
}

/* An upload parsed and validated, waiting to be registered. */
struct ls_adapter_load_job {
    ls_server *srv;
    ls_principal who; /* the caller, for its quotas, its names and the audit line */
    ls_adapter_upload up;
    ls_adapter a;
    ls_adapter_origin origin;
};

ls_adapter_load_job *ls_adapter_load_prepare(const ls_request *req, ls_reply *r) {
    ls_server *srv = req->srv;
    ls_error err;
    ls_error_init(&err);
    ls_adapter_load_job *j = calloc(1, sizeof *j);
    ls_status st = j ? LS_OK : ls_error_set(&err, LS_INTERNAL, NULL, "out of memory");
    ls_metrics_loads(&srv->metrics, +1);
    if (st == LS_OK) st = ls_adapter_prepare(req, true, &j->up, &j->a, &j->origin, &err);
    if (st != LS_OK) {
        ls_metrics_loads(&srv->metrics, -1);
        free(j);
        ls_reply_error(r, &err);
        ls_error_free(&err);
        return NULL;
    }
    j->srv = srv;
    j->who = *req->who;
    ls_error_free(&err);
    return j;
}

void ls_adapter_load_commit(ls_adapter_load_job *j, ls_reply *r) {
    ls_server *srv = j->srv;
    ls_error err;
    ls_error_init(&err);
    json_t *ignored = ls_ignored_json(&j->a);
    json_t *modules = ls_modules_json(&j->a, &srv->dims);
    json_t *layers = ls_layers_json(j->a.layer_present, j->a.layers, &srv->dims); /* before the pool takes a */
    ls_pool_load_opts opts = {.pinned = j->up.pinned,
                              .keep_pin = !j->up.pinned_given,
                              .replace = j->up.replace,
                              .source_path = j->origin.path[0] ? j->origin.path : NULL,
                              .params = j->origin.params};
    ls_adapter_info info;
    ls_status st = ls_tenant_register(srv, &j->who, j->up.name, &j->a, &opts, &info, &err);
    /* Every load that stands, also one the disk made though its sync
     * failed (a version: lora/pool.h); what the pool replaced as it
     * published, not a look before. */
    if (info.version > 0) ls_tenant_audit(&j->who, info.replaced ? "replace" : "load", info.name, info.version);
    if (st == LS_OK) {
        ls_log_info("adapter %s v%llu loaded: rank %d, %s, %s", info.name, (unsigned long long)info.version,
                    info.meta.rank, ls_adapter_format_name(info.meta.format), info.slot >= 0 ? "resident" : "host tier");
        /* The pool took the adapter; its entry keeps the warnings, which
         * the description below carries. */
        for (int k = 0; k < LS_ADAPTER_WARNINGS; k++)
            if (info.warnings[k][0])
                ls_log_warn("adapter %s v%llu: %s", info.name, (unsigned long long)info.version, info.warnings[k]);
        json_t *d = ls_tenant_describe(srv, &j->who, &info);
        if (d) {
            json_object_set_new(d, "ignored", ignored);
            json_object_set_new(d, "modules", modules);
            json_object_set_new(d, "layers", layers);
        } else {
            json_decref(ignored);
            json_decref(modules);
            json_decref(layers);
        }
        ls_reply_json(r, 201, ls_json_take_text(d));
        memset(&j->a, 0, sizeof j->a); /* the pool owns it now */
    } else {
        json_decref(ignored);
        json_decref(modules);
        json_decref(layers);
        ls_reply_error(r, &err);
    }
    ls_error_free(&err);
    ls_adapter_load_job_free(j);
}

void ls_adapter_load_job_free(ls_adapter_load_job *j) {
    if (!j) return;
    ls_adapter_free(&j->a);
    ls_adapter_upload_free(&j->up);
    ls_metrics_loads(&j->srv->metrics, -1);
    free(j);
}

void ls_handle_adapter_load(const ls_request *req, ls_reply *r) {
    ls_adapter_load_job *j = ls_adapter_load_prepare(req, r);
    if (j) ls_adapter_load_commit(j, r);
}

void ls_handle_adapter_validate(const ls_request *req, ls_reply *r) {
    ls_error err;
    ls_error_init(&err);
    ls_adapter_upload up;
    ls_adapter a;
    ls_adapter_origin origin;
    ls_status st = ls_adapter_prepare(req, false, &up, &a, &origin, &err);
    if (st == LS_OK) {
        json_t *layers = ls_layers_json(a.layer_present, a.layers, &req->srv->dims);
        json_t *j = json_pack("{s:b, s:s, s:i, s:f, s:s, s:o, s:o, s:o, s:s, s:I}", "valid", 1, "format",
                              ls_adapter_format_name(a.meta.format), "rank", a.meta.rank, "scale", a.meta.scale, "layout",
                              a.meta.outer > 1 ? "per-expert" : "shared", "layers", layers, "ignored", ls_ignored_json(&a),
                              "warnings", ls_describe_warnings(a.warnings), "sha256", a.meta.sha256, "bytes",
                              (json_int_t)a.meta.bytes);
        if (j) json_object_set_new(j, "shared_expert_gate", json_boolean(a.meta.gate));
        if (j) json_object_set_new(j, "modules", ls_modules_json(&a, &req->srv->dims));
        if (j && up.name[0]) json_object_set_new(j, "name", json_string(ls_tenant_name_out(req->who, up.name)));
        ls_reply_json(r, 200, ls_json_take_text(j));
        ls_adapter_free(&a);
        ls_adapter_upload_free(&up);
    } else {
        ls_reply_error(r, &err);
    }
    ls_error_free(&err);
}

void ls_handle_adapter_list(const ls_request *req, ls_reply *r) {
    ls_error err;
    ls_error_init(&err);
    ls_adapter_info *infos = NULL;
    size_t n = 0;
    if (ls_pool_list(req->srv->pool, &infos, &n, &err) != LS_OK) {
        ls_reply_error(r, &err);
    } else {
        json_t *arr = json_array();
        for (size_t i = 0; arr && i < n; i++) {
            json_t *d = ls_tenant_describe(req->srv, req->who, &infos[i]);
            if (d) json_array_append_new(arr, d);
        }
        ls_reply_json(r, 200, ls_json_take_text(json_pack("{s:o}", "adapters", arr)));
    }
    free(infos);
    ls_error_free(&err);
}

void ls_handle_adapter_get(const ls_request *req, ls_reply *r) {
    ls_error err;
    ls_error_init(&err);
    ls_adapter_info info;
    ls_adapter_details d;
    memset(&d, 0, sizeof d);
    char name[LS_TENANT_LOOKUP_MAX];
    if (ls_tenant_name_lookup(req->who, req->param, name, sizeof name, &err) != LS_OK ||
        ls_pool_describe_details(req->srv->pool, name, &info, &d, &err) != LS_OK) {
        ls_reply_error(r, &err);
    } else {
        /* One adapter's GET also says what its load applied and skipped. */
        json_t *j = ls_tenant_describe(req->srv, req->who, &info);
        if (j) {
            json_object_set_new(j, "layers", ls_layers_json(d.layers, d.n_layers, &req->srv->dims));
            json_object_set_new(j, "ignored", ls_names_json(d.ignored, d.n_ignored));
        }
        ls_reply_json(r, 200, ls_json_take_text(j));
    }
    ls_adapter_details_free(&d);
    ls_error_free(&err);
}

void ls_handle_adapter_delete(const ls_request *req, ls_reply *r) {
    ls_error err;
    ls_error_init(&err);
    ls_adapter_info info;
    memset(&info, 0, sizeof info);
    char name[LS_TENANT_LOOKUP_MAX];
    ls_status st = ls_tenant_name_lookup(req->who, req->param, name, sizeof name, &err);
    if (st == LS_OK) st = ls_request_check_query(req, NULL, "", &err);
    /* The reply names the version the delete removed, which a replace
     * racing it may have made newer than any describe before. */
    if (st == LS_OK) st = ls_pool_delete(req->srv->pool, name, &info, &err);
    /* Every delete that stands, also one the disk made though its sync
     * failed (a version: lora/pool.h). */
    if (info.version > 0) ls_tenant_audit(req->who, "delete", info.name, info.version);
    if (st != LS_OK) {
        ls_reply_error(r, &err);
    } else {
        ls_log_info("adapter %s v%llu deleted", info.name, (unsigned long long)info.version);
        ls_reply_json(r, 200,
                      ls_json_take_text(json_pack("{s:s, s:I, s:b}", "deleted", ls_tenant_name_out(req->who, info.name), "version",
                                                  (json_int_t)info.version, "in_flight", info.in_flight > 0)));
    }
    ls_error_free(&err);
}
