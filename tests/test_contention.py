"""Lockstep contention (issue 11 item 1): replicas share a route at every pipeline tick.

Oracles: hand arithmetic of the tick (R replicas x message / capacity, per direction), the
1F1B closed form re-evaluated at other transmit times (every plane is below it, tight at
its own point), and exhaustive search over the wave count through the evaluator (the
formulations must buy what the tick needs, not what the step-average bound needs). The
simulator check of the same rule is tests/test_simulate.py."""

from __future__ import annotations

import random

import pytest

from placer.io import problem_from_data
from placer.optimize.contention import ChainPlanes, crossings, plane_at
from placer.optimize.driver import solve
from placer.perf.step import PerfModel
from placer.rules import job_config

MODEL = {
    "name": "contention-8l",
    "layers": 8,
    "hidden": 4096,
    "heads": 32,
    "vocab": 32000,
    "seq_len": 4096,
}


def instance(schedule: str = "lockstep", max_step: float | None = None) -> dict:
    """Two sites of 8 H100 nodes joined by 300 km of new fiber; tp 8, pp 2, dp 8 pinned
    and 8 GPUs per site per stage, so every replica's pipeline must cross the route."""
    inst = {
        "name": "contention",
        "sites": [
            {"name": "a", "gpu": "h100-sxm", "gpus": 64},
            {"name": "b", "gpu": "h100-sxm", "gpus": 64},
        ],
        "routes": [{"sites": ["a", "b"], "km": 300, "fiber_pairs": 1}],
        "job": {
            "model": MODEL,
            "global_batch": 64,
            "replica_schedule": schedule,
            "parallelism": {"tp": [8], "pp": [2], "dp": [8], "micro_batch": [1]},
        },
        "solver": {"max_sites_per_replica": 2, "paths_per_pair": 1},
    }
    if max_step is not None:
        inst["objective"] = {"minimize": "cost", "max_step_time_s": max_step}
    return inst


def _cfg(prob):
    return job_config(prob.instance.job, 8, 2, 8, 1, 8, (4, 4), "synchronous")


def _step(prob, waves: int) -> float:
    perf = PerfModel(prob)
    groups = [(8, ("a", "b"))]
    return perf.step(_cfg(prob), groups, {("a", "b"): waves}).step_time_s


def test_tick_is_the_replicas_activations_over_the_capacity_per_direction() -> None:
    """5 chains a -> b and 3 chains b -> a: each direction of the route carries the
    activations of the chains that travel it (5 and 3 messages), not all 8."""
    prob = problem_from_data(instance())
    perf = PerfModel(prob)
    cfg = _cfg(prob)
    cap = {("a", "b"): perf.net.capacity_Bps(("a", "b"), 2)}
    tick = perf.route_tick_s(cfg, [(5, ("a", "b")), (3, ("b", "a"))], cap)
    msg = 1 * 4096 * 4096 * 2
    assert tick[("a", "b")] == pytest.approx(5 * msg / cap[("a", "b")], rel=1e-12)
    assert tick[("b", "a")] == pytest.approx(3 * msg / cap[("a", "b")], rel=1e-12)
    assert (
        perf.route_tick_s(_cfg(problem_from_data(instance("staggered"))), [(5, ("a", "b"))], cap)
        == {}
    )


def test_planes_are_below_the_chain_time_everywhere_and_tight_at_their_point() -> None:
    prob = problem_from_data(instance())
    perf = PerfModel(prob)
    cfg = _cfg(prob)
    paths = {("a", "b"): perf.net.candidate_paths("a", "b", 1)}
    cp = ChainPlanes(("a", "b"), crossings(perf, cfg, ("a", "b"), paths))
    (x,) = cp.crossings
    rng = random.Random(7)
    for _ in range(20):
        tau, lam = x.nic_s * rng.uniform(1, 40), x.latency_s[0] * rng.uniform(1, 3)
        plane = plane_at(perf, cfg, cp, (tau,), (lam,))
        for _ in range(5):
            t2, l2 = x.nic_s * rng.uniform(1, 40), x.latency_s[0] * rng.uniform(1, 3)
            truth = perf.chain_time_at(
                cfg, ("a", "b"), (l2 - perf.catalog.network.intra_site_latency_s,), (t2,)
            )
            assert plane.value((t2,), (l2,)) <= truth * (1 + 1e-12)
        own = perf.chain_time_at(
            cfg, ("a", "b"), (lam - perf.catalog.network.intra_site_latency_s,), (tau,)
        )
        assert plane.value((tau,), (lam,)) == pytest.approx(own, rel=1e-12)


@pytest.mark.parametrize("backend", ["cpsat", "milp"])
def test_the_optimizer_buys_the_waves_the_tick_needs(backend: str) -> None:
    """Cheapest plan within a step limit set between the 1-wave and the many-wave step:
    the wave count is the smallest whose lockstep step meets the limit (exhaustive search
    through the evaluator), more than the step-average rule would buy."""
    prob = problem_from_data(instance())
    steps = {w: _step(prob, w) for w in range(1, 33)}
    assert steps[1] > 1.2 * steps[32]  # the tick binds with few waves
    limit = (steps[1] + steps[32]) / 2
    need = min(w for w, t in steps.items() if t <= limit)
    res = solve(problem_from_data(instance(max_step=limit)), backend=backend, time_limit_s=60)
    assert res.status == "optimal"
    assert res.plan.links[0].waves == need
    assert res.evaluation.step_time_s <= limit
    # staggered replicas: only the step average binds, fewer waves do
    stag = solve(problem_from_data(instance("staggered", limit)), backend=backend, time_limit_s=60)
    assert stag.status == "optimal" and stag.plan.links[0].waves < need
