"""Human-readable outputs: the rich console summary and report.md."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from placer.evaluate import Evaluation
from placer.io import Problem
from placer.schema import Plan

SHARE_EPS = 1e-9  # a path share at or below this carries nothing: not listed


def _placement_rows(plan: Plan) -> list[tuple[int, str]]:
    rows = []
    for g in plan.replica_groups:
        blocks: list[str] = []
        start = 0
        for k in range(1, len(g.stage_sites) + 1):
            if k == len(g.stage_sites) or g.stage_sites[k] != g.stage_sites[start]:
                blocks.append(
                    f"{g.stage_sites[start]} (stages {start}-{k - 1})"
                    if k - 1 > start
                    else f"{g.stage_sites[start]} (stage {start})"
                )
                start = k
        rows.append((g.count, " -> ".join(blocks)))
    return rows


def binding_constraints(problem: Problem, ev: Evaluation, plan: Plan | None = None) -> list[str]:
    """Resources at (or within 1% of) their limit in the plan, and routes whose bandwidth
    binds: one more wave on them would shorten the step (checked by evaluating that plan)."""
    out = []
    inst = problem.instance
    for s in inst.sites:
        if s.power_mw is not None and ev.power_mw.get(s.name, 0) >= 0.99 * s.power_mw:
            out.append(f"power at {s.name}: {ev.power_mw[s.name]:.2f} of {s.power_mw:g} MW")
        if s.gpus and ev.gpus_by_site.get(s.name, 0) >= 0.99 * s.gpus:
            out.append(f"GPUs at {s.name}: {ev.gpus_by_site[s.name]} of {s.gpus}")
    if (
        inst.objective.max_cost_usd is not None
        and ev.capex_usd >= 0.99 * inst.objective.max_cost_usd
    ):
        out.append(f"link budget: ${ev.capex_usd:,.0f} of ${inst.objective.max_cost_usd:,.0f}")
    if (
        inst.objective.max_step_time_s is not None
        and ev.step_time_s >= 0.99 * inst.objective.max_step_time_s
    ):
        out.append(f"step time: {ev.step_time_s:.3f} of {inst.objective.max_step_time_s:g} s")
    if plan is not None and ev.feasible:
        out += _binding_routes(problem, plan, ev)
    return out


def _binding_routes(problem: Problem, plan: Plan, ev: Evaluation) -> list[str]:
    from placer.evaluate import evaluate
    from placer.network import Network

    step = ev.step
    if step is None:
        return []
    net = Network(problem)
    waves = {tuple(sorted(link["sites"])): link for link in ev.links}
    out = []
    for key in sorted(set(step.route_pp_s) | set(step.route_dp_s)):
        if step.route_pp_s.get(key, 0) + step.route_dp_s.get(key, 0) <= 0:
            continue
        link = waves.get(key)
        optic = link["optic"] if link else net.default_optic(key)
        n = link["waves"] if link else 0
        if optic is None or n + 1 > net.max_waves(key, optic):
            continue
        more = plan.model_dump(mode="json", exclude_none=True)
        more["links"] = [lk for lk in more["links"] if tuple(sorted(lk["sites"])) != key] + [
            {"sites": list(key), "waves": n + 1, "optic": optic}
        ]
        t = evaluate(problem, more, check_resilience=False).step_time_s
        if t < ev.step_time_s * (1 - 1e-6):
            out.append(
                f"route {key[0]}-{key[1]} bandwidth: one more wave ({n + 1}) would cut the step from {ev.step_time_s:.4f} to {t:.4f} s"  # noqa: E501
            )
    return out


def markdown_report(
    problem: Problem, plan: Plan, ev: Evaluation, solver: dict[str, Any] | None = None
) -> str:
    par = plan.parallelism
    lines = [f"# placer plan: {problem.name}", ""]
    if problem.instance.description:
        lines += [problem.instance.description.strip(), ""]
    lines += [
        "## Parallelism",
        "",
        f"- model `{problem.model.name}`, global batch {problem.instance.job.global_batch} x {problem.model.seq_len} tokens",  # noqa: E501
        f"- tensor {par.tp}{_cp_ep(ev.config)} x pipeline {par.pp} x data {par.dp} = {ev.config.gpus} GPUs; micro-batch {par.micro_batch}, {ev.config.num_micro_batches} micro-batches per step"  # noqa: E501
        + (
            f"; interleaved 1F1B, {par.virtual_stages} chunks per pipeline rank"
            if par.virtual_stages > 1
            else ""
        )
        + (
            "; DualPipeV, 2 chunks per pipeline rank in a V"
            if par.pipeline_schedule == "dualpipev"
            else ""
        ),
        f"- layers per stage: {list(plan.stage_layers)}"
        + (
            f"; per model stage (chunk c of rank k at c*pp + k): {list(par.chunk_layers)}"
            if par.chunk_layers is not None
            else ""
        ),
        f"- data-parallel sync: {ev.sync_mode}",
        "",
        "## Placement (replicas -> sites hosting their stages)",
        "",
        "| replicas | stages by site |",
        "|---:|---|",
    ]
    lines += [f"| {n} | {row} |" for n, row in _placement_rows(plan)]
    lines += [
        "",
        "## Links",
        "",
        "| route | km | waves | optic | fiber pairs lit | capex USD |",
        "|---|---:|---:|---|---:|---:|",
    ]
    routes = {r.key: r for r in problem.instance.routes}
    for link in ev.links:
        key = tuple(sorted(link["sites"]))
        lines.append(
            f"| {key[0]}-{key[1]} | {routes[key].km:g} | {link['waves']} | {link['optic']} | {link['fiber_pairs_lit']} | {link['capex_usd']:,.0f} |"  # noqa: E501
        )
    if not ev.links:
        lines.append("| (no new waves) | | | | | |")
    lines += _routing_lines(problem, plan, ev)
    lines += ["", "## Step time", "", "| component | seconds |", "|---|---:|"]
    for k, v in ev.breakdown.items():
        lines.append(f"| {k} | {v:.4f} |")
    lines += [
        f"| **step time** | **{ev.step_time_s:.4f}** |",
        "",
        *_hidden_lines(ev),
        f"- tokens/s: {ev.tokens_per_s:,.0f}; MFU: {ev.mfu:.1%}",
        "",
        "## Power and cost per site",
        "",
        "| site | GPUs used | nodes | power MW | limit MW |",
        "|---|---:|---:|---:|---:|",
    ]
    for s in problem.instance.sites:
        lim = f"{s.power_mw:g}" if s.power_mw is not None else "unlimited"
        lines.append(
            f"| {s.name} | {ev.gpus_by_site.get(s.name, 0)} | {ev.nodes_by_site.get(s.name, 0)} | {ev.power_mw.get(s.name, 0):.3f} | {lim} |"  # noqa: E501
        )
    lines += ["", f"Link capex: ${ev.capex_usd:,.0f}", ""]
    if ev.links:
        from placer.outputs.bom import bom_markdown

        lines += [bom_markdown(problem, plan).strip(), ""]
    lines += ["## Warnings", ""]
    lines += [f"- {w.kind}: {w.message}" for w in plan.warnings] or ["- none"]
    lines += ["", "## Binding constraints", ""]
    lines += [f"- {b}" for b in binding_constraints(problem, ev, plan)] or [
        "- none within 1% of its limit, and no route where one more wave would shorten the step"
    ]
    if plan.resilience:
        lines += resilience_section(plan.resilience)
    if ev.violations:
        lines += ["", "## Violations", ""] + [f"- {v}" for v in ev.violations]
    if solver:
        lines += [
            "",
            "## Solver",
            "",
            f"- backend {solver.get('backend')}, status {solver.get('status')}, {solver.get('seconds')} s",  # noqa: E501
            f"- objective {solver.get('objective')}, bound {solver.get('bound')}, gap {solver.get('gap', 0):.2e}",  # noqa: E501
            f"- configurations: {solver.get('configs_total')} enumerated, {solver.get('configs_solved')} solved exactly, the rest pruned by bound",  # noqa: E501
        ]
        if solver.get("splits"):
            words = [SPLITS_TEXT.get(x, x) for x in solver["splits"].split("+")]
            lines.append("- layer splits searched: " + "; and, for other shapes, ".join(words))
    return "\n".join(lines) + "\n"


# plan.solver.splits in words (placer.optimize.splits)
SPLITS_TEXT = {
    "all": "every split of the layers into the pipeline stages",
    "candidates": "the even split and the min-max split of each GPU-type sequence (too many splits to search them all; job.parallelism.stage_layers: all asks for a bound over every split)",  # noqa: E501
    "even": "the even split only (job.parallelism.stage_layers: even; with interleaving, v > 1, the even chunks or Megatron-Core's balanced layout)",  # noqa: E501
    "listed": "the splits listed in job.parallelism.stage_layers",
}


def print_summary(
    console: Console, problem: Problem, plan: Plan, ev: Evaluation, title: str
) -> None:
    par = plan.parallelism
    console.print(
        f"[bold]{title}[/bold]: {problem.name}  tp={par.tp}{_cp_ep(ev.config, '=')} pp={par.pp} dp={par.dp} mb={par.micro_batch}"  # noqa: E501
        + (f" v={par.virtual_stages}" if par.virtual_stages > 1 else "")
        + (" dualpipev" if par.pipeline_schedule == "dualpipev" else "")
        + f" sync={ev.sync_mode}"
    )
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
        s.add_row(
            site.name,
            str(ev.gpus_by_site.get(site.name, 0)),
            f"{ev.power_mw.get(site.name, 0):.3f}",
            f"{site.power_mw:g}" if site.power_mw is not None else "-",
        )
    console.print(s)
    links = defaultdict(int)
    for link in ev.links:
        links[f"{link['sites'][0]}-{link['sites'][1]} ({link['optic']})"] += link["waves"]
    console.print(
        "links: "
        + (", ".join(f"{k}: {v} waves" for k, v in links.items()) or "none")
        + f"; capex ${ev.capex_usd:,.0f}"
    )
    for r in plan.routing:
        split = ", ".join(
            f"{p.share:.0%} via {'-'.join(p.via)}" for p in r.paths if p.share > SHARE_EPS
        )
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
        f"- guarantee: every single failure of {', '.join(res.get('survive', []))} keeps the step within "  # noqa: E501
        + (f"{fr.get('limit_s'):.4f} s" if fr.get("limit_s") else "the limit")
        + f" (max_slowdown {res.get('max_slowdown')}), priced with the {res.get('collective')} collective",  # noqa: E501
        f"- healthy step {fr.get('healthy_step_time_s', 0):.4f} s; holds: {fr.get('survives')}",
        "",
        "| failure | where | ring s | OptCC s | bound s |",
        "|---|---|---:|---:|---:|",
    ]
    for sc in fr.get("scenarios", []):
        st = sc["step_time_s"]
        cell = lambda v: "no capacity" if v is None else f"{v:.4f}"  # noqa: E731
        lines.append(
            f"| {sc['class']}: {sc['description']} | {sc['where']} | {cell(st.get('ring'))} | {cell(st.get('optcc'))} | {cell(st.get('bound'))} |"  # noqa: E501
        )
    exp = fr.get("expected_step_time_s") or {}
    if exp:
        lines += [
            "",
            "Expected step time over NIC failures: "
            + ", ".join(f"{c} {v:.4f} s" for c, v in exp.items()),
        ]
    # per route the waves each plan buys; a guarantee may move waves between routes, so
    # only the total difference is "spare" capacity
    lines += [
        "",
        "| route | waves without guarantee | waves with guarantee, ring | waves with guarantee, OptCC |",  # noqa: E501
        "|---|---:|---:|---:|",
    ]
    base = res.get("waves_without_resilience") or {}
    ring = res.get("spare_waves_ring_by_route")
    opt = res.get("spare_waves_optcc_by_route")
    with_ = lambda extra, route: (  # noqa: E731
        "-" if extra is None else str(base.get(route, 0) + extra.get(route, 0))
    )  # noqa: E731
    for route in sorted(set(base) | set(ring or {}) | set(opt or {})):
        lines.append(
            f"| {route} | {base.get(route, 0)} | {with_(ring, route)} | {with_(opt, route)} |"
        )
    total = lambda extra: "-" if extra is None else str(sum(base.values()) + extra)  # noqa: E731
    lines.append(
        f"| **total** | {sum(base.values())} | {total(res.get('spare_waves_ring'))} | {total(res.get('spare_waves_optcc'))} |"  # noqa: E501
    )
    lines += [
        "",
        f"Spare waves the guarantee costs: {res.get('spare_waves_ring')} under ring, {res.get('spare_waves_optcc')} under OptCC (total with guarantee minus total without).",  # noqa: E501
    ]
    unproven = [
        f"{name} ({res[f'{name}_status']}, gap {res.get(f'{name}_gap', 0.0):.2%})"
        for name in ("none", "ring", "optcc")
        if res.get(f"{name}_status") not in (None, "optimal")
    ]
    if unproven:
        lines.append(
            "Not proven within the time limit, so their wave counts are those of a feasible "
            "plan, not the fewest: " + ", ".join(unproven) + "."
        )
    return lines


def _routing_lines(problem: Problem, plan: Plan, ev: Evaluation) -> list[str]:
    """Traffic split over several paths, and the load each route carries per step."""
    out = ["", "## Routing", ""]
    if plan.routing:
        out += ["| phase | pair | path | share | one-way latency ms |", "|---|---|---|---:|---:|"]
        for entry in plan.routing:
            for use in ev.routing.get(entry.key, ()):
                if use.share <= SHARE_EPS:
                    continue
                out.append(
                    f"| {entry.phase} | {entry.key[1][0]}-{entry.key[1][1]} | {use.path.label()} | {use.share:.1%} | {use.path.latency_s * 1e3:.3f} |"  # noqa: E501
                )
        out.append("")
        out.append(
            "A pair's latency is that of its slowest listed path; pairs not listed use their shortest path."  # noqa: E501
        )
    else:
        out.append("Every site pair uses its shortest path.")
    step = ev.step
    if step is not None and (step.route_pp_load or step.route_dp_load):
        per = "step" if ev.sync_mode == "synchronous" else "outer sync"
        out += [
            "",
            f"| route | pipeline GB/step | pipeline s/step | data-parallel GB/{per} | data-parallel s/{per} |",  # noqa: E501
            "|---|---:|---:|---:|---:|",
        ]
        for key in sorted(set(step.route_pp_load) | set(step.route_dp_load)):
            out.append(
                f"| {key[0]}-{key[1]} | {step.route_pp_load.get(key, 0) / 1e9:.3f} | {step.route_pp_s.get(key, 0):.4f} "  # noqa: E501
                f"| {step.route_dp_load.get(key, 0) / 1e9:.3f} | {step.route_dp_s.get(key, 0):.4f} |"  # noqa: E501
            )
        if ev.sync_mode != "synchronous":
            h = problem.instance.job.sync.every_steps
            out += [
                "",
                f"Data-parallel traffic crosses the WAN once per outer sync, every {h} steps ({ev.sync_mode}).",  # noqa: E501
            ]
    return out


def print_simulation(console: Console, problem: Problem, res: Any) -> None:
    """`placer simulate`: the simulated step beside the closed form, term by term, and the
    routes' utilisation (res is a placer.sim.SimulationResult)."""
    t = Table(
        title=f"{problem.name}: one simulated step ({res.replicas} replicas x {res.micro_batches} micro-batches, {res.sync_mode})"  # noqa: E501
    )
    for col in ("component", "simulated s", "closed form s"):
        t.add_column(col, justify="left" if col == "component" else "right")
    for key, v in res.breakdown.items():
        t.add_row(key, f"{v:.4f}", f"{res.closed_breakdown.get(key, 0.0):.4f}")
    t.add_row("step time", f"{res.step_time_s:.4f}", f"{res.closed_form_s:.4f}", style="bold")
    console.print(t)
    console.print(
        f"closed form vs simulation: {res.rel_diff:+.1%} ({'optimistic' if res.rel_diff < 0 else 'pessimistic'})",  # noqa: E501
        highlight=False,
    )
    if res.routes:
        r = Table(title="routes (per direction)")
        for col in ("route", "capacity GB/s", "GB per step", "peak util", "mean util"):
            r.add_column(col, justify="left" if col == "route" else "right")
        for row in res.routes:
            r.add_row(
                " -> ".join(row["route"]),
                f"{row['capacity_Bps'] / 1e9:.1f}",
                f"{row['bytes'] / 1e9:.2f}",
                f"{row['peak_utilisation']:.0%}",
                f"{row['mean_utilisation']:.0%}",
            )
        console.print(r)
    if res.outer_sync_s > 0:
        h = problem.instance.job.sync.every_steps
        peak = max((r["peak_utilisation"] for r in res.outer_routes), default=0.0)
        console.print(
            f"{res.sync_mode} outer exchange: {res.outer_sync_s:.4f} s every {h} steps on its own (busiest route peak {peak:.0%}), priced per step as the evaluator does",  # noqa: E501
            highlight=False,
        )
    longest = res.max_cross_site_transfer_s()
    if longest > 0:
        console.print(
            f"longest cross-site pipeline message: {longest * 1e3:.2f} ms (queueing, shared routes and latency)",  # noqa: E501
            highlight=False,
        )
    if not res.feasible:
        console.print(
            f"[yellow]note:[/yellow] the plan breaks limits the simulation does not model: {'; '.join(res.violations)}",  # noqa: E501
            highlight=False,
        )
    console.print(
        f"{res.flows} flows simulated in {res.wall_s:.2f} s", style="dim", highlight=False
    )


def _hidden_lines(ev: Any) -> list[str]:
    """Communication the step overlaps with compute (not in the additive table above)."""
    hidden = ev.step.hidden if ev.step is not None else {}
    if not any(v > 0 for v in hidden.values()):
        return []
    return [
        "- hidden under compute (job.overlap): "
        + ", ".join(f"{k} {v:.4f} s" for k, v in hidden.items())
    ]


def print_failures(out: Console, fr: Any) -> None:
    """The single-failure table of a FailureReport (placer.resilience)."""
    t = Table(
        title=f"single failures (healthy {fr.healthy_s:.4f} s; plan's collective: {fr.collective})"
    )
    for col in ("class", "where", "what", "ring s", "OptCC s", "bound s"):
        t.add_column(col, justify="right" if col.endswith(" s") else "left")
    fmt = lambda v: f"{v:.5g}" if v < float("inf") else "no capacity"  # noqa: E731
    secs = lambda v: (  # noqa: E731
        f"{v:.5g} s" if v < float("inf") else "no capacity left (the step cannot complete)"
    )  # noqa: E731
    for sc in fr.scenarios:
        t.add_row(
            sc.klass,
            sc.where,
            sc.description + (" [DISCONNECTED]" if sc.disconnected else ""),
            fmt(sc.step_s["ring"]),
            fmt(sc.step_s["optcc"]),
            fmt(sc.step_s["bound"]),
        )
    out.print(t)
    w = fr.worst()
    if w is not None:
        out.print(
            f"worst single failure: {w.klass} at {w.where}: {secs(w.step_s[fr.collective])} under {fr.collective}"  # noqa: E501
            + (
                f" (limit {fr.limit_s:.4f} s: {'ok' if fr.survives else 'EXCEEDED'})"
                if fr.limit_s
                else ""
            )
        )
    for c, v in fr.expected_s.items():
        out.print(f"expected step time over NIC failures with {c}: {v:.4f} s")


def simulate_critical_chain(prob: Problem, ev: Evaluation) -> dict[str, float] | None:
    """The event simulation of the plan's critical chain (1F1B, or interleaved 1F1B for
    v > 1) beside the closed form."""
    from placer.perf.pipeline import simulate_1f1b
    from placer.perf.step import PerfModel

    if ev.step is None or ev.step.critical_chain is None:
        return None
    perf = PerfModel(prob)
    cfg, chain = ev.config, ev.step.critical_chain
    if cfg.dualpipev:
        return None  # no chain-only simulation of it: `placer simulate` runs the whole job
    if cfg.virtual_stages > 1:
        # interleaved: simpy's event simulation of the chain's schedule (placer.sim)
        from placer.sim import simulate_chain

        if cfg.num_micro_batches % cfg.pp:
            return None  # no interleaved schedule (the evaluator names the violation)
        fwd, bwd, lat, tx = perf.chain_times_at(cfg, chain, None, None)
        makespan = simulate_chain(
            fwd, bwd, lat, tx, cfg.num_micro_batches, cfg.virtual_stages
        ) + perf.optimizer_step_s(cfg, chain)
    else:
        st = [perf.stage_times(cfg, prob.instance.site(s).gpu)[k] for k, s in enumerate(chain)]
        lat, tx = (
            zip(
                *[perf.boundary(cfg, a, b) for a, b in zip(chain, chain[1:], strict=False)],
                strict=False,
            )
            if len(chain) > 1
            else ((), ())
        )
        sim = simulate_1f1b(
            [t.fwd for t in st], [t.bwd for t in st], list(lat), list(tx), cfg.num_micro_batches
        )
        # the optimizer step follows the flush
        makespan = sim.makespan_s + perf.optimizer_step_s(cfg, chain)
    closed = perf.chain_time(cfg, chain)
    return {
        "pipeline_s": makespan,
        "closed_form_s": closed,
        "rel_diff": abs(makespan - closed) / closed,
    }


def _cp_ep(cfg: Any, sep: str = " ") -> str:
    """The context- and expert-parallel degrees when used (a replica is tp x cp x ep GPUs
    per stage; Megatron's data-parallel size is dp x ep)."""
    out = ""
    if cfg.cp > 1:
        out += f" x context {cfg.cp}" if sep == " " else f" cp={cfg.cp}"
    if cfg.ep > 1:
        out += f" x expert {cfg.ep}" if sep == " " else f" ep={cfg.ep}"
    if getattr(cfg, "etp", None) is not None:  # folded: ep x etp drawn from the stage's ranks
        out += f" (folded, expert TP {cfg.etp})" if sep == " " else f" etp={cfg.etp}"
    if getattr(cfg, "dp_shard", 1) > 1:  # FSDP shard group (HSDP with the dp replicas)
        out += f" x fsdp {cfg.dp_shard}" if sep == " " else f" dp_shard={cfg.dp_shard}"
    return out
