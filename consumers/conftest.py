"""Consumer tier (make test-consumers): placer's exports run in the real tools.

The exports are made by the Makefile with placer's own venv (PLACER_EXPORT, PLACER_EXPORT_02);
this venv holds the tools only: torch 2.13.0 (CPU), megatron-core, torchtitan (and 0.2.2 in
TORCHTITAN_02_PATH), Debian's slurm-wlm. Skip-proof: under CI=true a missing tool fails the
test instead of skipping it; only the Megatron-LM source check (MEGATRON_LM_SRC, no package
ships megatron/training) may skip.
"""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require(ok: bool, what: str) -> None:
    """Skip outside CI when a tool is missing; fail in CI, where .ci/run installs everything."""
    if not ok:
        if IN_CI:
            pytest.fail(f"consumer tier: {what} is missing in CI (.ci/run must install it)")
        pytest.skip(f"{what} is missing (run `make test-consumers`, which installs it)")


def require_cmd(*names: str) -> None:
    for n in names:
        require(shutil.which(n) is not None, f"command '{n}'")


@pytest.fixture(scope="session")
def export_dir() -> Path:
    d = Path(os.environ.get("PLACER_EXPORT", ROOT / "build" / "consumers" / "export"))
    require((d / "rankmap.csv").exists(), f"placer's export in {d} (make test-consumers writes it)")
    return d


@pytest.fixture(scope="session")
def rankmap(export_dir: Path) -> list[dict[str, str]]:
    with open(export_dir / "rankmap.csv") as f:
        return list(csv.DictReader(f))


MEGATRON_VALIDATE = ROOT / "consumers" / "megatron_validate.py"


def megatron_lm_src() -> str:
    """The Megatron-LM checkout (MEGATRON_LM_SRC) whose argument checks judge an export;
    the one check allowed to skip: megatron/training is on no package registry."""
    src = os.environ.get("MEGATRON_LM_SRC")
    if not src:
        pytest.skip(
            "MEGATRON_LM_SRC not set: Megatron-LM's megatron/training is not on any package registry"  # noqa: E501
        )
    return src


def megatron_validate(export: Path, world: int, arch: int = 9) -> dict:
    """Megatron-LM's parse_args + validate_args on the export's megatron_args.sh, sourced
    first as a user would (consumers/megatron_validate.py); the arguments it settled on."""
    import json
    import subprocess
    import sys

    src = megatron_lm_src()
    cmd = f"source {export / 'megatron_args.sh'} && exec {sys.executable} {MEGATRON_VALIDATE} {src} {export} {arch}"  # noqa: E501
    ok = subprocess.run(
        ["bash", "-c", cmd],
        env=os.environ | {"WORLD_SIZE": str(world)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    return json.loads(ok.stdout.strip().splitlines()[-1])
