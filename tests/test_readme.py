"""The README's quoted numbers are what the code gives: the worked example (step time, its
terms, waves, capex, throughput, MFU, placement) and the spare waves of the resilient
instance; the validation example's output, the renamed catalog keys, the deprecation warning
and the catalog typos the schema flags. Regenerate the README from the command output when
the model changes."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

from placer.cli import app
from placer.io import load_instance, problem_from_data
from placer.optimize.driver import solve
from placer.schema import RENAMED_GPU_KEYS, RENAMED_KEYS_REMOVED_IN

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
    groups = res.plan.replica_groups
    crossing = sum(g.count for g in groups if len(set(g.stage_sites)) > 1)
    whole = sum(g.count for g in groups if set(g.stage_sites) == {"north"})
    assert f"stretches {crossing} of the {par.dp} replicas' pipelines" in text
    assert f"runs {whole} whole replicas in north" in text


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


@pytest.mark.slow
def test_within_fastest_example() -> None:
    """The trade-offs section's within_fastest example on three-sites-80-300-500km: the
    fastest plan's waves, capex and step, and the cheapest plan within 1% of it."""
    m = re.search(
        r"`instances/three-sites-80-300-500km.yaml` this buys (\d+) waves \(\$([\d,]+)\) "
        r"for a ([\d.]+) s step instead of (\d+) waves \(\$([\d,]+), within the instance's "
        r"budget of \$([\d,]+)\) for ([\d.]+) s\.",
        " ".join(README.split()),
    )
    assert m, "README quotes no within_fastest example"
    problem = load_instance(REPO / "instances" / "three-sites-80-300-500km.yaml")
    data = problem.instance.model_dump(mode="json", exclude_none=True)
    budget = data["objective"]["max_cost_usd"]
    data["objective"] = {"minimize": "cost", "within_fastest": 0.01, "max_cost_usd": budget}
    cheap = solve(problem_from_data(data)).evaluation
    fast = solve(problem).evaluation
    for ev, (waves, capex, step) in ((cheap, m.group(1, 2, 3)), (fast, m.group(4, 5, 7))):
        assert sum(link["waves"] for link in ev.links) == int(waves)
        assert f"{ev.capex_usd:,.0f}" == capex
        assert f"{ev.step_time_s:.3f}" == step
    assert f"{budget:,.0f}" == m.group(6)


def _block_after(marker: str, lang: str = "", nth: int = 0) -> str:
    """The nth fenced block (of that language, or any) after the marker."""
    i = README.index(marker)
    blocks = re.compile(r"```(\w*)\n(.*?)```", re.S).findall(README, i)
    blocks = [text for tag, text in blocks if not lang or tag == lang]
    assert len(blocks) > nth, f"no ```{lang} block {nth} after {marker!r}"
    return blocks[nth]


def _validate(folder: Path, name: str) -> tuple[int, str]:
    old = os.getcwd()
    os.chdir(folder)
    try:
        r = CliRunner().invoke(app, ["validate", name])
    finally:
        os.chdir(old)
    return r.exit_code, r.stderr


def test_validation_example_lists_what_placer_prints(tmp_path: Path) -> None:
    """The README's bad instance gives exactly the quoted lines, all three in one run."""
    marker = "### Validation: every error at once"
    (tmp_path / "bad.yaml").write_text(_block_after(marker, "yaml"))
    quoted = _block_after(marker, nth=1)
    assert quoted.startswith("$ placer validate bad.yaml\n")
    code, stderr = _validate(tmp_path, "bad.yaml")
    assert code == 2
    assert stderr.splitlines() == quoted.splitlines()[1:]


def test_renamed_keys_table_is_the_code() -> None:
    section = README[README.index("### Catalog units and renamed keys") :]
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| (\S+) ", section, flags=re.M)
    assert {old: (new, unit) for old, new, unit in rows} == RENAMED_GPU_KEYS
    assert f"still works until {RENAMED_KEYS_REMOVED_IN}:" in " ".join(section.split())


def test_deprecation_example_gives_the_quoted_warning(tmp_path: Path) -> None:
    section = README[README.index("### Catalog units and renamed keys") :]
    override = yaml.safe_load(_block_after("### Catalog units and renamed keys", "yaml"))
    data = yaml.safe_load((REPO / "instances" / "two-campus-100km.yaml").read_text())
    data["job"]["model"] = str(REPO / "models" / f"{data['job']['model']}.yaml")
    data.update(override)
    text = yaml.safe_dump(data, sort_keys=False)
    (tmp_path / "inst.yaml").write_text(text)
    line = text.splitlines().index("      nvlink_gbps_bidir: 450") + 1
    m = re.search(r"gives `(warning: deprecated: .*?)`", " ".join(section.split()))
    assert m, "README quotes no deprecation warning"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        code, stderr = _validate(tmp_path, "inst.yaml")
    assert code == 0
    assert m.group(1).replace("LINE", str(line)) in " ".join(stderr.split())


def test_schema_flags_the_quoted_typos() -> None:
    schema = json.loads((REPO / "schema" / "instance.schema.json").read_text())
    data = yaml.safe_load((REPO / "instances" / "two-campus-100km.yaml").read_text())
    validator = Draft202012Validator(schema)
    assert not list(validator.iter_errors(data))
    typos = re.search(r"a misspelt key \(`(\w+)`, `(\w+)`\)", " ".join(README.split()))
    assert typos, "README quotes no catalog typos"
    gpu_typo, section_typo = typos.groups()
    for catalog in ({"gpus": {"h100-sxm": {gpu_typo: 96}}}, {section_typo: {}}):
        assert list(validator.iter_errors({**data, "catalog": catalog})), catalog
