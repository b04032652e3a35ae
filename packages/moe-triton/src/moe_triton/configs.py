"""Tuned launch configurations: a JSON database keyed by kernel, shape, dtype and device.

A file holds the best configuration per token count M for one key; `lookup` picks the nearest
tuned M. When no file matches the key exactly it falls back, in order, to the nearest tuned shape
on the same device, then to the same shape tuned on another device, then to a heuristic default;
the returned `Lookup.source` always says which, so nothing degrades silently.

Two families of entries: `KernelConfig` for the bf16/fp16 kernels (kernel "bf16") and
`QuantKernelConfig` for the quantized grouped GEMM (kernel names starting "wna16-", e.g.
"wna16-int4-g128", "fp8-" by weight scale granularity, e.g. "fp8-block", and "mxfp4"). The
quantized experts only take a file of their exact shape (`lookup_exact`; MXFP4 and symmetric int8
without a file of their shape for this device, the int4 one: `BORROWED_FAMILIES`);
otherwise their own shape-aware heuristic (`quant_gemm_details._heuristics.pick_config`) applies.
A quantized entry may also set `fused` (`FusedDecodeConfig`): calls of up to 8 tokens then run the
one-launch decode path (`moe_triton.fused_decode`) instead of its GEMMs; a borrowed entry drops it
(its options were measured for the lender's weights). `TunedLaunch` is the experts classes' `config_for`.

A file holds only what the lookup reads: "key", "configs" (tuned M -> configuration) and the
versions it was tuned under; the tuner's timings go to a side file (`write_configs`).

Files are read from the package's `configs/` folder and from `$MOE_TRITON_CONFIG_DIR` (searched
first, so a user's own `moe tune` output wins).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from abc import abstractmethod
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path

__all__ = [
    "BORROWED_FAMILIES",
    "ConfigKey",
    "FusedDecodeConfig",
    "GemmConfig",
    "KernelConfig",
    "Lookup",
    "QuantKernelConfig",
    "TileConfig",
    "TunedLaunch",
    "config_dirs",
    "default_config",
    "device_tag",
    "lender_lookup",
    "lookup",
    "lookup_exact",
    "reload",
    "write_configs",
]

ENV_DIR = "MOE_TRITON_CONFIG_DIR"
PACKAGE_DIR = Path(__file__).parent / "configs"


@dataclass(frozen=True)
class TileConfig:
    """One GEMM's tiling. Every size is a power of two; block_k >= 16 and block_n >= 16 (tl.dot).

    direct: the decode kernel instead of the grouped GEMM (see `moe_triton.gemm_details._direct`):
    no tl.dot, so block_n may be as small as 1; group_m is unused there.
    tma: the grouped GEMM reads the weights through a tensor descriptor (the copy engine).
    wgmma: NVIDIA Hopper only, 16-bit layers: the Gluon grouped GEMM (`moe_triton.gemm_details._wgmma`):
    block_k 64, num_warps 8 (two consumer warpgroups), num_stages >= 2 (its ring); its weight rows
    per program (block_n, gated twice that) must be 128 or 256 and the layer's block_m 64 or 128.
    narrow: the tl.dot grouped GEMM multiplies only the valid half of a block that has no more (an
    expert's last); the layer's block_m must be 64 or more. (The wgmma kernel always does.)
    persistent: the wgmma kernel as one program per SM looping over the tiles, a loader warpgroup
    filling the ring (`_wgmma.moe_gemm_wgmma_persistent_kernel`): a tile's epilogue overlaps
    the next tile's copies. wgmma tiles only.
    tail: 0, or 16 / 32 with persistent (below the wgmma kernel's blocks of 64 or 128 rows): a full
    block takes in its expert's last block when that holds at most `tail` rows, so the expert's
    weights are read once less.
    """

    block_n: int
    block_k: int
    group_m: int  # row blocks that share B tiles in the launch order (L2 reuse); >= 1
    num_warps: int
    num_stages: int  # software-pipelining depth of the K loop; >= 1
    direct: bool = False
    tma: bool = False
    wgmma: bool = False
    narrow: bool = False
    persistent: bool = False
    tail: int = 0

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k"):
            v = getattr(self, name)
            least = 1 if (self.direct and name == "block_n") else 16
            if v < least or v & (v - 1):
                raise ValueError(f"TileConfig.{name}={v} must be a power of two >= {least}")
        if self.direct and self.tma:
            raise ValueError("TileConfig: the direct kernel reads no tiles through a descriptor (tma)")
        if self.group_m < 1 or self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"TileConfig: group_m, num_warps and num_stages must be >= 1, got {self}")
        if self.wgmma and (self.direct or self.tma or self.block_k != 64 or self.num_warps != 8
                           or self.num_stages < 2 or self.block_n > 256):
            raise ValueError("TileConfig: the wgmma kernel takes block_k 64, num_warps 8, num_stages >= 2, "
                             f"block_n <= 256, neither direct nor tma, got {self}")
        if self.persistent and not self.wgmma:
            raise ValueError(f"TileConfig: persistent is an option of the wgmma kernel, got {self}")
        if self.tail not in (0, 16, 32) or (self.tail and not self.persistent):
            raise ValueError(f"TileConfig: tail is 0, or 16 or 32 with the persistent wgmma kernel, got {self}")
        if self.narrow and (self.direct or self.wgmma):
            raise ValueError(f"TileConfig: narrow is an option of the tl.dot grouped GEMM, not of the direct or "
                             f"wgmma kernels, got {self}")


@dataclass(frozen=True)
class KernelConfig:
    block_m: int  # rows per block of the sorted token ids, shared by both tiled GEMMs (one alignment); pow2 >= 16
    gemm1: TileConfig
    gemm2: TileConfig

    def __post_init__(self) -> None:
        if self.block_m < 16 or self.block_m & (self.block_m - 1):
            raise ValueError(f"KernelConfig.block_m={self.block_m} must be a power of two >= 16")
        if (self.gemm1.wgmma or self.gemm2.wgmma) and self.block_m not in (64, 128):
            raise ValueError(f"KernelConfig: the wgmma kernel takes blocks of 64 or 128 rows, got block_m={self.block_m}")
        if (self.gemm1.narrow or self.gemm2.narrow) and self.block_m < 64:
            raise ValueError(f"KernelConfig: narrow tiles need blocks of 64 rows or more, got block_m={self.block_m}")

    def to_dict(self) -> dict:
        return {"block_m": self.block_m, "gemm1": _set_fields(self.gemm1), "gemm2": _set_fields(self.gemm2)}

    @staticmethod
    def from_dict(d: dict) -> KernelConfig:
        return KernelConfig(int(d["block_m"]), TileConfig(**d["gemm1"]), TileConfig(**d["gemm2"]))

    def __str__(self) -> str:
        def t(c: TileConfig) -> str:
            if c.direct:
                return f"direct {c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages}"
            if c.wgmma:
                return (f"wgmma {c.block_n}x{c.block_k} g{c.group_m} s{c.num_stages}"
                        f"{' persistent' if c.persistent else ''}{f' tail{c.tail}' if c.tail else ''}")
            return (f"{c.block_n}x{c.block_k} g{c.group_m} w{c.num_warps} s{c.num_stages}{' tma' if c.tma else ''}"
                    f"{' narrow' if c.narrow else ''}")
        return f"BM{self.block_m} | gemm1 {t(self.gemm1)} | gemm2 {t(self.gemm2)}"


def _set_fields(c: TileConfig | GemmConfig | FusedDecodeConfig) -> dict:
    """A GEMM's fields without those at their default (`from_dict` restores them): what a file needs."""
    return {f.name: getattr(c, f.name) for f in fields(c)
            if f.default is MISSING or getattr(c, f.name) != f.default}


def _pow2(v: int) -> bool:
    return v >= 1 and not v & (v - 1)


@dataclass(frozen=True)
class GemmConfig:
    """Launch shape of one quantized grouped GEMM (`moe_triton.quant_gemm`)."""

    block_m: int  # pairs per block: the align block size the sorted ids were built with; pow2 >= 16
    block_n: int  # pow2 >= 16
    split_k: int  # K splits summed atomically; >= 1
    num_warps: int
    num_stages: int
    # out^T = W . X^T (the kernel's SWAP_AB): required by 4-bit weights and quads, an option of fp8 (Hopper's
    # fp8 wgmma for blocks below 64 pairs), ignored by canonical int8
    swap_ab: bool = False
    # int4 quads on NVIDIA Hopper only: the Gluon kernel with warp-specialized asynchronous wgmma
    # (`quant_gemm_details._wgmma`); then swap_ab, block_m <= 128, block_n 128 or 256 (two consumer
    # warpgroups of half the rows each), num_warps 4 (a consumer warpgroup; 8 or 12 warps run in all)
    # and num_stages >= 3 (its ring).
    wgmma: bool = False
    # An aligned block with at most block_m / 2 valid pairs (an expert's last) runs its dots over
    # that half only (a direct launch's blocks hold one pair: there it changes nothing). tl.dot
    # kernel, block_m >= 32 (the wgmma kernel narrows its 128-pair blocks itself).
    narrow: bool = False
    # int4 quads: 0, or a full block whose expert's next block holds at most `tail` valid pairs (that
    # expert's last) multiplies them too, with the same dequantized weights, and the next block's
    # program exits (one dequantization of the expert less). wgmma kernel: 8 or 16 with 128-pair
    # blocks; tl.dot kernel (its dots are at least 16 wide): 16 or 32, below block_m, swapped.
    tail: int = 0
    # tl.dot kernel: M blocks launched in groups of group_m, M fastest within a group and the group's N
    # tiles in turn (1: block by block, N tiles fastest, as TileConfig.group_m 1): the programs running
    # together read each weight tile once for the group's blocks (an expert's several blocks at large
    # M) from DRAM, and hold only the group's activation rows in L2. Launches that put M blocks first
    # by construction (one token: direct; up to 8: last-arrival sums) keep their order. >= 1
    group_m: int = 1
    # tl.dot and mma kernels on NVIDIA: registers per thread the launch may hold (ptxas's maxnreg); 0: the
    # compiler's choice. A cap lets more programs share an SM, and spills where the build needs more.
    # 0 or 32..255.
    max_registers: int = 0
    # tl.dot kernel, quads weights: each K tile's four quarters as one dot (one wgmma chain and one wait
    # per tile), not four; other weights ignore it.
    one_dot: bool = False
    # int4, int8 or MXFP4 quads on NVIDIA (sm_80 and later), direct launches or blocks of block_m pairs: the
    # hand-scheduled mma.sync kernel (`quant_gemm_details._mma`) instead of the tl.dot one; GEMM1's
    # gated activation then finishes by last arrival. block_n a multiple of 16 x num_warps (16 rows
    # per warp at least); K tiles per split (cdiv(K / 128, split_k)) at most `_mma.MAX_TILES`;
    # num_stages the K tiles of words in flight (its cp.async ring; 2 at least).
    mma: bool = False
    # GEMM1 on the mma kernel, FusedMoE's one-token calls whose routing chooses experts by their logits
    # (a softmax over ungrouped experts, no bias) and no expert map: its programs rank their pair's
    # expert from the logits as the routing launch does and run their split while that launch still
    # runs (`quant_gemm.direct_quant_gemm`'s own_route). Faster where every program is resident from
    # the start; a program of a later wave only adds the ranking to its time.
    own_route: bool = False
    # The mma kernel: each K tile's scale rows (zero points, MXFP4's exponent words) loaded in the tile, a
    # round trip its sums wait on, instead of copied with its words into the ring (where the rows split
    # into 16-byte pieces); the copies' sums can hold more registers, which costs programs per SM.
    scales_in_tile: bool = False
    # GEMM2 of an aligned launch on the tl.dot kernel, quads weights, dependent launches: each program asks
    # L2 for its first prefetch_tiles K tiles of weights (and their scales) before its wait, while GEMM1
    # still streams; its expert is the alignment's, complete before GEMM1 started (a direct GEMM2 always
    # asks for `L2_PREFETCH_TILES`). Pays where GEMM1's last wave leaves DRAM idle; more tiles compete
    # with GEMM1's stream. 0..8; gemm1 0.
    prefetch_tiles: int = 0
    # GEMM2 right behind a GEMM1 that stores its input (16-bit activations; fp8's quantization launch sits
    # between them otherwise, and there it changes nothing), both on the tl.dot kernel: each program waits
    # for its own block of GEMM1's rows, counted as GEMM1's programs store them (`quant_gemm.BlockReady`),
    # instead of for all of GEMM1, so GEMM2 runs in the slots GEMM1's last wave leaves free. gemm1 False.
    block_ready: bool = False

    def on_tl_dot(self) -> GemmConfig:
        """The same launch shape on the tl.dot kernel: the mma kernel's options, and a register cap set for
        its build, dropped."""
        return replace(self, mma=False, own_route=False, scales_in_tile=False,
                       max_registers=0 if self.mma else self.max_registers)

    def __post_init__(self) -> None:
        if not 0 <= self.prefetch_tiles <= 8 or (self.prefetch_tiles and (self.wgmma or self.mma)):
            raise ValueError(f"GemmConfig: prefetch_tiles is 0..8, an option of the tl.dot kernel, got {self}")
        if self.block_ready and (self.wgmma or self.mma):
            raise ValueError(f"GemmConfig: block_ready is an option of the tl.dot kernel, got {self}")
        if (self.own_route or self.scales_in_tile) and not self.mma:
            raise ValueError(f"GemmConfig: own_route and scales_in_tile are options of the mma kernel, got {self}")
        if self.block_m < 16 or not _pow2(self.block_m) or self.block_n < 16 or not _pow2(self.block_n):
            raise ValueError(f"GemmConfig: block_m and block_n must be powers of two >= 16, got {self}")
        if self.mma and (self.wgmma or self.one_dot or self.narrow or self.tail or self.group_m > 1
                         or self.block_n % (16 * self.num_warps)):
            raise ValueError("GemmConfig: the mma kernel takes none of wgmma, one_dot, narrow, tail or group_m, and "
                             f"block_n a multiple of 16 x num_warps, got {self}")
        if self.one_dot and self.wgmma:
            raise ValueError(f"GemmConfig: one_dot is an option of the tl.dot kernel, got {self}")
        if self.max_registers and (self.wgmma or not 32 <= self.max_registers <= 255):
            raise ValueError("GemmConfig: max_registers is 0 or 32..255, an option of the tl.dot and mma kernels (the "
                             f"wgmma kernel plans its own), got {self}")
        if self.group_m < 1 or (self.group_m > 1 and self.wgmma):
            raise ValueError(f"GemmConfig: group_m is >= 1, and above 1 an option of the tl.dot kernel, got {self}")
        if self.split_k < 1 or self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"GemmConfig: split_k, num_warps and num_stages must be >= 1, got {self}")
        if self.narrow and (self.wgmma or self.block_m < 32):
            raise ValueError("GemmConfig: narrow is an option of the tl.dot kernel with block_m >= 32 (the wgmma "
                             f"kernel narrows its 128-pair blocks itself), got {self}")
        if self.wgmma and not (self.swap_ab and self.block_m <= 128 and self.block_n in (128, 256)
                               and self.num_warps == 4 and self.num_stages >= 3):
            raise ValueError("GemmConfig: the wgmma kernel takes swap_ab, block_m <= 128, block_n 128 or 256, "
                             f"num_warps 4 and num_stages >= 3, got {self}")
        if self.tail and self.wgmma and not (self.tail in (8, 16) and self.block_m == 128):
            raise ValueError("GemmConfig: tail (8 or 16 pairs taken in by the block before) is an option of the "
                             f"wgmma kernel with block_m 128, got {self}")
        if self.tail and not self.wgmma and not (self.tail in (16, 32) and self.tail < self.block_m and self.swap_ab):
            raise ValueError("GemmConfig: tail (16 or 32 pairs taken in by the block before) is an option of the "
                             f"swapped tl.dot kernel with block_m above it, got {self}")


@dataclass(frozen=True)
class FusedDecodeConfig:
    """Launch options of the one-launch decode path (`moe_triton.fused_decode.FusedDecode`)."""

    channels: int  # intermediate channels per program: 128 (one w2 K tile) or 64
    num_warps: int  # pow2
    block_h: int  # GEMM2's output rows per step; pow2 >= 16
    # Programs sharing one slice's K tiles in GEMM1 (1, 2, 4 or 8): their partial sums meet at L2 and
    # the last to arrive runs the activation and GEMM2, so GEMM1 spreads over k_split x the programs.
    k_split: int = 1

    def __post_init__(self) -> None:
        if self.k_split not in (1, 2, 4, 8):
            raise ValueError(f"FusedDecodeConfig: k_split must be 1, 2, 4 or 8, got {self.k_split}")
        if self.channels not in (64, 128):
            raise ValueError(f"FusedDecodeConfig: channels must be 64 or 128, got {self.channels}")
        if not _pow2(self.num_warps):
            raise ValueError(f"FusedDecodeConfig: num_warps must be a power of two, got {self.num_warps}")
        if self.block_h < 16 or not _pow2(self.block_h):
            raise ValueError(f"FusedDecodeConfig: block_h must be a power of two >= 16, got {self.block_h}")


@dataclass(frozen=True)
class QuantKernelConfig:
    gemm1: GemmConfig
    gemm2: GemmConfig  # same block_m as gemm1: both GEMMs read one alignment
    # Set (by a tuned file, where it measured faster): calls of up to `fused_decode.MAX_TOKENS` tokens
    # run the whole layer in one launch with these options; larger ones (a file's nearest entry) the GEMMs.
    fused: FusedDecodeConfig | None = None

    def __post_init__(self) -> None:
        if self.gemm1.block_m != self.gemm2.block_m:
            raise ValueError(f"QuantKernelConfig: both GEMMs share one block_m, got {self.gemm1.block_m} "
                             f"and {self.gemm2.block_m}")
        if self.gemm1.prefetch_tiles:
            raise ValueError("QuantKernelConfig: prefetch_tiles is GEMM2's (GEMM1's experts come from the launch "
                             f"right before it), got gemm1 {self.gemm1}")
        if self.gemm1.block_ready or (self.gemm2.block_ready and (self.gemm1.mma or self.gemm1.wgmma)):
            raise ValueError("QuantKernelConfig: block_ready is GEMM2's, behind a GEMM1 on the tl.dot kernel (which "
                             f"counts its blocks), got {self}")

    def to_dict(self) -> dict:
        d = {"gemm1": _set_fields(self.gemm1), "gemm2": _set_fields(self.gemm2)}
        if self.fused is not None:
            d["fused"] = _set_fields(self.fused)
        return d

    @staticmethod
    def from_dict(d: dict) -> QuantKernelConfig:
        fused = FusedDecodeConfig(**d["fused"]) if "fused" in d else None
        return QuantKernelConfig(GemmConfig(**d["gemm1"]), GemmConfig(**d["gemm2"]), fused)

    def __str__(self) -> str:
        def t(c: GemmConfig) -> str:
            return (f"{c.block_n} split{c.split_k} w{c.num_warps} s{c.num_stages}{' swap' if c.swap_ab else ''}"
                    f"{' wgmma' if c.wgmma else ''}{' narrow' if c.narrow else ''}{f' tail{c.tail}' if c.tail else ''}"
                    f"{f' group{c.group_m}' if c.group_m > 1 else ''}{' one-dot' if c.one_dot else ''}"
                    f"{f' regs{c.max_registers}' if c.max_registers else ''}{' mma' if c.mma else ''}"
                    f"{' own-route' if c.own_route else ''}{' scales-in-tile' if c.scales_in_tile else ''}"
                    f"{f' prefetch{c.prefetch_tiles}' if c.prefetch_tiles else ''}"
                    f"{' block-ready' if c.block_ready else ''}")
        fused = self.fused
        one = (f" | fused c{fused.channels} w{fused.num_warps} h{fused.block_h} k{fused.k_split}"
               if fused is not None else "")
        return f"BM{self.gemm1.block_m} | gemm1 {t(self.gemm1)} | gemm2 {t(self.gemm2)}{one}"


def _entry_type(kernel: str) -> type[KernelConfig] | type[QuantKernelConfig]:
    quantized = kernel.startswith(("wna16-", "fp8-")) or kernel in BORROWED_FAMILIES
    return QuantKernelConfig if quantized else KernelConfig


@dataclass(frozen=True)
class ConfigKey:
    kernel: str  # which kernel family the tiles are for: "bf16"; "wna16-...", "mxfp4", "fp8-..." for the quantized GEMM
    num_experts: int  # local experts E
    intermediate: int  # N per partition
    hidden: int  # K
    top_k: int
    dtype: str  # activation dtype, e.g. "bfloat16"
    device: str  # device_tag() of the GPU, e.g. "NVIDIA_H100_80GB_HBM3"

    def file_name(self) -> str:
        return (f"{self.kernel},E={self.num_experts},N={self.intermediate},K={self.hidden},topk={self.top_k},"
                f"dtype={self.dtype},device={self.device}.json")

    def shape_distance(self, other: ConfigKey) -> float:
        pairs = ((self.num_experts, other.num_experts), (self.intermediate, other.intermediate),
                 (self.hidden, other.hidden), (self.top_k, other.top_k))
        return sum(abs(math.log2(a / b)) for a, b in pairs)


@dataclass(frozen=True)
class Lookup:
    config: KernelConfig | QuantKernelConfig  # by the key's kernel family
    source: str  # "tuned", "nearest-shape", "other-device", "borrowed" or "default"
    detail: str  # the file and tuned M it came from, or why the default was used

    def __str__(self) -> str:
        return f"{self.config} [{self.source}: {self.detail}]"


def device_tag(name: str) -> str:
    """A file-name-safe device name: 'NVIDIA H100 80GB HBM3' -> 'NVIDIA_H100_80GB_HBM3'."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", name.strip()) or "unknown"


def config_dirs() -> list[Path]:
    extra = os.environ.get(ENV_DIR)
    return ([Path(extra)] if extra else []) + [PACKAGE_DIR]


_lock = threading.Lock()
_Table = dict[int, KernelConfig] | dict[int, QuantKernelConfig]
_db: dict[ConfigKey, tuple[Path, _Table]] | None = None


def _parse_file(path: Path) -> tuple[ConfigKey, _Table]:
    data = json.loads(path.read_text())
    try:
        key = ConfigKey(**data["key"])
        entry = _entry_type(key.kernel)
        table = {int(m): entry.from_dict(c) for m, c in data["configs"].items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed tuned-config file {path}: {type(exc).__name__}: {exc}") from exc
    if not table:
        raise ValueError(f"tuned-config file {path} holds no configurations")
    return key, table


def _load() -> dict[ConfigKey, tuple[Path, _Table]]:
    global _db
    with _lock:
        if _db is None:
            db: dict[ConfigKey, tuple[Path, _Table]] = {}
            for folder in config_dirs():
                if not folder.is_dir():
                    continue
                for path in sorted(folder.glob("*.json")):
                    key, table = _parse_file(path)
                    db.setdefault(key, (path, table))  # earlier folders win
            _db = db
        return _db


def reload() -> None:
    """Forget the loaded files (after writing new ones or changing $MOE_TRITON_CONFIG_DIR)."""
    global _db
    with _lock:
        _db = None


def _nearest_m(table: _Table, M: int) -> int:
    # Nearest in log space; ties go to the larger tuned M (more blocks, the safer tiling).
    return min(table, key=lambda m: (abs(math.log2(m) - math.log2(max(M, 1))), -m))


def default_config(key: ConfigKey, M: int) -> KernelConfig:
    """A reasonable tiling when nothing was tuned, from tokens per expert."""
    per_expert = M * key.top_k / key.num_experts
    if per_expert <= 16:
        small = TileConfig(64, 128, 1, 4, 3)
        return KernelConfig(16, small, small)
    if per_expert <= 64:
        return KernelConfig(64, TileConfig(64, 128, 8, 4, 3), TileConfig(64, 128, 8, 4, 3))
    return KernelConfig(128, TileConfig(128, 64, 8, 8, 3), TileConfig(128, 64, 8, 8, 3))


def _hit(db: dict[ConfigKey, tuple[Path, _Table]], key: ConfigKey, M: int, source: str) -> Lookup:
    path, table = db[key]
    m = _nearest_m(table, M)
    return Lookup(table[m], source, f"{path.name} at M={m}")


def lookup(key: ConfigKey, M: int) -> Lookup:
    db = _load()
    if key in db:
        return _hit(db, key, M, "tuned")
    same_family = [k for k in db if (k.kernel, k.dtype) == (key.kernel, key.dtype)]
    for source, pool in (("nearest-shape", [k for k in same_family if k.device == key.device]),
                         ("other-device", [k for k in same_family if k.device != key.device])):
        if pool:
            best = min(pool, key=lambda k: (key.shape_distance(k), k.file_name()))
            if source == "other-device" and key.shape_distance(best) > 0:
                continue
            return _hit(db, best, M, source)
    return Lookup(default_config(key, M), "default", f"no tuned file for {key.file_name()}")


# Quantized families that take another family's launch shapes where no file of their own covers the
# shape on this device (`lookup_exact`): MXFP4 runs the int4 quads kernels (the same words, a scale
# per 32 k) on about the same bytes, 4.25 bits per weight against int4's 4.125 at groups of 128;
# symmetric int8 runs them on words of four bytes (`_layouts.ByteQuadsLayout`, which per-channel and
# 128-group int8 codes always take, K padded where needed), the same tiles over twice the bytes.
BORROWED_FAMILIES = {"mxfp4": re.compile(r"wna16-int4-g(\d+)"),
                     **{f"wna16-int8-{group}": re.compile(r"wna16-int4-g(\d+)") for group in ("channel", "g128")}}


def _lenders(db: dict[ConfigKey, tuple[Path, _Table]], key: ConfigKey) -> list[ConfigKey]:
    """The files of key's lender family (BORROWED_FAMILIES) of exactly key's shape, on any device: the
    smallest group first (scaled per weight, as MXFP4 is)."""
    lender = BORROWED_FAMILIES.get(key.kernel)
    if lender is None:
        return []
    lent = (k for k in db if lender.fullmatch(k.kernel) and replace(k, kernel=key.kernel, device=key.device) == key)
    return sorted(lent, key=lambda k: (int(lender.fullmatch(k.kernel).group(1)), k.file_name()))


def lender_lookup(key: ConfigKey, M: int) -> Lookup | None:
    """The lender's entry (`_lenders`) of exactly key's shape on key's device, as it is in the lender's
    file ("borrowed"); None if there is none."""
    db = _load()
    here = [k for k in _lenders(db, key) if k.device == key.device]
    return _hit(db, here[0], M, "borrowed") if here else None


def lookup_exact(key: ConfigKey, M: int) -> Lookup | None:
    """A file of exactly this shape: tuned on this device; for a family of BORROWED_FAMILIES, else a
    lender's file of this shape on this device (`lender_lookup`), since launch shapes follow the device
    more than the scheme; else the family's own file from another device ("other-device"); else a
    lender's from another device; None if none."""
    db = _load()
    if key in db:
        return _hit(db, key, M, "tuned")
    if (lent_here := lender_lookup(key, M)) is not None:
        return lent_here
    others = sorted((k for k in db if replace(k, device=key.device) == key), key=ConfigKey.file_name)
    if others:
        return _hit(db, others[0], M, "other-device")
    lent = _lenders(db, key)
    return _hit(db, lent[0], M, "borrowed") if lent else None


def write_configs(key: ConfigKey, table: _Table, folder: Path, versions: dict[str, str] | None = None,
                  provenance: dict | None = None) -> Path:
    """Writes `folder/<key.file_name()>` with what the lookup reads (the key and one configuration
    per tuned M, a line each) and `versions` (device_name, triton_version, torch_version). The
    tuner's `provenance` (timings, method) goes to `folder/provenance/<same name>`, outside the
    folder the lookup reads."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / key.file_name()
    head = {"key": asdict(key), **(versions or {})}
    lines = [f" {json.dumps(name)}: {json.dumps(value)}," for name, value in head.items()]
    rows = [f"  {json.dumps(str(m))}: {json.dumps(table[m].to_dict())}" for m in sorted(table)]
    path.write_text("{\n" + "\n".join(lines) + '\n "configs": {\n' + ",\n".join(rows) + "\n }\n}\n")
    if provenance is not None:
        (folder / "provenance").mkdir(exist_ok=True)
        (folder / "provenance" / key.file_name()).write_text(json.dumps(provenance, indent=1) + "\n")
    return path


class TunedLaunch:
    """`config_for` of the Triton experts classes. An instance's `config_override` (tests, the
    tuner) wins; otherwise each token count's `_find_config` is looked up once per instance.
    Subclasses set `config_override = None` and `_lookups = {}` in `__init__`, and say in
    `_find_config` which files they take and what they fall back to."""

    config_override: KernelConfig | QuantKernelConfig | None
    _lookups: dict[int, Lookup]

    def config_for(self, num_tokens: int) -> Lookup:
        """The launch configuration of a call of num_tokens tokens, and where it came from."""
        if self.config_override is not None:
            return Lookup(self.config_override, "override", "set on this instance")
        hit = self._lookups.get(num_tokens)
        if hit is None:
            hit = self._lookups[num_tokens] = self._find_config(num_tokens)
        return hit

    @abstractmethod
    def _find_config(self, num_tokens: int) -> Lookup:
        """The launch configuration for num_tokens tokens from the files this class takes."""
