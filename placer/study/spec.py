"""Study files: the spec, override paths, points and their validation (placer.study.sweep
has the overview)."""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from placer.errors import InputError
from placer.io import (
    Loc,
    Problem,
    format_loc,
    line_for,
    parse_path,
    problem_from_data,
    read_document,
    validation_message,
)
from placer.schema import NAME_PATTERN, Instance

if TYPE_CHECKING:
    pass


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
    grid: dict[str, list[Any]] | None = Field(
        default=None, description="override path -> values (Cartesian product)"
    )
    points: list[dict[str, Any]] | None = Field(
        default=None, description="explicit list of override mappings"
    )
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
            raise ValueError(
                "give exactly one of grid: (mapping path -> list of values) or points: (list of mappings)"  # noqa: E501
            )
        return self


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
                raise ValueError(
                    f"{here} is {_describe(node)} in the base instance, not a list: cannot index [{part}]"  # noqa: E501
                )
            if part >= len(node):
                raise ValueError(
                    f"{format_loc(loc[: depth + 1])}: index out of range ({here} has {len(node)} entries)"  # noqa: E501
                )
            if last:
                node[part] = copy.deepcopy(value)
            else:
                node = node[part]
            continue
        if not isinstance(node, dict):
            raise ValueError(
                f"{here} is {_describe(node)} ({node!r}) in the base instance, not a mapping: cannot address .{part}"  # noqa: E501
            )
        if last:
            node[part] = copy.deepcopy(value)
        else:
            if node.get(part) is None:
                if isinstance(loc[depth + 1], int):
                    raise ValueError(
                        f"{format_loc(loc[: depth + 1])} is absent or null in the base instance: cannot index it"  # noqa: E501
                    )
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
    fingerprint: str  # what the result depends on besides the overrides (base, model, catalog, solver settings)  # noqa: E501
    values: dict[str, Any] = field(
        default_factory=dict
    )  # value of every study column in this point's instance


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
        return study_from_data(
            data, where=self.path or "<study>", base_dir=self.base_dir, name=self.name
        )


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
    base_dir = (
        base_dir
        if base_dir is not None
        else (Path(where).parent if isinstance(where, Path) else Path.cwd())
    )
    base_path = Path(spec.base) if Path(spec.base).is_absolute() else base_dir / spec.base
    if not base_path.is_file():
        raise InputError(f"{at(('base',))}: base: file not found: {base_path}")
    try:
        base_data, base_lines = read_document(base_path)
        if not isinstance(base_data, dict):
            raise InputError(
                f"{base_path}: an instance file is a mapping (name, sites, routes, job, ...)"
            )
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
                raise InputError(
                    f"{at(locs[k][:-1] if spec.grid is not None else locs[k])}: {_label(locs[k], where_label)}{exc}"  # noqa: E501
                ) from None

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
                    text = f"{at(('points', index) if spec.points is not None else ('grid',))}: {field_}{msg}"  # noqa: E501
                if text not in seen_err:
                    seen_err.add(text)
                    errors.append(text)
            continue
        pid = point_id(ov)
        if pid in ids:
            loc = next(iter(locs.values()), ("points", index))
            errors.append(
                f"{at(loc)}: {_label(loc, where_label)}point {_fmt_overrides(ov) or '(no overrides)'} repeats an earlier point"  # noqa: E501
            )
            continue
        ids[pid] = index
        eff_backend = backend or problem.instance.solver.backend
        eff_limit = time_limit if time_limit is not None else problem.instance.solver.time_limit_s
        dump = problem.instance.model_dump(mode="json")
        values = {c: ov[c] if c in ov else get_path(dump, parsed[c]) for c in columns}
        points.append(
            Point(
                pid, len(points), ov, problem, _fingerprint(problem, eff_backend, eff_limit), values
            )
        )
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
        # io's messages (did-you-mean, union pruning, bounds), one "field: message" a line
        issues: list[tuple[Loc, str]] = []
        for line in validation_message(_SENTINEL, exc, {}, data=data).splitlines():
            field_path, _, msg = line.removeprefix(f"{_SENTINEL}: ").partition(": ")
            issues.append((_loc_of(field_path), msg) if msg else ((), field_path))
        raise _PointError(issues) from None
    try:
        problem = problem_from_data(inst, where=_SENTINEL, base=base_path.parent)
    except InputError as exc:
        point_issues: list[tuple[Loc, str]] = []
        for msg in (
            str(exc).replace(f"{_SENTINEL}: ", "").replace(_SENTINEL, "instance").split("\n")
        ):
            field_path, _, rest = msg.partition(": ")
            loc = _loc_of(field_path)
            point_issues.append((loc, rest if loc else msg))
        raise _PointError(point_issues) from None
    return Problem(
        instance=problem.instance,
        catalog=problem.catalog,
        model=problem.model,
        path=base_path,
        deprecations=problem.deprecations,
    )


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
