/* /forward on a weights file against the tests' independent fp64
 * implementation, for both W13 layouts (from __metadata__ and from the
 * flag), f32 weights: relative error <= 1e-5. Also start-up failures on
 * broken weights files (exit 1, the tensor named). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "format/safetensors.h"
#include "gpu/backend.h"
#include "gpu/cpu/cpu_backend.h"
#include "gpu/cuda/cuda_backend.h"
#include "tests/util/reference.h"
#include "tests/util/server_driver.h"

typedef struct {
    int n, H, F, L;
    double *w13, *w2; /* per layer, concatenated */
} weights;

/* Writes random f32 weights; layout_meta NULL = no metadata. */
static void write_weights(const char *path, weights *w, const char *layout_meta, unsigned long long seed) {
    size_t n13 = (size_t)w->n * 2 * w->F * w->H, n2 = (size_t)w->n * w->H * w->F;
    w->w13 = malloc(sizeof(double) * n13 * w->L);
    w->w2 = malloc(sizeof(double) * n2 * w->L);
    ls_ref_fill_uniform(w->w13, (long)(n13 * w->L), 1.0 / 4, &seed);
    ls_ref_fill_uniform(w->w2, (long)(n2 * w->L), 1.0 / 4, &seed);
    float *f13 = malloc(sizeof(float) * n13 * w->L), *f2 = malloc(sizeof(float) * n2 * w->L);
    for (size_t i = 0; i < n13 * w->L; i++) w->w13[i] = f13[i] = (float)w->w13[i];
    for (size_t i = 0; i < n2 * w->L; i++) w->w2[i] = f2[i] = (float)w->w2[i];
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    if (layout_meta) ls_tensor_set_add_meta(&set, "w13_layout", layout_meta);
    for (int l = 0; l < w->L; l++) {
        char name[128];
        ls_tensor t13 = {.dtype = LS_DTYPE_F32, .ndim = 3, .shape = {w->n, 2 * w->F, w->H}, .data = f13 + n13 * l,
                         .nbytes = n13 * 4};
        ls_tensor t2 = {.dtype = LS_DTYPE_F32, .ndim = 3, .shape = {w->n, w->H, w->F}, .data = f2 + n2 * l,
                        .nbytes = n2 * 4};
        snprintf(name, sizeof name, "model.layers.%d.mlp.shared_experts.w13_weight", l);
        ls_tensor_set_add(&set, name, &t13);
        snprintf(name, sizeof name, "model.layers.%d.mlp.shared_experts.w2_weight", l);
        ls_tensor_set_add(&set, name, &t2);
    }
    uint8_t *buf;
    size_t len;
    assert_int_equal(ls_safetensors_write(&set, &buf, &len, NULL), LS_OK);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    fclose(f);
    free(buf);
    ls_tensor_set_free(&set);
    free(f13);
    free(f2);
}

/* Runs a forward of T random tokens on layer l and compares. */
static void check_forward(ls_test_server *s, const weights *w, ls_w13_layout layout, int layer, int T,
                          unsigned long long seed) {
    double *x = malloc(sizeof(double) * T * w->H), *g = malloc(sizeof(double) * T * w->n);
    double *ref = malloc(sizeof(double) * T * w->H);
    ls_ref_fill_uniform(x, (long)T * w->H, 1.0, &seed);
    ls_ref_fill_uniform(g, (long)T * w->n, 1.0, &seed);
    json_t *jx = json_array(), *jg = json_array();
    for (int t = 0; t < T; t++) {
        json_t *rx = json_array(), *rg = json_array();
        for (int h = 0; h < w->H; h++) {
            x[t * w->H + h] = (float)x[t * w->H + h];
            json_array_append_new(rx, json_real(x[t * w->H + h]));
        }
        for (int e = 0; e < w->n; e++) {
            g[t * w->n + e] = (float)g[t * w->n + e];
            json_array_append_new(rg, json_real(g[t * w->n + e]));
        }
        json_array_append_new(jx, rx);
        json_array_append_new(jg, rg);
    }
    json_t *req = json_pack("{s:i, s:o, s:o}", "layer", layer, "x", jx, "gammas", jg);
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    ls_test_response r;
    assert_int_equal(ls_test_http(s, "POST", "/forward", NULL, body, strlen(body), NULL, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = ls_test_response_json(&r);
    long cnt;
    double *y = ls_test_json_doubles(json_object_get(j, "y"), &cnt);
    assert_int_equal(cnt, (long)T * w->H);
    ls_dims d = {.n = w->n, .H = w->H, .F = w->F, .L = w->L, .w13_layout = layout};
    size_t n13 = (size_t)w->n * 2 * w->F * w->H, n2 = (size_t)w->n * w->H * w->F;
    ls_ref_forward(&d, w->w13 + n13 * layer, w->w2 + n2 * layer, T, x, g, NULL, ref);
    double rel = ls_ref_rel_err_d(y, ref, cnt);
    printf("layer %d, T=%d, %s: relative error %.3g\n", layer, T, ls_w13_layout_name(layout), rel);
    assert_true(rel <= 1e-5);
    /* and the layout matters: the other layout's reference disagrees */
    d.w13_layout = layout == LS_W13_INTERLEAVED ? LS_W13_CONTIGUOUS : LS_W13_INTERLEAVED;
    ls_ref_forward(&d, w->w13 + n13 * layer, w->w2 + n2 * layer, T, x, g, NULL, ref);
    assert_true(ls_ref_rel_err_d(y, ref, cnt) > 1e-3);
    json_decref(j);
    free(y);
    ls_test_response_free(&r);
    free(body);
    free(x);
    free(g);
    free(ref);
}

static void run_case(const char *layout_meta, const char *layout_flag, ls_w13_layout expect, unsigned long long seed) {
    char *dir = ls_test_mkdtemp();
    char path[512];
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    weights w = {.n = 3, .H = 40, .F = 24, .L = 2};
    write_weights(path, &w, layout_meta, seed);
    const char *args[8] = {"--weights", path, NULL};
    if (layout_flag) {
        args[2] = "--w13-layout";
        args[3] = layout_flag;
        args[4] = NULL;
    }
    ls_test_server *s = ls_test_server_start(args);
    assert_non_null(s);
    /* GET /model: the fused file, its layers 0..L-1, the file read */
    ls_test_response r;
    assert_int_equal(ls_test_http(s, "GET", "/model", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *m = ls_test_response_json(&r);
    assert_string_equal(json_string_value(json_object_get(m, "source")), "file");
    assert_string_equal(json_string_value(json_object_get(m, "family")), "fused");
    assert_true(json_is_null(json_object_get(m, "model_type")));
    assert_int_equal(json_integer_value(json_object_get(m, "n")), w.n);
    assert_int_equal(json_array_size(json_object_get(m, "layers")), 2);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(m, "layers"), 1)), 1);
    assert_string_equal(json_string_value(json_object_get(m, "w13_layout")), ls_w13_layout_name(expect));
    assert_string_equal(json_string_value(json_array_get(json_object_get(m, "files"), 0)), "weights.safetensors");
    assert_false(json_is_true(json_object_get(m, "gate")));
    json_decref(m);
    ls_test_response_free(&r);
    check_forward(s, &w, expect, 0, 1, seed + 1);
    check_forward(s, &w, expect, 1, 17, seed + 2);
    check_forward(s, &w, expect, 0, 70, seed + 3);
    assert_int_equal(ls_test_server_stop(s), 0);
    free(w.w13);
    free(w.w2);
    ls_test_rmtree(dir);
    free(dir);
}

static void test_interleaved_from_metadata(void **state) {
    (void)state;
    run_case("interleaved", NULL, LS_W13_INTERLEAVED, 11);
}

/* No layout in the file and no --w13-layout: start-up stops, saying both
 * layouts and the flag (no default: the two have the same shape). */
static void test_undeclared_layout_exit_1(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    char path[512], out[8192];
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    weights w = {.n = 2, .H = 8, .F = 4, .L = 1};
    write_weights(path, &w, NULL, 5);
    const char *args[] = {"--weights", path, "--port", "0", NULL};
    assert_int_equal(ls_test_run_binary(args, out, sizeof out), 1);
    assert_non_null(strstr(out, "__metadata__ w13_layout"));
    assert_non_null(strstr(out, "--w13-layout contiguous|interleaved"));
    assert_non_null(strstr(out, "contiguous (rows 0..F-1 gate"));
    assert_non_null(strstr(out, "interleaved (row 2j gate j"));
    assert_non_null(strstr(out, "FusedMoE"));
    free(w.w13);
    free(w.w2);
    ls_test_rmtree(dir);
    free(dir);
}

static void test_contiguous_from_metadata(void **state) {
    (void)state;
    run_case("contiguous", NULL, LS_W13_CONTIGUOUS, 22);
}

static void test_flag_overrides_metadata(void **state) {
    (void)state;
    run_case("contiguous", "interleaved", LS_W13_INTERLEAVED, 33);
    run_case(NULL, "contiguous", LS_W13_CONTIGUOUS, 44);
}

static void test_broken_weights_exit_1(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    char path[512], out[8192];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    /* layer 1's w2 has the wrong H */
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    float *zeros = calloc(2 * 8 * 4 * 2, sizeof(float));
    ls_tensor t13 = {.dtype = LS_DTYPE_F32, .ndim = 3, .shape = {2, 8, 4}, .data = zeros, .nbytes = 2 * 8 * 4 * 4};
    ls_tensor t2 = {.dtype = LS_DTYPE_F32, .ndim = 3, .shape = {2, 4, 4}, .data = zeros, .nbytes = 2 * 4 * 4 * 4};
    ls_tensor t2bad = {.dtype = LS_DTYPE_F32, .ndim = 3, .shape = {2, 2, 4}, .data = zeros, .nbytes = 2 * 2 * 4 * 4};
    ls_tensor_set_add(&set, "model.layers.0.mlp.shared_experts.w13_weight", &t13);
    ls_tensor_set_add(&set, "model.layers.0.mlp.shared_experts.w2_weight", &t2);
    ls_tensor_set_add(&set, "model.layers.1.mlp.shared_experts.w13_weight", &t13);
    ls_tensor_set_add(&set, "model.layers.1.mlp.shared_experts.w2_weight", &t2bad);
    ls_tensor_set_add_meta(&set, "w13_layout", "interleaved");
    uint8_t *buf;
    size_t len;
    assert_int_equal(ls_safetensors_write(&set, &buf, &len, NULL), LS_OK);
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, len, f);
    fclose(f);
    free(buf);
    ls_tensor_set_free(&set);
    free(zeros);
    const char *args[] = {"--weights", path, "--port", "0", NULL};
    assert_int_equal(ls_test_run_binary(args, out, sizeof out), 1);
    assert_non_null(strstr(out, "model.layers.1.mlp.shared_experts.w2_weight"));
    snprintf(path, sizeof path, "%s/missing.safetensors", dir);
    assert_int_equal(ls_test_run_binary(args, out, sizeof out), 1);
    ls_test_rmtree(dir);
    free(dir);
}

static void test_command_line(void **state) {
    (void)state;
    char out[65536];
    const char *version[] = {"--version", NULL};
    assert_int_equal(ls_test_run_binary(version, out, sizeof out), 0);
    assert_non_null(strstr(out, "lorasink 0.1.0"));
    const char *short_version[] = {"-V", NULL};
    assert_int_equal(ls_test_run_binary(short_version, out, sizeof out), 0);
    assert_non_null(strstr(out, "lorasink 0.1.0"));
    const char *help[] = {"--help", NULL};
    assert_int_equal(ls_test_run_binary(help, out, sizeof out), 0);
    assert_non_null(strstr(out, "--max-rank"));
    assert_non_null(strstr(out, "LORASINK_MAX_RANK"));
    const char *bad[] = {"--no-such-flag", NULL};
    assert_int_equal(ls_test_run_binary(bad, out, sizeof out), 2);
    assert_non_null(strstr(out, "--no-such-flag"));
    const char *range[] = {"--slots", "0", NULL};
    assert_int_equal(ls_test_run_binary(range, out, sizeof out), 2);
    const char *value[] = {"--port", "eighty", NULL};
    assert_int_equal(ls_test_run_binary(value, out, sizeof out), 2);
    const char *host[] = {"--host", "localhost", NULL};
    assert_int_equal(ls_test_run_binary(host, out, sizeof out), 2);
    assert_non_null(strstr(out, "not a numeric IPv4 or IPv6 address"));
    /* --device cuda where no device answers: a clear error, exit 1 (on a
     * machine with a device it would start serving, so it is not run) */
    if (!ls_backend_cuda_available()) {
        const char *cuda[] = {"--device", "cuda", "--port", "0", NULL};
        assert_int_equal(ls_test_run_binary(cuda, out, sizeof out), 1);
        assert_non_null(strstr(out, "cuda"));
        assert_non_null(strstr(out, "starting on the cuda backend"));
    }
    /* The CPU engine names its kernel path and threads at start-up (a
     * --host that is no address of this machine, TEST-NET-1 of RFC 5737,
     * stops the server right after). Every path this CPU runs
     * can be forced; one it lacks stops start-up with exit 1. */
    const ls_cpu_isa paths[] = {LS_CPU_ISA_AVX512, LS_CPU_ISA_AVX2, LS_CPU_ISA_GENERIC};
    for (size_t i = 0; !ls_backend_cuda_available() && i < sizeof paths / sizeof paths[0]; i++) {
        const char *isa = ls_cpu_isa_name(paths[i]);
        const char *forced[] = {"--cpu-isa", isa, "--threads", "3", "--host", "192.0.2.1", "--experts", "1",
                                "--hidden", "16", "--intermediate", "16", "--layers", "1", NULL};
        assert_int_equal(ls_test_run_binary(forced, out, sizeof out), 1);
        char want[96];
        if (ls_cpu_isa_supported(paths[i])) {
            snprintf(want, sizeof want, "cpu engine: %s kernels (--cpu-isa %s), 3 threads", isa, isa);
            assert_non_null(strstr(out, want));
            assert_non_null(strstr(out, "cannot listen on 192.0.2.1"));
        } else {
            snprintf(want, sizeof want, "this CPU does not run the %s kernels", isa);
            assert_non_null(strstr(out, want));
        }
    }
    /* A port another process listens on stops start-up before the
     * weights are read (a checkpoint of hundreds of GB used to load
     * first): the weights named here do not even exist. */
    int held = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    assert_true(held >= 0 && bind(held, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(held, 1) == 0 &&
                getsockname(held, (struct sockaddr *)&sa, &sl) == 0);
    char port[16], want_port[96];
    snprintf(port, sizeof port, "%d", ntohs(sa.sin_port));
    const char *taken[] = {"--port", port, "--weights", "/nonexistent.safetensors", NULL};
    assert_int_equal(ls_test_run_binary(taken, out, sizeof out), 1);
    snprintf(want_port, sizeof want_port, "cannot listen on 127.0.0.1:%s: Address already in use", port);
    assert_non_null(strstr(out, want_port));
    assert_null(strstr(out, "nonexistent"));
    close(held);
    /* auto says which backend it took in its first log line */
    const char *autod[] = {"--device", "auto", "--weights", "/nonexistent.safetensors", NULL};
    assert_int_equal(ls_test_run_binary(autod, out, sizeof out), 1);
    assert_non_null(strstr(out, ls_backend_cuda_available() ? "starting on the cuda backend" : "starting on the cpu backend"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interleaved_from_metadata), cmocka_unit_test(test_undeclared_layout_exit_1),
        cmocka_unit_test(test_contiguous_from_metadata),
        cmocka_unit_test(test_flag_overrides_metadata), cmocka_unit_test(test_broken_weights_exit_1),
        cmocka_unit_test(test_command_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
