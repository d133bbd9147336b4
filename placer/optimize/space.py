"""The search space: parallel configurations and the replica chain types of each.

Configurations (tp, cp, ep, pp, dp, micro-batch, layers per stage, interleaved chunks per
rank, sync policy) are enumerated outside the formulations and pruned by memory and by a
lower bound against the incumbent. The layer split is part of the configuration (every
replica holds the same stage shards); which splits are searched is placer.optimize.splits'
decision.

A chain type fixes the site of every stage of a replica. placer searches chains that
visit each site at most once, in one contiguous block of stages, with at most
`solver.max_sites_per_replica` sites (default 2). Any chain can be re-ordered into such
blocks without changing its GPU or power use and with no more WAN crossings, so the
restriction only excludes zig-zag chains; it is documented in the README, and the
brute-force backend searches the same space.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from placer.io import Problem
from placer.optimize import deadline
from placer.optimize.splits import split_space
from placer.perf.flops import config_stage_memory_bytes
from placer.perf.step import (
    Chain,
    Config,
    PerfModel,
    balanced_chunk_layers,
    balanced_stage_layers,
)
from placer.rules import (
    cp_ep_problems,
    dp_shard_problems,
    etp_problems,
    expert_fold_width,
    job_config,
    num_micro_batches,
    replica_slots,
    site_gpus_per_node,
)

GB = 1e9


def divisors(n: int) -> list[int]:
    """Divisors in increasing order, in O(sqrt n) (global_batch may be 10^8)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def powers_of_two_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


@dataclass
class SpaceReport:
    """Why configurations were dropped: used to explain infeasibility."""

    considered: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    best_memory_gap_gb: float = math.inf  # smallest memory overflow seen
    memory_example: str = ""
    best_time_lb_s: float = (
        math.inf
    )  # fastest lower bound among configurations over max_step_time_s

    # configuration shapes (with their even split) whose splits were not all enumerated:
    # the driver keeps a lower bound of the splits left out (placer.optimize.splits)
    unsearched: list[Config] = field(default_factory=list)
    split_sources: set[str] = field(default_factory=set)  # SplitSpace.source of every shape

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def drop_slow(self, lower_bound_s: float) -> None:
        """A configuration whose step-time lower bound exceeds max_step_time_s."""
        self.drop("lower bound above max_step_time_s")
        self.best_time_lb_s = min(self.best_time_lb_s, lower_bound_s)


def site_group_capacity(problem: Problem, site: str, tp: int, width: int | None = None) -> int:
    """Replica-stages of `width` = tp x cp x ep GPUs (default: tp) the site can host."""
    s = problem.instance.site(site)
    gpn = site_gpus_per_node(problem, site)
    per, block = replica_slots(gpn, tp, width or tp)
    return (s.gpus // gpn // block) * per


def ep_candidates(problem: Problem, max_gpn: int) -> list[int]:
    """job.parallelism.ep, else [1] for a dense model and, for an MoE model, the powers of
    two that divide the expert count up to the largest scale-up domain (larger EP over the
    NICs only when listed)."""
    par, moe = problem.instance.job.parallelism, problem.model.moe
    if par.ep:
        return sorted(set(par.ep))
    if moe is None:
        return [1]
    return [e for e in powers_of_two_upto(min(moe.experts, max_gpn)) if moe.experts % e == 0]


def enumerate_configs(
    problem: Problem, report: SpaceReport | None = None, perf: PerfModel | None = None
) -> list[Config]:
    """Every configuration of the candidate sets, one per layer split searched."""
    inst, model = problem.instance, problem.model
    job = inst.job
    par = job.parallelism
    report = report if report is not None else SpaceReport()
    perf = perf or PerfModel(problem)
    max_gpn = max(site_gpus_per_node(problem, s.name) for s in inst.sites)
    tps = par.tp or powers_of_two_upto(max_gpn)
    listed = par.stage_layers if isinstance(par.stage_layers, list) else None
    pps = par.pp or (sorted({len(s) for s in listed}) if listed else divisors(model.layers))
    mbs = par.micro_batch or [1, 2, 4]
    cps = sorted(set(par.cp or [1]))
    eps = ep_candidates(problem, max_gpn)
    shards = sorted(set(par.dp_shard))
    # the unfolded layout always, and each listed expert TP folded (rules.expert_fold_width)
    etps: list[int | None] = [None, *sorted(set(par.etp or []))]
    out: list[Config] = []
    for tp in sorted(set(tps)):
        if model.heads % tp or model.kv % tp and tp % model.kv:
            report.drop(f"tp={tp} does not divide the attention heads")
            continue
        for cp, ep, f, etp in itertools.product(cps, eps, shards, etps):
            why = cp_ep_problems(model, tp, cp, ep, job.sequence_parallel)
            why += dp_shard_problems(ep, f)
            why += etp_problems(model, tp, cp, ep, etp, f)
            if etp == 1 and math.gcd(tp * cp, ep) == 1:
                why.append(f"etp=1 folded at tp x cp = {tp * cp}, ep = {ep}: the unfolded layout")
            if why:
                report.drop(why[0])
                continue
            out += _configs_for(problem, perf, report, tp, cp, ep, pps, mbs, listed, f, etp)
    return out


def _configs_for(
    problem: Problem,
    perf: PerfModel,
    report: SpaceReport,
    tp: int,
    cp: int,
    ep: int,
    pps: list[int],
    mbs: list[int],
    listed: list[list[int]] | None,
    dp_shard: int = 1,
    etp: int | None = None,
) -> list[Config]:
    """The configurations of one (tp, cp, ep, dp_shard, etp): every pp, micro-batch, dp,
    interleaving and sync policy, with the layer splits placer.optimize.splits searches
    (v = 1) or the balanced split into v equal chunks per rank (v > 1: uneven interleaved
    splits are not searched)."""
    inst, model = problem.instance, problem.model
    job = inst.job
    par = job.parallelism
    width = tp * cp * ep * dp_shard if etp is None else expert_fold_width(tp, cp, ep, etp)
    side = width // (tp * cp)  # data-parallel ranks (sequences side by side) per replica
    f = dp_shard
    out: list[Config] = []
    groups = sum(site_group_capacity(problem, s.name, tp, width) for s in inst.sites)
    if groups == 0:
        extra = f" x cp={cp} x ep={ep}" + (f" x dp_shard={f}" if f > 1 else "")
        extra += f" (etp={etp}: {width} GPUs)" if etp is not None else ""
        report.drop(f"tp={tp}" + (extra if width > tp else "") + " fits no node")
        return out
    gpus = sorted({s.gpu for s in inst.sites if site_group_capacity(problem, s.name, tp, width)})
    for pp in sorted(set(pps)):
        if pp > model.layers:
            report.drop(f"pp={pp} exceeds {model.layers} layers")
            continue
        if listed is not None and not any(len(s) == pp for s in listed):
            report.drop(f"pp={pp} has no split in job.parallelism.stage_layers")
            continue
        layers = balanced_stage_layers(model.layers, pp)
        for b in sorted(set(mbs)):
            if job.global_batch % (b * side):
                continue
            dps = par.dp or divisors(job.global_batch // (b * side))
            for dp in sorted(set(dps)):
                report.considered += 1
                if (job.global_batch // b) % (dp * side):
                    report.drop("global_batch not divisible by micro_batch x dp x ep x dp_shard")
                    continue
                if pp * dp > groups:
                    report.drop("more GPUs than the sites offer")
                    continue
                if job.gpus is not None and width * pp * dp != job.gpus:
                    report.drop("tp x cp x ep x dp_shard x pp x dp differs from job.gpus")
                    continue
                m = num_micro_batches(job, b, dp, side)
                # job.parallelism.pipeline_schedule: 1F1B at each virtual_stages, DualPipeV
                # (its own 2 chunks per rank, virtual_stages 1) once
                schedules = par.pipeline_schedule or ["1f1b"]
                shapes = [(v, "1f1b") for v in sorted(set(par.virtual_stages))]
                shapes = [x for x in shapes if "1f1b" in schedules]
                if "dualpipev" in schedules:
                    shapes.append((1, "dualpipev"))
                for v, schedule in shapes:
                    chunks = None
                    if schedule == "dualpipev":
                        found = dualpipev_split(model.layers, pp, m, report)
                        if found is None:
                            continue
                        split, chunks = found
                        report.split_sources.add("even")
                        splits, complete = [split], True
                    elif v == 1:
                        base = job_config(
                            job,
                            tp,
                            pp,
                            dp,
                            b,
                            m,
                            layers,
                            job.sync.modes[0],
                            cp,
                            ep,
                            dp_shard=f,
                            etp=etp,
                        )
                        space = split_space(problem, perf, base, gpus)
                        report.split_sources.add(space.source)
                        splits, complete = space.splits, space.complete
                    else:
                        found = interleaved_split(model.layers, pp, m, v, report)
                        if found is None:
                            continue
                        split, chunks = found
                        # one split per (pp, v): the even chunks, else Megatron-Core's
                        # balanced layout; the plan's solver.splits says so
                        report.split_sources.add("even")
                        splits, complete = [split], True
                    for mode in job.sync.modes:
                        for split in splits:
                            out.append(
                                job_config(
                                    job,
                                    tp,
                                    pp,
                                    dp,
                                    b,
                                    m,
                                    split,
                                    mode,
                                    cp,
                                    ep,
                                    virtual_stages=v,
                                    dp_shard=f,
                                    etp=etp,
                                    chunk_split=chunks,
                                    pipeline_schedule=schedule,
                                )
                            )
                        if not complete:
                            rest = job_config(
                                job, tp, pp, dp, b, m, layers, mode, cp, ep, dp_shard=f, etp=etp
                            )
                            report.unsearched.append(rest)
    return out


def interleaved_split(
    layers: int, pp: int, m: int, v: int, report: SpaceReport
) -> tuple[tuple[int, ...], tuple[int, ...] | None] | None:
    """(layers per pipeline rank, layers per model stage or None for even chunks) of v
    chunks per rank, or None (with the reason dropped).

    v = 1: the balanced split. v > 1 needs pipeline parallelism and a micro-batch count
    that is a multiple of pp (the interleaved schedule's micro-batch groups, as placer.
    perf.critical_path.interleaved_order and Megatron-LM before Core 0.8 require). When v
    divides the layers (and leaves each rank a chunk): the balanced split of layers / v
    over the ranks, times v, every chunk of rank k holding the balanced share of rank k
    (Megatron-Core's even split). Otherwise uneven chunks (balanced_chunk_layers: the
    embedding and the loss counted as a layer, Megatron-Core's pipeline layout), each
    rank's layers the sum of its chunks."""
    if v == 1:
        return balanced_stage_layers(layers, pp), None
    if pp == 1:
        report.drop("virtual_stages > 1 needs pp > 1")
        return None
    if m % pp:
        report.drop("interleaving needs the micro-batch count to be a multiple of pp")
        return None
    if layers % v == 0 and layers // v >= pp:
        return tuple(v * n for n in balanced_stage_layers(layers // v, pp)), None
    chunks = balanced_chunk_layers(layers, pp, v)
    if chunks is None:
        report.drop("the layers do not split into pp x virtual_stages chunks")
        return None
    ranks = tuple(sum(chunks[c * pp + k] for c in range(v)) for k in range(pp))
    return ranks, chunks


def dualpipev_split(
    layers: int, pp: int, m: int, report: SpaceReport
) -> tuple[tuple[int, ...], tuple[int, ...] | None] | None:
    """(layers per pipeline rank, layers per model stage or None for equal halves) of
    DualPipeV's 2 pp model stages (rank k holds stages k and 2 pp - 1 - k), or None (with
    the reason dropped). DualPipeV needs pp >= 2 and at least 2 pp micro-batches
    (DeepSeek's DualPipeV.step; placer.perf.dualpipe). When 2 pp divides the layers every
    model stage holds layers / (2 pp); otherwise the balanced split of the model stages
    (balanced_chunk_layers over 2 pp stages in model order: the embedding and the loss
    counted as a layer each, here both on rank 0), each rank's layers the sum of its two.
    One split per pp, as for interleaving (solver.splits: even)."""
    if pp < 2:
        report.drop("dualpipev needs pp >= 2")
        return None
    if m < 2 * pp:
        report.drop("dualpipev needs at least 2 x pp micro-batches")
        return None
    n = 2 * pp
    if layers % n == 0:
        return tuple(2 * layers // n for _ in range(pp)), None
    chunks = balanced_chunk_layers(layers, n, 1)
    if chunks is None:
        report.drop("the layers do not split into 2 x pp dualpipev chunks")
        return None
    return tuple(chunks[k] + chunks[n - 1 - k] for k in range(pp)), chunks


def stage_memory_gb(problem: Problem, cfg: Config, stage: int) -> float:
    """A stage's memory per GPU (GB): it reads no site, so callers that test it against
    several GPU types compute it once."""
    return config_stage_memory_bytes(problem.model, cfg, stage)["total"] / GB


def memory_gap_gb(problem: Problem, mem_gb: float, gpu_key: str) -> float:
    """How much more memory than `gpu_key` has the stage needs (<= 0: it fits)."""
    return mem_gb - (problem.catalog.gpus[gpu_key].hbm_gb - problem.catalog.memory.reserve_gb)


def memory_fits(problem: Problem, cfg: Config, stage: int, gpu_key: str) -> tuple[bool, float]:
    mem = stage_memory_gb(problem, cfg, stage)
    cap = problem.catalog.gpus[gpu_key].hbm_gb - problem.catalog.memory.reserve_gb
    return mem <= cap, mem - cap


def chain_types(
    problem: Problem, perf: PerfModel, cfg: Config, report: SpaceReport | None = None
) -> list[Chain]:
    """Every contiguous-block chain of at most K sites that fits in memory and is routable."""
    inst = problem.instance
    k_max = inst.solver.max_sites_per_replica
    sites = [
        s.name for s in inst.sites if site_group_capacity(problem, s.name, cfg.tp, cfg.width) > 0
    ]
    fits: dict[tuple[int, str], bool] = {}
    mems = [stage_memory_gb(problem, cfg, k) for k in range(cfg.pp)] if sites else []
    for s in sites:
        gpu = inst.site(s).gpu
        for k in range(cfg.pp):
            gap = memory_gap_gb(problem, mems[k], gpu)
            ok = gap <= 0
            fits[(k, s)] = ok
            if report is not None and not ok and gap < report.best_memory_gap_gb:
                report.best_memory_gap_gb = gap
                report.memory_example = (
                    f"{cfg.label()}: stage {k} on {gpu} needs {gap:.1f} GB more than it has"
                )
    _check_chain_space(len(sites), k_max, cfg.pp)
    out: list[Chain] = []
    for n_blocks in range(1, min(k_max, len(sites), cfg.pp) + 1):
        for order in itertools.permutations(sites, n_blocks):
            deadline.check()
            hops = list(zip(order, order[1:], strict=False))
            if cfg.virtual_stages > 1 and len(order) > 1:
                hops.append((order[-1], order[0]))  # the wrap from the last rank to the first
            if any(perf.net.path(a, b) is None for a, b in hops):
                continue
            for cuts in itertools.combinations(range(1, cfg.pp), n_blocks - 1):
                bounds = (0, *cuts, cfg.pp)
                chain = tuple(
                    order[i] for i in range(n_blocks) for _ in range(bounds[i], bounds[i + 1])
                )
                if all(fits[(k, s)] for k, s in enumerate(chain)):
                    out.append(chain)
    return out


def _check_chain_space(n_sites: int, k_max: int, pp: int) -> None:
    """Refuse, with the fields to change, a configuration whose chain enumeration (site
    orders x stage cuts) exceeds MAX_CHAIN_CANDIDATES: it could not finish in any limit."""
    from placer.errors import InputError
    from placer.limits import MAX_CHAIN_CANDIDATES

    total = 0
    for n in range(1, min(k_max, n_sites, pp) + 1):
        total += math.perm(n_sites, n) * math.comb(pp - 1, n - 1)
        if total > MAX_CHAIN_CANDIDATES:
            raise InputError(
                f"solver.max_sites_per_replica: {k_max} with {n_sites} usable sites and pp={pp} gives more than "  # noqa: E501
                f"{MAX_CHAIN_CANDIDATES:,} candidate chains per configuration; lower solver.max_sites_per_replica "  # noqa: E501
                "or restrict job.parallelism.pp"
            )
