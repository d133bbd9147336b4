"""Launch configurations: rank map, Megatron-LM, torchtitan, torchrun and SLURM files.

Rank order
----------
Megatron-LM (`megatron.core.parallel_state`, default order ``"tp-cp-ep-dp-pp"``, leftmost
fastest) with cp = ep = 1 numbers the global ranks

    rank = tp_rank + tp * (dp_rank + dp * pp_rank)

torchtitan (`ParallelDims`: DeviceMesh dims ``["pp", "dp_replicate", "dp_shard", "cp", "tp"]``,
rightmost fastest) with cp = 1 numbers them

    rank = tp_rank + tp * (dp_shard_rank + dp_shard * (dp_replicate_rank + dp_replicate * pp_rank))

which is the same order once ``dp_rank = dp_replicate_rank * dp_shard + dp_shard_rank`` (the
flattened "dp" mesh). Consecutive ranks fill tp, then dp, then pp. One layout therefore serves
both frameworks; each emitter recomputes its own coordinates and checks them against it.

Replicas and placement
----------------------
Data-parallel replicas get dp_rank 0..dp-1 group by group, the plan's replica groups sorted by
their ``stage_sites`` (stable), so replicas with the same chain are consecutive. The TP group
(pp_rank, dp_rank), i.e. ``tp`` consecutive ranks, lives at site ``stage_sites[pp_rank]`` of
that replica. At each site its TP groups, in increasing rank order, fill the site's nodes
``gpus_per_node // tp`` at a time (exactly the evaluator's node count); the local GPU is
``slot * tp + tp_rank``. So a TP group never straddles a node, and within a node increasing
rank means increasing local GPU (SLURM_LOCALID = local GPU under arbitrary distribution).
When tp does not divide gpus_per_node (e.g. tp=16 on a 72-GPU NVL72 node) the last
``gpus_per_node % tp`` GPUs of each node stay idle, as the evaluator assumes.

Node ranks
----------
torchrun (and Megatron through it) gives each node rank a contiguous block of global ranks.
A *node rank* here is a maximal run of consecutive global ranks on one physical node, in rank
order; the host-order files list them (line i = node rank i: site, node within the site,
GPUs). When every run of same-site replicas of every stage is a multiple of
``gpus_per_node / tp`` replicas (always when tp = gpus_per_node, and whenever the replica
counts per chain are multiples of it), each physical node is exactly one node rank. Otherwise
(e.g. tp * dp not a multiple of gpus_per_node, or a site change in the middle of a node) a
physical node hosts two or more node ranks: each is its own torchrun agent restricted to its
GPUs with CUDA_VISIBLE_DEVICES, and nproc_per_node differs between node ranks (torchrun's
static rendezvous, i.e. --master_addr/--master_port without --rdzv_backend=c10d, honours
--node_rank and sums the agents' local world sizes; do not set TORCH_ELASTIC_WORKER_IDENTICAL).
No GPU is wasted and no node is added: the plan's node counts stand. A plan cannot be
expressed (InputError) when tp exceeds a hosting site's gpus_per_node, when a stage names an
unknown site, or when a site lacks the nodes its TP groups need.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shlex
from dataclasses import dataclass
from functools import reduce
from typing import Any

from placer.errors import InputError
from placer.io import Problem, plan_from_data
from placer.network import PHASES, Network, resolve_routing
from placer.outputs.model_flags import megatron_env, megatron_model_args, model_notes
from placer.rules import (
    config_of,
    expert_fold_width,
    nodes_for,
    plan_side,
    replica_slots,
    site_gpus_per_host,
    site_gpus_per_node,
    sync_mode_of,
)
from placer.schema import Plan

MEGATRON_ORDER = "tp-cp-ep-dp-pp"
TORCHTITAN_MESH = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
RANKMAP_COLUMNS = [
    "rank",
    "site",
    "node",
    "host",
    "local_gpu",
    "tp",
    "pp",
    "dp",
    "replica_group",
    "node_rank",
    "local_rank",
    "domain",
    "cp",
    "ep",
    "expert_dp",
]
MiB = 1 << 20


# ----------------------------------------------------------------------------- rank formulas


def megatron_rank(tp_rank: int, dp_rank: int, pp_rank: int, tp: int, dp: int) -> int:
    """Megatron-Core's default order 'tp-cp-ep-dp-pp' (leftmost fastest), cp = ep = 1."""
    return tp_rank + tp * (dp_rank + dp * pp_rank)


def megatron_coords(rank: int, tp: int, dp: int) -> tuple[int, int, int]:
    """(tp_rank, dp_rank, pp_rank) of a global rank under Megatron's default order."""
    return rank % tp, (rank // tp) % dp, rank // (tp * dp)


def megatron_rank_5d(
    tp_rank: int, cp_rank: int, dp_rank: int, pp_rank: int, tp: int, cp: int, dp: int
) -> int:
    """Megatron-Core's 'tp-cp-ep-dp-pp' for the dense layers (EP is not a dense dimension:
    Megatron builds it from the same ranks in a second order, expert_coords)."""
    return tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))


def megatron_coords_5d(rank: int, tp: int, cp: int, dp: int) -> tuple[int, int, int, int]:
    """(tp_rank, cp_rank, dp_rank, pp_rank) of a global rank; dp = Megatron's data-parallel
    size (world / (tp cp pp))."""
    return rank % tp, (rank // tp) % cp, (rank // (tp * cp)) % dp, rank // (tp * cp * dp)


def expert_coords(rank: int, stage_size: int, ep: int, etp: int = 1) -> tuple[int, int]:
    """(ep_rank, expert_dp_rank) under Megatron-Core's expert order 'tp-cp-ep-dp-pp' with
    tp = expert tensor parallelism and cp = 1 (parallel_state's expert RankGenerator): the
    etp x ep consecutive ranks of a pipeline stage form an expert model-parallel group, EP
    ranks at stride etp. With etp = 1 (the unfolded layout) torchtitan's sparse mesh
    ['pp', 'dp_replicate', 'efsdp', 'ep'] (EP borrowed from FSDP and TP, rightmost
    fastest) gives the same."""
    i = rank % stage_size
    return (i // etp) % ep, i // (etp * ep)


def torchtitan_coords(
    rank: int, pp: int, dp_replicate: int, dp_shard: int, tp: int, cp: int = 1
) -> dict[str, int]:
    """Coordinates of a rank in torchtitan's mesh ['pp', 'dp_replicate', 'dp_shard', 'cp', 'tp'],
    rightmost fastest (row-major, like torch's init_device_mesh)."""
    sizes = dict(zip(TORCHTITAN_MESH, (pp, dp_replicate, dp_shard, cp, tp), strict=True))
    out: dict[str, int] = {}
    r = rank
    for name in reversed(TORCHTITAN_MESH):
        out[name] = r % sizes[name]
        r //= sizes[name]
    if r:
        raise ValueError(f"rank {rank} outside the mesh {sizes}")
    return out


def torchtitan_dp_split(plan: Plan, zero1: bool) -> tuple[int, int]:
    """(dp_replicate, dp_shard): shard within blocks of identical chains so that every FSDP
    shard group stays inside one site (dp_shard = gcd of the replica-group counts) when the job
    shards optimizer state (zero1); plain replication (DDP) otherwise. A plan with its own
    FSDP shard group (parallelism.dp_shard > 1) is exported as it is: its replicas are the
    replicate group, its dp_shard ranks the shard group."""
    dp = plan.parallelism.dp
    ep = plan_side(plan)  # data-parallel ranks per replica: ep unfolded
    if (plan.parallelism.dp_shard or 1) > 1:
        # the plan's FSDP shard group (HSDP): dp_shard ranks per replica, replicas replicate
        return dp, ep
    if not zero1:
        # EP borrows its ranks from FSDP in torchtitan (efsdp = dp_shard cp tp / ep): shard
        # over the ep data-parallel ranks of each replica, replicate the replicas
        return dp, ep
    shard = reduce(math.gcd, (g.count for g in plan.replica_groups))
    return dp // shard, shard * ep


# ----------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class RankRow:
    rank: int
    site: str
    node: int  # host (OS instance) within the site: what launchers address
    host: str
    local_gpu: int  # GPU within the host
    tp: int
    pp: int
    dp: int
    replica_group: int
    node_rank: int
    local_rank: int
    domain: int  # NVLink domain within the site (the evaluator's "node")
    cp: int = 0  # context-parallel rank
    ep: int = 0  # expert-parallel rank
    expert_dp: int = 0  # expert data-parallel rank
    etp: int = 0  # expert tensor-parallel rank (0 unless folded with etp > 1)


@dataclass(frozen=True)
class NodeRank:
    index: int
    site: str
    node: int
    host: str
    gpus: tuple[int, ...]
    first_rank: int

    @property
    def nproc(self) -> int:
        return len(self.gpus)

    @property
    def gpu_list(self) -> str:
        return ",".join(str(g) for g in self.gpus)

    @property
    def gpu_range(self) -> str:
        return f"{self.gpus[0]}-{self.gpus[-1]}" if len(self.gpus) > 1 else str(self.gpus[0])


@dataclass
class Layout:
    problem: Problem
    plan: Plan
    tp: int
    pp: int
    dp: int
    replica_group: list[int]  # dp_rank -> index in plan.replica_groups
    replica_sites: list[tuple[str, ...]]  # dp_rank -> stage sites
    ranks: list[RankRow]
    node_ranks: list[NodeRank]
    nodes_by_site: dict[str, int]  # NVLink domains in use (the evaluator's node count)
    gpus_per_node: dict[str, int]  # NVLink domain size
    gpus_per_host: dict[str, int]
    hosts_by_site: dict[str, list[int]]  # host indices in use, increasing
    cp: int = 1
    ep: int = 1
    dp_shard: int = 1  # FSDP shard group: data-parallel ranks per replica (ep = 1)
    etp: int | None = None  # folded expert layout's expert TP (rules.expert_fold_width)

    @property
    def width(self) -> int:
        """GPUs of one replica at one stage, consecutive ranks: tp x cp x ep x dp_shard;
        folded (etp set) lcm(tp x cp, ep x etp)."""
        if self.etp is not None:
            return expert_fold_width(self.tp, self.cp, self.ep, self.etp)
        return self.tp * self.cp * self.ep * self.dp_shard

    @property
    def side(self) -> int:
        """Data-parallel ranks of one replica: width / (tp x cp)."""
        return self.width // (self.tp * self.cp)

    @property
    def dp_size(self) -> int:
        """Megatron's data-parallel size: dp replicas of `side` (ep x dp_shard unfolded)
        data-parallel ranks each."""
        return self.dp * self.side

    @property
    def world_size(self) -> int:
        return self.width * self.pp * self.dp

    @property
    def sites(self) -> list[str]:
        return [s.name for s in self.problem.instance.sites if self.nodes_by_site.get(s.name)]

    @property
    def host_count(self) -> int:
        return sum(len(h) for h in self.hosts_by_site.values())

    def site_of(self, pp_rank: int, dp_rank: int) -> str:
        return self.replica_sites[dp_rank][pp_rank]

    def host(self, site: str, node: int) -> str:
        return site_host_name(self.problem, site, node)

    def host_names(self, site: str) -> list[str]:
        return [self.host(site, n) for n in self.hosts_by_site.get(site, [])]

    def named_hosts(self, site: str) -> bool:
        return self.problem.instance.site(site).hosts is not None


def _stage_aligned_slots(
    replica_sites: list[tuple[str, ...]], per_node: dict[str, int], pp: int, dp: int
) -> dict[tuple[int, int], int]:
    """The slot (TP-group position at its site, per_node to a domain) of every (pp_rank,
    dp_rank), so that each stage's members at a site fill whole domains in dp order and
    its remainder (count mod per_node) sits in one domain, as the data-parallel price
    assumes (PerfModel.node_fill: a domain of r < q members carries the node's whole
    share of the ring on its r NICs). A site's domains are the evaluator's count,
    ceil(its TP groups / per_node): the remainders of its stages are packed first-fit
    decreasing into the domains left; where they do not fit unsplit, the site keeps the
    contiguous order (rank order; then a stage can start inside its predecessor's last
    domain). Inside a shared domain the stages keep rank order. With every count a
    multiple of per_node (always with per_node 1) this is the contiguous order."""
    members: dict[str, list[list[int]]] = {}
    for pp_r in range(pp):
        for dp_r in range(dp):
            site = replica_sites[dp_r][pp_r]
            members.setdefault(site, [[] for _ in range(pp)])[pp_r].append(dp_r)
    out: dict[tuple[int, int], int] = {}
    for site, stages in members.items():
        q = per_node[site]
        total = sum(len(m) for m in stages)
        domains = -(-total // q)
        full = sum(len(m) // q for m in stages)
        free = [q] * (domains - full)
        home: dict[int, int] = {}  # stage -> index into free of its remainder's domain
        order = sorted(range(pp), key=lambda k: (-(len(stages[k]) % q), k))
        for k in order:
            r = len(stages[k]) % q
            if r == 0:
                continue
            fit = next((i for i, cap in enumerate(free) if cap >= r), None)
            if fit is None:
                home = {}
                break
            free[fit] -= r
            home[k] = fit
        if any(len(m) % q for m in stages) and not home:
            slot = 0  # contiguous: the rank order
            for pp_r, m in enumerate(stages):
                for dp_r in m:
                    out[(pp_r, dp_r)] = slot
                    slot += 1
            continue
        d = 0
        for pp_r, m in enumerate(stages):  # whole domains first, in rank order
            for j in range(len(m) // q * q):
                out[(pp_r, m[j])] = (d + j // q) * q + j % q
            d += len(m) // q
        used = [0] * len(free)
        for pp_r, m in enumerate(stages):  # remainders, rank order inside each domain
            if pp_r not in home:
                continue
            i = home[pp_r]
            for dp_r in m[len(m) // q * q :]:
                out[(pp_r, dp_r)] = (full + i) * q + used[i]
                used[i] += 1
    return out


def host_name(site: str, node: int) -> str:
    """Placeholder name of host `node` of `site`, used when the instance names no hosts."""
    return f"{site}-node{node}"


def site_host_name(problem: Problem, site: str, node: int) -> str:
    """The real name of host `node` of `site` (instance `hosts` / `hostfile`), else a placeholder."""  # noqa: E501
    hosts = problem.instance.site(site).hosts
    return hosts[node] if hosts is not None else host_name(site, node)


def build_layout(problem: Problem, plan: Plan | dict[str, Any]) -> Layout:
    plan = plan_from_data(plan)
    par = plan.parallelism
    tp, pp, dp = par.tp, par.pp, par.dp
    cp, ep, shard = par.cp or 1, par.ep or 1, par.dp_shard or 1
    etp = par.etp
    width = expert_fold_width(tp, cp, ep, etp) if etp is not None else tp * cp * ep * shard
    side = width // (tp * cp)  # data-parallel ranks of one replica
    inst = problem.instance
    known = {s.name for s in inst.sites}
    groups = plan.replica_groups
    for i, g in enumerate(groups):
        for s in g.stage_sites:
            if s not in known:
                raise InputError(
                    f"replica_groups[{i}].stage_sites: unknown site '{s}' (known: {', '.join(sorted(known))})"  # noqa: E501
                )
    order = sorted(range(len(groups)), key=lambda i: tuple(groups[i].stage_sites))
    replica_group = [i for i in order for _ in range(groups[i].count)]
    replica_sites = [tuple(groups[i].stage_sites) for i in replica_group]
    used = {s for sites in replica_sites for s in sites}
    gpn = {s.name: site_gpus_per_node(problem, s.name) for s in inst.sites}
    gph = {s.name: site_gpus_per_host(problem, s.name) for s in inst.sites}
    for s in inst.sites:
        if s.name in used and tp > gpn[s.name]:
            raise InputError(
                f"cannot launch: tp={tp} does not fit in an NVLink domain of site '{s.name}' ({gpn[s.name]} GPUs); a TP group must sit inside one domain"  # noqa: E501
            )
    for s in inst.sites:
        if s.name in used and replica_slots(gpn[s.name], tp, width)[0] == 0:
            raise InputError(
                f"cannot launch: a replica stage of tp x cp x ep = {width} GPUs neither fits an NVLink domain of site '{s.name}' ({gpn[s.name]} GPUs) nor fills whole domains"  # noqa: E501
            )
    per_node = {s: replica_slots(gpn[s], tp, width)[0] for s in used}
    block = {s: replica_slots(gpn[s], tp, width)[1] for s in used}
    filled: dict[str, int] = dict.fromkeys(used, 0)
    rows: list[RankRow] = []
    node_ranks: list[NodeRank] = []
    cur: tuple[str, int] | None = None
    cur_gpus: list[int] = []
    cur_first = 0

    def close() -> None:
        if cur is not None:
            node_ranks.append(
                NodeRank(
                    len(node_ranks),
                    cur[0],
                    cur[1],
                    site_host_name(problem, *cur),
                    tuple(cur_gpus),
                    cur_first,
                )
            )

    slot_of = _stage_aligned_slots(replica_sites, per_node, pp, dp)
    for pp_r in range(pp):
        for dp_r in range(dp):
            site = replica_sites[dp_r][pp_r]
            slot_index = slot_of[(pp_r, dp_r)]
            filled[site] += 1
            first_domain, slot = divmod(slot_index, per_node[site])
            first_domain *= block[site]
            hosts_per_domain = gpn[site] // gph[site]
            for u in range(width):
                tp_r, cp_r, e = u % tp, (u // tp) % cp, u // (tp * cp)
                rank = megatron_rank_5d(tp_r, cp_r, dp_r * side + e, pp_r, tp, cp, dp * side)
                if rank != len(rows):
                    raise AssertionError("ranks must be produced in order")
                domain, in_domain = divmod(slot * width + u, gpn[site])
                domain += first_domain
                host_in_domain, gpu = divmod(in_domain, gph[site])
                node = domain * hosts_per_domain + host_in_domain
                if (site, node) != cur:
                    close()
                    cur, cur_gpus, cur_first = (site, node), [], rank
                cur_gpus.append(gpu)
                ep_r, edp_r = expert_coords(rank, width * dp, ep, etp or 1)
                rows.append(
                    RankRow(
                        rank,
                        site,
                        node,
                        "",
                        gpu,
                        tp_r,
                        pp_r,
                        dp_r * side + e,
                        replica_group[dp_r],
                        len(node_ranks),
                        len(cur_gpus) - 1,
                        domain,
                        cp_r,
                        ep_r,
                        edp_r,
                        (rank % (width * dp)) % (etp or 1),
                    )
                )
    close()
    nodes_by_site = {
        s.name: nodes_for(gpn[s.name], tp, width, filled.get(s.name, 0)) for s in inst.sites
    }
    for s in inst.sites:
        have = s.gpus // gpn[s.name]
        if nodes_by_site[s.name] > have:
            raise InputError(
                f"cannot launch: site '{s.name}' needs {nodes_by_site[s.name]} NVLink domains of {gpn[s.name]} GPUs for its {filled[s.name]} replica stages of {width} GPUs (tp x cp x ep), has {have}"  # noqa: E501
            )
    rows = [
        RankRow(
            r.rank,
            r.site,
            r.node,
            site_host_name(problem, r.site, r.node),
            *[
                getattr(r, f)
                for f in (
                    "local_gpu",
                    "tp",
                    "pp",
                    "dp",
                    "replica_group",
                    "node_rank",
                    "local_rank",
                    "domain",
                    "cp",
                    "ep",
                    "expert_dp",
                    "etp",
                )
            ],
        )
        for r in rows
    ]
    hosts_by_site = {s.name: sorted({r.node for r in rows if r.site == s.name}) for s in inst.sites}
    # within a host, increasing rank must mean increasing local GPU (SLURM_LOCALID)
    seen: dict[tuple[str, int], int] = {}
    for r in rows:
        if seen.get((r.site, r.node), -1) >= r.local_gpu:
            raise AssertionError(f"local GPU order broken on {r.host}")
        seen[(r.site, r.node)] = r.local_gpu
    return Layout(
        problem,
        plan,
        tp,
        pp,
        dp,
        replica_group,
        replica_sites,
        rows,
        node_ranks,
        nodes_by_site,
        gpn,
        gph,
        hosts_by_site,
        cp,
        ep,
        shard,
        etp,
    )


# ----------------------------------------------------------------------------- shared text


def _mapping_comment(layout: Layout, framework: str) -> list[str]:
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    if layout.width > tp:
        return _mapping_comment_5d(layout, framework)
    lines = [
        f"placer launch layout for instance '{layout.problem.name}': tp={tp} pp={pp} dp={dp}, world size {layout.world_size}, {len(layout.node_ranks)} node ranks on {layout.host_count} hosts ({sum(layout.nodes_by_site.values())} NVLink domains)",  # noqa: E501
    ]
    if framework == "megatron":
        lines += [
            f"Rank order: Megatron-Core default order '{MEGATRON_ORDER}' (leftmost fastest), cp = ep = 1:",  # noqa: E501
            "  rank = tp_rank + tp * (dp_rank + dp * pp_rank)",
            "  (do not pass --use-tp-pp-dp-mapping: it switches to order tp-cp-ep-pp-dp)",
        ]
    elif framework == "torchtitan":
        lines += [
            "Rank order: torchtitan DeviceMesh dims ['pp', 'dp_replicate', 'dp_shard', 'cp', 'tp'], rightmost fastest, cp = 1:",  # noqa: E501
            "  rank = tp_rank + tp * (dp_shard_rank + dp_shard * (dp_replicate_rank + dp_replicate * pp_rank))",  # noqa: E501
            "  dp_rank = dp_replicate_rank * dp_shard + dp_shard_rank (the flattened 'dp' mesh)",
        ]
    else:
        lines += [
            "Rank order (Megatron 'tp-cp-ep-dp-pp' = torchtitan mesh order): rank = tp_rank + tp * (dp_rank + dp * pp_rank)"  # noqa: E501
        ]
    lines += [
        "Replicas: dp_rank numbers replicas group by group, the plan's replica groups sorted by stage_sites:",  # noqa: E501
    ]
    for g, start, n in _replica_runs(layout):
        lines.append(
            f"  dp_rank {start}-{start + n - 1}: replica_groups[{g}] stages on {_chain(layout.plan.replica_groups[g].stage_sites)}"  # noqa: E501
        )
    lines += [
        "Placement: TP group (pp_rank, dp_rank) sits at the site of that stage of that replica; each site's TP groups fill its",  # noqa: E501
        "  NVLink domains (gpus_per_node GPUs) gpus_per_node // tp at a time in rank order; GPU in the domain = slot * tp + tp_rank;",  # noqa: E501
        "  a domain is gpus_per_node / gpus_per_host hosts: host = domain * that + GPU in domain // gpus_per_host, local GPU = the rest.",  # noqa: E501
        "  A TP group never leaves its NVLink domain; it spans hosts when tp > gpus_per_host (e.g. NVL72 trays of 4 GPUs).",  # noqa: E501
        "Node rank i = the i-th maximal run of consecutive ranks on one host (line i of the host-order file).",  # noqa: E501
    ]
    for s in layout.sites:
        lines.append(
            f"  site {s}: NVLink domain {layout.gpus_per_node[s]} GPUs, host {layout.gpus_per_host[s]} GPUs"  # noqa: E501
            + (
                ""
                if layout.named_hosts(s)
                else f" (placeholder host names {host_name(s, 0)} ...: name real hosts with sites[].hosts or hostfile)"  # noqa: E501
            )
        )
    if len(layout.node_ranks) != layout.host_count:
        lines += [
            "NOTE: some hosts run more than one node rank (same-site replica runs are not multiples of gpus_per_host / tp):",  # noqa: E501
            "  run one torchrun agent per node rank with CUDA_VISIBLE_DEVICES set to its GPUs; nproc_per_node differs.",  # noqa: E501
        ]
    return lines


def _replica_runs(layout: Layout) -> list[tuple[int, int, int]]:
    """(replica group, first replica, count) in replica order: the runs the comments list."""
    out, start = [], 0
    for g in dict.fromkeys(layout.replica_group):
        n = layout.plan.replica_groups[g].count
        out.append((g, start, n))
        start += n
    return out


def _mapping_comment_5d(layout: Layout, framework: str) -> list[str]:
    """The rank order with context and expert parallelism (a replica stage is tp x cp x ep
    consecutive ranks; Megatron's data-parallel size is dp x ep)."""
    tp, cp, ep, pp, dp = layout.tp, layout.cp, layout.ep, layout.pp, layout.dp
    side = layout.side  # data-parallel ranks per replica
    fsdp = f" dp_shard={layout.dp_shard}" if layout.dp_shard > 1 else ""
    per = "ep x dp_shard" if layout.dp_shard > 1 else "ep"
    etp = layout.etp
    if etp is not None:
        fsdp += f" etp={etp}"
        per = f"lcm(tp x cp, ep x etp) / (tp x cp) = {side}"
    experts = [
        "  experts (expert tensor parallelism 1): ep_rank = rank-in-stage % ep, expert_dp = rank-in-stage // ep,",  # noqa: E501
        "  i.e. ep consecutive ranks form an EP group (Megatron's expert order; torchtitan's sparse mesh [pp, dp_replicate, efsdp, ep]).",  # noqa: E501
    ]
    if etp is not None:
        experts = [
            f"  experts (folded, --expert-tensor-parallel-size {etp}): etp_rank = rank-in-stage % {etp}, ep_rank = (rank-in-stage // {etp}) % ep,",  # noqa: E501
            f"  expert_dp = rank-in-stage // ({etp} x ep): etp x ep consecutive ranks form an expert group drawn from the stage's tp x cp x dp ranks (Megatron-Core's expert RankGenerator, order tp-ep-dp-pp).",  # noqa: E501
        ]
    lines = [
        f"placer launch layout for instance '{layout.problem.name}': tp={tp} cp={cp} ep={ep}{fsdp} pp={pp}, {dp} replicas (data-parallel size {layout.dp_size} = replicas x {per}), world size {layout.world_size}, {len(layout.node_ranks)} node ranks on {layout.host_count} hosts ({sum(layout.nodes_by_site.values())} NVLink domains)",  # noqa: E501
        f"Rank order: Megatron-Core '{MEGATRON_ORDER}' (leftmost fastest) = torchtitan mesh ['pp', 'dp_replicate', 'dp_shard', 'cp', 'tp'] (rightmost fastest):",  # noqa: E501
        "  rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp_size * pp_rank))",
        *experts,
        f"Replica r of the plan is dp_rank r*{side} .. r*{side}+{side - 1}: its {layout.width} GPUs per stage (tp x cp x {per}) are consecutive ranks at",  # noqa: E501
        "  one site, so every TP, CP, EP and FSDP shard group stays inside the site; only DP (replicate) and PP groups cross sites.",  # noqa: E501
        "  (do not pass --use-tp-pp-dp-mapping: it switches to order tp-cp-ep-pp-dp)",
        "Replicas, the plan's replica groups sorted by stage_sites:",
    ]
    for g, start, n in _replica_runs(layout):
        lines.append(
            f"  replicas {start}-{start + n - 1} (dp_rank {start * side}-{(start + n) * side - 1}): replica_groups[{g}] stages on {_chain(layout.plan.replica_groups[g].stage_sites)}"  # noqa: E501
        )
    lines += [
        "Placement: each site's replica stages fill its NVLink domains in rank order, gpus_per_node // (tp cp ep) per domain,",  # noqa: E501
        "  or whole domains each when wider; a TP group never leaves its domain, CP and EP groups leave it only over the site's NICs.",  # noqa: E501
        "Node rank i = the i-th maximal run of consecutive ranks on one host (line i of the host-order file).",  # noqa: E501
    ]
    for s in layout.sites:
        lines.append(
            f"  site {s}: NVLink domain {layout.gpus_per_node[s]} GPUs, host {layout.gpus_per_host[s]} GPUs"  # noqa: E501
        )
    if len(layout.node_ranks) != layout.host_count:
        lines += [
            "NOTE: some hosts run more than one node rank: run one torchrun agent per node rank with CUDA_VISIBLE_DEVICES."  # noqa: E501
        ]
    return lines


def _chain(stage_sites: list[str] | tuple[str, ...]) -> str:
    parts = []
    start = 0
    for k in range(1, len(stage_sites) + 1):
        if k == len(stage_sites) or stage_sites[k] != stage_sites[start]:
            parts.append(
                f"{stage_sites[start]} (stage {start})"
                if k - 1 == start
                else f"{stage_sites[start]} (stages {start}-{k - 1})"
            )
            start = k
    return " -> ".join(parts)


def _comment(lines: list[str], prefix: str = "# ") -> str:
    return "\n".join((prefix + ln).rstrip() for ln in lines) + "\n"


def host_order_text(layout: Layout, framework: str) -> str:
    head = _mapping_comment(layout, framework) + [
        "Line i (not counting '#' lines) = node rank i.",
        "columns: node_rank site node host gpus nproc first_rank",
    ]
    body = [
        f"{u.index} {u.site} {u.node} {u.host} {u.gpu_range} {u.nproc} {u.first_rank}"
        for u in layout.node_ranks
    ]
    return _comment(head) + "\n".join(body) + "\n"


def parse_host_order(text: str) -> list[tuple[str, int, list[int], int]]:
    """(site, node, gpus, first_rank) per node rank from a host-order file."""
    out = []
    for ln in text.splitlines():
        if not ln.strip() or ln.startswith("#"):
            continue
        idx, site, node, _host, gpus, nproc, first = ln.split()
        lo, _, hi = gpus.partition("-")
        g = list(range(int(lo), int(hi or lo) + 1))
        if int(idx) != len(out) or len(g) != int(nproc):
            raise ValueError(f"malformed host-order line: {ln}")
        out.append((site, int(node), g, int(first)))
    return out


# ----------------------------------------------------------------------------- rank map


def rankmap_files(layout: Layout) -> dict[str, str]:
    data = {
        "instance": layout.problem.name,
        "world_size": layout.world_size,
        "parallelism": {
            "tp": layout.tp,
            "pp": layout.pp,
            "dp": layout.dp,
            **({"cp": layout.cp} if layout.cp > 1 else {}),
            **({"ep": layout.ep} if layout.ep > 1 else {}),
            **({"dp_shard": layout.dp_shard} if layout.dp_shard > 1 else {}),
        },
        **(
            {
                "fsdp": f"HSDP: dp = dp_replicate * {layout.dp_shard} + dp_shard; the shard group of a rank is the {layout.dp_shard} ranks with its pp, tp, cp and dp // {layout.dp_shard} (one replica, consecutive ranks at one site); the replicate group is the {layout.dp} ranks with its pp, tp, cp and dp % {layout.dp_shard}"  # noqa: E501
            }
            if layout.dp_shard > 1
            else {}
        ),
        "rank_order": "rank = tp + tp_size * (dp + dp_size * pp)  (Megatron 'tp-cp-ep-dp-pp'; torchtitan mesh ['pp','dp_replicate','dp_shard','cp','tp'])",  # noqa: E501
        "placement": "each site's TP groups fill its NVLink domains gpus_per_node // tp at a time in rank order; GPU in domain = slot * tp + tp_rank; node = host index in the site = domain * (gpus_per_node / gpus_per_host) + GPU in domain // gpus_per_host; local_gpu = GPU in domain % gpus_per_host",  # noqa: E501
        "nodes_by_site": layout.nodes_by_site,
        "gpus_per_node": {s: layout.gpus_per_node[s] for s in layout.sites},
        "gpus_per_host": {s: layout.gpus_per_host[s] for s in layout.sites},
        "hosts": {s: layout.host_names(s) for s in layout.sites},
        "node_ranks": [
            {
                "node_rank": u.index,
                "site": u.site,
                "node": u.node,
                "host": u.host,
                "gpus": list(u.gpus),
                "first_rank": u.first_rank,
            }
            for u in layout.node_ranks
        ],
        "columns": RANKMAP_COLUMNS,
        "ranks": [[getattr(r, c) for c in RANKMAP_COLUMNS] for r in layout.ranks],
    }
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(RANKMAP_COLUMNS)
    for r in layout.ranks:
        w.writerow([getattr(r, c) for c in RANKMAP_COLUMNS])
    return {
        "rankmap.json": json.dumps(data, separators=(",", ":")) + "\n",
        "rankmap.csv": buf.getvalue(),
    }


# ----------------------------------------------------------------------------- Megatron-LM


def megatron_pipeline_args(
    stage_layers: list[int], virtual_stages: int = 1, chunk_layers: list[int] | None = None
) -> tuple[list[str], list[str]]:
    """(arguments, comment lines) that give Megatron the plan's layers per stage.

    Megatron splits the layers evenly unless --decoder-first-pipeline-num-layers and/or
    --decoder-last-pipeline-num-layers set the end stages; the middle stages must then be even.
    Interleaving (v > 1) adds --num-virtual-stages-per-pipeline-rank v, the one virtual-stage
    flag Megatron-LM's validate_args accepts together with the first/last flags; Megatron-
    Core then gives every chunk of rank k stage_layers[k] / v layers (get_transformer_layer_
    offset), as the plan means. A custom layout lists the v pp model stages instead (its
    length sets the virtual size; no other virtual-stage flag is allowed with it): the
    plan's uneven middle stages, or its uneven chunks (`chunk_layers`, parallelism.
    chunk_layers in model-stage order), which no other flag expresses.
    """
    pp, v = len(stage_layers), virtual_stages
    if v > 1:
        even = [stage_layers[s % pp] // v for s in range(v * pp)]
        if chunk_layers is not None and list(chunk_layers) != even:
            return _megatron_layout(stage_layers, v, list(chunk_layers))
        if pp > 2 and len(set(stage_layers[1:-1])) > 1:
            return _megatron_layout(stage_layers, v)
        args, notes = megatron_pipeline_args(stage_layers)
        return args + ["--num-virtual-stages-per-pipeline-rank", str(v)], notes + [
            f"interleaved 1F1B: {v} chunks per rank of {[n // v for n in stage_layers]} layers"
        ]
    if pp == 1 or len(set(stage_layers)) == 1:
        return [], []
    if pp == 2:
        return ["--decoder-first-pipeline-num-layers", str(stage_layers[0])], [
            f"uneven split {stage_layers}: first stage set, the last takes the rest"
        ]
    middle = stage_layers[1:-1]
    if len(set(middle)) == 1:
        m = middle[0]
        args: list[str] = []
        if stage_layers[0] != m:
            args += ["--decoder-first-pipeline-num-layers", str(stage_layers[0])]
        if stage_layers[-1] != m:
            args += ["--decoder-last-pipeline-num-layers", str(stage_layers[-1])]
        return args, [f"uneven ends {stage_layers}: middle stages {m} layers each"]
    return _megatron_layout(stage_layers, 1)


def megatron_layout_string(chunks: list[int]) -> str:
    """Megatron-Core's pipeline layout of model stages holding `chunks` decoder layers each
    (entry c pp + k is chunk c of rank k: PipelineParallelLayerLayout), the embedding on the
    first, the loss on the last: e.g. [2, 3, 3, 2] -> "Et*2|t*3|t*3|t*2,L"."""
    n = len(chunks)
    return "|".join(
        ("E" if s == 0 else "") + f"t*{c}" + (",L" if s == n - 1 else "")
        for s, c in enumerate(chunks)
    )


def _megatron_layout(
    stage_layers: list[int], v: int, chunks: list[int] | None = None
) -> tuple[list[str], list[str]]:
    """--pipeline-model-parallel-layout of the v pp model stages in Megatron-Core's order
    (entry c pp + k is chunk c of rank k: PipelineParallelLayerLayout): `chunks` when the
    plan gives uneven chunks, else stage_layers[k] / v for every chunk of rank k."""
    pp = len(stage_layers)
    layout = megatron_layout_string(chunks or [stage_layers[s % pp] // v for s in range(v * pp)])
    if chunks is not None:
        return ["--pipeline-model-parallel-layout", layout], [
            f"interleaved 1F1B with uneven chunks {chunks} (model-stage order, chunk c of rank k at c*pp + k):",  # noqa: E501
            "Megatron-Core's even split needs each rank's layers divisible by the virtual size, so the custom",  # noqa: E501
            "layout below lists every model stage (--pipeline-model-parallel-layout, experimental; checked with",  # noqa: E501
            "megatron-core 0.16.1; E = embedding, t = decoder layer, L = loss; its length sets the virtual size).",  # noqa: E501
        ]
    middle = stage_layers[1:-1]
    return ["--pipeline-model-parallel-layout", layout], [
        f"WARNING: the plan's middle stages are uneven ({middle}): Megatron's --decoder-first/last-pipeline-num-layers",  # noqa: E501
        "require equal middle stages, so they cannot express this split. The custom layout below does (Megatron-Core",  # noqa: E501
        "with --pipeline-model-parallel-layout, experimental; E = embedding, t = decoder layer, L = loss); on an older",  # noqa: E501
        "Megatron, re-solve with even middle stages.",
    ]


def megatron_files(layout: Layout) -> dict[str, str]:
    problem, plan = layout.problem, layout.plan
    if plan.parallelism.pipeline_schedule == "dualpipev":
        # megatron-core 0.16.1 pipeline_parallel/schedules.py: no-pipelining, 1F1B and
        # interleaved 1F1B (plus the combined 1F1B of the EP overlap); no DualPipe
        raise InputError(
            "parallelism.pipeline_schedule: dualpipev has no Megatron-LM / Megatron-Core schedule "  # noqa: E501
            "(Megatron-Core runs 1F1B and interleaved 1F1B only); export it for torchtitan "
            '(-f torchtitan: pipeline_parallel_schedule = "DualPipeV") or plan with 1f1b'
        )
    # the Megatron rank order, recomputed from its formula, must give the layout's coordinates
    for r in layout.ranks:
        coords = megatron_coords_5d(r.rank, layout.tp, layout.cp, layout.dp_size)
        if coords != (r.tp, r.cp, r.dp, r.pp):
            raise AssertionError(f"Megatron order disagrees with the layout at rank {r.rank}")
    par = plan.parallelism
    model = problem.model
    job = problem.instance.job
    cfg = config_of(problem, plan)
    pipe_args, pipe_notes = megatron_pipeline_args(
        list(plan.stage_layers), plan.parallelism.virtual_stages, plan.parallelism.chunk_layers
    )
    args: list[tuple[list[str], str]] = [
        (["--tensor-model-parallel-size", str(par.tp)], "TP inside one node"),
        (
            ["--pipeline-model-parallel-size", str(par.pp)],
            f"data-parallel size = world / (tp * cp * pp) = {layout.dp_size}",
        ),
    ]
    args += megatron_5d_args(layout)
    args += [
        (["--micro-batch-size", str(par.micro_batch)], ""),
        (
            ["--global-batch-size", str(job.global_batch)],
            f"= micro_batch {par.micro_batch} x data-parallel size {layout.dp_size} x {cfg.num_micro_batches} micro-batches",  # noqa: E501
        ),
        (["--num-layers", str(model.layers)], f"layers per stage {list(plan.stage_layers)}"),
    ]
    if pipe_args:
        args.append((pipe_args, "; ".join(pipe_notes[:1])))
    args += [
        (["--hidden-size", str(model.hidden)], ""),
        (["--ffn-hidden-size", str(model.ffn)], ""),
        (["--num-attention-heads", str(model.heads)], ""),
        (["--seq-length", str(model.seq_len)], ""),
        (["--max-position-embeddings", str(model.seq_len)], ""),
    ]
    args += megatron_model_args(
        problem, plan
    )  # architecture and what the perf/memory model assumes
    prec = {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp8": ["--bf16", "--fp8-format", "hybrid"]}[
        job.precision
    ]
    args.append((prec, f"precision {job.precision}"))
    if job.recompute == "selective":
        args.append((["--recompute-granularity", "selective"], ""))
    elif job.recompute == "full":
        args.append(
            (
                [
                    "--recompute-granularity",
                    "full",
                    "--recompute-method",
                    "uniform",
                    "--recompute-num-layers",
                    "1",
                ],
                "",
            )
        )
    if job.zero1:
        args.append(
            (
                ["--use-distributed-optimizer"],
                "ZeRO-1: optimizer state sharded over dp, as the plan's memory model assumes"
                if layout.dp_shard == 1
                else "Megatron-FSDP's optimizer over the shard group",
            )
        )
    args += megatron_fsdp_args(layout)
    text = "#!/usr/bin/env bash\n" + _comment(
        _mapping_comment(layout, "megatron")
        + [
            "Launch: on the host of node rank i (line i of megatron_hosts.txt) run",
            "  CUDA_VISIBLE_DEVICES=<its gpus> torchrun --nnodes=N --node_rank=i --nproc_per_node=<its nproc> \\",  # noqa: E501
            '    --master_addr=${MASTER_ADDR} --master_port=${MASTER_PORT} pretrain_gpt.py "${MEGATRON_ARGS[@]}"',  # noqa: E501
            "  (static rendezvous so that --node_rank is honoured; the torchrun_<site>.sh files spell this out)",  # noqa: E501
            "Data, tokenizer, optimizer and checkpoint arguments are yours to add.",
            "What placer's step-time and memory model assumes, realised below (placer.outputs.model_flags):",  # noqa: E501
            *model_notes(problem, plan),
        ]
    )
    env = megatron_env(problem, plan)
    for k, v in env.items():
        text += f"export {k}={v}  # required by Megatron-LM's validate_args for tp > 1 before Blackwell (compute capability < 10)\n"  # noqa: E501
    if pipe_notes[1:]:
        text += _comment(pipe_notes)
    mode = sync_mode_of(problem, plan)
    if mode != "synchronous":
        text += _comment(
            [
                f"NOTE: the plan assumes sync mode '{mode}' (outer sync every {job.sync.every_steps} steps, {job.sync.bits}-bit exchange).",  # noqa: E501
                "Megatron-LM has no built-in DiLoCo: the data-parallel groups that cross sites need an outer optimizer",  # noqa: E501
                "(e.g. a DiLoCo implementation such as torchft's) instead of the per-step all-reduce.",  # noqa: E501
            ]
        )
    text += "MEGATRON_ARGS=(\n"
    for a, note in args:
        text += "  " + " ".join(shlex.quote(x) for x in a) + (f"  # {note}" if note else "") + "\n"
    text += ")\n"
    return {"megatron_args.sh": text, "megatron_hosts.txt": host_order_text(layout, "megatron")}


def megatron_fsdp_args(layout: Layout) -> list[tuple[list[str], str]]:
    """HSDP in Megatron-Core 0.16 (Megatron-FSDP): --use-megatron-fsdp with
    optim_grads_params shards parameters, gradients and optimizer state (ZeRO-3) over the
    intra-instance data-parallel group, and --num-distributed-optimizer-instances R splits
    the dp x cp group into R consecutive blocks (parallel_state: intra-partial groups) that
    the outer group replicates (mcore_fsdp_adapter: HSDP when R > 1). With R = the plan's
    replicas each block is one replica's dp_shard x cp ranks, at one site. Megatron-LM's
    validate_args requires the fsdp_dtensor checkpoint format for Megatron-FSDP. Megatron-
    FSDP has no reshard-after-forward switch (it reshards): a plan that assumes otherwise
    is refused rather than exported with a different memory footprint."""
    if layout.dp_shard == 1:
        return []
    if not layout.problem.instance.job.fsdp.reshard_after_forward:
        raise InputError(
            "job.fsdp.reshard_after_forward: false has no Megatron-FSDP equivalent (it reshards after forward); "  # noqa: E501
            "export torchtitan (-f torchtitan: fsdp_reshard_after_forward = never) or set it to true"  # noqa: E501
        )
    return [
        (
            [
                "--use-megatron-fsdp",
                "--data-parallel-sharding-strategy",
                "optim_grads_params",
                "--num-distributed-optimizer-instances",
                str(layout.dp),
            ],
            f"HSDP: ZeRO-3 over each replica's dp_shard x cp = {layout.dp_shard * layout.cp} ranks (one site), {layout.dp} replicas replicate",  # noqa: E501
        ),
        (["--ckpt-format", "fsdp_dtensor"], "Megatron-FSDP's checkpoint format (validate_args)"),
    ]


def megatron_5d_args(layout: Layout) -> list[tuple[list[str], str]]:
    """Context and expert parallelism and the MoE / MLA architecture flags (Megatron-Core
    MoE: --num-experts, --moe-router-topk, --moe-ffn-hidden-size, --moe-layer-freq, ...)."""
    m = layout.problem.model
    out: list[tuple[list[str], str]] = []
    if layout.cp > 1:
        out.append(
            (
                ["--context-parallel-size", str(layout.cp), "--cp-comm-type", "p2p"],
                "ring attention (KV passed around the CP ring, overlapped with attention)",
            )
        )
    if m.head_dim is not None and m.mla is None:
        out.append(
            (["--kv-channels", str(m.head_dim)], "per-head width (heads x head_dim != hidden)")
        )
    if m.mla is not None:
        a = m.mla
        mla = ["--multi-latent-attention", "--kv-lora-rank", str(a.kv_lora_rank)]
        if a.q_lora_rank is not None:
            mla += ["--q-lora-rank", str(a.q_lora_rank)]
        mla += [
            "--qk-head-dim",
            str(a.qk_nope_head_dim),
            "--qk-pos-emb-head-dim",
            str(a.qk_rope_head_dim),
            "--v-head-dim",
            str(a.v_head_dim),
        ]
        out.append((mla, "multi-head latent attention"))
    if m.moe is not None:
        e = m.moe
        pattern = [int(m.is_moe_layer(i)) for i in range(m.layers)]
        moe = [
            "--num-experts",
            str(e.experts),
            "--moe-router-topk",
            str(e.top_k),
            "--moe-ffn-hidden-size",
            str(e.expert_ffn_hidden),
            "--expert-model-parallel-size",
            str(layout.ep),
            "--expert-tensor-parallel-size",
            str(layout.etp or 1),
            *_dispatcher_args(layout.problem.instance.job.moe_dispatcher),
            "--moe-grouped-gemm",
            "--moe-router-score-function",
            e.router,
        ]
        moe += _node_limited_args(layout)
        if e.shared_ffn:
            moe += ["--moe-shared-expert-intermediate-size", str(e.shared_ffn)]
        if any(p == 0 for p in pattern):
            moe += ["--moe-layer-freq", _layer_pattern(pattern)]
        if e.router_expert_bias:
            moe += ["--moe-router-enable-expert-bias"]
        out.append(
            (
                moe,
                f"EP {layout.ep} inside a site, expert TP {layout.etp or 1}"
                + (" (EP folded over the stage's TP x DP ranks)" if layout.etp is not None else "")
                + ": the plan's all-to-all and expert memory model",
            )
        )
    return out


def _dispatcher_args(dispatcher: str) -> list[str]:
    """job.moe_dispatcher as Megatron-Core 0.16 spells it (flex + deepep: per-node dedup)."""
    if dispatcher == "deepep":
        return ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"]
    return ["--moe-token-dispatcher-type", "alltoall"]


def ep_nodes(layout: Layout) -> int:
    """Nodes one EP group spans (ep ranks at stride etp, node-sized blocks)."""
    gpn = min(
        layout.problem.catalog.gpus[layout.problem.instance.site(s).gpu].gpus_per_node
        for s in {x for g in layout.plan.replica_groups for x in g.stage_sites}
    )
    return max(1, layout.ep // max(1, min(layout.ep, gpn // (layout.etp or 1))))


def _node_limited_args(layout: Layout) -> list[str]:
    """Node-limited routing (model.moe.max_nodes_per_token) when the EP group spans more
    nodes than a token may reach: Megatron-Core's group-limited routing with one group per
    node (--moe-router-num-groups = nodes, --moe-router-group-topk = the limit)."""
    e = layout.problem.model.moe
    nodes = ep_nodes(layout)
    if e is None or e.max_nodes_per_token is None or nodes <= e.max_nodes_per_token:
        return []
    return [
        "--moe-router-num-groups",
        str(nodes),
        "--moe-router-group-topk",
        str(e.max_nodes_per_token),
    ]


def _layer_pattern(pattern: list[int]) -> str:
    """Megatron's --moe-layer-freq list expression, run-length encoded: ([0]*3+[1]*58)."""
    runs: list[tuple[int, int]] = []
    for p in pattern:
        if runs and runs[-1][0] == p:
            runs[-1] = (p, runs[-1][1] + 1)
        else:
            runs.append((p, 1))
    return "(" + "+".join(f"[{p}]*{n}" for p, n in runs) + ")"


def parse_megatron_args(text: str) -> dict[str, list[str]]:
    """Flag -> values of the MEGATRON_ARGS array in megatron_args.sh."""
    body = text.split("MEGATRON_ARGS=(", 1)[1].split("\n)", 1)[0]
    tokens: list[str] = []
    for ln in body.splitlines():
        tokens += shlex.split(ln, comments=True)
    out: dict[str, list[str]] = {}
    key = None
    for t in tokens:
        if t.startswith("--"):
            key = t
            out[key] = []
        elif key is not None:
            out[key].append(t)
    return out


# ----------------------------------------------------------------------------- torchtitan


TORCHTITAN_VERSIONS = ("0.3", "0.2")
# the last stage's output projection: `lm_head` in torchtitan 0.3's common Decoder, `output` in
# 0.2.x's Llama Transformer (an unknown name silently leaves the last stage without it)
TORCHTITAN_OUTPUT_MODULE = {"0.3": "lm_head", "0.2": "output"}
# placer model name -> torchtitan 0.3 (module, config registry function) of the same shape
TORCHTITAN_RECIPES = {
    "llama3-8b": ("llama3", "llama3_8b"),
    "llama3-70b": ("llama3", "llama3_70b"),
    "llama3-405b": ("llama3", "llama3_405b"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"),
}


def torchtitan_parts(layout: Layout, version: str) -> list[list[str]]:
    """Module FQNs per model stage: the plan's layers per stage, embeddings first, final
    norm and output projection last (torchtitan's Llama module names for `version`).
    Interleaved (v > 1): v pp parts, part c pp + k being chunk c of rank k with
    stage_layers[k] / v layers, or parallelism.chunk_layers[c pp + k] (uneven chunks:
    module_fqns_per_model_part takes any layers per part); torchtitan's looped schedules
    (Interleaved1F1B) place part s on pipeline rank s mod pp, as placer's model does."""
    parts: list[list[str]] = []
    start = 0
    par = layout.plan.parallelism
    v = par.virtual_stages
    chunks = par.chunk_layers or [n // v for _ in range(v) for n in layout.plan.stage_layers]
    if par.pipeline_schedule == "dualpipev" and par.chunk_layers is None:
        # DualPipeV (torchtitan's "v" stage style: part s on rank s, then back, 2 pp - 1 - s):
        # the 2 pp model stages in model order, each rank's layers halved
        sl, p = layout.plan.stage_layers, len(layout.plan.stage_layers)
        chunks = [sl[s if s < p else 2 * p - 1 - s] // 2 for s in range(2 * p)]
    for k, n in enumerate(chunks):
        part = (["tok_embeddings"] if k == 0 else []) + [
            f"layers.{i}" for i in range(start, start + n)
        ]
        if k == len(chunks) - 1:
            part += ["norm", TORCHTITAN_OUTPUT_MODULE[version]]
        parts.append(part)
        start += n
    return parts


def torchtitan_settings(layout: Layout, version: str) -> list[tuple[str, str, Any]]:
    """(section, key, value) of the torchtitan config the plan fixes."""
    problem, plan = layout.problem, layout.plan
    rep, shard = torchtitan_dp_split(plan, problem.instance.job.zero1)
    cfg = config_of(problem, plan)
    out: list[tuple[str, str, Any]] = [
        ("parallelism", "data_parallel_replicate_degree", rep),
        ("parallelism", "data_parallel_shard_degree", shard),
        ("parallelism", "tensor_parallel_degree", layout.tp),
        ("parallelism", "pipeline_parallel_degree", layout.pp),
        ("parallelism", "context_parallel_degree", layout.cp),
        ("training", "local_batch_size", plan.parallelism.micro_batch * cfg.num_micro_batches),
        ("training", "global_batch_size", problem.instance.job.global_batch),
        ("training", "seq_len", problem.model.seq_len),
    ]
    if layout.ep > 1:
        out.append(("parallelism", "expert_parallel_degree", layout.ep))
    if layout.etp is not None:
        if layout.etp not in (1, layout.tp):
            raise InputError(
                f"parallelism.etp: torchtitan's expert_tensor_parallel_degree is 1 or tp ({layout.tp}), the plan has etp {layout.etp}; export it for Megatron-LM (-f megatron)"  # noqa: E501
            )
        out.append(("parallelism", "expert_tensor_parallel_degree", layout.etp))
    if layout.dp_shard > 1:  # the plan's FSDP memory and exposure assume this policy
        policy = "always" if problem.instance.job.fsdp.reshard_after_forward else "never"
        out.append(("parallelism", "fsdp_reshard_after_forward", policy))
    if version == "0.3":  # 0.2.x has no switch: its Llama TP plan always applies SequenceParallel
        out.append(("parallelism", "enable_sequence_parallel", layout.tp > 1))
    dual = plan.parallelism.pipeline_schedule == "dualpipev"
    if layout.pp > 1:
        schedule = "Interleaved1F1B" if plan.parallelism.virtual_stages > 1 else "1F1B"
        out += [
            ("parallelism", "pipeline_parallel_schedule", "DualPipeV" if dual else schedule),
            ("parallelism", "pipeline_parallel_microbatch_size", plan.parallelism.micro_batch),
            ("parallelism", "module_fqns_per_model_part", torchtitan_parts(layout, version)),
        ]
        if version == "0.3":
            out.append(
                ("training", "disable_cuda_graphs", True)
            )  # 0.3: CUDA graphs do not support PP yet
        if dual and layout.ep > 1:
            # torchtitan distributed/dual_pipe_v.py get_dual_pipe_v_flag: the EP overlap of
            # DualPipeV's F&B pairs (default true) refuses activation checkpointing, so it
            # says what the plan priced (Config.ep_overlap) and, when on, the AC mode none
            out.append(("parallelism", "pipeline_parallel_expert_parallel_overlap", cfg.ep_overlap))
            if cfg.ep_overlap:
                out.append(("activation_checkpoint", "mode", "none"))
    if version == "0.2" and not any(sec == "activation_checkpoint" for sec, _, _ in out):
        out.append(("activation_checkpoint", "mode", torchtitan_ac_mode(cfg.recompute)))
    return out


def torchtitan_ac_mode(recompute: str) -> str:
    """torchtitan's activation_checkpoint.mode for the recompute the plan priced: "full" for
    full; "none" for selective and none, because torchtitan's attention is PyTorch SDPA,
    whose flash / memory-efficient kernels keep no s x s scores and recompute them in the
    backward (arXiv 2205.14135): placer's "selective" (Korthikanti et al.'s attention-core
    recompute). torchtitan's own default ("selective": per-op SAC, or every 2nd layer
    with selective_ac_option "2", torchtitan 0.2.2 config/job_config.py) is neither."""
    return "full" if recompute == "full" else "none"


def _cli_value(v: Any) -> list[str]:
    if isinstance(v, list):
        return [",".join(p) for p in v]
    return [str(v)]


def torchtitan_files(layout: Layout, version: str = "0.3") -> dict[str, str]:
    """torchtitan launch configuration: for 0.3+ (Python config registries, `--module` +
    `--config` + command-line overrides) torchtitan_args.sh; for 0.2.x a TOML job file
    (torchtitan.toml, `--job.config_file`)."""
    if version not in TORCHTITAN_VERSIONS:
        raise InputError(
            f"--torchtitan-version: expected one of {', '.join(TORCHTITAN_VERSIONS)}, got '{version}'"  # noqa: E501
        )
    problem, plan = layout.problem, layout.plan
    rep, shard = torchtitan_dp_split(plan, problem.instance.job.zero1)
    for r in layout.ranks:
        c = torchtitan_coords(r.rank, layout.pp, rep, shard, layout.tp, layout.cp)
        got = (c["tp"], c["cp"], c["dp_replicate"] * shard + c["dp_shard"], c["pp"])
        if got != (r.tp, r.cp, r.dp, r.pp):
            raise AssertionError(
                f"torchtitan mesh order disagrees with the layout at rank {r.rank}"
            )
    cfg = config_of(problem, plan)
    settings = torchtitan_settings(layout, version)
    head = _mapping_comment(layout, "torchtitan") + [
        "Host order: torchtitan_hosts.txt (line i = node rank i); launch with torchrun --node_rank=i on that host",  # noqa: E501
        "  (static rendezvous: --master_addr/--master_port, not --rdzv_backend=c10d, which orders nodes itself).",  # noqa: E501
        *(
            [
                f"HSDP as planned: data_parallel_shard_degree = {shard} (the plan's dp_shard: the {shard} data-parallel ranks of one replica,",  # noqa: E501
                f"  consecutive ranks at one site, shard parameters, gradients and optimizer state; fsdp mesh = dp_shard x cp = {shard * layout.cp}),",  # noqa: E501
                f"  data_parallel_replicate_degree = {rep} (the plan's replicas all-reduce their shards, across sites).",  # noqa: E501
            ]
            if layout.dp_shard > 1
            else [
                f"data_parallel_shard_degree = {shard}: the gcd of the replica-group counts, so every FSDP shard group is",  # noqa: E501
                "  consecutive replicas with the same chain, i.e. inside one site; replicate groups (all-reduce) cross sites.",  # noqa: E501
                "  The plan's memory model assumes ZeRO-1 over all dp: check memory if dp_shard is small.",  # noqa: E501
            ]
            if problem.instance.job.zero1
            else ["job.zero1 is false: pure replication (DDP), data_parallel_shard_degree = 1."]
        ),
        f"Batch: {par_text(plan, cfg.num_micro_batches, problem.instance.job.global_batch, problem.model.seq_len)}",  # noqa: E501
        "  (local_batch_size = per data-parallel rank per step; pipeline_parallel_microbatch_size = micro-batch).",  # noqa: E501
    ]
    if layout.pp > 1:
        head += [
            f"module_fqns_per_model_part pins the plan's layers per stage {list(plan.stage_layers)}: torchtitan {version}'s Llama",  # noqa: E501
            f"  module names (tok_embeddings, layers.<i>, norm, {TORCHTITAN_OUTPUT_MODULE[version]}); rename for other model families.",  # noqa: E501
        ]
    mode = sync_mode_of(problem, plan)
    if mode != "synchronous":
        head += [
            f"NOTE: the plan assumes sync mode '{mode}': torchtitan's own DP syncs every step; use torchft's DiLoCo for the cross-site replicas."  # noqa: E501
        ]
    if version != "0.2":  # 0.3's activation_checkpoint is a config class, set by the recipe
        want = torchtitan_ac_mode(config_of(problem, plan).recompute)
        head += [
            f"NOTE: the plan prices recompute '{problem.instance.job.recompute}': give the recipe activation checkpointing {'FullAC' if want == 'full' else 'off (no AC; SDPA flash attention is placer selective)'}; torchtitan's default is SelectiveAC."  # noqa: E501
        ]
    files = {"torchtitan_hosts.txt": host_order_text(layout, "torchtitan")}
    if version == "0.2":
        lines: list[str] = []
        for section in ("parallelism", "training", "activation_checkpoint"):
            if section == "activation_checkpoint" and not any(x[0] == section for x in settings):
                continue
            lines.append(f"[{section}]")
            for sec, key, v in settings:
                if sec == section:
                    lines.append(f"{key} = {json.dumps(v)}")
            lines.append("")
        head = [
            "torchtitan 0.2.x job file: torchrun ... -m torchtitan.train --job.config_file torchtitan.toml",  # noqa: E501
            *head,
        ]
        files["torchtitan.toml"] = _comment(head) + "\n" + "\n".join(lines)
        return files
    module, recipe = TORCHTITAN_RECIPES.get(problem.model.name, ("llama3", "llama3_debugmodel"))
    known = problem.model.name in TORCHTITAN_RECIPES
    head = [
        "torchtitan 0.3+ launch arguments: a config registry function (--module, --config) plus command-line overrides.",  # noqa: E501
        '  torchrun ... -m torchtitan.train "${TORCHTITAN_ARGS[@]}"   (torchtitan 0.2.x: export --torchtitan-version 0.2 for TOML)',  # noqa: E501
        f"Base recipe: {module}.{recipe}"
        + (
            ""
            if known
            else f" (no torchtitan recipe of model '{problem.model.name}' is known: set TORCHTITAN_MODULE/TORCHTITAN_CONFIG to yours)"  # noqa: E501
        )
        + "; the overrides below fix what the plan decides.",
        *head,
    ]
    text = "#!/usr/bin/env bash\n" + _comment(head)
    text += f': "${{TORCHTITAN_MODULE:={module}}}"\n: "${{TORCHTITAN_CONFIG:={recipe}}}"\n'
    text += 'TORCHTITAN_ARGS=(\n  --module "$TORCHTITAN_MODULE" --config "$TORCHTITAN_CONFIG"\n'
    for sec, key, v in settings:
        if isinstance(v, bool):
            text += f"  --{sec}.{key}\n" if v else f"  --{sec}.no_{key}\n"
        else:
            text += f"  --{sec}.{key} " + " ".join(shlex.quote(x) for x in _cli_value(v)) + "\n"
    text += ")\n"
    files["torchtitan_args.sh"] = text
    return files


def parse_torchtitan_args(text: str) -> list[str]:
    """The TORCHTITAN_ARGS array of torchtitan_args.sh, with the default module/config filled in."""
    env = dict(re.findall(r': "\$\{(TORCHTITAN_\w+):=([^}]*)\}"', text))
    body = text.split("TORCHTITAN_ARGS=(", 1)[1].split("\n)", 1)[0]
    for k, v in env.items():
        body = body.replace(f'"${k}"', v)
    return shlex.split(body, comments=True)


def par_text(plan: Plan, m: int, global_batch: int, seq_len: int) -> str:
    p = plan.parallelism
    return f"global batch {global_batch} sequences of {seq_len} tokens = micro-batch {p.micro_batch} x {m} pipeline micro-batches x dp {p.dp}"  # noqa: E501


# ----------------------------------------------------------------------------- NCCL


def inter_site_groups(layout: Layout) -> list[dict[str, Any]]:
    """Communicators whose members sit at more than one site: pipeline p2p pairs and
    data-parallel groups (TP groups never leave a node)."""
    out: list[dict[str, Any]] = []
    groups = layout.plan.replica_groups
    for i, g in enumerate(groups):
        for k in range(layout.pp - 1):
            a, b = g.stage_sites[k], g.stage_sites[k + 1]
            if a != b:
                out.append(
                    {
                        "kind": "pp",
                        "stage": k,
                        "sites": [a, b],
                        "replicas": g.count,
                        "what": f"pipeline p2p stage {k} -> {k + 1} of replica_groups[{i}] ({g.count} replicas x tp {layout.tp})",  # noqa: E501
                    }
                )
        a, b = g.stage_sites[-1], g.stage_sites[0]
        if layout.plan.parallelism.virtual_stages > 1 and a != b:
            out.append(
                {
                    "kind": "pp",
                    "stage": layout.pp - 1,
                    "sites": [a, b],
                    "replicas": g.count,
                    "what": f"pipeline p2p wrap stage {layout.pp - 1} -> 0 (interleaved chunks) of replica_groups[{i}] ({g.count} replicas x tp {layout.tp})",  # noqa: E501
                }
            )
    for k in range(layout.pp):
        sites = sorted({layout.site_of(k, d) for d in range(layout.dp)})
        if len(sites) > 1:
            out.append(
                {
                    "kind": "dp",
                    "stage": k,
                    "sites": sites,
                    "replicas": layout.dp,
                    "what": f"data-parallel groups of stage {k} ({layout.tp} groups of {layout.dp}) over {', '.join(sites)}",  # noqa: E501
                }
            )
    return out


def nccl_suggestions(layout: Layout, site: str) -> list[str]:
    """Comment lines with NCCL environment suggestions for `site`'s inter-site communicators."""
    problem = layout.problem
    net = Network(problem)
    mine = [g for g in inter_site_groups(layout) if site in g["sites"]]
    lines = [
        f"NCCL suggestions for site {site} (SUGGESTIONS TO TUNE: measure with nccl-tests across the WAN first)."  # noqa: E501
    ]
    if not mine:
        return lines + ["No communicator of this site crosses sites: keep NCCL defaults."]
    peers = sorted({p for g in mine for p in g["sites"] if p != site})
    # the slowest path the plan routes any of the pair's traffic on (placer.network)
    routing, _ = resolve_routing(problem, layout.plan, net)
    rtt = {p: 2 * max(net.pair_latency_s(routing, ph, site, p) for ph in PHASES) for p in peers}
    rtt_max = max(rtt.values())
    nic_gbps = problem.catalog.gpus[problem.instance.site(site).gpu].nic_gbps
    bdp = nic_gbps * 1e9 / 8 * rtt_max
    buff = max(4 * MiB, 1 << math.ceil(math.log2(max(1.0, bdp / 2))))
    capped = buff > 64 * MiB
    buff = min(buff, 64 * MiB)
    lines += ["Inter-site communicators at this site:"] + [f"  - {g['what']}" for g in mine]
    mode = sync_mode_of(problem, layout.plan)
    if mode != "synchronous" and any(g["kind"] == "dp" for g in mine):
        lines.append(
            f"  (sync mode '{mode}': the cross-site data-parallel exchange runs every {problem.instance.job.sync.every_steps} steps)"  # noqa: E501
        )
    lines += [f"  RTT to {p}: {rtt[p] * 1e3:.3f} ms" for p in peers]
    lines += [
        f"Bandwidth-delay product per GPU NIC: {nic_gbps:g} Gb/s x {rtt_max * 1e3:.3f} ms = {bdp / 1e6:.1f} MB.",  # noqa: E501
        "NCCL environment variables apply to every communicator of the process (intra-site TP/DP too): compare both.",  # noqa: E501
        "export NCCL_ALGO=Ring            # rings stream large messages over each WAN hop; trees add hops whose latency is ms here",  # noqa: E501
        "export NCCL_PROTO=Simple         # LL/LL128 trade bandwidth for latency on small messages; WAN transfers are large",  # noqa: E501
        "export NCCL_CROSS_NIC=1          # the WAN router aggregates all rails: let rings pair different NICs across sites",  # noqa: E501
        f"export NCCL_BUFFSIZE={buff}  # {buff // MiB} MiB: a channel keeps at most BUFFSIZE in flight, so rate/channel <= BUFFSIZE/RTT;",  # noqa: E501
        "                                  # sized ~BDP / 2 channels per NIC (power of 2, >= the 4 MiB default, <= 64 MiB);",  # noqa: E501
        "                                  # costs BUFFSIZE x peers x channels of GPU memory per communicator",  # noqa: E501
    ]
    if capped:
        lines.append(
            f"  (BDP/2 exceeds 64 MiB: raise NCCL_MIN_NCHANNELS so that channels x BUFFSIZE >= {bdp / 1e6:.0f} MB per NIC)"  # noqa: E501
        )
    lines += [
        "export NCCL_IB_QPS_PER_CONNECTION=4   # RoCE: more queue pairs spread flows over ECMP paths and waves",  # noqa: E501
        "export NCCL_IB_TIMEOUT=20             # 4.096 us x 2^20 = 4.3 s >> RTT; raise only if retransmit timeouts appear",  # noqa: E501
        "export NCCL_IB_RETRY_CNT=7",
        "export NCCL_IB_TC=${LOSSLESS_TC}      # lossless (PFC) class on the deep-buffer WAN switch ports: buffer >= rate x RTT (see bom.csv)",  # noqa: E501
        "export NCCL_IB_GID_INDEX=${ROCE_V2_GID_INDEX}",
        "If the WAN path uses NCCL's socket transport (TCP) instead of RoCE:",
        "export NCCL_SOCKET_IFNAME=${WAN_IFNAME}",
        "export NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4   # 16 TCP streams: each stream's rate <= window / RTT",  # noqa: E501
        f"  (threads x sockets <= 64); and raise net.core.rmem_max / wmem_max to >= {bdp / 1e6:.0f} MB (the BDP)",  # noqa: E501
    ]
    return lines


# ----------------------------------------------------------------------------- torchrun


def torchrun_line(layout: Layout, u: NodeRank) -> str:
    return (
        f"CUDA_VISIBLE_DEVICES={u.gpu_list} PLACER_SITE={u.site} torchrun --nnodes={len(layout.node_ranks)} --node_rank={u.index} "  # noqa: E501
        f'--nproc_per_node={u.nproc} --master_addr=${{MASTER_ADDR}} --master_port=${{MASTER_PORT}} "${{TRAIN_SCRIPT}}" ${{TRAIN_ARGS:-}}'  # noqa: E501
    )


def torchrun_files(layout: Layout) -> dict[str, str]:
    out: dict[str, str] = {}
    rank0 = layout.node_ranks[0]
    for site in layout.sites:
        units = [u for u in layout.node_ranks if u.site == site]
        head = [
            f"torchrun launch lines for site {site}: {len(layout.hosts_by_site[site])} hosts, {len(units)} of the {len(layout.node_ranks)} node ranks.",  # noqa: E501
            f"Run `bash torchrun_{site}.sh <host>` on each host of hosts_{site}.txt (default host: $(hostname)).",  # noqa: E501
            f"One rendezvous for all sites: MASTER_ADDR = address of {rank0.host} (node rank 0, site {rank0.site}), reachable from every site.",  # noqa: E501
            "Static rendezvous (no --rdzv_backend=c10d): torchrun honours --node_rank, so global ranks follow the plan.",  # noqa: E501
        ] + _mapping_comment(layout, "torchrun")
        text = (
            "#!/usr/bin/env bash\n"
            + _comment(head)
            + "#\n"
            + _comment(nccl_suggestions(layout, site))
        )
        text += (
            'set -euo pipefail\n: "${MASTER_ADDR:?set MASTER_ADDR to the address of '
            + rank0.host
            + '}"\n'
        )
        text += ': "${MASTER_PORT:=29500}"\n: "${TRAIN_SCRIPT:?set TRAIN_SCRIPT to the training entry point}"\n'  # noqa: E501
        text += 'HOST="${1:-$(hostname)}"\n'
        # every torchrun of the host runs in the background; the script waits for each and
        # exits with the last failure's code (a bare `wait` exits 0 whatever they return)
        text += (
            'pids=()\nwait_all() {\n  local rc=0 pid\n  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done\n'  # noqa: E501
            '  return "$rc"\n}\ncase "$HOST" in\n'
        )
        by_host: dict[str, list[NodeRank]] = {}
        for u in units:
            by_host.setdefault(u.host, []).append(u)
        for host, us in by_host.items():
            text += f"  {host})\n"
            for u in us:
                text += f"    # node rank {u.index}: GPUs {u.gpu_range}, global ranks {u.first_rank}-{u.first_rank + u.nproc - 1}\n"  # noqa: E501
                text += f"    {torchrun_line(layout, u)} &\n    pids+=($!)\n"
            text += "    wait_all ;;\n"
        text += f'  *) echo "host $HOST is not a host of site {site} in this plan" >&2; exit 2 ;;\nesac\n'  # noqa: E501
        out[f"torchrun_{site}.sh"] = text
        what = (
            "the instance's host names"
            if layout.named_hosts(site)
            else "placeholders: name real hosts with sites[].hosts or hostfile"
        )
        hosts = [
            f"# hosts of site {site} ({what}); slots = GPUs used",
            *(
                f"{layout.host(site, n)} slots={sum(u.nproc for u in units if u.node == n)}"
                for n in layout.hosts_by_site[site]
            ),
        ]
        out[f"hosts_{site}.txt"] = "\n".join(hosts) + "\n"
    return out


# ----------------------------------------------------------------------------- SLURM


def slurm_gpu_request(layout: Layout) -> tuple[str, list[str]]:
    """The #SBATCH GPU request and its comment: whole hosts' GPUs per node when every host in
    use has the same size; otherwise --exclusive (one --gpus-per-node cannot describe hosts
    of different sizes)."""
    sizes = sorted({layout.gpus_per_host[s] for s in layout.sites})
    if len(sizes) == 1:
        return f"#SBATCH --gpus-per-node={sizes[0]}\n", [
            f"GPU request: --gpus-per-node={sizes[0]} (every host's GPUs; tasks use the GPU their SLURM_LOCALID names)."  # noqa: E501
        ]
    return "#SBATCH --exclusive\n", [
        f"GPU request: the hosts have different sizes ({', '.join(map(str, sizes))} GPUs), which one --gpus-per-node cannot",  # noqa: E501
        "  describe: --exclusive asks for whole hosts. Where GPUs are scheduled as GRES and --exclusive does not grant them,",  # noqa: E501
        "  submit one heterogeneous job component per host size (#SBATCH hetjob) instead.",
    ]


def slurm_files(layout: Layout) -> dict[str, str]:
    hostfile = "\n".join(r.host for r in layout.ranks) + "\n"
    nodes = [layout.host(s, n) for s in layout.sites for n in layout.hosts_by_site[s]]
    gres, gres_notes = slurm_gpu_request(layout)
    head = [
        f"SLURM launch for instance '{layout.problem.name}': {layout.world_size} tasks on {len(nodes)} hosts.",  # noqa: E501
        "Submit from this folder: sbatch slurm.sbatch (TRAIN_SCRIPT and TRAIN_ARGS in the environment).",  # noqa: E501
        "slurm_hostfile.txt has one host per task in task (= global rank) order: the srun step's arbitrary distribution",  # noqa: E501
        "puts task i on line i (SLURM_HOSTFILE). Arbitrary distribution is a step option only: on #SBATCH lines sbatch",  # noqa: E501
        "would read the node list as a per-task hostfile, and srun takes no -N/--nodes with it (SLURM >= 23.11 rejects them).",  # noqa: E501
        "Within a host tasks get SLURM_LOCALID 0, 1, ... in rank order, which is the GPU the plan gives them (placer's",  # noqa: E501
        "local_gpu). Do not bind GPUs per task (no --gpus-per-task); LOCAL_RANK = SLURM_LOCALID.",
        *gres_notes,
    ]
    for s in layout.sites:
        k = sum(1 for r in layout.ranks if r.site == s)
        names = layout.host_names(s)
        what = (
            ""
            if layout.named_hosts(s)
            else " (placeholder names: set sites[].hosts or hostfile in the instance and export again)"  # noqa: E501
        )
        head.append(
            f"site {s}: {len(names)} hosts {names[0]} .. {names[-1]}{what}, {layout.gpus_per_host[s]} GPUs per host, {k} tasks"  # noqa: E501
        )
    head += _mapping_comment(layout, "slurm")
    rank0 = layout.ranks[0].host
    text = "#!/bin/bash\n"
    text += f"#SBATCH --job-name=placer-{layout.problem.name}\n#SBATCH --nodes={len(nodes)}\n#SBATCH --ntasks={layout.world_size}\n"  # noqa: E501
    text += f"#SBATCH --nodelist={','.join(nodes)}\n" + gres
    text += _comment(head)
    for s in layout.sites:
        text += "#\n" + _comment(nccl_suggestions(layout, s))
    text += f'\nexport SLURM_HOSTFILE="${{SLURM_SUBMIT_DIR:-.}}/slurm_hostfile.txt"\nexport MASTER_ADDR="${{MASTER_ADDR:-{rank0}}}"  # host of rank 0\n'  # noqa: E501
    text += 'export MASTER_PORT="${MASTER_PORT:-29500}"\n: "${TRAIN_SCRIPT:?set TRAIN_SCRIPT to the training entry point}"\n'  # noqa: E501
    text += f"srun --ntasks={layout.world_size} --distribution=arbitrary --kill-on-bad-exit=1 \\\n"
    text += "  bash -c 'export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS; exec python \"$TRAIN_SCRIPT\" ${TRAIN_ARGS:-}'\n"  # noqa: E501
    return {
        "slurm_hostfile.txt": hostfile,
        "slurm_nodes.txt": "\n".join(nodes) + "\n",
        "slurm.sbatch": text,
    }


__all__ = [
    "Layout",
    "NodeRank",
    "RankRow",
    "build_layout",
    "host_order_text",
    "inter_site_groups",
    "megatron_coords",
    "megatron_files",
    "megatron_layout_string",
    "megatron_pipeline_args",
    "megatron_rank",
    "nccl_suggestions",
    "parse_host_order",
    "parse_megatron_args",
    "rankmap_files",
    "parse_torchtitan_args",
    "slurm_files",
    "torchrun_files",
    "torchtitan_coords",
    "torchtitan_dp_split",
    "torchtitan_files",
]
