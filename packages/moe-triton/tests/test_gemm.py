"""The 16-bit expert GEMMs (`moe_triton.gemm`) against their torch twins, and their kernels
compiled for sm_90 without a GPU.
"""

import pytest
import torch
from _experts_support import GEMV1, GEMV2, WGMMA_TILE

from moe_core.config import Activation
from moe_triton._common.offline_compile import run_compiler_script
from moe_triton.align import align_block_size
from moe_triton.configs import TileConfig
from moe_triton.gemm import direct_gemm, direct_gemm_torch, grouped_gemm, grouped_gemm_torch


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("gemm", ["gemm1", "gemm2"])
def test_gemm_matches_torch_twin(gemm, tma, device):
    gen = torch.Generator().manual_seed(7)
    M, k, E, K, N = 13, 2, 4, 48, 40
    act = Activation.gelu() if gemm == "gemm1" else None
    rows_in = M if gemm == "gemm1" else M * k
    w = (torch.randn(E, 2 * N if act else N, K, generator=gen) / K**0.5).to(device)
    bias = torch.randn(E, w.shape[1], generator=gen).to(device)
    a = torch.randn(rows_in, K, generator=gen).to(device)
    tw = torch.rand(M, k, generator=gen).to(device)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(M)]).int().to(device)
    expert_map = torch.tensor([0, -1, 1, 2], dtype=torch.int32, device=device)
    sorted_ids, expert_ids, total = align_block_size(ids, 16, E, expert_map)
    w_local = w[[0, 2, 3]]
    b_local = bias[[0, 2, 3]]
    out = torch.randn(M * k, N, generator=gen).to(device)
    twin = out.clone()
    kw = dict(top_k=k, block_m=16, activation=act, mul_weight=True, zero_foreign=True)
    tile = TileConfig(16, 16, 2, 4, 1, tma=tma)
    grouped_gemm(a, w_local, b_local, out, tw, sorted_ids, expert_ids, total, tile=tile, **kw)
    grouped_gemm_torch(a, w_local, b_local, twin, tw, sorted_ids, expert_ids, total, **kw)
    torch.testing.assert_close(out, twin, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("gemm", ["gemm1", "gemm2"])
def test_gemm_narrow_blocks_match_torch_twin(gemm, tma, device):
    """Narrow tiles over 128-row blocks: an expert's last block with at most 64 valid rows multiplies
    only its first 64 (`moe_gemm_kernel`'s NARROW); the others all 128."""
    gen = torch.Generator().manual_seed(11)
    M, k, E, K, N = 160, 2, 3, 32, 24
    act = Activation.silu() if gemm == "gemm1" else None
    # Choices per expert 150, 100, 70: blocks of 128 and 22 (narrow), 100 and 70 rows.
    ids = torch.tensor([[0, 1] if t < 90 else [0, 2] if t < 150 else [1, 2] for t in range(M)], dtype=torch.int32)
    ids = ids[torch.randperm(M, generator=gen)].to(device)
    w = (torch.randn(E, 2 * N if act else N, K, generator=gen) / K**0.5).to(device)
    bias = torch.randn(E, w.shape[1], generator=gen).to(device)
    a = torch.randn(M if act else M * k, K, generator=gen).to(device)
    tw = torch.rand(M, k, generator=gen).to(device)
    sorted_ids, expert_ids, total = align_block_size(ids, 128, E)
    valid = [(sorted_ids[b * 128:(b + 1) * 128] < M * k).sum().item() for b in range(int(total) // 128)]
    assert any(v <= 64 for v in valid) and any(v > 64 for v in valid), valid
    out = torch.randn(M * k, N, generator=gen).to(device)
    twin = out.clone()
    kw = dict(top_k=k, block_m=128, activation=act, mul_weight=True, zero_foreign=True)
    tile = TileConfig(16, 16, 1, 4, 1, tma=tma, narrow=True)
    grouped_gemm(a, w, bias, out, tw, sorted_ids, expert_ids, total, tile=tile, **kw)
    grouped_gemm_torch(a, w, bias, twin, tw, sorted_ids, expert_ids, total, **kw)
    torch.testing.assert_close(out, twin, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("gemm", ["gemm1", "gemm2"])
def test_gemv_matches_torch_twin(gemm, device):
    # K = 40 is not a multiple of block_k, N = 20 not of block_n: the masked K loop and wrapped rows.
    gen = torch.Generator().manual_seed(12)
    M, k, E, K, N = 5, 3, 4, 40, 20
    act = Activation.swiglu_oai(1.702, 7.0) if gemm == "gemm1" else None
    w = (torch.randn(E, 2 * N if act else N, K, generator=gen) / K**0.5).to(device)
    bias = torch.randn(E, w.shape[1], generator=gen).to(device)
    a = torch.randn(M if act else M * k, K, generator=gen).to(device)
    tw = torch.rand(M, k, generator=gen).to(device)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(M)]).int().to(device)
    expert_map = torch.tensor([0, -1, 1, 2], dtype=torch.int32, device=device)
    w_local, b_local = w[[0, 2, 3]], bias[[0, 2, 3]]
    out = torch.zeros(M * k if act else M, N, device=device)
    twin = out.clone()
    kw = dict(activation=act, mul_weight=True)
    direct_gemm(a, w_local, b_local, out, tw, ids, expert_map, tile=GEMV1 if act else GEMV2, **kw)
    direct_gemm_torch(a, w_local, b_local, twin, tw, ids, expert_map, **kw)
    torch.testing.assert_close(out, twin, atol=1e-4, rtol=1e-4)


def test_wgmma_gemm_refused_off_hopper():
    # The Gluon kernel exists for sm_90 only: a clear error elsewhere (here CPU tensors), never a
    # silent fallback.
    # The refusal comes before any launch: sorted ids built by hand (on a GPU machine the CPU
    # tensors could not go through the alignment kernel).
    gen = torch.Generator().manual_seed(9)
    sorted_ids = torch.cat([torch.arange(10, dtype=torch.int32), torch.full((54,), 10, dtype=torch.int32)])
    expert_ids, total = torch.zeros(1, dtype=torch.int32), torch.tensor([64], dtype=torch.int32)
    a = torch.randn(10, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(4, 256, 64, generator=gen).to(torch.bfloat16)
    out = torch.empty(10, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"wgmma GEMM \(TileConfig.wgmma\) needs an NVIDIA Hopper GPU \(sm_90\)"):
        grouped_gemm(a, w, None, out, torch.rand(5, 2), sorted_ids, expert_ids, total, top_k=2, block_m=64,
                 tile=WGMMA_TILE, activation=None, mul_weight=True, zero_foreign=True)


@pytest.mark.device("cuda")
@pytest.mark.parametrize("tail", [16, 32])
@pytest.mark.parametrize("gemm", ["gemm1", "gemm2"])
def test_persistent_tails_match_torch_twin(gemm, tail):
    """A full 128-row block takes in its expert's last block of at most `tail` rows (`TileConfig.tail`):
    experts of 128 + 16, 128 + 17, 128 + 33, 256 + 3, 5, 0 and 128 rows, and one another rank owns."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the wgmma kernel is Hopper-only (its refusal elsewhere: test_wgmma_gemm_refused_off_hopper)")
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(tail)
    counts = [144, 145, 161, 259, 5, 0, 128, 40]
    E, K, N = len(counts), 192, 128
    ids = torch.cat([torch.full((c,), e, dtype=torch.int32) for e, c in enumerate(counts)])
    M = ids.numel()
    ids = ids[torch.randperm(M, generator=gen)][:, None].to(dev)  # one choice per token
    expert_map = torch.tensor([0, 1, 2, 3, 4, 5, 6, -1], dtype=torch.int32, device=dev)
    sorted_ids, expert_ids, total = align_block_size(ids, 128, E, expert_map)
    act = Activation.silu() if gemm == "gemm1" else None
    w = (torch.randn(E - 1, 2 * N if act else N, K, generator=gen) / K**0.5).to(dev, torch.bfloat16)
    bias = torch.randn(E - 1, w.shape[1], generator=gen).to(dev)
    a = torch.randn(M, K, generator=gen).to(dev, torch.bfloat16)
    tw = torch.rand(M, 1, generator=gen).to(dev)
    out = torch.randn(M, N, generator=gen).to(dev, torch.bfloat16)
    twin = out.clone()
    kw = dict(top_k=1, block_m=128, activation=act, mul_weight=True, zero_foreign=True)
    tile = TileConfig(N // 2 if act else N, 64, 1, 8, 3, wgmma=True, persistent=True, tail=tail)
    grouped_gemm(a, w, bias, out, tw, sorted_ids, expert_ids, total, tile=tile, **kw)
    grouped_gemm_torch(a, w, bias, twin, tw, sorted_ids, expert_ids, total, **kw)
    torch.testing.assert_close(out.float(), twin.float(), atol=3e-2, rtol=2e-2)


_COMPILE_BF16 = """
from moe_triton._common.activation import ActKind
from moe_triton._common.offline_compile import compile_kernel
from moe_triton.gemm_details._direct import moe_gemv1_kernel, moe_gemv2_kernel
from moe_triton.gemm_details._kernel import moe_gemm_kernel
ptrs = {"a_ptr": "*bf16", "b_ptr": "*bf16", "b_desc": "*bf16", "bias_ptr": "*bf16", "c_ptr": "*bf16",
        "topk_weights_ptr": "*fp32", "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32", "total_ptr": "*i32",
        "x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "topk_ids_ptr": "*i32", "expert_map_ptr": "*i32",
        "alpha": "fp32", "limit": "fp32"}
compile_kernel(moe_gemm_kernel, dict(A_ROW_DIV=8, GATED=True, ACT=int(ActKind.SILU), HAS_BIAS=False, MUL_WEIGHT=False,
                                        ZERO_FOREIGN=False, EVEN_K=True, B_TMA=False, UPCAST=False,
                                        DOT_PRECISION="tf32", BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8,
                                        NARROW=False, PDL=True), ptrs)
# 128-row blocks with their narrow half-block path.
compile_kernel(moe_gemm_kernel, dict(A_ROW_DIV=8, GATED=True, ACT=int(ActKind.SILU), HAS_BIAS=False, MUL_WEIGHT=False,
                                        ZERO_FOREIGN=True, EVEN_K=True, B_TMA=False, UPCAST=False,
                                        DOT_PRECISION="tf32", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8,
                                        NARROW=True, PDL=True), ptrs, num_warps=8, num_stages=4)
direct = dict(HAS_BIAS=True, MUL_WEIGHT=False, HAS_MAP=False, EVEN_K=True, BLOCK_N=8, BLOCK_K=256, PDL=True)
compile_kernel(moe_gemv1_kernel, dict(direct, TOP_K=8, GATED=True, ACT=int(ActKind.SWIGLU_OAI)), ptrs)
compile_kernel(moe_gemv2_kernel, dict(direct, TOP_K=8, K_P2=8), ptrs)
from moe_triton._common.offline_compile import compile_bf16_wgmma_gemm
# GEMM1 (SiLU) of 128-row blocks; GEMM2 with bias, router weight and zeroed foreign blocks; 64-row
# blocks with a K tail, the clamped SwiGLU, fp16 and sizes and strides that are not multiples of 16
# (cp.async needs 16-byte pieces: Triton must see them from multiples of 8). Each per tile, persistent,
# and persistent with 32-row tails (the largest ring).
for consts, fp16 in ((dict(), False),
                     (dict(GATED=False, ACT=0, A_ROW_DIV=1, HAS_BIAS=True, MUL_WEIGHT=True, ZERO_FOREIGN=True), False),
                     (dict(BLOCK_M=64, BLOCK_N=128, STAGES=3, ACT=int(ActKind.SWIGLU_OAI), HAS_BIAS=True, K_TAIL=True), True)):
    ptr16 = "*fp16" if fp16 else "*bf16"
    for persistent, tail in ((False, 0), (True, 0), (True, 32)):
        k = compile_bf16_wgmma_gemm({**consts, "TAIL": tail} if persistent else consts,
                                    {"a_ptr": ptr16, "c_ptr": ptr16}, aligned_ints=not fp16, persistent=persistent)
        assert k.metadata.shared <= 232448, k.metadata.shared  # an H100 block's shared memory
print("built")
"""


def test_kernels_compile_for_hopper():
    """Triton's compiler on the bf16 GEMM and the direct kernels for sm_90, launched dependent (their
    griddepcontrol code never runs under the interpreter), and on the Gluon wgmma GEMM, which the
    interpreter cannot run; in a child process, since this module may interpret the kernels."""
    assert run_compiler_script(_COMPILE_BF16).split() == ["built"]
