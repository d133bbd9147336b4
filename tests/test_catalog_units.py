"""Units read the same in every catalog key (issue 14): `_gbps`/`_tbps` are bits per second,
byte rates say bytes. The renamed keys (nvlink_gbps_bidir, hbm_tbps) are still read, with a
deprecation warning a CLI user sees; both names with different values are an error."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, ValidationError
from typer.testing import CliRunner

import placer.schema as schema
from placer.cli import app
from placer.diagnostics import instance_warnings
from placer.errors import InputError
from placer.evaluate import evaluate
from placer.io import default_catalog_data, load_instance, load_plan
from placer.schema import RENAMED_GPU_KEYS, GpuSpec

pytestmark = pytest.mark.filterwarnings("ignore:.*deprecated key:DeprecationWarning")

REPO = Path(__file__).resolve().parents[1]
TWO = REPO / "instances" / "two-campus-100km.yaml"
PLAN = REPO / "instances" / "plans" / "two-campus-100km.json"


def _write(tmp_path: Path, gpu_override: dict, name: str = "inst.yaml") -> Path:
    data = yaml.safe_load(TWO.read_text())
    data["job"]["model"] = str(REPO / "models" / f"{data['job']['model']}.yaml")
    data["catalog"] = {"gpus": {"h100-sxm": gpu_override}}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _step(path: Path) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        prob = load_instance(path)
    return evaluate(prob, load_plan(PLAN)).step_time_s


def test_old_key_reads_as_the_new_one_with_a_warning(tmp_path: Path) -> None:
    """Half the NVLink bandwidth under the old name gives the step of the new name, not the
    built-in one's (the old key overrides the built-in new key, it is not merged beside it)."""
    old = _write(tmp_path, {"nvlink_gbps_bidir": 450}, "old.yaml")
    new = _write(tmp_path, {"nvlink_gbytes_per_s_bidir": 450}, "new.yaml")
    with pytest.warns(DeprecationWarning, match="nvlink_gbps_bidir: deprecated key"):
        prob = load_instance(old)
    assert prob.catalog.gpus["h100-sxm"].nvlink_gbytes_per_s_bidir == 450
    assert _step(old) == _step(new)
    assert _step(old) > _step(TWO)  # the value is used: slower NVLink, slower step
    (w,) = instance_warnings(prob)
    assert w.kind == "deprecated"
    line = old.read_text().splitlines().index("      nvlink_gbps_bidir: 450") + 1
    assert w.message.startswith(f"{old}:{line}: catalog.gpus.h100-sxm.nvlink_gbps_bidir: ")
    assert "write 'nvlink_gbytes_per_s_bidir' (same value, in GB/s)" in w.message
    assert instance_warnings(load_instance(new)) == []


def test_cli_user_sees_the_deprecation(tmp_path: Path) -> None:
    path = _write(tmp_path, {"hbm_tbps": 3.0})
    r = CliRunner().invoke(app, ["validate", str(path)])
    assert r.exit_code == 0, r.stdout + r.stderr
    assert "warning: deprecated: " in r.stderr
    assert "catalog.gpus.h100-sxm.hbm_tbps: deprecated key: write 'hbm_tbytes_per_s'" in r.stderr
    r = CliRunner().invoke(app, ["evaluate", str(path), str(PLAN), "--json"])
    assert r.exit_code == 0, r.stdout + r.stderr
    kinds = [w["kind"] for w in json.loads(r.stdout)["warnings"]]
    assert "deprecated" in kinds  # plan.json and report.md carry the same warnings


def test_both_names_equal_is_accepted_different_is_an_error(tmp_path: Path) -> None:
    same = _write(tmp_path, {"nvlink_gbps_bidir": 900, "nvlink_gbytes_per_s_bidir": 900}, "s.yaml")
    with pytest.warns(DeprecationWarning):
        assert load_instance(same).catalog.gpus["h100-sxm"].nvlink_gbytes_per_s_bidir == 900
    bad = _write(
        tmp_path,
        {"nvlink_gbps_bidir": 450, "nvlink_gbytes_per_s_bidir": 900, "hbm_tbps": 3, "hbm_gb": -1},
        "b.yaml",
    )
    r = CliRunner().invoke(app, ["validate", str(bad)])
    assert r.exit_code == 2
    text = bad.read_text().splitlines()
    line = text.index("      nvlink_gbytes_per_s_bidir: 900") + 1
    assert (
        f"{bad}:{line}: catalog.gpus.h100-sxm.nvlink_gbytes_per_s_bidir: 900 and the deprecated "
        "'nvlink_gbps_bidir': 450 are both given and differ" in r.stderr
    )
    assert f":{text.index('      hbm_gb: -1') + 1}: catalog.gpus.h100-sxm.hbm_gb: must be > 0" in (
        r.stderr
    )  # listed with the other errors


def test_python_api_reads_old_keys_too() -> None:
    entry = dict(default_catalog_data()["gpus"]["h100-sxm"])
    entry["nvlink_gbps_bidir"] = entry.pop("nvlink_gbytes_per_s_bidir")
    with pytest.warns(DeprecationWarning, match="nvlink_gbps_bidir"):
        spec = GpuSpec.model_validate(entry)
    assert spec.nvlink_gbytes_per_s_bidir == 900
    with pytest.warns(DeprecationWarning):
        assert spec.nvlink_gbps_bidir == 900  # the old attribute, for code written against it
    with pytest.raises(ValidationError, match="both given and differ"):
        GpuSpec.model_validate({**entry, "nvlink_gbytes_per_s_bidir": 1})


def test_shipped_catalog_uses_no_deprecated_key() -> None:
    for name, entry in default_catalog_data()["gpus"].items():
        assert not set(entry) & set(RENAMED_GPU_KEYS), name
    for old, (new, _) in RENAMED_GPU_KEYS.items():
        assert new in GpuSpec.model_fields and old not in GpuSpec.model_fields


def _fields() -> list[tuple[str, str, str]]:
    """(model, field, description) of every catalog and instance model."""
    out = []
    for name in dir(schema):
        cls = getattr(schema, name)
        if (
            isinstance(cls, type)
            and issubclass(cls, BaseModel)
            and cls.__module__ == schema.__name__
        ):
            for f, info in cls.model_fields.items():
                out.append((name, f, info.description or ""))
    return out


def test_rate_keys_name_their_unit() -> None:
    """A key ending in `bps` is a bit rate and says Gbit/s; a byte rate (GB/s, TB/s) says
    bytes in its name. Would catch a new `foo_gbps` holding GB/s, the slip this renamed."""
    fields = _fields()
    assert any(f == "nic_gbps" for _, f, _ in fields)
    for model, f, desc in fields:
        if f.endswith("bps"):
            assert "bit/s" in desc, f"{model}.{f}: a bit rate whose description names no bit/s"
        if "GB/s" in desc or "TB/s" in desc:
            assert "bytes_per_s" in f, f"{model}.{f}: a byte rate named without 'bytes_per_s'"


def test_renamed_key_conflict_is_collected_with_other_problems(tmp_path: Path) -> None:
    bad = _write(tmp_path, {"hbm_tbps": 3, "hbm_tbytes_per_s": 4})
    data = yaml.safe_load(bad.read_text())
    data["sites"][0]["gpu"] = "h900"
    bad.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(InputError) as exc:
        load_instance(bad)
    lines = str(exc.value).splitlines()
    assert len(lines) == 2, lines
    assert "sites[0].gpu: unknown GPU 'h900'" in lines[0]
    assert "catalog.gpus.h100-sxm.hbm_tbytes_per_s: 4 and the deprecated 'hbm_tbps': 3" in lines[1]
