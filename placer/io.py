"""Reading instance, model and plan files; writing outputs atomically.

Errors name the file, the line (from the YAML node marks) and the field path, e.g.
`inst.yaml:7: sites[1].gpus: Input should be greater than or equal to 0 (got -8)`.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from placer.errors import InputError
from placer.schema import Catalog, Instance, ModelSpec, Plan

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_MODELS_DIR = PACKAGE_DIR.parent / "models"
DEFAULT_CATALOG = PACKAGE_DIR / "catalog" / "default.yaml"

Loc = tuple[Any, ...]


# ----------------------------------------------------------------------------- YAML with lines


def _line_map(node: yaml.Node, path: Loc, out: dict[Loc, int]) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            k = key.value
            out[path + (k,)] = key.start_mark.line + 1
            _line_map(value, path + (k,), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_map(item, path + (i,), out)


def read_document(path: Path) -> tuple[Any, dict[Loc, int]]:
    """Parse a YAML or JSON file into Python data and a map from field path to line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read file ({exc})") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"{path}{where}: malformed YAML/JSON: {problem}") from None
    lines: dict[Loc, int] = {}
    if node is not None:
        _line_map(node, (), lines)
    return data, lines


def format_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(document)"


def _line_for(loc: Loc, lines: dict[Loc, int]) -> int | None:
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def _clean_loc(loc: Loc) -> Loc:
    # pydantic adds union-member tags (e.g. 'str', 'ModelSpec', 'list[...]') to the location
    return tuple(p for p in loc if isinstance(p, int) or not (p[:1].isupper() or "[" in p or p in {"str", "int", "float"}))


def validation_message(path: Path | str, exc: ValidationError, lines: dict[Loc, int], prefix: Loc = ()) -> str:
    msgs = []
    for err in exc.errors(include_url=False):
        loc = prefix + _clean_loc(tuple(err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")
        # model-level validators embed their own field path in the message ("sites[1].name: ...")
        if not err["loc"] and ":" in msg.split(" ")[0]:
            field = msg.split(":", 1)[0]
            line = _line_for(_parse_loc(field), lines)
            msgs.append(f"{path}{f':{line}' if line else ''}: {msg}")
            continue
        got = err.get("input")
        got_s = f" (got {got!r})" if err["type"] not in {"missing", "extra_forbidden"} and not isinstance(got, dict | list) else ""
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        line = _line_for(loc, lines)
        msgs.append(f"{path}{f':{line}' if line else ''}: {format_loc(loc)}: {msg}{got_s}")
    return "\n".join(msgs)


def _parse_loc(text: str) -> Loc:
    out: list[Any] = []
    for part in text.replace("]", "").split("."):
        pieces = part.split("[")
        if pieces[0]:
            out.append(pieces[0])
        out.extend(int(p) for p in pieces[1:] if p.isdigit())
    return tuple(out)


# ----------------------------------------------------------------------------- catalog


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


@cache
def default_catalog_data() -> dict[str, Any]:
    return yaml.safe_load(DEFAULT_CATALOG.read_text(encoding="utf-8"))


def build_catalog(overrides: dict[str, Any] | None = None, *, where: str = "catalog") -> Catalog:
    data = _deep_merge(default_catalog_data(), overrides or {})
    try:
        return Catalog.model_validate(data)
    except ValidationError as exc:
        raise InputError(validation_message(where, exc, {}, prefix=("catalog",))) from None


# ----------------------------------------------------------------------------- models


def model_search_dirs(base: Path | None) -> list[Path]:
    dirs = []
    if base is not None:
        dirs += [base / "models", base.parent / "models"]
    dirs += [Path.cwd() / "models", REPO_MODELS_DIR]
    return dirs


def load_model(name_or_path: str, base: Path | None = None) -> ModelSpec:
    """Resolve a model by file path or by name in models/ (next to the instance, cwd, repo)."""
    candidates = [Path(name_or_path)]
    if base is not None:
        candidates.insert(0, base / name_or_path)
    for c in candidates:
        if c.suffix in {".yaml", ".yml", ".json"} and c.is_file():
            return _load_model_file(c)
    for d in model_search_dirs(base):
        for ext in (".yaml", ".yml", ".json"):
            f = d / f"{name_or_path}{ext}"
            if f.is_file():
                return _load_model_file(f)
    known = sorted({p.stem for d in model_search_dirs(base) if d.is_dir() for p in d.glob("*.yaml")})
    raise InputError(f"unknown model '{name_or_path}' (known: {', '.join(known)})")


def _load_model_file(path: Path) -> ModelSpec:
    data, lines = read_document(path)
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise InputError(validation_message(path, exc, lines)) from None


# ----------------------------------------------------------------------------- instance


@dataclass(frozen=True)
class Problem:
    """An instance with its catalog merged and its model resolved: what the solver reads."""

    instance: Instance
    catalog: Catalog
    model: ModelSpec
    path: Path | None = None

    @property
    def name(self) -> str:
        return self.instance.name


def load_instance(path: str | os.PathLike[str]) -> Problem:
    p = Path(path)
    data, lines = read_document(p)
    if not isinstance(data, dict):
        raise InputError(f"{p}: an instance file is a mapping (name, sites, routes, job, ...)")
    return problem_from_data(data, where=p, lines=lines, base=p.parent)


def problem_from_data(
    data: dict[str, Any] | Instance,
    *,
    where: Path | str = "<instance>",
    lines: dict[Loc, int] | None = None,
    base: Path | None = None,
) -> Problem:
    lines = lines or {}
    if isinstance(data, Instance):
        inst = data
    else:
        try:
            inst = Instance.model_validate(data)
        except ValidationError as exc:
            raise InputError(validation_message(where, exc, lines)) from None
    catalog = build_catalog(inst.catalog, where=str(where))

    def err(loc: Loc, msg: str) -> InputError:
        line = _line_for(loc, lines)
        return InputError(f"{where}{f':{line}' if line else ''}: {format_loc(loc)}: {msg}")

    for i, s in enumerate(inst.sites):
        if s.gpu not in catalog.gpus:
            raise err(("sites", i, "gpu"), f"unknown GPU '{s.gpu}' (catalog: {', '.join(sorted(catalog.gpus))})")
    if isinstance(inst.job.model, str):
        try:
            model = load_model(inst.job.model, base)
        except InputError as exc:
            raise err(("job", "model"), str(exc)) from None
    else:
        model = inst.job.model
    if inst.job.seq_len is not None:
        model = model.model_copy(update={"seq_len": inst.job.seq_len})
    par = inst.job.parallelism
    if par.tp:
        for s in inst.sites:
            gpn = s.gpus_per_node or catalog.gpus[s.gpu].gpus_per_node
            if all(t > gpn for t in par.tp):
                raise err(("job", "parallelism", "tp"), f"no candidate fits inside a node of site '{s.name}' ({gpn} GPUs)")
    return Problem(instance=inst, catalog=catalog, model=model, path=Path(where) if isinstance(where, Path) else None)


# ----------------------------------------------------------------------------- plan


def load_plan(path: str | os.PathLike[str]) -> Plan:
    p = Path(path)
    data, lines = read_document(p)
    return plan_from_data(data, where=p, lines=lines)


def plan_from_data(data: Any, *, where: Path | str = "<plan>", lines: dict[Loc, int] | None = None) -> Plan:
    if isinstance(data, Plan):
        return data
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        raise InputError(validation_message(where, exc, lines or {})) from None


# ----------------------------------------------------------------------------- writing


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write via a temporary file in the same folder and rename: never a partial file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2) + "\n")
