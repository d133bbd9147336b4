"""Warnings (placer.diagnostics): implausible values, unreachable routes, single points of
failure and unused sites are flagged, with the file, line and field, and only when true."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from placer.cli import app
from placer.diagnostics import instance_warnings, plan_warnings
from placer.evaluate import evaluate
from placer.io import load_instance, problem_from_data
from placer.schema import Plan

REPO = Path(__file__).resolve().parents[1]
TWO = REPO / "instances" / "two-campus-100km.yaml"


def _data() -> dict:
    data = yaml.safe_load(TWO.read_text())
    data["job"]["model"] = str(REPO / "models" / f"{data['job']['model']}.yaml")
    return data


def _plan(waves: int, count_south: int = 32) -> Plan:
    plan = json.loads((REPO / "instances" / "plans" / "two-campus-100km.json").read_text())
    plan["links"][0]["waves"] = waves
    return Plan.model_validate(plan)


def test_shipped_instances_are_plausible() -> None:
    for path in sorted((REPO / "instances").glob("*.yaml")):
        assert [
            w for w in instance_warnings(load_instance(path)) if w.kind == "implausible"
        ] == [], path


def test_implausible_values_name_file_line_and_field(tmp_path: Path) -> None:
    data = _data()
    data["routes"][0]["km"] = 5000  # beyond every optic's reach and the plausible ceiling
    data["routes"][0]["latency_ms"] = 10.0  # 5,000 km take >= 16.7 ms even in vacuum
    data["sites"][0]["power_mw"] = 8000
    data["sites"][1]["pue"] = 2.5
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    lines = path.read_text().splitlines()
    ws = {(w.kind, w.where): w.message for w in instance_warnings(load_instance(path))}
    assert set(ws) == {
        ("implausible", "routes[0].km"),
        ("implausible", "routes[0].latency_ms"),
        ("implausible", "sites[0].power_mw"),
        ("implausible", "sites[1].pue"),
        ("unreachable", "routes[0].km"),
    }
    km_line = next(i for i, t in enumerate(lines, 1) if t.strip().startswith("km:"))
    assert ws[("implausible", "routes[0].km")].startswith(
        f"{path}:{km_line}: routes[0].km: 5000 km"
    )
    assert "faster than light in vacuum (16.7 ms)" in ws[("implausible", "routes[0].latency_ms")]
    r = CliRunner().invoke(app, ["validate", str(path)])
    assert r.exit_code == 0 and "warning: implausible" in r.output


def test_latency_below_fiber_but_above_vacuum() -> None:
    data = _data()
    data["routes"][0]["latency_ms"] = 0.4  # 100 km: fiber 0.49 ms, vacuum 0.334 ms
    (w,) = instance_warnings(problem_from_data(data))
    assert (
        w.where == "routes[0].latency_ms"
        and "below the fiber's propagation delay (0.49 ms" in w.message
    )


def test_single_wave_between_two_sites_is_a_single_point_of_failure() -> None:
    prob = problem_from_data(_data())
    plan = _plan(1)
    ev = evaluate(prob, plan)
    assert ev.feasible
    (w,) = plan_warnings(prob, plan, ev)
    assert w.kind == "single_point_of_failure" and w.where == "route north-south"
    assert "the only wave on north-south lost" in w.message and "cannot complete" in w.message


def test_no_single_point_when_capacity_survives() -> None:
    data = _data()
    data["routes"][0]["capacity_gbps"] = (
        800  # capacity already in place survives a wave or pair loss
    )
    prob = problem_from_data(data)
    plan = _plan(1)
    assert plan_warnings(prob, plan, evaluate(prob, plan)) == []
    # 2 pairs hold 64 waves of 800ZR at 150 GHz (32 per pair): 33 waves need both pairs, so a
    # pair cut leaves one lit and nothing goes dark
    prob = problem_from_data(_data())
    plan = _plan(33)
    assert plan_warnings(prob, plan, evaluate(prob, plan)) == []
    plan = _plan(32)  # one pair holds all 32: its cut darkens the route
    (w,) = plan_warnings(prob, plan, evaluate(prob, plan))
    assert "a fiber-pair cut on north-south takes all its 32 waves" in w.message


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"power_mw": 0.005}, "power: 0.005 MW cannot feed one 8-GPU node"),
        (
            {"gpus_per_node": 4},
            "size: the plan's tensor-parallel groups of 8 GPUs do not fit its 4-GPU nodes",
        ),
        ({"gpu": "small-hbm"}, "memory: the smallest stage of tp 8 x pp 16 needs"),
    ],
)
def test_unused_site_reasons(change: dict, reason: str) -> None:
    data = _data()
    data["sites"].append({"name": "east", "gpus": 1024, "gpu": "h100-sxm", "power_mw": 5.0})
    data["sites"][2].update(change)
    data["routes"].append({"sites": ["north", "east"], "km": 20})
    data["job"]["parallelism"]["tp"] = [8]
    if "gpus_per_node" in change:
        data["job"]["parallelism"]["tp"] = [4, 8]
    # an H100 whose usable HBM is 1 GB less than the smallest stage of the plan needs
    base = load_instance(TWO)
    least = min(evaluate(base, _plan(32)).memory_gb.values())
    hbm = base.catalog.memory.reserve_gb + least - 1
    data["catalog"] = {
        "gpus": {"small-hbm": {**base.catalog.gpus["h100-sxm"].model_dump(), "hbm_gb": hbm}}
    }
    prob = problem_from_data(data)
    plan = _plan(32)
    ev = evaluate(prob, plan)
    unused = [w for w in plan_warnings(prob, plan, ev) if w.kind == "unused_site"]
    assert len(unused) == 1 and unused[0].where == "sites[2]"
    assert reason in unused[0].message, unused[0].message


def test_unused_site_wan_and_objective() -> None:
    data = _data()
    data["sites"].append({"name": "far", "gpus": 1024, "gpu": "h100-sxm"})
    data["routes"].append({"sites": ["north", "far"], "km": 9000})  # no optic reaches
    prob = problem_from_data(data)
    plan = _plan(32)
    (w,) = [w for w in plan_warnings(prob, plan, evaluate(prob, plan)) if w.kind == "unused_site"]
    assert "WAN: no route that can carry traffic joins it" in w.message
    data2 = copy.deepcopy(data)
    data2["routes"][1]["km"] = 50
    prob = problem_from_data(data2)
    (w,) = [w for w in plan_warnings(prob, plan, evaluate(prob, plan)) if w.kind == "unused_site"]
    assert (
        "not needed" in w.message and "proven optimal" not in w.message
    )  # the hand plan claims no status


def test_solve_writes_warnings_to_plan_report_and_stderr(tmp_path: Path) -> None:
    # the worked example with a budget of one wave: that wave darkens the route when lost
    data = yaml.safe_load(TWO.read_text())
    data["objective"]["max_cost_usd"] = 110_000  # one wave: $102,000
    one = tmp_path / "one-wave.yaml"
    one.write_text(yaml.safe_dump(data))
    r = CliRunner().invoke(app, ["solve", str(one), "-o", str(tmp_path), "-q", "--json"])
    assert r.exit_code == 0
    plan = json.loads(r.stdout)
    kinds = [w["kind"] for w in plan["warnings"]]
    assert plan["links"][0]["waves"] == 1
    assert kinds == ["single_point_of_failure"]
    assert "warning: single_point_of_failure" in r.stderr
    r = CliRunner().invoke(app, ["solve", str(one), "-o", str(tmp_path), "-q"])
    assert "## Warnings" in (tmp_path / "report.md").read_text()
    assert plan["warnings"][0]["message"] in (tmp_path / "report.md").read_text()


def test_unknown_backend_is_bad_input_in_the_api() -> None:
    import placer
    from placer.errors import InputError

    with pytest.raises(
        InputError, match="backend: expected one of cpsat, milp, brute, got 'gurobi'"
    ):
        placer.solve(load_instance(TWO), backend="gurobi")
