"""`align_block_size` (Triton) against its torch twin, and the twin against the definition."""

import pytest
import torch

from moe_triton._common.offline_compile import run_compiler_script
from moe_triton.align import align_block_size, align_block_size_torch, max_padded_tokens


def _random_ids(M: int, k: int, E: int, gen: torch.Generator) -> torch.Tensor:
    return torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(M)]).to(torch.int32)


def _check_definition(ids: torch.Tensor, bs: int, E: int, expert_map, out) -> None:
    sorted_ids, expert_ids, total = (t.cpu() for t in out)
    flat = ids.flatten().cpu().long()
    numel = flat.numel()
    assert sorted_ids.numel() == max_padded_tokens(numel, bs, E)
    counts = torch.bincount(flat, minlength=E)
    padded = (counts + bs - 1) // bs * bs
    assert int(total) == int(padded.sum())
    live = sorted_ids[: int(total)]
    assert torch.equal(torch.sort(live[live < numel]).values, torch.arange(numel, dtype=torch.int32))
    assert bool((sorted_ids[int(total):] == numel).all())
    start = 0
    for e in range(E):
        seg = sorted_ids[start:start + int(padded[e])]
        real = seg[seg < numel].long()
        assert bool((flat[real] == e).all()) and real.numel() == int(counts[e])
        assert bool((real[1:] > real[:-1]).all()), "stable: increasing within an expert"
        want = e if expert_map is None else int(expert_map[e])
        assert bool((expert_ids[start // bs:(start + int(padded[e])) // bs] == want).all())
        start += int(padded[e])
    assert bool((expert_ids[int(total) // bs:] == -1).all())


CASES = {
    "one-token": (1, 2, 8, 16),
    "not-a-block-multiple": (37, 2, 8, 16),
    "empty-experts": (3, 2, 64, 16),
    "wide-block": (5, 4, 16, 64),
    "many-experts": (4, 8, 256, 16),
    "pairwise-largest": (32, 8, 128, 16),  # 256 choices: the most the pairwise kernel ranks
    "single-program": (150, 2, 8, 16),  # a one-hot tile of 512 x 8 in one program
    "chunks": (700, 4, 32, 32),
    "chunks-many-experts": (300, 8, 128, 64),
    "chunks-wide-block": (200, 8, 256, 128),
    "chunks-odd-block": (100, 8, 64, 24),
    "multi-launch": (1100, 4, 32, 32),
    "multi-launch-many-experts": (600, 8, 256, 16),  # the offsets scan: 16 programs of 16 experts
    "multi-launch-long-scan": (4200, 8, 16, 16),  # 263 chunks: the scan takes two steps of 256
    # One-row blocks (no padding: a stable sort by expert, as moe-cuda's grouped classes use it), each path
    "one-row-pairwise": (32, 8, 128, 1),
    "one-row-single-program": (150, 2, 8, 1),
    "one-row-chunks": (700, 4, 32, 1),
    "one-row-multi-launch": (1100, 4, 32, 1),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("with_map", [False, True])
def test_matches_twin_and_definition(name, with_map, device):
    M, k, E, bs = CASES[name]
    gen = torch.Generator().manual_seed(hash(name) % 1000)
    ids = _random_ids(M, k, E, gen).to(device)
    expert_map = None
    if with_map:  # this rank owns a middle slice; the others' experts map to -1
        expert_map = torch.full((E,), -1, dtype=torch.int32)
        lo, hi = E // 4, E // 2 + 1
        expert_map[lo:hi] = torch.arange(hi - lo, dtype=torch.int32)
        expert_map = expert_map.to(device)
    got = align_block_size(ids, bs, E, expert_map)
    want = align_block_size_torch(ids, bs, E, expert_map)
    for g, w in zip(got, want):
        assert g.dtype == torch.int32
        assert torch.equal(g, w)
    _check_definition(ids, bs, E, None if expert_map is None else expert_map.cpu(), want)


@pytest.mark.parametrize("M", [1, 50, 2000])
def test_all_tokens_to_one_expert(M, device):
    ids = torch.full((M, 1), 5, dtype=torch.int32, device=device)
    got = align_block_size(ids, 16, 8)
    want = align_block_size_torch(ids, 16, 8)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert int(got[2]) == -(-M // 16) * 16


def test_rejects_bad_input(device):
    ids = torch.zeros(4, 2, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="int32"):
        align_block_size(ids, 16, 8)
    with pytest.raises(ValueError, match=r"\[M, top_k\]"):
        align_block_size(ids.int().flatten(), 16, 8)
    with pytest.raises(ValueError, match="block_size"):
        align_block_size(ids.int(), 0, 8)
    with pytest.raises(ValueError, match="expert_map"):
        align_block_size(ids.int(), 16, 8, torch.zeros(7, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        align_block_size_torch(torch.full((2, 2), 9, dtype=torch.int32, device=device), 16, 8)


@pytest.mark.device("cuda")
@pytest.mark.parametrize("M", [1, 8, 32, 16384])
def test_real_sizes_on_gpu(M):
    gen = torch.Generator().manual_seed(M)
    ids = torch.randint(0, 256, (M, 8), generator=gen, dtype=torch.int32).cuda()
    for bs in (16, 64, 128):
        got = align_block_size(ids, bs, 256)
        want = align_block_size_torch(ids, bs, 256)
        assert all(torch.equal(g, w) for g, w in zip(got, want))


_COMPILE_ALIGN = """
from moe_triton.align_details import _kernels as ak
from moe_triton._common.offline_compile import compile_kernel
ptrs = dict.fromkeys(("topk_ids_ptr", "expert_map_ptr", "sorted_ptr", "expert_ids_ptr", "total_ptr", "hist_ptr",
                      "counts_ptr"), "*i32")
common = dict(HAS_MAP=True, BLOCK_SIZE=16, E_P2=256)
one_launch = dict(common, PDL=True)  # launched dependent on the kernel ahead
compile_kernel(ak._align_pairs_kernel, dict(one_launch, NUMEL_P2=256, FILL_TILE=1024), ptrs)
compile_kernel(ak._align_single_kernel, dict(one_launch, E_P2=8, NUMEL_P2=2048, FILL_TILE=1024), ptrs)
compile_kernel(ak._align_chunks_kernel, dict(one_launch, BLOCK_SIZE=24, BS_P2=32, NUMEL_P2=4096, EXPERTS_PER_PROGRAM=8,
                                             CHUNK=128, FILL_TILE=1024), ptrs)
compile_kernel(ak._align_count_kernel, dict(CHUNK=128, E_P2=256, FILL_TILE=256), ptrs)
compile_kernel(ak._align_offsets_kernel, dict(E_P2=256, EXPERTS=16, ROWS=256), ptrs)
compile_kernel(ak._align_scatter_kernel, dict(common, CHUNK=128), ptrs)
print("built")
"""


def test_kernels_compile_for_hopper():
    """Triton's compiler on every alignment kernel for sm_90, which the interpreter never runs (in a
    child process, since this module may interpret the kernels)."""
    assert run_compiler_script(_COMPILE_ALIGN).split() == ["built"]
