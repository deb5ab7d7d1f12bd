/* docs/configuration.md against the settings table: its "Every setting"
 * block is `lorasink --help` as the table prints it, so a flag added,
 * renamed or given another default fails here until the page says so.
 * On a mismatch the text the page needs is written to stderr. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config/settings.h"
#include "tests/util/testutil.h"

#ifndef LS_SOURCE_DIR
#error "LS_SOURCE_DIR must name the source tree (tests/CMakeLists.txt sets it)"
#endif

static void test_configuration_md_holds_help(void **state) {
    (void)state;
    char *help = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&help, &len);
    assert_non_null(out);
    fputs("```text\n", out);
    ls_settings_help(out);
    fputs("```\n", out);
    fclose(out);
    char *md = ls_test_read_file(LS_SOURCE_DIR "/docs/configuration.md", NULL);
    if (!strstr(md, help))
        fprintf(stderr, "docs/configuration.md must hold, under \"Every setting\", exactly:\n%s", help);
    assert_non_null(strstr(md, help));
    free(md);
    free(help);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_configuration_md_holds_help),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
