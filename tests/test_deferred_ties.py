"""Ties broken late (issue 12 item 4): the search breaks a configuration's ties only for
the plan that ends up final (driver._backend with `deferred`, then driver._break_ties),
and the contention rounds only once a round's plan is priced exactly. Both must give the
plan the tie-break solve gave before: the same decisions as breaking ties at once. (MILP
only: CP-SAT's tie-breaks are cheap and its rounds keep the tie-broken points.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from placer.io import load_instance
from placer.optimize import driver
from placer.optimize.data import InnerSolution, build_inner
from placer.optimize.presolve import presolve, site_caps, tighten
from placer.optimize.space import SpaceReport, chain_types, enumerate_configs
from placer.perf.step import PerfModel

pytestmark = pytest.mark.filterwarnings("ignore:Constructing LpVariable:DeprecationWarning")

ROOT = Path(__file__).resolve().parent.parent


def _best_config_data(name: str):
    problem = load_instance(ROOT / "instances" / f"{name}.yaml")
    perf = PerfModel(problem)
    report = SpaceReport()
    caps = site_caps(problem, perf.net)
    configs = presolve(problem, enumerate_configs(problem, report, perf), caps, report)
    cands = driver.prepare_candidates(problem, perf, configs, report, "step_time", caps=caps)
    cfg = next(c.cfg for c in cands if not c.rest)
    data = build_inner(problem, perf, cfg, chain_types(problem, perf, cfg))
    tighten(data, caps)
    return problem, perf, data


def test_deferred_tie_break_gives_the_same_plan() -> None:
    backend = "milp"
    problem, perf, data = _best_config_data("two-campus-100km")
    opts = problem.instance.solver
    at_once = driver._backend(problem, perf, data, backend, "step_time", None, 60, 1, opts)
    deferred: list = []
    first = driver._backend(
        problem, perf, data, backend, "step_time", None, 60, 1, opts, deferred=deferred
    )
    assert isinstance(at_once, InnerSolution) and isinstance(first, InnerSolution)
    assert at_once.optimal and first.optimal
    assert first.objective == pytest.approx(at_once.objective, rel=1e-6)
    assert len(deferred) == 1  # the model whose ties are still open
    broken = driver._break_ties(
        problem, perf, (data, first, deferred[0]), "step_time", time.perf_counter() + 60, backend
    )
    plan = broken[1] if broken is not None else driver.solution_plan(problem, data, first)
    again = driver.solution_plan(problem, data, at_once)
    assert plan.replica_groups == again.replica_groups
    assert plan.links == again.links


def test_cpsat_breaks_ties_at_once() -> None:
    problem, perf, data = _best_config_data("two-campus-100km")
    deferred: list = []
    sol = driver._backend(
        problem,
        perf,
        data,
        "cpsat",
        "step_time",
        None,
        60,
        1,
        problem.instance.solver,
        deferred=deferred,
    )
    assert isinstance(sol, InnerSolution) and sol.optimal and deferred == []
