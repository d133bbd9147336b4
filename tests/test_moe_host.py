"""Host time of eager MoE layers (issue 16 item 6): the catalog's moe_layer_host_s once per
MoE layer forward (and recomputed forward), none for dense layers or under
job.moe_cuda_graphs, by hand arithmetic on tiny-moe (4 layers, layer 0 dense, 3 MoE).

The expected figures are written out from the docstrings of placer.perf.compute.moe_host_s
and stage_ops, not read back from the model.
"""

from __future__ import annotations

import pytest

from placer.evaluate import evaluate
from placer.io import build_catalog, load_model, problem_from_data
from placer.perf import compute
from placer.perf.step import PerfModel
from placer.rules import job_config

CAT = build_catalog()
H100 = CAT.gpus["h100-sxm"]
N_MOE = 3  # tiny-moe: layers 1-3 are MoE (first_dense_layers 1)
HOST = 5.75e-3  # the catalog's moe_layer_host_s (benchmarks/moe_bench.py fit, branch moehost)


def _problem(**job: object):
    return problem_from_data(
        {
            "name": "host",
            "sites": [{"name": "dc", "gpu": "h100-sxm", "gpus": 64}],
            "job": {"model": "tiny-moe", "global_batch": 64, **job},
        }
    )


def _stage(prob, micro: int = 16):  # noqa: ANN001, ANN202
    cfg = job_config(prob.instance.job, 1, 1, 1, 1, micro, (4,), "synchronous", 1, 4)
    return PerfModel(prob).stage_times(cfg, "h100-sxm")[0]


def test_catalog_prices_eager_moe_layers() -> None:
    """Every built-in GPU carries the fitted 5.75 ms (benchmarks/moe_bench.py fit: the five
    25.11 Megatron-Bridge rows run without CUDA graphs), and the catalog labels it."""
    for name, gpu in CAT.gpus.items():
        assert gpu.moe_layer_host_s == HOST, name


def test_moe_host_s_by_hand() -> None:
    """The catalog value for an MoE model run eagerly; 0 for a dense model, 0 under CUDA
    graphs."""
    moe, dense = load_model("tiny-moe"), load_model("tiny-4l")
    assert compute.moe_host_s(H100, moe, cuda_graphs=False) == HOST
    assert compute.moe_host_s(H100, moe, cuda_graphs=True) == 0.0
    assert compute.moe_host_s(H100, dense, cuda_graphs=False) == 0.0


@pytest.mark.parametrize("recompute", ["selective", "none", "full"])
def test_host_time_in_the_stage_by_hand(recompute: str) -> None:
    """tiny-moe on one stage (stage_ops with 1 ms per MoE layer forward): 3 MoE layers x 1 ms
    in the forward; in the backward only the recomputed forward of full recompute repeats
    the sync (3 ms), else nothing; the compute terms do not move."""
    m = load_model("tiny-moe")

    def ops(host: float):  # noqa: ANN202
        return compute.stage_ops(
            H100, m, 4, True, 1, 1, recompute, "bf16", True, 0.0, 0.0, ep=4, moe_host_s=host
        )

    eager, none = ops(1e-3), ops(0.0)
    want_bwd = 3e-3 if recompute == "full" else 0.0
    assert eager.host_fwd == pytest.approx(3e-3, rel=1e-12)
    assert eager.host_bwd == pytest.approx(want_bwd, rel=1e-12)
    assert eager.fwd - none.fwd == pytest.approx(3e-3, rel=1e-9)
    assert eager.bwd - none.bwd == pytest.approx(want_bwd, abs=1e-15)
    assert eager.matmul == none.matmul and eager.memory_bound == none.memory_bound


def test_cuda_graphs_remove_the_host_time_from_the_stage() -> None:
    """The job switch: eager, the stage's forward carries 3 x 5.75 ms; with
    job.moe_cuda_graphs nothing, and the compute is the same."""
    eager = _stage(_problem())
    graphs = _stage(_problem(moe_cuda_graphs=True))
    assert eager.ops.host_fwd == pytest.approx(N_MOE * HOST, rel=1e-12)
    assert graphs.ops.host_fwd == 0.0 and graphs.ops.host_bwd == 0.0
    assert eager.fwd - graphs.fwd == pytest.approx(N_MOE * HOST, rel=1e-9)
    assert eager.bwd == pytest.approx(graphs.bwd, rel=1e-12)
    assert eager.fwd_compute == graphs.fwd_compute


def test_stage_ops_takes_the_host_time_per_moe_layer() -> None:
    """stage_ops with moe_host_s = 1 ms on tiny-moe's stages: layer 0 alone (dense) gets none,
    layers 1-3 get 3 ms, layers 0-1 get 1 ms."""
    m = load_model("tiny-moe")

    def ops(first: int, layers: int):  # noqa: ANN202
        return compute.stage_ops(
            H100, m, layers, False, 1, 1, "selective", "bf16", True, 0.0, 0.0,
            first_layer=first, ep=4, moe_host_s=1e-3,
        )  # fmt: skip

    assert ops(0, 1).host_fwd == 0.0
    assert ops(1, 3).host_fwd == pytest.approx(3e-3, rel=1e-12)
    assert ops(0, 2).host_fwd == pytest.approx(1e-3, rel=1e-12)


def test_step_breakdown_and_plan_by_hand() -> None:
    """One stage, ep 4, 16 micro-batches (global batch 64 over ep 4): the step is
    16 x 3 x 5.75 ms = 0.276 s slower eager than with CUDA graphs, the breakdown shows it as
    moe_host_s and nowhere else (TP communication unchanged)."""
    plan = {
        "parallelism": {"tp": 1, "pp": 1, "dp": 1, "ep": 4, "micro_batch": 1},
        "stage_layers": [4],
        "replica_groups": [{"count": 1, "stage_sites": ["dc"]}],
    }
    eager = evaluate(_problem(), plan)
    graphs = evaluate(_problem(moe_cuda_graphs=True), plan)
    assert eager.feasible and graphs.feasible
    want = 16 * N_MOE * HOST
    assert eager.step_time_s - graphs.step_time_s == pytest.approx(want, rel=1e-9)
    assert eager.breakdown["moe_host_s"] == pytest.approx(want, rel=1e-9)
    assert "moe_host_s" not in graphs.breakdown
    assert eager.breakdown["tp_comm_s"] == pytest.approx(graphs.breakdown["tp_comm_s"], abs=1e-12)


def test_custom_gpu_without_the_field_prices_nothing() -> None:
    """An instance catalog GPU that does not give moe_layer_host_s gets 0 (not priced)."""
    spec = H100.model_dump(exclude_none=True)
    spec.pop("moe_layer_host_s")
    prob = problem_from_data(
        {
            "name": "custom",
            "catalog": {"gpus": {"myh100": spec}},
            "sites": [{"name": "dc", "gpu": "myh100", "gpus": 64}],
            "job": {"model": "tiny-moe", "global_batch": 64},
        }
    )
    assert prob.catalog.gpus["myh100"].moe_layer_host_s == 0.0


def _export(**job: object) -> str:
    from placer.outputs.export import render
    from placer.schema import Plan

    prob = _problem(**job)
    plan = Plan.model_validate(
        {
            "parallelism": {"tp": 1, "pp": 1, "dp": 1, "ep": 4, "micro_batch": 1},
            "stage_layers": [4],
            "replica_groups": [{"count": 1, "stage_sites": ["dc"]}],
        }
    )
    return render(prob, plan, "megatron")["megatron_args.sh"]


def test_cuda_graph_flags_exported_only_when_the_model_assumes_them() -> None:
    """job.moe_cuda_graphs asks Megatron-Core for the partial graphs the model assumes
    (TransformerConfig accepts moe_preprocess only with moe_router); eager runs get no
    CUDA-graph flag and their launch file says the host time is priced."""
    graphs = _export(moe_cuda_graphs=True)
    assert "--cuda-graph-impl transformer_engine --cuda-graph-scope moe_router moe_preprocess" in (
        graphs
    )
    eager = _export()
    assert "--cuda-graph" not in eager
    assert "moe_layer_host_s" in eager


def test_cuda_graphs_with_full_recompute_is_refused() -> None:
    """Megatron-Core's TransformerConfig: 'full recompute is only supported with full
    iteration CUDA graph': the instance is rejected, naming the field."""
    with pytest.raises(Exception, match="moe_cuda_graphs"):
        _problem(recompute="full", moe_cuda_graphs=True)


# Under Megatron-Core's combined 1F1B (job.overlap.ep_comm) the other micro-batch's routed-
# expert backward is queued on the compute stream when the host blocks on the dispatcher's
# D2H event (compute.moe_host_exposed_s): exposed max(0, host - partner).


def test_moe_host_exposed_s_by_hand() -> None:
    """None hidden without the overlap; part (5 - 2 = 3 ms); all (the partner's 7 ms exceed
    the 5 ms host time: 0, not negative)."""
    assert compute.moe_host_exposed_s(5e-3, 2e-3, ep_overlap=False) == 5e-3
    assert compute.moe_host_exposed_s(5e-3, 2e-3, ep_overlap=True) == pytest.approx(3e-3)
    assert compute.moe_host_exposed_s(5e-3, 7e-3, ep_overlap=True) == 0.0
    assert compute.moe_host_exposed_s(0.0, 2e-3, ep_overlap=True) == 0.0


def _partner_by_hand() -> float:
    """tiny-moe, micro-batch 1 (256 tokens), tp 1, ep 4: 256 x top-2 = 512 pairs over 8 / 4 =
    2 local experts, 256 tokens each; a non-gated expert FFN of 256 is two GEMMs of
    256 x 256 x 256 (in: N = 256, K = hidden 256; out: N = hidden, K = 256), so the routed
    experts' forward (= their data-gradient backward) is 2 experts x 2 GEMMs of that shape."""
    g = compute.Gemm("expert", 256, 256, 256)
    return 2 * 2 * compute.gemm_s(H100, g, "bf16")


@pytest.mark.parametrize(("host_over_partner", "overlap"), [(0.5, True), (3.0, True), (3.0, False)])
def test_partner_backward_hides_host_time_in_the_stage(
    host_over_partner: float, overlap: bool
) -> None:
    """stage_ops on tiny-moe's 4 layers (3 MoE): host time at 0.5 x the partner's expert
    backward is hidden entirely under ep_overlap, at 3 x it leaves 3 layers x 2 partners,
    without the overlap all 3 x 3 partners stay; nothing else in the stage moves."""
    m = load_model("tiny-moe")
    partner = _partner_by_hand()
    host = host_over_partner * partner

    def ops(h: float):  # noqa: ANN202
        return compute.stage_ops(
            H100, m, 4, True, 1, 1, "selective", "bf16", True, 0.0, 0.0,
            ep=4, moe_host_s=h, ep_overlap=overlap,
        )  # fmt: skip

    with_host, without = ops(host), ops(0.0)
    want = N_MOE * (max(0.0, host - partner) if overlap else host)
    assert with_host.host_fwd == pytest.approx(want, rel=1e-9, abs=1e-15)
    assert with_host.host_bwd == 0.0
    assert with_host.fwd - without.fwd == pytest.approx(want, rel=1e-9, abs=1e-15)
    assert with_host.bwd == without.bwd and with_host.matmul == without.matmul


def test_overlap_job_hides_partner_backward_in_the_step() -> None:
    """One stage, ep 4, 16 micro-batches, job.overlap.ep_comm: the eager step is
    16 x 3 x (5.75 ms - partner) slower than with CUDA graphs (breakdown moe_host_s);
    at pp 2 without a virtual pipeline Megatron-Core refuses the overlap (Config.ep_overlap
    false), so the full 16 x 3 x 5.75 ms stays in the breakdown."""

    def plan(pp: int) -> dict:
        return {
            "parallelism": {"tp": 1, "pp": pp, "dp": 1, "ep": 4, "micro_batch": 1},
            "stage_layers": [4] if pp == 1 else [2, 2],
            "replica_groups": [{"count": 1, "stage_sites": ["dc"] * pp}],
        }

    overlap = {"overlap": {"ep_comm": True}, "expert_load_imbalance": 1.0}  # 256 tokens/expert
    eager = evaluate(_problem(**overlap), plan(1))
    graphs = evaluate(_problem(moe_cuda_graphs=True, **overlap), plan(1))
    assert eager.feasible and graphs.feasible
    want = 16 * N_MOE * (HOST - _partner_by_hand())
    assert 0.0 < want < 16 * N_MOE * HOST
    assert eager.breakdown["moe_host_s"] == pytest.approx(want, rel=1e-9)
    assert eager.step_time_s - graphs.step_time_s == pytest.approx(want, rel=1e-9)
    # pp 2, v 1: no overlap; the busiest stage holds layers 2-3, i.e. 2 MoE layers
    no_overlap = evaluate(_problem(**overlap), plan(2))
    assert no_overlap.feasible
    assert no_overlap.breakdown["moe_host_s"] == pytest.approx(16 * 2 * HOST, rel=1e-9)
