/* config/: defaults, the three sources and their precedence, every kind of
 * bad input (one-line error, LS_CONFIG_ERROR), --help / --version, the dump
 * and the example file. Config files are written under a mkdtemp dir. */
#include <jansson.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "tests/util/testutil.h"

#define ERRLEN 512

static char *tmpdir; /* ls_test_mkdtemp's; removed whole at teardown */

static int group_setup(void **state) {
    (void)state;
    tmpdir = ls_test_mkdtemp();
    return tmpdir ? 0 : -1;
}

static int group_teardown(void **state) {
    (void)state;
    ls_test_rmtree(tmpdir);
    free(tmpdir);
    return 0;
}

/* Writes text to tmpdir/name; the path goes to buf (PATH_MAX). */
static const char *write_file(const char *name, const char *text, char *buf) {
    snprintf(buf, PATH_MAX, "%s/%s", tmpdir, name);
    FILE *f = fopen(buf, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return buf;
}

/* Runs ls_config_load with argv = "lorasink" + args and envp = env (both
 * NULL-terminated, either may be NULL). What it prints lands in *out when
 * out is given (malloc'd, the caller frees). */
static ls_config_result run_out(ls_config *cfg, const char *const *args, const char *const *env, char *err,
                                char **out) {
    char *argv[64] = {"lorasink"};
    int argc = 1;
    for (; args && args[argc - 1]; argc++) {
        assert_true(argc < 63);
        argv[argc] = (char *)args[argc - 1];
    }
    argv[argc] = NULL;
    char *empty_env[] = {NULL};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    err[0] = '\0';
    ls_config_result r = ls_config_load(cfg, argc, argv, env ? (char **)env : empty_env, f, err, ERRLEN);
    fclose(f);
    if (out) *out = buf;
    else free(buf);
    if (r == LS_CONFIG_ERROR) {
        assert_true(err[0] != '\0');
        assert_null(strchr(err, '\n'));
    }
    return r;
}

static ls_config_result run(ls_config *cfg, const char *const *args, const char *const *env, char *err) {
    return run_out(cfg, args, env, err, NULL);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Expects LS_CONFIG_ERROR with want somewhere in the message. */
static void expect_error(const char *const *args, const char *const *env, const char *want) {
    ls_config cfg;
    char err[ERRLEN];
    assert_int_equal(run(&cfg, args, env, err), LS_CONFIG_ERROR);
    if (!strstr(err, want)) fail_msg("error \"%s\" lacks \"%s\"", err, want);
    for (const char *c = err; *c; c++) /* printed as one log line */
        if ((unsigned char)*c < 0x20 || *c == 0x7f) fail_msg("error \"%s\" holds control byte 0x%02x", err, (unsigned char)*c);
}

/* The dump as a malloc'd string (the caller frees). Through a tmpfile:
 * with open_memstream here GCC 12 -O2 warns of a dangling pointer. */
static char *dump_string(const ls_config *cfg) {
    FILE *f = tmpfile();
    assert_non_null(f);
    ls_config_dump(cfg, f);
    long len = ftell(f);
    assert_true(len > 0);
    char *buf = malloc((size_t)len + 1);
    assert_non_null(buf);
    rewind(f);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    buf[len] = '\0';
    fclose(f);
    return buf;
}

/* ---- defaults and single sources ---------------------------------------- */

static void test_defaults(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    assert_int_equal(run(&c, NULL, NULL, err), LS_CONFIG_RUN);
    assert_string_equal(c.config_file, "");
    assert_string_equal(c.host, "127.0.0.1");
    assert_int_equal(c.port, 8080);
    assert_int_equal(c.device, LS_DEVICE_AUTO);
    assert_int_equal(c.threads, 0);
    assert_int_equal(c.cpu_isa, LS_CPU_ISA_AUTO);
    assert_string_equal(c.weights, "");
    assert_true(c.demo);
    assert_int_equal(c.experts, 2);
    assert_int_equal(c.hidden, 1024);
    assert_int_equal(c.intermediate, 512);
    assert_int_equal(c.layers, 2);
    assert_true(c.seed == 42);
    assert_int_equal(c.w13_layout, LS_W13_INTERLEAVED);
    assert_false(c.w13_layout_set);
    assert_int_equal(c.dtype, LS_WDTYPE_AUTO);
    assert_int_equal(c.slots, 8);
    assert_int_equal(c.max_rank, 64);
    assert_int_equal(c.lora_layout, LS_LORA_SHARED);
    assert_int_equal(c.host_cache, 64);
    assert_string_equal(c.adapter_dir, "");
    assert_false(c.strict_adapters);
    assert_int_equal(c.max_body_mb, 256);
    assert_string_equal(c.api_key, "");
    assert_int_equal(c.max_batch_tokens, 4096);
    assert_int_equal(c.batch_wait_us, 200);
    assert_int_equal(c.max_queue_tokens, 65536);
    assert_int_equal(c.max_connections, 1024);
    assert_int_equal(c.per_ip_connections, 256);
    assert_int_equal(c.connection_timeout_s, 60);
    assert_int_equal(c.shutdown_timeout_s, 30);
    assert_int_equal(c.log_level, LS_LOG_INFO);
}

static void test_flags_alone(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    assert_int_equal(run(&c,
                         ARGS("--host", "0.0.0.0", "--port", "0", "--slots", "4", "--seed", "18446744073709551615",
                              "--dtype", "f32", "--adapter-dir", "/srv/adapters", "--connection-timeout", "5"),
                         NULL, err),
                     LS_CONFIG_RUN);
    assert_string_equal(c.host, "0.0.0.0");
    assert_int_equal(c.port, 0);
    assert_int_equal(c.slots, 4);
    assert_true(c.seed == UINT64_MAX);
    assert_int_equal(c.dtype, LS_WDTYPE_F32);
    assert_string_equal(c.adapter_dir, "/srv/adapters");
    assert_int_equal(c.connection_timeout_s, 5);
    assert_int_equal(c.max_rank, 64); /* untouched */
}

static void test_env_alone(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    assert_int_equal(run(&c, NULL,
                         ARGS("PATH=/bin", "LORASINK_SLOTS=5", "LORASINK_MAX_RANK=16", "LORASINK_HOST=::1",
                              "LORASINK_LORA_LAYOUT=per-expert", "LORASINK_API_KEY=k3y", "LORASINK_UNRELATED=1",
                              "LORASINK_SLOTS=7"),
                         err),
                     LS_CONFIG_RUN);
    assert_int_equal(c.slots, 5); /* the first entry counts, as with getenv */
    assert_int_equal(c.max_rank, 16);
    assert_string_equal(c.host, "::1");
    assert_int_equal(c.lora_layout, LS_LORA_PER_EXPERT);
    assert_string_equal(c.api_key, "k3y");
    assert_string_equal(c.env_unread, ""); /* LORASINK_UNRELATED is near no setting */
    /* A typo, or vLLM's flag as a variable, changed nothing with no word:
     * noted for the start-up warning (still not refused). */
    assert_int_equal(run(&c, NULL, ARGS("LORASINK_PROT=1", "LORASINK_URL=http://x", "LORASINK_MAX_LORAS=2"), err),
                     LS_CONFIG_RUN);
    assert_string_equal(c.env_unread,
                        "LORASINK_PROT (did you mean LORASINK_PORT?), LORASINK_MAX_LORAS (did you mean LORASINK_SLOTS?)");
    assert_int_equal(c.port, 8080);
}

static void test_file_alone(void **state) {
    (void)state;
    char path[PATH_MAX], env[PATH_MAX + 32];
    write_file("alone.json",
               "{\"slots\": 6, \"max_batch_tokens\": 100, \"log_level\": \"debug\", \"strict_adapters\": true,"
               " \"seed\": \"18446744073709551615\", \"w13_layout\": null}",
               path);
    ls_config c;
    char err[ERRLEN];
    assert_int_equal(run(&c, ARGS("--config", path), NULL, err), LS_CONFIG_RUN);
    assert_string_equal(c.config_file, path);
    assert_int_equal(c.slots, 6);
    assert_int_equal(c.max_batch_tokens, 100);
    assert_int_equal(c.log_level, LS_LOG_DEBUG);
    assert_true(c.strict_adapters);
    assert_true(c.seed == UINT64_MAX);
    assert_false(c.w13_layout_set); /* null leaves the setting as it was */

    /* The same file through LORASINK_CONFIG, and --config= (empty) for none. */
    snprintf(env, sizeof env, "LORASINK_CONFIG=%s", path);
    assert_int_equal(run(&c, NULL, ARGS(env), err), LS_CONFIG_RUN);
    assert_int_equal(c.slots, 6);
    assert_int_equal(run(&c, ARGS("--config="), ARGS(env), err), LS_CONFIG_RUN);
    assert_int_equal(c.slots, 8);
    assert_string_equal(c.config_file, "");
}

static void test_precedence(void **state) {
    (void)state;
    char path[PATH_MAX];
    write_file("prec.json", "{\"slots\": 6, \"host\": \"10.0.0.1\", \"port\": 1}", path);
    ls_config c;
    char err[ERRLEN];
    const char *const *env = ARGS("LORASINK_SLOTS=5", "LORASINK_HOST=10.0.0.2");
    assert_int_equal(run(&c, ARGS("--config", path, "--slots", "4"), env, err), LS_CONFIG_RUN);
    assert_int_equal(c.slots, 4);               /* flag > env > file */
    assert_string_equal(c.host, "10.0.0.2");    /* env > file */
    assert_int_equal(c.port, 1);                /* file > default */
    assert_int_equal(run(&c, ARGS("--config", path), env, err), LS_CONFIG_RUN);
    assert_int_equal(c.slots, 5);
    /* A flag given twice: the last one counts. */
    assert_int_equal(run(&c, ARGS("--slots", "3", "--slots=2"), NULL, err), LS_CONFIG_RUN);
    assert_int_equal(c.slots, 2);
}

static void test_equals_form(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    assert_int_equal(run(&c, ARGS("--max-rank=128", "--api-key=a=b", "--weights=/w.safetensors"), NULL, err),
                     LS_CONFIG_RUN);
    assert_int_equal(c.max_rank, 128);
    assert_string_equal(c.api_key, "a=b"); /* only the first '=' splits */
    assert_string_equal(c.weights, "/w.safetensors");
    assert_false(c.demo);
}

static void test_bools(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    assert_int_equal(run(&c, ARGS("--strict-adapters"), NULL, err), LS_CONFIG_RUN);
    assert_true(c.strict_adapters);
    const char *yes[] = {"true", "1"}, *no[] = {"false", "0"};
    for (int i = 0; i < 2; i++) {
        char flag[64], env[64];
        snprintf(flag, sizeof flag, "--strict-adapters=%s", yes[i]);
        assert_int_equal(run(&c, ARGS(flag), NULL, err), LS_CONFIG_RUN);
        assert_true(c.strict_adapters);
        snprintf(env, sizeof env, "LORASINK_STRICT_ADAPTERS=%s", yes[i]);
        assert_int_equal(run(&c, NULL, ARGS(env), err), LS_CONFIG_RUN);
        assert_true(c.strict_adapters);
        /* false from the flag beats true from the environment */
        snprintf(flag, sizeof flag, "--strict-adapters=%s", no[i]);
        assert_int_equal(run(&c, ARGS(flag), ARGS(env), err), LS_CONFIG_RUN);
        assert_false(c.strict_adapters);
    }
    /* A bool flag never takes the next argument as its value. */
    expect_error(ARGS("--strict-adapters", "true"), NULL, "unexpected argument \"true\"");
    expect_error(ARGS("--strict-adapters=yes"), NULL, "--strict-adapters: \"yes\" is not a boolean");
    expect_error(NULL, ARGS("LORASINK_DEMO=on"), "LORASINK_DEMO: \"on\" is not a boolean");
    char path[PATH_MAX];
    write_file("bool.json", "{\"strict_adapters\": true}", path);
    assert_int_equal(run(&c, ARGS("--config", path), NULL, err), LS_CONFIG_RUN);
    assert_true(c.strict_adapters);
}

/* The dump names the value the flag set. */
static void check_enum(const char *flag, const char *name) {
    ls_config c;
    char err[ERRLEN];
    assert_int_equal(run(&c, ARGS(flag, name), NULL, err), LS_CONFIG_RUN);
    char *d = dump_string(&c);
    json_t *j = json_loads(d, 0, NULL);
    assert_non_null(j);
    char key[64];
    snprintf(key, sizeof key, "%s", flag + 2);
    for (char *p = key; *p; p++)
        if (*p == '-') *p = '_';
    assert_string_equal(json_string_value(json_object_get(j, key)), name);
    json_decref(j);
    free(d);
}

static void test_enums(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    const struct {
        const char *name;
        int value;
    } devices[] = {{"auto", LS_DEVICE_AUTO}, {"cpu", LS_DEVICE_CPU}, {"cuda", LS_DEVICE_CUDA}},
      dtypes[] = {{"auto", LS_WDTYPE_AUTO}, {"bf16", LS_WDTYPE_BF16}, {"f16", LS_WDTYPE_F16}, {"f32", LS_WDTYPE_F32}},
      w13[] = {{"interleaved", LS_W13_INTERLEAVED}, {"contiguous", LS_W13_CONTIGUOUS}},
      lora[] = {{"shared", LS_LORA_SHARED}, {"per-expert", LS_LORA_PER_EXPERT}},
      isas[] = {{"auto", LS_CPU_ISA_AUTO}, {"avx512", LS_CPU_ISA_AVX512}, {"avx2", LS_CPU_ISA_AVX2},
                {"generic", LS_CPU_ISA_GENERIC}};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(run(&c, ARGS("--device", devices[i].name), NULL, err), LS_CONFIG_RUN);
        assert_int_equal(c.device, devices[i].value);
        assert_string_equal(ls_device_kind_name(c.device), devices[i].name);
        check_enum("--device", devices[i].name);
    }
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(run(&c, ARGS("--dtype", dtypes[i].name), NULL, err), LS_CONFIG_RUN);
        assert_int_equal(c.dtype, dtypes[i].value);
        assert_string_equal(ls_weight_dtype_name(c.dtype), dtypes[i].name);
        check_enum("--dtype", dtypes[i].name);
    }
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(run(&c, ARGS("--w13-layout", w13[i].name), NULL, err), LS_CONFIG_RUN);
        assert_int_equal(c.w13_layout, w13[i].value);
        assert_true(c.w13_layout_set);
        assert_string_equal(ls_w13_layout_name(c.w13_layout), w13[i].name);
        assert_int_equal(run(&c, ARGS("--lora-layout", lora[i].name), NULL, err), LS_CONFIG_RUN);
        assert_int_equal(c.lora_layout, lora[i].value);
        assert_string_equal(ls_lora_layout_name(c.lora_layout), lora[i].name);
        check_enum("--lora-layout", lora[i].name);
    }
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(run(&c, ARGS("--cpu-isa", isas[i].name), NULL, err), LS_CONFIG_RUN);
        assert_int_equal(c.cpu_isa, isas[i].value);
        assert_string_equal(ls_cpu_isa_name(c.cpu_isa), isas[i].name);
        check_enum("--cpu-isa", isas[i].name);
    }
    /* The environment and the file name it too; the flag wins. */
    assert_int_equal(run(&c, NULL, ARGS("LORASINK_CPU_ISA=generic"), err), LS_CONFIG_RUN);
    assert_int_equal(c.cpu_isa, LS_CPU_ISA_GENERIC);
    char isa_path[PATH_MAX];
    write_file("isa.json", "{\"cpu_isa\": \"avx2\"}", isa_path);
    assert_int_equal(run(&c, ARGS("--config", isa_path), NULL, err), LS_CONFIG_RUN);
    assert_int_equal(c.cpu_isa, LS_CPU_ISA_AVX2);
    assert_int_equal(run(&c, ARGS("--config", isa_path, "--cpu-isa", "generic"), ARGS("LORASINK_CPU_ISA=avx512"), err),
                     LS_CONFIG_RUN);
    assert_int_equal(c.cpu_isa, LS_CPU_ISA_GENERIC);
    const char *levels[] = {"debug", "info", "warn", "error"};
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(run(&c, ARGS("--log-level", levels[i]), NULL, err), LS_CONFIG_RUN);
        assert_int_equal(c.log_level, (ls_log_level)i);
        check_enum("--log-level", levels[i]);
    }
    /* w13_layout_set from the environment and from the file too. */
    assert_int_equal(run(&c, NULL, ARGS("LORASINK_W13_LAYOUT=contiguous"), err), LS_CONFIG_RUN);
    assert_true(c.w13_layout_set);
    assert_int_equal(c.w13_layout, LS_W13_CONTIGUOUS);
    char path[PATH_MAX];
    write_file("w13.json", "{\"w13_layout\": \"interleaved\"}", path);
    assert_int_equal(run(&c, ARGS("--config", path), NULL, err), LS_CONFIG_RUN);
    assert_true(c.w13_layout_set);

    expect_error(ARGS("--device", "gpu"), NULL, "--device: \"gpu\" is not one of auto, cpu, cuda");
    expect_error(ARGS("--dtype", "fp8"), NULL, "is not one of auto, bf16, f16, f32");
    expect_error(ARGS("--lora-layout", "per_expert"), NULL, "is not one of shared, per-expert");
    expect_error(ARGS("--cpu-isa", "sse2"), NULL, "--cpu-isa: \"sse2\" is not one of auto, avx512, avx2, generic");
    expect_error(NULL, ARGS("LORASINK_LOG_LEVEL=trace"), "LORASINK_LOG_LEVEL: \"trace\" is not one of");
}

/* ---- errors ---------------------------------------------------------------- */

static void test_unknown_flag_and_positionals(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    assert_int_equal(run(&c, ARGS("--foo"), NULL, err), LS_CONFIG_ERROR);
    assert_string_equal(err, "unknown flag --foo (see lorasink --help)");
    assert_int_equal(run(&c, ARGS("--foo=1"), NULL, err), LS_CONFIG_ERROR);
    assert_string_equal(err, "unknown flag --foo (see lorasink --help)");
    expect_error(ARGS("--max_rank", "8"), NULL, "unknown flag --max_rank");
    expect_error(ARGS("serve"), NULL, "unexpected argument \"serve\"");
    expect_error(ARGS("-p", "80"), NULL, "unexpected argument \"-p\"");
    expect_error(ARGS("--"), NULL, "unexpected argument \"--\"");
    /* A control character in the text cannot break the one-line error. */
    expect_error(ARGS("--a\nb"), NULL, "unknown flag --a?b");
    /* A peer's flag without a counterpart says what to do instead. */
    expect_error(ARGS("--enable-lora"), NULL, "unknown flag --enable-lora (vLLM's and sglang's flag): lorasink always");
    expect_error(ARGS("--model", "org/m"), NULL, "unknown flag --model (vLLM's flag): give the checkpoint with --weights");
    expect_error(ARGS("--max-loaded-loras=4"), NULL, "--host-cache N");
}

static void test_bad_numbers(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    assert_int_equal(run(&c, NULL, ARGS("LORASINK_SLOTS=abc"), err), LS_CONFIG_ERROR);
    assert_string_equal(err, "LORASINK_SLOTS: \"abc\" is not an integer");
    const char *junk[] = {"12abc", " 12", "12 ", "+12", "0x10", "", "1.5", "1e3", "--1"};
    for (size_t i = 0; i < sizeof junk / sizeof *junk; i++) {
        char want[64];
        snprintf(want, sizeof want, "--slots: \"%s\" is not an integer", junk[i]);
        expect_error(ARGS("--slots", junk[i]), NULL, want);
    }
    expect_error(ARGS("--seed", "-1"), NULL, "--seed: \"-1\" is not an unsigned integer");
    expect_error(ARGS("--seed", "18446744073709551616"), NULL, "--seed: 18446744073709551616 is out of range");
}

static void test_out_of_range(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    assert_int_equal(run(&c, ARGS("--max-rank", "0"), NULL, err), LS_CONFIG_ERROR);
    assert_string_equal(err, "--max-rank: 0 is out of range [1, 1024]");
    assert_int_equal(run(&c, ARGS("--max-rank", "1025"), NULL, err), LS_CONFIG_ERROR);
    assert_string_equal(err, "--max-rank: 1025 is out of range [1, 1024]");
    assert_int_equal(run(&c, ARGS("--max-rank", "1"), NULL, err), LS_CONFIG_RUN);
    assert_int_equal(c.max_rank, 1);
    assert_int_equal(run(&c, ARGS("--max-rank", "1024"), NULL, err), LS_CONFIG_RUN);
    assert_int_equal(c.max_rank, 1024);
    expect_error(ARGS("--port", "-1"), NULL, "--port: -1 is out of range [0, 65535]");
    expect_error(ARGS("--port", "65536"), NULL, "--port: 65536 is out of range [0, 65535]");
    expect_error(ARGS("--threads", "99999999999999999999"), NULL, "out of range [0, 1024]");
    expect_error(ARGS("--batch-wait-us", "1000001"), NULL, "out of range [0, 1000000]");
    expect_error(NULL, ARGS("LORASINK_PER_IP_CONNECTIONS=-5"), "LORASINK_PER_IP_CONNECTIONS: -5 is out of range");
    assert_int_equal(run(&c, ARGS("--per-ip-connections", "0", "--batch-wait-us", "0"), NULL, err), LS_CONFIG_RUN);
    assert_int_equal(c.per_ip_connections, 0);
    assert_int_equal(c.batch_wait_us, 0);
}

/* --host is bound as given: a name is a setting error (exit 2) naming
 * what to give, where it used to fail later at bind time (exit 1). */
static void test_host_is_numeric(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    expect_error(ARGS("--host", "localhost"), NULL, "--host: \"localhost\" is not a numeric IPv4 or IPv6 address");
    expect_error(NULL, ARGS("LORASINK_HOST=10.0.0.256"), "LORASINK_HOST: \"10.0.0.256\" is not a numeric");
    const char *const ok[] = {"0.0.0.0", "::", "::1", "192.168.1.20", "fe80::1"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        assert_int_equal(run(&c, ARGS("--host", ok[i]), NULL, err), LS_CONFIG_RUN);
        assert_string_equal(c.host, ok[i]);
    }
}

static void test_missing_value(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    assert_int_equal(run(&c, ARGS("--port", "1", "--slots"), NULL, err), LS_CONFIG_ERROR);
    assert_string_equal(err, "--slots needs a value");
    expect_error(ARGS("--config"), NULL, "--config needs a value");
}

static void test_strings(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    char *longest = malloc(LS_CONFIG_PATH_MAX + 1);
    assert_non_null(longest);
    memset(longest, 'a', LS_CONFIG_PATH_MAX - 1);
    longest[LS_CONFIG_PATH_MAX - 1] = '\0';
    assert_int_equal(run(&c, ARGS("--adapter-dir", longest), NULL, err), LS_CONFIG_RUN);
    assert_int_equal(strlen(c.adapter_dir), LS_CONFIG_PATH_MAX - 1);
    strcat(longest, "a");
    expect_error(ARGS("--adapter-dir", longest), NULL, "--adapter-dir: value is longer than 4095 bytes");
    expect_error(ARGS("--config", longest), NULL, "--config: value is longer than 4095 bytes");
    free(longest);
    char host[300];
    memset(host, 'h', 256);
    host[256] = '\0';
    expect_error(ARGS("--host", host), NULL, "--host: value is longer than 255 bytes");
    expect_error(ARGS("--host", ""), NULL, "--host: value must not be empty");
    /* A too-long key is refused without being echoed. */
    char key[600];
    memset(key, 'k', 599);
    key[599] = '\0';
    assert_int_equal(run(&c, ARGS("--api-key", key), NULL, err), LS_CONFIG_ERROR);
    assert_null(strstr(err, "kkkk"));
}

/* Origins and host names a browser or Host can carry, and no other: a
 * default port (browsers leave it out of Origin) or one past 65535 never
 * matched, and a trailing comma was taken while a leading one was not. */
static void test_allowed_lists(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    const char *good[] = {"https://ui.example.com:8443,http://127.0.0.1:1", "http://[::1]:8080", "https://a.com", "*",
                          "http://[fe80::1]"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        if (run(&c, ARGS("--allowed-origins", good[i]), NULL, err) != LS_CONFIG_RUN) fail_msg("%s: %s", good[i], err);
    }
    const char *bad[][2] = {
        {"https://a.com:443", "names its scheme's default port"},
        {"http://a.com:80", "names its scheme's default port"},
        {"https://a.com:99999", "port that is not a number from 1 to 65535"},
        {"https://a.com:0", "port that is not a number from 1 to 65535"},
        {"https://a.com:", "port that is not a number from 1 to 65535"},
        {"https://:::", "has no host name"},
        {"https://[::1", "an IPv6 address goes in brackets"},
        {"ui.example.com", "does not begin with http:// or https://"},
        {"https://a.com,", "is empty (a comma too many)"},
        {",https://a.com", "is empty (a comma too many)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        expect_error(ARGS("--allowed-origins", bad[i][0]), NULL, bad[i][1]);
    assert_int_equal(run(&c, ARGS("--allowed-hosts", "a.com,b.example"), NULL, err), LS_CONFIG_RUN);
    expect_error(ARGS("--allowed-hosts", "a.com,"), NULL, "is empty (a comma too many)");
    expect_error(ARGS("--allowed-hosts", "a.com:8080"), NULL, "entry \"a.com:8080\" is not a host name");
    /* A control byte in an entry is quoted as '?': the error stays one printable line (fuzz_config found it). */
    expect_error(ARGS("--allowed-origins", "ui\x7f\x1b[2Jx"), NULL, "entry \"ui??[2Jx\" does not begin with http://");
}

static void test_demo_and_weights(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN], path[PATH_MAX];
    assert_int_equal(run(&c, ARGS("--weights", "/m.safetensors"), NULL, err), LS_CONFIG_RUN);
    assert_false(c.demo);
    assert_int_equal(run(&c, ARGS("--demo", "--weights", "/m.safetensors"), NULL, err), LS_CONFIG_ERROR);
    assert_string_equal(err, "--demo and --weights exclude each other");
    expect_error(NULL, ARGS("LORASINK_WEIGHTS=/m", "LORASINK_DEMO=true"),
                 "LORASINK_DEMO and LORASINK_WEIGHTS exclude each other");
    write_file("both.json", "{\"weights\": \"/m\", \"demo\": true}", path);
    expect_error(ARGS("--config", path), NULL, "demo and weights exclude each other");
    /* Across sources the higher one wins. */
    write_file("weights.json", "{\"weights\": \"/m\"}", path);
    assert_int_equal(run(&c, ARGS("--config", path), NULL, err), LS_CONFIG_RUN);
    assert_false(c.demo);
    assert_string_equal(c.weights, "/m");
    assert_int_equal(run(&c, ARGS("--config", path, "--demo"), NULL, err), LS_CONFIG_RUN);
    assert_true(c.demo);
    assert_string_equal(c.weights, "");
    assert_int_equal(run(&c, ARGS("--weights", "/f"), ARGS("LORASINK_DEMO=1"), err), LS_CONFIG_RUN);
    assert_false(c.demo);
    assert_string_equal(c.weights, "/f");
    /* Same source, demo=false with weights: consistent. */
    assert_int_equal(run(&c, ARGS("--demo=false", "--weights", "/f"), NULL, err), LS_CONFIG_RUN);
    assert_false(c.demo);
    /* No demo and no weights: nothing to serve. */
    expect_error(ARGS("--demo=false"), NULL, "demo is off but no weights file is given");
}

/* TLS settings go in pairs: a certificate with its key, client CAs only
 * with both; half of it is an error (exit 2), never plain HTTP. */
static void test_tls_pairs(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    assert_int_equal(run(&c, ARGS("--tls-cert", "/c.pem", "--tls-key", "/k.pem", "--tls-client-ca", "/ca.pem"), NULL,
                         err), LS_CONFIG_RUN);
    assert_string_equal(c.tls_cert, "/c.pem");
    assert_string_equal(c.tls_key, "/k.pem");
    assert_string_equal(c.tls_client_ca, "/ca.pem");
    assert_int_equal(run(&c, NULL, ARGS("LORASINK_TLS_CERT=/c", "LORASINK_TLS_KEY=/k"), err), LS_CONFIG_RUN);
    assert_string_equal(c.tls_key, "/k");
    expect_error(ARGS("--tls-cert", "/c.pem"), NULL, "--tls-cert is given without --tls-key");
    expect_error(ARGS("--tls-key", "/k.pem"), NULL, "--tls-key is given without --tls-cert");
    expect_error(NULL, ARGS("LORASINK_TLS_CLIENT_CA=/ca.pem"), "LORASINK_TLS_CLIENT_CA is given without --tls-cert");
    expect_error(NULL, ARGS("LORASINK_TLS_CERT=/c"),
                 "LORASINK_TLS_CERT is given without --tls-key (--tls-key, LORASINK_TLS_KEY or the file's \"tls_key\")");
    /* "" from a higher source turns a lower one's off: a pair again. */
    expect_error(ARGS("--tls-key="), ARGS("LORASINK_TLS_CERT=/c", "LORASINK_TLS_KEY=/k"),
                 "LORASINK_TLS_CERT is given without --tls-key");
}

static void test_file_errors(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN], path[PATH_MAX], want[PATH_MAX + 64];
    write_file("slotz.json", "{\"slots\": 3, \"slotz\": 3}", path);
    assert_int_equal(run(&c, ARGS("--config", path), NULL, err), LS_CONFIG_ERROR);
    snprintf(want, sizeof want, "%s: unknown key \"slotz\"; did you mean \"slots\"?", path);
    assert_string_equal(err, want);
    expect_error(ARGS("--config", write_file("dash.json", "{\"max-rank\": 8}", path)), NULL,
                 "unknown key \"max-rank\"");

    struct {
        const char *json, *want;
    } wrong[] = {
        {"{\"slots\": \"8\"}", "slots: expected an integer, got a string"},
        {"{\"slots\": 8.0}", "slots: expected an integer, got a real"},
        {"{\"demo\": 1}", "demo: expected true or false, got an integer"},
        {"{\"host\": 5}", "host: expected a string, got an integer"},
        {"{\"dtype\": [\"f32\"]}", "dtype: expected a string, got an array"},
        {"{\"seed\": -1}", "seed: \"-1\" is not an unsigned integer"},
        {"{\"max_rank\": 0}", "max_rank: 0 is out of range [1, 1024]"},
        {"{\"max_rank\": 99999999999}", "max_rank: 99999999999 is out of range [1, 1024]"},
        {"{\"device\": \"gpu\"}", "device: \"gpu\" is not one of auto, cpu, cuda"},
        {"[1, 2]", "the config file must hold a JSON object"},
        {"{\"slots\": 3,}", path},
        {"{\"slots\": 3, \"slots\": 4}", "duplicate"},
        {"", "the config file is empty"},
    };
    for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++) {
        char name[32];
        snprintf(name, sizeof name, "wrong%zu.json", i);
        write_file(name, wrong[i].json, path);
        assert_int_equal(run(&c, ARGS("--config", path), NULL, err), LS_CONFIG_ERROR);
        if (!strstr(err, wrong[i].want) || strncmp(err, path, strlen(path)))
            fail_msg("%s: error \"%s\" lacks \"%s\" or the path", wrong[i].json, err, wrong[i].want);
    }

    snprintf(path, sizeof path, "%s/missing.json", tmpdir);
    assert_int_equal(run(&c, ARGS("--config", path), NULL, err), LS_CONFIG_ERROR);
    snprintf(want, sizeof want, "%s: cannot open: ", path);
    assert_memory_equal(err, want, strlen(want));
    char env[PATH_MAX + 32];
    snprintf(env, sizeof env, "LORASINK_CONFIG=%s", path);
    expect_error(NULL, ARGS(env), "missing.json: cannot open");
    expect_error(ARGS("--config", tmpdir), NULL, "the config file is a directory");
    /* A FIFO blocked start-up until something wrote to it. */
    snprintf(path, sizeof path, "%s/fifo.json", tmpdir);
    assert_int_equal(mkfifo(path, 0600), 0);
    expect_error(ARGS("--config", path), NULL, "the config file is not a regular file");
    unlink(path);
    /* A byte-order mark (Windows editors write one) is skipped. */
    write_file("bom.json", "\xef\xbb\xbf{\"slots\": 3}", path);
    assert_int_equal(run(&c, ARGS("--config", path), NULL, err), LS_CONFIG_RUN);
    assert_int_equal(c.slots, 3);
}

/* ---- help, version, dump, example ------------------------------------------ */

static void test_help(void **state) {
    (void)state;
    ls_config c, defaults;
    char err[ERRLEN];
    char *out = NULL;
    assert_int_equal(run(&defaults, NULL, NULL, err), LS_CONFIG_RUN);
    /* --help wins even when later arguments are bad. */
    assert_int_equal(run_out(&c, ARGS("--port", "1", "--help", "--bogus"), NULL, err, &out), LS_CONFIG_EXIT);
    assert_non_null(strstr(out, "usage: lorasink"));
    assert_non_null(strstr(out, "LORASINK_CONFIG"));
    assert_non_null(strstr(out, "--version"));

    /* Every setting the dump lists has a help line with its flag, its
     * environment variable and its default. */
    char *d = dump_string(&defaults);
    json_t *j = json_loads(d, 0, NULL);
    assert_non_null(j);
    assert_true(json_object_size(j) >= 28);
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v) {
        char flag[64], env[64], def[64];
        snprintf(flag, sizeof flag, "  --%s", key);
        snprintf(env, sizeof env, "LORASINK_%s", key);
        for (char *p = flag; *p; p++)
            if (*p == '_') *p = '-';
        /* A list's key is the plural of its repeatable flag. */
        if (!strcmp(key, "adapters")) snprintf(flag, sizeof flag, "  --adapter NAME=PATH");
        for (char *p = env; *p; p++)
            *p = (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
        if (json_is_string(v)) {
            const char *s = json_string_value(v);
            snprintf(def, sizeof def, s[0] ? "default %s;" : "default \"%s\"", s);
        } else if (json_is_integer(v)) {
            snprintf(def, sizeof def, "default %" JSON_INTEGER_FORMAT ";", json_integer_value(v));
        } else if (json_is_array(v)) {
            snprintf(def, sizeof def, "default \"\"");
        } else {
            snprintf(def, sizeof def, "default %s;", json_is_true(v) ? "true" : "false");
        }
        char *line = strstr(out, flag);
        while (line && line[strlen(flag)] != ' ' && line[strlen(flag)] != '\n') line = strstr(line + 1, flag);
        if (!line) fail_msg("--help lacks %s", flag);
        /* Its entry: its wrapped lines, up to the next flag or section. */
        char *end = line + 1;
        while ((end = strchr(end, '\n')) && end[1] == ' ' && end[2] == ' ' && end[3] == ' ') end++;
        assert_non_null(end);
        *end = '\0';
        char entry[1024];
        snprintf(entry, sizeof entry, "%s", line);
        for (char *p = entry; *p; p++) /* a default may be wrapped after "default" */
            if (*p == '\n') *p = ' ';
        for (char *p = entry, *q = entry;; p++) { /* and the indent squeezed out */
            if (p > entry && *p == ' ' && p[-1] == ' ' && p > entry + strlen(flag)) continue;
            if (!(*q++ = *p)) break;
        }
        if (!strstr(entry, env) || !strstr(entry, def))
            fail_msg("help entry \"%s\" lacks %s or \"%s\"", entry, env, def);
        *end = '\n';
    }
    /* Sections, every line within 100 columns, the aliases one line each. */
    for (const char *t = out; *t;) {
        size_t n = strcspn(t, "\n");
        if (n > 100) fail_msg("--help line wider than 100 columns: %.*s", (int)n, t);
        t += n + (t[n] == '\n');
    }
    const char *const sections[] = {"\nModel and compute:\n", "\nPool and batching:\n", "\nAdapters:\n",
                                    "\nHTTP:\n", "\nLimits:\n", "\nOperations:\n"};
    const char *prev = out;
    for (size_t k = 0; k < sizeof sections / sizeof sections[0]; k++) {
        const char *at = strstr(out, sections[k]);
        if (!at || at < prev) fail_msg("--help lacks section %s in order", sections[k] + 1);
        prev = at;
    }
    assert_non_null(strstr(out, "\n  --max-loras N           vLLM's name for --slots\n"));
    assert_non_null(strstr(out, "\n  --max-cpu-loras N       vLLM's name for --host-cache\n"));
    assert_non_null(strstr(out, "\n  --max-lora-rank N       vLLM's name for --max-rank"));
    assert_non_null(strstr(out, "\n  --lora-modules NAME=PATH...\n"));
    json_decref(j);
    free(d);
    /* A few by hand, independent of the dump. */
    assert_non_null(strstr(out, "LORASINK_MAX_RANK"));
    assert_non_null(strstr(out, "default 64"));
    assert_non_null(strstr(out, "[1, 1024]"));
    assert_non_null(strstr(out, "auto|cpu|cuda"));
    assert_non_null(strstr(out, "LORASINK_W13_LAYOUT"));
    assert_non_null(strstr(out, "default interleaved"));
    free(out);

    assert_int_equal(run_out(&c, ARGS("-h"), NULL, err, &out), LS_CONFIG_EXIT);
    assert_non_null(strstr(out, "usage: lorasink"));
    free(out);
}

static void test_version(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    char *out = NULL;
    assert_int_equal(run_out(&c, ARGS("--version"), NULL, err, &out), LS_CONFIG_EXIT);
    assert_string_equal(out, "lorasink 0.1.0\n");
    free(out);
}

static void test_dump_masks_key(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    assert_int_equal(run(&c, ARGS("--api-key", "s3cret-value", "--slots", "3"), NULL, err), LS_CONFIG_RUN);
    char *d = dump_string(&c);
    assert_null(strstr(d, "s3cret"));
    assert_int_equal(strchr(d, '\n') - d, (long)strlen(d) - 1); /* one line */
    json_t *j = json_loads(d, 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "api_key")), "***");
    assert_int_equal(json_integer_value(json_object_get(j, "slots")), 3);
    assert_string_equal(json_string_value(json_object_get(j, "host")), "127.0.0.1");
    assert_true(json_is_true(json_object_get(j, "demo")));
    assert_null(json_object_get(j, "config_file"));
    json_decref(j);
    free(d);
    /* No key: shown as "", so a reader can tell auth is off. */
    assert_int_equal(run(&c, NULL, NULL, err), LS_CONFIG_RUN);
    d = dump_string(&c);
    j = json_loads(d, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "api_key")), "");
    json_decref(j);
    free(d);
}

/* A checkpoint's config dumps the demo sizes as null (not given), so the
 * dump loads back: a size beside --weights is refused. */
static void test_dump_of_weights_reads_back(void **state) {
    (void)state;
    ls_config c, back;
    char err[ERRLEN], path[PATH_MAX];
    assert_int_equal(run(&c, ARGS("--demo=false", "--weights", "/models/w.safetensors"), NULL, err), LS_CONFIG_RUN);
    char *d = dump_string(&c);
    json_t *j = json_loads(d, 0, NULL);
    assert_non_null(j);
    assert_true(json_is_null(json_object_get(j, "hidden")));
    assert_true(json_is_null(json_object_get(j, "seed")));
    json_decref(j);
    write_file("dumped.json", d, path);
    if (run(&back, ARGS("--config", path), NULL, err) != LS_CONFIG_RUN) fail_msg("%s", err);
    char *again = dump_string(&back);
    assert_string_equal(d, again);
    free(again);
    free(d);
}

static void test_example_file(void **state) {
    (void)state;
    const char *example = LS_TEST_DATA "/../../config/lorasink.example.json";
    ls_config loaded, defaults;
    char err[ERRLEN];
    assert_int_equal(run(&defaults, NULL, NULL, err), LS_CONFIG_RUN);
    if (run(&loaded, ARGS("--config", example), NULL, err) != LS_CONFIG_RUN) fail_msg("%s", err);
    char *a = dump_string(&loaded), *b = dump_string(&defaults);
    assert_string_equal(a, b);
    free(a);
    free(b);
    assert_string_equal(loaded.config_file, example);
    memset(loaded.config_file, 0, sizeof loaded.config_file);
    assert_memory_equal(&loaded, &defaults, sizeof loaded); /* w13_layout_set included */

    /* It lists every setting: the same keys as the dump. */
    json_t *ex = json_load_file(example, 0, NULL);
    assert_non_null(ex);
    char *d = dump_string(&defaults);
    json_t *dj = json_loads(d, 0, NULL);
    assert_int_equal(json_object_size(ex), json_object_size(dj));
    const char *key;
    json_t *v;
    json_object_foreach(dj, key, v) {
        if (!json_object_get(ex, key)) fail_msg("the example lacks %s", key);
    }
    json_decref(ex);
    json_decref(dj);
    free(d);
}

/* The entries of cfg->adapters as "name=path[,pinned]|..." into buf. */
static const char *adapters_of(const ls_config *cfg, char *buf, size_t len) {
    const char *cursor = cfg->adapters;
    ls_config_adapter e;
    buf[0] = '\0';
    while (ls_config_adapter_next(&cursor, &e)) {
        size_t used = strlen(buf);
        int n = snprintf(buf + used, len - used, "%s%s=%s%s", used ? "|" : "", e.name, e.path,
                         e.pinned ? ",pinned" : "");
        assert_true(n >= 0 && (size_t)n < len - used);
    }
    return buf;
}

/* --adapter repeats and appends; the variable takes ';'-separated entries;
 * the file takes strings and objects; a higher source replaces a lower
 * one's list whole; malformed entries are one-line errors. */
static void test_adapter_list(void **state) {
    (void)state;
    ls_config *c = malloc(sizeof *c);
    assert_non_null(c);
    char err[ERRLEN], got[512], path[PATH_MAX];
    assert_int_equal(run(c, ARGS("--adapter", "a=x/y,pinned", "--adapter=b=z"), NULL, err), LS_CONFIG_RUN);
    assert_string_equal(adapters_of(c, got, sizeof got), "a=x/y,pinned|b=z");

    const char *env[] = {"LORASINK_ADAPTERS=e1=p1;e2=p2,pinned;", NULL};
    assert_int_equal(run(c, NULL, env, err), LS_CONFIG_RUN);
    assert_string_equal(adapters_of(c, got, sizeof got), "e1=p1|e2=p2,pinned");
    assert_int_equal(run(c, ARGS("--adapter", "f=p"), env, err), LS_CONFIG_RUN);
    assert_string_equal(adapters_of(c, got, sizeof got), "f=p");

    write_file("list.json", "{\"adapters\": [\"s=p\", {\"name\": \"o\", \"path\": \"q\", \"pinned\": true}]}", path);
    assert_int_equal(run(c, ARGS("--config", path), NULL, err), LS_CONFIG_RUN);
    assert_string_equal(adapters_of(c, got, sizeof got), "s=p|o=q,pinned");
    assert_int_equal(run(c, ARGS("--config", path), env, err), LS_CONFIG_RUN);
    assert_string_equal(adapters_of(c, got, sizeof got), "e1=p1|e2=p2,pinned");

    /* The dump has the file's form and reads back the same. */
    assert_int_equal(run(c, ARGS("--config", path), NULL, err), LS_CONFIG_RUN);
    char *d = dump_string(c);
    assert_non_null(strstr(d, "\"adapters\": [\"s=p\", \"o=q,pinned\"]"));
    free(d);

    const char *bad[] = {"noequals", "=p", "n=", "n=,pinned", NULL};
    for (int i = 0; bad[i]; i++) {
        assert_int_equal(run(c, ARGS("--adapter", bad[i]), NULL, err), LS_CONFIG_ERROR);
        assert_non_null(strstr(err, "--adapter"));
    }
    /* A name no adapter may have is a setting error (exit 2), not a
     * failure of the server to start (it was exit 1 after the model had
     * been built). */
    const char *badname[] = {"bad name=p", ".hidden=p", "a/b/c=p", "Acme/b=p", "/b=p", "acme/=p", NULL};
    for (int i = 0; badname[i]; i++) {
        assert_int_equal(run(c, ARGS("--adapter", badname[i]), NULL, err), LS_CONFIG_ERROR);
        assert_non_null(strstr(err, "is not NAME or TENANT/NAME"));
    }
    /* A tenant's adapter, as an admin names it in a request. */
    assert_int_equal(run(c, ARGS("--adapter", "acme/a=dir,pinned"), NULL, err), LS_CONFIG_RUN);
    assert_string_equal(adapters_of(c, got, sizeof got), "acme/a=dir,pinned");
    /* A name given twice (which loaded the second as version 2) in any
     * source is an error naming it. */
    assert_int_equal(run(c, ARGS("--adapter", "x=a", "--adapter", "x=b,pinned"), NULL, err), LS_CONFIG_ERROR);
    assert_non_null(strstr(err, "adapter \"x\" is given twice"));
    const char *twice[] = {"LORASINK_ADAPTERS=d=p;e=q;d=r", NULL};
    assert_int_equal(run(c, NULL, twice, err), LS_CONFIG_ERROR);
    assert_non_null(strstr(err, "LORASINK_ADAPTERS"));
    write_file("twice.json", "{\"adapters\": [\"s=p\", {\"name\": \"s\", \"path\": \"q\"}]}", path);
    assert_int_equal(run(c, ARGS("--config", path), NULL, err), LS_CONFIG_ERROR);
    assert_non_null(strstr(err, "\"s\" is given twice"));
    write_file("bad.json", "{\"adapters\": [{\"name\": \"a=b\", \"path\": \"p\"}]}", path);
    assert_int_equal(run(c, ARGS("--config", path), NULL, err), LS_CONFIG_ERROR);
    write_file("bad2.json", "{\"adapters\": [{\"name\": \"a\", \"path\": \"p\", \"pin\": true}]}", path);
    assert_int_equal(run(c, ARGS("--config", path), NULL, err), LS_CONFIG_ERROR);
    write_file("bad3.json", "{\"adapters\": 3}", path);
    assert_int_equal(run(c, ARGS("--config", path), NULL, err), LS_CONFIG_ERROR);
    /* An object's path that ends like the pin suffix would be read as a
     * pin on a shorter path: refused instead. */
    write_file("bad4.json", "{\"adapters\": [{\"name\": \"a\", \"path\": \"w,pinned\", \"pinned\": false}]}", path);
    assert_int_equal(run(c, ARGS("--config", path), NULL, err), LS_CONFIG_ERROR);
    assert_non_null(strstr(err, ",pinned"));

    /* A string element holding many entries is taken whole, not cut at a
     * fixed size (the last entry keeps its path and pin). */
    char *many = malloc(16384);
    assert_non_null(many);
    int used = snprintf(many, 16384, "{\"adapters\": [\"");
    for (int i = 0; i < 200; i++) used += snprintf(many + used, 16384 - (size_t)used, "n%d=some/longer/path/%d;", i, i);
    snprintf(many + used, 16384 - (size_t)used, "last=final/path.safetensors,pinned\"]}");
    write_file("many.json", many, path);
    free(many);
    assert_int_equal(run(c, ARGS("--config", path), NULL, err), LS_CONFIG_RUN);
    const char *cursor = c->adapters;
    ls_config_adapter e, last = {0};
    int count = 0;
    while (ls_config_adapter_next(&cursor, &e)) last = e, count++;
    assert_int_equal(count, 201);
    assert_string_equal(last.name, "last");
    assert_string_equal(last.path, "final/path.safetensors");
    assert_true(last.pinned);
    free(c);
}

/* Issue 26: vLLM's flag names as aliases, "did you mean" for flags and
 * file keys, a boolean's value given apart, demo sizes with --weights. */
static void test_peers_and_mistakes(void **state) {
    (void)state;
    ls_config c;
    char err[ERRLEN];
    if (run(&c, ARGS("--max-loras", "3", "--max-lora-rank", "16", "--max-cpu-loras", "9"), NULL, err) !=
        LS_CONFIG_RUN)
        fail_msg("%s", err);
    assert_int_equal(c.slots, 3);
    assert_int_equal(c.max_rank, 16);
    assert_int_equal(c.host_cache, 9);
    /* ... and the start-up log can say each was read so. */
    assert_string_equal(c.aliases_used, "--max-loras as --slots, --max-lora-rank as --max-rank, "
                                        "--max-cpu-loras as --host-cache");
    assert_int_equal(run(&c, ARGS("--max-loras=4"), NULL, err), LS_CONFIG_RUN);
    assert_int_equal(c.slots, 4);
    /* vLLM's --lora-modules takes several entries after one flag. */
    char got[256];
    if (run(&c, ARGS("--lora-modules", "a=x", "b=y,pinned", "--slots", "2"), NULL, err) != LS_CONFIG_RUN)
        fail_msg("%s", err);
    assert_string_equal(adapters_of(&c, got, sizeof got), "a=x|b=y,pinned");
    assert_int_equal(c.slots, 2);
    /* ... and vLLM's JSON entries, beside NAME=PATH ones. */
    if (run(&c,
            ARGS("--lora-modules",
                 "{\"name\": \"a\", \"path\": \"x\", \"base_model_name\": \"org/m\", \"is_3d_lora_weight\": false}", "b=y",
                 "{\"path\": \"z\", \"name\": \"c\", \"pinned\": true}", "{\"name\": \"d\", \"path\": \"w\", \"base_model_name\": null}"),
            NULL, err) != LS_CONFIG_RUN)
        fail_msg("%s", err);
    assert_string_equal(adapters_of(&c, got, sizeof got), "a=x|b=y|c=z,pinned|d=w");
    /* One JSON entry is one adapter, as given: "=", ";", a newline or a
     * final ",pinned" made it another adapter, two, or a pinned one. */
    const char *split[] = {"{\"name\": \"a=b\", \"path\": \"x\"}", "{\"name\": \"a\", \"path\": \"x;b=y\"}",
                           "{\"name\": \"a\", \"path\": \"x,pinned\"}", "{\"name\": \"a\", \"path\": \"x\\ny\"}"};
    for (size_t i = 0; i < sizeof split / sizeof *split; i++)
        expect_error(ARGS("--lora-modules", split[i]), NULL, "--lora-modules: in a JSON entry a name may not hold '='");
    expect_error(ARGS("--lora-modules", "{\"name\": \"a\"}"), NULL, "--lora-modules: a JSON entry needs \"path\"");
    expect_error(ARGS("--lora-modules", "a=x", "{\"path\": \"x\"}"), NULL,
                 "--lora-modules: a JSON entry needs \"name\"");
    expect_error(ARGS("--lora-modules", "{\"name\": \"a\", \"pth\": \"x\"}"), NULL,
                 "--lora-modules: unknown key \"pth\" in a JSON entry; did you mean \"path\"?");
    expect_error(ARGS("--lora-modules", "{\"name\": \"a\", \"path\": 3}"), NULL,
                 "--lora-modules: \"path\" of a JSON entry must be a non-empty string");
    expect_error(ARGS("--lora-modules", "{\"name\": \"a\", \"path\": \"x\", \"is_3d_lora_weight\": \"no\"}"), NULL,
                 "--lora-modules: \"is_3d_lora_weight\" of a JSON entry must be true or false");
    expect_error(ARGS("--lora-modules", "{\"name\": \"a\", \"name\": \"b\", \"path\": \"x\"}"), NULL,
                 "--lora-modules: an entry that starts with '{' must be a JSON object");
    expect_error(ARGS("--lora-modules", "{\"name\": \"a\""), NULL,
                 "--lora-modules: an entry that starts with '{' must be a JSON object");
    expect_error(ARGS("--lora-modules", "{\"name\": \"a\", \"path\": \"x\"}", "{bad"), NULL,
                 "--lora-modules: an entry that starts with '{' must be a JSON object");
    /* sglang's --lora-paths: NAME=PATH, a bare NAME (also its path), its
     * JSON entry; a bare path with '/' names no adapter the API can
     * spell. */
    if (run(&c,
            ARGS("--lora-paths", "a=x", "b", "{\"lora_name\": \"c\", \"lora_path\": \"z\", \"pinned\": true}",
                 "--max-loras-per-batch", "3"),
            NULL, err) != LS_CONFIG_RUN)
        fail_msg("%s", err);
    assert_string_equal(adapters_of(&c, got, sizeof got), "a=x|b=b|c=z,pinned");
    assert_int_equal(c.slots, 3);
    assert_string_equal(c.aliases_used, "--lora-paths as --adapter, --max-loras-per-batch as --slots");
    expect_error(ARGS("--lora-paths", "/data/loras/a"), NULL,
                 "--lora-paths: \"/data/loras/a\" is a path with '/', which lorasink's adapter names never hold; a "
                 "bare entry is sglang's path that is also the adapter's name: write NAME=PATH");
    /* Each bare entry is refused for its own reason, quoted as typed
     * (control bytes as '?'); so is a JSON entry's unknown key. */
    expect_error(ARGS("--lora-paths", ""), NULL, "--lora-paths: \"\" is empty;");
    expect_error(ARGS("--lora-paths", "a b"), NULL, "--lora-paths: \"a b\" is no adapter name lorasink takes");
    expect_error(ARGS("--lora-paths", "a;b"), NULL, "--lora-paths: \"a;b\" is no adapter name");
    expect_error(ARGS("--lora-paths", "x\x1b[31m/b"), NULL, "--lora-paths: \"x?[31m/b\" is a path with '/'");
    expect_error(ARGS("--lora-modules", "{\"nam\\u001b[2J\": \"a\"}"), NULL,
                 "--lora-modules: unknown key \"nam?[2J\" in a JSON entry");
    expect_error(ARGS("--lora-paths", "{\"name\": \"a\", \"path\": \"x\"}"), NULL,
                 "--lora-paths: unknown key \"name\" in a JSON entry");
    expect_error(ARGS("--lora-paths", "{\"lora_name\": \"a\"}"), NULL, "--lora-paths: a JSON entry needs \"lora_path\"");
    expect_error(ARGS("--lora-paths", "a=x", "--lora-modules", "b=y"), NULL,
                 "--lora-paths is sglang's name for --adapter, and --lora-modules is given too");
    expect_error(ARGS("--max-loras"), NULL, "--max-loras needs a value");
    /* Both names of one setting: which stood depended on their order. */
    expect_error(ARGS("--slots", "4", "--max-loras", "6"), NULL,
                 "--max-loras is vLLM's name for --slots, and --slots is given too: give one of them");
    expect_error(ARGS("--lora-modules", "a=x", "--adapter", "b=y"), NULL, "--lora-modules is vLLM's name for --adapter");
    assert_int_equal(run(&c, ARGS("--slots", "4", "--slots", "6"), NULL, err), LS_CONFIG_RUN);
    assert_int_equal(c.slots, 6); /* one name twice: the last wins, as documented */
    expect_error(ARGS("--max-loras", "0"), NULL, "--max-loras: 0 is out of range [1, 1024]");
    expect_error(ARGS("--lora-modules", "a=x", "b"), NULL, "--lora-modules: \"b\" is not NAME=PATH[,pinned]");
    /* A misspelt pin was taken as part of the path ("A,pined" not found). */
    expect_error(ARGS("--adapter", "a=x,pined"), NULL,
                 "--adapter: \"a=x,pined\" ends in a ',' and a near miss of \"pinned\": write NAME=PATH,pinned");
    assert_int_equal(run(&c, ARGS("--adapter", "a=x,y.safetensors"), NULL, err), LS_CONFIG_RUN);

    expect_error(ARGS("--max-rnak", "8"), NULL, "unknown flag --max-rnak; did you mean --max-rank?");
    expect_error(ARGS("--max_lora_rank", "8"), NULL, "did you mean --max-lora-rank?");
    expect_error(ARGS("--slot", "8"), NULL, "unknown flag --slot; did you mean --slots?");
    expect_error(ARGS("--bogus", "8"), NULL, "unknown flag --bogus (see lorasink --help)");

    expect_error(ARGS("--demo", "false"), NULL,
                 "unexpected argument \"false\": a boolean flag alone means true; write --demo=false");
    expect_error(ARGS("--batching", "0"), NULL, "write --batching=0");
    expect_error(ARGS("--port", "1", "false"), NULL, "unexpected argument \"false\" (see lorasink --help)");
    expect_error(ARGS("--access-log", "off"), NULL, "write --access-log=false");
    /* A flag's value is never the next flag: "--api-key --probe" served
     * with the key "--probe" instead of probing. */
    expect_error(ARGS("--api-key", "--probe"), NULL,
                 "--api-key needs a value, and --probe is a flag (write --api-key=--probe if the value is that)");
    expect_error(ARGS("--weights", "--demo"), NULL, "--weights needs a value, and --demo is a flag");
    expect_error(ARGS("--api-key", "--port", "9000"), NULL, "--api-key needs a value, and --port is a flag");
    expect_error(ARGS("--max-lora-rank", "-h"), NULL, "--max-lora-rank needs a value, and -h is a flag");
    expect_error(ARGS("--lora-modules", "--slots", "3"), NULL, "--lora-modules needs a value, and --slots is a flag");
    assert_int_equal(run(&c, ARGS("--api-key=--probe"), NULL, err), LS_CONFIG_RUN);
    assert_string_equal(c.api_key, "--probe");
    assert_int_equal(run(&c, ARGS("--api-key", "--not-a-flag"), NULL, err), LS_CONFIG_RUN);
    expect_error(ARGS("--probe=true"), NULL, "--probe takes no value");
    expect_error(ARGS("--help=1"), NULL, "--help takes no value");

    expect_error(ARGS("--weights", "ckpt", "--hidden", "2048"), NULL,
                 "--hidden sets the demo model, and --weights serves a checkpoint");
    /* Named as it was given: the user never typed --experts here. */
    expect_error(ARGS("--weights", "ckpt"), ARGS("LORASINK_EXPERTS=4"),
                 "LORASINK_EXPERTS sets the demo model, and --weights serves a checkpoint");
    expect_error(ARGS("--weights", "ckpt"), ARGS("LORASINK_EXPERTS=4"),
                 "drop it (--experts, LORASINK_EXPERTS or the file's \"experts\")");
    /* Not given (or null in the file): nothing to refuse. */
    char path[PATH_MAX];
    write_file("sizes.json", "{\"hidden\": null, \"seed\": null}", path);
    assert_int_equal(run(&c, ARGS("--config", path, "--weights", "ckpt"), NULL, err), LS_CONFIG_RUN);
    write_file("sizes2.json", "{\"layers\": 3}", path);
    expect_error(ARGS("--config", path, "--weights", "ckpt"), NULL, "sizes2.json: layers sets the demo model");
    expect_error(ARGS("--config", path, "--weights", "ckpt"), NULL, "or give it in the file as null");
    /* The demo takes them, of course. */
    assert_int_equal(run(&c, ARGS("--hidden", "64"), NULL, err), LS_CONFIG_RUN);

    write_file("near.json", "{\"max_rnak\": 2}", path);
    expect_error(ARGS("--config", path), NULL, "unknown key \"max_rnak\"; did you mean \"max_rank\"?");
    write_file("vllm.json", "{\"max_loras\": 2}", path); /* aliases are flags only */
    expect_error(ARGS("--config", path), NULL, "unknown key \"max_loras\"; did you mean \"slots\"?");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adapter_list),
        cmocka_unit_test(test_peers_and_mistakes),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_flags_alone),
        cmocka_unit_test(test_env_alone),
        cmocka_unit_test(test_file_alone),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_equals_form),
        cmocka_unit_test(test_bools),
        cmocka_unit_test(test_enums),
        cmocka_unit_test(test_unknown_flag_and_positionals),
        cmocka_unit_test(test_bad_numbers),
        cmocka_unit_test(test_out_of_range),
        cmocka_unit_test(test_host_is_numeric),
        cmocka_unit_test(test_missing_value),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_allowed_lists),
        cmocka_unit_test(test_demo_and_weights),
        cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_tls_pairs),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_dump_masks_key),
        cmocka_unit_test(test_dump_of_weights_reads_back),
        cmocka_unit_test(test_example_file),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
