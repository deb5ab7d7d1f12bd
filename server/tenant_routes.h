/* The routes' side of tenants (server/tenant.h): descriptions, /pool and
 * /metrics as a caller may see them, a load's quotas, the audit line. */
#ifndef LS_SERVER_TENANT_ROUTES_H
#define LS_SERVER_TENANT_ROUTES_H

#include <jansson.h>

#include "server/request.h"

/* The description of info as req's caller sees it (new reference), or
 * NULL when the adapter is not the caller's. */
json_t *ls_tenant_describe(ls_server *srv, const ls_principal *who, const ls_adapter_info *info);
/* /pool's body for a scoped caller, in place: another tenant's slot says
 * only that it is busy, and the pool-wide adapter counts are null. */
void ls_tenant_pool_view(const ls_principal *who, json_t *pool);
/* /metrics' text for a scoped caller: its adapters' series by bare name,
 * nobody else's. Takes text (malloc'd) and returns the text to send
 * (malloc'd; NULL when out of memory). */
char *ls_tenant_metrics_view(const ls_principal *who, char *text);
/* The quotas of loading pool name name (pinned as asked, or as the
 * version it replaces with keep_pin), with `also` other new names of the
 * same request counted as held: 403 adapter_quota past max_adapters for
 * a new name, 409 tenant_pin_limit past max_pins. An early answer only:
 * ls_tenant_register checks again where the place is taken. */
ls_status ls_tenant_admit_load(ls_server *srv, const ls_principal *who, const char *name, bool pinned, bool keep_pin,
                               size_t also, ls_error *err);
/* ls_pool_load of name for who (ownership of *a as there), its quotas
 * checked under one lock with the registration, so that two loads of
 * one tenant (uploads or auto-loads) cannot both take its last place. */
ls_status ls_tenant_register(ls_server *srv, const ls_principal *who, const char *name, ls_adapter *a,
                             const ls_pool_load_opts *opts, ls_adapter_info *info, ls_error *err);
/* The audit line of a change to pool name name (action: "load",
 * "replace", "delete"). */
void ls_tenant_audit(const ls_principal *who, const char *action, const char *name, uint64_t version);
/* The audit line of a change a tenant's quota or pin cap refused
 * (code: LS_ADAPTER_QUOTA or LS_TENANT_PIN_LIMIT). */
void ls_tenant_audit_refused(const ls_principal *who, const char *action, const char *name, ls_status code);

#endif
