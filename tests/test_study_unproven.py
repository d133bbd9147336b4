"""Studies show which points the time limit ended before the proof (issue 12 item 5):
results.csv carries status, proven and gap; plots ring those points; `placer sweep` prints
how many are not proven. A point is stopped at its first plan through CP-SAT's own options
(stop_after_first_solution, one worker: deterministic), the way a time limit ends a large
instance (tests/test_solver_status.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from placer.cli import app
from placer.study.cli import register
from placer.study.plot import plot_lines, unproven
from placer.study.sweep import read_results

if "sweep" not in {
    c.name or (c.callback.__name__ if c.callback else None) for c in app.registered_commands
}:
    register(app)

ROOT = Path(__file__).resolve().parent.parent
STOP = {"stop_after_first_solution": True, "num_workers": 1}


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("unproven")
    base = (ROOT / "instances" / "deepseek-v3-two-sites.yaml").read_text()
    (folder / "base.yaml").write_text(base)
    study = {
        "name": "unproven",
        "base": "base.yaml",
        "backend": "cpsat",
        "time_limit_s": 30,
        "points": [{"solver.options": {}}, {"solver.options": STOP}],
    }
    (folder / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    r = CliRunner().invoke(
        app, ["sweep", str(folder / "study.yaml"), "-o", str(folder / "out"), "--workers", "1"]
    )
    assert r.exit_code == 0, r.output
    return folder / "out", r.output


def test_results_carry_status_proven_and_gap(swept: tuple[Path, str]) -> None:
    out, _ = swept
    t = read_results(out)
    assert {"status", "proven", "gap"} <= set(t.columns)
    full, stopped = t.iloc[0], t.iloc[1]
    assert full["status"] == "optimal" and bool(full["proven"]) and full["gap"] == 0
    assert stopped["status"] in ("feasible", "time_limit") and not bool(stopped["proven"])
    assert stopped["gap"] > 0
    # the stopped point's plan is no better than the proven optimum
    assert stopped["step_time_s"] >= full["step_time_s"] * (1 - 1e-9)
    assert list(unproven(t)) == [False, True]


def test_sweep_prints_how_many_points_are_not_proven(swept: tuple[Path, str]) -> None:
    _, output = swept
    assert "1 point(s) not proven optimal" in output


def test_plots_ring_the_points_not_proven(swept: tuple[Path, str]) -> None:
    out, _ = swept
    t = read_results(out)
    t["x"] = [0, 1]
    fig = plot_lines(t, "step_time_s", x="x", by=[])
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert any(lab.startswith("not proven: time limit (1") for lab in labels), labels
