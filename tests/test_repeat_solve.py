"""Repeat solves give byte-identical plans (issue 15 item 8), apart from the timings.

Before: `four-metro-resilient` with CP-SAT gave step 2.42755 s in one run and 2.43436 s in
another (same cost, other routing): the tie-break did not pin down how flows share the
listed paths, and CP-SAT's parallel search returns whichever optimum its fastest worker
finds. The routing is now solved again from the plan's decisions alone
(placer.optimize.canonical), so 1, 2 and 8 workers, and repeated runs, write the same plan.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from placer.evaluate import evaluate
from placer.io import load_instance
from placer.optimize.driver import solve

pytestmark = pytest.mark.filterwarnings("ignore:Constructing LpVariable:DeprecationWarning")

ROOT = Path(__file__).resolve().parent.parent


def _bytes(plan) -> str:
    data = plan.model_dump(mode="json", exclude_none=True)
    data["solver"].pop("seconds", None)  # the only timing a plan carries
    return json.dumps(data, sort_keys=True)


# three-sites at 1 worker: 201 s of CP-SAT (one full subsolver, cpsat.PORTFOLIO_WORKERS),
# 40% of CI's budget, and at 2 workers 21-152 s under make test's load (its proof left to
# default_lp alone: 25 s on an idle box, against 5.8 s at 3 workers and 5.5 s at 8), so it
# runs at 3 and 8 workers (two other portfolios), and the run-to-run repeat at 8 is four-
# metro-resilient's (a second three-sites run cost ~14 s of CI); four-metro-resilient
# keeps 1 and 2
@pytest.mark.parametrize(
    ("name", "workers"),
    [("four-metro-resilient", (1, 2, 8, 8)), ("three-sites-80-300-500km", (3, 8))],
)
def test_cpsat_plans_are_byte_identical_with_1_2_and_8_workers(
    name: str, workers: tuple[int, ...]
) -> None:
    problem = load_instance(ROOT / "instances" / f"{name}.yaml")
    # a limit that no run reaches, even on a loaded box: the resilience summary re-solves
    # the instance without the guarantee and under ring within what is left of it, and a
    # variant ended by the limit is a feasible plan, not the canonical one (CI, stop 20)
    runs = [solve(problem, backend="cpsat", time_limit_s=600, threads=w) for w in workers]
    assert all(r.status == "optimal" for r in runs)
    for r in runs:
        res = r.plan.resilience or {}
        assert all(
            res.get(f"{v}_status", "optimal") == "optimal" for v in ("none", "ring", "optcc")
        )
    first = _bytes(runs[0].plan)
    for r in runs[1:]:
        assert _bytes(r.plan) == first
    assert evaluate(problem, runs[0].plan).feasible


def test_routing_is_the_step_minimizing_split_of_the_decisions() -> None:
    """The canonical split is the fastest one for the plan's decisions: no slower than the
    two routings the issue saw at the same cost (2.42755 and 2.43436 s), and the MILP, with
    the same decisions, writes the same routing."""
    problem = load_instance(ROOT / "instances" / "four-metro-resilient.yaml")
    c = solve(problem, backend="cpsat", time_limit_s=60, threads=8)
    m = solve(problem, backend="milp", time_limit_s=60, threads=1)
    assert c.objective == m.objective  # cost, both proven
    assert c.plan.step_time_s <= 2.42755
    same_decisions = c.plan.replica_groups == m.plan.replica_groups and c.plan.links == m.plan.links
    if same_decisions:
        assert c.plan.routing == m.plan.routing
