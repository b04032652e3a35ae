"""`permute_by_expert` (the alignment's counting sort at one-row blocks, then one fields pass) against
its torch twin, field by field, on fresh random routings; and the refusals."""

import pytest
import torch
from _quant_support import DEV

from moe_triton.expert_permutation import permute_by_expert, permute_by_expert_torch

FIELDS = ("pair", "token", "expert", "weight", "slot", "offsets", "starts", "counts")


@pytest.mark.parametrize(("M", "top_k", "E", "elsewhere"), [
    (1, 2, 8, False), (37, 2, 8, True), (150, 2, 8, False), (700, 4, 32, True), (1100, 4, 32, False),
    (300, 8, 128, False)],
    ids=["one-token", "expert-parallel", "one-program", "chunks", "multi-launch", "many-experts"])
def test_the_two_launches_equal_the_stable_argsort(M, top_k, E, elsewhere):
    """Every field, bit for bit: pairs of experts computed elsewhere (id E) sort last with slot -1;
    experts nobody chose get empty segments; more than one fields program past 1024 pairs."""
    gen = torch.Generator().manual_seed(M)
    ids = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(M)]).to(torch.int32)
    if elsewhere:  # this rank computes experts 0 .. E/2 - 1; the others are marked E
        ids = torch.where(ids < E // 2, ids, E // 2)
        E //= 2
    weights = torch.rand(M, top_k, generator=gen).to(torch.bfloat16)
    want = permute_by_expert_torch(ids, weights, E)
    got = permute_by_expert(ids.to(DEV), weights.to(DEV), E)
    for name in FIELDS:
        w, g = getattr(want, name), getattr(got, name).cpu()
        assert g.dtype == w.dtype and torch.equal(g, w), name
    assert want.counts.sum() == want.local.sum()


def test_no_pairs_give_empty_fields():
    got = permute_by_expert(torch.empty(0, 2, dtype=torch.int32, device=DEV), torch.empty(0, 2, device=DEV), 4)
    assert got.pair.numel() == 0 and got.counts.tolist() == [0, 0, 0, 0]


def test_refusals_name_what_is_accepted():
    ids, weights = torch.zeros(3, 2, dtype=torch.int32), torch.rand(3, 2)
    with pytest.raises(ValueError, match="int32"):
        permute_by_expert(ids.long(), weights, 4)
    with pytest.raises(ValueError, match="shaped as topk_ids"):
        permute_by_expert(ids, weights[:2], 4)
    with pytest.raises(ValueError, match="positive int"):
        permute_by_expert(ids, weights, 0)
    with pytest.raises(ValueError, match=r"must lie in \[0, 4\]"):
        permute_by_expert_torch(ids + 5, weights, 4)


_COMPILE = """
from moe_triton._common.offline_compile import compile_kernel
from moe_triton.expert_permutation import _fields_kernel
pointers = {"sorted_pairs_ptr": "*i32", "sorted_experts_ptr": "*i32", "weights_ptr": "*bf16", "pair_ptr": "*i64",
            "token_ptr": "*i64", "expert_ptr": "*i64", "weight_ptr": "*fp32", "slot_ptr": "*i32",
            "offsets_ptr": "*i32", "starts_ptr": "*i32", "counts_ptr": "*i32"}
ptx = compile_kernel(_fields_kernel, dict(BLOCK=1024, E_BLOCK=128), pointers).asm["ptx"]
print(".entry _fields_kernel" in ptx)
"""


def test_the_fields_pass_compiles_for_hopper():
    """Built for sm_90 by the installed Triton (the interpreter runs none of the compiler), in a child process."""
    from moe_triton._common.offline_compile import run_compiler_script

    assert run_compiler_script(_COMPILE).split() == ["True"]
