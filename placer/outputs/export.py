"""`placer export`: write a plan's link BOM and launch configurations.

    export(problem, plan, fmt, outdir) -> list[Path]

Formats and the files they write (all inside `outdir`):

- ``bom``: bom.csv, bom.json, bom.md (placer.outputs.bom)
- ``rankmap``: rankmap.json, rankmap.csv (one row per global rank)
- ``megatron``: megatron_args.sh, megatron_hosts.txt
- ``torchtitan``: torchtitan_args.sh (0.3+, default) or torchtitan.toml (``torchtitan_version="0.2"``), torchtitan_hosts.txt
- ``torchrun``: torchrun_<site>.sh and hosts_<site>.txt per site in use
- ``slurm``: slurm_hostfile.txt, slurm_nodes.txt, slurm.sbatch
- ``all``: every one of the above

The plan is evaluated first: an infeasible plan is bad input (InputError naming every
violation). Every text is generated before anything is written, and each file is written
with the folder's other files as one set (placer.outputs.fileset), so a failure never
leaves a partial file or a mix of two runs.
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from placer.errors import InputError
from placer.evaluate import evaluate
from placer.io import Problem, plan_from_data
from placer.outputs import launch
from placer.outputs.bom import bom_data, csv_of, json_of, markdown_of
from placer.schema import Plan


def _bom(problem: Problem, plan: Plan) -> dict[str, str]:
    data = bom_data(problem, plan)
    return {"bom.csv": csv_of(data), "bom.json": json_of(data), "bom.md": markdown_of(data)}


LAYOUT_FORMATS: dict[str, Callable[[launch.Layout], dict[str, str]]] = {
    "rankmap": launch.rankmap_files,
    "megatron": launch.megatron_files,
    "torchtitan": launch.torchtitan_files,
    "torchrun": launch.torchrun_files,
    "slurm": launch.slurm_files,
}
FORMAT_NAMES = ["bom", *LAYOUT_FORMATS, "all"]


def render(
    problem: Problem, plan: Plan | dict[str, Any], fmt: str, torchtitan_version: str = "0.3"
) -> dict[str, str]:
    """File name -> text for a format, after checking the plan is feasible."""
    if fmt not in FORMAT_NAMES:
        raise InputError(f"--format: unknown format '{fmt}' (formats: {', '.join(FORMAT_NAMES)})")
    if torchtitan_version not in launch.TORCHTITAN_VERSIONS:
        raise InputError(
            f"--torchtitan-version: expected one of {', '.join(launch.TORCHTITAN_VERSIONS)}, got '{torchtitan_version}'"  # noqa: E501
        )
    plan = plan_from_data(plan)
    ev = evaluate(problem, plan)
    if not ev.feasible:
        lines = list(dict.fromkeys(f"  - {v.kind}: {v.where}: {v.message}" for v in ev.violations))
        other = (
            f" (the plan names instance '{plan.instance}')"
            if plan.instance and plan.instance != problem.name
            else ""
        )
        raise InputError(
            f"the plan is not feasible for instance '{problem.name}'{other}; export needs a feasible plan:\n"  # noqa: E501
            + "\n".join(lines)
        )
    names = [n for n in FORMAT_NAMES if n != "all"] if fmt == "all" else [fmt]
    files: dict[str, str] = {}
    if "bom" in names:
        files.update(_bom(problem, plan))
    if any(n in LAYOUT_FORMATS for n in names):
        layout = launch.build_layout(problem, plan)
        for n in names:
            if n == "torchtitan":
                files.update(launch.torchtitan_files(layout, torchtitan_version))
            elif n in LAYOUT_FORMATS:
                files.update(LAYOUT_FORMATS[n](layout))
    return files


def export(
    problem: Problem,
    plan: Plan | dict[str, Any],
    fmt: str,
    outdir: str | Path,
    torchtitan_version: str = "0.3",
) -> list[Path]:
    """Write the files of `fmt` into `outdir`; return their paths."""
    from placer.outputs.fileset import write_set

    files = render(problem, plan, fmt, torchtitan_version)
    # added to the folder's set (solve's plan.json stays), the whole set swapped in at once
    return write_set(
        Path(outdir), files, keep_others=True, run={"command": "export", "format": fmt}
    )


__all__ = ["FORMAT_NAMES", "LAYOUT_FORMATS", "export", "render"]
