"""Link BOM: quantities, buffers, power and costs against hand-computed values.

Catalog figures used by the hand values (placer/catalog/default.yaml):
800zr: 800G, reach 120 km, 28 W, 150 GHz grid, $6,000; 800zr+: 800G, 1,000 km, 30 W, 150 GHz,
$9,000; 400zr: 400G, 120 km, 18 W, 75 GHz, $2,000; router port $10,000; mux/demux $20,000;
amplifier $30,000 and 200 W every 80 km; C-band 4,800 GHz (32 channels at 150 GHz, 64 at 75);
fiber 4.9 us/km.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from placer.evaluate import evaluate
from placer.io import problem_from_data
from placer.outputs.bom import bom_csv, bom_data, bom_json, bom_markdown
from placer.schema import Plan

GOLDEN = Path(__file__).resolve().parent / "golden" / "bom_small.csv"


def make_problem():
    site = {"gpu": "h100-sxm", "gpus": 64}
    return problem_from_data(
        {
            "name": "bom-test",
            "sites": [{"name": n, **site} for n in "abcd"],
            "routes": [
                {"sites": ["a", "b"], "km": 100, "fiber_pairs": 2},
                {
                    "sites": ["a", "c"],
                    "km": 500,
                    "fiber_pairs": 1,
                    "fiber_usd_per_pair_km_year": 12.5,
                },
                {"sites": ["b", "c"], "km": 60, "fiber_pairs": 2},
                {"sites": ["c", "d"], "km": 30, "latency_ms": 0.5},
            ],
            "job": {"model": "tiny-4l", "global_batch": 1},
        }
    )


@pytest.fixture(scope="module")
def problem():
    return make_problem()


def golden_plan() -> Plan:
    return plan_with({"sites": ["a", "b"], "waves": 3}, {"sites": ["a", "c"], "waves": 2})


def plan_with(*links: dict) -> Plan:
    return Plan.model_validate(
        {
            "parallelism": {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 1, "num_micro_batches": 1},
            "stage_layers": [4],
            "replica_groups": [{"count": 1, "stage_sites": ["a"]}],
            "links": list(links),
        }
    )


def route(data: dict, name: str) -> dict:
    (r,) = [r for r in data["routes"] if r["route"] == name]
    return r


def test_short_route_800zr_no_amplifiers(problem):
    plan = plan_with({"sites": ["b", "c"], "waves": 3})
    r = route(bom_data(problem, plan), "b-c")
    assert r["optic"] == "800zr"  # default: 60 km <= 120 km reach, 800G beats 400G
    assert (
        r["transceivers"],
        r["router_ports"],
        r["fiber_pairs_lit"],
        r["mux_demux"],
        r["amplifiers"],
    ) == (6, 6, 1, 2, 0)
    # 3 waves x (2 x 6,000 + 2 x 10,000) + 1 pair x 2 x 20,000
    assert r["capex_usd"] == 136_000
    # 800 Gb/s x 2 x 60 km x 4.9 us/km / 8 = 58.8 MB
    assert r["buffer_per_port_mb"] == pytest.approx(58.8)
    assert r["optics_power_w"] == {"b": 84, "c": 84}  # 3 x 28 W at each end
    assert r["amplifier_power_w"] == 0
    assert r["fiber_opex_usd_per_year"] is None


def test_100km_route_buffer_and_one_amplifier(problem):
    plan = plan_with({"sites": ["a", "b"], "waves": 3})
    r = route(bom_data(problem, plan), "a-b")
    assert r["optic"] == "800zr"
    # 800 Gb/s x 2 x 0.49 ms = 800e9 x 0.98e-3 / 8 bytes = 98 MB (hardware.md)
    assert r["rtt_ms"] == pytest.approx(0.98)
    assert r["buffer_per_port_mb"] == pytest.approx(98.0)
    # 100 km is two 80 km spans: ceil(100 / 80) - 1 = 1 in-line amplifier per lit pair
    assert (r["fiber_pairs_lit"], r["amplifiers"]) == (1, 1)
    assert r["capex_usd"] == 136_000 + 30_000


def test_long_route_800zr_plus_with_amplifiers(problem):
    plan = plan_with({"sites": ["a", "c"], "waves": 2})
    data = bom_data(problem, plan)
    r = route(data, "a-c")
    assert r["optic"] == "800zr+"  # 500 km > 120 km: ZR+
    assert r["amplifiers_per_pair"] == 6  # ceil(500 / 80) - 1 = 7 - 1
    assert (
        r["transceivers"],
        r["router_ports"],
        r["fiber_pairs_lit"],
        r["mux_demux"],
        r["amplifiers"],
    ) == (4, 4, 1, 2, 6)
    # 2 x (2 x 9,000 + 2 x 10,000) + 2 x 20,000 + 6 x 30,000
    assert r["capex_usd"] == 296_000
    assert r["amplifier_power_w"] == 1200  # 6 x 200 W, in huts
    assert r["optics_power_w"] == {
        "a": 60,
        "c": 60,
    }  # 2 x 30 W per end; amplifiers charged to no site
    assert data["totals"]["optics_power_w_by_site"] == {"a": 60, "b": 0, "c": 60, "d": 0}
    # 1 lit pair x 500 km x 12.5 USD per pair-km-year
    assert r["fiber_opex_usd_per_year"] == 6250
    # RTT 2 x 500 x 4.9 us = 4.9 ms; 800e9 x 4.9e-3 / 8 = 490 MB
    assert r["buffer_per_port_mb"] == pytest.approx(490.0)


def test_several_fiber_pairs(problem):
    plan = plan_with({"sites": ["b", "c"], "waves": 40, "optic": "800zr"})
    r = route(bom_data(problem, plan), "b-c")
    # 40 waves / 32 channels per pair (4800 / 150 GHz) -> 2 pairs
    assert (r["channels_per_pair"], r["fiber_pairs_lit"], r["mux_demux"], r["amplifiers"]) == (
        32,
        2,
        4,
        0,
    )
    assert (r["transceivers"], r["router_ports"]) == (80, 80)
    # 40 x 32,000 + 2 x 40,000
    assert r["capex_usd"] == 1_360_000
    assert r["optics_power_w"] == {"b": 1120, "c": 1120}  # 40 x 28 W


def test_buffer_uses_measured_latency(problem):
    plan = plan_with({"sites": ["c", "d"], "waves": 1})
    r = route(bom_data(problem, plan), "c-d")
    # latency_ms 0.5 (not 30 km x 4.9 us): RTT 1 ms -> 800e9 x 1e-3 / 8 = 100 MB
    assert r["rtt_ms"] == pytest.approx(1.0)
    assert r["buffer_per_port_mb"] == pytest.approx(100.0)


def test_optic_from_plan_400zr(problem):
    plan = plan_with({"sites": ["a", "b"], "waves": 3, "optic": "400zr"})
    r = route(bom_data(problem, plan), "a-b")
    assert (r["optic"], r["channels_per_pair"], r["fiber_pairs_lit"]) == ("400zr", 64, 1)
    # 3 waves x (2 x 2,000 + 2 x 10,000) + 1 pair x (2 x 20,000 + 1 amplifier x 30,000)
    assert r["capex_usd"] == 3 * (2 * 2000 + 2 * 10_000) + 2 * 20_000 + 30_000
    assert r["buffer_per_port_mb"] == pytest.approx(49.0)  # 400e9 x 0.98e-3 / 8


@pytest.mark.parametrize(
    "links",
    [
        [{"sites": ["a", "b"], "waves": 3}],
        [{"sites": ["a", "c"], "waves": 2}, {"sites": ["b", "c"], "waves": 40}],
        [
            {"sites": ["a", "b"], "waves": 33, "optic": "800zr"},
            {"sites": ["c", "a"], "waves": 5, "optic": "400zr+"},
        ],
        [],
    ],
)
def test_capex_and_power_match_evaluator(problem, links):
    plan = plan_with(*links)
    ev = evaluate(problem, plan)
    data = bom_data(problem, plan)
    assert data["totals"]["capex_usd"] == pytest.approx(ev.capex_usd)
    rows = list(csv.DictReader(io.StringIO(bom_csv(problem, plan))))
    (total,) = [r for r in rows if r["route"] == "TOTAL" and r["item"] == "capex"]
    assert float(total["capex_usd"]) == pytest.approx(ev.capex_usd)
    assert sum(float(r["capex_usd"] or 0) for r in rows if r["route"] != "TOTAL") == pytest.approx(
        ev.capex_usd
    )
    # sites b, c and d run no GPUs: their evaluated power is the BOM's module watts x PUE 1.2
    for s in ("b", "c", "d"):
        assert ev.power_mw[s] == pytest.approx(
            data["totals"]["optics_power_w_by_site"][s] * 1.2 / 1e6
        )
    json.loads(bom_json(problem, plan))


def test_markdown_states_the_rules(problem):
    plan = plan_with({"sites": ["a", "c"], "waves": 2})
    md = bom_markdown(problem, plan)
    assert md.startswith("## Link bill of materials")
    for phrase in (
        "2 x waves: one module per wave at each end",
        "ceil(km / 80 km) - 1",
        "charged to no site",
        "line rate x round-trip time",
        "296,000",
    ):
        assert phrase in md
    empty = bom_markdown(problem, plan_with())
    assert "nothing to buy" in empty


def test_sources_beside_costs(problem):
    plan = plan_with({"sites": ["a", "b"], "waves": 1})
    rows = list(csv.DictReader(io.StringIO(bom_csv(problem, plan))))
    for r in rows:
        if r["unit_cost_usd"]:
            assert r["source"], r
    (t,) = [
        r
        for r in rows
        if r["route"] == "a-b" and r["item"] == "coherent transceiver" and r["charged_to"] == "a"
    ]
    assert t["source"] == problem.catalog.optics["800zr"].source


def test_golden_small(problem):
    """Two routes: a-b 100 km with 3 default-optic waves (800zr, 1 amplifier), a-c 500 km with
    2 waves (800zr+, 6 amplifiers) and a fiber price. Every number in tests/golden/bom_small.csv
    was checked by hand: a-b 166,000 + a-c 296,000 = 462,000 USD capex; 6,250 USD/yr lease;
    optics power a 84 + 60 = 144 W, b 84 W, c 60 W; amplifiers 7 x 200 = 1,400 W in huts."""
    assert bom_csv(problem, golden_plan()) == GOLDEN.read_text()
