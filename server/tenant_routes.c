/* What each route shows a caller of its tenant's adapters and lets it
 * change: descriptions by the caller's names, /pool and /metrics with
 * other tenants' adapters left out, the quotas of a load (max_adapters,
 * max_pins), and the audit line of every adapter change. */
#include "server/tenant_routes.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "server/describe.h"

json_t *ls_tenant_describe(ls_server *srv, const ls_principal *who, const ls_adapter_info *info) {
    const char *shown = ls_tenant_name_out(who, info->name);
    if (!shown) return NULL;
    json_t *d = ls_describe_adapter(srv, info);
    if (d) json_object_set_new(d, "name", json_string(shown));
    /* Its files are TENANT/PATH beneath --adapter-dir: shown as it gave them. */
    const char *source = ls_tenant_name_out(who, info->source_path);
    if (d && info->source_path[0] && ls_principal_scoped(who))
        json_object_set_new(d, "source", source ? json_string(source) : json_null());
    return d;
}

static pthread_mutex_t ls_tenant_load_mu = PTHREAD_MUTEX_INITIALIZER;

static void ls_tenant_load_lock(const ls_principal *who) {
    if (ls_principal_scoped(who)) pthread_mutex_lock(&ls_tenant_load_mu);
}

static void ls_tenant_load_unlock(const ls_principal *who) {
    if (ls_principal_scoped(who)) pthread_mutex_unlock(&ls_tenant_load_mu);
}

void ls_tenant_pool_view(const ls_principal *who, json_t *pool) {
    if (!ls_principal_scoped(who)) return;
    size_t i;
    json_t *slot;
    json_array_foreach(json_object_get(pool, "slots"), i, slot) {
        const char *name = json_string_value(json_object_get(slot, "adapter"));
        const char *shown = name ? ls_tenant_name_out(who, name) : NULL;
        if (shown) {
            json_object_set_new(slot, "adapter", json_string(shown));
        } else if (name) {
            /* Another tenant's (or no tenant's) slot: busy, nothing more. */
            static const char *const hidden[] = {"adapter", "version", "rank", "live", "last_used", NULL};
            for (int k = 0; hidden[k]; k++) json_object_set_new(slot, hidden[k], json_null());
            json_object_set_new(slot, "in_flight", json_integer(0));
            json_object_set_new(slot, "hits", json_integer(0));
            json_object_set_new(slot, "pinned", json_false());
        }
    }
    /* Pool-wide counts of adapters, their bytes and their loads would
     * count other tenants' adapters and changes. */
    json_t *hc = json_object_get(pool, "host_cache");
    static const char *const counts[] = {"used", "bytes", "registered", "pinned", NULL};
    for (int k = 0; hc && counts[k]; k++) json_object_set_new(hc, counts[k], json_null());
    json_t *counters = json_object_get(pool, "counters");
    static const char *const changes[] = {"loads", "evictions", "hits", "misses", "host_drops", NULL};
    for (int k = 0; counters && changes[k]; k++) json_object_set_new(counters, changes[k], json_null());
}

/* The adapter label of a metrics line (borrowed into line), or NULL;
 * *n is its length. */
static const char *ls_metrics_label(const char *line, size_t len, size_t *n) {
    const char *l = memmem(line, len, "adapter=\"", 9);
    if (!l) return NULL;
    l += 9;
    const char *q = memchr(l, '"', len - (size_t)(l - line));
    if (!q) return NULL;
    *n = (size_t)(q - l);
    return l;
}

/* Server-wide series a scoped caller does not see, as GET /pool nulls
 * their fields: they count other tenants' adapters, their bytes, their
 * loads into slots and out (loads = evictions + slots used), and refused
 * uploads. What the shared machine does (slots, queues, requests,
 * latency) stays. */
static const char *const ls_tenant_hidden_gauges[] = {
    "lorasink_adapters_registered",    "lorasink_adapters_folded",          "lorasink_pool_slots_pinned",
    "lorasink_host_cache_adapters",    "lorasink_host_cache_bytes",         "lorasink_host_cache_drops_total",
    "lorasink_pool_loads_total",       "lorasink_pool_evictions_total",     "lorasink_pool_hits_total",
    "lorasink_pool_misses_total",      "lorasink_adapter_loads_running",    "lorasink_validation_failures_total",
    "lorasink_state_records_unrestored", NULL};

/* Whether line (len bytes) is a sample, HELP or TYPE line of a hidden
 * gauge. */
static bool ls_tenant_hidden_line(const char *line, size_t len) {
    static const char help[] = "# HELP ", type[] = "# TYPE ";
    const char *name = line;
    if (len > sizeof help - 1 && (!strncmp(line, help, sizeof help - 1) || !strncmp(line, type, sizeof type - 1)))
        name = line + sizeof help - 1;
    const size_t rest = len - (size_t)(name - line);
    for (int k = 0; ls_tenant_hidden_gauges[k]; k++) {
        const size_t n = strlen(ls_tenant_hidden_gauges[k]);
        if (rest > n && !strncmp(name, ls_tenant_hidden_gauges[k], n) && (name[n] == ' ' || name[n] == '{'))
            return true;
    }
    return false;
}

char *ls_tenant_metrics_view(const ls_principal *who, char *text) {
    if (!ls_principal_scoped(who) || !text) return text;
    const size_t tl = strlen(who->tenant);
    char *out = malloc(strlen(text) + 1);
    if (!out) {
        free(text);
        return NULL;
    }
    size_t o = 0;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        const size_t len = nl ? (size_t)(nl - p) + 1 : strlen(p);
        size_t n = 0;
        const char *label = ls_metrics_label(p, len, &n);
        /* The list of adapters forwards run with names everyone's. */
        static const char info[] = "lorasink_lora_requests_info{";
        if (!strncmp(p, info, sizeof info - 1) || ls_tenant_hidden_line(p, len)) {
        } else if (!label) {
            memcpy(out + o, p, len);
            o += len;
        } else if (n > tl && !strncmp(label, who->tenant, tl) && label[tl] == '/') {
            /* The caller's own adapter: by its bare name. */
            const size_t head = (size_t)(label - p);
            memcpy(out + o, p, head);
            memcpy(out + o + head, label + tl + 1, len - head - tl - 1);
            o += len - tl - 1;
        } /* else another tenant's series (or the fold of many): left out */
        p += len;
    }
    out[o] = '\0';
    free(text);
    return out;
}

/* Counts the tenant's adapters and pinned ones, and whether name is one. */
static ls_status ls_tenant_holds(ls_server *srv, const char *tenant, const char *name, size_t *count, size_t *pins,
                                 bool *has, bool *pinned, ls_error *err) {
    ls_adapter_info *infos = NULL;
    size_t n = 0;
    ls_status st = ls_pool_list(srv->pool, &infos, &n, err);
    const size_t tl = strlen(tenant);
    *count = *pins = 0;
    *has = *pinned = false;
    for (size_t i = 0; st == LS_OK && i < n; i++) {
        if (strncmp(infos[i].name, tenant, tl) || infos[i].name[tl] != '/') continue;
        (*count)++;
        if (infos[i].pinned) (*pins)++;
        if (!strcmp(infos[i].name, name)) {
            *has = true;
            *pinned = infos[i].pinned;
        }
    }
    free(infos);
    return st;
}

ls_status ls_tenant_admit_load(ls_server *srv, const ls_principal *who, const char *name, bool pinned, bool keep_pin,
                               size_t also, ls_error *err) {
    if (!ls_principal_scoped(who)) return LS_OK;
    size_t count, pins;
    bool has, was_pinned;
    ls_status st = ls_tenant_holds(srv, who->tenant, name, &count, &pins, &has, &was_pinned, err);
    if (st != LS_OK) return st;
    if (!has && who->max_adapters >= 0 && (long long)(count + also) >= who->max_adapters) {
        char more[96] = "";
        if (also) snprintf(more, sizeof more, " and this forward loads %zu more before this one", also);
        return ls_error_set(err, LS_ADAPTER_QUOTA, NULL,
                            "tenant %s holds %zu adapter%s%s: its quota is %lld (max_adapters of key %s)", who->tenant,
                            count, count == 1 ? "" : "s", more, who->max_adapters, who->key_id);
    }
    const bool pin = pinned || (keep_pin && was_pinned);
    if (pin && !was_pinned && who->max_pins >= 0 && (long long)pins >= who->max_pins)
        return ls_error_set(err, LS_TENANT_PIN_LIMIT, NULL,
                            "tenant %s holds %zu pinned adapter%s: its cap is %d (max_pins of key %s)", who->tenant,
                            pins, pins == 1 ? "" : "s", who->max_pins, who->key_id);
    return LS_OK;
}

ls_status ls_tenant_register(ls_server *srv, const ls_principal *who, const char *name, ls_adapter *a,
                             const ls_pool_load_opts *opts, ls_adapter_info *info, ls_error *err) {
    memset(info, 0, sizeof *info); /* version 0 unless the load stands (lora/pool.h) */
    ls_tenant_load_lock(who);
    ls_status st = ls_tenant_admit_load(srv, who, name, opts->pinned, opts->keep_pin && opts->replace, 0, err);
    if (st == LS_OK) st = ls_pool_load(srv->pool, name, a, opts, info, err);
    ls_tenant_load_unlock(who);
    if (st == LS_ADAPTER_QUOTA || st == LS_TENANT_PIN_LIMIT)
        ls_tenant_audit_refused(who, opts->auto_loaded ? "auto-load" : opts->replace ? "replace" : "load", name, st);
    return st;
}

/* The fields every audit line opens with, for pool name name. */
static void ls_tenant_audit_line(const ls_principal *who, const char *action, const char *name, const char *outcome) {
    char tenant[LS_TENANT_NAME_MAX + 1];
    ls_tenant_of(name, tenant, sizeof tenant);
    const char *slash = strchr(name, '/');
    ls_log_info("audit: tenant=%s key=%s role=%s action=%s name=%s %s", tenant[0] ? tenant : "-",
                who->key_id[0] ? who->key_id : "-", ls_role_name(who->role), action, slash ? slash + 1 : name,
                outcome);
}

void ls_tenant_audit(const ls_principal *who, const char *action, const char *name, uint64_t version) {
    char outcome[32];
    snprintf(outcome, sizeof outcome, "version=%llu", (unsigned long long)version);
    ls_tenant_audit_line(who, action, name, outcome);
}

void ls_tenant_audit_refused(const ls_principal *who, const char *action, const char *name, ls_status code) {
    char outcome[64];
    snprintf(outcome, sizeof outcome, "refused=%s", ls_status_code(code));
    ls_tenant_audit_line(who, action, name, outcome);
}
