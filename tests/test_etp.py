"""Expert tensor parallelism and Megatron-Core's EP folding (issue 16 item 2) by hand
arithmetic: the folded replica stage and its data-parallel counts, the expert GEMM shapes
with ETP, the ETP gather, the EP stride on the NVLink domain, expert memory over ep x etp,
the rank map against an independent re-implementation of Megatron-Core's RankGenerator,
the exported flags, validation, and the optimizer choosing a folded layout (brute force vs
CP-SAT vs MILP in the solver library, case `etp-fold`).

Expected figures are written out from the formulas in the docstrings, not read back.
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest

from placer.errors import InfeasibleError
from placer.evaluate import evaluate
from placer.io import build_catalog, load_model, problem_from_data
from placer.optimize.driver import solve
from placer.optimize.space import enumerate_configs
from placer.perf import comm, compute
from placer.perf.flops import model_state_bytes_per_param, param_count, stage_memory_bytes
from placer.perf.step import PerfModel
from placer.rules import expert_fold_width, job_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
import solver_cases as sc  # noqa: E402

CAT = build_catalog()
H100 = CAT.gpus["h100-sxm"]
NVLINK = 900e9 / 2 * CAT.network.nvlink_efficiency  # per direction
NIC = 400e9 / 8 * CAT.network.nic_efficiency
LAT = CAT.network.intra_site_latency_s


# tiny-moe made gated (SwiGLU, exported without linear biases): Megatron-Core refuses MoE
# biases with expert TP > 1, so placer does too (rules.etp_problems)
TINY_MOE_GATED = {
    "name": "tiny-moe-gated",
    "layers": 4,
    "hidden": 256,
    "heads": 4,
    "gated_ffn": True,
    "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 256, "first_dense_layers": 1},
    "vocab": 1024,
    "seq_len": 256,
    "tied_embeddings": False,
}


def _problem(model, gpus: int = 64, gpn: int | None = None, **job):
    site = {"name": "dc", "gpu": "h100-sxm", "gpus": gpus}
    if gpn:
        site["gpus_per_node"] = gpn
    return problem_from_data(
        {"name": "etp", "sites": [site], "job": {"model": model, "global_batch": 64, **job}}
    )


# ----------------------------------------------------------------------------- layout


@pytest.mark.parametrize(
    "tp, cp, ep, etp, width, side, expert_dp",
    [
        (2, 1, 32, 1, 32, 16, 1),  # Qwen3-235B on H100: TP 2 x EP 32 in a 32-GPU stage
        (2, 1, 8, 1, 8, 4, 1),  # unfolded this is 16 GPUs (tp x ep)
        (2, 1, 4, 2, 8, 4, 1),  # etp = tp: experts split 8 ways
        (4, 1, 2, 1, 4, 1, 2),  # the EP group inside a TP group
        (2, 2, 2, 1, 4, 1, 2),  # CP folded into expert DP
    ],
)
def test_folded_replica_stage(tp, cp, ep, etp, width, side, expert_dp) -> None:
    """width = lcm(tp cp, ep etp); side = width / (tp cp) data-parallel ranks; expert
    DP inside the stage = width / (ep etp); Megatron's DP = dp x side."""
    assert expert_fold_width(tp, cp, ep, etp) == width
    job = _problem("tiny-moe").instance.job
    cfg = job_config(job, tp, 1, 3, 1, 1, (4,), "synchronous", cp, ep, etp=etp)
    assert (cfg.width, cfg.ranks_per_replica, cfg.expert_dp_per_replica) == (width, side, expert_dp)
    assert cfg.data_parallel_size == 3 * side
    assert cfg.gpus == 3 * width
    assert cfg.expert_tp == etp and "-etp" in cfg.label()


def test_unfolded_layout_unchanged() -> None:
    """etp None: tp x cp x ep GPUs, ep data-parallel ranks, tp x cp expert DP (as before)."""
    job = _problem("tiny-moe").instance.job
    cfg = job_config(job, 2, 1, 1, 1, 1, (4,), "synchronous", 1, 8)
    assert (cfg.width, cfg.ranks_per_replica, cfg.expert_dp_per_replica) == (16, 8, 2)
    assert cfg.expert_tp == 1 and "etp" not in cfg.label()


def megatron_groups(world: int, sizes: dict[str, int], order: str, group: str) -> list[list[int]]:
    """Megatron-Core's RankGenerator, re-implemented from its definition: ranks laid out
    over the dimensions of `order` (leftmost fastest); a group of `group` varies that
    dimension with all others fixed."""
    dims = order.split("-")
    shape = [sizes[d] for d in dims]
    assert math.prod(shape) == world
    strides = itertools.accumulate([1, *shape[:-1]], lambda a, b: a * b)
    stride = dict(zip(dims, strides, strict=True))
    out = []
    for r in range(world):
        coords = {d: (r // stride[d]) % sizes[d] for d in dims}
        if coords[group] == 0:
            out.append([r + i * stride[group] for i in range(sizes[group])])
    return sorted(out)


@pytest.mark.parametrize("etp, dp", [(1, 2), (2, 1)])
def test_rank_map_matches_megatron_expert_generator(etp: int, dp: int) -> None:
    """A folded tp 2 x ep 4 plan (etp 1: 4-GPU stages, 2 replicas; etp 2: 8-GPU stages)
    over pp 2 across two sites: placer's rank map gives each rank the etp, ep and
    expert-dp coordinates of Megatron-Core's expert RankGenerator(tp=etp, ep,
    dp=world/(etp ep pp), pp, cp=1, order tp-cp-ep-dp-pp), every expert group lies in one
    replica stage (one site), and the dense TP groups are the decoder generator's."""
    from placer.outputs.launch import build_layout

    prob = problem_from_data(
        {
            "name": "etp-map",
            "sites": [{"name": s, "gpu": "h100-sxm", "gpus": 8} for s in ("a", "b")],
            "routes": [{"sites": ["a", "b"], "km": 10, "fiber_pairs": 1}],
            "job": {"model": TINY_MOE_GATED, "global_batch": 16},
        }
    )
    chains = [["a", "b"], ["b", "a"]][:dp]
    plan = {
        "parallelism": {"tp": 2, "pp": 2, "dp": dp, "ep": 4, "etp": etp, "micro_batch": 1},
        "stage_layers": [2, 2],
        "replica_groups": [{"count": 1, "stage_sites": c} for c in chains],
        "links": [{"sites": ["a", "b"], "waves": 1}],
    }
    assert evaluate(prob, plan).feasible
    lay = build_layout(prob, plan)
    world = len(lay.ranks)
    assert world == 16 and lay.width == 4 * etp and lay.dp_size == 2 * etp * dp
    sizes = {"tp": etp, "cp": 1, "ep": 4, "dp": world // (etp * 4 * 2), "pp": 2}
    keys = {
        "ep": lambda r: (r.pp, r.etp, r.expert_dp),
        "dp": lambda r: (r.pp, r.etp, r.ep),
        "tp": lambda r: (r.pp, r.ep, r.expert_dp),
    }
    for name, key in keys.items():
        want = megatron_groups(world, sizes, "tp-cp-ep-dp-pp", name)
        got: dict = {}
        for r in lay.ranks:
            got.setdefault(key(r), []).append(r.rank)
        assert sorted(got.values()) == want, name
    site = {r.rank: r.site for r in lay.ranks}
    for g in megatron_groups(world, {**sizes, "ep": 4 * etp, "tp": 1}, "tp-cp-ep-dp-pp", "ep"):
        assert len({site[r] for r in g}) == 1  # the etp x ep expert model-parallel group
    dense = {"tp": 2, "cp": 1, "ep": 1, "dp": lay.dp_size, "pp": 2}
    got = {}
    for r in lay.ranks:
        got.setdefault((r.pp, r.dp), []).append(r.rank)
    assert sorted(got.values()) == megatron_groups(world, dense, "tp-cp-ep-dp-pp", "tp")


# ----------------------------------------------------------------------------- compute


def gemm(mm: int, n: int, k: int) -> float:
    d = min(mm, n, k)
    e = H100.matmul_efficiency * d / (d + H100.matmul_half_dim)
    return 2 * mm * n * k / (989e12 * e)


def test_expert_gemms_with_etp_by_hand() -> None:
    """tiny-moe (h 256, 8 experts of width 256, top-2), 256 tokens, tp 2 (128 routed per
    rank), ep 4, etp 2: the router on 128 tokens; each GPU gathers its ETP pair's copies,
    2 x 128 x 2 = 512 pairs over its 2 local experts = 256 each, on half the expert width:
    in 256 x 128 x 256, out 256 x 256 x 128."""
    m = load_model("tiny-moe")
    want = gemm(128, 8, 256) + 2 * (gemm(256, 128, 256) + gemm(256, 256, 128))
    got = compute.moe_ffn_s(H100, m, 256, 2, 4, 1.0, "bf16", 2)
    assert got == pytest.approx(want, rel=1e-12)
    # etp 1 at the same tp / ep: 128 x 2 / 2 = 128 tokens per expert, full width
    want1 = gemm(128, 8, 256) + 2 * (gemm(128, 256, 256) + gemm(128, 256, 256))
    assert compute.moe_ffn_s(H100, m, 256, 2, 4, 1.0, "bf16") == pytest.approx(want1, rel=1e-12)


def test_etp_gather_by_hand() -> None:
    """The ETP all-gather of the dispatched copies: etp 2 members, each 256/2 tokens x top-2
    x h 256 x 2 bytes (b 1, s 256, tp 2): a ring moving 1/2 of the 2 x 131,072 bytes."""
    perf = PerfModel(_problem("tiny-moe"))
    per_member = 128 * 2 * 256 * 2
    assert perf.etp_gather_s(H100, 2, 1, 2, 1, 1.0) == pytest.approx(
        0.5 * 2 * per_member / NVLINK, rel=1e-12
    )
    assert perf.etp_gather_s(H100, 2, 1, 1, 1, 1.0) == 0.0


def test_ep_ranks_at_stride_etp_by_hand() -> None:
    """ep 8 at etp 2 on 8-GPU nodes: the EP group spans 16 ranks, 4 EP ranks per node, so
    4/8 of a rank's dispatch crosses the NICs (comm.two_level_all_to_all_s with q = 4);
    at etp 1 all 8 share the node."""
    perf = PerfModel(_problem("tiny-moe"))
    nbytes = 128 * 2 * 256 * 2  # 256 / tp 2 tokens x top-2 x h x bf16
    want = comm.two_level_all_to_all_s(8, 4, nbytes, NVLINK, NIC, 0.0, LAT)
    assert want == pytest.approx(max(3 / 8 * nbytes / NVLINK, 4 / 8 * nbytes / NIC + 4 * LAT))
    assert perf.ep_all_to_all_s(H100, 2, 1, 8, 1, 1.0, etp=2) == pytest.approx(want, rel=1e-12)
    assert perf.ep_all_to_all_s(H100, 2, 1, 8, 1, 1.0) == pytest.approx(
        7 / 8 * nbytes / NVLINK, rel=1e-12
    )


def test_stage_all_to_all_includes_the_etp_gather() -> None:
    """A folded tp 2 ep 4 etp 2 stage: every MoE layer's forward is dispatch + gather +
    reduce-scatter + combine (2 x (a2a + gather)), the backward the same (3 MoE layers)."""
    prob = _problem("tiny-moe")
    perf = PerfModel(prob)
    cfg = job_config(prob.instance.job, 2, 1, 1, 1, 16, (4,), "synchronous", 1, 4, etp=2)
    ops = perf.stage_times(cfg, "h100-sxm")[0].ops
    imb = cfg.expert_load_imbalance
    a2a = perf.ep_all_to_all_s(H100, 2, 1, 4, 1, imb, etp=2)
    g = perf.etp_gather_s(H100, 2, 1, 2, 1, imb)
    assert g > 0
    assert ops.ep_fwd == pytest.approx(3 * 2 * (a2a + g), rel=1e-12)
    assert ops.ep_bwd == pytest.approx(3 * 2 * (a2a + g), rel=1e-12)


# ----------------------------------------------------------------------------- memory


def test_expert_memory_over_ep_etp_by_hand() -> None:
    """tiny-moe, one stage, folded tp 2 ep 4 etp 2 (W = 8), dp 2, ZeRO-1: dense weights /2
    with optimizer state over dp W / tp = 8 ranks, experts / (ep etp) = /8 over
    dp W / (ep etp) = 2 ranks. Without ZeRO-1: 16 bytes each."""
    m = load_model("tiny-moe")
    experts = 3 * 8 * 2 * 256 * 256
    dense = param_count(m) - experts
    mem = stage_memory_bytes(m, 4, 0, 1, 2, 2, 1, 1, "selective", True, ep=4, etp=2)
    want = dense / 2 * (4 + 12 / 8) + experts / 8 * (4 + 12 / 2)
    assert want == pytest.approx(
        dense / 2 * model_state_bytes_per_param(8, True)
        + experts / 8 * model_state_bytes_per_param(2, True)
    )
    assert mem["model_state"] == pytest.approx(want, rel=1e-12)
    mem = stage_memory_bytes(m, 4, 0, 1, 2, 2, 1, 1, "selective", False, ep=4, etp=2)
    assert mem["model_state"] == pytest.approx(16 * (dense / 2 + experts / 8), rel=1e-12)


def test_gradients_and_optimizer_with_etp() -> None:
    """Gradient bytes per GPU: dense / tp + experts / (ep etp), bf16; the ZeRO-1 optimizer
    step of a GPU: the stage over the W GPUs of a replica stage."""
    prob = _problem("tiny-moe")
    perf = PerfModel(prob)
    m = prob.model
    experts = 3 * 8 * 2 * 256 * 256
    dense = param_count(m) - experts
    cfg = job_config(prob.instance.job, 2, 1, 1, 1, 16, (4,), "synchronous", 1, 4, etp=2)
    assert perf.stage_grad_bytes(cfg, 0) == pytest.approx((dense / 2 + experts / 8) * 2)
    opt = perf.stage_times(cfg, "h100-sxm")[0].optimizer
    assert opt == pytest.approx(compute.optimizer_step_s(H100, param_count(m) / 8), rel=1e-12)


# ----------------------------------------------------------------------------- validation


def test_invalid_etp_is_named() -> None:
    """A dense model, expert TP > 1 with linear biases (Megatron-Core's TransformerConfig
    refuses it), or an expert width etp does not divide is a violation at parallelism.etp;
    a batch that does not match the folded data-parallel size names the fold."""
    plan = {
        "parallelism": {"tp": 2, "pp": 1, "dp": 1, "etp": 2, "micro_batch": 1},
        "stage_layers": [4],
        "replica_groups": [{"count": 1, "stage_sites": ["dc"]}],
    }
    ev = evaluate(_problem("tiny-gqa"), plan)
    assert not ev.feasible
    assert any(v.where == "parallelism.etp" and "dense" in v.message for v in ev.violations)
    ev = evaluate(_problem("tiny-moe"), plan)
    assert any(v.where == "parallelism.etp" and "biases" in v.message for v in ev.violations)
    assert evaluate(_problem(TINY_MOE_GATED), plan).feasible
    plan["parallelism"] |= {"etp": 3, "tp": 1}
    ev = evaluate(_problem(TINY_MOE_GATED), plan)
    assert any(v.where == "parallelism.etp" and "256" in v.message for v in ev.violations)
    # tp 2 x ep 8 x etp 1: lcm(2, 8) / 2 = 4 data-parallel ranks per replica, so 16
    # micro-batches make the batch of 64 and 8 make 1 x 1 x 4 x 8 = 32
    plan["parallelism"] |= {"tp": 2, "ep": 8, "etp": 1, "num_micro_batches": 16}
    assert evaluate(_problem(TINY_MOE_GATED), plan).feasible
    plan["parallelism"] |= {"num_micro_batches": 8}
    ev = evaluate(_problem(TINY_MOE_GATED), plan)
    assert any(v.kind == "batch" and "folded ep 8 x etp 1" in v.message for v in ev.violations)


def test_export_flags_of_a_folded_plan() -> None:
    """Megatron-LM gets --expert-tensor-parallel-size etp; torchtitan's
    expert_tensor_parallel_degree only takes 1 or tp, anything else is refused."""
    from placer.errors import InputError
    from placer.outputs.export import render

    prob = _problem(TINY_MOE_GATED, gpus=16)
    for etp in (1, 2):
        plan = {
            "parallelism": {"tp": 2, "pp": 1, "dp": 2, "ep": 4, "etp": etp, "micro_batch": 1},
            "stage_layers": [4],
            "replica_groups": [{"count": 2, "stage_sites": ["dc"]}],
        }
        assert evaluate(prob, plan).feasible
        files = render(prob, plan, "all")
        args = files["megatron_args.sh"]
        assert f"--expert-model-parallel-size 4 --expert-tensor-parallel-size {etp}" in args
        assert "expert_tensor_parallel_degree" in files["torchtitan_args.sh"]
    plan["parallelism"] |= {"tp": 4, "etp": 2, "ep": 2}
    assert evaluate(prob, plan).feasible
    assert "--expert-tensor-parallel-size 2" in render(prob, plan, "megatron")["megatron_args.sh"]
    with pytest.raises(InputError, match="expert_tensor_parallel_degree"):
        render(prob, plan, "torchtitan")


# ----------------------------------------------------------------------------- optimizer


def test_candidates_keep_the_unfolded_space() -> None:
    """Without job.parallelism.etp the space is the unfolded one; with it the folded
    configurations are added (the etp 1 fold that equals the unfolded layout is not)."""
    par = {"tp": [1, 2], "pp": [1], "ep": [2, 4]}
    base = enumerate_configs(_problem(TINY_MOE_GATED, gpus=16, parallelism=par))
    assert all(c.etp is None for c in base)
    more = enumerate_configs(_problem(TINY_MOE_GATED, gpus=16, parallelism={**par, "etp": [1, 2]}))
    assert {c.label() for c in base} <= {c.label() for c in more}
    folded = {(c.tp, c.ep, c.etp) for c in more if c.etp is not None}
    assert (1, 2, 1) not in folded and (2, 2, 1) in folded and (1, 4, 2) in folded


def test_library_case_picks_a_folded_layout() -> None:
    """etp-fold: a wide MoE on two sites of 8 GPUs: the unfolded tp 2 x ep 8 replica stage
    (16 GPUs) fits no site and the unfolded tp 2 x ep 4 stage does not fit memory, so the
    unfolded space is infeasible; brute force finds a folded optimum with etp != tp (the
    library test checks CP-SAT and MILP agree)."""
    case = sc.BY_ID_5D["etp-fold"]
    res = solve(problem_from_data(case.instance), backend="brute", time_limit_s=60)
    assert res.plan.parallelism.etp is not None
    assert res.plan.parallelism.etp != res.plan.parallelism.tp
    unfolded = {**case.instance, "job": {**case.instance["job"]}}
    unfolded["job"]["parallelism"] = {
        k: v for k, v in case.instance["job"]["parallelism"].items() if k != "etp"
    }
    with pytest.raises(InfeasibleError):
        solve(problem_from_data(unfolded), backend="brute", time_limit_s=60)
