"""The MoE fidelity exports (consumers/case-moe, issue 16 items 2 and 6) in megatron-core's own
TransformerConfig: the all-to-all overlap (--overlap-moe-expert-parallel-comm), the flex/DeepEP
dispatcher and group-limited (node-limited) routing, exactly where placer's step model hides
the all-to-all. The oracle can fail: the pp 2 export without a virtual pipeline, with the
overlap flag added by hand, is refused by megatron-core, which is why placer leaves it out."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from conftest import ROOT, megatron_lm_src, megatron_validate, require


def _dir(name: str) -> Path:
    base = Path(os.environ.get("PLACER_EXPORT_MOE", ROOT / "build" / "consumers" / "export-moe"))
    return base / name


def _export(name: str) -> dict[str, list[str]]:
    d = _dir(name)
    require((d / "megatron_args.sh").exists(), f"placer's MoE export in {d} (make test-consumers)")
    body = (d / "megatron_args.sh").read_text().split("MEGATRON_ARGS=(", 1)[1].split("\n)", 1)[0]
    out: dict[str, list[str]] = {}
    key = None
    for t in shlex.split(body, comments=True):
        if t.startswith("--"):
            key = t
            out[key] = []
        elif key is not None:
            out[key].append(t)
    return out


def _config(a: dict[str, list[str]]):  # noqa: ANN202 - megatron.core TransformerConfig
    """TransformerConfig from the exported values, mapped as megatron/training's
    core_transformer_config_from_args maps them (the MoE and pipeline fields)."""
    import torch
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import CudaGraphScope

    def one(flag: str, cast=int, default=None):  # noqa: ANN001, ANN202
        return cast(a[flag][0]) if flag in a and a[flag] else default

    pp = one("--pipeline-model-parallel-size")
    v = one("--num-virtual-stages-per-pipeline-rank")
    return TransformerConfig(
        num_layers=one("--num-layers"),
        hidden_size=one("--hidden-size"),
        ffn_hidden_size=one("--ffn-hidden-size"),
        num_attention_heads=one("--num-attention-heads"),
        tensor_model_parallel_size=one("--tensor-model-parallel-size"),
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=v,
        pipeline_dtype=torch.bfloat16,
        bf16="--bf16" in a,
        params_dtype=torch.bfloat16,
        add_bias_linear="--disable-bias-linear" not in a,
        gated_linear_unit="--swiglu" in a,
        num_moe_experts=one("--num-experts"),
        moe_router_topk=one("--moe-router-topk"),
        moe_ffn_hidden_size=one("--moe-ffn-hidden-size"),
        expert_model_parallel_size=one("--expert-model-parallel-size"),
        expert_tensor_parallel_size=one("--expert-tensor-parallel-size"),
        moe_token_dispatcher_type=one("--moe-token-dispatcher-type", str),
        moe_flex_dispatcher_backend=one("--moe-flex-dispatcher-backend", str, "deepep"),
        moe_router_num_groups=one("--moe-router-num-groups"),
        moe_router_group_topk=one("--moe-router-group-topk"),
        moe_layer_freq=eval(a["--moe-layer-freq"][0]) if "--moe-layer-freq" in a else 1,  # noqa: S307
        overlap_moe_expert_parallel_comm="--overlap-moe-expert-parallel-comm" in a,
        recompute_granularity=one("--recompute-granularity", str),
        recompute_method=one("--recompute-method", str),
        recompute_num_layers=one("--recompute-num-layers"),
        # megatron/training/arguments.py: --cuda-graph-scope's type maps each name to the enum
        cuda_graph_impl=one("--cuda-graph-impl", str, "none"),
        cuda_graph_scope=[CudaGraphScope[s] for s in a.get("--cuda-graph-scope", [])],
    )


@pytest.mark.parametrize("name", ["pp1", "vpp"])
def test_overlap_export_accepted_by_megatron_core(name: str) -> None:
    a = _export(name)
    assert "--overlap-moe-expert-parallel-comm" in a
    assert a["--moe-token-dispatcher-type"] == ["flex"]
    cfg = _config(a)
    assert cfg.overlap_moe_expert_parallel_comm
    assert cfg.moe_token_dispatcher_type == "flex" and cfg.moe_flex_dispatcher_backend == "deepep"
    if name == "pp1":  # ep 16 spans two 8-GPU nodes, a token may reach one
        assert (cfg.moe_router_num_groups, cfg.moe_router_group_topk) == (2, 1)


def test_overlap_left_out_where_megatron_core_refuses_it() -> None:
    a = _export("pp2")
    assert "--overlap-moe-expert-parallel-comm" not in a
    assert not _config(a).overlap_moe_expert_parallel_comm
    forced = {**a, "--overlap-moe-expert-parallel-comm": []}
    with pytest.raises(AssertionError, match="virtual_pipeline_model_parallel_size"):
        _config(forced)


# the full-recompute arguments placer exports (granularity full, method uniform, 1 layer)
FULL_RECOMPUTE = {
    "--recompute-granularity": ["full"],
    "--recompute-method": ["uniform"],
    "--recompute-num-layers": ["1"],
}


def test_full_recompute_with_the_overlap_is_refused_by_megatron_core() -> None:
    """What placer's instance check (Job: overlap.ep_comm with recompute full) mirrors: the
    full-recompute arguments placer exports (granularity full, method uniform, 1 layer)."""
    a = _export("pp1") | FULL_RECOMPUTE
    with pytest.raises(AssertionError, match="full recomputation"):
        _config(a)


@pytest.mark.parametrize("name", ["pp1", "vpp", "pp2"])
def test_megatron_lm_parse_and_validate_args(name: str) -> None:
    """Megatron-LM's own parse_args + validate_args on the MoE exports (needs MEGATRON_LM_SRC,
    as consumers/test_configs.py): the generated flags exist and pass its checks."""
    megatron_lm_src()  # skips first, as before
    megatron_validate(_dir(name), 32)  # consumers/case-moe: every plan uses the site's 32 GPUs


# ----------------------------------------------------------------------------- CUDA graphs
# consumers/case-moe/instance-graphs.yaml with plan-pp1.json (job.moe_cuda_graphs: placer
# prices no host time per MoE layer, so the export must ask for the graphs)


def test_cuda_graph_export_accepted_by_megatron_core() -> None:
    from megatron.core.transformer.enums import CudaGraphScope

    a = _export("graphs")
    assert a["--cuda-graph-impl"] == ["transformer_engine"]
    assert a["--cuda-graph-scope"] == ["moe_router", "moe_preprocess"]
    cfg = _config(a)
    assert cfg.cuda_graph_impl == "transformer_engine"
    assert cfg.cuda_graph_scope == [CudaGraphScope.moe_router, CudaGraphScope.moe_preprocess]


def test_cuda_graphs_with_full_recompute_refused_by_megatron_core() -> None:
    """What placer's instance check (Job: moe_cuda_graphs with recompute full) mirrors; and
    the eager export asks for no graphs."""
    a = _export("graphs") | FULL_RECOMPUTE
    with pytest.raises(AssertionError, match="full iteration CUDA graph"):
        _config(a)
    assert "--cuda-graph-impl" not in _export("pp1")


def test_megatron_lm_validates_cuda_graph_export() -> None:
    megatron_lm_src()
    megatron_validate(_dir("graphs"), 32)


# ----------------------------------------------------------------------------- EP folding
# consumers/case-moe/instance-etp.yaml (gated: no linear biases, which Megatron-Core refuses
# in MoE layers with expert TP > 1); plan-etp1.json: tp 2 with ep 8 x etp 1 (a replica stage
# of lcm(2, 8) = 8 GPUs, Megatron's data-parallel size 8); plan-etp2.json: tp 2 with ep 4 x
# etp 2 (8 GPUs, data-parallel 8)


@pytest.mark.parametrize("name, etp, ep", [("etp1", 1, 8), ("etp2", 2, 4)])
def test_folded_export_accepted_by_megatron_core(name: str, etp: int, ep: int) -> None:
    a = _export(name)
    assert a["--expert-tensor-parallel-size"] == [str(etp)]
    assert a["--expert-model-parallel-size"] == [str(ep)]
    assert a["--tensor-model-parallel-size"] == ["2"]
    cfg = _config(a)
    assert (cfg.expert_tensor_parallel_size, cfg.expert_model_parallel_size) == (etp, ep)


@pytest.mark.parametrize("name, etp, ep", [("etp1", 1, 8), ("etp2", 2, 4)])
def test_folded_rank_map_is_megatron_cores_expert_groups(name: str, etp: int, ep: int) -> None:
    """megatron-core's own RankGenerator (parallel_state, the expert generator of
    initialize_model_parallel: tp = expert TP, cp = 1, dp = world / (etp ep pp)) builds
    the EP and expert-DP groups placer's rank map states, and the dense one the TP groups."""
    import csv

    from megatron.core.parallel_state import RankGenerator

    d = _dir(name)
    require((d / "megatron_args.sh").exists(), f"placer's MoE export in {d} (make test-consumers)")
    with open(d / "rankmap.csv") as f:
        rows = list(csv.DictReader(f))
    world, pp = len(rows), 2
    expert = RankGenerator(
        tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order="tp-cp-ep-dp-pp"
    )
    dense = RankGenerator(tp=2, ep=1, dp=world // (2 * pp), pp=pp, cp=1, order="tp-cp-ep-dp-pp")

    def groups(key) -> list[list[int]]:  # noqa: ANN001
        out: dict = {}
        for r in rows:
            out.setdefault(key(r), []).append(int(r["rank"]))
        return sorted(sorted(g) for g in out.values())

    etp_rank = {int(r["rank"]): int(r["rank"]) % (world // pp) % etp for r in rows}
    ep_groups = groups(lambda r: (r["pp"], r["expert_dp"], etp_rank[int(r["rank"])]))
    assert ep_groups == sorted(sorted(g) for g in expert.get_ranks("ep"))
    edp = groups(lambda r: (r["pp"], r["ep"], etp_rank[int(r["rank"])]))
    assert edp == sorted(sorted(g) for g in expert.get_ranks("dp"))
    assert groups(lambda r: (r["pp"], r["dp"])) == sorted(sorted(g) for g in dense.get_ranks("tp"))


@pytest.mark.parametrize("name", ["etp1", "etp2"])
def test_megatron_lm_validates_folded_exports(name: str) -> None:
    megatron_lm_src()
    megatron_validate(_dir(name), 32)
