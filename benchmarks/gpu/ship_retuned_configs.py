"""Write shipped launch-shape files of a quantized family from a retune run (`run_moe_cuda.sh retune`).

A shipped file covers every token count of the benchmark (1 ... 8192): the kept tuned entries, and
elsewhere what the layer serves now (the family's shipped file where there is one, else what it
serves without a file), so only the kept cells change.
- A shipped file of the family and shape (int4: always): its kept entries replaced; its provenance
  record keeps the other token counts' measurements and takes the kept ones' (each with its method).
- mxfp4, int8 (per-channel symmetric): without its own file the family borrows the int4 file of its
  shape (`configs.BORROWED_FAMILIES`), its entries as MXFP4 or int8 serves them
  (`quantized.borrowed_as_served`).
- fp8-tensor / fp8-channel / fp8-block: without a file of this device the layer serves the same shape's
  file of another device where there is one (`configs.lookup_exact`), else `pick_config`'s heuristic,
  which depends on the GPU's multiprocessor count (--sms).
The tuner's record of the kept entries goes to benchmarks/results/tuned-configs/provenance.json.

    python benchmarks/gpu/ship_retuned_configs.py RETUNE_DIR --quant fp8-block \\
        --keep mixtral-8x7b:2048,8192 qwen3-30b-a3b:512 --device "NVIDIA H100 80GB HBM3" --note "why" \\
        [--sms 132] [--out packages/moe-triton/src/moe_triton/configs]

RETUNE_DIR holds PRESET/configs/ (the tuner's files and provenance) per preset.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from moe_core.presets import get_preset
from moe_triton import configs
from moe_triton._common.intmath import cdiv
from moe_triton.configs import ConfigKey, QuantKernelConfig, device_tag
from moe_triton.quant_gemm_details._heuristics import pick_config
from moe_triton.quant_gemm_details._layouts import WeightOperand, WType
from moe_triton.quantized import FP8_BLOCK_K, borrowed_as_served

ROOT = Path(__file__).resolve().parents[2]
PROVENANCE = ROOT / "benchmarks" / "results" / "tuned-configs" / "provenance.json"
TOKENS = (1, 8, 32, 128, 512, 2048, 8192)  # the benchmark's token counts
QUANTS = ("int4", "mxfp4", "int8", "fp8-tensor", "fp8-channel", "fp8-block")
# The tuner's kernel family per --quant where it is not the scheme's name.
KERNELS = {"int8": "wna16-int8-channel"}


def _borrowed_int4(key: ConfigKey, preset, out: Path, int8: bool) -> tuple[dict[int, QuantKernelConfig], str]:
    lender = dataclasses.replace(key, kernel=f"wna16-int4-g{preset.int4_group_size}")
    lent = json.loads((out / lender.file_name()).read_text())
    table = {int(m): borrowed_as_served(QuantKernelConfig.from_dict(c), int8=int8) for m, c in lent["configs"].items()}
    borrower = "int8" if int8 else "MXFP4"
    return table, f"{lender.file_name()}'s entries as {borrower} serves them (`borrowed_as_served`)"


def _fp8_heuristic(key: ConfigKey, sms: int) -> tuple[dict[int, QuantKernelConfig], str]:
    """`TritonFp8Experts.heuristic_config` at each benchmark token count on a GPU of `sms`
    multiprocessors (pick_config reads only the operands' sizes, so they hold no weights)."""

    def operand(n: int, k: int) -> WeightOperand:
        meta = torch.empty(key.num_experts, 0, device="meta")
        return WeightOperand(WType.FP8, meta, meta, None, n, cdiv(k, FP8_BLOCK_K) * FP8_BLOCK_K, 0, FP8_BLOCK_K, 0)

    w13, w2 = operand(2 * key.intermediate, key.hidden), operand(key.hidden, key.intermediate)
    table = {m: QuantKernelConfig(pick_config(m * key.top_k, key.num_experts, w13, sms),
                                  pick_config(m * key.top_k, key.num_experts, w2, sms)) for m in TOKENS}
    return table, f"pick_config's heuristic ({sms} multiprocessors)"


def ship(retune: Path, quant: str, preset: str, kept: list[int], device: str, sms: int, out: Path,
         note: str, shipped_records: dict) -> tuple[Path, dict]:
    p = get_preset(preset)
    cfg = p.config
    kernel = f"wna16-int4-g{p.int4_group_size}" if quant == "int4" else KERNELS.get(quant, quant)
    key = ConfigKey(kernel, cfg.num_experts, cfg.intermediate_size, cfg.hidden_size, cfg.top_k, "bfloat16",
                    device_tag(device))
    own = out / key.file_name()
    had_own = own.exists()
    if had_own:  # a file of the family's own (int4 always): its other entries stay as shipped
        shipped = json.loads(own.read_text())
        table = {int(m): QuantKernelConfig.from_dict(c) for m, c in shipped["configs"].items()}
    elif quant == "int4":
        raise FileNotFoundError(f"{own}: int4 retunes replace entries of a shipped file")
    elif quant in ("mxfp4", "int8"):
        table, served = _borrowed_int4(key, p, out, int8=quant == "int8")
    elif others := sorted(out.glob(dataclasses.replace(key, device="*").file_name())):
        lent = json.loads(others[0].read_text())
        table = {int(m): QuantKernelConfig.from_dict(c) for m, c in lent["configs"].items()}
        served = f"{others[0].name}'s entries (served from another device before)"
    else:
        table, served = _fp8_heuristic(key, sms)
    tuned_dir = retune / preset / "configs"
    tuned = json.loads((tuned_dir / key.file_name()).read_text())
    record = json.loads((tuned_dir / "provenance" / key.file_name()).read_text())
    for m in kept:
        table[m] = QuantKernelConfig.from_dict(tuned["configs"][str(m)])
    versions = {f: tuned[f] for f in ("device_name", "triton_version", "torch_version")}
    path = configs.write_configs(key, table, out, versions)
    if had_own:
        provenance = shipped_records[path.name]
        for m in kept:
            provenance["measured_us"][str(m)] = {**record["measured_us"][str(m)], "method": record["method"],
                                                 "retuned": note}
        return path, provenance
    provenance = {
        "model": preset,
        "method": f"{served}; M in {kept} from {record['method']}",
        "measured_us": {str(m): record["measured_us"][str(m)] for m in kept},
        "retuned": note,
    }
    return path, provenance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("retune", type=Path)
    parser.add_argument("--quant", choices=QUANTS, required=True)
    parser.add_argument("--keep", nargs="+", required=True, help="preset:M,M (tuned entries to ship)")
    parser.add_argument("--device", required=True, help="the GPU's name, as torch reports it")
    parser.add_argument("--sms", type=int, default=132, help="its multiprocessors (fp8: the heuristic's splits)")
    parser.add_argument("--note", required=True, help="what measured the kept entries")
    parser.add_argument("--out", type=Path, default=ROOT / "packages/moe-triton/src/moe_triton/configs")
    args = parser.parse_args(argv)
    records = json.loads(PROVENANCE.read_text())
    for item in args.keep:
        preset, _, ms = item.partition(":")
        path, record = ship(args.retune, args.quant, preset, [int(m) for m in ms.split(",")], args.device,
                            args.sms, args.out, args.note, records)
        records[path.name] = record
        print("wrote", path)
    PROVENANCE.write_text(json.dumps(dict(sorted(records.items())), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
