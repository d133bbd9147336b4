"""Trade-off objectives: `within_fastest` (the fastest step, then the cheapest plan within a
fraction of it) and `placer frontier` (the exact capex vs step Pareto front), checked
against an independent enumeration: the route's wave count capped at w = 0..W by
`max_waves`, each solved for the fastest step."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from placer.cli import app
from placer.io import problem_from_data
from placer.optimize.driver import solve
from placer.optimize.lexicographic import LIMIT_SLACK, FrontierPoint, mark_knee
from placer.study.frontier import frontier

REPO = Path(__file__).resolve().parents[1]
MAX_WAVES = 3


def _data(**objective: object) -> dict:
    data = yaml.safe_load((REPO / "instances" / "two-campus-100km.yaml").read_text())
    # Llama 3 70B on the two campuses: 0, 1 and 2 waves give three different optima
    data["job"]["model"] = str(REPO / "models" / "llama3-70b.yaml")
    data["job"]["parallelism"] = {"tp": [8], "micro_batch": [1]}
    data["routes"][0].update(max_waves=MAX_WAVES, fiber_pairs=1)
    data["objective"] = {"minimize": "step_time", **objective}
    return data


@pytest.fixture(scope="module", params=["cpsat", "milp"])
def enumeration(request: pytest.FixtureRequest) -> tuple[str, list[tuple[float, float]]]:
    """(capex, fastest step) for every cap on the wave count, and its Pareto filter."""
    pts = []
    for w in range(MAX_WAVES + 1):
        data = _data()
        data["routes"][0]["max_waves"] = w
        r = solve(problem_from_data(data), backend=request.param, time_limit_s=60)
        assert r.status == "optimal"
        pts.append((r.evaluation.capex_usd, r.evaluation.step_time_s))
    # a plan with capex C and step T uses some waves w; the cap w gives a plan no slower and
    # no dearer (capex grows with waves), so the Pareto filter of these points is the front
    pts = sorted(set(pts))
    front = [
        p
        for p in pts
        if not any(q[0] <= p[0] and q[1] <= p[1] * (1 + 1e-9) and q != p for q in pts)
    ]
    assert len(front) >= 3  # the test means something only if the front has a knee
    return request.param, sorted(front, reverse=True)


def test_frontier_matches_enumeration(enumeration: tuple[str, list[tuple[float, float]]]) -> None:
    backend, expected = enumeration
    points = frontier(problem_from_data(_data()), backend=backend, time_limit_s=60)
    assert [p.status for p in points] == ["optimal"] * len(points)
    assert [p.capex_usd for p in points] == pytest.approx([c for c, _ in expected])
    assert [p.step_time_s for p in points] == pytest.approx(
        [t for _, t in expected], rel=2 * LIMIT_SLACK
    )
    assert sum(p.knee for p in points) == (1 if len(points) >= 3 else 0)


@pytest.mark.parametrize("within", [0.0, 0.05])
def test_within_fastest_is_the_cheapest_plan_within_the_limit(
    enumeration: tuple[str, list[tuple[float, float]]], within: float
) -> None:
    backend, expected = enumeration
    fastest = min(t for _, t in expected)
    r = solve(
        problem_from_data(_data(minimize="cost", within_fastest=within)),
        backend=backend,
        time_limit_s=60,
    )
    assert r.status == "optimal"
    limit = fastest * (1 + within) * (1 + LIMIT_SLACK)
    assert r.evaluation.step_time_s <= limit * (1 + 1e-12)
    assert r.evaluation.capex_usd == pytest.approx(min(c for c, t in expected if t <= limit))
    lex = r.plan.solver.lexicographic
    assert lex["fastest_step_s"] == pytest.approx(fastest) and lex["fastest_status"] == "optimal"


def test_within_fastest_needs_minimize_cost() -> None:
    from placer.errors import InputError

    with pytest.raises(InputError, match="within_fastest: goes with minimize: cost"):
        problem_from_data(_data(within_fastest=0.01))
    problem_from_data(_data(minimize="cost", within_fastest=0.01))  # no max_step_time_s needed


def test_knee_is_the_point_farthest_from_the_chord() -> None:
    # (capex, step) on a convex front; scaled to [0,1]^2 the chord runs from (1, 0) to (0, 1)
    # and (0.2, 0.2) is the farthest point from it: |0.2 + 0.2 - 1| / sqrt(2), against 0.5 / sqrt(2) next  # noqa: E501
    raw = [(10.0, 1.0), (4.0, 1.5), (2.0, 2.0), (1.0, 4.0), (0.0, 6.0)]
    pts = mark_knee([FrontierPoint(c, t, "optimal", None) for c, t in raw])
    assert [p.knee for p in pts] == [False, False, True, False, False]


def test_cli_frontier_writes_table_and_plot(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(copy.deepcopy(_data())))
    r = CliRunner().invoke(
        app, ["frontier", str(path), "-o", str(tmp_path / "f"), "-q", "--max-points", "2"]
    )
    assert r.exit_code == 0, r.output
    rows = (tmp_path / "f" / "frontier.csv").read_text().splitlines()
    assert rows[0] == "capex_usd,step_time_s,waves,tp,pp,dp,status,knee" and len(rows) == 3
    assert (tmp_path / "f" / "frontier.png").read_bytes()[:4] == b"\x89PNG"
