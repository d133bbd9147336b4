"""Failures priced with the OptCC bound (reference/optcc.md): scenarios, the survive
constraint in both backends, and ring vs OptCC spare capacity worked out by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer.evaluate import evaluate
from placer.io import problem_from_data
from placer.optimize.driver import solve
from placer.perf.flops import param_count
from placer.resilience import failure_report, slowdown_factor

WAVE_800G_BPS = 800e9 / 8 * 0.9  # one 800G wave, payload efficiency 0.9 (catalog)
EPS = 0.02  # catalog resilience.optcc_eps
KM = 50.0
ONE_WAY_S = KM * 4.9e-6


def mesh(n_sites: int, extra: dict[str, Any] | None = None, max_waves: int = 8) -> dict[str, Any]:
    """n sites, one replica of a 1.7B model each (tp=1, pp=1), every pair joined by 50 km:
    the data-parallel all-reduce between sites dominates the step."""
    names = [chr(ord("a") + i) for i in range(n_sites)]
    inst: dict[str, Any] = {
        "name": f"mesh{n_sites}",
        # one GPU per site: each site holds exactly one replica, so the job must span them
        "sites": [{"name": n, "gpu": "h100-sxm", "gpus": 1, "gpus_per_node": 1} for n in names],
        "routes": [
            {"sites": [a, b], "km": KM, "fiber_pairs": 1, "max_waves": max_waves}
            for i, a in enumerate(names)
            for b in names[i + 1 :]
        ],
        "job": {
            "model": "sc21-1.7b",
            "global_batch": n_sites,
            "recompute": "selective",
            "parallelism": {"tp": [1], "pp": [1], "dp": [n_sites], "micro_batch": [1]},
        },
        "solver": {"max_sites_per_replica": 1, "time_limit_s": 60},
    }
    inst.update(extra or {})
    return inst


def local_plan(n_sites: int, waves: int) -> dict[str, Any]:
    names = [chr(ord("a") + i) for i in range(n_sites)]
    return {
        "parallelism": {"tp": 1, "pp": 1, "dp": n_sites, "micro_batch": 1},
        "stage_layers": [24],
        "replica_groups": [{"count": 1, "stage_sites": [n]} for n in names],
        "links": [
            {"sites": [a, b], "waves": waves} for i, a in enumerate(names) for b in names[i + 1 :]
        ],
    }


def wan_bytes_per_pair(n_sites: int) -> float:
    """Hierarchical all-reduce between K sites: each pair exchanges 2 S / K per direction,
    S the bf16 gradient of the whole model."""
    prob = problem_from_data(mesh(n_sites))
    return 2 * (2 * param_count(prob.model)) / n_sites


def rest_of_step(n_sites: int) -> float:
    """Step time minus the WAN bandwidth term (compute and the WAN latency), read from the
    evaluator on a plan with one wave per route."""
    prob = problem_from_data(mesh(n_sites))
    ev = evaluate(prob, local_plan(n_sites, 1))
    return ev.step_time_s - wan_bytes_per_pair(n_sites) / WAVE_800G_BPS


# ----------------------------------------------------------------------------- factors


def test_slowdown_factor_properties_by_hand() -> None:
    # l = 1: no failure, no overhead, whatever the collective
    for c in ("ring", "optcc", "bound"):
        assert slowdown_factor(c, 7, 1.0, EPS) == 1.0
    # p = 2: the cut is the link: OptCC cannot beat the ring
    assert slowdown_factor("bound", 2, 1.5, EPS) == pytest.approx(1.5)
    assert slowdown_factor("optcc", 2, 1.5, EPS) == pytest.approx(1.5)
    # p = 5, l = 2: bound = 1.25 x fault-free ring (optcc.md)
    assert slowdown_factor("bound", 5, 2.0, EPS) == pytest.approx(1.25)
    assert slowdown_factor("optcc", 5, 2.0, EPS) == pytest.approx(1.25 * 1.02)
    assert slowdown_factor("ring", 5, 2.0, EPS) == 2.0


@given(p=st.integers(2, 64), l=st.floats(1.0, 8.0))  # noqa: E741
def test_bound_le_optcc_le_ring(p: int, l: float) -> None:  # noqa: E741
    b, o, r = (slowdown_factor(c, p, l, EPS) for c in ("bound", "optcc", "ring"))
    assert b <= o + 1e-12 and o <= r + 1e-12


# ----------------------------------------------------------------------------- scenarios


def wan_factor_seen(n_sites: int, waves: int, collective: str) -> float:
    """The factor by which a scenario multiplied the WAN bandwidth term of the step."""
    prob = problem_from_data(mesh(n_sites))
    plan = local_plan(n_sites, waves)
    healthy = evaluate(prob, plan).step_time_s
    rep = failure_report(prob, evaluate(prob, plan), ["wave"])
    sc = rep.scenarios[0]
    bw = wan_bytes_per_pair(n_sites) / (waves * WAVE_800G_BPS)
    return 1 + (sc.step_s[collective] - healthy) / bw


def test_scenarios_reproduce_optcc_properties() -> None:
    # 4 sites, 2 waves per route, one lost: l = 2 -> bound p/(p-1) = 4/3, ring 2
    assert wan_factor_seen(4, 2, "bound") == pytest.approx(4 / 3, rel=1e-6)
    assert wan_factor_seen(4, 2, "ring") == pytest.approx(2.0, rel=1e-6)
    assert wan_factor_seen(4, 2, "optcc") == pytest.approx(4 / 3 * 1.02, rel=1e-6)
    # 5 sites, l = 2: 1.25 (optcc.md)
    assert wan_factor_seen(5, 2, "bound") == pytest.approx(1.25, rel=1e-6)
    # 2 sites: OptCC pays the same as the ring
    assert wan_factor_seen(2, 2, "optcc") == pytest.approx(wan_factor_seen(2, 2, "ring"), rel=1e-9)
    # l > 2 (4 waves -> 1 left is a fiber-pair-like loss of 3): overhead ~ l/2, not O(1/p)
    prob = problem_from_data(mesh(4))
    plan = local_plan(4, 4)
    rep = failure_report(prob, evaluate(prob, plan), ["fiber_pair"])
    assert rep.scenarios == [] or all(s.klass == "fiber_pair" for s in rep.scenarios)


def test_disconnecting_failure_is_reported() -> None:
    prob = problem_from_data(mesh(2))
    rep = failure_report(prob, evaluate(prob, local_plan(2, 3)), ["fiber_pair"])
    (sc,) = rep.scenarios
    assert sc.disconnected
    assert math.isinf(sc.step_s["optcc"])
    assert "disconnected" in sc.description
    assert sc.to_dict()["step_time_s"]["ring"] is None  # JSON-safe


def test_nic_failure_expected_step_time() -> None:
    inst = mesh(
        2, {"resilience": {"survive": ["nic"], "collective": "optcc", "nic_failure_rate": 0.01}}
    )
    inst["sites"] = [
        {"name": "a", "gpu": "h100-sxm", "gpus": 64},
        {"name": "b", "gpu": "h100-sxm", "gpus": 64},
    ]
    inst["job"]["global_batch"] = 16
    inst["job"]["parallelism"]["dp"] = [16]
    # the sync fully exposed, so that the step grows by exactly the slowed-down sync
    inst["job"]["overlap"] = {"grad_reduce": False, "param_gather": False, "tp_comm": False}
    prob = problem_from_data(inst)
    plan = local_plan(2, 2)
    plan["parallelism"]["dp"] = 16
    plan["replica_groups"] = [
        {"count": 8, "stage_sites": ["a"]},
        {"count": 8, "stage_sites": ["b"]},
    ]
    rep = failure_report(prob, evaluate(prob, plan))
    (nic,) = [s for s in rep.scenarios if s.klass == "nic"]
    ev = evaluate(prob, plan)
    intra = ev.step.intra_s
    # ring pays l = 8/7 on the intra-site sync; OptCC the bound for p = dp = 16 members
    assert nic.step_s["ring"] - ev.step_time_s == pytest.approx(intra * (8 / 7 - 1), rel=1e-6)
    p, l = 16, 8 / 7  # noqa: E741
    bound = max(l, 2 * (p - 1) * l / ((p - 1) * l + 1)) / (2 * (p - 1) / p)
    assert nic.step_s["bound"] - ev.step_time_s == pytest.approx(intra * (bound - 1), rel=1e-6)
    nodes = sum(ev.nodes_by_site.values())
    p_any = 1 - 0.99**nodes
    assert rep.expected_s["ring"] == pytest.approx(
        ev.step_time_s + p_any * (nic.step_s["ring"] - ev.step_time_s)
    )
    assert ev.step_time_s <= rep.expected_s["optcc"] <= rep.expected_s["ring"]


# ----------------------------------------------------------------------------- optimizer


def spare_counts(n_sites: int, t_max: float, backend: str) -> dict[str, Any]:
    inst = mesh(
        n_sites,
        {
            "objective": {"minimize": "cost", "max_step_time_s": t_max},
            # limit = (1 + 0) x max_step_time_s: the failure must fit the same SLA
            "resilience": {"survive": ["wave"], "collective": "optcc", "max_slowdown": 0.0},
        },
    )
    res = solve(problem_from_data(inst), backend=backend)
    return res.plan.resilience or {}


@pytest.mark.parametrize("backend", ["milp", "cpsat"])
def test_four_sites_ring_needs_more_spares_than_optcc(backend: str) -> None:
    """Hand-worked: with w waves per route the WAN term is B1 / w (B1: one wave). Give the
    WAN W = B1 / 3.5 of time: without failures w = 4 (B1/4 = 0.875 W). Losing one wave:
    ring pays l = 4/3 -> B1/3 = 1.17 W > W, so the ring needs w = 5 (B1/4 <= W): 1 spare
    per route, 6 in all. OptCC with p = 4 and l = 4/3 < 5/3 pays 2(p-1)l/((p-1)l+1) /
    (2(p-1)/p) x 1.02 = 4w/(4w-1) x 1.02 -> 1.02 x 4 B1 / 15 = 0.952 W <= W: no spare."""
    b1 = wan_bytes_per_pair(4) / WAVE_800G_BPS
    t_max = rest_of_step(4) + b1 / 3.5
    out = spare_counts(4, t_max, backend)
    assert out["waves_without_resilience"] == {
        k: 4 for k in ["a-b", "a-c", "a-d", "b-c", "b-d", "c-d"]
    }
    assert out["spare_waves_ring"] == 6
    assert out["spare_waves_optcc"] == 0
    assert out["failures"]["survives"]


@pytest.mark.parametrize("backend", ["milp", "cpsat"])
def test_two_sites_optcc_buys_as_many_spares_as_ring(backend: str) -> None:
    """Two sites: l = w/(w-1) for both collectives. Budget W = B1 / 3.5 -> w = 4 healthy;
    after losing one wave B1/3 > W, so both need 5: one spare each."""
    b1 = wan_bytes_per_pair(2) / WAVE_800G_BPS
    t_max = rest_of_step(2) + b1 / 3.5
    out = spare_counts(2, t_max, backend)
    assert out["waves_without_resilience"] == {"a-b": 4}
    assert out["spare_waves_ring"] == out["spare_waves_optcc"] == 1


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 3),
    slowdown=st.sampled_from([0.02, 0.05, 0.2]),
    collective=st.sampled_from(["ring", "optcc"]),
    survive=st.sampled_from([["wave"], ["wave", "fiber_pair"], ["wave", "nic"]]),
)
def test_n_minus_1_guarantee_holds(
    n: int, slowdown: float, collective: str, survive: list[str]
) -> None:
    inst = mesh(
        n,
        {"resilience": {"survive": survive, "collective": collective, "max_slowdown": slowdown}},
        max_waves=4,
    )
    prob = problem_from_data(inst)
    try:
        res = solve(prob, backend="cpsat", time_limit_s=30)
    except Exception as exc:  # noqa: BLE001 - an infeasible guarantee is a valid answer
        assert getattr(exc, "exit_code", None) == 3, exc
        return
    rep = failure_report(prob, res.evaluation)
    limit = res.evaluation.step_time_s * (1 + slowdown)
    for sc in rep.scenarios:
        assert sc.step_s[collective] <= limit * (1 + 1e-6), sc
    assert evaluate(prob, res.plan).feasible


@pytest.mark.parametrize("seed", range(8))
def test_backends_agree_with_brute_force_under_resilience(seed: int) -> None:
    """The survive constraints of both formulations against exhaustive search scored by the
    evaluator (which checks every single failure itself), on the tiny solver-library cases."""
    import random
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import solver_cases as sc

    from placer.errors import InfeasibleError

    inst = sc.random_instance(seed)
    rng = random.Random(seed)
    inst["resilience"] = {
        "survive": rng.choice([["wave"], ["wave", "fiber_pair"], ["nic"], ["wave", "nic"]]),
        "collective": rng.choice(["ring", "optcc"]),
        "max_slowdown": rng.choice([0.0, 0.05, 0.5]),
    }
    # brute force does not search routings together with resilience (placer.optimize.brute)
    inst.setdefault("solver", {})["paths_per_pair"] = 1
    out = {}
    for backend in ("brute", "cpsat", "milp"):
        try:
            out[backend] = solve(
                problem_from_data(inst), backend=backend, time_limit_s=60, _nested=True
            ).objective
        except InfeasibleError:
            out[backend] = None
    if out["brute"] is None:
        assert out["cpsat"] is None and out["milp"] is None, out
    else:
        assert out["cpsat"] == pytest.approx(out["brute"], rel=1e-5, abs=1e-9)
        assert out["milp"] == pytest.approx(out["brute"], rel=1e-6, abs=1e-9)
