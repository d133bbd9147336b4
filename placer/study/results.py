"""Point records on disk and the tidy results table (results.csv / results.parquet)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from placer.errors import InputError
from placer.io import (
    write_atomic,
)
from placer.study.spec import RECORD_VERSION, Study

if TYPE_CHECKING:
    import pandas as pd


# ----------------------------------------------------------------------------- records and table


def _read_record(path: Path, point_id: str) -> dict[str, Any] | None:
    """A finished record to reuse, or None (missing, edited, wrong shape: recomputed)."""
    from placer.study.records import check

    try:
        if path.stat().st_size > 50_000_000:
            return None
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return check(rec, point_id=point_id, version=RECORD_VERSION)


def _write_record(path: Path, rec: dict[str, Any]) -> None:
    from placer.study.records import seal

    write_atomic(
        path,
        json.dumps(seal(rec), indent=1, sort_keys=False, allow_nan=False, default=_nan_to_none)
        + "\n",
    )


def _nan_to_none(o: Any) -> Any:
    return str(o)


def _write_manifest(out: Path, study: Study) -> None:
    manifest = {
        "name": study.name,
        "study_file": str(study.path) if study.path else None,
        "base": str(study.base_path),
        "backend": study.backend,
        "time_limit_s": study.time_limit_s,
        "columns": study.columns,
        "points": [{"id": p.id, "overrides": p.overrides} for p in study.points],
    }
    write_atomic(out / "study.json", json.dumps(manifest, indent=1, default=str) + "\n")


METRIC_ORDER = [
    "step_time_s",
    "compute_s",
    "memory_bound_s",
    "tp_comm_s",
    "bubble_s",
    "pp_comm_s",
    "dp_sync_s",
    "optimizer_s",
    "tokens_per_s",
    "mfu",
    "capex_usd",
    "cost_per_token_usd",
    "power_mw",
    "sync_mode",
    "layout",
    "sites_used",
    "gpus",
    "tp",
    "pp",
    "dp",
    "micro_batch",
]
TAIL = ["solver_s", "gap"]
# optimal, or infeasible (proven to have no plan); the rest stopped at the time limit or failed
PROVEN_STATUSES = ("optimal", "infeasible")


def _cell(v: Any) -> Any:
    """Override values in the table: scalars as they are, mappings/lists as YAML flow text."""
    if isinstance(v, dict | list):
        return yaml.safe_dump(v, default_flow_style=True, sort_keys=False, width=10_000).strip()
    return v


def results_table(study: Study, records: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """One row per finished point, in study order: point_id, the override columns (where a
    point leaves a path alone: the value in its instance, defaults included), status,
    message, then the metrics."""
    import pandas as pd

    rows = []
    metric_cols: list[str] = []
    for p in study.points:
        rec = records.get(p.id)
        if rec is None:
            continue
        row: dict[str, Any] = {"point_id": p.id}
        for k in study.columns:
            row[k] = _cell(p.values.get(k))
        row["status"] = rec.get("status", "error")
        # a plan the time limit ended before the proof: its status is feasible or time_limit
        # and its gap (the tail column) says how far the bound is (issue 12 item 5)
        row["proven"] = row["status"] in PROVEN_STATUSES
        row["message"] = rec.get("message", "")
        for k, v in (rec.get("metrics") or {}).items():
            row[k] = v
            if k not in metric_cols:
                metric_cols.append(k)
        rows.append(row)
    known = [c for c in METRIC_ORDER if c in metric_cols]
    waves = sorted(c for c in metric_cols if c.startswith("waves["))
    extra = [c for c in metric_cols if c not in known and c not in waves and c not in TAIL]
    tail = [c for c in TAIL if c in metric_cols]
    cols = [
        "point_id",
        *study.columns,
        "status",
        "proven",
        "message",
        *known,
        *waves,
        *extra,
        *tail,
    ]
    df = pd.DataFrame(rows, columns=cols)
    for c in df.columns:  # integer columns stay integers when some rows have no value
        vals = [
            v
            for v in (r.get(c) for r in rows)
            if v is not None and not (isinstance(v, float) and math.isnan(v))
        ]
        if (
            vals
            and all(isinstance(v, int) and not isinstance(v, bool) for v in vals)
            and len(vals) < len(rows)
        ):
            df[c] = df[c].astype("Int64")
    if "step_time_s" not in df:
        for c in ("step_time_s", "tokens_per_s", "mfu", "capex_usd"):
            df[c] = float("nan")
    return df


def write_table(out: Path, table: pd.DataFrame) -> list[Path]:
    """DIR/results.csv, and DIR/results.parquet when pyarrow is importable; both atomic."""
    import importlib.util

    write_atomic(out / "results.csv", table.to_csv(index=False))
    written = [out / "results.csv"]
    if importlib.util.find_spec("pyarrow") is not None:
        df = table.copy()
        for c in df.columns:
            if df[c].dtype == object:
                df[c] = df[c].map(lambda v: v if v is None or isinstance(v, str) else str(v))
        fd, tmp = tempfile.mkstemp(prefix=".results.parquet.", dir=out)
        os.close(fd)
        try:
            df.to_parquet(tmp, index=False)
            os.replace(tmp, out / "results.parquet")
            written.append(out / "results.parquet")
        finally:
            Path(tmp).unlink(missing_ok=True)
    return written


def read_results(path: str | os.PathLike[str]) -> pd.DataFrame:
    """A results table from results.csv / results.parquet, or a sweep folder."""
    import pandas as pd

    p = Path(path)
    if p.is_dir():
        p = p / "results.csv"
    if not p.is_file():
        raise InputError(f"{p}: file not found")
    try:
        if p.suffix == ".parquet":
            return pd.read_parquet(p)
        return pd.read_csv(p, keep_default_na=True)
    except Exception as exc:  # noqa: BLE001 - any reader failure is bad input
        raise InputError(f"{p}: cannot read results table ({type(exc).__name__}: {exc})") from None


def override_columns(table: pd.DataFrame) -> list[str]:
    """The override columns of a results table: those between point_id and status."""
    cols = list(table.columns)
    if "point_id" in cols and "status" in cols:
        return cols[cols.index("point_id") + 1 : cols.index("status")]
    return [c for c in cols if ("." in c or "[" in c) and not c.startswith("waves[")]
