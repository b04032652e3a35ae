"""Merge the entries of a partial `moe tune` run into full config files.

Each tuned file's token counts replace those entries (config and measured times) of the file of
the same name in BASE; the other token counts keep BASE's entries, and the `retuned` note gains a
line saying which were replaced and why. Files only in TUNED are copied. The result goes to OUT (may be BASE).

    python benchmarks/gpu/merge_tuned.py BASE TUNED OUT --note "why these token counts were retuned"

For example after `python -m moe_triton.tune --m 2048 8192 --out TUNED`, with BASE the shipped
`moe_triton/configs` folder.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def merge(base: Path, tuned: Path, out: Path, note: str) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for new_path in sorted(tuned.glob("*.json")):
        new = json.loads(new_path.read_text())
        old_path = base / new_path.name
        merged = json.loads(old_path.read_text()) if old_path.exists() else dict(new)
        ms = sorted(new["configs"], key=int)
        for field in ("configs", "measured_us"):
            merged.setdefault(field, {}).update(new.get(field, {}))
            merged[field] = dict(sorted(merged[field].items(), key=lambda kv: int(kv[0])))
        for field in ("device_name", "triton_version", "torch_version"):
            merged[field] = new.get(field, merged.get(field))
        line = f"M in [{', '.join(ms)}] retuned on {time.strftime('%Y-%m-%d')} ({note})"
        merged["retuned"] = f"{merged['retuned']}; {line}" if "retuned" in merged else line
        (out / new_path.name).write_text(json.dumps(merged, indent=1) + "\n")
        done.append(f"{new_path.name}: M {', '.join(ms)}")
    return done


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", type=Path)
    p.add_argument("tuned", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--note", required=True, help="why these token counts were retuned")
    args = p.parse_args(argv)
    for line in merge(args.base, args.tuned, args.out, args.note):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
