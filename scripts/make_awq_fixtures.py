"""Golden AWQ (GEMM) fixture for moe-core's checkpoint reader, packed by AutoAWQ's own code.

Writes packages/moe-core/tests/fixtures/awq/: model/ (a two-expert Qwen3-MoE-style layer whose expert
projections were packed by `awq.modules.linear.gemm.WQLinear_GEMM.from_linear`, and its config.json
with the `quantization_config` AutoAWQ's `to_transformers_dict` writes), and reference.safetensors with
the fp32 weights AutoAWQ's own `awq.utils.packing_utils.dequantize_gemm` recovers from the packed
tensors, which the reader's tests compare against.

AutoAWQ needs its own environment (it pins torch/transformers and pulls triton):

    uv venv /tmp/awqenv && uv pip install --python /tmp/awqenv autoawq==0.2.9 safetensors
    /tmp/awqenv/bin/python scripts/make_awq_fixtures.py
"""

import json
from pathlib import Path

import torch
from awq.modules.linear.gemm import WQLinear_GEMM
from awq.utils.packing_utils import dequantize_gemm
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parents[1] / "packages/moe-core/tests/fixtures/awq"
NUM_EXPERTS, HIDDEN, INTERMEDIATE, GROUP, BITS = 2, 64, 32, 32, 4
PREFIX = "model.layers.0.mlp"


def pack_projection(gen: torch.Generator, out_features: int, in_features: int) -> dict[str, torch.Tensor]:
    # Weights built from known integer codes, so AutoAWQ's rounding reproduces them exactly.
    groups = in_features // GROUP
    codes = torch.randint(0, 16, (out_features, in_features), generator=gen)
    zeros = torch.randint(0, 16, (groups, out_features), generator=gen)  # AutoAWQ passes [K/g, N]
    scales = (torch.rand(groups, out_features, generator=gen) * 0.02 + 0.005).half().float()
    weight = (codes - zeros.t().repeat_interleave(GROUP, 1)) * scales.t().repeat_interleave(GROUP, 1)
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    linear.weight.data = weight
    q = WQLinear_GEMM.from_linear(linear, BITS, GROUP, scales=scales, zeros=zeros)
    recovered = dequantize_gemm(q.qweight, q.qzeros, q.scales, BITS, GROUP)  # fp16 [in, out]
    # dequantize_gemm multiplies in fp16, so its values match ours to fp16 rounding only.
    assert torch.allclose(recovered.float(), weight.t(), rtol=1e-3, atol=1e-5), "AutoAWQ round trip lost the codes"
    return {"qweight": q.qweight, "qzeros": q.qzeros, "scales": q.scales, "reference": recovered}


def main() -> None:
    gen = torch.Generator().manual_seed(20261121)
    tensors, reference = {}, {}
    shapes = {"gate_proj": (INTERMEDIATE, HIDDEN), "up_proj": (INTERMEDIATE, HIDDEN), "down_proj": (HIDDEN, INTERMEDIATE)}
    for e in range(NUM_EXPERTS):
        for proj, (out_f, in_f) in shapes.items():
            packed = pack_projection(gen, out_f, in_f)
            name = f"{PREFIX}.experts.{e}.{proj}"
            reference[f"{name}.weight"] = packed.pop("reference").t().contiguous()  # nn.Linear [out, in]
            tensors.update({f"{name}.{k}": v.contiguous() for k, v in packed.items()})
    tensors[f"{PREFIX}.gate.weight"] = (torch.randn(NUM_EXPERTS, HIDDEN, generator=gen) * 0.1).half()
    (OUT / "model").mkdir(parents=True, exist_ok=True)
    save_file(tensors, OUT / "model" / "model.safetensors")
    save_file(reference, OUT / "reference.safetensors")
    config = {
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 1,
        "hidden_size": HIDDEN, "moe_intermediate_size": INTERMEDIATE, "num_experts": NUM_EXPERTS,
        "num_experts_per_tok": 1, "norm_topk_prob": True, "hidden_act": "silu", "torch_dtype": "float16",
        "quantization_config": {"quant_method": "awq", "zero_point": True, "group_size": GROUP, "bits": BITS,
                                "version": "gemm", "modules_to_not_convert": None},
    }
    (OUT / "model" / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
