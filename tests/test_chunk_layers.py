"""Interleaved 1F1B with uneven chunks (parallelism.chunk_layers, issue 16).

Oracles: the plan checks against the rules they state (lengths, each rank's chunks
summing to its stage_layers); the explicit even split against the null default (the same
pipeline, the same numbers); the activation peak of the schedule walk against the
closed count (placer.perf.flops.in_flight_chunks) on equal chunks; the uneven pipeline's
closed form against the flow-level simulator (placer.sim, an independent event run of
Megatron-Core's interleaved order); balanced_chunk_layers against Megatron-Core's
account_for_embedding/loss_in_pipeline_split arithmetic by hand.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_cases import SMALL_MODEL, plan, problem

from placer.errors import InputError
from placer.evaluate import evaluate
from placer.io import plan_from_data
from placer.perf.flops import config_stage_memory_bytes, in_flight_chunks, peak_chunk_layers
from placer.perf.step import balanced_chunk_layers
from placer.sim import SimOptions, simulate


def _interleaved(stage_layers: list[int], v: int, chunks: list[int] | None, m: int = 8) -> dict:
    p = plan(1, stage_layers, [(1, ["a"] * len(stage_layers))], m)
    p["parallelism"]["virtual_stages"] = v
    if chunks is not None:
        p["parallelism"]["chunk_layers"] = chunks
    return p


# ----------------------------------------------------------------------------- the plan field


def test_chunk_layers_make_an_indivisible_rank_plannable() -> None:
    bad = _interleaved([5, 3], 2, None)
    with pytest.raises(InputError, match=r"stage_layers\[0\]: 5 layers do not split"):
        plan_from_data(bad)
    ok = plan_from_data(_interleaved([5, 3], 2, [2, 1, 3, 2]))
    assert ok.parallelism.chunk_layers == [2, 1, 3, 2]


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([2, 1, 3], r"parallelism.chunk_layers: 3 entries, virtual_stages x pp is 2 x 2 = 4"),
        ([3, 1, 3, 2], r"rank 0's chunks \[0\], \[2\] sum to 6, stage_layers\[0\] is 5"),
        ([5, 1, 0, 2], r"parallelism.chunk_layers\[2\]: must be >= 1, got 0"),
    ],
)
def test_chunk_layers_errors_name_the_field(chunks: list[int], message: str) -> None:
    with pytest.raises(InputError, match=message):
        plan_from_data(_interleaved([5, 3], 2, chunks))


def test_explicit_even_chunks_are_the_default_split() -> None:
    prob = problem(["a"], [], global_batch=8, model={**SMALL_MODEL, "vocab": 8})
    null = evaluate(prob, _interleaved([4, 4], 2, None))
    even = evaluate(prob, _interleaved([4, 4], 2, [2, 2, 2, 2]))
    assert even.config == null.config  # one pipeline, one cache key
    assert even.step_time_s == null.step_time_s
    assert even.breakdown == null.breakdown


# ----------------------------------------------------------------------------- memory


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    pp=st.integers(2, 6),
    groups=st.integers(1, 3),
    v=st.integers(2, 4),
    per_chunk=st.integers(1, 5),
    data=st.data(),
)
def test_schedule_walk_peak_is_the_closed_count_on_equal_chunks(
    pp: int, groups: int, v: int, per_chunk: int, data: st.DataObject
) -> None:
    rank = data.draw(st.integers(0, pp - 1))
    m = groups * pp
    peak = peak_chunk_layers(pp, m, rank, (per_chunk,) * v)
    assert peak == in_flight_chunks(pp, m, v, rank) * per_chunk


def test_uneven_chunks_weigh_the_chunks_in_flight() -> None:
    """pp 2, m 4, v 2, rank 0 (interleaved_order): F c0 F c0 F c1 F c1 F c0 B c1 F c0 B c1
    F c1 B c0 F c1 ... Chunks of (3, 1) layers hold 3, 6, 7, 8, 11, 10, 13, 12, 13, 10, 11:
    peak 13 (four chunk-0 micro-batches and one of chunk 1); (1, 3): 1, 2, 5, 8, 9, 6, 7,
    4, 7, 6, 9: peak 9 (by hand). The evaluator's activations follow the same ratio."""
    assert peak_chunk_layers(2, 4, 0, (3, 1)) == 13
    assert peak_chunk_layers(2, 4, 0, (1, 3)) == 9
    prob = problem(["a"], [], global_batch=4, model={**SMALL_MODEL, "vocab": 8})
    front = evaluate(prob, _interleaved([4, 4], 2, [3, 2, 1, 2], m=4))
    back = evaluate(prob, _interleaved([4, 4], 2, [1, 2, 3, 2], m=4))
    act = [config_stage_memory_bytes(prob.model, e.config, 0)["activations"] for e in (front, back)]
    assert act[0] / act[1] == pytest.approx(13 / 9)


# ----------------------------------------------------------------------------- the pipeline


@pytest.mark.parametrize(
    ("stage_layers", "chunks"),
    [([5, 3], [2, 1, 3, 2]), ([3, 5], [1, 2, 2, 3]), ([4, 4], [1, 3, 3, 1])],
)
def test_uneven_pipeline_closed_form_is_the_simulation(
    stage_layers: list[int], chunks: list[int]
) -> None:
    """One site, one replica (no contention, no sync): the closed form's pipeline (the
    critical path of Megatron-Core's order on the chunk times) equals the simulated one."""
    prob = problem(["a"], [], global_batch=8, model={**SMALL_MODEL, "vocab": 8})
    p = _interleaved(stage_layers, 2, chunks)
    res = simulate(prob, p)
    assert res.closed_pipe_s == pytest.approx(res.pipe_s, rel=1e-6)
    even = simulate(prob, _interleaved([4, 4], 2, None))
    if chunks != [2, 2, 2, 2]:  # an imbalance the critical path sees: slower than even
        assert res.pipe_s > even.pipe_s


def test_simulate_option_drops_the_chunks_of_another_v() -> None:
    prob = problem(["a"], [], global_batch=8, model={**SMALL_MODEL, "vocab": 8})
    p = _interleaved([4, 4], 2, [1, 3, 3, 1])
    res = simulate(prob, copy.deepcopy(p), SimOptions(virtual_stages=4))
    assert res.virtual_stages == 4 and res.closed_pipe_s == pytest.approx(res.pipe_s, rel=1e-6)


# ----------------------------------------------------------------------------- the balanced split


def test_balanced_chunks_are_megatron_cores_account_for_embedding_and_loss() -> None:
    """Qwen3-235B-A22B, 94 layers (Megatron-Bridge's Qwen3 MoE recipes with VP): with the
    embedding and the loss counted as a layer, 96 / (8 x 4) = 3 a model stage, the first
    and the last one short (transformer_block.get_num_layers_to_build); 96 / (8 x 3) = 4."""
    assert balanced_chunk_layers(94, 8, 4) == (2,) + (3,) * 30 + (2,)
    assert balanced_chunk_layers(94, 8, 3) == (3,) + (4,) * 22 + (3,)
    # DeepSeek-V3's 61 layers: 63 units over 16 model stages, the one short stage the last
    assert balanced_chunk_layers(61, 4, 4) == (3,) + (4,) * 14 + (2,)
    assert balanced_chunk_layers(15, 8, 2) is None  # fewer layers than model stages


@settings(max_examples=200, deadline=None, derandomize=True)
@given(pp=st.integers(1, 16), v=st.integers(2, 6), layers=st.integers(1, 200))
def test_balanced_chunks_are_a_valid_even_split(pp: int, v: int, layers: int) -> None:
    chunks = balanced_chunk_layers(layers, pp, v)
    if layers < pp * v:
        assert chunks is None
        return
    if chunks is None:  # only when the ends cannot take the shortfall
        assert (layers + 2) // (pp * v) < 2
        return
    assert len(chunks) == pp * v and sum(chunks) == layers and min(chunks) >= 1
    units = [c + (s == 0) + (s == pp * v - 1) for s, c in enumerate(chunks)]
    assert max(units) - min(units) <= 1  # as even as possible, embedding and loss counted


# ----------------------------------------------------------------------------- exports


def _parse_layout(text: str) -> list[int]:
    """Decoder layers per model stage of a Megatron-Core layout string, read by the grammar
    PipelineParallelLayerLayout.parse_str_to_list documents (commas cosmetic, "(..)*n" and
    "x*n" unrolled, "|" between stages; E and L counted once each, first and last)."""
    import re

    text = text.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), text)
    stages = text.split("|")
    assert stages[0].startswith("E") and stages[-1].endswith("L")
    assert text.count("E") == 1 and text.count("L") == 1 and set(text) <= set("EtL|")
    return [s.count("t") for s in stages]


@settings(max_examples=100, deadline=None, derandomize=True)
@given(chunks=st.lists(st.integers(1, 12), min_size=2, max_size=24))
def test_layout_string_round_trips(chunks: list[int]) -> None:
    from placer.outputs.launch import megatron_layout_string

    assert _parse_layout(megatron_layout_string(chunks)) == chunks


def test_exports_carry_the_uneven_chunks() -> None:
    import solver_cases as sc

    from placer.io import problem_from_data
    from placer.outputs.launch import (
        build_layout,
        megatron_files,
        parse_megatron_args,
        torchtitan_settings,
    )

    data = sc.uneven_chunk_instance(None)
    prob = problem_from_data(data)
    p = plan(1, [5, 3], [(4, ["a", "a"])], 4)
    p["parallelism"].update(virtual_stages=3, chunk_layers=[1, 1, 2, 1, 2, 1])
    layout = build_layout(prob, plan_from_data(p))
    text = megatron_files(layout)["megatron_args.sh"]
    flags = parse_megatron_args(text)
    assert flags["--pipeline-model-parallel-layout"] == ["Et*1|t*1|t*2|t*1|t*2|t*1,L"]
    assert _parse_layout(flags["--pipeline-model-parallel-layout"][0]) == [1, 1, 2, 1, 2, 1]
    assert "--num-virtual-stages-per-pipeline-rank" not in flags
    assert "uneven chunks [1, 1, 2, 1, 2, 1]" in text
    settings_ = {k: val for _, k, val in torchtitan_settings(layout, "0.3")}
    assert settings_["pipeline_parallel_schedule"] == "Interleaved1F1B"
    parts = settings_["module_fqns_per_model_part"]
    assert [sum(x.startswith("layers.") for x in part) for part in parts] == [1, 1, 2, 1, 2, 1]
    assert [x for part in parts for x in part if x.startswith("layers.")] == [
        f"layers.{i}" for i in range(8)
    ]
