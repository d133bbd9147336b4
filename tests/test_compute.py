"""Operator-level compute, the optimizer step and the overlap windows, by hand arithmetic.

Every expected figure is written out from the catalog numbers and the formulas of
reference/performance-model.md, not read back from placer.perf.compute.
"""

from __future__ import annotations

import pytest

from placer.evaluate import evaluate
from placer.io import build_catalog, problem_from_data
from placer.perf import compute
from placer.perf.step import PerfModel
from placer.schema import ModelSpec

CAT = build_catalog()
H100 = CAT.gpus["h100-sxm"]
# a GPT block small enough to count by hand: h=1024, 16 heads, 4 KV heads (GQA, kv_dim 256)
GQA = ModelSpec(name="hand", layers=4, hidden=1024, heads=16, kv_heads=4, vocab=32000, seq_len=2048)


def test_qkv_gemm_time_by_hand() -> None:
    """QKV of one TP rank (tp=2), 2048 tokens: N = (1024 + 2 x 256)/2 = 768, K = 1024.
    FLOPs 2 x 2048 x 768 x 1024; efficiency e_max d/(d + d_half) with d = min = 768."""
    qkv = compute.layer_gemms(GQA, 2048, 2)[0]
    assert (qkv.m, qkv.n, qkv.k) == (2048, 768, 1024)
    e = H100.matmul_efficiency * 768 / (768 + H100.matmul_half_dim)
    want = 2 * 2048 * 768 * 1024 / (989e12 * e)
    assert compute.gemm_s(H100, qkv, "bf16") == pytest.approx(want, rel=1e-12)
    # FP8 is the catalog's measured GEMM speed-up, not the 2x of the peak figures
    assert compute.gemm_s(H100, qkv, "fp8") == pytest.approx(
        want / H100.fp8_gemm_speedup, rel=1e-12
    )
    assert 1.0 < H100.fp8_gemm_speedup < 2.0


def test_gated_ffn_and_lm_head_shapes() -> None:
    m = GQA.model_copy(update={"gated_ffn": True, "ffn_hidden": 2816})
    names = {g.name: (g.m, g.n, g.k) for g in compute.layer_gemms(m, 4096, 4)}
    assert names["ffn_in"] == (4096, 2 * 2816 // 4, 1024)  # gate and up projections fused
    assert names["ffn_out"] == (4096, 1024, 2816 // 4)
    assert names["attn_proj"] == (4096, 1024, 1024 // 4)
    head = compute.lm_head_gemm(m, 4096, 4)
    assert (head.m, head.n, head.k) == (4096, 8000, 1024)


def test_memory_bound_bytes_by_hand() -> None:
    """Per token: 2 norms x 4h + 2 dropout-adds x 7h = 22h bytes on s/t tokens under SP;
    GELU 4 x ffn (ffn = 4h) and no rotary on the rank's 1/t slice."""
    h, t, tokens = 1024, 2, 2048
    want_sp = tokens * (22 * h / t + 4 * 4 * h / t)
    assert (
        compute.layer_memory_bytes(GQA, tokens, t, sequence_parallel=True, rotary=False) == want_sp
    )
    want_no_sp = tokens * (22 * h + 4 * 4 * h / t)
    assert (
        compute.layer_memory_bytes(GQA, tokens, t, sequence_parallel=False, rotary=False)
        == want_no_sp
    )
    rotary = tokens * 4 * (h + 256) / t  # read and write q and k (kv_dim 256) in bf16
    assert compute.layer_memory_bytes(GQA, tokens, t, True, True) - want_sp == rotary
    assert compute.hbm_s(H100, 3.35e12 * H100.hbm_efficiency) == pytest.approx(1.0)


def test_tp_overlap_and_sequence_parallel_all_gathers() -> None:
    """Per layer 2 all-reduces forward; backward 2 plus the 2 repeated all-gathers of
    sequence parallelism (one all-reduce's worth) under selective recompute; a fraction
    f of all of it hidden."""
    ar, f = 1e-3, 0.25
    ops = compute.stage_ops(H100, GQA, 4, False, 1, 2, "selective", "bf16", True, ar, f)
    assert ops.tp_fwd == pytest.approx(0.75 * 4 * 2 * ar)
    assert ops.tp_bwd == pytest.approx(0.75 * 4 * 3 * ar)
    assert ops.tp_hidden == pytest.approx(0.25 * 4 * 5 * ar)
    full = compute.stage_ops(H100, GQA, 4, False, 1, 2, "full", "bf16", True, ar, 0.0)
    assert full.tp_bwd == pytest.approx(4 * 4 * ar)  # the replayed forward already gathers
    no_sp = compute.stage_ops(H100, GQA, 4, False, 1, 2, "selective", "bf16", False, ar, 0.0)
    assert no_sp.tp_bwd == pytest.approx(4 * 2 * ar)


def test_optimizer_step_by_hand() -> None:
    """Adam over the local shard: stage params / t / d (ZeRO-1) x 30 bytes at HBM rate.
    sc21-1.7b on one stage (24 blocks of 12 h^2 + 2h, the tied 51200 x h embedding held
    once since the stage is both first and last, the final norm), tp=1, dp=32."""
    prob = problem_from_data(
        {
            "name": "opt",
            "sites": [{"name": "dc", "gpu": "a100-80g", "gpus": 32}],
            "job": {"model": "sc21-1.7b", "global_batch": 512, "zero1": True},
        }
    )
    perf = PerfModel(prob)
    from placer.rules import job_config

    cfg = job_config(prob.instance.job, 1, 1, 32, 1, 16, (24,), "synchronous")
    h = 2304
    params = 24 * (12 * h * h + 2 * h) + 51200 * h + h  # blocks, embedding, final norm
    a100 = CAT.gpus["a100-80g"]
    want = params / 32 * 30 / (2.04e12 * a100.hbm_efficiency)
    assert perf.optimizer_step_s(cfg, ("dc",)) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(
    ("sync", "window", "exposed"), [(1.0, 3.0, 0.0), (5.0, 3.0, 2.0), (5.0, 0.0, 5.0)]
)
def test_overlap_window_hides_all_part_none(sync: float, window: float, exposed: float) -> None:
    assert compute.dp_exposed_s(sync, ((1.0, window),)) == exposed
    # ZeRO-1: half under the backward window, half under the forward window
    assert (
        compute.dp_exposed_s(sync, ((0.5, window), (0.5, 0.0)))
        == max(0.0, sync / 2 - window) + sync / 2
    )


def _single_site(dp: int, batch: int, overlap: dict, zero1: bool = False):
    prob = problem_from_data(
        {
            "name": "ov",
            "sites": [{"name": "dc", "gpu": "h100-sxm", "gpus": 8 * dp}],
            "job": {
                "model": "sc21-1.7b",
                "global_batch": batch,
                "zero1": zero1,
                "overlap": overlap,
            },
        }
    )
    plan = {
        "parallelism": {"tp": 8, "pp": 1, "dp": dp, "micro_batch": 1},
        "stage_layers": [24],
        "replica_groups": [{"count": dp, "stage_sites": ["dc"]}],
    }
    return prob, evaluate(prob, plan)


@pytest.mark.parametrize("batch_per_replica", [1, 4])
def test_grad_reduce_overlap_end_to_end(batch_per_replica: int) -> None:
    """With --overlap-grad-reduce (no ZeRO-1) the step shrinks by min(sync, window): the
    window is one micro-batch's backward, the sync the hierarchical all-reduce of the
    1.7B model's gradients over 16 nodes (tp=8: one replica per node)."""
    off = {"grad_reduce": False, "param_gather": False, "tp_comm": False}
    on = {**off, "grad_reduce": True}
    prob, ev_off = _single_site(16, 16 * batch_per_replica, off)
    _, ev_on = _single_site(16, 16 * batch_per_replica, on)
    perf = PerfModel(prob)
    st = perf.stage_times(ev_off.config, "h100-sxm")[0]
    sync = ev_off.breakdown["dp_sync_s"]
    g = (24 * (12 * 2304**2 + 2 * 2304) + 51200 * 2304 + 2304) * 2 / 8  # bf16 grads per tp rank
    nic = 400e9 / 8 * 0.9
    want_sync = 2 * 15 / 16 * g / nic + 2 * 15 * 5e-6  # ring over 16 nodes, 5 us per hop
    assert sync == pytest.approx(want_sync, rel=1e-9)
    hidden = min(sync, st.bwd)
    assert ev_off.step_time_s - ev_on.step_time_s == pytest.approx(hidden, rel=1e-9)
    assert ev_on.breakdown["dp_sync_s"] == pytest.approx(max(0.0, sync - st.bwd), abs=1e-12)


OVERLAPS = {
    "none": ({"grad_reduce": False, "param_gather": False, "tp_comm": False}, True),
    "grad-only-no-zero1": ({"grad_reduce": True, "param_gather": False, "tp_comm": True}, False),
    "all": ({"grad_reduce": True, "param_gather": True, "tp_comm": True}, True),
}


@pytest.mark.parametrize("seed", [1, 5, 14])
@pytest.mark.parametrize("overlap", sorted(OVERLAPS))
def test_backends_agree_under_each_overlap(seed: int, overlap: str) -> None:
    """The exposed-sync rows of both formulations against exhaustive search scored by the
    evaluator, with every overlap setting (one piece without ZeRO-1, two with it, none)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import solver_cases as sc

    from placer.errors import InfeasibleError
    from placer.optimize.driver import solve

    inst = sc.random_instance(seed)
    inst["job"]["overlap"], inst["job"]["zero1"] = OVERLAPS[overlap]
    out = {}
    for backend in ("brute", "cpsat", "milp"):
        try:
            out[backend] = solve(
                problem_from_data(inst), backend=backend, time_limit_s=60
            ).objective
        except InfeasibleError:
            out[backend] = None
    if out["brute"] is None:
        assert out["cpsat"] is None and out["milp"] is None, out
    else:
        assert out["cpsat"] == pytest.approx(out["brute"], rel=1e-5, abs=1e-9)
        assert out["milp"] == pytest.approx(out["brute"], rel=1e-6, abs=1e-9)
