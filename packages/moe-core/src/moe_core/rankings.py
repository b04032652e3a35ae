"""Measured backend rankings: which installed backend ran a layer fastest on a device, as data.

Static priorities (`moe_core.plugins.Priority`) cannot know that one kernel wins on one GPU and loses
on the next; a ranking file can. `moe bench --backends all` times every installed backend on the
same layers and writes one (`ranking_from_rows`); `select()` orders the backends it covers by the
measured times and keeps the static order for the rest.

A ranking file is JSON for one device name (torch's, e.g. "NVIDIA H200"):

    {"device": "NVIDIA H200", "measured": {"date": ..., "torch": ..., "distributions": {...}},
     "protocol": "...", "entries": [{"scheme": "int4_w4a16_g128", "family": "wna16",
       "shape": "E=128,N=768,K=2048,topk=8", "tokens": 32, "us": {"triton": 41.2, "marlin": 60.3}}, ...]}

`tokens` is a bucket: an entry measured at M tokens serves the layers called with at most M tokens
and more than the next smaller bucket (`token_bucket`). Files are read from, in this order (the
first that covers a case decides): the paths in env `MOE_RANKINGS` (files, or folders whose
`ranking-*.json` files are read; `os.pathsep` separated; `MOE_RANKINGS=off` disables rankings), the
user's folder (`user_rankings_dir()`, where `moe bench --save-ranking` writes), and the files shipped
in `moe_core/rankings_data/`.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from moe_core.config import MoEConfig
from moe_core.quant import MoEQuantConfig

__all__ = ["ENV_RANKINGS", "TOKEN_BUCKETS", "Ranking", "RankingEntry", "RankingMatch", "find_ranking",
           "list_rankings", "load_ranking", "ranking_from_rows", "shape_key", "token_bucket", "user_rankings_dir"]

ENV_RANKINGS = "MOE_RANKINGS"
# Token counts the benchmark measures; a count between two buckets takes the larger one's entry.
TOKEN_BUCKETS = (1, 8, 32, 128, 512, 2048, 8192)
_SHIPPED_DIR = Path(__file__).parent / "rankings_data"


def token_bucket(num_tokens: int) -> int:
    """The smallest bucket holding `num_tokens` (the largest bucket for anything above it)."""
    if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 1:
        raise ValueError(f"num_tokens must be an int >= 1, got {num_tokens!r}")
    return next((b for b in TOKEN_BUCKETS if num_tokens <= b), TOKEN_BUCKETS[-1])


def shape_key(config: MoEConfig) -> str:
    """The layer shape a ranking entry is measured on: the experts one device holds, the expert's
    intermediate size, the hidden size and top-k."""
    return (f"E={config.num_local_experts},N={config.intermediate_size},K={config.hidden_size},"
            f"topk={config.top_k}")


@dataclass(frozen=True)
class RankingEntry:
    scheme: str  # MoEQuantConfig.name
    family: str  # QuantFamily value of the scheme
    shape: str  # shape_key of the measured layer
    tokens: int  # one of TOKEN_BUCKETS
    us: tuple[tuple[str, float], ...]  # (backend, microseconds per layer call), fastest first

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(b for b, _ in self.us)


@dataclass(frozen=True)
class Ranking:
    device: str  # torch's device name the entries were measured on
    source: str  # the file it was read from
    measured: dict  # date, torch, triton and distribution versions of the measuring run
    protocol: str  # how the times were taken
    entries: tuple[RankingEntry, ...]


@dataclass(frozen=True)
class RankingMatch:
    """The measured order for one case, and what it rests on."""

    us: tuple[tuple[str, float], ...]  # fastest first: one entry's microseconds, or (relative) geometric
    # means of time / the entry's fastest
    basis: str  # which entries decided: "scheme and shape at 32 tokens", "scheme on 3 shapes", ...
    ranking: Ranking
    relative: bool = False  # `us` holds ratios to each entry's fastest, not times

    @property
    def order(self) -> tuple[str, ...]:
        """The measured backends, fastest first."""
        return tuple(b for b, _ in self.us)

    def time_text(self, backend: str) -> str:
        t = dict(self.us)[backend]
        return f"{t:.2f}x the fastest" if self.relative else f"{t:.1f} us"

    def describe(self) -> str:
        times = ", ".join(f"{b} {self.time_text(b)}" for b, _ in self.us)
        date = self.ranking.measured.get("date", "undated")
        return (f"measured ranking {self.ranking.source} ({self.ranking.device}, {date}; {self.basis}): "
                f"{times}")


def load_ranking(path: str | os.PathLike) -> Ranking:
    """Read one ranking file; ValueError naming the file and the field that is wrong."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"ranking file {path}: cannot be read as JSON: {exc}") from None
    try:
        if not isinstance(data, dict):
            raise TypeError("the top level is not a JSON object")
        entries = []
        for e in data["entries"]:
            us = tuple(sorted(((str(b), float(t)) for b, t in e["us"].items()), key=lambda bt: bt[1]))
            if not us or any(not math.isfinite(t) or t <= 0 for _, t in us):
                raise ValueError(f"entry {e!r} needs positive finite times")
            if int(e["tokens"]) not in TOKEN_BUCKETS:
                raise ValueError(f"entry tokens {e['tokens']!r} is not one of {TOKEN_BUCKETS}")
            entries.append(RankingEntry(str(e["scheme"]), str(e["family"]), str(e["shape"]), int(e["tokens"]), us))
        return Ranking(str(data["device"]), str(path), dict(data.get("measured", {})), str(data.get("protocol", "")),
                       tuple(entries))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"ranking file {path}: {what} (expected device, entries[scheme, family, shape, "
                         f"tokens, us{{backend: microseconds}}])") from None


def user_rankings_dir() -> Path:
    """Where `moe bench --save-ranking` writes: $XDG_CACHE_HOME/moe/rankings (default ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "moe" / "rankings"


def _ranking_paths() -> list[Path]:
    env = os.environ.get(ENV_RANKINGS)
    if env is not None and env.strip().lower() == "off":
        return []
    roots = [Path(p) for p in (env or "").split(os.pathsep) if p] + [user_rankings_dir(), _SHIPPED_DIR]
    paths: list[Path] = []
    for root in roots:
        if root.is_dir():
            paths.extend(sorted(root.glob("ranking-*.json")))
        elif root.is_file():
            paths.append(root)
    return paths


@functools.cache
def _load_cached(path: str, mtime_ns: int) -> Ranking:
    return load_ranking(path)


def _rankings_for(device_name: str) -> list[Ranking]:
    found = []
    for path in _ranking_paths():
        ranking = _load_cached(str(path), path.stat().st_mtime_ns)
        if ranking.device == device_name:
            found.append(ranking)
    return found


def list_rankings() -> list[dict]:
    """Every ranking file `select()` reads, in the order it reads them: path, device, date and entry
    count, or the error that makes the file unreadable (`moe doctor`)."""
    found = []
    for path in _ranking_paths():
        try:
            r = _load_cached(str(path), path.stat().st_mtime_ns)
        except ValueError as exc:
            found.append({"path": str(path), "error": str(exc)})
            continue
        found.append({"path": r.source, "device": r.device, "date": r.measured.get("date"),
                      "entries": len(r.entries)})
    return found


def _geomean_order(entries: list[RankingEntry]) -> tuple[tuple[str, float], ...]:
    """Backends measured in every entry, by the geometric mean of their time over the entry's fastest."""
    common = set(entries[0].backends).intersection(*(e.backends for e in entries[1:]))
    scores = {}
    for b in common:
        ratios = [dict(e.us)[b] / e.us[0][1] for e in entries]
        scores[b] = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return tuple(sorted(scores.items(), key=lambda bt: bt[1]))


def _match(ranking: Ranking, config: MoEConfig, quant: MoEQuantConfig, num_tokens: int | None
           ) -> RankingMatch | None:
    shape, bucket = shape_key(config), token_bucket(num_tokens) if num_tokens is not None else None
    levels = (("scheme and shape", lambda e: e.scheme == quant.name and e.shape == shape),
              (f"scheme {quant.name}", lambda e: e.scheme == quant.name),
              (f"family {quant.family.value}", lambda e: e.family == quant.family.value))
    for label, pick in levels:
        entries = [e for e in ranking.entries if pick(e) and (bucket is None or e.tokens == bucket)]
        if not entries:
            continue
        at = f"at {bucket} tokens" if bucket is not None else "over every measured token count"
        if len(entries) == 1:
            return RankingMatch(entries[0].us, f"{label} {at}", ranking)
        us = _geomean_order(entries)
        if us:
            return RankingMatch(us, f"{label} {at}, geometric mean over {len(entries)} "
                                "entries", ranking, relative=True)
    return None


def find_ranking(device_name: str, config: MoEConfig, quant: MoEQuantConfig,
                 num_tokens: int | None = None) -> RankingMatch | None:
    """The measured order for a layer on `device_name`, or None when no ranking covers it.
    `num_tokens`: the token count the layer is mostly called with (its bucket's entries decide);
    None ranks by every measured token count together."""
    if not device_name:
        return None
    for ranking in _rankings_for(device_name):
        match = _match(ranking, config, quant, num_tokens)
        if match is not None:
            return match
    return None


def ranking_from_rows(rows: Iterable[dict], device_name: str, measured: dict, protocol: str) -> dict:
    """A ranking file's JSON from benchmark rows (dicts with preset, scheme name, family, shape,
    tokens, backend and time_ms): one entry per (scheme, shape, token bucket), every backend timed there."""
    cells: dict[tuple[str, str, str, int], dict[str, float]] = {}
    for r in rows:
        key = (r["quant"], r["family"], r["shape"], token_bucket(int(r["tokens"])))
        us = float(r["time_ms"]) * 1e3
        backends = cells.setdefault(key, {})
        backends[r["backend"]] = min(us, backends.get(r["backend"], math.inf))
    entries = [{"scheme": s, "family": f, "shape": sh, "tokens": t,
                "us": dict(sorted(((b, round(us, 2)) for b, us in times.items()), key=lambda bt: bt[1]))}
               for (s, f, sh, t), times in sorted(cells.items())]
    return {"device": device_name, "measured": measured, "protocol": protocol, "entries": entries}
