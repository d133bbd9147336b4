"""Why an instance has no feasible plan: the binding resource and the shortfall."""

from __future__ import annotations

import math
from typing import Any

from placer.io import Problem
from placer.optimize.space import SpaceReport, site_group_capacity
from placer.perf.step import PerfModel
from placer.rules import site_gpus_per_node, site_power_w


def explain_infeasible(
    problem: Problem, perf: PerfModel, report: SpaceReport, cands: list[Any]
) -> str:
    inst, cat = problem.instance, problem.catalog
    lines: list[str] = [f"instance '{inst.name}' has no feasible plan."]
    total_gpus = sum(s.gpus for s in inst.sites)
    if inst.job.gpus is not None and inst.job.gpus > total_gpus:
        lines.append(
            f"GPUs: job.gpus = {inst.job.gpus}, the sites offer {total_gpus}: short by {inst.job.gpus - total_gpus} GPUs."  # noqa: E501
        )
    if not cands:
        lines += _empty_space_headline(problem, report)
        if math.isfinite(report.best_memory_gap_gb) and report.dropped.get(
            "no stage placement fits in GPU memory"
        ):
            lines.append(f"memory: no configuration fits; the closest ({report.memory_example}).")
        for reason, n in sorted(report.dropped.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {n} configuration(s) dropped: {reason}")
    # power: how many GPUs can the power budgets feed, vs the smallest configuration
    smallest = min((c.cfg.gpus for c in cands), default=None)
    if smallest is not None:
        tp = min(c.cfg.tp for c in cands)
        feedable = 0
        short_site = []
        for s in inst.sites:
            gpn = site_gpus_per_node(problem, s.name)
            node_w = site_power_w(problem, s.name, 1)
            nodes = s.gpus // gpn
            if s.power_mw is not None:
                fed = min(nodes, math.floor(s.power_mw * 1e6 / node_w + 1e-9))
                if fed < nodes:
                    short_site.append(
                        f"{s.name} feeds {fed} of {nodes} nodes ({s.power_mw:g} MW; {(nodes - fed) * node_w / 1e6:.2f} MW more would power all)"  # noqa: E501
                    )
                nodes = fed
            feedable += nodes * (gpn // tp) * tp if tp <= gpn else 0
        if feedable < smallest:
            lines.append(
                f"power: the smallest configuration needs {smallest} GPUs, the power limits feed {feedable}: "  # noqa: E501
                f"short by {smallest - feedable} GPUs (~{(smallest - feedable) * max(site_power_w(problem, s.name, 1) / site_gpus_per_node(problem, s.name) for s in inst.sites) / 1e6:.2f} MW). "  # noqa: E501
                + "; ".join(short_site)
            )
        narrow = min(cands, key=lambda c: (c.cfg.width, c.cfg.gpus)).cfg
        width = narrow.width  # a replica stage: tp x cp x ep GPUs (tp without CP / EP)
        groups = sum(site_group_capacity(problem, s.name, narrow.tp, width) for s in inst.sites)
        if groups * width < smallest:
            unit = f"TP groups of {tp}" if width == tp else f"replica stages of {width} GPUs"
            lines.append(
                f"GPUs: the smallest configuration needs {smallest} GPUs in {unit}; the sites hold {groups * width}."  # noqa: E501
            )
    # routes that carry nothing: no optic reaches, or no wave may be lit, and no capacity in place
    for r in inst.routes:
        if r.capacity_gbps > 0:
            continue
        if perf.net.default_optic(r.key) is None:
            longest = max(o.reach_km for o in cat.optics.values())
            lines.append(
                f"reach: route {r.sites[0]}-{r.sites[1]} is {r.km:g} km; no optic reaches (longest {longest:g} km) and it has no existing capacity, so it carries nothing."  # noqa: E501
            )
        elif perf.net.max_waves(r.key) == 0:
            why = "max_waves is 0" if r.max_waves == 0 else "it has no fiber pairs"
            lines.append(
                f"links: route {r.sites[0]}-{r.sites[1]} can light no wave ({why}) and has no existing capacity, so it carries nothing."  # noqa: E501
            )
    # power left after a site's nodes that cannot light even one wave's coherent module
    if smallest is not None and smallest > max(s.gpus for s in inst.sites):
        for s in inst.sites:
            if s.power_mw is None:
                continue
            gpn = site_gpus_per_node(problem, s.name)
            nodes = s.gpus // gpn
            node_w = site_power_w(problem, s.name, 1)
            left_w = s.power_mw * 1e6 - nodes * node_w
            need = [
                (cat.optics[o].module_w * s.pue, o)
                for r in inst.routes
                if s.name in r.sites
                for o in [perf.net.default_optic(r.key)]
                if o
            ]
            if need and 0 <= left_w < min(need)[0]:
                w, o = min(need)
                lines.append(
                    f"power: site {s.name} has {left_w:.1f} W left after its {nodes} nodes ({nodes * node_w / 1e6:.4f} MW), "  # noqa: E501
                    f"less than one {o} module ({w:.1f} W incl. PUE) needed to light a wave: short by {w - left_w:.1f} W."  # noqa: E501
                )
    if inst.objective.max_step_time_s is not None and cands:
        best_lb = (
            min(c.lower_bound for c in cands) if inst.objective.minimize == "step_time" else None
        )
        lines.append(
            f"step time: no plan meets max_step_time_s = {inst.objective.max_step_time_s:g} s"
            + (f" (best lower bound {best_lb:.4g} s)" if best_lb else "")
            + " within the budget and power limits."
        )
    if inst.objective.max_cost_usd is not None:
        lines.append(f"budget: link capex is limited to ${inst.objective.max_cost_usd:,.0f}.")
    if len(lines) == 1:
        for reason, n in sorted(report.dropped.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {n} configuration(s) dropped: {reason}")
    return "\n".join(lines)


def _empty_space_headline(problem: Problem, report: SpaceReport) -> list[str]:
    """The binding resource when no configuration survives enumeration and bounding."""
    inst, model = problem.instance, problem.model
    out: list[str] = []
    t_max = inst.objective.max_step_time_s
    if t_max is not None and math.isfinite(report.best_time_lb_s):
        short = report.best_time_lb_s - t_max
        out.append(
            f"step time: objective.max_step_time_s = {t_max:g} s, but the fastest configuration cannot beat "  # noqa: E501
            f"{report.best_time_lb_s:.4g} s (its lower bound): the limit is {short:.4g} s too tight ({short / t_max:.0%})."  # noqa: E501
        )
    tps = sorted(inst.job.parallelism.tp or [1])
    tps_ok = [t for t in tps if not (model.heads % t or (model.kv % t and t % model.kv))] or tps
    need = min(tps_ok)  # one stage of one replica
    usable = sum(site_group_capacity(problem, s.name, t) * t for s in inst.sites for t in [need])
    if usable == 0:
        where = ", ".join(
            f"sites[{i}].gpus = {s.gpus} ({site_gpus_per_node(problem, s.name)} per node)"
            for i, s in enumerate(inst.sites)
        )
        best = max(min(s.gpus, site_gpus_per_node(problem, s.name)) for s in inst.sites)
        out.append(
            f"GPUs: the smallest plan needs {need} GPUs in one node (one tp={need} group); the fullest node "  # noqa: E501
            f"any site offers has {best}: short by {need - best} GPUs ({where})."
        )
    return [line for line in out if line]
