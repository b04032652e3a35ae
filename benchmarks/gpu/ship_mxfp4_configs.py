"""Write shipped MXFP4 launch-shape files from a retune run (`run_moe_cuda.sh retune`).

MXFP4 borrows the int4 file of its shape (`moe_triton.configs.BORROWED_FAMILIES`). Where tuning
found faster MXFP4 shapes for some token counts, an MXFP4 file of that shape replaces the borrowing
for every token count: the int4 entries as MXFP4 serves them (`quantized.borrowed_as_served`), with
the kept tuned entries in their place. The tuner's record of the kept entries goes to
benchmarks/results/tuned-configs/provenance.json.

    python benchmarks/gpu/ship_mxfp4_configs.py RETUNE_DIR --keep deepseek-v3:512 gpt-oss-120b:32,2048 \\
        --device "NVIDIA H100 80GB HBM3" --note "why" [--out packages/moe-triton/src/moe_triton/configs]

RETUNE_DIR holds PRESET/configs/ (the tuner's files and provenance) per preset.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from moe_core.presets import get_preset
from moe_triton import configs
from moe_triton.configs import ConfigKey, QuantKernelConfig, device_tag
from moe_triton.quantized import borrowed_as_served

ROOT = Path(__file__).resolve().parents[2]
PROVENANCE = ROOT / "benchmarks" / "results" / "tuned-configs" / "provenance.json"


def ship(retune: Path, preset: str, kept: list[int], device: str, out: Path, note: str) -> tuple[Path, dict]:
    p = get_preset(preset)
    cfg = p.config
    key = ConfigKey("mxfp4", cfg.num_experts, cfg.intermediate_size, cfg.hidden_size, cfg.top_k, "bfloat16",
                    device_tag(device))
    lender = dataclasses.replace(key, kernel=f"wna16-int4-g{p.int4_group_size}")
    lent = json.loads((out / lender.file_name()).read_text())
    table = {int(m): borrowed_as_served(QuantKernelConfig.from_dict(c)) for m, c in lent["configs"].items()}
    tuned_dir = retune / preset / "configs"
    tuned = json.loads((tuned_dir / key.file_name()).read_text())
    record = json.loads((tuned_dir / "provenance" / key.file_name()).read_text())
    for m in kept:
        table[m] = QuantKernelConfig.from_dict(tuned["configs"][str(m)])
    versions = {f: tuned[f] for f in ("device_name", "triton_version", "torch_version")}
    path = configs.write_configs(key, table, out, versions)
    provenance = {
        "model": preset,
        "method": f"{lender.file_name()}'s entries as MXFP4 serves them (wgmma stages capped at 3); "
                  f"M in {kept} from {record['method']}",
        "measured_us": {str(m): record["measured_us"][str(m)] for m in kept},
        "retuned": note,
    }
    return path, provenance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("retune", type=Path)
    parser.add_argument("--keep", nargs="+", required=True, help="preset:M,M (tuned entries to ship)")
    parser.add_argument("--device", required=True, help="the GPU's name, as torch reports it")
    parser.add_argument("--note", required=True, help="what measured the kept entries")
    parser.add_argument("--out", type=Path, default=ROOT / "packages/moe-triton/src/moe_triton/configs")
    args = parser.parse_args(argv)
    records = json.loads(PROVENANCE.read_text())
    for item in args.keep:
        preset, _, ms = item.partition(":")
        path, record = ship(args.retune, preset, [int(m) for m in ms.split(",")], args.device, args.out, args.note)
        records[path.name] = record
        print("wrote", path)
    PROVENANCE.write_text(json.dumps(dict(sorted(records.items())), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
