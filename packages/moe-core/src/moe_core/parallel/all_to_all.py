"""All-to-all mode: dispatch each rank's routed tokens to the ranks holding their experts, run the
local experts there, send the partial sums back and combine them in the tokens' original order.

Per call, on every rank of the group (each with its own M tokens, already routed on this rank):
1. destination of each (token, choice): the rank of the expert's copy that serves it (one copy;
   with redundant replicas, copy `(row + source rank) % copies`, the same on every call);
2. a token is sent once to each destination, with its k choices; choices served elsewhere are
   masked (weight 0 and an id the receiving rank does not hold: the experts contract makes them
   contribute zero);
3. exchange the row counts (`all_to_all_single` of int64 [R]), then the rows: hidden (in the
   payload dtype) + fp32 weights + int32 ids packed as bytes, one `all_to_all_single`;
4. the receiving rank runs its experts' modular `apply` on what it got;
5. the weighted partial sums [rows, K] go back the reverse way (one `all_to_all_single`);
6. each token adds its partial sums in fp32, rank by rank (deterministic), one rounding.

With `AllToAll(fixed_slots=True)` steps 2-3 send every token to every rank (rows without a
choice there are fully masked), so the splits are [M] * R and nothing waits on the host: the call
can be captured in a CUDA graph at a fixed token bucket M (the same M on every rank). It moves as
many bytes as an all-gather; exact splits (the default) move only the routed rows but read the
counts on the host, which graph capture cannot do.

Collectives go through torch.distributed: NCCL needs the tensors on the rank's GPU and takes the
uneven split sizes as Python int lists (what is passed here); gloo runs the same calls on CPU.
Rows travel as uint8 bytes, so any payload dtype passes any backend.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from moe_core.config import MoEConfig
from moe_core.experts import Experts
from moe_core.parallel.modes import AllToAll
from moe_core.parallel.replicate import check_group

__all__ = ["AllToAllDispatch", "decode_rows", "encode_rows", "payload_roundtrip"]

_FP8_MAX = 448.0  # largest finite float8_e4m3fn
_SCALE_FLOOR = 1e-12  # keeps an all-zero row's scale finite


def encode_rows(x: torch.Tensor, payload: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows [n, K] in the dispatch payload: (values, per-row fp32 scale [n, 1] for fp8 else None)."""
    if payload is None or payload == x.dtype:
        return x, None
    if payload == torch.float8_e4m3fn:
        scale = (x.abs().amax(1, keepdim=True).float() / _FP8_MAX).clamp_min(_SCALE_FLOOR)
        return (x.float() / scale).to(torch.float8_e4m3fn), scale
    return x.to(payload), None


def decode_rows(values: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    if scale is not None:
        return (values.float() * scale).to(dtype)
    return values.to(dtype)


def payload_roundtrip(x: torch.Tensor, payload: torch.dtype | None) -> torch.Tensor:
    """What the experts see of `x` after dispatch in `payload` (x itself for the layer dtype)."""
    return decode_rows(*encode_rows(x, payload), x.dtype)


def _as_bytes(rows: torch.Tensor) -> torch.Tensor:
    """[n, c] of any dtype -> uint8 [n, c * itemsize] (same memory)."""
    if rows.numel() == 0:  # an empty tensor counts as contiguous with any strides, which view(dtype) refuses
        return torch.empty((rows.shape[0], rows.shape[1] * rows.element_size()), dtype=torch.uint8,
                           device=rows.device)
    return rows.contiguous().view(torch.uint8)


def _unpack_rows(received: torch.Tensor, payload: torch.dtype, K: int, k: int, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Received byte rows -> (hidden [n, K] in `dtype`, fp32 weights [n, k], int32 ids [n, k])."""
    width = K * payload.itemsize
    scaled = payload == torch.float8_e4m3fn

    def field(start: int, nbytes: int, as_dtype: torch.dtype) -> torch.Tensor:
        return received[:, start:start + nbytes].contiguous().view(as_dtype)

    scale = field(width, 4, torch.float32) if scaled else None
    at = width + (4 if scaled else 0)
    return (decode_rows(field(0, width, payload), scale, dtype), field(at, 4 * k, torch.float32),
            field(at + 4 * k, 4 * k, torch.int32))


class AllToAllDispatch:
    """Dispatch + local experts + combine for one layer on one rank of the expert-parallel group."""

    def __init__(self, config: MoEConfig, mode: AllToAll, group: dist.ProcessGroup | None = None) -> None:
        check_group(config, group)
        self.config, self.mode, self.group = config, mode, group
        p = config.parallel
        self.num_ranks, self.rank = p.ep_size, p.ep_rank
        E = config.num_experts
        placement = p.expert_placement(E)
        copies = [placement.replicas(e) for e in range(E)]
        width = max(map(len, copies))
        # copy_rank[e, j]: rank of copy j of expert e; rows padded with copy 0 (never picked past copies[e]).
        copy_rank = torch.tensor([[r for r, _ in c] + [c[0][0]] * (width - len(c)) for c in copies])
        num_copies = torch.tensor([len(c) for c in copies])
        absent = []  # per rank: an expert it holds no copy of, the id masked choices take there
        for r, held in enumerate(placement.ranks):
            missing = sorted(set(range(E)).difference(held))
            if not missing:
                raise ValueError(f"all-to-all: rank {r} holds every expert, so choices served by another copy "
                                 "cannot be masked there; give each rank at most num_experts - 1 experts")
            absent.append(missing[0])
        self._cpu_tables = (copy_rank, num_copies, torch.tensor(absent))
        self._tables: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def _on(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        if device not in self._tables:  # moved once per device, before any graph capture (warm-up call)
            self._tables[device] = tuple(t.to(device) for t in self._cpu_tables)
        return self._tables[device]

    def destinations(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """int64 [M, k]: the rank serving each choice."""
        copy_rank, num_copies, _ = self._on(topk_ids.device)
        ids = topk_ids.long()
        if copy_rank.shape[1] == 1:
            return copy_rank[ids, 0]
        rows = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1)
        pick = (rows + self.rank) % num_copies[ids]
        return copy_rank[ids, pick]

    def __call__(self, experts: Experts, hidden_states: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor) -> torch.Tensor:
        """[M, K] hidden + this rank's routing of them -> the layer output for these M tokens."""
        M, K = hidden_states.shape
        k = topk_ids.shape[1]
        R, dev = self.num_ranks, hidden_states.device
        _, _, absent = self._on(dev)
        dest = self.destinations(topk_ids)
        if self.mode.fixed_slots:
            send_rank = torch.arange(R, device=dev).repeat_interleave(M)
            send_token = torch.arange(M, device=dev).repeat(R)
            send_splits = recv_splits = [M] * R
        else:
            goes = torch.zeros(M, R, dtype=torch.bool, device=dev).scatter_(1, dest, True)
            send_rank, send_token = goes.t().nonzero(as_tuple=True)  # by destination, then token
            counts = goes.sum(0)
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts, group=self.group)
            send_splits, recv_splits = torch.stack([counts, recv_counts]).tolist()
        mine = dest[send_token] == send_rank.unsqueeze(1)
        ids = torch.where(mine, topk_ids[send_token].int(), absent[send_rank].int().unsqueeze(1))
        weights = torch.where(mine, topk_weights[send_token].float(), 0.0)
        values, scale = encode_rows(hidden_states[send_token], self.mode.payload)
        parts = [values] + ([scale] if scale is not None else []) + [weights, ids]
        rows = torch.cat([_as_bytes(t) for t in parts], 1)
        received = rows.new_empty((sum(recv_splits), rows.shape[1]))
        dist.all_to_all_single(received, rows, recv_splits, send_splits, group=self.group)

        x, w, i = _unpack_rows(received, values.dtype, K, k, hidden_states.dtype)
        try:
            y = experts.apply(x, w, i.to(topk_ids.dtype)) if x.shape[0] else x.new_empty((0, K))
        except NotImplementedError as exc:
            raise RuntimeError(f"{experts.name()} cannot run pre-routed rows (its modular apply), which all-to-all "
                               "mode needs; choose another backend (prefer=...) or parallel=Replicate()") from exc
        back = torch.empty((send_token.shape[0], K), dtype=y.dtype, device=dev)
        dist.all_to_all_single(back.view(torch.uint8), _as_bytes(y), send_splits, recv_splits, group=self.group)

        out = torch.zeros((M, K), dtype=torch.float32, device=dev)
        start = 0
        for n in send_splits:  # a token appears once per destination: rank by rank, each add is ordered
            out.index_add_(0, send_token[start:start + n], back[start:start + n].float())
            start += n
        return out.to(hidden_states.dtype)
