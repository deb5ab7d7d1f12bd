/* API keys per tenant (--api-keys, docs/api.md "API keys and tenants"):
 * two tenants each with an adapter "a" get their own; a tenant never sees
 * another's adapters on any route (a sweep of every route as each role
 * looks for the other tenant's names and sha256 in every body and
 * header); naming another's adapter answers as an absent one; a viewer
 * only reads; the quotas (max_adapters, max_pins, rate); the audit line;
 * the key file re-read when it changes, a bad one kept out; the durable
 * registry keeping each adapter's tenant across a restart. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/sha256.h"
#include "tests/util/tiny_server.h"

static tiny_server ts;
static char *keys_dir, *keys_path;

static const char *acme_auth[] = {"Authorization: Bearer acme-key", NULL};
static const char *bob_auth[] = {"Authorization: Bearer bob-key", NULL};
static const char *view_auth[] = {"Authorization: Bearer acme-view", NULL};
static const char *admin_auth[] = {"Authorization: Bearer admin-key", NULL};
static const char *root_auth[] = {"Authorization: Bearer root-key", NULL}; /* --api-key */
static const char *slow_auth[] = {"Authorization: Bearer slow-key", NULL};
/* A tenant whose name is one edit from acme's: its pool names are within
 * a did-you-mean's reach of acme's. */
static const char *acmf_auth[] = {"Authorization: Bearer acmf-key", NULL};

/* The key file's entry of key (its SHA-256, never the key). */
static char *key_entry(const char *key, const char *rest) {
    char hex[65], *out = NULL;
    ls_sha256_hex(key, strlen(key), hex);
    assert_true(asprintf(&out, "{\"sha256\": \"%s\", %s}", hex, rest) > 0);
    return out;
}

static void write_keys(bool with_late) {
    char *e[] = {key_entry("acme-key", "\"tenant\": \"acme\", \"role\": \"tenant\", \"max_adapters\": 3"),
                 key_entry("bob-key", "\"tenant\": \"bob\", \"role\": \"tenant\", \"max_pins\": 1"),
                 key_entry("acme-view", "\"tenant\": \"acme\", \"role\": \"viewer\""),
                 key_entry("admin-key", "\"role\": \"admin\""),
                 key_entry("slow-key", "\"tenant\": \"slow\", \"role\": \"tenant\", \"rate\": 0.01"),
                 key_entry("acmf-key", "\"tenant\": \"acmf\", \"role\": \"tenant\""),
                 key_entry("late-key", "\"tenant\": \"late\", \"role\": \"tenant\"")};
    char *text = NULL;
    assert_true(asprintf(&text, "{\"keys\": [%s, %s, %s, %s, %s, %s%s%s]}", e[0], e[1], e[2], e[3], e[4], e[5],
                         with_late ? ", " : "", with_late ? e[6] : "") > 0);
    /* Written aside and renamed, as an operator's tool would. */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", keys_path);
    ls_test_write_file(tmp, text, strlen(text));
    assert_int_equal(rename(tmp, keys_path), 0);
    for (int i = 0; i < 7; i++) free(e[i]);
    free(text);
}

static long req(const char *method, const char *path, const char *const *auth, const char *body,
                ls_test_response *keep) {
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, method, path, NULL, body, body ? strlen(body) : 0, auth, &r), 0);
    const long st = r.status;
    if (keep) *keep = r;
    else ls_test_response_free(&r);
    return st;
}

/* The example adapter as name, its lora_alpha alpha (so each tenant's
 * has its own sha256). */
static char *adapter_body(const char *name, int alpha, bool pinned) {
    json_t *j = tiny_adapter_inline(&ts, name, NULL);
    json_object_set_new(json_object_get(j, "config"), "lora_alpha", json_integer(alpha));
    if (pinned) json_object_set_new(j, "pinned", json_true());
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return text;
}

static void upload(const char *const *auth, const char *name, int alpha, long want) {
    char *body = adapter_body(name, alpha, false);
    ls_test_response r;
    if (req("POST", "/adapters", auth, body, &r) != want) fail_msg("upload %s: %ld %s", name, r.status, r.body);
    ls_test_response_free(&r);
    free(body);
}

/* The sha256 of pool name name as the admin sees it (into hex). */
static void admin_sha(const char *name, char hex[65]) {
    char path[256];
    snprintf(path, sizeof path, "/adapters/%s", name);
    ls_test_response r;
    assert_int_equal(req("GET", path, admin_auth, NULL, &r), 200);
    json_t *j = ls_test_response_json(&r);
    snprintf(hex, 65, "%s", json_string_value(json_object_get(j, "sha256")));
    json_decref(j);
    ls_test_response_free(&r);
}

static int setup(void **state) {
    (void)state;
    keys_dir = ls_test_mkdtemp();
    assert_true(asprintf(&keys_path, "%s/keys.json", keys_dir) > 0);
    char *state_dir = NULL;
    assert_true(asprintf(&state_dir, "%s/state", keys_dir) > 0);
    write_keys(false);
    const char *extra[] = {"--api-keys", keys_path, "--api-key",   "root-key", "--state-dir",
                           state_dir,    "--auto-load", NULL};
    const bool ok = tiny_server_start(&ts, "interleaved", extra);
    free(state_dir);
    if (!ok) return -1;
    /* acme: a, acme-secret; bob: a, bob-secret (each its own alpha). */
    upload(acme_auth, "a", 4, 201);
    upload(acme_auth, "acme-secret", 6, 201);
    upload(bob_auth, "a", 8, 201);
    upload(bob_auth, "bob-secret", 10, 201);
    upload(acmf_auth, "near-secret", 14, 201);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tiny_server_stop(&ts);
    free(keys_path);
    free(keys_dir);
    return 0;
}

/* The names a list route shows auth, comma-joined, into out: each
 * element's field of the array under key, past the first skip. */
static void names_at(const char *path, const char *key, const char *field, size_t skip, const char *const *auth,
                     char *out, size_t len) {
    ls_test_response r;
    assert_int_equal(req("GET", path, auth, NULL, &r), 200);
    json_t *j = ls_test_response_json(&r);
    size_t i;
    json_t *a;
    out[0] = '\0';
    json_array_foreach(json_object_get(j, key), i, a) {
        if (i < skip) continue;
        const size_t l = strlen(out);
        snprintf(out + l, len - l, "%s%s", l ? "," : "", json_string_value(json_object_get(a, field)));
    }
    json_decref(j);
    ls_test_response_free(&r);
}

/* The names GET /adapters lists for auth. */
static void listed(const char *const *auth, char *out, size_t len) {
    names_at("/adapters", "adapters", "name", 0, auth, out, len);
}

/* The adapters' ids GET /v1/models lists for auth (after the model's card). */
static void modeled(const char *const *auth, char *out, size_t len) {
    names_at("/v1/models", "data", "id", 1, auth, out, len);
}

static void test_each_tenant_sees_its_own(void **state) {
    (void)state;
    char names[512];
    listed(acme_auth, names, sizeof names);
    assert_string_equal(names, "a,acme-secret");
    modeled(acme_auth, names, sizeof names);
    assert_string_equal(names, "a,acme-secret");
    modeled(admin_auth, names, sizeof names);
    assert_string_equal(names, "acme/a,acme/acme-secret,acmf/near-secret,bob/a,bob/bob-secret");
    listed(view_auth, names, sizeof names);
    assert_string_equal(names, "a,acme-secret");
    listed(bob_auth, names, sizeof names);
    assert_string_equal(names, "a,bob-secret");
    listed(admin_auth, names, sizeof names);
    assert_string_equal(names, "acme/a,acme/acme-secret,acmf/near-secret,bob/a,bob/bob-secret");
    listed(root_auth, names, sizeof names);
    assert_string_equal(names, "acme/a,acme/acme-secret,acmf/near-secret,bob/a,bob/bob-secret");
    /* One name, two adapters: each tenant's "a" is its own. */
    char acme_a[65], bob_a[65];
    admin_sha("acme/a", acme_a);
    admin_sha("bob/a", bob_a);
    assert_string_not_equal(acme_a, bob_a);
    ls_test_response r;
    assert_int_equal(req("GET", "/adapters/a", acme_auth, NULL, &r), 200);
    json_t *j = ls_test_response_json(&r);
    assert_string_equal(json_string_value(json_object_get(j, "name")), "a");
    assert_string_equal(json_string_value(json_object_get(j, "sha256")), acme_a);
    json_decref(j);
    ls_test_response_free(&r);
    assert_int_equal(req("GET", "/adapters/a", bob_auth, NULL, &r), 200);
    assert_non_null(strstr(r.body, bob_a));
    ls_test_response_free(&r);
}

/* A forward of adapter a as auth: its y and the adapter it names. */
static json_t *forward_a(const char *const *auth, const char *name, long want) {
    char *body = ls_test_forward_json(1, 4, "0.5", "[0.5, 0.5]", name);
    ls_test_response r;
    if (req("POST", "/forward", auth, body, &r) != want) fail_msg("forward %s: %ld %s", name, r.status, r.body);
    json_t *j = ls_test_response_json(&r);
    ls_test_response_free(&r);
    free(body);
    return j;
}

static void test_forward_uses_the_tenants_adapter(void **state) {
    (void)state;
    json_t *ya = forward_a(acme_auth, "a", 200), *yb = forward_a(bob_auth, "a", 200);
    json_t *admin_a = forward_a(admin_auth, "acme/a", 200), *admin_b = forward_a(admin_auth, "bob/a", 200);
    assert_true(json_equal(json_object_get(ya, "y"), json_object_get(admin_a, "y")));
    assert_true(json_equal(json_object_get(yb, "y"), json_object_get(admin_b, "y")));
    assert_false(json_equal(json_object_get(ya, "y"), json_object_get(yb, "y")));
    const json_t *used = json_array_get(json_object_get(ya, "adapters"), 0);
    assert_string_equal(json_string_value(json_object_get(used, "name")), "a");
    used = json_array_get(json_object_get(admin_b, "adapters"), 0);
    assert_string_equal(json_string_value(json_object_get(used, "name")), "bob/a");
    json_decref(ya);
    json_decref(yb);
    json_decref(admin_a);
    json_decref(admin_b);
    /* A tenant cannot reach another's adapter by its pool name. */
    json_t *e = forward_a(acme_auth, "bob/a", 400);
    assert_string_equal(ls_test_error_code(e), "invalid_request");
    json_decref(e);
}

/* body with every "word" replaced by "NAME" (malloc'd). */
static char *masked(const char *body, const char *word) {
    char *out = calloc(1, strlen(body) * 2 + 16);
    const size_t wl = strlen(word);
    size_t o = 0;
    for (const char *p = body; *p;) {
        if (!strncmp(p, word, wl)) {
            memcpy(out + o, "NAME", 4);
            o += 4;
            p += wl;
        } else {
            out[o++] = *p++;
        }
    }
    return out;
}

/* Another tenant's adapter answers exactly as an absent name: same
 * status, same body once the name is masked, on every route that names
 * one (with no did-you-mean pointing at the other tenant). */
static void test_foreign_is_absent(void **state) {
    (void)state;
    static const struct {
        const char *method, *fmt;
        bool body;
    } routes[] = {{"GET", "/adapters/%s", false},    {"DELETE", "/adapters/%s", false},
                  {"POST", "/forward", true},        {"POST", "/v1/unload_lora_adapter", true}};
    /* bob's, and a near miss; acmf's (whose pool name "acmf/near-secret"
     * is one edit from "acme/near-secret"), and a near miss. */
    const char *pairs[][2] = {{"bob-secret", "bob-secreu"}, {"near-secret", "near-secreu"}};
    for (size_t i = 0; i < 2 * sizeof routes / sizeof *routes; i++) {
        char *bodies[2];
        long status[2];
        const char *const *names = pairs[i & 1];
        for (int k = 0; k < 2; k++) {
            char path[256], *body = NULL;
            snprintf(path, sizeof path, routes[i / 2].fmt, names[k]);
            if (routes[i / 2].body && !strcmp(routes[i / 2].fmt, "/forward"))
                body = ls_test_forward_json(1, 4, "0.5", "[0.5, 0.5]", names[k]);
            else if (routes[i / 2].body)
                assert_true(asprintf(&body, "{\"lora_name\": \"%s\"}", names[k]) > 0);
            ls_test_response r;
            status[k] = req(routes[i / 2].method, path, acme_auth, body, &r);
            bodies[k] = masked(r.body, names[k]);
            assert_null(strstr(r.body, "bob/"));
            assert_null(strstr(r.body, "acmf"));
            assert_null(strstr(r.body, "did you mean"));
            ls_test_response_free(&r);
            free(body);
        }
        assert_int_equal(status[0], 404);
        assert_int_equal(status[0], status[1]);
        if (strcmp(bodies[0], bodies[1]))
            fail_msg("%s %s: %s vs %s", routes[i / 2].method, routes[i / 2].fmt, bodies[0], bodies[1]);
        free(bodies[0]);
        free(bodies[1]);
    }
    /* bob's pool name is no way in either: a tenant key's name with a
     * '/' is 400 on every route (as docs/api.md says), the same whether
     * that adapter exists or not. */
    static const char *const slash_routes[][3] = {{"GET", "/adapters/bob/%s", NULL},
                                                  {"DELETE", "/adapters/bob/%s", NULL},
                                                  {"POST", "/v1/unload_lora_adapter", "{\"lora_name\": \"bob/%s\"}"}};
    for (size_t i = 0; i < sizeof slash_routes / sizeof *slash_routes; i++) {
        ls_test_response pr[2];
        const char *names2[2] = {"bob-secret", "bob-secreu"};
        for (int k = 0; k < 2; k++) {
            char path[256], body[256];
            snprintf(path, sizeof path, slash_routes[i][2] ? "%s" : slash_routes[i][1],
                     slash_routes[i][2] ? slash_routes[i][1] : names2[k]);
            if (slash_routes[i][2]) snprintf(body, sizeof body, slash_routes[i][2], names2[k]);
            const long got = req(slash_routes[i][0], path, acme_auth, slash_routes[i][2] ? body : NULL, &pr[k]);
            if (got != 400) fail_msg("%s %s as a tenant: %ld %s", slash_routes[i][0], path, got, pr[k].body);
            assert_non_null(strstr(pr[k].body, "invalid_request"));
        }
        assert_string_equal(pr[0].body, pr[1].body);
        ls_test_response_free(&pr[0]);
        ls_test_response_free(&pr[1]);
    }
    /* bob's adapter is still there. */
    assert_int_equal(req("GET", "/adapters/bob-secret", bob_auth, NULL, NULL), 200);
    /* Within a tenant the did-you-mean still helps. */
    ls_test_response r;
    assert_int_equal(req("GET", "/adapters/acme-secreu", acme_auth, NULL, &r), 404);
    assert_non_null(strstr(r.body, "did you mean 'acme-secret'"));
    ls_test_response_free(&r);
}

/* Replies before authorization (no route, no key) keep their text whole. */
static void test_unauthorized_replies_untouched(void **state) {
    (void)state;
    ls_test_response r;
    assert_int_equal(req("GET", "/nope", NULL, NULL, &r), 404);
    assert_non_null(strstr(r.body, "no route GET /nope"));
    assert_non_null(strstr(r.body, "/health"));
    ls_test_response_free(&r);
    assert_int_equal(req("POST", "/health", acme_auth, "{}", &r), 405);
    assert_non_null(strstr(r.body, "on /health"));
    ls_test_response_free(&r);
    assert_int_equal(req("GET", "/adapters", NULL, NULL, &r), 401);
    ls_test_response_free(&r);
}

static void test_viewer_reads_only(void **state) {
    (void)state;
    assert_int_equal(req("GET", "/adapters/a", view_auth, NULL, NULL), 200);
    assert_int_equal(req("GET", "/pool", view_auth, NULL, NULL), 200);
    assert_int_equal(req("HEAD", "/adapters", view_auth, NULL, NULL), 200);
    char *body = adapter_body("v", 4, false);
    const char *calls[][2] = {{"POST", "/adapters"}, {"DELETE", "/adapters/a"}, {"POST", "/forward"},
                              {"POST", "/adapters/validate"}, {"POST", "/v1/unload_lora_adapter"}};
    for (size_t i = 0; i < sizeof calls / sizeof *calls; i++) {
        ls_test_response r;
        assert_int_equal(req(calls[i][0], calls[i][1], view_auth, !strcmp(calls[i][0], "POST") ? body : NULL, &r), 403);
        json_t *j = ls_test_response_json(&r);
        assert_string_equal(ls_test_error_code(j), "forbidden");
        json_decref(j);
        ls_test_response_free(&r);
    }
    free(body);
    char names[256];
    listed(acme_auth, names, sizeof names);
    assert_string_equal(names, "a,acme-secret");
}

static void test_quotas(void **state) {
    (void)state;
    /* acme: max_adapters 3, it holds 2. */
    upload(acme_auth, "third", 4, 201);
    ls_test_response r;
    char *body = adapter_body("fourth", 4, false);
    assert_int_equal(req("POST", "/adapters", acme_auth, body, &r), 403);
    json_t *j = ls_test_response_json(&r);
    assert_string_equal(ls_test_error_code(j), "adapter_quota");
    assert_non_null(strstr(r.body, "quota is 3"));
    json_decref(j);
    ls_test_response_free(&r);
    free(body);
    /* A replace takes no new place. */
    char *text = adapter_body("third", 4, false);
    json_t *up = json_loads(text, 0, NULL);
    free(text);
    json_object_set_new(up, "replace", json_true());
    body = json_dumps(up, JSON_COMPACT);
    json_decref(up);
    assert_int_equal(req("POST", "/adapters", acme_auth, body, NULL), 201);
    free(body);
    assert_int_equal(req("DELETE", "/adapters/third", acme_auth, NULL, NULL), 200);
    /* bob: max_pins 1. */
    body = adapter_body("pin1", 4, true);
    assert_int_equal(req("POST", "/adapters", bob_auth, body, NULL), 201);
    free(body);
    body = adapter_body("pin2", 4, true);
    assert_int_equal(req("POST", "/adapters", bob_auth, body, &r), 409);
    j = ls_test_response_json(&r);
    assert_string_equal(ls_test_error_code(j), "tenant_pin_limit");
    assert_non_null(strstr(r.body, "holds 1 pinned adapter: its cap is 1"));
    json_decref(j);
    /* A refused change is audited too, with its code. */
    char bob_hex[65], refused[256];
    ls_sha256_hex("bob-key", 7, bob_hex);
    snprintf(refused, sizeof refused,
             "audit: tenant=bob key=%.12s role=tenant action=load name=pin2 refused=tenant_pin_limit", bob_hex);
    assert_true(ls_test_server_wait_output(ts.srv, refused) >= 1);
    ls_test_response_free(&r);
    free(body);
    assert_int_equal(req("DELETE", "/adapters/pin1", bob_auth, NULL, NULL), 200);
    /* slow: 0.01 requests a second, a burst of one. */
    assert_int_equal(req("GET", "/adapters", slow_auth, NULL, NULL), 200);
    assert_int_equal(req("GET", "/adapters", slow_auth, NULL, &r), 429);
    j = ls_test_response_json(&r);
    assert_string_equal(ls_test_error_code(j), "rate_limited");
    json_decref(j);
    char retry[32];
    ls_test_header(r.headers, "Retry-After", retry, sizeof retry);
    assert_true(atoi(retry) >= 1 && atoi(retry) <= 100);
    ls_test_response_free(&r);
}

static void test_audit_lines(void **state) {
    (void)state;
    char hex[65], line[256];
    ls_sha256_hex("acme-key", 8, hex);
    snprintf(line, sizeof line, "audit: tenant=acme key=%.12s role=tenant action=load name=acme-secret version=1", hex);
    assert_true(ls_test_server_wait_output(ts.srv, line) >= 1);
    upload(admin_auth, "acme/adm", 4, 201);
    ls_sha256_hex("admin-key", 9, hex);
    snprintf(line, sizeof line, "audit: tenant=acme key=%.12s role=admin action=load name=adm version=1", hex);
    assert_true(ls_test_server_wait_output(ts.srv, line) >= 1);
    assert_int_equal(req("DELETE", "/adapters/acme/adm", admin_auth, NULL, NULL), 200);
    snprintf(line, sizeof line, "audit: tenant=acme key=%.12s role=admin action=delete name=adm version=1", hex);
    assert_true(ls_test_server_wait_output(ts.srv, line) >= 1);
    char *out = ls_test_server_output(ts.srv);
    assert_null(strstr(out, "acme-key")); /* a key itself is never logged */
    free(out);
}

/* Every body and header as caller, for every route: none may carry a
 * forbidden string (another tenant's names, its sha256s, its prefix). */
static void sweep(const char *const *auth, const char *const *forbidden) {
    char *fwd = ls_test_forward_json(1, 4, "0.5", "[0.5, 0.5]", "a");
    char *upload_body = adapter_body("swept", 12, false);
    const struct {
        const char *method, *path, *body;
    } calls[] = {{"GET", "/health", NULL},           {"GET", "/ready", NULL},
                 {"GET", "/metrics", NULL},          {"GET", "/openapi.json", NULL},
                 {"GET", "/pool", NULL},             {"GET", "/model", NULL},
                 {"GET", "/dashboard", NULL},        {"GET", "/adapters", NULL},
                 {"GET", "/adapters/a", NULL},       {"GET", "/adapters/bob-secreu", NULL},
                 {"GET", "/adapters/near-secreu", NULL}, {"POST", "/forward?adapter=near-secreu", NULL},
                 {"GET", "/adapters/acme-secreu", NULL}, {"HEAD", "/adapters", NULL},
                 {"POST", "/forward", fwd},          {"POST", "/forward?adapter=bob-secreu", NULL},
                 {"POST", "/adapters/validate", upload_body}, {"POST", "/adapters", upload_body},
                 {"DELETE", "/adapters/swept", NULL}, {"DELETE", "/adapters/nope", NULL},
                 {"POST", "/v1/load_lora_adapter", "{\"lora_name\": \"x\", \"lora_path\": \"nope\"}"},
                 {"POST", "/v1/unload_lora_adapter", "{\"lora_name\": \"bob-secreu\"}"},
                 {"GET", "/v1/models", NULL},
                 {"GET", "/nope", NULL}};
    for (size_t i = 0; i < sizeof calls / sizeof *calls; i++) {
        ls_test_response r;
        const char *rid[] = {auth[0], "X-Request-Id: sweep-1", NULL};
        req(calls[i].method, calls[i].path, rid, calls[i].body, &r);
        for (size_t f = 0; forbidden[f]; f++)
            if (strstr(r.body, forbidden[f]) || strstr(r.headers, forbidden[f]))
                fail_msg("%s %s as %s: \"%s\" in %s %s", calls[i].method, calls[i].path, auth[0], forbidden[f],
                         r.headers, r.body);
        ls_test_response_free(&r);
    }
    free(fwd);
    free(upload_body);
}

static void test_sweep_every_route_as_each_role(void **state) {
    (void)state;
    char acme_a[65], acme_s[65], bob_a[65], bob_s[65];
    admin_sha("acme/a", acme_a);
    admin_sha("acme/acme-secret", acme_s);
    admin_sha("bob/a", bob_a);
    admin_sha("bob/bob-secret", bob_s);
    /* Some traffic first, so that per-adapter series exist. */
    json_decref(forward_a(bob_auth, "bob-secret", 200));
    json_decref(forward_a(acme_auth, "acme-secret", 200));
    char acmf_s[65];
    admin_sha("acmf/near-secret", acmf_s);
    const char *not_bob[] = {"bob-secret", "bob/", bob_a, bob_s, "near-secret", "acmf", acmf_s, NULL};
    const char *not_acme[] = {"acme-secret", "acme/", acme_a, acme_s, "near-secret", "acmf", acmf_s, NULL};
    sweep(acme_auth, not_bob);
    sweep(view_auth, not_bob);
    sweep(bob_auth, not_acme);
    /* The tenants' own names do show: the sweep could find them. */
    ls_test_response r;
    assert_int_equal(req("GET", "/metrics", bob_auth, NULL, &r), 200);
    assert_non_null(strstr(r.body, "adapter=\"bob-secret\""));
    /* Counts of everyone's adapters, which GET /pool nulls for a tenant,
     * are not its to see here either. */
    static const char *const hidden[] = {"lorasink_adapters_registered ",     "lorasink_adapters_folded ",
                                         "lorasink_pool_slots_pinned ",       "lorasink_host_cache_adapters ",
                                         "lorasink_host_cache_bytes ",        "lorasink_host_cache_drops_total ",
                                         "lorasink_pool_loads_total ",        "lorasink_pool_evictions_total ",
                                         "lorasink_pool_hits_total ",         "lorasink_pool_misses_total ",
                                         "lorasink_adapter_loads_running ",   "lorasink_validation_failures_total",
                                         "lorasink_state_records_unrestored ", NULL};
    for (int k = 0; hidden[k]; k++)
        if (strstr(r.body, hidden[k])) fail_msg("a tenant sees %s", hidden[k]);
    assert_non_null(strstr(r.body, "lorasink_pool_slots_used "));
    ls_test_response_free(&r);
    /* /pool nulls the same counts. */
    assert_int_equal(req("GET", "/pool", bob_auth, NULL, &r), 200);
    json_t *pool = ls_test_response_json(&r);
    const json_t *hc = json_object_get(pool, "host_cache"), *counters = json_object_get(pool, "counters");
    assert_true(json_is_integer(json_object_get(hc, "capacity")));
    assert_true(json_is_null(json_object_get(hc, "used")) && json_is_null(json_object_get(hc, "bytes")));
    static const char *const nulled[] = {"loads", "evictions", "hits", "misses", "host_drops", NULL};
    for (int k = 0; nulled[k]; k++)
        if (!json_is_null(json_object_get(counters, nulled[k]))) fail_msg("a tenant sees counters.%s", nulled[k]);
    assert_true(json_is_integer(json_object_get(json_object_get(pool, "capacity"), "slots")));
    json_decref(pool);
    ls_test_response_free(&r);
    assert_int_equal(req("GET", "/metrics", admin_auth, NULL, &r), 200);
    assert_non_null(strstr(r.body, "adapter=\"bob/bob-secret\""));
    assert_non_null(strstr(r.body, "adapter=\"acme/acme-secret\""));
    for (int k = 0; hidden[k]; k++)
        if (!strstr(r.body, hidden[k])) fail_msg("the admin does not see %s", hidden[k]);
    ls_test_response_free(&r);
}

/* Waits (20 s at most, the file is looked at every 0.5 s) until text is
 * in the server's output n times. */
static bool wait_count(const char *text, int n) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        if (ls_test_server_wait_output(ts.srv, text) >= n) return true;
        nanosleep(&(struct timespec){0, 10000000}, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (t.tv_sec - t0.tv_sec < 20);
    return false;
}

static void test_key_file_reload(void **state) {
    (void)state;
    const char *late[] = {"Authorization: Bearer late-key", NULL};
    assert_int_equal(req("GET", "/adapters", late, NULL, NULL), 401);
    write_keys(true);
    assert_true(wait_count("read 7 keys", 1));
    /* The line says which keys came and went, by id (never the key). */
    char hex[65], said[128];
    ls_sha256_hex("late-key", 8, hex);
    snprintf(said, sizeof said, "read 7 keys; added %.12s\n", hex);
    assert_true(wait_count(said, 1));
    assert_int_equal(req("GET", "/adapters", late, NULL, NULL), 200);
    /* A bad file keeps the keys in force and says why. */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", keys_path);
    const char *bad = "{\"keys\": [{\"sha256\": \"00\", \"role\": \"admin\"}]}";
    ls_test_write_file(tmp, bad, strlen(bad));
    assert_int_equal(rename(tmp, keys_path), 0);
    assert_true(wait_count("keeping the 7 keys read before", 1));
    assert_int_equal(req("GET", "/adapters", late, NULL, NULL), 200);
    assert_int_equal(req("GET", "/adapters", acme_auth, NULL, NULL), 200);
    write_keys(false);
    assert_true(wait_count("read 6 keys", 2));
    snprintf(said, sizeof said, "read 6 keys; removed %.12s\n", hex);
    assert_true(wait_count(said, 1));
    assert_int_equal(req("GET", "/adapters", late, NULL, NULL), 401);
    /* A deleted file keeps the keys too, and says so once. */
    assert_int_equal(unlink(keys_path), 0);
    assert_true(wait_count("No such file or directory; keeping the 6 keys read before", 1));
    assert_int_equal(req("GET", "/adapters", acme_auth, NULL, NULL), 200);
    write_keys(false);
    assert_true(wait_count("the file is there again", 1));
    assert_true(wait_count("read 6 keys", 3));
}

static void test_bad_key_file_at_start(void **state) {
    (void)state;
    char path[4200], out[4096];
    snprintf(path, sizeof path, "%s/bad.json", keys_dir);
    const char *bad = "{\"keys\": [{\"sha256\": \"00\", \"role\": \"admin\"}]}";
    ls_test_write_file(path, bad, strlen(bad));
    const char *args[] = {"--demo", "--api-keys", path, "--port", "0", NULL};
    assert_int_equal(ls_test_run_binary(args, out, sizeof out), 2);
    assert_non_null(strstr(out, "keys[0].sha256 must be the 64 hex digits"));
    snprintf(path, sizeof path, "%s/absent.json", keys_dir);
    assert_int_equal(ls_test_run_binary(args, out, sizeof out), 2);
    assert_non_null(strstr(out, "absent.json"));
}

typedef struct {
    const char *name;
    long status;
} race_forward_arg;

static void *race_forward(void *p) {
    race_forward_arg *a = p;
    char *body = ls_test_forward_json(1, 4, "0.5", "[0.5, 0.5]", a->name);
    ls_test_response r;
    memset(&r, 0, sizeof r);
    a->status = ls_test_http(ts.srv, "POST", "/forward", NULL, body, strlen(body), acme_auth, &r) == 0 ? r.status : -1;
    ls_test_response_free(&r);
    free(body);
    return NULL;
}

/* Two forwards at once, each auto-loading a new adapter, and one place
 * left: both pass the early check while neither has registered, so the
 * registration itself must refuse one (403) and let the other in. */
static void forwards_race_for_the_last_place(void) {
    race_forward_arg arg[2] = {{"auto", 0}, {"auto2", 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, race_forward, &arg[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    assert_true((arg[0].status == 200 && arg[1].status == 403) || (arg[0].status == 403 && arg[1].status == 200));
    const char *won = arg[0].status == 200 ? "auto" : "auto2";
    char names[256], want[64];
    listed(acme_auth, names, sizeof names);
    snprintf(want, sizeof want, "a,acme-secret,%s", won);
    assert_string_equal(names, want);
    char path[64];
    snprintf(path, sizeof path, "/adapters/%s", won);
    assert_int_equal(req("DELETE", path, acme_auth, NULL, NULL), 200);
}

/* A tenant's files are its directory's: loads by path and --auto-load
 * look beneath --adapter-dir/TENANT/, and an auto-load counts against
 * the tenant's quota. */
static void test_files_are_the_tenants(void **state) {
    (void)state;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/acme", ts.dir);
    mkdir(dir, 0755);
    tiny_write_peft_dir(&ts, "acme/auto", "{\"r\": 2, \"lora_alpha\": 4}");
    tiny_write_peft_dir(&ts, "acme/by-path", "{\"r\": 2, \"lora_alpha\": 4}");
    /* bob cannot reach acme's files, by name or by path; the 404 says
     * where bob's own would be looked for. */
    json_t *nf = forward_a(bob_auth, "auto", 404);
    const json_t *e = json_object_get(nf, "error");
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")), "the tenant's directory holds neither"));
    assert_non_null(strstr(json_string_value(json_object_get(e, "hint")), "tenant's own directory of --adapter-dir"));
    json_decref(nf);
    ls_test_response r;
    assert_int_equal(req("POST", "/adapters", bob_auth, "{\"name\": \"p\", \"path\": \"../acme/by-path\"}", &r), 400);
    assert_null(strstr(r.body, "acme"));
    /* The message still says where its files are (its tenant's prefix
     * is taken out of its replies, so it cannot be "--adapter-dir/bob/"). */
    assert_non_null(strstr(r.body, "beneath its tenant's own directory of --adapter-dir"));
    ls_test_response_free(&r);
    assert_int_equal(req("POST", "/adapters", bob_auth, "{\"name\": \"p\", \"path\": \"by-path\"}", NULL), 400);
    /* acme's auto-load takes its third and last place. */
    json_t *j = forward_a(acme_auth, "auto", 200);
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "adapters"), 0), "name")),
                        "auto");
    json_decref(j);
    /* The auto-load is an adapter change too: audited for the forward's key. */
    char hex[65], line[256];
    ls_sha256_hex("acme-key", 8, hex);
    snprintf(line, sizeof line, "audit: tenant=acme key=%.12s role=tenant action=auto-load name=auto version=1", hex);
    assert_true(ls_test_server_wait_output(ts.srv, line) >= 1);
    char names[256];
    listed(acme_auth, names, sizeof names);
    assert_string_equal(names, "a,acme-secret,auto");
    assert_int_equal(req("POST", "/adapters", acme_auth, "{\"name\": \"p\", \"path\": \"by-path\"}", &r), 403);
    j = ls_test_response_json(&r);
    assert_string_equal(ls_test_error_code(j), "adapter_quota");
    json_decref(j);
    ls_test_response_free(&r);
    snprintf(line, sizeof line, "audit: tenant=acme key=%.12s role=tenant action=load name=p refused=adapter_quota", hex);
    assert_true(ls_test_server_wait_output(ts.srv, line) >= 1);
    assert_int_equal(req("DELETE", "/adapters/auto", acme_auth, NULL, NULL), 200);
    assert_int_equal(req("POST", "/adapters", acme_auth, "{\"name\": \"p\", \"path\": \"by-path\"}", &r), 201);
    j = ls_test_response_json(&r);
    assert_string_equal(json_string_value(json_object_get(j, "source")), "by-path");
    json_decref(j);
    ls_test_response_free(&r);
    json_decref(forward_a(acme_auth, "auto", 403)); /* the quota again, now on the auto-load */
    snprintf(line, sizeof line, "audit: tenant=acme key=%.12s role=tenant action=auto-load name=auto refused=adapter_quota",
             hex);
    assert_true(ls_test_server_wait_output(ts.srv, line) >= 1);
    assert_int_equal(req("DELETE", "/adapters/p", acme_auth, NULL, NULL), 200);
    /* One place left and a forward naming two new adapters: refused whole
     * before either loads (each alone would fit). */
    tiny_write_peft_dir(&ts, "acme/auto2", "{\"r\": 2, \"lora_alpha\": 4}");
    assert_int_equal(req("POST", "/forward", acme_auth,
                         "{\"x\": [[0.5,0.5,0.5,0.5],[0.5,0.5,0.5,0.5]], \"gammas\": [[0.5,0.5],[0.5,0.5]], "
                         "\"adapters\": [\"auto\", \"auto2\"]}",
                         &r),
                     403);
    j = ls_test_response_json(&r);
    assert_string_equal(ls_test_error_code(j), "adapter_quota");
    /* It says what is held and what the forward would add, apart. */
    assert_non_null(strstr(json_string_value(json_object_get(json_object_get(j, "error"), "message")),
                           "holds 2 adapters and this forward loads 1 more"));
    json_decref(j);
    ls_test_response_free(&r);
    listed(acme_auth, names, sizeof names);
    assert_string_equal(names, "a,acme-secret");
    forwards_race_for_the_last_place();
}

/* The durable registry keeps each adapter's tenant. */
static void test_restart_keeps_tenants(void **state) {
    (void)state;
    char before[65], after[65], names[512];
    admin_sha("bob/a", before);
    assert_true(tiny_server_restart(&ts, false));
    listed(acme_auth, names, sizeof names);
    assert_string_equal(names, "a,acme-secret");
    listed(bob_auth, names, sizeof names);
    assert_string_equal(names, "a,bob-secret");
    admin_sha("bob/a", after);
    assert_string_equal(before, after);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_tenant_sees_its_own),
        cmocka_unit_test(test_forward_uses_the_tenants_adapter),
        cmocka_unit_test(test_foreign_is_absent),
        cmocka_unit_test(test_unauthorized_replies_untouched),
        cmocka_unit_test(test_viewer_reads_only),
        cmocka_unit_test(test_quotas),
        cmocka_unit_test(test_audit_lines),
        cmocka_unit_test(test_sweep_every_route_as_each_role),
        cmocka_unit_test(test_key_file_reload),
        cmocka_unit_test(test_bad_key_file_at_start),
        cmocka_unit_test(test_files_are_the_tenants),
        cmocka_unit_test(test_restart_keeps_tenants),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
