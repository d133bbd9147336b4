"""Command line: a thin shell over the Python API (CONTRACT section 4).

Exit codes: 0 success, 2 bad input, 3 infeasible, 4 time limit with no plan, 1 internal.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from placer.errors import InputError, PlacerError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="placer: plan multi-site AI training jobs.")
err = Console(stderr=True)
out = Console()


def _clip_lines(text: str) -> str:
    """No line of a message longer than MESSAGE_LINE_CHARS (a hostile value is not echoed whole)."""
    from placer.limits import MESSAGE_LINE_CHARS

    return "\n".join(ln if len(ln) <= MESSAGE_LINE_CHARS else f"{ln[:MESSAGE_LINE_CHARS]}... ({len(ln):,} characters)" for ln in text.splitlines())


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map placer errors to exit codes; never show a traceback for bad input."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from placer._entry import command_started

        command_started()
        try:
            return fn(*args, **kwargs)
        except PlacerError as exc:
            err.print(Text("error: ", style="red") + Text(_clip_lines(str(exc))), highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except typer.Exit:
            raise
        except KeyboardInterrupt:  # Ctrl-C before the handlers are in place (start-up)
            err.print(Text("interrupted", style="red"), highlight=False)
            raise typer.Exit(130) from None
        except Exception as exc:  # noqa: BLE001
            if os.environ.get("PLACER_DEBUG"):
                raise
            err.print(Text("internal error: ", style="red") + Text(_clip_lines(f"{type(exc).__name__}: {exc} (set PLACER_DEBUG=1 for a traceback)")), soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


@app.command()
@_guard
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
            err.print(Text("invalid ", style="red") + Text(_clip_lines(str(exc))), highlight=False, soft_wrap=True)
    if bad:
        raise typer.Exit(2)


@app.command()
@_guard
def solve(
    instance: Path,
    output: Annotated[str | None, typer.Option("-o", "--output", help="output folder (default out/<instance name>)")] = None,
    backend: Annotated[str | None, typer.Option(help="cpsat | milp | brute")] = None,
    time_limit: Annotated[float | None, typer.Option("--time-limit", help="seconds")] = None,
    threads: Annotated[int | None, typer.Option(help="solver threads")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan only, to stdout")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="print the catalog and defaults in use")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="no progress on stderr")] = False,
) -> None:
    """Find the best plan; write plan.json, bom.csv and report.md."""
    from placer import interrupt
    from placer.io import load_instance
    from placer.optimize.driver import solve as run
    from placer.outputs.fileset import output_folder

    if backend is not None and backend not in {"cpsat", "milp", "brute"}:
        raise InputError(f"--backend: expected cpsat, milp or brute, got '{backend}'")
    if time_limit is not None and time_limit <= 0:
        raise InputError(f"--time-limit: must be > 0, got {time_limit}")
    folder_arg = output_folder(output, Path("."))  # refuse -o "" before any work
    prob = load_instance(instance)
    if explain:
        err.print_json(json.dumps({"catalog": prob.catalog.model_dump(), "instance": prob.instance.model_dump(mode="json")}))
    progress = None if quiet else (lambda msg: err.print(Text(msg, style="dim"), highlight=False))
    with interrupt.handle_signals():
        res = run(prob, backend=backend, time_limit_s=time_limit, threads=threads, progress=progress)
        _write_solve(prob, res, output, folder_arg, as_json)
    stop = interrupt.requested()
    if stop:
        err.print(Text(f"interrupted by {stop}: kept the best plan found ({res.status}, gap {res.gap:.1e})", style="yellow"), highlight=False)
        raise typer.Exit(interrupt.EXIT_CODE)


def _write_solve(prob: Any, res: Any, output: str | None, folder_arg: Path, as_json: bool) -> None:
    from placer.io import dumps_json
    from placer.outputs.bom import bom_csv
    from placer.outputs.fileset import write_set
    from placer.outputs.report import markdown_report, print_summary

    plan_data = res.plan.model_dump(mode="json", exclude_none=True)
    if as_json:
        sys.stdout.write(dumps_json(plan_data))
        return
    folder = folder_arg if output is not None else Path("out") / prob.name
    files = {
        "plan.json": dumps_json(plan_data),
        "bom.csv": bom_csv(prob, res.plan),
        "report.md": markdown_report(prob, res.plan, res.evaluation, plan_data.get("solver")),
    }
    write_set(folder, files, run={"command": "solve", "instance": prob.name, "status": res.status})
    print_summary(out, prob, res.plan, res.evaluation, f"{res.status} ({res.backend}, {res.seconds:.2f} s, gap {res.gap:.1e})")
    out.print(f"wrote {folder / 'plan.json'}, {folder / 'bom.csv'}, {folder / 'report.md'}", highlight=False)


@app.command()
@_guard
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
    from placer.outputs.report import print_summary

    prob = load_instance(instance)
    p = load_plan(plan)
    ev = run(prob, p)
    sim = _simulate(prob, ev) if simulate else None
    fr = None
    if failures and ev.step is not None:
        from placer.resilience import failure_report

        fr = failure_report(prob, p)
    if as_json:
        data = ev.to_dict()
        if sim is not None:
            data["simulation"] = sim
        if fr is not None:
            data["failures"] = fr.to_dict()
        from placer.io import dumps_json

        sys.stdout.write(dumps_json(data, default=_json_default))
    else:
        print_summary(out, prob, p, ev, "feasible" if ev.feasible else "INFEASIBLE")
        if fr is not None:
            _print_failures(fr)
        if sim is not None:
            out.print(f"1F1B simulation of the critical chain: {sim['pipeline_s']:.4f} s (closed form {sim['closed_form_s']:.4f} s, diff {sim['rel_diff']:.2e})")
    if not ev.feasible:
        raise typer.Exit(3)


def _print_failures(fr: Any) -> None:
    from rich.table import Table

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


def _simulate(prob: Any, ev: Any) -> dict[str, float] | None:
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


def _json_default(o: Any) -> Any:
    if isinstance(o, tuple | set):
        return list(o)
    return str(o)


@app.command()
@_guard
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
@_guard
def export(
    plan: Annotated[Path, typer.Argument(help="plan.json written by solve")],
    instance: Annotated[Path, typer.Option("--instance", "-i", help="the instance the plan was made for")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="bom | rankmap | megatron | torchtitan | torchrun | slurm | all")],
    output: Annotated[str | None, typer.Option("-o", "--output", help="output folder (default out/<instance name>)")] = None,
) -> None:
    """Write the link bill of materials or launch configurations of a feasible plan."""
    from placer.io import load_instance, load_plan
    from placer.outputs.export import export as run
    from placer.outputs.fileset import output_folder

    folder_arg = output_folder(output, Path("."))
    prob = load_instance(instance)
    p = load_plan(plan)
    for path in run(prob, p, fmt, folder_arg if output is not None else Path("out") / prob.name):
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
