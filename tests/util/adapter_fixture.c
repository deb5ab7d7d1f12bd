/* The adapter tests' fixtures, compiled once: tensor sets from
 * tests/data/tiny.json or a fill pattern, in PEFT or pool format, and
 * assertions on the violations an upload produces. */
#include "tests/util/adapter_fixture.h"

/* The tiny example's dimensions: n=2, H=4, F=3, one layer, R=4. */
ls_dims tu_tiny_dims(int layers) {
    ls_dims d = {.n = 2, .H = 4, .F = 3, .L = layers, .w13_layout = LS_W13_INTERLEAVED};
    return d;
}
ls_pool_dims tu_pool(int max_rank, ls_lora_layout layout) {
    ls_pool_dims p = {.slots = 4, .max_rank = max_rank, .layout = layout, .max_tokens = 64};
    return p;
}

json_t *tu_load_tiny(void) {
    json_error_t jerr;
    json_t *j = json_load_file(LS_TEST_DATA "/tiny.json", 0, &jerr);
    if (!j) fail_msg("cannot read tiny.json: %s", jerr.text);
    return j;
}

/* Flattens nested arrays of numbers into *out (malloc'd); returns count. */
static size_t tu_flatten_into(const json_t *v, float *out, size_t at) {
    if (json_is_array(v)) {
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e) at = tu_flatten_into(e, out, at);
        return at;
    }
    if (out) out[at] = (float)json_number_value(v);
    return at + 1;
}
float *tu_flatten(const json_t *v, size_t *count) {
    size_t n = tu_flatten_into(v, NULL, 0);
    float *out = malloc((n ? n : 1) * sizeof *out);
    assert_non_null(out);
    tu_flatten_into(v, out, 0);
    if (count) *count = n;
    return out;
}

/* Adds an owned tensor of dtype dt holding vals (fp32) converted. */
void tu_add(ls_tensor_set *s, const char *name, ls_dtype dt, const int64_t *shape, int ndim, const float *vals) {
    ls_tensor t = {.dtype = dt, .ndim = ndim, .owned = true};
    memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    int64_t numel = ls_shape_numel(shape, ndim);
    assert_true(numel >= 0);
    t.nbytes = (size_t)numel * ls_dtype_size(dt);
    t.data = calloc(t.nbytes ? t.nbytes : 1, 1);
    assert_non_null(t.data);
    if (ls_dtype_is_float(dt)) assert_true(ls_convert_from_f32(dt, vals, (size_t)numel, t.data));
    assert_true(ls_tensor_set_add(s, name, &t));
}

/* A deterministic value pattern exact in bf16: multiples of 1/16. */
static float tu_pattern(size_t i, int salt) { return (float)((int)((i * 7 + (size_t)salt * 3) % 9) - 4) / 16.0f; }

void tu_add_pattern(ls_tensor_set *s, const char *name, ls_dtype dt, const int64_t *shape, int ndim, int salt) {
    int64_t numel = ls_shape_numel(shape, ndim);
    float *v = malloc((size_t)(numel > 0 ? numel : 1) * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < numel; i++) v[i] = tu_pattern((size_t)i, salt);
    tu_add(s, name, dt, shape, ndim, v);
    free(v);
}

const char *tu_name(char *buf, size_t len, const char *prefix, const char *fmt, int layer) {
    int off = snprintf(buf, len, "%s", prefix ? prefix : "");
    assert_true(off >= 0 && (size_t)off < len);
    snprintf(buf + off, len - (size_t)off, fmt, layer);
    return buf;
}

/* A valid PEFT layer of rank r for dims d; skip bit k leaves out factor k
 * (0 gate_up A, 1 gate_up B, 2 down A, 3 down B). */
void tu_add_peft_layer(ls_tensor_set *s, const char *prefix, const ls_dims *d, int l, int r, unsigned skip) {
    char name[192];
    const int64_t gua[2] = {r, d->H}, gub[2] = {(int64_t)d->n * 2 * d->F, r};
    const int64_t da[2] = {r, (int64_t)d->n * d->F}, db[2] = {d->H, r};
    if (!(skip & 1)) tu_add_pattern(s, tu_name(name, sizeof name, prefix, TU_GU_A, l), LS_DTYPE_F32, gua, 2, l * 4);
    if (!(skip & 2)) tu_add_pattern(s, tu_name(name, sizeof name, prefix, TU_GU_B, l), LS_DTYPE_F32, gub, 2, l * 4 + 1);
    if (!(skip & 4)) tu_add_pattern(s, tu_name(name, sizeof name, prefix, TU_D_A, l), LS_DTYPE_F32, da, 2, l * 4 + 2);
    if (!(skip & 8)) tu_add_pattern(s, tu_name(name, sizeof name, prefix, TU_D_B, l), LS_DTYPE_F32, db, 2, l * 4 + 3);
}

/* A valid pool-format layer: O' outer blocks, rank r. */
void tu_add_pool_layer(ls_tensor_set *s, const ls_dims *d, int l, int outer, int r, unsigned skip) {
    char name[192];
    const int64_t ga[4] = {1, outer, 2 * r, d->H}, gb[4] = {1, d->n, 2 * d->F, r};
    const int64_t da[4] = {1, d->n, r, d->F}, db[4] = {1, outer, d->H, r};
    if (!(skip & 1))
        tu_add_pattern(s, tu_name(name, sizeof name, "", TU_SHARED "gate_up_lora_a", l), LS_DTYPE_F32, ga, 4, l);
    if (!(skip & 2))
        tu_add_pattern(s, tu_name(name, sizeof name, "", TU_SHARED "gate_up_lora_b", l), LS_DTYPE_F32, gb, 4, l + 1);
    if (!(skip & 4))
        tu_add_pattern(s, tu_name(name, sizeof name, "", TU_SHARED "down_lora_a", l), LS_DTYPE_F32, da, 4, l + 2);
    if (!(skip & 8))
        tu_add_pattern(s, tu_name(name, sizeof name, "", TU_SHARED "down_lora_b", l), LS_DTYPE_F32, db, 4, l + 3);
}

/* Replaces the tensor called name (shape and values) in place. */
void tu_replace(ls_tensor_set *s, const char *name, ls_dtype dt, const int64_t *shape, int ndim) {
    for (size_t i = 0; i < s->n; i++) {
        if (strcmp(s->items[i].name, name)) continue;
        ls_tensor_free(&s->items[i].t);
        ls_tensor_set tmp;
        ls_tensor_set_init(&tmp);
        tu_add_pattern(&tmp, name, dt, shape, ndim, 5);
        s->items[i].t = tmp.items[0].t;
        tmp.items[0].t.owned = false;
        ls_tensor_set_free(&tmp);
        return;
    }
    fail_msg("no tensor %s", name);
}

/* Drops the tensor called name from the set. */
void tu_remove(ls_tensor_set *s, const char *name) {
    for (size_t i = 0; i < s->n; i++) {
        if (strcmp(s->items[i].name, name)) continue;
        free(s->items[i].name);
        ls_tensor_free(&s->items[i].t);
        memmove(&s->items[i], &s->items[i + 1], (s->n - i - 1) * sizeof s->items[0]);
        s->n--;
        return;
    }
    fail_msg("no tensor %s", name);
}

float *tu_f32_data(ls_tensor_set *s, const char *name) {
    const ls_tensor *t = ls_tensor_set_find(s, name);
    assert_non_null(t);
    assert_int_equal(t->dtype, LS_DTYPE_F32);
    return t->data;
}

void tu_dump(const ls_error *e) {
    for (size_t i = 0; i < e->n_violations; i++) {
        const ls_violation *v = &e->violations[i];
        print_message("  [%s] layer %d tensor '%s' axis %d expected %lld got %lld: %s | hint: %s\n",
                      ls_status_code(v->code), v->layer, v->tensor, v->axis, (long long)v->expected, (long long)v->got,
                      v->message, v->hint);
    }
}

/* Number of violations with this code. */
size_t tu_count(const ls_error *e, ls_status code) {
    size_t n = 0;
    for (size_t i = 0; i < e->n_violations; i++) n += e->violations[i].code == code;
    return n;
}

/* The violation with this code and tensor (NULL: any tensor); fails the
 * test (after printing every violation) when there is none. */
const ls_violation *tu_find(const ls_error *e, ls_status code, const char *tensor) {
    for (size_t i = 0; i < e->n_violations; i++) {
        const ls_violation *v = &e->violations[i];
        if (v->code == code && (!tensor || !strcmp(v->tensor, tensor))) return v;
    }
    tu_dump(e);
    fail_msg("no %s violation for %s", ls_status_code(code), tensor ? tensor : "(any)");
    return NULL;
}

/* Asserts one violation's fields, and that it carries a hint. */
const ls_violation *tu_expect(const ls_error *e, ls_status code, int layer, const char *tensor, int axis,
                              int64_t expected, int64_t got) {
    const ls_violation *v = tu_find(e, code, tensor);
    if (v->layer != layer || v->axis != axis || v->expected != expected || v->got != got) tu_dump(e);
    assert_int_equal(v->layer, layer);
    assert_int_equal(v->axis, axis);
    assert_int_equal(v->expected, expected);
    assert_int_equal(v->got, got);
    assert_true(strlen(v->hint) > 0);
    assert_true(strlen(v->message) > 0);
    return v;
}

const ls_adapter_params tu_scale1 = {.has_scale = true, .scale = 1.0};

/* Asserts that out is all zero bytes (what a failed normalise leaves). */
static void tu_assert_zeroed(const ls_adapter *a) {
    const unsigned char *p = (const unsigned char *)a;
    for (size_t i = 0; i < sizeof *a; i++) assert_int_equal(p[i], 0);
}

/* Normalises s expecting failure with top-level code want; out must come
 * back zeroed. The caller frees err. */
void tu_expect_fail(const ls_tensor_set *s, const ls_adapter_params *p, const ls_dims *d, const ls_pool_dims *pool,
                    ls_status want, ls_error *err) {
    ls_adapter a;
    memset(&a, 0x5a, sizeof a);
    ls_status st = ls_adapter_normalise(s, p, d, pool, &a, err);
    if (st != want) tu_dump(err);
    assert_int_equal(st, want);
    assert_int_equal(err->code, want);
    assert_true(err->n_violations >= 1);
    tu_assert_zeroed(&a);
}

int tu_fx_setup(void **state) {
    tu_fx *f = calloc(1, sizeof *f);
    if (!f) return -1;
    f->d = tu_tiny_dims(2);
    f->p = tu_pool(4, LS_LORA_SHARED);
    ls_tensor_set_init(&f->s);
    ls_error_init(&f->err);
    *state = f;
    return 0;
}

int tu_fx_teardown(void **state) {
    tu_fx *f = *state;
    ls_tensor_set_free(&f->s);
    ls_error_free(&f->err);
    free(f);
    return 0;
}
