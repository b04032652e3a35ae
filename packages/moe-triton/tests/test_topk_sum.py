"""The top-k reduce behind GEMM2's stored rows (`moe_triton.topk_sum`) against an fp32 sum and its torch twin."""

import pytest
import torch

from moe_triton._common.offline_compile import run_compiler_script
from moe_triton.topk_sum import (
    BLOCK_K,
    BLOCK_T,
    gather_topk_sum,
    gather_topk_sum_torch,
    topk_sum,
    topk_sum_torch,
)


@pytest.mark.parametrize(("M", "top_k", "K"), [
    (1, 8, 64),
    (BLOCK_T * 3 + 1, 4, BLOCK_K + 24),  # a partly filled last column block (and token block, if BLOCK_T > 1)
    (7, 2, 2880),
    (3, 1, 100),
    (4, 6, 8),  # a top-k that is not a power of two
])
def test_matches_an_fp32_sum(M, top_k, K, device):
    gen = torch.Generator().manual_seed(M * 31 + top_k * 7 + K)
    rows = torch.randn(M * top_k, K, generator=gen).to(device)
    out = topk_sum(rows, top_k, torch.float32)
    assert out.shape == (M, K) and out.dtype == torch.float32
    torch.testing.assert_close(out, rows.view(M, top_k, K).double().sum(dim=1).float(), atol=1e-5, rtol=1e-6)
    # Same fp32 additions in the same order: the twin agrees bit for bit.
    assert torch.equal(out, topk_sum_torch(rows, top_k, torch.float32))


def test_sums_16_bit_rows_in_fp32(device):
    gen = torch.Generator().manual_seed(5)
    rows = torch.randn(9 * 8, 300, generator=gen).to(torch.bfloat16).to(device)
    out = topk_sum(rows, 8, torch.float32)
    # Summed in bf16 the error would be about 2**-8 of the sum; in fp32 only fp32 rounding is left.
    torch.testing.assert_close(out, rows.view(9, 8, 300).double().sum(dim=1).float(), atol=1e-5, rtol=1e-6)


def test_no_tokens(device):
    out = topk_sum(torch.empty(0, 16, device=device), 8, torch.bfloat16)
    assert out.shape == (0, 16) and out.dtype == torch.bfloat16


def test_rejects_rows_it_cannot_sum(device):
    rows = torch.randn(16, 32, device=device)
    with pytest.raises(ValueError, match="contiguous"):
        topk_sum(rows.t(), 8, torch.float32)
    with pytest.raises(ValueError, match="contiguous"):
        topk_sum(rows.flatten(), 8, torch.float32)
    with pytest.raises(ValueError, match="divisor of the 16 rows"):
        topk_sum(rows, 3, torch.float32)
    with pytest.raises(ValueError, match="divisor"):
        topk_sum(rows, 0, torch.float32)


def _sorted_rows(M: int, top_k: int, K: int, owned: float, seed: int, dtype=torch.float32):
    """Rows in a random order (as a grouped GEMM leaves them), each choice's slot, some choices owned
    elsewhere (slot -1, their rows filled with NaN: never to be read), and per-row weights."""
    gen = torch.Generator().manual_seed(seed)
    P = M * top_k
    order = torch.randperm(P, generator=gen)  # sorted row i holds flat choice order[i]
    rows = torch.randn(P, K, generator=gen).to(dtype)
    weights = torch.rand(P, generator=gen)
    local = torch.rand(P, generator=gen) < owned
    slot = torch.full((P,), -1, dtype=torch.int32)
    slot[order[local]] = torch.arange(P, dtype=torch.int32)[local]
    rows[~local] = float("nan")
    return rows, slot, weights, order, local


@pytest.mark.parametrize(("M", "top_k", "K", "owned"), [
    (1, 8, 64, 1.0), (BLOCK_T * 3 + 1, 4, BLOCK_K + 24, 0.7), (7, 2, 2880, 1.0), (5, 6, 8, 0.5), (4, 1, 100, 0.0),
])
@pytest.mark.parametrize("weighted", [False, True])
def test_gathered_sum_matches_an_fp32_sum(M, top_k, K, owned, weighted, device):
    rows, slot, weights, order, local = _sorted_rows(M, top_k, K, owned, seed=M * 13 + top_k + K)
    w = weights if weighted else None
    out = gather_topk_sum(rows.to(device), slot.to(device), top_k, torch.float32,
                          w.to(device) if weighted else None)
    # The fp64 sum of the same products, back in (token, choice) order, skipped choices adding 0.
    flat = torch.zeros(M * top_k, K, dtype=torch.float64)
    flat[order[local]] = rows[local].double() * (weights[local].double()[:, None] if weighted else 1.0)
    assert out.shape == (M, K) and not out.isnan().any()
    torch.testing.assert_close(out.cpu(), flat.view(M, top_k, K).sum(1).float(), atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(out.cpu(), gather_topk_sum_torch(rows, slot, top_k, torch.float32, w),
                               atol=1e-6, rtol=1e-6)


def test_gathered_sum_rejects_what_it_cannot_take(device):
    rows = torch.randn(16, 32, device=device)
    slot = torch.arange(16, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="int32"):
        gather_topk_sum(rows, slot.long(), 8, torch.float32)
    with pytest.raises(ValueError, match="divisor of the 16 slots"):
        gather_topk_sum(rows, slot, 3, torch.float32)
    with pytest.raises(ValueError, match=r"fp32 \[16\]"):
        gather_topk_sum(rows, slot, 8, torch.float32, torch.ones(8, device=device))
    assert gather_topk_sum(rows, slot[:0], 8, torch.bfloat16).shape == (0, 32)


@pytest.mark.device("cuda")
@pytest.mark.parametrize(("M", "top_k", "K"), [(8192, 8, 2048), (2048, 4, 2880), (8192, 2, 4096)])
def test_layer_shapes_on_gpu(M, top_k, K):
    gen = torch.Generator(device="cuda").manual_seed(M + top_k)
    rows = torch.randn(M * top_k, K, generator=gen, device="cuda").to(torch.bfloat16)
    out = topk_sum(rows, top_k, torch.bfloat16)
    # One rounding of the same fp32 sums: equal to the twin, within a bf16 ulp of the exact sum.
    assert torch.equal(out, topk_sum_torch(rows, top_k, torch.bfloat16))
    torch.testing.assert_close(out.float(), rows.view(M, top_k, K).double().sum(dim=1).float(), atol=1e-2, rtol=8e-3)


_COMPILE = """
from moe_triton._common.offline_compile import compile_kernel
from moe_triton.topk_sum import BLOCK_K, BLOCK_T, topk_sum_kernel
for gather, weighted in ((False, False), (True, False), (True, True)):
    compile_kernel(topk_sum_kernel, dict(TOP_K=8, BLOCK_T=BLOCK_T, BLOCK_K=BLOCK_K, GATHER=gather,
                                         WEIGHTED=weighted, PDL=True),
                   {"rows_ptr": "*bf16", "out_ptr": "*bf16", "slot_ptr": "*i32", "weights_ptr": "*fp32"},
                   num_warps=4)
    print("built")
"""


def test_kernel_compiles_for_hopper():
    """Triton's compiler on the reduce (plain, gathered, gathered and weighted) for sm_90 with its
    dependent-launch wait, which the interpreter never runs (in a child process, since this module may interpret the kernel)."""
    assert run_compiler_script(_COMPILE).split() == ["built"] * 3
