#!/usr/bin/env python3
"""PyTorch's own error in bfloat16 on each Hugging Face fixture: writes
tests/fixtures/hf/<case>/torch_bf16.json, which tests/hf_bf16.rs compares the crate's bfloat16
layers against. Run by hand (not by CI), from the repository root:

    source ~/.cache/mha-pytorch-cpu/bin/activate      # see ../../../shared/pytorch-cpu/
    nice -n 19 python dev/hf_fixtures/bf16_error.py [case ...]

Per case it builds the family's model as generate.py does (the same config.json, the fixture's
float32 weights from model.safetensors), converts it to torch.bfloat16, and runs the attention
module on the fixture's x rounded to bfloat16 (mask, cos/sin and ALiBi from the model's own
forward in bfloat16, as generate.py captures them), the eager attention (every matmul and the
softmax in bfloat16 as transformers' eager code runs them). The error is against the fixture's
float64 `expected`: max |out - expected| over all outputs, its root mean square, and max
|expected|.
"""

import json
import os
import sys

import numpy as np
import safetensors.numpy
import torch

sys.path.insert(0, os.path.dirname(__file__))
import generate as G  # noqa: E402


def run_bf16(case, case_dir, x32, pos):
    fam = G.FAMILIES[case["family"]]
    weights = safetensors.numpy.load_file(os.path.join(case_dir, "model.safetensors"))
    with torch.no_grad():
        model = G.build_model(case, os.path.join(case_dir, "config.json"))
        sd = model.state_dict()
        for k, w in weights.items():
            sd[k].copy_(torch.from_numpy(w.astype(np.float64)))
        model = model.to(torch.bfloat16)
        attn = fam["attn"](model, case.get("layer", 0))
        x = torch.from_numpy(x32).to(torch.bfloat16)
        position_ids = torch.from_numpy(pos)
        b, t, _ = x.shape
        if case.get("model_inputs"):
            args = G.captured_inputs(case, model, attn, x, position_ids)
            args["hidden_states"] = x
            if "residual" in args:
                args["residual"] = torch.zeros_like(x)
            out = attn(**args)[0]
        else:
            mask = torch.zeros(b, 1, t, t, dtype=torch.bfloat16)
            mask.masked_fill_(torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1),
                              torch.finfo(torch.bfloat16).min)
            if fam["rotary"] is None:
                out = attn(hidden_states=x, attention_mask=mask, position_ids=position_ids)[0]
            else:
                cos, sin = fam["rotary"](model)(x, position_ids)
                out = attn(hidden_states=x, position_embeddings=(cos, sin), attention_mask=mask)[0]
        assert out.dtype == torch.bfloat16, out.dtype
        return out.float().numpy().astype(np.float64)


def main():
    only = set(sys.argv[1:])
    torch.set_num_threads(1)
    cases = {c["name"]: c for c in G.CASES}
    for name in sorted(os.listdir(G.OUT)):
        if (only and name not in only) or name not in cases:
            continue
        case_dir = os.path.join(G.OUT, name)
        io = safetensors.numpy.load_file(os.path.join(case_dir, "io.safetensors"))
        try:
            out = run_bf16(cases[name], case_dir, io["x"], io["position_ids"])
        except Exception as e:  # a family whose bfloat16 path transformers does not run
            print(f"{name:22} skipped: {type(e).__name__}: {e}")
            continue
        expected = io["expected"]
        result = {
            "torch": torch.__version__,
            "max_abs_error": float(np.max(np.abs(out - expected))),
            "rms_error": float(np.sqrt(np.mean((out - expected) ** 2))),
            "max_abs_expected": float(np.max(np.abs(expected))),
        }
        with open(os.path.join(case_dir, "torch_bf16.json"), "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"{name:22} torch bf16 max error {result['max_abs_error']:.3e} "
              f"rms {result['rms_error']:.3e} "
              f"(max |expected| {result['max_abs_expected']:.3e})")


if __name__ == "__main__":
    main()
