"""The exact healthy step (milp/cpsat _exact_step): under resilience.max_slowdown the survival
limit is (1 + max_slowdown) x the healthy step, so the step variable must equal the plan's
step, not just bound it (an overstated step lets a plan through the limit). Every variable
the step reads through a max is pinned to that max by a one-hot (MILP) or AddMaxEquality
(CP-SAT). A family whose pin is missing leaves its variable free upward: here a library
case's brute-force plan is pinned (replicas per chain type, waves, nodes) and the step is
*maximized*; it must still be the evaluator's step of the plan the solver returns (routing
included, which stays free). A missing pin fails this where the agreement tests, which
minimize, cannot see it."""

from __future__ import annotations

import copy
from typing import Any

import pulp
import pytest
import solver_cases as sc
from ortools.sat.python import cp_model
from test_pinned_plan import pin_cpsat, pin_milp

from placer.evaluate import evaluate
from placer.io import problem_from_data
from placer.optimize.cpsat import CpsatInner
from placer.optimize.data import InnerSolution, build_inner, solution_plan
from placer.optimize.driver import _upper_bound_time, solve
from placer.optimize.milp import MilpInner
from placer.optimize.space import chain_types
from placer.perf.step import PerfModel
from placer.rules import config_of

pytestmark = pytest.mark.filterwarnings("ignore:Constructing LpVariable:DeprecationWarning")

# max_slowdown loose enough that every plan survives: the exact rows, not the limit, are
# under test
LOOSE = {"survive": ["wave"], "collective": "ring", "max_slowdown": 10.0}


def _triangle(direct_km: float, detour_km: float) -> dict[str, Any]:
    """tests/test_routing.py's triangle: whole replicas at a and b, their stages synced
    over a - b directly or split with the detour via c (a flow-routed pair)."""
    inst = sc.part_filled_instance(direct_km, dp=5, overlap=True, site_gpus=8)
    inst["sites"][1]["gpus"] = 4
    inst["sites"].append({"name": "c", "gpu": "h100-sxm", "gpus": 0, "gpus_per_node": 4})
    inst["routes"] = [
        {"sites": ["a", "b"], "km": direct_km, "capacity_gbps": 100, "max_waves": 0},
        {"sites": ["a", "c"], "km": detour_km, "capacity_gbps": 100, "max_waves": 0},
        {"sites": ["c", "b"], "km": detour_km, "capacity_gbps": 100, "max_waves": 0},
    ]
    inst["solver"] = {"paths_per_pair": 2, "time_limit_s": 60, "max_sites_per_replica": 1}
    return inst


def _three_hosts() -> dict[str, Any]:
    """Three sites of 4 GPUs, routes a - b, b - c and a long a - c of fixed capacity, dp 5
    of tp 1 pp 2 (1-GPU stages), whole replicas per site and paths_per_pair 2: each pair's
    sync may take the detour through the third site (the formulations' B_series rows over
    every pair's paths)."""
    inst = sc.part_filled_instance(60.0, dp=5, overlap=True, site_gpus=4)
    inst["sites"].append({"name": "c", "gpu": "h100-sxm", "gpus": 4, "gpus_per_node": 4})
    inst["routes"] = [
        {"sites": list(p), "km": km, "capacity_gbps": 100, "max_waves": 0}
        for p, km in ((("a", "b"), 60.0), (("b", "c"), 80.0), (("a", "c"), 400.0))
    ]
    inst["solver"] = {"paths_per_pair": 2, "time_limit_s": 60, "max_sites_per_replica": 1}
    return inst


CASES = {
    "triangle-short-detour": _triangle(50.0, 30.0),
    "triangle-long-detour": _triangle(20.0, 200.0),
    "three-hosts": _three_hosts(),
    "part-filled-20km": sc.part_filled_instance(20.0, overlap=True),
}


def _setup(name: str):
    inst = copy.deepcopy(CASES[name])
    # the plan: brute force's optimum without resilience (it has no routed resilience)
    res = solve(problem_from_data(inst), backend="brute")
    inst["resilience"] = dict(LOOSE)
    problem = problem_from_data(inst)
    perf = PerfModel(problem)
    cfg = config_of(problem, res.plan)
    chains = chain_types(problem, perf, cfg)
    data = build_inner(problem, perf, cfg, chains)
    counts = {chains.index(tuple(g.stage_sites)): g.count for g in res.plan.replica_groups}
    waves = {link.key: link.waves for link in res.plan.links}
    nodes = {
        s: n // data.site_node_block.get(s, 1) for s, n in res.evaluation.nodes_by_site.items()
    }
    return problem, perf, data, counts, waves, nodes, res


def _evaluated(problem, perf, data, counts, waves, routing) -> float:
    plan = solution_plan(
        problem, data, InnerSolution(counts, waves, 0.0, 0.0, False, routing=routing)
    )
    ev = evaluate(problem, plan, perf)
    return ev.step_time_s


@pytest.mark.parametrize("name", sorted(CASES))
def test_milp_step_cannot_be_raised_above_the_plans(name: str) -> None:
    problem, perf, data, counts, waves, nodes, res = _setup(name)
    m = MilpInner(data, "step_time", _upper_bound_time(data) * 1.001 + 1e-6)
    assert m.d.resilience is not None
    pin_milp(m, counts, waves, lambda s: nodes.get(s, 0))
    m.prob.sense = pulp.LpMaximize
    m.prob.setObjective(m.T)
    out = m._solve_once(60, 1, {})
    assert out.kind == "optimal", out
    got = pulp.value(m.T) * m.ts
    want = _evaluated(problem, perf, data, counts, waves, m.routing())
    assert got == pytest.approx(want, rel=1e-6), (got, want, res.evaluation.step_time_s)


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpsat_step_cannot_be_raised_above_the_plans(name: str) -> None:
    problem, perf, data, counts, waves, nodes, res = _setup(name)
    m = CpsatInner(data, "step_time", _upper_bound_time(data) * 1.001 + 1e-6)
    M = m.m
    pin_cpsat(m, counts, waves, lambda s: nodes.get(s, 0))
    M.Maximize(m.T)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 60
    assert solver.Solve(M) == cp_model.OPTIMAL
    got = solver.Value(m.T) * m.tau
    want = _evaluated(problem, perf, data, counts, waves, m.routing(solver))
    # CP-SAT counts time in ticks, each term rounded up to one (test_pinned_plan: 1e-5)
    assert got == pytest.approx(want, rel=1e-5, abs=4 * m.tau), (got, want)
