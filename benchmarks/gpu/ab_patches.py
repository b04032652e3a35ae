"""Launch-shape patches for `ab_layer.py` variants (`--variant NAME=ab_patches:FUNCTION`, with
benchmarks/gpu on PYTHONPATH): each forces the quantized layer's launch shapes at the timed token
count to those it would run, with one field of both GEMMs changed. A patch that changes fields of the
launch shapes starts from an earlier patch's where the variant lists one before it
(`NAME=ab_patches:a,ab_patches:b`).

- `group_m4`, `group_m8`, `group_m16`: M blocks launched in groups of that many (`GemmConfig.group_m`);
  for token counts whose launch puts N tiles first.
- `swapped`, `unswapped`: `GemmConfig.swap_ab` on or off (fp8, which runs either way).
- `mixtral_int4_8_before`, `qwen3_fp8_block_8_before`: the 8-token entries these two cells shipped
  before their per-GEMM retunes (`mixtral-8x7b` int4: GEMM2 split 2; `qwen3-30b-a3b` block fp8:
  GEMM1 split 2, both GEMMs four stages deep).
- `max_registers_168`, `max_registers_128`, `max_registers_96`, `max_registers_80`, `max_registers_64`: both
  GEMMs capped at that many registers per thread (`GemmConfig.max_registers`; 4-warp programs per H200
  SM: 3, 4, 5, 6, 8); `max_registers_168_gemm1`, `max_registers_168_gemm2`: one GEMM only; `gpt_oss_mxfp4_1_before`:
  gpt-oss-120b's one-token MXFP4 entry as it shipped before its GEMM2 cap (none).
- `stages4`, `stages5`: both GEMMs' pipelines (`num_stages`) that many K tiles deep.
- `one_dot`, `quarters_apart`: both GEMMs with each quads K tile's quarters as one dot, or as four
  (`GemmConfig.one_dot`).
- `gemm1_wgmma_128`, `gemm1_wgmma_256`, `both_wgmma_128`: aligned GEMM1 (or both GEMMs) on the
  warp-specialized Gluon kernel (`GemmConfig.wgmma`, four stages) with 128 or 256 weight rows per
  program; GEMM2 cannot at up to 8 tokens (its sums finish by last arrival, which that kernel lacks).
- `mma_both`, `mma_gemm1`, `mma_gemm2`, `mma_both_split2x`: decode-size launches (int4, int8, MXFP4) on the
  hand-scheduled mma.sync kernel (`GemmConfig.mma`), both GEMMs or one, at the served block_m, block_n
  and split (warps cut to 16 weight rows each at least, splits to at most 8 K tiles), or twice the splits;
  `one_token_entry_mma_both`, `one_token_entry_mma_gemm2`: the one-token entry's launch shapes with both
  GEMMs or GEMM2 on the mma kernel at any token count;
  `mma_gemm1_64x4`, `mma_gemm1_64x4_gemm2_64x3`, `mma_gemm2_256x4`, `mma_gemm2_64x4`: the served shapes
  with those GEMMs on the mma kernel at (block_n, split), four warps, three stages;
  `reshaped`: the served shapes with GEMM1 (GEMM2) at the block_n, split and warps (and a register cap) of
  $AB_GEMM1 ($AB_GEMM2), e.g. `64x3x4` or `128x3x4x96`, set by the variant; `own_routed`: an mma GEMM1
  ranking its pairs' experts itself; `int4_entry`: this device's int4 file's entry of the layer's shape as int4
  runs it (mma GEMMs kept, scale rows copied), for MXFP4 and int8 layers;
  `mma_gemm1_own_route`, `mma_both_own_route`: GEMM1 (or both GEMMs) moved onto the mma kernel, GEMM1
  ranking its pairs' experts itself (`GemmConfig.own_route`, one token);
  `mma_entries_21_before`: what served 1-3 tokens before the twenty-first session's H200 mma entries;
  `one_token_entries_22_before`: what served 1-3 tokens before the twenty-second session's one-token
  and 2-token entries (int4 on four presets, deepseek-v3 MXFP4); `one_token_entry`: the shipped
  one-token entry at any token count;
  `mma_entries_before`: the one-token H200 int4 entries the mma kernel replaced (qwen3-30b-a3b's GEMM1,
  qwen3-235b-a22b's and gpt-oss-120b's GEMM2) as they were.
- `gemm2_whole_share`, `gemm2_whole_share_split2`, `gemm2_whole_share_split6`, `gemm2_whole_share_64`,
  `gemm2_whole_share_fewest`, `gemm2_whole_share_fewest_64`, `both_mma_gemm2_whole_share_fewest`: a
  direct GEMM2 on the mma kernel asking for all its weights before its wait on GEMM1 (ring one stage
  deeper than its K tiles), at the served split, 2 or 6 splits, or the fewest splits of at most 8 K
  tiles (fewer, heavier programs), 64 rows wide, or with GEMM1 on the mma kernel too (whose programs
  hold fewer registers, leaving GEMM2 room on the SMs while GEMM1 runs);
  `one_token_entry_gemm2_whole_share`: the one-token entry's launch shapes with GEMM2's whole share
  asked for before its wait, at any token count (a 2-token entry as it would serve 2 and 3 tokens).
- `gemm1_stages5`, `gemm1_n128_stages5`, `gemm1_split8`, `gemm1_n128_split8`: GEMM1 alone, its
  pipeline deep enough (or its K-splits short enough) that a one-token program of qwen3-30b-a3b
  (K = 2048: 16 tiles of 128, split 4 or 8) asks for all its weight tiles before computing.

And some that change the layer's code: `act_quant_plain_launch` (`act_quant` launched plain, not
dependent on the kernel ahead); `direct_up_to_8` and `direct_one_token_only` (calls of up to 8 tokens,
or one, launch their GEMMs without the alignment, whatever the router: `quantized.DIRECT_MAX_TOKENS*`);
`input_quantized_apart` (block fp8's input quantized by an `act_quant` launch, not by the routing
launch: `quantized.ROUTE_QUANTIZES_MAX_TOKENS` 0); `prefetch_tiles_2`, `prefetch_tiles_all` (a one-token GEMM2
asking L2 for its first two K tiles of weights, or all of them, before its wait on GEMM1:
`quant_gemm.L2_PREFETCH_TILES`, shipped 1).
- `scales_in_tile`, `scales_in_tile_gemm1`, `scales_in_tile_gemm2`: the served shapes with both GEMMs (or one)
  on the mma kernel loading each K tile's scale rows in the tile, the others copying them with the tile's
  words (`GemmConfig.scales_in_tile`); `scales_copied`: both copying them, whatever the entry says.
- `mma_kernel_from_source`: the mma kernel built from the file at $AB_MMA_SOURCE (a changed copy of
  `quant_gemm_details/_mma.py`, e.g. a raw folder's patch applied to the installed one) wherever the
  served shapes launch it; combine it with a launch-shape patch (`NAME=ab_patches:a,ab_patches:b`).
- `gemm2_block_ready`: GEMM2 waiting for its own block of GEMM1's rows, counted as GEMM1 stores them,
  instead of for all of GEMM1 (`GemmConfig.block_ready`); the served shapes as they are where either
  GEMM runs on the mma or wgmma kernel.
- `folded_regs_240`, `folded_regs_248`: the wgmma kernel's 128-pair blocks (copies folded into the
  consumers) at that many registers per thread instead of `_heuristics.FOLDED_REGS`' plan.
- `scale_rows_one_by_one`: no launch reads the tl.dot kernel's scale rows in pairs (`SCALE_PAIRS`);
  `int4_rows_scaled_per_weight`: per-channel int4 scaled as grouped int4 (per weight pair, or after each
  16 x 128 tile's dots), not once per output (`WeightOperand.one_scale_row`, the kernels' ROW_SCALE).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from pathlib import Path
from unittest import mock

from moe_core.quant import QuantDType
from moe_triton import act_quant, configs, quant_gemm, quantized
from moe_triton._common.intmath import cdiv
from moe_triton.configs import GemmConfig, QuantKernelConfig
from moe_triton.quant_gemm_details import _heuristics
from moe_triton.quant_gemm_details import _mma as mma_kernel_module
from moe_triton.quant_gemm_details._layouts import WeightOperand, WType
from moe_triton.quant_gemm_details._mma import MAX_TILES, TILE_K
from moe_triton.tune import as_mma


def _so_far(layer, tokens: int) -> QuantKernelConfig:
    """The launch shapes a variant has before this patch: an earlier patch's override, else the served ones."""
    return layer.experts.config_override or layer.experts._find_config(tokens).config


def _gemms(gemm1: dict, gemm2: dict):
    def patch(layer, tokens: int):
        base = _so_far(layer, tokens)
        changed = QuantKernelConfig(dataclasses.replace(base.gemm1, **gemm1), dataclasses.replace(base.gemm2, **gemm2))
        return mock.patch.object(layer.experts, "config_override", changed)
    return patch


def _gemm1(**changes):
    return _gemms(changes, {})


def _both_gemms(**changes):
    return _gemms(changes, changes)


mixtral_int4_8_before = _gemms({}, dict(split_k=2))
qwen3_fp8_block_8_before = _gemms(dict(split_k=2, num_stages=4), dict(num_stages=4))


gemm1_stages5 = _gemm1(num_stages=5)
gemm1_n128_stages5 = _gemm1(block_n=128, split_k=4, num_stages=5)
gemm1_split8 = _gemm1(split_k=8)
gemm1_n128_split8 = _gemm1(block_n=128, split_k=8)
group_m4 = _both_gemms(group_m=4)
group_m8 = _both_gemms(group_m=8)
group_m16 = _both_gemms(group_m=16)
swapped = _both_gemms(swap_ab=True)
unswapped = _both_gemms(swap_ab=False)


def act_quant_plain_launch(layer, tokens: int):
    return mock.patch.object(act_quant, "dependent_options", lambda device: {"PDL": False})


def _direct_up_to(most: int):
    def patch(layer, tokens: int):
        return mock.patch.multiple(quantized, DIRECT_MAX_TOKENS=most, DIRECT_MAX_TOKENS_WIDE_ROUTER=most)
    return patch


direct_up_to_8 = _direct_up_to(8)
direct_one_token_only = _direct_up_to(1)


def input_quantized_apart(layer, tokens: int):
    return mock.patch.object(quantized, "ROUTE_QUANTIZES_MAX_TOKENS", 0)


max_registers_168_gemm1 = _gemm1(max_registers=168)
max_registers_168_gemm2 = _gemms({}, dict(max_registers=168))
max_registers_168 = _both_gemms(max_registers=168)
max_registers_128 = _both_gemms(max_registers=128)
max_registers_96 = _both_gemms(max_registers=96)
max_registers_80 = _both_gemms(max_registers=80)
max_registers_64 = _both_gemms(max_registers=64)
stages4 = _both_gemms(num_stages=4)
stages5 = _both_gemms(num_stages=5)
gpt_oss_mxfp4_1_before = _gemms({}, dict(max_registers=0))
quarters_apart = _both_gemms(one_dot=False)
one_dot = _both_gemms(one_dot=True)


def _prefetch_tiles(tiles: int):
    def patch(layer, tokens: int):
        return mock.patch.object(quant_gemm, "L2_PREFETCH_TILES", tiles)
    return patch


prefetch_tiles_2 = _prefetch_tiles(2)
prefetch_tiles_all = _prefetch_tiles(64)  # more than any split's K tiles: the program's whole share


def _scales_in_tile(gemm1: bool, gemm2: bool):
    """The served shapes (or an earlier patch's) with the chosen GEMMs, where they run on the mma kernel,
    loading each K tile's scale rows in the tile (`GemmConfig.scales_in_tile`) and the others copying them
    with its words."""
    def patch(layer, tokens: int):
        served = _so_far(layer, tokens)
        changed = QuantKernelConfig(*(dataclasses.replace(g, scales_in_tile=flip) if g.mma else g
                                      for g, flip in ((served.gemm1, gemm1), (served.gemm2, gemm2))))
        return mock.patch.object(layer.experts, "config_override", changed)
    return patch


scales_in_tile = _scales_in_tile(True, True)
scales_in_tile_gemm1 = _scales_in_tile(True, False)
scales_in_tile_gemm2 = _scales_in_tile(False, True)
scales_copied = _scales_in_tile(False, False)


@functools.cache
def _mma_kernel_variant():
    spec = importlib.util.spec_from_file_location("moe_triton.quant_gemm_details._mma_variant",
                                                  os.environ["AB_MMA_SOURCE"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.moe_mma_gemm_kernel


def mma_kernel_from_source(layer, tokens: int):
    """The launcher reads `_mma.moe_mma_gemm_kernel` at each launch: the variant's kernel stands there."""
    return mock.patch.object(mma_kernel_module, "moe_mma_gemm_kernel", _mma_kernel_variant())


# The wgmma kernel's launch shape: only the tl.dot kernel's options reset.
_WGMMA = dict(wgmma=True, num_warps=4, num_stages=4, one_dot=False, max_registers=0, group_m=1, narrow=False, tail=0)
gemm1_wgmma_128 = _gemm1(**_WGMMA, block_n=128)
gemm1_wgmma_256 = _gemm1(**_WGMMA, block_n=256)
both_wgmma_128 = _both_gemms(**_WGMMA, block_n=128)


def _as_mma(g, k: int, split_factor: int):
    """A served launch shape on the mma kernel (`tune.as_mma`, a wgmma one as tl.dot's first), split_k
    times split_factor but each split at most `_mma.MAX_TILES` K tiles."""
    k_tiles = cdiv(k, TILE_K.value)
    split = min(k_tiles, max(g.split_k * split_factor, cdiv(k_tiles, MAX_TILES.value)))
    return as_mma(dataclasses.replace(g, wgmma=False, split_k=split))


def _mma(gemm1: bool, gemm2: bool, split_factor: int = 1, from_one_token: bool = False, own_route: bool = False):
    """from_one_token: the one-token entry's launch shapes at any token count (a 2-token entry as it
    would serve 2 and 3 tokens); own_route: GEMM1 (moved) ranking its pairs' experts itself
    (`GemmConfig.own_route`, one token)."""
    def patch(layer, tokens: int):
        served = layer.experts._find_config(1 if from_one_token else tokens).config
        cfg = layer.experts.config
        g1 = _as_mma(served.gemm1, cfg.hidden_size, split_factor) if gemm1 else served.gemm1
        if own_route:
            g1 = dataclasses.replace(g1, own_route=True)
        changed = QuantKernelConfig(
            g1, _as_mma(served.gemm2, cfg.intermediate_size_per_partition, split_factor) if gemm2 else served.gemm2)
        return mock.patch.object(layer.experts, "config_override", changed)
    return patch


mma_both = _mma(True, True)
mma_gemm1 = _mma(True, False)
mma_gemm2 = _mma(False, True)
mma_gemm1_own_route = _mma(True, False, own_route=True)
mma_both_own_route = _mma(True, True, own_route=True)
mma_both_split2x = _mma(True, True, split_factor=2)
one_token_entry_mma_both = _mma(True, True, from_one_token=True)
one_token_entry_mma_gemm2 = _mma(False, True, from_one_token=True)


def _gemm2_whole_share(split: int | None = None, block_n: int | None = None, gemm1_mma: bool = False,
                       from_one_token: bool = False):
    """GEMM2 on the mma kernel with a ring one stage deeper than its split's K tiles: a dependent direct
    launch then asks for all of its weights before its wait on GEMM1 (EARLY_WEIGHTS). split: the served
    one (None), the fewest of at most `_mma.MAX_TILES` K tiles each (0), or that many (raised to the
    fewest); block_n: the served one or given (16 rows per warp); gemm1_mma: GEMM1 on the mma kernel too
    (`_as_mma`, served split); from_one_token: the one-token entry's launch shapes at any token count."""
    def patch(layer, tokens: int):
        served = layer.experts._find_config(1 if from_one_token else tokens).config
        cfg = layer.experts.config
        k_tiles = cdiv(cfg.intermediate_size_per_partition, TILE_K.value)
        g2 = served.gemm2.on_tl_dot()
        if block_n is not None:
            g2 = dataclasses.replace(g2, block_n=block_n, num_warps=block_n // 16)
        g2 = dataclasses.replace(g2, split_k=g2.split_k if split is None else max(split, 1))
        g2 = _as_mma(g2, cfg.intermediate_size_per_partition, 1)
        g2 = dataclasses.replace(g2, num_stages=cdiv(k_tiles, g2.split_k) + 1)
        g1 = _as_mma(served.gemm1, cfg.hidden_size, 1) if gemm1_mma else served.gemm1
        return mock.patch.object(layer.experts, "config_override", QuantKernelConfig(g1, g2))
    return patch


gemm2_whole_share = _gemm2_whole_share()
gemm2_whole_share_fewest = _gemm2_whole_share(0)
gemm2_whole_share_fewest_64 = _gemm2_whole_share(0, block_n=64)
both_mma_gemm2_whole_share_fewest = _gemm2_whole_share(0, gemm1_mma=True)
gemm2_whole_share_split2 = _gemm2_whole_share(2)
gemm2_whole_share_split6 = _gemm2_whole_share(6)
gemm2_whole_share_64 = _gemm2_whole_share(block_n=64)
one_token_entry_gemm2_whole_share = _gemm2_whole_share(from_one_token=True)


# The one-token H200 int4 entries the mma kernel replaced, per (hidden, intermediate) shape: the GEMM's
# fields before (tl.dot kernel).
_BEFORE_MMA = {(2048, 768): ("gemm1", dict(one_dot=True)), (4096, 1536): ("gemm2", dict(group_m=16)),
               (2880, 2880): ("gemm2", dict(one_dot=True))}


def mma_entries_before(layer, tokens: int):
    cfg = layer.experts.config
    gemm, fields = _BEFORE_MMA[cfg.hidden_size, cfg.intermediate_size_per_partition]
    served = layer.experts._find_config(tokens).config
    before = dataclasses.replace(getattr(served, gemm).on_tl_dot(), **fields)
    return mock.patch.object(layer.experts, "config_override", dataclasses.replace(served, **{gemm: before}))


# The one-token H200 int8 entries this session's mma entries replaced, per (hidden, intermediate) shape.
_INT8_ONE_TOKEN_BEFORE = {
    (2048, 768): QuantKernelConfig(GemmConfig(16, 64, 4, 4, 2, swap_ab=True),
                                   GemmConfig(16, 64, 4, 4, 2, swap_ab=True)),
    (2880, 2880): QuantKernelConfig(GemmConfig(16, 128, 2, 4, 3, swap_ab=True, one_dot=True),
                                    GemmConfig(16, 128, 4, 4, 3, swap_ab=True, one_dot=True)),
}


def mma_entries_21_before(layer, tokens: int):
    """What served `tokens` before the twenty-first session's H200 entries: int8's one-token entries
    as they were (`_INT8_ONE_TOKEN_BEFORE`, at 1 and 2 tokens); elsewhere, where a 2-token entry was
    added, the one-token entry at 2 tokens and the 8-token one at 3 (the nearest then)."""
    cfg = layer.experts.config
    if layer.experts.quant.weight.dtype is QuantDType.INT8:
        before = _INT8_ONE_TOKEN_BEFORE[cfg.hidden_size, cfg.intermediate_size_per_partition]
    else:
        before = layer.experts._find_config(1 if tokens <= 2 else 8).config
    return mock.patch.object(layer.experts, "config_override", before)


# The H200 one-token entries the twenty-second session's per-GEMM searches replaced, per (scheme, hidden,
# intermediate): int4's four and deepseek-v3 MXFP4's (then int4's file, borrowed as served).
_DEEPSEEK_BEFORE_22 = QuantKernelConfig(GemmConfig(16, 256, 2, 4, 4, swap_ab=True), GemmConfig(16, 256, 1, 4, 4, swap_ab=True))
_ONE_TOKEN_BEFORE_22 = {
    ("int4", 2048, 768): QuantKernelConfig(GemmConfig(16, 64, 4, 4, 3, swap_ab=True, mma=True),
                                           GemmConfig(16, 128, 3, 8, 3, swap_ab=True, one_dot=True)),
    ("int4", 4096, 1536): QuantKernelConfig(GemmConfig(16, 128, 3, 4, 3, swap_ab=True, group_m=16),
                                            GemmConfig(16, 128, 2, 4, 3, swap_ab=True, mma=True)),
    ("int4", 2880, 2880): QuantKernelConfig(GemmConfig(16, 256, 2, 4, 3, swap_ab=True, one_dot=True),
                                            GemmConfig(16, 256, 4, 4, 3, swap_ab=True, mma=True)),
    ("int4", 7168, 2048): _DEEPSEEK_BEFORE_22,
    ("mxfp4", 7168, 2048): _DEEPSEEK_BEFORE_22,
}
# qwen3-30b-a3b int4's 2-token entry (serving 2 and 3 tokens) the same session replaced.
_QWEN3_30B_TWO_TOKEN_BEFORE_22 = QuantKernelConfig(GemmConfig(16, 64, 4, 4, 3, swap_ab=True, mma=True),
                                                   GemmConfig(16, 128, 3, 8, 3, swap_ab=True, mma=True))


def one_token_entries_22_before(layer, tokens: int):
    """What served `tokens` before the twenty-second session's H200 entries: the one-token entry as it
    was at 1 token, and at 2 where it was the nearest (no 2-token entry then), the 8-token entry at 3;
    qwen3-30b-a3b int4's own 2-token entry at 2 and 3."""
    experts = layer.experts
    cfg = experts.config
    scheme = "mxfp4" if experts.quant.weight.dtype is QuantDType.FP4_E2M1 else "int4"
    own_two = scheme == "int4" and cfg.hidden_size == 2048  # qwen3-30b-a3b had a 2-token entry
    if tokens == 1 or (tokens == 2 and not own_two):
        before = _ONE_TOKEN_BEFORE_22[scheme, cfg.hidden_size, cfg.intermediate_size_per_partition]
    elif own_two and tokens <= 3:
        before = _QWEN3_30B_TWO_TOKEN_BEFORE_22
    else:
        before = experts._find_config(8).config
    return mock.patch.object(experts, "config_override", before)


def _entry_of(m: int):
    """The entry served at m tokens, at any token count."""
    def patch(layer, tokens: int):
        return mock.patch.object(layer.experts, "config_override", layer.experts._find_config(m).config)
    return patch


one_token_entry = _entry_of(1)
# deepseek-v3 int8: the 8192-token entry's wgmma tile against the 2048-token entry where that serves.
tile_of_8192 = _entry_of(8192)


def _mma_tiles(**tiles: tuple[int, int]):
    """The served launch shapes with the named GEMMs (gemm1=, gemm2=) on the mma kernel at (block_n,
    split), four warps, three stages: the one-token int4 entries' mma tiles tried on other schemes."""
    def patch(layer, tokens: int):
        served = layer.experts._find_config(tokens).config
        changed = {g: GemmConfig(16, bn, split, 4, 3, swap_ab=True, mma=True) for g, (bn, split) in tiles.items()}
        return mock.patch.object(layer.experts, "config_override", dataclasses.replace(served, **changed))
    return patch


mma_gemm1_64x4 = _mma_tiles(gemm1=(64, 4))
mma_gemm1_64x4_gemm2_64x3 = _mma_tiles(gemm1=(64, 4), gemm2=(64, 3))
mma_gemm2_256x4 = _mma_tiles(gemm2=(256, 4))
mma_gemm2_64x4 = _mma_tiles(gemm2=(64, 4))


def reshaped(layer, tokens: int):
    """The served launch shapes (or an earlier patch's) with GEMM1 (GEMM2) at $AB_GEMM1 ($AB_GEMM2) =
    BLOCK_NxSPLITxWARPS[xREGISTERS] (the last a register cap, `GemmConfig.max_registers`), their other options
    kept; set per variant: `--variant g1-64x3=AB_GEMM1=64x3x4,ab_patches:reshaped`."""
    served = _so_far(layer, tokens)
    changed = {}
    for gemm in ("gemm1", "gemm2"):
        if shape := os.environ.get(f"AB_{gemm.upper()}"):
            block_n, split, warps, *regs = map(int, shape.split("x"))
            changed[gemm] = dataclasses.replace(getattr(served, gemm), block_n=block_n, split_k=split, num_warps=warps,
                                                **({"max_registers": regs[0]} if regs else {}))
    return mock.patch.object(layer.experts, "config_override", dataclasses.replace(served, **changed))


# The served launch shapes (or an earlier patch's) with an mma GEMM1 ranking its pairs' experts itself.
own_routed = _gemm1(own_route=True)


def int4_entry(layer, tokens: int):
    """This device's int4 file's entry of the layer's shape as int4 runs it (`lender_config`: mma GEMMs
    kept), copying their scale rows: for MXFP4 and int8 layers, which borrow it only on the tl.dot kernel."""
    entry = layer.experts.lender_config(tokens).config
    served = QuantKernelConfig(*(dataclasses.replace(g, scales_in_tile=False) for g in (entry.gemm1, entry.gemm2)))
    return mock.patch.object(layer.experts, "config_override", served)


# The twenty-third session's int8 searches at 2048 tokens (`moe tune --quant int8 --wgmma --per-gemm`, int8's
# deeper wgmma rings), keyed by hidden size: the tuner's winners, set against the served entries at the token
# counts a 2048-token entry serves (1024-4095).
_WGMMA_128x256 = GemmConfig(128, 256, 1, 4, 3, swap_ab=True, wgmma=True)
_INT8_2048_TUNED = {
    7168: QuantKernelConfig(_WGMMA_128x256, _WGMMA_128x256),  # deepseek-v3
    2880: QuantKernelConfig(*(GemmConfig(64, 128, 1, 4, 3, swap_ab=True, tail=32, one_dot=True),) * 2),  # gpt-oss-120b
}


def int8_2048_tuned(layer, tokens: int):
    return mock.patch.object(layer.experts, "config_override", _INT8_2048_TUNED[layer.experts.config.hidden_size])


def int8_2048_tuned_tail16(layer, tokens: int):
    """The tuned entry with a 16-pair tail on its wgmma GEMMs (the tuner tried tails on tl.dot tiles only)."""
    tuned = _INT8_2048_TUNED[layer.experts.config.hidden_size]
    tail = {g: dataclasses.replace(getattr(tuned, g), tail=16) for g in ("gemm1", "gemm2") if getattr(tuned, g).wgmma}
    return mock.patch.object(layer.experts, "config_override", dataclasses.replace(tuned, **tail))


# qwen3-235b-a22b int4's one-token GEMM2 (mma kernel, 256 rows on 8 warps, split 4: 512 programs) holds three
# programs per SM (77 registers x 256 threads), so 116 of them run in a second wave; fewer programs, or
# smaller ones, fit one.
gemm2_split3 = _gemms({}, dict(split_k=3))
gemm2_split3_ring4 = _gemms({}, dict(split_k=3, num_stages=4))
gemm2_split2 = _gemms({}, dict(split_k=2))
gemm2_split2_ring6 = _gemms({}, dict(split_k=2, num_stages=6))
gemm2_n128_split3 = _gemms({}, dict(block_n=128, num_warps=4, split_k=3))


# GEMM1 on the mma kernel ranking its pairs' experts itself (`GemmConfig.own_route`), or waiting for the routing's.
own_route_on = _gemm1(own_route=True)
own_route_off = _gemm1(own_route=False)
# own_route pays where all of GEMM1's programs are resident from the start: smaller or fewer programs that
# fit one wave (qwen3-235b-a22b: 128 or 64 rows on 4 warps; gpt-oss-120b: split 3 of 23 K tiles).
gemm1_128w4 = _gemm1(block_n=128, num_warps=4)
gemm1_128w4_own = _gemm1(block_n=128, num_warps=4, own_route=True)
gemm1_64w4_own = _gemm1(block_n=64, num_warps=4, own_route=True)
gemm1_split3 = _gemm1(split_k=3)
gemm1_split3_own = _gemm1(split_k=3, own_route=True)


# An entry's aligned GEMM2 without its L2 prefetch before the wait (`GemmConfig.prefetch_tiles`).
gemm2_prefetch_off = _gemms({}, dict(prefetch_tiles=0))


def gemm2_block_ready(layer, tokens: int):
    served = layer.experts._find_config(tokens).config
    tl_dot = not any(g.mma or g.wgmma for g in (served.gemm1, served.gemm2))
    changed = dataclasses.replace(served, gemm2=dataclasses.replace(served.gemm2, block_ready=True)) if tl_dot else served
    return mock.patch.object(layer.experts, "config_override", changed)


# The shipped entries with GEMM2 waiting for all of GEMM1 again, at the token counts each entry serves.
gemm2_block_ready_off = _gemms({}, dict(block_ready=False))


def entry2(layer, tokens: int):
    """The 2-token entry at any token count: what an entry keyed 4 of that form would serve (3-5 tokens)."""
    return mock.patch.object(layer.experts, "config_override", layer.experts._find_config(2).config)


def entry8_block_ready_off(layer, tokens: int):
    """The 8-token entry without block_ready at any token count: what an entry keyed 4 of that form would serve."""
    served = layer.experts._find_config(8).config
    changed = dataclasses.replace(served, gemm2=dataclasses.replace(served.gemm2, block_ready=False))
    return mock.patch.object(layer.experts, "config_override", changed)


# gpt-oss-120b int4's 8-token GEMMs (256 rows: 231-240 registers, two programs per SM, GEMM1 in about three
# waves) on 128-row tiles, which hold four or five programs per SM.
gemm1_n128 = _gemm1(block_n=128)
gemm1_n128_s3 = _gemm1(block_n=128, num_stages=3)
both_n128 = _both_gemms(block_n=128)
both_n128_g16 = _gemms(dict(block_n=128, num_stages=3, group_m=16), dict(block_n=128, split_k=1, num_stages=3, group_m=16))


# gpt-oss-120b MXFP4's 8-token entry before its per-GEMM retune (both GEMMs grouped by 16, GEMM2 unsplit), and
# each of the retune's two changes alone.
gpt_oss_mxfp4_8_before = _gemms(dict(group_m=16), dict(group_m=16, split_k=1))
gpt_oss_mxfp4_8_grouped = _both_gemms(group_m=16)
gpt_oss_mxfp4_8_unsplit = _gemms({}, dict(split_k=1))


def tuned_entry(layer, tokens: int):
    """The entry nearest `tokens` in the layer's tuned-config file in $AB_TUNED_DIR (a `moe tune --out`
    folder, or copies of shipped files as they were)."""
    _, table = configs._parse_file(Path(os.environ["AB_TUNED_DIR"]) / layer.experts.config_key.file_name())
    return mock.patch.object(layer.experts, "config_override", table[configs._nearest_m(table, tokens)])


def _folded_regs(regs: int):
    """The wgmma kernel's 128-pair blocks (copies folded into its two consumer warpgroups) at `regs`
    registers per thread instead of `_heuristics.FOLDED_REGS`' 255 (8 warps x 32 x `regs`, rounded up
    to 8 per thread, must fit the 64K-register file)."""
    plan = dataclasses.replace(_heuristics.FOLDED_REGS, consumer_regs=regs, maxnreg=regs)

    def patch(layer, tokens: int):
        return mock.patch.object(_heuristics, "FOLDED_REGS", plan)
    return patch


# Offline (Triton 3.6): at 240 int4's and MXFP4's consumers reload two spilled values per K tile and
# int8's 17; at 248 int4 and MXFP4 spill nothing and int8 reloads 12-14; every build's wgmma asynchronous.
folded_regs_240 = _folded_regs(240)
folded_regs_248 = _folded_regs(248)


def int4_rows_scaled_per_weight(layer, tokens: int):
    """Per-channel int4 scaled per weight pair (the tl.dot kernel's 16 x 128 tiles: after each tile's dots,
    POST_SCALE) as grouped int4, not once per output (ROW_SCALE); int8 unchanged."""
    shipped = WeightOperand.one_scale_row.func
    return mock.patch.object(WeightOperand, "one_scale_row", property(lambda w: w.wtype is WType.INT8 and shipped(w)))


def scale_rows_one_by_one(layer, tokens: int):
    """The tl.dot kernel's scale rows loaded one 16-bit scale per thread in each K tile: no launch takes
    `quant_gemm._scale_pairs` (SCALE_PAIRS: int32 words of two, staged by cp.async)."""
    return mock.patch.object(quant_gemm, "_scale_pairs", lambda w, cfg: False)
