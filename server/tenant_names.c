/* The one mapping of adapter names between callers and the pool: a
 * tenant's adapter "a" of tenant acme is "acme/a" in the pool. The
 * adapter name rule has no '/', so no tenant's name can be another's,
 * nor an adapter of no tenant. */
#include "server/tenant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/text.h"

void ls_tenant_of(const char *internal, char *out, size_t len) {
    const char *slash = strchr(internal, '/');
    const size_t tl = slash ? (size_t)(slash - internal) : 0;
    snprintf(out, len, "%.*s", (int)tl, internal);
}

ls_status ls_tenant_name_in(const ls_principal *who, const char *name, char *out, size_t len, ls_error *err) {
    if (!ls_principal_scoped(who)) {
        if (!ls_adapter_pool_name_valid(name) || strlen(name) >= len)
            return ls_error_set(err, LS_INVALID_REQUEST, NULL,
                                "an adapter name is 1-128 letters, digits, '.', '_' or '-', not starting with '.', or "
                                "TENANT/NAME for a tenant's adapter (128 bytes in all)");
        snprintf(out, len, "%s", name);
        return LS_OK;
    }
    const int n = snprintf(out, len, "%s/%s", who->tenant, name);
    if (!ls_adapter_name_valid(name) || n < 0 || (size_t)n >= len || n > 128) {
        if (len) out[0] = '\0';
        return ls_error_set(err, LS_INVALID_REQUEST, NULL,
                            "an adapter name is 1-%zu letters, digits, '.', '_' or '-', not starting with '.' (with "
                            "your tenant's name and a '/' before it, at most 128 bytes)",
                            127 - strlen(who->tenant));
    }
    return LS_OK;
}

ls_status ls_tenant_name_lookup(const ls_principal *who, const char *name, char *out, size_t len, ls_error *err) {
    if (!ls_principal_scoped(who)) {
        snprintf(out, len, "%s", name);
        return LS_OK;
    }
    if (strchr(name, '/')) {
        if (len) out[0] = '\0';
        return ls_error_set(err, LS_INVALID_REQUEST, "name your tenant's adapters without a TENANT/ prefix",
                            "a tenant key names adapters without a '/'");
    }
    snprintf(out, len, "%s/%s", who->tenant, name);
    return LS_OK;
}

const char *ls_tenant_name_out(const ls_principal *who, const char *internal) {
    if (!ls_principal_scoped(who)) return internal;
    const size_t tl = strlen(who->tenant);
    if (strncmp(internal, who->tenant, tl) || internal[tl] != '/') return NULL;
    return internal + tl + 1;
}

/* The first token that names names[k] (for a message). */
static int ls_tenant_first_token(const ls_token_names *tn, int k) {
    for (int t = 0; tn->of_token && t < tn->T; t++)
        if (tn->of_token[t] == k) return t;
    return 0;
}

ls_status ls_tenant_forward_names(const ls_principal *who, ls_token_names *tn, ls_error *err) {
    char one[130];
    if (!ls_principal_scoped(who)) {
        /* An admin's names were read by the forward's own rule; a pool
         * name with a tenant is checked here. */
        for (int k = 0; k < tn->n; k++)
            if (!ls_adapter_pool_name_valid(tn->names[k]))
                return ls_error_set(err, LS_INVALID_REQUEST, NULL, "adapter name of token %d is not valid",
                                    ls_tenant_first_token(tn, k));
        return LS_OK;
    }
    if (!tn->n) return LS_OK;
    /* Mapped into a new table that replaces tn only whole, so a bad name
     * changes nothing; a tenant's prefix maps names one to one, so each
     * keeps its index. */
    ls_token_names mapped;
    ls_token_names_init(&mapped, false);
    ls_status st = LS_OK;
    for (int k = 0; k < tn->n && st == LS_OK; k++) {
        st = ls_tenant_name_in(who, tn->names[k], one, sizeof one, err);
        if (st == LS_OK && ls_token_names_index(&mapped, one) != k)
            st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    }
    for (int t = 0; t < tn->T && st == LS_OK; t++)
        if (!ls_token_names_push(&mapped, tn->of_token[t])) st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    if (st != LS_OK) {
        ls_token_names_free(&mapped);
        return st;
    }
    ls_token_names_free(tn);
    *tn = mapped;
    return LS_OK;
}

size_t ls_tenant_strip_body(const ls_principal *who, char *body, size_t len) {
    /* A request answered before it was authorized has no tenant. */
    if (!ls_principal_scoped(who) || !who->tenant[0] || !body) return len;
    char prefix[LS_TENANT_NAME_MAX + 2];
    const int pl = snprintf(prefix, sizeof prefix, "%s/", who->tenant);
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        /* Only where a name starts: "xacme/" is left as it is. */
        const char c = i ? body[i - 1] : ' ';
        const bool start = !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                             c == '.' || c == '_' || c == '-');
        if (start && len - i >= (size_t)pl && !memcmp(body + i, prefix, (size_t)pl)) {
            i += (size_t)pl;
            continue;
        }
        body[o++] = body[i++];
    }
    return o;
}

ls_status ls_tenant_path_in(const ls_principal *who, char *path, size_t len, ls_error *err) {
    if (!ls_principal_scoped(who) || !path[0]) return LS_OK;
    bool dotdot = false;
    for (const char *c = path; *c;) {
        const size_t n = strcspn(c, "/");
        if (n == 2 && c[0] == '.' && c[1] == '.') dotdot = true;
        c += n;
        if (*c) c++;
    }
    char full[4096];
    const int n = snprintf(full, sizeof full, "%s/%s", who->tenant, path);
    if (path[0] == '/' || dotdot || n < 0 || (size_t)n >= len)
        /* Not "--adapter-dir/TENANT/": a scoped caller's bodies lose
         * every "TENANT/" (ls_tenant_strip_body). */
        return ls_error_set(err, LS_INVALID_REQUEST, "a tenant key's paths are relative to its tenant's directory",
                            "a tenant key names files by a relative path without '..', beneath its tenant's own "
                            "directory of --adapter-dir (named as the tenant)");
    memcpy(path, full, (size_t)n + 1);
    return LS_OK;
}
