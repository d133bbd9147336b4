"""Trade-off objectives built from exact solves: the fastest step first, then the cheapest
plan within a fraction of it (epsilon-constraint, Haimes et al. 1971).

    solve_within_fastest(problem, ...) -> SolveResult      # objective.within_fastest
    frontier(problem, ...) -> list[FrontierPoint]          # placer frontier

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

from placer.errors import InfeasibleError
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


def _objective(problem: Problem, **fields: Any) -> Problem:
    obj = problem.instance.objective.model_dump()
    obj.update(within_fastest=None, **fields)
    return problem_with(problem, objective=obj)


def solve_within_fastest(problem: Problem, backend: str | None, time_limit_s: float, threads: int | None, progress: Any) -> Any:
    """minimize cost subject to step <= (1 + within_fastest) x the fastest step."""
    from placer.optimize.driver import solve

    obj = problem.instance.objective
    t0 = time.perf_counter()
    say = progress or (lambda _m: None)
    fastest = solve(_objective(problem, minimize="step_time"), backend, time_limit_s / 2, threads, progress, _nested=True)
    limit = fastest.evaluation.step_time_s * (1 + obj.within_fastest) * (1 + LIMIT_SLACK)
    if obj.max_step_time_s is not None:
        limit = min(limit, obj.max_step_time_s)
    say(f"fastest step {fastest.evaluation.step_time_s:.6g} s ({fastest.status}); cheapest plan within {limit:.6g} s")
    left = max(time_limit_s - (time.perf_counter() - t0), 0.05 * time_limit_s)
    cheapest = solve(_objective(problem, minimize="cost", max_step_time_s=limit), backend, left, threads, progress)
    status = "optimal" if fastest.status == "optimal" and cheapest.status == "optimal" else ("time_limit" if "time_limit" in {fastest.status, cheapest.status} else "feasible")
    solver = dict(cheapest.plan.solver.model_dump() if cheapest.plan.solver else {})
    solver.update(
        status=status,
        seconds=round(time.perf_counter() - t0, 3),
        lexicographic={"fastest_step_s": fastest.evaluation.step_time_s, "fastest_status": fastest.status, "step_limit_s": limit, "within_fastest": obj.within_fastest},
    )
    plan = cheapest.plan.model_copy(update={"status": status, "solver": SolverInfo.model_validate(solver)})
    return type(cheapest)(plan, cheapest.evaluation, status, cheapest.objective, cheapest.bound, cheapest.gap, solver["seconds"], cheapest.backend, cheapest.configs_total, cheapest.configs_solved)


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
        return {"capex_usd": self.capex_usd, "step_time_s": self.step_time_s, "waves": waves, "tp": par.tp, "pp": par.pp, "dp": par.dp, "status": self.status, "knee": self.knee}


def frontier(problem: Problem, backend: str | None = None, time_limit_s: float | None = None, threads: int | None = None, max_points: int = 50, progress: Any = None) -> list[FrontierPoint]:
    """The exact capex vs step-time Pareto front, most expensive (fastest) point first.

    Each point: T_i = the fastest step with capex <= budget_i, then C_i = the least capex
    reaching T_i; the next budget is just below C_i. Every Pareto-optimal (capex, step) pair
    is found, since any plan cheaper than C_i is slower than T_i by construction."""
    from placer.optimize.driver import solve

    obj = problem.instance.objective
    limit = time_limit_s if time_limit_s is not None else problem.instance.solver.time_limit_s
    say = progress or (lambda _m: None)
    budget = obj.max_cost_usd
    points: list[FrontierPoint] = []
    while len(points) < max_points:
        try:
            fast = solve(_objective(problem, minimize="step_time", max_cost_usd=budget), backend, limit, threads, None, _nested=True)
        except InfeasibleError:
            break
        t = fast.evaluation.step_time_s
        cheap = solve(_objective(problem, minimize="cost", max_cost_usd=budget, max_step_time_s=t * (1 + LIMIT_SLACK)), backend, limit, threads, None, _nested=True)
        capex = cheap.evaluation.capex_usd
        status = "optimal" if fast.status == cheap.status == "optimal" else "feasible"
        if points and capex >= points[-1].capex_usd:
            break  # no strictly cheaper plan was found (solver tolerance): the front ends here
        points.append(FrontierPoint(capex, cheap.evaluation.step_time_s, status, cheap.plan))
        say(f"point {len(points)}: capex ${capex:,.0f}, step {cheap.evaluation.step_time_s:.6g} s ({status})")
        if capex <= 0:
            break
        budget = capex - max(BUDGET_STEP_USD, BUDGET_STEP_REL * capex)
    return mark_knee(points)


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
    return [FrontierPoint(p.capex_usd, p.step_time_s, p.status, p.plan, knee=(i == k)) for i, p in enumerate(points)]


__all__ = ["FrontierPoint", "frontier", "mark_knee", "solve_within_fastest"]
