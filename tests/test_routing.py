"""Multi-commodity routing: traffic of a site pair split over paths of the route graph.

The reference numbers are closed forms over quantities of the performance model and the
network (stage gradient bytes, route capacity, path latency), never the formulations'.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from placer.evaluate import evaluate
from placer.io import problem_from_data
from placer.network import Network
from placer.optimize.driver import solve
from placer.perf.step import PerfModel

pytestmark = pytest.mark.filterwarnings("ignore:Constructing LpVariable:DeprecationWarning")
BACKENDS = ("cpsat", "milp", "brute")


def triangle(
    direct_gbps: float,
    detour_gbps: float,
    *,
    direct_km: float = 100,
    detour_km: float = 60,
    k: int = 2,
) -> dict[str, Any]:
    """Sites a and b each host half the replicas (whole replicas: one site per replica);
    c hosts nothing but relays. The a-b data-parallel exchange may go direct or via c.
    Every capacity is in place (no waves to buy), so routing is the only WAN decision."""
    return {
        "name": "triangle",
        "sites": [
            {"name": "a", "gpu": "h100-sxm", "gpus": 8, "gpus_per_node": 4},
            {"name": "b", "gpu": "h100-sxm", "gpus": 8, "gpus_per_node": 4},
            {"name": "c", "gpu": "h100-sxm", "gpus": 0, "gpus_per_node": 4},
        ],
        "routes": [
            {"sites": ["a", "b"], "km": direct_km, "capacity_gbps": direct_gbps, "max_waves": 0},
            {"sites": ["a", "c"], "km": detour_km, "capacity_gbps": detour_gbps, "max_waves": 0},
            {"sites": ["c", "b"], "km": detour_km, "capacity_gbps": detour_gbps, "max_waves": 0},
        ],
        "job": {
            "model": "tiny-8l",
            "global_batch": 16,
            "gpus": 16,
            "sync": {"mode": "synchronous", "bits": 16},
            "parallelism": {"tp": [4], "pp": [1], "dp": [4], "micro_batch": [1]},
        },
        "solver": {"max_sites_per_replica": 1, "paths_per_pair": k, "time_limit_s": 30},
    }


def _split_pair_demand(instance: dict[str, Any]) -> tuple[Network, float]:
    """The network and the a-b pair's WAN demand D = 2 S / 2 bytes of the plan both closed
    forms price: tp 4, pp 1, two replicas at a and two at b."""
    problem = problem_from_data(instance)
    net, perf = Network(problem), PerfModel(problem)
    from placer.rules import config_of
    from placer.schema import Plan

    plan = Plan.model_validate(
        {
            "parallelism": {"tp": 4, "pp": 1, "dp": 4, "micro_batch": 1},
            "stage_layers": [8],
            "replica_groups": [
                {"count": 2, "stage_sites": ["a"]},
                {"count": 2, "stage_sites": ["b"]},
            ],
        }
    )
    return net, 2 * perf.stage_wan_bytes(config_of(problem, plan), 0) / 2


def closed_form_wan(instance: dict[str, Any]) -> tuple[float, float]:
    """(WAN phase seconds, share on the direct path) of the best routing, by hand: the
    pair exchanges D = 2 S / 2 bytes; direct alone, detour alone, or split in proportion
    to capacity (which equalises the two paths' times) at the slower path's latency."""
    net, demand = _split_pair_demand(instance)
    c1 = net.capacity_Bps(("a", "b"), 0)
    c2 = min(net.capacity_Bps(("a", "c"), 0), net.capacity_Bps(("b", "c"), 0))
    l1 = net.latency_s(("a", "b"))
    l2 = net.latency_s(("a", "c")) + net.latency_s(("b", "c"))
    options = [
        (demand / c1 + 2 * l1, 1.0),
        (demand / c2 + 2 * l2, 0.0),
        (demand / (c1 + c2) + 2 * max(l1, l2), c1 / (c1 + c2)),
    ]
    return min(options)


def solved(instance: dict[str, Any], backend: str) -> Any:
    return solve(
        problem_from_data({**instance, "solver": {**instance["solver"], "backend": backend}})
    )


def wan_of(instance: dict[str, Any], backend: str) -> tuple[float, float, Any]:
    res = solved(instance, backend)
    step = res.evaluation.step
    assert step is not None
    direct = step.route_dp_load.get(("a", "b"), 0.0)
    total = direct + step.route_dp_load.get(("a", "c"), 0.0)
    return step.wan_s, direct / total if total else 1.0, res


@pytest.mark.parametrize("backend", BACKENDS)
def test_split_over_two_paths_matches_the_closed_form(backend: str) -> None:
    # equal capacities, a detour a little longer: splitting halves the transfer time
    inst = triangle(10, 10, direct_km=100, detour_km=60)
    expected, share = closed_form_wan(inst)
    assert 0 < share < 1, "the instance must make the split optimal"
    wan, direct_share, res = wan_of(inst, backend)
    assert wan == pytest.approx(expected, rel=1e-5)
    assert direct_share == pytest.approx(share, abs=1e-4)
    assert [r.phase for r in res.plan.routing] == ["data_parallel"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_far_detour_is_not_worth_its_latency(backend: str) -> None:
    # a 2000 km detour adds ~20 ms of round trip: more than splitting saves on this model
    inst = triangle(400, 400, direct_km=100, detour_km=1000)
    expected, share = closed_form_wan(inst)
    assert share == 1.0
    wan, direct_share, res = wan_of(inst, backend)
    assert wan == pytest.approx(expected, rel=1e-5)
    assert direct_share == pytest.approx(1.0)
    assert res.plan.routing == []


@pytest.mark.parametrize("backend", ("cpsat", "milp"))
def test_a_congested_direct_route_is_bypassed(backend: str) -> None:
    # the direct route barely carries anything: the detour takes (almost) everything
    inst = triangle(1, 100, direct_km=100, detour_km=60)
    expected, share = closed_form_wan(inst)
    wan, direct_share, _ = wan_of(inst, backend)
    assert wan == pytest.approx(expected, rel=1e-5)
    assert direct_share == pytest.approx(share, abs=1e-4)


@pytest.mark.parametrize("backend", ("cpsat", "milp"))
def test_more_candidate_paths_never_hurt(backend: str) -> None:
    base = triangle(10, 10)
    one = copy.deepcopy(base)
    one["solver"]["paths_per_pair"] = 1
    t_multi = solved(base, backend).objective
    t_single = solved(one, backend).objective
    assert t_multi <= t_single * (1 + 1e-6)
    assert t_multi < t_single  # this instance gains from the split


def test_evaluator_prices_a_given_split() -> None:
    inst = triangle(10, 10)
    problem = problem_from_data(inst)
    net = Network(problem)
    s = 0.3
    plan = {
        "parallelism": {"tp": 4, "pp": 1, "dp": 4, "micro_batch": 1},
        "stage_layers": [8],
        "replica_groups": [{"count": 2, "stage_sites": ["a"]}, {"count": 2, "stage_sites": ["b"]}],
        "routing": [
            {
                "phase": "data_parallel",
                "sites": ["a", "b"],
                "paths": [
                    {"via": ["a", "b"], "share": s},
                    {"via": ["b", "c", "a"], "share": 1 - s},
                ],
            }
        ],
    }
    ev = evaluate(problem, plan)
    assert ev.feasible, ev.violations
    base = evaluate(problem, {k: v for k, v in plan.items() if k != "routing"})
    demand = base.step.route_dp_load[("a", "b")]  # shortest path: all of it direct
    c1, c2 = net.capacity_Bps(("a", "b"), 0), net.capacity_Bps(("a", "c"), 0)
    lat = net.latency_s(("a", "c")) + net.latency_s(("b", "c"))
    assert ev.step.route_dp_load[("a", "b")] == pytest.approx(s * demand)
    assert ev.step.route_dp_load[("b", "c")] == pytest.approx((1 - s) * demand)
    assert ev.step.wan_s == pytest.approx(max(s * demand / c1, (1 - s) * demand / c2) + 2 * lat)


def test_evaluator_names_a_path_without_a_route() -> None:
    inst = triangle(10, 10)
    inst["routes"] = inst["routes"][:2]  # no c-b route
    plan = {
        "parallelism": {"tp": 4, "pp": 1, "dp": 4, "micro_batch": 1},
        "stage_layers": [8],
        "replica_groups": [{"count": 2, "stage_sites": ["a"]}, {"count": 2, "stage_sites": ["b"]}],
        "routing": [
            {
                "phase": "data_parallel",
                "sites": ["a", "b"],
                "paths": [{"via": ["a", "c", "b"], "share": 1.0}],
            }
        ],
    }
    ev = evaluate(problem_from_data(inst), plan)
    assert not ev.feasible
    assert any(
        v.where == "routing[0].paths[0]" and "no route between b and c" in v.message
        for v in ev.violations
    )


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        ([{"via": ["a", "b"], "share": 0.5}], "shares sum to 0.5"),
        ([{"via": ["a", "c"], "share": 1.0}], "must run between a and b"),
        ([{"via": ["a", "c", "a", "b"], "share": 1.0}], "visits a site twice"),
    ],
)
def test_plan_schema_rejects_bad_routing(paths: list[dict[str, Any]], message: str) -> None:
    from pydantic import ValidationError

    from placer.schema import PairRouting

    with pytest.raises(ValidationError, match=message):
        PairRouting.model_validate({"phase": "data_parallel", "sites": ["a", "b"], "paths": paths})


def test_candidate_paths_are_the_lowest_latency_simple_paths() -> None:
    inst = triangle(10, 10, direct_km=100, detour_km=60)
    net = Network(problem_from_data(inst))
    paths = net.candidate_paths("a", "b", 5)
    assert [p.sites for p in paths] == [("a", "b"), ("a", "c", "b")]  # the only two simple paths
    assert paths[1].latency_s == pytest.approx(2 * 60 * 4.9e-6)
    assert math.isclose(paths[0].latency_s, 100 * 4.9e-6)


def pipeline_triangle() -> dict[str, Any]:
    """Every replica has its first stage at a and its second at b (each site holds one
    stage of every replica), on thin routes: activations cross a-b every micro-batch."""
    inst = triangle(1, 1, direct_km=100, detour_km=60)
    inst["job"]["parallelism"] = {"tp": [4], "pp": [2], "dp": [2], "micro_batch": [1]}
    inst["solver"]["max_sites_per_replica"] = 2
    inst["sites"][0]["gpus"] = inst["sites"][1]["gpus"] = 8
    return inst


def test_pipeline_traffic_is_split_and_all_backends_agree() -> None:
    inst = pipeline_triangle()
    results = {b: solved(inst, b) for b in BACKENDS}
    ref = results["brute"].objective
    for b, res in results.items():
        assert res.objective == pytest.approx(ref, rel=1e-5), b
        assert [r.phase for r in res.plan.routing] == ["pipeline"], b
    single = copy.deepcopy(inst)
    single["solver"]["paths_per_pair"] = 1
    assert ref < solved(single, "milp").objective


def kite(gbps: float = 10, km: tuple[float, float, float] = (100, 60, 70)) -> dict[str, Any]:
    """triangle with a second relay d: the a-b exchange has three candidate paths (direct,
    via c, via d; paths_per_pair 3), each of `gbps`, so the best plan splits it over all
    three in equal thirds at the slowest path's latency."""
    inst = triangle(gbps, gbps, direct_km=km[0], detour_km=km[1], k=3)
    inst["sites"].append({"name": "d", "gpu": "h100-sxm", "gpus": 0, "gpus_per_node": 4})
    inst["routes"] += [
        {"sites": ["a", "d"], "km": km[2], "capacity_gbps": gbps, "max_waves": 0},
        {"sites": ["d", "b"], "km": km[2], "capacity_gbps": gbps, "max_waves": 0},
    ]
    return inst


def kite_closed_form(instance: dict[str, Any]) -> tuple[float, float]:
    """(WAN phase seconds, a-b demand bytes) of the best routing by hand: the first j
    paths (by latency) in equal shares of D, at the j-th path's round trip."""
    net, demand = _split_pair_demand(instance)
    cap = net.capacity_Bps(("a", "b"), 0)
    rtts = sorted(
        [
            2 * net.latency_s(("a", "b")),
            2 * (net.latency_s(("a", "c")) + net.latency_s(("b", "c"))),
            2 * (net.latency_s(("a", "d")) + net.latency_s(("b", "d"))),
        ]
    )
    return min(demand / (j * cap) + rtts[j - 1] for j in (1, 2, 3)), demand


def test_three_paths_split_agrees_across_backends() -> None:
    """paths_per_pair 3 with CP-SAT's flows in units of more than a byte (the pair's
    demand is above 2**FLOW_BITS bytes): CP-SAT, the MILP and brute force find the closed
    form's three-way split, and the same objective."""
    from placer.optimize.cpsat import FLOW_BITS

    inst = kite()
    expected, demand = kite_closed_form(inst)
    assert demand > 2**FLOW_BITS, "the pair's flows must be rescaled (unit > 1 byte)"
    results = {b: wan_of(inst, b) for b in BACKENDS}
    for b, (wan, _, res) in results.items():
        assert wan == pytest.approx(expected, rel=1e-6), b
        assert len(res.plan.routing) == 1 and len(res.plan.routing[0].paths) == 3, b
        assert res.objective == pytest.approx(results["brute"][2].objective, rel=1e-6), b


def test_cpsat_flow_unit_bounds_coefficients_and_rounds_up() -> None:
    """CP-SAT's split flows in units of U bytes (cpsat.flow_unit): the smallest U that
    keeps a pair's largest demand within 2**FLOW_BITS units; the model's path-allowed
    big-M stays within that, and its flows carry the exact demand rounded UP to a unit
    (so every route load bounds the evaluator's from above, by under one unit)."""
    from placer.optimize.cpsat import FLOW_BITS, CpsatInner, flow_unit
    from placer.optimize.data import build_inner
    from placer.optimize.driver import _upper_bound_time
    from placer.optimize.space import chain_types, enumerate_configs

    for m in (1, 2**FLOW_BITS, 2**FLOW_BITS + 1, 10**11 + 7):
        u = flow_unit(m)
        assert -(-m // u) <= 2**FLOW_BITS and (u == 1 or -(-m // (u - 1)) > 2**FLOW_BITS)
    problem = problem_from_data(kite())
    perf = PerfModel(problem)
    _, demand = kite_closed_form(kite())
    cfg = next(c for c in enumerate_configs(problem) if c.dp == 4)
    data = build_inner(problem, perf, cfg, chain_types(problem, perf, cfg))
    inner = CpsatInner(data, "step_time", _upper_bound_time(data) * 1.001 + 1e-6)
    (key,) = inner.f_unit
    U = inner.f_unit[key]
    assert U > 1
    proto = inner.m.Proto()
    big_m = [
        abs(co)
        for c in proto.constraints
        if c.name.startswith("route.dp.path_allowed")
        for co in c.linear.coeffs
    ]
    assert big_m and max(big_m) <= 2**FLOW_BITS
    res = inner.solve(10, 1, 0, {}, tiebreak=False)
    assert res.optimal
    solver = inner._tie[0]
    carried = U * sum(solver.Value(f) for k, f in inner.f.items() if k[:2] == key)
    assert demand <= carried < demand + U


def _triangle_repeats(direct: tuple[float, float], detour: tuple[float, float]) -> dict[str, Any]:
    """part-filled's tp 1 pp 2 job (sc.part_filled_instance: stages of 8 and 6 gradient
    buckets, R = 7 and 5 latency repeats) under job.overlap, whole replicas at a (8 GPUs)
    and b (4), so both stages sync across the a-b pair, directly or split with the detour
    via c (paths_per_pair 2). Each bucket pays its stage's pairs' latency again, the
    slowest path the pair uses (PerfModel.dp_stage_repeats): (Gbps, km) per route."""
    import solver_cases as sc

    inst = sc.part_filled_instance(direct[1], dp=5, overlap=True, site_gpus=8)
    inst["name"] = "triangle-repeats"
    inst["sites"][1]["gpus"] = 4
    inst["sites"].append({"name": "c", "gpu": "h100-sxm", "gpus": 0, "gpus_per_node": 4})
    inst["routes"] = [
        {"sites": ["a", "b"], "km": direct[1], "capacity_gbps": direct[0], "max_waves": 0},
        {"sites": ["a", "c"], "km": detour[1], "capacity_gbps": detour[0], "max_waves": 0},
        {"sites": ["c", "b"], "km": detour[1], "capacity_gbps": detour[0], "max_waves": 0},
    ]
    inst["solver"] = {"paths_per_pair": 2, "time_limit_s": 60, "max_sites_per_replica": 1}
    return inst


@pytest.mark.parametrize(
    ("direct", "detour", "split"),
    [((100, 50), (100, 30), True), ((400, 20), (400, 200), False)],
    ids=["short-detour", "long-detour"],
)
def test_routed_sync_pays_the_detours_latency_repeats(direct, detour, split) -> None:
    """The release groups' latency repeats (PerfModel.dp_stage_repeats; the formulations'
    dp.group_path_repeats rows) of a flow-routed data-parallel pair: a detour the sync
    uses makes every bucket pay its latency. A short detour is worth splitting over; a
    long one is not (its 7 repeats of 2 x 400 km's latency outweigh halving the bytes).
    Brute force, CP-SAT and the MILP find the same optimum; without those rows both
    formulations priced a split's repeats at the direct path's latency (caught here as
    a step that is not the evaluator's, on both cases)."""
    inst = _triangle_repeats(direct, detour)
    results = {b: solved(inst, b) for b in BACKENDS}
    ref = results["brute"].objective
    for b, res in results.items():
        assert res.objective == pytest.approx(ref, rel=1e-6), b
        counts = sorted(g.count for g in res.plan.replica_groups)
        assert counts == ([2, 3] if split else [1, 4]), b
        assert bool(res.plan.routing) is split, b
