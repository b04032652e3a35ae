"""The layer where users call it: torch.compile (the custom op), CUDA graphs of eager calls, reloads
racing with calls, state dicts of fused models.

CPU (CI): `torch._dynamo.explain` finds no graph break in a bare `FusedMoE` nor in a tiny transformers
model `fuse()` made, and `torch.compile(fullgraph=True)` of each equals eager; copies of a layer get
their own op key; a call during a reload sees the whole new load; a fused model's state dict carries
its experts. GPU (`device("cuda")`): eager calls replayed from their graphs equal the plain calls and
never overwrite outputs a caller holds; a reload drops the graphs; a graph memory pool dies with its
graphs; compile, reduce-overhead and the caller's own CUDA graph capture serve every triton scheme
and torch grouped GEMM.
"""

from __future__ import annotations

import copy
import pickle
import threading

import pytest
import torch

from moe_core import ExpertWeights, FusedMoE, MoEConfig, Routing
from moe_core.quant import fp8_w8a8, int4_w4a16, mxfp4_w4a16, unquantized

TINY = MoEConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64,
                 routing=Routing.softmax_topk(renormalize=True), dtype=torch.float32)


def _layer(backend: str = "cpu", config: MoEConfig = TINY, quant=None, device: str = "cpu", seed: int = 0,
           **kwargs) -> FusedMoE:
    layer = FusedMoE(config, quant, device=device, prefer=backend, **kwargs)
    layer.load_weights(ExpertWeights.random(config, layer.quant, seed=seed, device=device))
    return layer


def _inputs(config: MoEConfig, tokens: int, device: str = "cpu", seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(tokens, config.hidden_size, generator=gen, device=device).to(config.dtype),
            torch.randn(tokens, config.num_experts, generator=gen, device=device))


def _graph_breaks(fn, *args) -> tuple[int, list[str]]:
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args)
    return explained.graph_break_count, [str(r.reason)[:300] for r in explained.break_reasons]


@torch.no_grad()
def test_bare_layer_compiles_as_one_op_without_graph_breaks():
    layer = _layer()
    x, logits = _inputs(TINY, 5)
    eager = layer(x, logits)
    assert _graph_breaks(layer, x, logits) == (0, [])
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    torch.testing.assert_close(compiled(x, logits), eager, rtol=0, atol=0)
    x2, logits2 = _inputs(TINY, 9, seed=1)  # another token count: recompiled or dynamic, same answer
    torch.testing.assert_close(compiled(x2, logits2), layer(x2, logits2), rtol=0, atol=0)


@torch.no_grad()
def test_compiled_layer_keeps_its_input_checks_at_trace_time():
    layer = _layer()
    x, logits = _inputs(TINY, 4)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    with pytest.raises(Exception, match=r"router_logits must be \[4, 8\]"):
        compiled(x, logits[:, :6])


@torch.no_grad()
def test_fused_transformers_model_compiles_without_graph_breaks():
    from test_transformers_models import build_model

    from moe_core.integrations.transformers import fuse

    model = build_model("qwen3_moe", torch.float32, seed=0)
    ids = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    fuse(model, prefer="cpu")
    eager = model(ids).logits
    breaks, reasons = _graph_breaks(model, ids)
    assert breaks == 0, reasons
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(ids).logits, eager, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_copies_of_a_layer_are_registered_apart():
    layer = _layer("reference")
    x, logits = _inputs(TINY, 3)
    for twin in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert twin._op_key != layer._op_key
        torch.testing.assert_close(twin(x, logits), layer(x, logits), rtol=0, atol=0)
        twin.load_weights(ExpertWeights.random(TINY, twin.quant, seed=5))
        assert not torch.equal(twin(x, logits), layer(x, logits))  # its own weights, not the original's
        torch.testing.assert_close(torch.ops.moe_core.fused_moe(x, logits, twin._op_key), twin(x, logits))


def test_the_op_names_a_layer_that_is_gone():
    layer = _layer("reference")
    key = layer._op_key
    x, logits = _inputs(TINY, 2)
    del layer
    import gc

    gc.collect()
    with pytest.raises(RuntimeError, match="no live FusedMoE is registered"):
        torch.ops.moe_core.fused_moe(x, logits, key)


def test_a_call_during_a_reload_sees_the_whole_new_load():
    """A call made while load_weights is between the new weights and the new correction bias waits,
    and then sees both: never load B's weights with load A's bias."""
    config = MoEConfig(num_experts=16, top_k=4, hidden_size=64, intermediate_size=32,
                       routing=Routing.deepseek_v3(4, 2, 2.5), dtype=torch.float32)
    layer = FusedMoE(config, device="cpu", prefer="reference")
    loads = [(ExpertWeights.random(config, layer.quant, seed=s),
              torch.randn(16, generator=torch.Generator().manual_seed(s))) for s in (1, 2)]
    x, logits = _inputs(config, 6)
    expected = []
    with torch.no_grad():
        for weights, bias in loads:
            layer.load_weights(weights, bias)
            expected.append(layer(x, logits))
    assert not torch.equal(*expected)
    layer.load_weights(*loads[0])
    converted, proceed = threading.Event(), threading.Event()
    convert = layer.experts.load_weights

    def paused_convert(weights):  # the new weights are in place; the bias is not yet
        convert(weights)
        converted.set()
        proceed.wait(5)

    layer.experts.load_weights = paused_convert
    reload = threading.Thread(target=layer.load_weights, args=loads[1])
    reload.start()
    assert converted.wait(5)
    seen = []
    call = threading.Thread(target=lambda: seen.append(layer(x, logits).detach()))
    call.start()
    call.join(0.3)  # it must be waiting for the reload
    proceed.set()
    reload.join()
    call.join()
    torch.testing.assert_close(seen[0], expected[1], rtol=0, atol=0)


# ---- on the GPU --------------------------------------------------------------------------------------

GPU_CASES = {
    # name: (backend, quant, config)
    "triton-bf16": ("triton", unquantized(), MoEConfig(num_experts=32, top_k=4, hidden_size=512, intermediate_size=256,
                                                       routing=Routing.softmax_topk(True))),
    "triton-int4": ("triton", int4_w4a16(128), MoEConfig(num_experts=32, top_k=4, hidden_size=512,
                                                         intermediate_size=256, routing=Routing.softmax_topk(True))),
    "triton-fp8-block": ("triton", fp8_w8a8("block"), MoEConfig(num_experts=32, top_k=4, hidden_size=512,
                                                                intermediate_size=256,
                                                                routing=Routing.deepseek_v3(8, 4, 2.5))),
    "triton-mxfp4": ("triton", mxfp4_w4a16(), MoEConfig(num_experts=32, top_k=4, hidden_size=512, intermediate_size=256,
                                                        routing=Routing.softmax_topk(True))),
    "torch-grouped-mm": ("torch_grouped_mm", unquantized(), MoEConfig(num_experts=32, top_k=4, hidden_size=512,
                                                                      intermediate_size=256,
                                                                      routing=Routing.softmax_topk(True))),
}


def _gpu_layer(name: str, seed: int = 0, **kwargs) -> FusedMoE:
    backend, quant, config = GPU_CASES[name]
    if backend == "torch_grouped_mm" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("torch grouped GEMM serves sm_90 and later")
    layer = FusedMoE(config, quant, device="cuda", prefer=backend, **kwargs)
    bias = torch.randn(config.num_experts, device="cuda") * 1e-3 if config.routing.has_correction_bias else None
    layer.load_weights(ExpertWeights.random(config, layer.quant, seed=seed, device="cuda"), bias)
    return layer


@pytest.mark.device("cuda")
@pytest.mark.parametrize("name", list(GPU_CASES))
@torch.no_grad()
def test_eager_calls_replayed_from_graphs_equal_plain_calls(name):
    graphed = _gpu_layer(name)
    plain = copy.deepcopy(graphed)
    plain._graphs = None  # the same weights, every call eager
    tol = _tolerance(graphed)
    for tokens in (1, 8, 64):
        for seed in range(3):  # eager, captured, replayed: each output dropped before the next call
            x, logits = _inputs(graphed.config, tokens, "cuda", seed=seed)
            torch.testing.assert_close(graphed(x, logits), plain(x, logits), **tol)
    assert len(graphed._graphs) == 3  # one graph per token count, captured on its second call
    # Dense inputs are copied by the graphs themselves, re-pointed at each call's tensors.
    assert all(g.point_inputs is not None for sig in graphed._graphs._signatures.values() for g in sig.graphs)
    # Outputs a caller keeps are never overwritten: more graphs of the signature, then eager calls.
    calls = [_inputs(graphed.config, 8, "cuda", seed=20 + i) for i in range(7)]
    kept = [graphed(x, logits) for x, logits in calls]
    for out, (x, logits) in zip(kept, calls):
        torch.testing.assert_close(out, plain(x, logits), **tol)
    assert len(graphed._graphs) == 3 + 3  # the signature's ring filled up (4 graphs)
    first_kept = kept[0].clone()
    for layer in (graphed, plain):
        layer.load_weights(ExpertWeights.random(graphed.config, graphed.quant, seed=7, device="cuda"),
                           graphed.correction_bias)
    for _ in range(3):
        x, logits = _inputs(graphed.config, 8, "cuda", seed=11)
        torch.testing.assert_close(graphed(x, logits), plain(x, logits), **tol)
    assert len(graphed._graphs) == 1  # the old weights' graphs dropped; one for the new ones
    torch.testing.assert_close(kept[0], first_kept, rtol=0, atol=0)  # dropped graphs leave kept outputs alone


@pytest.mark.device("cuda")
@torch.no_grad()
def test_the_graph_input_copy_kernel_copies_every_byte_wherever_it_is_pointed():
    """The copy node (`moe_core._graph_copy`) in a captured graph, re-pointed at other tensors between
    replays: sizes that are whole 16-byte vectors and sizes that are not, sources 2 bytes off a
    16-byte boundary (bytewise path), one input larger than the kernel's grid covers in one step."""
    from moe_core._graph_copy import CopyKernels

    gen = torch.Generator(device="cuda").manual_seed(3)

    def fresh():
        big = torch.randn(2048, 7168, generator=gen, device="cuda").bfloat16()  # 29 MB: grid-stride steps
        odd = torch.randn(5, 7, generator=gen, device="cuda")  # 140 bytes: not whole vectors
        flat = torch.randn(4097, generator=gen, device="cuda").bfloat16()
        shifted = flat[1:]  # starts 2 bytes past its allocation: not 16-byte aligned
        return big, odd, shifted

    first = fresh()
    statics = tuple(torch.empty_like(t) for t in first)
    copies = CopyKernels()
    assert copies.prepare(statics[0].device, len(statics))
    sink = torch.empty(3, device="cuda")
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        copies.launch(statics, first)  # warm, outside the capture
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        copies.launch(statics, first)
        torch.stack([s.float().sum() for s in statics], out=sink)
    graph.instantiate()
    point = copies.pointer(graph, statics)
    for inputs in (first, fresh(), fresh(), first):
        for s in statics:
            s.zero_()
        point(inputs)
        graph.replay()
        torch.cuda.synchronize()
        for static, t in zip(statics, inputs):
            assert torch.equal(static, t)
        torch.testing.assert_close(sink, torch.stack([t.float().sum() for t in inputs]))


@pytest.mark.device("cuda")
@torch.no_grad()
def test_graphed_calls_of_strided_inputs_equal_plain_calls():
    """Inputs that are views with gaps are copied in before the replay, not by the graph."""
    graphed = _gpu_layer("triton-bf16")
    plain = copy.deepcopy(graphed)
    plain._graphs = None
    H, E = graphed.config.hidden_size, graphed.config.num_experts
    for seed in range(3):
        x, logits = _inputs(graphed.config, 8, "cuda", seed=seed)
        wide = torch.cat([x, x], dim=1)[:, :H]  # rows 2H apart
        assert not wide.is_contiguous()
        torch.testing.assert_close(graphed(wide, logits[:, :E]), plain(x, logits), rtol=0, atol=0)
    assert len(graphed._graphs) == 1
    (sig,) = graphed._graphs._signatures.values()
    assert not sig.copies_in_graph and sig.graphs[0].point_inputs is None


@pytest.mark.device("cuda")
@torch.no_grad()
def test_a_layer_called_while_another_device_is_current_captures_on_its_own(caplog):
    """As under accelerate's device_map: the layer on cuda:0 called while cuda:1 is current."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    graphed = _gpu_layer("triton-bf16")
    plain = copy.deepcopy(graphed)
    plain._graphs = None
    with torch.cuda.device(1):
        for seed in range(3):
            x, logits = _inputs(graphed.config, 8, "cuda:0", seed=seed)
            torch.testing.assert_close(graphed(x, logits), plain(x, logits), rtol=0, atol=0)
    assert len(graphed._graphs) == 1
    assert "capturing them in a CUDA graph failed" not in caplog.text
    x, logits = _inputs(graphed.config, 8, "cuda:1", seed=0)
    with pytest.raises(ValueError, match="hidden_states is on cuda:1, the layer on cuda:0"):
        graphed(x, logits)


def _tolerance(layer: FusedMoE) -> dict:
    """Exact for 16-bit weights; quantized GEMMs sum split-K parts and top-k choices with fp32 atomics,
    in whichever order the programs finish: one bf16 rounding step apart."""
    return dict(rtol=0, atol=0) if not layer.quant.weight.quantized else dict(rtol=1.6e-2, atol=1e-2)


@pytest.mark.device("cuda")
@pytest.mark.parametrize("name", list(GPU_CASES))
@torch.no_grad()
def test_compile_reduce_overhead_and_caller_graphs_on_gpu(name):
    layer = _gpu_layer(name)
    x, logits = _inputs(layer.config, 16, "cuda", seed=3)
    eager = layer(x, logits)
    assert _graph_breaks(layer, x, logits) == (0, [])
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        compiled = torch.compile(layer, fullgraph=True, mode=mode)
        for _ in range(3):  # reduce-overhead records its CUDA graph on a later call
            torch.testing.assert_close(compiled(x, logits), eager, **_tolerance(layer))
    static_x, static_logits = x.clone(), logits.clone()
    layer(static_x, static_logits)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(static_x, static_logits)
    x2, logits2 = _inputs(layer.config, 16, "cuda", seed=4)
    static_x.copy_(x2)
    static_logits.copy_(logits2)
    graph.replay()
    torch.testing.assert_close(out, layer(x2, logits2), **_tolerance(layer))


@pytest.mark.device("cuda")
@torch.no_grad()
def test_fused_model_compiles_and_replays_on_gpu():
    from test_transformers_models import build_model

    from moe_core.integrations.transformers import fuse

    model = build_model("qwen3_moe", torch.bfloat16, seed=0).cuda()
    ids = torch.randint(0, 100, (2, 6), device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    fuse(model, prefer="triton")
    eager = [model(ids).logits for _ in range(3)]  # the third call replays each block's graph
    torch.testing.assert_close(eager[2], eager[0], rtol=0, atol=0)
    blocks = [m for m in model.modules() if type(m).__name__ == "FusedMoEBlock"]
    assert blocks and all(len(b._graphs) == 1 for b in blocks)
    assert all(len(b.moe._graphs) == 0 for b in blocks)  # the layer runs plain inside its block's graph
    breaks, reasons = _graph_breaks(model, ids)
    assert breaks == 0, reasons
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    for _ in range(3):
        torch.testing.assert_close(compiled(ids).logits, eager[0], rtol=2e-2, atol=2e-2)
    assert all(len(b.moe._graphs) == 1 for b in blocks)  # compiled, each layer op replays its own graph


@pytest.mark.device("cuda")
@torch.no_grad()
def test_generate_compiled_in_reduce_overhead_mode_on_gpu():
    """transformers' compiled decode: a static cache, and generate compiling the model's call in
    mode="reduce-overhead" (inductor's CUDA graph trees, whose warm-ups allocate from their own pool).
    The layers' ops run plain while the trees warm up and record (no graph of their own), and the
    replayed decode matches eager decode."""
    from test_transformers_models import build_model
    from transformers import CompileConfig

    from moe_core.integrations.transformers import fuse

    model = build_model("qwen3_moe", torch.bfloat16, seed=0).cuda()
    fuse(model, prefer="triton")
    ids = torch.randint(0, 100, (1, 6), device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))

    def generate():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6,
                              do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)

    eager = generate()
    model.generation_config.cache_implementation = "static"
    model.generation_config.compile_config = CompileConfig(mode="reduce-overhead")
    torch._dynamo.reset()
    for _ in range(3):  # the trees warm up and record over the first calls, then replay
        compiled = generate()
    assert hasattr(model, "_compiled_call")  # generate compiled its decode
    blocks = [m for m in model.modules() if type(m).__name__ == "FusedMoEBlock"]
    assert blocks and all(len(b.moe._graphs) == 0 for b in blocks)
    for ours, theirs in zip(compiled.logits, eager.logits):  # up to the first token a near-tie turns
        torch.testing.assert_close(ours, theirs, rtol=2e-2, atol=2e-2)
        if not torch.equal(ours.argmax(-1), theirs.argmax(-1)):
            break


@pytest.mark.device("cuda")
@torch.no_grad()
def test_graphs_capture_again_after_every_earlier_graph_is_gone(caplog):
    """A graph memory pool dies with its last graph; the next capture must not reuse it."""
    import gc

    for seed in range(2):
        layer = _gpu_layer("triton-bf16", seed=seed)
        x, logits = _inputs(layer.config, 4, "cuda", seed=seed)
        for _ in range(3):
            layer(x, logits)
        assert len(layer._graphs) == 1
        del layer
        gc.collect()
    assert "capturing them in a CUDA graph failed" not in caplog.text


def test_fuse_of_mixed_dtype_experts_says_how_to_fix_it():
    from test_transformers_models import build_model

    from moe_core.integrations.transformers import UnsupportedModelError, fuse

    model = build_model("qwen3_moe", torch.float32, seed=0)
    experts = next(m for m in model.modules() if type(m).__name__ == "Qwen3MoeExperts")
    experts.down_proj.data = experts.down_proj.data.to(torch.float16)
    with pytest.raises(UnsupportedModelError, match=r"mixed dtypes \(float16, float32\).*model.to\(torch.bfloat16\)"):
        fuse(model, prefer="cpu")


@torch.no_grad()
def test_a_fused_models_state_dict_carries_its_experts(tmp_path):
    """state_dict() holds each layer's experts in its kernel layout: torch.save and load_state_dict into a
    model fused the same way give the same logits; an unfused model or another layout refuse it."""
    from test_transformers_models import build_model

    from moe_core.integrations.transformers import fuse

    ids = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    for prefer, dtype in (("cpu", torch.bfloat16), ("reference", torch.float32)):  # oneDNN's opaque tensors too
        source = build_model("qwen3_moe", dtype, seed=0)
        fuse(source, prefer=prefer)
        want = source(ids).logits
        path = tmp_path / f"{prefer}.pt"
        torch.save(source.state_dict(), path)
        target = build_model("qwen3_moe", dtype, seed=1)  # other weights everywhere
        fuse(target, prefer=prefer)
        assert not torch.equal(target(ids).logits, want)
        target.load_state_dict(torch.load(path, weights_only=False))
        torch.testing.assert_close(target(ids).logits, want, rtol=0, atol=0)
    unfused = build_model("qwen3_moe", torch.float32, seed=1)
    with pytest.raises(RuntimeError, match="_extra_state"):
        unfused.load_state_dict(torch.load(tmp_path / "reference.pt", weights_only=False))
    other = build_model("qwen3_moe", torch.float32, seed=1)
    fuse(other, prefer="cpu")
    with pytest.raises(ValueError, match=r"was saved from .*ReferenceExperts.*this layer is .*Cpu"):
        other.load_state_dict(torch.load(tmp_path / "reference.pt", weights_only=False))
