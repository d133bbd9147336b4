"""Command line: a thin shell over the Python API (CONTRACT section 4).

Exit codes: 0 success, 2 bad input, 3 infeasible, 4 time limit with no plan, 1 internal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from placer.cli_support import clip_lines, err, guard, json_default, out
from placer.errors import InfeasibleError, InputError

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="placer: plan multi-site AI training jobs."
)


@app.command()
@guard
def validate(instances: Annotated[list[Path], typer.Argument(help="instance files")]) -> None:
    """Check instance files: schema, cross-field rules, catalog and model references."""
    from placer.diagnostics import instance_warnings
    from placer.io import load_instance

    bad = 0
    for p in instances:
        try:
            prob = load_instance(p)
            out.print(
                f"[green]ok[/green] {p} ({prob.name}: {len(prob.instance.sites)} sites, model {prob.model.name})",  # noqa: E501
                highlight=False,
            )
            _print_warnings(instance_warnings(prob))
        except InputError as exc:
            bad += 1
            err.print(
                Text("invalid ", style="red") + Text(clip_lines(str(exc))),
                highlight=False,
                soft_wrap=True,
            )
    if bad:
        raise typer.Exit(2)


@app.command()
@guard
def solve(
    instance: Path,
    output: Annotated[
        str | None,
        typer.Option("-o", "--output", help="output folder (default out/<instance name>)"),
    ] = None,
    backend: Annotated[str | None, typer.Option(help="cpsat | milp | brute")] = None,
    time_limit: Annotated[float | None, typer.Option("--time-limit", help="seconds")] = None,
    threads: Annotated[int | None, typer.Option(help="solver threads")] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="stdout carries only the plan as one JSON document (with -o the files are written too)",  # noqa: E501
        ),
    ] = False,
    explain: Annotated[
        bool, typer.Option("--explain", help="print the catalog and defaults in use")
    ] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="no progress on stderr")] = False,
) -> None:
    """Find the best plan; write plan.json, bom.csv, report.md and report.html."""
    from placer.optimize.deadline import command_start, output_reserve_s

    # the time limit bounds the whole command: start-up and loading count, and writing the
    # outputs gets its reserve (issue 15 item 3)
    started = command_start()
    from placer import interrupt
    from placer.io import load_instance
    from placer.optimize.driver import check_solver_options
    from placer.optimize.driver import solve as run
    from placer.outputs.fileset import output_folder

    if backend is not None and backend not in {"cpsat", "milp", "brute"}:
        raise InputError(f"--backend: expected cpsat, milp or brute, got '{backend}'")
    check_solver_options(time_limit, threads, ("--time-limit", "--threads"))
    folder_arg = output_folder(output, Path("."))  # refuse -o "" before any work
    prob = load_instance(instance)
    if explain:
        err.print_json(
            json.dumps(
                {
                    "catalog": prob.catalog.model_dump(),
                    "instance": prob.instance.model_dump(mode="json"),
                }
            )
        )
    progress = None if quiet else (lambda msg: err.print(Text(msg, style="dim"), highlight=False))
    with interrupt.handle_signals():
        limit = time_limit if time_limit is not None else prob.instance.solver.time_limit_s
        res = run(
            prob,
            backend=backend,
            time_limit_s=time_limit,
            threads=threads,
            progress=progress,
            deadline_at=started + limit - output_reserve_s(limit, len(prob.instance.sites)),
        )
        _write_solve(prob, res, output, folder_arg, as_json)
    stop = interrupt.requested()
    if stop:
        err.print(
            Text(
                f"interrupted by {stop}: kept the best plan found ({res.status}, gap {res.gap:.1e})",  # noqa: E501
                style="yellow",
            ),
            highlight=False,
        )
        raise typer.Exit(interrupt.EXIT_CODE)


def _write_solve(prob: Any, res: Any, output: str | None, folder_arg: Path, as_json: bool) -> None:
    from placer.io import dumps_json
    from placer.outputs.bom import bom_csv
    from placer.outputs.fileset import write_set
    from placer.outputs.html import html_report
    from placer.outputs.report import markdown_report, print_summary

    plan_data = res.plan.model_dump(mode="json", exclude_none=True)
    if as_json and output is None:
        _print_warnings(res.plan.warnings)
        sys.stdout.write(dumps_json(plan_data))
        return
    folder = folder_arg if output is not None else Path("out") / prob.name
    files = {
        "plan.json": dumps_json(plan_data),
        "bom.csv": bom_csv(prob, res.plan),
        "report.md": markdown_report(prob, res.plan, res.evaluation, plan_data.get("solver")),
        "report.html": html_report(prob, res.plan, res.evaluation, plan_data.get("solver")),
    }
    write_set(folder, files, run={"command": "solve", "instance": prob.name, "status": res.status})
    if as_json:  # --json -o DIR: the files above, and stdout still carries only the plan
        _print_warnings(res.plan.warnings)
        sys.stdout.write(dumps_json(plan_data))
        return
    print_summary(
        out,
        prob,
        res.plan,
        res.evaluation,
        f"{res.status} ({res.backend}, {res.seconds:.2f} s, gap {res.gap:.1e})",
    )
    _print_warnings(res.plan.warnings)
    out.print(
        f"wrote {folder / 'plan.json'}, {folder / 'bom.csv'}, {folder / 'report.md'}, {folder / 'report.html'}",  # noqa: E501
        highlight=False,
    )


@app.command()
@guard
def evaluate(
    instance: Path,
    plan: Path,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    simulate: Annotated[
        bool, typer.Option("--simulate", help="also run the 1F1B event simulator")
    ] = False,
    failures: Annotated[
        bool,
        typer.Option(
            "--failures", help="step time under every single failure (ring, OptCC, bound)"
        ),
    ] = False,
) -> None:
    """Check a plan against every limit and compute its step time, power and cost.

    Exit 0 when the plan is feasible, 3 when it breaks a limit (all violations listed)."""
    from placer.diagnostics import instance_warnings, plan_warnings
    from placer.evaluate import evaluate as run
    from placer.io import load_instance, load_plan
    from placer.outputs.report import print_failures, print_summary, simulate_critical_chain

    prob = load_instance(instance)
    p = load_plan(plan)
    ev = run(prob, p)
    warnings = instance_warnings(prob) + plan_warnings(prob, p, ev)
    sim = simulate_critical_chain(prob, ev) if simulate else None
    fr = None
    if failures and ev.step is not None:
        from placer.resilience import failure_report

        fr = failure_report(prob, ev)
    if as_json:
        data = ev.to_dict()
        data["warnings"] = [w.model_dump() for w in warnings]
        if sim is not None:
            data["simulation"] = sim
        if fr is not None:
            data["failures"] = fr.to_dict()
        from placer.io import dumps_json

        sys.stdout.write(dumps_json(data, default=json_default))
    else:
        print_summary(out, prob, p, ev, "feasible" if ev.feasible else "INFEASIBLE")
        _print_warnings(warnings)
        if fr is not None:
            print_failures(out, fr)
        if sim is not None:
            out.print(
                f"1F1B simulation of the critical chain: {sim['pipeline_s']:.4f} s (closed form {sim['closed_form_s']:.4f} s, diff {sim['rel_diff']:.2e})"  # noqa: E501
            )
    if not ev.feasible:
        raise typer.Exit(3)


@app.command()
@guard
def simulate(
    instance: Path,
    plan: Path,
    as_json: Annotated[
        bool, typer.Option("--json", help="print one JSON document to stdout")
    ] = False,
    dp_buckets: Annotated[
        int | None,
        typer.Option(
            "--dp-buckets",
            help="default: the plan's job.overlap with Megatron's bucket size; 0: no overlap (each stage syncs after its schedule); N: overlap, the first chunk's gradients in N buckets",  # noqa: E501
        ),
    ] = None,
    virtual_stages: Annotated[
        int | None,
        typer.Option(
            "--virtual-stages",
            help="interleaved 1F1B chunks per device, overriding the plan's parallelism.virtual_stages (default: the plan's) for the simulation and the closed form alike",  # noqa: E501
        ),
    ] = None,
) -> None:
    """Simulate one training step event by event (every replica, micro-batch and transfer,
    max-min fair sharing of the routes) and compare it with the evaluator's closed form."""
    from placer.io import load_instance, load_plan
    from placer.outputs.report import print_simulation
    from placer.sim import SimOptions
    from placer.sim import simulate as run

    prob = load_instance(instance)
    p = load_plan(plan)
    res = run(prob, p, SimOptions(dp_buckets=dp_buckets, virtual_stages=virtual_stages))
    if as_json:
        sys.stdout.write(json.dumps(res.to_dict(), indent=2) + "\n")
    else:
        print_simulation(out, prob, res)


def _print_warnings(warnings: list[Any]) -> None:
    """Warnings go to stderr, so that --json output stays one JSON document."""
    for w in warnings:
        err.print(
            Text("warning: ", style="yellow") + Text(f"{w.kind}: {w.message}"),
            highlight=False,
            soft_wrap=True,
        )


@app.command()
@guard
def schema(
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write to a file")] = None,
    kind: Annotated[str, typer.Option(help="instance | model | plan")] = "instance",
) -> None:
    """Print the JSON Schema (defaults and the built-in catalog included)."""
    from placer.io import write_atomic
    from placer.schema_export import schema_json

    if kind not in {"instance", "model", "plan"}:
        raise InputError(f"--kind: expected instance, model or plan, got '{kind}'")
    text = schema_json(kind)
    if output:
        write_atomic(output, text)
    else:
        sys.stdout.write(text)


@app.command()
@guard
def export(
    plan: Annotated[Path, typer.Argument(help="plan.json written by solve")],
    instance: Annotated[
        Path, typer.Option("--instance", "-i", help="the instance the plan was made for")
    ],
    fmt: Annotated[
        str,
        typer.Option(
            "--format", "-f", help="bom | rankmap | megatron | torchtitan | torchrun | slurm | all"
        ),
    ],
    output: Annotated[
        str | None,
        typer.Option("-o", "--output", help="output folder (default out/<instance name>)"),
    ] = None,
    torchtitan_version: Annotated[
        str,
        typer.Option(
            "--torchtitan-version",
            help="0.3 (config registry + overrides, torchtitan_args.sh) | 0.2 (TOML)",
        ),
    ] = "0.3",
) -> None:
    """Write the link bill of materials or launch configurations of a feasible plan."""
    from placer.io import load_instance, load_plan
    from placer.outputs.export import export as run
    from placer.outputs.fileset import output_folder

    folder_arg = output_folder(output, Path("."))
    prob = load_instance(instance)
    p = load_plan(plan)
    for path in run(
        prob,
        p,
        fmt,
        folder_arg if output is not None else Path("out") / prob.name,
        torchtitan_version,
    ):
        out.print(f"wrote {path}", highlight=False)


@app.command()
@guard
def frontier(
    instance: Path,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="output folder (default out/<instance name>/frontier)"),
    ] = None,
    backend: Annotated[str | None, typer.Option(help="cpsat | milp | brute")] = None,
    time_limit: Annotated[
        float | None, typer.Option("--time-limit", help="seconds per solve (two solves per point)")
    ] = None,
    max_points: Annotated[
        int, typer.Option("--max-points", min=1, help="stop after this many points")
    ] = 50,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="no progress on stderr")] = False,
) -> None:
    """Trace the exact link-capex vs step-time Pareto front; write frontier.csv and frontier.png."""
    from rich.table import Table

    from placer.io import load_instance
    from placer.study.frontier import frontier as run
    from placer.study.frontier import write_frontier

    if backend is not None and backend not in {"cpsat", "milp", "brute"}:
        raise InputError(f"--backend: expected cpsat, milp or brute, got '{backend}'")
    prob = load_instance(instance)
    progress = None if quiet else (lambda msg: err.print(Text(msg, style="dim"), highlight=False))
    points = run(
        prob, backend=backend, time_limit_s=time_limit, max_points=max_points, progress=progress
    )
    if not points:
        raise InfeasibleError(f"instance '{prob.name}' has no feasible plan: the front is empty")
    t = Table(title=f"Pareto front: {prob.name}")
    for col in ("capex USD", "step s", "waves", "tp x pp x dp", "status", ""):
        t.add_column(col, justify="right" if col in {"capex USD", "step s", "waves"} else "left")
    for p in points:
        r = p.row()
        t.add_row(
            f"{r['capex_usd']:,.0f}",
            f"{r['step_time_s']:.4f}",
            str(r["waves"]),
            f"{r['tp']} x {r['pp']} x {r['dp']}",
            r["status"],
            "knee" if p.knee else "",
        )
    out.print(t)
    for path in write_frontier(
        points,
        output or Path("out") / prob.name / "frontier",
        f"{prob.name}: link capex vs step time",
    ):
        out.print(f"wrote {path}", highlight=False)


@app.command("plot-plan")
@guard
def plot_plan(
    plan: Annotated[Path, typer.Argument(help="plan.json written by solve")],
    instance: Annotated[
        Path, typer.Option("--instance", "-i", help="the instance the plan was made for")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="picture to write (.svg or .png)")],
) -> None:
    """Draw a plan: sites, routes with their waves and load, and where the stages run."""
    from placer.evaluate import evaluate as run
    from placer.io import load_instance, load_plan
    from placer.outputs.figure import write_plan_figure

    prob = load_instance(instance)
    p = load_plan(plan)
    out.print(f"wrote {write_plan_figure(prob, p, run(prob, p), output)}", highlight=False)


def _register_study_commands() -> None:
    """`placer sweep` and `placer plot` live in placer.study (pandas, matplotlib, dask are
    imported only when those commands run)."""
    from placer.study.cli import register

    register(app)


_register_study_commands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
