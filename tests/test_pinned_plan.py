"""Per-family agreement ("pinned plan"): fix a library case's decisions to the brute-force
optimum (replicas per chain type, waves per route, nodes per site) in each backend, solve
what is left, and check that every family's variables equal the evaluator's component of
that plan: pipeline time (pipeline, routing), intra-site sync (dp_hosting), WAN time
(dp_hosting, routing), step time (step), power per site (power) and link capex (waves).

A family that writes its rows differently from placer.perf / placer.evaluate (a missing
latency, a coefficient off by a unit, a wrong PUE) fails here with the family's name, even
when the optimum of the whole model happens to agree.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pulp
import pytest
import solver_cases as sc
from ortools.sat.python import cp_model

from placer.io import Problem, problem_from_data
from placer.optimize.contention import add_violated_planes
from placer.optimize.cpsat import CpsatInner
from placer.optimize.data import InnerData, build_inner
from placer.optimize.driver import SolveResult, _upper_bound_time
from placer.optimize.milp import MilpInner
from placer.optimize.space import chain_types
from placer.perf.step import PerfModel
from placer.rules import config_of

pytestmark = pytest.mark.filterwarnings("ignore:Constructing LpVariable:DeprecationWarning")

REL = {
    "milp": 1e-6,
    "cpsat": 1e-5,
}  # HiGHS tolerances; CP-SAT rounds each term (and the overlap windows) to its ticks: the library bound  # noqa: E501


def _eligible(case: sc.Case) -> bool:
    inst = case.instance
    mode = inst["job"]["sync"]["mode"]
    # every time component is minimized by the step-time objective (streaming hides T_wan)
    return (
        not case.infeasible
        and inst["objective"]["minimize"] == "step_time"
        and mode in ("synchronous", "diloco")
    )


CASES = [c for c in sc.cases() if _eligible(c)]


@cache
def pinned(case_id: str) -> tuple[Problem, SolveResult, InnerData, dict[int, int], dict[Any, int]]:
    case = next(c for c in CASES if c.id == case_id)
    problem = problem_from_data(case.instance)
    res = sc.brute_solve(case_id)
    assert isinstance(res, SolveResult), res
    perf = PerfModel(problem)
    cfg = config_of(problem, res.plan)
    chains = chain_types(problem, perf, cfg)
    data = build_inner(problem, perf, cfg, chains)
    counts = {chains.index(tuple(g.stage_sites)): g.count for g in res.plan.replica_groups}
    waves = {link.key: link.waves for link in res.plan.links}
    if data.planes is not None:
        # lockstep contention: the planes at the pinned plan's own point, which the driver's
        # cutting-plane loop ends with (placer.optimize.contention)
        add_violated_planes(problem, perf, cfg, data.planes, counts, waves, res.evaluation.routing)
    return problem, res, data, counts, waves


def _components(res: SolveResult) -> dict[str, float]:
    ev = res.evaluation
    assert ev.step is not None
    out = {
        "pipeline_s": ev.step.pipe_s,
        "intra_s": ev.step.intra_s,
        "wan_s": ev.step.wan_s,
        "step_s": ev.step_time_s,
        "capex_usd": ev.capex_usd,
    }
    out.update({f"power_w[{s}]": mw * 1e6 for s, mw in ev.power_mw.items()})
    return out


def _blocks(data: InnerData, res: SolveResult, site: str) -> int:
    """The formulations' node count: the evaluator's nodes in blocks of the nodes one
    replica stage spans (1 unless tp x cp x ep is wider than a node)."""
    return res.evaluation.nodes_by_site[site] // data.site_node_block.get(site, 1)


def _option(data: InnerData, r: Any, waves: int) -> int:
    return next(i for i, o in enumerate(data.wave_options[r]) if o.waves == waves)


def pin_milp(m: MilpInner, counts: dict[int, int], waves: dict[Any, int], nodes: Any) -> None:
    """A plan's decisions fixed in the MILP: replicas per chain type, the wave option of
    every route, nodes per site (`nodes(site)`, in the formulation's blocks)."""
    for c, v in m.n.items():
        m.add(v == counts.get(c, 0), f"pin.n:{c}")
    for r in m.d.routes:
        m.add(m.y[(r, _option(m.d, r, waves.get(r, 0)))] == 1, f"pin.y:{r[0]}:{r[1]}")
    for s, v in m.nodes.items():
        m.add(v == nodes(s), f"pin.nodes:{s}")


def pin_cpsat(m: CpsatInner, counts: dict[int, int], waves: dict[Any, int], nodes: Any) -> None:
    """pin_milp in CP-SAT."""
    M = m.m
    for c, v in m.n.items():
        M.Add(v == counts.get(c, 0))
    for r in m.d.routes:
        M.Add(m.y[(r, _option(m.d, r, waves.get(r, 0)))] == 1)
    for s, v in m.nodes.items():
        M.Add(v == nodes(s))


def milp_components(case_id: str) -> dict[str, float]:
    problem, res, data, counts, waves = pinned(case_id)
    m = MilpInner(data, "step_time", _upper_bound_time(data) * 1.001 + 1e-6)
    pin_milp(m, counts, waves, lambda s: _blocks(data, res, s))
    out = m._solve_once(30, 1, {})
    assert out.kind == "optimal", out
    ts = m.ts
    val = pulp.value
    # the components are bounded below by their rows and free above where they enter the
    # step only through a max (the staggered sync; T_dpbw not at all when the last release
    # group prices its routes apart): their least values at the pinned step, as for CP-SAT
    m.add(m.T <= val(m.T) * (1 + 1e-9) + 1e-9, "pin.T")
    m.prob.setObjective(m.T_intra + m.T_dpbw + m.T_lat)
    out = m._solve_once(30, 1, {})
    assert out.kind == "optimal", out
    got = {
        "pipeline_s": val(m.T_pipe) * ts,
        "intra_s": val(m.T_intra) * ts,
        "wan_s": (val(m.T_dpbw) + val(m.T_lat)) * ts,
        "step_s": val(m.T) * ts,
        "capex_usd": val(m.capex),
    }
    got.update({f"power_w[{s}]": val(e) for s, e in m.power_w.items()})
    return got


def cpsat_components(case_id: str) -> dict[str, float]:
    problem, res, data, counts, waves = pinned(case_id)
    m = CpsatInner(data, "step_time", _upper_bound_time(data) * 1.001 + 1e-6)
    M = m.m
    pin_cpsat(m, counts, waves, lambda s: _blocks(data, res, s))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 30
    assert solver.Solve(M) == cp_model.OPTIMAL
    # the components are bounded below by their rows and free above where they enter the
    # step only through a max (the staggered sync): at the pinned step, their least values
    # are what the families price (as HiGHS' vertex has them)
    M.Add(m.T == solver.Value(m.T))
    M.Minimize(m.T_intra + m.T_dpbw + m.T_lat)
    assert solver.Solve(M) == cp_model.OPTIMAL
    tau = m.tau
    got = {
        "pipeline_s": solver.Value(m.T_pipe) * tau,
        "intra_s": solver.Value(m.T_intra) * tau,
        "wan_s": (solver.Value(m.T_dpbw) + solver.Value(m.T_lat)) * tau,
        "step_s": solver.Value(m.T) * tau,
        "capex_usd": float(solver.Value(m.capex)),
        "tick": tau,
    }
    # power: CP-SAT has no power variable, only the site.power rows (milliwatts); read the
    # row's own coefficients from the model and evaluate them at the solution
    proto, values = M.Proto(), solver.ResponseProto().solution
    for ct in proto.constraints:
        if ct.name.startswith("site.power:"):
            mw = sum(
                coef * values[var]
                for var, coef in zip(ct.linear.vars, ct.linear.coeffs, strict=True)
            )
            got[f"power_w[{ct.name.split(':', 1)[1]}]"] = mw / 1000
    return got


def test_cases_exercise_every_family() -> None:
    comps = [_components(pinned(c.id)[1]) for c in CASES]
    assert len(CASES) >= 3
    for key in ("pipeline_s", "intra_s", "wan_s", "capex_usd"):
        assert any(c[key] > 0 for c in comps), key
    assert any(len([k for k in c if k.startswith("power_w")]) >= 2 for c in comps)


@pytest.mark.parametrize("backend", ["milp", "cpsat"])
@pytest.mark.parametrize("case_id", [c.id for c in CASES])
def test_families_equal_the_evaluator(case_id: str, backend: str) -> None:
    _, res, _data, _, _ = pinned(case_id)
    want = _components(res)
    got = (milp_components if backend == "milp" else cpsat_components)(case_id)
    # time: relative to the step (a component may be zero); CP-SAT rounds each time up to
    # its tick, capex per wave option to the dollar and power per term up to a milliwatt
    step = want["step_s"]
    tick = got.pop("tick", 0.0)  # CP-SAT counts time in ticks, each time rounded up to one
    for key, value in got.items():
        if key.endswith("_s"):
            tol = max(REL[backend] * step, 2 * tick)
            assert value == pytest.approx(want[key], rel=REL[backend], abs=tol), (
                key,
                value,
                want[key],
            )
        elif key == "capex_usd":
            assert value == pytest.approx(want[key], abs=0.5 * max(1, len(res.plan.links))), (
                key,
                value,
                want[key],
            )
        else:
            assert value == pytest.approx(want[key], rel=1e-9, abs=0.01), (key, value, want[key])
    if backend == "milp":  # every site has a power expression in the MILP
        assert {k for k in got if k.startswith("power_w")} == {
            k for k in want if k.startswith("power_w")
        }


@pytest.mark.parametrize("waves", [126, 128])
def test_milp_prices_a_pinned_plan_at_its_step_under_lockstep_contention(waves: int) -> None:
    """seed-1t-two-sites (64 chains east -> west sharing the route at every tick), its
    optimum's layout pinned at 126 and 128 waves, with the contention planes at its point
    (what the driver's cutting-plane loop ends with): the MILP's step is the evaluator's to
    MIP_REL_GAP. With the transmit rows' big at t_max, HiGHS' integrality tolerance let the
    126-wave plan through 1.1e-6 below its step (a chain's u at 1 - 1.2e-7), and the MILP
    called it optimal over the 128-wave optimum (milp._define_ticks, theta_max)."""
    from pathlib import Path

    from placer.evaluate import evaluate
    from placer.io import load_instance, plan_from_data
    from placer.optimize.milp import MIP_REL_GAP

    problem = load_instance(
        Path(__file__).resolve().parents[1] / "instances/seed-1t-two-sites.yaml"
    )
    data_plan = {
        "instance": problem.name,
        "parallelism": {"tp": 8, "pp": 32, "dp": 32, "micro_batch": 1},
        "stage_layers": [4] * 32,
        "replica_groups": [{"count": 32, "stage_sites": ["east"] * 16 + ["west"] * 16}],
        "links": [{"sites": ["east", "west"], "waves": waves, "optic": "800zr"}],
        "sync_mode": "synchronous",
    }
    ev = evaluate(problem, data_plan)
    assert ev.feasible, ev.violations
    plan = plan_from_data(data_plan)
    perf = PerfModel(problem)
    cfg = config_of(problem, plan)
    chains = chain_types(problem, perf, cfg)
    data = build_inner(problem, perf, cfg, chains)
    counts = {chains.index(tuple(g.stage_sites)): g.count for g in plan.replica_groups}
    link_waves = {link.key: link.waves for link in plan.links}
    assert data.planes is not None
    add_violated_planes(problem, perf, cfg, data.planes, counts, link_waves, ev.routing)
    m = MilpInner(data, "step_time", _upper_bound_time(data) * 1.001 + 1e-6)
    for c, v in m.n.items():
        m.add(v == counts.get(c, 0), f"pin.n:{c}")
    for r in data.routes:
        m.add(m.y[(r, _option(data, r, link_waves.get(r, 0)))] == 1, f"pin.y:{r[0]}:{r[1]}")
    out = m._solve_once(60, 1, {})
    assert out.kind == "optimal", out
    assert pulp.value(m.T) * m.ts == pytest.approx(ev.step_time_s, rel=2 * MIP_REL_GAP)
