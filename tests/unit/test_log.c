/* The logger (common/log.c): one line per call, whatever the message
 * quotes. A control byte a client or a file sent (a newline, ESC) would
 * forge a line or drive the terminal; each is written as '?'. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/log.h"
#include "tests/util/testutil.h"

static void test_control_bytes_never_reach_the_log(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    char path[4200];
    snprintf(path, sizeof path, "%s/log", dir);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_non_null(freopen(path, "w", stderr));
    ls_log_warn("adapter %s: key \"%s\"", "a\r", "gate_proj|\n2026-12-04T00:00:00.000Z info  forged\x1b[2J\x7f");
    fflush(stderr);
    assert_int_equal(dup2(saved, 2), 2);
    close(saved);
    size_t len = 0;
    char *text = ls_test_read_file(path, &len);
    assert_non_null(text);
    assert_int_equal(text[len - 1], '\n');
    assert_null(memchr(text, '\n', len - 1)); /* one line */
    for (size_t i = 0; i + 1 < len; i++) assert_true((unsigned char)text[i] >= 0x20 && text[i] != 0x7f);
    assert_non_null(strstr(text, "adapter a?: key \"gate_proj|?2026-12-04T00:00:00.000Z info  forged?[2J?\""));
    free(text);
    ls_test_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_control_bytes_never_reach_the_log),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
