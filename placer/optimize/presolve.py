"""Presolve: what each site can really run, before any configuration is bounded or modelled.

A site offers `gpus` in nodes of `gpus_per_node` (the NVLink domain), and its power limit
feeds whole nodes at their all-in draw times the PUE (placer.rules.site_power_w). A site
used together with another site also lights at least one coherent wave: every used site
exchanges traffic with another one (replica chains join their sites, and sites hosting the
same stage all-reduce its gradients), so unless one of its routes has capacity in place it
pays at least one module of the cheapest optic reaching one of its routes. These caps are
upper bounds on what any plan can use (the formulations keep the exact power rows), so
pruning with them never removes a feasible plan:

* a configuration needs pp x dp TP groups: if the power-capped groups of all sites (each
  charged its module when more than one site is needed) cannot hold them, it is dropped;
* a stage must fit in the memory of the GPUs hosting it: if the capped groups of the sites
  whose GPU holds stage k are fewer than dp, the configuration is dropped.

When every configuration is dropped, `InfeasibleError` names the binding resource and the
shortfall at once (exit 3), instead of an empty search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from placer.errors import InfeasibleError
from placer.io import Problem
from placer.network import Network
from placer.optimize.data import InnerData
from placer.optimize.space import SpaceReport, memory_gap_gb, stage_memory_gb
from placer.perf.step import Config
from placer.rules import node_it_w, replica_slots, site_gpus_per_node, tp_groups_per_node

POWER_DROP = "more GPUs than the power limits feed"
MEMORY_DROP = "too few powered GPUs with the memory for a stage"
NO_FIT_DROP = "no stage placement fits in GPU memory"  # the reason space.chain_types gives


@dataclass(frozen=True)
class SiteCap:
    """How many nodes a site can run: offered, fed by its power alone, and fed while it
    also lights one wave (its share of a multi-site plan)."""

    site: str
    gpu: str
    gpus_per_node: int
    nodes: int
    powered_nodes: int
    connected_nodes: int
    node_w: float  # facility draw of one node (all-in W x PUE)
    module_w: float  # facility draw of the cheapest coherent module it needs, 0 if none

    def groups(self, tp: int, connected: bool = False, width: int | None = None) -> int:
        """Replica stages of tp x cp x ep = `width` GPUs (default tp) the site can run."""
        if tp > self.gpus_per_node:
            return 0
        nodes = self.connected_nodes if connected else self.powered_nodes
        if width is None or width == tp:
            return nodes * tp_groups_per_node(self.gpus_per_node, tp)
        per, block = replica_slots(self.gpus_per_node, tp, width)
        return (nodes // block) * per


def site_caps(problem: Problem, net: Network | None = None) -> dict[str, SiteCap]:
    net = net or Network(problem)
    inst, cat = problem.instance, problem.catalog
    out: dict[str, SiteCap] = {}
    for s in inst.sites:
        gpn = site_gpus_per_node(problem, s.name)
        nodes = s.gpus // gpn
        node_w = node_it_w(problem, s.name) * s.pue
        own = [r for r in inst.routes if s.name in r.sites]
        if any(r.capacity_gbps > 0 for r in own):
            module_w = 0.0
        else:
            ws = [
                cat.optics[o].module_w * s.pue
                for r in own
                for o in [net.default_optic(r.key)]
                if o is not None
            ]
            module_w = min(ws, default=0.0)
        if s.power_mw is None:
            powered = connected = nodes
        else:
            limit = s.power_mw * 1e6
            powered = min(nodes, math.floor(limit / node_w + 1e-9)) if node_w > 0 else nodes
            connected = (
                min(nodes, max(0, math.floor((limit - module_w) / node_w + 1e-9)))
                if node_w > 0
                else nodes
            )
        out[s.name] = SiteCap(s.name, s.gpu, gpn, nodes, powered, connected, node_w, module_w)
    return out


def usable_groups(caps: dict[str, SiteCap], tp: int, need: int, width: int | None = None) -> int:
    """Replica stages (TP groups of size tp, or tp x cp x ep = width) that all sites
    together can power for a plan of `need` of them: one site alone if it holds them all,
    else every site charged its module."""
    alone = max((c.groups(tp, width=width) for c in caps.values()), default=0)
    if alone >= need:
        return alone
    return sum(c.groups(tp, connected=True, width=width) for c in caps.values())


def presolve(
    problem: Problem, configs: list[Config], caps: dict[str, SiteCap], report: SpaceReport
) -> list[Config]:
    """The configurations some set of sites can power and hold in memory."""
    groups_by_gpu: dict[tuple[int, int, str], int] = {}  # (tp, width, GPU) -> capped groups
    gpus = sorted({c.gpu for c in caps.values()})
    out: list[Config] = []
    # the memory check reads no sync policy: once per configuration of every policy
    short: dict[Config, str | None] = {}
    for cfg in configs:
        need = cfg.pp * cfg.dp
        if usable_groups(caps, cfg.tp, need, cfg.width) < need:
            report.drop(POWER_DROP)
            continue
        shape = replace(cfg, sync_mode="synchronous", sync_bits=16, every_steps=1)
        if shape not in short:
            short[shape] = _memory_short(problem, cfg, caps, gpus, groups_by_gpu, report)
        why = short[shape]
        if why is not None:
            report.drop(why)
            continue
        out.append(cfg)
    if configs and not out and report.dropped.get(POWER_DROP):
        raise InfeasibleError(_no_config_message(problem, configs, caps, report))
    return out


def _memory_short(
    problem: Problem,
    cfg: Config,
    caps: dict[str, SiteCap],
    gpus: list[str],
    groups_by_gpu: dict[tuple[int, str], int],
    report: SpaceReport,
) -> str | None:
    """Why the configuration's stages cannot all be held (None: they can): no GPU type
    holds some stage, or those that do have fewer than dp groups between them, or a set
    of stages needs more groups than the GPU types that hold them have together (Hall's
    condition: each TP group hosts one stage of one replica, so the stages whose GPU types
    all lie in a set F need dp groups each among F's; checked for every F that is some
    stage's set of GPU types)."""
    fit_sets: list[frozenset[str]] = []
    for k in range(cfg.pp):
        hold = 0
        fit: set[str] = set()
        mem = stage_memory_gb(problem, cfg, k)
        for g in gpus:
            gap = memory_gap_gb(problem, mem, g)
            ok = gap <= 0
            if not ok and gap < report.best_memory_gap_gb:
                report.best_memory_gap_gb = gap
                report.memory_example = (
                    f"{cfg.label()}: stage {k} on {g} needs {gap:.1f} GB more than it has"
                )
            if ok:
                key = (cfg.tp, cfg.width, g)
                if key not in groups_by_gpu:
                    groups_by_gpu[key] = sum(
                        c.groups(cfg.tp, width=cfg.width) for c in caps.values() if c.gpu == g
                    )
                hold += groups_by_gpu[key]
                fit.add(g)
        if hold == 0:
            return NO_FIT_DROP
        if hold < cfg.dp:
            return MEMORY_DROP
        fit_sets.append(frozenset(fit))
    for f in set(fit_sets):
        stages = sum(1 for other in fit_sets if other <= f)
        if stages * cfg.dp > sum(groups_by_gpu[(cfg.tp, cfg.width, g)] for g in f):
            return MEMORY_DROP
    return None


def tighten(data: InnerData, caps: dict[str, SiteCap]) -> None:
    """Cap the model's node counts by what power feeds (a bound the power rows imply, so
    the model's plans are unchanged; CP-SAT and HiGHS start from smaller domains)."""
    for s in data.sites:
        cap = caps.get(s)
        if cap is None or cap.powered_nodes >= data.site_nodes[s]:
            continue
        data.site_nodes[s] = cap.powered_nodes
        data.site_groups[s] = cap.powered_nodes * data.site_groups_per_node[s]


def _no_config_message(
    problem: Problem, configs: list[Config], caps: dict[str, SiteCap], report: SpaceReport
) -> str:
    inst = problem.instance
    lines = [f"instance '{inst.name}' has no feasible plan."]
    smallest = min(configs, key=lambda c: (c.pp * c.dp * c.tp, c.label()))
    need = smallest.pp * smallest.dp
    if report.dropped.get(POWER_DROP):
        fed = usable_groups(caps, smallest.tp, need) * smallest.tp
        per_gpu_w = max(c.node_w / c.gpus_per_node for c in caps.values())
        short = smallest.gpus - fed
        detail = "; ".join(
            f"{c.site} feeds {c.powered_nodes} of {c.nodes} nodes"
            + (
                f" ({c.connected_nodes} while lighting a wave)"
                if c.connected_nodes < c.powered_nodes
                else ""
            )  # noqa: E501
            for c in caps.values()
        )
        lines.append(
            f"power: the smallest configuration ({smallest.label()}) needs {smallest.gpus} GPUs, "
            f"the power limits feed {fed}: short by {short} GPUs (~{short * per_gpu_w / 1e6:.3g} MW). "  # noqa: E501
            + detail
        )
    if report.dropped.get(MEMORY_DROP) or report.dropped.get(NO_FIT_DROP):
        lines.append(f"memory: no configuration fits; the closest ({report.memory_example}).")
    for reason, n in sorted(report.dropped.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {n} configuration(s) dropped: {reason}")
    return "\n".join(lines)
