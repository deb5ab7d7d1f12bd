/* Separate gate_proj / up_proj / down_proj PEFT factors fused into one
 * slot: with unequal ranks and scales (r, lora_alpha, use_rslora,
 * rank_pattern, alpha_pattern), the pool's deltas equal the unfused LoRA
 * math computed directly in fp64 (s_g B_g A_g per expert, and so on);
 * modules present in some layers only; every family's spelling; the same
 * math as fused, separate and pool form gives one sha256. */
#include <math.h>

#include "lora/adapter_config.h"
#include "tests/util/adapter_fixture.h"

#define NE 2
#define HH 5
#define FF 3
#define LL 3
#define RR 6

typedef struct {
    int r;
    double s;
    float *A, *B; /* A [r, in], B [out, r] */
} fx_mod;

static unsigned long long fx_seed = 12345;

static float fx_rand(void) {
    fx_seed = fx_seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(fx_seed >> 40) / (double)(1ULL << 24) - 0.5);
}

/* A module of rank r with in_features x out_features, random A and B. */
static fx_mod fx_make(ls_tensor_set *s, const char *name_fmt, int layer, int r, int in, int out) {
    fx_mod m = {.r = r, .A = malloc(sizeof(float) * r * in), .B = malloc(sizeof(float) * out * r)};
    for (int i = 0; i < r * in; i++) m.A[i] = fx_rand();
    for (int i = 0; i < out * r; i++) m.B[i] = fx_rand();
    char name[192];
    const int64_t sa[2] = {r, in}, sb[2] = {out, r};
    snprintf(name, sizeof name, name_fmt, layer, "lora_A");
    tu_add(s, name, LS_DTYPE_F32, sa, 2, m.A);
    snprintf(name, sizeof name, name_fmt, layer, "lora_B");
    tu_add(s, name, LS_DTYPE_F32, sb, 2, m.B);
    return m;
}

static void fx_free(fx_mod *m) {
    free(m->A);
    free(m->B);
    m->A = m->B = NULL;
}

static ls_dims fx_dims(void) { return (ls_dims){.n = NE, .H = HH, .F = FF, .L = LL}; }

/* The pool's gate (up: half 1) delta of expert e, row j, column h. */
static double pool_gu_delta(const float *gu_a, const float *gu_b, int e, int half, int j, int h) {
    double d = 0;
    for (int k = 0; k < RR; k++)
        d += (double)gu_b[((e * 2 * FF) + half * FF + j) * RR + k] * gu_a[(half * RR + k) * HH + h];
    return d;
}

/* The module's own delta s * B[e*F + j] * A[:, h] in fp64. */
static double lora_delta(const fx_mod *m, int row, int col, int in) {
    if (!m || !m->A) return 0;
    double d = 0;
    for (int k = 0; k < m->r; k++) d += (double)m->B[row * m->r + k] * m->A[k * in + col];
    return m->s * d;
}

/* Compares layer l of a against the unfused modules (NULL: absent). */
static void check_layer(const ls_adapter *a, int l, const fx_mod *g, const fx_mod *u, const fx_mod *d) {
    ls_dims dims = fx_dims();
    ls_pool_dims pool = tu_pool(RR, LS_LORA_SHARED);
    float *gu_a = calloc(ls_pool_gu_a_len(&dims, &pool), sizeof(float));
    float *gu_b = calloc(ls_pool_gu_b_len(&dims, &pool), sizeof(float));
    float *d_a = calloc(ls_pool_d_a_len(&dims, &pool), sizeof(float));
    float *d_b = calloc(ls_pool_d_b_len(&dims, &pool), sizeof(float));
    ls_adapter_expand(a, l, &dims, &pool, gu_a, gu_b, d_a, d_b);
    double worst = 0;
    for (int e = 0; e < NE; e++)
        for (int j = 0; j < FF; j++)
            for (int h = 0; h < HH; h++) {
                worst = fmax(worst, fabs(pool_gu_delta(gu_a, gu_b, e, 0, j, h) - lora_delta(g, e * FF + j, h, HH)));
                worst = fmax(worst, fabs(pool_gu_delta(gu_a, gu_b, e, 1, j, h) - lora_delta(u, e * FF + j, h, HH)));
            }
    for (int e = 0; e < NE; e++)
        for (int h = 0; h < HH; h++)
            for (int j = 0; j < FF; j++) {
                double p = 0;
                for (int k = 0; k < RR; k++) p += (double)d_b[h * RR + k] * d_a[(e * RR + k) * FF + j];
                worst = fmax(worst, fabs(p - lora_delta(d, h, e * FF + j, NE * FF)));
            }
    /* The pool holds s*B in fp32: one rounding per element of B. */
    if (worst > 1e-6) fail_msg("layer %d: pool delta differs from the unfused LoRA math by %g", l, worst);
    free(gu_a);
    free(gu_b);
    free(d_a);
    free(d_b);
}

#define GATE "model.layers.%d.mlp.shared_experts.gate_proj.%s.weight"
#define UP "model.layers.%d.mlp.shared_experts.up_proj.%s.weight"
#define DOWN "model.layers.%d.mlp.shared_experts.down_proj.%s.weight"

static ls_status parse_config(const char *text, ls_adapter_params *p, ls_error *err) {
    memset(p, 0, sizeof *p);
    return ls_adapter_config_parse_text(text, p, err);
}

/* Unequal ranks and scales: rank_pattern for up (every layer) and for
 * one layer's down (a layer-specific key before the general one),
 * alpha_pattern for gate; layer 1 has no up, layer 2 nothing at all. */
static void test_unequal_ranks_and_scales(void **state) {
    (void)state;
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    fx_mod g0 = fx_make(&s, GATE, 0, 2, HH, NE * FF), u0 = fx_make(&s, UP, 0, 5, HH, NE * FF);
    fx_mod d0 = fx_make(&s, DOWN, 0, 1, NE * FF, HH);
    fx_mod g1 = fx_make(&s, GATE, 1, 2, HH, NE * FF), d1 = fx_make(&s, DOWN, 1, 4, NE * FF, HH);
    const char *cfg = "{\"r\": 2, \"lora_alpha\": 4, \"target_modules\": [\"gate_proj\", \"up_proj\", \"down_proj\"],"
                      " \"rank_pattern\": {\"model.layers.0.mlp.shared_experts.down_proj\": 1, \"down_proj\": 4, "
                      "\"up_proj\": 5}, \"alpha_pattern\": {\"gate_proj\": 8, \"layers.1.mlp.*down_proj\": 12}}";
    ls_adapter_params p;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(parse_config(cfg, &p, &err), LS_OK);
    /* PEFT's own scalings: alpha_m / r_m. */
    g0.s = 8.0 / 2, u0.s = 4.0 / 5, d0.s = 4.0 / 1, g1.s = 8.0 / 2, d1.s = 12.0 / 4;
    ls_dims d = fx_dims();
    ls_pool_dims pool = tu_pool(RR, LS_LORA_SHARED);
    ls_adapter a;
    ls_status st = ls_adapter_normalise(&s, &p, &d, &pool, &a, &err);
    if (st != LS_OK) tu_dump(&err);
    assert_int_equal(st, LS_OK);
    assert_int_equal(a.meta.rank, 5); /* the largest module rank */
    assert_true(fabs(a.meta.scale - 2.0) < 1e-12); /* lora_alpha / r of the modules no key matches */
    check_layer(&a, 0, &g0, &u0, &d0);
    check_layer(&a, 1, &g1, NULL, &d1);
    check_layer(&a, 2, NULL, NULL, NULL);
    /* What the replies show: each module's own rank and scale per layer. */
    const ls_adapter_modules *m = a.modules;
    assert_non_null(m);
    const int K = LS_ADAPTER_MODULE_KINDS, G = 2, U = 3, D = 1; /* gate, up, down (adapter_internal.h) */
    assert_string_equal(m->name[G], "gate_proj");
    assert_string_equal(m->name[U], "up_proj");
    assert_string_equal(m->name[D], "down_proj");
    assert_string_equal(m->name[0], "");
    assert_int_equal(m->rank[0 * K + U], 5), assert_true(fabs(m->scale[0 * K + U] - 0.8) < 1e-12);
    assert_int_equal(m->rank[0 * K + D], 1), assert_true(fabs(m->scale[0 * K + D] - 4.0) < 1e-12);
    assert_int_equal(m->rank[1 * K + D], 4), assert_true(fabs(m->scale[1 * K + D] - 3.0) < 1e-12);
    assert_int_equal(m->rank[1 * K + G], 2), assert_true(fabs(m->scale[1 * K + G] - 4.0) < 1e-12);
    assert_int_equal(m->rank[1 * K + U], 0);
    for (int k = 0; k < K; k++) assert_int_equal(m->rank[2 * K + k], 0);
    assert_true(a.layer_present[0] && a.layer_present[1] && !a.layer_present[2]);
    ls_adapter_free(&a);

    /* rsLoRA: alpha_m / sqrt(r_m), the same modules. */
    cfg = "{\"r\": 2, \"lora_alpha\": 4, \"use_rslora\": true, \"rank_pattern\": {\"model.layers.0.mlp.shared_experts"
          ".down_proj\": 1, \"down_proj\": 4, \"up_proj\": 5}, \"alpha_pattern\": {\"gate_proj\": 8}}";
    assert_int_equal(parse_config(cfg, &p, &err), LS_OK);
    g0.s = 8.0 / sqrt(2), u0.s = 4.0 / sqrt(5), d0.s = 4.0 / 1, g1.s = 8.0 / sqrt(2), d1.s = 4.0 / 2;
    assert_int_equal(ls_adapter_normalise(&s, &p, &d, &pool, &a, &err), LS_OK);
    check_layer(&a, 0, &g0, &u0, &d0);
    check_layer(&a, 1, &g1, NULL, &d1);
    ls_adapter_free(&a);

    /* The first matching key wins: a general key listed first shadows a
     * layer-specific one after it, as in PEFT. */
    cfg = "{\"r\": 2, \"lora_alpha\": 4, \"rank_pattern\": {\"down_proj\": 4, \"model.layers.0.mlp.shared_experts"
          ".down_proj\": 1, \"up_proj\": 5}}";
    assert_int_equal(parse_config(cfg, &p, &err), LS_OK);
    tu_expect_fail(&s, &p, &d, &pool, LS_LORA_RANK_MISMATCH, &err);
    const ls_violation *v = tu_find(&err, LS_LORA_RANK_MISMATCH, "model.layers.0.mlp.shared_experts.down_proj.lora_A.weight");
    assert_non_null(strstr(v->message, "rank_pattern key \"down_proj\""));
    assert_int_equal(v->expected, 4);
    assert_int_equal(v->got, 1);

    /* --max-rank below the largest module: named on that module. */
    ls_error_clear(&err);
    assert_int_equal(parse_config("{\"r\": 2, \"lora_alpha\": 4, \"rank_pattern\": {\"model.layers.0.mlp.shared_experts"
                                  ".down_proj\": 1, \"down_proj\": 4, \"up_proj\": 5}}",
                                  &p, &err),
                     LS_OK);
    pool.max_rank = 4;
    tu_expect_fail(&s, &p, &d, &pool, LS_LORA_RANK_TOO_LARGE, &err);
    tu_expect(&err, LS_LORA_RANK_TOO_LARGE, LS_NA, "model.layers.0.mlp.shared_experts.up_proj.lora_A.weight", LS_NA, 4,
              5);
    ls_error_free(&err);
    fx_free(&g0), fx_free(&u0), fx_free(&d0), fx_free(&g1), fx_free(&d1);
    ls_tensor_set_free(&s);
}

/* Without rank_pattern the modules share r: an odd one is a mismatch
 * that names it and says where a rank per module is stated. */
static void test_unequal_ranks_need_rank_pattern(void **state) {
    (void)state;
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    fx_mod g = fx_make(&s, GATE, 0, 2, HH, NE * FF), u = fx_make(&s, UP, 0, 3, HH, NE * FF);
    fx_mod dn = fx_make(&s, DOWN, 0, 2, NE * FF, HH);
    ls_dims d = fx_dims();
    ls_pool_dims pool = tu_pool(RR, LS_LORA_SHARED);
    ls_error err;
    ls_error_init(&err);
    tu_expect_fail(&s, &tu_scale1, &d, &pool, LS_LORA_RANK_MISMATCH, &err);
    const ls_violation *v = tu_expect(&err, LS_LORA_RANK_MISMATCH, 0,
                                      "model.layers.0.mlp.shared_experts.up_proj.lora_A.weight", 0, 2, 3);
    assert_non_null(strstr(v->hint, "rank_pattern"));
    ls_error_free(&err);
    fx_free(&g), fx_free(&u), fx_free(&dn);
    ls_tensor_set_free(&s);
}

/* Every family's spelling maps to the same slot, with or without the
 * base_model.model. prefix: Qwen's singular shared_expert, Llama 4's
 * feed_forward, the language model of vision-language checkpoints. */
static void test_family_names(void **state) {
    (void)state;
    const char *forms[] = {
        "model.layers.%d.mlp.shared_experts.%s_proj.%s.weight",
        "base_model.model.model.layers.%d.mlp.shared_expert.%s_proj.%s.weight",
        "model.language_model.layers.%d.mlp.shared_expert.%s_proj.%s.weight",
        "language_model.model.layers.%d.feed_forward.shared_expert.%s_proj.%s.weight",
    };
    char digest[65] = "";
    for (size_t f = 0; f < sizeof forms / sizeof *forms; f++) {
        ls_tensor_set s;
        ls_tensor_set_init(&s);
        fx_seed = 99;
        const char *mods[3] = {"gate", "up", "down"};
        for (int m = 0; m < 3; m++) {
            char fmt[192];
            /* fx_make fills layer and factor; the module is fixed here. */
            snprintf(fmt, sizeof fmt, forms[f], 1, mods[m], "%s");
            char *at = strstr(fmt, "layers.1.");
            memmove(at + 9, at + 8, strlen(at + 8) + 1);
            memcpy(at, "layers.%d", 9);
            fx_mod x = fx_make(&s, fmt, 1, 2, m == 2 ? NE * FF : HH, m == 2 ? HH : NE * FF);
            fx_free(&x);
        }
        ls_dims d = fx_dims();
        ls_pool_dims pool = tu_pool(RR, LS_LORA_SHARED);
        ls_adapter a;
        ls_error err;
        ls_error_init(&err);
        ls_status st = ls_adapter_normalise(&s, &tu_scale1, &d, &pool, &a, &err);
        if (st != LS_OK) tu_dump(&err);
        assert_int_equal(st, LS_OK);
        assert_true(a.layer_present[1] && !a.layer_present[0]);
        if (f) assert_string_equal(a.meta.sha256, digest);
        memcpy(digest, a.meta.sha256, sizeof digest);
        ls_adapter_free(&a);
        ls_error_free(&err);
        ls_tensor_set_free(&s);
    }
}

/* One adapter in three forms: fused gate_up_proj (one A for gate and up),
 * separate gate_proj and up_proj with that same A, and the pool buffers
 * of the result: one digest. */
static void test_one_digest_three_forms(void **state) {
    (void)state;
    const int r = 3;
    ls_dims d = fx_dims();
    ls_pool_dims pool = tu_pool(RR, LS_LORA_SHARED);
    float A[3 * HH], Bgu[NE * 2 * FF * 3], Bg[NE * FF * 3], Bu[NE * FF * 3], Ad[3 * NE * FF], Bd[HH * 3];
    for (int i = 0; i < r * HH; i++) A[i] = fx_rand();
    for (int i = 0; i < NE * 2 * FF * r; i++) Bgu[i] = fx_rand();
    for (int i = 0; i < r * NE * FF; i++) Ad[i] = fx_rand();
    for (int i = 0; i < HH * r; i++) Bd[i] = fx_rand();
    for (int e = 0; e < NE; e++)
        for (int j = 0; j < FF; j++)
            for (int k = 0; k < r; k++) {
                Bg[(e * FF + j) * r + k] = Bgu[(e * 2 * FF + j) * r + k];
                Bu[(e * FF + j) * r + k] = Bgu[(e * 2 * FF + FF + j) * r + k];
            }
    const int64_t sa[2] = {r, HH}, sgu[2] = {NE * 2 * FF, r}, sg[2] = {NE * FF, r}, sda[2] = {r, NE * FF},
                  sdb[2] = {HH, r};
    ls_tensor_set fused, sep;
    ls_tensor_set_init(&fused);
    ls_tensor_set_init(&sep);
    tu_add(&fused, "model.layers.0.mlp.shared_experts.gate_up_proj.lora_A.weight", LS_DTYPE_F32, sa, 2, A);
    tu_add(&fused, "model.layers.0.mlp.shared_experts.gate_up_proj.lora_B.weight", LS_DTYPE_F32, sgu, 2, Bgu);
    tu_add(&sep, "model.layers.0.mlp.shared_experts.gate_proj.lora_A.weight", LS_DTYPE_F32, sa, 2, A);
    tu_add(&sep, "model.layers.0.mlp.shared_experts.gate_proj.lora_B.weight", LS_DTYPE_F32, sg, 2, Bg);
    tu_add(&sep, "model.layers.0.mlp.shared_experts.up_proj.lora_A.weight", LS_DTYPE_F32, sa, 2, A);
    tu_add(&sep, "model.layers.0.mlp.shared_experts.up_proj.lora_B.weight", LS_DTYPE_F32, sg, 2, Bu);
    for (int k = 0; k < 2; k++) {
        ls_tensor_set *s = k ? &sep : &fused;
        tu_add(s, "model.layers.0.mlp.shared_experts.down_proj.lora_A.weight", LS_DTYPE_F32, sda, 2, Ad);
        tu_add(s, "model.layers.0.mlp.shared_experts.down_proj.lora_B.weight", LS_DTYPE_F32, sdb, 2, Bd);
    }
    ls_adapter_params p = {.has_alpha = true, .lora_alpha = 6};
    ls_adapter a1, a2, a3;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_adapter_normalise(&fused, &p, &d, &pool, &a1, &err), LS_OK);
    assert_int_equal(ls_adapter_normalise(&sep, &p, &d, &pool, &a2, &err), LS_OK);
    assert_string_equal(a1.meta.sha256, a2.meta.sha256);
    /* The pool form: the compact factors of layer 0 as the four buffers. */
    ls_tensor_set pf;
    ls_tensor_set_init(&pf);
    const ls_factor_layout lay = ls_factor_layout_of(&d, 1, r);
    const char *bufs[4] = {"gate_up_lora_a", "gate_up_lora_b", "down_lora_a", "down_lora_b"};
    const int64_t shapes[4][4] = {{1, 1, 2 * r, HH}, {1, NE, 2 * FF, r}, {1, NE, r, FF}, {1, 1, HH, r}};
    for (int k = 0; k < 4; k++) {
        char name[128];
        snprintf(name, sizeof name, "model.layers.0.mlp.shared_experts.%s", bufs[k]);
        tu_add(&pf, name, LS_DTYPE_F32, shapes[k], 4, a1.data + lay.off[k]);
    }
    assert_int_equal(ls_adapter_normalise(&pf, &tu_scale1, &d, &pool, &a3, &err), LS_OK);
    assert_string_equal(a1.meta.sha256, a3.meta.sha256);
    ls_adapter_free(&a1);
    ls_adapter_free(&a2);
    ls_adapter_free(&a3);
    ls_error_free(&err);
    ls_tensor_set_free(&fused);
    ls_tensor_set_free(&sep);
    ls_tensor_set_free(&pf);
}

/* Each of configs (adapter_config.json texts) loads s. */
static void expect_configs_load(const ls_tensor_set *s, const ls_dims *d, const ls_pool_dims *pool,
                                const char *const *configs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        ls_adapter_params p;
        ls_adapter a;
        ls_error err;
        ls_error_init(&err);
        assert_int_equal(parse_config(configs[i], &p, &err), LS_OK);
        ls_status st = ls_adapter_normalise(s, &p, d, pool, &a, &err);
        if (st != LS_OK) tu_dump(&err);
        assert_int_equal(st, LS_OK);
        ls_adapter_free(&a);
        ls_error_free(&err);
    }
}

/* Factors of gate on layers 0 and 2, with a config and its error. */
typedef struct {
    ls_tensor_set s;
    fx_mod g0, g2;
    ls_dims d;
    ls_pool_dims pool;
    ls_adapter_params p;
    ls_error err;
} gates2;

static void gates2_init(gates2 *f) {
    ls_tensor_set_init(&f->s);
    f->g0 = fx_make(&f->s, GATE, 0, 2, HH, NE * FF);
    f->g2 = fx_make(&f->s, GATE, 2, 2, HH, NE * FF);
    f->d = fx_dims();
    f->pool = tu_pool(RR, LS_LORA_SHARED);
    ls_error_init(&f->err);
}

static void gates2_free(gates2 *f) {
    ls_error_free(&f->err);
    fx_free(&f->g0), fx_free(&f->g2);
    ls_tensor_set_free(&f->s);
}

/* layers_to_transform: factors of a layer it leaves out contradict the
 * config (PEFT would neither create nor load them); with layers_pattern
 * the index is read after that name; full names in target_modules pass. */
static void test_layers_to_transform(void **state) {
    (void)state;
    gates2 f;
    gates2_init(&f);
    const char *ok[] = {
        "{\"r\": 2, \"lora_alpha\": 2, \"target_modules\": [\"gate_proj\"], \"layers_to_transform\": [0, 2]}",
        "{\"r\": 2, \"lora_alpha\": 2, \"target_modules\": [\"gate_proj\"], \"layers_to_transform\": [2, 0], "
        "\"layers_pattern\": \"layers\"}",
        "{\"r\": 2, \"lora_alpha\": 2, \"target_modules\": [\"gate_proj\", \"model.layers.2.mlp.shared_experts."
        "gate_proj\"], \"layers_to_transform\": 0}",
        "{\"r\": 2, \"lora_alpha\": 2, \"target_modules\": [\"gate_proj\"], \"layers_to_transform\": []}",
    };
    expect_configs_load(&f.s, &f.d, &f.pool, ok, sizeof ok / sizeof *ok);
    assert_int_equal(parse_config("{\"r\": 2, \"lora_alpha\": 2, \"target_modules\": [\"gate_proj\"], "
                                  "\"layers_to_transform\": [0, 1]}",
                                  &f.p, &f.err),
                     LS_OK);
    tu_expect_fail(&f.s, &f.p, &f.d, &f.pool, LS_ADAPTER_CONFIG_INVALID, &f.err);
    const ls_violation *v = tu_expect(&f.err, LS_ADAPTER_CONFIG_INVALID, 2,
                                      "model.layers.2.mlp.shared_experts.gate_proj.lora_A.weight", LS_NA, LS_NA, 2);
    assert_non_null(strstr(v->message, "[0, 1]"));
    assert_int_equal(f.err.n_violations, 1);
    ls_error_clear(&f.err);
    assert_int_equal(parse_config("{\"r\": 2, \"lora_alpha\": 2, \"target_modules\": [\"gate_proj\"], "
                                  "\"layers_to_transform\": [0, 2], \"layers_pattern\": [\"h\", \"blocks\"]}",
                                  &f.p, &f.err),
                     LS_OK);
    tu_expect_fail(&f.s, &f.p, &f.d, &f.pool, LS_ADAPTER_CONFIG_INVALID, &f.err);
    assert_int_equal(tu_count(&f.err, LS_ADAPTER_CONFIG_INVALID), 2);
    gates2_free(&f);
}

/* target_modules and exclude_modules, read as PEFT's
 * check_target_module_exists reads them: factors of a module they leave
 * out loaded and were applied, where PEFT creates no LoRA layer there
 * and drops them (a hand-edited or merged config). They are refused now,
 * as layers_to_transform's are; what cannot be evaluated exactly
 * ("all-linear", a look-ahead) checks nothing, as before. */
static void test_target_and_exclude_modules(void **state) {
    (void)state;
    gates2 f;
    gates2_init(&f);
#define CFG(rest) "{\"r\": 2, \"lora_alpha\": 2, " rest "}"
    const char *ok[] = {
        CFG("\"target_modules\": [\"gate_proj\", \"q_proj\"]"),
        CFG("\"target_modules\": [\"model.layers.0.mlp.shared_experts.gate_proj\", "
            "\"model.layers.2.mlp.shared_experts.gate_proj\"]"),
        CFG("\"target_modules\": \".*shared_experts\\\\.(gate|up)_proj\""),
        CFG("\"target_modules\": \"all-linear\""),
        CFG("\"target_modules\": \"ALL-LINEAR\""), /* PEFT lowercases it */
        CFG("\"target_modules\": \"(?=model).*gate_proj\""),
        CFG("\"target_modules\": null, \"exclude_modules\": []"),
        CFG("\"target_modules\": [\"gate_proj\"], \"exclude_modules\": [\"up_proj\", \"layers.2.mlp\"]"),
        CFG("\"exclude_modules\": \".*layers\\\\.1\\\\..*\""),
    };
    expect_configs_load(&f.s, &f.d, &f.pool, ok, sizeof ok / sizeof *ok);
    const struct {
        const char *config, *says;
        int layers; /* bit l: layer l's factor refused */
    } refused[] = {
        {CFG("\"target_modules\": [\"q_proj\", \"v_proj\"]"), "target_modules does not name", 5},
        {CFG("\"target_modules\": [\"up_proj\", \"model.layers.0.mlp.shared_experts.gate_proj\"]"),
         "target_modules does not name", 4},
        /* re.fullmatch, not re.match: a prefix of the name is no match. */
        {CFG("\"target_modules\": \"model\\\\.layers\\\\.0\""), "target_modules does not name", 5},
        {CFG("\"target_modules\": \"model\\\\.layers\\\\.0\\\\..*\""), "target_modules does not name", 4},
        {CFG("\"exclude_modules\": \".*layers\\\\.2\\\\..*\""), "exclude_modules names", 4},
        {CFG("\"target_modules\": [\"gate_proj\"], \"exclude_modules\": [\"gate_proj\"]"), "exclude_modules names",
         5},
    };
#undef CFG
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        ls_error_clear(&f.err);
        assert_int_equal(parse_config(refused[i].config, &f.p, &f.err), LS_OK);
        tu_expect_fail(&f.s, &f.p, &f.d, &f.pool, LS_ADAPTER_CONFIG_INVALID, &f.err);
        for (int l = 0; l <= 2; l += 2) {
            if (!(refused[i].layers & (1 << l))) continue;
            char name[96];
            snprintf(name, sizeof name, "model.layers.%d.mlp.shared_experts.gate_proj.lora_A.weight", l);
            const ls_violation *v = tu_expect(&f.err, LS_ADAPTER_CONFIG_INVALID, l, name, LS_NA, LS_NA, LS_NA);
            assert_non_null(strstr(v->message, refused[i].says));
            assert_non_null(strstr(v->message, "PEFT would neither create nor load it"));
        }
        assert_int_equal(f.err.n_violations, __builtin_popcount((unsigned)refused[i].layers));
    }
    gates2_free(&f);
}

/* A config whose kept rules come near 8 KiB: other modules' parameters
 * in target_parameters (which only quiet a warning) are dropped before
 * the exclude_modules scope, which still refuses what it names. */
static void test_long_rules_keep_their_scopes(void **state) {
    (void)state;
    gates2 f;
    gates2_init(&f);
    char *cfg = malloc(16384);
    assert_non_null(cfg);
    size_t n = (size_t)snprintf(cfg, 16384, "{\"r\": 2, \"lora_alpha\": 2, \"rank_pattern\": {");
    for (int l = 0; l < 145; l++)
        n += (size_t)snprintf(cfg + n, 16384 - n, "%s\"model.layers.%d.mlp.shared_experts.gate_proj\": 2", l ? ", " : "",
                              l);
    n += (size_t)snprintf(cfg + n, 16384 - n, "}, \"exclude_modules\": \".*layers\\\\.2\\\\..*\", \"target_parameters\": [");
    for (int k = 0; k < 40; k++)
        n += (size_t)snprintf(cfg + n, 16384 - n, "%s\"mlp.experts.fused_%d_gate_up_proj\"", k ? ", " : "", k);
    snprintf(cfg + n, 16384 - n, "]}");
    assert_int_equal(parse_config(cfg, &f.p, &f.err), LS_OK);
    assert_true(strlen(f.p.peft) > 7000); /* the rank_pattern keys were kept */
    tu_expect_fail(&f.s, &f.p, &f.d, &f.pool, LS_ADAPTER_CONFIG_INVALID, &f.err);
    const ls_violation *v = tu_expect(&f.err, LS_ADAPTER_CONFIG_INVALID, 2,
                                      "model.layers.2.mlp.shared_experts.gate_proj.lora_A.weight", LS_NA, LS_NA, LS_NA);
    assert_non_null(strstr(v->message, "exclude_modules names"));
    free(cfg);
    gates2_free(&f);
}

/* A pattern key that matches none of the modules the upload has factors
 * of is warned of; one that matches a module whose factors are skipped
 * here (a dense layer's down_proj, which PEFT applies) is not, nor one
 * for a skipped parameter that target_parameters names (PEFT's own
 * conversion for Qwen3-Next's routed experts writes ".*\\.gate_up_proj"
 * and puts their factors on "mlp.experts" and "mlp.experts.base_layer"). */
static void test_unmatched_pattern_key(void **state) {
    (void)state;
    gates2 f;
    gates2_init(&f);
    fx_mod dense = fx_make(&f.s, "model.layers.%d.mlp.down_proj.%s.weight", 1, 2, NE * FF, HH);
    fx_mod routed = fx_make(&f.s, "model.layers.%d.mlp.experts.base_layer.%s.weight", 0, 2, HH, 2 * FF);
    const char *configs[] = {
        "{\"r\": 2, \"lora_alpha\": 2, \"alpha_pattern\": {\"layers.1.mlp.down_proj\": 4}}",
        "{\"r\": 2, \"lora_alpha\": 2, \"alpha_pattern\": {\"layers.1.mlp.up_proj\": 4}}",
        "{\"r\": 2, \"lora_alpha\": 2, \"target_parameters\": [\"gate_up_proj\", \"down_proj\"], "
        "\"rank_pattern\": {\".*\\\\.gate_up_proj\": 4}, \"alpha_pattern\": {\".*\\\\.gate_up_proj\": 4}}",
        "{\"r\": 2, \"lora_alpha\": 2, \"target_parameters\": [\"gate_up_proj\"], "
        "\"alpha_pattern\": {\"layers.5.mlp.experts.gate_up_proj\": 4}}", /* no layer 5 */
    };
    for (int i = 0; i < 4; i++) {
        ls_adapter a;
        ls_error_clear(&f.err);
        assert_int_equal(parse_config(configs[i], &f.p, &f.err), LS_OK);
        assert_int_equal(ls_adapter_normalise(&f.s, &f.p, &f.d, &f.pool, &a, &f.err), LS_OK);
        const char *w = a.warnings[LS_WARN_UNMATCHED_KEY];
        if (i % 2 == 0) assert_string_equal(w, "");
        else assert_non_null(strstr(w, "alpha_pattern key 1 of adapter_config.json matches none of the modules"));
        ls_adapter_free(&a);
    }
    fx_free(&dense), fx_free(&routed);
    gates2_free(&f);
}

/* A skipped factor's module name, cut to fit a warning, never ends
 * inside a character: the warning goes into JSON replies and the state
 * record (a cut 'é' made json_string fail, dropping the warning, and
 * failed a load under --state-dir). */
static void test_cut_names_stay_utf8(void **state) {
    (void)state;
    for (int shift = 0; shift < 2; shift++) {
        gates2 f;
        gates2_init(&f);
        /* 70 of them: past the warning's 160 bytes, within the fixture's
         * names; one of the two alignments cuts inside a character. */
        char fmt[400] = "base_model.model.model.layers.%d.mlp.";
        if (shift) strcat(fmt, "x");
        for (int i = 0; i < 70; i++) strcat(fmt, "\xc3\xa9");
        strcat(fmt, ".%s.weight");
        fx_mod dense = fx_make(&f.s, fmt, 1, 2, NE * FF, HH);
        ls_adapter a;
        assert_int_equal(parse_config("{\"r\": 2, \"lora_alpha\": 2}", &f.p, &f.err), LS_OK);
        assert_int_equal(ls_adapter_normalise(&f.s, &f.p, &f.d, &f.pool, &a, &f.err), LS_OK);
        const char *w = a.warnings[LS_WARN_SKIPPED_MLP];
        assert_true(w[0] != '\0');
        json_t *j = json_string(w); /* NULL for text that is not UTF-8 */
        assert_non_null(j);
        json_decref(j);
        ls_adapter_free(&a);
        fx_free(&dense);
        gates2_free(&f);
    }
}

/* Both forms of gate in one layer would add the delta twice. */
static void test_fused_and_separate_in_one_layer(void **state) {
    (void)state;
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    fx_mod gu = fx_make(&s, "model.layers.%d.mlp.shared_experts.gate_up_proj.%s.weight", 0, 2, HH, NE * 2 * FF);
    fx_mod g = fx_make(&s, GATE, 0, 2, HH, NE * FF);
    ls_dims d = fx_dims();
    ls_pool_dims pool = tu_pool(RR, LS_LORA_SHARED);
    ls_error err;
    ls_error_init(&err);
    tu_expect_fail(&s, &tu_scale1, &d, &pool, LS_LORA_UNKNOWN_TENSOR, &err);
    tu_expect(&err, LS_LORA_UNKNOWN_TENSOR, 0, "model.layers.0.mlp.shared_experts.gate_proj.lora_A.weight", LS_NA,
              LS_NA, LS_NA);
    assert_int_equal(err.n_violations, 1);
    ls_error_free(&err);
    fx_free(&gu), fx_free(&g);
    ls_tensor_set_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unequal_ranks_and_scales), cmocka_unit_test(test_unequal_ranks_need_rank_pattern),
        cmocka_unit_test(test_family_names),             cmocka_unit_test(test_one_digest_three_forms),
        cmocka_unit_test(test_layers_to_transform),      cmocka_unit_test(test_target_and_exclude_modules),
        cmocka_unit_test(test_fused_and_separate_in_one_layer), cmocka_unit_test(test_unmatched_pattern_key),
        cmocka_unit_test(test_cut_names_stay_utf8),    cmocka_unit_test(test_long_rules_keep_their_scopes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
