"""CP-SAT's tie-break solve always ends with a plan: its model holds the first solve's plan.

OR-Tools 9.15.6755's presolve reports the tie-break model of four equal spokes around a hub
(lockstep replicas) INFEASIBLE ("exactly_one: empty or all false"), although the first
solve's plan satisfies it and the same model solves without presolve. placer then wrote
the first solve's plan, not the canonical one (fewest waves, then sites, paths, chain
order), so the written plan depended on the search. `CpsatInner._tie_without_presolve`
solves again without presolve. The fault is reproduced by a benchmark; this test injects it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortools.sat.python import cp_model

from placer.io import load_instance
from placer.optimize import cpsat
from placer.optimize.driver import solve

ROOT = Path(__file__).resolve().parent.parent


def test_a_tiebreak_reported_infeasible_is_solved_again_without_presolve(monkeypatch) -> None:
    """The fault itself (four equal spokes in lockstep, 19-35 s of CI) is exercised by
    `benchmarks/symmetry_bench.py --only hub-4-equal-lockstep` (benchmarks/README.md, "CP-SAT
    tie-break: a presolve fault"). Here every tie-break solve with presolve on reports
    INFEASIBLE, as 9.15's presolve did: the fallback must solve it again without presolve
    and write the plan the unfaulted solve writes, never the first solve's plan."""
    problem = load_instance(ROOT / "instances" / "two-campus-100km.yaml")
    clean = solve(problem, backend="cpsat", time_limit_s=60, threads=2)

    in_tiebreak = [False]
    calls: list[tuple[str | None, Any, Any]] = []
    real_break, real_solve = cpsat.CpsatInner.break_ties, cp_model.CpSolver.Solve

    def spy(self, time_limit_s: float):
        in_tiebreak[0] = True
        try:
            tied = real_break(self, time_limit_s)
        finally:
            in_tiebreak[0] = False
        calls.append((self.tie_status, self._tie[1], tied))
        return tied

    def faulty(self, model, *a, **k):
        if in_tiebreak[0] and self.parameters.cp_model_presolve:
            return cp_model.INFEASIBLE
        return real_solve(self, model, *a, **k)

    monkeypatch.setattr(cpsat.CpsatInner, "break_ties", spy)
    monkeypatch.setattr(cp_model.CpSolver, "Solve", faulty)
    res = solve(problem, backend="cpsat", time_limit_s=60, threads=2)
    assert calls
    for status, first, tied in calls:
        assert status == "INFEASIBLE, then OPTIMAL without presolve"
        assert tied is not first and tied.objective == first.objective
    assert res.status == clean.status == "optimal"
    assert res.objective == clean.objective
    assert res.plan.replica_groups == clean.plan.replica_groups
    assert res.plan.links == clean.plan.links
