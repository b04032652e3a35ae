"""Token alignment: group the flattened (token, slot) choices by expert, padded to whole GEMM blocks.

`align_block_size(topk_ids [M, k], block_size, num_experts, expert_map=None)` returns, in vLLM's
`moe_align_block_size` semantics:

- `sorted_token_ids` int32 [M*k + E*(block_size-1)]: indices t*k + s, experts in order, each
  expert's segment padded to a multiple of `block_size` with the sentinel M*k; within an expert
  the indices are in increasing order (both implementations are stable, so they agree exactly).
- `expert_ids` int32 [cdiv(max_padded, block_size)]: the expert of each block (its local id under
  `expert_map`, -1 when another rank owns it); -1 for blocks past the padded total.
- `num_tokens_post_padded` int32 [1]: the padded total (a device scalar, so no host sync).

Precondition of the Triton path: every id lies in [0, num_experts) (routers produce that by
construction; checking it would cost a device sync). The torch twin checks it.
"""

from __future__ import annotations

import torch

from moe_triton.align_details._kernels import launch_align

__all__ = ["align_block_size", "align_block_size_torch", "max_padded_tokens"]


def max_padded_tokens(num_choices: int, block_size: int, num_experts: int) -> int:
    """Worst-case length of `sorted_token_ids`: every expert may add block_size-1 padding."""
    return num_choices + num_experts * (block_size - 1)


def _check(topk_ids: torch.Tensor, block_size: int, num_experts: int, expert_map: torch.Tensor | None) -> None:
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be [M, top_k], got shape {list(topk_ids.shape)}")
    if topk_ids.dtype != torch.int32:
        raise ValueError(f"topk_ids must be int32, got {topk_ids.dtype}")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size={block_size!r} must be a positive int")
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts={num_experts!r} must be a positive int")
    if expert_map is not None:
        if expert_map.dtype != torch.int32 or tuple(expert_map.shape) != (num_experts,):
            raise ValueError(f"expert_map must be int32 [{num_experts}] (global -> local id or -1), got "
                             f"{expert_map.dtype} {list(expert_map.shape)}")
        if expert_map.device != topk_ids.device:
            raise ValueError(f"expert_map is on {expert_map.device}, topk_ids on {topk_ids.device}")


def align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int,
                     expert_map: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton implementation; see the module docstring for the outputs."""
    _check(topk_ids, block_size, num_experts, expert_map)
    return launch_align(topk_ids.contiguous(), block_size, num_experts, expert_map)


def align_block_size_torch(topk_ids: torch.Tensor, block_size: int, num_experts: int,
                           expert_map: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference twin of `align_block_size`, in plain torch."""
    _check(topk_ids, block_size, num_experts, expert_map)
    device = topk_ids.device
    flat = topk_ids.flatten().long()
    numel = flat.numel()
    if numel and (int(flat.min()) < 0 or int(flat.max()) >= num_experts):
        raise ValueError(f"topk_ids must lie in [0, {num_experts}), got [{int(flat.min())}, {int(flat.max())}]")
    max_padded = max_padded_tokens(numel, block_size, num_experts)
    max_blocks = -(-max_padded // block_size)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_size - 1) // block_size * block_size
    padded_starts = torch.cumsum(padded, 0) - padded
    count_starts = torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)
    expert_of_sorted = flat[order]
    rank = torch.arange(numel, device=device) - count_starts[expert_of_sorted]
    sorted_ids = torch.full((max_padded,), numel, dtype=torch.int32, device=device)
    sorted_ids[padded_starts[expert_of_sorted] + rank] = order.to(torch.int32)
    block_expert = torch.repeat_interleave(torch.arange(num_experts, device=device), padded // block_size)
    if expert_map is not None:
        block_expert = expert_map.long()[block_expert]
    expert_ids = torch.full((max_blocks,), -1, dtype=torch.int32, device=device)
    expert_ids[: block_expert.numel()] = block_expert.to(torch.int32)
    total = padded.sum().to(torch.int32).view(1)
    return sorted_ids, expert_ids, total
