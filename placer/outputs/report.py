"""Human-readable outputs: the rich console summary and report.md."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from placer.evaluate import Evaluation
from placer.io import Problem
from placer.schema import Plan


def _placement_rows(plan: Plan) -> list[tuple[int, str]]:
    rows = []
    for g in plan.replica_groups:
        blocks: list[str] = []
        start = 0
        for k in range(1, len(g.stage_sites) + 1):
            if k == len(g.stage_sites) or g.stage_sites[k] != g.stage_sites[start]:
                blocks.append(f"{g.stage_sites[start]} (stages {start}-{k - 1})" if k - 1 > start else f"{g.stage_sites[start]} (stage {start})")
                start = k
        rows.append((g.count, " -> ".join(blocks)))
    return rows


def binding_constraints(problem: Problem, ev: Evaluation) -> list[str]:
    """Resources at (or within 1% of) their limit in the plan."""
    out = []
    inst = problem.instance
    for s in inst.sites:
        if s.power_mw is not None and ev.power_mw.get(s.name, 0) >= 0.99 * s.power_mw:
            out.append(f"power at {s.name}: {ev.power_mw[s.name]:.2f} of {s.power_mw:g} MW")
        if s.gpus and ev.gpus_by_site.get(s.name, 0) >= 0.99 * s.gpus:
            out.append(f"GPUs at {s.name}: {ev.gpus_by_site[s.name]} of {s.gpus}")
    if inst.objective.max_cost_usd is not None and ev.capex_usd >= 0.99 * inst.objective.max_cost_usd:
        out.append(f"link budget: ${ev.capex_usd:,.0f} of ${inst.objective.max_cost_usd:,.0f}")
    if inst.objective.max_step_time_s is not None and ev.step_time_s >= 0.99 * inst.objective.max_step_time_s:
        out.append(f"step time: {ev.step_time_s:.3f} of {inst.objective.max_step_time_s:g} s")
    step = ev.step
    if step is not None:
        for key, t in sorted({**step.route_dp_s, **step.route_pp_s}.items()):
            if t > 0 and (t >= 0.99 * step.wan_s - 1e-12 or t >= 0.99 * step.pipe_s):
                out.append(f"route {key[0]}-{key[1]} bandwidth: {t:.3f} s of traffic per step")
    return out


def markdown_report(problem: Problem, plan: Plan, ev: Evaluation, solver: dict[str, Any] | None = None) -> str:
    par = plan.parallelism
    lines = [f"# placer plan: {problem.name}", ""]
    if problem.instance.description:
        lines += [problem.instance.description.strip(), ""]
    lines += [
        "## Parallelism",
        "",
        f"- model `{problem.model.name}`, global batch {problem.instance.job.global_batch} x {problem.model.seq_len} tokens",
        f"- tensor {par.tp} x pipeline {par.pp} x data {par.dp} = {par.tp * par.pp * par.dp} GPUs; micro-batch {par.micro_batch}, {ev.config.num_micro_batches} micro-batches per step",
        f"- layers per stage: {list(plan.stage_layers)}",
        f"- data-parallel sync: {ev.sync_mode}",
        "",
        "## Placement (replicas -> sites hosting their stages)",
        "",
        "| replicas | stages by site |",
        "|---:|---|",
    ]
    lines += [f"| {n} | {row} |" for n, row in _placement_rows(plan)]
    lines += ["", "## Links", "", "| route | km | waves | optic | fiber pairs lit | capex USD |", "|---|---:|---:|---|---:|---:|"]
    routes = {r.key: r for r in problem.instance.routes}
    for link in ev.links:
        key = tuple(sorted(link["sites"]))
        lines.append(f"| {key[0]}-{key[1]} | {routes[key].km:g} | {link['waves']} | {link['optic']} | {link['fiber_pairs_lit']} | {link['capex_usd']:,.0f} |")
    if not ev.links:
        lines.append("| (no new waves) | | | | | |")
    lines += _routing_lines(plan, ev)
    lines += ["", "## Step time", "", "| component | seconds |", "|---|---:|"]
    for k, v in ev.breakdown.items():
        lines.append(f"| {k} | {v:.4f} |")
    lines += [
        f"| **step time** | **{ev.step_time_s:.4f}** |",
        "",
        f"- tokens/s: {ev.tokens_per_s:,.0f}; MFU: {ev.mfu:.1%}",
        "",
        "## Power and cost per site",
        "",
        "| site | GPUs used | nodes | power MW | limit MW |",
        "|---|---:|---:|---:|---:|",
    ]
    for s in problem.instance.sites:
        lim = f"{s.power_mw:g}" if s.power_mw is not None else "unlimited"
        lines.append(f"| {s.name} | {ev.gpus_by_site.get(s.name, 0)} | {ev.nodes_by_site.get(s.name, 0)} | {ev.power_mw.get(s.name, 0):.3f} | {lim} |")
    lines += ["", f"Link capex: ${ev.capex_usd:,.0f}", ""]
    if ev.links:
        from placer.outputs.bom import bom_markdown

        lines += [bom_markdown(problem, plan).strip(), ""]
    lines += ["## Binding constraints", ""]
    lines += [f"- {b}" for b in binding_constraints(problem, ev)] or ["- none within 1% of its limit"]
    if plan.resilience:
        lines += resilience_section(plan.resilience)
    if ev.violations:
        lines += ["", "## Violations", ""] + [f"- {v}" for v in ev.violations]
    if solver:
        lines += [
            "",
            "## Solver",
            "",
            f"- backend {solver.get('backend')}, status {solver.get('status')}, {solver.get('seconds')} s",
            f"- objective {solver.get('objective')}, bound {solver.get('bound')}, gap {solver.get('gap', 0):.2e}",
            f"- configurations: {solver.get('configs_total')} enumerated, {solver.get('configs_solved')} solved exactly, the rest pruned by bound",
        ]
    return "\n".join(lines) + "\n"


def print_summary(console: Console, problem: Problem, plan: Plan, ev: Evaluation, title: str) -> None:
    par = plan.parallelism
    console.print(f"[bold]{title}[/bold]: {problem.name}  tp={par.tp} pp={par.pp} dp={par.dp} mb={par.micro_batch} sync={ev.sync_mode}")
    t = Table(title="placement")
    t.add_column("replicas", justify="right")
    t.add_column("stages by site")
    for n, row in _placement_rows(plan):
        t.add_row(str(n), row)
    console.print(t)
    b = Table(title="step time")
    b.add_column("component")
    b.add_column("seconds", justify="right")
    for k, v in ev.breakdown.items():
        b.add_row(k, f"{v:.4f}")
    b.add_row("[bold]step time[/bold]", f"[bold]{ev.step_time_s:.4f}[/bold]")
    console.print(b)
    s = Table(title="sites")
    for col in ("site", "GPUs", "power MW", "limit MW"):
        s.add_column(col, justify="right" if col != "site" else "left")
    for site in problem.instance.sites:
        s.add_row(site.name, str(ev.gpus_by_site.get(site.name, 0)), f"{ev.power_mw.get(site.name, 0):.3f}", f"{site.power_mw:g}" if site.power_mw is not None else "-")
    console.print(s)
    links = defaultdict(int)
    for link in ev.links:
        links[f"{link['sites'][0]}-{link['sites'][1]} ({link['optic']})"] += link["waves"]
    console.print("links: " + (", ".join(f"{k}: {v} waves" for k, v in links.items()) or "none") + f"; capex ${ev.capex_usd:,.0f}")
    for r in plan.routing:
        split = ", ".join(f"{p.share:.0%} via {'-'.join(p.via)}" for p in r.paths)
        console.print(f"routing ({r.phase}) {r.sites[0]}-{r.sites[1]}: {split}")
    console.print(f"tokens/s {ev.tokens_per_s:,.0f}  MFU {ev.mfu:.1%}")
    if ev.violations:
        console.print("[red]violations:[/red]")
        for v in ev.violations:
            console.print(f"  - {v}", markup=False, highlight=False)


def resilience_section(res: dict[str, Any]) -> list[str]:
    """Failures, spare waves bought for the guarantee, and ring vs OptCC spare capacity."""
    fr = res.get("failures", {})
    lines = [
        "",
        "## Resilience",
        "",
        f"- guarantee: every single failure of {', '.join(res.get('survive', []))} keeps the step within "
        + (f"{fr.get('limit_s'):.4f} s" if fr.get("limit_s") else "the limit")
        + f" (max_slowdown {res.get('max_slowdown')}), priced with the {res.get('collective')} collective",
        f"- healthy step {fr.get('healthy_step_time_s', 0):.4f} s; holds: {fr.get('survives')}",
        "",
        "| failure | where | ring s | OptCC s | bound s |",
        "|---|---|---:|---:|---:|",
    ]
    for sc in fr.get("scenarios", []):
        st = sc["step_time_s"]
        cell = lambda v: "no capacity" if v is None else f"{v:.4f}"  # noqa: E731
        lines.append(f"| {sc['class']}: {sc['description']} | {sc['where']} | {cell(st.get('ring'))} | {cell(st.get('optcc'))} | {cell(st.get('bound'))} |")
    exp = fr.get("expected_step_time_s") or {}
    if exp:
        lines += ["", "Expected step time over NIC failures: " + ", ".join(f"{c} {v:.4f} s" for c, v in exp.items())]
    lines += ["", "| route | waves without guarantee | spare under ring | spare under OptCC |", "|---|---:|---:|---:|"]
    base = res.get("waves_without_resilience") or {}
    ring = res.get("spare_waves_ring_by_route") or {}
    opt = res.get("spare_waves_optcc_by_route") or {}
    for route in sorted(set(base) | set(ring) | set(opt)):
        lines.append(f"| {route} | {base.get(route, 0)} | {ring.get(route, '-')} | {opt.get(route, '-')} |")
    lines.append(f"| **total** | {sum(base.values())} | {res.get('spare_waves_ring')} | {res.get('spare_waves_optcc')} |")
    return lines


def _routing_lines(plan: Plan, ev: Evaluation) -> list[str]:
    """Traffic split over several paths, and the load each route carries per step."""
    out = ["", "## Routing", ""]
    if plan.routing:
        out += ["| phase | pair | path | share | one-way latency ms |", "|---|---|---|---:|---:|"]
        for entry in plan.routing:
            for use in ev.routing.get(entry.key, ()):
                out.append(f"| {entry.phase} | {entry.key[1][0]}-{entry.key[1][1]} | {use.path.label()} | {use.share:.1%} | {use.path.latency_s * 1e3:.3f} |")
        out.append("")
        out.append("A pair's latency is that of its slowest listed path; pairs not listed use their shortest path.")
    else:
        out.append("Every site pair uses its shortest path.")
    step = ev.step
    if step is not None and (step.route_pp_load or step.route_dp_load):
        out += ["", "| route | pipeline GB/step | pipeline s | data-parallel GB/step | data-parallel s |", "|---|---:|---:|---:|---:|"]
        for key in sorted(set(step.route_pp_load) | set(step.route_dp_load)):
            out.append(
                f"| {key[0]}-{key[1]} | {step.route_pp_load.get(key, 0) / 1e9:.3f} | {step.route_pp_s.get(key, 0):.4f} "
                f"| {step.route_dp_load.get(key, 0) / 1e9:.3f} | {step.route_dp_s.get(key, 0):.4f} |"
            )
    return out


def print_failures(out: Console, fr: Any) -> None:
    """The single-failure table of a FailureReport (placer.resilience)."""
    t = Table(title=f"single failures (healthy {fr.healthy_s:.4f} s; plan's collective: {fr.collective})")
    for col in ("class", "where", "what", "ring s", "OptCC s", "bound s"):
        t.add_column(col, justify="right" if col.endswith(" s") else "left")
    fmt = lambda v: f"{v:.5g}" if v < float("inf") else "no capacity"  # noqa: E731
    secs = lambda v: f"{v:.5g} s" if v < float("inf") else "no capacity left (the step cannot complete)"  # noqa: E731
    for sc in fr.scenarios:
        t.add_row(sc.klass, sc.where, sc.description + (" [DISCONNECTED]" if sc.disconnected else ""), fmt(sc.step_s["ring"]), fmt(sc.step_s["optcc"]), fmt(sc.step_s["bound"]))
    out.print(t)
    w = fr.worst()
    if w is not None:
        out.print(f"worst single failure: {w.klass} at {w.where}: {secs(w.step_s[fr.collective])} under {fr.collective}" + (f" (limit {fr.limit_s:.4f} s: {'ok' if fr.survives else 'EXCEEDED'})" if fr.limit_s else ""))
    for c, v in fr.expected_s.items():
        out.print(f"expected step time over NIC failures with {c}: {v:.4f} s")


def simulate_critical_chain(prob: Problem, ev: Evaluation) -> dict[str, float] | None:
    """The 1F1B event simulation of the plan's critical chain beside the closed form."""
    from placer.perf.pipeline import simulate_1f1b
    from placer.perf.step import PerfModel

    if ev.step is None or ev.step.critical_chain is None:
        return None
    perf = PerfModel(prob)
    cfg, chain = ev.config, ev.step.critical_chain
    st = [perf.stage_times(cfg, prob.instance.site(s).gpu)[k] for k, s in enumerate(chain)]
    lat, tx = zip(*[perf.boundary(cfg, a, b) for a, b in zip(chain, chain[1:], strict=False)], strict=False) if len(chain) > 1 else ((), ())
    sim = simulate_1f1b([t.fwd for t in st], [t.bwd for t in st], list(lat), list(tx), cfg.num_micro_batches)
    closed = perf.chain_time(cfg, chain)
    return {"pipeline_s": sim.makespan_s, "closed_form_s": closed, "rel_diff": abs(sim.makespan_s - closed) / closed}
