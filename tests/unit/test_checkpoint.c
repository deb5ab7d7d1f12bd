/* Hugging Face checkpoints, below the server: each family's layer rule and
 * keys from config.json (model/families.c), the tensor names, the layer
 * list in messages, opening checkpoints of every family and reading their
 * values back exactly, and every way an index, a shard or a config can be
 * wrong: a weight_map naming a path outside the directory, a missing
 * shard, a tensor in two shards, a shard whose header lacks the tensor the
 * index gives it, shared experts on a dense layer, wrong shapes, dtypes
 * and quantization. FP8 blocks dequantize to bf16 exactly as documented. */
#include <jansson.h>
#include <math.h>
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

#include "model/model_internal.h"
#include "tests/util/ckpt_writer.h"
#include "tests/util/testutil.h"

/* ---- the layer rules ---------------------------------------------------------- */

/* Plans text (a config.json); expect NULL: must fail, err then names why. */
static ls_status plan(const char *text, ls_family_plan *p, ls_error *err) {
    json_error_t je;
    json_t *c = json_loads(text, 0, &je);
    if (!c) fail_msg("bad test JSON: %s", je.text);
    ls_error_clear(err);
    ls_status st = ls_family_plan_from_config(c, p, err);
    json_decref(c);
    return st;
}

/* The planned layers as "a,b,c". */
static const char *moe_list(const ls_family_plan *p) {
    static char buf[512];
    buf[0] = '\0';
    for (int l = 0; l < p->layers_total; l++) {
        if (!p->moe[l]) continue;
        size_t n = strlen(buf);
        snprintf(buf + n, sizeof buf - n, "%s%d", n ? "," : "", l);
    }
    return buf;
}

static void expect_plan(const char *text, const char *family, int F, bool gate, const char *layers) {
    ls_family_plan p;
    ls_error err;
    ls_error_init(&err);
    if (plan(text, &p, &err) != LS_OK) fail_msg("%s: %s", text, err.message);
    assert_string_equal(p.name, family);
    assert_int_equal(p.F, F);
    assert_int_equal(p.gate, gate);
    assert_string_equal(moe_list(&p), layers);
    ls_family_plan_free(&p);
    ls_error_free(&err);
}

static void expect_refused(const char *text, const char *a, const char *b) {
    ls_family_plan p;
    ls_error err;
    ls_error_init(&err);
    assert_int_not_equal(plan(text, &p, &err), LS_OK);
    printf("refused: %s\n", err.message);
    assert_non_null(strstr(err.message, a));
    if (b) assert_non_null(strstr(err.message, b));
    ls_error_free(&err);
}

#define DS(extra)                                                                                           \
    "{\"model_type\": \"deepseek_v3\", \"architectures\": [\"DeepseekV3ForCausalLM\"], \"num_hidden_layers\": 8, " \
    "\"hidden_size\": 64, \"n_shared_experts\": 2, \"moe_intermediate_size\": 16" extra "}"

static void test_deepseek_rules(void **state) {
    (void)state;
    /* DeepSeek-V3's own numbers: 61 layers, 3 dense, one shared expert */
    expect_plan("{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 61, \"hidden_size\": 7168, "
                "\"n_shared_experts\": 1, \"moe_intermediate_size\": 2048, \"first_k_dense_replace\": 3, "
                "\"moe_layer_freq\": 1, \"n_routed_experts\": 256}",
                "deepseek_v3", 2048, false,
                "3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,"
                "39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60");
    expect_plan(DS(", \"first_k_dense_replace\": 1"), "deepseek_v3", 32, false, "1,2,3,4,5,6,7");
    expect_plan(DS(", \"first_k_dense_replace\": 1, \"moe_layer_freq\": 3"), "deepseek_v3", 32, false, "3,6");
    /* Kimi-K2 reuses DeepSeek-V3; V2 and the models built on it */
    expect_plan("{\"model_type\": \"kimi_k2\", \"architectures\": [\"DeepseekV3ForCausalLM\"], \"num_hidden_layers\": 4,"
                " \"hidden_size\": 8, \"n_shared_experts\": 1, \"moe_intermediate_size\": 4, \"first_k_dense_replace\":"
                " 1}",
                "deepseek_v3", 4, false, "1,2,3");
    expect_plan("{\"model_type\": \"deepseek_v2\", \"num_hidden_layers\": 6, \"hidden_size\": 8, \"n_shared_experts\": "
                "2, \"moe_intermediate_size\": 4, \"first_k_dense_replace\": 1, \"moe_layer_freq\": 2}",
                "deepseek_v2", 8, false, "2,4");
    expect_plan("{\"architectures\": [\"Glm4MoeForCausalLM\"], \"num_hidden_layers\": 4, \"hidden_size\": 8, "
                "\"n_shared_experts\": 1, \"moe_intermediate_size\": 4, \"first_k_dense_replace\": 1}",
                "glm4_moe", 4, false, "1,2,3");
    expect_plan("{\"model_type\": \"dots1\", \"num_hidden_layers\": 3, \"hidden_size\": 8, \"n_shared_experts\": 2, "
                "\"moe_intermediate_size\": 4, \"first_k_dense_replace\": 0}",
                "dots1", 8, false, "0,1,2");
    expect_plan("{\"model_type\": \"bailing_moe\", \"num_hidden_layers\": 3, \"hidden_size\": 8, \"num_shared_experts\": "
                "2, \"moe_intermediate_size\": 4, \"first_k_dense_replace\": 1, \"num_experts\": 8}",
                "bailing_moe", 8, false, "1,2");
    expect_plan("{\"model_type\": \"bailing_moe\", \"num_hidden_layers\": 3, \"hidden_size\": 8, \"num_shared_experts\": "
                "2, \"moe_intermediate_size\": 4, \"moe_shared_expert_intermediate_size\": 6, \"first_k_dense_replace\":"
                " 1}",
                "bailing_moe", 12, false, "1,2");
    /* a key that decides the layers or the width is never assumed */
    expect_refused(DS(""), "first_k_dense_replace", "will not assume");
    expect_refused(DS(", \"first_k_dense_replace\": 1, \"n_routed_experts\": null"), "no layer", NULL);
    expect_refused(DS(", \"first_k_dense_replace\": 1, \"moe_layer_freq\": 0"), "moe_layer_freq", NULL);
    /* the block is SwiGLU: another activation would serve other numbers */
    expect_plan(DS(", \"first_k_dense_replace\": 1, \"hidden_act\": \"silu\""), "deepseek_v3", 32, false, "1,2,3,4,5,6,7");
    expect_plan(DS(", \"first_k_dense_replace\": 1, \"hidden_act\": \"swish\""), "deepseek_v3", 32, false, "1,2,3,4,5,6,7");
    expect_refused(DS(", \"first_k_dense_replace\": 1, \"hidden_act\": \"gelu\""), "hidden_act is \"gelu\"", "SwiGLU");
    expect_refused(DS(", \"first_k_dense_replace\": 1, \"hidden_act\": 3"), "hidden_act is an integer", NULL);
    expect_refused("{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 4, \"hidden_size\": 8, "
                   "\"moe_intermediate_size\": 4, \"first_k_dense_replace\": 1}",
                   "n_shared_experts", NULL);
}

#define NEWER(type, extra)                                                                                    \
    "{\"model_type\": \"" type "\", \"num_hidden_layers\": 4, \"hidden_size\": 8, \"moe_intermediate_size\": 4, " \
    "\"n_routed_experts\": 4" extra "}"

/* transformers 5's newer DeepSeek-style families: mlp_layer_types, when
 * config.json has it, decides over first_k_dense_replace (their code reads
 * only it); EXAONE counts num_shared_experts; Solar Open builds every
 * layer; Mistral 4 reads first_k_dense_replace. */
static void test_newer_deepseek_rules(void **state) {
    (void)state;
    const char *types = ", \"n_shared_experts\": 2, \"first_k_dense_replace\": 3, "
                        "\"mlp_layer_types\": [\"dense\", \"sparse\", \"dense\", \"sparse\"]";
    char text[512];
    const char *typed[] = {"deepseek_v32", "glm_moe_dsa", "glm4_moe_lite"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(text, sizeof text, NEWER("%s", "%s"), typed[i], types);
        expect_plan(text, typed[i], 8, false, "1,3");
    }
    /* Without the list, first_k_dense_replace as DeepSeek's rule reads it,
     * never assumed (glm4_moe_lite's saved config has it null). */
    expect_plan(NEWER("deepseek_v32", ", \"n_shared_experts\": 1, \"first_k_dense_replace\": 1"), "deepseek_v32", 4,
                false, "1,2,3");
    expect_refused(NEWER("glm4_moe_lite", ", \"n_shared_experts\": 1, \"first_k_dense_replace\": null"),
                   "first_k_dense_replace", "will not assume");
    expect_plan(NEWER("exaone_moe", ", \"num_shared_experts\": 3, \"first_k_dense_replace\": 1, "
                                    "\"mlp_layer_types\": [\"dense\", \"dense\", \"sparse\", \"sparse\"]"),
                "exaone_moe", 12, false, "2,3");
    expect_refused(NEWER("exaone_moe", ", \"n_shared_experts\": 3, \"first_k_dense_replace\": 1"), "num_shared_experts",
                   NULL);
    expect_plan(NEWER("solar_open", ", \"n_shared_experts\": 2"), "solar_open", 8, false, "0,1,2,3");
    expect_plan(NEWER("axk2", ", \"n_shared_experts\": 1, \"mlp_layer_types\": [\"dense\", \"dense\", \"sparse\", \"dense\"]"),
                "axk2", 4, false, "2");
    /* GLM-4.5V: text_config's keys, DeepSeek's rule. */
    expect_plan("{\"model_type\": \"glm4v_moe\", \"architectures\": [\"Glm4vMoeForConditionalGeneration\"], "
                "\"text_config\": {\"model_type\": \"glm4v_moe_text\", \"num_hidden_layers\": 3, \"hidden_size\": 8, "
                "\"n_shared_experts\": 1, \"moe_intermediate_size\": 4, \"first_k_dense_replace\": 1}}",
                "glm4v_moe", 4, false, "1,2");
    expect_plan(NEWER("mistral4", ", \"n_shared_experts\": 2, \"first_k_dense_replace\": 1, "
                                  "\"mlp_layer_types\": [\"sparse\", \"sparse\", \"sparse\", \"sparse\"]"),
                "mistral4", 8, false, "1,2,3"); /* its code never reads the list */
    /* A list that is not one entry of "sparse" or "dense" per layer. */
    expect_refused(NEWER("deepseek_v32", ", \"n_shared_experts\": 1, \"mlp_layer_types\": [\"dense\", \"sparse\"]"),
                   "mlp_layer_types", "num_hidden_layers (4)");
    expect_refused(NEWER("deepseek_v32", ", \"n_shared_experts\": 1, "
                                       "\"mlp_layer_types\": [\"dense\", \"moe\", \"sparse\", \"sparse\"]"),
                   "mlp_layer_types[1] is not", NULL);
    expect_refused(NEWER("deepseek_v32", ", \"n_shared_experts\": 1, \"mlp_layer_types\": \"sparse\""),
                   "mlp_layer_types is a string, expected a list", NULL);
    expect_refused(NEWER("glm_moe_dsa", ", \"n_shared_experts\": 1, \"n_routed_experts\": 0, "
                                      "\"mlp_layer_types\": [\"dense\", \"sparse\", \"sparse\", \"sparse\"]"),
                   "no layer", NULL);
}

/* transformers 5's other DeepSeek-style families: A.X-K1, HY-V4 and
 * dots3 read mlp_layer_types (dots3 with its own width key),
 * Bailing-Hybrid counts num_shared_experts, AFMoE's dense layers are the
 * first num_dense_layers (no moe_layer_freq), Aria has every layer, of
 * moe_num_shared_experts x intermediate_size. */
static void test_more_deepseek_style_rules(void **state) {
    (void)state;
    const char *types = ", \"n_shared_experts\": 2, \"first_k_dense_replace\": 3, "
                        "\"mlp_layer_types\": [\"dense\", \"sparse\", \"dense\", \"sparse\"]";
    char text[512];
    const char *typed[] = {"axk1", "hy_v4"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(text, sizeof text, NEWER("%s", "%s"), typed[i], types);
        expect_plan(text, typed[i], 8, false, "1,3");
    }
    expect_plan(NEWER("axk1", ", \"n_shared_experts\": 1, \"first_k_dense_replace\": 1, \"moe_layer_freq\": 2"),
                "axk1", 4, false, "2");
    expect_plan("{\"model_type\": \"dots3_note_text\", \"num_hidden_layers\": 4, \"hidden_size\": 8, "
                "\"moe_intermediate_size\": 4, \"shared_experts_intermediate_size\": 3, \"n_shared_experts\": 2, "
                "\"mlp_layer_types\": [\"dense\", \"sparse\", \"dense\", \"sparse\"]}",
                "dots3_note", 6, false, "1,3");
    expect_plan("{\"model_type\": \"dots3_note\", \"architectures\": [\"Dots3NoteForConditionalGeneration\"], "
                "\"text_config\": {\"num_hidden_layers\": 3, \"hidden_size\": 8, \"shared_experts_intermediate_size\": 5, "
                "\"n_shared_experts\": 1, \"first_k_dense_replace\": 1}}",
                "dots3_note", 5, false, "1,2");
    expect_refused("{\"model_type\": \"dots3_note_text\", \"num_hidden_layers\": 2, \"hidden_size\": 8, "
                   "\"moe_intermediate_size\": 4, \"n_shared_experts\": 1, \"first_k_dense_replace\": 1}",
                   "shared_experts_intermediate_size", "will not assume");
    expect_plan("{\"model_type\": \"bailing_hybrid\", \"num_hidden_layers\": 4, \"hidden_size\": 8, "
                "\"moe_intermediate_size\": 4, \"num_shared_experts\": 2, \"num_experts\": 4, "
                "\"first_k_dense_replace\": 2, \"mlp_layer_types\": [\"dense\", \"dense\", \"sparse\", \"sparse\"]}",
                "bailing_hybrid", 8, false, "2,3");
    expect_refused("{\"model_type\": \"bailing_hybrid\", \"num_hidden_layers\": 4, \"hidden_size\": 8, "
                   "\"moe_intermediate_size\": 4, \"n_shared_experts\": 2, \"first_k_dense_replace\": 2}",
                   "num_shared_experts", NULL);
    expect_plan("{\"model_type\": \"afmoe\", \"num_hidden_layers\": 4, \"hidden_size\": 8, "
                "\"moe_intermediate_size\": 4, \"num_shared_experts\": 2, \"num_dense_layers\": 1, "
                "\"moe_layer_freq\": 2, \"first_k_dense_replace\": 3}",
                "afmoe", 8, false, "1,2,3"); /* its code reads neither of the last two */
    expect_refused("{\"model_type\": \"afmoe\", \"num_hidden_layers\": 4, \"hidden_size\": 8, "
                   "\"moe_intermediate_size\": 4, \"num_shared_experts\": 2}",
                   "num_dense_layers", "will not assume");
    expect_refused("{\"model_type\": \"afmoe\", \"num_hidden_layers\": 2, \"hidden_size\": 8, "
                   "\"moe_intermediate_size\": 4, \"num_shared_experts\": 1, \"num_dense_layers\": 2}",
                   "no layer", "num_dense_layers (2)");
    expect_plan("{\"model_type\": \"aria\", \"architectures\": [\"AriaForConditionalGeneration\"], "
                "\"text_config\": {\"model_type\": \"aria_text\", \"num_hidden_layers\": 2, \"hidden_size\": 8, "
                "\"intermediate_size\": 6, \"moe_intermediate_size\": 99, \"moe_num_shared_experts\": 2}}",
                "aria", 12, false, "0,1");
    expect_refused("{\"model_type\": \"aria_text\", \"num_hidden_layers\": 2, \"hidden_size\": 8, "
                   "\"intermediate_size\": 6, \"moe_num_shared_experts\": 0}",
                   "moe_num_shared_experts", "too small");
    expect_refused("{\"model_type\": \"aria_text\", \"num_hidden_layers\": 2, \"hidden_size\": 8, "
                   "\"intermediate_size\": 6, \"moe_num_shared_experts\": 1, \"hidden_act\": \"gelu\"}",
                   "gelu", NULL);
}

/* ERNIE 4.5 VL's text model: mlp_layer_types, never assumed; the text
 * experts' width moe_intermediate_size[0] (or a plain integer). */
static void test_ernie_vl_rule(void **state) {
    (void)state;
    const char *head = "{\"model_type\": \"ernie4_5_vl_moe\", \"architectures\": "
                       "[\"Ernie4_5_VLMoeForConditionalGeneration\"], \"text_config\": {\"model_type\": "
                       "\"ernie4_5_vl_moe_text\", \"num_hidden_layers\": 3, \"hidden_size\": 8, ";
    char text[640];
    snprintf(text, sizeof text, "%s\"moe_intermediate_size\": [4, 2], \"moe_num_shared_experts\": 2, "
             "\"moe_layer_start_index\": 0, \"mlp_layer_types\": [\"dense\", \"sparse\", \"sparse\"]}}", head);
    expect_plan(text, "ernie4_5_vl_moe", 8, false, "1,2");
    snprintf(text, sizeof text, "%s\"moe_intermediate_size\": 3, \"moe_num_shared_experts\": 1, "
             "\"mlp_layer_types\": [\"sparse\", \"dense\", \"sparse\"]}}", head);
    expect_plan(text, "ernie4_5_vl_moe", 3, false, "0,2");
    snprintf(text, sizeof text, "%s\"moe_intermediate_size\": [4, 2], \"moe_num_shared_experts\": 2, "
             "\"moe_layer_start_index\": 1}}", head);
    expect_refused(text, "mlp_layer_types", "will not assume");
    snprintf(text, sizeof text, "%s\"moe_intermediate_size\": [4, 2], \"moe_num_shared_experts\": 0, "
             "\"mlp_layer_types\": [\"dense\", \"sparse\", \"sparse\"]}}", head);
    expect_refused(text, "moe_num_shared_experts is 0", NULL);
    snprintf(text, sizeof text, "%s\"moe_intermediate_size\": [], \"moe_num_shared_experts\": 1, "
             "\"mlp_layer_types\": [\"dense\", \"sparse\", \"sparse\"]}}", head);
    expect_refused(text, "moe_intermediate_size[0]", "empty list");
    snprintf(text, sizeof text, "%s\"moe_intermediate_size\": [4, 2], \"moe_num_shared_experts\": 1, "
             "\"mlp_layer_types\": [\"dense\", \"sparse\"]}}", head);
    expect_refused(text, "mlp_layer_types", "num_hidden_layers (3)");
}

static void test_ernie_rules(void **state) {
    (void)state;
    const char *base = "{\"model_type\": \"ernie4_5_moe\", \"num_hidden_layers\": 8, \"hidden_size\": 8, "
                       "\"moe_num_shared_experts\": 2, \"moe_intermediate_size\": 4, ";
    char text[512];
    snprintf(text, sizeof text, "%s\"moe_layer_start_index\": 1, \"moe_layer_end_index\": 5, \"moe_layer_interval\": 2}",
             base);
    expect_plan(text, "ernie4_5_moe", 8, false, "1,3,5");
    snprintf(text, sizeof text, "%s\"moe_layer_start_index\": 2, \"moe_layer_end_index\": -1}", base);
    expect_plan(text, "ernie4_5_moe", 8, false, "2,3,4,5,6,7");
    /* per modality: the smallest start, the largest end */
    snprintf(text, sizeof text, "%s\"moe_layer_start_index\": [3, 1], \"moe_layer_end_index\": [4, 6]}", base);
    expect_plan(text, "ernie4_5_moe", 8, false, "1,2,3,4,5,6");
    snprintf(text, sizeof text, "%s\"moe_layer_end_index\": 5}", base);
    expect_refused(text, "moe_layer_start_index", NULL);
    expect_refused("{\"model_type\": \"ernie4_5_moe\", \"num_hidden_layers\": 8, \"hidden_size\": 8, "
                   "\"moe_num_shared_experts\": 0, \"moe_intermediate_size\": 4, \"moe_layer_start_index\": 1}",
                   "no shared experts", NULL);
}

static void test_qwen_and_llama4_rules(void **state) {
    (void)state;
    expect_plan("{\"model_type\": \"qwen2_moe\", \"architectures\": [\"Qwen2MoeForCausalLM\"], \"num_hidden_layers\": 8,"
                " \"hidden_size\": 8, \"shared_expert_intermediate_size\": 20, \"decoder_sparse_step\": 2, "
                "\"mlp_only_layers\": [3], \"num_experts\": 4}",
                "qwen2_moe", 20, true, "1,5,7");
    expect_plan("{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 3, \"hidden_size\": 8, "
                "\"shared_expert_intermediate_size\": 20}",
                "qwen2_moe", 20, true, "0,1,2");
    expect_plan("{\"model_type\": \"qwen3_next\", \"num_hidden_layers\": 4, \"hidden_size\": 8, "
                "\"shared_expert_intermediate_size\": 12, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [0, 9]}",
                "qwen3_next", 12, true, "1,2,3");
    expect_refused("{\"model_type\": \"qwen3_next\", \"num_hidden_layers\": 4, \"hidden_size\": 8, "
                   "\"shared_expert_intermediate_size\": 12, \"num_experts\": 0}",
                   "no layer", NULL);
    /* Qwen's shared expert without its gate: Flint by Qwen2-MoE's rule,
     * Lara-Mini on every layer. */
    expect_plan("{\"model_type\": \"flint\", \"num_hidden_layers\": 6, \"hidden_size\": 8, "
                "\"shared_expert_intermediate_size\": 12, \"decoder_sparse_step\": 2, \"mlp_only_layers\": [3], "
                "\"num_experts\": 4}",
                "flint", 12, false, "1,5");
    expect_plan("{\"architectures\": [\"LaraMiniForCausalLM\"], \"num_hidden_layers\": 3, \"hidden_size\": 8, "
                "\"shared_expert_intermediate_size\": 12, \"decoder_sparse_step\": 2}",
                "lara_mini", 12, false, "0,1,2");
    /* a vision-language config: the keys are text_config's, every layer */
    expect_plan("{\"model_type\": \"qwen3_5_moe\", \"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], "
                "\"text_config\": {\"model_type\": \"qwen3_5_moe_text\", \"num_hidden_layers\": 3, \"hidden_size\": 8, "
                "\"shared_expert_intermediate_size\": 6}}",
                "qwen3_5_moe", 6, true, "0,1,2");
    expect_plan("{\"model_type\": \"llama4\", \"text_config\": {\"num_hidden_layers\": 6, \"hidden_size\": 8, "
                "\"intermediate_size\": 16, \"interleave_moe_layer_step\": 2}}",
                "llama4", 16, false, "1,3,5");
    expect_plan("{\"model_type\": \"llama4_text\", \"num_hidden_layers\": 6, \"hidden_size\": 8, \"intermediate_size\": "
                "16, \"moe_layers\": [0, 4]}",
                "llama4", 16, false, "0,4");
    expect_plan("{\"model_type\": \"llama4\", \"text_config\": {\"num_hidden_layers\": 4, \"hidden_size\": 8, "
                "\"intermediate_size\": 16}}",
                "llama4", 16, false, "0,1,2,3");
    /* the text model's activation: Llama 4's vision tower has gelu */
    expect_plan("{\"model_type\": \"llama4\", \"vision_config\": {\"hidden_act\": \"gelu\"}, \"text_config\": "
                "{\"num_hidden_layers\": 2, \"hidden_size\": 8, \"intermediate_size\": 16, \"hidden_act\": \"silu\"}}",
                "llama4", 16, false, "0,1");
    expect_refused("{\"model_type\": \"llama4\", \"text_config\": {\"num_hidden_layers\": 2, \"hidden_size\": 8, "
                   "\"intermediate_size\": 16, \"hidden_act\": \"gelu_pytorch_tanh\"}}",
                   "gelu_pytorch_tanh", NULL);
    expect_refused("{\"model_type\": \"llama4_text\", \"num_hidden_layers\": 6, \"hidden_size\": 8, "
                   "\"intermediate_size\": 16, \"moe_layers\": [6]}",
                   "moe_layers", NULL);
}

/* Granite's shared MLP (beside its MoE block): every layer, width
 * shared_intermediate_size; none when that or num_local_experts is 0. */
static void test_granite_rules(void **state) {
    (void)state;
    expect_plan("{\"model_type\": \"granitemoehybrid\", \"architectures\": [\"GraniteMoeHybridForCausalLM\"], "
                "\"num_hidden_layers\": 4, \"hidden_size\": 8, \"shared_intermediate_size\": 12, "
                "\"num_local_experts\": 4, \"layer_types\": [\"mamba\", \"attention\", \"mamba\", \"mamba\"]}",
                "granitemoehybrid", 12, false, "0,1,2,3");
    expect_plan("{\"model_type\": \"granitemoeshared\", \"num_hidden_layers\": 2, \"hidden_size\": 8, "
                "\"shared_intermediate_size\": 6, \"num_local_experts\": 4, \"hidden_act\": \"silu\"}",
                "granitemoeshared", 6, false, "0,1");
    expect_refused("{\"model_type\": \"granitemoeshared\", \"num_hidden_layers\": 2, \"hidden_size\": 8, "
                   "\"shared_intermediate_size\": 0, \"num_local_experts\": 4}",
                   "no layer", "shared_intermediate_size is 0");
    expect_refused("{\"model_type\": \"granitemoehybrid\", \"num_hidden_layers\": 2, \"hidden_size\": 8, "
                   "\"shared_intermediate_size\": 8, \"num_local_experts\": 0}",
                   "no layer", "num_local_experts is 0");
    expect_refused("{\"model_type\": \"granitemoehybrid\", \"num_hidden_layers\": 2, \"hidden_size\": 8, "
                   "\"num_local_experts\": 4}",
                   "shared_intermediate_size", NULL);
    expect_refused("{\"model_type\": \"granitemoehybrid\", \"num_hidden_layers\": 2, \"hidden_size\": 8, "
                   "\"shared_intermediate_size\": 8, \"num_local_experts\": 4, \"hidden_act\": \"gelu\"}",
                   "gelu", NULL);
}

/* Every layer: Kolibri's shared_experts of Qwen's width key, HunYuan-MoE's
 * mlp.shared_mlp of intermediate_size; Granite's SWA model as Granite's. */
static void test_every_layer_rules(void **state) {
    (void)state;
    expect_plan("{\"model_type\": \"kolibri1\", \"num_hidden_layers\": 3, \"hidden_size\": 8, "
                "\"shared_expert_intermediate_size\": 12, \"moe_intermediate_size\": 4, \"decoder_sparse_step\": 2}",
                "kolibri1", 12, false, "0,1,2");
    expect_refused("{\"model_type\": \"kolibri1\", \"num_hidden_layers\": 3, \"hidden_size\": 8, "
                   "\"moe_intermediate_size\": 4}",
                   "shared_expert_intermediate_size", NULL);
    expect_plan("{\"architectures\": [\"HunYuanMoEV1ForCausalLM\"], \"num_hidden_layers\": 2, \"hidden_size\": 8, "
                "\"intermediate_size\": 10, \"num_experts\": 4}",
                "hunyuan_v1_moe", 10, false, "0,1");
    expect_refused("{\"model_type\": \"hunyuan_v1_moe\", \"num_hidden_layers\": 2, \"hidden_size\": 8}",
                   "intermediate_size", "will not assume");
    expect_plan("{\"model_type\": \"granitemoe_swa\", \"num_hidden_layers\": 2, \"hidden_size\": 8, "
                "\"shared_intermediate_size\": 6, \"num_local_experts\": 4}",
                "granitemoe_swa", 6, false, "0,1");
    expect_refused("{\"model_type\": \"granitemoe_swa\", \"num_hidden_layers\": 2, \"hidden_size\": 8, "
                   "\"shared_intermediate_size\": 0, \"num_local_experts\": 4}",
                   "no layer", "shared_intermediate_size is 0");
}

static void test_other_families_refused(void **state) {
    (void)state;
    /* a MoE family without shared experts: named, never guessed */
    expect_refused("{\"model_type\": \"qwen3_moe\", \"architectures\": [\"Qwen3MoeForCausalLM\"], \"num_hidden_layers\":"
                   " 4, \"hidden_size\": 8}",
                   "\"qwen3_moe\"", "Qwen3MoeForCausalLM");
    expect_refused("{\"model_type\": \"mixtral\", \"num_hidden_layers\": 4}", "mixtral", "not a family");
    /* the hint lists every family, whole: the message's names cannot cut it */
    ls_family_plan p;
    ls_error err;
    ls_error_init(&err);
    assert_int_not_equal(plan("{\"model_type\": \"mixtral\", \"architectures\": [\"MixtralForCausalLM\"]}", &p, &err),
                         LS_OK);
    /* made from the family table: every family named, none cut */
    assert_non_null(strstr(err.hint, "served: deepseek_v2, deepseek_v3,"));
    assert_non_null(strstr(err.hint, ", granitemoe_swa"));
    assert_null(strstr(err.hint, "and more"));
    assert_non_null(strstr(err.message, "fused weights file (docs/api.md, \"The model\")"));
    ls_error_free(&err);
    expect_refused("{\"num_hidden_layers\": 4}", "model_type \"\"", NULL);
    expect_refused("{\"model_type\": \"qwen2_moe\", \"architectures\": [\"DeepseekV3ForCausalLM\"], "
                   "\"num_hidden_layers\": 4, \"hidden_size\": 8, \"shared_expert_intermediate_size\": 4}",
                   "qwen2_moe", "deepseek_v3");
    expect_refused("[1, 2]", "an array", NULL);
}

/* ---- names and messages ---------------------------------------------------------- */

static void test_names(void **state) {
    (void)state;
    ls_family_plan p;
    ls_error err;
    ls_error_init(&err);
    char buf[256];
    long layer;
    const char *rest;
    assert_int_equal(plan(DS(", \"first_k_dense_replace\": 1"), &p, &err), LS_OK);
    ls_family_name(&p, "model.layers.", 12, LS_PROJ_UP, buf, sizeof buf);
    assert_string_equal(buf, "model.layers.12.mlp.shared_experts.up_proj.weight");
    assert_true(ls_family_in_module(&p, "model.layers.", "model.layers.7.mlp.shared_experts.down_proj.weight_scale_inv",
                                    &layer, &rest));
    assert_int_equal(layer, 7);
    assert_string_equal(rest, "down_proj.weight_scale_inv");
    assert_false(ls_family_in_module(&p, "model.layers.", "model.layers.7.mlp.experts.0.up_proj.weight", &layer, &rest));
    assert_false(ls_family_in_module(&p, "model.layers.", "model.layers.x.mlp.shared_experts.up_proj.weight", &layer,
                                     &rest));
    ls_family_plan_free(&p);
    assert_int_equal(plan("{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 3, \"hidden_size\": 8, "
                          "\"shared_expert_intermediate_size\": 20}",
                          &p, &err),
                     LS_OK);
    ls_family_name(&p, "model.language_model.layers.", 2, LS_PROJ_GATE, buf, sizeof buf);
    assert_string_equal(buf, "model.language_model.layers.2.mlp.shared_expert.gate_proj.weight");
    ls_family_name(&p, "model.layers.", 0, LS_PROJ_SCALAR_GATE, buf, sizeof buf);
    assert_string_equal(buf, "model.layers.0.mlp.shared_expert_gate.weight");
    assert_true(ls_family_in_module(&p, "model.layers.", buf, &layer, &rest));
    assert_string_equal(rest, "shared_expert_gate.weight");
    ls_family_plan_free(&p);
    assert_int_equal(plan("{\"model_type\": \"llama4_text\", \"num_hidden_layers\": 2, \"hidden_size\": 8, "
                          "\"intermediate_size\": 16}",
                          &p, &err),
                     LS_OK);
    ls_family_name(&p, "language_model.model.layers.", 1, LS_PROJ_DOWN, buf, sizeof buf);
    assert_string_equal(buf, "language_model.model.layers.1.feed_forward.shared_expert.down_proj.weight");
    ls_family_plan_free(&p);
    /* HunYuan-MoE's shared_mlp in its MoE block; HY-V4's gate saved as
     * linear_gate. */
    assert_int_equal(plan("{\"model_type\": \"hunyuan_v1_moe\", \"num_hidden_layers\": 2, \"hidden_size\": 8, "
                          "\"intermediate_size\": 16}",
                          &p, &err),
                     LS_OK);
    ls_family_name(&p, "model.layers.", 1, LS_PROJ_UP, buf, sizeof buf);
    assert_string_equal(buf, "model.layers.1.mlp.shared_mlp.up_proj.weight");
    assert_true(ls_family_in_module(&p, "model.layers.", "model.layers.0.mlp.shared_mlp.up_proj.bias", &layer, &rest));
    assert_string_equal(rest, "up_proj.bias");
    ls_family_plan_free(&p);
    assert_int_equal(plan(NEWER("hy_v4", ", \"n_shared_experts\": 1, \"mlp_layer_types\": "
                                         "[\"dense\", \"sparse\", \"sparse\", \"sparse\"]"),
                          &p, &err),
                     LS_OK);
    ls_family_name(&p, "model.layers.", 2, LS_PROJ_GATE, buf, sizeof buf);
    assert_string_equal(buf, "model.layers.2.mlp.shared_experts.linear_gate.weight");
    ls_family_name(&p, "model.layers.", 2, LS_PROJ_UP, buf, sizeof buf);
    assert_string_equal(buf, "model.layers.2.mlp.shared_experts.up_proj.weight");
    ls_family_plan_free(&p);
    ls_error_free(&err);
}

static const char *layers_str(const int *ids, int L) {
    static char buf[96];
    ls_dims d = {.n = 1, .H = 1, .F = 1, .L = L, .layer_ids = ids};
    return ls_dims_layers_str(&d, buf, sizeof buf);
}

static void test_layer_lists(void **state) {
    (void)state;
    int ids[64];
    for (int i = 0; i < 58; i++) ids[i] = 3 + i;
    assert_string_equal(layers_str(ids, 58), "3-60");
    for (int i = 0; i < 24; i++) ids[i] = 1 + 2 * i;
    assert_string_equal(layers_str(ids, 24), "1, 3, 5, ..., 47 (every 2nd)");
    assert_string_equal(layers_str((int[]){0, 2}, 2), "0, 2");
    assert_string_equal(layers_str((int[]){0, 1, 3}, 3), "0, 1, 3");
    assert_string_equal(layers_str((int[]){0, 1, 2, 5, 7, 8, 9}, 7), "0-2, 5, 7-9");
    assert_string_equal(layers_str((int[]){4}, 1), "4");
    ls_dims plain = {.n = 1, .H = 1, .F = 1, .L = 2};
    char buf[32];
    assert_string_equal(ls_dims_layers_str(&plain, buf, sizeof buf), "0-1");
    for (int i = 0; i < 64; i++) ids[i] = 3 * i + (i % 2); /* no even step: runs, cut */
    const char *s = layers_str(ids, 64);
    assert_true(strlen(s) < 96 && !strcmp(s + strlen(s) - 3, "..."));
    assert_int_equal(ls_dims_layer_index(&(ls_dims){.L = 2, .layer_ids = (int[]){3, 5}}, 4), -1);
    assert_int_equal(ls_dims_layer_index(&(ls_dims){.L = 2, .layer_ids = (int[]){3, 5}}, 5), 1);
}

/* ---- opening checkpoints ------------------------------------------------------------ */

/* Opens path; on failure returns the status and err names why. */
static ls_status open_ckpt(const char *path, ls_model *m, ls_error *err) {
    ls_error_clear(err);
    ls_status st = ls_model_open(path, NULL, m, err);
    if (st != LS_OK) printf("open %s: %s\n", path, err->message);
    return st;
}

static void test_every_family_reads_back(void **state) {
    (void)state;
    for (int f = 0; f < CK_FAMILIES; f++) {
        char *dir = ls_test_mkdtemp();
        ck_spec spec = {.family = (ck_family)f, .H = 16, .F = 8, .dtype = LS_DTYPE_F32, .shards = f % 3, .seed = 40 + f};
        ck_model cm;
        ck_write(dir, &spec, &cm);
        ls_model m;
        ls_error err;
        ls_error_init(&err);
        assert_int_equal(open_ckpt(dir, &m, &err), LS_OK);
        assert_string_equal(m.family, cm.family);
        assert_int_equal(m.dims.n, 1);
        assert_int_equal(m.dims.H, 16);
        assert_int_equal(m.dims.F, 8);
        assert_int_equal(m.dims.L, cm.L);
        assert_int_equal(m.dims.gate, cm.gate);
        assert_int_equal(m.dims.w13_layout, LS_W13_CONTIGUOUS);
        assert_int_equal(ls_dims_layers_total(&m.dims), cm.layers_total);
        assert_int_equal(m.bytes, cm.shared_bytes);
        for (int i = 0; i < cm.L; i++) {
            assert_int_equal(ls_dims_layer_id(&m.dims, i), cm.ids[i]);
            assert_int_equal(ls_dims_layer_index(&m.dims, cm.ids[i]), i);
            ls_model_layer ml;
            assert_int_equal(ls_model_read_layer(&m, i, &ml, &err), LS_OK);
            assert_int_equal(ml.dt13, LS_DTYPE_F32);
            for (int k = 0; k < 2 * 8 * 16; k++) assert_true(((float *)ml.w13)[k] == (float)cm.w13[i][k]);
            for (int k = 0; k < 16 * 8; k++) assert_true(((float *)ml.w2)[k] == (float)cm.w2[i][k]);
            for (int k = 0; cm.gate && k < 16; k++) assert_true(((float *)ml.gate)[k] == (float)cm.gatew[i][k]);
            assert_true(cm.gate ? ml.gate != NULL : ml.gate == NULL);
            ls_model_layer_free(&ml);
        }
        if (cm.dense >= 0) assert_int_equal(ls_dims_layer_index(&m.dims, cm.dense), -1);
        ls_model_free(&m);
        ls_error_free(&err);
        ck_model_free(&cm);
        ls_test_rmtree(dir);
        free(dir);
    }
}

/* ---- hostile checkpoints --------------------------------------------------------------- */

/* A small DeepSeek-V3 checkpoint written by hand: 3 layers, layer 0 dense,
 * H = 8, F = 4 (two shared experts of 2), f32. */
#define MH 8
#define MF 4
static float g_ones[MF * MH * 2];

static void mini_config(const char *dir, const char *extra) {
    char text[1024], path[4200];
    snprintf(text, sizeof text,
             "{\"model_type\": \"deepseek_v3\", \"architectures\": [\"DeepseekV3ForCausalLM\"], "
             "\"num_hidden_layers\": 3, \"hidden_size\": %d, \"n_shared_experts\": 2, \"moe_intermediate_size\": %d, "
             "\"first_k_dense_replace\": 1, \"n_routed_experts\": 4%s}",
             MH, MF / 2, extra);
    snprintf(path, sizeof path, "%s/config.json", dir);
    ls_test_write_file(path, text, strlen(text));
}

static ck_tensor mini_t(int layer, const char *proj, ls_dtype dt, int64_t rows, int64_t cols) {
    ck_tensor t = {.dtype = dt, .ndim = 2, .shape = {rows, cols}, .data = g_ones};
    snprintf(t.name, sizeof t.name, "model.layers.%d.mlp.shared_experts.%s", layer, proj);
    return t;
}

/* Layer's three projections (f32, the right shapes) into t. */
static int mini_layer(ck_tensor *t, int layer) {
    t[0] = mini_t(layer, "gate_proj.weight", LS_DTYPE_F32, MF, MH);
    t[1] = mini_t(layer, "up_proj.weight", LS_DTYPE_F32, MF, MH);
    t[2] = mini_t(layer, "down_proj.weight", LS_DTYPE_F32, MH, MF);
    return 3;
}

static void shard(const char *dir, const char *name, const ck_tensor *t, int n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ck_write_safetensors(path, t, n);
}

/* The index: each tensor of t[0..n) mapped to files[k] (k = owner[i]). */
static void index_of(const char *dir, const ck_tensor *t, const char *const *owner, int n) {
    json_t *map = json_object();
    for (int i = 0; i < n; i++) json_object_set_new(map, t[i].name, json_string(owner[i]));
    json_t *idx = json_pack("{s:o}", "weight_map", map);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    assert_int_equal(json_dump_file(idx, path, 0), 0);
    json_decref(idx);
}

/* Opening dir fails, and the message holds want (and also, when given). */
static void expect_open_fails(const char *dir, const char *want, const char *also) {
    ls_model m;
    ls_error err;
    ls_error_init(&err);
    assert_int_not_equal(open_ckpt(dir, &m, &err), LS_OK);
    assert_non_null(strstr(err.message, want));
    if (also) assert_non_null(strstr(err.message, also));
    assert_null(m.src);
    ls_error_free(&err);
}

static void expect_open_ok(const char *dir) {
    ls_model m;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(open_ckpt(dir, &m, &err), LS_OK);
    ls_model_free(&m);
    ls_error_free(&err);
}

/* Two shards: layer 1 in A, layer 2 in B. */
static void mini_two_shards(const char *dir, ck_tensor *t, const char **owner) {
    for (int i = 0; i < (int)(sizeof g_ones / sizeof *g_ones); i++) g_ones[i] = 0.25f;
    mini_config(dir, "");
    mini_layer(t, 1);
    mini_layer(t + 3, 2);
    for (int i = 0; i < 6; i++) owner[i] = i < 3 ? "a.safetensors" : "b.safetensors";
    shard(dir, "a.safetensors", t, 3);
    shard(dir, "b.safetensors", t + 3, 3);
    index_of(dir, t, owner, 6);
}

static void test_hostile_indexes(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ck_tensor t[8];
    const char *owner[8];
    mini_two_shards(dir, t, owner);
    expect_open_ok(dir);

    owner[4] = "../b.safetensors"; /* outside the directory */
    index_of(dir, t, owner, 6);
    expect_open_fails(dir, "model.layers.2.mlp.shared_experts.up_proj.weight", "beneath the directory");
    owner[4] = "/etc/passwd";
    index_of(dir, t, owner, 6);
    expect_open_fails(dir, "/etc/passwd", "beneath the directory");

    owner[3] = owner[4] = owner[5] = "c.safetensors"; /* a shard that is not there */
    index_of(dir, t, owner, 6);
    expect_open_fails(dir, "c.safetensors", "cannot open");
    owner[3] = owner[5] = "b.safetensors";

    owner[4] = "a.safetensors"; /* a shard without the tensor the index gives it */
    index_of(dir, t, owner, 6);
    expect_open_fails(dir, "model.layers.2.mlp.shared_experts.up_proj.weight", "whose header has no such tensor");

    /* a tensor in two shards: in both headers, the index naming one */
    owner[4] = "b.safetensors";
    t[6] = t[4];
    shard(dir, "a.safetensors", (ck_tensor[]){t[0], t[1], t[2], t[4]}, 4);
    index_of(dir, t, owner, 6);
    expect_open_fails(dir, "model.layers.2.mlp.shared_experts.up_proj.weight", "is in a.safetensors and in b.safetensors");
    shard(dir, "a.safetensors", t, 3);
    /* ... or twice in the weight_map itself */
    char path[4200], text[2048] = "{\"weight_map\": {";
    for (int i = 0; i < 6; i++) {
        size_t l = strlen(text);
        snprintf(text + l, sizeof text - l, "\"%s\": \"%s\", ", t[i].name, owner[i]);
    }
    size_t l = strlen(text);
    snprintf(text + l, sizeof text - l, "\"%s\": \"a.safetensors\"}}", t[4].name);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    ls_test_write_file(path, text, strlen(text));
    expect_open_fails(dir, "duplicate", t[4].name);

    ls_test_write_file(path, "{\"metadata\": {}, \"weight_map\": []}", 34);
    expect_open_fails(dir, "weight_map", "expected an object");
    ls_test_write_file(path, "{\"weight_map\": ", 15);
    expect_open_fails(dir, "not valid JSON", NULL);
    /* metadata empty, absent or anything: the weight_map is what counts */
    index_of(dir, t, owner, 6);
    expect_open_ok(dir);
    /* The config beside the index, given for it: said so, with the
     * directory to give (it was "weight_map is missing"). */
    snprintf(path, sizeof path, "%s/config.json", dir);
    expect_open_fails(path, "config.json is the model's config, not an index of its weights: give --weights", dir);
    ls_test_rmtree(dir);
    free(dir);
}

#define HUB_COMMIT "89abcdef0123456789abcdef0123456789abcdef"
/* --weights ORG/NAME when no such path exists: the snapshot of the hub
 * cache ($HF_HUB_CACHE here) that refs/main names, its files links to
 * ../../blobs as the cache keeps them; a repo the cache lacks names the
 * cache and the download command. */
static void test_hub_cache_repo_id(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ck_tensor t[8];
    const char *owner[8];
    char path[4400], to[4400];
    const char *sub[] = {"models--org--mini", "models--org--mini/blobs", "models--org--mini/refs",
                         "models--org--mini/snapshots", "models--org--mini/snapshots/" HUB_COMMIT, "files"};
    ls_test_mkdirs(dir, sub, sizeof sub / sizeof *sub);
    snprintf(path, sizeof path, "%s/files", dir);
    mini_two_shards(path, t, owner);
    const char *files[] = {"config.json", "a.safetensors", "b.safetensors", "model.safetensors.index.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/files/%s", dir, files[i]);
        snprintf(to, sizeof to, "%s/models--org--mini/blobs/%d", dir, i);
        assert_int_equal(rename(path, to), 0);
        snprintf(path, sizeof path, "%s/models--org--mini/snapshots/" HUB_COMMIT "/%s", dir, files[i]);
        snprintf(to, sizeof to, "../../blobs/%d", i);
        assert_int_equal(symlink(to, path), 0);
    }
    snprintf(path, sizeof path, "%s/models--org--mini/refs/main", dir);
    ls_test_write_file(path, HUB_COMMIT, 40);
    char *old = getenv("HF_HUB_CACHE") ? strdup(getenv("HF_HUB_CACHE")) : NULL;
    assert_int_equal(setenv("HF_HUB_CACHE", dir, 1), 0);

    ls_model m;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(open_ckpt("org/mini", &m, &err), LS_OK);
    assert_non_null(strstr(m.path, "models--org--mini/snapshots/" HUB_COMMIT));
    assert_int_equal(m.dims.H, MH);
    ls_model_free(&m);
    ls_error_clear(&err);
    assert_int_not_equal(open_ckpt("org/absent", &m, &err), LS_OK);
    assert_non_null(strstr(err.message, "cannot open org/absent"));
    assert_non_null(strstr(err.hint, "hf download org/absent"));
    assert_non_null(strstr(err.hint, dir));
    ls_error_free(&err);

    if (old) setenv("HF_HUB_CACHE", old, 1);
    else unsetenv("HF_HUB_CACHE");
    free(old);
    ls_test_rmtree(dir);
    free(dir);
}

/* A broken shard under a long directory path: the message keeps the
 * path's end, where the shard's name is. */
static void test_broken_shard_named_under_a_long_path(void **state) {
    (void)state;
    char *root = ls_test_mkdtemp();
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", root);
    for (int i = 0; i < 6; i++) { /* six components of 60 bytes */
        size_t n = strlen(dir);
        snprintf(dir + n, sizeof dir - n, "/%060d", i);
        assert_int_equal(mkdir(dir, 0700), 0);
    }
    ck_tensor t[8];
    const char *owner[8];
    mini_two_shards(dir, t, owner);
    char path[4300];
    snprintf(path, sizeof path, "%s/b.safetensors", dir);
    ls_test_write_file(path, "\x03\0\0\0\0\0\0\0{}", 10);
    expect_open_fails(dir, "/b.safetensors: ", "runs past the end");
    ls_test_rmtree(root);
    free(root);
}

static void test_layers_and_tensors_must_agree(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ck_tensor t[12];
    const char *owner[12];
    mini_two_shards(dir, t, owner);
    /* shared experts on layer 0, which config.json makes dense */
    mini_layer(t + 6, 0);
    for (int i = 6; i < 9; i++) owner[i] = "b.safetensors";
    shard(dir, "b.safetensors", t + 3, 6);
    index_of(dir, t, owner, 9);
    expect_open_fails(dir, "model.layers.0.mlp.shared_experts.gate_proj.weight", "makes layer 0 dense");
    /* past num_hidden_layers (multi-token prediction): skipped */
    mini_layer(t + 6, 3);
    shard(dir, "b.safetensors", t + 3, 6);
    index_of(dir, t, owner, 9);
    expect_open_ok(dir);
    /* a served layer without its up_proj */
    index_of(dir, (ck_tensor[]){t[0], t[2], t[3], t[4], t[5]}, owner, 5);
    expect_open_fails(dir, "model.layers.1.mlp.shared_experts.up_proj.weight", "is missing");
    /* a bias: not a tensor of the layout */
    t[6] = mini_t(1, "gate_proj.bias", LS_DTYPE_F32, MF, 1);
    shard(dir, "b.safetensors", t + 3, 4);
    index_of(dir, t, owner, 7);
    expect_open_fails(dir, "gate_proj.bias", "unexpected");
    /* config.json and the checkpoint's names must describe the same model */
    mini_two_shards(dir, t, owner);
    mini_config(dir, ", \"first_k_dense_replace\": 2");
    expect_open_fails(dir, "duplicate", NULL); /* first_k_dense_replace twice */
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    const char *qwen = "{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 3, \"hidden_size\": 8, "
                       "\"shared_expert_intermediate_size\": 4}";
    ls_test_write_file(path, qwen, strlen(qwen));
    expect_open_fails(dir, "model.layers.0.mlp.shared_expert.gate_proj.weight", "has none of");
    ls_test_rmtree(dir);
    free(dir);
}

/* Opens dir, which must serve exactly the layers want ("1,2"), with a
 * layer rule that holds rule. */
static void expect_layers(const char *dir, const char *want, const char *rule) {
    ls_model m;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(open_ckpt(dir, &m, &err), LS_OK);
    char got[64] = "";
    for (int i = 0; i < m.dims.L; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d", i ? "," : "", ls_dims_layer_id(&m.dims, i));
    printf("layers %s: %s\n", got, m.rule);
    assert_string_equal(got, want);
    assert_non_null(strstr(m.rule, rule));
    ls_model_free(&m);
    ls_error_free(&err);
}

/* moe_layer_freq 2 (layers 0-2, first_k_dense_replace 1): DeepSeek's code
 * gives layer 2 shared experts, transformers' (which ignores the key)
 * layers 1 and 2. Each writer's checkpoint serves its own layers; one
 * that matches neither is refused, naming what is missing. */
static void test_moe_layer_freq_readings(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ck_tensor t[8];
    const char *owner[8];
    mini_two_shards(dir, t, owner); /* layers 1 and 2: transformers' save_pretrained */
    mini_config(dir, ", \"moe_layer_freq\": 2");
    expect_layers(dir, "1,2", "moe_layer_freq (2) not applied");
    index_of(dir, t + 3, owner + 3, 3); /* layer 2 only: DeepSeek's own code */
    expect_layers(dir, "2", "l % moe_layer_freq (2) == 0");
    index_of(dir, t, owner, 3); /* layer 1 only: neither */
    expect_open_fails(dir, "model.layers.2.mlp.shared_experts.gate_proj.weight", "is missing");
    /* a freq that leaves DeepSeek's reading no layer: transformers' may */
    mini_two_shards(dir, t, owner);
    mini_config(dir, ", \"moe_layer_freq\": 5");
    expect_layers(dir, "1,2", "not applied");
    index_of(dir, t, owner, 0); /* no shared experts anywhere */
    expect_open_fails(dir, "gives no layer shared experts", NULL);
    ls_test_rmtree(dir);
    free(dir);
}

static void test_shapes_dtypes_quantization(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ck_tensor t[8];
    const char *owner[8];
    mini_two_shards(dir, t, owner);
    t[4] = mini_t(2, "up_proj.weight", LS_DTYPE_F32, MF + 1, MH);
    shard(dir, "b.safetensors", t + 3, 3);
    expect_open_fails(dir, "model.layers.2.mlp.shared_experts.up_proj.weight", "expected [4, 8]");
    t[4] = mini_t(2, "up_proj.weight", LS_DTYPE_I32, MF, MH);
    shard(dir, "b.safetensors", t + 3, 3);
    expect_open_fails(dir, "up_proj.weight has dtype I32", NULL);
    t[4] = mini_t(2, "up_proj.weight", LS_DTYPE_F8_E4M3, MF, MH);
    shard(dir, "b.safetensors", t + 3, 3);
    expect_open_fails(dir, "without a weight_scale_inv", NULL);
    /* mixed dtypes are served at the widest (here f32 for f16 and bf16) */
    t[3] = mini_t(2, "gate_proj.weight", LS_DTYPE_BF16, MF, MH);
    t[4] = mini_t(2, "up_proj.weight", LS_DTYPE_F16, MF, MH);
    shard(dir, "b.safetensors", t + 3, 3);
    ls_model m;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(open_ckpt(dir, &m, &err), LS_OK);
    assert_int_equal(m.dtype, LS_DTYPE_F32);
    ls_model_layer ml;
    assert_int_equal(ls_model_read_layer(&m, 1, &ml, &err), LS_OK);
    assert_int_equal(ml.dt13, LS_DTYPE_F32);
    /* g_ones holds 0.25f; as bf16 and f16 bytes its halves read as other
     * values, which widen exactly: compare with the same widening */
    float want[MF * MH];
    ls_convert_dtype(LS_DTYPE_F16, g_ones, LS_DTYPE_F32, want, MF * MH);
    assert_memory_equal((float *)ml.w13 + MF * MH, want, sizeof want);
    ls_convert_dtype(LS_DTYPE_BF16, g_ones, LS_DTYPE_F32, want, MF * MH);
    assert_memory_equal(ml.w13, want, sizeof want);
    ls_model_layer_free(&ml);
    ls_model_free(&m);
    /* quantization other than FP8 blocks is refused, saying what to do */
    mini_two_shards(dir, t, owner);
    mini_config(dir, ", \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4}");
    expect_open_fails(dir, "quant_method \"gptq\"", NULL);
    assert_int_equal(ls_model_open(dir, NULL, &m, &err), LS_INVALID_REQUEST);
    assert_non_null(strstr(err.hint, "dequantize"));
    /* --w13-layout is the fused file's: interleaved makes no sense here */
    mini_config(dir, "");
    ls_w13_layout inter = LS_W13_INTERLEAVED, contig = LS_W13_CONTIGUOUS;
    ls_error_clear(&err);
    assert_int_not_equal(ls_model_open(dir, &inter, &m, &err), LS_OK);
    assert_non_null(strstr(err.message, "--w13-layout"));
    assert_int_equal(ls_model_open(dir, &contig, &m, &err), LS_OK);
    ls_model_free(&m);
    ls_error_free(&err);
    ls_test_rmtree(dir);
    free(dir);
}

/* A gateless family's checkpoint that carries a shared_expert_gate (a
 * Qwen2-MoE checkpoint whose config says flint) is refused: served
 * without its gate it would give other numbers. */
static void test_gate_of_a_gateless_family(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    ck_spec spec = {.family = CK_QWEN2_MOE, .H = 16, .F = 8, .dtype = LS_DTYPE_F32, .shards = 0, .seed = 90};
    ck_model cm;
    ck_write(dir, &spec, &cm);
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *c = json_load_file(path, 0, NULL);
    assert_non_null(c);
    json_object_set_new(c, "model_type", json_string("flint"));
    json_object_set_new(c, "architectures", json_pack("[s]", "FlintForCausalLM"));
    assert_int_equal(json_dump_file(c, path, 0), 0);
    json_decref(c);
    expect_open_fails(dir, "shared_expert_gate.weight", "has no shared-expert gate");
    ck_model_free(&cm);
    ls_test_rmtree(dir);
    free(dir);
}

static void test_directory_contents(void **state) {
    (void)state;
    char *dir = ls_test_mkdtemp();
    expect_open_fails(dir, "config.json", "cannot open");
    mini_config(dir, "");
    expect_open_fails(dir, "neither model.safetensors nor model.safetensors.index.json", NULL);
    /* one model.safetensors (no index); preferred over an index, as
     * transformers does */
    ck_tensor t[8];
    const char *owner[8];
    mini_two_shards(dir, t, owner);
    shard(dir, "model.safetensors", t, 6);
    ls_model m;
    ls_error err;
    ls_error_init(&err);
    assert_int_equal(open_ckpt(dir, &m, &err), LS_OK);
    assert_int_equal(m.n_files, 2);
    assert_string_equal(m.files[1], "model.safetensors");
    ls_model_free(&m);
    /* the index itself as the path: that index, in its directory */
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    assert_int_equal(open_ckpt(path, &m, &err), LS_OK);
    assert_int_equal(m.n_files, 4);
    assert_string_equal(m.files[1], "model.safetensors.index.json");
    assert_string_equal(m.files[2], "a.safetensors");
    ls_model_free(&m);
    ls_error_free(&err);
    ls_test_rmtree(dir);
    free(dir);
}

/* ---- FP8 blocks -------------------------------------------------------------------------- */

static void test_fp8_dequant(void **state) {
    (void)state;
    /* every e4m3 byte but NaN, as a [16, 15] weight in blocks of 4 x 6 */
    enum { R = 16, C = 15 };
    uint8_t q[R * C];
    float scale[4 * 3];
    for (int i = 0; i < R * C; i++) q[i] = (uint8_t)(i + (i >= 0x7f)); /* skips 0x7f */
    for (int i = 0; i < 12; i++) scale[i] = 0.5f + 0.25f * (float)i;
    uint16_t out[R * C];
    ls_model_dequant_fp8(q, scale, LS_DTYPE_F32, R, C, (const int[]){4, 6}, LS_DTYPE_BF16, out);
    for (int i = 0; i < R * C; i++) {
        const int e = (q[i] >> 3) & 15, m = q[i] & 7;
        double v = e == 0 ? m / 8.0 * pow(2, -6) : (1 + m / 8.0) * pow(2, e - 7);
        v = q[i] & 0x80 ? -v : v;
        const float s = scale[(i / C / 4) * 3 + (i % C) / 6];
        assert_int_equal(out[i], ls_f32_to_bf16((float)(v * s)));
    }
    assert_true(isnan(ls_f8e4m3_to_f32(0x7f)) && isnan(ls_f8e4m3_to_f32(0xff)));
    assert_true(ls_f8e4m3_to_f32(0x7e) == 448.0f && ls_f8e4m3_to_f32(0x01) == 0.001953125f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deepseek_rules),
        cmocka_unit_test(test_newer_deepseek_rules),
        cmocka_unit_test(test_more_deepseek_style_rules),
        cmocka_unit_test(test_ernie_vl_rule),
        cmocka_unit_test(test_every_layer_rules),
        cmocka_unit_test(test_ernie_rules),
        cmocka_unit_test(test_qwen_and_llama4_rules),
        cmocka_unit_test(test_granite_rules),
        cmocka_unit_test(test_other_families_refused),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_layer_lists),
        cmocka_unit_test(test_every_family_reads_back),
        cmocka_unit_test(test_hostile_indexes),
        cmocka_unit_test(test_hub_cache_repo_id),
        cmocka_unit_test(test_broken_shard_named_under_a_long_path),
        cmocka_unit_test(test_layers_and_tensors_must_agree),
        cmocka_unit_test(test_moe_layer_freq_readings),
        cmocka_unit_test(test_shapes_dtypes_quantization),
        cmocka_unit_test(test_directory_contents),
        cmocka_unit_test(test_gate_of_a_gateless_family),
        cmocka_unit_test(test_fp8_dequant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
