/* The route table and its lookups: kept apart from the daemon so that the
 * routing rules (exact paths, the {name} segment, HEAD served by GET, the
 * Allow list of a 405) can be tested without a socket. */
#include "server/routes.h"

#include <stdio.h>
#include <string.h>

#include "server/handlers.h"

/* method, pattern, handler, open, has_body, probe, steps, on. A delete
 * waits for the state lock, which a load holds while it waits for the
 * backend; a validation only reads (its body, or a file), as does a load
 * until it registers the adapter. */
static const ls_route ls_routes[] = {
    {"GET", "/health", ls_handle_health, true, false, true, LS_STEPS_HANDLER, LS_RUN_HTTP},
    {"GET", "/ready", ls_handle_ready, true, false, true, LS_STEPS_HANDLER, LS_RUN_HTTP},
    {"GET", "/metrics", ls_handle_metrics, false, false, false, LS_STEPS_HANDLER, LS_RUN_HTTP},
    {"GET", "/openapi.json", ls_handle_openapi, false, false, false, LS_STEPS_HANDLER, LS_RUN_HTTP},
    {"GET", "/pool", ls_handle_pool, false, false, false, LS_STEPS_HANDLER, LS_RUN_HTTP},
    {"GET", "/model", ls_handle_model, false, false, false, LS_STEPS_HANDLER, LS_RUN_HTTP},
    {"GET", "/dashboard", ls_handle_dashboard, true, false, false, LS_STEPS_HANDLER, LS_RUN_HTTP},
    {"POST", "/forward", ls_handle_forward, false, true, false, LS_STEPS_FORWARD, LS_RUN_BACKEND},
    {"POST", "/adapters", ls_handle_adapter_load, false, true, false, LS_STEPS_LOAD, LS_RUN_BACKEND},
    {"GET", "/adapters", ls_handle_adapter_list, false, false, false, LS_STEPS_HANDLER, LS_RUN_HTTP},
    {"POST", "/adapters/validate", ls_handle_adapter_validate, false, true, false, LS_STEPS_HANDLER, LS_RUN_DISK},
    {"GET", "/adapters/{name}", ls_handle_adapter_get, false, false, false, LS_STEPS_HANDLER, LS_RUN_HTTP},
    {"DELETE", "/adapters/{name}", ls_handle_adapter_delete, false, false, false, LS_STEPS_HANDLER, LS_RUN_BACKEND},
    /* vLLM's names (server/handlers_vllm.c): a load here
     * validates and registers in one step, on the backend's queue. */
    {"POST", "/v1/load_lora_adapter", ls_handle_vllm_load, false, true, false, LS_STEPS_HANDLER, LS_RUN_BACKEND},
    {"POST", "/v1/unload_lora_adapter", ls_handle_vllm_unload, false, true, false, LS_STEPS_HANDLER, LS_RUN_BACKEND},
    {"GET", "/v1/models", ls_handle_vllm_models, false, false, false, LS_STEPS_HANDLER, LS_RUN_HTTP},
    /* sglang's names (server/handlers_sglang.c), run as vLLM's are. */
    {"POST", "/load_lora_adapter", ls_handle_sglang_load, false, true, false, LS_STEPS_HANDLER, LS_RUN_BACKEND},
    {"POST", "/unload_lora_adapter", ls_handle_sglang_unload, false, true, false, LS_STEPS_HANDLER, LS_RUN_BACKEND},
};
#define LS_N_ROUTES (sizeof ls_routes / sizeof *ls_routes)

/* Matches path against a pattern; copies the {name} segment into param.
 * A name is one segment, or two (TENANT/NAME: a tenant's adapter as an
 * admin names it, docs/api.md), neither empty. A segment too long for
 * param still matches, cut and marked "...": no adapter has so long a
 * name, so the route answers adapter_not_found as it does for any name
 * past the limit, not "no route". */
static bool ls_route_match(const char *pattern, const char *path, char *param, size_t plen) {
    const char *brace = strchr(pattern, '{');
    if (!brace) return !strcmp(pattern, path);
    size_t prefix = (size_t)(brace - pattern);
    if (strncmp(pattern, path, prefix)) return false;
    const char *seg = path + prefix, *slash = strchr(seg, '/');
    if (slash && (slash == seg || !slash[1] || strchr(slash + 1, '/'))) return false;
    if (!*seg) return false;
    const size_t len = strlen(seg);
    if (len < plen) snprintf(param, plen, "%s", seg);
    else snprintf(param, plen, "%.*s...", (int)(plen - 4), seg);
    return true;
}

/* See routes.h. */
const ls_route *ls_route_find(const char *method, const char *path, char *param, size_t plen, char *allow,
                              size_t alen) {
    const ls_route *found = NULL;
    allow[0] = '\0';
    bool head = !strcmp(method, "HEAD");
    for (size_t i = 0; i < LS_N_ROUTES; i++) {
        /* empty unless the pattern has a {name} segment */
        char p[256] = "";
        if (!ls_route_match(ls_routes[i].pattern, path, p, sizeof p)) continue;
        /* /adapters/validate is a route of its own only for POST */
        if (!strcmp(path, "/adapters/validate") && ls_routes[i].pattern[10] == '{' && !strcmp(method, "POST"))
            continue;
        if (!strcmp(ls_routes[i].method, method) || (head && !strcmp(ls_routes[i].method, "GET"))) {
            if (!found) {
                found = &ls_routes[i];
                snprintf(param, plen, "%s", p);
            }
        } else if (!strstr(allow, ls_routes[i].method)) {
            /* HEAD is served wherever GET is, so it is allowed there too. */
            const bool get = !strcmp(ls_routes[i].method, "GET");
            size_t l = strlen(allow);
            snprintf(allow + l, alen - l, "%s%s%s", l ? ", " : "", ls_routes[i].method, get ? ", HEAD" : "");
        }
    }
    return found;
}

const char *ls_route_label(const char *path) {
    char unused[256];
    for (size_t i = 0; i < LS_N_ROUTES; i++)
        if (ls_route_match(ls_routes[i].pattern, path, unused, sizeof unused)) return ls_routes[i].pattern;
    return "other";
}
