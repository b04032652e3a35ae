"""CPU checks of peer_matmul_ogs.py: the MXFP4 conversion to triton_kernels' layouts and back, the
arguments, and small layers end to end under the Triton interpreter (in a subprocess: this file run
as a script), against moe_core's fp32 reference.

Needs the extracted triton_kernels (benchmarks/gpu/extract_triton_kernels.sh VLLM_WHEEL .carry/vendor);
skipped without it.

The interpreter cannot run matmul_ogs as it is; the subprocess patches, for itself only: kernel
arguments that are triton_kernels Tensors (passed as their torch storage), triton_kernels'
`specialize` (the interpreter's kernels are not JITFunctions: the original kernel is called with the
constants bound), fixed opt_flags and no-TMA/no-native-MXFP target answers (there is no GPU to ask),
the int32 masks the interpreter makes of `block_mask & scalar_mask` (cast to bool), and
MXFP_BLOCK_SIZE as a plain int. Only the unswizzled (strided) layouts run there: the Hopper value
layout's kernel path is inline PTX, which the interpreter refuses; the Hopper layouts are checked by
the conversion round trip only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
VENDOR = HERE.parent.parent / ".carry" / "vendor" / "triton_kernels"

pytestmark = pytest.mark.skipif(
    not (VENDOR / "matmul_ogs.py").is_file(),
    reason=f"no extracted triton_kernels at {VENDOR} (extract_triton_kernels.sh)",
)


@pytest.fixture(scope="module")
def peer():
    sys.path.insert(0, str(HERE))
    try:
        import peer_matmul_ogs

        peer_matmul_ogs.use_triton_kernels(VENDOR)
        yield peer_matmul_ogs
    finally:
        sys.path.remove(str(HERE))


def _weights(E=5, k=2, K=256, N=192, swiglu=True):
    from moe_core.config import Activation, MoEConfig
    from moe_core.quant import mxfp4_w4a16
    from moe_core.weights.canonical import ExpertWeights

    cfg = MoEConfig(
        num_experts=E,
        top_k=k,
        hidden_size=K,
        intermediate_size=N,
        has_bias=swiglu,
        activation=Activation.swiglu_oai() if swiglu else Activation.silu(),
    )
    return cfg, ExpertWeights.random(cfg, mxfp4_w4a16(), seed=0)


def test_interleave_is_undone_by_the_checkpoint_reader(peer):
    from moe_core.weights.hf import deinterleave_gate_up

    t = torch.arange(2 * 6 * 3).view(2, 6, 3)
    mixed = peer.interleave_gate_up(t)
    assert mixed[0, :, 0].tolist() == [0, 9, 3, 12, 6, 15]  # gate row 0, up row 0, gate row 1, ...
    assert torch.equal(deinterleave_gate_up(mixed, 1), t)


@pytest.mark.parametrize("layouts", ["strided", "hopper"])
def test_conversion_dequantizes_to_the_canonical_values(peer, layouts):
    from moe_core.weights.hf import deinterleave_gate_up

    _, w = _weights(K=96, N=160)  # K/32 = 3 scale groups: the Hopper padding to 4 is exercised
    lay = peer.strided_layouts() if layouts == "strided" else peer.hopper_layouts()
    d13, d2 = w.dequantize()
    for chunk in (None, 2):
        w13 = peer.to_matmul_ogs_mxfp4(
            peer.interleave_gate_up(w.w13), peer.interleave_gate_up(w.w13_scale), lay, chunk
        )
        w2 = peer.to_matmul_ogs_mxfp4(w.w2, w.w2_scale, lay, chunk)
        assert w13[0].shape == [5, 96, 320] and w2[0].shape == [5, 160, 96]  # [E, K, N]: reduction on dim 1
        assert torch.equal(deinterleave_gate_up(peer.dequantize_matmul_ogs(*w13).transpose(1, 2), 1), d13)
        assert torch.equal(peer.dequantize_matmul_ogs(*w2).transpose(1, 2), d2)
    whole = peer.to_matmul_ogs_mxfp4(w.w2, w.w2_scale, lay, None)
    parts = peer.to_matmul_ogs_mxfp4(w.w2, w.w2_scale, lay, 2)
    for a, b in zip(whole, parts):
        assert torch.equal(a.storage.data, b.storage.data)
        assert a.storage.data.stride() == b.storage.data.stride() and a.shape == b.shape


def test_arguments_and_refusals(peer, tmp_path):
    from moe_core.presets import PRESETS

    args = peer.parse_args(
        ["--triton-kernels", str(VENDOR), "--out", str(tmp_path), "--m", "1", "8", "--check"]
    )
    assert args.preset == ["qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b", "qwen3-235b-a22b", "deepseek-v3"]
    assert args.m == [1, 8] and args.check and args.layout == "vllm"
    with pytest.raises(SystemExit):
        peer.parse_args(["--triton-kernels", str(VENDOR), "--out", str(tmp_path), "--m", "0"])
    assert peer.use_triton_kernels(VENDOR.parent).startswith("extracted from vllm-0.26.0")
    assert {name: peer.unsupported(p.config) for name, p in PRESETS.items()} == dict.fromkeys(PRESETS)


@pytest.mark.slow
def test_small_layers_end_to_end_under_the_interpreter():
    proc = subprocess.run(
        [sys.executable, __file__],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("gpt-oss-like", "silu", "grouped sigmoid routing"):
        assert found[name]["err"] < 2e-2, found
        assert found[name]["routing_same_experts"] == 1.0, found
        assert found[name]["routing_max_weight_diff"] < 1e-6, found
    assert found["gpt-oss-like, w13 not interleaved"]["err"] > 0.3, found
    run = found["run"]
    assert run["rc"] == 0 and run["triton_kernels"] == "vllm 0.26.0 third_party", run
    assert [(r["preset"], r["M"]) for r in run["rows"]] == [("tiny", 1), ("tiny", 5)], run
    for row in run["rows"]:
        assert row["us"] == 100.0 and row["timing"] == "stub" and row["err"] < 2e-2, row
        assert (
            row["floor_fraction"] == pytest.approx(row["floor_us"] / row["us"])
            and "silu" in row["activation"]
        )


# ---- the interpreter run (this file as a script, TRITON_INTERPRET=1) -----------------------------


def _patch_for_the_interpreter() -> None:
    import inspect

    import numpy as np
    import triton.runtime.interpreter as interp
    import triton_kernels.matmul_ogs as mo
    import triton_kernels.matmul_ogs_details._matmul_ogs as kernel_module
    import triton_kernels.target_info as target_info
    import triton_kernels.tensor as tk_tensor
    from triton_kernels.matmul_ogs_details.opt_flags import OptFlags

    unwrap = interp._unwrap_tensor
    interp._unwrap_tensor = lambda t: t.storage.data if isinstance(t, tk_tensor.Tensor) else unwrap(t)

    class BoolMasks:
        def __init__(self, inner):
            self.inner = inner

        def load(self, ptrs, mask, other, dtype):
            return self.inner.load(ptrs, mask.astype(bool), other, dtype)

        def store(self, ptrs, value, mask):
            return self.inner.store(ptrs, value, mask.astype(bool))

        def __getattr__(self, name):
            return getattr(self.inner, name)

    interp._interpreter = BoolMasks(interp._interpreter)
    kernel_module.MXFP_BLOCK_SIZE = 32
    tk_tensor.cuda_capability_geq = lambda *a: False  # no TMA
    target_info.has_native_mxfp = lambda: False
    target_info.has_tma_gather = lambda: False
    target_info.num_sms = lambda: 132
    flags = OptFlags(
        block_m=16,
        block_n=64,
        block_k=128,
        num_warps=4,
        num_stages=1,
        group_m=8,
        xcd_swizzle=1,
        w_cache_modifier=None,
        split_k=1,
        is_persistent=False,
        fused_scatter=False,
        idle_sms=0,
        epilogue_subtile=1,
        arch=None,
        target_kernel_kwargs={},
    )
    mo.make_opt_flags = lambda *a, **k: flags

    class Specialized:
        def __init__(self, fn, constants, tuples):
            self.fn, self.constants, self.tuples = fn, constants, tuples
            self.params = list(inspect.signature(fn.fn).parameters)

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                args, call = list(args), {}
                for p in self.params:
                    if p in self.constants:
                        call[p] = self.constants[p]
                    elif p in kwargs:
                        call[p] = kwargs.pop(p)
                    elif p in self.tuples:
                        n = len(self.tuples[p])
                        call[p], args = tuple(args[:n]), args[n:]
                    elif args:
                        call[p] = args.pop(0)
                assert not args, f"{len(args)} arguments left over"
                return self.fn[grid](**call, **kwargs)

            return launch

    mo.specialize = lambda fn, module, constants, tuples, name=None, do_not_specialize=(): Specialized(
        fn, constants, tuples
    )
    np.seterr(all="ignore")


def _interpreter_run() -> dict:
    import dataclasses
    import warnings

    warnings.simplefilter("ignore")
    sys.path.insert(0, str(HERE))
    import peer_matmul_ogs as peer

    from moe_core.config import Routing

    peer.use_triton_kernels(VENDOR)
    _patch_for_the_interpreter()
    gen = torch.Generator().manual_seed(0)
    found = {}
    cfg, w = _weights(E=4, k=2, K=64, N=64)
    silu_cfg, silu_w = _weights(E=8, k=2, K=64, N=96, swiglu=False)
    grouped = dataclasses.replace(silu_cfg, num_experts=16, top_k=4, routing=Routing.deepseek_v3(4, 2, 2.5))
    from moe_core.quant import mxfp4_w4a16
    from moe_core.weights.canonical import ExpertWeights

    grouped_w = ExpertWeights.random(grouped, mxfp4_w4a16(), seed=1)
    bias = torch.randn(16, generator=gen) * 0.1
    for name, c, weights, b in (
        ("gpt-oss-like", cfg, w, None),
        ("silu", silu_cfg, silu_w, None),
        ("grouped sigmoid routing", grouped, grouped_w, bias),
    ):
        layer = peer.MatmulOgsMoE(c, weights, peer.strided_layouts(), b)
        assert layer.fused_routing == (b is None)
        x = torch.randn(7, c.hidden_size, generator=gen).bfloat16()
        logits = torch.randn(7, c.num_experts, generator=gen)
        found[name] = peer.check(layer, weights, x, logits)
        if name == "gpt-oss-like":  # a layout mistake shows: gate and up rows left in canonical order
            layer.w13, layer.pc13.weight_scale = peer.to_matmul_ogs_mxfp4(w.w13, w.w13_scale, layer.layouts)
            found[f"{name}, w13 not interleaved"] = peer.check(layer, weights, x, logits)
    found["run"] = _dry_run(peer)
    return found


def _dry_run(peer) -> dict:
    """peer_matmul_ogs.main on the CPU for the tiny preset, CUDA timing and ceilings stubbed: the cells,
    the check and the JSON it writes."""
    import tempfile

    import moe_core.bench as bench

    bench.measure_ceilings = lambda device, dtype: bench.Ceilings(1e12, {"bfloat16": 1e14}, "bfloat16", 1, 1, None, "stub")
    bench.time_cuda_layer = lambda layer, inputs: ([layer(*inputs[0]) is not None and 1e-4], "stub")
    with tempfile.TemporaryDirectory() as out:
        rc = peer.main(
            [
                "--triton-kernels",
                str(VENDOR),
                "--out",
                out,
                "--preset",
                "tiny",
                "--m",
                "1",
                "5",
                "--check",
                "--device",
                "cpu",
            ]
        )
        return {"rc": rc, **json.loads((Path(out) / "peer_matmul_ogs.json").read_text())}


if __name__ == "__main__":
    print(json.dumps(_interpreter_run()))
