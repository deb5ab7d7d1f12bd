/* Server start-up and tear-down: device choice, model, backend, pool. */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/error_body.h"
#include "api/forward.h"
#include "common/log.h"
#include "gpu/cpu/cpu_backend.h"
#include "gpu/cuda/cuda_backend.h"
#include "model/model.h"
#include "lora/autoload.h"
#include "server/tenant.h"
#include "server/tenant_routes.h"
#include "server/http_status.h"
#include "server/batcher.h"
#include "server/offload.h"
#include "server/tls.h"

/* What the log adds about bf16 compute: whether this CPU runs it natively. */
static const char *ls_server_compute_note(const ls_backend *be, const ls_config *cfg) {
    if (cfg->compute != LS_CPU_COMPUTE_BF16) return "";
    return strcmp(ls_backend_isa(be), "avx512bf16") == 0 ? " (VDPBF16PS)"
                                                          : " (emulated: this CPU has no AVX512-BF16; the same bits, "
                                                            "not faster than f32)";
}

static ls_dtype ls_server_dtype(ls_weight_dtype d, ls_dtype file_dtype) {
    switch (d) {
    case LS_WDTYPE_BF16: return LS_DTYPE_BF16;
    case LS_WDTYPE_F16: return LS_DTYPE_F16;
    case LS_WDTYPE_F32: return LS_DTYPE_F32;
    default: return file_dtype;
    }
}

/* The start-up log's account of the model: what, where from, which
 * layers, what dtype, whether the gate applies, which files were read. */
static void ls_server_log_model(const ls_model *m, ls_dtype served) {
    char layers[160], files[512] = "";
    ls_dims_layers_str(&m->dims, layers, sizeof layers);
    for (int i = 0; i < m->n_files; i++) {
        size_t l = strlen(files);
        if (i == 8 && m->n_files > 9) {
            snprintf(files + l, sizeof files - l, ", ... (%d files)", m->n_files);
            break;
        }
        snprintf(files + l, sizeof files - l, "%s%s", i ? ", " : "", m->files[i]);
    }
    ls_log_info("model: %s %s%s%s%s, family %s: n=%d H=%d F=%d, layers %s (%d of %d: %s), %s weights%s, w13 %s, "
                "%.1f MiB of shared experts",
                m->source, m->path[0] ? m->path : "(built in)", m->model_type[0] ? " (model_type " : "",
                m->model_type, m->model_type[0] ? ")" : "", m->family, m->dims.n, m->dims.H, m->dims.F, layers,
                m->dims.L, ls_dims_layers_total(&m->dims), m->rule, ls_dtype_name(served),
                m->fp8 ? " (FP8 blocks dequantized to bf16 at load)" : "", ls_w13_layout_name(m->dims.w13_layout),
                (double)m->bytes / (1 << 20));
    if (m->dims.gate) ls_log_info("model: shared-expert gate: a forward without gammas applies sigmoid(gate . x)");
    if (m->n_files) ls_log_info("model: read %s", files);
}

/* Prints err's structured body on stderr: an operator reads the same
 * violations a client of POST /adapters would. */
static void ls_server_preload_error(const char *name, const ls_error *err) {
    char *body = ls_error_body_text(err, ls_http_status(err->code == LS_OK ? LS_INTERNAL : err->code));
    ls_log_error("start-up adapter %s: %s", name, err->message);
    fprintf(stderr, "%s\n", body ? body : "{\"error\": {\"code\": \"internal\"}}");
    free(body);
}

/* Loads the --adapter entries (after the state directory's restore, so
 * that an entry names what it wants served now). A name already restored
 * as this entry left it (same factors, pin and path, not auto-loaded) is
 * kept as it is (no new version on every restart); otherwise the entry
 * replaces it. The first failure stops start-up. */
static bool ls_server_preload(ls_server *srv) {
    const char *cursor = srv->cfg.adapters;
    ls_config_adapter e;
    int loaded = 0, kept = 0;
    while (ls_config_adapter_next(&cursor, &e)) {
        ls_error err;
        ls_error_init(&err);
        ls_adapter a;
        ls_adapter_origin origin;
        ls_adapter_info info;
        ls_status st = ls_adapter_name_check(e.name, "--adapter", &err);
        ls_adapter_source src = {.path = e.path, .given = {.strict = srv->cfg.strict_adapters}};
        if (st == LS_OK) st = ls_loader_load(&srv->loader, &src, &a, &origin, &err);
        if (st != LS_OK) {
            ls_server_preload_error(e.name, &err);
            ls_error_free(&err);
            return false;
        }
        bool exists = ls_pool_describe(srv->pool, e.name, &info, NULL) == LS_OK;
        if (exists && info.pinned == e.pinned && !info.auto_loaded && !strcmp(info.source_path, origin.path) &&
            !strcmp(info.meta.sha256, a.meta.sha256)) {
            ls_log_info("start-up adapter %s: kept v%llu restored from the state directory (same sha256)", e.name,
                        (unsigned long long)info.version);
            ls_adapter_free(&a);
            ls_error_free(&err);
            kept++;
            continue;
        }
        ls_pool_load_opts opts = {.pinned = e.pinned, .replace = exists, .source_path = origin.path,
                                  .params = origin.params};
        if ((st = ls_pool_load(srv->pool, e.name, &a, &opts, &info, &err)) != LS_OK) {
            ls_adapter_free(&a);
            ls_server_preload_error(e.name, &err);
            ls_error_free(&err);
            return false;
        }
        ls_log_info("start-up adapter %s v%llu loaded from %s: rank %d, %s%s", e.name, (unsigned long long)info.version,
                    origin.path, info.meta.rank, ls_adapter_format_name(info.meta.format), e.pinned ? ", pinned" : "");
        ls_error_free(&err);
        loaded++;
    }
    if (loaded || kept)
        ls_log_info("start-up adapters: %d loaded, %d kept as the state directory restored them (the same files)",
                    loaded, kept);
    return true;
}

/* Auto-load's loads, counted in the same gauge as uploads. */
static void ls_server_count_load(void *metrics, int delta) { ls_metrics_loads(metrics, delta); }

/* The state directory's lock first: a second server on it stops here,
 * before it loads a model or takes a device. Then the model (from its
 * weights, or the demo one). */
static bool ls_server_open_model(ls_server *srv, const ls_config *cfg, ls_error *err) {
    ls_status st;
    if (cfg->state_dir[0] && (st = ls_state_open(cfg->state_dir, &srv->state, err)) != LS_OK) {
        ls_log_error("%s", err->message);
        if (err->hint[0]) ls_log_error("hint: %s", err->hint);
        return false;
    }
    if (cfg->weights[0]) {
        st = ls_model_open(cfg->weights, cfg->w13_layout_set ? &cfg->w13_layout : NULL, &srv->model, err);
    } else {
        ls_dims d = {.n = cfg->experts, .H = cfg->hidden, .F = cfg->intermediate, .L = cfg->layers,
                     .w13_layout = cfg->w13_layout};
        st = ls_model_demo(&d, cfg->seed, ls_server_dtype(cfg->dtype, LS_DTYPE_BF16), &srv->model, err);
    }
    if (st != LS_OK) {
        ls_log_error("model: %s", err->message);
        /* Only a hint of the model's own: the code's default speaks of requests. */
        if (err->hint[0] && strcmp(err->hint, ls_status_hint(err->code))) ls_log_error("hint: %s", err->hint);
        return false;
    }
    return true;
}

/* The backend cfg asks for (--device, --threads, --cpu-isa, --compute), made for bc. */
static bool ls_server_make_backend(ls_server *srv, const ls_config *cfg, const ls_backend_config *bc, ls_error *err) {
    const bool use_cuda = cfg->device == LS_DEVICE_CUDA || (cfg->device == LS_DEVICE_AUTO && ls_backend_cuda_available());
    const ls_cpu_settings cpu = {.threads = cfg->threads, .isa = cfg->cpu_isa, .compute = cfg->compute};
    const ls_cuda_settings cuda = {.device_id = 0, .graphs = cfg->cuda_graphs > 0 ? cfg->cuda_graphs : -1};
    ls_status st = use_cuda ? ls_backend_cuda_create(bc, &cuda, &srv->backend, err)
                            : ls_backend_cpu_create(bc, &cpu, &srv->backend, err);
    if (st != LS_OK) {
        ls_log_error("cannot start the %s backend: %s", use_cuda ? "cuda" : "cpu", err->message);
        if (err->hint[0] && strcmp(err->hint, ls_status_hint(err->code))) ls_log_error("hint: %s", err->hint);
        return false;
    }
    return true;
}

/* A backend handed to ls_server_init_with_backend must serve the model's
 * shapes and hold the pool cfg asks for; its dtype is its own. */
static bool ls_server_backend_fits(const ls_backend *be, const ls_backend_config *bc) {
    const ls_dims *d = ls_backend_dims(be), *m = &bc->dims;
    const ls_pool_dims *p = ls_backend_pool_dims(be), *q = &bc->pool;
    if (d->n == m->n && d->H == m->H && d->F == m->F && d->L == m->L && d->w13_layout == m->w13_layout &&
        d->gate == m->gate && p->slots == q->slots && p->max_rank == q->max_rank && p->layout == q->layout &&
        p->max_tokens == q->max_tokens)
        return true;
    ls_log_error("the %s backend handed to the server was made for n=%d H=%d F=%d L=%d (w13 %s%s), %d slots of rank "
                 "%d (%s), %d tokens; the server serves n=%d H=%d F=%d L=%d (w13 %s%s), %d slots of rank %d (%s), %d "
                 "tokens",
                 ls_backend_name(be), d->n, d->H, d->F, d->L, ls_w13_layout_name(d->w13_layout), d->gate ? ", gate" : "",
                 p->slots, p->max_rank, ls_lora_layout_name(p->layout), p->max_tokens, m->n, m->H, m->F, m->L,
                 ls_w13_layout_name(m->w13_layout), m->gate ? ", gate" : "", q->slots, q->max_rank,
                 ls_lora_layout_name(q->layout), q->max_tokens);
    return false;
}

/* The backend (srv->backend when one was handed in, else the one cfg asks
 * for), with the base weights uploaded (the host copy then let go). */
static bool ls_server_open_backend(ls_server *srv, const ls_config *cfg, ls_error *err) {
    ls_model *model = &srv->model;
    srv->dims = model->dims;
    srv->pool_dims = (ls_pool_dims){.slots = cfg->slots, .max_rank = cfg->max_rank, .layout = cfg->lora_layout,
                                    .max_tokens = cfg->max_batch_tokens};
    ls_backend_config bc = {.dims = srv->dims, .pool = srv->pool_dims, .dtype = ls_server_dtype(cfg->dtype, model->dtype)};
    const bool handed = srv->backend != NULL;
    if (handed ? !ls_server_backend_fits(srv->backend, &bc) : !ls_server_make_backend(srv, cfg, &bc, err))
        return false;
    srv->pool_dims = *ls_backend_pool_dims(srv->backend); /* with what the backend cannot apply */
    ls_status st;
    if (ls_backend_isa(srv->backend) && !handed)
        ls_log_info("cpu engine: %s kernels (--cpu-isa %s), %d threads, compute %s%s", ls_backend_isa(srv->backend),
                    ls_cpu_isa_name(cfg->cpu_isa), ls_backend_threads(srv->backend), ls_cpu_compute_name(cfg->compute),
                    ls_server_compute_note(srv->backend, cfg));
    if ((st = ls_model_upload(model, srv->backend, err)) != LS_OK) {
        ls_log_error("uploading the base weights: %s", err->message);
        return false;
    }
    ls_model_release(model);
    ls_server_log_model(model, ls_backend_dtype(srv->backend));
    ls_log_info("pool: %d slots, max rank %d, %s layout, %.1f MiB", cfg->slots, cfg->max_rank,
                ls_lora_layout_name(cfg->lora_layout), (double)ls_backend_pool_bytes(srv->backend) / (1 << 20));
    return true;
}

/* The audit line of an adapter an auto-load registered, on behalf of the
 * forward's caller (actor: its ls_principal; NULL when no request asked,
 * as in the tests of lora/). */
static ls_status ls_server_register_autoload(void *ctx, const void *actor, const char *name, ls_adapter *a,
                                             const ls_pool_load_opts *opts, ls_adapter_info *info, ls_error *err) {
    static const ls_principal none = {.role = LS_ROLE_ADMIN, .key_id = "-", .max_adapters = -1, .max_pins = -1};
    const ls_principal *who = actor ? actor : &none;
    ls_status st = ls_tenant_register(ctx, who, name, a, opts, info, err);
    /* Every load that stands, also one the disk made though its sync
     * failed (a version: lora/pool.h). */
    if (info->version > 0) ls_tenant_audit(who, "auto-load", name, info->version);
    return st;
}

/* The adapter directory, the pool with the registry restored from the
 * state directory, the start-up adapters and auto-load. */
static bool ls_server_open_adapters(ls_server *srv, const ls_config *cfg, ls_error *err) {
    ls_status st;
    if ((st = ls_loader_open(&srv->loader, cfg->adapter_dir, &srv->dims, &srv->pool_dims, err)) != LS_OK) {
        ls_log_error("%s", err->message);
        if (err->hint[0] && strcmp(err->hint, ls_status_hint(err->code))) ls_log_error("hint: %s", err->hint);
        return false;
    }
    /* Paths are taken beneath this directory only: say which it is, since
     * the default is wherever the server was started. */
    srv->loader.max_file_bytes = (size_t)cfg->max_adapter_mb << 20;
    /* With keys there may be tenants, each confined to its TENANT/. */
    srv->loader.scoped = cfg->api_keys[0] != '\0';
    ls_log_info("adapter directory %s%s: adapter paths resolve beneath it", srv->loader.root,
                cfg->adapter_dir[0] ? "" : " (the working directory; set --adapter-dir)");
    ls_pool_config pc = {.host_cache = cfg->host_cache, .reload = ls_loader_reload, .reload_ctx = &srv->loader,
                         .state = srv->state};
    if ((st = ls_pool_create(srv->backend, &pc, &srv->pool, err)) != LS_OK) {
        ls_log_error("pool: %s", err->message);
        return false;
    }
    /* Before the server listens: /ready answers 200 only with the
     * registry back as it was acknowledged. */
    int restored = 0;
    if ((st = ls_pool_restore(srv->pool, &restored, err)) != LS_OK) {
        /* Its messages mostly name the state directory already; the hint
         * says what to do about a record that cannot be read. */
        const bool named = !strncmp(err->message, "state directory", 15);
        ls_log_error("%s%s%s%s%s", named ? "" : "state directory: ", err->message, err->hint[0] ? " (" : "",
                     err->hint, err->hint[0] ? ")" : "");
        return false;
    }
    if (srv->state) ls_log_info("state directory %s: %d adapter(s) restored", cfg->state_dir, restored);
    /* Each was an adapter a client was told is stored: said loudly, and
     * kept in /metrics for whoever watches the replicas. */
    srv->metrics.state_unrestored = ls_state_unrestored(srv->state);
    if (srv->metrics.state_unrestored)
        ls_log_warn("state directory %s: %d record(s) not restored (the lines above say why; damaged ones are in "
                    "%s/corrupt/): load those adapters again",
                    cfg->state_dir, srv->metrics.state_unrestored, cfg->state_dir);
    if (!ls_server_preload(srv)) return false;
    if (cfg->auto_load) {
        const ls_autoload_gauge gauge = {ls_server_count_load, &srv->metrics};
        if ((st = ls_autoload_create(&srv->loader, srv->pool, &gauge, cfg->strict_adapters, &srv->autoload, err)) !=
            LS_OK) {
            ls_log_error("auto-load: %s", err->message);
            return false;
        }
        ls_autoload_set_registrar(srv->autoload, &(ls_autoload_registrar){ls_server_register_autoload, srv});
        ls_log_info("auto-load on: forwards load unregistered adapters from %s by name", srv->loader.root);
    }
    return true;
}

/* The threads requests are handed to: the batcher and the two offload
 * pools. */
static bool ls_server_open_workers(ls_server *srv, const ls_config *cfg, ls_error *err) {
    if (cfg->batching &&
        ls_batcher_create(srv->pool, &srv->metrics, &srv->dims, cfg->max_batch_tokens, cfg->batch_wait_us,
                          cfg->max_queue_tokens, &srv->batcher, err) != LS_OK) {
        ls_log_error("batcher: %s", err->message);
        return false;
    }
    /* As many as there are HTTP threads: the requests that wait (loads
     * behind a forward, auto-loads) get the concurrency they had when
     * they held an HTTP thread, without taking one. */
    if (ls_offload_create(cfg->http_threads, &srv->metrics.offload_waiting[LS_METRICS_BACKEND_WORKERS],
                          &srv->offload, err) != LS_OK) {
        ls_log_error("offload workers: %s", err->message);
        return false;
    }
    /* Validations apart, as many again: queued with the loads, they
     * waited for the forward the loads wait for, which they never use. */
    if (ls_offload_create(cfg->http_threads, &srv->metrics.offload_waiting[LS_METRICS_DISK_WORKERS],
                          &srv->offload_disk, err) != LS_OK) {
        ls_log_error("offload workers: %s", err->message);
        return false;
    }
    return true;
}

bool ls_server_init(ls_server *srv, const ls_config *cfg) { return ls_server_init_with_backend(srv, cfg, NULL); }

bool ls_server_init_with_backend(ls_server *srv, const ls_config *cfg, ls_backend *be) {
    memset(srv, 0, sizeof *srv);
    srv->loader.dirfd = -1;
    srv->cfg = *cfg;
    srv->backend = be; /* taken now: ls_server_free releases it on every path */
    ls_metrics_init(&srv->metrics);
    ls_error err;
    ls_error_init(&err);
    bool use_cuda = cfg->device == LS_DEVICE_CUDA || (cfg->device == LS_DEVICE_AUTO && ls_backend_cuda_available());
    if (be)
        ls_log_info("lorasink %s starting on the %s backend (handed in)", LS_VERSION, ls_backend_name(be));
    else
        ls_log_info("lorasink %s starting on the %s backend (--device %s%s)", LS_VERSION, use_cuda ? "cuda" : "cpu",
                    ls_device_kind_name(cfg->device),
                    cfg->device == LS_DEVICE_AUTO && !use_cuda ? ": no CUDA device found" : "");
    /* The certificate first: a wrong file is told before a model loads. */
    bool ok = (!cfg->tls_cert[0] || (srv->tls = ls_tls_open(cfg))) && ls_server_open_model(srv, cfg, &err) &&
              ls_server_open_backend(srv, cfg, &err) && ls_server_open_adapters(srv, cfg, &err) &&
              ls_server_open_workers(srv, cfg, &err);
    ls_error_free(&err);
    if (!ok) ls_server_free(srv);
    return ok;
}

void ls_server_free(ls_server *srv) {
    /* Work flows both ways between these (a validated upload moves on to
     * the backend workers and their forwards to the batcher; a batch
     * whose auto-loaded adapter went sends its forward back to a disk
     * worker), so any order is safe only because ls_http_stop has let it
     * all run out: no connection is suspended, so no job is queued. */
    ls_offload_free(srv->offload_disk);
    srv->offload_disk = NULL;
    ls_offload_free(srv->offload);
    srv->offload = NULL;
    ls_batcher_free(srv->batcher);
    srv->batcher = NULL;
    ls_autoload_free(srv->autoload);
    srv->autoload = NULL;
    ls_pool_free(srv->pool);
    srv->pool = NULL;
    ls_state_close(srv->state);
    srv->state = NULL;
    ls_backend_free(srv->backend);
    srv->backend = NULL;
    ls_loader_close(&srv->loader);
    ls_metrics_free(&srv->metrics);
    ls_tenants_free(srv->tenants);
    srv->tenants = NULL;
    ls_model_free(&srv->model); /* last: srv->dims points at its layer numbers */
    ls_tls_free(srv->tls);      /* after the daemon, whose connections held its credentials */
    srv->tls = NULL;
}
