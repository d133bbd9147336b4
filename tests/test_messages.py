"""Messages (issue 15): JSON output is always valid JSON (null for infinity); every
infeasibility class names the binding resource and by how much it falls short; errors are
attributed to the field that causes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from placer.cli import app

ROOT = Path(__file__).resolve().parents[1]
TWO = ROOT / "instances" / "two-campus-100km.yaml"
BASE = TWO.read_text(encoding="utf-8")
runner = CliRunner()


def _strict_json(text: str) -> object:
    def refuse(token: str) -> object:
        raise AssertionError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_evaluate_json_of_an_infeasible_plan_is_valid_json(tmp_path: Path) -> None:
    plan = json.loads((ROOT / "instances" / "plans" / "two-campus-100km.json").read_text())
    plan["links"] = []  # cross-site traffic with no capacity: infinite step time
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(plan))
    r = runner.invoke(app, ["evaluate", str(TWO), str(f), "--json"])
    assert r.exit_code == 3
    data = _strict_json(r.stdout)
    assert data["feasible"] is False and data["step_time_s"] is None
    assert any(v["kind"] == "channels" for v in data["violations"])


@pytest.mark.parametrize(
    "edit,headline,amount",
    [
        # pue and power: power binds (not the link budget)
        (
            lambda t: t.replace("pue: 1.2", "pue: 10").replace("power_mw: 7.0", "power_mw: 0.1"),
            "power: ",
            "short by 64 GPUs",
        ),
        (lambda t: t.replace("gpus: 4096", "gpus: 0"), "GPUs: ", "short by 8 GPUs"),
        (
            lambda t: t.replace(
                "  max_cost_usd: 2000000", "  max_cost_usd: 2000000\n  max_step_time_s: 0.01"
            ),
            "step time: ",
            "s too tight",
        ),
    ],
    ids=["power", "zero-gpus", "max-step-time"],
)
def test_infeasibility_names_the_binding_resource_and_shortfall(
    tmp_path: Path, edit, headline: str, amount: str
) -> None:
    f = tmp_path / "i.yaml"
    f.write_text(edit(BASE))
    r = runner.invoke(app, ["solve", str(f), "-q", "-o", str(tmp_path / "out")])
    assert r.exit_code == 3, r.output
    lines = r.output.replace("error: ", "").splitlines()
    assert lines[1].startswith(headline), r.output  # the first reason is the binding one
    assert amount in lines[1]
    assert "memory" not in lines[1] and "fits no node" not in lines[1]


def test_node_size_error_is_attributed_to_the_site(tmp_path: Path) -> None:
    f = tmp_path / "i.yaml"
    f.write_text(BASE.replace("pue: 1.2", "pue: 1.2\n    gpus_per_node: 3", 1))
    r = runner.invoke(app, ["validate", str(f)])
    assert r.exit_code == 2
    assert (
        f"{f}:13: sites[0].gpus_per_node: 3 GPUs per node fit none of the tensor-parallel candidates"  # noqa: E501
        in r.output
    )
