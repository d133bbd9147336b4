"""report.md and the console summary say only what is true of the plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from placer.evaluate import evaluate
from placer.io import load_instance, problem_from_data
from placer.outputs.report import binding_constraints, markdown_report, resilience_section
from placer.schema import Plan

REPO = Path(__file__).resolve().parents[1]


def _two(waves: int) -> tuple:
    prob = load_instance(REPO / "instances" / "two-campus-100km.yaml")
    plan = json.loads((REPO / "instances" / "plans" / "two-campus-100km.json").read_text())
    plan["links"][0]["waves"] = waves
    plan = Plan.model_validate(plan)
    return prob, plan, evaluate(prob, plan)


def test_route_binds_only_when_one_more_wave_helps() -> None:
    # every replica sits inside one campus: the WAN carries the data-parallel sync alone, whose
    # bandwidth term is S / (waves x rate), so one more wave always shortens a 1-wave step
    prob, plan, ev = _two(1)
    lines = [b for b in binding_constraints(prob, ev, plan) if b.startswith("route")]
    assert len(lines) == 1 and "one more wave (2)" in lines[0]
    # 2 pairs x 32 channels (800ZR at 150 GHz over 4.8 THz): 64 waves is the most the route
    # holds, so no wave can be added and nothing is reported as binding
    prob, plan, ev = _two(64)
    assert [b for b in binding_constraints(prob, ev, plan) if b.startswith("route")] == []


def test_spare_waves_table_has_no_negative_cells() -> None:
    res = {
        "survive": ["wave"],
        "collective": "optcc",
        "max_slowdown": 0.0,
        "failures": {},
        "waves_without_resilience": {"a-b": 3, "b-c": 4},
        "spare_waves_ring_by_route": {
            "a-b": -3,
            "b-c": 6,
        },  # the guarantee moved a-b's waves to b-c
        "spare_waves_ring": 3,
        "spare_waves_optcc_by_route": {"a-b": 0, "b-c": 1},
        "spare_waves_optcc": 1,
    }
    rows = [
        r
        for r in resilience_section(res)
        if r.startswith("| a-b") or r.startswith("| b-c") or r.startswith("| **total")
    ]
    assert rows == ["| a-b | 3 | 0 | 3 |", "| b-c | 4 | 10 | 5 |", "| **total** | 7 | 10 | 8 |"]


def test_zero_share_paths_are_not_listed() -> None:
    prob = load_instance(REPO / "instances" / "four-metro-resilient.yaml")
    plan = json.loads((REPO / "instances" / "plans" / "four-metro-resilient.json").read_text())
    plan["routing"] = [
        {
            "phase": "data_parallel",
            "sites": ["n1", "n4"],
            "paths": [
                {"via": ["n1", "n4"], "share": 1.0},
                {"via": ["n1", "n3", "n4"], "share": 0.0},
            ],
        }
    ]
    plan = Plan.model_validate(plan)
    md = markdown_report(prob, plan, evaluate(prob, plan))
    rows = [r for r in md.splitlines() if r.startswith("| data_parallel | n1-n4")]
    assert rows == ["| data_parallel | n1-n4 | n1-n4 | 100.0% | 0.441 |"]


def test_diloco_traffic_is_labelled_per_outer_sync() -> None:
    prob = load_instance(REPO / "instances" / "four-site-metro-longhaul.yaml")
    plan = Plan.model_validate(
        json.loads((REPO / "instances" / "plans" / "four-site-metro-longhaul.json").read_text())
    )
    ev = evaluate(prob, plan)
    assert ev.sync_mode != "synchronous"
    md = markdown_report(prob, plan, ev)
    assert "data-parallel GB/outer sync" in md and "data-parallel GB/step" not in md
    assert f"every {prob.instance.job.sync.every_steps} steps" in md


def test_piped_tables_are_not_cut(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "instances" / "two-campus-100km.yaml").read_text())
    long = "north-campus-of-the-very-long-named-operator-region-1"
    data["sites"][0]["name"] = long
    data["routes"][0]["sites"][0] = long
    data["job"]["model"] = str(REPO / "models" / f"{data['job']['model']}.yaml")
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(data))
    problem_from_data(data)  # valid
    r = subprocess.run(
        [sys.executable, "-m", "placer.cli", "solve", str(path), "-o", str(tmp_path / "out"), "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert f"{long} (stages 0-" in r.stdout  # rich cuts cells to "..." at 80 columns
