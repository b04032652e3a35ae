"""The sum of each token's top-k expert rows as one Triton pass on CUDA.

GEMM2 of the Marlin flow writes one row per (token, choice), already weighted; a token's k rows are
consecutive. Summed in fp32 and written once in the layer dtype, as the torch form
`y.view(M, k, K).sum(1, dtype=torch.float32).to(y.dtype)` (its twin) computes them in two launches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["topk_sum_pass"]

_BLOCK = 1024


@triton.jit
def _topk_sum(y_ptr, out_ptr, K, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < K
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for choice in tl.static_range(TOP_K):
        acc += tl.load(y_ptr + (token * TOP_K + choice) * K + cols, mask=mask).to(tl.float32)
    tl.store(out_ptr + token * K + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def topk_sum_pass(y: torch.Tensor, num_tokens: int, top_k: int) -> torch.Tensor:
    """y [num_tokens * top_k, K] (contiguous, a token's rows consecutive) -> [num_tokens, K] in y's dtype."""
    K = y.shape[1]
    out = torch.empty(num_tokens, K, dtype=y.dtype, device=y.device)
    if num_tokens:
        _topk_sum[(num_tokens, triton.cdiv(K, _BLOCK))](y.contiguous(), out, K, TOP_K=top_k, BLOCK=_BLOCK)
    return out
