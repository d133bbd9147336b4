"""Bad input through the real command line: exit code 2, a message naming the file, the
line and the field path, and never a Python traceback (CONTRACT section 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

import placer
from placer.cli import app
from placer.errors import InputError

# Line numbers below refer to this file; the cases edit one line or insert one after it.
BASE = """\
name: errors-demo
sites:
  - name: north
    gpu: h100-sxm
    gpus: 64
  - name: south
    gpu: h100-sxm
    gpus: 64
routes:
  - sites:
      - north
      - south
    km: 100
job:
  model: tiny-4l
  global_batch: 16
"""

# 2 replicas of 2 stages (tp 8) in each site, one wave for the cross-site data-parallel sync
GOOD_PLAN = {
    "parallelism": {"tp": 8, "pp": 2, "dp": 4, "micro_batch": 1},
    "stage_layers": [2, 2],
    "replica_groups": [
        {"count": 2, "stage_sites": ["north", "north"]},
        {"count": 2, "stage_sites": ["south", "south"]},
    ],
    "links": [{"sites": ["north", "south"], "waves": 1}],
}

PLAN_DP = """\
{
  "parallelism": {"tp": 8, "pp": 2, "dp": 4, "micro_batch": 1},
  "stage_layers": [2, 2],
  "replica_groups": [
    {"count": 2, "stage_sites": ["north", "north"]},
    {"count": 1, "stage_sites": ["south", "south"]}
  ]
}
"""

PLAN_PP = """\
{
  "parallelism": {"tp": 8, "pp": 2, "dp": 4, "micro_batch": 1},
  "stage_layers": [2, 1, 1],
  "replica_groups": [
    {"count": 2, "stage_sites": ["north", "north"]},
    {"count": 2, "stage_sites": ["south", "south"]}
  ]
}
"""


def edit(line: int, text: str, insert: bool = False) -> str:
    """BASE with line `line` (1-based) replaced by `text`, or `text` inserted after it."""
    lines = BASE.splitlines()
    if insert:
        lines.insert(line, text)
    else:
        lines[line - 1] = text
    return "\n".join(lines) + "\n"


INLINE_MODEL = BASE.replace(
    "  model: tiny-4l\n",
    "  model:\n    name: inline\n    layers: 4\n    hidden: 256\n    heads: 8\n    vocab: 1024\n    seq_len: -5\n",  # noqa: E501
)
# line 15 is now "  model:", the inline mapping runs over lines 16-21 (seq_len on 21)

# name -> (files {name: text}, CLI args, [file shown, ":line:", "field path", message part])
CASES: dict[str, tuple[dict[str, str], list[str], list[str]]] = {
    "malformed-yaml": (
        {"inst.yaml": edit(13, "    km: [100")},
        ["validate", "inst.yaml"],
        [
            "inst.yaml",
            ":14:",
            " routes[0].km:",
            "malformed YAML",
            "flow sequence started on line 13",
        ],
    ),
    "unknown-key": (
        {"inst.yaml": edit(13, "    colour: blue", insert=True)},
        ["validate", "inst.yaml"],
        ["inst.yaml", ":14:", " routes[0].colour:", "unknown key 'colour'"],
    ),
    "wrong-type": (
        {"inst.yaml": edit(5, "    gpus: lots")},
        ["validate", "inst.yaml"],
        ["inst.yaml", ":5:", " sites[0].gpus:", "must be an integer, got 'lots'"],
    ),
    "negative-gpus": (
        {"inst.yaml": edit(8, "    gpus: -8")},
        ["validate", "inst.yaml"],
        ["inst.yaml", ":8:", " sites[1].gpus:", "must be >= 0, got -8"],
    ),
    "route-to-unknown-site": (
        {"inst.yaml": edit(12, "      - west")},
        ["validate", "inst.yaml"],
        ["inst.yaml", ":12:", " routes[0].sites[1]:", "unknown site 'west'"],
    ),
    "duplicate-site": (
        {"inst.yaml": edit(6, "  - name: north")},
        ["validate", "inst.yaml"],
        ["inst.yaml", ":6:", " sites[1].name:", "duplicate site name 'north'"],
    ),
    "unknown-model": (
        {"inst.yaml": edit(15, "  model: gpt-9")},
        ["validate", "inst.yaml"],
        ["inst.yaml", ":15:", " job.model:", "unknown model 'gpt-9'", "gpt3-175b"],
    ),
    "unknown-gpu": (
        {"inst.yaml": edit(7, "    gpu: h900")},
        ["validate", "inst.yaml"],
        ["inst.yaml", ":7:", " sites[1].gpu:", "unknown GPU 'h900'", "h100-sxm"],
    ),
    "duplicate-yaml-key": (
        {"inst.yaml": edit(5, "    gpus: 65", insert=True)},
        ["validate", "inst.yaml"],
        ["inst.yaml", ":6:", " sites[0].gpus:", "duplicate key (first given on line 5)"],
    ),
    "inline-model-field": (
        {"inst.yaml": INLINE_MODEL},
        ["validate", "inst.yaml"],
        ["inst.yaml", ":21:", " job.model.seq_len:", "must be >= 1, got -5"],
    ),
    "model-validator": (
        {"inst.yaml": BASE + "objective:\n  minimize: cost\n"},
        ["validate", "inst.yaml"],
        ["inst.yaml", ":17:", " objective.max_step_time_s:", "required when minimize is 'cost'"],
    ),
    "catalog-override": (
        {"inst.yaml": BASE + "catalog:\n  gpus:\n    h100-sxm:\n      hbm_gb: -80\n"},
        ["validate", "inst.yaml"],
        ["inst.yaml", ":20:", " catalog.gpus.h100-sxm.hbm_gb:", "must be > 0, got -80"],
    ),
    "json-instance-field": (
        {
            "inst.json": json.dumps(
                {
                    "name": "j",
                    "sites": [{"name": "a", "gpu": "h100-sxm", "gpus": -8}],
                    "job": {"model": "tiny-4l", "global_batch": 16},
                },
                indent=2,
            )
        },
        ["validate", "inst.json"],
        ["inst.json", ":7:", " sites[0].gpus:", "must be >= 0, got -8"],
    ),
    "plan-dp-sum": (
        {"inst.yaml": BASE, "plan.json": PLAN_DP},
        ["evaluate", "inst.yaml", "plan.json"],
        ["plan.json", ":4:", " replica_groups:", "counts sum to 3, parallelism.dp is 4"],
    ),
    "plan-stage-layers": (
        {"inst.yaml": BASE, "plan.json": PLAN_PP},
        ["evaluate", "inst.yaml", "plan.json"],
        ["plan.json", ":3:", " stage_layers:", "3 entries, parallelism.pp is 2"],
    ),
    "missing-instance": (
        {},
        ["validate", "nowhere.yaml"],
        ["nowhere.yaml", "file not found"],
    ),
    "missing-plan": (
        {"inst.yaml": BASE},
        ["evaluate", "inst.yaml", "nowhere.json"],
        ["nowhere.json", "file not found"],
    ),
    "bad-backend": (
        {"inst.yaml": BASE},
        ["solve", "inst.yaml", "--backend", "gurobi", "--json"],
        ["--backend", "gurobi", "cpsat"],
    ),
}


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def _run(folder: Path, args: list[str]) -> Result:
    """The real CLI in a fresh interpreter."""
    r = subprocess.run(
        [sys.executable, "-m", "placer.cli", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return Result(r.returncode, r.stdout, r.stderr)


def _invoke(folder: Path, args: list[str]) -> Result:
    """The CLI in-process (typer's CliRunner): an uncaught exception would show up as a
    non-SystemExit `exception`, i.e. the traceback a user would see."""
    old = os.getcwd()
    os.chdir(folder)
    try:
        r = CliRunner().invoke(app, args)
    finally:
        os.chdir(old)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        tb = "".join(traceback.format_exception(r.exception))
        return Result(r.exit_code, r.stdout, r.stderr + "\n" + tb)
    return Result(r.exit_code, r.stdout, r.stderr)


def _write_case(root: pytest.TempPathFactory, name: str) -> Path:
    folder = root.mktemp(name)
    for fname, text in CASES[name][0].items():
        (folder / fname).write_text(text, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    return {name: _invoke(_write_case(tmp_path_factory, name), CASES[name][1]) for name in CASES}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exit_2_with_location(case: str, results: dict[str, Result]) -> None:
    r = results[case]
    output = r.stdout + r.stderr
    assert r.returncode == 2, f"exit {r.returncode}, expected 2:\n{output}"
    assert "Traceback" not in output
    for part in CASES[case][2]:
        assert part in r.stderr, f"{part!r} missing from:\n{r.stderr}"


SUBPROCESS_CASES = ["malformed-yaml", "plan-dp-sum"]


def test_real_command_line(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A sample of the cases through a fresh interpreter (run in parallel): same exit code,
    same message, nothing else on stderr."""
    folders = {name: _write_case(tmp_path_factory, name) for name in SUBPROCESS_CASES}
    with ThreadPoolExecutor(max_workers=len(folders)) as pool:
        runs = dict(
            zip(folders, pool.map(lambda n: _run(folders[n], CASES[n][1]), folders), strict=True)
        )
    for name, r in runs.items():
        assert r.returncode == 2, (name, r.stdout + r.stderr)
        assert "Traceback" not in r.stdout + r.stderr
        assert r.stdout == ""
        for part in CASES[name][2]:
            assert part in r.stderr, (name, part, r.stderr)


def test_messages_are_exact(results: dict[str, Result]) -> None:
    """File, line and field path come together, as `file:line: path: message`."""
    assert "inst.yaml:8: sites[1].gpus: must be >= 0, got -8" in results["negative-gpus"].stderr
    assert (
        "plan.json:4: replica_groups: counts sum to 3, parallelism.dp is 4"
        in results["plan-dp-sum"].stderr
    )


def test_union_members_do_not_leak_into_messages(results: dict[str, Result]) -> None:
    """`job.model` is `str | ModelSpec`: an inline mapping with one bad field gives one
    message about that field, not also 'Input should be a valid string' or type tags."""
    err = results["inline-model-field"].stderr
    assert err.count("inst.yaml:") == 1, err
    for noise in ("valid string", "ModelSpec", "function-after", "'str'", ".str."):
        assert noise not in err


def test_union_with_no_matching_member(tmp_path: Path) -> None:
    (tmp_path / "i.yaml").write_text(edit(15, "  model: 5") + "  sync: {mode: lazy}\n")
    with pytest.raises(InputError) as exc:
        placer.load_instance(tmp_path / "i.yaml")
    lines = str(exc.value).splitlines()
    assert lines == [
        f"{tmp_path / 'i.yaml'}:15: job.model: must be a string or a mapping, got 5",
        f"{tmp_path / 'i.yaml'}:17: job.sync.mode: must be one of 'synchronous', 'diloco' or "
        "'streaming-diloco', or a list of them, got 'lazy'",
    ]


def test_every_error_reported_at_once(tmp_path: Path) -> None:
    text = edit(8, "    gpus: -8").replace("    km: 100\n", "    km: 100\n    colour: blue\n")
    (tmp_path / "i.yaml").write_text(text)
    with pytest.raises(InputError) as exc:
        placer.load_instance(tmp_path / "i.yaml")
    msg = str(exc.value)
    assert ":8: sites[1].gpus: must be >= 0" in msg
    assert ":14: routes[0].colour: unknown key 'colour'" in msg


def test_json_instance_and_plan_work(tmp_path: Path) -> None:
    """JSON is accepted wherever YAML is, including tab-indented JSON and 1e2-style numbers."""
    import yaml

    data = yaml.safe_load(BASE)
    data["routes"][0]["km"] = "1e2"  # placeholder, replaced by a JSON number below
    text = json.dumps(data, indent="\t").replace('"1e2"', "1e2")
    (tmp_path / "inst.json").write_text(text)
    (tmp_path / "plan.json").write_text(json.dumps(GOOD_PLAN))
    prob = placer.load_instance(tmp_path / "inst.json")
    assert prob.instance.routes[0].km == 100.0
    assert prob.model.name == "tiny-4l"
    ev = placer.evaluate(prob, placer.load_plan(tmp_path / "plan.json"))
    assert ev.feasible, ev.violations
    r = _invoke(tmp_path, ["evaluate", "inst.json", "plan.json", "--json"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["feasible"] is True


# three independent cross-field errors, each caught by a different stage of validation: a
# site's GPU missing from the catalog (placer.io), a route to an unknown site (Instance), and
# minimize: cost without a step-time limit (Objective)
CROSS_FIELD_EDITS = {
    "unknown-gpu": lambda text: text.replace("    gpu: h100-sxm\n", "    gpu: h900\n", 1),
    "route-to-unknown-site": lambda text: text.replace("      - south\n", "      - west\n"),
    "cost-without-time": lambda text: text + "objective:\n  minimize: cost\n",
}


def _error_lines(r: Result) -> list[str]:
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    return [ln.removeprefix("invalid ") for ln in r.stderr.splitlines() if ln.strip()]


def test_every_cross_field_error_at_once(tmp_path: Path) -> None:
    """All three are listed in one run, in file order, each exactly as it reads alone (file,
    line, field and message unchanged), and nothing else."""
    alone = {}
    for name, change in CROSS_FIELD_EDITS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "inst.yaml").write_text(change(BASE))
        lines = _error_lines(_invoke(tmp_path / name, ["validate", "inst.yaml"]))
        assert len(lines) == 1, lines
        alone[name] = lines[0]
    assert alone["unknown-gpu"].startswith("inst.yaml:4: sites[0].gpu: unknown GPU 'h900'")
    assert alone["route-to-unknown-site"] == (
        "inst.yaml:12: routes[0].sites[1]: unknown site 'west' (known: north, south)"
    )
    assert alone["cost-without-time"].startswith(
        "inst.yaml:17: objective.max_step_time_s: required when minimize is 'cost'"
    )
    text = BASE
    for change in CROSS_FIELD_EDITS.values():
        text = change(text)
    (tmp_path / "inst.yaml").write_text(text)
    together = _error_lines(_invoke(tmp_path, ["validate", "inst.yaml"]))
    assert together == [
        alone["unknown-gpu"],
        alone["route-to-unknown-site"],
        alone["cost-without-time"],
    ]
    # the Python API says the same
    with pytest.raises(InputError) as exc:
        placer.load_instance(tmp_path / "inst.yaml")
    assert str(exc.value).splitlines() == [f"{tmp_path / ln}" for ln in together]


def test_cross_field_errors_of_hosts_and_model_reference(tmp_path: Path) -> None:
    """Per-site host checks, the model reference and the node-size check are collected too."""
    text = edit(5, "    hosts: [a, b]", insert=True)  # north: 8 hosts of 8 GPUs needed
    text = text.replace("    gpus: 64\nroutes", "    gpus: 64\n    gpus_per_node: 4\nroutes")
    text = text.replace("  model: tiny-4l\n", "  model: gpt-9\n") + "  parallelism:\n    tp: [8]\n"
    (tmp_path / "inst.yaml").write_text(text)
    with pytest.raises(InputError) as exc:
        placer.load_instance(tmp_path / "inst.yaml")
    lines = str(exc.value).splitlines()
    where = tmp_path / "inst.yaml"
    assert len(lines) == 3, lines
    hosts = "site 'north' has 64 GPUs = 8 hosts of 8 GPUs, 2 host names given"
    assert lines[0] == f"{where}:6: sites[0].hosts: {hosts}"
    assert lines[1].startswith(f"{where}:10: sites[1].gpus_per_node: 4 GPUs per node fit none")
    assert lines[2].startswith(f"{where}:17: job.model: unknown model 'gpt-9'")


def test_every_plan_shape_error_at_once(tmp_path: Path) -> None:
    (tmp_path / "inst.yaml").write_text(BASE)
    plan = json.loads(PLAN_PP)
    plan["replica_groups"][1]["count"] = 1  # dp sums to 3 as well as 3 stage entries for pp 2
    (tmp_path / "plan.json").write_text(json.dumps(plan, indent=2))
    with pytest.raises(InputError) as exc:
        placer.load_plan(tmp_path / "plan.json")
    lines = str(exc.value).splitlines()
    assert [ln.split(": ", 2)[1] for ln in lines] == ["stage_layers", "replica_groups"], lines
    assert lines[0].endswith("3 entries, parallelism.pp is 2")
    assert lines[1].endswith("counts sum to 3, parallelism.dp is 4")


def test_field_errors_keep_cross_field_errors_pydantic_reaches(tmp_path: Path) -> None:
    """With a field error the instance cannot be built, so the checks that need it wait; the
    sibling models' own checks still run beside the field error, as before."""
    (tmp_path / "i.yaml").write_text(edit(8, "    gpus: -8") + "objective:\n  minimize: cost\n")
    with pytest.raises(InputError) as exc:
        placer.load_instance(tmp_path / "i.yaml")
    lines = str(exc.value).splitlines()
    assert len(lines) == 2, lines
    assert lines[0].endswith("i.yaml:8: sites[1].gpus: must be >= 0, got -8")
    assert ":17: objective.max_step_time_s: required when minimize is 'cost'" in lines[1]


def test_python_api_validation_lists_every_problem_of_a_model() -> None:
    """`Instance.model_validate` outside placer.io: one pydantic error, every problem in it."""
    import yaml
    from pydantic import ValidationError

    from placer.schema import Instance

    data = yaml.safe_load(edit(6, "  - name: north").replace("      - south\n", "      - west\n"))
    with pytest.raises(ValidationError) as exc:
        Instance.model_validate(data)
    msg = str(exc.value)
    assert "sites[1].name: duplicate site name 'north'" in msg
    assert "routes[0].sites[1]: unknown site 'west'" in msg
