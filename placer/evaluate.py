"""The plan evaluator: every limit checked, every violation named, and the step time,
throughput, power and cost of a plan computed by the one performance model.

Every plan that `placer solve` writes goes through `evaluate` first; the solver's
objective must equal what this module computes (placer.optimize checks it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from placer.io import Problem, plan_from_data
from placer.network import RouteKey, Routing, resolve_routing, route_key
from placer.perf.flops import config_stage_memory_bytes
from placer.perf.step import Chain, Config, PerfModel, StepResult
from placer.resilience import failure_report
from placer.rules import (
    config_of,
    cp_ep_problems,
    dp_shard_problems,
    etp_problems,
    nodes_for,
    replica_slots,
    site_gpus_per_node,
    site_power_w,
    usd_per_second,
)
from placer.schema import Plan

GB = 1e9


@dataclass
class Violation:
    kind: str  # gpus | power | memory | reach | channels | budget | step_time | batch | topology | shape  # noqa: E501
    where: str
    message: str
    shortfall: float | None = None

    def __str__(self) -> str:
        return f"[{self.kind}] {self.where}: {self.message}"


@dataclass
class Evaluation:
    feasible: bool
    violations: list[Violation]
    step_time_s: float
    breakdown: dict[str, float]
    tokens_per_s: float
    mfu: float
    capex_usd: float
    power_mw: dict[str, float]
    gpus_by_site: dict[str, int]
    nodes_by_site: dict[str, int]
    links: list[dict[str, Any]]
    sync_mode: str
    config: Config
    step: StepResult | None = None
    memory_gb: dict[str, float] = field(default_factory=dict)
    opex_usd_per_year: float = 0.0
    usd_per_s: float = 0.0  # link capex amortized + energy (catalog costs)
    cost_per_token_usd: float = math.inf
    routing: Routing = field(default_factory=dict)
    groups: list[tuple[int, Chain]] = field(default_factory=list)  # (replicas, stage sites)

    def to_dict(self) -> dict[str, Any]:
        return {
            "feasible": self.feasible,
            "violations": [v.__dict__ for v in self.violations],
            "step_time_s": self.step_time_s,
            "breakdown": self.breakdown,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "cost": {
                "capex_usd": self.capex_usd,
                "fiber_opex_usd_per_year": self.opex_usd_per_year,
                "usd_per_s": self.usd_per_s,
                "cost_per_token_usd": self.cost_per_token_usd,
            },
            "power_mw": self.power_mw,
            "gpus": self.gpus_by_site,
            "nodes": self.nodes_by_site,
            "links": self.links,
            "sync_mode": self.sync_mode,
            "memory_gb": self.memory_gb,
        }


# ----------------------------------------------------------------------------- evaluate


def evaluate(
    problem: Problem,
    plan: Plan | dict[str, Any],
    perf: PerfModel | None = None,
    check_resilience: bool = True,
) -> Evaluation:
    plan = plan_from_data(plan)
    inst, cat = problem.instance, problem.catalog
    perf = perf or PerfModel(problem)
    net = perf.net
    viol: list[Violation] = []
    cfg = config_of(problem, plan)
    site_names = {s.name for s in inst.sites}

    # --- shape and batch
    if sum(cfg.stage_layers) != problem.model.layers:
        viol.append(
            Violation(
                "shape",
                "stage_layers",
                f"sum to {sum(cfg.stage_layers)}, model '{problem.model.name}' has {problem.model.layers} layers",  # noqa: E501
            )
        )
    if (
        inst.job.global_batch
        != cfg.micro_batch * cfg.dp * cfg.ranks_per_replica * cfg.num_micro_batches
    ):  # noqa: E501
        ep = f" x ep {cfg.ep}" if cfg.ep > 1 and cfg.etp is None else ""
        ep += f" x dp_shard {cfg.dp_shard}" if cfg.dp_shard > 1 else ""
        if cfg.etp is not None and cfg.ranks_per_replica > 1:
            ep += f" x {cfg.ranks_per_replica} (folded ep {cfg.ep} x etp {cfg.etp})"
        viol.append(
            Violation(
                "batch",
                "parallelism",
                f"micro_batch x dp{ep} x num_micro_batches = {cfg.micro_batch}x{cfg.dp}{ep}x{cfg.num_micro_batches} != global_batch {inst.job.global_batch}",  # noqa: E501
            )
        )
    for why in cp_ep_problems(problem.model, cfg.tp, cfg.cp, cfg.ep, inst.job.sequence_parallel):
        viol.append(Violation("shape", "parallelism", why))
    for why in dp_shard_problems(cfg.ep, cfg.dp_shard):
        viol.append(Violation("shape", "parallelism.dp_shard", why))
    for why in etp_problems(problem.model, cfg.tp, cfg.cp, cfg.ep, cfg.etp, cfg.dp_shard):
        viol.append(Violation("shape", "parallelism.etp", why))
    if cfg.virtual_stages > 1 and cfg.num_micro_batches % cfg.pp:
        viol.append(
            Violation(
                "shape",
                "parallelism.virtual_stages",
                f"interleaved 1F1B runs micro-batches in groups of pp: num_micro_batches {cfg.num_micro_batches} is not a multiple of pp {cfg.pp}",  # noqa: E501
            )
        )
    if cfg.dualpipev and cfg.num_micro_batches < 2 * cfg.pp:
        viol.append(
            Violation(
                "shape",
                "parallelism.pipeline_schedule",
                f"dualpipev needs at least 2 x pp = {2 * cfg.pp} micro-batches per step (DualPipeV.step: num_chunks >= num_ranks * 2), got {cfg.num_micro_batches}",  # noqa: E501
            )
        )
    if cfg.sync_mode not in inst.job.sync.modes:
        viol.append(
            Violation(
                "shape",
                "sync_mode",
                f"'{cfg.sync_mode}' is not allowed by job.sync.mode {inst.job.sync.modes}",
            )
        )
    for i, g in enumerate(plan.replica_groups):
        for s in g.stage_sites:
            if s not in site_names:
                viol.append(Violation("topology", f"replica_groups[{i}]", f"unknown site '{s}'"))
    links: dict[RouteKey, tuple[int, str | None]] = {}
    for i, link in enumerate(plan.links):
        if link.key not in net.routes:
            viol.append(
                Violation(
                    "topology",
                    f"links[{i}]",
                    f"no route between {link.sites[0]} and {link.sites[1]}",
                )
            )
            continue
        if link.key in links:
            viol.append(
                Violation(
                    "topology", f"links[{i}]", f"route {link.key[0]}-{link.key[1]} listed twice"
                )
            )
        links[link.key] = (link.waves, link.optic)
    routing, routing_errors = resolve_routing(problem, plan, net)
    viol += [Violation("topology", where, msg) for where, msg in routing_errors]
    if any(v.kind in {"topology", "shape"} for v in viol):
        return _broken(problem, cfg, viol)

    groups: list[tuple[int, Chain]] = [(g.count, tuple(g.stage_sites)) for g in plan.replica_groups]

    # --- optics: reach and channels
    waves: dict[RouteKey, int] = {}
    link_rows: list[dict[str, Any]] = []
    optic_w: dict[str, float] = defaultdict(float)
    capex = 0.0
    opex = 0.0
    for key, (w, optic) in sorted(links.items()):
        route = net.routes[key]
        if w == 0:
            continue
        optic = optic or net.default_optic(key)
        where = f"route {key[0]}-{key[1]}"
        if optic is None:
            viol.append(
                Violation(
                    "reach",
                    where,
                    f"{route.km:g} km: no optic in the catalog reaches (longest reach {max(o.reach_km for o in cat.optics.values()):g} km)",  # noqa: E501
                    route.km - max(o.reach_km for o in cat.optics.values()),
                )
            )
            continue
        if optic not in cat.optics:
            viol.append(
                Violation(
                    "reach",
                    where,
                    f"unknown optic '{optic}' (catalog: {', '.join(sorted(cat.optics))})",
                )
            )
            continue
        if cat.optics[optic].reach_km < route.km:
            viol.append(
                Violation(
                    "reach",
                    where,
                    f"{optic} reaches {cat.optics[optic].reach_km:g} km, route is {route.km:g} km",
                    route.km - cat.optics[optic].reach_km,
                )
            )
        limit = net.max_waves(key, optic)
        if w > limit:
            why = f"{route.fiber_pairs} fiber pairs x {cat.channels_per_pair(optic)} channels" + (
                f", max_waves {route.max_waves}" if route.max_waves is not None else ""
            )
            viol.append(
                Violation(
                    "channels", where, f"{w} waves of {optic} exceed {limit} ({why})", w - limit
                )
            )
        waves[key] = w
        capex += net.link_capex_usd(key, w, optic)
        pairs = net.fiber_pairs_lit(key, w, optic)
        if route.fiber_usd_per_pair_km_year is not None:
            opex += pairs * route.km * route.fiber_usd_per_pair_km_year
        for end in key:
            optic_w[end] += w * cat.optics[optic].module_w
        link_rows.append(
            {
                "sites": list(key),
                "waves": w,
                "optic": optic,
                "fiber_pairs_lit": pairs,
                "capex_usd": net.link_capex_usd(key, w, optic),
            }
        )
    # waves on a route need the default optic to compute capacity: pass optic through
    optic_of = {k: (links[k][1] or net.default_optic(k)) for k in waves}

    # --- GPUs, nodes, power
    replicas_at: dict[str, int] = defaultdict(int)  # (replica, stage) TP groups per site
    for count, chain in groups:
        for s in chain:
            replicas_at[s] += count
    gpus_by_site: dict[str, int] = {}
    nodes_by_site: dict[str, int] = {}
    power_mw: dict[str, float] = {}
    for s in inst.sites:
        n_groups = replicas_at.get(s.name, 0)
        gpn = site_gpus_per_node(problem, s.name)
        if n_groups and cfg.tp > gpn:
            viol.append(
                Violation(
                    "gpus",
                    f"site {s.name}",
                    f"tp={cfg.tp} does not fit in a node of {gpn} GPUs (TP stays inside a node)",
                )
            )
            nodes = math.ceil(n_groups * cfg.width / gpn)
        else:
            if n_groups and replica_slots(gpn, cfg.tp, cfg.width)[0] == 0:
                viol.append(
                    Violation(
                        "gpus",
                        f"site {s.name}",
                        f"a replica stage of tp x cp x ep = {cfg.width} GPUs is wider than a node of {gpn} GPUs and not a whole number of nodes",  # noqa: E501
                    )
                )
            nodes = nodes_for(gpn, cfg.tp, cfg.width, n_groups)
        avail_nodes = s.gpus // gpn
        if nodes > avail_nodes:
            viol.append(
                Violation(
                    "gpus",
                    f"site {s.name}",
                    f"needs {nodes} nodes ({n_groups * cfg.width} GPUs in replica stages of {cfg.width} = tp x cp x ep), has {avail_nodes} nodes of {gpn} ({s.gpus} GPUs)",  # noqa: E501
                    (nodes - avail_nodes) * gpn,
                )
            )
        gpus_by_site[s.name] = n_groups * cfg.width
        nodes_by_site[s.name] = nodes
        p_w = site_power_w(problem, s.name, nodes, optic_w.get(s.name, 0.0))
        power_mw[s.name] = p_w / 1e6
        if s.power_mw is not None and p_w / 1e6 > s.power_mw * (1 + 1e-9):
            viol.append(
                Violation(
                    "power",
                    f"site {s.name}",
                    f"draws {p_w / 1e6:.3f} MW (GPUs x all-in W x PUE {s.pue} + optics), limit {s.power_mw:g} MW: short by {p_w / 1e6 - s.power_mw:.3f} MW",  # noqa: E501
                    p_w / 1e6 - s.power_mw,
                )
            )
    if inst.job.gpus is not None and cfg.gpus != inst.job.gpus:
        viol.append(
            Violation(
                "gpus",
                "job.gpus",
                f"plan uses {cfg.gpus} GPUs (tp x cp x ep x pp x dp), job.gpus requires exactly {inst.job.gpus}",  # noqa: E501
                abs(cfg.gpus - inst.job.gpus),
            )
        )

    # --- memory per (stage, GPU type)
    memory_gb: dict[str, float] = {}
    for _count, chain in groups:
        for k, s in enumerate(chain):
            gpu_key = inst.site(s).gpu
            label = f"stage {k} at site {s} ({gpu_key})"
            if label in memory_gb:
                continue
            mem = config_stage_memory_bytes(problem.model, cfg, k)
            memory_gb[label] = mem["total"] / GB
            cap = cat.gpus[gpu_key].hbm_gb - cat.memory.reserve_gb
            if mem["total"] / GB > cap:
                viol.append(
                    Violation(
                        "memory",
                        label,
                        f"needs {mem['total'] / GB:.1f} GB per GPU (state {mem['model_state'] / GB:.1f} + activations {mem['activations'] / GB:.1f}), {cap:g} GB usable ({cat.gpus[gpu_key].hbm_gb:g} HBM - {cat.memory.reserve_gb:g} reserve)",  # noqa: E501
                        mem["total"] / GB - cap,
                    )
                )

    # --- budget
    obj = inst.objective
    if obj.max_cost_usd is not None and capex > obj.max_cost_usd * (1 + 1e-9):
        viol.append(
            Violation(
                "budget",
                "objective.max_cost_usd",
                f"link capex ${capex:,.0f} exceeds budget ${obj.max_cost_usd:,.0f}",
                capex - obj.max_cost_usd,
            )
        )

    # --- step time
    perf_waves = waves
    step = perf.step(cfg, groups, perf_waves, optics=optic_of, routing=routing)
    for a, b in step.unreachable:
        viol.append(
            Violation("topology", f"sites {a}-{b}", "traffic between these sites has no route path")
        )
    for key, t in {**step.route_pp_s, **step.route_dp_s}.items():
        if math.isinf(t):
            viol.append(
                Violation(
                    "channels",
                    f"route {key[0]}-{key[1]}",
                    "carries traffic but has no capacity (no waves, no existing capacity)",
                )
            )
    if obj.max_step_time_s is not None and step.step_time_s > obj.max_step_time_s * (1 + 1e-9):
        viol.append(
            Violation(
                "step_time",
                "objective.max_step_time_s",
                f"step time {step.step_time_s:.4g} s exceeds {obj.max_step_time_s:g} s",
                step.step_time_s - obj.max_step_time_s,
            )
        )

    t = step.step_time_s
    usd_per_s = usd_per_second(problem, capex, power_mw, nodes_by_site)
    ev = Evaluation(
        feasible=not viol,
        violations=viol,
        step_time_s=t,
        breakdown=step.breakdown,
        tokens_per_s=perf.tokens_per_step() / t if 0 < t < math.inf else 0.0,
        mfu=perf.mfu(cfg, t, gpus_by_site),
        capex_usd=capex,
        power_mw=power_mw,
        gpus_by_site=gpus_by_site,
        nodes_by_site=nodes_by_site,
        links=link_rows,
        sync_mode=cfg.sync_mode,
        config=cfg,
        step=step,
        memory_gb=memory_gb,
        opex_usd_per_year=opex,
        usd_per_s=usd_per_s,
        cost_per_token_usd=usd_per_s * t / perf.tokens_per_step() if math.isfinite(t) else math.inf,
        routing=routing,
        groups=groups,
    )
    res = inst.resilience
    if check_resilience and res is not None and res.survive and not viol:
        fr = failure_report(problem, ev)
        worst = fr.worst()
        dark = [sc for sc in fr.scenarios if sc.dark]
        for sc in dark:
            viol.append(
                Violation(
                    "resilience",
                    sc.where,
                    f"{sc.klass}: {sc.description}: the route carries traffic and would go dark (placer does not count on rerouting)",  # noqa: E501
                )
            )
        if worst is not None and not dark and not fr.survives:
            t_w = worst.step_s[fr.collective]
            viol.append(
                Violation(
                    "resilience",
                    worst.where,
                    f"{worst.description}: step time {t_w:.4g} s under {fr.collective} exceeds the limit {fr.limit_s:.4g} s",  # noqa: E501
                    t_w - (fr.limit_s or 0),
                )
            )
        ev.feasible = not viol
    return ev


def _broken(problem: Problem, cfg: Config, viol: list[Violation]) -> Evaluation:
    return Evaluation(False, viol, math.inf, {}, 0.0, 0.0, 0.0, {}, {}, {}, [], cfg.sync_mode, cfg)


def completed_plan(problem: Problem, plan: Plan, ev: Evaluation, **extra: Any) -> Plan:
    """The plan with every derived field filled from its evaluation."""
    data = plan.model_dump(exclude_none=True)
    data.update(
        instance=problem.name,
        parallelism={**data["parallelism"], "num_micro_batches": ev.config.num_micro_batches},
        links=[{"sites": r["sites"], "waves": r["waves"], "optic": r["optic"]} for r in ev.links],
        sync_mode=ev.sync_mode,
        step_time_s=ev.step_time_s,
        breakdown=ev.breakdown,
        tokens_per_s=ev.tokens_per_s,
        mfu=ev.mfu,
        cost={
            "capex_usd": ev.capex_usd,
            "usd_per_s": ev.usd_per_s,
            "cost_per_token_usd": ev.cost_per_token_usd,
        },
        power_mw=ev.power_mw,
    )
    data.update(extra)
    return Plan.model_validate(data)


__all__ = ["Evaluation", "Violation", "evaluate", "completed_plan", "route_key"]
