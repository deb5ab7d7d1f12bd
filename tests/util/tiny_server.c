/* The conformance example served over HTTP, for the integration tests. */
#include "tests/util/tiny_server.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "api/base64.h"
#include "format/safetensors.h"
#include "tests/util/reference.h"

static const char *tiny_peft_names[] = {
    "model.layers.0.mlp.shared_experts.gate_up_proj.lora_A.weight",
    "model.layers.0.mlp.shared_experts.gate_up_proj.lora_B.weight",
    "model.layers.0.mlp.shared_experts.down_proj.lora_A.weight",
    "model.layers.0.mlp.shared_experts.down_proj.lora_B.weight",
};

/* A nested JSON array as an owned fp32 tensor of the given dtype. */
static ls_tensor tiny_tensor(const json_t *nested, ls_dtype dt) {
    int64_t shape[LS_MAX_DIMS];
    int nd = 0;
    for (const json_t *j = nested; json_is_array(j); j = json_array_get(j, 0)) shape[nd++] = (int64_t)json_array_size(j);
    long n;
    double *v = ls_test_json_doubles(nested, &n);
    float *f = malloc(sizeof(float) * (size_t)n);
    for (long i = 0; i < n; i++) f[i] = (float)v[i];
    free(v);
    ls_tensor t = {.dtype = dt, .ndim = nd, .nbytes = (size_t)n * ls_dtype_size(dt), .owned = true};
    memcpy(t.shape, shape, sizeof(int64_t) * (size_t)nd);
    t.data = malloc(t.nbytes);
    ls_convert_from_f32(dt, f, (size_t)n, t.data);
    free(f);
    return t;
}

bool tiny_server_start(tiny_server *ts, const char *layout, const char *const *extra) {
    return tiny_server_start_env(ts, layout, extra, NULL);
}

bool tiny_server_start_env(tiny_server *ts, const char *layout, const char *const *extra, const char *const *env) {
    memset(ts, 0, sizeof *ts);
    ts->tiny = ls_test_load_tiny();
    ts->dir = ls_test_mkdtemp();
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    ls_tensor w13 = tiny_tensor(json_object_get(ts->tiny, "w13_weight"), LS_DTYPE_F32);
    ls_tensor w2 = tiny_tensor(json_object_get(ts->tiny, "w2_weight"), LS_DTYPE_F32);
    ls_tensor_set_add(&set, "model.layers.0.mlp.shared_experts.w13_weight", &w13);
    ls_tensor_set_add(&set, "model.layers.0.mlp.shared_experts.w2_weight", &w2);
    ls_tensor_set_add_meta(&set, "w13_layout", layout);
    uint8_t *buf;
    size_t len;
    if (ls_safetensors_write(&set, &buf, &len, NULL) != LS_OK) return false;
    ls_tensor_set_free(&set);
    char path[1024];
    snprintf(path, sizeof path, "%s/weights.safetensors", ts->dir);
    ls_test_write_file(path, buf, len);
    free(buf);
    char max_rank[16];
    snprintf(max_rank, sizeof max_rank, "%lld", (long long)json_integer_value(json_object_get(ts->tiny, "max_rank")));
    const char *args[40] = {"--weights", path, "--max-rank", max_rank, "--slots", "4", "--adapter-dir", ts->dir};
    int a = 8;
    for (int i = 0; extra && extra[i] && a < 39; i++) args[a++] = extra[i];
    args[a] = NULL;
    ts->args = calloc((size_t)a + 1, sizeof *ts->args);
    assert_non_null(ts->args);
    for (int i = 0; i < a; i++) assert_non_null(ts->args[i] = strdup(args[i]));
    ts->srv = ls_test_server_start_env(args, env);
    return ts->srv != NULL;
}

bool tiny_server_restart(tiny_server *ts, bool crash) {
    if (crash) ls_test_server_kill(ts->srv);
    else assert_int_equal(ls_test_server_stop(ts->srv), 0);
    ts->srv = ls_test_server_start((const char *const *)ts->args);
    return ts->srv != NULL;
}

void tiny_server_stop(tiny_server *ts) {
    assert_int_equal(ls_test_server_stop(ts->srv), 0);
    for (int i = 0; ts->args && ts->args[i]; i++) free(ts->args[i]);
    free(ts->args);
    ls_test_rmtree(ts->dir);
    free(ts->dir);
    json_decref(ts->tiny);
    memset(ts, 0, sizeof *ts);
}

static const json_t *tiny_peft_tensor(tiny_server *ts, int i) {
    return json_object_get(json_object_get(json_object_get(ts->tiny, "adapter"), "tensors"), tiny_peft_names[i]);
}

json_t *tiny_adapter_inline(tiny_server *ts, const char *name, const char *dtype) {
    json_t *tensors = json_object();
    for (int i = 0; i < 4; i++) {
        const json_t *src = tiny_peft_tensor(ts, i);
        if (!dtype) {
            json_object_set_new(tensors, tiny_peft_names[i], json_deep_copy(src));
            continue;
        }
        ls_dtype dt;
        assert_true(ls_dtype_parse(dtype, &dt));
        ls_tensor t = tiny_tensor(src, dt);
        char *b64 = ls_base64_encode(t.data, t.nbytes);
        json_object_set_new(tensors, tiny_peft_names[i],
                            json_pack("{s:s, s:[I, I], s:s}", "dtype", dtype, "shape", (json_int_t)t.shape[0],
                                      (json_int_t)t.shape[1], "data", b64));
        free(b64);
        ls_tensor_free(&t);
    }
    return json_pack("{s:s, s:s, s:{s:i, s:i}, s:o}", "name", name, "format", "peft", "config", "r", 2, "lora_alpha",
                     4, "tensors", tensors);
}

/* Rows [r0, r0+n) of each innermost-but-one matrix, columns [0, c). */
json_t *tiny_adapter_pool_format(tiny_server *ts, const char *name) {
    const json_t *pool = json_object_get(ts->tiny, "pool");
    const int R = (int)json_integer_value(json_object_get(ts->tiny, "max_rank")), r = 2;
    json_t *tensors = json_object();
    /* gate_up_lora_a [1, 1, 2r, H]: rows 0..r-1 and R..R+r-1 of the pool */
    json_t *gua = json_array();
    const json_t *pg = json_array_get(json_object_get(pool, "gate_up_lora_a"), 0);
    for (int k = 0; k < r; k++) json_array_append(gua, json_array_get(pg, (size_t)k));
    for (int k = 0; k < r; k++) json_array_append(gua, json_array_get(pg, (size_t)(R + k)));
    json_object_set_new(tensors, "model.layers.0.mlp.shared_experts.gate_up_lora_a", json_pack("[[o]]", gua));
    /* gate_up_lora_b [1, n, 2F, r] and down_lora_b [1, 1, H, r]: first r columns */
    const char *bnames[] = {"gate_up_lora_b", "down_lora_b"};
    for (int b = 0; b < 2; b++) {
        json_t *outer = json_array();
        const json_t *src = json_object_get(pool, bnames[b]);
        for (size_t e = 0; e < json_array_size(src); e++) {
            json_t *mat = json_array();
            const json_t *m = json_array_get(src, e);
            for (size_t i = 0; i < json_array_size(m); i++) {
                json_t *row = json_array();
                for (int k = 0; k < r; k++) json_array_append(row, json_array_get(json_array_get(m, i), (size_t)k));
                json_array_append_new(mat, row);
            }
            json_array_append_new(outer, mat);
        }
        char full[128];
        snprintf(full, sizeof full, "model.layers.0.mlp.shared_experts.%s", bnames[b]);
        json_object_set_new(tensors, full, json_pack("[o]", outer));
    }
    /* down_lora_a [1, n, r, F]: first r rows per expert */
    json_t *da = json_array();
    const json_t *pda = json_object_get(pool, "down_lora_a");
    for (size_t e = 0; e < json_array_size(pda); e++) {
        json_t *mat = json_array();
        for (int k = 0; k < r; k++) json_array_append(mat, json_array_get(json_array_get(pda, e), (size_t)k));
        json_array_append_new(da, mat);
    }
    json_object_set_new(tensors, "model.layers.0.mlp.shared_experts.down_lora_a", json_pack("[o]", da));
    return json_pack("{s:s, s:s, s:o}", "name", name, "format", "pool", "tensors", tensors);
}

uint8_t *tiny_adapter_safetensors(tiny_server *ts, const char *alpha_meta, size_t *len) {
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    for (int i = 0; i < 4; i++) {
        ls_tensor t = tiny_tensor(tiny_peft_tensor(ts, i), LS_DTYPE_F32);
        ls_tensor_set_add(&set, tiny_peft_names[i], &t);
    }
    /* As PEFT's save_pretrained writes every adapter file. */
    ls_tensor_set_add_meta(&set, "format", "pt");
    if (alpha_meta) ls_tensor_set_add_meta(&set, "lora_alpha", alpha_meta);
    uint8_t *buf = NULL;
    assert_int_equal(ls_safetensors_write(&set, &buf, len, NULL), LS_OK);
    ls_tensor_set_free(&set);
    return buf;
}

void tiny_write_peft_dir(tiny_server *ts, const char *sub, const char *config_json) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", ts->dir, sub);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/adapter_config.json", ts->dir, sub);
    ls_test_write_file(path, (const uint8_t *)config_json, strlen(config_json));
    size_t len;
    uint8_t *buf = tiny_adapter_safetensors(ts, NULL, &len);
    snprintf(path, sizeof path, "%s/%s/adapter_model.safetensors", ts->dir, sub);
    ls_test_write_file(path, buf, len);
    free(buf);
}

void tiny_write_adapter_file(tiny_server *ts, const char *file, const char *alpha_meta) {
    size_t len;
    uint8_t *buf = tiny_adapter_safetensors(ts, alpha_meta, &len);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", ts->dir, file);
    ls_test_write_file(path, buf, len);
    free(buf);
}

void tiny_make_escape_link(tiny_server *ts, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", ts->dir, name);
    unlink(path);
    assert_int_equal(symlink("/tmp", path), 0);
}

json_t *tiny_post_json(tiny_server *ts, const char *path, const json_t *body, long want_status) {
    char *text = json_dumps(body, JSON_COMPACT);
    ls_test_response r;
    assert_int_equal(ls_test_http(ts->srv, "POST", path, NULL, text, strlen(text), NULL, &r), 0);
    if (r.status != want_status) fprintf(stderr, "POST %s -> %ld (wanted %ld): %s\n", path, r.status, want_status, r.body);
    assert_int_equal(r.status, want_status);
    json_t *j = ls_test_response_json(&r);
    assert_non_null(j);
    ls_test_response_free(&r);
    free(text);
    return j;
}

char *tiny_request(tiny_server *ts, const char *method, const char *path, const char *body,
                   const char *const *headers, long want_status) {
    ls_test_response r;
    const char *type = body ? "application/json" : NULL;
    assert_int_equal(ls_test_http(ts->srv, method, path, type, body, body ? strlen(body) : 0, headers, &r), 0);
    if (r.status != want_status)
        fprintf(stderr, "%s %s %s -> %ld (wanted %ld): %s\n", method, path, body ? body : "", r.status, want_status,
                r.body);
    assert_int_equal(r.status, want_status);
    char *out = strdup(r.body);
    assert_non_null(out);
    ls_test_response_free(&r);
    return out;
}

json_t *tiny_get_json(tiny_server *ts, const char *path, long want_status) {
    char *text = tiny_request(ts, "GET", path, NULL, NULL, want_status);
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    free(text);
    assert_non_null(j);
    return j;
}

/* The forward tiny_check_forward makes, as a safetensors body with the
 * adapters [name, null, name] in its metadata; y (count entries, malloc'd)
 * of the reply. */
static float *tiny_forward_safetensors(tiny_server *ts, const char *name, long *count) {
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    ls_tensor x = tiny_tensor(json_object_get(ts->tiny, "x"), LS_DTYPE_F32);
    ls_tensor g = tiny_tensor(json_object_get(ts->tiny, "gammas"), LS_DTYPE_F32);
    char names[320];
    snprintf(names, sizeof names, "[\"%s\", null, \"%s\"]", name, name);
    assert_true(ls_tensor_set_add(&set, "x", &x) && ls_tensor_set_add(&set, "gammas", &g));
    assert_true(ls_tensor_set_add_meta(&set, "adapters", names));
    uint8_t *body = NULL;
    size_t len = 0;
    assert_int_equal(ls_safetensors_write(&set, &body, &len, NULL), LS_OK);
    ls_tensor_set_free(&set);
    ls_test_response r;
    assert_int_equal(ls_test_http(ts->srv, "POST", "/forward", "application/octet-stream", body, len, NULL, &r), 0);
    if (r.status != 200) fprintf(stderr, "safetensors forward: %ld %s\n", r.status, r.body);
    assert_int_equal(r.status, 200);
    ls_tensor_set out;
    ls_tensor_set_init(&out);
    assert_int_equal(ls_safetensors_parse((uint8_t *)r.body, r.len, &out, NULL), LS_OK);
    const ls_tensor *ty = ls_tensor_set_find(&out, "y");
    assert_non_null(ty);
    *count = (long)(ty->nbytes / sizeof(float));
    float *y = malloc(ty->nbytes);
    memcpy(y, ty->data, ty->nbytes);
    assert_non_null(strstr(ls_tensor_set_meta(&out, "adapters"), name));
    ls_tensor_set_free(&out);
    ls_test_response_free(&r);
    free(body);
    return y;
}

void tiny_check_forward(tiny_server *ts, const char *name, const char *layout) {
    json_t *req = json_pack("{s:O, s:O, s:[s, n, s]}", "x", json_object_get(ts->tiny, "x"), "gammas",
                            json_object_get(ts->tiny, "gammas"), "adapters", name, name);
    json_t *resp = tiny_post_json(ts, "/forward", req, 200);
    long n, nref;
    double *y = ls_test_json_doubles(json_object_get(resp, "y"), &n);
    double *ref = ls_test_json_doubles(json_object_get(json_object_get(ts->tiny, "y"), layout), &nref);
    assert_int_equal(n, nref);
    double rel = ls_ref_rel_err_d(y, ref, n);
    if (rel > 1e-5) fprintf(stderr, "adapter %s: relative error %.3g\n", name, rel);
    assert_true(rel <= 1e-5);
    json_t *used = json_object_get(resp, "adapters");
    assert_int_equal(json_array_size(used), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(used, 0), "name")), name);
    /* The same tokens and adapters as a safetensors body: the same bits. */
    long n_st;
    float *y_st = tiny_forward_safetensors(ts, name, &n_st);
    assert_int_equal(n_st, n);
    for (long i = 0; i < n; i++) assert_true((float)y[i] == y_st[i]);
    free(y_st);
    free(y);
    free(ref);
    json_decref(resp);
    json_decref(req);
}

char *tiny_state_snapshot(tiny_server *ts) {
    ls_test_response a, b;
    assert_int_equal(ls_test_http(ts->srv, "GET", "/pool", NULL, NULL, 0, NULL, &a), 0);
    assert_int_equal(ls_test_http(ts->srv, "GET", "/adapters", NULL, NULL, 0, NULL, &b), 0);
    size_t n = a.len + b.len + 2;
    char *s = malloc(n);
    snprintf(s, n, "%s\n%s", a.body, b.body);
    ls_test_response_free(&a);
    ls_test_response_free(&b);
    return s;
}

json_t *tiny_filled(const int *shape, int nd, double v) {
    json_t *a = json_array();
    for (int i = 0; i < shape[0]; i++)
        json_array_append_new(a, nd == 1 ? json_real(v + 0.0625 * (i % 3)) : tiny_filled(shape + 1, nd - 1, v));
    return a;
}

#define TINY_P "model.layers.0.mlp.shared_experts."

json_t *tiny_shaped_peft(const int *ga, int nga, const int *gb, int ngb, const int *da, int nda, const int *db,
                         int ndb) {
    json_t *t = json_object();
    json_object_set_new(t, TINY_P "gate_up_proj.lora_A.weight", tiny_filled(ga, nga, 0.125));
    json_object_set_new(t, TINY_P "gate_up_proj.lora_B.weight", tiny_filled(gb, ngb, 0.25));
    json_object_set_new(t, TINY_P "down_proj.lora_A.weight", tiny_filled(da, nda, 0.125));
    json_object_set_new(t, TINY_P "down_proj.lora_B.weight", tiny_filled(db, ndb, 0.25));
    return json_pack("{s:s, s:{s:i, s:i}, s:o}", "name", "bad", "config", "r", 2, "lora_alpha", 4, "tensors", t);
}

json_t *tiny_shaped_pool(const int *ga, int nga, const int *gb, int ngb, const int *da, int nda, const int *db,
                         int ndb) {
    json_t *t = json_object();
    json_object_set_new(t, TINY_P "gate_up_lora_a", tiny_filled(ga, nga, 0.125));
    json_object_set_new(t, TINY_P "gate_up_lora_b", tiny_filled(gb, ngb, 0.25));
    json_object_set_new(t, TINY_P "down_lora_a", tiny_filled(da, nda, 0.125));
    json_object_set_new(t, TINY_P "down_lora_b", tiny_filled(db, ndb, 0.25));
    return json_pack("{s:s, s:s, s:o}", "name", "bad", "format", "pool", "tensors", t);
}
