"""Parity of `moe_core.integrations.transformers.fuse` against the models' own eager MoE blocks.

Each architecture is a tiny model built from its real transformers config class and randomly
initialized (initializer_range=0.1 so routing is far from uniform and the experts matter; the
zero-initialized biases and DeepSeek-V3's correction bias are redrawn so they take part). The same
model runs eager (`experts_implementation="eager"`: transformers' per-expert loop), is fused in place,
and runs again on the same fresh random token ids. Two checks, both by relative L2 error
||fused - eager|| / ||eager||:

- every fused block against the eager block it replaced, on fresh random hidden states;
- the model's logits, at the positions no routing slip reached (below).

Tolerances per dtype (relative L2):
- fp32: 1e-4. Both sides compute in fp32; only summation order differs (measured 0 to 3e-7).
- bf16: 2e-2 (measured 3e-3 to 6e-3 per block, 5e-3 to 8e-3 on logits). The eager blocks round each expert's weighted output to bf16 and accumulate in bf16
  (Qwen/OLMoE also round the routing weights to bf16, gpt-oss takes its softmax in bf16), while
  `FusedMoE` keeps routing weights in fp32 and the backends accumulate in fp32: each side carries
  a few bf16 ulps (2**-8 = 3.9e-3 relative) per block, compounded over two or three layers and the
  LM head. The fp32 runs pin the semantics.

Routing slips. Forward hooks record which experts each run picked: the eager model's router
outputs, and the ids each fused layer's `FusedMoE.route` computes from the logits it receives. In bf16 the second MoE layer's input differs by those few ulps, and a token whose
k-th and (k+1)-th router scores nearly tie can pick another expert in one run (seen on an H100 for
mixtral: logits off by 5.8e-2 while every block matched). Such a token's output differs by order 1,
and causal attention carries that to the later positions of its sequence, so the logits are
compared at the positions before each sequence's first slip. fp32 must have no slip at all, and in
bf16 at most 1 in 10 (token, layer) routings may slip and at least a quarter of the positions must
remain, so a routing bug cannot hide behind the exclusion.

Backends: `prefer="reference"` (moe-core's fp32 reference, always available) and the oracle's
default selection. The default case passes when the oracle picks a backend; when it picks none it
fails if a distribution that should serve the device is installed (e.g. moe-cpu on CPU), with the
candidate table, and otherwise skips with the reason. The cuda variant runs the same parity on a
GPU (marker `device("cuda")`, see integration/conftest.py).
"""

from __future__ import annotations

import zlib

import pytest
import torch
import transformers
from torch import nn

from _parity import record_fused_routing, relative_l2, unslipped_positions
from moe_core import BackendUnavailableError, ExpertWeights, NoBackendError
from moe_core.backends import detect_device
from moe_core.integrations._descriptors import ExpertsLayout
from moe_core.integrations.transformers import FusedMoEBlock, UnsupportedModelError, fuse
from moe_core.plugins import registry
from moe_core.quant import int8_w8a16, mxfp4_w4a16, unquantized

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
VOCAB = 128
_ATTENTION = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
_COMMON = {"hidden_size": 64, "vocab_size": VOCAB, "num_hidden_layers": 2, "initializer_range": 0.1}

# model_type -> (model class, config); each covers a different router variant.
ARCHITECTURES = {
    "mixtral": lambda: (transformers.MixtralForCausalLM, transformers.MixtralConfig(
        **_COMMON, **_ATTENTION, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": lambda: (transformers.Qwen2MoeForCausalLM, transformers.Qwen2MoeConfig(
        **_COMMON, **_ATTENTION, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=False)),
    "qwen3_moe": lambda: (transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig(
        **_COMMON, **_ATTENTION, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True)),
    "olmoe": lambda: (transformers.OlmoeForCausalLM, transformers.OlmoeConfig(
        **_COMMON, num_attention_heads=4, num_key_value_heads=4, intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=False)),
    # Three layers, the first dense (first_k_dense_replace=1): it must stay the model's MLP.
    "deepseek_v3": lambda: (transformers.DeepseekV3ForCausalLM, transformers.DeepseekV3Config(
        **{**_COMMON, "num_hidden_layers": 3}, num_attention_heads=4, num_key_value_heads=4, intermediate_size=96,
        moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4,
        topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1, q_lora_rank=32,
        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)),
    # swiglu_limit=1.0 instead of gpt-oss's 7.0 so the clamps are active at these magnitudes.
    "gpt_oss": lambda: (transformers.GptOssForCausalLM, transformers.GptOssConfig(
        **_COMMON, **_ATTENTION, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
        swiglu_limit=1.0, sliding_window=8)),
}

_REDRAWN = ("gate_up_proj_bias", "down_proj_bias", "e_score_correction_bias")


def build_model(model_type: str, dtype: torch.dtype, device: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model_cls, config = ARCHITECTURES[model_type]()
    config.experts_implementation = "eager"
    model = model_cls(config)
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.rsplit(".", 1)[-1] in _REDRAWN:
                tensor.normal_(0.0, 0.1)
    return model.to(device=device, dtype=dtype).eval()




def _block_output(block: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    out = block(hidden)
    return out[0] if isinstance(out, tuple) else out  # gpt-oss returns (hidden, router_scores)


def _fuse_with_default_backend(model: nn.Module, device: str, quant=None):
    """fuse() with the oracle's own choice, or fail/skip as the module docstring says."""
    quant = quant if quant is not None else unquantized()
    try:
        return fuse(model, quant=quant)
    except NoBackendError as exc:
        info = detect_device(device)
        installed = [s for s in registry().statuses.values() if s.spec is None or info.platform in s.spec.platforms]
        if installed:
            states = "; ".join(f"{s.distribution}: {s.state.value} {s.reason}".strip() for s in installed)
            pytest.fail(f"plugins for {info.platform.value} are installed ({states}) but the oracle chose no "
                        f"backend for {info}:\n{exc}")
        pytest.skip(f"no automatic backend for {info}: no plugin for {info.platform.value} is installed")


def _record_routing(blocks) -> list[torch.Tensor]:
    """Hooks every block's router; the returned list collects each call's chosen experts (sorted)."""
    calls: list[torch.Tensor] = []
    for block in blocks:
        router = block.gate if isinstance(getattr(block, "gate", None), nn.Module) else block.router
        router.register_forward_hook(lambda module, args, out: calls.append(out[-1].sort(dim=-1).values))
    return calls






def check_parity(model_type: str, dtype: torch.dtype, prefer: str | None, device: str) -> None:
    model = build_model(model_type, dtype, device, seed=zlib.crc32(f"{model_type} {dtype}".encode()))
    block_cls = type(model.model.layers[-1].mlp)
    eager_blocks = {name: m for name, m in model.named_modules() if type(m) is block_cls}
    routing_calls = _record_routing(eager_blocks.values())
    token_ids = torch.randint(0, VOCAB, (2, 12), device=device)
    with torch.no_grad():
        eager_logits = model(token_ids).logits
        eager_routing = list(routing_calls)

        report = fuse(model, prefer=prefer) if prefer else _fuse_with_default_backend(model, device)

        assert report.model_type == model_type
        assert [layer.name for layer in report.layers] == list(eager_blocks)
        for layer in report.layers:
            fused = model.get_submodule(layer.name)
            assert isinstance(fused, FusedMoEBlock)
            assert layer.backend == fused.plan.backend
            assert layer.plan.backend in layer.plan.explain()
            if prefer:
                assert layer.backend == prefer
            hidden = torch.randn(2, 12, model.config.hidden_size, device=device, dtype=dtype)
            error = relative_l2(_block_output(fused, hidden), _block_output(eager_blocks[layer.name], hidden))
            assert error < TOLERANCE[dtype], f"{layer.name} on {layer.backend}: relative L2 {error:.2e}"

        fused_routing = record_fused_routing(model.get_submodule(layer.name) for layer in report.layers)
        fused_logits = model(token_ids).logits
    keep = unslipped_positions(eager_routing, fused_routing, tuple(token_ids.shape), dtype)
    assert keep.float().mean() >= 0.25, f"only {int(keep.sum())} of {keep.numel()} positions precede a routing slip"
    error = relative_l2(fused_logits[keep], eager_logits[keep])
    assert error < TOLERANCE[dtype], (f"{model_type} {dtype} logits on {report.layers[0].backend} at {int(keep.sum())} "
                                      f"of {keep.numel()} positions: relative L2 {error:.2e}")


BACKENDS = [pytest.param("reference", id="reference"), pytest.param(None, id="default")]
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


@pytest.mark.parametrize("prefer", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_parity_cpu(model_type, dtype, prefer):
    check_parity(model_type, dtype, prefer, "cpu")


@pytest.mark.device("cuda")
@pytest.mark.parametrize("prefer", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_parity_cuda(model_type, dtype, prefer):
    check_parity(model_type, dtype, prefer, "cuda")


@pytest.mark.parametrize("prefer", BACKENDS)
def test_quantized_fuse(prefer):
    """quant= quantizes the float experts round-to-nearest: int8 per channel keeps blocks within 3e-2
    (a weight's rounding error is ~1/400 of its row's range; measured 8e-3)."""
    model = build_model("gpt_oss", torch.float32, "cpu", seed=5)
    block_cls = type(model.model.layers[0].mlp)
    eager_blocks = {name: m for name, m in model.named_modules() if type(m) is block_cls}
    quant = int8_w8a16()
    hidden = torch.randn(2, 12, model.config.hidden_size)
    with torch.no_grad():
        expected = {name: _block_output(block, hidden) for name, block in eager_blocks.items()}
        if prefer:
            report = fuse(model, quant=quant, prefer=prefer)
        else:
            report = _fuse_with_default_backend(model, "cpu", quant)
        for layer in report.layers:
            assert layer.plan.quant == quant
            error = relative_l2(_block_output(model.get_submodule(layer.name), hidden), expected[layer.name])
            assert error < 3e-2, f"{layer.name} int8 on {layer.backend}: relative L2 {error:.2e}"

    model = build_model("deepseek_v3", torch.float32, "cpu", seed=1)
    dense = model.model.layers[0].mlp
    report = fuse(model, prefer="reference")
    assert model.model.layers[0].mlp is dense
    assert [layer.name for layer in report.layers] == ["model.layers.1.mlp", "model.layers.2.mlp"]


def test_quantizing_fuse_reads_experts_a_chunk_at_a_time(monkeypatch):
    """fuse(quant=...) reads each block's float experts QUANTIZE_CHUNKS chunks at a time (gpt-oss's
    interleaved gate/up is copied by the reader: a chunk's copy, not the block's), and the result is
    the block's experts quantized whole, bit for bit."""
    from moe_core import FusedMoE
    from moe_core.integrations import transformers as integration

    model = build_model("gpt_oss", torch.float32, "cpu", seed=3)
    experts = model.model.layers[0].mlp.experts
    E = experts.gate_up_proj.shape[0]
    whole, _ = integration._canonical_experts("test", experts, ExpertsLayout.DECLARED)
    whole = ExpertWeights.from_float(whole.w13, whole.w2, mxfp4_w4a16(), whole.w13_bias, whole.w2_bias,
                                     dtype=torch.float32)
    read_counts = []
    reader = integration.experts_from_state_dict
    monkeypatch.setattr(integration, "experts_from_state_dict",
                        lambda tensors, prefix, n, **kw: read_counts.append(n) or reader(tensors, prefix, n, **kw))
    monkeypatch.setattr(integration, "QUANTIZE_CHUNKS", 3)
    report = fuse(model, quant=mxfp4_w4a16(), prefer="reference")
    layer = model.get_submodule(report.layers[0].name).moe
    expected = FusedMoE(layer.config, mxfp4_w4a16(), device="cpu", prefer="reference")
    expected.load_weights(whole)
    def flat(packed) -> dict[str, torch.Tensor]:  # the reference layer packs the canonical weights whole
        out = {}
        for name, t in packed.tensors.items():
            out.update({f"{name}.{k}": v for k, v in t.tensors().items()} if isinstance(t, ExpertWeights)
                       else {name: t})
        return out

    got, want = flat(layer.experts.packed_state()), flat(expected.experts.packed_state())
    assert got.keys() == want.keys() and got
    for name in want:
        assert torch.equal(got[name], want[name]), name
    # Each block is first read whole to check its values (one block at a time, released at once), then
    # converted from chunks.
    blocks = len(report.layers)
    checks, chunks = read_counts[:blocks], read_counts[blocks:]
    assert checks == [E] * blocks and max(chunks) == -(-E // 3) and sum(chunks) == E * blocks, read_counts


# ---- refusals: each names the model type and what is unsupported, and changes nothing --------------


def _assert_untouched(model: nn.Module, block_cls: type) -> None:
    assert not any(isinstance(m, FusedMoEBlock) for m in model.modules())
    assert all(type(layer.mlp) is block_cls for layer in model.model.layers)


def test_refuses_unsupported_model_type():
    config = transformers.PhimoeConfig(**_COMMON, **_ATTENTION, intermediate_size=32, num_local_experts=4,
                                       num_experts_per_tok=2)
    model = transformers.PhimoeForCausalLM(config)
    with pytest.raises(UnsupportedModelError, match=r"model_type 'phimoe'.*not supported: sparsemixer routing"):
        fuse(model, prefer="reference")


def test_refuses_inexpressible_activation():
    model_cls, config = ARCHITECTURES["mixtral"]()
    config.hidden_act = "relu"  # gated relu(gate) * up: no moe_core activation computes it
    model = model_cls(config)
    block_cls = type(model.model.layers[0].mlp)
    with pytest.raises(UnsupportedModelError, match=r"mixtral block 'model.layers.0.mlp': gated experts with "
                                                    r"activation 'ReLU' have no exact moe_core activation"):
        fuse(model, prefer="reference")
    _assert_untouched(model, block_cls)


def test_refuses_inexpressible_routing_value():
    model_cls, config = ARCHITECTURES["deepseek_v3"]()
    config.routed_scaling_factor = 0.0  # zeroes every routed expert; Routing requires a factor > 0
    model = model_cls(config)
    with pytest.raises(UnsupportedModelError, match=r"deepseek_v3 block 'model.layers.1.mlp'.*routed_scaling_factor"):
        fuse(model, prefer="reference")
    assert not any(isinstance(m, FusedMoEBlock) for m in model.modules())


def test_refuses_quantized_experts():
    model = build_model("qwen3_moe", torch.float32, "cpu", seed=2)
    block_cls = type(model.model.layers[0].mlp)
    experts = model.model.layers[1].mlp.experts
    experts.gate_up_proj = nn.Parameter(torch.zeros(experts.gate_up_proj.shape, dtype=torch.int8),
                                        requires_grad=False)
    with pytest.raises(UnsupportedModelError, match=r"qwen3_moe block 'model.layers.1.mlp'.*'gate_up_proj' has dtype "
                                                    r"int8, expected bfloat16"):
        fuse(model, prefer="reference")
    _assert_untouched(model, block_cls)


def test_forced_backend_that_cannot_serve_leaves_model_untouched():
    model = build_model("olmoe", torch.float32, "cpu", seed=3)
    block_cls = type(model.model.layers[0].mlp)
    with pytest.raises(BackendUnavailableError, match="no-such-backend"):
        fuse(model, prefer="no-such-backend")
    _assert_untouched(model, block_cls)


def test_refuses_already_fused_model():
    model = build_model("mixtral", torch.float32, "cpu", seed=4)
    fuse(model, prefer="reference")
    with pytest.raises(UnsupportedModelError, match="has no MixtralSparseMoeBlock blocks"):
        fuse(model, prefer="reference")


def test_unslipped_positions_stop_at_each_sequence_first_slip():
    eager = [torch.tensor([[0, 1]] * 6), torch.tensor([[0, 1]] * 6)]  # two layers, 2 sequences x 3 tokens
    fused = [eager[0].clone(), eager[1].clone()]
    fused[1][1] = torch.tensor([0, 2])  # sequence 0, position 1 slips in the second layer
    keep = unslipped_positions(eager, fused, (2, 3), torch.bfloat16)
    assert keep.tolist() == [[True, False, False], [True, True, True]]
    with pytest.raises(AssertionError, match="fp32 routing differs"):
        unslipped_positions(eager, fused, (2, 3), torch.float32)
    fused[0][:] = torch.tensor([1, 3])  # every token of the first layer: far beyond a near-tie
    with pytest.raises(AssertionError, match="routings slipped"):
        unslipped_positions(eager, fused, (2, 3), torch.bfloat16)
