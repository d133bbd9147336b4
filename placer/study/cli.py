"""`placer sweep` and `placer plot`, added to the main typer app by `register(app)`.

Heavy imports (pandas, matplotlib, dask) happen inside the commands, so registering costs
nothing at start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def sweep(
    study: Annotated[
        Path, typer.Argument(help="study file (YAML): base instance and grid or points")
    ],
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="output folder (default out/sweeps/<study name>)"),
    ] = None,
    executor: Annotated[
        str | None,
        typer.Option(help="local | dask (default local; dask when --scheduler is given)"),
    ] = None,
    workers: Annotated[
        int | None, typer.Option(help="parallel tasks, one solver thread each (default: CPU count)")
    ] = None,
    scheduler: Annotated[
        str | None,
        typer.Option(
            help="dask scheduler address, e.g. tcp://host:8786 (default: a local cluster)"
        ),
    ] = None,
    backend: Annotated[
        str | None, typer.Option(help="cpsat | milp | brute (overrides the study and the instance)")
    ] = None,
    time_limit: Annotated[
        float | None, typer.Option("--time-limit", help="seconds per point")
    ] = None,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="no progress bar")] = False,
) -> None:
    """Solve every point of a study; resumable; writes DIR/points/*.json and DIR/results.csv.

    Exit 0 when every point was solved or proved infeasible, 1 when some points failed
    (status error; re-run to retry them), 2 for a bad study file or option."""
    from placer.cli_support import err, out
    from placer.errors import InputError
    from placer.study.sweep import load_study, run_sweep

    if backend is not None and backend not in {"cpsat", "milp", "brute"}:
        raise InputError(f"--backend: expected cpsat, milp or brute, got '{backend}'")
    from placer.optimize.driver import check_solver_options

    check_solver_options(time_limit, None, ("--time-limit", "--threads"))
    if executor is None:
        executor = "dask" if scheduler else "local"
    if executor not in {"local", "dask"}:
        raise InputError(f"--executor: expected local or dask, got '{executor}'")
    if scheduler and executor != "dask":
        raise InputError("--scheduler: only with --executor dask")
    if workers is not None and workers < 1:
        raise InputError(f"--workers: must be >= 1, got {workers}")
    st = load_study(study).with_settings(backend=backend, time_limit_s=time_limit)
    folder = output or Path("out") / "sweeps" / st.name
    err.print(
        f"[dim]{st.name}: {len(st.points)} points from {st.base_path} -> {folder}[/dim]",
        highlight=False,
    )
    try:
        res = run_sweep(
            st, folder, executor=executor, workers=workers, scheduler=scheduler, progress=not quiet
        )  # type: ignore[arg-type]
    except KeyboardInterrupt as exc:
        err.print(
            f"[yellow]{exc or 'sweep interrupted'}[/yellow]; finished points are kept in {folder}/points",  # noqa: E501
            highlight=False,
        )
        raise typer.Exit(130) from None
    counts = ", ".join(f"{n} {s}" for s, n in res.counts.items() if n)
    out.print(
        f"{len(res.table)} points ({counts}); solved {len(res.computed)}, reused {len(res.reused)}; "  # noqa: E501
        f"wrote {folder / 'results.csv'}"
        + (" and results.parquet" if (folder / "results.parquet").exists() else ""),
        highlight=False,
    )
    # points whose plan the time limit ended before the proof (issue 12 item 5)
    not_proven = [
        row for _, row in res.table.iterrows() if row["status"] in ("feasible", "time_limit")
    ]
    if not_proven:
        gaps = [float(r["gap"]) for r in not_proven if "gap" in r and r["gap"] == r["gap"]]
        worst = f", largest gap {max(gaps):.1%}" if gaps else ""
        out.print(
            f"{len(not_proven)} point(s) not proven optimal (stopped by the time limit{worst}); "
            "results.csv: status, proven, gap",
            highlight=False,
        )
    failed = res.counts.get("error", 0)
    if failed:
        for _, row in res.table[res.table["status"] == "error"].head(5).iterrows():
            err.print(
                f"[red]failed[/red] {row['point_id']}: {row['message']}",
                highlight=False,
                soft_wrap=True,
            )
        err.print(
            f"[red]{failed} point(s) failed[/red]; re-run the same command to retry them",
            highlight=False,
        )
        raise typer.Exit(1)


def plot(
    results: Annotated[Path, typer.Argument(help="results.csv, results.parquet or a sweep folder")],
    output: Annotated[Path, typer.Option("-o", "--output", help="image file: .png, .svg or .pdf")],
    kind: Annotated[
        str, typer.Option(help="step_time | efficiency | pareto | spare_waves")
    ] = "step_time",
    x: Annotated[
        str | None,
        typer.Option("--x", help="x column (default: the first swept column that varies)"),
    ] = None,
    by: Annotated[
        str | None,
        typer.Option(
            "--by",
            help="group columns, comma-separated (default: the other swept columns that vary)",
        ),
    ] = None,
    y: Annotated[str | None, typer.Option("--y", help="y column (default per kind)")] = None,
    title: Annotated[str | None, typer.Option(help="figure title")] = None,
) -> None:
    """Plot a sweep's results table: step time or efficiency vs a swept column, the Pareto
    front of link capex vs step time, or spare waves under ring vs OptCC."""
    from placer.cli_support import out
    from placer.study.plot import plot_file

    path = plot_file(results, output, kind=kind, x=x, by=by, y=y, title=title)
    out.print(f"wrote {path}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add `sweep` and `plot` to the placer command line."""
    from placer.cli_support import guard

    app.command("sweep")(guard(sweep))
    app.command("plot")(guard(plot))


__all__ = ["plot", "register", "sweep"]
