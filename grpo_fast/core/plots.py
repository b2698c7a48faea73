"""PNG plots of a run's metrics history (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

PANELS = (
    ("reward/mean", "reward (train, mean)"),
    ("eval/accuracy", "held-out accuracy (greedy)"),
    ("completion/length_mean", "completion length (mean)"),
    ("entropy", "entropy"),
)
TOOL_PANELS = (("tools/rollouts_calling_frac", "rollouts calling a tool"),)
"""Added for runs with tools (multi-turn rollouts)."""


def save_plots(history: list[dict], output_dir: str | Path, panels: tuple[tuple[str, str], ...] = PANELS) -> list[Path]:
    """One PNG per (metric key, title) panel plus `training_curves.png` with all of them, two per row;
    returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    rows = (len(panels) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(10, 3.5 * rows), squeeze=False)
    for ax_all in axes.flat[len(panels) :]:
        ax_all.set_visible(False)
    for ax_all, (key, title) in zip(axes.flat, panels, strict=False):
        pts = [(r["step"], r[key]) for r in history if r.get(key) is not None]
        for ax in (ax_all, None):
            single = None
            if ax is None:
                single, ax = plt.subplots(figsize=(5, 3.5))
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o" if len(pts) < 30 else None)
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            if single is not None:
                path = out / f"{key.replace('/', '_')}.png"
                single.tight_layout()
                single.savefig(path, dpi=100)
                plt.close(single)
                written.append(path)
    fig.tight_layout()
    path = out / "training_curves.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written
