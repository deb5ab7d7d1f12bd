/* The route table and its lookups: kept apart from the daemon so that the
 * routing rules (exact paths, the {name} segment, HEAD served by GET, the
 * Allow list of a 405) can be tested without a socket. */
#include "server/routes.h"

#include <stdio.h>
#include <string.h>

/* method, pattern, handler, open, has_body, offload. A forward waits on
 * the backend itself only without the batcher (with it, http.c hands it
 * to the batcher, and to an offload worker only when it must auto-load). A
 * delete waits for the state lock, which a load holds while it waits for
 * the backend; a validation only reads (its body, or a file), as does a
 * load until it registers the adapter. */
static const ls_route ls_routes[] = {
    {"GET", "/health", ls_handle_health, true, false, LS_ROUTE_INLINE},
    {"GET", "/ready", ls_handle_ready, true, false, LS_ROUTE_INLINE},
    {"GET", "/metrics", ls_handle_metrics, false, false, LS_ROUTE_INLINE},
    {"GET", "/openapi.json", ls_handle_openapi, false, false, LS_ROUTE_INLINE},
    {"GET", "/pool", ls_handle_pool, false, false, LS_ROUTE_INLINE},
    {"GET", "/model", ls_handle_model, false, false, LS_ROUTE_INLINE},
    {"GET", "/dashboard", ls_handle_dashboard, true, false, LS_ROUTE_INLINE},
    {"POST", "/forward", ls_handle_forward, false, true, LS_ROUTE_BACKEND},
    {"POST", "/adapters", ls_handle_adapter_load, false, true, LS_ROUTE_LOAD},
    {"GET", "/adapters", ls_handle_adapter_list, false, false, LS_ROUTE_INLINE},
    {"POST", "/adapters/validate", ls_handle_adapter_validate, false, true, LS_ROUTE_DISK},
    {"GET", "/adapters/{name}", ls_handle_adapter_get, false, false, LS_ROUTE_INLINE},
    {"DELETE", "/adapters/{name}", ls_handle_adapter_delete, false, false, LS_ROUTE_BACKEND},
    /* vLLM's and sglang's names (server/handlers_vllm.c): a load here
     * validates and registers in one step, on the backend's queue. */
    {"POST", "/v1/load_lora_adapter", ls_handle_vllm_load, false, true, LS_ROUTE_BACKEND},
    {"POST", "/v1/unload_lora_adapter", ls_handle_vllm_unload, false, true, LS_ROUTE_BACKEND},
};
#define LS_N_ROUTES (sizeof ls_routes / sizeof *ls_routes)

/* Matches path against a pattern; copies the {name} segment into param.
 * A name is one segment, or two (TENANT/NAME: a tenant's adapter as an
 * admin names it, docs/api.md), neither empty. */
static bool ls_route_match(const char *pattern, const char *path, char *param, size_t plen) {
    const char *brace = strchr(pattern, '{');
    if (!brace) return !strcmp(pattern, path);
    size_t prefix = (size_t)(brace - pattern);
    if (strncmp(pattern, path, prefix)) return false;
    const char *seg = path + prefix, *slash = strchr(seg, '/');
    if (slash && (slash == seg || !slash[1] || strchr(slash + 1, '/'))) return false;
    if (!*seg || strlen(seg) >= plen) return false;
    snprintf(param, plen, "%s", seg);
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
