"""Capacity-procurement studies: parameter sweeps (local processes or dask.distributed),
tidy results tables and plots.

    from placer.study import load_study, run_sweep, plot_results
    study = load_study("notebooks/studies/distance.yaml")
    res = run_sweep(study, "out/sweeps/distance", workers=4)
    fig = plot_results(res.table, "step_time", x="routes[0].km", by="policy")

Attributes are imported lazily: `import placer.study.cli` (the command-line hook) does not
import pandas, matplotlib or dask.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Study": "placer.study.sweep",
    "StudySpec": "placer.study.sweep",
    "SweepResult": "placer.study.sweep",
    "load_study": "placer.study.sweep",
    "study_from_data": "placer.study.sweep",
    "run_sweep": "placer.study.sweep",
    "run_point": "placer.study.sweep",
    "read_results": "placer.study.sweep",
    "point_id": "placer.study.sweep",
    "plot_results": "placer.study.plot",
    "plot_file": "placer.study.plot",
    "pareto_mask": "placer.study.plot",
    "save_figure": "placer.study.plot",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'placer.study' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
