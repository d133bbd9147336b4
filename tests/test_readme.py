"""The README's quoted numbers are what the code gives: the worked example (step time, its
terms, waves, capex, throughput, MFU, placement) and the spare waves of the resilient
instance. Regenerate the README from the command output when the model changes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from placer.io import load_instance
from placer.optimize.driver import solve

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _example_block() -> str:
    m = re.search(
        r"```\n\$ placer solve instances/two-campus-100km.yaml\n(.*?)```", README, flags=re.S
    )
    assert m, "README has no worked example block"
    return m.group(1)


def test_worked_example_numbers() -> None:
    block = _example_block()
    res = solve(load_instance(REPO / "instances" / "two-campus-100km.yaml"))
    ev, par = res.evaluation, res.plan.parallelism
    assert f"tp={par.tp} pp={par.pp} dp={par.dp} mb={par.micro_batch} sync={ev.sync_mode}" in block
    assert block.startswith(f"{res.status} (")
    for key, value in ev.breakdown.items():
        assert re.search(rf"│ {key}\s+│\s+{value:.4f} │", block), key
    assert re.search(rf"│ step time\s+│\s+{ev.step_time_s:.4f} │", block)
    waves = sum(link["waves"] for link in ev.links)
    assert f": {waves} waves; capex ${ev.capex_usd:,.0f}" in block
    assert f"tokens/s {ev.tokens_per_s:,.0f}  MFU {ev.mfu:.1%}" in block
    for site in ("north", "south"):
        assert re.search(
            rf"│ {site}\s+│\s+{ev.gpus_by_site[site]} │\s+{ev.power_mw[site]:.3f} │", block
        ), site
    text = " ".join(README.split())
    assert f"stages 0-{par.pp // 2 - 1} in north, {par.pp // 2}-{par.pp - 1} in south" in text


@pytest.mark.slow
def test_resilient_instance_spare_waves() -> None:
    m = re.search(
        r"`instances/four-metro-resilient.yaml` the ring needs (\d+) spare waves, OptCC (\w+)\.",
        " ".join(README.split()),
    )
    assert m, "README quotes no spare waves"
    res = solve(load_instance(REPO / "instances" / "four-metro-resilient.yaml"))
    summary = res.plan.resilience
    ring, optcc = summary["spare_waves_ring"], summary["spare_waves_optcc"]
    assert int(m.group(1)) == ring
    assert m.group(2) == ("none" if optcc == 0 else str(optcc))
