"""Command line: a thin shell over the Python API (CONTRACT section 4).

Exit codes: 0 success, 2 bad input, 3 infeasible, 4 time limit with no plan, 1 internal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from placer.cli_support import err, guard, json_default, out
from placer.errors import InputError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="placer: plan multi-site AI training jobs.")


@app.command()
@guard
def validate(instances: Annotated[list[Path], typer.Argument(help="instance files")]) -> None:
    """Check instance files: schema, cross-field rules, catalog and model references."""
    from placer.io import load_instance

    bad = 0
    for p in instances:
        try:
            prob = load_instance(p)
            out.print(f"[green]ok[/green] {p} ({prob.name}: {len(prob.instance.sites)} sites, model {prob.model.name})", highlight=False)
        except InputError as exc:
            bad += 1
            err.print(Text("invalid ", style="red") + Text(str(exc)), highlight=False, soft_wrap=True)
    if bad:
        raise typer.Exit(2)


@app.command()
@guard
def solve(
    instance: Path,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="output folder (default out/<instance name>)")] = None,
    backend: Annotated[str | None, typer.Option(help="cpsat | milp | brute")] = None,
    time_limit: Annotated[float | None, typer.Option("--time-limit", help="seconds")] = None,
    threads: Annotated[int | None, typer.Option(help="solver threads")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan only, to stdout")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="print the catalog and defaults in use")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="no progress on stderr")] = False,
) -> None:
    """Find the best plan; write plan.json, bom.csv and report.md."""
    from placer.io import load_instance, write_atomic, write_json
    from placer.optimize.driver import check_solver_options
    from placer.optimize.driver import solve as run
    from placer.outputs.bom import bom_csv
    from placer.outputs.report import markdown_report, print_summary

    if backend is not None and backend not in {"cpsat", "milp", "brute"}:
        raise InputError(f"--backend: expected cpsat, milp or brute, got '{backend}'")
    check_solver_options(time_limit, threads, ("--time-limit", "--threads"))
    prob = load_instance(instance)
    if explain:
        err.print_json(json.dumps({"catalog": prob.catalog.model_dump(), "instance": prob.instance.model_dump(mode="json")}))
    progress = None if quiet else (lambda msg: err.print(Text(msg, style="dim"), highlight=False))
    res = run(prob, backend=backend, time_limit_s=time_limit, threads=threads, progress=progress)
    plan_data = res.plan.model_dump(mode="json", exclude_none=True)
    if as_json:
        sys.stdout.write(json.dumps(plan_data, indent=2) + "\n")
        return
    folder = output or Path("out") / prob.name
    write_json(folder / "plan.json", plan_data)
    write_atomic(folder / "bom.csv", bom_csv(prob, res.plan))
    write_atomic(folder / "report.md", markdown_report(prob, res.plan, res.evaluation, plan_data.get("solver")))
    print_summary(out, prob, res.plan, res.evaluation, f"{res.status} ({res.backend}, {res.seconds:.2f} s, gap {res.gap:.1e})")
    out.print(f"wrote {folder / 'plan.json'}, {folder / 'bom.csv'}, {folder / 'report.md'}", highlight=False)


@app.command()
@guard
def evaluate(
    instance: Path,
    plan: Path,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    simulate: Annotated[bool, typer.Option("--simulate", help="also run the 1F1B event simulator")] = False,
    failures: Annotated[bool, typer.Option("--failures", help="step time under every single failure (ring, OptCC, bound)")] = False,
) -> None:
    """Check a plan against every limit and compute its step time, power and cost.

    Exit 0 when the plan is feasible, 3 when it breaks a limit (all violations listed)."""
    from placer.evaluate import evaluate as run
    from placer.io import load_instance, load_plan
    from placer.outputs.report import print_failures, print_summary, simulate_critical_chain

    prob = load_instance(instance)
    p = load_plan(plan)
    ev = run(prob, p)
    sim = simulate_critical_chain(prob, ev) if simulate else None
    fr = None
    if failures and ev.step is not None:
        from placer.resilience import failure_report

        fr = failure_report(prob, ev)
    if as_json:
        data = ev.to_dict()
        if sim is not None:
            data["simulation"] = sim
        if fr is not None:
            data["failures"] = fr.to_dict()
        sys.stdout.write(json.dumps(data, indent=2, default=json_default) + "\n")
    else:
        print_summary(out, prob, p, ev, "feasible" if ev.feasible else "INFEASIBLE")
        if fr is not None:
            print_failures(out, fr)
        if sim is not None:
            out.print(f"1F1B simulation of the critical chain: {sim['pipeline_s']:.4f} s (closed form {sim['closed_form_s']:.4f} s, diff {sim['rel_diff']:.2e})")
    if not ev.feasible:
        raise typer.Exit(3)


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
    instance: Annotated[Path, typer.Option("--instance", "-i", help="the instance the plan was made for")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="bom | rankmap | megatron | torchtitan | torchrun | slurm | all")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="output folder (default out/<instance name>)")] = None,
) -> None:
    """Write the link bill of materials or launch configurations of a feasible plan."""
    from placer.io import load_instance, load_plan
    from placer.outputs.export import export as run

    prob = load_instance(instance)
    p = load_plan(plan)
    for path in run(prob, p, fmt, output or Path("out") / prob.name):
        out.print(f"wrote {path}", highlight=False)


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
