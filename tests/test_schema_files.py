"""The checked-in JSON Schemas (schema/*.schema.json) match the code, and every shipped
instance and model file points its editor at them."""

from __future__ import annotations

from pathlib import Path

import pytest

from placer.schema_export import schema_json

ROOT = Path(__file__).resolve().parent.parent
KINDS = ["instance", "model", "plan"]
HEADERS = {
    "instances": "# yaml-language-server: $schema=../schema/instance.schema.json",
    "models": "# yaml-language-server: $schema=../schema/model.schema.json",
}


@pytest.mark.parametrize("kind", KINDS)
def test_schema_file_is_current(kind: str) -> None:
    path = ROOT / "schema" / f"{kind}.schema.json"
    regen = f".venv/bin/placer schema --kind {kind} -o schema/{kind}.schema.json"
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing; create it with: {regen}"
    assert path.read_text(encoding="utf-8") == schema_json(kind), (
        f"{path.relative_to(ROOT)} is stale (placer/schema.py or the built-in catalog changed); "
        f"regenerate it with: {regen}"
    )


@pytest.mark.parametrize("folder", sorted(HEADERS))
def test_yaml_files_point_at_their_schema(folder: str) -> None:
    files = sorted((ROOT / folder).glob("*.yaml"))
    assert files, f"no {folder}/*.yaml found"
    bad = [
        f.name for f in files if f.read_text(encoding="utf-8").splitlines()[:1] != [HEADERS[folder]]
    ]
    assert not bad, f"{folder}/{{{', '.join(bad)}}}: first line must be '{HEADERS[folder]}'"
