"""The split candidates are computed once per shape (memory lines shared by the GPU types,
GPU-type patterns cached; issue 12 speed): the configuration set and the memory caps must be
exactly those of the straightforward computation, written out here independently (one
memory evaluation per stage, layer count and GPU type, patterns enumerated afresh)."""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import replace
from pathlib import Path

import pytest

from placer.io import load_instance
from placer.optimize import space, splits
from placer.perf.flops import config_stage_memory_bytes
from placer.perf.step import balanced_stage_layers

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = [
    ROOT / "tests" / "instances" / "power-bound-8-sites.yaml",
    ROOT / "instances" / "seed-1t-two-sites.yaml",
    ROOT / "instances" / "three-sites-80-300-500km.yaml",
]


def _caps(problem, cfg, gpu):
    cap = (problem.catalog.gpus[gpu].hbm_gb - problem.catalog.memory.reserve_gb) * 1e9
    out = []
    for k in range(cfg.pp):
        at = [
            config_stage_memory_bytes(problem.model, replace(cfg, stage_layers=(n,) * cfg.pp), k)[
                "total"
            ]
            for n in (1, 2)
        ]
        slope, base = at[1] - at[0], 2 * at[0] - at[1]
        if base + slope > cap:
            out.append(0)
        elif slope <= 0:
            out.append(problem.model.layers)
        else:
            out.append(min(problem.model.layers, math.floor((cap - base) / slope + 1e-9)))
    return out


def _lines(perf, cfg, gpu):
    t = [perf.stage_times(replace(cfg, stage_layers=(n,) * cfg.pp), gpu) for n in (1, 2)]
    out = []
    for t1, t2 in zip(*t, strict=True):
        c1, c2 = t1.fwd + t1.bwd, t2.fwd + t2.bwd
        out.append((2 * c1 - c2, c2 - c1))
    return out


def _patterns(k_max, pp, gpus):
    out = []
    for n in range(1, min(k_max, pp) + 1):
        for order in itertools.product(gpus, repeat=n):
            if any(a == b for a, b in itertools.pairwise(order)):
                continue
            for cuts in itertools.combinations(range(1, pp), n - 1):
                b = (0, *cuts, pp)
                out.append(tuple(order[i] for i in range(n) for _ in range(b[i], b[i + 1])))
    return out[: splits.MAX_TYPE_PATTERNS]


def _min_max(lines, caps, layers):
    pp = len(lines)
    if any(c < 1 for c in caps) or sum(caps) < layers or layers < pp:
        return None
    counts = [1] * pp
    heap = [(lines[k][0] + 2 * lines[k][1], k) for k in range(pp) if caps[k] > 1]
    heapq.heapify(heap)
    for _ in range(layers - pp):
        _, k = heapq.heappop(heap)
        counts[k] += 1
        if counts[k] < caps[k]:
            heapq.heappush(heap, (lines[k][0] + lines[k][1] * (counts[k] + 1), k))
    return tuple(counts)


def _reference_split_space(problem, perf, cfg, gpus):
    layers, pp = problem.model.layers, cfg.pp
    listed = problem.instance.job.parallelism.stage_layers
    if listed == "even":
        return splits.SplitSpace([balanced_stage_layers(layers, pp)], True, "even")
    if isinstance(listed, list):
        return splits.SplitSpace([tuple(s) for s in listed if len(s) == pp], True, "listed")
    if math.comb(layers - 1, pp - 1) <= splits.MAX_ENUMERATED_SPLITS:
        return splits.SplitSpace(splits.compositions(layers, pp), True, "all")
    out = [balanced_stage_layers(layers, pp)]
    k_max = problem.instance.solver.max_sites_per_replica
    lines = {g: _lines(perf, cfg, g) for g in gpus}
    caps = {g: _caps(problem, cfg, g) for g in gpus}
    for pattern in _patterns(k_max, pp, gpus):
        split = _min_max(
            [lines[g][k] for k, g in enumerate(pattern)],
            [caps[g][k] for k, g in enumerate(pattern)],
            layers,
        )
        if split is not None and split not in out:
            out.append(split)
    if listed == "all":
        return splits.SplitSpace(out, False, "all")
    return splits.SplitSpace(out, True, "candidates")


@pytest.mark.parametrize("path", INSTANCES, ids=lambda p: p.stem)
def test_configurations_and_caps_match_the_straightforward_computation(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    problem = load_instance(path)
    fast_report = space.SpaceReport()
    fast = space.enumerate_configs(problem, fast_report)
    shapes: list = []

    def reference(problem, perf, cfg, gpus):
        shapes.append((perf, cfg, gpus))
        return _reference_split_space(problem, perf, cfg, gpus)

    monkeypatch.setattr(space, "split_space", reference)
    ref_report = space.SpaceReport()
    ref = space.enumerate_configs(problem, ref_report)
    assert fast == ref  # the same configurations in the same order
    assert fast_report == ref_report  # and the same drops, split sources, unsearched shapes
    assert len(fast) > 0 and shapes
    candidates = 0
    for perf, cfg, gpus in shapes[:: max(1, len(shapes) // 200)]:  # a sample: 200 shapes
        for g in gpus:
            assert splits.memory_caps(problem, cfg, g) == _caps(problem, cfg, g)
            assert splits.stage_lines(perf, cfg, g) == _lines(perf, cfg, g)
        k_max = problem.instance.solver.max_sites_per_replica
        assert splits.gpu_type_patterns(problem, cfg.pp, gpus) == _patterns(k_max, cfg.pp, gpus)
        candidates += splits.split_space(problem, perf, cfg, gpus).source == "candidates"
    if path.stem == "power-bound-8-sites":
        assert candidates  # the generated-candidate path (memory caps) was exercised
