/* PEFT adapters on separate gate_proj / up_proj / down_proj, as PEFT
 * writes them, served over HTTP on a model in the single-file layout:
 * one with rank_pattern, alpha_pattern and rsLoRA on every layer
 * (DeepSeek's spelling, base_model.model. prefix), one on some layers
 * only through layers_to_transform (Qwen's spelling); per-token mixed
 * adapters in one forward against the tests' fp64 reference of the
 * unfused LoRA math, 2e-5 relative L2 in f32. The inline config and a raw
 * body's __metadata__ carry the same rules (one sha256), and a DoRA
 * config is refused naming the key. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "api/base64.h"
#include "format/safetensors.h"
#include "tests/util/reference.h"
#include "tests/util/server_driver.h"

#define NE 2
#define HD 8
#define FF 4
#define NL 3

enum { GATE, UP, DOWN };
static const char *const mod_name[3] = {"gate_proj", "up_proj", "down_proj"};

typedef struct {
    int r;
    double s;
    double *A, *B; /* A [r, in], B [out, r], values exact in f32 */
} pmod;

typedef struct {
    pmod m[NL][3]; /* r 0: absent */
} padapter;

static double *w13, *w2;
static unsigned long long seed = 2024;

static void write_file(const char *path, ls_tensor_set *set) {
    uint8_t *buf;
    size_t len;
    assert_int_equal(ls_safetensors_write(set, &buf, &len, NULL), LS_OK);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    fclose(f);
    free(buf);
}

/* Adds v (doubles exact in f32) as an f32 tensor; the set copies nothing,
 * so the floats are kept in *keep (freed by the caller). */
static void add_f32(ls_tensor_set *set, const char *name, const int64_t *shape, const double *v, size_t count,
                    float **keep) {
    float *f = malloc(sizeof(float) * count);
    for (size_t i = 0; i < count; i++) f[i] = (float)v[i];
    ls_tensor t = {.dtype = LS_DTYPE_F32, .ndim = 2, .shape = {shape[0], shape[1]}, .data = f,
                   .nbytes = count * sizeof(float)};
    assert_true(ls_tensor_set_add(set, name, &t));
    *keep = f;
}

/* Random f32-exact doubles. */
static double *rand_vals(size_t count, double scale) {
    double *v = malloc(sizeof(double) * count);
    ls_ref_fill_uniform(v, (long)count, scale, &seed);
    for (size_t i = 0; i < count; i++) v[i] = (float)v[i];
    return v;
}

static void write_model(const char *path) {
    const size_t n13 = (size_t)NE * 2 * FF * HD, n2 = (size_t)NE * HD * FF;
    w13 = rand_vals(n13 * NL, 0.3);
    w2 = rand_vals(n2 * NL, 0.3);
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    float *k13[NL], *k2[NL];
    for (int l = 0; l < NL; l++) {
        char name[128];
        snprintf(name, sizeof name, "model.layers.%d.mlp.shared_experts.w13_weight", l);
        const int64_t s13[2] = {NE * 2 * FF, HD}, s2[2] = {NE * HD, FF};
        add_f32(&set, name, s13, w13 + n13 * l, n13, &k13[l]);
        snprintf(name, sizeof name, "model.layers.%d.mlp.shared_experts.w2_weight", l);
        add_f32(&set, name, s2, w2 + n2 * l, n2, &k2[l]);
    }
    ls_tensor_set_add_meta(&set, "w13_layout", "interleaved"); /* a fused file states it */
    /* 3D as the layout wants: [n, 2F, HD] and [n, HD, FF]. */
    for (size_t i = 0; i < set.n; i++) {
        ls_tensor *t = &set.items[i].t;
        const bool is13 = strstr(set.items[i].name, "w13") != NULL;
        t->ndim = 3;
        t->shape[0] = NE, t->shape[1] = is13 ? 2 * FF : HD, t->shape[2] = is13 ? HD : FF;
    }
    write_file(path, &set);
    ls_tensor_set_free(&set);
    for (int l = 0; l < NL; l++) free(k13[l]), free(k2[l]);
}

/* The adapter's factors at their ranks; scales as PEFT computes them. */
static void make_adapter(padapter *a, const int ranks[NL][3], const double alphas[NL][3], bool rslora) {
    memset(a, 0, sizeof *a);
    for (int l = 0; l < NL; l++)
        for (int m = 0; m < 3; m++) {
            pmod *p = &a->m[l][m];
            p->r = ranks[l][m];
            if (!p->r) continue;
            const int in = m == DOWN ? NE * FF : HD, out = m == DOWN ? HD : NE * FF;
            p->A = rand_vals((size_t)p->r * in, 0.5);
            p->B = rand_vals((size_t)out * p->r, 0.5);
            p->s = rslora ? alphas[l][m] / sqrt(p->r) : alphas[l][m] / p->r;
        }
}

static void free_adapter(padapter *a) {
    for (int l = 0; l < NL; l++)
        for (int m = 0; m < 3; m++) free(a->m[l][m].A), free(a->m[l][m].B);
}

/* The adapter's PEFT tensors under name_fmt (layer, module, factor). */
static void adapter_tensors(const padapter *a, const char *name_fmt, ls_tensor_set *set, float **keep, int *nkeep) {
    for (int l = 0; l < NL; l++)
        for (int m = 0; m < 3; m++) {
            const pmod *p = &a->m[l][m];
            if (!p->r) continue;
            const int in = m == DOWN ? NE * FF : HD, out = m == DOWN ? HD : NE * FF;
            char name[192];
            const int64_t sa[2] = {p->r, in}, sb[2] = {out, p->r};
            snprintf(name, sizeof name, name_fmt, l, mod_name[m], "lora_A");
            add_f32(set, name, sa, p->A, (size_t)p->r * in, &keep[(*nkeep)++]);
            snprintf(name, sizeof name, name_fmt, l, mod_name[m], "lora_B");
            add_f32(set, name, sb, p->B, (size_t)out * p->r, &keep[(*nkeep)++]);
        }
}

static void write_peft_dir(const char *dir, const char *sub, const padapter *a, const char *name_fmt,
                           const char *config) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/%s/adapter_config.json", dir, sub);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(config, f);
    fclose(f);
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    float *keep[2 * NL * 3];
    int nkeep = 0;
    adapter_tensors(a, name_fmt, &set, keep, &nkeep);
    snprintf(path, sizeof path, "%s/%s/adapter_model.safetensors", dir, sub);
    write_file(path, &set);
    ls_tensor_set_free(&set);
    for (int i = 0; i < nkeep; i++) free(keep[i]);
}

/* The reference's own arrangement of the unfused math, independent of
 * the server's slot layout: rank axis r_ref = r_g + r_u + r_d, gate in
 * columns 0..r_g-1, up in r_g..r_g+r_u-1, down in 0..r_d-1. */
typedef struct {
    ls_ref_lora lora;
    double *buf;
} ref_adapter;

static void ref_of(const padapter *a, int l, ref_adapter *out) {
    const pmod *g = &a->m[l][GATE], *u = &a->m[l][UP], *d = &a->m[l][DOWN];
    const int R = g->r + u->r + d->r > 0 ? g->r + u->r + d->r : 1;
    const size_t na = 2 * (size_t)R * HD, nb = (size_t)NE * 2 * FF * R, nda = (size_t)NE * R * FF, ndb = (size_t)HD * R;
    out->buf = calloc(na + nb + nda + ndb, sizeof(double));
    double *ga = out->buf, *gb = ga + na, *da = gb + nb, *db = da + nda;
    for (int k = 0; k < g->r; k++)
        for (int h = 0; h < HD; h++) ga[k * HD + h] = g->A[k * HD + h];
    for (int k = 0; k < u->r; k++)
        for (int h = 0; h < HD; h++) ga[(R + g->r + k) * HD + h] = u->A[k * HD + h];
    for (int e = 0; e < NE; e++)
        for (int j = 0; j < FF; j++) {
            for (int k = 0; k < g->r; k++) gb[(e * 2 * FF + j) * R + k] = g->s * g->B[(e * FF + j) * g->r + k];
            for (int k = 0; k < u->r; k++)
                gb[(e * 2 * FF + FF + j) * R + g->r + k] = u->s * u->B[(e * FF + j) * u->r + k];
            for (int k = 0; k < d->r; k++) da[(e * R + k) * FF + j] = d->A[k * NE * FF + e * FF + j];
        }
    for (int h = 0; h < HD; h++)
        for (int k = 0; k < d->r; k++) db[h * R + k] = d->s * d->B[h * d->r + k];
    out->lora = (ls_ref_lora){.r = R, .outer = 1, .gu_a = ga, .gu_b = gb, .d_a = da, .d_b = db};
}

static ls_test_server *srv;
static char *dir;
static padapter A, B;

static int setup(void **state) {
    (void)state;
    dir = ls_test_mkdtemp();
    char path[600];
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    write_model(path);
    /* A: r 4, alpha 8, rsLoRA; up rank 6 everywhere; layer 1's down rank
     * 2 (a layer-specific key before the general one); gate alpha 12. */
    const int ra[NL][3] = {{4, 6, 4}, {4, 6, 2}, {4, 6, 4}};
    const double aa[NL][3] = {{12, 8, 8}, {12, 8, 8}, {12, 8, 8}};
    make_adapter(&A, ra, aa, true);
    write_peft_dir(dir, "ds-ranks", &A, "base_model.model.model.layers.%d.mlp.shared_experts.%s.%s.weight",
                   "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"use_rslora\": true, \"target_modules\": "
                   "[\"gate_proj\", \"up_proj\", \"down_proj\"], \"rank_pattern\": {\"model.layers.1.mlp.shared_"
                   "experts.down_proj\": 2, \"up_proj\": 6}, \"alpha_pattern\": {\"gate_proj\": 12}, "
                   "\"init_lora_weights\": true, \"use_dora\": false, \"lora_bias\": false}");
    /* B: r 3, alpha 6, layers 0 and 2 only, no up on layer 2. */
    const int rb[NL][3] = {{3, 3, 3}, {0, 0, 0}, {3, 0, 3}};
    const double ab[NL][3] = {{6, 6, 6}, {0, 0, 0}, {6, 6, 6}};
    make_adapter(&B, rb, ab, false);
    write_peft_dir(dir, "qwen-some-layers", &B, "base_model.model.model.layers.%d.mlp.shared_expert.%s.%s.weight",
                   "{\"r\": 3, \"lora_alpha\": 6, \"target_modules\": [\"gate_proj\", \"up_proj\", \"down_proj\"], "
                   "\"layers_to_transform\": [0, 2], \"layers_pattern\": \"layers\"}");
    const char *args[] = {"--weights", path, "--device", "cpu", "--max-rank", "8", "--adapter-dir", dir, NULL};
    srv = ls_test_server_start(args);
    return srv ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    if (srv) assert_int_equal(ls_test_server_stop(srv), 0);
    free_adapter(&A);
    free_adapter(&B);
    free(w13);
    free(w2);
    ls_test_rmtree(dir);
    free(dir);
    return 0;
}

static json_t *post(const char *path, json_t *body, long want) {
    char *text = json_dumps(body, JSON_COMPACT);
    ls_test_response r;
    assert_int_equal(ls_test_http(srv, "POST", path, NULL, text, strlen(text), NULL, &r), 0);
    if (r.status != want) fail_msg("%s: %ld, wanted %ld: %s", path, r.status, want, r.body);
    json_t *j = ls_test_response_json(&r);
    ls_test_response_free(&r);
    free(text);
    return j;
}

static json_t *load(const char *name, const char *path, long want) {
    json_t *req = json_pack("{s:s, s:s}", "name", name, "path", path);
    json_t *j = post("/adapters", req, want);
    json_decref(req);
    return j;
}

/* Tokens cycle through adapters A, B and none, in one request. */
static void check_layer(int layer, int T) {
    double *x = rand_vals((size_t)T * HD, 1.0), *g = rand_vals((size_t)T * NE, 1.0);
    double *ref = malloc(sizeof(double) * T * HD);
    json_t *jx = json_array(), *jg = json_array(), *ja = json_array();
    const char *names[3] = {"ds-ranks", "qwen-some-layers", NULL};
    ref_adapter ra, rb;
    ref_of(&A, layer, &ra);
    ref_of(&B, layer, &rb);
    const ls_ref_lora **per = malloc(sizeof *per * T);
    for (int t = 0; t < T; t++) {
        json_t *rx = json_array(), *rg = json_array();
        for (int h = 0; h < HD; h++) json_array_append_new(rx, json_real(x[t * HD + h]));
        for (int e = 0; e < NE; e++) json_array_append_new(rg, json_real(g[t * NE + e]));
        json_array_append_new(jx, rx);
        json_array_append_new(jg, rg);
        const char *nm = names[t % 3];
        json_array_append_new(ja, nm ? json_string(nm) : json_null());
        per[t] = t % 3 == 0 ? &ra.lora : t % 3 == 1 ? &rb.lora : NULL;
    }
    json_t *req = json_pack("{s:i, s:o, s:o, s:o}", "layer", layer, "x", jx, "gammas", jg, "adapters", ja);
    json_t *j = post("/forward", req, 200);
    long cnt;
    double *y = ls_test_json_doubles(json_object_get(j, "y"), &cnt);
    assert_int_equal(cnt, (long)T * HD);
    ls_dims d = {.n = NE, .H = HD, .F = FF, .L = NL, .w13_layout = LS_W13_INTERLEAVED};
    const size_t n13 = (size_t)NE * 2 * FF * HD, n2 = (size_t)NE * HD * FF;
    ls_ref_forward(&d, w13 + n13 * layer, w2 + n2 * layer, T, x, g, per, ref);
    double rel = ls_ref_rel_err_d(y, ref, cnt);
    printf("layer %d, T=%d, mixed adapters: relative error %.3g\n", layer, T, rel);
    assert_true(rel <= 2e-5);
    /* and the adapters matter: without them the reference disagrees */
    ls_ref_forward(&d, w13 + n13 * layer, w2 + n2 * layer, T, x, g, NULL, ref);
    assert_true(ls_ref_rel_err_d(y, ref, cnt) > 1e-3);
    free(y);
    json_decref(j);
    json_decref(req);
    free(per);
    free(ra.buf);
    free(rb.buf);
    free(x);
    free(g);
    free(ref);
}

static void test_separate_factors_forward(void **state) {
    (void)state;
    json_t *a = load("ds-ranks", "ds-ranks", 201);
    assert_int_equal(json_integer_value(json_object_get(a, "rank")), 6);
    assert_int_equal(json_array_size(json_object_get(a, "warnings")), 0);
    json_decref(a);
    json_t *b = load("qwen-some-layers", "qwen-some-layers", 201);
    assert_int_equal(json_integer_value(json_object_get(b, "rank")), 3);
    json_decref(b);
    for (int l = 0; l < NL; l++) check_layer(l, 7 + 5 * l);
}

/* The same rules inline (the config object) and in a raw body's
 * __metadata__: the same factors, so the same sha256. */
static void test_rules_in_every_carrier(void **state) {
    (void)state;
    ls_test_response r;
    char path[600];
    snprintf(path, sizeof path, "/adapters/%s", "ds-ranks");
    assert_int_equal(ls_test_http(srv, "GET", path, NULL, NULL, 0, NULL, &r), 0);
    json_t *j = ls_test_response_json(&r);
    char sha[65];
    snprintf(sha, sizeof sha, "%s", json_string_value(json_object_get(j, "sha256")));
    json_decref(j);
    ls_test_response_free(&r);

    ls_tensor_set set;
    ls_tensor_set_init(&set);
    float *keep[4 * NL * 3];
    int nkeep = 0;
    adapter_tensors(&A, "model.layers.%d.mlp.shared_experts.%s.%s.weight", &set, keep, &nkeep);
    json_t *tensors = json_object();
    for (size_t i = 0; i < set.n; i++) {
        const ls_tensor *t = &set.items[i].t;
        char *b64 = ls_base64_encode((const uint8_t *)t->data, t->nbytes);
        json_object_set_new(tensors, set.items[i].name,
                            json_pack("{s:s, s:[I, I], s:s}", "dtype", "f32", "shape", (json_int_t)t->shape[0],
                                      (json_int_t)t->shape[1], "data", b64));
        free(b64);
    }
    json_t *cfg = json_loads("{\"r\": 4, \"lora_alpha\": 8, \"use_rslora\": true, \"rank_pattern\": {\"model.layers.1"
                             ".mlp.shared_experts.down_proj\": 2, \"up_proj\": 6}, \"alpha_pattern\": {\"gate_proj\": "
                             "12}}",
                             0, NULL);
    json_t *req = json_pack("{s:s, s:s, s:O, s:O}", "name", "inline-ranks", "format", "peft", "config", cfg, "tensors",
                            tensors);
    j = post("/adapters/validate", req, 200);
    assert_string_equal(json_string_value(json_object_get(j, "sha256")), sha);
    json_decref(j);
    json_decref(req);
    /* A request's shadowing keys are quoted in the warning, a control
     * byte in one shown as '?'. */
    json_t *esc = json_deep_copy(cfg);
    json_object_set_new(esc, "alpha_pattern", json_loads("{\"\\u001b|gate_proj\": 12, \"gate_proj\": 5}", 0, NULL));
    req = json_pack("{s:s, s:s, s:O, s:O}", "name", "inline-esc", "format", "peft", "config", esc, "tensors", tensors);
    j = post("/adapters/validate", req, 200);
    const char *w = json_string_value(json_array_get(json_object_get(j, "warnings"), 0));
    assert_non_null(w);
    assert_non_null(strstr(w, "key \"?|gate_proj\" (12) and key \"gate_proj\" (5)"));
    assert_null(strchr(w, 0x1b));
    json_decref(j);
    json_decref(req);
    json_decref(esc);
    /* Without rank_pattern the same tensors are refused: ranks differ. */
    json_object_del(cfg, "rank_pattern");
    req = json_pack("{s:s, s:s, s:O, s:O}", "name", "inline-ranks", "format", "peft", "config", cfg, "tensors",
                    tensors);
    j = post("/adapters/validate", req, 422);
    assert_string_equal(ls_test_error_code(j), "lora_rank_mismatch");
    json_decref(j);
    json_decref(req);
    json_decref(cfg);
    ls_tensor_set_free(&set);

    ls_tensor_set raw;
    ls_tensor_set_init(&raw);
    adapter_tensors(&A, "model.layers.%d.mlp.shared_experts.%s.%s.weight", &raw, keep, &nkeep);
    ls_tensor_set_add_meta(&raw, "lora_alpha", "8");
    ls_tensor_set_add_meta(&raw, "use_rslora", "true");
    ls_tensor_set_add_meta(&raw, "r", "4");
    ls_tensor_set_add_meta(&raw, "rank_pattern", "{\"model.layers.1.mlp.shared_experts.down_proj\": 2, \"up_proj\": 6}");
    ls_tensor_set_add_meta(&raw, "alpha_pattern", "{\"gate_proj\": 12}");
    uint8_t *body;
    size_t len;
    assert_int_equal(ls_safetensors_write(&raw, &body, &len, NULL), LS_OK);
    assert_int_equal(ls_test_http(srv, "POST", "/adapters/validate?name=raw-ranks", "application/octet-stream", body,
                                  len, NULL, &r),
                     0);
    if (r.status != 200) fail_msg("raw: %ld %s", r.status, r.body);
    j = ls_test_response_json(&r);
    assert_string_equal(json_string_value(json_object_get(j, "sha256")), sha);
    json_decref(j);
    ls_test_response_free(&r);
    free(body);
    ls_tensor_set_free(&raw);
    json_decref(tensors);
    for (int i = 0; i < nkeep; i++) free(keep[i]);
}

/* The sha256 and warnings of a PEFT directory of B's factors with
 * config, validated. */
static json_t *validate_dir(const char *sub, const char *config) {
    write_peft_dir(dir, sub, &B, "base_model.model.model.layers.%d.mlp.shared_expert.%s.%s.weight", config);
    json_t *req = json_pack("{s:s}", "path", sub);
    json_t *j = post("/adapters/validate", req, 200);
    json_decref(req);
    return j;
}

/* Two alpha_pattern keys matching one module with different values: the
 * file's first applies (PEFT's loader), and since PEFT's save_pretrained
 * writes keys sorted, the reply and a load say so; keys that match
 * disjoint modules say nothing. */
static void test_shadowed_alpha_pattern_warns(void **state) {
    (void)state;
    json_t *shadowed = validate_dir("shadowed", "{\"r\": 3, \"lora_alpha\": 6, \"alpha_pattern\": {\".*\": 9, "
                                                "\"up_proj\": 3}}");
    json_t *first = validate_dir("first-only", "{\"r\": 3, \"lora_alpha\": 6, \"alpha_pattern\": {\".*\": 9}}");
    json_t *disjoint = validate_dir("disjoint", "{\"r\": 3, \"lora_alpha\": 6, \"alpha_pattern\": {\"gate_proj|"
                                                "down_proj\": 9, \"up_proj\": 3}}");
    assert_string_equal(json_string_value(json_object_get(shadowed, "sha256")),
                        json_string_value(json_object_get(first, "sha256")));
    json_t *w = json_object_get(shadowed, "warnings");
    assert_int_equal(json_array_size(w), 1);
    const char *text = json_string_value(json_array_get(w, 0));
    /* keys of a file are named by their place in it, never echoed */
    assert_non_null(strstr(text, "key 1 of adapter_config.json (9) and key 2 of adapter_config.json (3)"));
    assert_non_null(strstr(text, "sorted"));
    assert_int_equal(json_array_size(json_object_get(first, "warnings")), 0);
    assert_int_equal(json_array_size(json_object_get(disjoint, "warnings")), 0);
    assert_string_not_equal(json_string_value(json_object_get(disjoint, "sha256")),
                            json_string_value(json_object_get(first, "sha256")));
    json_decref(shadowed);
    json_decref(first);
    json_decref(disjoint);
    json_t *a = load("shadowed", "shadowed", 201);
    assert_int_equal(json_array_size(json_object_get(a, "warnings")), 1);
    /* GET says it too, later: the operator who did not load it sees it. */
    ls_test_response r;
    assert_int_equal(ls_test_http(srv, "GET", "/adapters/shadowed", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *g = ls_test_response_json(&r);
    ls_test_response_free(&r);
    assert_true(json_equal(json_object_get(g, "warnings"), json_object_get(a, "warnings")));
    /* And what it applied and skipped: the same layers and names. */
    assert_true(json_array_size(json_object_get(a, "layers")) > 0);
    assert_true(json_equal(json_object_get(g, "layers"), json_object_get(a, "layers")));
    assert_true(json_equal(json_object_get(g, "ignored"), json_object_get(a, "ignored")));
    json_decref(g);
    json_decref(a);
}

/* Validates config (in dir sub) and the same factors with only r and
 * lora_alpha: the same sha256, and one warning, saying want. */
static void expect_warned_same(const char *sub, const char *config, const char *want) {
    char plain_sub[64];
    snprintf(plain_sub, sizeof plain_sub, "%s-plain", sub);
    json_t *warned = validate_dir(sub, config), *plain = validate_dir(plain_sub, "{\"r\": 3, \"lora_alpha\": 6}");
    assert_string_equal(json_string_value(json_object_get(warned, "sha256")),
                        json_string_value(json_object_get(plain, "sha256")));
    json_t *w = json_object_get(warned, "warnings");
    assert_int_equal(json_array_size(w), 1);
    assert_non_null(strstr(json_string_value(json_array_get(w, 0)), want));
    assert_int_equal(json_array_size(json_object_get(plain, "warnings")), 0);
    json_decref(warned);
    json_decref(plain);
}

/* A misspelt math key (alpha_patern): the load stands as PEFT's would,
 * at lora_alpha / r, and its reply says which key was meant. */
static void test_near_miss_key_warns(void **state) {
    (void)state;
    expect_warned_same("near-miss", "{\"r\": 3, \"lora_alpha\": 6, \"alpha_patern\": {\"down_proj\": 9}}",
                       "key 3 of adapter_config.json is no LoraConfig key, so it changes nothing (PEFT ignores it "
                       "too); did you mean \"alpha_pattern\"?");
}

/* A pattern key that matches none of the adapter's modules changes
 * nothing, as in PEFT; written for target_parameters' names beside
 * target_modules' factors ("up_proj.weight"), it looked as if it did.
 * The reply says so, naming the key by its place; a key that matches
 * says nothing. */
static void test_unmatched_key_warns(void **state) {
    (void)state;
    expect_warned_same("unmatched", "{\"r\": 3, \"lora_alpha\": 6, \"alpha_pattern\": {\"gate_proj\": 6, "
                                    "\"up_proj.weight\": 9}}",
                       "alpha_pattern key 2 of adapter_config.json matches none of the modules");
    json_t *hit = validate_dir("matched", "{\"r\": 3, \"lora_alpha\": 6, \"alpha_pattern\": {\"up_proj\": 9}}");
    assert_int_equal(json_array_size(json_object_get(hit, "warnings")), 0);
    /* The reply says what each module was read with: the key took up's
     * scale to 9 / 3, gate and down keep 6 / 3. */
    const json_t *mods = json_object_get(hit, "modules");
    int seen = 0;
    for (size_t i = 0; i < json_array_size(mods); i++) {
        const json_t *m = json_array_get(mods, i);
        const char *name = json_string_value(json_object_get(m, "module"));
        const double scale = json_real_value(json_object_get(m, "scale"));
        assert_int_equal(json_integer_value(json_object_get(m, "rank")), 3);
        assert_true(json_array_size(json_object_get(m, "layers")) > 0);
        if (!strcmp(name, "up_proj")) assert_true(fabs(scale - 3.0) < 1e-12), seen |= 1;
        else if (!strcmp(name, "gate_proj") || !strcmp(name, "down_proj")) assert_true(fabs(scale - 2.0) < 1e-12), seen |= 2;
        else fail_msg("module %s", name);
    }
    assert_int_equal(seen, 3);
    json_decref(hit);
}

/* lora_alpha 0 loads, as in PEFT, and adds nothing: said so; one
 * module of scale 0 among others is no such adapter. */
static void test_zero_scale_warns(void **state) {
    (void)state;
    json_t *zero = validate_dir("zero-alpha", "{\"r\": 3, \"lora_alpha\": 0}");
    json_t *w = json_object_get(zero, "warnings");
    assert_int_equal(json_array_size(w), 1);
    assert_non_null(strstr(json_string_value(json_array_get(w, 0)), "every module's scale is 0"));
    json_t *some = validate_dir("zero-some", "{\"r\": 3, \"lora_alpha\": 6, \"alpha_pattern\": {\"up_proj\": 0}}");
    assert_int_equal(json_array_size(json_object_get(some, "warnings")), 0);
    json_decref(zero);
    json_decref(some);
}

/* A DoRA adapter: 422 naming use_dora, nothing registered. */
static void test_dora_refused(void **state) {
    (void)state;
    write_peft_dir(dir, "dora", &B, "base_model.model.model.layers.%d.mlp.shared_expert.%s.%s.weight",
                   "{\"r\": 3, \"lora_alpha\": 6, \"use_dora\": true}");
    json_t *e = load("dora", "dora", 422);
    assert_string_equal(ls_test_error_code(e), "adapter_config_invalid");
    assert_non_null(strstr(json_string_value(json_object_get(json_object_get(e, "error"), "message")), "use_dora"));
    json_decref(e);
    ls_test_response r;
    assert_int_equal(ls_test_http(srv, "GET", "/adapters/dora", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 404);
    ls_test_response_free(&r);
}

static const char *error_text(const json_t *e, const char *key) {
    return json_string_value(json_object_get(json_object_get(e, "error"), key));
}

/* A directory that lacks a file the load needs says what it holds
 * instead: a subfolder PEFT saved a named adapter in, a bare model file,
 * a pickle. */
static void test_missing_files_explained(void **state) {
    (void)state;
    const char *fmt = "base_model.model.model.layers.%d.mlp.shared_expert.%s.%s.weight";
    char path[600];
    snprintf(path, sizeof path, "%s/saved", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    write_peft_dir(dir, "saved/tenant-a", &B, fmt, "{\"r\": 3, \"lora_alpha\": 6}");
    json_t *e = load("saved", "saved", 400);
    assert_non_null(strstr(error_text(e, "message"), "subfolder \"tenant-a\""));
    assert_non_null(strstr(error_text(e, "hint"), "\"saved/tenant-a\""));
    json_decref(e);
    json_decref(load("saved", "saved/tenant-a", 201));

    write_peft_dir(dir, "noconfig", &B, fmt, "{}");
    snprintf(path, sizeof path, "%s/noconfig/adapter_config.json", dir);
    assert_int_equal(unlink(path), 0);
    e = load("noconfig", "noconfig", 400);
    assert_non_null(strstr(error_text(e, "message"), "no adapter_config.json"));
    assert_non_null(strstr(error_text(e, "hint"), "noconfig/adapter_model.safetensors"));
    json_decref(e);

    write_peft_dir(dir, "pickled", &B, fmt, "{\"r\": 3, \"lora_alpha\": 6}");
    char to[640];
    snprintf(path, sizeof path, "%s/pickled/adapter_model.safetensors", dir);
    snprintf(to, sizeof to, "%s/pickled/adapter_model.bin", dir);
    assert_int_equal(rename(path, to), 0);
    e = load("pickled", "pickled", 400);
    assert_non_null(strstr(error_text(e, "message"), "adapter_model.bin, a pickled PyTorch file"));
    assert_non_null(strstr(error_text(e, "hint"), "safetensors"));
    json_decref(e);

    /* A subfolder's adapter that is only a pickle: both said at once. */
    snprintf(path, sizeof path, "%s/outer", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    write_peft_dir(dir, "outer/named", &B, fmt, "{\"r\": 3, \"lora_alpha\": 6}");
    snprintf(path, sizeof path, "%s/outer/named/adapter_model.safetensors", dir);
    snprintf(to, sizeof to, "%s/outer/named/adapter_model.bin", dir);
    assert_int_equal(rename(path, to), 0);
    e = load("outer", "outer", 400);
    assert_non_null(strstr(error_text(e, "message"), "subfolder \"named\""));
    assert_non_null(strstr(error_text(e, "message"), "pickled adapter_model.bin"));
    assert_non_null(strstr(error_text(e, "hint"), "\"outer/named\", once its adapter_model.bin is saved again"));
    json_decref(e);

    /* The adapter directory itself holds the adapters: none of them is
     * offered for it. */
    e = load("root", ".", 400);
    assert_null(strstr(error_text(e, "message"), "subfolder"));
    json_decref(e);

    /* A long path is shown by its end, whole quotes and all; its hint
     * names the subfolder to add, not a cut path. */
    char longp[300] = "saved";
    for (int i = 0; i < 110; i++) strcat(longp, "/."); /* 225 bytes */
    e = load("long", longp, 400);
    const char *msg = error_text(e, "message"), *hint = error_text(e, "hint");
    assert_non_null(strstr(msg, "\"..."));
    assert_non_null(strstr(msg, "but its subfolder \"tenant-a\" does"));
    assert_non_null(strstr(msg, "in a subfolder of its name"));
    assert_string_equal(hint, "give the path you gave with \"/tenant-a\" after it");
    json_decref(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_separate_factors_forward),
        cmocka_unit_test(test_rules_in_every_carrier),
        cmocka_unit_test(test_dora_refused),
        cmocka_unit_test(test_shadowed_alpha_pattern_warns),
        cmocka_unit_test(test_near_miss_key_warns),
        cmocka_unit_test(test_unmatched_key_warns),
        cmocka_unit_test(test_zero_scale_warns),
        cmocka_unit_test(test_missing_files_explained),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
