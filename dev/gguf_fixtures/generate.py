#!/usr/bin/env python3
"""Writes the GGUF fixtures of tests/gguf.rs into tests/fixtures/gguf/ (see README.md).

1. From the Hugging Face fixtures (tests/fixtures/hf/<case>/): the layer's float32 attention
   weights written as llama.cpp's converter (convert_hf_to_gguf.py) writes them, with the
   `gguf` package (llama.cpp's own writer): tensors `blk.0.attn_q.weight`, ..., the `{arch}.*`
   keys, and for `llama` the rows of Q and K permuted per head (the converter's
   `LlamaModel.permute`). The test runs the case's x through the layer loaded from the GGUF
   and compares with the case's float64 `expected`.
2. Quantized layers: random float32 weights of a layer of width 256 quantized with ggml's own
   `ggml_quantize_chunk` (ggml-python), one ggml type per projection. For every quantized
   tensor, ggml's own dequantization (`type_traits.to_float`, i.e. `dequantize_row_*`) is
   recorded in the file's metadata: `mha.test.fnv1a64.<tensor>` (FNV-1a 64 of the float32
   values' little-endian bytes) and `mha.test.head.<tensor>` (the first 64 values). The
   generator checks that gguf-py's numpy dequantizers (`gguf.quants.dequantize`) give the
   same bits.

Run with the ggml venv (../shared/peers/decode/setup-ggml.sh) and `pip install -r
requirements.txt` in it. `--hf-only` writes only the files of step 1 (the `gguf` package
alone, no ggml needed).
"""
import ctypes
import json
import struct
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

# ggml-python, imported by main() only when the quantized files are written.
ggml = None

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests/fixtures/hf"
OUT = ROOT / "tests/fixtures/gguf"

ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
        "phi3": "phi3", "olmo2": "olmo2"}
HF_CASES = ["llama_gqa", "llama_linear", "qwen2_bias", "qwen2_yarn", "qwen3_qknorm",
            "phi3_partial", "olmo2_qknorm"]
NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
         "q_norm": "attn_q_norm", "k_norm": "attn_k_norm", "qkv_proj": "attn_qkv"}


def read_safetensors(path):
    """{name: float32 array} of an F32 safetensors file, read with numpy only."""
    b = path.read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (name, t["dtype"])
        lo, hi = t["data_offsets"]
        out[name] = np.frombuffer(b[8 + n + lo:8 + n + hi], dtype="<f4").reshape(t["shape"])
    return out


def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute: per head, rotate-half pairs (i, i + d/2)
    become adjacent rows (2i, 2i + 1)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def rope_settings(cfg):
    """(theta, scaling dict) from either spelling of config.json."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or params
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    return theta, scaling


def add_hparams(w, arch, d, heads, kv_heads, head_dim, ctx, theta, scaling, eps,
                rotary_dim=None):
    w.add_block_count(1)
    w.add_context_length(ctx)
    w.add_embedding_length(d)
    w.add_feed_forward_length(4 * d)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim if rotary_dim is None else rotary_dim)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(eps)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(scaling["factor"])
    elif kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(scaling["factor"])
        w.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
    else:
        assert kind == "default", kind


def hf_case(name, split=False):
    """The F32 GGUF of HF fixture `name`; with `split`, as splits of 3 tensors each in
    split/ (`{name}-0000i-of-0000n.gguf`, the metadata in the first)."""
    case = json.loads((HF / name / "case.json").read_text())
    cfg = json.loads((HF / name / "config.json").read_text())
    arch = ARCH[cfg["model_type"]]
    tensors = read_safetensors(HF / name / "model.safetensors")
    heads, kv_heads, head_dim = case["num_heads"], case["num_kv_heads"], case["head_dim"]
    path = OUT / "split" / f"{name}.gguf" if split else OUT / f"{name}.gguf"
    w = gguf.GGUFWriter(path, arch, split_max_tensors=3 if split else 0)
    w.add_name(f"mha test fixture {name}")
    theta, scaling = rope_settings(cfg)
    # Phi-3's converter: int(partial_rotary_factor * n_embd) // n_head rotated features.
    rotary_dim = head_dim
    if "partial_rotary_factor" in cfg:
        rotary_dim = int(cfg["partial_rotary_factor"] * case["hidden_size"]) // heads
    add_hparams(w, arch, case["hidden_size"], heads, kv_heads, head_dim,
                cfg["max_position_embeddings"], theta, scaling, cfg.get("rms_norm_eps", 1e-6),
                rotary_dim)
    prefix = case["layer_prefix"]
    for full, t in sorted(tensors.items()):
        module, kind = full[len(prefix):].split(".")
        if arch == "llama" and module in ("q_proj", "k_proj"):
            t = permute(t, heads if module == "q_proj" else kv_heads)
        w.add_tensor(f"blk.0.{NAMES[module]}.{kind}", np.ascontiguousarray(t, dtype=np.float32))
    # A tensor the loader must not read.
    w.add_tensor("token_embd.weight", np.full((16, case["hidden_size"]), 0.5, dtype=np.float32))
    finish(w)


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def ggml_quantize(t, ty, rows, n):
    """ggml_quantize_chunk of float32 rows (rows, n) into type ty: the block bytes."""
    size = ggml.ggml_row_size(ty, n) * rows
    dst = (ctypes.c_uint8 * size)()
    src = np.ascontiguousarray(t, dtype=np.float32)
    ggml.ggml_quantize_chunk(ty, src.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                             ctypes.cast(dst, ctypes.c_void_p), 0, rows, n, None)
    return np.frombuffer(bytes(dst), dtype=np.uint8)


def ggml_dequantize(b, ty, count):
    """ggml's own to_float (dequantize_row_*) of `count` values."""
    traits = ggml.ggml_get_type_traits(ty).contents
    out = np.empty(count, dtype=np.float32)
    src = np.ascontiguousarray(b)
    traits.to_float(ctypes.cast(src.ctypes.data, ctypes.c_void_p),
                    out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), count)
    return out


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


# Quantized layers: D = 256, 4 heads of 64, 2 key/value heads; the type of q, k, v, output.
QUANT_CASES = {
    "qwen2_kquants": ("qwen2", [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0]),
    "llama_legacy": ("llama", [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]),
    "qwen3_mixed": ("qwen3", [Q.Q8_0, Q.Q6_K, Q.Q4_K, Q.Q4_0]),
}
D, H, HKV, HD = 256, 4, 2, 64


def quant_case(name, arch, types, seed):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(OUT / f"{name}.gguf", arch)
    w.add_name(f"mha test fixture {name}")
    add_hparams(w, arch, D, H, HKV, HD, 4096, 10000.0, {}, 1e-6)
    shapes = {"attn_q": (H * HD, D), "attn_k": (HKV * HD, D), "attn_v": (HKV * HD, D),
              "attn_output": (D, H * HD)}
    mismatches = []
    for (module, (rows, n)), ty in zip(shapes.items(), types):
        t = rng.uniform(-1, 1, size=(rows, n)).astype(np.float32) / np.float32(np.sqrt(n))
        # Some rows of very different magnitude, and one row of zeros.
        t[1] *= np.float32(1000.0)
        t[2] *= np.float32(1e-4)
        t[3] = 0.0
        tensor = f"blk.0.{module}.weight"
        blocks = ggml_quantize(t, int(ty), rows, n)
        values = ggml_dequantize(blocks, int(ty), rows * n)
        numpy_values = gguf.quants.dequantize(blocks.reshape(rows, -1), ty).reshape(-1)
        if not np.array_equal(values.view(np.uint32), numpy_values.view(np.uint32)):
            diff = np.count_nonzero(values.view(np.uint32) != numpy_values.view(np.uint32))
            mismatches.append(f"{name} {tensor} {ty.name}: {diff} values differ")
        w.add_tensor(tensor, blocks.reshape(rows, -1), raw_dtype=ty)
        w.add_uint64(f"mha.test.fnv1a64.{tensor}", fnv1a64(values.astype("<f4").tobytes()))
        w.add_array(f"mha.test.head.{tensor}", [float(x) for x in values[:64]])
    if arch == "qwen2":
        for module, rows in [("attn_q", H * HD), ("attn_k", HKV * HD), ("attn_v", HKV * HD)]:
            w.add_tensor(f"blk.0.{module}.bias",
                         rng.uniform(-0.5, 0.5, size=rows).astype(np.float32))
    if arch == "qwen3":
        for module in ["attn_q_norm", "attn_k_norm"]:
            w.add_tensor(f"blk.0.{module}.weight",
                         rng.uniform(0.5, 1.5, size=HD).astype(np.float32))
    finish(w)
    return mismatches


def main():
    global ggml
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "split").mkdir(exist_ok=True)
    for name in HF_CASES:
        hf_case(name)
    hf_case("qwen2_bias", split=True)
    if "--hf-only" in sys.argv[1:]:
        return 0
    import ggml as ggml_python
    ggml = ggml_python
    ggml.ggml_cpu_init()
    mismatches = []
    for seed, (name, (arch, types)) in enumerate(QUANT_CASES.items()):
        mismatches += quant_case(name, arch, types, seed)
    for m in mismatches:
        print("ggml and gguf-py dequantize differently:", m, file=sys.stderr)
    print("gguf", gguf.__version__ if hasattr(gguf, "__version__") else "", "ggml-python",
          ggml.__version__, "numpy", np.__version__)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
