"""Offline sm_90 code check of the quantized grouped GEMM: no GPU needed.

Compiles `moe_triton._details.quant_gemm._moe_wgemm_kernel` for an H100 target with the installed
Triton, runs that Triton's ptxas with -v on the PTX, and reports per launch shape:
- whether ptxas serialized the wgmma instructions (its info C7515: every HGMMA then waits for the
  previous one, which the kernel must never trigger),
- the K loop's SASS instructions per weight per thread, and the most frequent opcodes,
- the kernel's `wgmma.wait_group N` waits by N: a wait 0 after each dot means no MMA stays in
  flight while the next operand is dequantized (what Triton emits for a register-made operand).
Use the Triton version the GPU runs (3.6 here): code generation differs between versions.

    python benchmarks/gpu/sass_check.py [--wtype int4|halves|mxfp4] [--post-scale]
        [--sink atomic|store-act|last-arrival] BM,BN,WARPS,STAGES ...
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import tempfile
from pathlib import Path

import triton

from moe_triton._details.offline import compile_quant_gemm

_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
_UNIT_STRIDES = ("stride_ak", "stride_sn", "stride_ask")
# The GEMM epilogues as the experts launch them: split-K sums (an fp8 GEMM1, or a split GEMM1 of many
# tokens), GEMM1 with the SiLU in its epilogue (which also zeroes GEMM2's sums), and a direct
# launch's sums finished by their last contributor.
_SINKS = {"atomic": dict(SINK=1, ACT=0, GATE_UP_CHUNK=0, ZERO_SIDE=False, DIRECT=False),
          "store-act": dict(SINK=0, ACT=1, GATE_UP_CHUNK=32, ZERO_SIDE=True, DIRECT=False),
          "last-arrival": dict(SINK=2, ACT=1, GATE_UP_CHUNK=32, ZERO_SIDE=False, DIRECT=True)}


def compile_sm90(wtype: str, block_m: int, block_n: int, warps: int, stages: int, post_scale: bool,
                 sink: str = "atomic"):
    """The kernel compiled for sm_90 (int4 group 128 symmetric; mxfp4 group 32), with a `_SINKS` epilogue."""
    consts = dict(GROUP=32 if wtype == "mxfp4" else 128, WTYPE=3 if wtype == "mxfp4" else 0,
                  CODE_OFFSET=0 if wtype == "mxfp4" else 8, **_SINKS[sink], SPLIT_K=2, BLOCK_M=block_m,
                  BLOCK_N=block_n, BLOCK_K=128 if wtype == "int4" else 64, QUADS=wtype == "int4",
                  POST_SCALE=post_scale, **{n: 1 for n in _UNIT_STRIDES},
                  # The codes' unit stride, as the launch specializes it: quads run along K, halves along N.
                  **{"stride_bk" if wtype == "int4" else "stride_bn": 1})
    return compile_quant_gemm(consts, {"b_ptr": "*i16" if wtype == "int4" else "*u8", "z_ptr": "*bf16"},
                              num_warps=warps, num_stages=stages)


def ptxas_info(ptx: str) -> str:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "k.ptx").write_text(ptx)
        run = subprocess.run([str(_BIN / "ptxas"), "-arch=sm_90a", "-v", str(Path(d) / "k.ptx"), "-o",
                              str(Path(d) / "k.cubin")], capture_output=True, text=True, check=True)
    return run.stderr


def k_loop_opcodes(cubin: bytes) -> collections.Counter:
    """Opcodes of the innermost loop that issues HGMMA (the K loop)."""
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "k.cubin").write_bytes(cubin)
        lines = subprocess.run([str(_BIN / "nvdisasm"), "-c", str(Path(d) / "k.cubin")], capture_output=True,
                               text=True, check=True).stdout.splitlines()
    labels = {line[:-1]: i for i, line in enumerate(lines) if re.match(r"^\.L_x_\d+:$", line)}
    loops = []
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s+`\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i:
            body = [x for x in lines[labels[m.group(1)]:i + 1] if re.match(r"\s*/\*[0-9a-f]+\*/", x)]
            ops = collections.Counter(
                re.sub(r"^\s*/\*[0-9a-f]+\*/\s+(@!?U?P[T0-9]+\s+)?", "", b).split()[0].split(".")[0] for b in body)
            if ops["HGMMA"]:
                loops.append(ops)
    return min(loops, key=lambda c: sum(c.values())) if loops else collections.Counter()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shapes", nargs="+", help="BM,BN,WARPS,STAGES")
    p.add_argument("--wtype", choices=["int4", "halves", "mxfp4"], default="int4",
                   help="int4: quads layout (K tiles of 128); halves: int4 in 64-wide tiles; mxfp4")
    p.add_argument("--post-scale", action="store_true", help="int4 quads: scale after the dots (POST_SCALE)")
    p.add_argument("--sink", choices=sorted(_SINKS), default="atomic", help="the epilogue (see _SINKS)")
    args = p.parse_args(argv)
    print(f"triton {triton.__version__}, target sm_90, {args.wtype}{' post-scale' if args.post_scale else ''}, "
          f"{args.sink} epilogue")
    serialized = False
    for shape in args.shapes:
        bm, bn, warps, stages = (int(v) for v in shape.split(","))
        cc = compile_sm90(args.wtype, bm, bn, warps, stages, args.post_scale, args.sink)
        info = ptxas_info(cc.asm["ptx"])
        ops = k_loop_opcodes(cc.asm["cubin"])
        bk = 128 if args.wtype == "int4" else 64
        per_weight = sum(ops.values()) / (bn * bk / (32 * warps))
        regs = re.search(r"Used (\d+) registers", info)
        wgmma_serialized = "C7515" in info
        serialized |= wgmma_serialized
        waits = collections.Counter(re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", cc.asm["ptx"]))
        print(f"BM{bm} BN{bn} w{warps} s{stages}: wgmma {'SERIALIZED' if wgmma_serialized else 'async'}, "
              f"{regs.group(1) if regs else '?'} registers, wgmma waits "
              + " ".join(f"{n}x wait({k})" for k, n in sorted(waits.items()))
              + f", K loop {per_weight:.2f} SASS/weight/thread: "
              + ", ".join(f"{op} {n}" for op, n in ops.most_common(8)))
    return 1 if serialized else 0


if __name__ == "__main__":
    raise SystemExit(main())
