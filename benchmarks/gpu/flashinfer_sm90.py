"""Build FlashInfer 0.7.2.post1's sm_90 CUTLASS fused-MoE module inside one device call, narrowed to the
kernels moe-cuda's `FlashInferCutlassExperts` calls (bf16 and fp16 grouped GEMMs, and fp8 128x128 blocks,
whose GEMMs DeepGEMM compiles at run time with NVRTC), then install it as FlashInfer's AOT module so
later processes load it instead of compiling.

    python3 flashinfer_sm90.py --workspace DIR [--jobs N]

FlashInfer must be importable (PYTHONPATH) and CUDA_HOME set. The whole module is 248 translation units,
about 8.6 CPU-hours (benchmarks/results/flashinfer_sm90_jit_2026-11-27.md); nothing in FlashInfer filters
its instantiations, so this script drops, before ninja runs, the generated CUTLASS files of every other
input type (fp32, per-tensor fp8, the mixed int4/fp4 inputs, the fpA_intB GEMMs) and those types' GEMM
runners, which leaves 44 units. Their symbols stay undefined in the library; FlashInfer loads modules
lazily (RTLD_LAZY), so only a call into a dropped type would fail, and the undefined-symbol count is
printed. Prints the build time; exits non-zero on failure.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

KEPT_TMA_TYPES = {"__nv_bfloat16", "half"}  # activation = weight type of the TMA grouped GEMMs kept
_TMA_TYPES = re.compile(r"INSTANTIATE_TMA_WARP_SPECIALIZED_MOE_GEMM\(\s*Sm90,\s*(\w+),\s*(\w+)")
# The GEMM runners of the binding's three FusedMoeRunner kinds moe-cuda makes (activation_weight).
KEPT_RUNNERS = {"moe_gemm_kernels_bf16_bf16.cu", "moe_gemm_kernels_fp16_fp16.cu", "moe_gemm_kernels_bf16_fp8.cu"}


def wanted(source: Path) -> bool:
    """Hand-written sources but the other types' GEMM runners; generated ones: the sm80 fused
    SwiGLU kernels (bf16/fp16) and the sm90 TMA grouped GEMMs whose activations and weights are
    both bf16 or both fp16."""
    if source.name.startswith("moe_gemm_kernels_"):
        return source.name in KEPT_RUNNERS
    if "generated" not in source.name:
        return True
    text = source.read_text()
    if "sm80_generic_fused_moe_gemm_kernelLauncher" in text:
        return True
    types = set(_TMA_TYPES.findall(text))
    return bool(types) and all(a == w and a in KEPT_TMA_TYPES for a, w in types)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, required=True, help="FLASHINFER_WORKSPACE_BASE (objects, .so)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) * 3 // 4),
                        help="parallel nvcc processes (each takes up to ~8 GB)")
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
        kept = [s for s in spec.sources if wanted(Path(s))]
        print(f"flashinfer_sm90: {len(kept)} of {len(spec.sources)} sources kept", flush=True)
        spec.sources = kept
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
