"""CP-SAT's worker count and repeated options (placer.optimize.cpsat.PORTFOLIO_WORKERS).

With `threads` unset CP-SAT must run at least its 8-worker portfolio: at one worker per core
a 2-core machine gets a single full-problem subsolver, which on four-site-metro-longhaul's
first configuration dived for the whole 60 s without closing a 2e-4 gap (benchmarks/README.md,
branch `portfolio`). An explicit thread count is honoured exactly. Repeated CP-SAT parameters
(`subsolvers`, ...) pass through solver.options as lists.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ortools.sat.python import cp_model

from placer.io import load_instance, problem_with
from placer.optimize import cpsat
from placer.optimize.driver import solve

pytestmark = pytest.mark.filterwarnings("ignore:Constructing LpVariable:DeprecationWarning")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The parameters of every CP-SAT solve placer runs."""
    out: list[dict] = []
    real = cp_model.CpSolver.Solve

    def record(self, model, *args, **kwargs):
        p = self.parameters
        out.append({"num_workers": p.num_workers, "subsolvers": list(p.subsolvers)})
        return real(self, model, *args, **kwargs)

    monkeypatch.setattr(cp_model.CpSolver, "Solve", record)
    return out


def _two_campus(options: dict | None = None):
    prob = load_instance(ROOT / "instances" / "two-campus-100km.yaml")
    if options is not None:
        prob = problem_with(prob, solver={**prob.instance.solver.model_dump(), "options": options})
    return prob


def test_unset_threads_run_the_portfolio(seen: list[dict]) -> None:
    res = solve(_two_campus(), backend="cpsat", time_limit_s=60)
    assert res.status == "optimal"
    want = max(cpsat.PORTFOLIO_WORKERS, os.cpu_count() or 1)
    assert seen and all(s["num_workers"] == want for s in seen)
    assert want >= 8


@pytest.mark.parametrize("threads", [1, 3])
def test_explicit_threads_are_honoured(seen: list[dict], threads: int) -> None:
    solve(_two_campus(), backend="cpsat", time_limit_s=60, threads=threads)
    assert seen and all(s["num_workers"] == threads for s in seen)


def test_repeated_parameters_pass_through_as_lists(seen: list[dict]) -> None:
    """`subsolvers` is a repeated field: a list reaches CP-SAT whole (setattr would raise)."""
    res = solve(
        _two_campus({"subsolvers": ["default_lp", "no_lp"]}), backend="cpsat", time_limit_s=60
    )
    assert res.status == "optimal"
    assert seen and all(s["subsolvers"] == ["default_lp", "no_lp"] for s in seen)
