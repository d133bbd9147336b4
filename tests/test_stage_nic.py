"""Each stage's own WAN NIC term with a flow-routed pair (PerfModel.step's stage_bw; the
formulations' B_series >= N_series, families.stagger_works). A stage's WAN rounds run on
its own ranks' NICs (placer.sim), so a stage with a lone member at a site (whose one NIC
carries that site's shard) slows its own sync, not the other stages'. Before, every
stage's route term was at least every stage's NIC term, and each release group's NIC
phase ran in series with the whole WAN phase: up to +22% against the simulation
(tests/test_simulate.py::test_each_stage_pays_its_own_nic_term_against_the_simulation).

Here a plan of that shape is pinned in both backends on a triangle (every pair
flow-routed): the step they price, minimized and (with the exact pins of
resilience.max_slowdown) maximized, is the evaluator's."""

from __future__ import annotations

from typing import Any

import pulp
import pytest
import solver_cases as sc
from ortools.sat.python import cp_model
from sim_cases import plan as sim_plan
from test_exact_step import LOOSE, _evaluated
from test_pinned_plan import pin_cpsat, pin_milp

from placer.evaluate import evaluate
from placer.io import plan_from_data, problem_from_data
from placer.optimize.cpsat import CpsatInner
from placer.optimize.data import build_inner
from placer.optimize.driver import _upper_bound_time
from placer.optimize.milp import MilpInner
from placer.optimize.space import chain_types
from placer.perf.step import PerfModel
from placer.rules import config_of

pytestmark = pytest.mark.filterwarnings("ignore:Constructing LpVariable:DeprecationWarning")

# stage 0 at a (3) and b (2); stage 1 at a (2), b (2) and c (1): c's one member sends c's
# whole shard of stage 1 through its one NIC
GROUPS = [(2, ("a", "a")), (2, ("b", "b")), (1, ("a", "c"))]


def triangle_instance(
    gpus: dict[str, int],
    km: dict[tuple[str, str], float],
    capacity_gbps: float,
    max_sites_per_replica: int,
    resilience: bool,
) -> dict[str, Any]:
    """A dp 5 job on three sites of nodes of 4 H100s joined in a triangle (no waves to buy,
    every pair flow-routed over 2 paths), with the loose wave-survival limit when asked."""
    inst = sc.part_filled_instance(dp=5, overlap=False)  # its sites and routes replaced
    inst["sites"] = [
        {"name": s, "gpu": "h100-sxm", "gpus": g, "gpus_per_node": 4} for s, g in gpus.items()
    ]
    inst["routes"] = [
        {"sites": list(p), "km": d, "capacity_gbps": capacity_gbps, "max_waves": 0}
        for p, d in km.items()
    ]
    inst["solver"] = {
        "paths_per_pair": 2,
        "time_limit_s": 60,
        "max_sites_per_replica": max_sites_per_replica,
    }
    if resilience:
        inst["resilience"] = dict(LOOSE)
    return inst


def _instance(resilience: bool) -> dict[str, Any]:
    # routes fast enough that the NIC terms, not the routes, bound the WAN rounds
    return triangle_instance(
        {"a": 8, "b": 4, "c": 4},
        {("a", "b"): 60.0, ("b", "c"): 80.0, ("a", "c"): 120.0},
        capacity_gbps=1600,
        max_sites_per_replica=2,
        resilience=resilience,
    )


def pinned_case(instance: dict[str, Any], base: dict[str, Any], groups: list):
    """The problem, the plan `base` (its replicas placed as `groups`: (count, stage
    sites)) evaluated, its configuration's inner data, and the chain-type counts and
    nodes that pin it in a backend (pinned_step)."""
    problem = problem_from_data(instance)
    perf = PerfModel(problem)
    assert perf.any_dp_pair_routed()
    plan = plan_from_data(base)
    cfg = config_of(problem, plan)
    chains = chain_types(problem, perf, cfg)
    data = build_inner(problem, perf, cfg, chains)
    ev = evaluate(problem, plan, perf)
    assert ev.feasible, ev.violations
    counts = {chains.index(s): c for c, s in groups}
    nodes = {s: n // data.site_node_block.get(s, 1) for s, n in ev.nodes_by_site.items()}
    return problem, perf, data, counts, nodes, ev


def pinned_step(backend: str, sense: str, data, counts, nodes, constrain=None):
    """The step the backend prices for the pinned plan, minimized or (with the exact pins
    of resilience.max_slowdown) maximized, with the routing it returns and the tolerance
    to hold it to; `constrain(model)` adds rows first (the model: MilpInner, CpsatInner)."""
    if backend == "milp":
        m = MilpInner(data, "step_time", _upper_bound_time(data) * 1.001 + 1e-6)
        pin_milp(m, counts, {}, lambda s: nodes.get(s, 0))
        if constrain:
            constrain(m)
        if sense == "maximize":
            m.prob.sense = pulp.LpMaximize
            m.prob.setObjective(m.T)
        out = m._solve_once(60, 1, {})
        assert out.kind == "optimal", out
        return pulp.value(m.T) * m.ts, m.routing(), 1e-6
    c = CpsatInner(data, "step_time", _upper_bound_time(data) * 1.001 + 1e-6)
    pin_cpsat(c, counts, {}, lambda s: nodes.get(s, 0))
    if constrain:
        constrain(c)
    c.m.Maximize(c.T) if sense == "maximize" else c.m.Minimize(c.T)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 60
    assert solver.Solve(c.m) == cp_model.OPTIMAL
    return solver.Value(c.T) * c.tau, c.routing(solver), 1e-4


def _setup(resilience: bool):
    # the plan: tp 1 pp 2 dp 5 (layers 5 + 3, 8 micro-batches: the instance's optimum's
    # configuration) with its replicas placed as GROUPS, its routing the evaluator's
    base = sim_plan(1, [5, 3], [(c, list(s)) for c, s in GROUPS], 8)
    return pinned_case(_instance(resilience), base, GROUPS)


def test_the_plan_is_one_where_each_stages_own_nic_term_decides() -> None:
    """The lone member's NIC term (stage 1's) is above stage 0's own and above every
    route's time, and the exposed sync is below stage 0's NIC phase and latency in series
    with stage 1's NIC term (the old rule): the backends below price the new rule."""
    _problem, perf, _data, _counts, _nodes, ev = _setup(False)
    cfg, st = ev.config, ev.step
    hosts = [{"a": 3, "b": 2}, {"a": 2, "b": 2, "c": 1}]
    nic = [perf.wan_nic_s(cfg, k, hosts[k]) for k in range(2)]
    assert nic[1] > 1.5 * nic[0] and nic[1] > max(st.route_dp_s.values())
    intra0 = max(perf.intra_sync_s(cfg, 0, s, members=n) for s, n in hosts[0].items())
    lat0 = 2 * perf.net.pair_latency_s(ev.routing, "data_parallel", "a", "b")
    old_rule = intra0 + lat0 + nic[1]
    assert st.dp_s < old_rule - 1e-3, (st.dp_s, old_rule)


@pytest.mark.parametrize("backend", ["milp", "cpsat"])
@pytest.mark.parametrize("sense", ["minimize", "maximize"])
def test_both_backends_price_each_stages_own_nic_term(backend: str, sense: str) -> None:
    problem, perf, data, counts, nodes, ev = _setup(sense == "maximize")
    got, routing, rel = pinned_step(backend, sense, data, counts, nodes)
    want = _evaluated(problem, perf, data, counts, {}, routing)  # no waves: fixed routes
    assert got == pytest.approx(want, rel=rel), (got, want, ev.step_time_s)
