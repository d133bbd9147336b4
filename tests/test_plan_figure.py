"""The plan picture (`placer plot-plan`) and report.html: what they draw is the plan's."""

from __future__ import annotations

import json
import math
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from placer.cli import app
from placer.evaluate import evaluate
from placer.io import load_instance, problem_with
from placer.outputs.figure import (
    DPI,
    FIGSIZE_IN,
    plan_figure,
    render_plan_figure,
    site_positions,
    stages_by_site,
)
from placer.outputs.html import html_report
from placer.schema import Plan

REPO = Path(__file__).resolve().parents[1]
INSTANCE = REPO / "instances" / "three-sites-80-300-500km.yaml"


@pytest.fixture(scope="module")
def solved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("three")
    r = CliRunner().invoke(app, ["solve", str(INSTANCE), "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    return out


def test_positions_from_coordinates_are_equirectangular() -> None:
    prob = load_instance(INSTANCE)
    coords = {"a": (60.0, 10.0), "b": (60.0, 12.0), "c": (62.0, 10.0)}
    sites = [
        s.model_copy(update={"lat": coords[s.name][0], "lon": coords[s.name][1]})
        for s in prob.instance.sites
    ]
    pos = site_positions(problem_with(prob, sites=sites))
    # mean latitude 60.667 deg: one degree of longitude is cos(60.667 deg) of one of latitude
    k = math.cos(math.radians((60 + 60 + 62) / 3))
    assert pos["b"][0] - pos["a"][0] == pytest.approx(2 * k)
    assert pos["c"][1] - pos["a"][1] == pytest.approx(2.0)
    assert pos["a"][1] == pos["b"][1]


def test_layout_without_coordinates_is_reproducible() -> None:
    prob = load_instance(INSTANCE)
    assert site_positions(prob) == site_positions(prob)
    assert len(set(site_positions(prob).values())) == len(prob.instance.sites)


def test_stages_by_site_lists_ranges_and_counts() -> None:
    plan = Plan.model_validate(
        {
            "parallelism": {"tp": 1, "pp": 4, "dp": 5, "micro_batch": 1},
            "stage_layers": [1, 1, 1, 1],
            "replica_groups": [
                {"count": 3, "stage_sites": ["a", "a", "b", "a"]},
                {"count": 2, "stage_sites": ["c"] * 4},
            ],
            "links": [],
        }
    )
    assert stages_by_site(plan) == {
        "a": ["3 x stages 0-1,3"],
        "b": ["3 x stages 2"],
        "c": ["2 x stages 0-3"],
    }


def test_figure_draws_every_route_and_marks_idle_ones(solved: Path) -> None:
    prob = load_instance(INSTANCE)
    plan = Plan.model_validate(json.loads((solved / "plan.json").read_text()))
    ev = evaluate(prob, plan)
    fig = plan_figure(prob, plan, ev)
    ax = fig.axes[0]
    assert len(ax.lines) == len(prob.instance.routes)
    loaded = {
        k
        for k in set(ev.step.route_pp_s) | set(ev.step.route_dp_s)
        if ev.step.route_pp_s.get(k, 0) + ev.step.route_dp_s.get(k, 0) > 0
    }
    dashed = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
    assert len(dashed) == len(prob.instance.routes) - len(loaded)
    svg = render_plan_figure(prob, plan, ev, "svg").decode()
    for s in prob.instance.sites:
        assert f"{s.name} ({s.gpu})" in svg
        assert f"{ev.gpus_by_site.get(s.name, 0):,}/{s.gpus:,} GPUs" in svg
    for link in ev.links:
        assert f"{link['waves']} x {link['optic']}" in svg


def test_cli_plot_plan_png_and_bad_suffix(solved: Path, tmp_path: Path) -> None:
    png = tmp_path / "plan.png"
    r = CliRunner().invoke(
        app, ["plot-plan", str(solved / "plan.json"), "-i", str(INSTANCE), "-o", str(png)]
    )
    assert r.exit_code == 0, r.output
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (
        round(FIGSIZE_IN[0] * DPI),
        round(FIGSIZE_IN[1] * DPI),
    )
    r = CliRunner().invoke(
        app,
        [
            "plot-plan",
            str(solved / "plan.json"),
            "-i",
            str(INSTANCE),
            "-o",
            str(tmp_path / "plan.gif"),
        ],
    )
    assert r.exit_code == 2 and "plan.gif" in r.output
    assert not (tmp_path / "plan.gif").exists()


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.count: dict[str, int] = {}
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.count[tag] = self.count.get(tag, 0) + 1
        for name, value in attrs:
            if name in {"src", "href"} and value and not value.startswith("#"):
                self.external.append(value)


def test_report_html_is_self_contained_and_has_every_table(solved: Path) -> None:
    md = (solved / "report.md").read_text()
    page = (solved / "report.html").read_text()
    tags = _Tags()
    tags.feed(page)
    n_tables = sum(1 for line in md.splitlines() if line.startswith("|---"))
    assert tags.count.get("table") == n_tables > 0
    assert tags.count.get("svg") == 2  # the plan picture and the breakdown chart
    assert tags.count.get("script", 0) == 0 and tags.external == []
    prob = load_instance(INSTANCE)
    plan = Plan.model_validate(json.loads((solved / "plan.json").read_text()))
    ev = evaluate(prob, plan)
    assert f"step time {ev.step_time_s:.4g} s" in html_report(prob, plan, ev)
