"""The fused Triton router against `moe_core.routing.route_torch`, every routing method."""

import pytest
import torch

from moe_core.config import Routing, Scoring
from moe_triton._common.offline_compile import run_compiler_script
from moe_triton.act_quant import QMode, act_quant
from moe_triton.routing import route, route_torch

ROUTINGS = {
    "softmax": (Routing.softmax_topk(False), 16, 4),
    "softmax-renorm": (Routing.softmax_topk(True), 8, 2),
    "softmax-non-pow2-experts": (Routing.softmax_topk(True), 60, 4),
    "sigmoid": (Routing.sigmoid_topk(False), 16, 3),
    "sigmoid-renorm": (Routing.sigmoid_topk(True), 16, 3),
    "llama4": (Routing.llama4(), 16, 1),
    "deepseek-v3": (Routing.deepseek_v3(8, 4, 2.5), 256, 8),
    "grouped-no-renorm": (Routing.deepseek_v3(4, 2, 1.5, renormalize=False), 24, 3),
    "grouped-softmax-no-bias": (Routing(num_expert_groups=6, topk_groups=2), 12, 2),
    "one-expert-groups": (Routing(num_expert_groups=8, topk_groups=4, has_correction_bias=True), 8, 2),
}


@pytest.mark.parametrize("name", list(ROUTINGS))
@pytest.mark.parametrize("M", [1, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_route_torch(name, M, dtype, device):
    routing, E, k = ROUTINGS[name]
    gen = torch.Generator().manual_seed(M * 7 + E)
    if dtype == torch.float32:
        logits = torch.randn(M, E, generator=gen) * 2
    else:  # distinct, exactly representable 16-bit logits: no ties for the two sides to break differently
        logits = torch.stack([torch.randperm(E, generator=gen) for _ in range(M)]).float().sub(E / 2).div(E / 8)
    logits = logits.to(dtype).to(device)
    bias = (torch.randn(E, generator=gen) * 0.1).to(device) if routing.has_correction_bias else None
    w, ids = route(logits, routing, k, bias)
    w_ref, ids_ref = route_torch(logits, routing, k, bias)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w, w_ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["softmax-renorm", "sigmoid", "deepseek-v3"])
def test_many_rows_per_program(name, device):
    # 1030 rows: several rows per program and a partly filled last program.
    routing, E, k = ROUTINGS[name]
    gen = torch.Generator().manual_seed(E)
    logits = (torch.randn(1030, E, generator=gen) * 2).to(device)
    bias = (torch.randn(E, generator=gen) * 0.1).to(device) if routing.has_correction_bias else None
    w, ids = route(logits, routing, k, bias)
    w_ref, ids_ref = route_torch(logits, routing, k, bias)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w, w_ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("routing", [Routing.softmax_topk(False), Routing.sigmoid_topk(False)], ids=["softmax", "sigmoid"])
def test_ties_go_to_the_lower_expert(routing, device):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randint(-2, 2, (40, 32), generator=gen).float().to(device)  # four values: many ties
    w, ids = route(logits, routing, 6)
    scores = torch.softmax(logits, -1) if routing.scoring is Scoring.SOFTMAX else torch.sigmoid(logits)
    expected = torch.sort(-scores, dim=-1, stable=True).indices[:, :6]
    assert torch.equal(ids.long(), expected)
    torch.testing.assert_close(w, scores.gather(1, expected), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("renormalize", [False, True])
def test_softmax_chooses_by_logit_where_probabilities_round_alike(renormalize, device):
    """A softmax over ungrouped experts without a bias ranks the logits (`Routing`): where probabilities
    underflow to equal values, the larger logits are still chosen first, as exact arithmetic would."""
    logits = torch.tensor([[0.0, -200.0, -150.0, -300.0, -120.0, -250.0, -180.0, -90.0],
                           [-300.0, -100.0, 5.0, -100.0, -220.0, -130.0, -99.5, -400.0]], device=device)
    routing = Routing.softmax_topk(renormalize)
    for router in (route, route_torch):
        w, ids = router(logits, routing, 4)
        assert ids.tolist() == [[0, 7, 4, 2], [2, 6, 1, 3]], router.__name__
        torch.testing.assert_close(w, torch.tensor([[1.0, 0, 0, 0], [1.0, 0, 0, 0]], device=device), atol=1e-30, rtol=0)


@pytest.mark.parametrize(("M", "numel"), [(1, 2500), (1030, 7), (0, 300)])
def test_clears_a_buffer_beside_routing(M, numel, device):
    """`zero`: programs of the routing launch beside the routing's fill a buffer that held garbage
    with zeros, past its last whole block too, and the routing is unchanged (one program of rows
    at one token, many at 1030, none at zero tokens)."""
    routing, E, k = ROUTINGS["deepseek-v3"]
    gen = torch.Generator().manual_seed(numel)
    logits = (torch.randn(M, E, generator=gen) * 2).to(device)
    bias = (torch.randn(E, generator=gen) * 0.1).to(device)
    buf = torch.full((numel,), 0x5A5A5A5A, dtype=torch.int32, device=device)
    w, ids = route(logits, routing, k, bias, zero=buf)
    assert not buf.any()
    w_ref, ids_ref = route(logits, routing, k, bias)
    assert torch.equal(ids, ids_ref) and torch.equal(w, w_ref)


@pytest.mark.parametrize(("M", "K", "dtype"), [(1, 2048, torch.bfloat16), (3, 384, torch.float16), (8, 7168, torch.bfloat16)])
def test_quantizes_the_input_beside_routing(M, K, dtype, device):
    """`quantize`: programs of the routing launch write the input's e4m3 codes and per-128 scales,
    code for code those of `act_quant`'s GROUP128 launch (a K that 512 does not divide: a part-filled
    last program), beside a cleared buffer, and the routing is unchanged."""
    routing, E, k = ROUTINGS["deepseek-v3"]
    gen = torch.Generator().manual_seed(K + M)
    logits = (torch.randn(M, E, generator=gen) * 2).to(device)
    bias = (torch.randn(E, generator=gen) * 0.1).to(device)
    x = (torch.randn(M, K, generator=gen) * torch.rand(M, K // 128, 1, generator=gen).repeat_interleave(128, 1)
         .view(M, K) * 8).to(dtype).to(device)
    codes = torch.full((M, K), 0x7F, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    scales = torch.full((M, K // 128), float("nan"), device=device)
    buf = torch.full((3000,), 0x5A5A5A5A, dtype=torch.int32, device=device)
    w, ids = route(logits, routing, k, bias, zero=buf, quantize=(x, codes, scales))
    want_codes, want_scales = act_quant(x, None, QMode.GROUP128, torch.float8_e4m3fn, M)
    assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8))
    assert torch.equal(scales, want_scales)
    assert not buf.any()
    w_ref, ids_ref = route(logits, routing, k, bias)
    assert torch.equal(ids, ids_ref) and torch.equal(w, w_ref)


def test_rejects_what_it_cannot_quantize(device):
    logits = torch.randn(2, 8, device=device)
    x = torch.randn(2, 256, device=device, dtype=torch.bfloat16)
    codes = torch.empty(2, 256, dtype=torch.float8_e4m3fn, device=device)
    scales = torch.empty(2, 2, device=device)
    cases = [((x[:, :200], codes[:, :200], scales[:, :1]), "K a multiple of 128"),
             ((x.float(), codes, scales), "x bf16 or fp16"),
             ((x, codes.view(torch.uint8), scales), "codes float8_e4m3fn"),
             ((x, codes, scales[:, :1]), r"scales float32 \[2, 2\]"),
             ((x[:1], codes[:1], scales[:1]), r"x bf16 or fp16 \[2, K\]")]
    for quantize, message in cases:
        with pytest.raises(ValueError, match=message):
            route(logits, Routing.softmax_topk(True), 2, quantize=quantize)


def test_rejects_a_buffer_it_cannot_clear(device):
    logits = torch.randn(4, 8, device=device)
    for buf in (torch.ones(16, device=device), torch.ones(16, 2, dtype=torch.int32, device=device)[:, 0]):
        with pytest.raises(ValueError, match="zero must be a contiguous int32 tensor"):
            route(logits, Routing.softmax_topk(True), 2, zero=buf)


def test_rejects_bad_input(device):
    logits = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match="top_k"):
        route(logits, Routing.softmax_topk(True), 9)
    with pytest.raises(ValueError, match=r"\[M, E\]"):
        route(logits[0], Routing.softmax_topk(True), 2)
    with pytest.raises(ValueError, match="correction_bias"):
        route(logits, Routing.deepseek_v3(2, 1, 1.0), 2)
    with pytest.raises(ValueError, match="has_correction_bias is False"):
        route(logits, Routing.softmax_topk(True), 2, torch.zeros(8, device=device))
    with pytest.raises(ValueError, match="floating point"):
        route(logits.int(), Routing.softmax_topk(True), 2)


@pytest.mark.device("cuda")
@pytest.mark.parametrize("M", [1, 8192])
def test_deepseek_and_qwen_shapes_on_gpu(M):
    gen = torch.Generator().manual_seed(M)
    for routing, E, k in ((Routing.deepseek_v3(8, 4, 2.5), 256, 8), (Routing.softmax_topk(True), 128, 8)):
        logits = torch.randn(M, E, generator=gen).cuda()  # fp32: no ties at this size
        bias = torch.randn(E, generator=gen).cuda() * 0.1 if routing.has_correction_bias else None
        w, ids = route(logits, routing, k, bias)
        w_ref, ids_ref = route_torch(logits, routing, k, bias)
        assert torch.equal(ids, ids_ref)
        torch.testing.assert_close(w, w_ref, atol=1e-6, rtol=1e-5)


_COMPILE_ROUTE = """
from moe_triton._common.offline_compile import compile_kernel
from moe_triton.routing_details._kernel import _route_kernel
ptrs = {"logits_ptr": "*bf16", "bias_ptr": "*fp32", "weights_ptr": "*fp32", "ids_ptr": "*i32", "zero_ptr": "*i32",
        "x_ptr": "*bf16", "xq_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "renormalize_eps": "fp32", "scaling": "fp32"}
for grouped in (False, True):
    compile_kernel(_route_kernel, dict(TOP_K=8, K_P2=8, SOFTMAX=not grouped, HAS_BIAS=grouped, GROUPS=8 if grouped else 1,
                                       G_P2=8 if grouped else 1, PER_GROUP=32 if grouped else 128,
                                       PG_P2=32 if grouped else 128, TOPK_GROUPS=4 if grouped else 1,
                                       RENORMALIZE=True, SCALE=grouped, BLOCK_M=1, ZERO_BLOCK=1024 if grouped else 0,
                                       QUANT_BLOCK=512 if grouped else 0, INTERPRET=False, LAUNCH_DEPENDENTS=True, TRACE=False),
                   ptrs,
                   num_warps=1)
print("built")
"""


def test_kernel_compiles_for_hopper():
    """Triton's compiler on the router for sm_90 with its dependent-launch trigger, which the
    interpreter never runs, with and without its quantizing and zeroing programs (in a child process,
    since this module may interpret the kernel)."""
    assert run_compiler_script(_COMPILE_ROUTE).split() == ["built"]


def test_fused_layers_of_every_triton_class_route_with_this_router():
    """FusedMoE (and the conformance suite) route with the router an experts class names
    (`oracle.router_of`). Every class this distribution registers names this one; the quantized
    classes once named none, so int4, fp8 and mxfp4 layers routed with moe_core's torch reference,
    several launches per call."""
    from moe_core.oracle import router_of
    from moe_core.plugins import registry
    from moe_triton._plugin import backend_spec

    classes = [registry().resolve(ref) for ref in backend_spec().experts]
    assert {cls.__name__ for cls in classes} == {"TritonExperts", "TritonWna16Experts", "TritonFp8Experts",
                                                "TritonMxfp4Experts"}
    for cls in classes:
        assert router_of(cls) is route, cls.__name__


INF = float("inf")


def _infinite_rows(E: int, seed: int) -> torch.Tensor:
    """One +Inf; three +Inf; all -Inf; all +Inf; every other expert -Inf; all but one -Inf (fewer
    possible experts than k: -Inf ones fill the slots); then a finite row."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(7, E, generator=gen) * 2
    logits[0, 3] = INF
    logits[1, [1, E // 2, E - 1]] = INF
    logits[2] = -INF
    logits[3] = INF
    logits[4, ::2] = -INF
    logits[5, :E - 1] = -INF
    return logits


@pytest.mark.parametrize("name", list(ROUTINGS))
def test_infinite_logits_route_as_route_torch(name, device):
    """+Inf chooses its expert (several share the weight; lower ids first), a row of -Inf chooses
    none (the k lowest ids, weight 0): the same ids and weights as route_torch, and never NaN."""
    routing, E, k = ROUTINGS[name]
    logits = _infinite_rows(E, E).to(device)
    gen = torch.Generator().manual_seed(1)
    bias = (torch.randn(E, generator=gen) * 0.1).to(device) if routing.has_correction_bias else None
    w, ids = route(logits, routing, k, bias)
    w_ref, ids_ref = route_torch(logits, routing, k, bias)
    assert torch.isfinite(w).all()
    torch.testing.assert_close(w, w_ref, atol=1e-6, rtol=1e-5)
    assert torch.equal(ids, ids_ref)
    assert torch.equal(ids[2].cpu(), torch.arange(k, dtype=torch.int32)) and not w[2].any()
    assert 3 in ids[0].tolist()
