"""DualPipeV (issue 16 item 6): plans carry `parallelism.pipeline_schedule: dualpipev`, the
closed form prices it, the optimizer chooses it, the exports say it.

Oracles: the DualPipe README's bubble (p - 1)(F&B + B - 3W) and activation count PP + 1
(github.com/deepseek-ai/DualPipe, "Pipeline Bubbles and Memory Usage Comparison"; F&B = F + B
here, the overlap priced in the stage times), hand arithmetic on the schedule's op lists,
the 1F1B rank parameters (DualPipeV holds 1x), exhaustive search (the brute backend) for
the optimizer's choice. torch's own ScheduleDualPipeV order is checked against
dualpipev_order in the consumer tier (consumers/test_dualpipev.py).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import solver_cases as sc
from sim_cases import SMALL_MODEL, plan, problem

from placer.errors import InputError
from placer.evaluate import evaluate
from placer.io import plan_from_data, problem_from_data
from placer.perf.dualpipe import dualpipev_order, dualpipev_path, dualpipev_peak_layers
from placer.perf.flops import config_stage_memory_bytes
from placer.perf.step import PerfModel, weight_grad_s
from placer.rules import config_of

pytestmark = pytest.mark.filterwarnings("ignore:Constructing LpVariable:DeprecationWarning")


def _dual(p: dict, chunks: list[int] | None = None) -> dict:
    p["parallelism"]["pipeline_schedule"] = "dualpipev"
    if chunks is not None:
        p["parallelism"]["chunk_layers"] = chunks
    return p


# ----------------------------------------------------------------------------- the order


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("extra", [0, 1, 5])
def test_every_rank_runs_each_micro_batch_once_per_chunk(p: int, extra: int) -> None:
    """Rank r: m forwards of each of its model stages r and 2p-1-r, m backwards of each
    (full, or I with its W later), every W after its I, the micro-batches in order."""
    m = 2 * p + extra
    for r in range(p):
        acts = [a for op in dualpipev_order(p, m, r) for a in op]
        for s in (r, 2 * p - 1 - r):
            fwd = [x for k, x, t in acts if k == "F" and t == s]
            bwd = [x for k, x, t in acts if k in ("B", "I") and t == s]
            assert fwd == list(range(m)) and bwd == list(range(m))
            seen_i = set()
            for k, x, t in acts:
                if t == s and k == "I":
                    seen_i.add(x)
                if t == s and k == "W":
                    assert x in seen_i
            assert {x for k, x, t in acts if k == "W" and t == s} == seen_i


def test_the_schedule_needs_two_micro_batches_per_rank() -> None:
    with pytest.raises(ValueError, match="at least 2 x pp"):
        dualpipev_order(4, 7, 0)


# ----------------------------------------------------------------------------- bubble, memory


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("extra", [0, 3])
@pytest.mark.parametrize("fbw", [(1.0, 2.0, 1.0), (2.0, 3.0, 1.0), (0.5, 1.0, 0.5)])
def test_bubble_is_the_readme_table(p: int, extra: int, fbw: tuple[float, float, float]) -> None:
    """Uniform chunks, no communication: makespan = 2 m (F + B) of work per rank plus the
    README's bubble (p - 1)(F&B + B - 3W), F&B = F + B, in the zero-bubble regime the table
    assumes (W = F, I >= W)."""
    f, b, w = fbw
    m = 2 * p + extra
    n = 2 * p
    path = dualpipev_path([f] * n, [b] * n, [w] * n, [0.0] * (p - 1), [0.0] * (p - 1), m)
    assert path.makespan_s == pytest.approx(2 * m * (f + b) + (p - 1) * (f + b + b - 3 * w))


def test_bubble_is_below_1f1b_on_the_same_ranks() -> None:
    """DualPipeV on p ranks against 1F1B on the same ranks (one stage = its two chunks,
    F1 = 2f, B1 = 2b): (p - 1)(F + 2B - 3W) < (p - 1)(F1 + B1) = 2 (p - 1)(F + B)."""
    p, m, f, b, w = 4, 16, 1.0, 2.0, 1.0
    dual = dualpipev_path([f] * 8, [b] * 8, [w] * 8, [0.0] * 3, [0.0] * 3, m).makespan_s
    one = (m + p - 1) * (2 * f + 2 * b)  # 1F1B: (m + p - 1)(F1 + B1)
    assert one - dual == pytest.approx((p - 1) * (2 * f + 2 * b) - (p - 1) * (f + 2 * b - 3 * w))


def test_messages_cost_what_they_cross() -> None:
    """A boundary's transmit and latency delay the step; the longest path's counts price a
    supporting plane that equals the makespan at its own point."""
    m = 6  # pp 3
    fwd, bwd, wgt = [1.0] * 6, [2.0] * 6, [1.0] * 6
    base = dualpipev_path(fwd, bwd, wgt, [0.0, 0.0], [0.0, 0.0], m).makespan_s
    path = dualpipev_path(fwd, bwd, wgt, [0.1, 0.2], [0.05, 0.05], m)
    assert path.makespan_s > base
    const, n, lc = path.plane([0.05, 0.05], [0.1, 0.2])
    assert const + sum(a * 0.05 for a in n) + lc[0] * 0.1 + lc[1] * 0.2 == pytest.approx(
        path.makespan_s
    )
    assert min(n) >= 1 and min(lc) >= 1


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_peak_activations_are_pp_plus_one_chunks(p: int) -> None:
    """The README's "Activation Per Device" PP + 1 with PP = 2 p stages, on every rank."""
    for m in (2 * p, 2 * p + 5):
        assert [dualpipev_peak_layers(p, m, r, (1, 1)) for r in range(p)] == [2 * p + 1] * p


def _four_rank_problem(model: dict | None = None, **kw):
    model = model or {**SMALL_MODEL, "layers": 16, "vocab": 8}
    return problem(["a"], [], global_batch=8, model=model, **kw)


def test_memory_is_one_x_parameters_and_p_plus_half_stages_of_activations() -> None:
    """pp 4, 16 layers, m 8, vocab 8: every rank holds 4 layers under both schedules, so the
    same parameters per rank (DualPipeV "1x", the V's rank 0 holding embedding and head);
    activations (2p + 1) chunks of 2 layers = 18 layers against 1F1B rank 0's 4 micro-
    batches of 4 layers = 16 (no logits: vocab 8 is negligible, checked apart)."""
    prob = _four_rank_problem()
    base = plan(8, [4, 4, 4, 4], [(1, ["a"] * 4)], 8)
    one = config_of(prob, plan_from_data(copy.deepcopy(base)))
    dual = config_of(prob, plan_from_data(_dual(copy.deepcopy(base))))
    assert dual.chunk_layers == (2,) * 8 and dual.rank_chunks(1) == (2, 2)
    mem1 = [config_stage_memory_bytes(prob.model, one, k) for k in range(4)]
    mem2 = [config_stage_memory_bytes(prob.model, dual, k) for k in range(4)]
    assert sum(x["model_state"] for x in mem2) == pytest.approx(
        sum(x["model_state"] for x in mem1), rel=1e-12
    )
    assert mem2[1]["model_state"] == pytest.approx(mem1[1]["model_state"], rel=1e-12)
    logits = 4.0 * 1 * prob.model.seq_len * prob.model.vocab / 8
    per_layer = (mem1[1]["activations"]) / (3 * 4)  # rank 1 holds 3 micro-batches of 4 layers
    assert mem2[1]["activations"] == pytest.approx(9 * 2 * per_layer, rel=1e-12)
    assert mem2[0]["activations"] == pytest.approx(9 * 2 * per_layer + logits, rel=1e-12)


# ----------------------------------------------------------------------------- step time


def test_evaluator_prices_the_v_schedule_on_the_chunk_times() -> None:
    """The step's pipeline is dualpipev_path on the 8 model stages' times (W = their forward
    GEMMs) plus the optimizer; the breakdown's bubble is that less m x a rank's work."""
    prob = _four_rank_problem()
    p = _dual(plan(8, [4, 4, 4, 4], [(1, ["a"] * 4)], 8))
    ev = evaluate(prob, p)
    assert ev.feasible, ev.violations
    cfg = config_of(prob, plan_from_data(p))
    perf = PerfModel(prob)
    ch = perf.chunk_times(cfg, "h100-sxm")
    assert len(ch) == 8
    wgt = [weight_grad_s(t) for t in ch]
    assert all(0 < w < t.bwd for w, t in zip(wgt, ch, strict=True))
    assert wgt[3] == pytest.approx(ch[3].ops.gemm_fwd)
    no_comm = dualpipev_path(
        [t.fwd for t in ch], [t.bwd for t in ch], wgt, [0.0] * 3, [0.0] * 3, 8
    ).makespan_s
    opt = perf.optimizer_step_s(cfg, ("a",) * 4)
    ranks = perf.stage_times(cfg, "h100-sxm")
    for k in range(4):  # rank k's time is its two chunks'
        assert ranks[k].fwd == pytest.approx(ch[k].fwd + ch[7 - k].fwd, rel=1e-12)
    b = ev.breakdown
    work = 8 * max(t.fwd + t.bwd for t in ranks)
    assert b["bubble_s"] == pytest.approx(no_comm - work, rel=1e-9)
    assert b["optimizer_s"] == pytest.approx(opt, rel=1e-12)
    assert sum(b.values()) == pytest.approx(ev.step_time_s, rel=1e-12)
    # and 1F1B on the same plan: its bubble (p - 1)(F1 + B1) is the larger
    one = evaluate(prob, plan(8, [4, 4, 4, 4], [(1, ["a"] * 4)], 8))
    assert one.breakdown["bubble_s"] > b["bubble_s"] and one.step_time_s > ev.step_time_s


MOE = {
    "name": "dp-moe",
    "layers": 8,
    "hidden": 1024,
    "heads": 8,
    "vocab": 8,
    "seq_len": 2048,
    "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 1024},
}


def _moe_problem(recompute: str, overlap: bool):
    data = {
        "name": "dp-moe",
        "sites": [{"name": "a", "gpu": "h100-sxm", "gpus": 64, "gpus_per_node": 8}],
        "job": {
            "model": MOE,
            "global_batch": 64,
            "recompute": recompute,
            "overlap": {"ep_comm": overlap},
        },
    }
    return problem_from_data(data)


def _moe_plan(schedule: str | None) -> dict:
    p = plan(1, [4, 4], [(1, ["a", "a"])], 8)
    p["parallelism"]["ep"] = 8
    if schedule:
        p["parallelism"]["pipeline_schedule"] = schedule
    return p


def test_ep_overlap_runs_under_the_f_and_b_pairs_without_recompute() -> None:
    """DualPipeV's F&B pairs hide each MoE layer's all-to-all under the other direction's
    compute (Config.ep_overlap, as the combined 1F1B): on without activation checkpointing,
    which torchtitan's DualPipeV EP overlap requires, i.e. at recompute none and selective
    (SDPA's flash kernels recompute the attention core in the backward: placer's
    "selective"; full recompute with ep_comm is refused by the schema); 1F1B at v = 1
    never (Megatron-Core needs a virtual pipeline)."""
    prob = _moe_problem("none", True)
    cfg = config_of(prob, plan_from_data(_moe_plan("dualpipev")))
    assert cfg.ep_overlap
    assert not config_of(prob, plan_from_data(_moe_plan(None))).ep_overlap
    sel = _moe_problem("selective", True)
    assert config_of(sel, plan_from_data(_moe_plan("dualpipev"))).ep_overlap
    perf = PerfModel(prob)
    on = perf.chunk_times(cfg, "h100-sxm")
    off_prob = _moe_problem("none", False)
    off = PerfModel(off_prob).chunk_times(
        config_of(off_prob, plan_from_data(_moe_plan("dualpipev"))), "h100-sxm"
    )
    for a, b in zip(on, off, strict=True):
        # the exposed all-to-all is only the part the other direction's compute cannot hide
        assert a.ops.ep_exposed < b.ops.ep_exposed
        assert b.ops.ep_exposed == pytest.approx(a.ops.ep_exposed + a.ops.ep_hidden, rel=1e-9)
    ev_on, ev_off = (
        evaluate(prob, _moe_plan("dualpipev")),
        evaluate(off_prob, _moe_plan("dualpipev")),
    )
    assert ev_on.step_time_s < ev_off.step_time_s
    assert ev_on.breakdown["ep_comm_s"] < ev_off.breakdown["ep_comm_s"]


# ----------------------------------------------------------------------------- validation


def test_plan_fields_are_checked() -> None:
    with pytest.raises(InputError, match="dualpipev needs pp >= 2"):
        plan_from_data(_dual(plan(8, [8], [(1, ["a"])], 4)))
    p = _dual(plan(8, [4, 4], [(1, ["a"] * 2)], 8))
    p["parallelism"]["virtual_stages"] = 2
    with pytest.raises(InputError, match="virtual_stages must be 1"):
        plan_from_data(p)
    with pytest.raises(InputError, match="at least 2 x pp = 4 micro-batches, got 3"):
        plan_from_data(_dual(plan(8, [4, 4], [(1, ["a"] * 2)], 3)))
    with pytest.raises(InputError, match=r"stage_layers\[0\]: 3 layers do not split"):
        plan_from_data(_dual(plan(8, [3, 5], [(1, ["a"] * 2)], 8)))
    with pytest.raises(InputError, match=r"rank 0's chunks \[0\] and \[3\] sum to 4"):
        plan_from_data(_dual(plan(8, [3, 5], [(1, ["a"] * 2)], 8), [2, 2, 3, 2]))
    ok = plan_from_data(_dual(plan(8, [3, 5], [(1, ["a"] * 2)], 8), [2, 2, 3, 1]))
    assert ok.parallelism.chunk_layers == [2, 2, 3, 1]
    # the derived micro-batch count is checked by the evaluator
    prob = problem(["a"], [], global_batch=3)
    p = _dual(plan(8, [4, 4], [(1, ["a"] * 2)], 3))
    del p["parallelism"]["num_micro_batches"]
    ev = evaluate(prob, p)
    assert [v.where for v in ev.violations if v.kind == "shape"] == [
        "parallelism.pipeline_schedule"
    ]
    assert math.isinf(ev.step_time_s)


def test_default_plans_do_not_write_the_field() -> None:
    """1f1b is the default: plans leave the field out (outputs unchanged)."""
    p = plan_from_data(plan(8, [4, 4], [(1, ["a"] * 2)], 8))
    assert "pipeline_schedule" not in p.model_dump(mode="json", exclude_none=True)["parallelism"]


# ----------------------------------------------------------------------------- optimizer


def test_dualpipev_case_wins_over_1f1b_and_interleaving() -> None:
    """The library case: pp 4, m 8 on one node, schedules 1f1b (v 1, 2) and dualpipev; the
    brute-force optimum is DualPipeV (test_solver_library checks CP-SAT and the MILP agree)
    and it beats the best plan of each other schedule."""
    inst = sc.dualpipev_instance()
    prob = problem_from_data(inst)
    best = {}
    for name, extra in (("v1", {}), ("v2", {"virtual_stages": 2}), ("dual", None)):
        p = plan(1, [2, 2, 2, 2], [(2, ["a"] * 4)], 8)
        p["parallelism"].update(extra or {})
        if extra is None:
            _dual(p)
        best[name] = evaluate(prob, p).step_time_s
    assert best["dual"] < best["v2"] < best["v1"]
    from placer.optimize.driver import solve

    res = solve(prob, backend="brute", time_limit_s=60)
    assert res.plan.parallelism.pipeline_schedule == "dualpipev"
    assert evaluate(prob, res.plan).step_time_s == pytest.approx(best["dual"], rel=1e-9)


# ----------------------------------------------------------------------------- exports

CASE = Path(__file__).resolve().parent.parent / "consumers" / "case-dualpipev"


def test_torchtitan_export_says_dualpipev_and_megatron_refuses(tmp_path) -> None:
    """torchtitan: pipeline_parallel_schedule DualPipeV over 2 pp model parts in model order
    (torchtitan's "v" style puts part s on rank s, then back), the EP overlap as priced, AC
    none (torchtitan's DualPipeV EP overlap refuses checkpointing). Megatron-LM: refused
    with the field named and no file written (-f megatron and -f all alike)."""
    from placer.io import load_instance, load_plan
    from placer.outputs.export import export
    from placer.outputs.launch import build_layout, torchtitan_settings

    prob = load_instance(CASE / "instance.yaml")
    plan_ = load_plan(CASE / "plan.json")
    settings = {k: v for _, k, v in torchtitan_settings(build_layout(prob, plan_), "0.2")}
    assert settings["pipeline_parallel_schedule"] == "DualPipeV"
    parts = settings["module_fqns_per_model_part"]
    assert [sum(x.startswith("layers.") for x in part) for part in parts] == [1, 1, 1, 1]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-1] == "output"
    assert settings["pipeline_parallel_expert_parallel_overlap"] is True
    assert settings["mode"] == "none"
    files = export(prob, plan_, "torchtitan", tmp_path / "tt", torchtitan_version="0.2")
    text = (tmp_path / "tt" / "torchtitan.toml").read_text()
    assert 'pipeline_parallel_schedule = "DualPipeV"' in text and files
    assert '[activation_checkpoint]\nmode = "none"' in text
    for fmt in ("megatron", "all"):
        out = tmp_path / fmt
        with pytest.raises(InputError, match="pipeline_schedule: dualpipev has no Megatron"):
            export(prob, plan_, fmt, out)
        assert not out.exists() or not any(out.iterdir())


SIM_MODEL = {**SMALL_MODEL, "layers": 16, "vocab": 8}
ONE_SITE = (["a"], [], [(2, ["a"] * 4)])
ACROSS = (["a", "b"], [("a", "b", 200.0)], [(2, ["a", "a", "b", "b"])])
SPLIT = (["a", "b"], [("a", "b", 200.0)], [(1, ["a"] * 4), (1, ["b"] * 4)])


def _sim(case, overlap: bool, dual: bool = True):
    from placer.sim import simulate

    sites, routes, groups = case
    prob = problem(sites, routes, global_batch=16, model=SIM_MODEL, overlap=overlap)
    p = plan(8, [4, 4, 4, 4], groups, 8, {("a", "b"): 1} if len(sites) > 1 else None)
    return simulate(prob, _dual(p) if dual else p)


@pytest.mark.parametrize("case", [ONE_SITE, ACROSS], ids=["one-site", "chain-across-200km"])
def test_closed_form_equals_the_simulation(case) -> None:
    """Two replicas of pp 4, the data-parallel sync after the pipeline (no overlap): the
    flow-level simulator running the DualPipeV order (every message a flow over the NICs
    and the route, lockstep replicas sharing it) gives the closed form's step, bubble
    included (rel 1e-9)."""
    r = _sim(case, overlap=False)
    assert r.step_time_s == pytest.approx(r.closed_form_s, rel=1e-9)
    assert r.breakdown["bubble_s"] == pytest.approx(r.closed_breakdown["bubble_s"], rel=1e-9)
    assert r.breakdown["bubble_s"] < _sim(case, overlap=False, dual=False).breakdown["bubble_s"]


@pytest.mark.parametrize(
    ("case", "overlap"),
    [(SPLIT, False), (ONE_SITE, True), (ACROSS, True), (SPLIT, True)],
    ids=["dp-across", "one-site-overlap", "chain-across-overlap", "dp-across-overlap"],
)
def test_closed_form_is_pessimistic_on_the_sync(case, overlap: bool) -> None:
    """Where the data-parallel sync overlaps the schedule or crosses the route, the closed
    form gives DualPipeV no stagger of the ranks' WAN syncs (their ends are W ops in no rank
    order: PerfModel.dp_release_s) and one chunk's backward as the overlap window: at or
    above the simulation, by less than 10% here."""
    r = _sim(case, overlap)
    assert r.closed_form_s * 0.90 < r.step_time_s <= r.closed_form_s * (1 + 1e-9)


def test_rank_gradients_are_its_two_chunks() -> None:
    """The data-parallel sync of rank k carries its two chunks' gradients: rank 0 the
    embedding and the LM head, the V's middle ranks plain layers; all ranks together the
    model, as under 1F1B."""
    model = {**SMALL_MODEL, "layers": 16}
    prob = _four_rank_problem(model)
    base = plan(8, [4, 4, 4, 4], [(1, ["a"] * 4)], 8)
    one = config_of(prob, plan_from_data(copy.deepcopy(base)))
    dual = config_of(prob, plan_from_data(_dual(copy.deepcopy(base))))
    perf = PerfModel(prob)
    g1 = [perf.stage_grad_bytes(one, k) for k in range(4)]
    g2 = [perf.stage_grad_bytes(dual, k) for k in range(4)]
    assert sum(g2) == pytest.approx(sum(g1), rel=1e-12)
    # rank 0's extra over a plain rank: 1F1B's first stage's (embedding) and last stage's
    # (final norm, LM head)
    assert g2[0] - g1[1] == pytest.approx((g1[0] - g1[1]) + (g1[3] - g1[1]), rel=1e-9)
    assert g1[0] > g1[1] and g1[3] > g1[1]
    assert g2[1] == pytest.approx(g1[1], rel=1e-12) and g2[3] == pytest.approx(g1[1], rel=1e-12)


@pytest.mark.parametrize(("km", "dual"), [(200.0, True), (1000.0, False)])
def test_the_route_decides_between_dualpipev_and_1f1b(km: float, dual: bool) -> None:
    """Two sites, one crossing per chain: DualPipeV crosses it twice each way per
    micro-batch; at 200 km its smaller bubble still wins, at 1000 km 1F1B does (brute
    force; test_solver_library checks CP-SAT and the MILP agree)."""
    from placer.optimize.driver import solve

    prob = problem_from_data(sc.dualpipev_instance(km))
    res = solve(prob, backend="brute", time_limit_s=60)
    assert (res.plan.parallelism.pipeline_schedule == "dualpipev") is dual
    sites = {s for g in res.plan.replica_groups for s in g.stage_sites}
    assert sites == {"a", "b"}
