"""Both formulations are one list of constraint families (placer.optimize.families): the
same define_* methods in the same order, and every row they share named alike, so that a
row written in one backend and forgotten in the other fails here."""

from __future__ import annotations

import pytest
import solver_cases as sc

from placer.io import load_instance, problem_from_data
from placer.optimize.cpsat import CpsatInner
from placer.optimize.data import build_inner
from placer.optimize.driver import _upper_bound_time
from placer.optimize.families import FAMILIES
from placer.optimize.milp import MilpInner
from placer.optimize.space import chain_types, enumerate_configs
from placer.perf.step import PerfModel

pytestmark = pytest.mark.filterwarnings("ignore:Constructing LpVariable:DeprecationWarning")

# how each backend writes a max, a rounding or a one-hot it alone needs: the namespaces
# (the name up to the first ':') whose rows only one backend has
# (a flow-routed pair's group load min(D_g, F_r) from below: the MILP's two big-M rows on
# a binary, CP-SAT's AddMinEquality under the first one's name, dp.group_flow_lo_dem)
MILP_ONLY = ("dp.k_onehot", ".pick", ".onehot", ".active", "dp.group_flow_lo_path")
CPSAT_ONLY = (
    "dp.k_share",
    "step.time_round",
    ".capacity_ub",
    ".no_capacity",
    "exact.chain_path_off",
    "res.wan_part",
    "res.nic_scaled",
    "exact.pipe",
    "exact.dpbw",
    "exact.lat",
    "exact.intra",
    "exact.exposed",
    "exact.dp_overlap",
    "res.dp_part",
    # lockstep contention: CP-SAT's gating of a crossing's transmit time (enforcement
    # literals where the MILP writes big-M rows), its exact max, integer tick flows
    "pipe.too_slow",
    ".off",
    ".hop_on",
    ".hop_off",
    "exact.tau",
    "route.tick_flow",
    # the split flows in whole units of bytes (cpsat.flow_unit): the demand rounded up
    ".demand_round",
    # the staggered WAN phase: CP-SAT's per release group share tables and demands (the
    # MILP scales the class's demand by the group's share of its bytes) and their exact
    # rows; its exact max over the groups' terms
    "dp.pair_group",
    "exact.share_group",
    "exact.pair_off_group",
    "exact.dpst",
    # the WAN phase's NIC term: CP-SAT's element table over (host count, member count)
    "dp.nic_table",
)
# rows that exist in both but are indexed by a backend's own decomposition (the WAN
# phase's NIC term: a MILP secant per (site, stage, K, j), a CP-SAT bound per (site, stage))
INDEXED_APART = ("exact.chain_path_on", "dp.wan_nic", "res.wan_nic")


def _namespace(name: str) -> str:
    return name.split(":", 1)[0]


def _only(names: set[str], markers: tuple[str, ...]) -> bool:
    return all(any(m in _namespace(n) for m in markers) for n in names)


def _models(problem, objective: str = "step_time"):
    perf = PerfModel(problem)
    for cfg in enumerate_configs(problem)[:6]:
        chains = chain_types(problem, perf, cfg)
        if not chains:
            continue
        data = build_inner(problem, perf, cfg, chains)
        t_max = _upper_bound_time(data) * 1.001 + 1e-6
        yield cfg, MilpInner(data, objective, t_max), CpsatInner(data, objective, t_max)


def test_both_backends_define_the_same_families() -> None:
    for backend in (MilpInner, CpsatInner):
        assert [f for f in FAMILIES if callable(getattr(backend, f"define_{f}", None))] == list(
            FAMILIES
        )
        own = sorted(n[len("define_") :] for n in vars(backend) if n.startswith("define_"))
        assert own == sorted(FAMILIES), backend


CASES = [c for c in sc.cases() if not c.infeasible][:12]
INSTANCES = ["two-campus-100km", "four-metro-resilient", "three-sites-80-300-500km"]


def _check_rows(milp: MilpInner, cpsat: CpsatInner, label: str) -> None:
    m, c = set(milp.rows), set(cpsat.rows)
    assert len(m) == len(milp.rows) and len(c) == len(cpsat.rows), f"{label}: duplicate row names"
    assert all(":" in n or n in {"budget"} or "." in n for n in m | c)
    shared = lambda names: {n for n in names if not any(k in _namespace(n) for k in INDEXED_APART)}  # noqa: E731
    only_m, only_c = shared(m) - c, shared(c) - m
    assert _only(only_m, MILP_ONLY), f"{label}: rows only the MILP writes: {sorted(only_m)[:8]}"
    assert _only(only_c, CPSAT_ONLY), f"{label}: rows only CP-SAT writes: {sorted(only_c)[:8]}"
    assert {_namespace(n) for n in m if any(k in n for k in INDEXED_APART)} == {
        _namespace(n) for n in c if any(k in n for k in INDEXED_APART)
    }


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_rows_mirror_on_library_cases(case: sc.Case) -> None:
    problem = problem_from_data(case.instance)
    for cfg, milp, cpsat in _models(problem):
        _check_rows(milp, cpsat, f"{case.id} {cfg.label()}")


@pytest.mark.parametrize("name", INSTANCES)
def test_rows_mirror_on_shipped_instances(name: str) -> None:
    problem = load_instance(f"instances/{name}.yaml")
    for cfg, milp, cpsat in _models(problem):
        _check_rows(milp, cpsat, f"{name} {cfg.label()}")
