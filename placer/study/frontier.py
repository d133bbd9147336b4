"""`placer frontier`: the exact capex vs step-time Pareto front of an instance as a table
(frontier.csv) and a plot (frontier.png) with the knee marked.

Each point is two exact solves (placer.optimize.driver.solve on variants of the instance
whose objective block is replaced, placer.optimize.lexicographic).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from placer.errors import InfeasibleError
from placer.io import Problem, write_atomic
from placer.optimize.driver import solve
from placer.optimize.lexicographic import (
    BUDGET_STEP_REL,
    BUDGET_STEP_USD,
    LIMIT_SLACK,
    FrontierPoint,
    mark_knee,
    objective_variant,
)
from placer.study.plot import FIGSIZE_IN, save_figure


def frontier(
    problem: Problem,
    backend: str | None = None,
    time_limit_s: float | None = None,
    threads: int | None = None,
    max_points: int = 50,
    progress: Any = None,
) -> list[FrontierPoint]:
    """The exact capex vs step-time Pareto front, most expensive (fastest) point first.

    Each point: T_i = the fastest step with capex <= budget_i, then C_i = the least capex
    reaching T_i; the next budget is just below C_i. Every Pareto-optimal (capex, step) pair
    is found, since any plan cheaper than C_i is slower than T_i by construction."""
    obj = problem.instance.objective
    limit = time_limit_s if time_limit_s is not None else problem.instance.solver.time_limit_s
    say = progress or (lambda _m: None)
    budget = obj.max_cost_usd
    points: list[FrontierPoint] = []
    while len(points) < max_points:
        try:
            fast = solve(
                objective_variant(problem, minimize="step_time", max_cost_usd=budget),
                backend,
                limit,
                threads,
                None,
                _nested=True,
            )
        except InfeasibleError:
            break
        t = fast.evaluation.step_time_s
        cheap = solve(
            objective_variant(
                problem, minimize="cost", max_cost_usd=budget, max_step_time_s=t * (1 + LIMIT_SLACK)
            ),
            backend,
            limit,
            threads,
            None,
            _nested=True,
        )
        capex = cheap.evaluation.capex_usd
        status = "optimal" if fast.status == cheap.status == "optimal" else "feasible"
        if points and capex >= points[-1].capex_usd:
            break  # no strictly cheaper plan was found (solver tolerance): the front ends here
        points.append(FrontierPoint(capex, cheap.evaluation.step_time_s, status, cheap.plan))
        say(
            f"point {len(points)}: capex ${capex:,.0f}, step {cheap.evaluation.step_time_s:.6g} s ({status})"  # noqa: E501
        )
        if capex <= 0:
            break
        budget = capex - max(BUDGET_STEP_USD, BUDGET_STEP_REL * capex)
    return mark_knee(points)


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
    ax.step(
        [xs[i] for i in order], [ys[i] for i in order], where="post", color="0.6", lw=1, zorder=1
    )
    proven = [p.status == "optimal" for p in points]
    ax.scatter(
        [x for x, ok in zip(xs, proven, strict=True) if ok],
        [y for y, ok in zip(ys, proven, strict=True) if ok],
        color="#3b7dd8",
        zorder=2,
        label="Pareto point (proven)",
    )
    if not all(proven):
        ax.scatter(
            [x for x, ok in zip(xs, proven, strict=True) if not ok],
            [y for y, ok in zip(ys, proven, strict=True) if not ok],
            facecolor="none",
            edgecolor="#3b7dd8",
            zorder=2,
            label="not proven (time limit)",
        )
    for p in points:
        if p.knee:
            ax.scatter(
                [p.capex_usd / 1e6],
                [p.step_time_s],
                s=160,
                facecolor="none",
                edgecolor="#e4572e",
                lw=2,
                zorder=3,
                label="knee",
            )
            ax.annotate(
                f"knee: ${p.capex_usd:,.0f}, {p.step_time_s:.4g} s",
                (p.capex_usd / 1e6, p.step_time_s),
                xytext=(8, 8),
                textcoords="offset points",
                fontsize=8,
            )
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


__all__ = ["frontier", "frontier_csv", "frontier_figure", "write_frontier"]
