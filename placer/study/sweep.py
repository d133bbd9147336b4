"""Parameter sweeps over an instance: study files, override paths, execution and results.

A study file (YAML) names a base instance and the points to solve:

    name: distance                      # optional; default: the study file's stem
    base: ../instances/two-campus-100km.yaml   # relative to the study file
    grid:                               # Cartesian product of the lists ...
      routes[0].km: [10, 100, 1000]
      job.sync.mode: [synchronous, diloco]
    # points:                           # ... or an explicit list of override mappings
    #   - {routes[0].km: 10}
    backend: cpsat                      # optional: overrides the instance's solver.backend
    time_limit_s: 20                    # optional: overrides the instance's solver.time_limit_s

Every point is the base instance with its overrides applied; every point is validated
before anything runs (errors name the study file, the line and the override path). Each
point is solved with one solver thread, on a local process pool or on dask.distributed;
its record goes to DIR/points/<id>.json as soon as it finishes (id: a stable hash of the
overrides), so an interrupted sweep resumes where it stopped. DIR/results.csv (and
results.parquet when pyarrow is importable) is the tidy table, one row per point.

The code lives in one module per concern: placer.study.spec (the study file, override
paths, points), placer.study.run (tasks, executors, run_sweep), placer.study.results
(records and the table) and placer.study.progress (the bar). This module is the public
surface they share.
"""

from __future__ import annotations

from placer.study.results import (
    METRIC_ORDER,
    override_columns,
    read_results,
    results_table,
    write_table,
)
from placer.study.run import SweepResult, Task, resilience_columns, run_point, run_sweep
from placer.study.spec import (
    OK_STATUSES,
    RECORD_VERSION,
    STATUSES,
    Point,
    Study,
    StudySpec,
    get_path,
    load_study,
    parse_path,
    point_id,
    set_path,
    study_from_data,
)

__all__ = [
    "METRIC_ORDER",
    "OK_STATUSES",
    "RECORD_VERSION",
    "STATUSES",
    "Point",
    "Study",
    "StudySpec",
    "SweepResult",
    "Task",
    "get_path",
    "load_study",
    "override_columns",
    "parse_path",
    "point_id",
    "read_results",
    "resilience_columns",
    "results_table",
    "run_point",
    "run_sweep",
    "set_path",
    "study_from_data",
    "write_table",
]
