/* The server over a failing device, end to end over HTTP in-process: the
 * server ls_server_init_with_backend builds around the failing backend
 * (its model, loader, state directory, pool, workers), served by
 * ls_http_start on an ephemeral port and asked with libcurl. A backend
 * made for other shapes than the server's stops start-up. A device error during POST /adapters answers 503
 * device_error and registers nothing; a passing one leaves /ready at 200
 * and the retry loads; a sticky one turns /ready to 503 for good.
 *
 * No allocation is failed here (libmicrohttpd frees the bodies our code
 * allocated with its own free, which the allocation hook does not see),
 * so this program checks no live count; LSan still checks leaks. */
#include <curl/curl.h>

#include "config/config.h"
#include "server/server.h"
#include "tests/fault/fault_fixture.h"
#include "tests/util/pool_fixture.h"
#include "tests/util/testutil.h"

typedef struct {
    char *p;
    size_t n;
} sv_body;

static size_t sv_write(char *data, size_t size, size_t count, void *ctx) {
    sv_body *b = ctx;
    size_t len = size * count;
    char *p = realloc(b->p, b->n + len + 1);
    if (!p) return 0;
    memcpy(p + b->n, data, len);
    b->n += len;
    p[b->n] = '\0';
    b->p = p;
    return len;
}

/* One request; returns the status and the body in *out (caller frees). */
static long sv_request(int port, const char *method, const char *path, const char *json, char **out) {
    CURL *c = curl_easy_init();
    assert_non_null(c);
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    sv_body b = {0};
    struct curl_slist *h = NULL;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sv_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    if (json) {
        h = curl_slist_append(h, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, json);
    }
    CURLcode rc = curl_easy_perform(c);
    if (rc != CURLE_OK) fail_msg("%s %s: %s", method, path, curl_easy_strerror(rc));
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (out) *out = b.p;
    else free(b.p);
    return status;
}

/* Asserts the status and that the body names code (NULL: any body). */
static void sv_expect(int port, const char *method, const char *path, const char *json, long status,
                      const char *code) {
    char *body = NULL;
    long got = sv_request(port, method, path, json, &body);
    if (got != status || (code && (!body || !strstr(body, code))))
        fail_msg("%s %s answered %ld %s, expected %ld %s", method, path, got, body ? body : "", status,
                 code ? code : "");
    free(body);
}

typedef struct {
    char *adapter_dir, *state_dir;
    ls_server srv;
    fx_world view; /* the server's pool, state directory and loader, seen as a world (borrowed) */
    fx_world *w;   /* &view */
} sv_fx;

/* Enters what the server will make of path in the catalogue, so that the
 * slot checks know its factors. */
static void sv_catalog(fx_world *w, const char *path) {
    ls_adapter_source src = {.path = path};
    ls_adapter a;
    ls_adapter_origin origin;
    ls_error err;
    ls_error_init(&err);
    if (ls_loader_load(&w->ld, &src, &a, &origin, &err) != LS_OK) fail_msg("%s: %s", path, err.message);
    fx_catalog_add(&a);
    ls_adapter_free(&a);
    ls_error_free(&err);
}

/* The defaults, on 127.0.0.1:0 without a key, serving the demo model of
 * the fault worlds' shapes (fx_dims) from a pool of theirs. */
static void sv_config(ls_config *cfg, int slots) {
    char *argv[] = {"lorasink", NULL}, *envp[] = {NULL}, errbuf[256];
    FILE *out = fopen("/dev/null", "w");
    assert_non_null(out);
    assert_int_equal(ls_config_load(cfg, 1, argv, envp, out, errbuf, sizeof errbuf), LS_CONFIG_RUN);
    fclose(out);
    cfg->port = 0;
    snprintf(cfg->host, sizeof cfg->host, "127.0.0.1");
    cfg->api_key[0] = '\0';
    cfg->experts = fx_dims.n, cfg->hidden = fx_dims.H, cfg->intermediate = fx_dims.F, cfg->layers = fx_dims.L;
    cfg->w13_layout = fx_dims.w13_layout;
    cfg->slots = slots, cfg->max_rank = FX_RMAX, cfg->max_batch_tokens = FX_TOKENS;
    cfg->lora_layout = LS_LORA_SHARED;
}

/* A failing backend over a CPU one, made for slots slots of the worlds'
 * pool. */
static fb_backend *sv_backend(int slots) {
    double *w13, *w2;
    ls_backend *cpu = pt_cpu_create(fx_dims, slots, FX_RMAX, FX_TOKENS, 7, &w13, &w2);
    free(w13);
    free(w2);
    return fb_wrap(cpu);
}

/* The server ls_server_init builds, on a failing backend handed to it,
 * with a state directory and an adapter directory. */
static void sv_start(sv_fx *f) {
    f->adapter_dir = ls_test_mkdtemp();
    f->state_dir = ls_test_mkdtemp();
    assert_non_null(f->adapter_dir);
    assert_non_null(f->state_dir);
    fx_write_adapter_dir(f->adapter_dir);
    ls_config cfg;
    sv_config(&cfg, 3);
    snprintf(cfg.adapter_dir, sizeof cfg.adapter_dir, "%s", f->adapter_dir);
    snprintf(cfg.state_dir, sizeof cfg.state_dir, "%s", f->state_dir);
    fb_backend *fb = sv_backend(3);
    ls_server *srv = &f->srv;
    assert_true(ls_server_init_with_backend(srv, &cfg, fb_be(fb))); /* the server owns fb from here */
    assert_ptr_equal(srv->backend, fb_be(fb));
    f->view = (fx_world){.d = fx_dims, .pd = srv->pool_dims, .fb = fb, .p = srv->pool, .state = srv->state,
                         .state_dir = f->state_dir, .ld = srv->loader};
    f->w = &f->view;
    sv_catalog(f->w, "peft1");
    sv_catalog(f->w, "bare.safetensors");
    assert_true(ls_http_start(srv));
}

static void sv_stop(sv_fx *f) {
    ls_http_stop(&f->srv);
    ls_server_free(&f->srv); /* and the failing backend with it */
    ls_test_rmtree(f->state_dir);
    ls_test_rmtree(f->adapter_dir);
    free(f->state_dir);
    free(f->adapter_dir);
}

static const char *const load_a1 = "{\"name\": \"a1\", \"path\": \"peft1\"}";
static const char *const load_a2 = "{\"name\": \"a2\", \"path\": \"bare.safetensors\"}";

/* What the registry and the state directory hold: exactly names. */
static void sv_expect_registry(sv_fx *f, const char *const *names, size_t n) {
    fx_state s;
    fx_capture(f->w, &s);
    assert_int_equal(s.n_reg, n);
    for (size_t i = 0; i < n; i++) assert_string_equal(s.reg[i].name, names[i]);
    size_t adapters = 0;
    for (size_t i = 0; i < s.n_files; i++) adapters += strstr(s.files[i].path, ".adapter") != NULL;
    assert_int_equal(adapters, n);
    fx_state_free(&s);
}

static void test_passing_device_error_over_http(void **state) {
    (void)state;
    sv_fx f;
    sv_start(&f);
    const int port = f.srv.port;
    sv_expect(port, "GET", "/ready", NULL, 200, "ready");
    sv_expect(port, "POST", "/adapters", load_a1, 201, NULL);
    fb_arm(f.w->fb, 1, false);
    sv_expect(port, "POST", "/adapters", load_a2, 503, "device_error");
    fb_disarm(f.w->fb);
    const char *const one[] = {"a1"};
    sv_expect_registry(&f, one, 1);
    /* The device recovered: it is ready, and the same upload loads. */
    sv_expect(port, "GET", "/ready", NULL, 200, "ready");
    sv_expect(port, "POST", "/adapters", load_a2, 201, NULL);
    const char *const two[] = {"a1", "a2"};
    sv_expect_registry(&f, two, 2);
    sv_stop(&f);
}

static void test_sticky_device_error_over_http(void **state) {
    (void)state;
    sv_fx f;
    sv_start(&f);
    const int port = f.srv.port;
    sv_expect(port, "POST", "/adapters", load_a1, 201, NULL);
    sv_expect(port, "GET", "/ready", NULL, 200, "ready");
    fb_arm(f.w->fb, 1, true);
    sv_expect(port, "POST", "/adapters", load_a2, 503, "device_error");
    fb_disarm(f.w->fb);
    /* The load's device fault turned the server unready, for good. */
    sv_expect(port, "GET", "/ready", NULL, 503, "device_error");
    sv_expect(port, "POST", "/adapters", load_a2, 503, "device_error");
    sv_expect(port, "GET", "/ready", NULL, 503, "device_error");
    const char *const one[] = {"a1"};
    sv_expect_registry(&f, one, 1);
    /* What needs no device still answers. */
    sv_expect(port, "GET", "/health", NULL, 200, "ok");
    sv_expect(port, "GET", "/adapters", NULL, 200, "a1");
    sv_stop(&f);
}

/* A backend made for another pool than the server's (or another model)
 * stops start-up, and the server frees it with everything else. */
static void test_handed_backend_must_fit(void **state) {
    (void)state;
    ls_config cfg;
    sv_config(&cfg, 3);
    ls_server srv;
    assert_false(ls_server_init_with_backend(&srv, &cfg, fb_be(sv_backend(2))));
    cfg.hidden = 2 * fx_dims.H;
    assert_false(ls_server_init_with_backend(&srv, &cfg, fb_be(sv_backend(3))));
    cfg.hidden = fx_dims.H;
    assert_true(ls_server_init_with_backend(&srv, &cfg, fb_be(sv_backend(3))));
    assert_string_equal(ls_backend_name(srv.backend), "fault");
    ls_server_free(&srv);
}

int main(void) {
    fx_init();
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handed_backend_must_fit),
        cmocka_unit_test(test_passing_device_error_over_http),
        cmocka_unit_test(test_sticky_device_error_over_http),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
