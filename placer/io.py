"""Reading instance, model and plan files; writing outputs atomically.

Errors name the file, the line (from the YAML node marks) and the field path, e.g.
`inst.yaml:7: sites[1].gpus: Input should be greater than or equal to 0 (got -8)`.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from placer.errors import InputError
from placer.limits import MAX_DEPTH, MAX_FILE_BYTES, MAX_INT_DIGITS, MAX_NODES, MESSAGE_VALUE_CHARS
from placer.schema import (
    DEFER_CROSS_FIELD,
    HOST_PATTERN,
    RENAMED_GPU_KEYS,
    Catalog,
    CrossFieldErrors,
    Instance,
    ModelSpec,
    Plan,
    renamed_key_warning,
    upgrade_gpu_keys,
)

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_MODELS_DIR = PACKAGE_DIR.parent / "models"
DEFAULT_CATALOG = PACKAGE_DIR / "catalog" / "default.yaml"

Loc = tuple[Any, ...]


# ----------------------------------------------------------------------------- YAML with lines


def _line_map(
    node: yaml.Node, path: Loc, out: dict[Loc, int], dups: list[tuple[Loc, int, int]] | None = None
) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key, value in node.value:
            k = key.value
            line = key.start_mark.line + 1
            if isinstance(k, str) and k != "<<":
                if k in seen and dups is not None:
                    dups.append((path + (k,), line, seen[k]))
                seen.setdefault(k, line)
            out[path + (k,)] = line
            _line_map(value, path + (k,), out, dups)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_map(item, path + (i,), out, dups)


def _path_at_error(text: str) -> Loc:
    """Field path of the innermost open mapping key / sequence item when parsing fails."""
    stack: list[list[Any]] = []  # [kind, key or index, expecting a key]
    try:
        for ev in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(ev, yaml.NodeEvent) and stack:
                top = stack[-1]
                if top[0] == "seq":
                    top[1] += 1
                elif top[2]:
                    top[1], top[2] = (ev.value if isinstance(ev, yaml.ScalarEvent) else None), False
                else:
                    top[2] = True
            if isinstance(ev, yaml.MappingStartEvent):
                stack.append(["map", None, True])
            elif isinstance(ev, yaml.SequenceStartEvent):
                stack.append(["seq", -1, False])
            elif isinstance(ev, yaml.CollectionEndEvent) and stack:
                stack.pop()
    except yaml.YAMLError:
        pass
    if stack and (stack[-1][0] == "seq" or stack[-1][2]):
        stack = stack[:-1] + [["map", None, True]]  # failing list item or key: name the parent
    return tuple(f[1] for f in stack if f[1] is not None and f[1] != -1)


def _yaml_error(path: Path, exc: yaml.YAMLError, text: str = "") -> InputError:
    mark = getattr(exc, "problem_mark", None)
    where = f":{mark.line + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    context, cmark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context:
        opened = (
            f" started on line {cmark.line + 1}"
            if cmark is not None and (mark is None or cmark.line != mark.line)
            else ""
        )
        problem = f"{problem} ({context}{opened})"
    loc = _path_at_error(text) if text else ()
    field = f" {format_loc(loc)}:" if loc else ""
    return InputError(f"{path}{where}:{field} malformed YAML/JSON: {problem}")


_INT_LIKE = re.compile(r"^[-+]?(0[xob])?[0-9_a-fA-F]+$")


def _node_sizes(root: yaml.Node) -> dict[int, int]:
    """Nodes each node stands for once aliases are expanded (memoized by identity, so an
    alias bomb is measured without being expanded)."""
    size: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in size:
            continue
        kids = _children(node)
        if done or not kids:
            size[id(node)] = 1 + sum(size.get(id(k), 0) for k in kids)
            continue
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in size)
    return size


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for kv in node.value for n in kv]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_tree(path: Path, root: yaml.Node) -> None:
    """Refuse documents that would take unbounded time or memory to build or validate:
    alias bombs, nesting deeper than MAX_DEPTH, integers longer than MAX_INT_DIGITS."""
    size = _node_sizes(root)

    def fail(loc: Loc, node: yaml.Node, msg: str) -> InputError:
        return InputError(f"{path}:{node.start_mark.line + 1}: {clip(format_loc(loc), 120)}: {msg}")

    if size[id(root)] > MAX_NODES:
        loc, node = (), root  # descend to the field whose expansion is too large
        while True:
            nxt = None
            if isinstance(node, yaml.MappingNode):
                nxt = max(
                    ((k.value, v) for k, v in node.value),
                    key=lambda kv: size[id(kv[1])],
                    default=None,
                )
            elif isinstance(node, yaml.SequenceNode):
                nxt = max(enumerate(node.value), key=lambda kv: size[id(kv[1])], default=None)
            if nxt is None or 2 * size[id(nxt[1])] <= size[id(node)] or len(loc) >= MAX_DEPTH:
                break  # no single child holds most of it: this field is the bomb
            loc, node = loc + (nxt[0],), nxt[1]
        raise fail(
            loc,
            node,
            f"expands to {size[id(root)]:,} values with aliases (limit {MAX_NODES:,}); YAML alias bomb?",  # noqa: E501
        )
    stack: list[tuple[yaml.Node, Loc]] = [(root, ())]
    while stack:
        node, loc = stack.pop()
        if len(loc) > MAX_DEPTH:
            raise fail(loc[:MAX_DEPTH], node, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, yaml.ScalarNode):
            v = node.value
            if node.style is None and len(v) > MAX_INT_DIGITS and _INT_LIKE.match(v):
                raise fail(
                    loc, node, f"integer with {len(v)} digits (at most {MAX_INT_DIGITS}): {clip(v)}"
                )
        elif isinstance(node, yaml.MappingNode):
            stack.extend(
                (v, loc + (k.value if isinstance(k, yaml.ScalarNode) else "?",))
                for k, v in node.value
            )
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((v, loc + (i,)) for i, v in enumerate(node.value))


def _too_deep(path: Path, text: str) -> InputError:
    """Where nesting first exceeds MAX_DEPTH, found from the event stream (no recursion)."""
    stack: list[list[Any]] = []
    try:
        for ev in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(ev, yaml.NodeEvent) and stack:
                top = stack[-1]
                if top[0] == "seq":
                    top[1] += 1
                elif top[2]:
                    top[1], top[2] = (ev.value if isinstance(ev, yaml.ScalarEvent) else "?"), False
                else:
                    top[2] = True
            if isinstance(ev, yaml.CollectionStartEvent):
                if len(stack) >= MAX_DEPTH:
                    loc = tuple(f[1] for f in stack if f[1] is not None)
                    return InputError(
                        f"{path}:{ev.start_mark.line + 1}: {clip(format_loc(loc), 120)}: nested deeper than {MAX_DEPTH} levels"  # noqa: E501
                    )
                stack.append(
                    ["seq", -1, False]
                    if isinstance(ev, yaml.SequenceStartEvent)
                    else ["map", None, True]
                )
            elif isinstance(ev, yaml.CollectionEndEvent) and stack:
                stack.pop()
    except yaml.YAMLError:
        pass
    return InputError(f"{path}: nested deeper than {MAX_DEPTH} levels")


def _compose(path: Path, loader: yaml.SafeLoader) -> yaml.Node | None:
    try:
        node = loader.get_single_node()
    except RecursionError:
        raise _too_deep(path, loader.buffer.rstrip("\0")) from None
    if node is not None:
        _check_tree(path, node)
    return node


def read_document(path: Path) -> tuple[Any, dict[Loc, int]]:
    """Parse a YAML or JSON file into Python data and a map from field path to line.

    A `.json` file is read by the JSON parser (tab indentation, 1e5 numbers), falling back
    to YAML (a superset in practice) when it is not strict JSON. Duplicate keys are errors.
    Files over MAX_FILE_BYTES, alias bombs, deep nesting and huge integers are refused
    before anything is built from them (`placer.limits`).
    """
    try:
        if path.is_file() and path.stat().st_size > MAX_FILE_BYTES:
            raise InputError(
                f"{path}: file is {path.stat().st_size:,} bytes, larger than the {MAX_FILE_BYTES:,} bytes an input file may have"  # noqa: E501
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, expected a YAML or JSON file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read file ({exc})") from None
    if len(text) > MAX_FILE_BYTES:  # a pipe or special file
        raise InputError(f"{path}: larger than the {MAX_FILE_BYTES:,} bytes an input file may have")
    json_error: json.JSONDecodeError | None = None
    data: Any = None
    parsed = False
    if path.suffix.lower() == ".json":
        try:
            data, parsed = json.loads(text), True
        except json.JSONDecodeError as exc:
            json_error = exc
        except RecursionError:
            raise _too_deep(path, text) from None
        except ValueError as exc:  # e.g. an integer over Python's 4300-digit limit
            raise InputError(f"{path}: {clip(str(exc))}") from None
    node, loader = None, None
    try:
        # JSON forbids raw tabs inside strings: replacing them keeps every line number
        loader = yaml.SafeLoader(text.replace("\t", " ") if parsed else text)
        node = _compose(path, loader)
        if not parsed:
            try:
                data = loader.construct_document(node) if node is not None else None
            except (RecursionError, ValueError, OverflowError) as exc:
                raise InputError(f"{path}: cannot read a value ({clip(str(exc))})") from None
    except yaml.YAMLError as exc:
        if json_error is not None:
            raise InputError(
                f"{path}:{json_error.lineno}: malformed JSON: {json_error.msg} (column {json_error.colno})"  # noqa: E501
            ) from None
        if not parsed:
            raise _yaml_error(path, exc, text) from None
    finally:
        if loader is not None:
            loader.dispose()
    lines: dict[Loc, int] = {}
    dups: list[tuple[Loc, int, int]] = []
    if node is not None:
        _line_map(node, (), lines, dups)
    if dups:
        raise InputError(
            "\n".join(
                f"{path}:{line}: {format_loc(loc)}: duplicate key (first given on line {first})"
                for loc, line, first in dups
            )
        )
    return data, lines


def clip(text: str, n: int = MESSAGE_VALUE_CHARS) -> str:
    """A value shortened for an error message (a 5,000-character name is not echoed whole)."""
    return text if len(text) <= n else f"{text[: n - 20]}... ({len(text):,} characters)"


def format_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(document)"


def line_for(loc: Loc, lines: dict[Loc, int]) -> int | None:
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def clean_loc(loc: Loc) -> Loc:
    # pydantic adds union-member tags (e.g. 'str', 'ModelSpec', 'list[...]') to the location
    return tuple(
        p
        for p in loc
        if isinstance(p, int) or not (p[:1].isupper() or "[" in p or p in {"str", "int", "float"})
    )


_NO_DATA = object()

# error types meaning "the value has the wrong shape for this (union member) type"
_MISMATCH = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
    "list_type": "a list",
    "tuple_type": "a list",
    "none_required": "null",
}


def _split_loc(raw: Loc, data: Any, err_type: str) -> tuple[Loc, int | None]:
    """Field path without pydantic's union-member tags, and where the first tag was.

    A location part is a field when it indexes the input data at that level; anything
    else (e.g. 'str', 'function-after[...]', "literal['a','b']") is a union tag."""
    if data is _NO_DATA:
        clean = clean_loc(raw)
        return clean, (
            None
            if len(clean) == len(raw)
            else next(
                i for i, (a, b) in enumerate(zip(raw, clean + (None,), strict=False)) if a != b
            )
        )
    cur, out, tag_at = data, [], None
    for i, part in enumerate(raw):
        if isinstance(cur, list) and isinstance(part, int) and -len(cur) <= part < len(cur):
            out.append(part)
            cur = cur[part]
        elif isinstance(cur, dict) and part in cur:
            out.append(part)
            cur = cur[part]
        elif i == len(raw) - 1 and err_type in {"missing", "extra_forbidden"}:
            out.append(part)
        elif isinstance(part, int):
            out.append(part)
            cur = None
        else:
            tag_at = len(out) if tag_at is None else tag_at
    return tuple(out), tag_at


def _show(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list | tuple):
        return "a list"
    return repr(clip(v)) if isinstance(v, str) else clip(str(v))


def _allowed_keys(root: Any, loc: Loc) -> list[str] | None:
    """Keys the model at `loc` accepts (for 'unknown key' hints), when it can be found."""

    def first_model(ann: Any) -> Any:
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            return ann
        for a in getattr(ann, "__args__", ()) or ():
            m = first_model(a)
            if m is not None:
                return m
        return None

    cls = root
    for part in loc:
        if cls is None:
            return None
        if isinstance(part, int) or part not in cls.model_fields:
            continue  # list index or dict key: same value model
        cls = first_model(cls.model_fields[part].annotation)
    return list(cls.model_fields) if cls is not None else None


def _short_message(err: dict[str, Any]) -> str:
    t, ctx = err["type"], err.get("ctx") or {}
    if t in {"greater_than_equal", "greater_than", "less_than_equal", "less_than"}:
        op = {
            "greater_than_equal": ">=",
            "greater_than": ">",
            "less_than_equal": "<=",
            "less_than": "<",
        }[t]
        bound = next(iter(ctx.values()), None)
        return f"must be {op} {bound:g}" if isinstance(bound, float) else f"must be {op} {bound}"
    if t == "missing":
        return (
            "entry is missing" if isinstance(err["loc"][-1], int) else "required field is missing"
        )
    if t == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if t == "string_pattern_mismatch":
        return f"must match the pattern {ctx.get('pattern')}"
    if t == "too_short":
        n = ctx.get("min_length")
        return f"needs at least {n} entr{'y' if n == 1 else 'ies'}, got {ctx.get('actual_length')}"
    if t == "too_long":
        n = ctx.get("max_length")
        return f"takes at most {n} entr{'y' if n == 1 else 'ies'}, got {ctx.get('actual_length')}"
    if t in _MISMATCH:
        return f"must be {_MISMATCH[t]}"
    return str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")


_EMBEDDED_PATH = re.compile(
    r"^([A-Za-z_]\w*(?:\[\d+\])*(?:\.[A-Za-z_]\w*(?:\[\d+\])*)*): (.+)$", re.S
)


def validation_message(
    path: Path | str,
    exc: ValidationError,
    lines: dict[Loc, int],
    prefix: Loc = (),
    data: Any = _NO_DATA,
) -> str:
    """One line per problem: `file:line: field.path: message, got value`.

    Pass the validated `data` to tell union-member tags from field names reliably; errors
    from union members the value plainly is not (a mapping given where a string or a
    mapping is allowed) are dropped, and a value matching no member gets one message."""
    import placer.schema as schema_module

    root = getattr(schema_module, exc.title, None)
    if not (isinstance(root, type) and issubclass(root, BaseModel)):
        root = None
    rows = []  # (loc, tag site, branch, mismatch, err)
    for err in exc.errors(include_url=False):
        raw = tuple(err["loc"])
        loc, tag_at = _split_loc(raw, data, err["type"])
        site = loc[:tag_at] if tag_at is not None else None
        # the member's tag: the first raw part that is not a field of the clean path
        branch = next(
            (p for p, q in zip(raw, loc + (None,) * len(raw), strict=False) if p != q), None
        )
        mismatch = err["type"] in _MISMATCH or err["type"] == "literal_error"
        rows.append((loc, site, branch, mismatch and len(loc) == len(site or ()), err))

    # union pruning: per union site, keep the members the value has the shape of
    by_site: dict[Loc, dict[Any, list[tuple[Any, ...]]]] = {}
    for row in rows:
        if row[1] is not None:
            by_site.setdefault(row[1], {}).setdefault(row[2], []).append(row)
    drop: set[int] = set()
    merged: dict[Loc, str] = {}
    for site, branches in by_site.items():
        if len(branches) < 2:
            continue
        shaped = [b for b, rs in branches.items() if not all(r[3] for r in rs)]
        for b, rs in branches.items():
            if b not in shaped:
                drop.update(id(r) for r in rs)
        if not shaped:
            wants = []
            for rs in branches.values():
                for r in rs:
                    e = r[4]
                    w = (
                        f"one of {(e.get('ctx') or {}).get('expected')}"
                        if e["type"] == "literal_error"
                        else _MISMATCH[e["type"]]
                    )
                    if w not in wants:
                        wants.append(w)
            got = next(iter(branches.values()))[0][4].get("input")
            if "a list" in wants and any(w.startswith("one of") for w in wants):
                wants = [w if w != "a list" else "a list of them" for w in wants]
                merged[site] = f"must be {', or '.join(wants)}, got {_show(got)}"
            else:
                merged[site] = f"must be {' or '.join(wants)}, got {_show(got)}"

    msgs: list[str] = []

    def emit(loc: Loc, msg: str) -> None:
        line = line_for(loc, lines)
        text = f"{path}{f':{line}' if line else ''}: {format_loc(loc)}: {msg}"
        if text not in msgs:
            msgs.append(text)

    for row in rows:
        if row[1] in merged:
            emit(prefix + row[1], merged[row[1]])
        if id(row) in drop:
            continue
        loc, err = row[0], row[4]
        full = prefix + loc
        t = err["type"]
        msg = _short_message(err)
        if t in {"value_error", "assertion_error"}:
            error = (err.get("ctx") or {}).get("error")
            for text in error.problems if isinstance(error, CrossFieldErrors) else [msg]:
                # validators name the field they reject relative to their model: "hidden: ..."
                at, text = full, text
                m = _EMBEDDED_PATH.match(text)
                rel = _parse_loc(m.group(1)) if m else ()
                if rel and loc and rel[0] == loc[-1]:  # a field validator naming its own field
                    at, text = prefix + loc[:-1] + rel, m.group(2)
                elif rel:  # a model validator naming one of its fields
                    allowed = _allowed_keys(root, loc) if root is not None else None
                    if allowed is None or rel[0] in allowed:
                        at, text = full + rel, m.group(2)
                emit(at, text)
            continue
        if t == "extra_forbidden":
            allowed = _allowed_keys(root, loc[:-1]) if root is not None else None
            hint = ""
            if allowed:
                close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
                hint = (
                    f" (did you mean '{close[0]}'?)"
                    if close
                    else f" (allowed: {', '.join(allowed)})"
                )
            emit(full, f"unknown key '{loc[-1]}'{hint}")
            continue
        got = err.get("input")
        if t != "missing" and not (isinstance(got, dict | list) and t not in _MISMATCH):
            msg += f", got {_show(got)}"
        emit(full, msg)
    return "\n".join(msgs)


_KEY = r"[A-Za-z0-9_+\-]+"
_PATH_RE = re.compile(rf"^{_KEY}(\[\d+\])*(\.{_KEY}(\[\d+\])*)*$")


def parse_path(text: str) -> Loc:
    """`routes[0].km` -> ('routes', 0, 'km'): a field path as written in study files and
    messages (the inverse of `format_loc`). Raises ValueError on bad syntax."""
    if not isinstance(text, str) or not _PATH_RE.match(text):
        raise ValueError(
            f"'{text}' is not a field path (expected e.g. routes[0].km, job.sync.mode)"
        )
    out: list[Any] = []
    for part in text.split("."):
        name, *idx = part.split("[")
        out.append(name)
        out.extend(int(i.rstrip("]")) for i in idx)
    return tuple(out)


def _parse_loc(text: str) -> Loc:
    out: list[Any] = []
    for part in text.replace("]", "").split("."):
        pieces = part.split("[")
        if pieces[0]:
            out.append(pieces[0])
        out.extend(int(p) for p in pieces[1:] if p.isdigit())
    return tuple(out)


# ----------------------------------------------------------------------------- cross-field


_TREE = (BaseModel, list, tuple)


def cross_field_problems(value: Any, loc: Loc = ()) -> list[tuple[Loc, str]]:
    """Every cross-field problem of a validated model tree, each with its full field path:
    the checks the models' validators run (`cross_field_problems()`), children first, as
    pydantic runs them, but none skipped because another failed."""
    out: list[tuple[Loc, str]] = []
    if isinstance(value, BaseModel):
        for name, v in value.__dict__.items():  # the field values
            if isinstance(v, _TREE):
                out += cross_field_problems(v, loc + (name,))
        check = getattr(value, "cross_field_problems", None)
        for text in check() if check is not None else []:
            m = _EMBEDDED_PATH.match(text)
            out.append((loc + _parse_loc(m.group(1)), m.group(2)) if m else (loc, text))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            if isinstance(v, _TREE):
                out += cross_field_problems(v, loc + (i,))
    return out


class InputProblems:
    """Input problems collected across checks and raised together (one line each, in file
    order), so that a user fixes them all in one round instead of one per run."""

    def __init__(self, where: Path | str, lines: dict[Loc, int]) -> None:
        self.where, self.lines = where, lines
        self.found: list[tuple[float, int, str]] = []

    def add(self, loc: Loc, msg: str) -> None:
        line = line_for(loc, self.lines)
        self.add_text(f"{self.where}{f':{line}' if line else ''}: {format_loc(loc)}: {msg}", line)

    def add_text(self, text: str, line: int | None = None) -> None:
        if all(t != text for _, _, t in self.found):
            self.found.append((line if line is not None else math.inf, len(self.found), text))

    def raise_any(self) -> None:
        if self.found:
            raise InputError("\n".join(t for _, _, t in sorted(self.found)))


def validate_all(
    cls: type[BaseModel],
    data: Any,
    where: Path | str,
    lines: dict[Loc, int],
    problems: InputProblems | None = None,
) -> Any:
    """`cls` validated from data, with every field error (pydantic) or, once the fields are
    valid, every cross-field problem of the whole tree at once. With `problems`, cross-field
    problems are added there (the caller adds its own checks and raises); without, raised."""
    try:
        obj = cls.model_validate(data, context={DEFER_CROSS_FIELD: True})
    except ValidationError as deferred:
        exc = deferred
        try:  # the same field errors, with the cross-field ones pydantic reaches beside them
            cls.model_validate(data)
        except ValidationError as full:
            exc = full
        raise InputError(validation_message(where, exc, lines, data=data)) from None
    own = problems if problems is not None else InputProblems(where, lines)
    for loc, msg in cross_field_problems(obj):
        own.add(loc, msg)
    if problems is None:
        own.raise_any()
    return obj


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


def build_catalog(
    overrides: dict[str, Any] | None = None,
    *,
    where: str = "catalog",
    lines: dict[Loc, int] | None = None,
    problems: InputProblems | None = None,
    deprecations: list[tuple[Loc, str]] | None = None,
) -> Catalog | None:
    """The built-in catalog with `overrides` merged in; `lines` (of the instance file, keyed
    by paths starting with 'catalog') locate errors in the overrides. With `problems`, errors
    are added there and None returned; without, raised. Deprecated keys in the overrides are
    read under their new names, each noted in `deprecations` (field path, text)."""
    lines = lines if lines is not None else {}
    own = problems if problems is not None else InputProblems(where, lines)
    over = _renamed_catalog_keys(overrides or {}, own, lines, deprecations)
    data = _deep_merge(default_catalog_data(), over)
    catalog = None
    try:
        catalog = Catalog.model_validate(data)
    except ValidationError as exc:
        text = validation_message(where, exc, lines, prefix=("catalog",), data=data)
        for ln in text.splitlines():
            m = re.match(r"^.*?:(\d+): ", ln)
            own.add_text(ln, int(m.group(1)) if m else None)
    if problems is None:
        own.raise_any()
    return catalog


def _renamed_catalog_keys(
    overrides: dict[str, Any],
    problems: InputProblems,
    lines: dict[Loc, int],
    deprecations: list[tuple[Loc, str]] | None,
) -> dict[str, Any]:
    """Overrides with the GPU keys renamed for units (placer.schema.RENAMED_GPU_KEYS) under
    their new names, before the merge: an old key must override the built-in new one."""
    gpus = overrides.get("gpus")
    if not isinstance(gpus, dict) or not any(
        isinstance(e, dict) and any(k in e for k in RENAMED_GPU_KEYS) for e in gpus.values()
    ):
        return overrides
    renamed = {}
    for name, entry in gpus.items():
        if not isinstance(entry, dict):
            renamed[name] = entry
            continue
        renamed[name], used, conflicts = upgrade_gpu_keys(entry)
        for text in conflicts:
            new, _, msg = text.partition(": ")
            problems.add(("catalog", "gpus", name, new), msg)
        for old in used:
            loc = ("catalog", "gpus", name, old)
            new_loc = loc[:-1] + (RENAMED_GPU_KEYS[old][0],)
            if loc in lines:  # errors in the value name the new key, on the old key's line
                lines.setdefault(new_loc, lines[loc])
            if deprecations is not None:
                deprecations.append((loc, renamed_key_warning(old)))
            warnings.warn(
                f"{format_loc(loc)}: {renamed_key_warning(old)}", DeprecationWarning, stacklevel=4
            )
    return {**overrides, "gpus": renamed}


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
    known = sorted(
        {p.stem for d in model_search_dirs(base) if d.is_dir() for p in d.glob("*.yaml")}
    )
    raise InputError(f"unknown model '{name_or_path}' (known: {', '.join(known)})")


def _load_model_file(path: Path) -> ModelSpec:
    data, lines = read_document(path)
    return validate_all(ModelSpec, data, path, lines)


# ----------------------------------------------------------------------------- instance


@dataclass(frozen=True)
class Problem:
    """An instance with its catalog merged and its model resolved: what the solver reads."""

    instance: Instance
    catalog: Catalog
    model: ModelSpec
    path: Path | None = None
    lines: dict[Loc, int] = field(
        default_factory=dict, compare=False, repr=False
    )  # field path -> line
    deprecations: tuple[tuple[Loc, str], ...] = field(
        default=(), compare=False, repr=False
    )  # (field path, text) per deprecated key read: warnings of kind 'deprecated'

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
    problems = InputProblems(where, lines)
    if isinstance(data, Instance):
        inst = data
        for loc, msg in cross_field_problems(inst):
            problems.add(loc, msg)
    else:
        inst = validate_all(Instance, data, where, lines, problems)
    deprecations: list[tuple[Loc, str]] = []
    catalog = build_catalog(
        inst.catalog, where=str(where), lines=lines, problems=problems, deprecations=deprecations
    )
    known = set(catalog.gpus) if catalog is not None else set()
    for i, s in enumerate(inst.sites):
        if catalog is not None and s.gpu not in catalog.gpus:
            problems.add(
                ("sites", i, "gpu"),
                f"unknown GPU '{s.gpu}' (catalog: {', '.join(sorted(catalog.gpus))})",
            )
    inst = _resolve_hosts(inst, catalog, problems, base, known)
    model: ModelSpec | None
    if isinstance(inst.job.model, str):
        try:
            model = load_model(inst.job.model, base)
        except InputError as exc:
            problems.add(("job", "model"), str(exc))
            model = None
    else:
        model = inst.job.model
    if model is not None and inst.job.seq_len is not None:
        model = model.model_copy(update={"seq_len": inst.job.seq_len})
    par = inst.job.parallelism
    if par.tp and catalog is not None:
        for i, s in enumerate(inst.sites):
            if s.gpu not in known:
                continue
            gpn = s.gpus_per_node or catalog.gpus[s.gpu].gpus_per_node
            if all(t > gpn for t in par.tp):
                if s.gpus_per_node is not None:  # the site's own node size is what is out of line
                    problems.add(
                        ("sites", i, "gpus_per_node"),
                        f"{gpn} GPUs per node fit none of the tensor-parallel candidates job.parallelism.tp = {list(par.tp)} "  # noqa: E501
                        f"(a tp group sits in one node)",
                    )
                else:
                    problems.add(
                        ("job", "parallelism", "tp"),
                        f"no candidate fits inside a node of site '{s.name}' ({gpn} GPUs)",
                    )
    problems.raise_any()
    assert catalog is not None and model is not None  # no problems: both were built
    return Problem(
        instance=inst,
        catalog=catalog,
        model=model,
        path=Path(where) if isinstance(where, Path) else None,
        lines=lines,
        deprecations=tuple(deprecations),
    )


def read_hostfile(path: Path) -> list[str]:
    """Host names of a hostfile: the first word of each line; blank lines and '#' comments
    skipped (so an MPI hostfile with `slots=` columns reads too)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the hostfile ({exc.strerror})") from None
    out = []
    for ln in text.splitlines():
        word = ln.split("#", 1)[0].split()
        if word:
            out.append(word[0])
    return out


def _resolve_hosts(
    inst: Instance,
    catalog: Catalog | None,
    problems: InputProblems,
    base: Path | None,
    known: set[str],
) -> Instance:
    """Check host sizes against the NVLink domain and read hostfiles into `hosts`, so that
    every later stage sees one list of host names per site (or none: placeholders). Sites
    whose GPU is not in the catalog are skipped (their GPU is the problem reported)."""
    from placer.rules import default_gpus_per_host

    sites = []
    changed = False
    for i, s in enumerate(inst.sites):
        sites.append(s)
        if catalog is None or s.gpu not in known:
            continue
        spec = catalog.gpus[s.gpu]
        domain = s.gpus_per_node or spec.gpus_per_node
        host = default_gpus_per_host(s.gpus_per_host, domain, spec.gpus_per_host)
        if domain % host:
            field = "gpus_per_host" if s.gpus_per_host is not None else "gpus_per_node"
            problems.add(
                ("sites", i, field),
                f"the NVLink domain ({domain} GPUs) must be a whole number of hosts of {host} GPUs",
            )
            continue  # the host count below would rest on a host size that does not fit
        hosts = s.hosts
        if s.hostfile is not None:
            if hosts is not None:
                problems.add(("sites", i, "hostfile"), "give either hosts or hostfile, not both")
                continue
            path = Path(s.hostfile)
            if not path.is_absolute() and base is not None:
                path = base / path
            try:
                hosts = read_hostfile(path)
            except InputError as exc:
                problems.add_text(str(exc), line_for(("sites", i, "hostfile"), problems.lines))
                continue
            bad = [h for h in hosts if not re.fullmatch(HOST_PATTERN, h)]
            if bad:
                problems.add(("sites", i, "hostfile"), f"{path}: not a host name: '{bad[0]}'")
        if hosts is not None:
            want = -(-s.gpus // host)
            if len(hosts) != want:
                problems.add(
                    ("sites", i, "hostfile" if s.hostfile else "hosts"),
                    f"site '{s.name}' has {s.gpus} GPUs = {want} hosts of {host} GPUs, {len(hosts)} host names given",  # noqa: E501
                )
            dup = sorted({h for h in hosts if hosts.count(h) > 1})
            if dup:
                problems.add(
                    ("sites", i, "hostfile" if s.hostfile else "hosts"),
                    f"host '{dup[0]}' named twice",
                )
        if hosts != s.hosts:
            sites[-1] = s.model_copy(update={"hosts": hosts})
            changed = True
    return inst.model_copy(update={"sites": sites}) if changed else inst


def problem_with(problem: Problem, **updates: Any) -> Problem:
    """A copy of the problem with top-level instance fields replaced (the resolved model
    goes inline, so the copy does not depend on the models/ folder)."""
    data = problem.instance.model_dump(mode="json")
    data.update(updates)
    data["job"]["model"] = problem.model.model_dump(mode="json")
    data["job"]["seq_len"] = None
    return problem_from_data(data)


# ----------------------------------------------------------------------------- plan


def load_plan(path: str | os.PathLike[str]) -> Plan:
    p = Path(path)
    data, lines = read_document(p)
    return plan_from_data(data, where=p, lines=lines)


def plan_from_data(
    data: Any, *, where: Path | str = "<plan>", lines: dict[Loc, int] | None = None
) -> Plan:
    if isinstance(data, Plan):
        return data
    return validate_all(Plan, data, where, lines or {})


# ----------------------------------------------------------------------------- writing


def write_atomic(path: str | os.PathLike[str], text: str | bytes) -> None:
    """Write via a temporary file in the same folder and rename: never a partial file."""
    p = Path(path)
    try:
        _write_atomic(p, text)
    except OSError as exc:  # a full disk, a read-only folder, a file where a folder belongs
        raise InputError(f"{exc.filename or p}: cannot write ({exc.strerror or exc})") from None


def _write_atomic(p: Path, text: str) -> None:
    if p.is_dir():
        raise IsADirectoryError(21, "is a folder", str(p))
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; outputs are ordinary files
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def json_safe(data: Any) -> Any:
    """The data with every infinite or NaN number replaced by null, so the text is JSON
    (Python's json would write Infinity). null in a numeric field of placer's JSON output
    means "unbounded / not attainable" (e.g. the step time of a plan that breaks a limit)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [json_safe(v) for v in data]
    return data


def dumps_json(data: Any, default: Any = None) -> str:
    """JSON text of placer's outputs: valid JSON always (see json_safe)."""
    if default is not None:
        data = json.loads(json.dumps(data, default=default, allow_nan=True))
    return json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n"


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    write_atomic(path, dumps_json(data))
