"""Hand-made plans that break one limit each (and one that breaks six at once): the
evaluator names the violated limit, the site or route, and the shortfall, which each test
recomputes by hand from the catalog figures below; the CLI exits 3 and lists them."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import placer
from placer.cli import app
from placer.evaluate import Evaluation, Violation

# ----------------------------------------------------------------------------- hand figures
# Built-in catalog numbers used by the hand computations (checked in test_catalog_figures).
ALL_IN_W = 1275.0  # h100-sxm, W per GPU incl. host and network
GPUS_PER_NODE = 8  # h100-sxm
HBM_GB, RESERVE_GB = 80.0, 6.0
CHANNELS_800 = 4800 // 150  # C band / 800ZR(+) grid: 32 waves per fiber pair
MODULE_W = {"800zr": 28.0, "800zr+": 30.0}
MODULE_USD = {"800zr": 6000.0, "800zr+": 9000.0}
PORT_USD, MUX_USD, AMP_USD, AMP_SPACING_KM = 10000.0, 20000.0, 30000.0, 80.0
PUE = 1.2

# gpt3-175b (models/gpt3-175b.yaml): 96 layers, h 12288, MHA, 4h FFN, vocab 51200, seq 2048, tied
L, H, V, S = 96, 12288, 51200, 2048
PARAMS = L * (12 * H * H + 2 * H) + V * H + H  # blocks + embedding + final norm (tied head)

INSTANCE: dict[str, Any] = {
    "name": "limits-lab",
    "sites": [
        {"name": "a", "gpu": "h100-sxm", "gpus": 1024, "power_mw": 1.0, "pue": PUE},  # 128 nodes
        {"name": "b", "gpu": "h100-sxm", "gpus": 512, "pue": PUE},  # 64 nodes, no power cap
        {"name": "far", "gpu": "h100-sxm", "gpus": 512, "pue": PUE},
    ],
    "routes": [
        {"sites": ["a", "b"], "km": 100, "fiber_pairs": 1},
        {"sites": ["a", "far"], "km": 1500, "fiber_pairs": 1},  # beyond every optic (1000 km max)
    ],
    "job": {"model": "gpt3-175b", "global_batch": 256, "parallelism": {"tp": [8]}},
}


def chains(pp: int, *groups: tuple[int, str]) -> list[dict[str, Any]]:
    return [{"count": n, "stage_sites": [site] * pp} for n, site in groups]


def plan(
    tp: int, pp: int, groups: list[dict[str, Any]], links: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    dp = sum(g["count"] for g in groups)
    return {
        "parallelism": {"tp": tp, "pp": pp, "dp": dp, "micro_batch": 1},
        "stage_layers": [L // pp] * pp,
        "replica_groups": groups,
        "links": links or [],
    }


# 2 + 2 replicas of 16 stages in a and b, data-parallel sync over 4 waves: feasible
BASELINE = plan(
    8, 16, chains(16, (2, "a"), (2, "b")), [{"sites": ["a", "b"], "waves": 4, "optic": "800zr"}]
)


def link_capex(waves: int, optic: str, km: float, pairs_lit: int) -> float:
    per_wave = 2 * MODULE_USD[optic] + 2 * PORT_USD
    per_pair = 2 * MUX_USD + (math.ceil(km / AMP_SPACING_KM) - 1) * AMP_USD
    return waves * per_wave + pairs_lit * per_pair


def memory_gb(tp: int, dp: int) -> float:
    """pp = 1, selective recompute, micro-batch 1, ZeRO-1: one GPU holds all 96 layers."""
    state = PARAMS / tp * (2 + 2 + 12 / dp)  # bf16 weights + grads, fp32 Adam sharded over dp
    act = (
        L * 34 * S * 1 * H / tp
    )  # Korthikanti et al., selective recompute, 1 micro-batch in flight
    logits = 4 * 1 * S * V / tp  # fp32 logits of one micro-batch on the last stage
    return (state + act + logits) / 1e9


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("violations")


def problem(folder: Path, **changes: Any) -> placer.Problem:
    """INSTANCE with top-level keys replaced, written as YAML and loaded like a user's file."""
    data = {**copy.deepcopy(INSTANCE), **changes}
    text = yaml.safe_dump(data, sort_keys=False)
    path = folder / f"inst-{hashlib.sha1(text.encode()).hexdigest()[:10]}.yaml"
    path.write_text(text)
    return placer.load_instance(path)


def only(ev: Evaluation, kind: str) -> Violation:
    assert not ev.feasible
    assert [v.kind for v in ev.violations] == [kind], [str(v) for v in ev.violations]
    return ev.violations[0]


def test_catalog_figures(folder: Path) -> None:
    cat = problem(folder).catalog
    gpu = cat.gpus["h100-sxm"]
    assert (gpu.all_in_w, gpu.gpus_per_node, gpu.hbm_gb, cat.memory.reserve_gb) == (
        ALL_IN_W,
        GPUS_PER_NODE,
        HBM_GB,
        RESERVE_GB,
    )
    for o in ("800zr", "800zr+"):
        assert (cat.optics[o].module_w, cat.optics[o].module_cost_usd) == (
            MODULE_W[o],
            MODULE_USD[o],
        )
        assert cat.channels_per_pair(o) == CHANNELS_800
    assert max(o.reach_km for o in cat.optics.values()) == 1000
    c = cat.costs
    assert (c.router_port_usd, c.mux_usd, c.amplifier_usd, cat.network.amplifier_spacing_km) == (
        PORT_USD,
        MUX_USD,
        AMP_USD,
        AMP_SPACING_KM,
    )


def test_baseline_is_feasible(folder: Path) -> None:
    ev = placer.evaluate(problem(folder), BASELINE)
    assert ev.feasible, [str(v) for v in ev.violations]
    assert ev.capex_usd == link_capex(4, "800zr", 100, 1)


def test_power(folder: Path) -> None:
    # 8 replicas x 16 stages = 128 TP groups of 8 = all 128 nodes of site a
    ev = placer.evaluate(problem(folder), plan(8, 16, chains(16, (8, "a"))))
    v = only(ev, "power")
    draw_mw = 128 * GPUS_PER_NODE * ALL_IN_W * PUE / 1e6  # 1.56672 MW
    assert v.where == "site a"
    assert ev.power_mw["a"] == pytest.approx(draw_mw)
    assert v.shortfall == pytest.approx(draw_mw - 1.0)
    assert "limit 1 MW" in v.message and f"short by {draw_mw - 1:.3f} MW" in v.message


def test_memory(folder: Path) -> None:
    # GPT-3 175B with pp = 1: 8 replicas of one tp=8 stage in site b
    ev = placer.evaluate(problem(folder), plan(8, 1, chains(1, (8, "b"))))
    v = only(ev, "memory")
    need = memory_gb(tp=8, dp=8)  # ~130.3 GB
    assert v.where == "stage 0 at site b (h100-sxm)"
    assert v.shortfall == pytest.approx(need - (HBM_GB - RESERVE_GB), rel=1e-9)
    assert f"needs {need:.1f} GB" in v.message and "74 GB usable" in v.message


def test_memory_names_the_site(folder: Path) -> None:
    ev = placer.evaluate(problem(folder), plan(8, 1, chains(1, (8, "b"))))
    assert "b" in only(ev, "memory").where.split()


def test_reach_with_named_optic(folder: Path) -> None:
    # pipeline split a -> far (1500 km) on 2 waves of 800ZR+ (reach 1000 km)
    groups = [{"count": 8, "stage_sites": ["a", "far"]}]
    ev = placer.evaluate(
        problem(folder),
        plan(8, 2, groups, [{"sites": ["a", "far"], "waves": 2, "optic": "800zr+"}]),
    )
    v = only(ev, "reach")
    assert v.where == "route a-far"
    assert v.shortfall == pytest.approx(1500 - 1000)
    assert "800zr+ reaches 1000 km, route is 1500 km" in v.message


def test_reach_without_optic(folder: Path) -> None:
    """No optic given and none reaches: the route is named, and with no usable waves the
    pipeline traffic on it has no capacity either."""
    groups = [{"count": 8, "stage_sites": ["a", "far"]}]
    ev = placer.evaluate(problem(folder), plan(8, 2, groups, [{"sites": ["a", "far"], "waves": 2}]))
    kinds = {(v.kind, v.where) for v in ev.violations}
    assert kinds == {("reach", "route a-far"), ("channels", "route a-far")}
    reach = next(v for v in ev.violations if v.kind == "reach")
    assert "1500 km" in reach.message and "longest reach 1000 km" in reach.message


def test_reach_without_optic_shortfall(folder: Path) -> None:
    groups = [{"count": 8, "stage_sites": ["a", "far"]}]
    ev = placer.evaluate(problem(folder), plan(8, 2, groups, [{"sites": ["a", "far"], "waves": 2}]))
    reach = next(v for v in ev.violations if v.kind == "reach")
    assert reach.shortfall == pytest.approx(1500 - 1000)


def test_channels(folder: Path) -> None:
    p = copy.deepcopy(BASELINE)
    p["links"] = [{"sites": ["a", "b"], "waves": 40, "optic": "800zr"}]  # 1 pair x 32 channels
    v = only(placer.evaluate(problem(folder), p), "channels")
    assert v.where == "route a-b"
    assert v.shortfall == 40 - 1 * CHANNELS_800
    assert "exceed 32 (1 fiber pairs x 32 channels)" in v.message


def test_channels_max_waves(folder: Path) -> None:
    routes = copy.deepcopy(INSTANCE["routes"])
    routes[0]["max_waves"] = 16
    p = copy.deepcopy(BASELINE)
    p["links"] = [{"sites": ["a", "b"], "waves": 20, "optic": "800zr"}]
    v = only(placer.evaluate(problem(folder, routes=routes), p), "channels")
    assert (v.where, v.shortfall) == ("route a-b", 20 - 16)
    assert "max_waves 16" in v.message


def test_gpus_more_tp_groups_than_nodes(folder: Path) -> None:
    # 8 replicas x 16 stages = 128 TP groups of 8 in site b, which has 64 nodes
    v = only(placer.evaluate(problem(folder), plan(8, 16, chains(16, (8, "b")))), "gpus")
    assert v.where == "site b"
    assert v.shortfall == (128 - 512 // GPUS_PER_NODE) * GPUS_PER_NODE  # 512 GPUs short
    assert "needs 128 nodes" in v.message and "has 64 nodes" in v.message


def test_gpus_tp_larger_than_a_node(folder: Path) -> None:
    ev = placer.evaluate(
        problem(folder), plan(16, 16, chains(16, (1, "a"), (1, "b")), BASELINE["links"])
    )
    assert {(v.kind, v.where) for v in ev.violations} == {("gpus", "site a"), ("gpus", "site b")}
    assert all("tp=16 does not fit in a node of 8 GPUs" in v.message for v in ev.violations)


def test_budget(folder: Path) -> None:
    v = only(
        placer.evaluate(problem(folder, objective={"max_cost_usd": 100000}), BASELINE), "budget"
    )
    capex = 4 * (2 * 6000 + 2 * 10000) + 1 * (2 * 20000 + 1 * 30000)  # 4 waves, 1 pair, 1 amplifier
    assert v.where == "objective.max_cost_usd"
    assert v.shortfall == pytest.approx(capex - 100000) == 98000
    assert "$198,000 exceeds budget $100,000" in v.message


# ----------------------------------------------------------------------------- all at once
# pp = 1 (memory), 128 replicas in a (power), 128 in b (64 nodes: gpus), 40 waves on a-b
# (channels), 800ZR+ on the 1500 km route (reach), capex over a $100k budget.
MULTI_PLAN = plan(
    8,
    1,
    chains(1, (128, "a"), (128, "b")),
    [
        {"sites": ["a", "b"], "waves": 40, "optic": "800zr"},
        {"sites": ["a", "far"], "waves": 2, "optic": "800zr+"},
    ],
)
MULTI_CAPEX = link_capex(40, "800zr", 100, math.ceil(40 / CHANNELS_800)) + link_capex(
    2, "800zr+", 1500, 1
)
MULTI_POWER_MW = (1024 * ALL_IN_W + 40 * MODULE_W["800zr"] + 2 * MODULE_W["800zr+"]) * PUE / 1e6
MULTI_EXPECTED = {
    ("channels", "route a-b"): 40 - CHANNELS_800,
    ("reach", "route a-far"): 1500 - 1000,
    ("power", "site a"): MULTI_POWER_MW - 1.0,
    ("gpus", "site b"): (128 - 64) * GPUS_PER_NODE,
    ("memory", "stage 0 at site a (h100-sxm)"): memory_gb(tp=8, dp=256) - (HBM_GB - RESERVE_GB),
    ("memory", "stage 0 at site b (h100-sxm)"): memory_gb(tp=8, dp=256) - (HBM_GB - RESERVE_GB),
    ("budget", "objective.max_cost_usd"): MULTI_CAPEX - 100000,
}


def test_several_limits_at_once(folder: Path) -> None:
    assert MULTI_CAPEX == 2_076_000
    ev = placer.evaluate(problem(folder, objective={"max_cost_usd": 100000}), MULTI_PLAN)
    got = {(v.kind, v.where): v.shortfall for v in ev.violations}
    assert set(got) == set(MULTI_EXPECTED)
    for key, shortfall in MULTI_EXPECTED.items():
        assert got[key] == pytest.approx(shortfall, rel=1e-9), key
    assert not ev.feasible and ev.capex_usd == MULTI_CAPEX


def test_cli_exit_3_lists_every_violation(folder: Path) -> None:
    inst = problem(folder, objective={"max_cost_usd": 100000}).path
    assert inst is not None
    plan_file = folder / "multi.json"
    plan_file.write_text(json.dumps(MULTI_PLAN))

    args = ["evaluate", str(inst), str(plan_file)]
    text = subprocess.run(
        [sys.executable, "-m", "placer.cli", *args], capture_output=True, text=True, timeout=120
    )
    as_json = CliRunner().invoke(app, [*args, "--json"])
    assert text.returncode == 3, text.stdout + text.stderr
    out = " ".join(text.stdout.split())  # undo the console's line wrapping
    assert "INFEASIBLE" in out
    for _kind, where in MULTI_EXPECTED:
        assert f"{where}:" in out
    assert "short by 0.568 MW" in out and "exceeds budget $100,000" in out

    assert as_json.exit_code == 3, as_json.output
    data = json.loads(as_json.stdout)
    assert data["feasible"] is False
    got = {(v["kind"], v["where"]): v["shortfall"] for v in data["violations"]}
    assert set(got) == set(MULTI_EXPECTED)
    for key, shortfall in MULTI_EXPECTED.items():
        assert got[key] == pytest.approx(shortfall, rel=1e-9), key
    assert all(v["message"] for v in data["violations"])
    assert "Traceback" not in as_json.stderr + text.stderr


def test_cli_text_shows_violation_kinds(folder: Path) -> None:
    inst = problem(folder, objective={"max_cost_usd": 100000}).path
    plan_file = folder / "multi.json"
    plan_file.write_text(json.dumps(MULTI_PLAN))
    r = CliRunner().invoke(app, ["evaluate", str(inst), str(plan_file)])
    assert r.exit_code == 3
    for kind, where in MULTI_EXPECTED:
        assert f"[{kind}] {where}" in " ".join(r.stdout.split())
