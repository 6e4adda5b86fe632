#!/usr/bin/env python3
"""Writes tests/fixtures/hf/<case>/: one attention layer of a Hugging Face model family, its
config.json, inputs and the float64 expected output. Run by hand (not by CI):

    source ~/.cache/mha-pytorch-cpu/bin/activate      # see ../../../shared/pytorch-cpu/
    nice -n 19 python dev/hf_fixtures/generate.py     # from the repository root

For every case it
  1. builds the family's config with small odd sizes, writes it as config.json (in the spelling
     transformers v5 writes, `rope_parameters`, or in the legacy spelling most published
     checkpoints carry, `rope_theta` / `rope_scaling` / `rotary_pct` ...), and reads it back with
     transformers' own `from_json_file`, so the module below is built from the file as written;
  2. instantiates the family's *ForCausalLM with one layer, fills that layer's attention weights
     with random float32 values (upcast to float64 exactly) and takes its attention module and
     rotary embedding module;
  3. runs the attention module on float32 inputs x (upcast exactly) with a causal mask and
     position_ids, in float64, twice:
       - "plain": `.double()` as is. The eager code still computes cos/sin (and inv_freq), softmax
         and RMSNorm in float32 internally, so this run agrees with the truth to ~1e-7 only;
       - "f64": the same code with `torch.float`/`torch.float32` pointing at float64 and float64
         the default dtype while the model is built and run, so those internal casts become
         no-ops and everything is float64;
  4. computes the same layer with an independent plain numpy float64 implementation written
     below from the config.json text (projection, QK-norm, rotary with the inv_freq formulas of
     transformers' modeling_rope_utils incl. linear/llama3/yarn, causal softmax, output
     projection), asserts that it agrees with the "f64" run to 1e-12 relative (max |diff| /
     max |expected|) and with the "plain" run to 1e-5, and writes the numpy result as `expected`.

Issue 13's cases (sliding windows, Gemma 2/3 soft-capping / query_pre_attn_scalar / layer types /
(1 + w) QK-norm / local rope theta, BLOOM ALiBi, gpt-oss sinks) take the layer at index `layer`
of a `layers`-layer model, and feed its attention module the mask, cos/sin and ALiBi tensor that
the model's own forward passes to that layer (captured with a pre-hook), so the window and
layer-type conventions compared against are transformers' own; the numpy reference derives them
from the config.json text. Each such case also records how much the output changes when its
feature is dropped (`validation.max_abs_change_without_*`, required > 1e-3).

Outputs per case (see README.md for the exact formats): config.json, model.safetensors (the one
layer's attention weights under their real checkpoint names, float32), io.safetensors (x float32,
position_ids int64, expected float64, plus `__metadata__`), case.json.
"""

import contextlib
import inspect
import json
import math
import os
import shutil
import sys

# The numpy reference's last bits depend on the kernels numpy and OpenBLAS pick for the CPU
# (numpy's AVX-512 exp / reductions, OpenBLAS's SkylakeX GEMM differ from the AVX2 ones by an
# ulp): pinned to the AVX2 ones before numpy loads, so that `expected` is byte-identical on
# every x86-64 machine. (transformers' own runs, reported in case.json's `validation`, still
# use torch's kernels for the CPU: those figures may differ in their last digits.)
os.environ.setdefault("NPY_DISABLE_CPU_FEATURES", "X86_V4 AVX512_ICL AVX512_SPR")
os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

import numpy as np  # noqa: E402
import safetensors
import safetensors.numpy
import torch
import transformers
from transformers import (
    ApertusConfig,
    ApertusForCausalLM,
    Cohere2Config,
    Cohere2ForCausalLM,
    Ernie4_5Config,
    Ernie4_5ForCausalLM,
    Exaone4Config,
    Exaone4ForCausalLM,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    Olmo3Config,
    Olmo3ForCausalLM,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
    SeedOssConfig,
    SeedOssForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
    BloomConfig,
    BloomForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Llama4ForCausalLM,
    Llama4TextConfig,
    Ministral3Config,
    Ministral3ForCausalLM,
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    Gemma4ForCausalLM,
    Gemma4TextConfig,
    MiMoV2FlashConfig,
    MiMoV2FlashForCausalLM,
    Gemma3nTextConfig,
    Gemma3nForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    GPTJConfig,
    GPTJForCausalLM,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PhiConfig,
    PhiForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    MiniMaxM2Config,
    MiniMaxM2ForCausalLM,
    HunYuanDenseV1Config,
    HunYuanDenseV1ForCausalLM,
    Lfm2Config,
    Lfm2ForCausalLM,
    NemotronHConfig,
    NemotronHForCausalLM,
    GraniteSWAConfig,
    GraniteSWAForCausalLM,
    GraniteMoeHybridConfig,
    GraniteMoeHybridForCausalLM,
    FalconH1Config,
    FalconH1ForCausalLM,
)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "hf")

# Agreement required between the numpy float64 reference and transformers run fully in float64,
# as max |diff| / max |expected|.
TOL_F64 = 1e-12
# ... and with transformers' `.double()` run, which keeps float32 internals.
TOL_PLAIN = 1e-5

# Sizes shared by every case that are irrelevant to attention (the rest of the model is built
# only to get real checkpoint names).
TINY = dict(num_hidden_layers=1, intermediate_size=8, vocab_size=16)


# --------------------------------------------------------------------------------------------
# Families: config class, model class, where the layer's attention and rotary modules live.
# --------------------------------------------------------------------------------------------
FAMILIES = {
    "llama": dict(config=LlamaConfig, model=LlamaForCausalLM, prefix="model.layers.{}.self_attn.",
                  attn=lambda m, i: m.model.layers[i].self_attn, rotary=lambda m: m.model.rotary_emb),
    "mistral": dict(config=MistralConfig, model=MistralForCausalLM, prefix="model.layers.{}.self_attn.",
                    attn=lambda m, i: m.model.layers[i].self_attn, rotary=lambda m: m.model.rotary_emb),
    "qwen2": dict(config=Qwen2Config, model=Qwen2ForCausalLM, prefix="model.layers.{}.self_attn.",
                  attn=lambda m, i: m.model.layers[i].self_attn, rotary=lambda m: m.model.rotary_emb),
    "qwen3": dict(config=Qwen3Config, model=Qwen3ForCausalLM, prefix="model.layers.{}.self_attn.",
                  attn=lambda m, i: m.model.layers[i].self_attn, rotary=lambda m: m.model.rotary_emb),
    "phi3": dict(config=Phi3Config, model=Phi3ForCausalLM, prefix="model.layers.{}.self_attn.",
                 attn=lambda m, i: m.model.layers[i].self_attn, rotary=lambda m: m.model.rotary_emb),
    "phi": dict(config=PhiConfig, model=PhiForCausalLM, prefix="model.layers.{}.self_attn.",
                attn=lambda m, i: m.model.layers[i].self_attn, rotary=lambda m: m.model.rotary_emb),
    "olmo2": dict(config=Olmo2Config, model=Olmo2ForCausalLM, prefix="model.layers.{}.self_attn.",
                  attn=lambda m, i: m.model.layers[i].self_attn, rotary=lambda m: m.model.rotary_emb),
    "gpt_neox": dict(config=GPTNeoXConfig, model=GPTNeoXForCausalLM, prefix="gpt_neox.layers.{}.attention.",
                     attn=lambda m, i: m.gpt_neox.layers[i].attention, rotary=lambda m: m.gpt_neox.rotary_emb),
    # GPT-J computes its (interleaved) rotary inside the attention module from position_ids.
    "gptj": dict(config=GPTJConfig, model=GPTJForCausalLM, prefix="transformer.h.{}.attn.",
                 attn=lambda m, i: m.transformer.h[i].attn, rotary=None),
    # Issue 13's families. Their modules are fed the mask, cos/sin (Gemma 3: of the layer's type)
    # and ALiBi tensor that the model's own forward hands to layer `i` (see `captured_inputs`), so
    # the window / layer-type / ALiBi conventions checked are transformers' own.
    "gemma2": dict(config=Gemma2Config, model=Gemma2ForCausalLM, prefix="model.layers.{}.self_attn.",
                   attn=lambda m, i: m.model.layers[i].self_attn, rotary=None),
    "gemma3": dict(config=Gemma3TextConfig, model=Gemma3ForCausalLM, prefix="model.layers.{}.self_attn.",
                   attn=lambda m, i: m.model.layers[i].self_attn, rotary=None,
                   # Gemma's RMSNorm multiplies by (1 + weight); real checkpoints store weights
                   # around 0, so the random ones are drawn there too.
                   norm_range=(-0.5, 0.5)),
    "bloom": dict(config=BloomConfig, model=BloomForCausalLM, prefix="transformer.h.{}.self_attention.",
                  attn=lambda m, i: m.transformer.h[i].self_attention, rotary=None),
    "gpt_oss": dict(config=GptOssConfig, model=GptOssForCausalLM, prefix="model.layers.{}.self_attn.",
                    attn=lambda m, i: m.model.layers[i].self_attn, rotary=None),
    # Issue 33's families (all fed the model's own mask and cos/sin, `model_inputs`).
    **{family: dict(config=config, model=model, prefix="model.layers.{}.self_attn.",
                    attn=lambda m, i: m.model.layers[i].self_attn, rotary=None)
       for family, config, model in [
           ("glm4_moe", Glm4MoeConfig, Glm4MoeForCausalLM),
           ("smollm3", SmolLM3Config, SmolLM3ForCausalLM),
           ("olmo3", Olmo3Config, Olmo3ForCausalLM),
           ("seed_oss", SeedOssConfig, SeedOssForCausalLM),
           ("ernie4_5", Ernie4_5Config, Ernie4_5ForCausalLM),
           ("apertus", ApertusConfig, ApertusForCausalLM),
           ("exaone4", Exaone4Config, Exaone4ForCausalLM),
           ("cohere2", Cohere2Config, Cohere2ForCausalLM),
           ("qwen3_next", Qwen3NextConfig, Qwen3NextForCausalLM),
           ("ministral3", Ministral3Config, Ministral3ForCausalLM),
           ("llama4", Llama4TextConfig, Llama4ForCausalLM),
           ("gemma4", Gemma4TextConfig, Gemma4ForCausalLM),
           ("mimo_v2_flash", MiMoV2FlashConfig, MiMoV2FlashForCausalLM),
       ]},
    # A composite model: the text model under `text_config`, its layers under
    # `model.language_model.`; the mask and cos/sin are captured from the language model alone
    # (`runner`), as a text-only forward computes them.
    "qwen3_5": dict(config=Qwen3_5Config, model=Qwen3_5ForConditionalGeneration,
                    prefix="model.language_model.layers.{}.self_attn.",
                    attn=lambda m, i: m.model.language_model.layers[i].self_attn, rotary=None,
                    runner=lambda m: m.model.language_model, text_config=True,
                    vision_config=dict(hidden_size=16, num_heads=2, depth=1, intermediate_size=8,
                                       out_hidden_size=16),
                    norm_range=(-0.5, 0.5)),
}
FAMILIES["qwen3_next"]["norm_range"] = (-0.5, 0.5)
# Mistral 3: the text model (here ministral3) under `text_config`; transformers keeps its layers
# under `model.language_model.` in memory and `save_pretrained` writes them under
# `language_model.model.` (`saved_prefix`), the names of the published checkpoints.
FAMILIES["mistral3"] = dict(config=Mistral3Config, model=Mistral3ForConditionalGeneration,
                            prefix="model.language_model.layers.{}.self_attn.",
                            saved_prefix="language_model.model.layers.{}.self_attn.",
                            attn=lambda m, i: m.model.language_model.layers[i].self_attn, rotary=None,
                            runner=lambda m: m.model.language_model, text_config=True,
                            vision_config=dict(hidden_size=16, num_attention_heads=2, num_hidden_layers=1,
                                               intermediate_size=8, head_dim=8))

# Issue 33's hybrid and 2025-26 families (second round): the Llama layout under
# `model.layers.{i}.self_attn.` but for Nemotron-H, whose attention is the layer's `mixer`
# (`save_pretrained` writes `backbone.` for transformers' `model.`).
for _family, _config, _model in [
    ("minimax_m2", MiniMaxM2Config, MiniMaxM2ForCausalLM),
    ("hunyuan_v1_dense", HunYuanDenseV1Config, HunYuanDenseV1ForCausalLM),
    ("lfm2", Lfm2Config, Lfm2ForCausalLM),
    ("granite_swa", GraniteSWAConfig, GraniteSWAForCausalLM),
    ("granitemoehybrid", GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM),
    ("falcon_h1", FalconH1Config, FalconH1ForCausalLM),
]:
    FAMILIES[_family] = dict(config=_config, model=_model, prefix="model.layers.{}.self_attn.",
                             attn=lambda m, i: m.model.layers[i].self_attn, rotary=None)
FAMILIES["nemotron_h"] = dict(config=NemotronHConfig, model=NemotronHForCausalLM,
                              prefix="model.layers.{}.mixer.", saved_prefix="backbone.layers.{}.mixer.",
                              attn=lambda m, i: m.model.layers[i].mixer, rotary=None)
HYBRID_ROUND = ("minimax_m2", "hunyuan_v1_dense", "lfm2", "nemotron_h", "granite_swa", "granitemoehybrid",
                "falcon_h1")

# Issue 33's families read their layer types from `layer_types` as config.json lists them.
LISTED_LAYER_TYPES = ("glm4_moe", "smollm3", "olmo3", "seed_oss", "ernie4_5", "apertus", "exaone4",
                      "cohere2", "qwen3_next", "qwen3_5", "llama4", "gemma4", "gemma3n") + HYBRID_ROUND
# Gemma 3n (text model): Gemma 4's attention without its per-layer heads, K = V or proportional
# rope; its rope in Gemma 3's published spelling (rope_theta, rope_local_base_freq).
FAMILIES["gemma3n"] = dict(config=Gemma3nTextConfig, model=Gemma3nForCausalLM,
                           prefix="model.layers.{}.self_attn.",
                           attn=lambda m, i: m.model.layers[i].self_attn, rotary=None)
GEMMA_V_NORM = ("gemma4", "gemma3n")
# Ministral 3's query scale: q * (1 + llama_4_scaling_beta * log(1 + floor(position_id /
# original_max_position_embeddings))) after RoPE (Mistral 3 wraps it).
MINISTRAL3 = ("ministral3", "mistral3")
# Their q_proj holds per head the query rows, then as many sigmoid output gate rows; their
# q_norm / k_norm multiply by (1 + weight).
GATED = ("qwen3_next", "qwen3_5")
LISTED_LAYER_TYPES += ("mimo_v2_flash",)


def layer_prefix(case):
    return FAMILIES[case["family"]]["prefix"].format(case.get("layer", 0))


def saved_prefix(case):
    """The layer's prefix in the checkpoint file (`save_pretrained`'s names)."""
    fam = FAMILIES[case["family"]]
    return fam.get("saved_prefix", fam["prefix"]).format(case.get("layer", 0))


def arange_positions(b, t, start=0):
    return np.tile(np.arange(start, start + t, dtype=np.int64), (b, 1))


def one_model(shared, *layers):
    """Cases for several layers of one model: `shared()` (called once per case, so that each case
    has dicts of its own) with each layer's keys added."""
    return [dict(shared(), **layer) for layer in layers]


# --------------------------------------------------------------------------------------------
# The cases. `cfg`: keyword arguments of the config class (v5 names; `legacy` says how the
# rope settings are respelled in config.json). `features`: what the case exercises.
# --------------------------------------------------------------------------------------------
CASES = [
    dict(name="llama_gqa", family="llama", seed=1, b=2, t=7, spelling="legacy",
         cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=2,
                  rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
         features=["rope", "gqa"]),
    dict(name="llama_linear", family="llama", seed=2, b=2, t=6, spelling="legacy", legacy_type_key="type",
         cfg=dict(hidden_size=30, num_attention_heads=3, num_key_value_heads=1,
                  rope_parameters=dict(rope_type="linear", factor=2.5, rope_theta=500.0)),
         features=["rope", "rope_scaling_linear", "mqa"]),
    dict(name="llama_llama3", family="llama", seed=3, b=2, t=7, spelling="legacy",
         cfg=dict(hidden_size=30, num_attention_heads=3, num_key_value_heads=3, max_position_embeddings=512,
                  rope_parameters=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=128,
                                       rope_theta=500.0)),
         features=["rope", "rope_scaling_llama3"]),
    dict(name="llama_yarn", family="llama", seed=4, b=2, t=6, spelling="v5",
         cfg=dict(hidden_size=30, num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=256,
                  rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64,
                                       rope_theta=500.0)),
         features=["rope", "rope_scaling_yarn", "mqa"]),
    dict(name="llama_positions", family="llama", seed=5, b=3, t=7, spelling="v5",
         positions=np.array([[3, 4, 5, 6, 7, 8, 9], [0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 5, 6, 7, 8]],
                            dtype=np.int64),
         cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=3, head_dim=6,
                  rope_parameters=dict(rope_type="default", rope_theta=100.0)),
         features=["rope", "gqa", "explicit_positions"]),
    dict(name="mistral", family="mistral", seed=6, b=2, t=7, spelling="legacy",
         cfg=dict(hidden_size=60, num_attention_heads=6, num_key_value_heads=3, sliding_window=None,
                  rope_parameters=dict(rope_type="default", rope_theta=1000.0)),
         features=["rope", "gqa"]),
    dict(name="qwen2_bias", family="qwen2", seed=7, b=2, t=6, spelling="legacy",
         cfg=dict(hidden_size=42, num_attention_heads=3, num_key_value_heads=1,
                  rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
         features=["rope", "mqa", "qkv_bias"]),
    dict(name="qwen2_yarn", family="qwen2", seed=8, b=2, t=5, spelling="legacy", legacy_type_key="type",
         cfg=dict(hidden_size=60, num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
                  rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32,
                                       rope_theta=300.0)),
         features=["rope", "rope_scaling_yarn", "gqa", "qkv_bias"]),
    dict(name="qwen3_qknorm", family="qwen3", seed=9, b=2, t=7, spelling="v5",
         cfg=dict(hidden_size=44, head_dim=10, num_attention_heads=6, num_key_value_heads=2, rms_norm_eps=1e-6,
                  rope_parameters=dict(rope_type="default", rope_theta=1000.0)),
         features=["rope", "gqa", "qk_norm_per_head", "query_width_ne_hidden", "head_dim_explicit"]),
    dict(name="phi3_partial", family="phi3", seed=10, b=2, t=6, spelling="legacy",
         cfg=dict(hidden_size=36, num_attention_heads=3, num_key_value_heads=1, pad_token_id=None,
                  eos_token_id=None, bos_token_id=None,
                  rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)),
         features=["rope", "rope_partial", "mqa", "fused_qkv"]),
    dict(name="gpt_neox", family="gpt_neox", seed=11, b=2, t=7, spelling="legacy",
         cfg=dict(hidden_size=72, num_attention_heads=3, attention_bias=True,
                  rope_parameters=dict(rope_type="default", rope_theta=10000, partial_rotary_factor=0.25)),
         features=["rope", "rope_partial", "fused_qkv_per_head", "qkv_bias", "out_bias"]),
    dict(name="olmo2_qknorm", family="olmo2", seed=12, b=2, t=6, spelling="v5",
         cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=2, rms_norm_eps=1e-6,
                  pad_token_id=None, eos_token_id=None, bos_token_id=None,
                  rope_parameters=dict(rope_type="default", rope_theta=500.0)),
         features=["rope", "gqa", "qk_norm_whole"]),
    dict(name="gptj_interleaved", family="gptj", seed=13, b=2, t=7, spelling="gptj",
         cfg=dict(n_embd=30, n_head=3, rotary_dim=6, n_positions=64, n_inner=8, bos_token_id=0,
                  eos_token_id=0),
         features=["rope", "rope_interleaved", "rope_partial"]),
    # ---- issue 13: windows, soft-capping, query_pre_attn_scalar, ALiBi, sinks ----------------
    # `layers`: num_hidden_layers of the model the layer is taken from; `layer`: its index (the
    # checkpoint names carry it). `drop`: keys v5 writes that the family's published configs lack
    # (the config reader must derive them). All take mask / cos-sin / ALiBi from the model.
    dict(name="mistral_window", family="mistral", model_inputs=True, seed=14, b=2, t=13, spelling="legacy",
         cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=2, sliding_window=4,
                  rope_parameters=dict(rope_type="default", rope_theta=500.0)),
         features=["rope", "gqa", "sliding_window", "layer_sliding"]),
    *one_model(
        lambda: dict(family="qwen2", model_inputs=True, b=2, t=11, spelling="legacy", layers=2,
                     drop=["layer_types"],
                     cfg=dict(hidden_size=30, num_attention_heads=3, num_key_value_heads=1,
                              use_sliding_window=True, sliding_window=3, max_window_layers=1,
                              rope_parameters=dict(rope_type="default", rope_theta=1000.0))),
        dict(name="qwen2_window_full", seed=15, layer=0,
             features=["rope", "mqa", "qkv_bias", "layer_full"]),
        dict(name="qwen2_window_sliding", seed=16, layer=1,
             features=["rope", "mqa", "qkv_bias", "sliding_window", "layer_sliding", "layer_index_nonzero"]),
    ),
    *one_model(
        lambda: dict(family="gemma2", model_inputs=True, b=2, t=12, spelling="legacy", layers=2,
                     drop=["layer_types"],
                     cfg=dict(hidden_size=42, num_attention_heads=6, num_key_value_heads=2, head_dim=10,
                              query_pre_attn_scalar=16, attn_logit_softcapping=1.0, final_logit_softcapping=30.0,
                              sliding_window=4, rope_parameters=dict(rope_type="default", rope_theta=500.0))),
        dict(name="gemma2_local", seed=17, layer=0,
             features=["rope", "gqa", "query_width_ne_hidden", "head_dim_explicit", "softcap",
                       "query_pre_attn_scalar", "sliding_window", "layer_sliding"]),
        dict(name="gemma2_global", seed=18, layer=1,
             features=["rope", "gqa", "query_width_ne_hidden", "head_dim_explicit", "softcap",
                       "query_pre_attn_scalar", "layer_full", "layer_index_nonzero"]),
    ),
    *one_model(
        lambda: dict(family="gemma3", model_inputs=True, b=2, t=14, spelling="legacy", layers=3,
                     drop=["layer_types", "_sliding_window_pattern"], extra=dict(sliding_window_pattern=3),
                     cfg=dict(hidden_size=30, num_attention_heads=3, num_key_value_heads=1, head_dim=14,
                              query_pre_attn_scalar=10, sliding_window=5, rms_norm_eps=1e-6,
                              rope_parameters={
                                  "full_attention": dict(rope_type="linear", factor=2.0, rope_theta=10000.0),
                                  "sliding_attention": dict(rope_type="default", rope_theta=100.0)})),
        dict(name="gemma3_local", seed=19, layer=1,
             features=["rope", "mqa", "query_width_ne_hidden", "head_dim_explicit", "qk_norm_per_head",
                       "qk_norm_gemma", "query_pre_attn_scalar", "sliding_window", "layer_sliding",
                       "rope_local_theta", "layer_index_nonzero"]),
        dict(name="gemma3_global", seed=20, layer=2,
             features=["rope", "mqa", "query_width_ne_hidden", "head_dim_explicit", "qk_norm_per_head",
                       "qk_norm_gemma", "query_pre_attn_scalar", "rope_scaling_linear", "layer_full",
                       "layer_index_nonzero"]),
    ),
    dict(name="bloom_alibi6", family="bloom", model_inputs=True, seed=21, b=2, t=9, spelling="bloom",
         cfg=dict(hidden_size=42, n_head=6),
         features=["alibi", "alibi_non_power_of_two", "fused_qkv_per_head", "qkv_bias", "out_bias", "no_rope"]),
    dict(name="bloom_alibi4", family="bloom", model_inputs=True, seed=22, b=3, t=9, spelling="bloom",
         cfg=dict(hidden_size=36, n_head=4),
         features=["alibi", "fused_qkv_per_head", "qkv_bias", "out_bias", "no_rope"]),
    # ---- issue 20: Phi-2, and BLOOM's ALiBi over a padding mask with holes -------------------
    # `attention_mask`: the (B, T) padding mask given to the model (1 real, 0 padding); BLOOM's
    # ALiBi places key j at cumsum(mask)[j] - 1, its rank among the real tokens.
    dict(name="bloom_holes", family="bloom", model_inputs=True, seed=26, b=2, t=10, spelling="bloom",
         attention_mask=np.array([[1, 1, 0, 0, 1, 1, 1, 0, 1, 1], [1, 0, 1, 1, 1, 0, 0, 0, 1, 1]],
                                 dtype=np.int64),
         cfg=dict(hidden_size=36, n_head=6),
         features=["alibi", "alibi_non_power_of_two", "fused_qkv_per_head", "qkv_bias", "out_bias",
                   "no_rope", "padding_mask_holes"]),
    dict(name="phi2_partial", family="phi", seed=25, b=2, t=7, spelling="legacy",
         cfg=dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=2, qk_layernorm=False,
                  rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.4)),
         features=["rope", "rope_partial", "gqa", "qkv_bias", "out_bias"]),
    *one_model(
        lambda: dict(family="gpt_oss", model_inputs=True, b=2, t=13, spelling="legacy", layers=2,
                     cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=2, head_dim=10,
                              sliding_window=4, num_local_experts=2, num_experts_per_tok=1,
                              max_position_embeddings=64,
                              rope_parameters=dict(rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0,
                                                   truncate=False, original_max_position_embeddings=16,
                                                   rope_theta=500.0))),
        dict(name="gpt_oss_sliding", seed=23, layer=0,
             features=["rope", "rope_scaling_yarn", "gqa", "query_width_ne_hidden", "head_dim_explicit",
                       "qkv_bias", "out_bias", "attention_sinks", "sliding_window", "layer_sliding"]),
        dict(name="gpt_oss_full", seed=24, layer=1,
             features=["rope", "rope_scaling_yarn", "gqa", "query_width_ne_hidden", "head_dim_explicit",
                       "qkv_bias", "out_bias", "attention_sinks", "layer_full", "layer_index_nonzero"]),
    ),
    # ---- issue 33: the families of 2025-26 ----------------------------------------------------
    dict(name="glm4_moe", family="glm4_moe", model_inputs=True, seed=27, b=2, t=7, spelling="legacy",
         cfg=dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=2, head_dim=12, use_qk_norm=True,
                  attention_bias=True, rms_norm_eps=1e-5, n_routed_experts=2, num_experts_per_tok=1,
                  moe_intermediate_size=8, n_shared_experts=1, n_group=1, topk_group=1,
                  rope_parameters=dict(rope_type="default", rope_theta=1000.0, partial_rotary_factor=0.5)),
         features=["rope", "rope_partial", "gqa", "qk_norm_per_head", "qkv_bias", "query_width_ne_hidden",
                   "head_dim_explicit"]),
    *one_model(
        lambda: dict(family="smollm3", model_inputs=True, b=2, t=8, spelling="legacy", layers=4,
                     cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=2,
                              rope_parameters=dict(rope_type="default", rope_theta=1000.0))),
        dict(name="smollm3_rope", seed=28, layer=2, features=["rope", "gqa", "layer_index_nonzero"]),
        dict(name="smollm3_nope", seed=29, layer=3, features=["no_rope", "no_rope_layer", "gqa",
                                                              "layer_index_nonzero"]),
    ),
    *one_model(
        lambda: dict(family="olmo3", model_inputs=True, b=2, t=11, spelling="v5", layers=4,
                     cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=3, sliding_window=3,
                              rms_norm_eps=1e-6, max_position_embeddings=64,
                              rope_parameters={
                                  "full_attention": dict(rope_type="yarn", factor=4.0,
                                                         original_max_position_embeddings=16, rope_theta=500.0),
                                  "sliding_attention": dict(rope_type="default", rope_theta=500.0)})),
        dict(name="olmo3_sliding", seed=30, layer=0,
             features=["rope", "gqa", "qk_norm_whole", "sliding_window", "layer_sliding"]),
        dict(name="olmo3_full", seed=31, layer=3,
             features=["rope", "rope_scaling_yarn", "gqa", "qk_norm_whole", "layer_full", "layer_index_nonzero"]),
    ),
    dict(name="seed_oss", family="seed_oss", model_inputs=True, seed=32, b=2, t=7, spelling="legacy",
         cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=2, head_dim=8, attention_bias=True,
                  attention_out_bias=True, rope_parameters=dict(rope_type="default", rope_theta=1000.0)),
         features=["rope", "gqa", "qkv_bias", "out_bias", "query_width_ne_hidden", "head_dim_explicit"]),
    dict(name="ernie4_5", family="ernie4_5", model_inputs=True, seed=33, b=2, t=7, spelling="legacy",
         cfg=dict(hidden_size=30, num_attention_heads=3, num_key_value_heads=1, head_dim=10, use_bias=True,
                  rope_parameters=dict(rope_type="default", rope_theta=500.0)),
         features=["rope", "rope_interleaved", "mqa", "qkv_bias", "out_bias"]),
    dict(name="apertus", family="apertus", model_inputs=True, seed=34, b=2, t=7, spelling="legacy",
         cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-5,
                  rope_parameters=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=128, rope_theta=500.0)),
         features=["rope", "rope_scaling_llama3", "gqa", "qk_norm_per_head"]),
    *one_model(
        lambda: dict(family="exaone4", model_inputs=True, b=2, t=9, spelling="legacy", layers=4,
                     drop=["layer_types"],
                     cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=2, sliding_window=3,
                              sliding_window_pattern=4, rms_norm_eps=1e-5,
                              rope_parameters=dict(rope_type="default", rope_theta=1000.0))),
        dict(name="exaone4_sliding", seed=35, layer=0,
             features=["rope", "gqa", "qk_norm_per_head", "sliding_window", "layer_sliding"]),
        dict(name="exaone4_full", seed=36, layer=3,
             features=["no_rope", "no_rope_layer", "gqa", "qk_norm_per_head", "layer_full", "layer_index_nonzero"]),
    ),
    *one_model(
        lambda: dict(family="cohere2", model_inputs=True, b=2, t=9, spelling="legacy", layers=4,
                     cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=3, sliding_window=3,
                              attention_bias=True, rope_parameters=dict(rope_type="default", rope_theta=1000.0))),
        dict(name="cohere2_sliding", seed=37, layer=2,
             features=["rope", "rope_interleaved", "gqa", "qkv_bias", "out_bias", "sliding_window",
                       "layer_sliding", "layer_index_nonzero"]),
        dict(name="cohere2_full", seed=38, layer=3,
             features=["no_rope", "no_rope_layer", "gqa", "qkv_bias", "out_bias", "layer_full",
                       "layer_index_nonzero"]),
    ),
    # Hybrid stacks: layer 0 is linear attention (run by the model before the hook), layer 1
    # softmax attention with the output gate.
    dict(name="qwen3_next", family="qwen3_next", model_inputs=True, seed=39, layer=1, b=2, t=7, spelling="v5", layers=2,
         cfg=dict(hidden_size=36, num_attention_heads=3, num_key_value_heads=1, head_dim=12, rms_norm_eps=1e-6,
                  layer_types=["linear_attention", "full_attention"], linear_key_head_dim=4,
                  linear_value_head_dim=4, linear_num_key_heads=2, linear_num_value_heads=2,
                  num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8,
                  shared_expert_intermediate_size=8,
                  rope_parameters=dict(rope_type="default", rope_theta=1000.0, partial_rotary_factor=0.5)),
         features=["rope", "rope_partial", "mqa", "qk_norm_per_head", "qk_norm_gemma", "output_gate",
                   "query_width_ne_hidden", "head_dim_explicit", "layer_index_nonzero"]),
    dict(name="qwen3_5", family="qwen3_5", model_inputs=True, seed=40, layer=1, b=2, t=7, spelling="v5", layers=2,
         cfg=dict(hidden_size=30, num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                  attention_bias=True, layer_types=["linear_attention", "full_attention"],
                  linear_key_head_dim=4, linear_value_head_dim=4, linear_num_key_heads=2,
                  linear_num_value_heads=2,
                  rope_parameters=dict(rope_type="default", rope_theta=1000.0, partial_rotary_factor=0.5,
                                       mrope_section=[1, 1, 0], mrope_interleaved=True)),
         features=["rope", "rope_partial", "gqa", "qk_norm_per_head", "qk_norm_gemma", "output_gate",
                   "qkv_bias", "out_bias", "query_width_ne_hidden", "head_dim_explicit", "text_config",
                   "layer_index_nonzero"]),
    # Ministral 3's query scale: period (original_max_position_embeddings) 4, positions up to 5
    # periods out, so the factors run from 1 to 1 + 0.5 ln 6.
    dict(name="ministral3", family="ministral3", model_inputs=True, seed=41, b=2, t=9, spelling="v5",
         positions=np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8], [13, 14, 15, 16, 17, 0, 1, 22, 23]], dtype=np.int64),
         cfg=dict(hidden_size=30, num_attention_heads=3, num_key_value_heads=1, head_dim=10,
                  max_position_embeddings=64,
                  rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=4,
                                       beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
                                       llama_4_scaling_beta=0.5, rope_theta=500.0)),
         features=["rope", "rope_scaling_yarn", "mqa", "explicit_positions", "query_scale"]),
    dict(name="mistral3_ministral3", family="mistral3", model_inputs=True, seed=42, b=2, t=11, spelling="v5",
         cfg=dict(model_type="ministral3", hidden_size=36, num_attention_heads=6, num_key_value_heads=2,
                  head_dim=6, sliding_window=4, max_position_embeddings=64,
                  rope_parameters=dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=3,
                                       llama_4_scaling_beta=0.3, rope_theta=300.0)),
         features=["rope", "rope_scaling_yarn", "gqa", "sliding_window", "layer_sliding", "query_scale",
                   "text_config"]),
    # Llama 4: layers 0-2 rotate (interleaved pairs, llama3 scaling), are chunked (4 tokens) and
    # L2-normalise q and k after RoPE; layer 3 has no rotary and the temperature tuning
    # (floor_scale 3, attn_scale 0.5). Dense MLPs (moe_layers []), so that layers before the
    # hook run in float64.
    *one_model(
        lambda: dict(family="llama4", model_inputs=True, b=2, t=13, spelling="legacy", layers=4,
                     cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=2, head_dim=6,
                              intermediate_size_mlp=8, moe_layers=[], attention_chunk_size=4,
                              floor_scale=3, attn_scale=0.5, rms_norm_eps=1e-5, max_position_embeddings=512,
                              rope_parameters=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                   high_freq_factor=4.0, original_max_position_embeddings=32,
                                                   rope_theta=500.0))),
        dict(name="llama4_chunked", seed=43, layer=2,
             features=["rope", "rope_interleaved", "rope_scaling_llama3", "gqa", "qk_norm_after_rope",
                       "chunked_attention", "layer_chunked", "layer_index_nonzero"]),
        dict(name="llama4_nope", seed=44, layer=3,
             features=["no_rope", "no_rope_layer", "gqa", "query_scale", "layer_index_nonzero"]),
    ),
    # Gemma 4: layers 0-1 slide (window 3, heads of 6, 3 key/value heads, default rope), layer 2
    # is full with wider heads (10) and one key/value head (per_layer_config), its values the
    # key projection's output (attention_k_eq_v) and proportional rope (2 of its 5 pairs turn).
    # Every layer: plain-weight q/k norm, weight-less v norm, scale 1. No per-layer inputs
    # (hidden_size_per_layer_input 0), so that inputs_embeds alone run the model.
    *one_model(
        lambda: dict(family="gemma4", model_inputs=True, b=2, t=9, spelling="v5", layers=3,
                     cfg=dict(hidden_size=30, num_attention_heads=3, num_key_value_heads=3, head_dim=6,
                              global_head_dim=10, num_global_key_value_heads=1, attention_k_eq_v=True,
                              hidden_size_per_layer_input=0, vocab_size_per_layer_input=16,
                              sliding_window=3, rms_norm_eps=1e-6, max_position_embeddings=512,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                              rope_parameters={
                                  "sliding_attention": dict(rope_type="default", rope_theta=1000.0),
                                  "full_attention": dict(rope_type="proportional", partial_rotary_factor=0.5,
                                                         rope_theta=10000.0)})),
        dict(name="gemma4_sliding", seed=45, layer=1,
             features=["rope", "qk_norm_per_head", "value_norm", "sliding_window", "layer_sliding",
                       "layer_index_nonzero", "head_dim_explicit"]),
        dict(name="gemma4_full", seed=46, layer=2,
             features=["rope", "rope_proportional", "mqa", "qk_norm_per_head", "value_norm", "k_eq_v",
                       "layer_full", "layer_head_dim", "layer_index_nonzero"]),
        # The spelling of the published configs: global_head_dim and num_global_key_value_heads
        # at the top level, no per_layer_config.
        dict(name="gemma4_full_global_keys", seed=47, layer=2, drop=["per_layer_config"],
             extra=dict(global_head_dim=10, num_global_key_value_heads=1),
             features=["rope", "rope_proportional", "mqa", "qk_norm_per_head", "value_norm", "k_eq_v",
                       "layer_full", "layer_head_dim", "layer_index_nonzero"]),
    ),
    # ---- issue 33, second round: MiniMax-M2, Hunyuan, and the hybrid stacks' attention -------
    # MiniMax-M2 as published: whole-row QK-norm, `rotary_dim` (6 of 10) instead of a factor.
    dict(name="minimax_m2", family="minimax_m2", model_inputs=True, seed=48, b=2, t=7, spelling="legacy",
         legacy_partial=False,
         cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=2, head_dim=10, rotary_dim=6,
                  rms_norm_eps=1e-6, num_local_experts=2, num_experts_per_tok=1,
                  rope_parameters=dict(rope_type="default", rope_theta=1000.0)),
         features=["rope", "rope_partial", "rotary_dim_key", "gqa", "qk_norm_whole", "query_width_ne_hidden",
                   "head_dim_explicit"]),
    # Hunyuan dense as published: rope_scaling {"type": "dynamic", "alpha": ...} (NTK-alpha: base
    # 100 * 4^(10/8)), weighted per-head QK-norm after RoPE, biases.
    dict(name="hunyuan_v1_dense", family="hunyuan_v1_dense", model_inputs=True, seed=49, b=2, t=9,
         spelling="legacy", legacy_type_key="type",
         cfg=dict(hidden_size=30, num_attention_heads=3, num_key_value_heads=1, head_dim=10, attention_bias=True,
                  rms_norm_eps=1e-5,
                  rope_parameters=dict(rope_type="dynamic", alpha=4.0, factor=1.0, rope_theta=100.0)),
         features=["rope", "rope_ntk_alpha", "mqa", "qk_norm_weighted_after_rope", "qkv_bias", "out_bias"]),
    # LFM2 with `full_attn_idxs` alone (layer_types dropped): layers 0 and 2 short convolutions.
    dict(name="lfm2", family="lfm2", model_inputs=True, seed=50, layer=1, b=2, t=8, spelling="v5", layers=3,
         drop=["layer_types"],
         cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=2, full_attn_idxs=[1], norm_eps=1e-5,
                  rope_parameters=dict(rope_type="default", rope_theta=1000.0)),
         features=["rope", "gqa", "qk_norm_per_head", "full_attn_idxs", "layer_index_nonzero"]),
    # Nemotron-H as published: `hybrid_override_pattern` "-*ME" (MLP, attention, Mamba-2, MoE), no
    # rotary; its layer 1's `mixer`.
    dict(name="nemotron_h", family="nemotron_h", model_inputs=True, seed=51, layer=1, b=2, t=8, spelling="v5",
         drop=["layers_block_type"], extra=dict(hybrid_override_pattern="-*ME", num_hidden_layers=4),
         cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=2, head_dim=6,
                  hybrid_override_pattern="-*ME", n_routed_experts=2, num_experts_per_tok=1,
                  moe_intermediate_size=8, moe_shared_expert_intermediate_size=8, mamba_num_heads=4,
                  mamba_head_dim=18, ssm_state_size=8, n_groups=1),
         features=["no_rope", "gqa", "hybrid_pattern", "layer_index_nonzero"]),
    # Granite SWA: layer 0 full without rotary (layer_rope_theta 0), layer 1 sliding (window 3)
    # with its own base; scale attention_multiplier, sinks, biases.
    *one_model(
        lambda: dict(family="granite_swa", model_inputs=True, b=2, t=11, spelling="v5", layers=4,
                     cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=2, sliding_window=3,
                              attention_multiplier=0.3, attention_bias=True, layer_rope_theta=[0, 500, 500, 1000],
                              rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
        dict(name="granite_swa_nope", seed=52, layer=0,
             features=["no_rope", "no_rope_layer", "gqa", "attention_multiplier", "attention_sinks", "qkv_bias",
                       "out_bias", "layer_full", "layer_rope_theta"]),
        dict(name="granite_swa_sliding", seed=53, layer=1,
             features=["rope", "gqa", "attention_multiplier", "attention_sinks", "qkv_bias", "out_bias",
                       "sliding_window", "layer_sliding", "layer_rope_theta", "layer_index_nonzero"]),
    ),
    # Granite 4.0-H as published: layer types "attention" / "mamba" (transformers' legacy names),
    # position_embedding_type "nope"; and one with rope, its attention after a Mamba-2 layer.
    dict(name="granitemoehybrid_nope", family="granitemoehybrid", model_inputs=True, seed=54, b=2, t=8,
         spelling="v5", layers=2, extra=dict(layer_types=["attention", "mamba"]),
         cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=2, attention_multiplier=0.25,
                  position_embedding_type="nope", layer_types=["full_attention", "linear_attention"],
                  num_local_experts=2, num_experts_per_tok=1, shared_intermediate_size=8, mamba_n_heads=4,
                  mamba_d_head=18, mamba_d_state=8, mamba_chunk_size=4,
                  rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
         features=["no_rope", "gqa", "attention_multiplier"]),
    dict(name="granitemoehybrid_rope", family="granitemoehybrid", model_inputs=True, seed=55, layer=1, b=2, t=8,
         spelling="v5", layers=2,
         cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=3, attention_multiplier=0.2,
                  attention_bias=True, position_embedding_type="rope",
                  layer_types=["linear_attention", "full_attention"], num_local_experts=2,
                  num_experts_per_tok=1, shared_intermediate_size=8, mamba_n_heads=4, mamba_d_head=18,
                  mamba_d_state=8, mamba_chunk_size=4,
                  rope_parameters=dict(rope_type="default", rope_theta=1000.0)),
         features=["rope", "gqa", "attention_multiplier", "qkv_bias", "out_bias", "layer_index_nonzero"]),
    # Falcon-H1: key, input and output multipliers (the crate folds them into the weights),
    # biases, head_dim 8 (Q = 48 != D); the layer's Mamba-2 mixer runs beside it (not here).
    dict(name="falcon_h1", family="falcon_h1", model_inputs=True, seed=56, b=2, t=7, spelling="legacy",
         cfg=dict(hidden_size=36, num_attention_heads=6, num_key_value_heads=2, head_dim=8, attention_bias=True,
                  key_multiplier=0.4, attention_in_multiplier=1.5, attention_out_multiplier=0.75,
                  mamba_d_ssm=24, mamba_n_heads=4, mamba_d_state=8, mamba_chunk_size=4,
                  rope_parameters=dict(rope_type="default", rope_theta=1000.0)),
         features=["rope", "gqa", "projection_multipliers", "qkv_bias", "out_bias", "query_width_ne_hidden",
                   "head_dim_explicit"]),
    # MiMo-V2-Flash: layer 0 full (one key/value head), layer 1 sliding (window 3, two key/value
    # heads, sinks); query/key heads of 12, value heads of 8, values times 0.707, a third of
    # each head rotating (int(12 * 0.334) = 4) with a rotary base per layer type. Layer 0's
    # dense MLP runs before layer 1's attention; the MoE layers are built small.
    *one_model(
        lambda: dict(family="mimo_v2_flash", model_inputs=True, b=2, t=9, spelling="v5", layers=2,
                     cfg=dict(hidden_size=30, num_attention_heads=4, num_key_value_heads=1, head_dim=12,
                              v_head_dim=8, attention_value_scale=0.707, sliding_window=3,
                              intermediate_size=16, moe_intermediate_size=8, n_routed_experts=4,
                              num_experts_per_tok=2, vocab_size=32, max_position_embeddings=512,
                              layer_types=["full_attention", "sliding_attention"],
                              rope_parameters={
                                  "full_attention": dict(rope_type="default", rope_theta=5000.0,
                                                         partial_rotary_factor=0.334),
                                  "sliding_attention": dict(rope_type="default", rope_theta=100.0,
                                                            partial_rotary_factor=0.334)})),
        dict(name="mimo_v2_flash_full", seed=48, layer=0,
             features=["rope", "rope_partial", "mqa", "layer_full", "head_dim_explicit",
                       "value_head_dim", "value_scale"]),
        dict(name="mimo_v2_flash_sliding", seed=49, layer=1,
             features=["rope", "rope_partial", "gqa", "attention_sinks", "sliding_window",
                       "layer_sliding", "layer_index_nonzero", "head_dim_explicit",
                       "value_head_dim", "value_scale", "layer_kv_heads"]),
    ),
]

# Laguna: a head count per layer (num_attention_heads_per_layer), plain-weight per-head q/k norm
# before RoPE, rope per layer type (the full layers rotate half of each head) and a softplus
# output gate g_proj, per head (gating true) or per feature ("per-element"). Layer 0 has a dense
# MLP, the later ones MoE (run before the hook on layers 1 and 2).
from transformers import LagunaConfig, LagunaForCausalLM  # noqa: E402

FAMILIES["laguna"] = dict(config=LagunaConfig, model=LagunaForCausalLM, prefix="model.layers.{}.self_attn.",
                          attn=lambda m, i: m.model.layers[i].self_attn, rotary=None)
LAGUNA_ROPE = {"full_attention": dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
               "sliding_attention": dict(rope_type="default", rope_theta=1000.0)}
CASES += [
    *one_model(
        lambda: dict(family="laguna", model_inputs=True, b=2, t=9, spelling="v5", layers=3,
                     cfg=dict(hidden_size=30, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                              num_attention_heads_per_layer=[4, 6, 2], sliding_window=3, rms_norm_eps=1e-6,
                              layer_types=["full_attention", "sliding_attention", "full_attention"],
                              num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8,
                              shared_expert_intermediate_size=8, rope_parameters=LAGUNA_ROPE)),
        dict(name="laguna_sliding", seed=57, layer=1,
             features=["rope", "gqa", "qk_norm_per_head", "output_gate", "gate_softplus", "gate_per_head",
                       "layer_heads", "sliding_window", "layer_sliding", "layer_index_nonzero",
                       "head_dim_explicit"]),
        dict(name="laguna_full", seed=58, layer=2,
             features=["rope", "rope_partial", "mqa", "qk_norm_per_head", "output_gate", "gate_softplus",
                       "gate_per_head", "layer_heads", "layer_full", "layer_index_nonzero",
                       "head_dim_explicit"]),
    ),
    dict(name="laguna_per_element", family="laguna", model_inputs=True, seed=59, layer=1, b=2, t=7,
         spelling="v5", layers=2,
         cfg=dict(hidden_size=24, num_attention_heads=3, num_key_value_heads=1, head_dim=8, gating="per-element",
                  sliding_window=3,
                  attention_bias=True, rms_norm_eps=1e-5, num_experts=2, num_experts_per_tok=1,
                  moe_intermediate_size=8, shared_expert_intermediate_size=8, rope_parameters=LAGUNA_ROPE),
         features=["rope", "rope_partial", "mqa", "qk_norm_per_head", "qkv_bias", "out_bias", "output_gate",
                   "gate_softplus", "layer_full", "layer_index_nonzero", "head_dim_explicit"]),
]
LISTED_LAYER_TYPES += ("laguna",)

# Step 3.5 (the text model step3p5; transformers has no causal-LM class for it alone, so the
# bare Step3p7TextModel, its layers saved under `model.layers.` as Step-3.5-Flash publishes
# them) and Step 3.7 (step3p7: the text model under `text_config`, its layers under
# `model.language_model.`): sliding layers with their own query-head count
# (num_sliding_attention_heads -> per_layer_config), (1 + w) per-head q/k norm before RoPE,
# scale query_pre_attn_scalar^-1/2, rope per layer type (the full layers rotate half of each
# head) and a sigmoid output gate per head from g_proj. All layers have dense MLPs (MoE from
# layer 3 on by default).
from transformers import Step3p7Config, Step3p7ForConditionalGeneration, Step3p7TextConfig  # noqa: E402
from transformers.models.step3p7.modeling_step3p7 import Step3p7TextModel  # noqa: E402

FAMILIES["step3p5"] = dict(config=Step3p7TextConfig, model=Step3p7TextModel, prefix="layers.{}.self_attn.",
                           saved_prefix="model.layers.{}.self_attn.",
                           attn=lambda m, i: m.layers[i].self_attn, rotary=None, norm_range=(-0.5, 0.5))
FAMILIES["step3p7"] = dict(config=Step3p7Config, model=Step3p7ForConditionalGeneration,
                           prefix="model.language_model.layers.{}.self_attn.",
                           attn=lambda m, i: m.model.language_model.layers[i].self_attn, rotary=None,
                           runner=lambda m: m.model.language_model, text_config=True,
                           vision_config=dict(hidden_size=16, intermediate_size=8, num_hidden_layers=1,
                                              num_attention_heads=2, image_size=28, patch_size=14),
                           norm_range=(-0.5, 0.5))
STEP = ("step3p5", "step3p7")
STEP_ROPE = {"full_attention": dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
             "sliding_attention": dict(rope_type="default", rope_theta=1000.0)}
STEP_CFG = dict(hidden_size=24, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                num_sliding_attention_heads=6, sliding_window=3, query_pre_attn_scalar=10, pad_token_id=0,
                layer_types=["full_attention", "sliding_attention", "full_attention"],
                rope_parameters=STEP_ROPE)
CASES += [
    *one_model(
        lambda: dict(family="step3p5", model_inputs=True, b=2, t=9, spelling="v5", layers=3,
                     cfg=dict(STEP_CFG, rope_parameters=dict(STEP_ROPE))),
        dict(name="step3p5_sliding", seed=62, layer=1,
             features=["rope", "gqa", "qk_norm_per_head", "qk_norm_gemma", "query_pre_attn_scalar",
                       "output_gate", "gate_per_head", "layer_heads", "sliding_window", "layer_sliding",
                       "layer_index_nonzero", "head_dim_explicit"]),
        dict(name="step3p5_full", seed=63, layer=2,
             features=["rope", "rope_partial", "gqa", "qk_norm_per_head", "qk_norm_gemma",
                       "query_pre_attn_scalar", "output_gate", "gate_per_head", "layer_full",
                       "layer_index_nonzero", "head_dim_explicit"]),
    ),
    dict(name="step3p7", family="step3p7", model_inputs=True, seed=64, layer=1, b=2, t=7, spelling="v5",
         layers=3, cfg=dict(STEP_CFG, rope_parameters=dict(STEP_ROPE)),
         features=["rope", "gqa", "qk_norm_per_head", "qk_norm_gemma", "query_pre_attn_scalar", "output_gate",
                   "gate_per_head", "layer_heads", "sliding_window", "layer_sliding", "layer_index_nonzero",
                   "head_dim_explicit", "text_config"]),
]
LISTED_LAYER_TYPES += STEP


# --------------------------------------------------------------------------------------------
# config.json in either spelling
# --------------------------------------------------------------------------------------------
def make_config_json(case):
    """The config dict as `to_json_string()` writes it, respelled as the case asks."""
    fam = FAMILIES[case["family"]]
    kwargs = dict(TINY)
    kwargs["num_hidden_layers"] = case.get("layers", 1)
    if case["family"] == "gptj":
        kwargs = dict(n_layer=1, vocab_size=16)
    if case["family"] == "bloom":
        kwargs = dict(n_layer=case.get("layers", 1), vocab_size=16)
    if case["family"] in LISTED_LAYER_TYPES:
        # Their default token ids lie outside the tiny vocabulary.
        kwargs.update(pad_token_id=None, bos_token_id=None, eos_token_id=None)
    kwargs.update(case["cfg"])
    if fam.get("text_config"):
        kwargs = dict(text_config=kwargs, vision_config=fam["vision_config"])
    cfg = fam["config"](**kwargs)
    d = json.loads(cfg.to_json_string())
    for key in case.get("drop", []):
        del d[key]
    d.update(case.get("extra", {}))
    if case["spelling"] == "legacy" and case["family"] in ("gemma3", "gemma3n"):
        # Gemma 3's published spelling: rope_theta (+ rope_scaling) for the global layers,
        # rope_local_base_freq for the sliding ones (always default rope).
        rp = d.pop("rope_parameters")
        full, local = dict(rp["full_attention"]), dict(rp["sliding_attention"])
        d["rope_theta"] = full.pop("rope_theta")
        d["rope_local_base_freq"] = local.pop("rope_theta")
        assert local == {"rope_type": "default"}, local
        d["rope_scaling"] = None if full == {"rope_type": "default"} else full
    elif case["spelling"] == "legacy":
        rp = d.pop("rope_parameters")
        theta = rp.pop("rope_theta")
        prf = rp.pop("partial_rotary_factor", None)
        rope_type = rp.pop("rope_type")
        if case["family"] == "gpt_neox":
            # Pythia's config.json: rotary_pct and rotary_emb_base, no rope_scaling.
            assert rope_type == "default"
            d["rotary_pct"] = prf if prf is not None else 1.0
            d["rotary_emb_base"] = theta
        else:
            d["rope_theta"] = theta
            if prf is not None and case.get("legacy_partial", True):
                d["partial_rotary_factor"] = prf  # Phi-3 family: top level
            if rope_type == "default":
                d["rope_scaling"] = None
            else:
                scaling = {case.get("legacy_type_key", "rope_type"): rope_type}
                scaling.update(rp)
                d["rope_scaling"] = scaling
    return dict(sorted(d.items()))


# --------------------------------------------------------------------------------------------
# Transformers, in float64, with or without its float32 internals
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def full_float64(enabled):
    """While active, `torch.float` / `torch.float32` (as looked up by transformers' Python code,
    e.g. `softmax(..., dtype=torch.float32)`, `x.to(torch.float32)` in RMSNorm,
    `arange(...).to(dtype=torch.float)` in the inv_freq formulas) name float64, and float64 is
    the default dtype, and `Tensor.float()` converts to float64: Gemma's RMSNorm (`x.float()`,
    Gemma 3's q_norm/k_norm) would otherwise round the float64 queries and keys to float32; the
    other uses of `.float()` meet integer position ids, exact either way."""
    if not enabled:
        yield
        return
    saved = (torch.float, torch.float32, torch.get_default_dtype(), torch.Tensor.float)
    torch.float = torch.float64
    torch.float32 = torch.float64
    torch.set_default_dtype(torch.float64)
    torch.Tensor.float = lambda self, *args, **kwargs: self.to(torch.float64)
    try:
        yield
    finally:
        torch.float, torch.float32 = saved[0], saved[1]
        torch.set_default_dtype(saved[2])
        torch.Tensor.float = saved[3]


def build_model(case, config_path):
    fam = FAMILIES[case["family"]]
    config = fam["config"].from_json_file(config_path)
    model = fam["model"](config)
    model.set_attn_implementation("eager")
    if hasattr(model, "set_experts_implementation") and case["family"] in ("gpt_oss", "qwen3_next",
                                                                            "granitemoehybrid", "laguna") + STEP:
        # gpt-oss's and Qwen3-Next's earlier layers run (up to the hook on layer i); grouped_mm
        # has no float64.
        model.set_experts_implementation("eager")
    return model.double().eval()


def random_weights(case, model):
    """float32 weights for every tensor of the layer's attention, by checkpoint name."""
    rng = np.random.default_rng(1000 + case["seed"])
    prefix = layer_prefix(case)
    out = {}
    for name, t in model.state_dict().items():
        if not name.startswith(prefix):
            continue
        shape = tuple(t.shape)
        short = name[len(prefix):]
        if short.endswith("norm.weight"):
            w = rng.uniform(*FAMILIES[case["family"]].get("norm_range", (0.5, 1.5)), size=shape)
        elif short == "sinks":
            # gpt-oss: one logit per head, of the size of the scores so that it takes real mass.
            w = rng.uniform(-1.0, 2.0, size=shape)
        elif short.endswith(".bias"):
            w = rng.uniform(-0.5, 0.5, size=shape)
        else:
            fan_in = shape[1]
            w = rng.uniform(-1.0, 1.0, size=shape) * math.sqrt(3.0 / fan_in)
        out[name] = w.astype(np.float32)
    return out


class _Captured(Exception):
    pass


def captured_inputs(case, model, attn, x, position_ids):
    """The arguments the model's own forward passes to layer `i`'s attention module (its mask,
    cos/sin, ALiBi tensor ...), for inputs_embeds x: a pre-hook records them and stops the
    forward there. Used by the issue-13 cases, whose window / layer type / ALiBi conventions are
    thereby transformers' own rather than a mask built here."""
    store = {}

    def hook(module, args, kwargs):
        store.update(inspect.signature(module.forward).bind(*args, **kwargs).arguments)
        raise _Captured

    handle = attn.register_forward_pre_hook(hook, with_kwargs=True)
    b, t, _ = x.shape
    mask = case.get("attention_mask")
    mask = torch.ones(b, t, dtype=torch.long) if mask is None else torch.from_numpy(mask)
    call = dict(inputs_embeds=x, attention_mask=mask, use_cache=False)
    if "position_ids" in inspect.signature(FAMILIES[case["family"]].get("runner", lambda m: m)(model).forward).parameters:
        call["position_ids"] = position_ids
    try:
        FAMILIES[case["family"]].get("runner", lambda m: m)(model)(**call)
        raise AssertionError("the attention module was not reached")
    except _Captured:
        pass
    finally:
        handle.remove()
    kwargs = store.pop("kwargs", {})
    store.update(kwargs)
    return store


def run_transformers(case, config_path, weights, x32, pos, f64):
    fam = FAMILIES[case["family"]]
    with full_float64(f64), torch.no_grad():
        model = build_model(case, config_path)
        sd = model.state_dict()
        missing = [k for k in weights if k not in sd]
        assert not missing, missing
        for k, w in weights.items():
            sd[k].copy_(torch.from_numpy(w.astype(np.float64)))
        attn = fam["attn"](model, case.get("layer", 0))
        x = torch.from_numpy(x32.astype(np.float64))
        position_ids = torch.from_numpy(pos)
        b, t, _ = x.shape
        if case.get("model_inputs"):
            args = captured_inputs(case, model, attn, x, position_ids)
            mask = args["attention_mask"]
            assert mask is not None and mask.dtype == torch.float64, mask
            args["hidden_states"] = x
            if "residual" in args:  # BLOOM adds the residual inside the attention module
                args["residual"] = torch.zeros_like(x)
            if case["family"] == "falcon_h1":
                # FalconH1DecoderLayer multiplies the attention's input and output.
                args["hidden_states"] = x * model.config.attention_in_multiplier
            out = attn(**args)[0]
            if case["family"] == "falcon_h1":
                out = out * model.config.attention_out_multiplier
        else:
            mask = torch.zeros(b, 1, t, t, dtype=torch.float64)
            mask.masked_fill_(torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1),
                              torch.finfo(torch.float64).min)
            if fam["rotary"] is None:
                out = attn(hidden_states=x, attention_mask=mask, position_ids=position_ids)[0]
            else:
                cos, sin = fam["rotary"](model)(x, position_ids)
                assert cos.dtype == torch.float64 or not f64  # OLMo 2 returns float32 cos/sin as is
                out = attn(hidden_states=x, position_embeddings=(cos, sin), attention_mask=mask)[0]
        assert out.dtype == torch.float64
        return out.numpy().copy()


# --------------------------------------------------------------------------------------------
# The independent numpy float64 reference, from the config.json text
# --------------------------------------------------------------------------------------------
def read_rope(d, family, head_dim, kind="full_attention"):
    """(theta, rotary_dim, layout, scaling dict with rope_type) from a config dict, either
    spelling; `rope_parameters` nested by layer type gives layer type `kind`'s. OLMo 3's sliding
    layers ignore a flat `rope_scaling` (it is its full layers')."""
    if family == "gptj":
        rd = d.get("rotary_dim") or head_dim
        return 10000.0, rd, "interleaved", {"rope_type": "default"}
    if "rope_parameters" in d:
        rp = dict(d["rope_parameters"])
        rp = dict(rp.get(kind, rp))
        theta = rp.pop("rope_theta")
        prf = rp.pop("partial_rotary_factor", 1.0)
        scaling = rp
    elif family == "gpt_neox":
        theta = d["rotary_emb_base"]
        prf = d.get("rotary_pct", 1.0)
        scaling = {"rope_type": "default"}
    else:
        theta = d["rope_theta"]
        prf = d.get("partial_rotary_factor", 1.0)
        scaling = dict(d.get("rope_scaling") or {"rope_type": "default"})
        if family == "olmo3" and kind == "sliding_attention":
            scaling = {"rope_type": "default"}
        if "type" in scaling:
            scaling["rope_type"] = scaling.pop("type")
    layout = "interleaved" if family in ("ernie4_5", "cohere2", "llama4") else "rotate_half"
    return float(theta), int(head_dim * prf), layout, scaling


def inv_freq_and_factor(theta, dim, scaling, max_pos):
    """inv_freq (dim/2,) and the factor cos/sin are multiplied by, as modeling_rope_utils defines them."""
    base_inv = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    kind = scaling["rope_type"]
    if kind == "default":
        return base_inv, 1.0
    if kind == "proportional":
        pairs = int(scaling.get("partial_rotary_factor", 1.0) * dim // 2)
        inv = np.concatenate([base_inv[:pairs], np.zeros(dim // 2 - pairs)])
        return inv / scaling.get("factor", 1.0), 1.0
    if kind == "linear":
        return base_inv / scaling["factor"], 1.0
    if kind == "llama3":
        factor = scaling["factor"]
        lff, hff = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / lff, old / hff
        out = np.empty_like(base_inv)
        for i, f in enumerate(base_inv):
            wavelen = 2 * math.pi / f
            if wavelen < high_wavelen:
                out[i] = f
            elif wavelen > low_wavelen:
                out[i] = f / factor
            else:
                smooth = (old / wavelen - lff) / (hff - lff)
                out[i] = (1 - smooth) * f / factor + smooth * f
        return out, 1.0
    if kind == "yarn":
        factor = scaling.get("factor")
        old = scaling["original_max_position_embeddings"]
        if factor is None:
            factor = max_pos / old

        def mscale(s, m=1.0):
            return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

        att = scaling.get("attention_factor")
        if att is None:
            if scaling.get("mscale") and scaling.get("mscale_all_dim"):
                att = mscale(factor, scaling["mscale"]) / mscale(factor, scaling["mscale_all_dim"])
            else:
                att = mscale(factor)
        beta_fast = scaling.get("beta_fast") or 32
        beta_slow = scaling.get("beta_slow") or 1

        def corr_dim(rot):
            return dim * math.log(old / (rot * 2 * math.pi)) / (2 * math.log(theta))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extra = 1 - ramp  # weight of the extrapolated (unscaled) frequency
        inv = (base_inv / factor) * (1 - extra) + base_inv * extra
        return inv, float(att)
    raise ValueError(f"rope_type {kind}")


def rms_norm(v, w, eps):
    return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * w


def rotate(v, pos, inv_freq, att, rotary_dim, layout):
    """v: (B, T, heads, hd); rotates the first rotary_dim features of every head."""
    ang = pos[:, :, None].astype(np.float64) * inv_freq[None, None, :]  # (B, T, r/2)
    c = (np.cos(ang) * att)[:, :, None, :]
    s = (np.sin(ang) * att)[:, :, None, :]
    out = v.copy()
    half = rotary_dim // 2
    if layout == "rotate_half":
        a, b = v[..., :half], v[..., half:rotary_dim]
        out[..., :half] = a * c - b * s
        out[..., half:rotary_dim] = b * c + a * s
    else:
        a, b = v[..., 0:rotary_dim:2], v[..., 1:rotary_dim:2]
        out[..., 0:rotary_dim:2] = a * c - b * s
        out[..., 1:rotary_dim:2] = b * c + a * s
    return out


def layer_kind(family, d, layer):
    """(layer type, window) of layer `layer`, from the config.json text. Layer types as the
    published configs imply them when `layer_types` is absent: Mistral one window for every
    layer; Qwen2 the window from layer `max_window_layers` on when `use_sliding_window`; Gemma 2
    and gpt-oss alternate sliding (even index) / full (odd); Gemma 3 every
    `sliding_window_pattern`-th layer (1-based) full, the others sliding."""
    n = d.get("num_hidden_layers") or d.get("n_layer")
    if family in LISTED_LAYER_TYPES:
        return listed_layer_kind(family, d, layer)
    if family in ("mistral",) + MINISTRAL3:
        types = ["sliding_attention" if d.get("sliding_window") else "full_attention"] * n
    elif family == "qwen2":
        on = d.get("use_sliding_window") and d.get("sliding_window") is not None
        types = ["sliding_attention" if on and i >= d["max_window_layers"] else "full_attention" for i in range(n)]
    elif family in ("gemma2", "gpt_oss"):
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    elif family == "gemma3":
        pattern = d.get("sliding_window_pattern", 6)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    else:
        types = ["full_attention"] * n
    if d.get("layer_types") is not None:
        assert d["layer_types"] == types, (d["layer_types"], types)
    kind = types[layer]
    return kind, (d["sliding_window"] if kind == "sliding_attention" else None)


def listed_layer_kind(family, d, layer):
    """(layer type, window) of an issue-33 family: `layer_types[layer]` (EXAONE 4 without the
    list: every `sliding_window_pattern`-th layer full, none sliding without a window); a
    sliding layer's window is `sliding_window`, for SmolLM3 only when `use_sliding_window`."""
    types = d.get("layer_types")
    if family == "nemotron_h":
        pattern = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
        types = d.get("layers_block_type") or [pattern[c] for c in d["hybrid_override_pattern"]]
    if types is None and family == "lfm2" and d.get("full_attn_idxs") is not None:
        types = ["full_attention" if i in d["full_attn_idxs"] else "conv" for i in range(d["num_hidden_layers"])]
    if types is None and family == "granite_swa":
        types = ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(d["num_hidden_layers"])]
    # transformers' legacy layer type names
    types = types and [{"attention": "full_attention", "mamba": "linear_attention"}.get(k, k) for k in types]
    if types is None and family == "exaone4":
        pattern = d.get("sliding_window_pattern", 4)
        on = d.get("sliding_window") is not None
        types = ["sliding_attention" if on and (i + 1) % pattern else "full_attention"
                 for i in range(d["num_hidden_layers"])]
    kind = (types or ["full_attention"] * d["num_hidden_layers"])[layer]
    windowed = kind == "sliding_attention" and (family != "smollm3" or d.get("use_sliding_window"))
    return kind, (d["sliding_window"] if windowed else None)


def gemma4_heads(d, layer, kind):
    """Gemma 4's (num_key_value_heads, head_dim) of layer `layer`: its `per_layer_config` entry
    (keys zero-padded layer indices), else on a full layer `global_head_dim` (512) and, with
    attention_k_eq_v, `num_global_key_value_heads`."""
    nkv, hd = d["num_key_value_heads"], d["head_dim"]
    if "per_layer_config" in d:
        entry = {int(k): v for k, v in d["per_layer_config"].items()}.get(layer, {})
        return entry.get("num_key_value_heads", nkv), entry.get("head_dim", hd)
    if kind != "full_attention":
        return nkv, hd
    if d.get("attention_k_eq_v") and d.get("num_global_key_value_heads") is not None:
        nkv = d["num_global_key_value_heads"]
    return nkv, d.get("global_head_dim", 512)


def has_rope(family, d, layer, kind):
    """Whether the layer rotates: SmolLM3 as `no_rope_layers[layer]` says, EXAONE 4's sliding
    layers (every layer without a window), Cohere 2's sliding layers, BLOOM never."""
    if family in ("smollm3", "llama4"):
        return d["no_rope_layers"][layer] == 1
    if family == "nemotron_h":
        return False
    if family == "granite_swa":  # layer_rope_theta 0 (or null): NoPE
        return bool((d.get("layer_rope_theta") or [1] * (layer + 1))[layer])
    if family == "granitemoehybrid":
        return d.get("position_embedding_type") == "rope"
    if family == "exaone4":
        return d.get("sliding_window") is None or kind == "sliding_attention"
    if family == "cohere2":
        return kind == "sliding_attention"
    return family != "bloom"


def alibi_slopes(n):
    """The ALiBi paper's slopes (ofirpress/attention_with_linear_biases): geometric from
    2^(-8/n) for a power of two; otherwise those of the nearest lower power of two followed by
    every other slope of twice that count."""
    def pow2(m):
        start = 2.0 ** (-(2.0 ** -(math.log2(m) - 3)))
        return [start * start ** i for i in range(m)]
    if math.log2(n).is_integer():
        return pow2(n)
    c = 2 ** math.floor(math.log2(n))
    return pow2(c) + pow2(2 * c)[0::2][: n - c]


def reference(family, d, w, x, pos, ablate=None, layer=0, padding=None, x_kv=None):
    """Plain float64 attention of one layer. d: the config.json dict; w: weights by short name
    (float64); x: (B, T, D); pos: (B, T). `ablate` drops one feature to show the case depends on
    it: "scaling", "positions", "window", "softcap", "scale" (1/sqrt(head_dim) instead of
    query_pre_attn_scalar), "alibi", "sinks", "norm_offset" (Gemma's 1 + w read as w),
    "local_theta" (a sliding Gemma 3 layer with the global rope), "force_window" (a full layer
    given the model's sliding_window), "alibi_index" (ALiBi by key index, not rank among the
    real tokens), "query_scale" (Ministral 3's / Llama 4's query factor), "chunk" (Llama 4's
    chunked mask). `padding`: the (B, T) padding mask (1 real), hiding keys; None: all real.
    `x_kv`: the (B, T, D) hidden states the keys and values are projected from, when not `x`
    (a KV-shared layer's source layer's, at the same positions)."""
    if family == "gptj":
        hidden, nh = d["n_embd"], d["n_head"]
        nkv = nh
    elif family == "bloom":
        hidden, nh = d["hidden_size"], d["n_head"]
        nkv = nh
    else:
        hidden, nh = d["hidden_size"], d["num_attention_heads"]
        nkv = d.get("num_key_value_heads") or nh
    if family == "laguna":
        nh = d["num_attention_heads_per_layer"][layer]
    if family in STEP:  # Step3p7TextConfig's per_layer_config, keys the layer indices
        nh = d.get("per_layer_config", {}).get(str(layer), {}).get("num_attention_heads", nh)
    hd = (hidden // nh if family in ("gpt_neox", "gptj", "bloom", "cohere2")
          else (d.get("head_dim") or hidden // nh))
    B, T, _ = x.shape
    kind, window = layer_kind(family, d, layer)
    if family == "gemma4":
        nkv, hd = gemma4_heads(d, layer, kind)
    dv = hd
    if family == "mimo_v2_flash":
        # MiMoV2FlashAttention: sliding layers have twice the key/value heads; value heads of
        # v_head_dim; the values times attention_value_scale (1 when null)
        nkv = nkv * 2 if kind == "sliding_attention" else nkv
        dv = d["v_head_dim"]

    def lin(v, name):
        y = v @ w[name + ".weight"].T
        if name + ".bias" in w:
            y = y + w[name + ".bias"]
        return y

    if padding is None:
        padding = np.ones((B, T), dtype=np.int64)
    # transformers' BLOOM: key j at cumsum(mask)[j] - 1 (build_alibi_tensor).
    ranks = np.cumsum(padding, axis=1) - 1
    if ablate == "alibi_index":
        ranks = arange_positions(B, T)
    if family == "phi3":
        qkv = lin(x, "qkv_proj")
        q, k, v = np.split(qkv, [nh * hd, nh * hd + nkv * hd], axis=-1)
    elif family in ("gpt_neox", "bloom"):
        qkv = lin(x, "query_key_value").reshape(B, T, nh, 3, hd)  # rows [q_h, k_h, v_h] per head
        q, k, v = (qkv[:, :, :, i, :].reshape(B, T, nh * hd) for i in range(3))
    elif family == "falcon_h1":
        # FalconH1DecoderLayer: attention_in_multiplier on the input; the attention multiplies
        # the projected keys (bias included) by key_multiplier
        m = (1.0, 1.0) if ablate == "multipliers" else (d["attention_in_multiplier"], d["key_multiplier"])
        q, k, v = lin(x * m[0], "q_proj"), lin(x * m[0], "k_proj") * m[1], lin(x * m[0], "v_proj")
    elif family == "gemma4" and d.get("attention_k_eq_v") and kind == "full_attention":
        q, k = lin(x, "q_proj"), lin(x if x_kv is None else x_kv, "k_proj")
        v = k.copy()  # K = V: the raw key projection, before k_norm and RoPE
    else:
        xk = x if x_kv is None else x_kv
        q, k, v = lin(x, "q_proj"), lin(xk, "k_proj"), lin(xk, "v_proj")
    gate = None
    if family == "laguna" or family in STEP:
        gate = lin(x, "g_proj")  # (B, T, nh) per head, (B, T, nh * hd) per feature
    if family in GATED:  # q_proj rows per head: [q_h (hd); gate_h (hd)]
        qg = q.reshape(B, T, nh, 2 * hd)
        q, gate = qg[..., :hd].reshape(B, T, nh * hd), qg[..., hd:].reshape(B, T, nh * hd)
    if family in ("olmo2", "olmo3", "minimax_m2"):
        q = rms_norm(q, w["q_norm.weight"], d["rms_norm_eps"])
        k = rms_norm(k, w["k_norm.weight"], d["rms_norm_eps"])
    q = q.reshape(B, T, nh, hd)
    k = k.reshape(B, T, nkv, hd)
    v = v.reshape(B, T, nkv, dv)
    if family == "mimo_v2_flash" and d.get("attention_value_scale") is not None:
        v = v * d["attention_value_scale"]
    if family in ("qwen3", "apertus", "exaone4", "laguna") or (family == "glm4_moe" and d.get("use_qk_norm")):
        q = rms_norm(q, w["q_norm.weight"], d["rms_norm_eps"])
        k = rms_norm(k, w["k_norm.weight"], d["rms_norm_eps"])
    if family == "lfm2":  # per head, before RoPE, its own names and eps key
        q = rms_norm(q, w["q_layernorm.weight"], d["norm_eps"])
        k = rms_norm(k, w["k_layernorm.weight"], d["norm_eps"])
    hunyuan_norm = family == "hunyuan_v1_dense"
    if hunyuan_norm and ablate == "norm_placement":  # weighted: before RoPE differs
        q = rms_norm(q, w["query_layernorm.weight"], d["rms_norm_eps"])
        k = rms_norm(k, w["key_layernorm.weight"], d["rms_norm_eps"])
    if family in GEMMA_V_NORM:
        # Gemma4RMSNorm: x * (mean(x^2) + eps)^-0.5 * w (plain weights); v_norm without weights
        q = rms_norm(q, w["q_norm.weight"], d["rms_norm_eps"])
        k = rms_norm(k, w["k_norm.weight"], d["rms_norm_eps"])
        if ablate != "v_norm":
            v = rms_norm(v, 1.0, d["rms_norm_eps"])
    if family == "gemma3" or family in GATED + STEP:
        offset = 0.0 if ablate == "norm_offset" else 1.0  # Gemma, Qwen3.5: x / rms * (1 + w)
        q = rms_norm(q, offset + w["q_norm.weight"], d["rms_norm_eps"])
        k = rms_norm(k, offset + w["k_norm.weight"], d["rms_norm_eps"])

    if not has_rope(family, d, layer, kind):
        theta, rd, layout, scaling, inv, att = None, 0, None, None, np.zeros(0), 1.0
    else:
        if family in ("gemma3", "gemma3n"):
            local = kind == "sliding_attention" and ablate != "local_theta"
            theta = d["rope_local_base_freq"] if local else d["rope_theta"]
            scaling = {"rope_type": "default"} if local else dict(d.get("rope_scaling") or {"rope_type": "default"})
            if "type" in scaling:
                scaling["rope_type"] = scaling.pop("type")
            theta, rd, layout = float(theta), hd, "rotate_half"
        elif family == "gemma4":
            # Rotate-half over the whole head; proportional rope zeroes the frequencies of the
            # pairs past int(partial_rotary_factor * head_dim // 2).
            scaling = dict(d["rope_parameters"][kind])
            theta, rd, layout = float(scaling.pop("rope_theta")), hd, "rotate_half"
        else:
            theta, rd, layout, scaling = read_rope(d, family, hd, kind)
        if family == "granite_swa" and d.get("layer_rope_theta"):
            theta = float(d["layer_rope_theta"][layer])
        if family == "minimax_m2" and "partial_rotary_factor" not in d and "rope_parameters" not in d:
            rd = int(hd * (d["rotary_dim"] / hd))  # MiniMaxM2Config: rotary_dim / head_dim
        if ablate == "scaling":
            scaling = {"rope_type": "default"}
        if ablate == "positions":
            pos = arange_positions(B, T)
        shown = scaling
        if scaling["rope_type"] == "dynamic" and scaling.get("alpha"):
            # HunYuanDenseV1RotaryEmbedding's ntk_alpha: a fixed base theta * alpha^(hd / (hd - 2))
            theta, scaling = theta * scaling["alpha"] ** (hd / (hd - 2)), {"rope_type": "default"}
        inv, att = inv_freq_and_factor(theta, rd, scaling, d.get("max_position_embeddings"))
        scaling = shown
        q = rotate(q, pos, inv, att, rd, layout)
        k = rotate(k, pos, inv, att, rd, layout)
        if hunyuan_norm and ablate != "norm_placement":  # weighted per-head RMSNorm after RoPE
            q = rms_norm(q, w["query_layernorm.weight"], d["rms_norm_eps"])
            k = rms_norm(k, w["key_layernorm.weight"], d["rms_norm_eps"])
        if family == "llama4" and d.get("use_qk_norm", True):
            # Llama4TextL2Norm: x / sqrt(mean(x^2) + eps), no weight, after RoPE
            q = rms_norm(q, 1.0, d["rms_norm_eps"])
            k = rms_norm(k, 1.0, d["rms_norm_eps"])
    if family in MINISTRAL3 and ablate != "query_scale":
        rp = d["rope_parameters"]  # position ids, floor, log, after RoPE
        steps = np.floor(pos.astype(np.float64) / rp["original_max_position_embeddings"])
        q = q * (1.0 + rp["llama_4_scaling_beta"] * np.log(1.0 + steps))[:, :, None, None]
    if (family == "llama4" and theta is None and d.get("attn_temperature_tuning", True)
            and ablate != "query_scale"):
        # the token index t (not the position ids): 1 + attn_scale * log(1 + floor((t + 1) / floor_scale))
        steps = np.floor((np.arange(T, dtype=np.float64) + 1.0) / d["floor_scale"])
        q = q * (1.0 + d["attn_scale"] * np.log(1.0 + steps))[None, :, None, None]

    if family in ("gemma2", "gemma3") + STEP and ablate != "scale":
        scale = 1.0 / math.sqrt(d["query_pre_attn_scalar"])
    elif family in GEMMA_V_NORM:
        scale = 1.0
    elif family in ("granite_swa", "granitemoehybrid") and ablate != "scale":
        scale = d["attention_multiplier"]
    else:
        scale = 1.0 / math.sqrt(hd)
    softcap = d.get("attn_logit_softcapping") if family in ("gemma2", "gemma3") else None
    if ablate == "softcap":
        softcap = None
    if ablate == "window":
        window = None
    if ablate == "force_window":  # a full-attention layer given the model's window
        window = d["sliding_window"]
    chunk = (d["attention_chunk_size"] if kind == "chunked_attention" and ablate != "chunk" else None)
    slopes = alibi_slopes(nh) if family == "bloom" and ablate != "alibi" else None
    sinks = w.get("sinks") if ablate != "sinks" else None
    group = nh // nkv
    o = np.zeros((B, T, nh, dv))
    for bi in range(B):
        for h in range(nh):
            kh = h // group
            for i in range(T):
                # keys j with j <= i (causal), i - window < j (sliding window), not padding
                # and (Llama 4's chunked layers) j // chunk == i // chunk
                js = [j for j in range(i + 1)
                      if (window is None or j > i - window) and padding[bi, j]
                      and (chunk is None or j // chunk == i // chunk)]
                s = np.array([np.dot(q[bi, i, h], k[bi, j, kh]) * scale for j in js])
                if softcap is not None:
                    s = softcap * np.tanh(s / softcap)
                if slopes is not None:
                    # BloomModel adds slope_h * rank_j: the same softmax as
                    # -slope_h * (rank_i - rank_j), which is -slope_h * (i - j) without padding
                    s = s - slopes[h] * (ranks[bi, i] - ranks[bi, js]).astype(np.float64)
                m = s.max() if sinks is None else max(s.max(), sinks[h])
                p = np.exp(s - m)
                denom = p.sum() + (0.0 if sinks is None else math.exp(sinks[h] - m))
                p /= denom  # a sink takes probability mass and contributes no value
                o[bi, i, h] = sum(pj * v[bi, j, kh] for pj, j in zip(p, js))
    o = o.reshape(B, T, nh * dv)
    if gate is not None and ablate != "gate" and family == "laguna":
        softplus = np.logaddexp(0.0, gate)  # ln(1 + e^g)
        per_head = d.get("gating", True) in (True, "per-head")
        o = (o.reshape(B, T, nh, dv) * softplus[..., None]).reshape(B, T, nh * dv) if per_head else o * softplus
    elif gate is not None and ablate != "gate" and family in STEP:  # sigmoid, one per head
        o = (o.reshape(B, T, nh, dv) / (1.0 + np.exp(-gate))[..., None]).reshape(B, T, nh * dv)
    elif gate is not None and ablate != "gate":
        o = o / (1.0 + np.exp(-gate))  # attn * sigmoid(gate), element by element
    out_name = {"gpt_neox": "dense", "gptj": "out_proj", "bloom": "dense", "phi": "dense",
                "lfm2": "out_proj"}.get(family, "o_proj")
    y = lin(o, out_name)
    if family == "falcon_h1" and ablate != "multipliers":
        y = y * d["attention_out_multiplier"]
    return y, dict(hidden=hidden, heads=nh, kv_heads=nkv, head_dim=hd, rotary_dim=rd,
                                  layout=layout, theta=theta, scaling=scaling, attention_factor=att,
                                  inv_freq=inv, layer_type=kind, window=window, scale=scale,
                                  softcap=softcap, slopes=slopes)


# --------------------------------------------------------------------------------------------
ST_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.int64): "I64"}


def save_safetensors(tensors, path, metadata):
    """A safetensors file, byte-reproducible (the safetensors package orders `__metadata__` at
    random): tensors in name order, keys sorted, header padded with spaces to 8 bytes. The
    safetensors package reads it back identically (checked below)."""
    header = {"__metadata__": dict(sorted(metadata.items()))}
    blobs, offset = [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": ST_DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))
    back = safetensors.numpy.load_file(path)
    assert sorted(back) == sorted(tensors)
    assert all(np.array_equal(back[k], tensors[k]) and back[k].dtype == tensors[k].dtype for k in back)
    with safetensors.safe_open(path, "np") as f:
        assert f.metadata() == metadata


def rel_diff(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def generate(case):
    name, family = case["name"], case["family"]
    fam = FAMILIES[family]
    prefix = layer_prefix(case)
    layer = case.get("layer", 0)
    d = make_config_json(case)
    cdir = os.path.join(OUT, name)
    if os.path.isdir(cdir):
        shutil.rmtree(cdir)
    os.makedirs(cdir)
    config_path = os.path.join(cdir, "config.json")
    with open(config_path, "w") as f:
        f.write(json.dumps(d, indent=2) + "\n")
    model_type = d["model_type"]
    d = d.get("text_config", d)  # a composite model's text model

    with torch.no_grad():
        weights = random_weights(case, build_model(case, config_path))
    rng = np.random.default_rng(2000 + case["seed"])
    hidden = d["n_embd"] if family == "gptj" else d["hidden_size"]
    b, t = case["b"], case["t"]
    x32 = rng.uniform(-1.0, 1.0, size=(b, t, hidden)).astype(np.float32)
    pos = case.get("positions")
    if pos is None:
        pos = arange_positions(b, t)
    assert pos.shape == (b, t)

    w64 = {k[len(prefix):]: v.astype(np.float64) for k, v in weights.items()}
    x64 = x32.astype(np.float64)
    padding = case.get("attention_mask")
    expected, info = reference(family, d, w64, x64, pos, layer=layer, padding=padding)
    hf64 = run_transformers(case, config_path, weights, x32, pos, f64=True)
    hfplain = run_transformers(case, config_path, weights, x32, pos, f64=False)
    validation = dict(
        max_abs_diff_transformers_f64=float(np.max(np.abs(hf64 - expected))),
        max_rel_diff_transformers_f64=rel_diff(hf64, expected),
        max_abs_diff_transformers_plain_double=float(np.max(np.abs(hfplain - expected))),
        max_rel_diff_transformers_plain_double=rel_diff(hfplain, expected),
        max_abs_expected=float(np.max(np.abs(expected))),
    )
    assert validation["max_rel_diff_transformers_f64"] <= TOL_F64, (name, validation)
    assert validation["max_rel_diff_transformers_plain_double"] <= TOL_PLAIN, (name, validation)
    # How much the case depends on its rope scaling / explicit positions (so a test that ignored
    # them would fail at the crate's 1e-4 tolerance).
    if info["scaling"] is not None and info["scaling"]["rope_type"] != "default":
        validation["max_abs_change_without_scaling"] = float(
            np.max(np.abs(reference(family, d, w64, x64, pos, "scaling", layer, padding)[0] - expected)))
    if "explicit_positions" in case["features"]:
        change = np.abs(reference(family, d, w64, x64, pos, "positions", layer, padding)[0] - expected)
        validation["max_abs_change_with_default_positions"] = float(np.max(change))
        validation["max_abs_change_with_default_positions_per_row"] = [float(np.max(r)) for r in change]
    # Issue 13: the same for each feature of the case (the name says what was dropped).
    for ablation, feature in [("window", "sliding_window"), ("softcap", "softcap"),
                              ("scale", "query_pre_attn_scalar"), ("alibi", "alibi"),
                              ("sinks", "attention_sinks"), ("norm_offset", "qk_norm_gemma"),
                              ("local_theta", "rope_local_theta"),
                              ("alibi_index", "padding_mask_holes"), ("gate", "output_gate"),
                              ("query_scale", "query_scale"), ("chunk", "chunked_attention"),
                              ("v_norm", "value_norm"), ("scale", "attention_multiplier"),
                              ("norm_placement", "qk_norm_weighted_after_rope"),
                              ("multipliers", "projection_multipliers")]:
        if feature in case["features"]:
            validation[f"max_abs_change_without_{ablation}"] = float(
                np.max(np.abs(reference(family, d, w64, x64, pos, ablation, layer, padding)[0] - expected)))
            assert validation[f"max_abs_change_without_{ablation}"] > 1e-3, (name, ablation, validation)
    if "layer_full" in case["features"] and d.get("sliding_window"):
        validation["max_abs_change_with_the_models_window"] = float(
            np.max(np.abs(reference(family, d, w64, x64, pos, "force_window", layer, padding)[0] - expected)))
        assert validation["max_abs_change_with_the_models_window"] > 1e-3, (name, validation)

    default_positions = bool(np.array_equal(pos, arange_positions(b, t)))
    features = list(case["features"])
    if case["spelling"] in ("legacy", "v5"):
        features.append("config_" + case["spelling"])

    def opt(v):
        return "none" if v is None else repr(v)

    saved = {saved_prefix(case) + k[len(prefix):]: v for k, v in weights.items()}
    save_safetensors(saved, os.path.join(cdir, "model.safetensors"), {"format": "pt"})
    meta = {
        "case": name,
        "family": family,
        "layer_prefix": saved_prefix(case),
        "batch": str(b),
        "seq_len": str(t),
        "hidden_size": str(hidden),
        "features": ",".join(features),
        "default_positions": "true" if default_positions else "false",
        # issue 13 (every case; "none" where the layer has no such setting)
        "layer_index": str(layer),
        "layer_type": info["layer_type"],
        "sliding_window": opt(info["window"]),
        "scale": repr(info["scale"]),
        "softcap": opt(info["softcap"]),
        "alibi_slopes": "none" if info["slopes"] is None else ",".join(repr(v) for v in info["slopes"]),
        "sinks": "true" if "sinks" in w64 else "false",
    }
    if padding is not None:
        # issue 20: io.safetensors holds the (B, T) padding mask `attention_mask`
        meta["padding_mask"] = "true"
    io = {"x": x32, "position_ids": pos.astype(np.int64), "expected": expected.astype(np.float64)}
    if padding is not None:
        io["attention_mask"] = padding.astype(np.int64)
    save_safetensors(io, os.path.join(cdir, "io.safetensors"), meta)

    rope = None if info["theta"] is None else {
        "theta": info["theta"],
        "rotary_dim": info["rotary_dim"],
        "layout": info["layout"],
        "scaling": dict(info["scaling"]),
        "attention_factor": info["attention_factor"],
        "inv_freq": [float(f) for f in info["inv_freq"]],
    }
    if family == "gemma3":
        rope["layer_rope"] = ("rope_local_base_freq, default rope (sliding layer)"
                              if info["layer_type"] == "sliding_attention" else
                              "rope_theta with rope_scaling (full-attention layer)")
    qk_norm = None
    if (family in ("qwen3", "gemma3", "apertus", "exaone4", "gemma4", "laguna") + GATED + STEP
            or (family == "glm4_moe" and d.get("use_qk_norm"))):
        qk_norm = {"span": "per_head", "eps": d["rms_norm_eps"], "weight_offset": 0.0}
    elif family in ("olmo2", "olmo3", "minimax_m2"):
        qk_norm = {"span": "whole", "eps": d["rms_norm_eps"], "weight_offset": 0.0}
    elif family == "lfm2":
        qk_norm = {"span": "per_head", "eps": d["norm_eps"], "weight_offset": 0.0,
                   "note": "q_layernorm / k_layernorm, eps norm_eps"}
    elif family == "hunyuan_v1_dense":
        qk_norm = {"span": "per_head", "eps": d["rms_norm_eps"], "weight_offset": 0.0,
                   "note": "query_layernorm / key_layernorm, weighted, applied after RoPE"}
    elif family == "llama4" and info["theta"] is not None and d.get("use_qk_norm", True):
        qk_norm = {"span": "per_head", "eps": d["rms_norm_eps"], "weight_offset": 0.0,
                   "note": "Llama4TextL2Norm: no weight (1), applied after RoPE"}
    if family == "gemma3" or family in GATED + STEP:
        qk_norm["weight_offset"] = 1.0
        qk_norm["note"] = ("Gemma RMSNorm: x / rms(x) * (1 + weight); for a plain x / rms(x) * w norm "
                           "use w = stored weight + 1")
    fused = {
        "phi3": {"tensor": "qkv_proj", "layout": "rows [Q (H*hd); K (Hkv*hd); V (Hkv*hd)]"},
        "gpt_neox": {"tensor": "query_key_value",
                     "layout": "rows [q_h (hd); k_h (hd); v_h (hd)] for h = 0..H-1, i.e. view(B, T, H, 3, hd)"},
        "bloom": {"tensor": "query_key_value",
                  "layout": "rows [q_h (hd); k_h (hd); v_h (hd)] for h = 0..H-1, i.e. view(B, T, H, 3, hd) "
                            "(BloomAttention._reshape); bias likewise"},
    }.get(family)
    case_json = {
        "name": name,
        "family": family,
        "model_type": model_type,
        "attention_class": type(fam["attn"](build_model(case, config_path), layer)).__name__,
        "layer_index": layer,
        "num_layers_in_config": d.get("num_hidden_layers") or d.get("n_layer"),
        "layer_type": info["layer_type"],
        "layer_prefix": saved_prefix(case),
        "batch": b,
        "seq_len": t,
        "hidden_size": hidden,
        "num_heads": info["heads"],
        "num_kv_heads": info["kv_heads"],
        "head_dim": info["head_dim"],
        "query_width": info["heads"] * info["head_dim"],
        "scale": info["scale"],
        "scale_source": ("query_pre_attn_scalar ** -0.5" if family in ("gemma2", "gemma3")
                         else "1 (Gemma4TextAttention.scaling)" if family == "gemma4"
                         else "attention_multiplier" if family in ("granite_swa", "granitemoehybrid")
                         else "head_dim ** -0.5"),
        **({} if family != "falcon_h1" else {
            "projection_multipliers": {k: d[k] for k in ("attention_in_multiplier", "key_multiplier",
                                                         "attention_out_multiplier")},
            "multiplier_rule": ("y = attention_out_multiplier * o_proj(attn(q, key_multiplier * k_proj(x'), "
                                "v)) with x' = attention_in_multiplier * x"),
        }),
        **({} if family != "gemma4" else {
            "value_norm": {"eps": d["rms_norm_eps"],
                           "rule": "v * (mean(v^2) + eps)^-0.5 per head, no weight, before caching"},
            "values_from_keys": bool(d.get("attention_k_eq_v")) and info["layer_type"] == "full_attention",
        }),
        "sliding_window": info["window"],
        "config_sliding_window": d.get("sliding_window"),
        "window_rule": "query i sees key j iff j <= i and i - sliding_window < j (null: causal only)",
        "softcap": info["softcap"],
        "softcap_rule": (None if info["softcap"] is None else
                         "s = softcap * tanh(s / softcap) on the scaled scores, before the mask"),
        "alibi": None if info["slopes"] is None else {
            "slopes": [float(v) for v in info["slopes"]],
            "bias": "-slope_h * (i - j) added to the scaled score of query i, key j",
            "transformers_form": ("BloomModel adds slope_h * j (key index only, no padding); the same "
                                  "softmax, as the two differ by a constant per row"),
        },
        "sinks": None if "sinks" not in w64 else {
            "tensor": saved_prefix(case) + "sinks",
            "shape": [info["heads"]],
            "values": [float(v) for v in w64["sinks"]],
            "rule": ("softmax over [scores_j..., sink_h]; the sink's share is dropped (it adds "
                     "exp(sink_h - m) to the denominator and no value)"),
        },
        "fused_qkv": fused,
        "rope": rope,
        "qk_norm": qk_norm,
        "config_spelling": case["spelling"],
        "default_positions": default_positions,
        "features": features,
        "weights": {k: list(v.shape) for k, v in sorted(saved.items())},
        "io": {"x": ["F32", [b, t, hidden]], "position_ids": ["I64", [b, t]],
               "expected": ["F64", [b, t, hidden]],
               **({} if padding is None else {"attention_mask": ["I64", [b, t]]})},
        **({} if padding is None else {"padding_mask": padding.tolist()}),
        "validation": validation,
        "generator": {"script": "dev/hf_fixtures/generate.py", "seed": case["seed"],
                      "torch": torch.__version__, "transformers": transformers.__version__,
                      "numpy": np.__version__},
    }
    with open(os.path.join(cdir, "case.json"), "w") as f:
        f.write(json.dumps(case_json, indent=2) + "\n")
    return case_json


# --------------------------------------------------------------------------------------------
# Multi-head latent attention (issue 34): tests/fixtures/mla/<case>/, read by tests/mla.rs
# --------------------------------------------------------------------------------------------

MLA_OUT = os.path.join(ROOT, "tests", "fixtures", "mla")
MLA_CASES = [
    # DeepSeek-V3's layout at small sizes (p + r = 32, whole kernel panels): q LoRA, interleaved RoPE, YaRN whose mscale and
    # mscale_all_dim differ (so both the cos/sin factor and the softmax scale's mscale² count).
    dict(name="deepseek_v3", seed=50, b=2, t=7,
         config=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24,
                     kv_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
                     num_hidden_layers=1, vocab_size=32, intermediate_size=32,
                     moe_intermediate_size=16, first_k_dense_replace=1, rope_interleave=True,
                     max_position_embeddings=1024, rms_norm_eps=1e-6,
                     rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                          original_max_position_embeddings=256, beta_fast=32,
                                          beta_slow=1, mscale=1.0, mscale_all_dim=0.8))),
    # DeepSeek-V2-Lite's layout (one q_proj, no query LoRA), rotate-half pairs
    # (rope_interleave false), YaRN without mscale_all_dim (scale (n + p)^-½), and an
    # rms_norm_eps that the latent norms ignore.
    dict(name="deepseek_v3_q_proj", seed=51, b=2, t=9,
         config=dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=3, q_lora_rank=None,
                     kv_lora_rank=28, qk_rope_head_dim=4, qk_nope_head_dim=12, v_head_dim=10,
                     num_hidden_layers=1, vocab_size=32, intermediate_size=32,
                     moe_intermediate_size=16, first_k_dense_replace=1, rope_interleave=False,
                     max_position_embeddings=512, rms_norm_eps=1e-5,
                     rope_parameters=dict(rope_type="yarn", rope_theta=5000.0, factor=2.0,
                                          original_max_position_embeddings=256))),
    # Mistral 4: DeepSeek-V3's MLA (n = p, so partial_rotary_factor p / (n + p) is 0.5 exactly)
    # with the llama_4_scaling_beta query scale, whose period original_max_position_embeddings
    # (4) is short enough that the scale changes twice within the sequence.
    dict(name="mistral4", family="mistral4", seed=52, b=2, t=11,
         config=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24,
                     kv_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12,
                     num_hidden_layers=1, vocab_size=32, intermediate_size=32,
                     moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
                     rope_interleave=True, max_position_embeddings=16, rms_norm_eps=1e-6,
                     rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                          original_max_position_embeddings=4, beta_fast=32.0,
                                          beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
                                          llama_4_scaling_beta=0.3,
                                          max_position_embeddings=16))),
    # LongCat-Flash: two MLA blocks per layer (self_attn.0 and self_attn.1, each with its own
    # weights; `expected` is block 0's output on x, `expected1` block 1's), the LoRA scales
    # √(D / q_lora_rank) on the queries and √(D / kv_lora_rank) on the latent, interleaved
    # RoPE whatever rope_interleave says, YaRN with mscale_all_dim.
    dict(name="longcat_flash", family="longcat_flash", seed=53, b=2, t=9, blocks=2,
         config=dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=3, q_lora_rank=12,
                     kv_lora_rank=20, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=10,
                     head_dim=4, num_layers=1, vocab_size=32, ffn_hidden_size=32,
                     expert_ffn_hidden_size=16, n_routed_experts=4, zero_expert_num=2, moe_topk=2,
                     max_position_embeddings=1024, rms_norm_eps=1e-5,
                     rope_parameters=dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0,
                                          original_max_position_embeddings=256, beta_fast=32,
                                          beta_slow=1, mscale=1.0, mscale_all_dim=0.7))),
]

# The transformers classes and layer prefixes of the MLA families (block `i` of a LongCat layer
# at `self_attn.{i}.`).
MLA_FAMILIES = {
    "deepseek_v3": dict(config="DeepseekV3Config", model="DeepseekV3ForCausalLM",
                        prefix="model.layers.0.self_attn."),
    "mistral4": dict(config="Mistral4Config", model="Mistral4ForCausalLM",
                     prefix="model.layers.0.self_attn."),
    "longcat_flash": dict(config="LongcatFlashConfig", model="LongcatFlashForCausalLM",
                          prefix="model.layers.0.self_attn.{block}."),
}


def mla_family(case):
    return MLA_FAMILIES[case.get("family", "deepseek_v3")]


def mla_prefix(case, block=0):
    return mla_family(case)["prefix"].format(block=block)


def mla_reference(d, w, x, pos, case=None, block=0):
    """DeepSeek-V3 MLA in plain numpy float64 from the config dict, per-head keys and values
    formed in full (the naive expansion): x (B, T, D), pos (B, T)."""
    h, n, p, r, v = (d["num_attention_heads"], d["qk_nope_head_dim"], d["qk_rope_head_dim"],
                     d["kv_lora_rank"], d["v_head_dim"])
    # q_a_layernorm and kv_a_layernorm are built with RMSNorm's default eps, not rms_norm_eps.
    family = (case or {}).get("family", "deepseek_v3")
    eps, pre = 1e-6, mla_prefix(case or {}, block)
    b, t, _ = x.shape
    if d["q_lora_rank"] is None:
        q = (x @ w[pre + "q_proj.weight"].T).reshape(b, t, h, n + p)
    else:
        q = rms_norm(x @ w[pre + "q_a_proj.weight"].T, w[pre + "q_a_layernorm.weight"], eps)
        q = (q @ w[pre + "q_b_proj.weight"].T).reshape(b, t, h, n + p)
    kv = x @ w[pre + "kv_a_proj_with_mqa.weight"].T
    c = rms_norm(kv[..., :r], w[pre + "kv_a_layernorm.weight"], eps)
    if family == "longcat_flash":
        # The LoRA scales: queries (nope and rope) and the normalised latent.
        q = q * math.sqrt(d["hidden_size"] / d["q_lora_rank"])
        c = c * math.sqrt(d["hidden_size"] / r)
    rp = dict(d["rope_parameters"])
    beta = rp.pop("llama_4_scaling_beta", None)
    rp.pop("max_position_embeddings", None)
    inv, att = inv_freq_and_factor(rp.pop("rope_theta"), p, rp, d["max_position_embeddings"])
    interleave = family == "longcat_flash" or d.get("rope_interleave", True)
    layout = "interleaved" if interleave else "rotate_half"
    q_rope = rotate(q[..., n:], pos, inv, att, p, layout)
    k_rope = rotate(kv[:, :, None, r:], pos, inv, att, p, layout)
    kvb = (c @ w[pre + "kv_b_proj.weight"].T).reshape(b, t, h, n + v)
    keys = np.concatenate([kvb[..., :n], np.broadcast_to(k_rope, (b, t, h, p))], axis=-1)
    queries = np.concatenate([q[..., :n], q_rope], axis=-1)
    if family == "mistral4":
        # get_llama_4_attn_scale: 1 + beta ln(1 + floor(pos / original_max_position_embeddings)).
        period = rp["original_max_position_embeddings"]
        factor = 1.0 + beta * np.log1p(np.floor(pos.astype(np.float64) / period))
        queries = queries * factor[:, :, None, None]
    all_dim = rp.get("mscale_all_dim") or 0
    mscale = 0.1 * all_dim * math.log(rp["factor"]) + 1.0 if all_dim and rp["factor"] > 1 else 1.0
    scale = (n + p) ** -0.5 * mscale * mscale
    scores = np.einsum("bthd,bshd->bhts", queries, keys) * scale
    scores = np.where(np.triu(np.ones((t, t), dtype=bool), 1), -np.inf, scores)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("bhts,bshd->bthd", probs, kvb[..., n:]).reshape(b, t, h * v)
    return out @ w[pre + "o_proj.weight"].T, scale


def mla_transformers(config_path, weights, x32, pos, f64, case=None, block=0):
    """transformers' own attention module (DeepseekV3Attention, Mistral4Attention, or block
    `block` of LongCat-Flash's layer 0; layer 0 of a one-layer model) on x, in float64."""
    family = mla_family(case or {})
    with full_float64(f64), torch.no_grad():
        config = getattr(transformers, family["config"]).from_json_file(config_path)
        model = getattr(transformers, family["model"])(config)
        model.set_attn_implementation("eager")
        model = model.double().eval()
        sd = model.state_dict()
        for k, w in weights.items():
            sd[k].copy_(torch.from_numpy(w.astype(np.float64)))
        x = torch.from_numpy(x32.astype(np.float64))
        b, t, _ = x.shape
        mask = torch.zeros(b, 1, t, t, dtype=torch.float64)
        mask.masked_fill_(torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1),
                          torch.finfo(torch.float64).min)
        cos, sin = model.model.rotary_emb(x, torch.from_numpy(pos))
        attn = model.model.layers[0].self_attn
        extra = {}
        if (case or {}).get("family") == "longcat_flash":
            attn = attn[block]
        if (case or {}).get("family") == "mistral4":
            extra = dict(position_ids=torch.from_numpy(pos))
        out = attn(hidden_states=x, position_embeddings=(cos, sin), attention_mask=mask, **extra)[0]
        return out.numpy().copy(), attn.scaling


def generate_mla(case):
    cdir = os.path.join(MLA_OUT, case["name"])
    if os.path.isdir(cdir):
        shutil.rmtree(cdir)
    os.makedirs(cdir)
    family = mla_family(case)
    d = dict(case["config"], model_type=case.get("family", "deepseek_v3"),
             architectures=[family["model"]])
    config_path = os.path.join(cdir, "config.json")
    with open(config_path, "w") as f:
        f.write(json.dumps(d, indent=2) + "\n")
    with torch.no_grad():
        config = getattr(transformers, family["config"]).from_json_file(config_path)
        model = getattr(transformers, family["model"])(config)
    rng = np.random.default_rng(1000 + case["seed"])
    weights = {}
    blocks = case.get("blocks", 1)
    for name, t in sorted(model.state_dict().items()):
        if not any(name.startswith(mla_prefix(case, i)) for i in range(blocks)):
            continue
        shape = tuple(t.shape)
        if name.endswith("norm.weight"):
            w = rng.uniform(0.5, 1.5, size=shape)
        else:
            w = rng.uniform(-1.0, 1.0, size=shape) * math.sqrt(3.0 / shape[1])
        weights[name] = w.astype(np.float32)
    rng = np.random.default_rng(2000 + case["seed"])
    b, t = case["b"], case["t"]
    x32 = rng.uniform(-1.0, 1.0, size=(b, t, d["hidden_size"])).astype(np.float32)
    pos = arange_positions(b, t)
    w64 = {k: v.astype(np.float64) for k, v in weights.items()}
    io = {"x": x32, "position_ids": pos}
    for block in range(blocks):
        expected, scale = mla_reference(d, w64, x32.astype(np.float64), pos, case, block)
        f64, hf_scale = mla_transformers(config_path, weights, x32, pos, True, case, block)
        plain, _ = mla_transformers(config_path, weights, x32, pos, False, case, block)
        assert rel_diff(f64, expected) < 1e-12, rel_diff(f64, expected)
        assert rel_diff(plain, expected) < 1e-5, rel_diff(plain, expected)
        assert abs(hf_scale - scale) < 1e-15 * scale, (hf_scale, scale)
        io["expected" + (str(block) if block else "")] = expected.astype(np.float64)
    save_safetensors(weights, os.path.join(cdir, "model.safetensors"), {"format": "pt"})
    meta = {"case": case["name"], "batch": str(b), "seq_len": str(t),
            "hidden_size": str(d["hidden_size"]), "scale": repr(scale)}
    save_safetensors(io, os.path.join(cdir, "io.safetensors"), meta)
    print(f"{case['name']:18} mla f64: rel {rel_diff(f64, expected):.2e} | plain .double(): rel "
          f"{rel_diff(plain, expected):.2e}")


# --------------------------------------------------------------------------------------------
# KV sharing (issue 33): tests/fixtures/kv_shared/<case>/, read by tests/kv_shared.rs
# --------------------------------------------------------------------------------------------

KV_SHARED_OUT = os.path.join(ROOT, "tests", "fixtures", "kv_shared")
KV_SHARED_CASES = [
    # Gemma 4 with its last 2 of 4 layers KV-shared: layers 0 and 2 slide (window 3, heads of 6,
    # 3 key/value heads), 1 and 3 are full (heads of 10, one key/value head from
    # global_head_dim and num_global_key_value_heads, values from the key projection,
    # proportional rope). Layer 2 reads layer 0's keys and values, layer 3 layer 1's. Each
    # layer has its own hidden states x{i}.
    dict(name="gemma4_kv_shared", family="gemma4", seed=60, b=2, t=9, spelling="v5", layers=4,
         drop=["per_layer_config"], extra=dict(global_head_dim=10, num_global_key_value_heads=1),
         cfg=dict(hidden_size=30, num_attention_heads=3, num_key_value_heads=3, head_dim=6,
                  global_head_dim=10, num_global_key_value_heads=1, attention_k_eq_v=True,
                  hidden_size_per_layer_input=0, vocab_size_per_layer_input=16, num_kv_shared_layers=2,
                  sliding_window=3, rms_norm_eps=1e-6, max_position_embeddings=512,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                  rope_parameters={
                      "sliding_attention": dict(rope_type="default", rope_theta=1000.0),
                      "full_attention": dict(rope_type="proportional", partial_rotary_factor=0.5,
                                             rope_theta=10000.0)})),
    # Gemma 3n with its last 2 of 4 layers KV-shared (layer 2 reads sliding layer 0, layer 3
    # full layer 1): window 3, 3 query heads of 10 over one key/value head, plain-weight q/k
    # norm, weight-less v norm, scale 1, rope in the published spelling (rope_theta for the full
    # layers, rope_local_base_freq for the sliding ones).
    dict(name="gemma3n_kv_shared", family="gemma3n", seed=61, b=2, t=9, spelling="legacy", layers=4,
         cfg=dict(hidden_size=30, num_attention_heads=3, num_key_value_heads=1, head_dim=10,
                  hidden_size_per_layer_input=4, vocab_size_per_layer_input=16, altup_num_inputs=2,
                  laurel_rank=4, activation_sparsity_pattern=[0.0] * 4, num_kv_shared_layers=2,
                  sliding_window=3, rms_norm_eps=1e-6, max_position_embeddings=512,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                  rope_parameters={
                      "sliding_attention": dict(rope_type="default", rope_theta=1000.0),
                      "full_attention": dict(rope_type="default", rope_theta=20000.0)})),
]


def kv_shared_transformers(case, config_path, weights, xs, pos, f64):
    """Each layer's output from transformers' own attention modules, in order, on its own
    hidden states: the source layers store their keys and values in a `shared_kv_states` of
    ours, which the shared layers read (as the model's forward passes it)."""
    with full_float64(f64), torch.no_grad():
        model = build_model(case, config_path)
        sd = model.state_dict()
        for k, w in weights.items():
            sd[k].copy_(torch.from_numpy(w.astype(np.float64)))
        # The model's forward (run up to each layer for its mask and cos/sin) slices the shared
        # layers' inputs to `logits_to_keep` (0: all of them) and trips over the per-layer
        # inputs the tiny model has none of: keep them whole.
        model.model._maybe_slice_kv_shared_inputs = lambda h, p, e, m, *a, **k: (h, p, e, m)
        shared_kv, outs = {}, []
        for i, x32 in enumerate(xs):
            attn = model.model.layers[i].self_attn
            x = torch.from_numpy(x32.astype(np.float64))
            args = captured_inputs(dict(case, layer=i), model, attn, x, torch.from_numpy(pos))
            args["hidden_states"], args["shared_kv_states"] = x, shared_kv
            outs.append(attn(**args)[0].numpy().copy())
            assert attn.is_kv_shared_layer == (i >= len(xs) - case["cfg"]["num_kv_shared_layers"])
        return outs


def generate_kv_shared(case):
    cdir = os.path.join(KV_SHARED_OUT, case["name"])
    if os.path.isdir(cdir):
        shutil.rmtree(cdir)
    os.makedirs(cdir)
    d = make_config_json(case)
    config_path = os.path.join(cdir, "config.json")
    with open(config_path, "w") as f:
        f.write(json.dumps(d, indent=2) + "\n")
    layers, shared = d["num_hidden_layers"], d["num_kv_shared_layers"]
    with torch.no_grad():
        model = build_model(case, config_path)
        weights = {}
        for i in range(layers):
            weights.update(random_weights(dict(case, layer=i, seed=case["seed"] + i), model))
    rng = np.random.default_rng(2000 + case["seed"])
    b, t = case["b"], case["t"]
    xs = [rng.uniform(-1.0, 1.0, size=(b, t, d["hidden_size"])).astype(np.float32) for _ in range(layers)]
    pos = arange_positions(b, t)
    prefix = FAMILIES[case["family"]]["prefix"]
    expected, sources = [], {}
    for i in range(layers):
        w64 = {k[len(prefix.format(i)):]: v.astype(np.float64) for k, v in weights.items()
               if k.startswith(prefix.format(i))}
        kind, _ = layer_kind(case["family"], d, i)
        if i < layers - shared:
            sources[kind] = (w64, xs[i])  # the last earlier layer of each type
            y, _ = reference(case["family"], d, w64, xs[i].astype(np.float64), pos, layer=i)
        else:
            source_w, source_x = sources[kind]
            merged = dict(source_w, **w64)  # q_proj, q_norm, o_proj of this layer
            y, _ = reference(case["family"], d, merged, xs[i].astype(np.float64), pos, layer=i,
                             x_kv=source_x.astype(np.float64))
        expected.append(y)
    f64 = kv_shared_transformers(case, config_path, weights, xs, pos, True)
    plain = kv_shared_transformers(case, config_path, weights, xs, pos, False)
    for i in range(layers):
        assert rel_diff(f64[i], expected[i]) < TOL_F64, (i, rel_diff(f64[i], expected[i]))
        assert rel_diff(plain[i], expected[i]) < TOL_PLAIN, (i, rel_diff(plain[i], expected[i]))
    # The shared layers depend on their source's hidden states (a test feeding them their own
    # would fail).
    for i in range(layers - shared, layers):
        kind, _ = layer_kind(case["family"], d, i)
        w64 = {k[len(prefix.format(i)):]: v.astype(np.float64) for k, v in weights.items()
               if k.startswith(prefix.format(i))}
        own, _ = reference(case["family"], d, dict(sources[kind][0], **w64), xs[i].astype(np.float64),
                           pos, layer=i)
        assert np.max(np.abs(own - expected[i])) > 1e-2, i
    save_safetensors(weights, os.path.join(cdir, "model.safetensors"), {"format": "pt"})
    meta = {"case": case["name"], "batch": str(b), "seq_len": str(t), "hidden_size": str(d["hidden_size"]),
            "layers": str(layers)}
    io = {"position_ids": pos}
    for i in range(layers):
        io[f"x{i}"], io[f"expected{i}"] = xs[i], expected[i].astype(np.float64)
    save_safetensors(io, os.path.join(cdir, "io.safetensors"), meta)
    print(f"{case['name']:18} kv sharing f64: rel "
          f"{max(rel_diff(f, e) for f, e in zip(f64, expected)):.2e} | plain .double(): rel "
          f"{max(rel_diff(p, e) for p, e in zip(plain, expected)):.2e}")


def main():
    only = set(sys.argv[1:])
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    rows = []
    for case in CASES:
        if only and case["name"] not in only:
            continue
        cj = generate(case)
        v = cj["validation"]
        rows.append((cj["name"], v))
        print(f"{cj['name']:18} f64: abs {v['max_abs_diff_transformers_f64']:.2e} rel "
              f"{v['max_rel_diff_transformers_f64']:.2e} | plain .double(): abs "
              f"{v['max_abs_diff_transformers_plain_double']:.2e} | "
              + " ".join(f"{k}={v[k]}" for k in v if k.startswith("max_abs_change")))
    total = 0
    for root, _, files in os.walk(OUT):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"{len(rows)} cases, {total} bytes under {os.path.relpath(OUT, ROOT)}")
    for case in MLA_CASES:
        if not only or case["name"] in only:
            generate_mla(case)
    for case in KV_SHARED_CASES:
        if not only or case["name"] in only:
            generate_kv_shared(case)


if __name__ == "__main__":
    main()
