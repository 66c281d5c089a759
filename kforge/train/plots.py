"""PNG curves of a run (reward, correctness, speedup) written into its folder."""

from __future__ import annotations

from pathlib import Path

from kforge.runs.folder import RunFolder

CURVES = {
    "reward.png": ("reward", ["reward/mean", "reward/max"]),
    "correctness.png": ("correctness", ["rate/correct", "rate/compiled", "rate/format_ok", "fast_1"]),
    "speedup.png": ("speedup of correct kernels", ["speedup/mean", "speedup/max"]),
}


def write_plots(run: RunFolder) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    metrics = run.metrics()
    written = []
    for filename, (title, keys) in CURVES.items():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        drawn = False
        for key in keys:
            pts = [(m["step"], m[key]) for m in metrics if isinstance(m.get(key), (int, float)) and "step" in m]
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, label=key)
                drawn = True
        ax.set_title(f"{run.name}: {title}")
        ax.set_xlabel("step")
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
        fig.tight_layout()
        path = run.path / filename
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written
