/* The pool under HTTP traffic: five adapters cycled through three slots
 * give the right forwards (against the tests' fp64 reference) with the
 * evictions counted in /pool; and DELETE / replace racing with forwards
 * never give anything but a 404 for a deleted name or the exact result of
 * the version the response names. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/reference.h"
#include "tests/util/tiny_server.h"

static tiny_server ts;

#define N 2
#define HID 4
#define FF 3
#define R 2
#define P "model.layers.0.mlp.shared_experts."

/* The tiny adapter's factors in the reference's form at scale alpha / r. */
typedef struct {
    double gu_a[2 * R * HID], gu_b[N * 2 * FF * R], d_a[N * R * FF], d_b[HID * R];
    ls_ref_lora lora;
} ref_adapter;

static void ref_adapter_make(ref_adapter *ra, double alpha) {
    const json_t *t = json_object_get(json_object_get(ts.tiny, "adapter"), "tensors");
    long n;
    double *A = ls_test_json_doubles(json_object_get(t, P "gate_up_proj.lora_A.weight"), &n);
    double *B = ls_test_json_doubles(json_object_get(t, P "gate_up_proj.lora_B.weight"), &n);
    double *Ad = ls_test_json_doubles(json_object_get(t, P "down_proj.lora_A.weight"), &n);
    double *Bd = ls_test_json_doubles(json_object_get(t, P "down_proj.lora_B.weight"), &n);
    double s = alpha / R;
    for (int k = 0; k < R; k++)
        for (int h = 0; h < HID; h++) ra->gu_a[k * HID + h] = ra->gu_a[(R + k) * HID + h] = A[k * HID + h];
    for (int i = 0; i < N * 2 * FF * R; i++) ra->gu_b[i] = s * B[i]; /* [n*2F, r] is [n, 2F, r] */
    for (int e = 0; e < N; e++)
        for (int k = 0; k < R; k++)
            for (int j = 0; j < FF; j++) ra->d_a[(e * R + k) * FF + j] = Ad[k * N * FF + e * FF + j];
    for (int i = 0; i < HID * R; i++) ra->d_b[i] = s * Bd[i];
    ra->lora = (ls_ref_lora){.r = R, .outer = 1, .gu_a = ra->gu_a, .gu_b = ra->gu_b, .d_a = ra->d_a, .d_b = ra->d_b};
    free(A), free(B), free(Ad), free(Bd);
}

static json_t *load(const char *name, double alpha, bool replace, long want) {
    json_t *a = tiny_adapter_inline(&ts, name, NULL);
    json_object_set_new(json_object_get(a, "config"), "lora_alpha", json_real(alpha));
    if (replace) json_object_set_new(a, "replace", json_true());
    json_t *r = tiny_post_json(&ts, "/adapters", a, want);
    json_decref(a);
    return r;
}

static json_t *pool_counters(void) {
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "GET", "/pool", NULL, NULL, 0, NULL, &r), 0);
    json_t *j = ls_test_response_json(&r);
    ls_test_response_free(&r);
    json_t *c = json_deep_copy(json_object_get(j, "counters"));
    json_decref(j);
    return c;
}

static void test_five_adapters_three_slots(void **state) {
    (void)state;
    const char *extra[] = {"--slots", "3", NULL};
    assert_true(tiny_server_start(&ts, "interleaved", extra));
    for (int i = 0; i < 5; i++) {
        char name[16];
        snprintf(name, sizeof name, "cyc%d", i);
        json_decref(load(name, 1.0 + i, false, 201));
    }
    long nx, ng, n13, n2;
    double *x = ls_test_json_doubles(json_object_get(ts.tiny, "x"), &nx);
    double *g = ls_test_json_doubles(json_object_get(ts.tiny, "gammas"), &ng);
    double *w13 = ls_test_json_doubles(json_object_get(ts.tiny, "w13_weight"), &n13);
    double *w2 = ls_test_json_doubles(json_object_get(ts.tiny, "w2_weight"), &n2);
    ls_dims d = {.n = N, .H = HID, .F = FF, .L = 1, .w13_layout = LS_W13_INTERLEAVED};
    int T = (int)(nx / HID);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 5; i++) {
            int a = (i * 2 + round) % 5, b = (a + 3) % 5; /* two adapters per request */
            char na[16], nb[16];
            snprintf(na, sizeof na, "cyc%d", a);
            snprintf(nb, sizeof nb, "cyc%d", b);
            json_t *req = json_pack("{s:O, s:O, s:[s, n, s]}", "x", json_object_get(ts.tiny, "x"), "gammas",
                                    json_object_get(ts.tiny, "gammas"), "adapters", na, nb);
            json_t *resp = tiny_post_json(&ts, "/forward", req, 200);
            ref_adapter ra, rb;
            ref_adapter_make(&ra, 1.0 + a);
            ref_adapter_make(&rb, 1.0 + b);
            const ls_ref_lora *per_token[3] = {&ra.lora, NULL, &rb.lora};
            double ref[3 * HID];
            ls_ref_forward(&d, w13, w2, T, x, g, per_token, ref);
            long ny;
            double *y = ls_test_json_doubles(json_object_get(resp, "y"), &ny);
            assert_true(ls_ref_rel_err_d(y, ref, ny) <= 1e-5);
            free(y);
            json_decref(resp);
            json_decref(req);
        }
    }
    json_t *c = pool_counters();
    char *text = json_dumps(c, JSON_COMPACT);
    printf("counters: %s\n", text);
    free(text);
    assert_true(json_integer_value(json_object_get(c, "evictions")) >= 10);
    assert_true(json_integer_value(json_object_get(c, "misses")) >= 10);
    json_decref(c);
    free(x), free(g), free(w13), free(w2);
    tiny_server_stop(&ts);
}

/* --- delete and replace racing with forwards ----------------------------- */

static atomic_bool stop_flag;
static json_t *expected_y[2]; /* alpha 2 (odd versions) and alpha 4 (even) */
static atomic_int checked, not_found, wrong;

static void *forward_thread(void *arg) {
    (void)arg;
    json_t *req = json_pack("{s:O, s:O, s:[s, n, s]}", "x", json_object_get(ts.tiny, "x"), "gammas",
                            json_object_get(ts.tiny, "gammas"), "adapters", "hot", "hot");
    char *body = json_dumps(req, JSON_COMPACT);
    while (!atomic_load(&stop_flag)) {
        ls_test_response r;
        if (ls_test_http(ts.srv, "POST", "/forward", NULL, body, strlen(body), NULL, &r)) {
            atomic_fetch_add(&wrong, 1);
            continue;
        }
        json_t *j = ls_test_response_json(&r);
        if (r.status == 404 && !strcmp(ls_test_error_code(j), "adapter_not_found")) {
            atomic_fetch_add(&not_found, 1);
        } else if (r.status == 200) {
            json_int_t v = json_integer_value(json_object_get(json_array_get(json_object_get(j, "adapters"), 0), "version"));
            if (!json_equal(json_object_get(j, "y"), expected_y[v % 2 ? 0 : 1])) atomic_fetch_add(&wrong, 1);
            atomic_fetch_add(&checked, 1);
        } else {
            fprintf(stderr, "unexpected %ld: %s\n", r.status, r.body);
            atomic_fetch_add(&wrong, 1);
        }
        json_decref(j);
        ls_test_response_free(&r);
    }
    free(body);
    json_decref(req);
    return NULL;
}

static void test_delete_replace_under_load(void **state) {
    (void)state;
    const char *extra[] = {"--slots", "2", "--batch-wait-us", "100", NULL};
    assert_true(tiny_server_start(&ts, "interleaved", extra));
    json_t *req = json_pack("{s:O, s:O, s:[s, n, s]}", "x", json_object_get(ts.tiny, "x"), "gammas",
                            json_object_get(ts.tiny, "gammas"), "adapters", "hot", "hot");
    for (int k = 0; k < 2; k++) {
        json_decref(load("hot", k ? 4.0 : 2.0, k == 1, 201));
        json_t *resp = tiny_post_json(&ts, "/forward", req, 200);
        expected_y[k] = json_deep_copy(json_object_get(resp, "y"));
        json_decref(resp);
    }
    assert_false(json_equal(expected_y[0], expected_y[1]));
    ls_test_response r;
    assert_int_equal(ls_test_http(ts.srv, "DELETE", "/adapters/hot", NULL, NULL, 0, NULL, &r), 0);
    ls_test_response_free(&r);
    /* Versions continue after a delete (never reused): version 3, odd, so
     * alpha 2 as every odd version. */
    json_t *again = load("hot", 2.0, false, 201);
    assert_int_equal(json_integer_value(json_object_get(again, "version")), 3);
    json_decref(again);

    atomic_store(&stop_flag, false);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, forward_thread, NULL);
    int version = 3;
    for (int i = 0; i < 40; i++) {
        if (i % 5 == 4) { /* delete, pause, load anew: the next version */
            assert_int_equal(ls_test_http(ts.srv, "DELETE", "/adapters/hot", NULL, NULL, 0, NULL, &r), 0);
            assert_int_equal(r.status, 200);
            ls_test_response_free(&r);
            usleep(2000);
            version++;
            json_t *resp = load("hot", version % 2 ? 2.0 : 4.0, false, 201);
            assert_int_equal(json_integer_value(json_object_get(resp, "version")), version);
            json_decref(resp);
        } else {
            version++;
            json_t *resp = load("hot", version % 2 ? 2.0 : 4.0, true, 201);
            assert_int_equal(json_integer_value(json_object_get(resp, "version")), version);
            json_decref(resp);
        }
        /* churn the two slots with other adapters to force evictions */
        char other[16];
        snprintf(other, sizeof other, "other%d", i % 3);
        json_decref(load(other, 1.0, true, 201));
    }
    atomic_store(&stop_flag, true);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    printf("%d results checked, %d 404s, %d wrong\n", atomic_load(&checked), atomic_load(&not_found),
           atomic_load(&wrong));
    assert_int_equal(atomic_load(&wrong), 0);
    assert_true(atomic_load(&checked) > 0);
    json_decref(expected_y[0]);
    json_decref(expected_y[1]);
    json_decref(req);
    tiny_server_stop(&ts);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_five_adapters_three_slots),
        cmocka_unit_test(test_delete_replace_under_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
