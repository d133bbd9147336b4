"""Sweeps (placer.study): study-file validation, local vs dask executors, resume, the
results table, plots, and the `sweep` / `plot` commands."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from placer.cli import app
from placer.errors import InputError
from placer.study.cli import register
from placer.study.plot import DPI, FIGSIZE_IN, pareto_mask, plot_file
from placer.study.sweep import load_study, parse_path, point_id, read_results, run_sweep, set_path

if "sweep" not in {
    c.name or (c.callback.__name__ if c.callback else None) for c in app.registered_commands
}:
    register(app)

runner = CliRunner()

BASE = """\
name: tiny-two-sites
sites:
  - {name: north, gpu: h100-sxm, gpus: 64, power_mw: 1.0}
  - {name: south, gpu: h100-sxm, gpus: 64, power_mw: 1.0}
routes:
  - {sites: [north, south], km: 100, fiber_pairs: 1}
job:
  model: tiny-4l
  global_batch: 16
  parallelism: {tp: [4], micro_batch: [1]}
objective:
  max_cost_usd: 1000000
solver:
  time_limit_s: 20
"""

POINTS = [
    {"routes[0].km": 50, "job.sync.mode": "synchronous"},
    {"routes[0].km": 500, "job.sync.mode": "synchronous"},
    {"routes[0].km": 50, "job.sync": {"mode": "diloco", "every_steps": 10}},
    {"routes[0].km": 500, "solver.max_sites_per_replica": 1, "objective.max_cost_usd": 500000},
    {"job.gpus": 100000},  # more GPUs than the sites have: infeasible
]

# columns that legitimately differ between two runs of the same point
TIMING = ["solver_s"]


def _write_study(folder: Path, **extra: object) -> Path:
    (folder / "base.yaml").write_text(BASE)
    study = {"name": "tiny", "base": "base.yaml", "points": POINTS, "time_limit_s": 20, **extra}
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, pd.DataFrame]:
    folder = tmp_path_factory.mktemp("study")
    study = _write_study(folder)
    res = run_sweep(
        load_study(study), folder / "out-local", executor="local", workers=2, progress=False
    )
    assert sorted(res.computed) == sorted(p.id for p in load_study(study).points)
    return study, folder / "out-local", res.table


def test_paths_and_ids() -> None:
    assert parse_path("routes[0].km") == ("routes", 0, "km")
    assert parse_path("catalog.optics.800zr+.module_cost_usd") == (
        "catalog",
        "optics",
        "800zr+",
        "module_cost_usd",
    )
    with pytest.raises(ValueError):
        parse_path("routes[x].km")
    data = {"routes": [{"km": 1}], "resilience": None}
    set_path(data, ("resilience", "max_slowdown"), 0.1)
    set_path(data, ("routes", 0, "km"), 5)
    assert data == {"routes": [{"km": 5}], "resilience": {"max_slowdown": 0.1}}
    with pytest.raises(ValueError, match="index out of range"):
        set_path(data, ("routes", 3, "km"), 1)
    # stable and independent of the order of the keys
    assert (
        point_id({"a": 1, "b": [2]}) == point_id({"b": [2], "a": 1}) != point_id({"a": 1, "b": [3]})
    )


def test_results_table(local_run: tuple[Path, Path, pd.DataFrame]) -> None:
    _, out, table = local_run
    assert len(table) == len(POINTS)
    assert (out / "results.csv").is_file() and len(list((out / "points").glob("*.json"))) == len(
        POINTS
    )
    for col in [
        "point_id", "routes[0].km", "job.sync.mode", "job.sync", "status", "message", "step_time_s", "compute_s",  # noqa: E501
        "bubble_s", "tp_comm_s", "pp_comm_s", "dp_sync_s", "tokens_per_s", "mfu", "capex_usd", "sync_mode",  # noqa: E501
        "tp", "pp", "dp", "waves[north-south]", "solver_s", "gap",
    ]:  # fmt: skip
        assert col in table.columns, col
    # the base value fills paths a point leaves alone
    assert table.loc[0, "solver.max_sites_per_replica"] == 2
    assert table.loc[table["job.gpus"] == 100000, "status"].tolist() == ["infeasible"]
    infeasible = table[table["status"] == "infeasible"].iloc[0]
    assert infeasible["message"] and pd.isna(infeasible["step_time_s"])
    ok = table[table["status"] != "infeasible"]
    assert set(ok["status"]) == {"optimal"}
    assert (ok["step_time_s"] > 0).all()
    parts = ok[
        [
            "compute_s",
            "memory_bound_s",
            "bubble_s",
            "tp_comm_s",
            "pp_comm_s",
            "dp_sync_s",
            "optimizer_s",
        ]
    ].sum(axis=1)
    assert (abs(parts - ok["step_time_s"]) <= 1e-9 * ok["step_time_s"]).all()
    # the csv reads back to the same table
    back = read_results(out)
    assert list(back.columns) == list(table.columns) and len(back) == len(table)


def test_dask_gives_the_same_table(
    local_run: tuple[Path, Path, pd.DataFrame], tmp_path: Path
) -> None:
    study, _, table = local_run
    res = run_sweep(
        load_study(study), tmp_path / "out-dask", executor="dask", workers=2, progress=False
    )
    pd.testing.assert_frame_equal(res.table.drop(columns=TIMING), table.drop(columns=TIMING))
    a = pd.read_csv(tmp_path / "out-dask" / "results.csv").drop(columns=TIMING)
    b = pd.read_csv(local_run[1] / "results.csv").drop(columns=TIMING)
    pd.testing.assert_frame_equal(a, b)


def test_resume_recomputes_only_missing_points(
    local_run: tuple[Path, Path, pd.DataFrame], tmp_path: Path
) -> None:
    study, out, table = local_run
    out2 = tmp_path / "resume"
    shutil.copytree(out, out2)
    files = sorted((out2 / "points").glob("*.json"))
    victim = files[1]
    victim.unlink()
    before = {f.name: f.stat().st_mtime_ns for f in files if f != victim}
    res = run_sweep(load_study(study), out2, workers=2, progress=False)
    assert res.computed == [victim.stem]
    assert sorted(res.reused) == sorted(f.stem for f in files if f != victim)
    assert {f.name: f.stat().st_mtime_ns for f in files if f != victim} == before
    assert victim.is_file()
    pd.testing.assert_frame_equal(res.table.drop(columns=TIMING), table.drop(columns=TIMING))
    # a point that failed (status error) is retried; a finished one is not
    rec = json.loads(victim.read_text())
    rec["status"] = "error"
    victim.write_text(json.dumps(rec))
    res = run_sweep(load_study(study), out2, workers=1, progress=False)
    assert res.computed == [victim.stem]


def test_cli_sweep_and_plots(local_run: tuple[Path, Path, pd.DataFrame], tmp_path: Path) -> None:
    study, out, _ = local_run
    out2 = tmp_path / "cli"
    shutil.copytree(out, out2)
    r = runner.invoke(app, ["sweep", str(study), "-o", str(out2), "--workers", "1", "-q"])
    assert r.exit_code == 0, r.output
    assert "solved 0, reused 5" in r.output

    import matplotlib.image as mpimg

    w, h = int(FIGSIZE_IN[0] * DPI), int(FIGSIZE_IN[1] * DPI)
    for kind, extra in [
        ("step_time", ["--x", "routes[0].km", "--by", "sync_mode"]),
        ("efficiency", []),
        ("pareto", []),
    ]:
        png = tmp_path / f"{kind}.png"
        r = runner.invoke(
            app, ["plot", str(out2 / "results.csv"), "--kind", kind, "-o", str(png), *extra]
        )
        assert r.exit_code == 0, r.output
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert mpimg.imread(png).shape[:2] == (h, w)
    svg = tmp_path / "pareto.svg"
    r = runner.invoke(app, ["plot", str(out2), "--kind", "pareto", "-o", str(svg)])
    assert r.exit_code == 0, r.output
    assert "<svg" in svg.read_text()[:2000]

    # spare waves: a clear input error without the resilience columns ...
    r = runner.invoke(
        app, ["plot", str(out2), "--kind", "spare_waves", "-o", str(tmp_path / "s.png")]
    )
    assert r.exit_code == 2
    assert "spare_waves_ring" in r.output and "Traceback" not in r.output
    # ... and a plot on any table that has them
    t = pd.read_csv(out2 / "results.csv")
    t["spare_waves_ring"] = range(len(t))
    t["spare_waves_optcc"] = 0
    t.to_csv(tmp_path / "with_spares.csv", index=False)
    png = plot_file(tmp_path / "with_spares.csv", tmp_path / "spares.png", kind="spare_waves")
    assert mpimg.imread(png).shape[:2] == (h, w)
    # bad options
    r = runner.invoke(app, ["plot", str(out2), "--kind", "pie", "-o", str(tmp_path / "x.png")])
    assert r.exit_code == 2
    r = runner.invoke(app, ["plot", str(out2), "-o", str(tmp_path / "x.jpg")])
    assert r.exit_code == 2
    r = runner.invoke(app, ["plot", str(out2), "--x", "nope", "-o", str(tmp_path / "x.png")])
    assert r.exit_code == 2 and "nope" in r.output


def test_pareto_mask() -> None:
    df = pd.DataFrame(
        {
            "status": ["optimal"] * 5 + ["infeasible"],
            "capex_usd": [0, 1, 1, 2, 3, None],
            "step_time_s": [5.0, 4.0, 4.5, 4.0, 1.0, None],
        }
    )
    assert pareto_mask(df).tolist() == [True, True, False, False, True, False]


BAD = [
    # (study text, expected line, expected fragments)
    (
        "base: base.yaml\ngrid:\n  routes[0].km: [10, 20]\n  routes[0].kms: [1]\n",
        4,
        ["routes[0].kms", "unknown key 'kms' (did you mean 'km'?)"],
    ),
    (
        "base: base.yaml\ngrid:\n  routes[0].km: [10, far]\n",
        3,
        ["routes[0].km", "must be a number, got 'far'"],
    ),
    (
        "base: base.yaml\npoints:\n  - routes[0].km: 10\n  - sites[1].gpus: -8\n",
        4,
        ["points[1]", "sites[1].gpus", "-8"],
    ),
    ("base: base.yaml\npoints:\n  - routes[3].km: 10\n", 3, ["routes[3]", "out of range"]),
    ("base: base.yaml\npoints:\n  - job.model.layers: 10\n", 3, ["job.model", "not a mapping"]),
    ("base: base.yaml\npoints:\n  - job.sync.mode: fast\n", 3, ["job.sync.mode", "synchronous"]),
    (
        "base: base.yaml\npoints:\n  - objective.minimize: cost\n",
        3,
        ["objective.minimize", "max_step_time_s"],
    ),
    ("base: missing.yaml\ngrid:\n  routes[0].km: [10]\n", 1, ["base", "missing.yaml", "not found"]),
    ("base: base.yaml\ngrid:\n  routes[0].km: [10]\ncolour: red\n", 4, ["colour", "unknown key"]),
    (
        "base: base.yaml\ngrid:\n  routes[0].km: [10]\npoints:\n  - routes[0].km: 10\n",
        None,
        ["exactly one of grid"],
    ),
    ("base: base.yaml\ngrid:\n  routes[0].km: []\n", None, ["must not be empty"]),
    ("base: base.yaml\ntime_limit_s: -1\ngrid:\n  routes[0].km: [1]\n", 2, ["time_limit_s", "-1"]),
    ("base: base.yaml\npoints:\n  - routes[0].km: 10\n  - routes[0].km: 10\n", 4, ["repeats"]),
    ("base: base.yaml\ngrid:\n  'routes..km': [1]\n", 3, ["routes..km", "not a field path"]),
]


@pytest.mark.parametrize(("text", "line", "fragments"), BAD)
def test_bad_study_files_exit_2(
    tmp_path: Path, text: str, line: int | None, fragments: list[str]
) -> None:
    (tmp_path / "base.yaml").write_text(BASE)
    study = tmp_path / "study.yaml"
    study.write_text(text)
    r = runner.invoke(app, ["sweep", str(study), "-o", str(tmp_path / "out"), "-q"])
    assert r.exit_code == 2, r.output
    msg = " ".join(r.output.split())
    assert "Traceback" not in r.output
    assert f"study.yaml{f':{line}' if line else ''}" in msg, msg
    for f in fragments:
        assert f in msg, (f, msg)
    assert not (tmp_path / "out" / "points").exists() or not any(
        (tmp_path / "out" / "points").iterdir()
    )


def test_bad_options(tmp_path: Path) -> None:
    study = _write_study(tmp_path)
    for args in (
        ["--executor", "spark"],
        ["--workers", "0"],
        ["--backend", "gurobi"],
        ["--time-limit", "0"],
    ):
        r = runner.invoke(app, ["sweep", str(study), "-q", "-o", str(tmp_path / "o"), *args])
        assert r.exit_code == 2, (args, r.output)
    r = runner.invoke(app, ["sweep", str(tmp_path / "nope.yaml")])
    assert r.exit_code == 2 and "not found" in r.output
    with pytest.raises(InputError, match="a study file is a mapping"):
        (tmp_path / "list.yaml").write_text("- 1\n")
        load_study(tmp_path / "list.yaml")
