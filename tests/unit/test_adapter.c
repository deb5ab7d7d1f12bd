/* Adapter normalisation on valid uploads: the tiny.json adapter expanded
 * into a slot equals its "pool" buffers, from PEFT and pool format, f32,
 * bf16 and f16, with and without the name prefix; scales, broadcasting
 * into per-expert pools, absent layers and modules, ignored factors. */
#include <math.h>

#include "lora/adapter_config.h"
#include "common/sha256.h"
#include "tests/util/adapter_fixture.h"

/* The tiny adapter as a tensor set with names prefixed by prefix (NULL:
 * none) and values in dtype dt; p receives its config. */
static void tiny_peft(ls_tensor_set *s, const char *prefix, ls_dtype dt, ls_adapter_params *p) {
    json_t *j = tu_load_tiny();
    const json_t *ad = json_object_get(j, "adapter"), *tensors = json_object_get(ad, "tensors");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)tensors, key, v) {
        int64_t shape[2] = {(int64_t)json_array_size(v), (int64_t)json_array_size(json_array_get(v, 0))};
        float *vals = tu_flatten(v, NULL);
        char name[256];
        snprintf(name, sizeof name, "%s%s", prefix ? prefix : "", key);
        tu_add(s, name, dt, shape, 2, vals);
        free(vals);
    }
    if (p) {
        ls_error err;
        ls_error_init(&err);
        memset(p, 0, sizeof *p);
        assert_int_equal(ls_adapter_config_parse(json_object_get(ad, "config"), true, p, &err), LS_OK);
        ls_error_free(&err);
    }
    json_decref(j);
}

typedef struct {
    float *gu_a, *gu_b, *d_a, *d_b;
} slot_bufs;

static void bufs_alloc(slot_bufs *b, const ls_dims *d, const ls_pool_dims *p) {
    /* Filled with garbage so a value expand forgets to write shows up. */
    size_t len[4] = {ls_pool_gu_a_len(d, p), ls_pool_gu_b_len(d, p), ls_pool_d_a_len(d, p), ls_pool_d_b_len(d, p)};
    float **dst[4] = {&b->gu_a, &b->gu_b, &b->d_a, &b->d_b};
    for (int k = 0; k < 4; k++) {
        *dst[k] = malloc(len[k] * sizeof(float));
        assert_non_null(*dst[k]);
        for (size_t i = 0; i < len[k]; i++) (*dst[k])[i] = 12345.0f;
    }
}
static void bufs_free(slot_bufs *b) {
    free(b->gu_a);
    free(b->gu_b);
    free(b->d_a);
    free(b->d_b);
}

static void assert_floats(const float *got, const float *want, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) fail_msg("%s[%zu] = %.9g, expected %.9g", what, i, (double)got[i], (double)want[i]);
}

static void assert_zero(const float *got, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != 0.0f) fail_msg("%s[%zu] = %.9g, expected 0", what, i, (double)got[i]);
}

/* Expands layer of a and compares with tiny.json's "pool" buffers. */
static void assert_tiny_pool(const ls_adapter *a, int layer, const ls_dims *d, const ls_pool_dims *p) {
    json_t *j = tu_load_tiny();
    const json_t *pool = json_object_get(j, "pool");
    slot_bufs b;
    bufs_alloc(&b, d, p);
    ls_adapter_expand(a, layer, d, p, b.gu_a, b.gu_b, b.d_a, b.d_b);
    const char *names[4] = {"gate_up_lora_a", "gate_up_lora_b", "down_lora_a", "down_lora_b"};
    const float *got[4] = {b.gu_a, b.gu_b, b.d_a, b.d_b};
    const size_t len[4] = {ls_pool_gu_a_len(d, p), ls_pool_gu_b_len(d, p), ls_pool_d_a_len(d, p),
                           ls_pool_d_b_len(d, p)};
    for (int k = 0; k < 4; k++) {
        size_t n;
        float *want = tu_flatten(json_object_get(pool, names[k]), &n);
        assert_int_equal(n, len[k]);
        assert_floats(got[k], want, n, names[k]);
        free(want);
    }
    bufs_free(&b);
    json_decref(j);
}

static void test_tiny_peft(void **state) {
    (void)state;
    ls_dims d = tu_tiny_dims(1);
    ls_pool_dims p = tu_pool(4, LS_LORA_SHARED);
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    ls_adapter_params prm;
    tiny_peft(&s, NULL, LS_DTYPE_F32, &prm);
    assert_int_equal(prm.r, 2);
    assert_true(prm.has_alpha);

    ls_adapter a;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_adapter_normalise(&s, &prm, &d, &p, &a, &err), LS_OK);
    assert_int_equal(err.n_violations, 0);
    assert_int_equal(a.meta.format, LS_ADAPTER_FORMAT_PEFT);
    assert_int_equal(a.meta.rank, 2);
    assert_int_equal(a.meta.outer, 1);
    assert_int_equal(a.layers, 1);
    assert_true(a.meta.scale == 2.0);
    assert_true(a.layer_present[0]);
    assert_int_equal(a.meta.n_ignored, 0);
    /* compact layout at r = 2: [1,4,4] + [2,6,2] + [2,2,3] + [1,4,2] */
    assert_int_equal(a.layer_floats, 16 + 24 + 12 + 8);
    assert_true(a.meta.bytes >= a.layer_floats * sizeof(float));
    char hex[65];
    ls_sha256_hex(a.data, a.layer_floats * sizeof(float), hex); /* the host is little-endian */
    assert_string_equal(a.meta.sha256, hex);
    assert_tiny_pool(&a, 0, &d, &p);

    ls_adapter_free(&a);
    ls_adapter_free(&a); /* idempotent */
    ls_error_free(&err);
    ls_tensor_set_free(&s);
}

/* The test's own conversion of the tiny PEFT factors into pool format
 * (one slot, O' = outer), scaled by s_in. */
static void tiny_to_pool(ls_tensor_set *out, ls_dtype dt, int outer, double s_in) {
    ls_tensor_set peft;
    ls_tensor_set_init(&peft);
    tiny_peft(&peft, NULL, LS_DTYPE_F32, NULL);
    const int n = 2, H = 4, F = 3, r = 2;
    char name[192];
    const float *A = tu_f32_data(&peft, "model.layers.0.mlp.shared_experts.gate_up_proj.lora_A.weight");
    const float *B = tu_f32_data(&peft, "model.layers.0.mlp.shared_experts.gate_up_proj.lora_B.weight");
    const float *Ad = tu_f32_data(&peft, "model.layers.0.mlp.shared_experts.down_proj.lora_A.weight");
    const float *Bd = tu_f32_data(&peft, "model.layers.0.mlp.shared_experts.down_proj.lora_B.weight");
    float ga[2 * 2 * 2 * 4], gb[2 * 6 * 2], da[2 * 2 * 3], db[2 * 4 * 2];
    for (int o = 0; o < outer; o++)
        for (int k = 0; k < 2 * r; k++)
            for (int h = 0; h < H; h++) ga[(o * 2 * r + k) * H + h] = A[(k % r) * H + h];
    for (int e = 0; e < n; e++)
        for (int i = 0; i < 2 * F; i++)
            for (int k = 0; k < r; k++) gb[(e * 2 * F + i) * r + k] = (float)(s_in * B[(e * 2 * F + i) * r + k]);
    for (int e = 0; e < n; e++)
        for (int k = 0; k < r; k++)
            for (int j = 0; j < F; j++) da[(e * r + k) * F + j] = Ad[k * n * F + e * F + j];
    for (int o = 0; o < outer; o++)
        for (int h = 0; h < H; h++)
            for (int k = 0; k < r; k++) db[(o * H + h) * r + k] = (float)(s_in * Bd[h * r + k]);
    const int64_t sga[4] = {1, outer, 2 * r, H}, sgb[4] = {1, n, 2 * F, r}, sda[4] = {1, n, r, F},
                  sdb[4] = {1, outer, H, r};
    tu_add(out, tu_name(name, sizeof name, "", TU_SHARED "gate_up_lora_a", 0), dt, sga, 4, ga);
    tu_add(out, tu_name(name, sizeof name, "", TU_SHARED "gate_up_lora_b", 0), dt, sgb, 4, gb);
    tu_add(out, tu_name(name, sizeof name, "", TU_SHARED "down_lora_a", 0), dt, sda, 4, da);
    tu_add(out, tu_name(name, sizeof name, "", TU_SHARED "down_lora_b", 0), dt, sdb, 4, db);
    ls_tensor_set_free(&peft);
}

static void normalise_ok(const ls_tensor_set *s, const ls_adapter_params *prm, const ls_dims *d, const ls_pool_dims *p,
                         ls_adapter *a) {
    ls_error err;
    ls_error_init(&err);
    ls_status st = ls_adapter_normalise(s, prm, d, p, a, &err);
    if (st != LS_OK) tu_dump(&err);
    assert_int_equal(st, LS_OK);
    ls_error_free(&err);
}

static void test_tiny_pool_format(void **state) {
    (void)state;
    ls_dims d = tu_tiny_dims(1);
    ls_pool_dims p = tu_pool(4, LS_LORA_SHARED);
    ls_tensor_set peft;
    ls_tensor_set_init(&peft);
    ls_adapter_params prm;
    tiny_peft(&peft, NULL, LS_DTYPE_F32, &prm);
    ls_adapter ref;
    normalise_ok(&peft, &prm, &d, &p, &ref);

    /* Already scaled, no scale given: taken as is. */
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    tiny_to_pool(&s, LS_DTYPE_F32, 1, 2.0);
    ls_adapter_params none = {0};
    ls_adapter a;
    normalise_ok(&s, &none, &d, &p, &a);
    assert_int_equal(a.meta.format, LS_ADAPTER_FORMAT_POOL);
    assert_int_equal(a.meta.rank, 2);
    assert_int_equal(a.meta.outer, 1);
    assert_tiny_pool(&a, 0, &d, &p);
    assert_string_equal(a.meta.sha256, ref.meta.sha256); /* same normalised factors, same digest */
    ls_adapter_free(&a);
    ls_tensor_set_free(&s);

    /* Unscaled with an explicit scale, declared format pool, bf16. */
    ls_tensor_set_init(&s);
    tiny_to_pool(&s, LS_DTYPE_BF16, 1, 1.0);
    ls_adapter_params scaled = {.format = LS_ADAPTER_FORMAT_POOL, .has_scale = true, .scale = 2.0, .r = 2};
    normalise_ok(&s, &scaled, &d, &p, &a);
    assert_true(a.meta.scale == 2.0);
    assert_tiny_pool(&a, 0, &d, &p);
    assert_string_equal(a.meta.sha256, ref.meta.sha256);
    ls_adapter_free(&a);
    ls_tensor_set_free(&s);

    ls_adapter_free(&ref);
    ls_tensor_set_free(&peft);
}

static void test_tiny_half_dtypes(void **state) {
    (void)state;
    ls_dims d = tu_tiny_dims(1);
    ls_pool_dims p = tu_pool(4, LS_LORA_SHARED);
    const ls_dtype dts[2] = {LS_DTYPE_BF16, LS_DTYPE_F16};
    for (int i = 0; i < 2; i++) {
        ls_tensor_set s;
        ls_tensor_set_init(&s);
        ls_adapter_params prm;
        tiny_peft(&s, NULL, dts[i], &prm);
        ls_adapter a;
        normalise_ok(&s, &prm, &d, &p, &a);
        assert_tiny_pool(&a, 0, &d, &p);
        ls_adapter_free(&a);
        ls_tensor_set_free(&s);
    }
}

static void test_prefix(void **state) {
    (void)state;
    ls_dims d = tu_tiny_dims(1);
    ls_pool_dims p = tu_pool(4, LS_LORA_SHARED);
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    ls_adapter_params prm;
    tiny_peft(&s, "base_model.model.", LS_DTYPE_F32, &prm);
    ls_adapter a;
    normalise_ok(&s, &prm, &d, &p, &a);
    assert_tiny_pool(&a, 0, &d, &p);
    ls_adapter_free(&a);

    /* The prefix is optional per name: half with, half without. */
    for (size_t i = 0; i < s.n; i += 2) {
        char *bare = strdup(s.items[i].name + strlen("base_model.model."));
        assert_non_null(bare);
        free(s.items[i].name);
        s.items[i].name = bare;
    }
    assert_non_null(strstr(s.items[1].name, "base_model.model."));
    assert_null(strstr(s.items[0].name, "base_model.model."));
    normalise_ok(&s, &prm, &d, &p, &a);
    assert_tiny_pool(&a, 0, &d, &p);
    ls_adapter_free(&a);
    ls_tensor_set_free(&s);
}

/* gu_b of the compact layout against the test's own B * scale. */
static void assert_gu_b_scaled(const ls_adapter *a, double scale) {
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    tiny_peft(&s, NULL, LS_DTYPE_F32, NULL);
    const float *B = tu_f32_data(&s, "model.layers.0.mlp.shared_experts.gate_up_proj.lora_B.weight");
    const float *gu_b = a->data + 16; /* after gu_a [1, 4, 4] */
    for (int i = 0; i < 24; i++) assert_float_equal(gu_b[i], scale * B[i], 1e-6);
    const float *Bd = tu_f32_data(&s, "model.layers.0.mlp.shared_experts.down_proj.lora_B.weight");
    const float *d_b = a->data + 16 + 24 + 12;
    for (int i = 0; i < 8; i++) assert_float_equal(d_b[i], scale * Bd[i], 1e-6);
    ls_tensor_set_free(&s);
}

static void test_scales(void **state) {
    (void)state;
    ls_dims d = tu_tiny_dims(1);
    ls_pool_dims p = tu_pool(4, LS_LORA_SHARED);
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    ls_adapter_params prm;
    tiny_peft(&s, NULL, LS_DTYPE_F32, &prm);
    ls_adapter a;

    prm.use_rslora = true; /* 4 / sqrt(2) */
    normalise_ok(&s, &prm, &d, &p, &a);
    assert_float_equal(a.meta.scale, 4.0 / sqrt(2.0), 1e-12);
    assert_gu_b_scaled(&a, 4.0 / sqrt(2.0));
    ls_adapter_free(&a);

    /* No alpha stated anywhere: refused, never a silent scale of 1. */
    prm.has_alpha = false;
    ls_error err;
    ls_error_init(&err);
    memset(&a, 0x5a, sizeof a);
    assert_int_equal(ls_adapter_normalise(&s, &prm, &d, &p, &a, &err), LS_ADAPTER_CONFIG_INVALID);
    assert_non_null(strstr(err.message, "lora_alpha is stated nowhere"));
    assert_non_null(strstr(err.violations[0].hint, "?lora_alpha="));
    ls_error_free(&err);
    ls_error_init(&err);
    assert_int_equal(ls_adapter_normalise(&s, NULL, &d, &p, &a, &err), LS_ADAPTER_CONFIG_INVALID);
    ls_error_free(&err);

    /* A scale given instead of alpha is the scale, rsLoRA or not. */
    prm.has_scale = true, prm.scale = 3.0;
    normalise_ok(&s, &prm, &d, &p, &a);
    assert_true(a.meta.scale == 3.0);
    assert_gu_b_scaled(&a, 3.0);
    ls_adapter_free(&a);

    ls_adapter_params bare = {.has_scale = true, .scale = 1.0}; /* r from the tensors */
    normalise_ok(&s, &bare, &d, &p, &a);
    assert_int_equal(a.meta.rank, 2);
    assert_true(a.meta.scale == 1.0);
    ls_adapter_free(&a);
    ls_tensor_set_free(&s);
}

/* A shared (O' = 1) upload into a per-expert pool: every expert's outer
 * block equals the shared one. */
static void test_per_expert_broadcast(void **state) {
    (void)state;
    ls_dims d = tu_tiny_dims(1);
    ls_pool_dims shared = tu_pool(4, LS_LORA_SHARED), per = tu_pool(4, LS_LORA_PER_EXPERT);
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    ls_adapter_params prm;
    tiny_peft(&s, NULL, LS_DTYPE_F32, &prm);
    ls_adapter a;
    normalise_ok(&s, &prm, &d, &per, &a);
    slot_bufs ref, got;
    bufs_alloc(&ref, &d, &shared);
    bufs_alloc(&got, &d, &per);
    ls_adapter_expand(&a, 0, &d, &shared, ref.gu_a, ref.gu_b, ref.d_a, ref.d_b);
    ls_adapter_expand(&a, 0, &d, &per, got.gu_a, got.gu_b, got.d_a, got.d_b);
    assert_int_equal(ls_pool_gu_a_len(&d, &per), 2 * ls_pool_gu_a_len(&d, &shared));
    for (int o = 0; o < 2; o++) {
        assert_floats(got.gu_a + o * ls_pool_gu_a_len(&d, &shared), ref.gu_a, ls_pool_gu_a_len(&d, &shared), "gu_a");
        assert_floats(got.d_b + o * ls_pool_d_b_len(&d, &shared), ref.d_b, ls_pool_d_b_len(&d, &shared), "d_b");
    }
    assert_floats(got.gu_b, ref.gu_b, ls_pool_gu_b_len(&d, &per), "gu_b");
    assert_floats(got.d_a, ref.d_a, ls_pool_d_a_len(&d, &per), "d_a");
    bufs_free(&ref);
    bufs_free(&got);
    ls_adapter_free(&a);
    ls_tensor_set_free(&s);
}

/* A per-expert (O' = n) pool-format upload into a per-expert pool: each
 * expert keeps its own outer factors, padded r -> R. */
static void test_per_expert_upload(void **state) {
    (void)state;
    ls_dims d = tu_tiny_dims(1);
    ls_pool_dims per = tu_pool(5, LS_LORA_PER_EXPERT);
    const int n = 2, H = 4, F = 3, r = 3, R = 5;
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    tu_add_pool_layer(&s, &d, 0, n, r, 0);
    ls_adapter a;
    normalise_ok(&s, NULL, &d, &per, &a);
    assert_int_equal(a.meta.outer, n);
    assert_int_equal(a.meta.rank, r);
    slot_bufs b;
    bufs_alloc(&b, &d, &per);
    ls_adapter_expand(&a, 0, &d, &per, b.gu_a, b.gu_b, b.d_a, b.d_b);
    const float *ga = tu_f32_data(&s, "model.layers.0.mlp.shared_experts.gate_up_lora_a");
    const float *gb = tu_f32_data(&s, "model.layers.0.mlp.shared_experts.gate_up_lora_b");
    const float *da = tu_f32_data(&s, "model.layers.0.mlp.shared_experts.down_lora_a");
    const float *db = tu_f32_data(&s, "model.layers.0.mlp.shared_experts.down_lora_b");
    for (int o = 0; o < n; o++)
        for (int row = 0; row < 2 * R; row++)
            for (int h = 0; h < H; h++) {
                float want = row < r                   ? ga[(o * 2 * r + row) * H + h]
                             : row >= R && row < R + r ? ga[(o * 2 * r + r + row - R) * H + h]
                                                       : 0.0f;
                assert_true(b.gu_a[(o * 2 * R + row) * H + h] == want);
            }
    for (int e = 0; e < n; e++)
        for (int i = 0; i < 2 * F; i++)
            for (int k = 0; k < R; k++)
                assert_true(b.gu_b[(e * 2 * F + i) * R + k] == (k < r ? gb[(e * 2 * F + i) * r + k] : 0.0f));
    for (int e = 0; e < n; e++)
        for (int k = 0; k < R; k++)
            for (int j = 0; j < F; j++)
                assert_true(b.d_a[(e * R + k) * F + j] == (k < r ? da[(e * r + k) * F + j] : 0.0f));
    for (int o = 0; o < n; o++)
        for (int h = 0; h < H; h++)
            for (int k = 0; k < R; k++)
                assert_true(b.d_b[(o * H + h) * R + k] == (k < r ? db[(o * H + h) * r + k] : 0.0f));
    /* The two experts' blocks differ, so a broadcast would have shown. */
    assert_memory_not_equal(b.gu_a, b.gu_a + 2 * R * H, 2 * R * H * sizeof(float));
    bufs_free(&b);
    ls_adapter_free(&a);
    ls_tensor_set_free(&s);
}

/* Tiny's factors at layer 1 of a 3-layer model: layers 0 and 2 are absent
 * and expand to zeros. */
static void test_absent_layers(void **state) {
    (void)state;
    ls_dims d = tu_tiny_dims(3);
    ls_pool_dims p = tu_pool(4, LS_LORA_SHARED);
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    ls_adapter_params prm;
    tiny_peft(&s, NULL, LS_DTYPE_F32, &prm);
    for (size_t i = 0; i < s.n; i++) s.items[i].name[strlen("model.layers.")] = '1';
    ls_adapter a;
    normalise_ok(&s, &prm, &d, &p, &a);
    assert_false(a.layer_present[0]);
    assert_true(a.layer_present[1]);
    assert_false(a.layer_present[2]);
    assert_tiny_pool(&a, 1, &d, &p);
    slot_bufs b;
    bufs_alloc(&b, &d, &p);
    for (int l = 0; l < 3; l += 2) {
        ls_adapter_expand(&a, l, &d, &p, b.gu_a, b.gu_b, b.d_a, b.d_b);
        assert_zero(b.gu_a, ls_pool_gu_a_len(&d, &p), "gu_a");
        assert_zero(b.gu_b, ls_pool_gu_b_len(&d, &p), "gu_b");
        assert_zero(b.d_a, ls_pool_d_a_len(&d, &p), "d_a");
        assert_zero(b.d_b, ls_pool_d_b_len(&d, &p), "d_b");
    }
    bufs_free(&b);
    ls_adapter_free(&a);
    ls_tensor_set_free(&s);
}

/* Only the gate_up module: its buffers match tiny, the down ones are 0. */
static void test_partial_module(void **state) {
    (void)state;
    ls_dims d = tu_tiny_dims(1);
    ls_pool_dims p = tu_pool(4, LS_LORA_SHARED);
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    ls_adapter_params prm;
    tiny_peft(&s, NULL, LS_DTYPE_F32, &prm);
    tu_remove(&s, "model.layers.0.mlp.shared_experts.down_proj.lora_A.weight");
    tu_remove(&s, "model.layers.0.mlp.shared_experts.down_proj.lora_B.weight");
    ls_adapter a;
    normalise_ok(&s, &prm, &d, &p, &a);
    json_t *j = tu_load_tiny();
    slot_bufs b;
    bufs_alloc(&b, &d, &p);
    ls_adapter_expand(&a, 0, &d, &p, b.gu_a, b.gu_b, b.d_a, b.d_b);
    float *want = tu_flatten(json_object_get(json_object_get(j, "pool"), "gate_up_lora_b"), NULL);
    assert_floats(b.gu_b, want, ls_pool_gu_b_len(&d, &p), "gu_b");
    free(want);
    want = tu_flatten(json_object_get(json_object_get(j, "pool"), "gate_up_lora_a"), NULL);
    assert_floats(b.gu_a, want, ls_pool_gu_a_len(&d, &p), "gu_a");
    free(want);
    assert_zero(b.d_a, ls_pool_d_a_len(&d, &p), "d_a");
    assert_zero(b.d_b, ls_pool_d_b_len(&d, &p), "d_b");
    json_decref(j);
    bufs_free(&b);
    ls_adapter_free(&a);
    ls_tensor_set_free(&s);
}

static const char *const other_modules[] = {
    "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
    "model.layers.0.mlp.experts.3.gate_proj.lora_B.weight",
    "base_model.model.model.embed_tokens.lora_embedding_A",
    "base_model.model.lm_head.lora_B.weight",
    /* What PEFT saves beside factors: modules_to_save, bias="all",
     * trainable_token_indices; none touches the shared experts. */
    "base_model.model.lm_head.weight",
    "base_model.model.model.layers.0.self_attn.k_proj.bias",
    "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta",
    /* modules_to_save copies in a layer keep their parameters' names: the
     * routed experts' fused parameters, DeepSeek's router's bias. */
    "base_model.model.model.layers.0.mlp.experts.gate_up_proj",
    "base_model.model.model.layers.1.mlp.gate.e_score_correction_bias",
};
enum { N_OTHER = sizeof other_modules / sizeof other_modules[0], N_OTHER_LORA = 4 };

static void add_other_modules(ls_tensor_set *s) {
    const int64_t shape[2] = {2, 4};
    for (int i = 0; i < N_OTHER; i++) tu_add_pattern(s, other_modules[i], LS_DTYPE_F32, shape, 2, i);
}

static void test_ignored_and_strict(void **state) {
    (void)state;
    ls_dims d = tu_tiny_dims(1);
    ls_pool_dims p = tu_pool(4, LS_LORA_SHARED);
    ls_tensor_set s;
    ls_tensor_set_init(&s);
    ls_adapter_params prm;
    tiny_peft(&s, NULL, LS_DTYPE_F32, &prm);
    add_other_modules(&s);

    ls_adapter a;
    normalise_ok(&s, &prm, &d, &p, &a);
    assert_int_equal(a.meta.n_ignored, N_OTHER);
    for (int i = 0; i < N_OTHER; i++) assert_string_equal(a.ignored[i], other_modules[i]);
    assert_tiny_pool(&a, 0, &d, &p);
    ls_adapter_free(&a);

    prm.strict = true;
    ls_error err;
    ls_error_init(&err);
    tu_expect_fail(&s, &prm, &d, &p, LS_LORA_UNKNOWN_TENSOR, &err);
    assert_int_equal(err.n_violations, N_OTHER);
    for (int i = 0; i < N_OTHER; i++) {
        const ls_violation *v = tu_expect(&err, LS_LORA_UNKNOWN_TENSOR, LS_NA, other_modules[i], LS_NA, LS_NA, LS_NA);
        assert_non_null(strstr(v->message, "strict"));
        assert_true((strstr(v->message, "not a LoRA factor") == NULL) == (i < N_OTHER_LORA));
    }
    ls_error_free(&err);
    ls_tensor_set_free(&s);
}

static void test_format_names(void **state) {
    (void)state;
    ls_adapter_format f;
    assert_string_equal(ls_adapter_format_name(LS_ADAPTER_FORMAT_PEFT), "peft");
    assert_string_equal(ls_adapter_format_name(LS_ADAPTER_FORMAT_POOL), "pool");
    assert_string_equal(ls_adapter_format_name(LS_ADAPTER_FORMAT_AUTO), "auto");
    const char *names[3] = {"peft", "pool", "auto"};
    for (int i = 0; i < 3; i++) {
        assert_true(ls_adapter_format_parse(names[i], &f));
        assert_string_equal(ls_adapter_format_name(f), names[i]);
    }
    assert_false(ls_adapter_format_parse("PEFTX", &f));
    assert_false(ls_adapter_format_parse("", &f));
    assert_false(ls_adapter_format_parse(NULL, &f));
}

/* Expanding a zeroed (failed or freed) adapter writes zeros, not junk. */
static void test_expand_zeroed(void **state) {
    (void)state;
    ls_dims d = tu_tiny_dims(1);
    ls_pool_dims p = tu_pool(4, LS_LORA_PER_EXPERT);
    ls_adapter a;
    memset(&a, 0, sizeof a);
    slot_bufs b;
    bufs_alloc(&b, &d, &p);
    ls_adapter_expand(&a, 0, &d, &p, b.gu_a, b.gu_b, b.d_a, b.d_b);
    assert_zero(b.gu_a, ls_pool_gu_a_len(&d, &p), "gu_a");
    assert_zero(b.d_b, ls_pool_d_b_len(&d, &p), "d_b");
    bufs_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_peft),
        cmocka_unit_test(test_tiny_pool_format),
        cmocka_unit_test(test_tiny_half_dtypes),
        cmocka_unit_test(test_prefix),
        cmocka_unit_test(test_scales),
        cmocka_unit_test(test_per_expert_broadcast),
        cmocka_unit_test(test_per_expert_upload),
        cmocka_unit_test(test_absent_layers),
        cmocka_unit_test(test_partial_module),
        cmocka_unit_test(test_ignored_and_strict),
        cmocka_unit_test(test_format_names),
        cmocka_unit_test(test_expand_zeroed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
