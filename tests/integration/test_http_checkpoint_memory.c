/* Loading a sharded checkpoint reads only the shared experts: the server's
 * peak RSS (VmHWM) once it is ready stays within its size before any
 * weights (a server of the same binary and flags on a 1-layer demo model
 * of 16 x 16) plus 1.3x the shared-expert bytes at their stored dtype
 * plus LS_SLACK_MIB, the bound docs/api.md states, on a checkpoint whose
 * routed experts (zeros, file holes) are 40 times larger: a loader that
 * read them, or a shard whole, or held an fp32 copy of the weights, would
 * be far past it. The CPU backend's packed copy of the weights counts: it
 * is what serves. Sanitizer builds are skipped (their allocators and
 * shadow memory change every RSS). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/util/ckpt_writer.h"
#include "tests/util/server_driver.h"

#define LS_SLACK_MIB 16 /* docs/api.md, "Memory while loading" */

/* A server's VmHWM once /ready answers 200 (args NULL-terminated). */
static long long ready_peak(const char *const *args) {
    ls_test_server *s = ls_test_server_start(args);
    assert_non_null(s);
    ls_test_response r;
    assert_int_equal(ls_test_http(s, "GET", "/ready", NULL, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ls_test_response_free(&r);
    const long long peak = (long long)ls_test_proc_kib(ls_test_server_pid(s), "VmHWM") * 1024;
    assert_int_equal(ls_test_server_stop(s), 0);
    assert_true(peak > 0);
    return peak;
}

#define LS_FLAGS "--device", "cpu", "--threads", "1", "--slots", "1", "--max-rank", "1", "--max-batch-tokens", "16"

static void test_peak_rss_while_loading(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    /* 8 layers with shared experts of 6 MiB each (bf16, H = F = 1024)
     * beside 256 MiB of routed experts each, over 4 shards. */
    const ck_spec spec = {.family = CK_DEEPSEEK_V3, .H = 1024, .F = 1024, .dtype = LS_DTYPE_BF16, .shards = 4,
                          .decoy_bytes = 256ull << 20, .layers = 9, .seed = 7};
    ck_model m;
    ck_write(dir, &spec, &m);
    const char *tiny[] = {"--experts", "1", "--hidden", "16", "--intermediate", "16", "--layers", "1", LS_FLAGS, NULL};
    const char *args[] = {"--weights", dir, LS_FLAGS, NULL};
    const long long base = ready_peak(tiny), peak = ready_peak(args);
    const double shared = (double)m.shared_bytes, mib = 1048576;
    const double bound = (double)base + 1.3 * shared + (double)(LS_SLACK_MIB << 20);
    printf("shared experts %.1f MiB (of %.0f MiB of tensors); peak RSS %.1f MiB, %.1f MiB over the %.1f MiB of a "
           "server before any weights; bound %.1f MiB\n",
           shared / mib, (shared + 9.0 * (256 << 20)) / mib, (double)peak / mib, (double)(peak - base) / mib,
           (double)base / mib, bound / mib);
    assert_true(peak - base >= (long long)shared); /* it did load them: the CPU backend holds them */
    assert_true((double)peak <= bound);
    ck_model_free(&m);
    ls_test_rmtree(dir);
    free(dir);
}

int main(void) {
#if LS_TEST_SANITIZED
    printf("SKIPPED: a sanitizer build (its allocator and shadow memory change every RSS)\n");
    return 77;
#endif
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_peak_rss_while_loading)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
