"""Interleaved 1F1B (issue 11 item 2): plans carry `parallelism.virtual_stages`, the
optimizer chooses it, the closed form prices it and the simulator checks it.

Oracles: hand arithmetic (the bubble (p - 1)/(v m) of Narayanan et al. SC21; Megatron-LM's
interleaved memory penalty 1 + (p - 1)/(p v)); the schedule itself (in-flight chunks are
counted from interleaved_order, independently of the closed form in flops.py); the
whole-job simulator (placer.sim, an event loop over every transfer); exhaustive search
(the brute backend) for the optimizer's choice of v.
"""

from __future__ import annotations

import json
import math

import pytest
import solver_cases as sc
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sim_cases import SMALL_MODEL, plan, problem
from typer.testing import CliRunner

from placer.cli import app
from placer.errors import InputError
from placer.evaluate import evaluate
from placer.io import plan_from_data, problem_from_data
from placer.optimize.driver import solve
from placer.optimize.space import SpaceReport, enumerate_configs
from placer.outputs.launch import (
    build_layout,
    megatron_files,
    parse_megatron_args,
    torchtitan_settings,
)
from placer.perf.critical_path import interleaved_order
from placer.perf.flops import config_stage_memory_bytes, in_flight_chunks
from placer.perf.step import PerfModel
from placer.rules import config_of
from placer.sim import simulate

pytestmark = pytest.mark.filterwarnings("ignore:Constructing LpVariable:DeprecationWarning")


def _with_v(p: dict, v: int) -> dict:
    p["parallelism"]["virtual_stages"] = v
    return p


# ----------------------------------------------------------------------------- closed form


@pytest.mark.parametrize("v", [1, 2, 4])
def test_interleaved_bubble_is_p_minus_1_over_v_m_of_the_ideal(v: int) -> None:
    """One site, 4 ranks of 4 layers, m = 8, a vocabulary of 8 (no LM-head skew): the
    evaluator's bubble is (p - 1)/(v m) of the ideal m (f + b) (SC21 section 2.2)."""
    model = {**SMALL_MODEL, "layers": 16, "vocab": 8}
    prob = problem(["a"], [], global_batch=8, model=model)
    ev = evaluate(prob, _with_v(plan(8, [4, 4, 4, 4], [(1, ["a"] * 4)], 8), v))
    assert ev.feasible, ev.violations
    b = ev.breakdown
    ideal = b["compute_s"] + b["memory_bound_s"] + b["tp_comm_s"]  # m (f + b) of one rank
    assert b["bubble_s"] / ideal == pytest.approx(3 / (v * 8), rel=2e-3)
    assert sum(b.values()) == pytest.approx(ev.step_time_s, rel=1e-12)


def test_chunk_times_add_up_to_the_stage() -> None:
    """A rank's v chunks do its stage's work: the LM head on the last chunk of the last
    rank, the rest split evenly (Megatron-Core's layer offsets)."""
    prob = problem(["a"], [], global_batch=8)
    cfg = config_of(prob, plan_from_data(_with_v(plan(8, [4, 4], [(1, ["a"] * 2)], 8), 2)))
    perf = PerfModel(prob)
    stage, chunks = perf.stage_times(cfg, "h100-sxm"), perf.chunk_times(cfg, "h100-sxm")
    assert cfg.chunk_layers == (2, 2, 2, 2)
    for k in range(2):
        assert chunks[k].fwd + chunks[k + 2].fwd == pytest.approx(stage[k].fwd, rel=1e-12)
        assert chunks[k].bwd + chunks[k + 2].bwd == pytest.approx(stage[k].bwd, rel=1e-12)
    assert chunks[3].fwd > chunks[1].fwd  # the LM head sits on model stage 3 only


# ----------------------------------------------------------------------------- memory


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [1, 2, 3, 4])
@pytest.mark.parametrize("groups", [1, 2, 3])
def test_in_flight_chunks_are_what_the_schedule_holds(p: int, v: int, groups: int) -> None:
    """The peak of (forwards run - backwards run) over each rank's op order."""
    m = groups * p
    for rank in range(p):
        live = peak = 0
        for kind, _, _ in interleaved_order(p, m, v, rank):
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        assert in_flight_chunks(p, m, v, rank) == peak


def test_first_rank_pays_megatrons_interleaving_penalty() -> None:
    """Rank 0 of p = 4, v = 2: 2 (p - 1) + (v - 1) p + 1 = 11 chunks of half a stage, i.e.
    p (1 + (p - 1)/(p v)) = 5.5 stages' activations against p = 4 without interleaving
    (Megatron-LM theoretical_memory_usage: interleaved_schedule_memory_penalty)."""
    prob = problem(["a"], [], global_batch=8)
    acts = {}
    for v in (1, 2):
        cfg = config_of(
            prob, plan_from_data(_with_v(plan(8, [2, 2, 2, 2], [(1, ["a"] * 4)], 8), v))
        )
        acts[v] = config_stage_memory_bytes(prob.model, cfg, 0)["activations"]
    assert acts[2] / acts[1] == pytest.approx((1 + 3 / (4 * 2)), rel=1e-12)


def _tight_memory_problem(gb: float):
    """pp 4 on one site with HBM reserve set so that `gb` GB are usable per GPU."""
    data = {
        "name": "il-memory",
        "sites": [{"name": "a", "gpu": "h100-sxm", "gpus": 64}],
        "job": {
            "model": {**SMALL_MODEL, "layers": 8, "seq_len": 8192},
            "global_batch": 8,
            "recompute": "none",
            "parallelism": {"tp": [1], "pp": [4], "dp": [1], "micro_batch": [1]},
        },
    }
    hbm = problem_from_data(data).catalog.gpus["h100-sxm"].hbm_gb
    data["catalog"] = {"memory": {"reserve_gb": hbm - gb}}
    return data


def test_a_plan_that_fits_only_without_interleaving_is_rejected_with_it() -> None:
    data = _tight_memory_problem(80.0)
    prob = problem_from_data(data)
    base = plan(1, [2, 2, 2, 2], [(1, ["a"] * 4)], 8)
    need = {}
    for v in (1, 2):
        cfg = config_of(prob, plan_from_data(_with_v(json.loads(json.dumps(base)), v)))
        need[v] = config_stage_memory_bytes(prob.model, cfg, 0)["total"] / 1e9
    assert need[1] < need[2]
    data = _tight_memory_problem((need[1] + need[2]) / 2)
    prob = problem_from_data(data)
    ok = evaluate(prob, _with_v(json.loads(json.dumps(base)), 1))
    bad = evaluate(prob, _with_v(json.loads(json.dumps(base)), 2))
    assert ok.feasible, ok.violations
    assert not bad.feasible
    assert [v.where for v in bad.violations if v.kind == "memory"] == [
        "stage 0 at site a (h100-sxm)"
    ]
    # the optimizer, offered both, keeps v = 1: interleaving would not fit
    data["job"]["parallelism"]["virtual_stages"] = [1, 2]
    res = solve(problem_from_data(data), backend="brute", time_limit_s=60)
    assert res.plan.parallelism.virtual_stages == 1


# ----------------------------------------------------------------------------- simulator


@pytest.mark.parametrize(
    ("sites", "routes", "chain", "layers", "v"),
    [
        (["a", "b"], [("a", "b", 300.0)], ["a", "b"], [4, 4], 2),
        (["a", "b"], [("a", "b", 80.0)], ["a", "a", "b", "b"], [2, 2, 2, 2], 2),
        (["a", "b"], [("a", "b", 500.0)], ["a", "b", "b"], [3, 3, 3], 3),
        # the wrap c -> a has no route of its own: it runs over b (two hops)
        (["a", "b", "c"], [("a", "b", 200.0), ("b", "c", 400.0)], ["a", "b", "c"], [2, 4, 2], 2),
    ],
)
def test_closed_form_equals_the_simulation_of_one_interleaved_chain(
    sites, routes, chain, layers, v
) -> None:
    """One replica, routes far wider than its messages: nothing is shared, so the
    evaluator's interleaved chain time must be the simulated step."""
    m = 2 * len(chain)
    prob = problem(sites, routes, global_batch=m, model={**SMALL_MODEL, "layers": sum(layers)})
    links = {(a, b): 8 for a, b, _ in routes}
    res = simulate(prob, _with_v(plan(8, layers, [(1, chain)], m, links), v))
    assert res.virtual_stages == v
    assert res.feasible, res.violations
    assert res.step_time_s == pytest.approx(res.closed_form_s, rel=1e-9)
    for key in ("bubble_s", "pp_comm_s"):
        assert res.breakdown[key] == pytest.approx(res.closed_breakdown[key], rel=1e-6, abs=1e-12)


def test_route_bytes_count_every_stream_and_the_wrap() -> None:
    """R replicas a,a | b,b with v = 2: the evaluator's per-direction route load is the
    bytes the simulator actually sends a -> b (boundary 1 twice, the wrap b -> a once per
    micro-batch each way: 3 messages per micro-batch and direction)."""
    r_count, m = 3, 4
    prob = problem(["a", "b"], [("a", "b", 100.0)], global_batch=r_count * m)
    p = _with_v(plan(8, [2, 2, 2, 2], [(r_count, ["a", "a", "b", "b"])], m, {("a", "b"): 2}), 2)
    ev = evaluate(prob, p)
    res = simulate(prob, p)
    msg = PerfModel(prob).message_bytes(ev.config)
    a_to_b = sum(msg for t in res.transfers if (t.src_site, t.dst_site) == ("a", "b"))
    b_to_a = sum(msg for t in res.transfers if (t.src_site, t.dst_site) == ("b", "a"))
    assert a_to_b == b_to_a == 3 * r_count * m * msg
    assert ev.step.route_pp_load[("a", "b")] == pytest.approx(a_to_b, rel=1e-12)
    perf = PerfModel(prob)
    assert perf.crossing_pairs(("a", "a", "b", "b"), 2) == [("a", "b")] * 3
    assert perf.crossing_pairs(("a", "a", "b", "b"), 1) == [("a", "b")]


# ----------------------------------------------------------------------------- optimizer


def test_default_is_no_interleaving_and_infeasible_candidates_are_dropped() -> None:
    data = sc.interleave_instance(None)
    del data["job"]["parallelism"]["virtual_stages"]
    assert {c.virtual_stages for c in enumerate_configs(problem_from_data(data))} == {1}
    # 8 layers over pp 4: v = 3 does not divide them, v = 2 does; m = 8 is a multiple of 4
    data["job"]["parallelism"]["virtual_stages"] = [1, 2, 3]
    report = SpaceReport()
    cfgs = enumerate_configs(problem_from_data(data), report)
    assert sorted(c.virtual_stages for c in cfgs) == [1, 2]
    assert cfgs[-1].stage_layers == (2, 2, 2, 2)
    assert report.dropped == {"the layers do not split into pp x virtual_stages chunks": 1}
    # m = 6 micro-batches (global batch 12, dp 2) is no multiple of pp 4
    data["job"]["global_batch"] = 12
    report = SpaceReport()
    cfgs = enumerate_configs(problem_from_data(data), report)
    assert {c.virtual_stages for c in cfgs} == {1}
    assert "interleaving needs the micro-batch count to be a multiple of pp" in report.dropped


@pytest.mark.parametrize(
    ("km", "winner"), [(None, 2), (20.0, 2), (200.0, 1)], ids=["one-site", "20km", "200km"]
)
def test_the_optimizer_chooses_v_as_exhaustive_search_does(km, winner) -> None:
    """Brute force over v in {1, 2} (the library checks CP-SAT and the MILP against it):
    on one site and over a short route the halved bubble wins; at 200 km the two extra
    WAN crossings per micro-batch (the boundary's second stream and the wrap) lose."""
    res = solve(problem_from_data(sc.interleave_instance(km)), backend="brute", time_limit_s=60)
    assert res.plan.parallelism.virtual_stages == winner
    only_v1 = solve(
        problem_from_data(sc.interleave_instance(km, [1])), backend="brute", time_limit_s=60
    )
    if winner == 2:
        assert res.objective < only_v1.objective * (1 - 1e-3)
    else:
        assert res.objective == pytest.approx(only_v1.objective, rel=1e-12)
    for backend in ("cpsat", "milp"):
        other = solve(problem_from_data(sc.interleave_instance(km)), backend=backend)
        assert other.plan.parallelism.virtual_stages == winner
        assert other.objective == pytest.approx(res.objective, rel=1e-5)


# ----------------------------------------------------------------------------- input


def test_plan_fields_are_checked() -> None:
    base = plan(8, [3, 5], [(1, ["a", "b"])], 4)
    with pytest.raises(InputError, match=r"stage_layers\[0\]: 3 layers do not split"):
        plan_from_data(_with_v(json.loads(json.dumps(base)), 2))
    with pytest.raises(InputError, match="needs pipeline parallelism"):
        plan_from_data(_with_v(plan(8, [8], [(1, ["a"])], 4), 2))
    prob = problem(["a", "b"], [("a", "b", 100.0)], global_batch=6)
    ev = evaluate(prob, _with_v(plan(8, [4, 4], [(2, ["a", "b"])], 3), 2))  # m 3, pp 2
    assert [v.where for v in ev.violations if v.kind == "shape"] == ["parallelism.virtual_stages"]
    assert math.isinf(ev.step_time_s)


def test_cli_names_the_field(tmp_path) -> None:
    inst = tmp_path / "i.json"
    inst.write_text(json.dumps(sc.interleave_instance(None)))
    p = tmp_path / "p.json"
    p.write_text(json.dumps(_with_v(plan(1, [1, 3, 2, 2], [(2, ["a"] * 4)], 8), 2)))
    r = CliRunner().invoke(app, ["evaluate", str(inst), str(p)])
    assert r.exit_code == 2
    assert "stage_layers[0]" in r.output and "virtual_stages=2" in r.output


# ----------------------------------------------------------------------------- exports


def test_exports_carry_the_interleaving() -> None:
    data = sc.interleave_instance(20.0)
    prob = problem_from_data(data)
    p = _with_v(plan(1, [2, 2, 2, 2], [(4, ["a", "a", "b", "b"])], 4, {("a", "b"): 1}), 2)
    layout = build_layout(prob, plan_from_data(p))
    flags = parse_megatron_args(megatron_files(layout)["megatron_args.sh"])
    assert flags["--num-virtual-stages-per-pipeline-rank"] == ["2"]
    assert "--num-layers-per-virtual-pipeline-stage" not in flags
    settings = {k: val for _, k, val in torchtitan_settings(layout, "0.3")}
    assert settings["pipeline_parallel_schedule"] == "Interleaved1F1B"
    parts = settings["module_fqns_per_model_part"]
    assert [sum(x.startswith("layers.") for x in part) for part in parts] == [1] * 8
    assert parts[0][:2] == ["tok_embeddings", "layers.0"] and parts[-1][-2:] == ["norm", "lm_head"]
    # uneven middle ranks: a layout of v pp model stages, no other virtual-stage flag
    p = _with_v(plan(1, [2, 4, 2, 2], [(4, ["a", "a", "b", "b"])], 4, {("a", "b"): 1}), 2)
    data["job"]["model"] = {**data["job"]["model"], "layers": 10}
    prob = problem_from_data(data)
    flags = parse_megatron_args(
        megatron_files(build_layout(prob, plan_from_data(p)))["megatron_args.sh"]
    )
    assert flags["--pipeline-model-parallel-layout"] == ["Et*1|t*2|t*1|t*1|t*1|t*2|t*1|t*1,L"]
    assert "--num-virtual-stages-per-pipeline-rank" not in flags


@st.composite
def single_interleaved_chains(draw):
    """2-3 sites on a path, 50-1,000 km, one replica whose pp 2-4 ranks visit 1-3 sites in
    blocks, v 2-3 chunks per rank, m = pp or 2 pp, routes with 8 waves (uncontended)."""
    n = draw(st.integers(2, 3))
    sites = [f"s{i}" for i in range(n)]
    routes = [(sites[i], sites[i + 1], draw(st.floats(50, 1000))) for i in range(n - 1)]
    pp = draw(st.integers(2, 4))
    v = draw(st.integers(2, 3))
    m = draw(st.sampled_from([pp, 2 * pp]))
    k = draw(st.integers(1, min(pp, n)))
    visit = draw(st.permutations(sites))[:k]
    cuts = sorted(
        draw(st.lists(st.integers(1, pp - 1), min_size=k - 1, max_size=k - 1, unique=True))
    )
    bounds = [0, *cuts, pp]
    chain = [
        s for s, lo, hi in zip(visit, bounds, bounds[1:], strict=False) for _ in range(hi - lo)
    ]
    layers = [v * draw(st.integers(1, 2)) for _ in range(pp)]
    tp = draw(st.sampled_from([1, 8]))
    return sites, routes, chain, layers, v, m, tp


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(single_interleaved_chains())
# one site, pp 3: rank 0 receives over the wrap and from rank 1 at once (0.22% apart)
@example((["s0", "s1"], [("s0", "s1", 50.0)], ["s0", "s0", "s0"], [4, 2, 2], 2, 6, 8))
def test_closed_form_equals_the_simulation_on_random_interleaved_chains(case) -> None:
    """Equal (rel 1e-9) whenever no message waited for another on a NIC. The simulator
    shares a device's NIC between all its streams (an interleaved first rank receives
    activations over the wrap and gradients from rank 1 at once), the closed form gives
    each boundary direction its own (placer.sim.job's documented difference): then the
    closed form is optimistic, by at most 1% on these chains."""
    sites, routes, chain, layers, v, m, tp = case
    prob = problem(sites, routes, global_batch=m, model={**SMALL_MODEL, "layers": sum(layers)})
    links = {(a, b): 8 for a, b, _ in routes}
    p = _with_v(plan(tp, layers, [(1, chain)], m, links), v)
    res = simulate(prob, p)
    perf = PerfModel(prob)
    cfg = config_of(prob, plan_from_data(p))
    shared = any(
        t.sent - t.start > perf.boundary(cfg, t.src_site, t.dst_site)[1] * (1 + 1e-9)
        for t in res.transfers
    )
    if not shared:
        assert res.step_time_s == pytest.approx(res.closed_form_s, rel=1e-9)
    else:
        assert -0.01 <= res.rel_diff <= 1e-9


def test_simulate_cli_reads_v_from_the_plan_and_can_override_it(tmp_path) -> None:
    inst = tmp_path / "i.json"
    inst.write_text(json.dumps(sc.interleave_instance(None)))
    p = tmp_path / "p.json"
    p.write_text(json.dumps(_with_v(plan(1, [2, 2, 2, 2], [(2, ["a"] * 4)], 8), 2)))
    out = {}
    for extra in ([], ["--virtual-stages", "1"]):
        r = CliRunner().invoke(app, ["simulate", str(inst), str(p), "--json", *extra])
        assert r.exit_code == 0, r.output
        out[len(extra)] = json.loads(r.stdout)
    assert out[0]["virtual_stages"] == 2 and out[2]["virtual_stages"] == 1
    # both sides of each run priced the same schedule: the v = 2 bubble is half of v = 1's
    b2, b1 = (out[k]["closed_form"]["breakdown"]["bubble_s"] for k in (0, 2))
    assert b2 < 0.6 * b1
    for k in (0, 2):
        assert out[k]["breakdown"]["bubble_s"] == pytest.approx(
            out[k]["closed_form"]["breakdown"]["bubble_s"], rel=1e-6
        )


def test_evaluate_simulate_checks_interleaved_plans(tmp_path) -> None:
    """`placer evaluate --simulate` on a v = 2 plan whose chain crosses a route: the
    critical chain's interleaved schedule run by simpy (placer.sim.simulate_chain, every
    message through its boundary's FIFO) agrees with the closed form's ordered evaluation
    to rounding, and a slower wrap (one boundary's transmit) moves both alike."""
    inst = tmp_path / "i.json"
    inst.write_text(json.dumps(sc.interleave_instance(300.0)))
    p = tmp_path / "p.json"
    p.write_text(
        json.dumps(
            _with_v(plan(1, [2, 2, 2, 2], [(4, ["a", "a", "b", "b"])], 4, {("a", "b"): 2}), 2)
        )
    )
    r = CliRunner().invoke(app, ["evaluate", str(inst), str(p), "--simulate", "--json"])
    assert r.exit_code == 0, r.output
    sim = json.loads(r.stdout)["simulation"]
    assert sim is not None
    assert sim["pipeline_s"] == pytest.approx(sim["closed_form_s"], rel=1e-9)
    from placer.perf.critical_path import critical_path
    from placer.sim import simulate_chain

    fwd, bwd = [1.0, 2.0, 1.5, 1.0] * 2, [2.0, 3.0, 2.5, 2.0] * 2
    lat, tx = [0.1, 0.5, 0.1, 0.5], [0.2, 1.0, 0.2, 3.0]
    assert simulate_chain(fwd, bwd, lat, tx, 8, 2) == pytest.approx(
        critical_path(fwd, bwd, lat, tx, 8, 2).makespan_s, rel=1e-12
    )
