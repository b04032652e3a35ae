"""What a `moe bench` run shows: the results table and the plot of time and floor against tokens."""

from __future__ import annotations

from pathlib import Path

from moe_core.bench.results import Row

_HEADER = (f"{'preset':<16} {'scheme':<8} {'M':>5} {'backend':<16} {'ms':>9} {'min ms':>9} {'spread':>6} "
           f"{'tok/s':>9} {'floor ms':>9} {'bound':<7} {'floor/t':>7} {'naive ms':>9} {'speedup':>7} {'diff':>8}")


def _format_row(r: Row) -> str:
    return (f"{r.preset:<16} {r.scheme:<8} {r.tokens:>5} {r.backend:<16} {r.time_ms:>9.3f} {r.min_ms:>9.3f} "
            f"{r.spread:>6.0%} {r.tokens_per_s:>9.1f} {r.floor_ms:>9.3f} {r.floor_bound:<7} {r.floor_fraction:>7.2f} "
            f"{r.naive_ms:>9.3f} {r.speedup_vs_naive:>7.2f} "
            f"{'' if r.rel_diff is None else f'{r.rel_diff:.1e}':>8}")


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
