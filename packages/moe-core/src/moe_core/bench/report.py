"""What a `moe bench` run shows: the results table, printed once the run's progress has ended, and
the plot of time and floor against tokens."""

from __future__ import annotations

from pathlib import Path

from moe_core.bench.results import Row
from moe_core.bench.roofline import IMPOSSIBLE_FRACTION, RECHECK_TOLERANCE, Ceilings


def _flagged(r: Row) -> bool:
    return r.floor_fraction > IMPOSSIBLE_FRACTION


def moved(r: Row) -> bool:
    """Whether the machine's speed moved while the cell was timed (`quick_ceilings`)."""
    return max(abs(r.copy_recheck - 1), abs(r.matmul_recheck - 1)) > RECHECK_TOLERANCE


def format_table(rows: list[Row]) -> list[str]:
    """The header and one line per row; the `diff` column only where a cell ran on several backends."""
    diff = any(r.rel_diff is not None for r in rows)
    wp, ws, wb = (max(len(h), *(len(getattr(r, f)) for r in rows)) for h, f in
                  (("preset", "preset"), ("scheme", "scheme"), ("backend", "backend")))
    lines = [f"{'preset':<{wp}} {'scheme':<{ws}} {'M':>5} {'backend':<{wb}} {'ms':>9} {'min ms':>9} {'spread':>6} "
             f"{'tok/s':>9} {'floor ms':>9} {'bound':<7} {'experts':>7} {'floor/t':>7} {'naive ms':>9} "
             f"{'speedup':>7}" + (f" {'diff':>8}" if diff else "")]
    for r in rows:
        fraction = f"{r.floor_fraction:.2f}" + ("!" if _flagged(r) else "")
        lines.append(
            f"{r.preset:<{wp}} {r.scheme:<{ws}} {r.tokens:>5} {r.backend:<{wb}} {r.time_ms:>9.3f} {r.min_ms:>9.3f} "
            f"{r.spread:>6.0%} {r.tokens_per_s:>9.1f} {r.floor_ms:>9.3f} {r.floor_bound:<7} {r.distinct_experts:>7.2f} "
            f"{fraction:>7} {r.naive_ms:>9.3f} {r.speedup_vs_naive:>7.2f}"
            + (f" {'' if r.rel_diff is None else f'{r.rel_diff:.1e}':>8}" if diff else ""))
    return lines


def format_report(title: str, ceilings: Ceilings, rows: list[Row], refused: list[dict]) -> str:
    """The run's results as printed on stdout: the machine, the ceilings, the table, what its marks
    mean where they appear, and what was refused."""
    rates = ", ".join(f"{name} {rate / 1e9:.1f}" for name, rate in ceilings.matmul_flop_per_s.items())
    read = f", read {ceilings.read_bytes_per_s / 1e9:.1f} GB/s" if ceilings.read_bytes_per_s else ""
    lines = [title, f"ceilings: copy {ceilings.copy_bytes_per_s / 1e9:.1f} GB/s (read+write){read}, matmul {rates} "
                    "GFLOP/s", ""]
    if rows:
        lines += format_table(rows)
        lines.append("")
        lines.append("experts: distinct experts the timed inputs' routing selects (what the memory floor reads); "
                     "floor/t: roofline floor over the median time")
        if any(r.rel_diff is not None for r in rows):
            lines.append("diff: relative L2 difference of the output from that of the cell's first backend, on the "
                         "same inputs")
        flagged = [r for r in rows if _flagged(r)]
        if flagged:
            lines.append(f"warning: {len(flagged)} cells marked ! report more than {IMPOSSIBLE_FRACTION} of their floor, "
                         "which is impossible (no layer runs faster than its floor): the floor or the timing is wrong")
        unsteady = [r for r in rows if moved(r)]
        if unsteady:
            lines.append(f"warning: the quick copy and matmul re-measured after {len(unsteady)} cells ran more than "
                         f"{RECHECK_TOLERANCE:.0%} away from their speed at the run's start, when the ceilings were "
                         "measured (other processes' load, then or during those cells): their times and floor "
                         "fractions are suspect: " + ", ".join(f"{r.preset} {r.scheme} {r.backend} M={r.tokens} (copy "
                                                 f"{r.copy_recheck:.2f}x, matmul {r.matmul_recheck:.2f}x)"
                                                 for r in unsteady))
    lines += [f"{r['preset']}: {r['scheme'] + ': ' if r['scheme'] else ''}{r['reason']}" for r in refused]
    return "\n".join(lines)


def _figure(rows: list[Row], title: str):
    """The plot of `rows`: one panel per preset, time and floor per scheme against tokens, under `title`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = list(dict.fromkeys(r.preset for r in rows))
    fig, axes = plt.subplots(1, len(presets), figsize=(6 * len(presets), 4.5), squeeze=False)
    for ax, name in zip(axes[0], presets):
        mine = [r for r in rows if r.preset == name]
        series = list(dict.fromkeys((r.scheme, r.backend) for r in mine))
        several = len({b for _, b in series}) > 1
        for i, (scheme, backend) in enumerate(series):
            pts = [r for r in mine if (r.scheme, r.backend) == (scheme, backend)]
            color, label = f"C{i % 10}", f"{scheme} {backend}" if several else scheme
            ax.plot([r.tokens for r in pts], [r.time_ms for r in pts], "o-", color=color, label=f"{label} layer")
            if pts[0].backend == next(b for s, b in series if s == scheme):  # one floor per scheme
                ax.plot([r.tokens for r in pts], [r.floor_ms for r in pts], "--", color=color,
                        label=f"{scheme} floor")
        base = [r for r in mine if (r.scheme, r.backend) == series[0]]
        ax.plot([r.tokens for r in base], [r.naive_ms for r in base], ":", color="gray", label="naive loop (dtype)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per forward")
        ax.set_ylabel("ms per layer (median)")
        ax.set_title(name)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    # A one-preset figure is narrower than a long device name: the title wraps to the figure's width
    # and the panels are laid out below it.
    fig.suptitle(title, fontsize=9, wrap=True)
    fig.tight_layout()
    return fig


def _plot(rows: list[Row], path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    fig = _figure(rows, title)
    fig.savefig(path, dpi=120)
    plt.close(fig)
