"""lorasink against the real transformers and peft libraries.

For every family lorasink serves that the pinned transformers can build
(FAMILIES below, one entry each), builds a tiny random-init model whose
dense and MoE layers are mixed by the family's own config keys, saves it
with save_pretrained (small shards, or one file), creates two PEFT LoRA
adapters on its shared experts with random A and B (one with rank_pattern,
alpha_pattern and rsLoRA on every layer, one on two layers only), saves
them with save_pretrained, serves the checkpoint directory and the adapter
directories with lorasink as they were saved, and checks:

- GET /model: the family, and the layer list equal to the layers where the
  instantiated model has shared-expert modules (read from the modules, not
  from lorasink's rule), and the gate where the model has one;
- a forward on a dense layer is 400 naming it as dense;
- forwards of the shared-expert block on every MoE layer, tokens mixing
  both adapters and none in one request, no gammas sent (the server
  applies the family's gate), against the modules' own forward with the
  adapter active: relative L2 at most 2e-5 in f32 (a bf16 checkpoint with
  bf16 adapters: against the modules run in f32 on the same bf16 values,
  within the same bound, since the CPU backend computes in f32);
- the pool format of each adapter's math, laid out from PEFT's own factors
  and scalings as docs/math.md says, normalises to the PEFT directory's
  sha256; an adapter with factors the server skipped (dense MLPs,
  attention) is refused with "strict", each of them named;
- where the entry uses target_parameters, that the plain target_modules
  list still misses the shared experts (docs/adapters.md's table).

First, the README's demo files ("demo"): the checkpoint of
scripts/write-demo-checkpoint.py loads in transformers with every key in
place, the adapter of scripts/write-demo-adapter.py loads onto it in PEFT
with none missing, and lorasink serving them gives the modules' forward.

Usage: check_hf.py LORASINK_BINARY WORKDIR [NAME...]  (run by scripts/check-hf.sh)
"""
import copy
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from typing import Callable

import numpy as np
import torch
from safetensors import safe_open

warnings.filterwarnings("ignore")
import peft  # noqa: E402
import transformers as tf  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402

# The bound for f32 checkpoints and for bf16 ones alike: the CPU backend
# computes in f32 throughout on the weights' and factors' bf16 values
# (docs/math.md, "Numerics"), as the reference does; only the CUDA backend
# rounds operands to bf16 (its bound against the CPU's is 1e-2).
TOL = 2e-5
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PROJS = ("gate_proj", "up_proj", "down_proj")
# The shared MLP of a layer: DeepSeek's shared_experts, Qwen's and Llama 4's
# shared_expert, Granite's shared_mlp (under the layer, beside its MoE block),
# HunYuan-MoE's mlp.shared_mlp (in its MoE block).
SHARED_RE = re.compile(r"^(.*\.layers\.(\d+)\.(?:(?:mlp|feed_forward)\.shared_experts?|(?:mlp\.)?shared_mlp))$")

# ---- the families ---------------------------------------------------------------

SMALL = dict(vocab_size=64, hidden_size=32, num_attention_heads=2, num_key_value_heads=2)
MLA = dict(q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
ROUTED = dict(n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1)
DSA = dict(index_n_heads=2, index_head_dim=16, index_topk=8)  # DeepSeek sparse attention's indexer
LINEAR_ATTN = dict(linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8)
QWEN35_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=4,
                     spatial_merge_size=1, temporal_patch_size=1)
LLAMA4_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                     patch_size=8, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32)

def deepseek_v3(**keys):
    return tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(**SMALL, **MLA, **ROUTED, intermediate_size=48,
                                                        moe_intermediate_size=16, n_shared_experts=2, **keys))


def qwen35_text():
    return dict(**SMALL, head_dim=16, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, **LINEAR_ATTN)


def dots3_text():
    return dict(**SMALL, **dict(MLA, q_lora_rank=16), **ROUTED, **DSA, head_dim=16, intermediate_size=48,
                moe_intermediate_size=16, shared_experts_intermediate_size=8, n_shared_experts=2, num_hidden_layers=4,
                mlp_layer_types=["dense", "sparse", "dense", "sparse"], pad_token_id=0, bos_token_id=1, eos_token_id=1)


def aria_text():
    return dict(**SMALL, head_dim=16, intermediate_size=16, moe_num_experts=4, moe_topk=2, moe_num_shared_experts=2,
                num_hidden_layers=2)


def llama4_text(**keys):
    return dict(**SMALL, head_dim=16, intermediate_size=24, intermediate_size_mlp=48, num_local_experts=4,
                num_experts_per_tok=1, **keys)


@dataclasses.dataclass
class Family:
    name: str                      # this entry's name in the results
    family: str                    # what GET /model must call it
    make: Callable[[], torch.nn.Module]
    # How today's PEFT reaches the shared experts (docs/adapters.md):
    # "modules" = target_modules ["gate_proj", "up_proj", "down_proj"];
    # "parameters" = target_parameters, for the model types whose
    # gate_proj/up_proj/down_proj targets PEFT rewrites into the routed
    # experts' fused parameters (transformers' conversion mapping).
    peft: str
    single_file: bool = False      # model.safetensors, not shards and an index
    bf16: bool = False             # saved in bf16
    model_type: str | None = None  # config.json's model_type rewritten to this after saving
    refused: str | None = None     # start-up must stop with a message holding this
    refusals: bool = False         # also the adapters PEFT writes that must be refused (REFUSED)
    # The MLP's projections: gate, up, down; or (Granite) the fused gate
    # and up, then down.
    projs: tuple = PROJS

    @property
    def fused(self):
        return len(self.projs) == 2


# LoraConfig keys whose adapters the server must refuse (422), the error
# code and what its message must hold: the key, or for a trained copy of
# the shared experts (modules_to_save) the copy's tensor.
REFUSED = {
    "dora": ({"use_dora": True}, "adapter_config_invalid", '"use_dora"'),
    "pissa": ({"init_lora_weights": "pissa"}, "adapter_config_invalid", "PiSSA"),
    "olora": ({"init_lora_weights": "olora"}, "adapter_config_invalid", "OLoRA"),
    "lora-bias": ({"lora_bias": True}, "adapter_config_invalid", '"lora_bias"'),
    "save-shared": ({"target_modules": ["q_proj"], "modules_to_save": ["shared_expert"]}, "lora_unknown_tensor",
                    "mlp.shared_expert.gate_proj.weight is a trained copy"),
}

FAMILIES = [
    Family("deepseek_v3", "deepseek_v3", lambda: deepseek_v3(num_hidden_layers=4, first_k_dense_replace=1),
           "parameters"),
    # Kimi-K2's own config.json says model_type "kimi_k2" over DeepSeek-V3's
    # modules (its code is remote; transformers has no kimi_k2 class).
    Family("kimi_k2", "deepseek_v3", lambda: deepseek_v3(num_hidden_layers=4, first_k_dense_replace=2),
           "parameters", model_type="kimi_k2"),
    # moe_layer_freq is DeepSeek's own key; transformers' modeling code
    # ignores it (every layer from first_k_dense_replace has shared experts).
    Family("deepseek_v2", "deepseek_v2", lambda: tf.DeepseekV2ForCausalLM(tf.DeepseekV2Config(
        **SMALL, **MLA, **ROUTED, intermediate_size=48, moe_intermediate_size=16, n_shared_experts=2,
        num_hidden_layers=5, first_k_dense_replace=1, moe_layer_freq=2)), "parameters", single_file=True),
    Family("glm4_moe", "glm4_moe", lambda: tf.Glm4MoeForCausalLM(tf.Glm4MoeConfig(
        **SMALL, **ROUTED, head_dim=16, intermediate_size=48, moe_intermediate_size=16, n_shared_experts=2,
        num_hidden_layers=4, first_k_dense_replace=1)), "parameters"),
    Family("dots1", "dots1", lambda: tf.Dots1ForCausalLM(tf.Dots1Config(
        **SMALL, **ROUTED, head_dim=16, intermediate_size=48, moe_intermediate_size=16, n_shared_experts=2,
        num_hidden_layers=5, first_k_dense_replace=2)), "parameters"),
    Family("ernie4_5_moe", "ernie4_5_moe", lambda: tf.Ernie4_5_MoeForCausalLM(tf.Ernie4_5_MoeConfig(
        **SMALL, intermediate_size=48, moe_intermediate_size=16, moe_num_shared_experts=2, moe_num_experts=4,
        moe_k=2, num_hidden_layers=8, moe_layer_start_index=1, moe_layer_end_index=6, moe_layer_interval=2)),
           "parameters"),
    Family("qwen2_moe", "qwen2_moe", lambda: tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(
        **SMALL, intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[1])),
           "modules", refusals=True),
    Family("qwen2_moe_bf16", "qwen2_moe", lambda: tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(
        **SMALL, intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[2])), "modules", bf16=True),
    Family("qwen3_next", "qwen3_next", lambda: tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(
        **SMALL, **LINEAR_ATTN, head_dim=16, intermediate_size=48, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, num_hidden_layers=8, num_experts=4, num_experts_per_tok=2,
        decoder_sparse_step=2, mlp_only_layers=[5])), "parameters"),
    Family("qwen3_5_moe_text", "qwen3_5_moe", lambda: tf.Qwen3_5MoeForCausalLM(
        tf.Qwen3_5MoeTextConfig(**qwen35_text())), "modules"),
    # The vision-language checkpoint: model.language_model.layers.
    Family("qwen3_5_moe_vl", "qwen3_5_moe", lambda: tf.Qwen3_5MoeForConditionalGeneration(
        tf.Qwen3_5MoeConfig(text_config=qwen35_text(), vision_config=QWEN35_VISION)), "modules", single_file=True),
    Family("llama4_text", "llama4", lambda: tf.Llama4ForCausalLM(tf.Llama4TextConfig(
        **llama4_text(num_hidden_layers=6, interleave_moe_layer_step=2))), "modules"),
    # The vision-language checkpoint: language_model.model.layers.
    Family("llama4_vl", "llama4", lambda: tf.Llama4ForConditionalGeneration(tf.Llama4Config(
        text_config=llama4_text(num_hidden_layers=5, moe_layers=[0, 2, 3]), vision_config=LLAMA4_VISION)),
           "modules"),
    # transformers 5's newer DeepSeek-style families: their own code reads
    # mlp_layer_types (here against first_k_dense_replace's default 3),
    # counts num_shared_experts (EXAONE), or builds every layer (Solar).
    Family("deepseek_v32", "deepseek_v32", lambda: tf.DeepseekV32ForCausalLM(tf.DeepseekV32Config(
        **SMALL, **dict(MLA, q_lora_rank=16), **ROUTED, **DSA, intermediate_size=48, moe_intermediate_size=16,
        n_shared_experts=2, num_hidden_layers=4, mlp_layer_types=["dense", "sparse", "dense", "sparse"])),
           "parameters"),
    Family("glm_moe_dsa", "glm_moe_dsa", lambda: tf.GlmMoeDsaForCausalLM(tf.GlmMoeDsaConfig(
        **SMALL, **dict(MLA, q_lora_rank=16), **ROUTED, **DSA, intermediate_size=48, moe_intermediate_size=16,
        n_shared_experts=2, num_hidden_layers=4, first_k_dense_replace=1)), "parameters"),
    Family("glm4_moe_lite", "glm4_moe_lite", lambda: tf.Glm4MoeLiteForCausalLM(tf.Glm4MoeLiteConfig(
        **SMALL, **MLA, **ROUTED, intermediate_size=48, moe_intermediate_size=16, n_shared_experts=1,
        num_hidden_layers=4, mlp_layer_types=["dense", "dense", "sparse", "sparse"])), "parameters"),
    Family("exaone_moe", "exaone_moe", lambda: tf.ExaoneMoeForCausalLM(tf.ExaoneMoeConfig(
        **SMALL, head_dim=16, num_experts=4, num_experts_per_tok=2, intermediate_size=48, moe_intermediate_size=16,
        num_shared_experts=2, num_hidden_layers=4, first_k_dense_replace=2)), "parameters"),
    # A.X-K2 writes mlp_layer_types from first_k_dense_replace and
    # moe_layer_freq (both applied, as DeepSeek's own code does).
    Family("axk2", "axk2", lambda: tf.AXK2ForCausalLM(tf.AXK2Config(
        **SMALL, **dict(MLA, q_lora_rank=16), **ROUTED, intermediate_size=48, moe_intermediate_size=16,
        n_shared_experts=2, num_hidden_layers=5, first_k_dense_replace=1, moe_layer_freq=2)), "modules"),
    # GLM-4.5V's text model: model.language_model.layers, text_config's keys.
    Family("glm4v_moe", "glm4v_moe", lambda: tf.Glm4vMoeForConditionalGeneration(tf.Glm4vMoeConfig(
        text_config=dict(**SMALL, head_dim=16, **ROUTED, intermediate_size=48, moe_intermediate_size=16,
                         n_shared_experts=2, num_hidden_layers=3, first_k_dense_replace=1),
        vision_config=QWEN35_VISION)), "parameters", single_file=True),
    Family("mistral4", "mistral4", lambda: tf.Mistral4ForCausalLM(tf.Mistral4Config(
        **SMALL, **MLA, **ROUTED, intermediate_size=48, moe_intermediate_size=16, n_shared_experts=2,
        num_hidden_layers=4, first_k_dense_replace=1)), "modules"),
    Family("solar_open", "solar_open", lambda: tf.SolarOpenForCausalLM(tf.SolarOpenConfig(
        **SMALL, head_dim=16, **ROUTED, moe_intermediate_size=16, n_shared_experts=2, num_hidden_layers=3)),
           "parameters"),
    # Qwen's shared expert without its gate: Flint's Qwen2-MoE rule,
    # Lara-Mini's every layer.
    Family("flint", "flint", lambda: tf.FlintForCausalLM(tf.FlintConfig(
        **SMALL, head_dim=16, intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        num_experts=4, num_experts_per_tok=2, num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3])),
           "modules"),
    Family("lara_mini", "lara_mini", lambda: tf.LaraMiniForCausalLM(tf.LaraMiniConfig(
        **SMALL, head_dim=16, intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        num_experts=4, num_experts_per_tok=2, num_hidden_layers=3)), "modules"),
    # Granite's shared MLP, under the layer beside its MoE block: one fused
    # input_linear (gate rows, then up rows) and output_linear; Granite 4's
    # hybrid model has it on its Mamba layers and attention layers alike.
    Family("granitemoehybrid", "granitemoehybrid", lambda: tf.GraniteMoeHybridForCausalLM(tf.GraniteMoeHybridConfig(
        **SMALL, intermediate_size=16, shared_intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
        num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"], mamba_n_heads=4, mamba_d_state=8,
        mamba_d_head=16, mamba_chunk_size=8)), "modules", projs=("input_linear", "output_linear")),
    Family("granitemoeshared", "granitemoeshared", lambda: tf.GraniteMoeSharedForCausalLM(tf.GraniteMoeSharedConfig(
        **SMALL, intermediate_size=16, shared_intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
        num_hidden_layers=2)), "modules", single_file=True, projs=("input_linear", "output_linear")),
    Family("granitemoe_swa", "granitemoe_swa", lambda: tf.GraniteMoeSWAForCausalLM(tf.GraniteMoeSWAConfig(
        **SMALL, intermediate_size=16, shared_intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
        num_hidden_layers=3)), "modules", projs=("input_linear", "output_linear")),
    # DeepSeek-style shared experts in transformers 5's newer families:
    # mlp_layer_types written from first_k_dense_replace (and A.X-K1's
    # moe_layer_freq), Bailing-Hybrid counting num_shared_experts, dots3's
    # own width key, AFMoE's num_dense_layers, Aria on every layer.
    Family("axk1", "axk1", lambda: tf.AXK1ForCausalLM(tf.AXK1Config(
        **SMALL, **dict(MLA, q_lora_rank=16), **ROUTED, intermediate_size=48, moe_intermediate_size=16,
        n_shared_experts=2, num_hidden_layers=5, first_k_dense_replace=1, moe_layer_freq=2)), "modules"),
    Family("bailing_hybrid", "bailing_hybrid", lambda: tf.BailingHybridForCausalLM(tf.BailingHybridConfig(
        **SMALL, **MLA, head_dim=16, intermediate_size=48, moe_intermediate_size=16, n_shared_experts=2,
        num_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, num_hidden_layers=4, first_k_dense_replace=2,
        layer_group_size=2, pad_token_id=0, bos_token_id=1, eos_token_id=1)), "modules"),
    Family("dots3_note_text", "dots3_note", lambda: tf.Dots3NoteForCausalLM(tf.Dots3NoteTextConfig(**dots3_text())),
           "modules"),
    # The vision-and-audio checkpoint: model.language_model.layers.
    Family("dots3_note_vl", "dots3_note", lambda: tf.Dots3NoteForConditionalGeneration(tf.Dots3NoteConfig(
        text_config=dots3_text(), vision_config=dict(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=4,
            moe_intermediate_size=8, spatial_merge_size=1, adapter_in_dim=16, adapter_out_dim=32, adapter_merge_size=1,
            num_local_experts=2, mlp_layer_types=["dense"]),
        audio_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                          downsample_hidden_size=8, adapter_input_size=16, adapter_out_dim=32, feature_size=16))),
           "modules", single_file=True),
    Family("hy_v4", "hy_v4", lambda: tf.HYV4ForCausalLM(tf.HYV4Config(
        **SMALL, **dict(MLA, q_lora_rank=16), **ROUTED, **DSA, intermediate_size=48, moe_intermediate_size=16,
        n_shared_experts=2, num_hidden_layers=3, pad_token_id=0, bos_token_id=1, eos_token_id=1)), "modules"),
    Family("afmoe", "afmoe", lambda: tf.AfmoeForCausalLM(tf.AfmoeConfig(
        **SMALL, head_dim=16, intermediate_size=48, moe_intermediate_size=16, num_shared_experts=2, num_experts=4,
        num_experts_per_tok=2, num_hidden_layers=4, num_dense_layers=2)), "parameters"),
    Family("aria_text", "aria", lambda: tf.AriaTextForCausalLM(tf.AriaTextConfig(**aria_text())), "modules"),
    # The vision-language checkpoint: model.language_model.layers.
    Family("aria_vl", "aria", lambda: tf.AriaForConditionalGeneration(tf.AriaConfig(
        text_config=aria_text(), vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                    num_attention_heads=2, image_size=32, patch_size=16),
        projector_patch_to_query_dict={4: 2})), "modules", single_file=True),
    # ERNIE 4.5 VL's text model: mlp_layer_types, moe_intermediate_size[0].
    Family("ernie4_5_vl_moe", "ernie4_5_vl_moe", lambda: tf.Ernie4_5_VLMoeForConditionalGeneration(
        tf.Ernie4_5_VLMoeConfig(text_config=dict(
            **SMALL, head_dim=16, intermediate_size=48, moe_intermediate_size=[16, 8], moe_num_shared_experts=2,
            moe_num_experts=4, moe_k=2, num_hidden_layers=4, mlp_layer_types=["dense", "sparse", "dense", "sparse"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [3, 3, 2]}),
            vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4,
                               spatial_merge_size=1, temporal_merge_size=1))), "modules", single_file=True),
    # Kolibri's shared_experts of Qwen's width key; HunYuan-MoE's shared_mlp
    # in its MoE block, of intermediate_size: both on every layer.
    Family("kolibri1", "kolibri1", lambda: tf.Kolibri1ForCausalLM(tf.Kolibri1Config(
        **SMALL, head_dim=16, intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        num_experts=4, num_experts_per_tok=2, num_hidden_layers=2)), "modules"),
    Family("hunyuan_v1_moe", "hunyuan_v1_moe", lambda: tf.HunYuanMoEV1ForCausalLM(tf.HunYuanMoEV1Config(
        **SMALL, head_dim=16, intermediate_size=24, num_experts=4, moe_topk=2, num_hidden_layers=2)), "parameters"),
    # Not SwiGLU: the server computes silu, so it must refuse, not serve.
    Family("deepseek_v3_gelu", "deepseek_v3", lambda: deepseek_v3(num_hidden_layers=2, first_k_dense_replace=0,
                                                                  hidden_act="gelu"), "parameters",
           refused='hidden_act is "gelu"'),
]

# ---- the model's own answers ------------------------------------------------------


def shared_modules(model):
    """{layer: (module name, gate module name or None)} for every layer
    whose block the instantiated model built with shared experts."""
    names = {n for n, _ in model.named_modules()}
    out = {}
    for n in names:
        m = SHARED_RE.match(n)
        if m:
            gate = m.group(1).rsplit(".", 1)[0] + ".shared_expert_gate"
            out[int(m.group(2))] = (n, gate if gate in names else None)
    return dict(sorted(out.items()))


def module_forward(model, shared, layer, x):
    """The block's output from the transformers modules themselves, with
    the family's gate where it has one."""
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    name, gate = shared[layer]
    y = base.get_submodule(name)(x)
    if gate:
        y = torch.sigmoid(base.get_submodule(gate)(x)) * y
    return y


def targets(fam, kind, shared, layers=None):
    """The LoraConfig keys that reach the shared experts (see Family.peft),
    on every layer or on the layers given."""
    if kind == "modules":
        out = {"target_modules": list(fam.projs)}
        if layers is not None:
            out["layers_to_transform"] = list(layers)
        return out
    if layers is None:  # "mlp.shared_experts.gate_proj.weight": every layer's
        first = shared[next(iter(shared))][0]
        tail = first.rsplit(".", 1)[1] if fam.fused else ".".join(first.split(".")[-2:])
        return {"target_modules": None, "target_parameters": [f"{tail}.{p}.weight" for p in fam.projs]}
    return {"target_modules": None,
            "target_parameters": [f"{shared[l][0]}.{p}.weight" for l in layers for p in fam.projs]}


def adapter_configs(fam, shared):
    """rank_pattern + alpha_pattern + rsLoRA on every layer; plain LoRA on
    the first and last MoE layer; where target_modules reaches the shared
    experts, target_parameters too (it works in every family). PEFT matches
    patterns against the module's name, or for target_parameters against
    "{module}.weight"."""
    w = ".weight" if fam.peft == "parameters" else ""
    layers = list(shared)
    second = shared[layers[1]][0]
    # Separate: up's rank, one layer's down rank, gate's alpha; fused:
    # gate-and-up's rank, one layer's down rank, down's alpha.
    up, down = fam.projs[0 if fam.fused else 1], fam.projs[-1]
    ranks = LoraConfig(r=4, lora_alpha=8, use_rslora=True, init_lora_weights=False,
                       rank_pattern={up + w: 6, f"{second}.{down}" + w: 2},
                       alpha_pattern={fam.projs[-1 if fam.fused else 0] + w: 12}, **targets(fam, fam.peft, shared))
    some = (layers[0], layers[-1])
    out = {"ranks": (ranks, layers),
           "some-layers": (LoraConfig(r=3, lora_alpha=6, init_lora_weights=False,
                                      **targets(fam, fam.peft, shared, layers=some)), list(some))}
    if fam.peft == "modules":
        out["parameters"] = (LoraConfig(r=2, lora_alpha=5, init_lora_weights=False,
                                        **targets(fam, "parameters", shared)), layers)
    if any(gate for _, gate in shared.values()):
        # What users train most: every Linear, the shared-expert gate's
        # too, with its own rank and alpha. (Where the entry says
        # target_parameters, PEFT's all-linear reaches the gate alone.)
        out["all-linear"] = (LoraConfig(r=2, lora_alpha=6, init_lora_weights=False, target_modules="all-linear",
                                        rank_pattern={"shared_expert_gate": 3},
                                        alpha_pattern={"shared_expert_gate": 5}), layers)
    return out


def check_not_reached(fam, model, shared, notes):
    """Where the entry says target_parameters, the plain target_modules
    list must still miss the shared experts (PEFT rewrites it into the
    routed experts' fused parameters): else docs/adapters.md's table is out
    of date."""
    if fam.peft != "parameters":
        return
    pm = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, **targets(fam, "modules", shared)))
    hit = [n for n, _ in pm.named_modules() if any(n.endswith(f"{shared[l][0]}.{p}.lora_A") for l in shared
                                                   for p in fam.projs)]
    if hit:
        raise RuntimeError(f"target_modules {list(fam.projs)} now reaches {hit[0]}: update docs/adapters.md")
    notes.append("target_modules list misses the shared experts")


def check_reach(fam, adir, name, shared, layers):
    """The adapter PEFT saved holds A and B of every shared-expert
    projection of the layers it was made for: the target spec reached them."""
    with safe_open(os.path.join(adir, name, "adapter_model.safetensors"), "np") as f:
        keys = set(f.keys())
    want = [f"{shared[l][0]}.{p}.lora_{ab}.weight" for l in layers for p in fam.projs for ab in "AB"
            if name != "all-linear" or fam.peft == "modules"]
    if name == "all-linear":  # and the shared-expert gate's
        want += [f"{shared[l][1]}.lora_{ab}.weight" for l in layers if shared[l][1] for ab in "AB"]
    missing = [w for w in want if f"base_model.model.{w}" not in keys]
    if missing:
        raise RuntimeError(f"{fam.name}/{name}: PEFT wrote no {missing[0]} ({len(missing)} missing); "
                           f"tensors: {sorted(keys)[:6]}")
    return len(keys)

# ---- the server ------------------------------------------------------------------


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http(port, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def http_raw(port, path, data):
    """POST of a safetensors body."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST",
                                 headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def start_server(binary, weights, adapter_dir, log):
    port = free_port()
    proc = subprocess.Popen([binary, "--weights", weights, "--device", "cpu", "--port", str(port), "--max-rank",
                             "16", "--adapter-dir", adapter_dir], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if http(port, "GET", "/ready")[0] == 200:
                return proc, port
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    log.flush()
    with open(log.name) as f:
        tail = f.read()[-600:]
    raise RuntimeError(f"lorasink did not become ready: {tail.strip()}")


def check_model(port, fam, shared, dense, dtype, notes):
    """GET /model says what was loaded; a dense layer is a clear 400."""
    st, m = http(port, "GET", "/model")
    want_gate = any(g for _, g in shared.values())
    if (st != 200 or m.get("family") != fam.family or m.get("layers") != list(shared)
            or bool(m.get("gate")) != want_gate or m.get("dtype") != dtype):
        raise RuntimeError(f"GET /model {st} {json.dumps(m)}; the model has shared experts on {list(shared)}, "
                           f"gate {want_gate}, dtype {dtype}")
    notes.append(f"GET /model {m['family']} layers {m['layers']} gate {m['gate']} {m['dtype']}")
    if dense:
        st, r = http(port, "POST", "/forward", {"layer": dense[0], "x": [[0.0] * m["hidden"]]})
        if st != 400 or "dense" not in r["error"]["message"]:
            raise RuntimeError(f"forward on dense layer {dense[0]}: {st} {json.dumps(r)}")
        notes.append(f"dense {dense}: 400")
    else:
        notes.append("no dense layer")
    return m["hidden"]

# ---- the adapter's other forms ---------------------------------------------------


def pool_form(fam, peft_model, shared):
    """The pool format of a PEFT adapter's math, laid out as docs/math.md
    ("Separate gate and up factors in a slot") says: rank R the largest
    module rank, gate's A in rows 0.., up's in rows R.., each B scaled by
    its module's own PEFT scaling (in f64, then rounded to f32). A fused
    module's A is both gate's and up's, its B's first F rows gate's."""
    base = peft_model.get_base_model()
    mods = {(l, p): base.get_submodule(f"{shared[l][0]}.{p}") for l in shared for p in fam.projs}
    mods = {k: m for k, m in mods.items() if "default" in getattr(m, "lora_A", {})}
    if not mods:  # the shared-expert gate alone: no pool buffer holds it
        return None
    R = max(m.r["default"] for m in mods.values())
    out = {}
    for l in sorted({l for l, _ in mods}):
        g, u, d = (mods.get((l, p)) for p in (fam.projs[:1] * 2 + fam.projs[1:] if fam.fused else fam.projs))
        ref = g or u
        H, F = ref.lora_A["default"].weight.shape[1], ref.lora_B["default"].weight.shape[0] // (2 if fam.fused else 1)
        a, b = np.zeros((2 * R, H), np.float32), np.zeros((2 * F, R), np.float32)
        da, db = np.zeros((R, F), np.float32), np.zeros((H, R), np.float32)

        def factors(m):
            r = m.r["default"]
            A = m.lora_A["default"].weight.detach().double().numpy()
            B = m.lora_B["default"].weight.detach().double().numpy() * m.scaling["default"]
            return r, A.astype(np.float32), B.astype(np.float32)
        for m, row in ((g, 0), (u, 1)):
            if m:
                r, A, B = factors(m)
                a[row * R:row * R + r] = A
                b[row * F:(row + 1) * F, :r] = B[row * F:(row + 1) * F] if fam.fused else B
        if d:
            r, A, B = factors(d)
            da[:r], db[:, :r] = A, B
        p = f"model.layers.{l}.mlp.shared_experts."
        for k, v in (("gate_up_lora_a", a), ("gate_up_lora_b", b), ("down_lora_a", da), ("down_lora_b", db)):
            out[p + k] = np.ascontiguousarray(v.reshape(1, 1, *v.shape))
    return out


def check_other_forms(port, fam, active, loaded, shared, notes):
    """The pool form of each adapter's math normalises to its sha256; an
    adapter with skipped factors is refused with strict, each named."""
    from safetensors.numpy import save
    strict = 0
    for name, pm in active.items():
        sha, ignored = loaded[name]["sha256"], loaded[name].get("ignored", [])
        form = pool_form(fam, pm, shared)
        if form is None:
            notes.append(f"{name}: the gate alone, no pool form")
        else:
            st, v = http_raw(port, f"/adapters/validate?format=pool&name={name}-pool", save(form))
            # The pool format has no buffer for the shared-expert gate's delta.
            gate = loaded[name].get("shared_expert_gate", False)
            if st != 200 or (v.get("sha256") == sha) == gate or v.get("rank") != loaded[name]["rank"]:
                raise RuntimeError(f"{name}: the pool form gives {st} {json.dumps(v)[:300]}, the PEFT directory "
                                   f"{sha}{' with the gate' if gate else ''}")
        if ignored:
            st, v = http(port, "POST", "/adapters/validate", {"path": name, "strict": True})
            named = sorted(x.get("tensor", "") for x in v.get("error", {}).get("violations", []))
            if st != 422 or v["error"]["code"] != "lora_unknown_tensor" or named != sorted(ignored):
                raise RuntimeError(f"{name} with strict: {st} {json.dumps(v)[:300]}")
            strict += 1
    notes.append(f"pool forms: same sha256; strict refuses the skipped factors ({strict} adapters)")

# ---- one family ------------------------------------------------------------------


def save_checkpoint(fam, model, ckpt):
    """save_pretrained as the entry says; the files must be what it says."""
    model.save_pretrained(ckpt, **({} if fam.single_file else {"max_shard_size": "20KB"}))
    files = sorted(f for f in os.listdir(ckpt) if f.endswith(".safetensors"))
    if fam.single_file != (files == ["model.safetensors"]):
        raise RuntimeError(f"save_pretrained wrote {files}")
    if fam.model_type:
        path = os.path.join(ckpt, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg["model_type"] = fam.model_type
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)
    return "1 file" if fam.single_file else f"{len(files)} shards"


def make_adapters(fam, saved, model, shared, adir, notes):
    """Saves both adapters, made by PEFT on the model as saved (bf16
    factors on a bf16 model); one PeftModel per adapter on the f32 model
    for the reference (PEFT refuses two target_parameters adapters of
    different parameter sets in one model)."""
    active = {}
    for i, (name, (cfg, layers)) in enumerate(adapter_configs(fam, shared).items()):
        torch.manual_seed(10 + i)
        pm = get_peft_model(copy.deepcopy(saved), cfg, autocast_adapter_dtype=False)
        pm.save_pretrained(os.path.join(adir, name))
        n = check_reach(fam, adir, name, shared, layers)
        active[name] = PeftModel.from_pretrained(copy.deepcopy(model), os.path.join(adir, name)).eval()
        notes.append(f"{name} {n} tensors")
    return active


def make_refused(fam, model, adir, active, notes):
    """The REFUSED adapters, saved as PEFT writes them; and a PiSSA adapter
    converted at save time (path_initial_model_for_weight_conversion),
    which is a plain delta of rank 2r on the original weights and must
    load and compute: it joins the adapters the forwards check."""
    if not fam.refusals:
        return {}
    projs = {"target_modules": list(fam.projs)}
    for name, (keys, _, _) in REFUSED.items():
        pm = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, lora_alpha=4, **{**projs, **keys}))
        pm.save_pretrained(os.path.join(adir, name))
    torch.manual_seed(20)
    pm = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, lora_alpha=4, init_lora_weights="pissa", **projs))
    pm.save_pretrained(os.path.join(adir, "pissa-initial"))
    with torch.no_grad():  # "training": B moves away from its initial value
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.add_(0.05 * torch.randn_like(p))
    pm.peft_config["default"].init_lora_weights = True
    pm.save_pretrained(os.path.join(adir, "pissa-converted"),
                       path_initial_model_for_weight_conversion=os.path.join(adir, "pissa-initial"))
    active["pissa-converted"] = PeftModel.from_pretrained(copy.deepcopy(model),
                                                          os.path.join(adir, "pissa-converted")).eval()
    # Beside its factors PEFT saves trained copies and biases of other
    # modules: they must load, skipped and listed in ignored. The routed
    # experts' copy keeps their fused parameters' names (no .weight).
    torch.manual_seed(21)
    pm = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, lora_alpha=4, init_lora_weights=False, bias="all",
                                                         modules_to_save=["lm_head", "experts"],
                                                         trainable_token_indices=[0, 1], **projs))
    pm.save_pretrained(os.path.join(adir, "other-modules"))
    active["other-modules"] = PeftModel.from_pretrained(copy.deepcopy(model),
                                                        os.path.join(adir, "other-modules")).eval()
    notes.append(f"{len(REFUSED)} adapters to refuse, pissa-converted, other-modules")
    return {name: (code, why) for name, (_, code, why) in REFUSED.items()}


def check_refusals(port, refused, notes):
    for name, (code, why) in refused.items():
        st, r = http(port, "POST", "/adapters/validate", {"path": name})
        err = r.get("error", {})
        said = [err.get("message", "")] + [v.get("message", "") for v in err.get("violations", [])]
        if st != 422 or err.get("code") != code or not any(why in m for m in said):
            raise RuntimeError(f"{name}: {st} {json.dumps(r)[:300]}, expected 422 {code} naming {why}")
    if refused:
        notes.append(f"refused: {', '.join(refused)} (422, naming the key or the trained copy)")


def make_attention_only(model, adir):
    """An adapter that trains attention only: it reaches no shared expert."""
    pm = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, lora_alpha=4, target_modules=["o_proj"]))
    pm.save_pretrained(os.path.join(adir, "attention-only"))


def check_empty_hint(port, fam, shared, notes):
    """lora_empty's hint gives the LoraConfig keys this family's entry
    reaches the shared experts with (the server's table agrees with this
    file's, which the adapters above hold to PEFT)."""
    want = "LoraConfig(" + ", ".join(f"{k}={'None' if v is None else json.dumps(v)}"
                                     for k, v in targets(fam, fam.peft, shared).items()) + ")"
    st, r = http(port, "POST", "/adapters/validate", {"path": "attention-only"})
    err = r.get("error", {})
    if st != 422 or err.get("code") != "lora_empty" or want not in err.get("hint", ""):
        raise RuntimeError(f"attention-only: {st} {json.dumps(r)[:400]}, expected lora_empty with {want}")
    notes.append("attention-only: lora_empty, hint " + want)


def check_mlp_warning(name, reply, notes):
    """Factors PEFT put on another MLP (a dense layer's) are skipped, and
    the load says so in warnings; without them it says nothing of it."""
    mlp = [n for n in reply.get("ignored", []) if ".lora_" in n and any(m in n for m in (".mlp.", ".feed_forward."))]
    said = [w for w in reply.get("warnings", []) if "MLP modules other than the shared experts" in w]
    if bool(mlp) != bool(said):
        raise RuntimeError(f"{name}: {len(mlp)} MLP factors ignored, warnings {reply.get('warnings')}")
    # Every pattern key of these configs matches a shared-expert module,
    # and every key is one save_pretrained writes: no near miss either.
    false = [w for w in reply.get("warnings", [])
             if "matches none of the modules" in w or "is no LoraConfig key" in w]
    if false:
        raise RuntimeError(f"{name}: a warning about a config PEFT wrote itself: {false}")
    if said:
        notes.append(f"{name}: {len(mlp)} MLP factors skipped, warned")


def check_modules(fam, name, pm, reply, shared):
    """The load reply's modules say each module's rank and scale as PEFT
    loaded it (its r and scaling), layer by layer, and nothing else."""
    base = pm.get_base_model()
    want = {}
    for l, (module, gate) in shared.items():
        names = [(p, f"{module}.{p}") for p in fam.projs] + ([("shared_expert_gate", gate)] if gate else [])
        for leaf, path in names:
            m = base.get_submodule(path)
            if "default" in getattr(m, "lora_A", {}):
                want[(leaf, l)] = (m.r["default"], float(m.scaling["default"]))
    got = {}
    for e in reply.get("modules", []):
        for l in e["layers"]:
            got[(e["module"], l)] = (e["rank"], e["scale"])
    bad = [k for k in set(want) | set(got) if k not in want or k not in got or want[k][0] != got[k][0]
           or abs(want[k][1] - got[k][1]) > 1e-9 * max(1.0, abs(want[k][1]))]
    if bad:
        k = sorted(bad)[0]
        raise RuntimeError(f"{name}: modules says {got.get(k)} for {k}, PEFT loaded {want.get(k)}")
    return len(want)


def check_other_modules(loaded, notes):
    """The saved copies of lm_head and the routed experts, the biases and
    the trainable tokens are each listed as skipped."""
    if "other-modules" not in loaded:
        return
    ignored = loaded["other-modules"].get("ignored", [])
    kinds = {"lm_head.weight": "base_model.model.lm_head.weight", "bias": ".bias",
             "trainable tokens": "trainable_tokens_delta", "routed experts' copy": "mlp.experts.gate_up_proj"}
    missing = [k for k, part in kinds.items() if not any(part in n for n in ignored)]
    if missing:
        raise RuntimeError(f"other-modules: ignored lists no {', '.join(missing)}: {ignored[:8]}")
    notes.append(f"other-modules: {len(ignored)} tensors of other modules ignored")


def check_forwards(port, fam, model, shared, active, hidden, notes):
    names = list(active) + [None]
    worst = 0.0
    T = 3 * len(names)
    for layer in shared:
        x = torch.randn(T, hidden)
        expected = torch.zeros(T, hidden)
        with torch.no_grad():
            for t in range(T):
                a = names[t % len(names)]
                expected[t] = module_forward(active[a] if a else model, shared, layer, x[t:t + 1])[0]
        # No gammas: the server applies the family's gate itself.
        st, r = http(port, "POST", "/forward", {"layer": layer, "x": x.tolist(),
                                                "adapters": [names[t % len(names)] for t in range(T)]})
        if st != 200:
            raise RuntimeError(f"forward on layer {layer}: {st} {json.dumps(r)}")
        y = torch.tensor(r["y"])
        worst = max(worst, (torch.linalg.norm(y - expected) / torch.linalg.norm(expected)).item())
        with torch.no_grad():  # the adapters do something: the base alone would not match
            plain = module_forward(model, shared, layer, x)
        if torch.linalg.norm(plain - expected) <= 1e-3 * torch.linalg.norm(expected):
            raise RuntimeError(f"layer {layer}: the adapters change nothing; the check would not see them")
    notes.append(f"forwards on {len(shared)} layers, {T} tokens each ({', '.join(a or 'none' for a in names)}): "
                 f"largest relative L2 {worst:.2e}")
    if worst > TOL:
        raise RuntimeError(f"relative error {worst:.3g} above {TOL}")


def check_refused(binary, work, fam, ckpt, adir, notes):
    """A checkpoint the server cannot serve exactly: start-up stops, saying why."""
    with open(os.path.join(work, fam.name, "lorasink.log"), "w") as log:
        try:
            proc, _ = start_server(binary, ckpt, adir, log)
        except RuntimeError as e:
            if fam.refused not in str(e):
                raise
            last = str(e).splitlines()[-1]
            notes.append("start-up refused: " + last[last.find("config.json"):][:160])
            return
        proc.terminate()
        proc.wait(timeout=30)
    raise RuntimeError(f"lorasink served it; expected a refusal holding {fam.refused!r}")


def check_family(binary, work, fam, notes):
    torch.manual_seed(1)
    model = fam.make().eval()
    shared = shared_modules(model)
    total = model.config.get_text_config().num_hidden_layers
    dense = [l for l in range(total) if l not in shared]
    ckpt, adir = os.path.join(work, fam.name, "checkpoint"), os.path.join(work, fam.name, "adapters")
    os.makedirs(adir, exist_ok=True)
    saved = model.to(torch.bfloat16) if fam.bf16 else model
    notes.append(save_checkpoint(fam, saved, ckpt) + (" bf16" if fam.bf16 else ""))
    if fam.refused:
        return check_refused(binary, work, fam, ckpt, adir, notes)
    # The reference runs in f32 on the values saved.
    model = copy.deepcopy(saved).float() if fam.bf16 else model
    check_not_reached(fam, model, shared, notes)
    active = make_adapters(fam, saved, model, shared, adir, notes)
    refused = make_refused(fam, model, adir, active, notes)
    make_attention_only(model, adir)
    with open(os.path.join(work, fam.name, "lorasink.log"), "w") as log:
        proc, port = start_server(binary, ckpt, adir, log)
        try:
            hidden = check_model(port, fam, shared, dense, "BF16" if fam.bf16 else "F32", notes)
            loaded = {}
            for name in active:
                st, loaded[name] = http(port, "POST", "/adapters", {"name": name, "path": name})
                if st != 201:
                    raise RuntimeError(f"loading {name}: {st} {json.dumps(loaded[name])}")
                notes.append(f"{name} rank {loaded[name]['rank']} ignored {len(loaded[name].get('ignored', []))}, "
                             f"{check_modules(fam, name, active[name], loaded[name], shared)} module scales as PEFT's")
                check_mlp_warning(name, loaded[name], notes)
            check_refusals(port, refused, notes)
            check_empty_hint(port, fam, shared, notes)
            check_other_modules(loaded, notes)
            check_forwards(port, fam, model, shared, active, hidden, notes)
            check_other_forms(port, fam, active, loaded, shared, notes)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def check_demo(binary, work, notes):
    """The README's demo files are what transformers and PEFT read: the
    checkpoint of scripts/write-demo-checkpoint.py loads with no key
    missing, unexpected or of another shape, the adapter of
    scripts/write-demo-adapter.py loads onto it with no adapter key
    missing, and lorasink serving both gives the modules' own forward."""
    torch.manual_seed(1)
    ckpt, adir = os.path.join(work, "demo", "checkpoint"), os.path.join(work, "demo", "adapters")
    for script, out in (("write-demo-checkpoint.py", ckpt), ("write-demo-adapter.py", os.path.join(adir, "mine"))):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", script), out], check=True,
                       stdout=subprocess.DEVNULL)
    model, info = tf.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise RuntimeError(f"transformers loaded the demo checkpoint with {bad}")
    model.eval()
    shared = shared_modules(model)
    notes.append(f"checkpoint loads with every key, shared experts on {list(shared)}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        adapted = PeftModel.from_pretrained(copy.deepcopy(model), os.path.join(adir, "mine")).eval()
    said = [str(w.message) for w in caught if "adapter keys" in str(w.message) or "unexpected" in str(w.message)]
    if said:
        raise RuntimeError(f"PEFT loading the demo adapter said: {said[0][:300]}")
    notes.append("adapter loads onto it with no key missing")
    with open(os.path.join(work, "demo", "lorasink.log"), "w") as log:
        proc, port = start_server(binary, ckpt, adir, log)
        try:
            hidden = check_model(port, Family("demo", "qwen2_moe", None, "modules"), shared, [1], "BF16", notes)
            st, r = http(port, "POST", "/adapters", {"name": "mine", "path": "mine"})
            if st != 201:
                raise RuntimeError(f"loading mine: {st} {json.dumps(r)}")
            check_forwards(port, None, model, shared, {"mine": adapted}, hidden, notes)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def main():
    binary, work, only = sys.argv[1], sys.argv[2], sys.argv[3:]
    torch.set_default_dtype(torch.float32)
    print(f"transformers {tf.__version__}, peft {peft.__version__}, torch {torch.__version__}, "
          f"numpy {np.__version__}", flush=True)
    failed = []
    if not only or "demo" in only:
        notes = []
        try:
            check_demo(binary, work, notes)
            print("PASS demo: " + "; ".join(notes), flush=True)
        except Exception as e:  # report it with the families
            failed.append("demo")
            print("FAIL demo: " + "; ".join(notes + [str(e)]), flush=True)
    for fam in FAMILIES:
        if only and fam.name not in only:
            continue
        notes = []
        try:
            check_family(binary, work, fam, notes)
            print(f"PASS {fam.name}: " + "; ".join(notes), flush=True)
        except Exception as e:  # report every family
            failed.append(fam.name)
            print(f"FAIL {fam.name}: " + "; ".join(notes + [str(e)]), flush=True)
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
