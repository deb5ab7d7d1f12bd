/* PEFT's config rules: the regular-expression engine against Python's
 * re.match (the answers below are Python 3.11's), what it refuses rather
 * than guess, rank_pattern/alpha_pattern parsing (first key wins), the
 * keys refused because they change the math (DoRA, lora_bias,
 * base-modifying initialisations, LoRA variants, a modules_to_save entry
 * that is no name, another peft_type), and the rules in a __metadata__.
 * Which modules a modules_to_save entry saved is read from the tensors
 * (test_adapter.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lora/adapter_config.h"
#include "lora/adapter_regex.h"
#include "lora/adapter_rules.h"

#define SE "model.layers.0.mlp.shared_experts."

static const struct {
    const char *pattern, *subject;
    int python;
} re_cases[] = {
    {"(.*\\.)?(gate_proj)$", SE "gate_proj", 1},
    {"(.*\\.)?(gate_proj)$", SE "gate_up_proj", 0},
    {"(.*\\.)?(up_proj)$", SE "gate_up_proj", 0},
    {"(.*\\.)?(proj)$", SE "gate_proj", 0},
    {"(.*\\.)?(layers.1.mlp.shared_experts.gate_proj)$", "model.layers.1.mlp.shared_experts.gate_proj", 1},
    {"(.*\\.)?(layers.1.mlp.shared_experts.gate_proj)$", "model.layers.11.mlp.shared_experts.gate_proj", 0},
    {"(.*\\.)?(layers.1.mlp.shared_experts.gate_proj)$", "model.layersX1Ymlp.shared_experts.gate_proj", 1},
    {"(.*\\.)?(.*\\.shared_expert\\.(gate_proj|up_proj|down_proj))$", "model.layers.3.mlp.shared_expert.up_proj", 1},
    {"(.*\\.)?(.*\\.shared_expert\\.(gate_proj|up_proj|down_proj))$", "model.layers.3.mlp.shared_experts.up_proj", 0},
    {"(.*\\.)?(layers\\.\\d{1,2}\\.mlp\\.shared_experts\\.(gate|up)_proj)$",
     "model.layers.12.mlp.shared_experts.up_proj", 1},
    {"(.*\\.)?(layers\\.\\d{1,2}\\.mlp\\.shared_experts\\.(gate|up)_proj)$",
     "model.layers.123.mlp.shared_experts.up_proj", 0},
    {"(.*\\.)?(q_proj|gate_proj)$", SE "gate_proj", 1},
    {"(.*\\.)?(up_proj)|(q)$", SE "up_projX", 1},
    {"(.*\\.)?([gu][a-z]+_proj)$", SE "up_proj", 1},
    {"(.*\\.)?([^.]+)$", SE "up_proj", 1},
    {"(.*\\.)?((?:gate|up)_proj)$", SE "down_proj", 0},
    {"(.*\\.)?((?P<m>gate)_proj)$", SE "gate_proj", 1},
    {"(.*\\.)?(^model.*gate_proj)$", SE "gate_proj", 1},
    {"(.*\\.)?(^layers.*gate_proj)$", SE "gate_proj", 0},
    {"(.*\\.)?(gate_proj\\Z)$", SE "gate_proj", 1},
    {"(.*\\.)?(x{0}gate_proj)$", SE "gate_proj", 1},
    {"(.*\\.)?(a{,2}gate_proj)$", SE "aagate_proj", 1},
    {"(.*\\.)?(gate_proj{)$", SE "gate_proj{", 1},
    {"(.*\\.)?(gate_proj{1,x})$", SE "gate_proj{1,x}", 1},
    {"(.*\\.)?([]a]+)$", "x.a]a", 1},
    {"(.*\\.)?([a-]+)$", "x.a-a", 1},
    {"(.*\\.)?([\\d.]+)$", "x.1.2", 1},
    {"(.*\\.)?(\\w+)$", "x.ab_1", 1},
    {"(.*\\.)?(\\s)$", "x.\x1c", 1},
    {"(.*\\.)?(|gate_proj)$", SE "gate_proj", 1},
    {"(.*\\.)?(mlp\\..*)$", SE "gate_proj", 1},
    {"(.*\\.)?(a*?b)$", "x.aab", 1},
    {"a$", "a\n", 1},
    {"a\\Z", "a\n", 0},
    {".", "\n", 0},
    {"(^)*model", "model", 1},
};

static void test_regex_as_python(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof re_cases / sizeof *re_cases; i++) {
        ls_regex *re;
        char why[160];
        if (!ls_regex_compile(re_cases[i].pattern, &re, why, sizeof why))
            fail_msg("%s does not compile: %s", re_cases[i].pattern, why);
        if (ls_regex_match(re, re_cases[i].subject) != re_cases[i].python)
            fail_msg("re.match(%s, %s) is %d in Python", re_cases[i].pattern, re_cases[i].subject,
                     re_cases[i].python);
        ls_regex_free(re);
    }
}

/* Python's errors stay errors; what Python evaluates but this engine
 * cannot is refused with a reason; non-ASCII text is not guessed at. */
static void test_regex_refusals(void **state) {
    (void)state;
    const char *bad[] = {"*", "a**", "(a", "a)", "[a", "[z-a]", "a{3,1}", "\\q", "^*",
                         "(?=a)", "(?!a)", "(?<=a)b", "(?i)a", "\\1", "a*+", "(?>a)", "\\bx", "\xc3\xa9"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ls_regex *re = NULL;
        char why[160] = "";
        if (ls_regex_compile(bad[i], &re, why, sizeof why)) fail_msg("%s compiled", bad[i]);
        assert_null(re);
        assert_true(why[0] != '\0');
    }
    ls_regex *re;
    char why[160];
    /* Counts of any length are read without overflow (UBSan in the
     * sanitizer build) and refused past the largest taken. */
    const char *huge[] = {"a{99999999999999999999}", "a{1,99999999999999999999}", "a{99999999999999999999,}"};
    for (size_t i = 0; i < sizeof huge / sizeof *huge; i++) {
        re = NULL;
        assert_false(ls_regex_compile(huge[i], &re, why, sizeof why));
        assert_non_null(strstr(why, "repeat counts above"));
    }
    assert_true(ls_regex_compile(".*", &re, why, sizeof why));
    assert_int_equal(ls_regex_match(re, "caf\xc3\xa9"), -1);
    ls_regex_free(re);
}

static ls_status parse(const char *text, ls_adapter_params *p, ls_error *err) {
    memset(p, 0, sizeof *p);
    ls_error_clear(err);
    return ls_adapter_config_parse_text(text, p, err);
}

static const ls_violation *find(const ls_error *err, const char *a, const char *b) {
    for (size_t i = 0; i < err->n_violations; i++) {
        const ls_violation *v = &err->violations[i];
        if (v->code == LS_ADAPTER_CONFIG_INVALID && strstr(v->message, a) && (!b || strstr(v->message, b)) &&
            v->hint[0])
            return v;
    }
    for (size_t i = 0; i < err->n_violations; i++) print_message("  %s\n", err->violations[i].message);
    fail_msg("no violation with \"%s\"", a);
    return NULL;
}

/* Keys that concern the shared experts are kept in order; the others
 * (attention, routed experts) are dropped; the first match wins. */
static void test_patterns_kept_in_order(void **state) {
    (void)state;
    ls_adapter_params p;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(parse("{\"r\": 8, \"lora_alpha\": 16, \"rank_pattern\": {\"q_proj\": 4, \"layers.1.mlp.shared_"
                           "experts.gate_proj\": 2, \"gate_proj\": 6, \"experts.0.w1\": 3}, \"alpha_pattern\": "
                           "{\"down_proj\": 32}}",
                           &p, &err),
                     LS_OK);
    assert_null(strstr(p.peft, "q_proj"));
    assert_null(strstr(p.peft, "w1"));
    ls_peft_rules *r;
    assert_int_equal(ls_peft_rules_load(p.peft, &r, &err), LS_OK);
    const char *key;
    assert_int_equal(ls_peft_rules_rank(r, "model.layers.1.mlp.shared_experts.gate_proj", &key), 2);
    assert_string_equal(key, "layers.1.mlp.shared_experts.gate_proj");
    assert_int_equal(ls_peft_rules_rank(r, "model.layers.11.mlp.shared_experts.gate_proj", &key), 6);
    assert_int_equal(ls_peft_rules_rank(r, "model.layers.1.mlp.shared_experts.up_proj", &key), 0);
    assert_null(key);
    double alpha = 0;
    assert_true(ls_peft_rules_alpha(r, "model.layers.1.mlp.shared_expert.down_proj", &alpha, NULL));
    assert_true(alpha == 32);
    ls_peft_rules_free(r);
    ls_error_free(&err);
}

/* Factors PEFT put on a weight parameter (target_parameters, the way to
 * DeepSeek's shared experts on transformers 5): PEFT matches the patterns
 * against "{module}.weight" and ignores layers_to_transform for them. */
static void test_target_parameters(void **state) {
    (void)state;
    ls_adapter_params p;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(parse("{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": null, \"target_parameters\": "
                           "[\"mlp.shared_experts.up_proj.weight\"], \"rank_pattern\": {\"up_proj\": 6, "
                           "\"down_proj.weight\": 2, \"up_proj.weight\": 5}}",
                           &p, &err),
                     LS_OK);
    ls_peft_rules *r;
    assert_int_equal(ls_peft_rules_load(p.peft, &r, &err), LS_OK);
    assert_int_equal(ls_peft_rules_rank(r, "model.layers.0.mlp.shared_experts.up_proj", NULL), 5);
    /* down_proj is no target parameter: its module name is matched */
    assert_int_equal(ls_peft_rules_rank(r, "model.layers.0.mlp.shared_experts.down_proj", NULL), 0);
    ls_peft_rules_free(r);
    ls_error_free(&err);
}

/* target_modules and exclude_modules only check: a config whose
 * patterns fill the kept text loads as it did before they were kept
 * (they are dropped then), never refused as too long. */
static void test_scopes_never_overflow(void **state) {
    (void)state;
    char text[12000];
    size_t n = (size_t)snprintf(text, sizeof text, "{\"r\": 8, \"lora_alpha\": 16, \"rank_pattern\": {");
    /* About 7000 bytes of patterns, and 1900 of full names in
     * target_modules: together past the 8 KiB kept, apart within it. */
    for (int l = 0; l < 140; l++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%s\"layers.%d.mlp.shared_experts.gate_proj\": 2", l ? ", " : "",
                              l);
    n += (size_t)snprintf(text + n, sizeof text - n, "}, \"target_modules\": [");
    for (int l = 0; l < 40; l++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%s\"model.layers.%d.mlp.shared_experts.gate_proj\"",
                              l ? ", " : "", l);
    snprintf(text + n, sizeof text - n, "]}");
    ls_adapter_params p;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(parse(text, &p, &err), LS_OK);
    assert_null(strstr(p.peft, "\"targets\""));
    assert_non_null(strstr(p.peft, "layers.139.mlp"));
    ls_error_free(&err);
}

/* Each refused key is named with its reason, all at once. */
static void test_refusals(void **state) {
    (void)state;
    ls_adapter_params p;
    ls_error err;
    ls_error_init(&err);
    const char *cfg = "{\"r\": 8, \"lora_alpha\": 16, \"use_dora\": true, \"lora_bias\": true, "
                      "\"init_lora_weights\": \"pissa_niter_4\", \"modules_to_save\": [\"lm_head\", 3], "
                      "\"alora_invocation_tokens\": [1, 2], \"layer_replication\": [[0, 2]], "
                      "\"rank_pattern\": {\"(?=gate)gate_proj\": 4, \"up_proj\": 0}, \"layers_pattern\": \"layers\"}";
    assert_int_equal(parse(cfg, &p, &err), LS_ADAPTER_CONFIG_INVALID);
    find(&err, "\"use_dora\"", "DoRA");
    find(&err, "\"lora_bias\"", NULL);
    const ls_violation *v = find(&err, "\"init_lora_weights\"", "PiSSA");
    assert_non_null(strstr(v->hint, "path_initial_model_for_weight_conversion"));
    find(&err, "\"modules_to_save\"", "entry 2 must be a module name");
    find(&err, "\"alora_invocation_tokens\"", NULL);
    find(&err, "\"layer_replication\"", NULL);
    find(&err, "\"rank_pattern\"", "look-around");
    find(&err, "\"rank_pattern\"", "positive integer");
    find(&err, "\"layers_pattern\"", "without layers_to_transform");
    assert_int_equal(err.n_violations, 9);
    /* Another adapter type: that alone is said, not its missing r or
     * lora_alpha; PEFT's own type names are quoted, a file's other text
     * never. */
    assert_int_equal(parse("{\"peft_type\": \"LOHA\", \"alpha\": 8}", &p, &err), LS_ADAPTER_CONFIG_INVALID);
    find(&err, "\"peft_type\"", "is LOHA");
    assert_int_equal(err.n_violations, 1);
    assert_int_equal(parse("{\"peft_type\": \"SHIRA\", \"r\": 8}", &p, &err), LS_ADAPTER_CONFIG_INVALID);
    find(&err, "\"peft_type\"", "is SHIRA"); /* one of peft 0.21's newer types */
    assert_int_equal(parse("{\"peft_type\": \"s3cret\", \"r\": 8}", &p, &err), LS_ADAPTER_CONFIG_INVALID);
    const ls_violation *t = find(&err, "\"peft_type\"", "not \"LORA\"");
    assert_null(strstr(t->message, "s3cret"));
    assert_int_equal(err.n_violations, 1);
    /* every initialisation that changes the base weights, by its name */
    const char *inits[][2] = {{"pissa", "PiSSA"}, {"olora", "OLoRA"}, {"corda", "CorDA"}, {"loftq", "LoftQ"},
                              {"lora_ga", "LoRA-GA"}};
    for (size_t i = 0; i < sizeof inits / sizeof *inits; i++) {
        char text[128];
        snprintf(text, sizeof text, "{\"r\": 8, \"lora_alpha\": 16, \"init_lora_weights\": \"%s\"}", inits[i][0]);
        ls_error_clear(&err);
        assert_int_equal(parse(text, &p, &err), LS_ADAPTER_CONFIG_INVALID);
        find(&err, "\"init_lora_weights\"", inits[i][1]);
        assert_int_equal(err.n_violations, 1);
    }
    /* What PEFT writes after converting at save time is a plain delta. */
    assert_int_equal(parse("{\"r\": 16, \"lora_alpha\": 32, \"init_lora_weights\": true, \"use_dora\": false, "
                           "\"modules_to_save\": [\"lm_head\", \"embed_tokens\", \"score\"], \"peft_type\": \"LORA\", "
                           "\"init_lora_weights\": true}",
                           &p, &err),
                     LS_ADAPTER_CONFIG_INVALID); /* a duplicate key: refused as such */
    assert_int_equal(parse("{\"r\": 16, \"lora_alpha\": 32, \"init_lora_weights\": \"mica\", \"use_dora\": false, "
                           "\"modules_to_save\": [\"lm_head\", \"embed_tokens\", \"score\"], \"peft_type\": \"LORA\", "
                           "\"layer_replication\": null, \"alora_invocation_tokens\": null}",
                           &p, &err),
                     LS_OK);
    ls_error_free(&err);
}

/* A raw upload's __metadata__ carries the rules as JSON text. */
static void test_rules_from_metadata(void **state) {
    (void)state;
    ls_tensor_set t;
    ls_tensor_set_init(&t);
    assert_true(ls_tensor_set_add_meta(&t, "rank_pattern", "{\"up_proj\": 4}"));
    assert_true(ls_tensor_set_add_meta(&t, "layers_to_transform", "[1, 2]"));
    ls_adapter_params p;
    memset(&p, 0, sizeof p);
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(ls_adapter_params_rules_from_meta(&t, "the body's __metadata__", &p, &err), LS_OK);
    assert_true(p.has_peft);
    ls_peft_rules *r;
    assert_int_equal(ls_peft_rules_load(p.peft, &r, &err), LS_OK);
    assert_int_equal(ls_peft_rules_rank(r, "model.layers.2.mlp.shared_experts.up_proj", NULL), 4);
    long long index;
    assert_false(ls_peft_rules_layer_ok(r, "model.layers.0.mlp.shared_experts.up_proj", &index));
    assert_int_equal(index, 0);
    ls_peft_rules_free(r);
    ls_tensor_set_free(&t);
    ls_tensor_set_init(&t);
    assert_true(ls_tensor_set_add_meta(&t, "alpha_pattern", "{\"up_proj\": \"x\"}"));
    assert_int_equal(ls_adapter_params_rules_from_meta(&t, "the body's __metadata__", &p, &err),
                     LS_ADAPTER_CONFIG_INVALID);
    ls_tensor_set_free(&t);
    ls_error_free(&err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regex_as_python),  cmocka_unit_test(test_regex_refusals),
        cmocka_unit_test(test_patterns_kept_in_order), cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_rules_from_metadata),
        cmocka_unit_test(test_target_parameters),
        cmocka_unit_test(test_scopes_never_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
