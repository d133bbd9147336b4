"""Boundaries of one chain whose messages travel a common route direction share it.

A chain s0 -> s2 -> s1 -> s1 whose s0-s2 path runs through s1 sends boundary 1's
activations (s2 -> s1) and boundary 0's gradients (s2 -> s1 -> s0) over the same route
direction. The lockstep tick prices each batch alone (PerfModel.route_tick_s); when one
is still on the route as the other is sent, the second waits for the part of the first's
transmit above its NIC serialization (PerfModel.boundary_queues, critical_path's shared
FIFO, served in the order the uncontended schedule sends them).

Oracles: the flow-level simulation (placer.sim, max-min fair sharing of the routes, which
placer did not derive from the closed form), the per-boundary evaluation the shared FIFO
must reduce to where nothing is shared or nothing waits, the plane inequality at other
points (what makes the formulations' cuts valid) and both formulations pinned to a plan
with a shared route direction.
"""

from __future__ import annotations

import pulp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model
from sim_cases import plan, problem

from placer.evaluate import evaluate
from placer.io import plan_from_data
from placer.optimize.contention import add_violated_planes
from placer.optimize.cpsat import CpsatInner
from placer.optimize.data import build_inner
from placer.optimize.driver import _upper_bound_time
from placer.optimize.milp import MIP_REL_GAP, MilpInner
from placer.optimize.space import chain_types
from placer.perf.critical_path import critical_path, service_order
from placer.perf.step import PerfModel
from placer.rules import config_of
from placer.sim import simulate

pytestmark = pytest.mark.filterwarnings("ignore:Constructing LpVariable:DeprecationWarning")

KM = 89.63655714096743  # a draw of tests/test_simulate.py's strategy (benchmarks/README.md)
CHAIN = ["s0", "s2", "s1", "s1"]


def _line_case():
    """Three sites in a line, s0 - s1 - s2; 56 chains s0 -> s2 -> s1 -> s1 on one wave
    over s1-s2: boundary 0 runs s0 -> s1 -> s2, so its gradients and boundary 1's
    activations both go s2 -> s1."""
    prob = problem(
        ["s0", "s1", "s2"],
        [("s0", "s1", KM), ("s1", "s2", KM)],
        global_batch=56 * 4,
        solver={"max_sites_per_replica": 3},  # the formulations' chain types include it
    )
    p = plan(1, [2, 2, 2, 2], [(56, CHAIN)], 4, {("s0", "s1"): 7, ("s1", "s2"): 1})
    return prob, p


def test_the_chain_shares_one_route_direction_between_two_boundaries() -> None:
    prob, p = _line_case()
    perf = PerfModel(prob)
    queues = perf.boundary_queues(tuple(CHAIN))
    assert queues is not None
    # boundary 1's activations wait where boundary 0's gradients do (s2 -> s1), and its
    # gradients where boundary 0's activations do (s1 -> s2); boundary 2 stays in s1
    assert queues[1][0] == queues[0][1]
    assert queues[1][1] == queues[0][0]
    assert len({q for pair in queues for q in pair}) == 4
    # inside one site nothing is shared
    assert perf.boundary_queues(("s0", "s0", "s1", "s1")) is None


def test_the_simulation_confirms_the_wait_on_the_shared_route_direction() -> None:
    """The closed form's pipeline is within 2% of the simulated one; with each boundary on
    its own FIFO it was 6% below (the batch sent at the turn from warm-up to steady state
    waits for the other on s2 -> s1 in the simulation)."""
    prob, p = _line_case()
    res = simulate(prob, p)
    assert res.feasible, res.violations
    perf = PerfModel(prob)
    ev = evaluate(prob, p, perf)
    cfg = config_of(prob, plan_from_data(p))
    chain = tuple(CHAIN)
    tick = perf.route_tick_s(cfg, [(56, chain)], _capacity(perf, p), None)
    ticks = perf.boundary_ticks(chain, None, tick)
    fwd, bwd, lat, tx = perf.chain_times_at(cfg, chain, None, ticks)
    alone = critical_path(fwd, bwd, lat, tx, 4).makespan_s + perf.optimizer_step_s(cfg, chain)
    assert ev.step.pipe_s == pytest.approx(res.pipe_s, rel=0.02)
    assert alone < res.pipe_s * 0.94
    assert ev.step.pipe_s > alone + 0.003  # the wait: ~4 ms on a 67 ms pipeline
    assert res.rel_diff == pytest.approx(0.0, abs=0.02)


def _capacity(perf: PerfModel, p: dict) -> dict:
    return {
        tuple(sorted(link["sites"])): perf.net.capacity_Bps(
            tuple(sorted(link["sites"])), link["waves"]
        )
        for link in p["links"]
    }


_t = st.floats(0.01, 5.0, allow_nan=False)


@st.composite
def shared_chains(draw):
    """A 1F1B or interleaved chain with two boundaries' directions on one FIFO."""
    v = draw(st.sampled_from([1, 2]))
    p = draw(st.integers(3, 5))
    m = draw(st.integers(1, 3)) * p if v > 1 else draw(st.integers(1, 3 * p))
    nb = p - 1 if v == 1 else p
    f = draw(st.lists(_t, min_size=v * p, max_size=v * p))
    b = draw(st.lists(_t, min_size=v * p, max_size=v * p))
    lat = draw(st.lists(_t, min_size=nb, max_size=nb))
    floor = draw(st.lists(_t, min_size=nb, max_size=nb))
    extra = draw(st.lists(st.floats(0.0, 20.0), min_size=nb, max_size=nb))
    extra2 = draw(st.lists(st.floats(0.0, 20.0), min_size=nb, max_size=nb))
    lat2 = draw(st.lists(_t, min_size=nb, max_size=nb))
    i, j = draw(st.lists(st.integers(0, nb - 1), min_size=2, max_size=2, unique=True))
    queues = [[k, nb + k] for k in range(nb)]
    queues[j][1] = queues[i][0]  # boundary j's gradients wait where i's activations do
    queues = [tuple(q) for q in queues]
    tx = [a + e for a, e in zip(floor, extra, strict=True)]
    tx2 = [a + e for a, e in zip(floor, extra2, strict=True)]
    return v, p, m, f, b, lat, floor, tx, lat2, tx2, queues


@settings(max_examples=200, deadline=None)
@given(case=shared_chains())
def test_the_shared_fifo_keeps_the_makespan_a_longest_path(case) -> None:
    """The planes the formulations cut with stay valid (a path of the same DAG at every
    point: the service order is fixed, the wait linear in the transmit times), the shared
    FIFO never speeds the step up, and where the route adds nothing to a message (transmit
    at its NIC floor) it costs nothing."""
    v, p, m, f, b, lat, floor, tx, lat2, tx2, queues = case
    service = service_order(f, b, lat, floor, m, v, queues)
    shared = [k for k in range(len(queues)) if queues[k][0] in service]
    (q,) = service  # one FIFO shared, holding every message of both directions once

    def streams(k: int) -> int:  # messages per micro-batch over boundary k, one way
        return 1 if v == 1 else (v if k < p - 1 else v - 1)

    back = [k for k in range(len(queues)) if queues[k][1] == q]
    assert len(service[q]) == m * (sum(map(streams, shared)) + sum(map(streams, back)))
    assert len(set(service[q])) == len(service[q])
    path = critical_path(f, b, lat, tx, m, v, queues, service, floor)
    alone = critical_path(f, b, lat, tx, m, v).makespan_s
    assert path.makespan_s >= alone - 1e-9
    const, n, lc = path.plane(tx, lat)
    other = critical_path(f, b, lat2, tx2, m, v, queues, service, floor).makespan_s
    at_other = const + sum(k * t for k, t in zip(n, tx2, strict=True))
    at_other += sum(k * t for k, t in zip(lc, lat2, strict=True))
    assert other >= at_other - 1e-9 * max(1.0, other)
    at_floor = critical_path(f, b, lat, floor, m, v, queues, service, floor).makespan_s
    assert at_floor == pytest.approx(critical_path(f, b, lat, floor, m, v).makespan_s, abs=1e-9)


def _pinned(backend: str) -> tuple[float, float]:
    """The pinned plan's step in the backend, and the evaluator's."""
    prob, p = _line_case()
    perf = PerfModel(prob)
    plan_obj = plan_from_data(p)
    ev = evaluate(prob, p, perf)
    assert ev.feasible, ev.violations
    cfg = config_of(prob, plan_obj)
    chains = chain_types(prob, perf, cfg)
    assert tuple(CHAIN) in chains
    data = build_inner(prob, perf, cfg, chains)
    assert data.planes is not None
    counts = {chains.index(tuple(g.stage_sites)): g.count for g in plan_obj.replica_groups}
    waves = {link.key: link.waves for link in plan_obj.links}
    add_violated_planes(prob, perf, cfg, data.planes, counts, waves, ev.routing)
    opt = {
        r: next(i for i, o in enumerate(data.wave_options[r]) if o.waves == waves.get(r, 0))
        for r in data.routes
    }
    if backend == "milp":
        mm = MilpInner(data, "step_time", _upper_bound_time(data) * 1.001 + 1e-6)
        for c, var in mm.n.items():
            mm.add(var == counts.get(c, 0), f"pin.n:{c}")
        for r in data.routes:
            mm.add(mm.y[(r, opt[r])] == 1, f"pin.y:{r[0]}:{r[1]}")
        out = mm._solve_once(60, 1, {})
        assert out.kind == "optimal", out
        return pulp.value(mm.T_pipe) * mm.ts, ev.step.pipe_s
    cm = CpsatInner(data, "step_time", _upper_bound_time(data) * 1.001 + 1e-6)
    for c, var in cm.n.items():
        cm.m.Add(var == counts.get(c, 0))
    for r in data.routes:
        cm.m.Add(cm.y[(r, opt[r])] == 1)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 60
    assert solver.Solve(cm.m) == cp_model.OPTIMAL
    return solver.Value(cm.T_pipe) * cm.tau, ev.step.pipe_s


@pytest.mark.parametrize("backend", ["milp", "cpsat"])
def test_both_formulations_price_the_shared_route_direction(backend: str) -> None:
    got, want = _pinned(backend)
    rel = 2 * MIP_REL_GAP if backend == "milp" else 1e-3
    assert got == pytest.approx(want, rel=rel)
