/* libFuzzer harness for the JSON config file reader (config/config.c,
 * config/settings.c) through ls_config_load("--config FILE"), the only way
 * in: the input is written to one file in $TMPDIR (or /tmp) per run and
 * loaded with no environment and no other flag. Any file must be either
 *  - rejected: LS_CONFIG_ERROR with a non-empty one-line message (no
 *    control character: the server prints it as one log line); or
 *  - accepted (LS_CONFIG_RUN; never LS_CONFIG_EXIT, nothing printed) with
 *    the demo/weights rule met, and then its dump (ls_config_dump) is a
 *    JSON object with the API key masked that, loaded as a config file,
 *    gives the same settings back.
 * Nothing is allocated that outlives the call (ASan's leak check).
 * Built only with clang (tests/fuzz/CMakeLists.txt). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "config/settings.h"

#define FUZZ_CHECK(cond)                                                                                          \
    do {                                                                                                           \
        if (!(cond)) abort();                                                                                      \
    } while (0)

static char in_path[512], dump_path[512];

static void remove_files(void) {
    unlink(in_path);
    unlink(dump_path);
}

static void write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    FUZZ_CHECK(f);
    FUZZ_CHECK(fwrite(data, 1, size, f) == size);
    FUZZ_CHECK(fclose(f) == 0);
}

static ls_config_result load(const char *path, ls_config *cfg, char *err, size_t errlen) {
    char *argv[] = {"lorasink", "--config", (char *)path, NULL}, *envp[] = {NULL};
    FILE *out = fopen("/dev/null", "w");
    FUZZ_CHECK(out);
    memset(err, 0, errlen);
    ls_config_result r = ls_config_load(cfg, 3, argv, envp, out, err, errlen);
    FUZZ_CHECK(ftell(out) == 0); /* --help and --version only */
    fclose(out);
    return r;
}

/* The value of setting s is the same in a and b (strings up to their NUL). */
static bool same_setting(const ls_setting *s, const ls_config *a, const ls_config *b) {
    const char *x = (const char *)a + s->offset, *y = (const char *)b + s->offset;
    if (s->type == LS_SET_STR) return !strcmp(x, y);
    return !memcmp(x, y, s->size);
}

static void check_round_trip(const ls_config *cfg) {
    FILE *f = fopen(dump_path, "w");
    FUZZ_CHECK(f);
    ls_config_dump(cfg, f);
    FUZZ_CHECK(fclose(f) == 0);

    json_error_t je;
    json_t *doc = json_load_file(dump_path, 0, &je);
    FUZZ_CHECK(doc && json_is_object(doc) && json_object_size(doc) == ls_settings_count);
    const char *key = json_string_value(json_object_get(doc, "api_key"));
    FUZZ_CHECK(key && !strcmp(key, cfg->api_key[0] ? "***" : ""));
    json_decref(doc);

    ls_config back;
    char err[512];
    FUZZ_CHECK(load(dump_path, &back, err, sizeof err) == LS_CONFIG_RUN);
    for (size_t i = 0; i < ls_settings_count; i++) {
        const ls_setting *s = &ls_settings[i];
        if (!s->secret) FUZZ_CHECK(same_setting(s, cfg, &back));
    }
    FUZZ_CHECK(back.demo == cfg->demo && back.w13_layout_set);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!in_path[0]) {
        const char *tmp = getenv("TMPDIR");
        if (!tmp || !*tmp || strlen(tmp) > 400) tmp = "/tmp";
        snprintf(in_path, sizeof in_path, "%s/lorasink-fuzz-config-%ld.json", tmp, (long)getpid());
        snprintf(dump_path, sizeof dump_path, "%s/lorasink-fuzz-config-%ld.dump.json", tmp, (long)getpid());
        atexit(remove_files); /* a crash leaves them: scripts/fuzz.sh points TMPDIR at its own directory */
    }
    write_file(in_path, data, size);

    ls_config cfg;
    char err[512];
    ls_config_result r = load(in_path, &cfg, err, sizeof err);
    FUZZ_CHECK(r == LS_CONFIG_RUN || r == LS_CONFIG_ERROR);
    FUZZ_CHECK(memchr(err, '\0', sizeof err));
    if (r == LS_CONFIG_ERROR) {
        FUZZ_CHECK(err[0]);
        for (const char *c = err; *c; c++) FUZZ_CHECK((unsigned char)*c >= 0x20 && *c != 0x7f);
    } else {
        FUZZ_CHECK(!strcmp(cfg.config_file, in_path));
        FUZZ_CHECK(cfg.demo ? !cfg.weights[0] : cfg.weights[0] != '\0');
        check_round_trip(&cfg);
    }
    return 0;
}
