"""CONTRACT section 4: under `--json` stdout is exactly one JSON document, for every backend,
from the CLI and from the Python API; solver output (HiGHS' banner) goes to stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTANCE = ROOT / "instances" / "two-campus-100km.yaml"


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    # a fresh interpreter: HiGHS prints its banner once per process, at the first solver object
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT
    )


@pytest.mark.parametrize("backend", ["milp", "cpsat"])
def test_cli_json_stdout_is_one_document(backend: str, tmp_path: Path) -> None:
    r = _run(
        [
            "-m",
            "placer.cli",
            "solve",
            str(INSTANCE),
            "--backend",
            backend,
            "--json",
            "--time-limit",
            "60",
        ]
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)  # raises on a banner or any other text around the document
    assert plan["instance"] == "two-campus-100km" and plan["status"] == "optimal"
    if backend == "milp":
        assert "HiGHS" in r.stderr  # the banner still reaches the user, on stderr


@pytest.mark.parametrize("backend", ["milp", "cpsat"])
def test_api_solve_prints_nothing_on_stdout(backend: str) -> None:
    code = f"import placer; p = placer.solve(placer.load_instance({str(INSTANCE)!r}), backend={backend!r}, time_limit_s=60); assert p.status == 'optimal'"  # noqa: E501
    r = _run(["-c", code])
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""


def test_cli_json_with_output_dir_writes_the_files_too(tmp_path: Path) -> None:
    out = tmp_path / "o"
    r = _run(
        [
            "-m",
            "placer.cli",
            "solve",
            str(INSTANCE),
            "--backend",
            "milp",
            "--json",
            "-o",
            str(out),
            "-q",
        ]
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert json.loads((out / "plan.json").read_text()) == plan
    assert (out / "bom.csv").read_text().strip() and (out / "report.md").read_text().strip()
