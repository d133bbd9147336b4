"""A proven MILP optimum may leave a share of a pair's traffic, within HiGHS' integrality
tolerance, on a path over a route that gets no wave (placer.optimize.data.drop_stray_shares).
The case is the one the links-vs-cost study met ($1.25M budget): the plan must reach the
evaluator without that share, while a real share on such a path must still be rejected."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from placer.evaluate import evaluate
from placer.io import problem_from_data
from placer.optimize.data import InnerSolution, build_inner, solution_plan
from placer.optimize.space import chain_types, enumerate_configs
from placer.perf.step import PerfModel

INSTANCE = Path(__file__).resolve().parent.parent / "instances" / "three-sites-80-300-500km.yaml"


def _case(dead_share: float) -> tuple[object, object]:
    inst = yaml.safe_load(INSTANCE.read_text())
    inst = copy.deepcopy(inst)
    inst["objective"]["max_cost_usd"] = 1_250_000
    inst["job"]["parallelism"]["pp"] = [4]
    problem = problem_from_data(inst)
    perf = PerfModel(problem)
    cfg = next(
        c for c in enumerate_configs(problem, None, perf) if c.label() == "tp8-pp4-dp128-mb1-diloco"
    )
    data = build_inner(problem, perf, cfg, chain_types(problem, perf, cfg))
    chains = {c: i for i, c in enumerate(data.chains)}
    # HiGHS' answer (1 thread): 67 replicas a-a-a-c, 61 b-b-b-c, no wave on a-b, and the
    # data-parallel pair a-b over the detour a-c-b but for a stray share of the direct route
    sol = InnerSolution(
        counts={chains[("a", "a", "a", "c")]: 67, chains[("b", "b", "b", "c")]: 61},
        waves={("a", "b"): 0, ("a", "c"): 12, ("b", "c"): 11},
        objective=0.0,
        bound=0.0,
        optimal=True,
        routing=[
            {
                "phase": "data_parallel",
                "sites": ["a", "b"],
                "paths": [
                    {"via": ["a", "b"], "share": dead_share},
                    {"via": ["a", "c", "b"], "share": 1.0 - dead_share},
                ],
            }
        ],
    )
    return problem, solution_plan(problem, data, sol)


def test_a_stray_share_on_a_route_without_waves_is_dropped() -> None:
    problem, plan = _case(3.35673865365405e-13)
    ev = evaluate(problem, plan)
    assert ev.feasible, ev.violations
    (entry,) = plan.model_dump()["routing"]
    assert [p["share"] for p in entry["paths"]] == [0.0, 1.0]


@pytest.mark.parametrize("share", [1e-3, 0.3])
def test_a_real_share_on_a_route_without_waves_still_reaches_the_evaluator(share: float) -> None:
    problem, plan = _case(share)
    ev = evaluate(problem, plan)
    assert not ev.feasible
    assert any("a-b" in str(v) and "no capacity" in str(v) for v in ev.violations)
