"""Warnings: what a planner should look at although nothing is invalid.

    instance_warnings(problem) -> list[PlanWarning]
    plan_warnings(problem, plan, ev) -> list[PlanWarning]

Kinds:
- `implausible`: a value that validates but is past a documented ceiling of the catalog's
  `plausibility` section (route km, site MW, PUE) or a latency below the physics of the
  fiber (or of light in vacuum); most likely a typo.
- `unreachable`: a route no optic reaches or no wave may be lit on, with no capacity in
  place: it carries nothing and traffic goes around it.
- `single_point_of_failure`: a single failure (one wave, one fiber pair) of a route the
  plan uses that disconnects the plan's sites, or that the plan rides through only by
  rerouting around a dark route; with that failure's step time.
- `unused_site`: a site that offers GPUs the plan leaves idle, and why (power, node size,
  memory, WAN reach, or the objective: using it is no better).
- `deprecated`: a catalog key read under its new name (placer.schema.RENAMED_GPU_KEYS).

Warnings go to stderr, report.md and plan.json's `warnings`; they never change the plan.
"""

from __future__ import annotations

import math

import networkx as nx

from placer.evaluate import Evaluation
from placer.io import Loc, Problem, line_for
from placer.network import Network
from placer.perf.flops import config_stage_memory_bytes
from placer.rules import site_gpus_per_node
from placer.schema import Plan, PlanWarning

GB = 1e9


def _warn(problem: Problem, kind: str, loc: Loc, text: str) -> PlanWarning:
    where = "".join(
        f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(loc)
    )
    line = line_for(loc, problem.lines) if problem.lines else None
    file = f"{problem.path}:{line}: " if problem.path is not None and line else ""
    return PlanWarning(kind=kind, where=where, message=f"{file}{where}: {text}")


def instance_warnings(problem: Problem) -> list[PlanWarning]:
    inst, cat = problem.instance, problem.catalog
    ceil = cat.plausibility
    net = Network(problem)
    out = [_warn(problem, "deprecated", loc, text) for loc, text in problem.deprecations]
    for i, s in enumerate(inst.sites):
        if s.power_mw is not None and s.power_mw > ceil.max_site_mw:
            out.append(
                _warn(
                    problem,
                    "implausible",
                    ("sites", i, "power_mw"),
                    f"{s.power_mw:g} MW is more than the largest AI campuses ({ceil.max_site_mw:g} MW); a unit slip (kW or W)?",  # noqa: E501
                )
            )
        if s.pue > ceil.max_pue:
            out.append(
                _warn(
                    problem,
                    "implausible",
                    ("sites", i, "pue"),
                    f"PUE {s.pue:g} is above {ceil.max_pue:g} (industry average ~1.55)",
                )
            )
    longest = max((o.reach_km for o in cat.optics.values()), default=0.0)
    for i, r in enumerate(inst.routes):
        if r.km > ceil.max_route_km:
            out.append(
                _warn(
                    problem,
                    "implausible",
                    ("routes", i, "km"),
                    f"{r.km:g} km is longer than any plausible route between sites of one job ({ceil.max_route_km:g} km)",  # noqa: E501
                )
            )
        if r.latency_ms is not None:
            floor_vac = r.km * ceil.vacuum_us_per_km / 1e3
            floor_fib = r.km * cat.network.fiber_us_per_km / 1e3
            if r.latency_ms < floor_vac:
                out.append(
                    _warn(
                        problem,
                        "implausible",
                        ("routes", i, "latency_ms"),
                        f"{r.latency_ms:g} ms over {r.km:g} km is faster than light in vacuum ({floor_vac:.3g} ms)",  # noqa: E501
                    )
                )
            elif r.latency_ms < floor_fib:
                out.append(
                    _warn(
                        problem,
                        "implausible",
                        ("routes", i, "latency_ms"),
                        f"{r.latency_ms:g} ms over {r.km:g} km is below the fiber's propagation delay ({floor_fib:.3g} ms at {cat.network.fiber_us_per_km:g} us/km): hollow-core fiber, or is km the straight line?",  # noqa: E501
                    )
                )
        if r.capacity_gbps > 0:
            continue
        if net.default_optic(r.key) is None:
            out.append(
                _warn(
                    problem,
                    "unreachable",
                    ("routes", i, "km"),
                    f"no optic reaches {r.km:g} km (longest {longest:g} km) and the route has no existing capacity: it carries nothing",  # noqa: E501
                )
            )
        elif net.max_waves(r.key) == 0:
            why = "max_waves is 0" if r.max_waves == 0 else "it has no fiber pairs"
            out.append(
                _warn(
                    problem,
                    "unreachable",
                    ("routes", i),
                    f"no wave can be lit ({why}) and the route has no existing capacity: it carries nothing",  # noqa: E501
                )
            )
    return out


def plan_warnings(problem: Problem, plan: Plan, ev: Evaluation) -> list[PlanWarning]:
    out = _single_points(problem, plan, ev)
    out += _unused_sites(problem, plan, ev)
    return out


def _single_points(problem: Problem, plan: Plan, ev: Evaluation) -> list[PlanWarning]:
    if not ev.feasible or not ev.links or sum(1 for g in ev.gpus_by_site.values() if g) < 2:
        return []
    from placer.optimize.deadline import DeadlinePassed
    from placer.resilience import failure_report

    try:
        fr = failure_report(problem, ev, ["wave", "fiber_pair"])
    except DeadlinePassed:  # the solve's time limit: say so instead of overrunning it
        return [
            PlanWarning(
                kind="single_point_of_failure",
                where="links",
                message="links: not checked for single points of failure: the time limit was "
                "reached first (run `placer evaluate --failures`)",
            )
        ]
    out: dict[str, PlanWarning] = {}  # one warning per route: the smallest failure that darkens it
    for sc in fr.scenarios:
        if not sc.dark or sc.where in out:
            continue
        step = sc.step_s.get(fr.collective, math.inf)
        what = sc.description.split(" (route dark")[0]
        if sc.disconnected:
            text = f"{what}: the route goes dark and no other path joins the plan's sites; the step cannot complete"  # noqa: E501
        elif not math.isfinite(step):
            text = f"{what}: the route goes dark and the detour has no capacity; the step cannot complete"  # noqa: E501
        else:
            text = f"{what}: the route goes dark; the plan rides through only by rerouting, at {step:.4g} s per step (healthy {fr.healthy_s:.4g} s)"  # noqa: E501
        out[sc.where] = PlanWarning(
            kind="single_point_of_failure", where=sc.where, message=f"{sc.where}: {text}"
        )
    return list(out.values())


def _unused_sites(problem: Problem, plan: Plan, ev: Evaluation) -> list[PlanWarning]:
    inst, cat = problem.instance, problem.catalog
    par = plan.parallelism
    used = {s for s, g in ev.gpus_by_site.items() if g}
    carrying = _carrying_graph(problem, Network(problem))
    out = []
    for i, s in enumerate(inst.sites):
        if s.gpus == 0 or s.name in used:
            continue
        gpu = cat.gpus[s.gpu]
        gpn = site_gpus_per_node(problem, s.name)
        node_mw = gpn * gpu.all_in_w * s.pue / 1e6
        cap_gb = gpu.hbm_gb - cat.memory.reserve_gb
        if s.power_mw is not None and s.power_mw < node_mw:
            why = f"power: {s.power_mw:g} MW cannot feed one {gpn}-GPU node ({node_mw:.3f} MW with PUE {s.pue:g})"  # noqa: E501
        elif par.tp > gpn or s.gpus < par.tp:
            why = f"size: the plan's tensor-parallel groups of {par.tp} GPUs do not fit its {gpn}-GPU nodes ({s.gpus} GPUs)"  # noqa: E501
        elif (need := _least_stage_memory_gb(problem, plan, ev)) > cap_gb:
            why = f"memory: the smallest stage of tp {par.tp} x pp {par.pp} needs {need:.1f} GB per GPU, {s.gpu} has {cap_gb:g} GB usable"  # noqa: E501
        elif used and not any(nx.has_path(carrying, s.name, u) for u in used):
            why = "WAN: no route that can carry traffic joins it to the sites the plan uses"
        else:
            proven = (
                " (the plan is proven optimal, so no plan that uses it is better)"
                if plan.status == "optimal"
                else ""
            )
            why = f"not needed: the chosen tp {par.tp} x pp {par.pp} x dp {par.dp} runs on the other sites, and adding it does not improve the objective '{inst.objective.minimize}'{proven}"  # noqa: E501
        out.append(
            _warn(
                problem,
                "unused_site",
                ("sites", i),
                f"{s.name}'s {s.gpus:,} {s.gpu} GPUs are unused: {why}",
            )
        )
    return out


def _least_stage_memory_gb(problem: Problem, plan: Plan, ev: Evaluation) -> float:
    cfg = ev.config
    per = [config_stage_memory_bytes(problem.model, cfg, k)["total"] for k in range(cfg.pp)]
    return min(per) / GB


def _carrying_graph(problem: Problem, net: Network) -> nx.Graph:
    """Sites joined by the routes that can carry traffic (an optic reaches and waves may be
    lit, or capacity is in place)."""
    g = nx.Graph()
    g.add_nodes_from(s.name for s in problem.instance.sites)
    for r in problem.instance.routes:
        if r.capacity_gbps > 0 or (
            net.default_optic(r.key) is not None and net.max_waves(r.key) > 0
        ):
            g.add_edge(*r.key)
    return g


__all__ = ["instance_warnings", "plan_warnings"]
