"""Symmetry breaking between interchangeable sites (placer.optimize.symmetry).

Detection is checked on tiny instances whose symmetry (or its absence) is known by
construction; the rows must never change an optimum (brute force, which has no rows, is
the reference) nor, since the tie-break drops them, the plan placer writes (the same solve
with solver.symmetry off is the reference)."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import solver_cases as sc

from placer.io import Problem, load_instance, problem_from_data
from placer.optimize.cpsat import CpsatInner
from placer.optimize.data import InnerData, build_inner
from placer.optimize.driver import _upper_bound_time, solve
from placer.optimize.milp import MilpInner
from placer.optimize.space import chain_types, enumerate_configs
from placer.optimize.symmetry import interchangeable, site_classes, used_by_site
from placer.perf.step import PerfModel

pytestmark = pytest.mark.filterwarnings("ignore:Constructing LpVariable:DeprecationWarning")

INSTANCES = Path(__file__).resolve().parent.parent / "instances"


def _site(name: str, gpus: int = 8, **kw: Any) -> dict[str, Any]:
    return {"name": name, "gpu": "h100-sxm", "gpus": gpus, "gpus_per_node": 4, **kw}


def _instance(
    sites: list[dict[str, Any]], routes: list[tuple[str, str, float]], **solver: Any
) -> dict[str, Any]:
    """A tiny-4l job of 16 GPUs (tp 4, pp 2, dp 2) over 8-GPU sites: it needs two sites."""
    return {
        "name": "symmetry-case",
        "sites": sites,
        "routes": [
            {"sites": [a, b], "km": km, "fiber_pairs": 1, "max_waves": 2} for a, b, km in routes
        ],
        "job": {
            "model": "tiny-4l",
            "global_batch": 8,
            "gpus": 16,
            "sync": {"mode": "synchronous"},
            "parallelism": {"tp": [4], "pp": [2], "dp": [2], "micro_batch": [1]},
        },
        "objective": {"minimize": "step_time"},
        "solver": solver,
    }


def _datas(instance: dict[str, Any], some: bool = True) -> list[InnerData]:
    problem = problem_from_data(instance)
    perf = PerfModel(problem)
    out = []
    for cfg in enumerate_configs(problem):
        chains = chain_types(problem, perf, cfg)
        if chains:
            out.append(build_inner(problem, perf, cfg, chains))
    assert out or not some
    return out


def _classes(instance: dict[str, Any]) -> list[list[list[str]]]:
    return [site_classes(d) for d in _datas(instance)]


# ----------------------------------------------------------------------------- detection


def test_two_equal_sites_are_one_class() -> None:
    inst = _instance([_site("a"), _site("b")], [("a", "b", 100)])
    assert all(cl == [["a", "b"]] for cl in _classes(inst))


@pytest.mark.parametrize(
    "b",
    [
        _site("b", gpus=12),  # more GPUs
        _site("b", power_mw=0.05),  # a power cap the other site lacks
        _site("b", pue=1.5),  # another PUE: its power and energy differ
        {**_site("b"), "gpu": "h200"},  # another GPU: its stage times differ
    ],
    ids=["gpus", "power", "pue", "gpu"],
)
def test_unequal_sites_are_no_class(b: dict[str, Any]) -> None:
    inst = _instance([_site("a"), b], [("a", "b", 100)])
    assert all(cl == [] for cl in _classes(inst))


def test_route_lengths_decide() -> None:
    # three sites at pairwise different distances: no transposition keeps the routes
    tri = _instance(
        [_site("a"), _site("b"), _site("c")], [("a", "b", 100), ("a", "c", 200), ("b", "c", 300)]
    )
    assert all(cl == [] for cl in _classes(tri))
    # a hub and three spokes, one of them longer: the two equal spokes alone (the hub's
    # routes are all different from a spoke's)
    hub = _instance(
        [_site("h"), _site("s1"), _site("s2"), _site("s3")],
        [("h", "s1", 50), ("h", "s2", 50), ("h", "s3", 80)],
    )
    assert all(cl == [["s1", "s2"]] for cl in _classes(hub))
    # all spokes equal: one class of three, the hub outside it
    hub["routes"][2]["km"] = 50
    assert all(cl == [["s1", "s2", "s3"]] for cl in _classes(hub))
    # the same with the hub named after the spokes (pairs keyed in instance order, unsorted)
    for site in hub["sites"][:1]:
        site["name"] = "x"
    for r in hub["routes"]:
        r["sites"][0] = "x"
    assert all(cl == [["s1", "s2", "s3"]] for cl in _classes(hub))


def test_a_tie_break_in_candidate_paths_breaks_the_symmetry() -> None:
    # a ring a-b-c-d-a of equal routes: the reflection (b d) maps the instance onto itself,
    # but a-c has two paths of equal latency, and the candidate order breaks the tie by
    # name (a-b-c first): (b d) would turn path 0 into path 1, so b, d are no class
    ring = _instance(
        [_site(s) for s in "abcd"],
        [("a", "b", 100), ("b", "c", 100), ("c", "d", 100), ("a", "d", 100)],
    )
    for d in _datas(ring):
        ac = d.pair_paths[("a", "c")]
        assert [p.sites for p in ac] == [("a", "b", "c"), ("a", "d", "c")]
        assert ac[0].latency_s == ac[1].latency_s
        assert not interchangeable(d, "b", "d") and not interchangeable(d, "a", "c")
        # the site data alone agree: it is the paths that decide
        assert d.site_groups["b"] == d.site_groups["d"] and d.intra[(0, "b")] == d.intra[(0, "d")]
        assert site_classes(d) == []
    # with the shortest path only the tie is still broken by name (a-b-c): the same answer
    ring["solver"] = {"paths_per_pair": 1}
    assert all(cl == [] for cl in _classes(ring))


def test_interchangeability_is_checked_on_every_shipped_symmetric_instance() -> None:
    for name, pair in [
        ("two-campus-100km", ["north", "south"]),
        ("seed-1t-two-sites", ["east", "west"]),
        ("deepseek-v3-two-sites", ["east", "west"]),
    ]:
        data = _first_data(load_instance(INSTANCES / f"{name}.yaml"))
        assert site_classes(data) == [pair], name


def _first_data(problem: Problem) -> InnerData:
    """The inner data of the instance's first configuration with a chain type."""
    perf = PerfModel(problem)
    for cfg in enumerate_configs(problem):
        chains = chain_types(problem, perf, cfg)
        if chains:
            return build_inner(problem, perf, cfg, chains)
    raise AssertionError("no configuration has a chain type")


# ----------------------------------------------------------------------------- rows


def _one_replica(instance: dict[str, Any], schedule: str = "staggered") -> dict[str, Any]:
    """The job at dp 1 (8 GPUs) over 4-GPU sites: one replica across two of them
    (staggered replicas: the MILP writes the rows only then)."""
    instance = copy.deepcopy(instance)
    for site in instance["sites"]:
        site["gpus"] = 4
    instance["job"]["gpus"] = 8
    instance["job"]["parallelism"]["dp"] = [1]
    instance["job"]["replica_schedule"] = schedule
    return instance


# a hub and four equal spokes (6,075 brute-force plans), three equal sites meshed (729)
FOUR = _one_replica(
    _instance(
        [_site("h"), *(_site(f"s{i}") for i in range(1, 5))],
        [("h", f"s{i}", 40) for i in range(1, 5)],
    )
)
THREE = _one_replica(
    _instance(
        [_site("a"), _site("b"), _site("c")], [("a", "b", 60), ("a", "c", 60), ("b", "c", 60)]
    )
)


@pytest.mark.parametrize("backend", [MilpInner, CpsatInner])
def test_rows_order_the_class_and_go_before_the_tie_break(backend: Any) -> None:
    data = _datas(FOUR)[0]
    assert site_classes(data) == [["s1", "s2", "s3", "s4"]]
    t_max = _upper_bound_time(data) * 1.001 + 1e-6
    plain = backend(data, "step_time", t_max)
    assert not any(r.startswith("symmetry.") for r in plain.rows)
    model = backend(data, "step_time", t_max, symmetry=True)
    wanted = [f"symmetry.order:s{i}:s{i + 1}" for i in range(1, 4)]
    assert [r for r in model.rows if r.startswith("symmetry.")] == wanted
    args = (30.0, 1, {}) if backend is MilpInner else (30.0, 1, 0, {})
    first = model.solve(*args, tiebreak=False)
    used = used_by_site(data, first.counts)
    assert [used[f"s{i}"] for i in range(1, 5)] == sorted(
        (used[f"s{i}"] for i in range(1, 5)), reverse=True
    )
    ref = plain.solve(*args, tiebreak=False)
    assert first.objective == pytest.approx(ref.objective, rel=1e-6)
    model.break_ties(30.0)
    assert not any(r.startswith("symmetry.") for r in model.rows)
    if backend is MilpInner:
        assert all(model.prob.get_constraint_by_name(r) is None for r in wanted)
        assert model.prob.get_constraint_by_name("site.nodes:s1") is not None


def test_permuted_start_keeps_the_rows() -> None:
    data = _datas(THREE)[0]
    t_max = _upper_bound_time(data) * 1.001 + 1e-6
    model = MilpInner(data, "step_time", t_max, symmetry=True)
    assert model.sym_classes == [["a", "b", "c"]]
    # a start on c and b (a chain type c -> b, the replica): out of the rows' order
    c = data.chains.index(("c", "b"))
    model.start_from({v.name: int(i == c) for i, v in model.n.items()})
    counts = {i: round(model.warm[v.name]) for i, v in model.n.items()}
    # moved to the sites the order wants (c -> b, b -> a: most used first, ties by name)
    assert {data.chains[i]: n for i, n in counts.items() if n} == {("b", "a"): 1}
    assert model.warm[model.u[data.chains.index(("b", "a"))].name] == 1
    # a start in order is kept as it is
    model.start_from({v.name: int(data.chains[i] == ("a", "b")) for i, v in model.n.items()})
    assert {data.chains[i] for i, v in model.n.items() if model.warm[v.name]} == {("a", "b")}


# ----------------------------------------------------------------------------- same answers


@cache
def _solve(instance_json: str, backend: str, symmetry: bool) -> tuple[float, str]:
    inst = json.loads(instance_json)
    inst.setdefault("solver", {})["symmetry"] = symmetry
    res = solve(problem_from_data(inst), backend=backend, time_limit_s=120)
    plan = res.plan.model_copy(update={"solver": None}).model_dump_json()
    return res.objective, plan


def _same_with_and_without(instance: dict[str, Any], backends: tuple[str, ...]) -> None:
    text = json.dumps(instance, sort_keys=True)
    brute = _solve(text, "brute", True)[0] if "brute" in backends else None
    for backend in (b for b in backends if b != "brute"):
        on, off = _solve(text, backend, True), _solve(text, backend, False)
        assert on[1] == off[1], f"{instance['name']} {backend}: another plan with symmetry"
        assert on[0] == off[0]
        if brute is not None:
            assert on[0] == pytest.approx(brute, rel=1e-5, abs=1e-9)


def test_milp_rows_only_without_contention_rounds() -> None:
    lockstep = _datas(_one_replica(FOUR, "lockstep"))[0]
    assert lockstep.planes is not None and site_classes(lockstep) == [["s1", "s2", "s3", "s4"]]
    t_max = _upper_bound_time(lockstep) * 1.001 + 1e-6
    milp = MilpInner(lockstep, "step_time", t_max, symmetry=True)
    cpsat = CpsatInner(lockstep, "step_time", t_max, symmetry=True)
    assert milp.sym_classes == [] and not any(r.startswith("symmetry.") for r in milp.rows)
    assert cpsat.sym_classes == [["s1", "s2", "s3", "s4"]]
    assert sum(r.startswith("symmetry.order:") for r in cpsat.rows) == 3


@pytest.mark.parametrize(
    "instance",
    [THREE, FOUR, _one_replica(THREE, "lockstep"), _one_replica(FOUR, "lockstep")],
    ids=["three-equal", "hub-four-equal", "three-equal-lockstep", "hub-four-equal-lockstep"],
)
def test_equal_sites_optimum_is_brute_force(instance: dict[str, Any]) -> None:
    assert sc.brute_plans(instance) <= 6075
    _same_with_and_without(instance, ("brute", "cpsat", "milp"))


SYMMETRIC_CASES = [
    c
    for c in sc.cases()
    if not c.infeasible
    and any(site_classes(d) for d in _datas(copy.deepcopy(c.instance), some=False))
]


def test_the_library_has_symmetric_cases() -> None:
    assert len(SYMMETRIC_CASES) >= 10


@pytest.mark.slow
@pytest.mark.parametrize("case", SYMMETRIC_CASES, ids=lambda c: c.id)
def test_library_same_plan_with_and_without_symmetry(case: sc.Case) -> None:
    # without symmetry both backends equal brute force on every library case
    # (test_solver_library.py), so the same plan with it equals brute force too
    _same_with_and_without(case.instance, ("cpsat", "milp"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["two-campus-100km", "deepseek-v3-two-sites"])
def test_shipped_same_plan_with_and_without_symmetry(name: str) -> None:
    """CP-SAT writes the same plan with and without its symmetry rows. The MILP writes none
    on these instances (lockstep contention: it breaks ties lazily, MilpInner.define_
    symmetry), so solving it twice would solve one model twice (2 x 11 s of make test on
    deepseek-v3-two-sites): that is checked on the model instead."""
    problem = load_instance(INSTANCES / f"{name}.yaml")
    data = _first_data(problem)
    assert data.planes is not None and site_classes(data)  # equal sites, lockstep contention
    t_max = _upper_bound_time(data) * 1.001 + 1e-6
    milp = MilpInner(data, "step_time", t_max, symmetry=True)
    assert milp.sym_classes == [] and not any(r.startswith("symmetry.") for r in milp.rows)
    assert CpsatInner(data, "step_time", t_max, symmetry=True).sym_classes
    _same_with_and_without(problem.instance.model_dump(mode="json", exclude_none=True), ("cpsat",))
