"""Issue 12 item 4: the configuration bounds and presolve prunes that make large spaces
tractable are valid, checked against brute force on the configurations where they bite.

A bound that is not a true lower bound of its configuration's optimum gives a false
`optimal`; the backends-agree tests cannot see it (brute force runs through the same
pruning), so each configuration is brute-forced on its own here.
"""

from __future__ import annotations

import pytest
import solver_cases as sc

import placer.optimize.driver as drv
from placer.io import problem_from_data
from placer.optimize.brute import brute_inner
from placer.optimize.capacity import capacity_bound
from placer.optimize.data import build_inner
from placer.optimize.driver import bound_shape, prepare_candidates, slow_slot_bound, stage_hosts
from placer.optimize.presolve import MEMORY_DROP, presolve, site_caps
from placer.optimize.space import SpaceReport, chain_types, enumerate_configs
from placer.perf.flops import config_stage_memory_bytes
from placer.perf.step import PerfModel, balanced_stage_layers
from placer.rules import site_gpus_per_node


def _space(inst: dict):
    problem = problem_from_data(inst)
    perf = PerfModel(problem)
    report = SpaceReport()
    configs = enumerate_configs(problem, report, perf)
    caps = site_caps(problem, perf.net)
    return problem, perf, report, presolve(problem, configs, caps, report), caps


def _slow_slot_bounds(problem, perf, cfg, caps, monkeypatch):
    """(stage hosts, the pigeonhole slow-slot bound, the one-slot bound it replaced:
    SLOW_SETS = 0) of a configuration."""
    hosts = stage_hosts(problem, perf, cfg, SpaceReport())
    assert hosts is not None
    pigeon = slow_slot_bound(problem, perf, cfg, hosts, caps)
    with monkeypatch.context() as m:
        m.setattr(drv, "SLOW_SETS", 0)
        one = slow_slot_bound(problem, perf, cfg, hosts, caps)
    return hosts, pigeon, one


_OPTIMA: dict[tuple[str, object], float | None] = {}  # (instance name, configuration)


def _config_optimum(problem, perf, cfg) -> float | None:
    """The configuration's own optimum step time, by exhaustive search (None: no plan);
    once per instance and configuration (the tests below share them)."""
    key = (problem.name, cfg)
    if key not in _OPTIMA:
        data = build_inner(problem, perf, cfg, chain_types(problem, perf, cfg))
        sol = brute_inner(problem, perf, data, "step_time") if data.chains else None
        _OPTIMA[key] = None if sol is None else sol.objective
    return _OPTIMA[key]


SLOW_SLOT_CASES = [c for c in sc.UNEVEN_SPLIT_CASES] + [
    sc.Case(
        "split-h100-b200-dp2",
        sc.mixed_gpu_pair("case-slow-slot", ("h100-sxm", "b200"), dp=2, site_gpus=(12, 4)),
    ),
]


@pytest.mark.parametrize("case", SLOW_SLOT_CASES, ids=lambda c: c.id)
def test_slow_slot_bound_is_below_every_configuration_optimum(case: sc.Case) -> None:
    """With the power caps the bound counts the fast GPUs' groups (driver.slow_slot_bound);
    on every configuration where that raises the bound, brute force's optimum of that
    configuration is not below it."""
    problem, perf, report, cfgs, caps = _space(case.instance)
    plain = {
        c.cfg: c.lower_bound for c in prepare_candidates(problem, perf, cfgs, report, "step_time")
    }
    capped = prepare_candidates(problem, perf, cfgs, report, "step_time", caps=caps)
    raised = [c for c in capped if c.lower_bound > plain[c.cfg] * (1 + 1e-12)]
    assert raised, "the fast GPUs hold every replica stage: the bound is not exercised"
    for cand in raised:
        opt = _config_optimum(problem, perf, cand.cfg)
        if opt is not None:
            assert cand.lower_bound <= opt * (1 + 1e-9), (cand.cfg.label(), cand.lower_bound, opt)


def test_slow_slot_bound_prunes_a_configuration_the_plain_bound_keeps() -> None:
    """Pruning happens: some configuration's raised bound is above the instance's optimum
    while the plain pipeline bound is below it, so the search skips a solve it needed."""
    pruned = 0
    for case in SLOW_SLOT_CASES:
        problem, perf, report, cfgs, caps = _space(case.instance)
        optima = [o for o in (_config_optimum(problem, perf, c) for c in cfgs) if o is not None]
        best = min(optima)
        plain = {
            c.cfg: c.lower_bound
            for c in prepare_candidates(problem, perf, cfgs, report, "step_time")
        }
        for c in prepare_candidates(problem, perf, cfgs, report, "step_time", caps=caps):
            if plain[c.cfg] < best <= c.lower_bound:
                pruned += 1
    assert pruned >= 1


def _capacity_case(name: str, gpus: tuple[str, str], dp: int, site_gpus: tuple[int, int]) -> dict:
    """A B200 site of one tp-4 group beside a slower site of many, a 4-layer model heavy
    enough that compute, not communication, sets the step: most of the pp 2 x dp replica
    stages must run on the slow GPU, which one slow slot (slow_slot_bound) undercounts."""
    inst = sc.mixed_gpu_pair(name, gpus, global_batch=4 * dp, dp=dp, site_gpus=site_gpus)
    inst["job"]["model"] = {
        "name": "capacity-4l",
        "layers": 4,
        "hidden": 8192,
        "heads": 64,
        "vocab": 1024,
        "seq_len": 8192,
    }
    return inst


CAPACITY_CASES = [
    _capacity_case("case-capacity-h100", ("h100-sxm", "b200"), 3, (20, 4)),
    _capacity_case("case-capacity-a100", ("a100-80g", "b200"), 4, (28, 4)),
]


@pytest.mark.parametrize("inst", CAPACITY_CASES, ids=lambda i: i["name"])
def test_capacity_bound_is_below_every_configuration_optimum(
    inst: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capacity bound (placer.optimize.capacity: the average replica over a fractional
    assignment of stages to the GPU kinds' powered groups) is never above brute force's
    optimum of its configuration, and it is above the one-slow-slot bound (SLOW_SETS 0)
    where the fast GPUs hold one stage slot of 2 x dp (so the test exercises more than
    that bound); the pigeonhole slow-slot bound is below the optimum too."""

    problem, perf, _report, cfgs, caps = _space(inst)
    kinds = {s.name: (s.gpu, site_gpus_per_node(problem, s.name)) for s in problem.instance.sites}
    assert cfgs
    for cfg in cfgs:
        hosts, pigeon, slow = _slow_slot_bounds(problem, perf, cfg, caps, monkeypatch)
        cap = capacity_bound(problem, perf, cfg, hosts, caps, kinds)
        opt = _config_optimum(problem, perf, cfg)
        assert opt is not None
        assert slow * 1.02 < cap <= opt * (1 + 1e-9), (cfg.label(), slow, cap, opt)
        assert pigeon <= opt * (1 + 1e-9), (cfg.label(), pigeon, opt)
    # and through the driver: the candidates' bounds carry it
    for cand in prepare_candidates(problem, perf, cfgs, SpaceReport(), "step_time", caps=caps):
        assert cand.lower_bound <= _config_optimum(problem, perf, cand.cfg) * (1 + 1e-9)


def test_capacity_bound_survives_a_milp_with_other_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """HiGHS keeps one thread scheduler per process: the capacity LP asked for one thread
    and, after a two-thread MILP in the same process, every LP failed and the bound fell to
    0 (valid, but lost: make test's parallel pass). The LP now takes the scheduler as is."""
    from pathlib import Path

    from placer.io import load_instance
    from placer.optimize.driver import solve

    root = Path(__file__).resolve().parent.parent
    solve(load_instance(root / "instances" / "two-campus-100km.yaml"), backend="milp", threads=2)
    problem, perf, _report, cfgs, caps = _space(CAPACITY_CASES[0])
    kinds = {s.name: (s.gpu, site_gpus_per_node(problem, s.name)) for s in problem.instance.sites}
    hosts = stage_hosts(problem, perf, cfgs[0], SpaceReport())
    monkeypatch.setattr("placer.optimize.driver.SLOW_SETS", 0)  # the one-slow-slot bound
    assert capacity_bound(problem, perf, cfgs[0], hosts, caps, kinds) > slow_slot_bound(
        problem, perf, cfgs[0], hosts, caps
    )


def test_bounds_are_shared_across_sync_policies_only() -> None:
    """A configuration's bound with several sync modes on offer equals its bound when its
    mode is the only one (the bound is computed once per bound_shape), and bound_shape
    keeps everything but the policy."""
    inst = sc.mixed_gpu_pair("case-modes", dp=2, site_gpus=(4, 12))
    inst["job"]["sync"] = {"mode": ["synchronous", "diloco", "streaming-diloco"], "every_steps": 10}
    problem, perf, report, cfgs, caps = _space(inst)
    together = {
        c.cfg: c.lower_bound
        for c in prepare_candidates(problem, perf, cfgs, report, "step_time", caps=caps)
    }
    assert len({c.sync_mode for c in together}) == 3
    for cfg, lb in together.items():
        alone = prepare_candidates(problem, perf, [cfg], SpaceReport(), "step_time", caps=caps)
        assert alone[0].lower_bound == lb
        shape = bound_shape(cfg)
        assert (shape.tp, shape.pp, shape.dp, shape.stage_layers) == (
            cfg.tp,
            cfg.pp,
            cfg.dp,
            cfg.stage_layers,
        )


def _hall_instance(seq_len: int) -> dict:
    """Two B200 sites of one tp-4 group each and an A100 site of four groups, a 4-layer
    model whose every stage at this sequence length fits a B200 (192 GB) but no A100
    (80 GB): pp 2 dp 1 needs two B200 groups, one per stage, and fits; pp 2 dp 2 needs two
    per stage (each stage alone passes the per-stage check) and four in all."""
    inst = sc.mixed_gpu_pair("case-hall", ("b200", "a100-80g"), site_gpus=(4, 16))
    inst["sites"].append({"name": "s2", "gpu": "b200", "gpus": 4, "gpus_per_node": 4})
    inst["routes"].append({"sites": ["s1", "s2"], "km": 10, "fiber_pairs": 1, "max_waves": 2})
    inst["routes"].append({"sites": ["s0", "s2"], "km": 10, "fiber_pairs": 1, "max_waves": 2})
    job = inst["job"]
    job.pop("gpus")
    job["global_batch"] = 4
    job["model"] = {
        "name": "hall-4l",
        "layers": 4,
        "hidden": 8192,
        "heads": 64,
        "vocab": 1024,
        "seq_len": seq_len,
    }
    job["parallelism"] = {
        "tp": [4],
        "pp": [2],
        "dp": [1, 2],
        "micro_batch": [1],
        "stage_layers": "even",
    }
    return inst


def _stage_memories_gb(inst: dict) -> list[float]:
    problem = problem_from_data(inst)
    cfgs = enumerate_configs(problem, SpaceReport(), PerfModel(problem))
    return [
        config_stage_memory_bytes(problem.model, c, k)["total"] / 1e9
        for c in cfgs
        for k in range(c.pp)
    ]


def test_hall_condition_drops_only_configurations_without_a_plan() -> None:
    """presolve's Hall check (a set of stages needs dp groups each among the GPU types that
    hold them) drops configurations that the per-stage check keeps; brute force finds no
    plan in any configuration dropped, and a plan in those kept."""
    reserve = problem_from_data(_hall_instance(256)).catalog.memory.reserve_gb
    inst = None
    for seq in range(491_520, 1_048_576, 32_768):
        mems = _stage_memories_gb(_hall_instance(seq))
        if min(mems) > 80 - reserve and max(mems) < 192 - reserve:
            inst = _hall_instance(seq)
            break
    assert inst is not None, "no sequence length puts every stage between 80 and 192 GB"
    problem, perf, report, kept, caps = _space(inst)
    cfgs = enumerate_configs(problem, SpaceReport(), perf)
    dropped = [c for c in cfgs if c not in kept]
    assert report.dropped.get(MEMORY_DROP, 0) >= 1 and dropped
    for cfg in dropped:
        assert _config_optimum(problem, perf, cfg) is None, cfg.label()
    assert kept and all(_config_optimum(problem, perf, c) is not None for c in kept)


MESSAGE_FLOOR_CASES = [
    sc.interleave_instance(20.0),  # pp 4, v 1 and 2: boundaries and the wrap cross the route
    sc.uneven_chunk_instance(20.0),  # uneven interleaved chunks
    sc.mixed_gpu_pair("case-floor-mixed", ("a100-80g", "b200"), dp=2, site_gpus=(4, 12)),
]


@pytest.mark.parametrize("inst", MESSAGE_FLOOR_CASES, ids=lambda i: i["name"])
def test_pipeline_bound_with_message_floor_is_exact_on_one_site_chains(inst: dict) -> None:
    """PerfModel.pipeline_lower_bound charges every pipeline message its floor
    (message_floor: the fabric latency and the fastest NIC's serialization). On a chain
    inside one site every message is exactly that, so the bound of that chain alone is its
    1F1B (interleaved) time; on a chain across sites it is not above the chain's time; and
    the floor is not zero (the bound without it is lower), so the test would catch a floor
    above what a message costs, or one that is lost."""
    problem = problem_from_data(inst)
    perf = PerfModel(problem)
    report = SpaceReport()
    one_site = across = raised = 0
    for cfg in enumerate_configs(problem, report, perf):
        for chain in chain_types(problem, perf, cfg):
            lb, t = perf.pipeline_lower_bound(cfg, [chain]), perf.chain_time(cfg, chain)
            if len(set(chain)) == 1:
                assert lb == pytest.approx(t, rel=1e-12), (cfg.label(), chain)
                one_site += 1
            else:
                assert lb <= t * (1 + 1e-12), (cfg.label(), chain, lb, t)
                across += 1
            if cfg.pp > 1 and lb > perf.chain_time(cfg, chain, with_comm=False) * (1 + 1e-9):
                raised += 1
    assert one_site and across and raised


def test_capacity_bound_counts_the_message_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The capacity bound's rows charge one micro-batch's 2 (S - 1) crossings and rank k's
    2 k at the message floor d: the bound rises by at most 2 (S - 1) d over the bound
    without the floor, by that much where a crossing row binds, and stays below brute
    force's optimum (test_capacity_bound_is_below_every_configuration_optimum checks
    every configuration)."""
    problem, perf, _report, cfgs, caps = _space(CAPACITY_CASES[0])
    kinds = {s.name: (s.gpu, site_gpus_per_node(problem, s.name)) for s in problem.instance.sites}
    raised = 0
    for cfg in cfgs:
        hosts = stage_hosts(problem, perf, cfg, SpaceReport())
        lat, tx = perf.message_floor(cfg, set().union(*hosts))
        most = 2 * (cfg.virtual_stages * cfg.pp - 1) * (lat + tx)
        with_floor = capacity_bound(problem, perf, cfg, hosts, caps, kinds)
        with monkeypatch.context() as mp:
            mp.setattr(PerfModel, "message_floor", lambda self, cfg, sites: (0.0, 0.0))
            without = capacity_bound(problem, perf, cfg, hosts, caps, kinds)
        assert without <= with_floor <= without + most * (1 + 1e-6)
        assert with_floor <= _config_optimum(problem, perf, cfg) * (1 + 1e-9)
        raised += with_floor > without + most * (1 - 1e-3)
    assert raised


def test_two_pass_bounding_gives_the_capped_bounds_or_prunes_by_the_plain_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """driver._prepare_until bounds every configuration plainly first, then raises the
    bounds (slow slot, capacity) smallest plain bound first. With no incumbent every bound
    ends as prepare_candidates gives it with the caps; with an incumbent the refinement
    stops at the first plain bound no better than it, and every candidate left unrefined
    has a plain bound at or above the incumbent (it is pruned either way), every refined
    one the capped bound."""
    import math

    from placer.optimize import driver
    from placer.optimize.driver import _prepare_until

    monkeypatch.setattr(driver, "PREPARE_CHUNK", 1)  # one configuration per chunk
    problem, perf, report, cfgs, caps = _space(CAPACITY_CASES[1])
    capped = {
        c.cfg: c.lower_bound
        for c in prepare_candidates(problem, perf, cfgs, SpaceReport(), "step_time", caps=caps)
    }
    plain = {
        c.cfg: c.lower_bound
        for c in prepare_candidates(problem, perf, cfgs, SpaceReport(), "step_time")
    }
    assert any(capped[c] > plain[c] * 1.01 for c in cfgs)  # the caps raise some bound
    full, left = _prepare_until(
        problem, perf, cfgs, SpaceReport(), "step_time", math.inf, caps=caps
    )
    assert left == 0 and {c.cfg: c.lower_bound for c in full} == capped
    assert not any(c.pending for c in full)
    inc = sorted(plain.values())[len(plain) // 2]  # half the plain bounds are below it
    seen: list[float] = []
    part, _ = _prepare_until(
        problem,
        perf,
        cfgs,
        SpaceReport(),
        "step_time",
        math.inf,
        caps=caps,
        incumbent=lambda: inc,
        on_refined=lambda new: seen.extend(c.lower_bound for c in new),
    )
    assert seen and any(c.pending for c in part)
    for c in part:
        if c.pending:
            assert c.lower_bound == plain[c.cfg] >= inc * (1 - 1e-9)
        else:
            assert c.lower_bound == capped[c.cfg]


@pytest.mark.parametrize("dp", [4, 6, 9, 13, 16])
def test_least_intra_members_is_below_every_member_count(dp: int) -> None:
    """The configuration bound's NIC phase (driver._pipe_intra_bound) takes its min over the
    member counts some host must hold from two counts (driver._least_intra_members), not
    from all of them: on part-filled sites (q = 4 replicas a node) that min is at or below
    intra_sync_s at every count n0 .. dp, for one to three hosts, and equal to it where the
    bound's whole-node count is itself a count a host can hold (a shortcut above the true
    min would be an invalid bound: a false `optimal`)."""
    from placer.optimize.driver import _least_intra_members

    inst = sc.part_filled_instance(100.0, dp=dp)
    inst["job"]["parallelism"]["pp"] = [1]
    inst["job"]["gpus"] = dp
    inst["job"]["global_batch"] = 4 * dp
    problem, perf, report, configs, _ = _space(inst)
    checked = 0
    for cfg in configs:
        for site in (s.name for s in problem.instance.sites):
            q = perf.node_fill_q(cfg, site)
            if not q:
                continue
            for hosts in (1, 2, 3):
                n0 = -(-cfg.dp // hosts)
                exact = min(perf.intra_sync_s(cfg, 0, site, n) for n in range(n0, cfg.dp + 1))
                short = min(
                    perf.intra_sync_s(cfg, 0, site, n)
                    for n in _least_intra_members(cfg.dp, hosts, q)
                )
                assert short <= exact * (1 + 1e-12)
                if all(n is None or n <= cfg.dp for n in _least_intra_members(cfg.dp, hosts, q)):
                    assert short == pytest.approx(exact, rel=1e-12)
                checked += 1
    assert checked >= 6


def _pigeonhole_case(name: str, gpus: tuple[str, str], pp: int, layers: int) -> dict:
    """tp 4, dp 2, pp stages: the fast site holds dp = 2 of the 2 pp replica stages, so
    some replica runs at most one rank there (slow_slot_bound's pigeonhole) and pp - 1 on
    the slow GPU; one slow slot counts only one of them."""
    inst = sc.mixed_gpu_pair(name, gpus, global_batch=8, dp=2, site_gpus=(4 * pp * 2, 8))
    inst["job"]["parallelism"]["pp"] = [pp]
    inst["job"]["gpus"] = 4 * pp * 2
    inst["job"]["model"] = {
        "name": f"pigeon-{layers}l",
        "layers": layers,
        "hidden": 8192,
        "heads": 64,
        "vocab": 1024,
        "seq_len": 8192,
    }
    return inst


PIGEONHOLE_CASES = [
    _pigeonhole_case("case-pigeon-h100-pp3", ("h100-sxm", "b200"), 3, 6),
    _pigeonhole_case("case-pigeon-a100-pp4", ("a100-80g", "b200"), 4, 4),
]


@pytest.mark.parametrize("inst", PIGEONHOLE_CASES, ids=lambda i: i["name"])
def test_slow_slot_bound_counts_every_forced_slow_rank(
    inst: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the fast GPUs' groups g < pp x dp some replica has at least pp - floor(g / dp)
    ranks on slower GPUs (driver.slow_slot_bound): the bound is below brute force's optimum
    of every configuration, and on the even split above the one-slow-slot bound (SLOW_SETS
    0 lowers the set size to 1) and within 1.5x of the optimum (a bound 1.5x too large
    would exceed it)."""

    problem, perf, _report, cfgs, caps = _space(inst)
    assert cfgs
    even = [c for c in cfgs if c.stage_layers == balanced_stage_layers(sum(c.stage_layers), c.pp)]
    assert even
    for cfg in cfgs:
        hosts, new, one = _slow_slot_bounds(problem, perf, cfg, caps, monkeypatch)
        opt = _config_optimum(problem, perf, cfg)
        assert opt is not None
        assert one <= new <= opt * (1 + 1e-9), (cfg.label(), one, new, opt)
        if cfg in even:  # tight enough there that 1.5x the bound would exceed the optimum
            assert 1.5 * new > opt and new > one * 1.02, (cfg.label(), one, new, opt)
    for cand in prepare_candidates(problem, perf, cfgs, SpaceReport(), "step_time", caps=caps):
        assert cand.lower_bound <= _config_optimum(problem, perf, cand.cfg) * (1 + 1e-9)
