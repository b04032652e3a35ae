"""Experiment: warp-specialized int4 wgmma kernel (moe_w4a16_ws_kernel) vs the shipped configs."""
import sys, time, json
import torch
sys.path.insert(0, "packages/moe-triton/tests")
from moe_triton._details import quant_gemm
from moe_triton.configs import GemmConfig, QuantKernelConfig, lookup_exact
from moe_core.config import Activation, ParallelConfig
from moe_core.quant import int4_w4a16
from moe_triton.quantized import TritonWna16Experts

WS2 = (4, 192, 120, 168, 128)  # two consumers of 128 rows (block_n 256)
WS2S = (4, 192, 120, 168, 64)  # two consumers of 64 rows (block_n 128)
WS4 = (4, 96, 112, 100, 64)  # four consumers of 64 rows (block_n 256)
WS = WS2
mode = sys.argv[1]

def t(bm, bn, w, s, split=1):
    return GemmConfig(bm, bn, split, w, s, swap_ab=True, wgmma=True)

if mode == "check":
    from test_quant import _run, rel_l2
    quant_gemm.WS_EXPERIMENT = WS
    cases = [
        ("g128-silu-64x256", int4_w4a16(128), torch.bfloat16, 2048, 768, Activation.silu(), False, 512, QuantKernelConfig(t(64, 256, 4, 4), t(64, 256, 4, 4)), None),
        ("g128-silu-128x256", int4_w4a16(128), torch.bfloat16, 2048, 768, Activation.silu(), False, 2048, QuantKernelConfig(t(128, 256, 4, 3), t(128, 256, 4, 3)), None),
        ("g64-zp-bias-ktail", int4_w4a16(64, zero_point=True), torch.bfloat16, 2880, 2880, Activation.swiglu_oai(), True, 300, QuantKernelConfig(t(64, 256, 4, 4), t(64, 256, 4, 4)), None),
        ("g32-fp16-split", int4_w4a16(32), torch.float16, 1024, 512, Activation.gelu(), False, 300, QuantKernelConfig(t(64, 256, 4, 4, 2), t(64, 256, 4, 3, 2)), None),
        ("channel-zp-relu2", int4_w4a16(-1, zero_point=True), torch.float16, 1024, 512, Activation.relu2(), False, 200, QuantKernelConfig(t(16, 256, 4, 3), t(16, 256, 4, 3)), None),
        ("ep", int4_w4a16(128), torch.bfloat16, 1024, 512, Activation.silu(), False, 300, QuantKernelConfig(t(64, 256, 4, 3), t(64, 256, 4, 3)), ParallelConfig(ep_size=2, ep_rank=1)),
    ]
    bad = 0
    variants = [("ws2", WS2, 256), ("ws2s", WS2S, 128), ("ws4", WS4, 256)]
    runs = []
    for vname, ws, bn in variants:
        for name, quant, dtype, K, N, act, bias, M, launch, par in cases:
            g1, g2 = launch.gemm1, launch.gemm2
            launch = QuantKernelConfig(t(g1.block_m, bn, 4, g1.num_stages, g1.split_k), t(g2.block_m, bn, 4, g2.num_stages, g2.split_k))
            runs.append((vname + ":" + name, ws, quant, dtype, K, N, act, bias, M, launch, par))
    for name, ws, quant, dtype, K, N, act, bias, M, launch, par in runs:
        quant_gemm.WS_EXPERIMENT = ws
        t0 = time.time()
        out, ref = _run(TritonWna16Experts, quant, act, dtype, K=K, N=N, E=16, topk=4, M=M, bias=bias,
                        override=launch, parallel=par)
        err = rel_l2(out, ref)
        bad += not (err < 1e-2)
        print(f"check {name}: rel_l2 {err:.2e} {'ok' if err < 1e-2 else 'FAIL'} ({time.time() - t0:.1f}s)", flush=True)
    sys.exit(1 if bad else 0)

from moe_core.presets import get_preset
from moe_triton.tune import _random_int4_layer, _graph_time_us
from moe_triton.routing import route
presets = sys.argv[2].split(",")
ms = [int(m) for m in sys.argv[3].split(",")]
dev = torch.device("cuda")
res = {}
for name in presets:
    preset = get_preset(name)
    experts = _random_int4_layer(preset, dev)
    cfg = experts.config
    gen = torch.Generator(device=dev).manual_seed(1)
    bias = torch.randn(cfg.num_experts, device=dev, generator=gen) * 1e-3 if cfg.routing.has_correction_bias else None
    for M in ms:
        x = torch.randn(M, cfg.hidden_size, device=dev, generator=gen).to(cfg.dtype)
        logits = torch.randn(M, cfg.num_experts, device=dev, generator=gen)
        def layer(x=x, logits=logits):
            tw, ti = route(logits, cfg.routing, cfg.top_k, bias)
            return experts.apply(x, tw, ti)
        shipped = lookup_exact(experts.config_key, M).config
        cands = {"shipped": (shipped, None), "old-wgmma-128x256w8s3": (QuantKernelConfig(t(128, 256, 8, 3), t(128, 256, 8, 3)), None)}
        tiles = [(128, 256, 3, WS2), (64, 256, 4, WS2), (128, 128, 4, WS2S), (64, 128, 4, WS2S), (64, 256, 4, WS4), (128, 256, 3, WS4)]
        if M <= 512:
            tiles = [(32, 256, 4, WS2), (32, 128, 4, WS2S), (64, 256, 4, WS2), (64, 128, 4, WS2S), (32, 256, 4, WS4)]
        for bm, bn, st, ws in tiles:
            cands[f"ws{ws[4]}-{bm}x{bn}s{st}"] = (QuantKernelConfig(t(bm, bn, 4, st), t(bm, bn, 4, st)), ws)
        row = {}
        for cname, (c, ws) in cands.items():
            quant_gemm.WS_EXPERIMENT = ws
            experts.config_override = c
            try:
                row[cname] = round(_graph_time_us(layer, 10), 1)
            except Exception as exc:
                row[cname] = f"{type(exc).__name__}: {str(exc)[:100]}"
        quant_gemm.WS_EXPERIMENT = None
        experts.config_override = None
        res[f"{name} M={M}"] = row
        print(name, M, json.dumps(row), flush=True)
    del experts
    torch.cuda.empty_cache()
