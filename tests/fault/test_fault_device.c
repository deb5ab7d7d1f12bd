/* Device failures in the pool (fault_cases.h): every backend call of
 * ls_pool_load (a new name, pinned, a replace, a load that evicts; with
 * and without a state directory), ls_pool_forward over a mix of adapters
 * and ls_pool_restore, failed in turn, N = 1, 2, ..., first as a passing
 * fault (the call fails with LS_DEVICE_ERROR, nothing registered changes,
 * a retry gives what a run that never failed gives), then as a sticky one
 * (the device is poisoned as CUDA's context is after an illegal address:
 * ls_backend_usable turns false and the server's /ready, driven here
 * in-process through its route table around the failing backend,
 * answers 503). Also a base-weight upload that fails: its layer is
 * refused until one succeeds. */
#include "server/request.h"
#include "server/routes.h"
#include "tests/fault/fault_cases.h"

/* GET /ready through the server's route table, around w's backend: the
 * handler reads nothing of the server but its backend. */
static int ready_status(fx_world *w, ls_status *code) {
    ls_server srv;
    memset(&srv, 0, sizeof srv);
    srv.backend = fb_be(w->fb);
    char param[256], allow[64];
    const ls_route *rt = ls_route_find("GET", "/ready", param, sizeof param, allow, sizeof allow);
    assert_non_null(rt);
    ls_request req = {.srv = &srv, .method = "GET", .path = "/ready"};
    ls_reply r;
    memset(&r, 0, sizeof r);
    rt->fn(&req, &r);
    free(r.body);
    *code = r.code;
    return r.status;
}

static void ready_is_503(fx_world *w) {
    ls_status code;
    int status = ready_status(w, &code);
    if (status != 503 || code != LS_DEVICE_ERROR)
        fail_msg("/ready answered %d (%s) after a sticky device fault", status, ls_status_code(code));
}

/* A device that works answers 200, one poisoned outside any call too. */
static void test_ready_follows_the_device(void **state) {
    (void)state;
    fx_opts o = {.slots = 3};
    fx_world *w = fx_world_new(&o);
    ls_status code;
    assert_int_equal(ready_status(w, &code), 200);
    fx_load(w, "A", 2, 1, false, false);
    fb_arm(w->fb, 1, true);
    ls_adapter a;
    fx_adapter(2, 2, &a);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_pool_load(w->p, "B", &a, NULL, NULL, &err), LS_DEVICE_ERROR);
    fb_disarm(w->fb);
    assert_false(ls_backend_usable(fb_be(w->fb)));
    ready_is_503(w);
    /* Every later call fails cleanly, and the registry stays as it was. */
    ls_error_clear(&err);
    assert_int_equal(ls_pool_load(w->p, "B", &a, NULL, NULL, &err), LS_DEVICE_ERROR);
    assert_non_null(a.data);
    fx_state s;
    fx_capture(w, &s);
    assert_int_equal(s.n_reg, 1);
    assert_string_equal(s.reg[0].name, "A");
    fx_state_free(&s);
    ls_adapter_free(&a);
    ls_error_free(&err);
    fx_world_free(w);
}

/* A re-upload of a layer's base weights that fails on the device may
 * leave it half written: its forwards are refused (they used to run on
 * whatever the failed upload left) until an upload succeeds. */
static void test_failed_upload_refuses_forwards(void **state) {
    (void)state;
    fx_opts o = {.slots = 2};
    fx_world *w = fx_world_new(&o);
    ls_backend *be = fb_be(w->fb);
    const size_t nFH = (size_t)fx_dims.n * fx_dims.F * fx_dims.H;
    float *w13 = calloc(2 * nFH, sizeof(float)), *w2 = calloc(nFH, sizeof(float));
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
    assert_true(w13 && w2 && fx_dims.H == 8);
    const ls_base_layer bl = ls_base_layer_f32(w13, w2);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_backend_forward(be, 1, 1, x, NULL, NULL, y, &err), LS_OK);
    fb_arm(w->fb, 1, false);
    assert_int_equal(ls_backend_upload_base(be, 1, &bl, &err), LS_DEVICE_ERROR);
    fb_disarm(w->fb);
    ls_error_clear(&err);
    assert_int_equal(ls_backend_forward(be, 1, 1, x, NULL, NULL, y, &err), LS_INTERNAL);
    assert_non_null(strstr(err.message, "last upload failed"));
    ls_error_clear(&err);
    assert_int_equal(ls_backend_forward(be, 0, 1, x, NULL, NULL, y, &err), LS_OK); /* the other layer serves */
    assert_int_equal(ls_backend_upload_base(be, 1, &bl, &err), LS_OK);
    assert_int_equal(ls_backend_forward(be, 1, 1, x, NULL, NULL, y, &err), LS_OK);
    for (int i = 0; i < 8; i++) assert_true(y[i] == 0.0f); /* the zero weights uploaded */
    ls_error_free(&err);
    free(w13);
    free(w2);
    fx_world_free(w);
}

static void sweep_all(fx_kind kind) {
    for (size_t i = 0; i < fc_n_specs; i++) {
        if (fc_specs[i].op == FC_DELETE) continue; /* no backend call to fail */
        fx_case c = fc_case(&fc_specs[i]);
        fx_sweep(&c, kind);
    }
}

static void test_device_errors(void **state) {
    (void)state;
    sweep_all(FX_DEVICE);
}

static void test_sticky_device_errors(void **state) {
    (void)state;
    fx_after_sticky = ready_is_503;
    sweep_all(FX_DEVICE_STICKY);
    fx_after_sticky = NULL;
}

int main(void) {
    fx_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready_follows_the_device),
        cmocka_unit_test(test_failed_upload_refuses_forwards),
        cmocka_unit_test(test_device_errors),
        cmocka_unit_test(test_sticky_device_errors),
    };
    return cmocka_run_group_tests(tests, fc_group_setup, fc_group_teardown);
}
