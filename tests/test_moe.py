"""Expert and context parallelism by hand arithmetic: the all-to-all and ring-attention
collectives, their exposure in the stage times, the MoE FFN GEMMs, memory sharded by EP
and divided by CP, the node packing of replicas wider than a node, and the optimizer
weighing EP and CP (the solver-library cases, brute force vs CP-SAT vs MILP).

Every expected figure is written out from the catalog numbers and the formulas in the
docstrings of placer.perf.comm / compute / flops, not read back from them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from placer.evaluate import evaluate
from placer.io import build_catalog, load_model, problem_from_data
from placer.perf import comm, compute
from placer.perf.flops import param_count, stage_memory_bytes
from placer.perf.step import PerfModel
from placer.rules import job_config, nodes_for, replica_slots

sys.path.insert(0, str(Path(__file__).resolve().parent))
import solver_cases as sc  # noqa: E402

CAT = build_catalog()
H100 = CAT.gpus["h100-sxm"]
NVLINK = 900e9 / 2 * CAT.network.nvlink_efficiency  # per direction
NIC = 400e9 / 8 * CAT.network.nic_efficiency
LAT = CAT.network.intra_site_latency_s


# ----------------------------------------------------------------------------- collectives


def test_all_to_all_by_hand() -> None:
    """4 members, 1 MB each: 3/4 of it leaves over the link, 3 peer start-ups."""
    assert comm.all_to_all_s(4, 1e6, 1e9, 1e-6) == pytest.approx(0.75e-3 + 3e-6, rel=1e-12)
    assert comm.all_to_all_s(1, 1e6, 1e9, 1e-6) == 0.0


def test_two_level_all_to_all_by_hand() -> None:
    """8 members, 4 per NVLink domain: 3/8 of the bytes on NVLink, 4/8 on the NIC at once;
    the slower sets the time. q = n and q = 1 are the flat all-to-alls."""
    s = 8e6
    want = max(3 / 8 * s / 450e9, 4 / 8 * s / 50e9 + 4 * 5e-6)
    assert comm.two_level_all_to_all_s(8, 4, s, 450e9, 50e9, 0.0, 5e-6) == pytest.approx(want)
    assert comm.two_level_all_to_all_s(8, 8, s, 450e9, 50e9) == pytest.approx(
        comm.all_to_all_s(8, s, 450e9)
    )
    assert comm.two_level_all_to_all_s(8, 1, s, 450e9, 50e9, 0.0, 5e-6) == pytest.approx(
        comm.all_to_all_s(8, s, 50e9, 5e-6)
    )


def test_ring_attention_by_hand() -> None:
    """cp = 4: three steps, each one chunk plus one start-up."""
    assert comm.ring_attention_kv_s(4, 2e6, 1e9, 1e-6) == pytest.approx(3 * (1e-6 + 2e-3))
    assert comm.ring_attention_kv_s(1, 2e6, 1e9) == 0.0


# ----------------------------------------------------------------------------- MoE compute


def test_moe_ffn_gemms_by_hand() -> None:
    """tiny-moe (h 256, 8 experts of GELU width 256, top-2), 256 tokens, ep 4: a router
    GEMM 256 x 8 x 256, then 2 local experts each getting 256 x 2 / 2 = 256 tokens, each an
    in and an out GEMM of 256 x 256 x 256."""
    m = load_model("tiny-moe")

    def gemm(mm: int, n: int, k: int) -> float:
        d = min(mm, n, k)
        e = H100.matmul_efficiency * d / (d + H100.matmul_half_dim)
        return 2 * mm * n * k / (989e12 * e)

    want = gemm(256, 8, 256) + 2 * (gemm(256, 256, 256) + gemm(256, 256, 256))
    assert compute.moe_ffn_s(H100, m, 256, 1, 4, 1.0, "bf16") == pytest.approx(want, rel=1e-12)
    # imbalance 1.5: the busiest rank's experts see 384 tokens each
    want = gemm(256, 8, 256) + 2 * (gemm(384, 256, 256) + gemm(384, 256, 256))
    assert compute.moe_ffn_s(H100, m, 256, 1, 4, 1.5, "bf16") == pytest.approx(want, rel=1e-12)


def _problem(model: str, gpus: int = 64, seq_len: int | None = None, gpn: int | None = None):
    site = {"name": "dc", "gpu": "h100-sxm", "gpus": gpus}
    if gpn:
        site["gpus_per_node"] = gpn
    job = {"model": model, "global_batch": 64}
    if seq_len:
        job["seq_len"] = seq_len
    return problem_from_data({"name": "moe", "sites": [site], "job": job})


def test_dispatch_on_nvlink_and_nics_by_hand() -> None:
    """One dispatch of tiny-moe (b 1, s 256, tp 1): 256 tokens x top-2 x h 256 x 2 bytes
    x the 1.1 imbalance per rank. ep 4 on an 8-GPU node: 3/4 of it on NVLink. ep 16: 7/16
    on NVLink and 8/16 on the NIC (plus 8 start-ups) at the same time, the NIC slower."""
    prob = _problem("tiny-moe")
    perf = PerfModel(prob)
    nbytes = 256 * 2 * 256 * 2 * 1.1
    assert perf.ep_all_to_all_s(H100, 1, 1, 4, 1, 1.1) == pytest.approx(
        0.75 * nbytes / NVLINK, rel=1e-12
    )
    want16 = max(7 / 16 * nbytes / NVLINK, 8 / 16 * nbytes / NIC + 8 * LAT)
    assert want16 == 8 / 16 * nbytes / NIC + 8 * LAT
    assert perf.ep_all_to_all_s(H100, 1, 1, 16, 1, 1.1) == pytest.approx(want16, rel=1e-12)
    # in a stage: 2 all-to-alls per MoE layer forward, 2 backward (3 of the 4 blocks are MoE)
    cfg = job_config(prob.instance.job, 1, 1, 1, 1, 16, (4,), "synchronous", 1, 4)
    ops = perf.stage_times(cfg, "h100-sxm")[0].ops
    a2a = 0.75 * nbytes / NVLINK
    assert ops.ep_fwd == pytest.approx(3 * 2 * a2a, rel=1e-12)
    assert ops.ep_bwd == pytest.approx(3 * 2 * a2a, rel=1e-12)


def test_ring_attention_hidden_under_attention_by_hand() -> None:
    """tiny-gqa at s 8192, cp 2, tp 1: each rank holds 4096 tokens; its KV chunk is 4096 x
    2 x 128 (kv dim) x 2 bytes, one step on NVLink forward. The attention core of a layer
    is 4 x 4096 x 8192 x 512 FLOPs at the catalog attention efficiency: the ring hides
    under it (nothing exposed) and the hidden time is 3 rings per layer (1 fwd + 2 bwd)."""
    prob = _problem("tiny-gqa", seq_len=8192)
    perf = PerfModel(prob)
    chunk = 4096 * 2 * 128 * 2
    ring = chunk / NVLINK
    assert perf.cp_ring_s(H100, 1, 2, 1) == pytest.approx(ring, rel=1e-12)
    core = 4 * 4096 * 8192 * 512 / (989e12 * H100.attention_efficiency)
    assert ring < core
    cfg = job_config(prob.instance.job, 1, 1, 1, 1, 64, (4,), "synchronous", cp=2)
    ops = perf.stage_times(cfg, "h100-sxm")[0].ops
    assert ops.attn_fwd == pytest.approx(4 * core, rel=1e-12)
    assert ops.cp_fwd == 0.0 and ops.cp_bwd == 0.0
    assert ops.cp_hidden == pytest.approx(4 * 3 * ring, rel=1e-12)
    # over the NICs (cp 16 on 8-GPU nodes) with a short sequence the ring is exposed:
    # 15 steps of a 256-token chunk vs an attention core of 256 x 4096 tokens
    prob = _problem("tiny-gqa", seq_len=4096)
    perf = PerfModel(prob)
    chunk = 256 * 256 * 2
    ring = 15 * (LAT + chunk / NIC)
    assert perf.cp_ring_s(H100, 1, 16, 1) == pytest.approx(ring, rel=1e-12)
    core = 4 * 256 * 4096 * 512 / (989e12 * H100.attention_efficiency)
    cfg = job_config(prob.instance.job, 1, 1, 1, 1, 64, (4,), "synchronous", cp=16)
    ops = perf.stage_times(cfg, "h100-sxm")[0].ops
    assert ops.cp_fwd == pytest.approx(4 * (ring - core), rel=1e-9)
    # selective recompute (the default): backward sends KV and dKV under twice the core
    assert ops.cp_bwd == pytest.approx(4 * max(0.0, 2 * ring - 2 * core), rel=1e-9)


# ----------------------------------------------------------------------------- memory


def test_experts_sharded_by_ep_by_hand() -> None:
    """tiny-moe on one stage, tp 1, no ZeRO-1: 16 bytes per dense parameter, 16 per routed
    expert parameter / ep. Routed experts: 3 MoE layers x 8 x 2 x 256 x 256."""
    m = load_model("tiny-moe")
    experts = 3 * 8 * 2 * 256 * 256
    dense = param_count(m) - experts
    for ep in (1, 2, 8):
        mem = stage_memory_bytes(m, 4, 0, 1, 1, 1, 1, 1, "selective", False, ep=ep)
        assert mem["model_state"] == pytest.approx(16 * (dense + experts / ep), rel=1e-12)
    # ZeRO-1 over dp 2: dense optimizer bytes over dp x cp x ep, experts' over dp x tp x cp
    mem = stage_memory_bytes(m, 4, 0, 1, 1, 2, 1, 1, "selective", True, ep=4, cp=2)
    want = dense * (4 + 12 / 16) + experts / 4 * (4 + 12 / 4)
    assert mem["model_state"] == pytest.approx(want, rel=1e-12)


def test_activations_divided_by_cp() -> None:
    m = load_model("llama3-405b")
    one = stage_memory_bytes(m, 8, 1, 4, 8, 1, 1, 4, "selective", True)
    two = stage_memory_bytes(m, 8, 1, 4, 8, 1, 1, 4, "selective", True, cp=2)
    assert two["activations"] == pytest.approx(one["activations"] / 2, rel=1e-12)


def test_moe_activation_bytes_by_hand() -> None:
    """tiny-moe layer (GELU, h 256, expert width 256, top-2), s 256, b 1, tp 1, selective:
    the dense 34 h per token with the MLP's 19 h replaced by 3 h (input, mask) + 2 x 1.1 x
    (2 h permuted input + 4 x 256 fc1 and GELU outputs)."""
    from placer.perf.flops import activation_bytes_per_layer

    m = load_model("tiny-moe")
    h = 256
    per_token = 34 * h - 19 * h + 3 * h + 2 * 1.1 * (2 * h + 4 * 256)
    got = activation_bytes_per_layer(m, 1, 1, "selective", 1, True, 1.1)
    assert got == pytest.approx(256 * per_token, rel=1e-12)


# ----------------------------------------------------------------------------- packing


@pytest.mark.parametrize(
    ("gpn", "tp", "width", "slots", "block", "replicas", "nodes"),
    [
        (8, 2, 4, 2, 1, 3, 2),  # two 4-GPU replica stages per node
        (8, 1, 16, 1, 2, 3, 6),  # ep 16 spans two nodes
        (4, 2, 16, 1, 4, 1, 4),
        (8, 1, 12, 0, 1, 1, 2),  # 12 GPUs do not tile 8-GPU nodes: refused (0 slots)
    ],
)
def test_replica_packing(gpn, tp, width, slots, block, replicas, nodes) -> None:
    assert replica_slots(gpn, tp, width) == (slots, block)
    assert nodes_for(gpn, tp, width, replicas) == nodes


def test_plan_wider_than_a_node_is_evaluated() -> None:
    """ep 8 on 4-GPU nodes: each replica stage spans 2 nodes, so 2 replicas use 16 GPUs in
    4 nodes; Megatron's data-parallel size is dp x ep = 16, so 64 sequences are 4
    micro-batches of 1 per replica."""
    prob = _problem("tiny-moe", gpus=64, gpn=4)
    plan = {
        "parallelism": {"tp": 1, "pp": 1, "dp": 2, "ep": 8, "micro_batch": 1},
        "stage_layers": [4],
        "replica_groups": [{"count": 2, "stage_sites": ["dc"]}],
    }
    ev = evaluate(prob, plan)
    assert ev.feasible, ev.violations
    assert ev.config.num_micro_batches == 4 and ev.config.gpus == 16
    assert ev.gpus_by_site == {"dc": 16} and ev.nodes_by_site == {"dc": 4}
    bad = {**plan, "parallelism": {**plan["parallelism"], "ep": 3}}
    ev = evaluate(prob, bad)
    assert not ev.feasible
    assert any("does not divide the 8 experts" in v.message for v in ev.violations)


# ----------------------------------------------------------------------------- optimizer


def test_library_optima_use_ep_and_cp() -> None:
    """The exhaustive search picks EP and CP where they pay (the library's designed cases;
    tests/test_solver_library.py checks CP-SAT and the MILP against it)."""
    from placer.optimize.driver import solve

    ids = {c.id: c for c in sc.PARALLEL_5D}
    par = solve(problem_from_data(ids["ep-nvlink-nic"].instance), backend="brute").plan.parallelism
    assert (par.ep or 1) > 1
    par = solve(problem_from_data(ids["cp-ring"].instance), backend="brute").plan.parallelism
    assert (par.cp or 1) > 1


def test_mla_gemms_and_attention_core_by_hand() -> None:
    """DeepSeek-V3's attention on one rank (tp 2, 4096 tokens): q down 4096 x 1536 x 7168
    and kv down 4096 x (512 + 64) x 7168 replicated; q up 128 x 192 / 2 wide, kv up
    128 x (128 + 128) / 2 wide from the 512 latent, output 7168 from 128 x 128 / 2. The core
    counts 2 s (q_dim + v_dim) = 2 s 128 (192 + 128) FLOPs per token, not 4 s h."""
    from placer.perf.flops import attention_core_flops_per_token, kv_exchange_width

    m = load_model("deepseek-v3")
    got = {g.name: (g.m, g.n, g.k) for g in compute.attention_gemms(m, 4096, 2)}
    assert got == {
        "q_down": (4096, 1536, 7168),
        "q_up": (4096, 128 * 192 // 2, 1536),
        "kv_down": (4096, 576, 7168),
        "kv_up": (4096, 128 * 256 // 2, 512),
        "attn_proj": (4096, 7168, 128 * 128 // 2),
    }
    assert attention_core_flops_per_token(m, 4096) == 2 * 4096 * 128 * (192 + 128)
    assert kv_exchange_width(m) == 128 * 192 + 128 * 128  # decompressed K and V per token


# ----------------------------------------------------------------------------- MoE fidelity
# (issue 16 items 2 and 6: the all-to-all overlap window, node-limited dedup, FP8 dispatch)


def test_overlap_window_hides_all_part_none_by_hand() -> None:
    """One MoE layer, forward all-to-alls 3 ms, backward 4 ms. Compute forward 5 ms /
    backward 10 ms hides both; forward 2 / backward 1 leaves 3 - 1 = 2 forward and
    4 - 2 = 2 backward; no compute leaves everything; without the overlap all of it."""
    assert compute.ep_exposed_s(3e-3, 4e-3, 5e-3, 10e-3, True) == (0.0, 0.0)
    f, b = compute.ep_exposed_s(3e-3, 4e-3, 2e-3, 1e-3, True)
    assert f == pytest.approx(2e-3, rel=1e-12) and b == pytest.approx(2e-3, rel=1e-12)
    assert compute.ep_exposed_s(3e-3, 4e-3, 0.0, 0.0, True) == (3e-3, 4e-3)
    assert compute.ep_exposed_s(3e-3, 4e-3, 5e-3, 10e-3, False) == (3e-3, 4e-3)


def _overlap_problem(**job: object):
    return problem_from_data(
        {
            "name": "ov",
            "sites": [{"name": "dc", "gpu": "h100-sxm", "gpus": 64}],
            "job": {"model": "tiny-moe", "global_batch": 64, **job},
        }
    )


def test_overlap_in_a_stage_by_hand() -> None:
    """tiny-moe, ep 4 on NVLink (the all-to-all of test_dispatch_on_nvlink_and_nics_by_hand):
    under job.overlap.ep_comm the 3 MoE layers' 2 + 2 all-to-alls per micro-batch hide
    entirely (a few us of NVLink against the layer's GEMMs); the hidden time is all of them
    and the forward / backward lose exactly what the default exposes (the forward also the
    partner's expert backward from the host time). With pp 2 and no
    virtual pipeline, Megatron-Core refuses the overlap: nothing hides."""
    a2a = 0.75 * (256 * 2 * 256 * 2 * 1.1) / NVLINK
    on, off = _overlap_problem(overlap={"ep_comm": True}), _overlap_problem()
    cfg_on = job_config(on.instance.job, 1, 1, 1, 1, 16, (4,), "synchronous", 1, 4)
    cfg_off = job_config(off.instance.job, 1, 1, 1, 1, 16, (4,), "synchronous", 1, 4)
    assert cfg_on.ep_overlap and not cfg_off.ep_overlap
    t_on = PerfModel(on).stage_times(cfg_on, "h100-sxm")[0]
    t_off = PerfModel(off).stage_times(cfg_off, "h100-sxm")[0]
    assert t_on.ops.ep_fwd == 0.0 and t_on.ops.ep_bwd == 0.0
    assert t_on.ops.ep_hidden == pytest.approx(3 * 4 * a2a, rel=1e-12)
    # the forward also loses host time: the partner's routed-expert backward queued before
    # the dispatcher's sync (compute.moe_host_exposed_s): 256 x 2 x 1.1 = 563.2 pairs over
    # 2 local experts -> 282 tokens each, 2 experts x 2 GEMMs of 282 x 256 x 256 per layer
    partner = 2 * 2 * compute.gemm_s(H100, compute.Gemm("expert", 282, 256, 256), "bf16")
    assert t_off.ops.host_fwd - t_on.ops.host_fwd == pytest.approx(3 * partner, rel=1e-9)
    assert t_off.fwd - t_on.fwd == pytest.approx(3 * 2 * a2a + 3 * partner, rel=1e-9)
    assert t_off.bwd - t_on.bwd == pytest.approx(3 * 2 * a2a, rel=1e-9)
    pp2 = job_config(on.instance.job, 1, 2, 1, 1, 16, (2, 2), "synchronous", 1, 4)
    assert not pp2.ep_overlap
    pp2v = job_config(
        on.instance.job, 1, 2, 1, 1, 16, (2, 2), "synchronous", 1, 4, virtual_stages=2
    )
    assert pp2v.ep_overlap


def test_deepep_sm_share_under_overlap_by_hand() -> None:
    """DeepEP's kernels hold a fraction f of the SMs while they run (catalog
    deepep_sm_fraction, 20 / 132 on H100): a comm of C beside compute P ends at
    C + max(0, P - C (1 - f)) (the compute's C (1 - f) done during the comm, the rest after
    it), so P + the exposed share. Checked against that timeline at both sides of the
    kink C = P / (1 - f), and f = 0 is the plain window."""
    f = 20 / 132

    def timeline(c: float, p: float) -> float:
        return c + max(0.0, p - c * (1 - f)) - p

    for c, p in ((3e-3, 10e-3), (3e-3, 5e-3), (4e-3, 1e-3), (5e-3, 5e-3 * (1 - f))):
        got = compute.ep_exposed_s(c, c, p, p, True, f)
        assert got[0] == pytest.approx(timeline(c, p), rel=1e-12, abs=1e-18)
        assert got[1] == got[0]
    assert compute.ep_exposed_s(3e-3, 4e-3, 5e-3, 10e-3, True, f) == pytest.approx(
        (f * 3e-3, f * 4e-3), rel=1e-12
    )
    assert compute.ep_exposed_s(3e-3, 4e-3, 5e-3, 10e-3, False, f) == (3e-3, 4e-3)
    assert H100.deepep_sm_fraction == pytest.approx(f, rel=1e-3)
    # in a stage: tiny-moe ep 4 on NVLink under the overlap, its 3 MoE layers' 2 + 2
    # all-to-alls per micro-batch are hidden by the layer's GEMMs; with deepep f of each is
    # still exposed, with alltoall (NCCL, not charged) none
    for disp, share in (("deepep", H100.deepep_sm_fraction), ("alltoall", 0.0)):
        prob = _overlap_problem(overlap={"ep_comm": True}, moe_dispatcher=disp)
        cfg = job_config(prob.instance.job, 1, 1, 1, 1, 16, (4,), "synchronous", 1, 4)
        perf = PerfModel(prob)
        a2a = perf.ep_all_to_all_s(H100, 1, 1, 4, 1, 1.1, disp)
        t = perf.stage_times(cfg, "h100-sxm")[0]
        assert t.ops.ep_fwd == pytest.approx(3 * 2 * share * a2a, rel=1e-9, abs=1e-15)
        assert t.ops.ep_bwd == pytest.approx(3 * 2 * share * a2a, rel=1e-9, abs=1e-15)
        assert t.ops.ep_hidden == pytest.approx(3 * 4 * (1 - share) * a2a, rel=1e-9)


def test_overlap_with_full_recompute_is_refused() -> None:
    """Megatron-Core asserts 'disable full recomputation when enabling
    overlap_moe_expert_parallel_comm': the instance is rejected, naming the field."""
    with pytest.raises(Exception, match="overlap.ep_comm"):
        _overlap_problem(overlap={"ep_comm": True}, recompute="full")
    with pytest.raises(Exception, match="moe_dispatch_precision"):
        _overlap_problem(moe_dispatch_precision="fp8")


def _brute_nodes(experts: int, top_k: int, nodes: int, allowed: int) -> tuple[float, float]:
    """(distinct nodes, distinct nodes other than the sender's node 0) of a token, averaged
    over every set of `allowed` nodes and every top_k subset of their experts (uniform)."""
    from itertools import combinations

    per = experts // nodes
    tot = rem = cnt = 0
    for sel in combinations(range(nodes), allowed):
        pool = [(n, j) for n in sel for j in range(per)]
        for pick in combinations(pool, top_k):
            hit = {n for n, _ in pick}
            tot += len(hit)
            rem += len(hit - {0})
            cnt += 1
    return tot / cnt, rem / cnt


@pytest.mark.parametrize(
    ("experts", "top_k", "nodes", "limit"), [(8, 2, 4, 2), (12, 3, 4, None), (16, 4, 4, 3)]
)
def test_expected_token_nodes_against_enumeration(experts, top_k, nodes, limit) -> None:
    """The closed form D (and the remote share D (N - 1) / N the NIC carries) against an
    exhaustive enumeration of node sets and expert picks."""
    d, remote = _brute_nodes(experts, top_k, nodes, limit or nodes)
    got = compute.expected_token_nodes(experts, top_k, nodes, limit)
    assert got == pytest.approx(d, rel=1e-12)
    assert got * (nodes - 1) / nodes == pytest.approx(remote, rel=1e-12)


def test_node_limited_dedup_bytes_by_hand() -> None:
    """DeepSeek-V3 at ep 64 (8 nodes of 8), b 1, s 4096, tp 1: 4096 tokens per rank.
    Without dedup the NIC carries top-8 x 56/64 copies of each token (7 per token). With
    per-node dedup and at most 4 nodes per token: D = 4 (1 - C(96, 8)/C(128, 8)) distinct
    nodes, 7/8 of them remote; NVLink carries 8 x 7/8 copies. FP8: 1 + 4/128 bytes per value."""
    from math import comb

    m = load_model("deepseek-v3")
    h, tok = 7168, 4096
    d = 4 * (1 - comb(96, 8) / comb(128, 8))
    assert 3.5 < d < 4.0
    nvl, nic = compute.moe_node_dispatch_bytes(m, tok, 1, 1.0, 64, 8)
    assert nic == pytest.approx(tok * d * 7 / 8 * h * 2, rel=1e-12)
    assert nvl == pytest.approx(tok * 8 * 7 / 8 * h * 2, rel=1e-12)
    flat = compute.moe_dispatch_bytes(m, tok, 1, 1.0)
    assert flat * 56 / 64 == pytest.approx(tok * 7 * h * 2, rel=1e-12)
    nvl8, nic8 = compute.moe_node_dispatch_bytes(
        m, tok, 1, 1.0, 64, 8, compute.token_value_bytes("fp8")
    )
    assert nic8 == pytest.approx(tok * d * 7 / 8 * h * 1.03125, rel=1e-12)
    # the time: NIC-bound, one message to each of the 7 other nodes
    want = max(nvl8 / NVLINK, nic8 / NIC + 7 * LAT)
    assert want == nic8 / NIC + 7 * LAT
    assert comm.node_dedup_all_to_all_s(8, nvl8, nic8, NVLINK, NIC, LAT) == pytest.approx(
        want, rel=1e-12
    )


def test_deepep_dispatch_in_the_step_model_by_hand() -> None:
    """tiny-moe with 16 experts (solver_cases.TINY_MOE16, at most 1 node per token), ep 16
    over two 8-GPU nodes, 256 tokens of h 256: D = 1, so the NIC carries 1/2 copy per token
    (the alltoall dispatcher: top-2 x 8/16 = 1 copy), NVLink 2 x 7/8 copies, x 1.1 imbalance."""
    model = {**sc.TINY_MOE16, "name": "tiny-moe16"}
    prob = problem_from_data(
        {
            "name": "dd",
            "sites": [{"name": "dc", "gpu": "h100-sxm", "gpus": 64}],
            "job": {"model": model, "global_batch": 64, "moe_dispatcher": "deepep"},
        }
    )
    perf = PerfModel(prob)
    per_tok = 256 * 256 * 2 * 1.1
    want = max(2 * 7 / 8 * per_tok / NVLINK, 0.5 * per_tok / NIC + LAT)
    got = perf.ep_all_to_all_s(H100, 1, 1, 16, 1, 1.1, "deepep")
    assert got == pytest.approx(want, rel=1e-12)
    flat = perf.ep_all_to_all_s(H100, 1, 1, 16, 1, 1.1)
    assert flat == pytest.approx(
        max(7 / 16 * 2 * per_tok / NVLINK, 8 / 16 * 2 * per_tok / NIC + 8 * LAT), rel=1e-12
    )
    assert got < flat


def test_overlap_and_dispatcher_flags_exported() -> None:
    """--overlap-moe-expert-parallel-comm exactly where the model hides the all-to-all (pp 1
    here; not for pp 2 without virtual stages), the flex/deepep dispatcher, and node-limited
    routing as Megatron-Core's group-limited routing only when EP spans more nodes than the
    limit (ep 16 = 2 nodes > 1)."""
    from placer.outputs.export import render
    from placer.schema import Plan

    model = {**sc.TINY_MOE16, "name": "tiny-moe16"}

    def export(pp: int, ep: int) -> str:
        prob = problem_from_data(
            {
                "name": "fx",
                "sites": [{"name": "dc", "gpu": "h100-sxm", "gpus": 64}],
                "job": {
                    "model": model,
                    "global_batch": 64,
                    "overlap": {"ep_comm": True},
                    "moe_dispatcher": "deepep",
                },
            }
        )
        plan = Plan.model_validate(
            {
                "parallelism": {"tp": 1, "pp": pp, "dp": 1, "ep": ep, "micro_batch": 1},
                "stage_layers": [4 // pp] * pp,
                "replica_groups": [{"count": 1, "stage_sites": ["dc"] * pp}],
            }
        )
        assert evaluate(prob, plan).feasible
        return render(prob, plan, "megatron")["megatron_args.sh"]

    a = export(1, 16)
    assert "--overlap-moe-expert-parallel-comm" in a
    assert "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep" in a
    assert "--moe-router-num-groups 2 --moe-router-group-topk 1" in a
    b = export(2, 8)
    assert "--overlap-moe-expert-parallel-comm" not in b
    assert "--moe-router-num-groups" not in b
