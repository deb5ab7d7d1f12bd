/* gpu/nvml.c against a stand-in NVML (tests/util/fake_nvml.c): the
 * utilisation read through dlopen, and every way NVML can be missing
 * giving NULL with a reason (the CUDA backend's warning), NVML shut down
 * and unloaded on every path. No device needed. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/nvml.h"

static const char BUS[] = "00000000:17:00.0";

/* The stand-in's count of NVML sessions left open (it stays loaded while
 * this handle holds it). */
static int open_sessions(void *fake) {
    int (*count)(void) = (int (*)(void))dlsym(fake, "fake_nvml_open_count");
    assert_non_null(count);
    return count();
}

static void test_reads_utilization(void **state) {
    (void)state;
    setenv("FAKE_NVML_UTIL", "37", 1);
    char why[256] = "";
    ls_nvml *nv = ls_nvml_open(LS_FAKE_NVML_LIB, BUS, why, sizeof why);
    assert_non_null(nv);
    unsigned pct = 0;
    assert_true(ls_nvml_gpu_utilization(nv, &pct));
    assert_int_equal(pct, 37);
    setenv("FAKE_NVML_UTIL", "100", 1);
    assert_true(ls_nvml_gpu_utilization(nv, &pct));
    assert_int_equal(pct, 100);
    void *fake = dlopen(LS_FAKE_NVML_LIB, RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(fake);
    assert_int_equal(open_sessions(fake), 1);
    ls_nvml_close(nv);
    assert_int_equal(open_sessions(fake), 0);
    dlclose(fake);
}

/* NVML that cannot say (a MIG instance): no figure, not a made-up 0. */
static void test_unsupported_is_no_figure(void **state) {
    (void)state;
    unsetenv("FAKE_NVML_UTIL");
    char why[256] = "";
    ls_nvml *nv = ls_nvml_open(LS_FAKE_NVML_LIB, BUS, why, sizeof why);
    assert_non_null(nv);
    unsigned pct = 12345;
    assert_false(ls_nvml_gpu_utilization(nv, &pct));
    assert_int_equal(pct, 12345);
    ls_nvml_close(nv);
    assert_false(ls_nvml_gpu_utilization(NULL, &pct));
}

static void test_missing_library(void **state) {
    (void)state;
    char why[256] = "";
    assert_null(ls_nvml_open("/nonexistent/libnvidia-ml.so.1", BUS, why, sizeof why));
    assert_non_null(strstr(why, "cannot load /nonexistent/libnvidia-ml.so.1"));
}

/* A library that is not NVML (the C library itself) lacks its calls. */
static void test_not_nvml(void **state) {
    (void)state;
    char why[256] = "";
    assert_null(ls_nvml_open("libc.so.6", BUS, why, sizeof why));
    assert_non_null(strstr(why, "NVML has no nvml"));
}

static void test_init_fails(void **state) {
    (void)state;
    setenv("FAKE_NVML_INIT_FAILS", "1", 1);
    char why[256] = "";
    assert_null(ls_nvml_open(LS_FAKE_NVML_LIB, BUS, why, sizeof why));
    unsetenv("FAKE_NVML_INIT_FAILS");
    assert_string_equal(why, "nvmlInit failed: Driver Not Loaded (9)");
}

/* A bus NVML does not know: NULL, and the session it opened is closed. */
static void test_unknown_device(void **state) {
    (void)state;
    void *fake = dlopen(LS_FAKE_NVML_LIB, RTLD_NOW);
    assert_non_null(fake);
    char why[256] = "";
    assert_null(ls_nvml_open(LS_FAKE_NVML_LIB, "00000000:99:00.0", why, sizeof why));
    assert_string_equal(why, "NVML finds no device at PCI bus 00000000:99:00.0: Not Found (6)");
    assert_int_equal(open_sessions(fake), 0);
    dlclose(fake);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_utilization), cmocka_unit_test(test_unsupported_is_no_figure),
        cmocka_unit_test(test_missing_library),   cmocka_unit_test(test_not_nvml),
        cmocka_unit_test(test_init_fails),        cmocka_unit_test(test_unknown_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
