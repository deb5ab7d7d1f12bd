/* Who a request comes from and what it may see: the live table of
 * --api-keys (read at start, re-read when the file changes), the key a
 * bearer token is, its role and its rate bucket, and the one mapping of
 * adapter names between what a tenant says (bare names) and the pool's
 * names (TENANT/NAME). docs/api.md, "API keys and tenants". */
#ifndef LS_SERVER_TENANT_H
#define LS_SERVER_TENANT_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "config/api_keys.h"
#include "lora/token_names.h"

/* How often the key file is looked at for a change (mtime, size, inode). */
#define LS_TENANTS_POLL_MS 500

/* The caller of one request. An admin (the --api-key, an admin entry of
 * --api-keys, or anyone when no key is set) sees every adapter by its
 * pool name; a tenant or viewer key sees only its tenant's, by bare name. */
typedef struct {
    ls_role role;
    char tenant[LS_TENANT_NAME_MAX + 1]; /* "" for an admin without one */
    char key_id[LS_KEY_ID_LEN + 1];      /* hash prefix; "api-key" for --api-key, "none" without auth */
    long long max_adapters;              /* -1 = no quota */
    int max_pins;
} ls_principal;

/* A principal is scoped when it sees only its tenant's adapters. */
static inline bool ls_principal_scoped(const ls_principal *p) { return p->role != LS_ROLE_ADMIN; }

typedef struct ls_tenants ls_tenants;

/* Reads path (not "") and starts watching it. On a bad file returns false
 * with why (the file's name and the reason) and nothing allocated. */
bool ls_tenants_open(const char *path, ls_tenants **out, char *why, size_t len);
/* Stops watching and frees t (NULL is fine). */
void ls_tenants_free(ls_tenants *t);
/* Keys in the table now (for the log and the tests). */
size_t ls_tenants_count(ls_tenants *t);

typedef enum { LS_AUTH_OK, LS_AUTH_DENIED, LS_AUTH_RATE } ls_auth;

/* Who token is (NULL: no bearer token). api_key is --api-key ("" = none);
 * t may be NULL. Without either, everyone is an admin. LS_AUTH_RATE: a
 * known key past its rate; *retry_after then holds the seconds until its
 * bucket has a request again. Compares in time independent of the keys. */
ls_auth ls_tenants_authorize(ls_tenants *t, const char *api_key, const char *token, ls_principal *who,
                             int *retry_after);

/* ---- names ---------------------------------------------------------------- */

/* The pool's name of the adapter name a request gives, into out (129
 * bytes). A scoped caller gives a bare name (the adapter name rule) that
 * becomes TENANT/NAME; an admin gives a pool name as it is: a bare name
 * (an adapter of no tenant) or TENANT/NAME. 400 invalid_request else. */
ls_status ls_tenant_name_in(const ls_principal *who, const char *name, char *out, size_t len, ls_error *err);
/* The pool name to look a request's name up by (GET and DELETE), into
 * out (LS_TENANT_LOOKUP_MAX bytes): an admin's name as it is, a scoped
 * caller's behind "TENANT/". No name rule is checked, as a name that
 * breaks it is simply not registered (404), but one: a scoped caller's
 * name with a '/' is 400 invalid_request whether such an adapter exists
 * or not, as in a forward (a tenant key names its adapters bare). */
#define LS_TENANT_LOOKUP_MAX (LS_TENANT_NAME_MAX + 2 + 256)
ls_status ls_tenant_name_lookup(const ls_principal *who, const char *name, char *out, size_t len, ls_error *err);
/* The name the caller knows a pool name by (borrowed from internal), or
 * NULL when the adapter is not the caller's to see. */
const char *ls_tenant_name_out(const ls_principal *who, const char *internal);
/* The tenant of a pool name into out ("" for no tenant). */
void ls_tenant_of(const char *internal, char *out, size_t len);

/* A scoped caller's adapter files live in --adapter-dir/TENANT/: its
 * path (len bytes of room) becomes TENANT/PATH in place; an absolute
 * path or a '..' component is 400. An admin's path is left as it is. */
ls_status ls_tenant_path_in(const ls_principal *who, char *path, size_t len, ls_error *err);
/* Rewrites a forward's table of names to pool names (the table then
 * holds copies; each token keeps its index); on a bad name fills err
 * and changes nothing. */
ls_status ls_tenant_forward_names(const ls_principal *who, ls_token_names *names, ls_error *err);

/* Removes "TENANT/" of a scoped caller from an error body's text (len
 * bytes, in place; returns the new length), so that messages and hints
 * name its adapters as it does. */
size_t ls_tenant_strip_body(const ls_principal *who, char *body, size_t len);

#endif
