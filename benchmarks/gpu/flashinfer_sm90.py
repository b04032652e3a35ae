"""Build FlashInfer 0.7.2.post1's sm_90 CUTLASS fused-MoE module inside one device call, narrowed to the
kernels one of moe-cuda's FlashInfer classes calls, then install it as FlashInfer's AOT module so
later processes load it instead of compiling.

    python3 flashinfer_sm90.py --workspace DIR [--variant bf16-fp8|mxfp4] [--jobs N] [--whole-files]

Variants (one module each; both do not fit one call's build together):
- bf16-fp8 (`FlashInferCutlassExperts`): bf16 and fp16 grouped GEMMs, and fp8 128x128 blocks, whose
  GEMMs DeepGEMM compiles at run time (with the toolkit's nvcc: `$CUDA_HOME` must hold one where the
  module runs): 44 files.
- mxfp4 (`FlashInferCutlassMxfp4Experts`): the sm90 mixed-input grouped GEMMs of bf16 activations and
  MXFP4 weights (W4A16) and their runner: 38 files.

FlashInfer must be importable (PYTHONPATH) and CUDA_HOME set. The whole module is 248 translation units,
about 8.6 CPU-hours (benchmarks/results/flashinfer_sm90_jit_2026-11-27.md); nothing in FlashInfer filters
its instantiations, so this script drops, before ninja runs, the generated CUTLASS files and the GEMM
runners of every other input type. Their symbols stay undefined in the library; FlashInfer loads
modules lazily (RTLD_LAZY), so only a call into a dropped type would fail, and the undefined-symbol
count is printed. Each generated file kept holds several kernel instantiations (8 CUTLASS grouped GEMMs),
and nvcc compiles a file on one core: the mixed-input ones took over 8 minutes each, so this script
writes each instantiation to a file of its own (same preamble), which the build compiles in parallel;
--whole-files keeps FlashInfer's files whole, for a machine with few cores, where every split unit
costs about a whole file's time (the preamble) and there is no core to run them side by side.
Prints the build time; exits non-zero on failure.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

_TMA_TYPES = re.compile(r"INSTANTIATE_TMA_WARP_SPECIALIZED_MOE_GEMM\(\s*Sm90,\s*(\w+),\s*(\w+)")
_MIXED_TYPES = re.compile(r"sm90_generic_mixed_moe_gemm_kernelLauncher<\s*(\w+),\s*(\w+)")
_SM80_FUSED = "sm80_generic_fused_moe_gemm_kernelLauncher"
# One explicit instantiation of a generated file: a TMA macro call in its #if guard, or a template.
_INSTANTIATION = re.compile(r"#if [^\n]*\n\s*INSTANTIATE_\w+\([^;]*\);\s*\n#endif|template void [^;]*;")


@dataclass(frozen=True)
class Variant:
    # The GEMM runners (activation_weight) of the binding's FusedMoeRunner kinds the class makes.
    runners: frozenset[str]
    # (activation, weight) type pairs of the generated sm90 grouped GEMMs kept: TMA ones, mixed-input ones.
    tma_types: frozenset[tuple[str, str]]
    mixed_types: frozenset[tuple[str, str]]
    sm80_fused: bool  # the sm80 fused SwiGLU kernels the bf16/fp16 runners fall back to at small sizes


VARIANTS = {
    "bf16-fp8": Variant(
        runners=frozenset({"moe_gemm_kernels_bf16_bf16.cu", "moe_gemm_kernels_fp16_fp16.cu",
                           "moe_gemm_kernels_bf16_fp8.cu"}),
        tma_types=frozenset({("__nv_bfloat16", "__nv_bfloat16"), ("half", "half")}),
        mixed_types=frozenset(), sm80_fused=True),
    "mxfp4": Variant(
        runners=frozenset({"moe_gemm_kernels_bf16_fp4.cu"}),
        tma_types=frozenset(), mixed_types=frozenset({("__nv_bfloat16", "SafeFP4")}), sm80_fused=False),
}


def wanted(source: Path, variant: Variant) -> bool:
    """Hand-written sources but the other types' GEMM runners; generated ones whose every
    instantiation is of a kept kind and type pair."""
    if source.name.startswith("moe_gemm_kernels_"):
        return source.name in variant.runners
    if "generated" not in source.name:
        return True
    text = source.read_text()
    if _SM80_FUSED in text:
        return variant.sm80_fused
    tma, mixed = set(_TMA_TYPES.findall(text)), set(_MIXED_TYPES.findall(text))
    return bool(tma or mixed) and tma <= variant.tma_types and mixed <= variant.mixed_types


def split_instantiations(source: Path) -> list[Path]:
    """`source` as one file per explicit instantiation (its text before the first and after the last
    kept around each), written beside it; a file of one instantiation or none is kept as it is."""
    text = source.read_text()
    found = list(_INSTANTIATION.finditer(text))
    if len(found) < 2:
        return [source]
    head, tail = text[:found[0].start()], text[found[-1].end():]
    between = [text[a.end():b.start()] for a, b in itertools.pairwise(found)]
    if any(gap.strip() for gap in between) or "INSTANTIATE_" in head + tail or "template void" in head + tail:
        raise SystemExit(f"flashinfer_sm90: {source.name} is not a preamble, instantiations and a closing: not split")
    stem = source.name.removesuffix(".generated.cu")
    parts = []
    for i, match in enumerate(found):
        part = source.with_name(f"{stem}_part{i}.generated.cu")
        content = head + match.group(0) + tail
        if not part.exists() or part.read_text() != content:  # unchanged parts keep their objects
            part.write_text(content)
        parts.append(part)
    return parts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, required=True, help="FLASHINFER_WORKSPACE_BASE (objects, .so)")
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="bf16-fp8",
                        help="which class's kernels the module holds (default: bf16-fp8)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) * 3 // 4),
                        help="parallel nvcc processes (each takes up to ~8 GB)")
    parser.add_argument("--whole-files", action="store_true",
                        help="compile FlashInfer's generated files whole instead of one instantiation per unit")
    args = parser.parse_args()
    os.environ.update(FLASHINFER_WORKSPACE_BASE=str(args.workspace.resolve()), FLASHINFER_CUDA_ARCH_LIST="9.0a",
                      MAX_JOBS=str(args.jobs), FLASHINFER_JIT_VERBOSE="1",
                      FLASHINFER_JIT_DEBUG="0")  # unset, VERBOSE=1 also means -O0 --device-debug
    if "CUDA_HOME" not in os.environ:
        raise SystemExit("set CUDA_HOME (FlashInfer links $CUDA_HOME/lib64's cudart and nvrtc)")

    from flashinfer.jit import env as jit_env
    from flashinfer.jit import fused_moe as jit_moe

    full = jit_moe.gen_cutlass_fused_moe_module

    def narrowed(*a, **k):
        spec = full(*a, **k)
        kept = [s for s in spec.sources if wanted(Path(s), VARIANTS[args.variant])]
        split = [p for s in kept for p in (split_instantiations(Path(s)) if "generated" in Path(s).name
                                           and not args.whole_files else [s])]
        print(f"flashinfer_sm90: {len(kept)} of {len(spec.sources)} sources kept, {len(split)} translation units"
              + ("" if args.whole_files else " with one instantiation per generated file"), flush=True)
        spec.sources = split
        return spec

    jit_moe.gen_cutlass_fused_moe_module = narrowed
    spec = jit_moe.gen_cutlass_fused_moe_sm90_module()
    start = time.monotonic()
    spec.build()
    print(f"flashinfer_sm90: built {spec.jit_library_path} in {time.monotonic() - start:.0f} s", flush=True)
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(spec.jit_library_path)],
                               capture_output=True, text=True).stdout.splitlines()
    print(f"flashinfer_sm90: {len(undefined)} undefined dynamic symbols", flush=True)
    aot = jit_env.FLASHINFER_AOT_DIR / spec.name / f"{spec.name}.so"
    aot.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(spec.jit_library_path, aot)
    spec.load(aot)  # the library loads with the dropped types' symbols unresolved
    print(f"flashinfer_sm90: installed and loaded {aot}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
