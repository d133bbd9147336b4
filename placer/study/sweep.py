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
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import json
import logging
import math
import os
import re
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from placer.errors import InputError, PlacerError
from placer.io import (
    Loc,
    Problem,
    clean_loc,
    format_loc,
    line_for,
    problem_from_data,
    read_document,
    validation_message,
    write_atomic,
)
from placer.schema import NAME_PATTERN, Instance

if TYPE_CHECKING:
    import pandas as pd

STATUSES = ("optimal", "feasible", "time_limit", "infeasible", "error")
OK_STATUSES = ("optimal", "feasible", "time_limit")  # a plan exists (time_limit: maybe not)
RECORD_VERSION = 1

# ----------------------------------------------------------------------------- study file


class StudySpec(BaseModel):
    """The study file (strict: unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(default=None, pattern=NAME_PATTERN)
    description: str | None = None
    base: str = Field(min_length=1, description="instance file, relative to the study file")
    grid: dict[str, list[Any]] | None = Field(default=None, description="override path -> values (Cartesian product)")
    points: list[dict[str, Any]] | None = Field(default=None, description="explicit list of override mappings")
    backend: Literal["cpsat", "milp", "brute"] | None = None
    time_limit_s: float | None = Field(default=None, gt=0)

    @field_validator("grid")
    @classmethod
    def _grid_lists(cls, v: dict[str, list[Any]] | None) -> dict[str, list[Any]] | None:
        for k, values in (v or {}).items():
            if not values:
                raise ValueError(f"grid.{k}: list of values must not be empty")
        return v

    @field_validator("points")
    @classmethod
    def _points_nonempty(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if v is not None and not v:
            raise ValueError("points: list must not be empty")
        return v

    @model_validator(mode="after")
    def _grid_xor_points(self) -> StudySpec:
        if (self.grid is None) == (self.points is None):
            raise ValueError("give exactly one of grid: (mapping path -> list of values) or points: (list of mappings)")
        return self


_KEY = r"[A-Za-z0-9_+\-]+"
_PATH_RE = re.compile(rf"^{_KEY}(\[\d+\])*(\.{_KEY}(\[\d+\])*)*$")


def parse_path(text: str) -> Loc:
    """`routes[0].km` -> ('routes', 0, 'km'). Raises ValueError on bad syntax."""
    if not isinstance(text, str) or not _PATH_RE.match(text):
        raise ValueError(f"'{text}' is not a field path (expected e.g. routes[0].km, job.sync.mode)")
    out: list[Any] = []
    for part in text.split("."):
        name, *idx = part.split("[")
        out.append(name)
        out.extend(int(i.rstrip("]")) for i in idx)
    return tuple(out)


def _describe(v: Any) -> str:
    return type(v).__name__ if v is not None else "null"


def set_path(data: dict[str, Any], loc: Loc, value: Any) -> None:
    """Set `value` at `loc` inside plain YAML data, creating mappings that are absent or
    null (e.g. `resilience.max_slowdown` on an instance without resilience). List indices
    must exist. Raises ValueError naming the part of the path that cannot be addressed."""
    node: Any = data
    for depth, part in enumerate(loc):
        last = depth == len(loc) - 1
        here = format_loc(loc[:depth]) or "(instance)"
        if isinstance(part, int):
            if not isinstance(node, list):
                raise ValueError(f"{here} is {_describe(node)} in the base instance, not a list: cannot index [{part}]")
            if part >= len(node):
                raise ValueError(f"{format_loc(loc[: depth + 1])}: index out of range ({here} has {len(node)} entries)")
            if last:
                node[part] = copy.deepcopy(value)
            else:
                node = node[part]
            continue
        if not isinstance(node, dict):
            raise ValueError(f"{here} is {_describe(node)} ({node!r}) in the base instance, not a mapping: cannot address .{part}")
        if last:
            node[part] = copy.deepcopy(value)
        else:
            if node.get(part) is None:
                if isinstance(loc[depth + 1], int):
                    raise ValueError(f"{format_loc(loc[: depth + 1])} is absent or null in the base instance: cannot index it")
                node[part] = {}
            node = node[part]


def get_path(data: Any, loc: Loc, default: Any = None) -> Any:
    node = data
    for part in loc:
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return default
            node = node[part]
        else:
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
    return node


def point_id(overrides: dict[str, Any]) -> str:
    """A stable id of a point: the first 12 hex digits of the SHA-256 of its overrides
    (canonical JSON, keys sorted), independent of the order of the grid keys."""
    text = json.dumps(overrides, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Point:
    id: str
    index: int
    overrides: dict[str, Any]
    problem: Problem
    fingerprint: str  # what the result depends on besides the overrides (base, model, catalog, solver settings)
    values: dict[str, Any] = field(default_factory=dict)  # value of every study column in this point's instance


@dataclass
class Study:
    name: str
    path: Path | None
    base_path: Path
    base_dir: Path
    spec: StudySpec
    points: list[Point]
    columns: list[str]  # override paths, in the order they first appear
    backend: str | None = None
    time_limit_s: float | None = None

    def with_settings(self, backend: str | None = None, time_limit_s: float | None = None) -> Study:
        """The same study with the backend / time limit overridden (command-line options)."""
        if backend is None and time_limit_s is None:
            return self
        data = self.spec.model_dump(exclude_none=True)
        if backend is not None:
            data["backend"] = backend
        if time_limit_s is not None:
            data["time_limit_s"] = time_limit_s
        return study_from_data(data, where=self.path or "<study>", base_dir=self.base_dir, name=self.name)


def load_study(path: str | os.PathLike[str]) -> Study:
    p = Path(path)
    data, lines = read_document(p)
    return study_from_data(data, where=p, lines=lines, base_dir=p.parent)


def study_from_data(
    data: Any,
    *,
    where: Path | str = "<study>",
    lines: dict[Loc, int] | None = None,
    base_dir: Path | None = None,
    name: str | None = None,
) -> Study:
    """Validate a study (file contents or a dict built in Python) and every point in it."""
    lines = lines or {}
    if not isinstance(data, dict):
        raise InputError(f"{where}: a study file is a mapping (base, grid or points, ...)")
    try:
        spec = StudySpec.model_validate(data)
    except ValidationError as exc:
        raise InputError(validation_message(where, exc, lines)) from None

    def at(loc: Loc) -> str:
        line = line_for(loc, lines)
        return f"{where}{f':{line}' if line else ''}"

    # the base instance
    base_dir = base_dir if base_dir is not None else (Path(where).parent if isinstance(where, Path) else Path.cwd())
    base_path = Path(spec.base) if Path(spec.base).is_absolute() else base_dir / spec.base
    if not base_path.is_file():
        raise InputError(f"{at(('base',))}: base: file not found: {base_path}")
    try:
        base_data, base_lines = read_document(base_path)
        if not isinstance(base_data, dict):
            raise InputError(f"{base_path}: an instance file is a mapping (name, sites, routes, job, ...)")
        problem_from_data(base_data, where=base_path, lines=base_lines, base=base_path.parent)
    except InputError as exc:
        raise InputError(f"{at(('base',))}: base: invalid instance:\n{exc}") from None

    # the override sets, each with the study-file location of each override
    raw: list[tuple[dict[str, Any], dict[str, Loc]]] = []
    if spec.grid is not None:
        keys = list(spec.grid)
        for combo in itertools.product(*(list(enumerate(spec.grid[k])) for k in keys)):
            ov = {k: v for k, (_, v) in zip(keys, combo, strict=True)}
            locs = {k: ("grid", k, i) for k, (i, _) in zip(keys, combo, strict=True)}
            raw.append((ov, locs))
        where_label = {k: "grid" for k in keys}
    else:
        where_label = {}
        for i, pt in enumerate(spec.points or []):
            raw.append((dict(pt), {k: ("points", i, k) for k in pt}))

    # syntax of every path, once
    parsed: dict[str, Loc] = {}
    for ov, locs in raw:
        for k in ov:
            if k in parsed:
                continue
            try:
                parsed[k] = parse_path(k)
            except ValueError as exc:
                raise InputError(f"{at(locs[k][:-1] if spec.grid is not None else locs[k])}: {_label(locs[k], where_label)}{exc}") from None

    backend = spec.backend
    time_limit = spec.time_limit_s
    columns: list[str] = []
    for ov, _ in raw:
        for k in ov:
            if k not in columns:
                columns.append(k)

    errors: list[str] = []
    seen_err: set[str] = set()
    points: list[Point] = []
    ids: dict[str, int] = {}
    for index, (ov, locs) in enumerate(raw):
        inst_data = copy.deepcopy(base_data)
        problem: Problem | None = None
        issues: list[tuple[Loc, str]] = []  # (instance field path, message without the path)
        for k, v in ov.items():
            try:
                set_path(inst_data, parsed[k], v)
            except ValueError as exc:
                issues.append((parsed[k], str(exc)))
                break
        if not issues:
            try:
                problem = _problem(inst_data, base_path)
            except _PointError as exc:
                issues = exc.issues
        if issues or problem is None:
            for loc, msg in issues:
                k, exact = _blame(loc, ov, parsed)
                field_ = f"{format_loc(loc)}: " if loc and loc != parsed.get(k) else ""
                if k:
                    head = f"{_label(locs[k], where_label)}{k} = {_fmt_value(ov[k])}"
                    if not exact and len(ov) > 1:
                        head += f" (with {_fmt_overrides({o: v for o, v in ov.items() if o != k})})"
                    text = f"{at(locs[k])}: {head}: {field_}{msg}"
                else:
                    text = f"{at(('points', index) if spec.points is not None else ('grid',))}: {field_}{msg}"
                if text not in seen_err:
                    seen_err.add(text)
                    errors.append(text)
            continue
        pid = point_id(ov)
        if pid in ids:
            loc = next(iter(locs.values()), ("points", index))
            errors.append(f"{at(loc)}: {_label(loc, where_label)}point {_fmt_overrides(ov) or '(no overrides)'} repeats an earlier point")
            continue
        ids[pid] = index
        eff_backend = backend or problem.instance.solver.backend
        eff_limit = time_limit if time_limit is not None else problem.instance.solver.time_limit_s
        dump = problem.instance.model_dump(mode="json")
        values = {c: ov[c] if c in ov else get_path(dump, parsed[c]) for c in columns}
        points.append(Point(pid, len(points), ov, problem, _fingerprint(problem, eff_backend, eff_limit), values))
    if errors:
        shown = errors[:20]
        more = f"\n... and {len(errors) - len(shown)} more" if len(errors) > len(shown) else ""
        raise InputError("\n".join(shown) + more)

    stem = Path(where).stem if isinstance(where, Path) else "study"
    study_name = name or spec.name or re.sub(r"[^A-Za-z0-9_.-]", "_", stem)
    return Study(
        name=study_name,
        path=Path(where) if isinstance(where, Path) else None,
        base_path=base_path,
        base_dir=base_dir,
        spec=spec,
        points=points,
        columns=columns,
        backend=backend,
        time_limit_s=time_limit,
    )


class _PointError(Exception):
    def __init__(self, issues: list[tuple[Loc, str]]):
        super().__init__("; ".join(f"{format_loc(loc)}: {msg}" for loc, msg in issues))
        self.issues = issues


_SENTINEL = "\x00point"


def _problem(data: dict[str, Any], base_path: Path) -> Problem:
    """Validate one point's instance; errors carry the instance field paths involved."""
    try:
        inst = Instance.model_validate(data)
    except ValidationError as exc:
        issues: list[tuple[Loc, str]] = []
        seen: set[Loc] = set()
        for err in exc.errors(include_url=False):
            msg = err["msg"].removeprefix("Value error, ")
            if not err["loc"] and ":" in msg.split(" ")[0]:  # model-level: "routes[0].sites: ..."
                field_path, _, rest = msg.partition(":")
                issues.append((_loc_of(field_path), rest.strip()))
                continue
            loc = clean_loc(tuple(err["loc"]))
            if loc in seen:  # union members repeat the same field
                continue
            seen.add(loc)
            got = err.get("input")
            if err["type"] == "extra_forbidden":
                msg = "unknown field"
            elif not isinstance(got, dict | list):
                msg += f" (got {got!r})"
            issues.append((loc, msg))
        raise _PointError(issues) from None
    try:
        problem = problem_from_data(inst, where=_SENTINEL, base=base_path.parent)
    except InputError as exc:
        msg = str(exc).replace(f"{_SENTINEL}: ", "").replace(_SENTINEL, "instance")
        field_path, _, rest = msg.partition(": ")
        loc = _loc_of(field_path)
        raise _PointError([(loc, rest if loc else msg)]) from None
    return Problem(instance=problem.instance, catalog=problem.catalog, model=problem.model, path=base_path)


def _loc_of(text: str) -> Loc:
    try:
        return parse_path(text.strip())
    except ValueError:
        return ()


def _blame(loc: Loc, overrides: dict[str, Any], parsed: dict[str, Loc]) -> tuple[str, bool]:
    """The override responsible for an error at instance path `loc`: the one with the longest
    common prefix with it (exact = the override addresses that field or one inside/around
    it); else the first override, not exact (a combination of overrides is invalid)."""
    best, best_len = "", 0
    for k in overrides:
        p = parsed[k]
        n = min(len(p), len(loc))
        if n and p[:n] == loc[:n] and n > best_len:
            best, best_len = k, n
    if best:
        return best, True
    return next(iter(overrides), ""), False


def _label(loc: Loc, where_label: dict[str, str]) -> str:
    if not loc:
        return ""
    if loc[0] == "grid":
        return "grid: "
    return f"points[{loc[1]}]: "


def _fmt_value(v: Any) -> str:
    if isinstance(v, dict | list):
        return yaml.safe_dump(v, default_flow_style=True, sort_keys=False, width=10_000).strip()
    return json.dumps(v) if isinstance(v, str) else repr(v)


def _fmt_overrides(ov: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {_fmt_value(v)}" for k, v in ov.items())


def _placer_version() -> str:
    from placer import __version__

    return __version__


def _fingerprint(problem: Problem, backend: str, time_limit_s: float) -> str:
    """Hash of everything a point's result depends on besides its overrides (a finished point
    is reused on resume only when this matches)."""
    data = {
        "instance": problem.instance.model_dump(mode="json"),
        "model": problem.model.model_dump(mode="json"),
        "catalog": problem.catalog.model_dump(mode="json"),
        "backend": backend,
        "time_limit_s": time_limit_s,
        "record": RECORD_VERSION,
        "placer": _placer_version(),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- one point


@dataclass(frozen=True)
class Task:
    """What a worker needs: picklable, no file access (the problem is already resolved)."""

    id: str
    overrides: dict[str, Any]
    problem: Problem
    backend: str | None
    time_limit_s: float | None
    fingerprint: str
    quiet: bool = True  # silence solver chatter on the worker's stdout (HiGHS banner)


@contextlib.contextmanager
def _quiet_stdout(enabled: bool) -> Iterator[None]:
    """Point file descriptor 1 at /dev/null (native solver libraries print there)."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def run_point(task: Task) -> dict[str, Any]:
    """Solve one point with one solver thread; never raises: failures become records."""
    from placer.errors import InfeasibleError, TimeLimitError
    from placer.optimize.driver import solve

    rec: dict[str, Any] = {
        "version": RECORD_VERSION,
        "id": task.id,
        "overrides": task.overrides,
        "fingerprint": task.fingerprint,
        "status": "error",
        "message": "",
        "metrics": {},
        "plan": None,
    }
    try:
        with _quiet_stdout(task.quiet):
            res = solve(task.problem, backend=task.backend, time_limit_s=task.time_limit_s, threads=1)
    except InfeasibleError as exc:
        rec.update(status="infeasible", message=str(exc))
        return rec
    except TimeLimitError as exc:
        rec.update(status="time_limit", message=str(exc))
        return rec
    except PlacerError as exc:
        rec.update(status="error", message=f"{type(exc).__name__}: {exc}")
        return rec
    except Exception as exc:  # noqa: BLE001 - a failed point is a row, not a crashed sweep
        rec.update(status="error", message=f"internal error: {type(exc).__name__}: {exc}")
        return rec
    plan = res.plan.model_dump(mode="json", exclude_none=True)
    rec.update(status=res.status, plan=plan, metrics=_metrics(task.problem, res, plan))
    return rec


def _metrics(problem: Problem, res: Any, plan: dict[str, Any]) -> dict[str, Any]:
    ev = res.evaluation
    par = plan["parallelism"]
    groups = plan.get("replica_groups", [])
    sites_used = sorted({s for g in groups for s in g["stage_sites"]})
    if any(len(set(g["stage_sites"])) > 1 for g in groups):
        layout = "pipeline-across-sites"
    elif len(sites_used) > 1:
        layout = "replicas-per-site"
    else:
        layout = "single-site"
    m: dict[str, Any] = {"step_time_s": ev.step_time_s}
    m.update({k: float(v) for k, v in ev.breakdown.items()})
    m.update(
        tokens_per_s=ev.tokens_per_s,
        mfu=ev.mfu,
        capex_usd=ev.capex_usd,
        cost_per_token_usd=ev.cost_per_token_usd if math.isfinite(ev.cost_per_token_usd) else None,
        power_mw=float(sum(ev.power_mw.values())),
        sync_mode=ev.sync_mode,
        layout=layout,
        sites_used=len(sites_used),
        gpus=int(sum(ev.gpus_by_site.values())),
        tp=par["tp"],
        pp=par["pp"],
        dp=par["dp"],
        micro_batch=par["micro_batch"],
    )
    waves = {_route_label(link["sites"]): int(link["waves"]) for link in plan.get("links", [])}
    for r in problem.instance.routes:
        lab = _route_label(r.sites)
        m[f"waves[{lab}]"] = waves.get(lab, 0)
    # columns of the resilience feature (plan["resilience"], written when the instance has a
    # resilience: block): spare waves under ring vs OptCC, worst single-failure slowdown
    m.update(resilience_columns(plan.get("resilience")))
    m.update(solver_s=float(res.seconds), gap=float(res.gap))
    return m


def _route_label(sites: Iterable[str]) -> str:
    a, b = sorted(sites)
    return f"{a}-{b}"


def resilience_columns(res: Any) -> dict[str, Any]:
    """Flat columns from a plan's resilience summary; tolerant of absent keys."""
    if not isinstance(res, dict):
        return {}
    out: dict[str, Any] = {}
    for name in ("ring", "optcc"):
        key = f"spare_waves_{name}"
        if key in res:
            out[key] = res[key]
        for route, n in sorted((res.get(f"{key}_by_route") or {}).items()):
            out[f"{key}[{route}]"] = n
    if "collective" in res:
        out["resilience_collective"] = res["collective"]
    fail = res.get("failures") if isinstance(res.get("failures"), dict) else {}
    worst = fail.get("worst") if isinstance(fail.get("worst"), dict) else None
    healthy = fail.get("healthy_step_time_s")
    if worst is not None:
        steps = worst.get("step_time_s") or {}
        t_w = steps.get(fail.get("collective") or res.get("collective"))
        out["worst_failure"] = worst.get("description")
        out["worst_failure_step_time_s"] = t_w
        if t_w is not None and healthy:
            out["worst_failure_slowdown"] = t_w / healthy - 1
    if "survives" in fail:
        out["survives"] = bool(fail["survives"])
    for k, v in res.items():
        if k.endswith("_error") and isinstance(v, str):
            out[f"resilience_{k}"] = v
    return out


# ----------------------------------------------------------------------------- the sweep


@dataclass
class SweepResult:
    out_dir: Path
    table: pd.DataFrame
    computed: list[str]  # ids solved in this run, in completion order
    reused: list[str]  # ids whose finished record was reused
    interrupted: bool = False

    @property
    def counts(self) -> dict[str, int]:
        return {s: int((self.table["status"] == s).sum()) for s in STATUSES if "status" in self.table}




def run_sweep(
    study: Study,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    executor: Literal["local", "dask"] = "local",
    workers: int | None = None,
    scheduler: str | None = None,
    progress: bool = True,
) -> SweepResult:
    """Solve every point not already finished in `out_dir`; write the records and the table."""
    if executor not in {"local", "dask"}:
        raise InputError(f"--executor: expected local or dask, got '{executor}'")
    if workers is not None and workers < 1:
        raise InputError(f"--workers: must be >= 1, got {workers}")
    out = Path(out_dir) if out_dir is not None else Path("out") / "sweeps" / study.name
    points_dir = out / "points"
    points_dir.mkdir(parents=True, exist_ok=True)
    _write_manifest(out, study)

    records: dict[str, dict[str, Any]] = {}
    todo: list[Point] = []
    reused: list[str] = []
    for p in study.points:
        rec = _read_record(points_dir / f"{p.id}.json", p.id)
        if rec is not None and rec.get("fingerprint") == p.fingerprint and rec.get("status") != "error":
            records[p.id] = rec
            reused.append(p.id)
        else:
            todo.append(p)
    tasks = [Task(p.id, p.overrides, p.problem, study.backend, study.time_limit_s, p.fingerprint) for p in todo]
    n_workers = workers or os.cpu_count() or 1

    computed: list[str] = []
    interrupted = False
    with _Progress(len(study.points), len(reused), records.values(), enabled=progress and bool(tasks)) as bar:

        def finish(rec: dict[str, Any]) -> None:
            _write_record(points_dir / f"{rec['id']}.json", rec)
            records[rec["id"]] = rec
            computed.append(rec["id"])
            bar.advance(rec)

        try:
            if tasks:
                runner = _run_dask if executor == "dask" else _run_local
                for rec in runner(tasks, n_workers, scheduler, bar.start):
                    finish(rec)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            table = results_table(study, records)
            write_table(out, table)
    if interrupted:
        raise KeyboardInterrupt(f"sweep interrupted: {len(records)} of {len(study.points)} points done; re-run to resume")
    return SweepResult(out, table, computed, reused, interrupted)


def _failed(task: Task, exc: BaseException) -> dict[str, Any]:
    return {
        "version": RECORD_VERSION,
        "id": task.id,
        "overrides": task.overrides,
        "fingerprint": task.fingerprint,
        "status": "error",
        "message": f"worker failure: {type(exc).__name__}: {exc}",
        "metrics": {},
        "plan": None,
    }


def _run_local(tasks: list[Task], workers: int, scheduler: str | None, started: Callable[[], None]) -> Iterator[dict[str, Any]]:
    import concurrent.futures as cf
    import multiprocessing as mp

    if scheduler:
        raise InputError("--scheduler needs --executor dask")
    # fork on Linux: fast, and a script or notebook without a __main__ guard still works
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    pool = cf.ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx, initializer=_ignore_sigint)
    try:
        futures = {pool.submit(run_point, t): t for t in tasks}  # processes start here (before the progress thread)
        started()
        for fut in cf.as_completed(futures):
            try:
                yield fut.result()
            except Exception as exc:  # noqa: BLE001 - e.g. a worker killed by the OS
                yield _failed(futures[fut], exc)
    except BaseException:
        # Ctrl-C (or the consumer stopped): drop the queue and stop the running solves now;
        # finished points are already on disk
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the parent, which stops them and keeps what is finished;
    they die with the parent, however it ends (even SIGKILL)."""
    import signal

    from placer.interrupt import die_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()


def _run_dask(tasks: list[Task], workers: int, scheduler: str | None, started: Callable[[], None]) -> Iterator[dict[str, Any]]:
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError as exc:  # pragma: no cover - dask is a dependency
        raise InputError(f"--executor dask: dask.distributed is not importable ({exc})") from None

    cluster = None
    try:
        if scheduler:
            client = Client(scheduler, timeout="10s")
        else:
            cluster = LocalCluster(
                n_workers=min(workers, len(tasks)),
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            )
            client = Client(cluster)
    except OSError as exc:
        if cluster is not None:
            cluster.close()
        raise InputError(f"--scheduler: cannot connect to '{scheduler}' ({exc})") from None
    try:
        run = uuid.uuid4().hex[:8]
        futures = {client.submit(run_point, t, key=f"placer-point-{t.id}-{run}", pure=False): t for t in tasks}
        started()
        for fut in as_completed(list(futures)):
            try:
                yield fut.result()
            except Exception as exc:  # noqa: BLE001 - a worker lost by dask
                yield _failed(futures[fut], exc)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


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

    write_atomic(path, json.dumps(seal(rec), indent=1, sort_keys=False, allow_nan=False, default=_nan_to_none) + "\n")


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
    "tp_comm_s",
    "bubble_s",
    "pp_comm_s",
    "dp_sync_s",
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
    cols = ["point_id", *study.columns, "status", "message", *known, *waves, *extra, *tail]
    df = pd.DataFrame(rows, columns=cols)
    for c in df.columns:  # integer columns stay integers when some rows have no value
        vals = [v for v in (r.get(c) for r in rows) if v is not None and not (isinstance(v, float) and math.isnan(v))]
        if vals and all(isinstance(v, int) and not isinstance(v, bool) for v in vals) and len(vals) < len(rows):
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


# ----------------------------------------------------------------------------- progress


class _Progress:
    """A rich progress bar on stderr: done / total, ETA, and counts by outcome."""

    def __init__(self, total: int, done: int, existing: Iterable[dict[str, Any]], enabled: bool):
        self.total, self.done, self.enabled = total, done, enabled
        self.counts = {"ok": 0, "infeasible": 0, "time_limit": 0, "error": 0}
        for rec in existing:
            self._count(rec)
        self._bar: Any = None
        self._task: Any = None

    def _count(self, rec: dict[str, Any]) -> None:
        s = rec.get("status")
        self.counts["ok" if s in ("optimal", "feasible") else s if s in self.counts else "error"] += 1

    def _text(self) -> str:
        c = self.counts
        parts = [f"ok {c['ok']}"]
        if c["infeasible"]:
            parts.append(f"infeasible {c['infeasible']}")
        if c["time_limit"]:
            parts.append(f"time limit {c['time_limit']}")
        parts.append(f"[red]failed {c['error']}[/red]" if c["error"] else "failed 0")
        return ", ".join(parts)

    def __enter__(self) -> _Progress:
        return self

    def start(self) -> None:
        if not self.enabled or self._bar is not None:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TextColumn("{task.fields[outcome]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._bar.start()
        self._task = self._bar.add_task("sweep", total=self.total, completed=self.done, outcome=self._text())

    def advance(self, rec: dict[str, Any]) -> None:
        self._count(rec)
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, outcome=self._text())

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()


__all__ = [
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
    "results_table",
    "run_point",
    "run_sweep",
    "set_path",
    "study_from_data",
    "write_table",
]
