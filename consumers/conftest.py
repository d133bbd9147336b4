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
