"""Every shipped instance has a hand-written plan (instances/plans/<name>.json) that the
evaluator accepts, through the CLI and the Python API; `--simulate` agrees with the closed
form of the 1F1B pipeline."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

import placer
from placer.cli import app

ROOT = Path(__file__).resolve().parent.parent
INSTANCES = sorted((ROOT / "instances").glob("*.yaml"))
PLAN_KEYS = {"parallelism", "stage_layers", "replica_groups", "links", "sync_mode"}
IDS = [p.stem for p in INSTANCES]


def plan_path(instance: Path) -> Path:
    return ROOT / "instances" / "plans" / f"{placer.load_instance(instance).name}.json"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "placer.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@cache
def cli_runs() -> dict[str, subprocess.CompletedProcess[str]]:
    """`placer evaluate X plans/X.json --simulate` for every instance, and `placer validate
    instances/*.yaml`, each in a fresh interpreter, run in parallel."""
    jobs = {p.stem: ("evaluate", str(p), str(plan_path(p)), "--simulate") for p in INSTANCES}
    jobs["validate"] = ("validate", *(str(p) for p in INSTANCES))
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {k: pool.submit(_cli, *args) for k, args in jobs.items()}
        return {k: f.result() for k, f in futures.items()}


def test_instances_exist() -> None:
    assert len(INSTANCES) >= 4


def test_validate_all_instances() -> None:
    r = cli_runs()["validate"]
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("ok ") == len(INSTANCES)


@pytest.mark.parametrize("instance", INSTANCES, ids=IDS)
def test_plan_is_shipped_with_input_keys_only(instance: Path) -> None:
    path = plan_path(instance)
    assert path.is_file(), f"no hand-written plan {path.relative_to(ROOT)} for {instance.name}"
    data = json.loads(path.read_text())
    assert set(data) <= PLAN_KEYS, (
        f"{path.name}: only plan input keys, got {sorted(set(data) - PLAN_KEYS)}"
    )
    assert {"parallelism", "stage_layers", "replica_groups", "links"} <= set(data)


@pytest.mark.parametrize("instance", INSTANCES, ids=IDS)
def test_plan_feasible_through_cli(instance: Path) -> None:
    r = cli_runs()[instance.stem]
    assert r.returncode == 0, r.stdout + r.stderr
    assert "feasible" in r.stdout and "INFEASIBLE" not in r.stdout
    assert "1F1B simulation" in r.stdout
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("instance", INSTANCES, ids=IDS)
def test_plan_feasible_through_api(instance: Path) -> None:
    prob = placer.load_instance(instance)
    plan = json.loads(plan_path(instance).read_text())
    ev = placer.evaluate(prob, plan)
    assert ev.feasible, [str(v) for v in ev.violations]
    assert ev.violations == []
    assert 0 < ev.step_time_s < float("inf") and 0 < ev.mfu < 1
    # what feasible means, spelled out
    par = plan["parallelism"]
    width = par["tp"] * par.get("cp", 1) * par.get("ep", 1)  # a replica stage's GPUs
    assert sum(ev.gpus_by_site.values()) == width * par["pp"] * par["dp"]
    for site in prob.instance.sites:
        assert ev.gpus_by_site[site.name] <= site.gpus
        if site.power_mw is not None:
            assert ev.power_mw[site.name] <= site.power_mw
    if prob.instance.objective.max_cost_usd is not None:
        assert ev.capex_usd <= prob.instance.objective.max_cost_usd
    assert sum(plan["stage_layers"]) == prob.model.layers
    mb = par["micro_batch"] * par["dp"] * par.get("ep", 1) * ev.config.num_micro_batches
    assert mb == prob.instance.job.global_batch


@pytest.mark.parametrize("instance", INSTANCES, ids=IDS)
def test_simulation_matches_closed_form(instance: Path) -> None:
    r = CliRunner().invoke(
        app, ["evaluate", str(instance), str(plan_path(instance)), "--simulate", "--json"]
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    sim = data["simulation"]
    assert sim is not None
    assert sim["pipeline_s"] == pytest.approx(sim["closed_form_s"], rel=0.01)
    assert sim["rel_diff"] < 0.01
    # the closed form is the evaluator's pipeline time: step time minus data-parallel sync
    pipe_s = data["step_time_s"] - data["breakdown"]["dp_sync_s"]
    assert sim["pipeline_s"] == pytest.approx(pipe_s, rel=0.01)
