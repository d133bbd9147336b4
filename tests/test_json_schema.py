"""The checked-in JSON Schemas, run by a JSON Schema validator (the `jsonschema` package, as an
editor's language server would): every shipped file passes, and the instance schema types
`catalog:`, so a misspelt catalog key is caught in the editor, not only by placer."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

from placer.errors import InputError
from placer.io import default_catalog_data, problem_from_data

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = {
    "instance": sorted((ROOT / "instances").glob("*.yaml"))
    + [ROOT / "consumers/case/instance.yaml"],
    "model": sorted((ROOT / "models").glob("*.yaml")),
    "plan": sorted((ROOT / "instances" / "plans").glob("*.json"))
    + [ROOT / "consumers/case/plan.json"],
}


def _validator(kind: str) -> Draft202012Validator:
    schema = json.loads((ROOT / "schema" / f"{kind}.schema.json").read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


INSTANCE = _validator("instance")


def _errors(data: dict) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in INSTANCE.iter_errors(data)
    ]


@pytest.mark.parametrize("kind", sorted(SHIPPED))
def test_every_shipped_file_passes_its_schema(kind: str) -> None:
    validator = _validator(kind)
    assert SHIPPED[kind]
    for path in SHIPPED[kind]:
        data = yaml.safe_load(path.read_text())
        errors = [e.message for e in validator.iter_errors(data)]
        assert not errors, f"{path.relative_to(ROOT)}: {errors}"


def _instance(catalog: dict) -> dict:
    data = yaml.safe_load((ROOT / "instances" / "two-campus-100km.yaml").read_text())
    data["job"]["model"] = str(ROOT / "models" / f"{data['job']['model']}.yaml")
    data["catalog"] = catalog
    return data


def _placer_accepts(data: dict) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            problem_from_data(copy.deepcopy(data))
    except InputError:
        return False
    return True


NEW_GPU = {k: v for k, v in default_catalog_data()["gpus"]["h100-sxm"].items()}

# catalog overrides -> accepted? (placer and the schema must agree on each)
CATALOG_CASES = {
    "builtin-catalog-verbatim": (copy.deepcopy(default_catalog_data()), True),
    "partial-builtin-gpu": ({"gpus": {"h100-sxm": {"hbm_gb": 96}}}, True),
    "typo-in-gpu-key": ({"gpus": {"h100-sxm": {"hbm_gbb": 96}}}, False),
    "typo-in-section": ({"netwrok": {"nic_efficiency": 0.8}}, False),
    "typo-in-network-key": ({"network": {"nic_eficiency": 0.8}}, False),
    "typo-in-costs-key": ({"costs": {"mux_us": 1}}, False),
    "typo-in-optic-key": ({"optics": {"800zr": {"reach": 80}}}, False),
    "string-for-number": ({"gpus": {"h100-sxm": {"hbm_gb": "lots"}}}, False),
    "boolean-for-number": ({"costs": {"mux_usd": True}}, False),
    "below-bound": ({"network": {"nic_efficiency": 1.5}}, False),
    "null-where-optional": ({"gpus": {"h100-sxm": {"nics_per_node": None}}}, True),
    "optional-below-bound": ({"gpus": {"h100-sxm": {"nics_per_node": 0}}}, False),
    "new-gpu-complete": ({"gpus": {"h100-custom": NEW_GPU}}, True),
    "new-gpu-missing-field": (
        {"gpus": {"h100-custom": {k: v for k, v in NEW_GPU.items() if k != "hbm_gb"}}},
        False,
    ),
    "new-gpu-with-old-key": (
        {
            "gpus": {
                "h100-custom": {
                    **{k: v for k, v in NEW_GPU.items() if k != "nvlink_gbytes_per_s_bidir"},
                    "nvlink_gbps_bidir": 900,
                }
            }
        },
        True,
    ),
    "new-gpu-without-either-name": (
        {
            "gpus": {
                "h100-custom": {
                    k: v for k, v in NEW_GPU.items() if k != "nvlink_gbytes_per_s_bidir"
                }
            }
        },
        False,
    ),
    "old-key-on-builtin": ({"gpus": {"h100-sxm": {"hbm_tbps": 3.0}}}, True),
    "new-optic-complete": (
        {
            "optics": {
                "1600zr": {**default_catalog_data()["optics"]["800zr"], "line_rate_gbps": 1600}
            }
        },
        True,
    ),
}


@pytest.mark.parametrize("case", list(CATALOG_CASES))
def test_schema_and_placer_agree_on_catalog_overrides(case: str) -> None:
    catalog, accepted = CATALOG_CASES[case]
    data = _instance(catalog)
    assert _placer_accepts(data) is accepted, "placer"
    errors = _errors(data)
    assert (not errors) is accepted, errors


def test_a_catalog_typo_is_named_by_the_schema() -> None:
    (err,) = _errors(_instance({"gpus": {"h100-sxm": {"hbm_gbb": 96}}}))
    assert err.startswith("catalog.gpus.h100-sxm: ") and "'hbm_gbb'" in err, err


def test_renamed_keys_are_marked_deprecated() -> None:
    gpu = INSTANCE.schema["$defs"]["GpuSpec"]["properties"]
    for old, new in (
        ("nvlink_gbps_bidir", "nvlink_gbytes_per_s_bidir"),
        ("hbm_tbps", "hbm_tbytes_per_s"),
    ):
        assert gpu[old]["deprecated"] is True and new in gpu[old]["description"]
        assert not gpu[new].get("deprecated")


def test_bounds_of_optional_numbers_are_standard_keywords() -> None:
    """pydantic writes `ge`/`le` for `int | None = Field(ge=1)`, which JSON Schema ignores;
    the schema says minimum/maximum, so a site's `gpus_per_node: 0` is caught too."""
    text = (ROOT / "schema" / "instance.schema.json").read_text()
    assert '"ge":' not in text and '"le":' not in text
    data = _instance({})
    data["sites"][0]["gpus_per_node"] = 0
    assert any("sites.0.gpus_per_node" in e for e in _errors(data))
