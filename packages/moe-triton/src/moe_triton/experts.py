"""`TritonExperts`: the modular fused-MoE experts for bf16 / fp16 / fp32 weights, in Triton.

Pipeline per call: align the routed choices into expert blocks (`moe_triton.align`), GEMM1 with
the activation fused into its epilogue, GEMM2 with bias and router weight, then a top-k sum. At
decode sizes the tuned config may pick the direct kernels for either GEMM instead: they read the
routed ids without alignment, and the direct GEMM2 sums the top-k choices itself.
Launch tiles come from the tuned-config database (`moe_triton.configs`); `config_for(M)` says
which configuration a call of M tokens uses and where it came from. On Hopper a tuned GEMM may run
on the Gluon wgmma kernel (`moe_triton.gemm_details._wgmma`); elsewhere such an entry runs the
tl.dot kernel at the same tile width. The GEMM launchers and their twins are in `moe_triton.gemm`.
"""

from __future__ import annotations

import dataclasses

import torch

from moe_core.backends import DeviceInfo, Platform
from moe_core.config import Activation, ActivationKind, MoEConfig
from moe_core.experts import (
    UNQUANTIZED,
    Capability,
    Experts,
    check_routed_inputs,
    checking_ids_on_accelerators,
)
from moe_core.quant import MoEQuantConfig
from moe_core.weights.canonical import ExpertWeights
from moe_core.weights.processor import PackedWeights
from moe_triton._common.target import tma_capable, wgmma_capable
from moe_triton.align import align_block_size
from moe_triton.configs import ConfigKey, KernelConfig, Lookup, TileConfig, TunedLaunch, device_tag, lookup
from moe_triton.gemm import direct_gemm, grouped_gemm
from moe_triton.topk_sum import topk_sum

__all__ = ["TritonExperts", "TritonWeightProcessor", "fused_experts"]


class TritonWeightProcessor:
    """Canonical w13 [E, R, K] / w2 [E, K, N] are already the kernel's layout: cast and make contiguous.

    Biases are kept in fp32 (the epilogue adds them in fp32).
    """

    layout = "triton.canonical"

    def __call__(self, weights: ExpertWeights, config: MoEConfig, device: torch.device) -> PackedWeights:
        tensors = {
            "w13": weights.w13.to(device=device, dtype=config.dtype).contiguous(),
            "w2": weights.w2.to(device=device, dtype=config.dtype).contiguous(),
        }
        if weights.has_bias:
            tensors["w13_bias"] = weights.w13_bias.to(device=device, dtype=torch.float32).contiguous()
            tensors["w2_bias"] = weights.w2_bias.to(device=device, dtype=torch.float32).contiguous()
        return PackedWeights(self.layout, tensors)


def _on_tl_dot(tile: TileConfig) -> TileConfig:
    """A wgmma tile as the tl.dot kernel's tile of the same output width."""
    return TileConfig(tile.block_n, 64, tile.group_m, 8, tile.num_stages) if tile.wgmma else tile


def _without_tma(tile: TileConfig) -> TileConfig:
    """The same tile reading its weights with plain loads."""
    return dataclasses.replace(tile, tma=False) if tile.tma else tile


class TritonExperts(Experts, TunedLaunch):
    backend = "triton"
    kernel_name = "bf16"  # the tuned-config family (fp16/fp32 layers use the same tiles, keyed by dtype)
    weight_processor = TritonWeightProcessor()
    router = "moe_triton.routing:route"
    capability = Capability(
        platforms=frozenset({Platform.CUDA, Platform.ROCM, Platform.XPU}),
        schemes=(UNQUANTIZED,),
        activations=frozenset(ActivationKind),
        min_capability=(8, 0),
        requires=("triton",),
        # the device tests and the benchmark's checks
        validated_on=("cuda: NVIDIA H100 80GB HBM3", "cuda: NVIDIA H200"),
        limitations=(
            "tuned configurations ship for NVIDIA H100 and H200 only; other GPUs use the nearest tuned shape or a default",
            "no split-K: a direct GEMM1 program covers the whole hidden size of its output columns",
            "the Gluon wgmma GEMM (some tuned H100 and H200 entries) runs on sm_90 only; elsewhere those entries run "
            "the tl.dot kernel at the same tile width",
        ),
    )

    def __init__(self, config: MoEConfig, quant: MoEQuantConfig, device: DeviceInfo) -> None:
        super().__init__(config, quant, device)
        self.config_override: KernelConfig | None = None  # forces the tiles (tests, tuning)
        self._key = ConfigKey(self.kernel_name, config.num_local_experts, config.intermediate_size_per_partition,
                              config.hidden_size, config.top_k, str(config.dtype).removeprefix("torch."),
                              device_tag(device.name))
        self._lookups: dict[int, Lookup] = {}

    def _find_config(self, num_tokens: int) -> Lookup:
        """Any tuned file (`configs.lookup`: this shape, else the nearest shape or another device's,
        else a default); wgmma tiles become tl.dot tiles of the same width off sm_90 or for fp32."""
        hit = lookup(self._key, num_tokens)
        cfg = hit.config
        if (cfg.gemm1.wgmma or cfg.gemm2.wgmma) and not (
                self.device.platform is Platform.CUDA and wgmma_capable(self.device.torch_device)
                and self.config.dtype in (torch.bfloat16, torch.float16)):
            # Another GPU's or dtype's entry: its Hopper-only tiles run on the tl.dot kernel, same shape.
            cfg = KernelConfig(cfg.block_m, _on_tl_dot(cfg.gemm1), _on_tl_dot(cfg.gemm2))
            hit = Lookup(cfg, hit.source, hit.detail + ", wgmma off (not an sm_90 GPU with a 16-bit layer)")
        if (cfg.gemm1.tma or cfg.gemm2.tma) and not tma_capable(self.device):
            # Tensor descriptors are NVIDIA's copy engine (sm_90+): elsewhere the same tiles use plain loads.
            hit = Lookup(KernelConfig(cfg.block_m, _without_tma(cfg.gemm1), _without_tma(cfg.gemm2)), hit.source,
                         hit.detail + ", tma off (not an NVIDIA GPU of sm_90 or later)")
        return hit

    def apply(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        packed = self._packed()
        if checking_ids_on_accelerators():
            check_routed_inputs(hidden_states, topk_weights, topk_ids, cfg)
        M = hidden_states.shape[0]
        if hidden_states.dim() != 2 or hidden_states.shape[1] != cfg.hidden_size:
            raise ValueError(f"hidden_states must be [M, {cfg.hidden_size}], got {list(hidden_states.shape)}")
        if hidden_states.dtype != cfg.dtype:
            raise ValueError(f"hidden_states dtype {hidden_states.dtype} differs from the layer dtype {cfg.dtype}")
        if tuple(topk_ids.shape) != (M, cfg.top_k) or topk_ids.dtype != torch.int32:
            raise ValueError(f"topk_ids must be int32 [{M}, {cfg.top_k}], got {topk_ids.dtype} {list(topk_ids.shape)}")
        if tuple(topk_weights.shape) != (M, cfg.top_k) or topk_weights.dtype != torch.float32:
            raise ValueError(f"topk_weights must be float32 [{M}, {cfg.top_k}], got {topk_weights.dtype} "
                             f"{list(topk_weights.shape)}")
        if M == 0:
            return hidden_states.new_empty((0, cfg.hidden_size))
        return fused_experts(
            hidden_states.contiguous(), packed["w13"], packed["w2"], packed.get("w13_bias"), packed.get("w2_bias"),
            topk_weights.contiguous(), topk_ids.contiguous(), num_experts=cfg.num_experts,
            activation=cfg.activation, weight_on_input=cfg.routing.weight_on_input, expert_map=self.expert_map,
            config=self.config_for(M).config)


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, b13: torch.Tensor | None,
                  b2: torch.Tensor | None, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                  num_experts: int, activation: Activation, weight_on_input: bool,
                  expert_map: torch.Tensor | None, config: KernelConfig) -> torch.Tensor:
    """[M, K] -> [M, K]: the whole expert computation for routed tokens (global ids in topk_ids)."""
    M, K = x.shape
    top_k = topk_ids.shape[1]
    N = w2.shape[2]
    direct1, direct2 = config.gemm1.direct, config.gemm2.direct
    if not (direct1 and direct2):
        sorted_ids, expert_ids, total = align_block_size(topk_ids, config.block_m, num_experts, expert_map)
    common = dict(top_k=top_k, block_m=config.block_m)
    inter = torch.empty(M * top_k, N, dtype=x.dtype, device=x.device)
    if direct1:
        direct_gemm(x, w13, b13, inter, topk_weights, topk_ids, expert_map, tile=config.gemm1, activation=activation,
                 mul_weight=weight_on_input)
    else:
        grouped_gemm(x, w13, b13, inter, topk_weights, sorted_ids, expert_ids, total, tile=config.gemm1,
                 activation=activation, mul_weight=weight_on_input, zero_foreign=False, **common)
    if direct2:
        # The direct GEMM2 sums each token's choices itself: no top-k reduce launch.
        out = torch.empty(M, K, dtype=x.dtype, device=x.device)
        direct_gemm(inter, w2, b2, out, topk_weights, topk_ids, expert_map, tile=config.gemm2, activation=None,
                 mul_weight=not weight_on_input)
        return out
    # With one choice per token the second GEMM writes the output rows directly.
    out = torch.empty(M * top_k, K, dtype=x.dtype, device=x.device)
    grouped_gemm(inter, w2, b2, out, topk_weights, sorted_ids, expert_ids, total, tile=config.gemm2,
             activation=None, mul_weight=not weight_on_input, zero_foreign=True, **common)
    if top_k == 1:
        return out
    return topk_sum(out, top_k, x.dtype)
