"""Each release group's own load on a flow-routed pair's routes (PerfModel.step's
stage_bw per group; the formulations' B_series per release group, rows dp.group_flow*).
A stage's sync starts at its own release (placer.sim), so by the time the last group's
stages start, the earlier ones have had their head start on the routes; a routed pair's
group load is min(its group demand, its flow on the route), the simulation's
proportional share when the pair keeps to one path. Before, every group's stages paid
every stage's bytes on their routes with a flow-routed pair (+11% against the
simulation: tests/test_simulate.py::
test_each_release_group_loads_its_routes_with_its_own_stages_against_the_simulation).

Here a plan where that decides is pinned in both backends on a triangle (every pair
flow-routed), its a - b sync on the direct path or split 3 : 1 with the detour via c
(the flows pinned: with them free CP-SAT does not prove the pinned plan in 60 s on one
worker, before this change either): the step they price, minimized and (with the exact
pins of resilience.max_slowdown) maximized, is the evaluator's for the routing they
return. Split, stage 0's group (59% of the pair's bytes) puts min(D_g, F_r) on each path:
its own bytes on the direct path (75% of the flow) and the flow on the detour (25%),
above the simulation's proportional share there (the formulations' pessimistic side)."""

from __future__ import annotations

from typing import Any

import pytest
from test_exact_step import _evaluated
from test_stage_nic import pinned_case, pinned_step, triangle_instance

from placer.evaluate import evaluate
from placer.io import plan_from_data
from placer.optimize.milp import MilpInner

pytestmark = pytest.mark.filterwarnings("ignore:Constructing LpVariable:DeprecationWarning")

# both stages synced across the a - b pair (3 replicas at a, 2 at b)
GROUPS = [(3, ("a", "a")), (2, ("b", "b"))]
# tp 1 pp 2 dp 5, layers 5 + 3, 8 micro-batches
BASE = {
    "parallelism": {"tp": 1, "pp": 2, "dp": 5, "micro_batch": 1, "num_micro_batches": 8},
    "stage_layers": [5, 3],
    "replica_groups": [{"count": c, "stage_sites": list(s)} for c, s in GROUPS],
}


def _instance(resilience: bool) -> dict[str, Any]:
    # slow routes (the sync's WAN rounds bound by them), a detour via c
    return triangle_instance(
        {"a": 8, "b": 4, "c": 0},
        {("a", "b"): 50.0, ("a", "c"): 30.0, ("c", "b"): 30.0},
        capacity_gbps=100,
        max_sites_per_replica=1,
        resilience=resilience,
    )


def _setup(resilience: bool):
    return pinned_case(_instance(resilience), BASE, GROUPS)


def test_the_plan_is_one_where_a_release_groups_own_load_decides() -> None:
    """On the direct path the sync is below every stage's bytes on the route after the
    NIC phase and latency (the old rule's last release group), and above stage 0's alone
    there: the second release group, credited its head start, decides."""
    _problem, perf, _data, _counts, _nodes, ev = _setup(False)
    cfg, st = ev.config, ev.step
    assert len(set(perf.dp_release_s(cfg))) == 2
    intra = max(
        perf.intra_sync_s(cfg, k, s, members=n) for k in range(2) for s, n in (("a", 3), ("b", 2))
    )
    lat = 2 * perf.net.pair_latency_s(None, "data_parallel", "a", "b")
    cap = perf.net.capacity_Bps(("a", "b"), 0)
    alone, both = (sum(perf.stage_wan_bytes(cfg, k) for k in ks) / cap for ks in ([0], [0, 1]))
    assert intra + lat + alone < st.dp_s < intra + lat + both - 1e-3


def test_a_split_pair_pays_the_smaller_of_its_group_demand_and_its_flow() -> None:
    """With the a - b sync split in halves, stage 0's release group puts min(its demand,
    half the pair's demand) on each path: stage 0's bytes exceed half of both stages', so
    each path carries half of both stages' bytes, not half of stage 0's (PerfModel.step's
    group loads, by hand)."""
    problem, perf, _data, _counts, _nodes, ev = _setup(False)
    cfg = ev.config
    s0, s1 = (perf.stage_wan_bytes(cfg, k) for k in range(2))
    assert s0 > (s0 + s1) / 2  # the min is the flow: pessimistic against s0 / 2
    halves = plan_from_data(
        {
            **BASE,
            "routing": [
                {
                    "phase": "data_parallel",
                    "sites": ["a", "b"],
                    "paths": [
                        {"via": ["a", "b"], "share": 0.5},
                        {"via": ["a", "c", "b"], "share": 0.5},
                    ],
                }
            ],
        }
    )
    split = evaluate(problem, halves, perf)
    routing, st = split.routing, split.step
    intra = max(
        perf.intra_sync_s(cfg, k, s, members=n) for k in range(2) for s, n in (("a", 3), ("b", 2))
    )
    lat = 2 * perf.net.pair_latency_s(routing, "data_parallel", "a", "b")  # the detour's
    assert lat > 2 * perf.net.pair_latency_s(None, "data_parallel", "a", "b")
    cap = perf.net.capacity_Bps(("a", "b"), 0)
    # stage 0's group alone pays half of both stages' bytes on each route (the min), as
    # many as every stage's: no head start left to credit
    assert st.dp_s == pytest.approx(intra + lat + (s0 + s1) / 2 / cap, rel=1e-6)


@pytest.mark.parametrize("split", ["direct", "3:1"])
@pytest.mark.parametrize("backend", ["milp", "cpsat"])
@pytest.mark.parametrize("sense", ["minimize", "maximize"])
def test_both_backends_price_each_release_groups_own_routes(
    backend: str, sense: str, split: str
) -> None:
    problem, perf, data, counts, nodes, ev = _setup(sense == "maximize")
    assert not data.dp_wan_stagger
    q = ("a", "b")

    def constrain(model) -> None:
        f0, f1 = model.f[("dp", q, 0)], model.f[("dp", q, 1)]
        row = (f1 == 0) if split == "direct" else (f0 == 3 * f1)
        if isinstance(model, MilpInner):
            model.prob += row
        else:
            model.m.Add(row)

    got, routing, rel = pinned_step(backend, sense, data, counts, nodes, constrain)
    detour = sum(p["share"] for r in routing for p in r["paths"] if p["via"] == ["a", "c", "b"])
    assert detour == pytest.approx(0.25 if split == "3:1" else 0.0, abs=1e-3)
    want = _evaluated(problem, perf, data, counts, {}, routing)  # no waves: fixed routes
    assert got == pytest.approx(want, rel=rel), (got, want, ev.step_time_s)
