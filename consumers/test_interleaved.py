"""Interleaved 1F1B exports (consumers/case-interleaved) in the real tools.

Three plans of the same instance (pp 4, v 2, 12 layers): plan.json with uneven ends
(--decoder-first/last-pipeline-num-layers + --num-virtual-stages-per-pipeline-rank),
plan-layout.json with uneven middle ranks (--pipeline-model-parallel-layout of 8 model
stages) and plan-chunks.json with uneven chunks (3 layers per rank in chunks of 1 and 2,
parallelism.chunk_layers, issue 16: a layout again). Megatron-Core's
account_for_embedding/loss_in_pipeline_split check placer's balanced chunk split. The
oracles are megatron-core 0.16's own layer assignment (get_num_layers_to_build,
get_transformer_layer_offset, PipelineParallelLayerLayout) and schedule
(get_schedule_table, get_pp_rank_microbatches), and torchtitan 0.3's config parser and
stage placement (_get_pp_rank_to_stage_indices_mapping): each (rank, chunk) must hold the
layers placer's model times, and Megatron must run the op order placer's closed form and
simulator evaluate (placer.perf.critical_path.interleaved_order).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, megatron_lm_src, megatron_validate, require

sys.path.insert(0, str(ROOT / "consumers"))
from probe import torchtitan_args  # noqa: E402

CASE = ROOT / "consumers" / "case-interleaved"
EXPORTS = {
    "plan": Path(
        os.environ.get("PLACER_EXPORT_VPP", ROOT / "build" / "consumers" / "export-interleaved")
    ),
    "plan-layout": Path(
        os.environ.get(
            "PLACER_EXPORT_VPP_LAYOUT", ROOT / "build" / "consumers" / "export-interleaved-layout"
        )
    ),
    "plan-chunks": Path(
        os.environ.get(
            "PLACER_EXPORT_VPP_CHUNKS", ROOT / "build" / "consumers" / "export-interleaved-chunks"
        )
    ),
}
LAYOUT_PLANS = ("plan-layout", "plan-chunks")


def _plan(name: str) -> dict:
    return json.loads((CASE / f"{name}.json").read_text())


def _chunks(plan: dict) -> dict[tuple[int, int], int]:
    """(pp rank, chunk) -> layers, as placer means the plan: parallelism.chunk_layers[c pp
    + k] when given (uneven chunks), else stage_layers[k] / v each."""
    par = plan["parallelism"]
    v, p = par["virtual_stages"], par["pp"]
    if par.get("chunk_layers") is not None:
        return {(k, c): par["chunk_layers"][c * p + k] for k in range(p) for c in range(v)}
    return {(k, c): n // v for k, n in enumerate(plan["stage_layers"]) for c in range(v)}


def _megatron_args(export: Path) -> dict[str, list[str]]:
    require((export / "megatron_args.sh").exists(), f"placer's export in {export}")
    body = (export / "megatron_args.sh").read_text().split("MEGATRON_ARGS=(", 1)[1]
    out: dict[str, list[str]] = {}
    key = None
    for t in shlex.split(body.split("\n)", 1)[0], comments=True):
        if t.startswith("--"):
            key = t
            out[key] = []
        else:
            out[key].append(t)
    return out


def _transformer_config(a: dict[str, list[str]]):
    """The exported values mapped as Megatron-LM's validate_args and
    core_transformer_config_from_args map them (virtual size from the stage count of a
    layout, else --num-virtual-stages-per-pipeline-rank)."""
    from megatron.core.transformer import TransformerConfig

    pp = int(a["--pipeline-model-parallel-size"][0])
    layout = a.get("--pipeline-model-parallel-layout", [None])[0]
    vpp = None
    if layout is None:
        vpp = int(a["--num-virtual-stages-per-pipeline-rank"][0])
    first = a.get("--decoder-first-pipeline-num-layers", [None])[0]
    last = a.get("--decoder-last-pipeline-num-layers", [None])[0]
    return TransformerConfig(
        num_layers=int(a["--num-layers"][0]),
        hidden_size=int(a["--hidden-size"][0]),
        ffn_hidden_size=int(a["--ffn-hidden-size"][0]),
        num_attention_heads=int(a["--num-attention-heads"][0]),
        tensor_model_parallel_size=int(a["--tensor-model-parallel-size"][0]),
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        pipeline_model_parallel_layout=layout,
        num_layers_in_first_pipeline_stage=None if first is None else int(first),
        num_layers_in_last_pipeline_stage=None if last is None else int(last),
        pipeline_dtype=__import__("torch").bfloat16,
        bf16=True,
    )


@pytest.mark.parametrize("name", list(EXPORTS))
def test_megatron_core_builds_the_plans_chunks(name: str) -> None:
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    plan = _plan(name)
    a = _megatron_args(EXPORTS[name])
    assert ("--pipeline-model-parallel-layout" in a) == (name in LAYOUT_PLANS)
    cfg = _transformer_config(a)
    p, v = plan["parallelism"]["pp"], plan["parallelism"]["virtual_stages"]
    assert cfg.virtual_pipeline_model_parallel_size == v
    want = _chunks(plan)
    parallel_state.set_virtual_pipeline_model_parallel_world_size(v)
    try:
        got, offsets = {}, {}
        for k in range(p):
            for c in range(v):
                if cfg.pipeline_model_parallel_layout is not None:
                    lay = cfg.pipeline_model_parallel_layout
                    got[(k, c)] = lay.get_num_layers_to_build(LayerType.decoder, c, k)
                    offsets[(k, c)] = lay.get_layer_offset(LayerType.decoder, c, k)
                else:
                    got[(k, c)] = get_num_layers_to_build(cfg, vp_stage=c, pp_rank=k)
                    offsets[(k, c)] = get_transformer_layer_offset(cfg, vp_stage=c, pp_rank=k)
    finally:
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)
    assert got == want
    # chunk c of rank k is model stage c p + k: its first layer follows all earlier stages'
    for (k, c), off in offsets.items():
        assert off == sum(want[(s % p, s // p)] for s in range(c * p + k)), (k, c)


@pytest.mark.parametrize("name", list(EXPORTS))
def test_megatron_lm_parse_and_validate_args(name: str) -> None:
    """Megatron-LM's own parse_args + validate_args on the interleaved exports (needs
    MEGATRON_LM_SRC, as consumers/test_configs.py): the layout of uneven chunks, or the
    virtual-stage flags, pass its checks (world: tp 1 x pp 4 x dp 2)."""
    megatron_lm_src()  # skips first, as the other Megatron-LM checks
    got = megatron_validate(EXPORTS[name], 8)
    assert got["pipeline_model_parallel_size"] == 4, got


def test_megatron_core_runs_the_schedule_placer_prices() -> None:
    """Megatron-Core's interleaved op order (its schedule table, warm-up counts and the
    mirrored chunk of a backward), rank by rank, is placer's interleaved_order."""
    from megatron.core.pipeline_parallel.schedules import (
        get_pp_rank_microbatches,
        get_schedule_table,
    )

    from placer.perf.critical_path import interleaved_order

    plan = _plan("plan")
    p, v = plan["parallelism"]["pp"], plan["parallelism"]["virtual_stages"]
    m = plan["parallelism"]["num_micro_batches"]
    table = get_schedule_table(m, v, p)  # microbatch_group_size_per_vp_stage defaults to pp
    for rank in range(p):
        comm = SimpleNamespace(
            pp_group=SimpleNamespace(size=lambda: p, rank=lambda r=rank: r),
            virtual_pipeline_model_parallel_size=v,
        )
        total, _, warm, rest = get_pp_rank_microbatches(m, v, p, p2p_communicator=comm)
        fwd = [("F", mb, c * p + rank) for mb, c in table]
        bwd = [("B", mb, (v - 1 - c) * p + rank) for mb, c in table]
        order = fwd[:warm]
        for i in range(rest):
            order += [fwd[warm + i], bwd[i]]
        order += bwd[rest:]
        assert total == m * v and len(order) == 2 * total
        assert order == interleaved_order(p, m, v, rank), rank


@pytest.mark.parametrize("name", list(EXPORTS))
def test_torchtitan_03_places_the_plans_chunks(name: str) -> None:
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping

    plan = _plan(name)
    export = EXPORTS[name]
    require((export / "torchtitan_args.sh").exists(), f"placer's export in {export}")
    cfg = ConfigManager().parse_args(torchtitan_args(str(export / "torchtitan_args.sh")))
    par = cfg.parallelism
    p, v = plan["parallelism"]["pp"], plan["parallelism"]["virtual_stages"]
    assert par.pipeline_parallel_degree == p
    assert issubclass(get_schedule_class(par.pipeline_parallel_schedule), PipelineScheduleMulti)
    parts = par.module_fqns_per_model_part
    assert len(parts) == v * p
    want = _chunks(plan)
    for rank in range(p):
        stages = _get_pp_rank_to_stage_indices_mapping(
            rank, p, par.pipeline_parallel_schedule, len(parts)
        )
        assert stages == tuple(c * p + rank for c in range(v))
        for c, s in enumerate(stages):
            assert sum(x.startswith("layers.") for x in parts[s]) == want[(rank, c)]
    layers = [x for part in parts for x in part if x.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(sum(plan["stage_layers"]))]


@pytest.mark.parametrize(("layers", "pp", "v"), [(94, 8, 4), (94, 8, 3), (14, 2, 2), (30, 4, 2)])
def test_balanced_chunks_are_megatron_cores_embedding_and_loss_split(
    layers: int, pp: int, v: int
) -> None:
    """Where Megatron-Core's account_for_embedding_in_pipeline_split and
    account_for_loss_in_pipeline_split run (layers + 2 divisible by pp and by pp v: the
    Qwen3-235B-A22B recipes' 94 layers at VP 4 and VP 3), placer's balanced chunk split
    (placer.perf.step.balanced_chunk_layers, what the optimizer plans when v does not
    divide a rank) is the one Megatron-Core builds."""
    from megatron.core import parallel_state
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    from placer.perf.step import balanced_chunk_layers

    cfg = TransformerConfig(
        num_layers=layers,
        hidden_size=64,
        num_attention_heads=4,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=v,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
        pipeline_dtype=__import__("torch").bfloat16,
        bf16=True,
    )
    parallel_state.set_virtual_pipeline_model_parallel_world_size(v)
    try:
        got = [
            get_num_layers_to_build(cfg, vp_stage=s // pp, pp_rank=s % pp) for s in range(pp * v)
        ]
    finally:
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)
    assert tuple(got) == balanced_chunk_layers(layers, pp, v)
