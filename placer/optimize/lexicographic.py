"""Trade-off objectives built from exact solves: the fastest step first, then the cheapest
plan within a fraction of it (epsilon-constraint, Haimes et al. 1971).

    solve_within_fastest(solve, problem, ...) -> SolveResult   # objective.within_fastest
    placer.study.frontier.frontier(problem, ...)               # placer frontier

Both run the ordinary solve (either backend) on variants of the instance whose objective
block is replaced, so each stage is as exact as a single solve: the result is `optimal`
only when every stage is proven optimal.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from placer.io import Problem, problem_with
from placer.schema import SolverInfo

# A step limit derived from a solved step time is loosened by this relative amount, so that
# the plan that set it stays feasible: CP-SAT counts time in ticks, each term rounded up,
# which can put a plan a few ticks (a few 1e-9 of its upper bound) over its exact time.
# Points and limits are therefore exact to 1 ppm of the step time.
LIMIT_SLACK = 1e-6
# The next frontier point must be strictly cheaper: the budget drops by at least this much.
# Catalog prices are whole dollars; a relative term keeps it above solver tolerances.
BUDGET_STEP_USD = 1.0
BUDGET_STEP_REL = 1e-6

Solve = Callable[..., Any]


def objective_variant(problem: Problem, **fields: Any) -> Problem:
    obj = problem.instance.objective.model_dump()
    obj.update(within_fastest=None, **fields)
    return problem_with(problem, objective=obj)


def solve_within_fastest(
    solve: Solve,
    problem: Problem,
    backend: str | None,
    time_limit_s: float,
    threads: int | None,
    progress: Any,
) -> Any:
    """minimize cost subject to step <= (1 + within_fastest) x the fastest step; `solve` is
    placer.optimize.driver.solve (passed in: this module sits below the driver)."""
    obj = problem.instance.objective
    t0 = time.perf_counter()
    say = progress or (lambda _m: None)
    fastest = solve(
        objective_variant(problem, minimize="step_time"),
        backend,
        time_limit_s / 2,
        threads,
        progress,
        _nested=True,
    )
    limit = fastest.evaluation.step_time_s * (1 + obj.within_fastest) * (1 + LIMIT_SLACK)
    if obj.max_step_time_s is not None:
        limit = min(limit, obj.max_step_time_s)
    say(
        f"fastest step {fastest.evaluation.step_time_s:.6g} s ({fastest.status}); cheapest plan within {limit:.6g} s"  # noqa: E501
    )
    left = max(time_limit_s - (time.perf_counter() - t0), 0.05 * time_limit_s)
    cheapest = solve(
        objective_variant(problem, minimize="cost", max_step_time_s=limit),
        backend,
        left,
        threads,
        progress,
    )
    status = (
        "optimal"
        if fastest.status == "optimal" and cheapest.status == "optimal"
        else ("time_limit" if "time_limit" in {fastest.status, cheapest.status} else "feasible")
    )
    solver = dict(cheapest.plan.solver.model_dump() if cheapest.plan.solver else {})
    solver.update(
        status=status,
        seconds=round(time.perf_counter() - t0, 3),
        lexicographic={
            "fastest_step_s": fastest.evaluation.step_time_s,
            "fastest_status": fastest.status,
            "step_limit_s": limit,
            "within_fastest": obj.within_fastest,
        },
    )
    plan = cheapest.plan.model_copy(
        update={"status": status, "solver": SolverInfo.model_validate(solver)}
    )
    return type(cheapest)(
        plan,
        cheapest.evaluation,
        status,
        cheapest.objective,
        cheapest.bound,
        cheapest.gap,
        solver["seconds"],
        cheapest.backend,
        cheapest.configs_total,
        cheapest.configs_solved,
    )


@dataclass(frozen=True)
class FrontierPoint:
    capex_usd: float
    step_time_s: float
    status: str  # optimal when both of the point's solves are proven
    plan: Any
    knee: bool = False

    def row(self) -> dict[str, Any]:
        par = self.plan.parallelism
        waves = sum(link.waves for link in self.plan.links)
        return {
            "capex_usd": self.capex_usd,
            "step_time_s": self.step_time_s,
            "waves": waves,
            "tp": par.tp,
            "pp": par.pp,
            "dp": par.dp,
            "status": self.status,
            "knee": self.knee,
        }


def mark_knee(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """The knee: the point farthest from the straight line between the two ends of the
    front, both axes scaled to [0, 1] (the "kneedle" rule, Satopaa et al. 2011)."""
    if len(points) < 3:
        return points
    cs = [p.capex_usd for p in points]
    ts = [p.step_time_s for p in points]
    c_span, t_span = (max(cs) - min(cs)) or 1.0, (max(ts) - min(ts)) or 1.0
    xy = [((c - min(cs)) / c_span, (t - min(ts)) / t_span) for c, t in zip(cs, ts, strict=True)]
    (x0, y0), (x1, y1) = xy[0], xy[-1]
    norm = math.hypot(x1 - x0, y1 - y0) or 1.0
    dist = [abs((y1 - y0) * x - (x1 - x0) * y + x1 * y0 - y1 * x0) / norm for x, y in xy]
    k = max(range(len(points)), key=lambda i: (dist[i], -i))
    return [
        FrontierPoint(p.capex_usd, p.step_time_s, p.status, p.plan, knee=(i == k))
        for i, p in enumerate(points)
    ]


__all__ = [
    "BUDGET_STEP_REL",
    "BUDGET_STEP_USD",
    "LIMIT_SLACK",
    "FrontierPoint",
    "mark_knee",
    "objective_variant",
    "solve_within_fastest",
]
