"""`placer frontier`: the exact capex vs step-time Pareto front of an instance as a table
(frontier.csv) and a plot (frontier.png) with the knee marked.

The points come from placer.optimize.lexicographic.frontier (two exact solves per point).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from placer.io import write_atomic
from placer.optimize.lexicographic import FrontierPoint
from placer.study.plot import FIGSIZE_IN, save_figure

COLUMNS = ["capex_usd", "step_time_s", "waves", "tp", "pp", "dp", "status", "knee"]


def frontier_csv(points: list[FrontierPoint]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for p in points:
        w.writerow(p.row())
    return buf.getvalue()


def frontier_figure(points: list[FrontierPoint], title: str):  # noqa: ANN201 - matplotlib Figure
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE_IN, layout="constrained")
    ax = fig.add_subplot()
    xs = [p.capex_usd / 1e6 for p in points]
    ys = [p.step_time_s for p in points]
    # the best step a budget buys: the point at or below it, so steps go right from each point
    order = sorted(range(len(points)), key=lambda i: xs[i])
    ax.step([xs[i] for i in order], [ys[i] for i in order], where="post", color="0.6", lw=1, zorder=1)
    proven = [p.status == "optimal" for p in points]
    ax.scatter([x for x, ok in zip(xs, proven, strict=True) if ok], [y for y, ok in zip(ys, proven, strict=True) if ok], color="#3b7dd8", zorder=2, label="Pareto point (proven)")
    if not all(proven):
        ax.scatter([x for x, ok in zip(xs, proven, strict=True) if not ok], [y for y, ok in zip(ys, proven, strict=True) if not ok], facecolor="none", edgecolor="#3b7dd8", zorder=2, label="not proven (time limit)")
    for p in points:
        if p.knee:
            ax.scatter([p.capex_usd / 1e6], [p.step_time_s], s=160, facecolor="none", edgecolor="#e4572e", lw=2, zorder=3, label="knee")
            ax.annotate(f"knee: ${p.capex_usd:,.0f}, {p.step_time_s:.4g} s", (p.capex_usd / 1e6, p.step_time_s), xytext=(8, 8), textcoords="offset points", fontsize=8)
    ax.set_xlabel("link capex (million USD)")
    ax.set_ylabel("step time (s)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def write_frontier(points: list[FrontierPoint], outdir: str | Path, title: str) -> list[Path]:
    out = Path(outdir)
    write_atomic(out / "frontier.csv", frontier_csv(points))
    return [out / "frontier.csv", save_figure(frontier_figure(points, title), out / "frontier.png")]


__all__ = ["frontier_csv", "frontier_figure", "write_frontier"]
