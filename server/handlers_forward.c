/* POST /forward: parse, run through the batcher (or the pool directly),
 * answer in the encoding the request came in. With the batcher, http.c
 * suspends the connection between ls_forward_prepare and
 * ls_forward_complete so no HTTP thread waits on a batch; a forward that
 * must auto-load an adapter first has it read on a disk worker and
 * registered on a backend worker. */
#include <stdlib.h>
#include <string.h>

#include "api/forward.h"
#include "common/log.h"
#include "common/mem.h"
#include "lora/autoload.h"
#include "server/batcher.h"
#include "server/handlers.h"
#include "server/jobs.h"
#include "server/tenant_routes.h"

/* What a forward's adapter bookkeeping counts against --max-queue-mb per
 * token: the unit it had when names were a string per token (a pointer, a
 * 152-byte used record and 32 bytes of name), kept so that the budget
 * refuses what it refused; the table now holds less (an index a token,
 * the rest per distinct name). */
enum { LS_FORWARD_TOKEN_BYTES = 192 };

/* Bytes kept in front of y for a safetensors reply's length field and
 * header, so the reply is sent from y's own buffer instead of a copy as
 * large as y. A forward's header (one adapter at most) takes some
 * hundreds; one that does not fit is copied as before. */
enum { LS_FORWARD_REPLY_ROOM = 4096 };

struct ls_forward_job {
    ls_forward_req fr;
    ls_body_kind kind;
    float *y;       /* [T, H], in ybuf */
    uint8_t *ybuf;  /* owned: y's allocation, y at LS_FORWARD_REPLY_ROOM for a safetensors reply (else 0) */
    ls_pool_used *used;
    ls_batch_job job;
    ls_server *srv;
    unsigned long long held; /* bytes counted in srv->metrics.queue_bytes */
    ls_error load_err; /* an adapter's read failed after another was read: answered once that one is registered */
    int load_until;    /* with load_err: the index (in fr.names) of the adapter that failed */
    int again;         /* times the forward went again after its batch (ls_forward_again) */
    ls_principal who;  /* the caller: its names are mapped in and out (server/tenant.h) */
};

/* Frees the job's tensors and gives its bytes back to the budget; the
 * job itself stays (its connection frees it). Idempotent. */
static void ls_forward_job_release(ls_forward_job *fj) {
    if (fj->held) atomic_fetch_sub(&fj->srv->metrics.queue_bytes, fj->held);
    fj->held = 0;
    ls_forward_req_free(&fj->fr);
    free(fj->ybuf);
    free(fj->used);
    fj->ybuf = NULL;
    fj->y = NULL;
    fj->used = NULL;
}

void ls_forward_job_free(ls_forward_job *fj) {
    if (!fj) return;
    ls_forward_job_release(fj);
    ls_error_free(&fj->job.err);
    ls_error_free(&fj->load_err);
    free(fj);
}

/* --auto-load, the look an HTTP thread may take: the adapters the
 * forward names that are not registered, what is left to do for them
 * (the largest step of all), and the answers that come at once: no such
 * file, or a file that failed as it is now (a typo is answered at once,
 * not after the loads queued ahead of it). A tenant's adapter to be
 * loaded must fit its quota with the others the forward loads (an early
 * answer: the registration checks again, under the tenants' lock). */
static ls_status ls_forward_autoload_check(ls_server *srv, const ls_principal *who, const ls_forward_req *fr,
                                           ls_forward_step *next, ls_error *err) {
    *next = LS_FORWARD_BATCH;
    size_t loads = 0; /* the names before k to be loaded: one request's loads fit the quota together */
    for (int k = 0; k < fr->names.n; k++) {
        ls_autoload_need need;
        ls_status st = ls_autoload_check(srv->autoload, fr->names.names[k], &need, err);
        if (st == LS_OK && need != LS_AUTOLOAD_READY) {
            st = ls_tenant_admit_load(srv, who, fr->names.names[k], false, false, loads++, err);
            if (st == LS_ADAPTER_QUOTA) ls_tenant_audit_refused(who, "auto-load", fr->names.names[k], st);
        }
        if (st != LS_OK) return st;
        if (need == LS_AUTOLOAD_READ) *next = LS_FORWARD_READ;
        else if (need != LS_AUTOLOAD_READY && *next == LS_FORWARD_BATCH) *next = LS_FORWARD_LOAD;
    }
    return LS_OK;
}

/* Reads (and validates) the files of the adapters the forward names
 * (each distinct name once, in order of first use) that are to be
 * loaded, at most ls_pool_read_budget of them: each
 * waits, normalised in memory, until the load step registers it, so a
 * forward naming hundreds must not hold them all at once. The load step
 * reads the rest one at a time as it registers them. */
ls_forward_step ls_forward_read(ls_forward_job *fj, ls_reply *r) {
    const ls_forward_req *fr = &fj->fr;
    const int budget = ls_pool_read_budget(fj->srv->pool);
    bool load = false, read = false;
    int staged = 0;
    ls_error err;
    ls_error_init(&err);
    for (int k = 0; k < fr->names.n && staged < budget; k++) {
        ls_autoload_need need;
        if (ls_autoload_read(fj->srv->autoload, fr->names.names[k], &need, &err) != LS_OK) {
            if (!read) { /* nothing this request read waits to be registered: answer now */
                ls_reply_error(r, &err);
                ls_error_free(&err);
                return LS_FORWARD_ANSWERED;
            }
            /* An adapter read before waits for its registration (a read
             * one is registered by its reader); the error is answered then. */
            ls_error_copy(&fj->load_err, &err);
            fj->load_until = k;
            break;
        }
        if (need != LS_AUTOLOAD_READY) load = true;
        if (need == LS_AUTOLOAD_LOAD) read = true, staged++;
    }
    ls_error_free(&err);
    return load ? LS_FORWARD_LOAD : LS_FORWARD_BATCH;
}

ls_forward_step ls_forward_load(ls_forward_job *fj, ls_reply *r) {
    const ls_forward_req *fr = &fj->fr;
    const bool failed = fj->load_err.code != LS_OK;
    const int until = failed ? fj->load_until : fr->names.n;
    ls_error err;
    ls_error_init(&err);
    ls_status st = LS_OK;
    /* Once the answer is an error (an adapter failed its read, or fails
     * here), the names left are only finished: an adapter this request
     * read is registered by this request (no other may ever ask for that
     * name, and the loads gauge counts it until then), but nothing more
     * is read or waited for. */
    for (int k = 0; k < until; k++) {
        if (st == LS_OK && !failed) st = ls_autoload_ensure_by(fj->srv->autoload, fr->names.names[k], &fj->who, &err);
        else ls_autoload_finish_by(fj->srv->autoload, fr->names.names[k], &fj->who, NULL);
    }
    const ls_error *answer = failed ? &fj->load_err : st != LS_OK ? &err : NULL;
    if (answer) ls_reply_error(r, answer);
    ls_error_free(&err);
    if (answer) return LS_FORWARD_ANSWERED;
    return LS_FORWARD_BATCH;
}

/* How many times a forward whose auto-loaded adapter was deleted before
 * its batch goes again: a client deleting the name as fast as forwards
 * load it must not keep one waiting for ever. */
enum { LS_FORWARD_AGAIN_MAX = 3 };

bool ls_forward_again(const ls_forward_job *fj) {
    return fj->job.status == LS_ADAPTER_NOT_FOUND && fj->srv->autoload && fj->again < LS_FORWARD_AGAIN_MAX;
}

ls_forward_step ls_forward_restart(ls_forward_job *fj, ls_reply *r) {
    fj->again++;
    /* What it may read now (the deleted adapter from its file) is held
     * until it is answered, as at prepare: counted again, not refused
     * (it was admitted; a request alone is always served). */
    const unsigned long long more = ls_pool_forward_read_bytes(fj->srv->pool, &fj->fr.names, true);
    atomic_fetch_add(&fj->srv->metrics.queue_bytes, more);
    fj->held += more;
    ls_log_debug("forward: an adapter it names was deleted after it was loaded; loading again (try %d)", fj->again);
    ls_error_free(&fj->job.err);
    ls_error_init(&fj->job.err);
    fj->job.status = LS_OK;
    fj->job.n_used = 0;
    ls_forward_step next;
    ls_error err;
    ls_error_init(&err);
    if (ls_forward_autoload_check(fj->srv, &fj->who, &fj->fr, &next, &err) != LS_OK) {
        ls_reply_error(r, &err);
        next = LS_FORWARD_ANSWERED;
    }
    ls_error_free(&err);
    return next;
}

/* The query parameters a forward reads, by body kind. */
static const char *const ls_forward_query_raw[] = {"layer", "adapter", NULL};
static const char *const ls_forward_query_json[] = {"adapter", NULL};

ls_forward_job *ls_forward_prepare(const ls_request *req, ls_forward_step *next, ls_reply *r) {
    ls_server *srv = req->srv;
    *next = LS_FORWARD_BATCH;
    ls_error err;
    ls_error_init(&err);
    ls_forward_job *fj = calloc(1, sizeof *fj);
    ls_status st = fj ? LS_OK : ls_error_set(&err, LS_INTERNAL, NULL, "out of memory");
    /* The body's bytes counted as it arrived are the job's from here. */
    if (fj) {
        fj->srv = srv;
        fj->held = req->held;
    } else if (req->held) {
        atomic_fetch_sub(&srv->metrics.queue_bytes, req->held);
    }
    const bool raw = req->kind == LS_BODY_SAFETENSORS;
    if (st == LS_OK)
        st = ls_request_check_query(req, raw ? ls_forward_query_raw : ls_forward_query_json,
                                    raw ? "" : "; a JSON body gives layer and gammas as keys of the body", &err);
    /* The adapter may come beside the body (query or header), so that a
     * proxy can route on it without reading the body. */
    const char *routed = NULL, *what = NULL;
    if (st == LS_OK)
        st = ls_forward_routed_name(ls_request_query(req, "adapter"), ls_request_header(req, LS_FORWARD_ADAPTER_HEADER),
                                    &routed, &what, &err);
    if (st == LS_OK) {
        fj->kind = req->kind;
        if (req->kind == LS_BODY_SAFETENSORS) {
            st = ls_forward_req_parse_safetensors(req->body, req->len, ls_request_query(req, "layer"), NULL,
                                                  &srv->dims, srv->cfg.max_request_tokens, &fj->fr, &err);
        } else {
            st = ls_forward_req_parse_json((const char *)req->body, req->len, &srv->dims, srv->cfg.max_request_tokens,
                                           &fj->fr, &err);
        }
        if (st == LS_OK) st = ls_forward_req_route(&fj->fr, routed, what, &err);
        /* From here on the names are the pool's. */
        if (st == LS_OK) st = ls_tenant_forward_names(req->who, &fj->fr.names, &err);
        if (st == LS_OK) fj->who = *req->who;
        /* Before the batch: a load must not hold up other requests'
         * batch, nor the thread that prepares. */
        if (st == LS_OK && srv->autoload) st = ls_forward_autoload_check(srv, req->who, &fj->fr, next, &err);
        if (st != LS_OK) ls_forward_req_free(&fj->fr);
    }
    if (st == LS_OK) {
        /* What this request holds until it is answered: its body, x
         * (unless it is read in place from a safetensors body, counted
         * once as the body), gammas, y and names, and the host copies of
         * adapters it reads (dropped from the host tier, or loaded by
         * name), at most the pool's read budget of them at once. Past the
         * server-wide budget it is refused before y is allocated, as a
         * full queue refuses (429). */
        const unsigned long long T = (unsigned long long)fj->fr.T, H = (unsigned long long)srv->dims.H;
        const unsigned long long adapters =
            ls_pool_forward_read_bytes(srv->pool, &fj->fr.names, srv->autoload != NULL);
        const unsigned long long rows = (fj->fr.x_borrowed ? 1 : 2) * H + (unsigned long long)srv->dims.n;
        const unsigned long long bytes =
            req->len + T * rows * sizeof(float) + T * LS_FORWARD_TOKEN_BYTES + adapters;
        const unsigned long long budget = (unsigned long long)srv->cfg.max_queue_mb << 20;
        /* The body counted as it arrived is part of it already. */
        const unsigned long long handed = fj->held, more = bytes > handed ? bytes - handed : 0;
        unsigned long long others;
        if (!ls_metrics_budget_take(&srv->metrics.queue_bytes, handed, more, budget, &others)) {
            ls_metrics_overload(&srv->metrics);
            st = ls_error_set(&err, LS_OVERLOADED, "retry after a short wait, or send fewer tokens per request",
                              "forward requests in flight hold %.1f MiB and this one needs %.1f MiB (%.1f MiB of it "
                              "for adapters it reads into host memory): together over the %d MiB budget "
                              "(--max-queue-mb)",
                              (double)others / 1048576.0, (double)(handed + more) / 1048576.0,
                              (double)adapters / 1048576.0, srv->cfg.max_queue_mb);
        } else {
            fj->held = handed + more;
        }
    }
    if (st == LS_OK) {
        const size_t room = fj->kind == LS_BODY_SAFETENSORS ? LS_FORWARD_REPLY_ROOM : 0;
        const size_t ybytes = room + (size_t)fj->fr.T * (size_t)srv->dims.H * sizeof *fj->y;
        fj->ybuf = malloc(ybytes);
        ls_mem_advise_large(fj->ybuf, ybytes);
        fj->y = fj->ybuf ? (float *)(void *)(fj->ybuf + room) : NULL;
        fj->used = calloc((size_t)(fj->fr.names.n > 0 ? fj->fr.names.n : 1), sizeof *fj->used);
        if (!fj->y || !fj->used) st = ls_error_set(&err, LS_INTERNAL, NULL, "out of memory for %d tokens", fj->fr.T);
    }
    if (st != LS_OK) {
        ls_reply_error(r, &err);
        ls_error_free(&err);
        ls_forward_job_free(fj);
        *next = LS_FORWARD_ANSWERED;
        return NULL;
    }
    fj->job = (ls_batch_job){.layer = fj->fr.layer_index, .T = fj->fr.T, .x = fj->fr.x, .gammas = fj->fr.gammas,
                             .names = &fj->fr.names, .y = fj->y, .used = fj->used};
    ls_error_init(&fj->job.err);
    ls_error_free(&err);
    return fj;
}

ls_batch_job *ls_forward_batch_job(ls_forward_job *fj) { return &fj->job; }

static void ls_forward_reply(ls_server *srv, ls_forward_job *fj, ls_reply *r);

/* Per-adapter requests and tokens for the metrics. Counted here, per HTTP
 * request, because the pool sees batches, not requests. used[k] is the
 * adapter of the request's names[k], so a token counts by its index. */
static void ls_forward_count_adapters(ls_server *srv, const ls_forward_job *fj) {
    const ls_batch_job *job = &fj->job;
    const ls_token_names *names = &fj->fr.names;
    if (!names->of_token || job->n_used <= 0) return;
    uint64_t *tokens = calloc((size_t)job->n_used, sizeof *tokens);
    if (!tokens) return; /* metrics only: out of memory skips them */
    for (int t = 0; t < fj->fr.T; t++)
        if (names->of_token[t] >= 0 && names->of_token[t] < job->n_used) tokens[names->of_token[t]]++;
    ls_pool_count_served(srv->pool, job->used, tokens, job->n_used);
    free(tokens);
}

/* Once the reply is built the request is no longer queued: its tensors
 * go and its bytes leave the budget before the reply is sent, so a
 * client that has read its reply finds the budget free again. */
void ls_forward_complete(ls_server *srv, ls_forward_job *fj, ls_reply *r) {
    ls_forward_reply(srv, fj, r);
    ls_forward_job_release(fj);
}

/* The safetensors reply, its head written in front of y: the reply takes
 * y's buffer (r->skip past the room left unused). A head that does not
 * fit there is the copy ls_forward_resp_safetensors makes. */
static void ls_forward_reply_safetensors(ls_server *srv, ls_forward_job *fj, const ls_pool_used *wire, ls_reply *r) {
    ls_error err;
    ls_error_init(&err);
    size_t start = 0, len = 0;
    uint8_t *out = NULL;
    if (ls_forward_resp_safetensors_before(&fj->fr, srv->dims.H, fj->ybuf, LS_FORWARD_REPLY_ROOM, wire,
                                           fj->job.n_used, &start, &len, &err) == LS_OK) {
        out = fj->ybuf;
        fj->ybuf = NULL;
        fj->y = NULL;
    } else {
        ls_error_free(&err);
        ls_error_init(&err);
        if (ls_forward_resp_safetensors(&fj->fr, srv->dims.H, fj->y, wire, fj->job.n_used, &out, &len, &err) != LS_OK)
            out = NULL;
    }
    if (out) {
        r->status = 200;
        r->body = (char *)out;
        r->skip = start;
        r->len = len;
        r->content_type = "application/octet-stream";
    } else {
        ls_reply_error(r, &err);
    }
    ls_error_free(&err);
}

static void ls_forward_reply(ls_server *srv, ls_forward_job *fj, ls_reply *r) {
    ls_batch_job *job = &fj->job;
    ls_status st = job->status;
    if (st == LS_ADAPTER_NOT_FOUND && fj->again > 0) {
        /* Auto-loaded, then deleted before its batch, each time it went
         * again: not a name the client got wrong. */
        ls_error e;
        ls_error_init(&e);
        ls_error_set(&e, LS_ADAPTER_NOT_FOUND, "retry once the adapter stays loaded, or stop deleting it",
                     "an adapter this forward names was deleted while it ran, %d times after --auto-load loaded it "
                     "(%s)",
                     fj->again + 1, job->err.message);
        ls_reply_error(r, &e);
        ls_error_free(&e);
        return;
    }
    if (st != LS_OK) {
        ls_reply_error(r, &job->err);
        return;
    }
    ls_metrics_add_tokens(&srv->metrics, (uint64_t)fj->fr.T);
    ls_forward_count_adapters(srv, fj);
    /* The caller's names: a tenant's without its prefix. */
    ls_pool_used *wire = calloc((size_t)(job->n_used ? job->n_used : 1), sizeof *wire);
    if (!wire) {
        ls_reply_fail(r, LS_INTERNAL, NULL, "out of memory");
        return;
    }
    size_t bad;
    for (int i = 0; i < job->n_used; i++)
        wire[i] = (ls_pool_used){ls_tenant_name_out(&fj->who, job->used[i].name), job->used[i].version,
                                 job->used[i].slot};
    if (fj->kind == LS_BODY_SAFETENSORS) {
        ls_forward_reply_safetensors(srv, fj, wire, r);
    } else if (!fj->fr.base64 && ls_find_nonfinite(LS_DTYPE_F32, fj->y, (size_t)fj->fr.T * (size_t)srv->dims.H, &bad)) {
        /* JSON numbers cannot carry Inf or NaN; a 200 without y would be a
         * silent wrong answer. The token's adapter is named: factors that
         * are finite but huge overflow as surely as a large x. */
        const size_t t = bad / (size_t)srv->dims.H;
        const int k = fj->fr.names.of_token ? fj->fr.names.of_token[t] : -1;
        char by[200] = " (the base model)";
        if (k >= 0 && k < job->n_used)
            snprintf(by, sizeof by, " (adapter '%s' v%llu)", wire[k].name ? wire[k].name : "?",
                     (unsigned long long)wire[k].version);
        ls_reply_fail(r, LS_INVALID_REQUEST,
                      "scale x or gammas down, check the factors of the token's adapter, or send \"encoding\": "
                      "\"base64\" to receive them",
                      "y[%zu][%zu] is not finite: the result overflows float32%s", t, bad % (size_t)srv->dims.H, by);
    } else {
        ls_reply_json(r, 200, ls_forward_resp_json(&fj->fr, srv->dims.H, fj->y, wire, job->n_used));
    }
    free(wire);
}

/* The blocking form, for a server without the batcher (on a backend
 * worker) and for a request that arrives while the server stops: every
 * step on this thread. */
void ls_handle_forward(const ls_request *req, ls_reply *r) {
    ls_server *srv = req->srv;
    ls_forward_step next;
    ls_forward_job *fj = ls_forward_prepare(req, &next, r);
    if (!fj) return;
    for (;;) {
        if (next == LS_FORWARD_READ) next = ls_forward_read(fj, r);
        if (next == LS_FORWARD_LOAD) next = ls_forward_load(fj, r);
        if (next == LS_FORWARD_ANSWERED) {
            ls_forward_job_free(fj);
            return;
        }
        ls_batch_job *job = &fj->job;
        if (srv->batcher) job->status = ls_batcher_run(srv->batcher, job);
        else
            job->status = ls_pool_forward(srv->pool, job->layer, job->T, job->x, job->gammas, job->names, job->y,
                                          job->used, &job->n_used, &job->err);
        if (!ls_forward_again(fj)) break;
        next = ls_forward_restart(fj, r);
    }
    ls_forward_complete(srv, fj, r);
    ls_forward_job_free(fj);
}
