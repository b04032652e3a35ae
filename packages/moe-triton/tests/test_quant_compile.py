"""The quantized GEMM kernels compiled for sm_90 without a GPU (Triton's own ptxas), in a child
process: the interpreter runs none of the compiler's checks, and cannot run Gluon at all.
"""

import json

from moe_triton._common.offline_compile import MMA_CONSTEXPRS, run_compiler_script

_SPECIALIZATIONS = {
    # int4 quads, groups of 64 (scaled per weight), zero points, K padded to whole tiles; the
    # activation in the epilogue and GEMM2's sums zeroed on the side (the launch shape that once
    # failed only in the compiler), launched programmatically dependent
    "quads-store-act": (dict(GROUP=64, WTYPE=0, HAS_ZP=True, QUADS=True, BLOCK_K=128, BLOCK_N=256, ACT=2,
                             GATE_UP_CHUNK=32, ZERO_SIDE=True, HAS_BIAS=True, PDL=True, K_TAIL=True),
                        {"b_ptr": "*i16"}),
    # GEMM2 of many tokens: rows finished by their last contributor
    "quads-gemm2-last-arrival": (dict(GROUP=128, WTYPE=0, HAS_ZP=True, QUADS=True, BLOCK_K=128, SINK=2,
                                      MUL_ROUTED=True, REDUCE_TOPK=8, PDL=True), {"b_ptr": "*i16"}),
    "quads-last-arrival": (dict(GROUP=128, WTYPE=0, QUADS=True, BLOCK_K=128, POST_SCALE=1, SINK=2, ACT=4,
                                GATE_UP_CHUNK=32, DIRECT=True, HAS_MAP=True, SPLIT_K=4), {"b_ptr": "*i16"}),
    # a few tokens' aligned GEMMs scaled after their dots, each K tile's scales loaded one tile ahead:
    # GEMM1 split with its last arrival activating, GEMM2 finishing its sums at the last arrival
    "quads-post-scale-ahead-gemm1": (dict(GROUP=128, WTYPE=0, QUADS=True, BLOCK_K=128, BLOCK_N=128, POST_SCALE=2,
                                          SINK=2, ACT=1, GATE_UP_CHUNK=32, SPLIT_K=2, PDL=True), {"b_ptr": "*i16"}),
    "int8-quads-post-scale-ahead-gemm2": (dict(GROUP=2048, WTYPE=1, CODE_OFFSET=128, QUADS=True, BLOCK_K=128,
                                               BLOCK_N=128, POST_SCALE=2, SINK=2, MUL_ROUTED=True, REDUCE_TOPK=8,
                                               PDL=True), {"b_ptr": "*i32"}),
    # each K tile's quarters as one dot (GemmConfig.one_dot): one token's int4 GEMM1 scaled after its
    # dot, and MXFP4's GEMM1 scaled per quarter
    "quads-one-dot-last-arrival": (dict(GROUP=128, WTYPE=0, QUADS=True, BLOCK_K=128, BLOCK_N=64, POST_SCALE=1, SINK=2,
                                        ACT=1, GATE_UP_CHUNK=32, DIRECT=True, SPLIT_K=4, PDL=True, ONE_DOT=True),
                                   {"b_ptr": "*i16"}),
    "mxfp4-one-dot": (dict(GROUP=32, WTYPE=3, CODE_OFFSET=0, QUADS=True, BLOCK_K=128, ACT=1, GATE_UP_CHUNK=32,
                           FOLDED_SCALE=True, PDL=True, ONE_DOT=True), {"b_ptr": "*i16", "s_ptr": "*i32"}),
    # one token's GEMM2: its weights prefetched into L2 before the wait, zero points g64 among them
    "quads-direct-prefetch": (dict(GROUP=64, WTYPE=0, HAS_ZP=True, QUADS=True, BLOCK_K=128, BLOCK_N=256, SINK=2,
                                   MUL_ROUTED=True, REDUCE_TOPK=8, DIRECT=True, HAS_MAP=True, SPLIT_K=2, PDL=True,
                                   PREFETCH_TILES=2), {"b_ptr": "*i16"}),
    # a few tokens' aligned GEMM2 asking L2 for its first two K tiles (the alignment's blocks) before the wait
    "quads-aligned-prefetch": (dict(GROUP=128, WTYPE=0, QUADS=True, BLOCK_K=128, BLOCK_N=128, POST_SCALE=2, SINK=2,
                                    MUL_ROUTED=True, REDUCE_TOPK=8, PDL=True, PREFETCH_TILES=2), {"b_ptr": "*i16"}),
    "halves-atomic": (dict(GROUP=64, WTYPE=0, BLOCK_K=64, SINK=1, MUL_ROUTED=True, REDUCE_TOPK=8, BLOCK_M=64,
                           PDL=True, N_FIRST=True), {"b_ptr": "*u8"}),
    # an expert's last block over its valid half (the K loop built for both row counts), N tiles first
    "quads-narrow": (dict(GROUP=128, WTYPE=0, QUADS=True, BLOCK_K=128, BLOCK_M=64, BLOCK_N=256, ACT=1,
                                  GATE_UP_CHUNK=32, NARROW=True, N_FIRST=True, PDL=True), {"b_ptr": "*i16"}),
    # a full block taking in its expert's last 16 pairs, GEMM1 with the activation and GEMM2 finishing
    # its sums at the last arrival
    "quads-tail-act": (dict(GROUP=128, WTYPE=0, QUADS=True, BLOCK_K=128, BLOCK_M=32, BLOCK_N=256, ACT=1,
                            GATE_UP_CHUNK=32, N_FIRST=True, PDL=True, TAIL=16), {"b_ptr": "*i16"}),
    "quads-tail-last-arrival": (dict(GROUP=64, WTYPE=0, HAS_ZP=True, QUADS=True, BLOCK_K=128, BLOCK_M=64, SINK=2,
                                     MUL_ROUTED=True, REDUCE_TOPK=8, K_TAIL=True, NARROW=True, TAIL=32),
                                {"b_ptr": "*i16"}),
    # MXFP4 quads: gpt-oss's GEMM1 (K padded, clamped SwiGLU, bias) with the folded scale, a GEMM2 with
    # the two-factor one taking in tails, and one token's GEMM2 prefetching its weights
    "mxfp4-gpt-oss-gemm1": (dict(GROUP=32, WTYPE=3, CODE_OFFSET=0, QUADS=True, BLOCK_K=128, BLOCK_N=256, ACT=4,
                                 GATE_UP_CHUNK=32, HAS_BIAS=True, K_TAIL=True, FOLDED_SCALE=True, PDL=True),
                            {"b_ptr": "*i16", "s_ptr": "*i32"}),
    "mxfp4-two-factor-tail": (dict(GROUP=32, WTYPE=3, CODE_OFFSET=0, QUADS=True, BLOCK_K=128, BLOCK_M=64, SINK=1,
                                   MUL_ROUTED=True, REDUCE_TOPK=4, NARROW=True, TAIL=32, N_FIRST=True),
                              {"b_ptr": "*i16", "s_ptr": "*i32"}),
    "mxfp4-direct-prefetch": (dict(GROUP=32, WTYPE=3, CODE_OFFSET=0, QUADS=True, BLOCK_K=128, SINK=2, MUL_ROUTED=True,
                                   REDUCE_TOPK=4, DIRECT=True, HAS_MAP=True, SPLIT_K=2, PDL=True, PREFETCH_TILES=1,
                                   FOLDED_SCALE=True), {"b_ptr": "*i16", "s_ptr": "*i32"}),
    # fp16 activations: the e2m1 values are scaled in fp32, then rounded to fp16
    "mxfp4-fp16": (dict(GROUP=32, WTYPE=3, CODE_OFFSET=0, QUADS=True, BLOCK_K=128, SINK=1, SPLIT_K=2,
                        FOLDED_SCALE=True), {"a_ptr": "*fp16", "b_ptr": "*i16", "s_ptr": "*i32"}),
    "int8-last-arrival": (dict(GROUP=128, WTYPE=1, CODE_OFFSET=128, BLOCK_K=128, SWAP_AB=False, SINK=2, ACT=1,
                               GATE_UP_CHUNK=32, DIRECT=True, REDUCE_TOPK=4), {"b_ptr": "*u8"}),
    # int8 byte quads (int32 words): per-channel GEMM1 with the activation; one token's GEMM2 scaled
    # after its dots and prefetching its weights; zero points in groups of 64 with fp16; a taken-in tail
    "int8-quads-gemm1-act": (dict(GROUP=2048, WTYPE=1, CODE_OFFSET=128, QUADS=True, BLOCK_K=128, BLOCK_N=256, ACT=1,
                                  GATE_UP_CHUNK=32, PDL=True), {"b_ptr": "*i32"}),
    "int8-quads-direct-post-scale-prefetch": (dict(GROUP=2048, WTYPE=1, CODE_OFFSET=128, QUADS=True, BLOCK_K=128,
                                                   POST_SCALE=1, SINK=2, MUL_ROUTED=True, REDUCE_TOPK=8, DIRECT=True,
                                                   HAS_MAP=True, SPLIT_K=2, PDL=True, PREFETCH_TILES=1),
                                              {"b_ptr": "*i32"}),
    "int8-quads-zp-g64-fp16": (dict(GROUP=64, WTYPE=1, CODE_OFFSET=0, HAS_ZP=True, QUADS=True, BLOCK_K=128, SINK=1,
                                    SPLIT_K=2), {"a_ptr": "*fp16", "s_ptr": "*fp16", "b_ptr": "*i32"}),
    "int8-quads-tail": (dict(GROUP=128, WTYPE=1, CODE_OFFSET=128, QUADS=True, BLOCK_K=128, BLOCK_M=32, BLOCK_N=256,
                             ACT=1, GATE_UP_CHUNK=32, N_FIRST=True, PDL=True, TAIL=16), {"b_ptr": "*i32"}),
    # gpt-oss's per-channel int8 (K = 2880 padded to 23 tiles, one scale row over them): GEMM1 with the
    # clamped SwiGLU and biases, scaled per weight; GEMM2 of one token scaled after its dots
    "int8-quads-k-tail-gemm1": (dict(GROUP=2944, WTYPE=1, CODE_OFFSET=128, QUADS=True, BLOCK_K=128, BLOCK_N=256, ACT=4,
                                     GATE_UP_CHUNK=32, HAS_BIAS=True, K_TAIL=True, PDL=True), {"b_ptr": "*i32"}),
    "int8-quads-k-tail-direct": (dict(GROUP=2944, WTYPE=1, CODE_OFFSET=128, QUADS=True, BLOCK_K=128, POST_SCALE=1,
                                      SINK=2, MUL_ROUTED=True, REDUCE_TOPK=4, DIRECT=True, HAS_MAP=True, K_TAIL=True),
                                 {"b_ptr": "*i32"}),
    "fp8-block-atomic": (dict(GROUP=1, WTYPE=2, A_SCALE=2, CODE_OFFSET=0, BLOCK_K=128, SWAP_AB=False, SINK=1,
                              SPLIT_K=2, BLOCK_M=64, ZERO_SIDE=True, N_FIRST=True),
                         {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "s_ptr": "*fp32"}),
    # mixtral-sized GEMMs at 512+ tokens: an expert's blocks launched together (grouped M blocks)
    "fp8-block-grouped": (dict(GROUP=1, WTYPE=2, A_SCALE=2, CODE_OFFSET=0, BLOCK_K=128, SWAP_AB=False, SINK=1,
                               BLOCK_M=64, N_FIRST=True, GROUP_M=8, PDL=True),
                          {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "s_ptr": "*fp32"}),
    "fp8-row-store": (dict(GROUP=1, WTYPE=2, A_SCALE=1, CODE_OFFSET=0, BLOCK_K=128, SWAP_AB=False),
                      {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "s_ptr": "*fp32", "c_ptr": "*bf16"}),
    # decode sizes swapped, on the fp8 wgmma: one token's direct GEMM2 (last-arrival sums), GEMM1 in
    # 128x128 blocks (a scale per tile) and per channel
    "fp8-block-swapped-direct": (dict(GROUP=1, WTYPE=2, A_SCALE=2, CODE_OFFSET=0, BLOCK_K=128, SWAP_AB=True, SINK=2,
                                      MUL_ROUTED=True, REDUCE_TOPK=8, DIRECT=True, SPLIT_K=2, PDL=True),
                                 {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "s_ptr": "*fp32"}),
    "fp8-block-swapped-store": (dict(GROUP=1, WTYPE=2, A_SCALE=2, CODE_OFFSET=0, BLOCK_K=128, SWAP_AB=True,
                                     BLOCK_M=32, N_FIRST=True, PDL=True),
                                {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "s_ptr": "*fp32", "c_ptr": "*fp32"}),
    "fp8-row-swapped-atomic": (dict(GROUP=1, WTYPE=2, A_SCALE=1, CODE_OFFSET=0, BLOCK_K=128, SWAP_AB=True, SINK=1,
                                    SPLIT_K=4, N_FIRST=True),
                               {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "s_ptr": "*fp32"}),
    # GemmConfig.block_ready: GEMM1 counting each block it stored (zeroing GEMM2's sums on the side,
    # taking in tails), GEMM2 waiting for its block, the taken-in tail's and the zeroed count
    "quads-block-ready-count": (dict(GROUP=128, WTYPE=0, QUADS=True, BLOCK_K=128, BLOCK_M=32, BLOCK_N=128, ACT=1,
                                     GATE_UP_CHUNK=32, ZERO_SIDE=True, N_FIRST=True, PDL=True, TAIL=16, READY=1),
                                {"b_ptr": "*i16"}),
    "quads-block-ready-wait": (dict(GROUP=128, WTYPE=0, QUADS=True, BLOCK_K=128, BLOCK_M=32, BLOCK_N=128, SINK=2,
                                    MUL_ROUTED=True, REDUCE_TOPK=8, PDL=True, TAIL=16, READY=2),
                               {"b_ptr": "*i16"}),
}


_COMPILE_ALL = """
import json, sys
from moe_triton._common.offline_compile import compile_quant_gemm
for name, (consts, pointers) in json.loads(sys.stdin.read()).items():
    ptx = compile_quant_gemm(consts, pointers).asm["ptx"]
    print(name, "wgmma" in ptx, "griddepcontrol.wait" in ptx, "cp.async.bulk.prefetch.L2" in ptx, "0x81C081C0" in ptx,
          "0x43804380" in ptx or "0x64806480" in ptx, "prmt.b32" in ptx, ".e4m3.e4m3" in ptx and "wgmma" in ptx,
          "cp.async.cg.shared.global" in ptx, ptx.count("ld.volatile.global"), ptx.count("nanosleep.u32"),
          ptx.count("ld.acquire.gpu.global"), ptx.count(".global.gpu.release.add"), flush=True)
"""


def test_gemm_compiles_for_hopper():
    """Triton's compiler on the kernel, which the interpreter never runs: one specialization per
    epilogue, weight type and layout, built for sm_90 by the installed Triton (in a child process,
    since this module interprets the kernels)."""
    stdout = run_compiler_script(_COMPILE_ALL, json.dumps(_SPECIALIZATIONS))
    built = {name: flags for name, *flags in map(str.split, stdout.splitlines())}
    assert set(built) == set(_SPECIALIZATIONS)
    for name, (consts, _) in _SPECIALIZATIONS.items():
        *flags, polls, sleeps, acquires, release_adds = built[name]
        wgmma, waits, prefetches, e2m1_unpack, int8_centering, byte_select, f8_wgmma, staged = (
            flag == "True" for flag in flags)
        # Quads words reach shared memory by cp.async, staged ahead by the pipeliner (as in the GPU's builds,
        # whose unit strides the offline build specializes as a launch does).
        assert staged or not consts.get("QUADS", False), name
        # The swapped GEMMs feed Hopper's wgmma (fp8 its fp8 wgmma); canonical int8 and fp8 may take
        # unswapped tiles of 16 rows.
        assert wgmma or not consts.get("SWAP_AB", True), name
        if consts["WTYPE"] == 2 and consts["SWAP_AB"]:
            assert f8_wgmma, name
        # Dependent launches wait for the kernel before, but a GEMM2 waiting per block (READY 2) waits on
        # GEMM1's counts instead: each wait one thread's polls (128 ns apart) and one acquire in PTX
        # (Triton 3.6 drops the acquire of an unused atomic add of zero); GEMM1 counts by release-adds (atom or red).
        ready = consts.get("READY", 0)
        assert waits == (consts.get("PDL", False) and ready != 2), name
        assert int(polls) == int(sleeps) == int(acquires), name
        assert (int(polls) > 0) == (ready == 2), name
        assert (int(release_adds) > 0) == (ready == 1), name
        assert prefetches == (consts.get("PREFETCH_TILES", 0) > 0), name
        assert e2m1_unpack == (consts["WTYPE"] == 3), name  # MXFP4 quads unpacked by the PTX lop3s
        # int8 centered by its bit recipe (bf16 or fp16), the byte quads' quarters selected by prmt
        int8_quads = consts["WTYPE"] == 1 and consts.get("QUADS", False)
        assert int8_centering == (int8_quads or (consts["WTYPE"] == 1 and consts.get("CODE_OFFSET") == 128)), name
        assert byte_select or not int8_quads, name


_WGMMA_SPECIALIZATIONS = {
    "gemm1-silu": ({}, {}),
    "gemm2-atomic": (dict(ATOMIC=True, ACT=0, GATE_UP_CHUNK=0, MUL_ROUTED=True, REDUCE_TOPK=8, A_ROWS_DIV=1,
                          ZERO_SIDE=False, STAGES=3), {"c_ptr": "*fp32"}),
    "gemm2-rows": (dict(ACT=0, GATE_UP_CHUNK=0, MUL_ROUTED=True, HAS_BIAS=True, A_ROWS_DIV=1, ZERO_SIDE=False),
                   {}),  # from ROWS_SUM_MIN_PAIRS pairs: bf16 rows, summed by a reduce after the GEMM
    "zero-points-g32": (dict(HAS_ZP=True, GROUP=32, BLOCK_M=64, BLOCK_N=128, STAGES=3), {}),
    "fp16-bias-k-tail": (dict(GROUP=64, K_TAIL=True, HAS_BIAS=True, ACT=4, SPLIT_K=2, BLOCK_N=128),
                         {"a_ptr": "*fp16", "s_ptr": "*fp16", "c_ptr": "*fp16"}),
    "relu2-channel": (dict(GROUP=4096, ACT=5, GATE_UP_CHUNK=0, BLOCK_M=16, BLOCK_N=128), {}),
    "tail8-gemm1-silu": (dict(TAIL=8), {}),
    "tail16-gemm2-atomic-k-tail": (dict(TAIL=16, ATOMIC=True, ACT=0, GATE_UP_CHUNK=0, MUL_ROUTED=True,
                                        REDUCE_TOPK=8, A_ROWS_DIV=1, ZERO_SIDE=False, STAGES=3, K_TAIL=True,
                                        GROUP=64), {"c_ptr": "*fp32"}),
    # MXFP4 quads (int32 e8m0 exponent words, one per row and K tile): gpt-oss's GEMM1 with the folded scale, a
    # GEMM2 with the two-factor one and a tail, fp16 activations (scaled in fp32) with a producer
    "mxfp4-gpt-oss-gemm1": (dict(WTYPE=3, FOLDED_SCALE=True, GROUP=32, CODE_OFFSET=0, ACT=4, HAS_BIAS=True,
                                 K_TAIL=True, STAGES=3), {"s_ptr": "*i32"}),
    "mxfp4-two-factor-tail16-gemm2": (dict(WTYPE=3, GROUP=32, CODE_OFFSET=0, TAIL=16, ATOMIC=True, ACT=0,
                                           GATE_UP_CHUNK=0, MUL_ROUTED=True, REDUCE_TOPK=4, A_ROWS_DIV=1,
                                           ZERO_SIDE=False, STAGES=3), {"s_ptr": "*i32", "c_ptr": "*fp32"}),
    "mxfp4-fp16-producer": (dict(WTYPE=3, FOLDED_SCALE=True, GROUP=32, CODE_OFFSET=0, BLOCK_M=64, BLOCK_N=256,
                                 STAGES=3), {"a_ptr": "*fp16", "s_ptr": "*i32", "c_ptr": "*fp16"}),
    # int8 byte quads (int32 words): per-channel GEMM1 scaled in its epilogue (three stages: the words'
    # ring is twice int4's), a GEMM2 with a producer, groups of 128 scaled in the unpack's asm, zero points
    # in groups of 32 with fp16 and a tail (128 rows: four scale and zero-point rows per stage beside a
    # 256-row tile would not fit)
    "int8-channel-gemm1": (dict(WTYPE=1, CODE_OFFSET=128, GROUP=2048, STAGES=3, ROW_SCALE=True), {"b_ptr": "*i32"}),
    # the shipped 2048-token entries' GEMM1 (qwen3 int8): a taken-in tail of 16 on the largest ring, at the
    # consumers' register limit
    "int8-channel-tail16-gemm1": (dict(WTYPE=1, CODE_OFFSET=128, GROUP=2048, STAGES=3, ROW_SCALE=True, TAIL=16),
                                  {"b_ptr": "*i32"}),
    "int8-channel-gemm2-producer": (dict(WTYPE=1, CODE_OFFSET=128, GROUP=2048, ROW_SCALE=True, ATOMIC=True, ACT=0,
                                         GATE_UP_CHUNK=0, MUL_ROUTED=True, REDUCE_TOPK=8, A_ROWS_DIV=1,
                                         ZERO_SIDE=False, STAGES=3, BLOCK_M=64), {"b_ptr": "*i32", "c_ptr": "*fp32"}),
    "int8-g128-gemm1": (dict(WTYPE=1, CODE_OFFSET=128, GROUP=128, STAGES=3), {"b_ptr": "*i32"}),
    "int8-channel-k-tail-gpt-oss-gemm1": (dict(WTYPE=1, CODE_OFFSET=128, GROUP=2944, ROW_SCALE=True, ACT=4,
                                               HAS_BIAS=True, K_TAIL=True, STAGES=3), {"b_ptr": "*i32"}),
    "int8-g32-zp-fp16-tail16": (dict(WTYPE=1, CODE_OFFSET=0, HAS_ZP=True, GROUP=32, TAIL=16, STAGES=3, BLOCK_N=128),
                                {"b_ptr": "*i32", "a_ptr": "*fp16", "s_ptr": "*fp16", "c_ptr": "*fp16"}),
    # int4 per channel, scaled in the epilogue as int8's: a GEMM1 with a tail, a GEMM2 with zero points and a producer
    "int4-channel-tail16-gemm1": (dict(GROUP=2048, ROW_SCALE=True, TAIL=16), {}),
    "int4-channel-zp-gemm2-producer": (dict(GROUP=2048, HAS_ZP=True, ROW_SCALE=True, ATOMIC=True, ACT=0,
                                            GATE_UP_CHUNK=0, MUL_ROUTED=True, REDUCE_TOPK=8, A_ROWS_DIV=1,
                                            ZERO_SIDE=False, BLOCK_M=64), {"c_ptr": "*fp32"}),
}


# The shared memory one block may use on sm_90 (H100, H200: 227 KB).
HOPPER_SHARED_BYTES = 232448

_COMPILE_WGMMA = """
import json, sys
from triton.tools.disasm import get_sass
from moe_triton._common.offline_compile import compile_wgmma_gemm
for name, (consts, pointers) in json.loads(sys.stdin.read()).items():
    kernel = compile_wgmma_gemm(consts, pointers)
    ptx = kernel.asm["ptx"]
    sass = get_sass(kernel.asm["cubin"])
    print(name, ptx.count("wgmma.mma_async"), ptx.count("wgmma.wait_group.sync.aligned 1;"),
          ptx.count("cp.async.mbarrier.arrive.noinc"), ptx.count("setmaxnreg"), ptx.count("0x81C081C0"),
          ptx.count("prmt.b32"), kernel.metadata.shared, ptx.count("st.global.b16"), ptx.count("ex2.approx.ftz.f32"),
          sass.count("HGMMA."), sass.count("WARPGROUP.ARRIVE"), flush=True)
"""


def test_wgmma_gemm_compiles_for_hopper():
    """The Gluon kernel built for sm_90 by the installed Triton: warp-specialized (registers moved
    between partitions, copies completing on mbarriers), each consumer's quarter MMAs asynchronous
    with one in flight at each of its four waits per 128-wide tile, and kept so by ptxas; MXFP4
    unpacked by the PTX lop3s; the epilogue's stores 16 bytes wide and its sigmoid approximate
    (docs/design/triton-gemm-quantized.md)."""
    stdout = run_compiler_script(_COMPILE_WGMMA, json.dumps(_WGMMA_SPECIALIZATIONS))
    built = {name: tuple(map(int, counts)) for name, *counts in map(str.split, stdout.splitlines())}
    assert set(built) == set(_WGMMA_SPECIALIZATIONS)
    for name, (mmas, waits, copy_arrivals, setmaxnreg, e2m1_masks, byte_selects, shared, two_byte_stores,
               approx_exps, hgmmas, mma_arrivals) in built.items():
        # Two consumers (the default partition and a worker) run the same loop; with 128-pair blocks
        # (copies folded into the consumers) each has a second one for blocks of at most 64 valid pairs,
        # and with TAIL a third one, two MMAs per quarter (block and tail) that it waits for (wait 0).
        loops = 2 * (2 if _WGMMA_SPECIALIZATIONS[name][0].get("BLOCK_M", 128) == 128 else 1)
        tail_loops = 2 if _WGMMA_SPECIALIZATIONS[name][0].get("TAIL", 0) else 0
        assert mmas >= 4 * loops + 8 * tail_loops and waits == 4 * loops, (name, mmas, waits)
        # Where a partition lacks the registers to keep wgmma in flight, ptxas serializes every one of them
        # (info C7512: an arrival and a wait around each HGMMA), sometimes where spilling a few copy
        # addresses would have kept them asynchronous (docs/design/triton-gemm-quantized.md, register
        # plans). A quarter's HGMMAs (two, four with a tail) share one arrival.
        assert 2 * mma_arrivals <= hgmmas, (name, hgmmas, mma_arrivals)
        assert copy_arrivals >= 1 and setmaxnreg >= 3, (name, copy_arrivals, setmaxnreg)
        # Quarters 0 and 1 of each loop's unpack mask with 0x81C081C0.
        assert (e2m1_masks >= 2 * loops) == (_WGMMA_SPECIALIZATIONS[name][0].get("WTYPE", 0) == 3), (name, e2m1_masks)
        # int8's four quarters each take their bytes by prmt
        assert (byte_selects >= 4 * loops) == (_WGMMA_SPECIALIZATIONS[name][0].get("WTYPE", 0) == 1), (name, byte_selects)
        assert shared <= HOPPER_SHARED_BYTES, (name, shared)  # launchable: within an sm_90 block's shared memory
        # The epilogue stores eight 16-bit outputs at a time (`_store_rows`), never one, and its sigmoid
        # (SiLU, GELU-tanh, SwiGLU) is the ex2/rcp approximation.
        assert two_byte_stores == 0, (name, two_byte_stores)
        assert (approx_exps > 0) == (_WGMMA_SPECIALIZATIONS[name][0].get("ACT", 1) in (1, 3, 4)), (name, approx_exps)


_COMPILE_WGMMA_SHARED = """
import json, sys
from moe_triton._common.offline_compile import compile_wgmma_gemm
for name, consts in json.loads(sys.stdin.read()).items():
    print(name, compile_wgmma_gemm(consts, {"b_ptr": "*i32"}).metadata.shared, flush=True)
"""


def test_int8_wgmma_grid_fits_an_sm90_block():
    """Each tile of int8's wgmma grid (`tune.wgmma_grid(int8=True)`: per channel, a taken-in tail of 16
    on 128-pair blocks as shipped entries have) fits an sm_90 block's shared memory, and the capped
    tiles (`tune.INT8_WGMMA_STAGES`) would not one stage deeper: the cap is the deepest ring that fits.
    Built as a GEMM2 into fp32 atomics, the epilogue's larger exchange (a GEMM1's 16-bit outputs take less)."""
    from moe_triton.tune import INT8_WGMMA_STAGES, wgmma_grid

    int8 = dict(WTYPE=1, CODE_OFFSET=128, GROUP=2048, ROW_SCALE=True, ACT=0, GATE_UP_CHUNK=0, MUL_ROUTED=True,
                REDUCE_TOPK=2, ATOMIC=True)
    builds = {}
    for cand in wgmma_grid(int8=True).values():
        t = cand.gemm1
        tail = 16 if t.block_m == 128 else 0
        builds[f"fits-{t.block_m}x{t.block_n}-s{t.num_stages}-t{tail}"] = dict(
            int8, BLOCK_M=t.block_m, BLOCK_N=t.block_n, STAGES=t.num_stages, TAIL=tail)
    for (bm, bn), stages in INT8_WGMMA_STAGES.items():
        builds[f"deeper-{bm}x{bn}-s{stages + 1}"] = dict(int8, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages + 1, TAIL=0)
    stdout = run_compiler_script(_COMPILE_WGMMA_SHARED, json.dumps(builds))
    shared = {name: int(n) for name, n in map(str.split, stdout.splitlines())}
    assert set(shared) == set(builds)
    for name, n in shared.items():
        assert (n <= HOPPER_SHARED_BYTES) == name.startswith("fits"), (name, n)


# The mma kernel's specializations over MMA_CONSTEXPRS (qwen3-30b-a3b's one-token GEMM1): GEMM2
# (weights asked for before the wait, top-k reduce, router weight), gpt-oss-like (zero points, groups
# of 64, bias, ragged N, expert map), groups of 32 into plain atomics, fp16 with a store;
# aligned blocks of 16 and 32 pairs (two and four 8-wide MMA columns), N tiles first; int8 (int32 byte
# quads: 32 bytes of words per thread and row block) per channel and with zero points in groups of 128;
# MXFP4 (exponent words as scales) with one factor per weight and with two, in fp16; GEMM1 ranking its
# pairs' experts itself.
_MMA_SPECIALIZATIONS = {
    "gemm1-g128": ({}, {}),
    "gemm2-early-weights": (dict(EARLY_WEIGHTS=True, ACT=0, GATE_UP_CHUNK=0, REDUCE_TOPK=8, A_ROWS_DIV=1,
                                 MUL_ROUTED=True, ZERO_SIDE=False, TILES=2, BLOCK_N=128), {}),
    "g64-zp-bias-ragged-n": (dict(HAS_ZP=True, GROUP=64, EVEN_N=False, HAS_BIAS=True, HAS_MAP=True), {}),
    "g32-atomic": (dict(GROUP=32, SINK=1, ACT=0, GATE_UP_CHUNK=0, TILES=1), {}),
    "fp16-store-relu2": (dict(SINK=0, ACT=5, GATE_UP_CHUNK=0, EVEN_N=False, TILES=8),
                         {"a_ptr": "*fp16", "s_ptr": "*fp16", "c_ptr": "*fp16"}),
    "blocks-gemm1": (dict(DIRECT=False, BLOCK_N=128, TILES=8), {}),
    "blocks-gemm2-32": (dict(DIRECT=False, ACT=0, GATE_UP_CHUNK=0, REDUCE_TOPK=8, A_ROWS_DIV=1, MUL_ROUTED=True,
                             ZERO_SIDE=False, BLOCK_M=32, TILES=2), {}),
    "blocks-n-first-atomic": (dict(DIRECT=False, N_FIRST=True, SINK=1, ACT=0, GATE_UP_CHUNK=0), {}),
    "int8-channel": (dict(WTYPE=1, GROUP=0), {"b_ptr": "*i32"}),
    "int8-zp-g128-gemm2": (dict(WTYPE=1, HAS_ZP=True, EARLY_WEIGHTS=True, ACT=0, GATE_UP_CHUNK=0, REDUCE_TOPK=8,
                                A_ROWS_DIV=1, MUL_ROUTED=True, ZERO_SIDE=False, TILES=2), {"b_ptr": "*i32"}),
    "mxfp4-bias-ragged-n": (dict(WTYPE=3, GROUP=32, FOLDED_SCALE=True, HAS_BIAS=True, EVEN_N=False),
                            {"s_ptr": "*i32"}),
    "mxfp4-two-factors-fp16-blocks": (dict(WTYPE=3, GROUP=32, DIRECT=False, SINK=1, ACT=0, GATE_UP_CHUNK=0),
                                      {"a_ptr": "*fp16", "s_ptr": "*i32", "fin_ptr": "*fp16"}),
    "gemm1-own-route": (dict(OWN_ROUTE=True), {}),
    "g64-zp-scales-in-tile": (dict(HAS_ZP=True, GROUP=64, STAGED_SCALES=False), {}),
}

_COMPILE_MMA = """
import json, sys
from moe_triton._common.offline_compile import compile_mma_gemm
for name, (consts, pointers) in json.loads(sys.stdin.read()).items():
    ptx = compile_mma_gemm(consts, pointers).asm["ptx"]
    print(name, ptx.count("mma.sync.aligned.m16n8k16"), ptx.count("cp.async.cg.shared.global"),
          ptx.count("cp.async.wait_group"), ptx.count("griddepcontrol.wait"), ptx.count("0x81C081C0"),
          ptx.count("prmt.b32"), flush=True)
"""


_COMPILE_MMA_CAPPED = """
from moe_triton._common.offline_compile import compile_mma_gemm
for cap in (0, 96):
    ptx = compile_mma_gemm({"BLOCK_N": 128, "TILES": 8}, maxnreg=cap).asm["ptx"]
    print(cap, ptx.count(".maxnreg"), ptx.count(".maxnreg 96"), flush=True)
"""


def test_mma_gemm_build_takes_a_register_cap():
    """`GemmConfig.max_registers` on the mma kernel: the sm_90 build hands ptxas the cap (`.maxnreg`);
    without one the compiler chooses."""
    lines = run_compiler_script(_COMPILE_MMA_CAPPED).splitlines()
    assert lines == ["0 0 0", "96 1 1"]


def test_mma_gemm_compiles_for_hopper():
    """The Gluon mma.sync kernel built for sm_90 by the installed Triton: per K tile, 16 weight rows and
    8 pair columns eight m16n8k16 MMAs (four quarters of 32 k, two per quarter); the words copied
    16 bytes at a time by cp.async into the ring, a wait per tile (and one before an early exit); a
    dependent launch's wait; int8's quarters taken by prmt, MXFP4's by the e2m1 masks."""
    stdout = run_compiler_script(_COMPILE_MMA, json.dumps(_MMA_SPECIALIZATIONS))
    built = {name: tuple(map(int, counts)) for name, *counts in map(str.split, stdout.splitlines())}
    assert set(built) == set(_MMA_SPECIALIZATIONS)
    for name, (mmas, copies, copy_waits, waits, e2m1_masks, byte_selects) in built.items():
        consts = {**MMA_CONSTEXPRS, **_MMA_SPECIALIZATIONS[name][0]}
        row_blocks = consts["BLOCK_N"] // 64  # 4 warps of 16 rows each
        col_blocks = 1 if consts["DIRECT"] else consts["BLOCK_M"] // 8
        tiles = consts["TILES"]
        assert mmas == 8 * tiles * row_blocks * col_blocks, (name, mmas)
        # A wait per tile, and one where another rank's expert ends the program early; int8's words
        # are twice int4's bytes. Staged, each tile's scale rows (32 and 64 k: 4 and 2 of them; MXFP4's
        # exponent words: 1) and zero-point rows are one 16-byte copy each per thread (a per-channel row
        # is loaded, not copied).
        pieces = 4 if consts["WTYPE"] == 1 else 2
        group = 128 if consts["WTYPE"] == 3 else consts["GROUP"]
        scale_rows = (max(1, 128 // group) * (1 + consts["HAS_ZP"])) if consts["STAGED_SCALES"] and group else 0
        assert copies == (pieces * row_blocks + scale_rows) * tiles and copy_waits == tiles + 1, (name, copies,
                                                                                                  copy_waits)
        assert waits == 1, (name, waits)
        # Per tile and row block: quarters 0 and 1 of MXFP4 mask with 0x81C081C0, int8's four take their bytes by prmt.
        tiles = consts["TILES"] * row_blocks
        assert (e2m1_masks >= 2 * tiles) == (consts["WTYPE"] == 3), (name, e2m1_masks)
        assert (byte_selects >= 4 * tiles) == (consts["WTYPE"] == 1), (name, byte_selects)
