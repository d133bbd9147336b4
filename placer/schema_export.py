"""JSON Schemas of the file formats, with the built-in catalog shown (no hidden constants)."""

from __future__ import annotations

import json

from placer.io import default_catalog_data
from placer.schema import Instance, ModelSpec, Plan

SCHEMA_URL = "https://json-schema.org/draft/2020-12/schema"


def schema_dict(kind: str) -> dict:
    model = {"instance": Instance, "model": ModelSpec, "plan": Plan}[kind]
    data = model.model_json_schema()
    data["$schema"] = SCHEMA_URL
    if kind == "instance":
        data["properties"]["catalog"]["description"] = (
            "Additions and overrides merged over the built-in catalog shown in x-default-catalog "
            "(every number there carries a source or the word 'assumption')."
        )
        data["x-default-catalog"] = default_catalog_data()
    return data


def schema_json(kind: str) -> str:
    return json.dumps(schema_dict(kind), indent=2, sort_keys=True) + "\n"
