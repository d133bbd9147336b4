"""Repeatable routing (issue 15 item 8): the split of a pair's traffic over its candidate
paths, recomputed from the plan's decisions alone, so that repeat solves (and any number of
CP-SAT workers) write byte-identical plans.

The tie-break (families.TieBreak) orders plans by waves, sites, listed paths and chain
types, but not by how the flows share the listed paths: any split with the same decisions
ties, and CP-SAT's parallel search returns whichever its fastest worker found (its parallel
search is not deterministic, and with a time limit no run is: or-tools issues #2159,
#4195, #4783; `interleave_search` makes one worker count repeatable at a large cost, not
different counts). So once the driver has its final plan, the flows are solved again as a
linear program: the MILP formulation of the same configuration with every integer decision
fixed to the plan's (replicas per chain type, chain types in use, the wave option of every
route, the path prefixes each pair may use) and the step time minimized, on one HiGHS
thread. Its input depends only on the decisions, so its answer does too; both backends get
the same routing for the same decisions. The result replaces the plan's routing only when
the evaluator accepts it and its tie-break key is no worse (for step time: the step is no
slower).
"""

from __future__ import annotations

import math
import time
from typing import Any

from placer.optimize.data import PHASE_NAMES, InnerData, InnerSolution, solution_plan
from placer.schema import Plan

PHASE_KEYS = {name: key for key, name in PHASE_NAMES.items()}  # "pipeline" -> "pp"


def routed_pairs(data: InnerData) -> bool:
    return any(len(paths) >= 2 for paths in data.pair_paths.values())


def canonical_routing_plan(
    problem: Any, data: InnerData, plan: Plan, time_limit_s: float, t_max_s: float
) -> Plan | None:
    """The plan with its routing solved again from its decisions, or None (nothing to
    route, the plan's chains are not this configuration's, or the LP did not solve)."""
    from placer.optimize.milp import MilpInner  # the formulation, not its search
    from placer.optimize.warmstart import hint_from_plan

    if not routed_pairs(data) or time_limit_s <= 0.05:
        return None
    hint = hint_from_plan(
        data,
        {tuple(g.stage_sites): g.count for g in plan.replica_groups},
        {link.key: link.waves for link in plan.links},
    )
    if hint is None:
        return None
    levels = {(PHASE_KEYS[e.phase], tuple(sorted(e.sites))): len(e.paths) for e in plan.routing}
    t0 = time.perf_counter()
    t_max = t_max_s if math.isfinite(t_max_s) else 1e9  # the driver's _upper_bound_time
    model = MilpInner(data, "step_time", t_max * 1.001 + 1e-6)
    _fix(model, data, hint, levels)
    left = time_limit_s - (time.perf_counter() - t0)
    if left <= 0.05:
        return None
    sol = model.solve(left, 1, {})
    if not isinstance(sol, InnerSolution):
        return None
    return solution_plan(
        problem, data, InnerSolution(hint.counts, hint.waves, 0.0, 0.0, False, routing=sol.routing)
    )


def _fix(model: Any, data: InnerData, hint: InnerSolution, levels: dict[Any, int]) -> None:
    """Every integer decision of the MILP at the plan's value (bounds lo = up)."""

    def pin(var: Any, value: float) -> None:
        var.lowBound = value
        var.upBound = value

    for c, var in model.n.items():
        pin(var, hint.counts.get(c, 0))
    for c, var in model.u.items():
        pin(var, 1 if hint.counts.get(c, 0) > 0 else 0)
    for (r, i), var in model.y.items():
        pin(var, 1 if data.wave_options[r][i].waves == hint.waves.get(r, 0) else 0)
    for (phase, q, j), var in model.w.items():
        pin(var, 1 if j < levels.get((phase, tuple(sorted(q))), 1) else 0)
