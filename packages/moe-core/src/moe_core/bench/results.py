"""What a `moe bench` run writes: its rows (`Row`), the results JSON rewritten atomically after every
measured point, the measured ranking its rows make (`moe_core.rankings`), and the machine it ran on."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from moe_core.backends import detect_device
from moe_core.plugins import registry
from moe_core.rankings import load_ranking, ranking_from_rows, user_rankings_dir


@dataclass(frozen=True)
class Row:
    preset: str
    scheme: str  # as given on the command line
    tokens: int
    backend: str  # the backend timed: the oracle's choice, or each of --backends
    experts: str  # its experts class
    quant: str  # MoEQuantConfig.name of the scheme, the key of ranking entries
    family: str  # QuantFamily of the scheme
    shape: str  # moe_core.rankings.shape_key of the layer
    timing: str  # "cuda-graph", "cuda-events (eager: ...)" or "wall-clock"
    time_ms: float  # the mean call: each input set's median, averaged (`mean_call_seconds`)
    min_ms: float
    p90_ms: float
    spread: float  # (p90 - min) / min; above SPREAD_WARNING the timings are unsteady
    tokens_per_s: float
    floor_ms: float
    floor_bound: str  # "memory" or "compute"
    floor_fraction: float  # floor / time; above IMPOSSIBLE_FRACTION the floor or the timing is wrong
    naive_ms: float  # median of the naive per-expert loop
    speedup_vs_naive: float
    bytes_per_expert: int  # the scheme's stored bytes (`expert_weight_bytes`), what the floor reads
    kernel_bytes_per_expert: int  # the experts' packed tensors (a backend may unpack or pad at load)
    distinct_experts: float  # the experts the timed inputs' routing selects (`routed_work`: the sets' mean), what the floor reads
    floor_matmul_dtype: str  # the matmul rate the compute floor uses (`Ceilings.matmul_rate`)
    # The quick ceilings re-measured right after the cell over those at the run's start
    # (`quick_ceilings`): far from 1, the machine's speed moved while the cell was timed.
    copy_recheck: float
    matmul_recheck: float
    # Relative L2 difference of this backend's output from the first backend timed on the same cell
    # and inputs (None for that one): a cross-check of the kernels at the real shape.
    compared_with: str | None = None
    rel_diff: float | None = None


def prepare_out_dir(path: str | os.PathLike) -> Path:
    """Create `path` and check that files can be written in it, before anything is measured."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".moe-write-check-"):
            pass
    except OSError as exc:
        raise ValueError(f"--out {os.fspath(path)!r} is not a writable folder: {exc.strerror or exc}") from None
    return out


def write_json_atomic(path: Path, payload: dict) -> None:
    """Write `payload` to a temporary file next to `path` and rename it over `path`: a reader (or a
    run killed mid-write) sees the previous complete file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # created with the umask's mode, as `path` would be
    try:
        tmp.write_text(json.dumps(payload, indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def triton_version() -> str | None:
    """The installed triton's version ("unknown" without metadata), or None where it is not installed."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _distribution_versions() -> dict[str, str]:
    """Versions of moe-core, the installed plugins' distributions and triton."""
    versions = registry().distribution_versions()
    if (triton := triton_version()) is not None:
        versions["triton"] = triton
    return versions


def _machine(device: torch.device, threads: int) -> dict:
    info = detect_device(device)
    return {"device": str(info), "device_name": info.name, "cpu_model": detect_device("cpu").name,
            "cpu_count": os.cpu_count(), "torch_threads": threads, "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "distributions": _distribution_versions(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def claim_results_path(out: Path, stem: str) -> Path:
    """`out/stem.json`, or `stem-2.json`, `stem-3.json`, ... when taken: created here, exclusively, so
    that runs started in the same second into one folder never share a results file."""
    n = 1
    while True:
        path = out / f"{stem}{'' if n == 1 else f'-{n}'}.json"
        try:
            with open(path, "x"):
                return path
        except FileExistsError:
            n += 1


class _Results:
    """The run's JSON, rewritten (atomically) after every measured point, and with several backends
    timed side by side the ranking its rows make, merged into the folder's ranking file (`save_ranking`)
    each time a scheme's backends have all been timed or refused (`scheme_done`): an interrupted run
    keeps what it measured, and its ranking never holds a cell that only some backends reached (the
    backends are timed one after the other, so such a cell would rank the first ones ahead of the
    rest for want of their times)."""

    def __init__(self, path: Path, payload: dict, ranking_folder: Path | None) -> None:
        self.path, self.ranking_folder = path, ranking_folder
        self.ranking_path: Path | None = None
        self._ranked_rows = 0  # rows of the schemes every backend has finished: the ranking's rows
        self.payload = {**payload, "complete": False, "rows": [], "refused": []}
        self.save()

    def save(self) -> None:
        write_json_atomic(self.path, self.payload)

    def add_row(self, row: Row) -> None:
        self.payload["rows"].append(asdict(row))
        self.save()

    def scheme_done(self) -> None:
        """Every backend of the current scheme has been timed or refused: merge the ranking so far."""
        self._ranked_rows = len(self.payload["rows"])
        if self.ranking_folder is not None and self._ranked_rows:
            self.ranking_path = save_ranking(self.ranking(), self.ranking_folder)

    def ranking(self) -> dict:
        """The ranking of the schemes finished so far (`scheme_done`)."""
        machine = self.payload["machine"]
        return ranking_from_rows(self.payload["rows"][:self._ranked_rows], machine["device_name"],
                                 {"date": machine["date"], "torch": machine["torch"],
                                  "distributions": machine["distributions"]}, self.payload["method"])

    def refuse(self, preset: str, reason: str, scheme: str | None = None, backend: str | None = None) -> None:
        self.payload["refused"].append({"preset": preset, "scheme": scheme, "backend": backend, "reason": reason})
        self.save()

    def finish(self) -> None:
        self.payload["complete"] = True
        self.save()

    @property
    def rows(self) -> list[Row]:
        return [Row(**r) for r in self.payload["rows"]]


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on `folder` (flock on the folder itself: no lock file is left behind), so
    that runs merging into one ranking file at once keep each other's entries."""
    import fcntl  # POSIX only; imported here so that `moe` imports everywhere

    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def save_ranking(ranking: dict, folder: Path | None = None) -> Path:
    """Merge `ranking` into the device's file in `folder` (default: the user's rankings folder), under
    a lock on the folder: entries measured now replace those of the same scheme, shape and token
    bucket; the others stay."""
    folder = folder if folder is not None else user_rankings_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ranking-{_slug(ranking['device'])}.json"
    with _locked(folder):
        merged = {(e["scheme"], e["shape"], e["tokens"]): e for e in ranking["entries"]}
        if path.exists():
            load_ranking(path)  # a broken file is reported, not overwritten
            old = json.loads(path.read_text())
            merged = {**{(e["scheme"], e["shape"], e["tokens"]): e for e in old["entries"]}, **merged}
        write_json_atomic(path, {**ranking, "entries": [merged[k] for k in sorted(merged)]})
    return path


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
