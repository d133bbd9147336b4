"""The search space: parallel configurations and the replica chain types of each.

Configurations (tp, pp, dp, micro-batch, sync policy) are enumerated outside the
formulations and pruned by memory and by a lower bound against the incumbent.

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
from placer.perf.flops import config_stage_memory_bytes
from placer.perf.step import Chain, Config, PerfModel, balanced_stage_layers
from placer.rules import job_config, num_micro_batches, site_gpus_per_node, tp_groups_per_node

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

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def drop_slow(self, lower_bound_s: float) -> None:
        """A configuration whose step-time lower bound exceeds max_step_time_s."""
        self.drop("lower bound above max_step_time_s")
        self.best_time_lb_s = min(self.best_time_lb_s, lower_bound_s)


def site_group_capacity(problem: Problem, site: str, tp: int) -> int:
    s = problem.instance.site(site)
    gpn = site_gpus_per_node(problem, site)
    if tp > gpn:
        return 0
    return (s.gpus // gpn) * tp_groups_per_node(gpn, tp)


def enumerate_configs(problem: Problem, report: SpaceReport | None = None) -> list[Config]:
    inst, model = problem.instance, problem.model
    job = inst.job
    par = job.parallelism
    report = report or SpaceReport()
    max_gpn = max(site_gpus_per_node(problem, s.name) for s in inst.sites)
    tps = par.tp or powers_of_two_upto(max_gpn)
    pps = par.pp or divisors(model.layers)
    mbs = par.micro_batch or [1, 2, 4]
    out: list[Config] = []
    for tp in sorted(set(tps)):
        if model.heads % tp or model.kv % tp and tp % model.kv:
            report.drop(f"tp={tp} does not divide the attention heads")
            continue
        groups = sum(site_group_capacity(problem, s.name, tp) for s in inst.sites)
        if groups == 0:
            report.drop(f"tp={tp} fits no node")
            continue
        for pp in sorted(set(pps)):
            if pp > model.layers:
                report.drop(f"pp={pp} exceeds {model.layers} layers")
                continue
            layers = balanced_stage_layers(model.layers, pp)
            for b in sorted(set(mbs)):
                if job.global_batch % b:
                    continue
                dps = par.dp or divisors(job.global_batch // b)
                for dp in sorted(set(dps)):
                    report.considered += 1
                    if (job.global_batch // b) % dp:
                        report.drop("global_batch not divisible by micro_batch x dp")
                        continue
                    if pp * dp > groups:
                        report.drop("more GPUs than the sites offer")
                        continue
                    if job.gpus is not None and tp * pp * dp != job.gpus:
                        report.drop("tp x pp x dp differs from job.gpus")
                        continue
                    m = num_micro_batches(job, b, dp)
                    for mode in job.sync.modes:
                        out.append(job_config(job, tp, pp, dp, b, m, layers, mode))
    return out


def memory_fits(problem: Problem, cfg: Config, stage: int, gpu_key: str) -> tuple[bool, float]:
    mem = config_stage_memory_bytes(problem.model, cfg, stage)["total"] / GB
    cap = problem.catalog.gpus[gpu_key].hbm_gb - problem.catalog.memory.reserve_gb
    return mem <= cap, mem - cap


def chain_types(
    problem: Problem, perf: PerfModel, cfg: Config, report: SpaceReport | None = None
) -> list[Chain]:
    """Every contiguous-block chain of at most K sites that fits in memory and is routable."""
    inst = problem.instance
    k_max = inst.solver.max_sites_per_replica
    sites = [s.name for s in inst.sites if site_group_capacity(problem, s.name, cfg.tp) > 0]
    fits: dict[tuple[int, str], bool] = {}
    for s in sites:
        gpu = inst.site(s).gpu
        for k in range(cfg.pp):
            ok, gap = memory_fits(problem, cfg, k, gpu)
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
            if any(perf.net.path(a, b) is None for a, b in zip(order, order[1:], strict=False)):
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
