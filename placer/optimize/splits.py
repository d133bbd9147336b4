"""Layers per stage as a decision: the candidate splits of one configuration.

A split (`stage_layers`) belongs to the configuration, not to a replica chain: data-parallel
replicas all-reduce each stage's gradients, so every replica must hold the same shard of
layers in stage k (Megatron and torchtitan build one pipeline layout for the whole job).
The plan format says so too: one `stage_layers` per plan.

Which splits are searched, per configuration shape (tp, pp, micro-batch, dp), is a candidate
set like the other parallel dimensions (`job.parallelism.stage_layers`):

* a list of splits: exactly those (a pp is searched only with its listed splits);
* `even`: the even split alone (the remainder on the middle stages);
* `all`: every composition of the layers into pp stages of at least one layer, the whole
  space a plan can name. Enumerated when there are at most MAX_ENUMERATED_SPLITS of them
  (C(layers - 1, pp - 1)); otherwise the generated candidates below are solved and the
  splits left out are covered by a lower bound on their step time (`rest_lower_bound_s`)
  that the driver keeps open: the plan is `optimal` only when no split left out can beat it,
  else `feasible` with the gap to that bound;
* null (the default): every composition when there are at most MAX_ENUMERATED_SPLITS,
  otherwise the generated candidates: the even split, and for every sequence of GPU types a
  contiguous-block chain can give the stages, the split that minimises the slowest stage's
  forward + backward time (the LM head and loss on the last stage, the embedding's memory on
  the first) within each stage's memory. That is what balancing stages by GPU speed needs
  (Metis, FlashFlex do the same); `optimal` is then over these candidates, and the plan says
  so (`solver.splits: candidates`).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from dataclasses import dataclass, replace

from placer.io import Problem
from placer.perf import compute
from placer.perf.flops import config_stage_memory_bytes, stage_params
from placer.perf.step import Config, PerfModel, balanced_stage_layers

MAX_ENUMERATED_SPLITS = 16  # solver setting (assumption: a cost/coverage trade-off, see README)
# GPU-type sequences per shape that get their own min-max split (assumption: 512 made the
# 8-site power-bound instance 24,004 configurations, none bounded within 20 s; 24: 5,028)
MAX_TYPE_PATTERNS = 24

GB = 1e9
Split = tuple[int, ...]


@dataclass(frozen=True)
class SplitSpace:
    splits: list[Split]
    complete: bool  # every split the instance's candidate set allows is in `splits`
    source: str  # "listed" | "even" | "all" | "candidates" (plan.solver.splits)


def compositions(layers: int, pp: int) -> list[Split]:
    """Every split of `layers` into `pp` stages of at least one layer, in lexicographic order."""
    out = []
    for cuts in itertools.combinations(range(1, layers), pp - 1):
        bounds = (0, *cuts, layers)
        out.append(tuple(bounds[i + 1] - bounds[i] for i in range(pp)))
    return out


def stage_lines(perf: PerfModel, cfg: Config, gpu: str) -> list[tuple[float, float]]:
    """(intercept, slope) per stage of the forward + backward time of one micro-batch as a
    function of the stage's layers on `gpu`: the operator model is affine in the layer count
    (placer.perf.compute.stage_ops: per-layer terms plus the LM head and loss of the last
    stage), so two evaluations give it exactly."""
    one, two = _one_two(cfg)
    return _time_lines(perf, one, two, gpu)


def _one_two(cfg: Config) -> tuple[Config, Config]:
    """cfg with one and with two layers on every stage: the two points of the lines."""
    return replace(cfg, stage_layers=(1,) * cfg.pp), replace(cfg, stage_layers=(2,) * cfg.pp)


def _time_lines(perf: PerfModel, one: Config, two: Config, gpu: str) -> list[tuple[float, float]]:
    out = []
    for t1, t2 in zip(perf.stage_times(one, gpu), perf.stage_times(two, gpu), strict=True):
        c1, c2 = t1.fwd + t1.bwd, t2.fwd + t2.bwd
        out.append((2 * c1 - c2, c2 - c1))
    return out


def memory_lines(problem: Problem, cfg: Config) -> list[tuple[float, float]]:
    """(base, slope) per stage of a stage's memory in its layers (bytes per GPU): it reads
    no GPU type, so split_space computes it once per shape for all the GPU types."""
    one, two = _one_two(cfg)
    return _memory_lines(problem, one, two)


def _memory_lines(problem: Problem, one: Config, two: Config) -> list[tuple[float, float]]:
    out = []
    for k in range(one.pp):
        m1 = config_stage_memory_bytes(problem.model, one, k)["total"]
        m2 = config_stage_memory_bytes(problem.model, two, k)["total"]
        out.append((2 * m1 - m2, m2 - m1))
    return out


def memory_caps(problem: Problem, cfg: Config, gpu: str) -> list[int]:
    """Most layers each stage can hold on `gpu` (stage memory is affine in its layers)."""
    return caps_from_lines(problem, memory_lines(problem, cfg), gpu)


def caps_from_lines(problem: Problem, mem: list[tuple[float, float]], gpu: str) -> list[int]:
    """memory_caps from the shape's memory_lines."""
    cap = (problem.catalog.gpus[gpu].hbm_gb - problem.catalog.memory.reserve_gb) * GB
    out = []
    for base, slope in mem:
        if base + slope > cap:
            out.append(0)
        elif slope <= 0:
            out.append(problem.model.layers)
        else:
            out.append(min(problem.model.layers, math.floor((cap - base) / slope + 1e-9)))
    return out


def min_max_split(lines: list[tuple[float, float]], caps: list[int], layers: int) -> Split | None:
    """The split minimising the slowest stage's time (lines: per-stage affine times), each
    stage holding 1..caps[k] layers. Giving the next layer to the stage whose time after it
    is smallest is optimal for a min-max of increasing separable terms (the classic
    exchange argument); ties go to the earlier stage, so the result is deterministic."""
    pp = len(lines)
    if any(c < 1 for c in caps) or sum(caps) < layers or layers < pp:
        return None
    counts = [1] * pp
    heap = [(lines[k][0] + lines[k][1] * 2, k) for k in range(pp) if caps[k] > 1]
    heapq.heapify(heap)
    for _ in range(layers - pp):
        _, k = heapq.heappop(heap)
        counts[k] += 1
        if counts[k] < caps[k]:
            heapq.heappush(heap, (lines[k][0] + lines[k][1] * (counts[k] + 1), k))
    return tuple(counts)


def gpu_type_patterns(problem: Problem, pp: int, gpus: list[str]) -> list[tuple[str, ...]]:
    """The GPU-type sequences of pp stages (_type_patterns) under the instance's
    solver.max_sites_per_replica."""
    return list(_type_patterns(problem.instance.solver.max_sites_per_replica, pp, tuple(gpus)))


@functools.lru_cache(maxsize=1024)
def _type_patterns(k_max: int, pp: int, gpus: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """The sequences of GPU types the stages of a contiguous-block chain of at most
    `solver.max_sites_per_replica` sites can have (adjacent blocks of one type merge), at
    most MAX_TYPE_PATTERNS of them (fewest blocks first). The same for every shape of one
    pp: cached (a pure function of its arguments)."""
    out: list[tuple[str, ...]] = []
    for n_blocks in range(1, min(k_max, pp) + 1):
        for order in itertools.product(gpus, repeat=n_blocks):
            if any(a == b for a, b in zip(order, order[1:], strict=False)):
                continue
            for cuts in itertools.combinations(range(1, pp), n_blocks - 1):
                bounds = (0, *cuts, pp)
                out.append(
                    tuple(
                        order[i] for i in range(n_blocks) for _ in range(bounds[i], bounds[i + 1])
                    )
                )
                if len(out) >= MAX_TYPE_PATTERNS:
                    return tuple(out)
    return tuple(out)


def split_space(problem: Problem, perf: PerfModel, cfg: Config, gpus: list[str]) -> SplitSpace:
    """The splits to search for a configuration shape (`cfg` carries the even split);
    `gpus` are the GPU types of the sites that can host a stage of it."""
    layers, pp = problem.model.layers, cfg.pp
    listed = problem.instance.job.parallelism.stage_layers
    if listed == "even":
        return SplitSpace([balanced_stage_layers(layers, pp)], True, "even")
    if isinstance(listed, list):
        return SplitSpace([tuple(s) for s in listed if len(s) == pp], True, "listed")
    if math.comb(layers - 1, pp - 1) <= MAX_ENUMERATED_SPLITS:
        return SplitSpace(compositions(layers, pp), True, "all")
    out = [balanced_stage_layers(layers, pp)]
    one, two = _one_two(cfg)
    lines = {g: _time_lines(perf, one, two, g) for g in gpus}
    mem = _memory_lines(problem, one, two)  # once per shape, not per GPU type
    caps = {g: caps_from_lines(problem, mem, g) for g in gpus}
    for pattern in gpu_type_patterns(problem, pp, gpus):
        split = min_max_split(
            [lines[g][k] for k, g in enumerate(pattern)],
            [caps[g][k] for k, g in enumerate(pattern)],
            layers,
        )
        if split is not None and split not in out:
            out.append(split)
    # the default space is these candidates; `all` asks for every split (a bound covers the rest)
    if listed == "all":  # solved: the candidates; covered: every split (rest_lower_bound_s)
        return SplitSpace(out, False, "all")
    return SplitSpace(out, True, "candidates")


def rest_lower_bound_s(problem: Problem, perf: PerfModel, cfg: Config, gpus: list[str]) -> float:
    """A lower bound on the step time of the configuration shape under any split.

    For any split and any chain, stage k runs its m forwards and m backwards one at a time;
    it cannot start before micro-batch 0 has passed stages 0..k-1 and their boundaries, and
    after its last backward the gradient still passes back through them, so the 1F1B time
    is at least  max_k  sum_{j<k} (c_j + 2 d_j) + m c_k  (c = forward + backward of a stage,
    d = one boundary's transmit + latency; tests check it against placer.perf.pipeline).
    Each c_k is at least the lower envelope over the GPU types (e_k + a_k l_k, the smallest
    intercept and slope) and each d at least a message inside the fastest-NIC site. The
    minimum of that bound over real-valued splits (l_k >= 0, sum = layers) is a small LP.
    The chain's optimizer step adds the slowest stage's, at least the average stage's
    parameters on the fastest-HBM GPU. Communication between sites and the data-parallel
    sync only add to the step, so they are left out."""
    import highspy

    inst = problem.instance
    pp, m, layers = cfg.pp, cfg.num_micro_batches, problem.model.layers
    lines = [stage_lines(perf, cfg, g) for g in gpus]
    env = [(min(ls[k][0] for ls in lines), min(ls[k][1] for ls in lines)) for k in range(pp)]
    d = min(sum(perf.boundary(cfg, s.name, s.name)) for s in inst.sites if s.gpu in set(gpus))
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    tau = h.addVariable(lb=0.0)
    ls = [h.addVariable(lb=0.0) for _ in range(pp)]
    h.addConstr(sum(ls) == layers)
    for k in range(pp):
        expr = m * (env[k][0] + env[k][1] * ls[k]) + sum(
            env[j][0] + env[j][1] * ls[j] + 2 * d for j in range(k)
        )
        h.addConstr(expr - tau <= 0)
    h.minimize(tau)
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return 0.0  # no bound (never expected: the LP is feasible and bounded)
    pipe = h.getInfo().objective_function_value
    total = sum(
        stage_params(problem.model, n, k == 0, k == pp - 1) for k, n in enumerate(cfg.stage_layers)
    )  # the same for every split
    shard = cfg.optimizer_shard_over_dp
    opt = min(
        compute.optimizer_step_s(problem.catalog.gpus[g], total / (pp * cfg.tp)) for g in gpus
    )
    # the LP solution is exact to HiGHS' tolerances: keep a margin so the bound stays valid
    return max(0.0, pipe * (1 - 1e-7)) + opt / shard
