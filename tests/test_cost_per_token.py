"""cost_per_token charges GPU-hours where a site prices them (sites[].gpu_usd_per_hour):
the evaluator by hand arithmetic, and brute force vs CP-SAT vs MILP on library cases."""

from __future__ import annotations

import copy
import json
import random
import sys
from pathlib import Path

import pytest

from placer.errors import InfeasibleError
from placer.evaluate import evaluate
from placer.io import load_instance, problem_with
from placer.optimize.driver import solve

sys.path.insert(0, str(Path(__file__).resolve().parent))
import solver_cases as sc  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def test_gpu_hours_add_to_the_running_cost_by_hand() -> None:
    prob = load_instance(REPO / "instances" / "two-campus-100km.yaml")
    plan = json.loads((REPO / "instances" / "plans" / "two-campus-100km.json").read_text())
    base = evaluate(prob, plan)
    sites = [
        s.model_copy(update={"gpu_usd_per_hour": price})
        for s, price in zip(prob.instance.sites, (2.0, 3.0), strict=True)
    ]
    priced = evaluate(problem_with(prob, sites=sites), plan)
    # 4096 GPUs per campus in use (512 nodes of 8): 4096 x $2 + 4096 x $3 per hour
    assert priced.nodes_by_site == {"north": 512, "south": 512}
    assert priced.usd_per_s - base.usd_per_s == pytest.approx(
        (4096 * 2.0 + 4096 * 3.0) / 3600, rel=1e-12
    )
    assert priced.cost_per_token_usd == pytest.approx(
        priced.usd_per_s * priced.step_time_s / (1536 * prob.model.seq_len), rel=1e-12
    )


def _priced_cases(n: int) -> list[dict]:
    out, seed = [], 0
    while len(out) < n:
        inst = copy.deepcopy(sc.random_instance(seed))
        rng = random.Random(1000 + seed)
        seed += 1
        for s in inst["sites"]:
            s["gpu_usd_per_hour"] = rng.choice((None, 1.0, 2.5, 6.0))
        inst["objective"] = {"minimize": "cost_per_token"}
        out.append(inst)
    return out


@pytest.mark.parametrize("inst", _priced_cases(8), ids=lambda i: i["name"])
def test_backends_agree_with_brute_force(inst: dict) -> None:
    from placer.io import problem_from_data

    out = {}
    for backend in ("brute", "cpsat", "milp"):
        try:
            res = solve(problem_from_data(inst), backend=backend, time_limit_s=60)
        except InfeasibleError:
            out[backend] = None
            continue
        assert res.status == "optimal", (
            backend,
            res.status,
            res.gap,
        )  # the walk ends proven, not at the limit
        out[backend] = res.objective
    if out["brute"] is None:
        assert out["cpsat"] is None and out["milp"] is None
        return
    assert out["cpsat"] == pytest.approx(out["brute"], rel=1e-5)
    assert out["milp"] == pytest.approx(out["brute"], rel=1e-5)
