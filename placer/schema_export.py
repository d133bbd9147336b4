"""JSON Schemas of the file formats, with the built-in catalog shown (no hidden constants).

The instance schema types `catalog:` (the overrides merged over the built-in catalog), so an
editor flags a misspelt key or a wrong value there as it does elsewhere: a built-in GPU or
optic may be overridden field by field, a new one needs every required field, and the keys
renamed for units (placer.schema.RENAMED_GPU_KEYS) are accepted and marked deprecated.
"""

from __future__ import annotations

import copy
import json
import typing
from typing import Any

from placer.io import default_catalog_data
from placer.schema import (
    RENAMED_GPU_KEYS,
    Catalog,
    Instance,
    ModelSpec,
    Plan,
    renamed_key_warning,
)

SCHEMA_URL = "https://json-schema.org/draft/2020-12/schema"
REF = "#/$defs/{model}"

# pydantic leaves the bounds of an optional number (`int | None = Field(ge=1)`) as its own
# keywords, which JSON Schema ignores: the standard names make editors check them
_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def _standard_bounds(node: Any) -> Any:
    if isinstance(node, dict):
        if node.get("type") in {"integer", "number"}:
            for k, std in _BOUNDS.items():
                if k in node:
                    node[std] = node.pop(k)
        for v in node.values():
            _standard_bounds(v)
    elif isinstance(node, list):
        for v in node:
            _standard_bounds(v)
    return node


def _partial(spec: dict[str, Any]) -> dict[str, Any]:
    """An override of a built-in entry or section: every field optional, none unknown."""
    out = copy.deepcopy(spec)
    out.pop("required", None)
    out.pop("allOf", None)
    out["title"] = f"{spec.get('title', '')} override".strip()
    return out


def _with_renamed_keys(gpu: dict[str, Any]) -> dict[str, Any]:
    """The GPU entry schema accepting each renamed key under its old name (deprecated), with
    one of the two names required where the new one is."""
    out = copy.deepcopy(gpu)
    required = out.get("required", [])
    either = []
    for old, (new, _unit) in RENAMED_GPU_KEYS.items():
        prop = copy.deepcopy(out["properties"][new])
        prop["title"] = old
        prop["deprecated"] = True
        prop["description"] = f"deprecated name of {new}: {renamed_key_warning(old)}"
        prop["deprecationMessage"] = prop["description"]  # VS Code's keyword for the same
        out["properties"][old] = prop
        if new in required:
            required.remove(new)
            either.append({"anyOf": [{"required": [new]}, {"required": [old]}]})
    if either:
        out["allOf"] = either
    return out


def catalog_override_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """(schema of `catalog:`, the $defs it refers to)."""
    full = Catalog.model_json_schema(ref_template=REF)
    defs: dict[str, Any] = _standard_bounds(full.pop("$defs"))
    defs["GpuSpec"] = _with_renamed_keys(defs["GpuSpec"])
    builtin = default_catalog_data()
    props: dict[str, Any] = {}
    for section, info in Catalog.model_fields.items():
        ann = info.annotation
        if typing.get_origin(ann) is dict:  # gpus, optics: named entries
            entry = typing.get_args(ann)[1].__name__
            defs[f"{entry}Override"] = _partial(defs[entry])
            props[section] = {
                "type": "object",
                "description": f"{section}: a built-in name overrides its fields, a new name "
                f"needs every required field (built-in: {', '.join(builtin[section])})",
                "properties": {
                    name: {"$ref": REF.format(model=f"{entry}Override")}
                    for name in builtin[section]
                },
                "additionalProperties": {"$ref": REF.format(model=entry)},
            }
        else:  # network, costs, ...: one section, overridden field by field
            name = ann.__name__
            defs[f"{name}Override"] = _partial(defs[name])
            props[section] = {"$ref": REF.format(model=f"{name}Override")}
    schema = {
        "type": "object",
        "title": "Catalog overrides",
        "description": "Additions and overrides merged over the built-in catalog shown in "
        "x-default-catalog (every number there carries a source or the word 'assumption').",
        "properties": props,
        "additionalProperties": False,
    }
    return schema, defs


def schema_dict(kind: str) -> dict:
    model = {"instance": Instance, "model": ModelSpec, "plan": Plan}[kind]
    data = _standard_bounds(model.model_json_schema())
    data["$schema"] = SCHEMA_URL
    if kind == "instance":
        catalog, defs = catalog_override_schema()
        clash = set(defs) & set(data["$defs"])
        assert not clash, f"catalog schema names clash with the instance's: {clash}"
        data["$defs"].update(defs)
        catalog["default"] = data["properties"]["catalog"].get("default", {})
        data["properties"]["catalog"] = catalog
        data["x-default-catalog"] = default_catalog_data()
    return data


def schema_json(kind: str) -> str:
    return json.dumps(schema_dict(kind), indent=2, sort_keys=True) + "\n"
