"""A seeded mutation fuzzer over the shipped instances and plans (issue 15): every mutant
is accepted (exit 0), refused as bad input (exit 2, naming the file and a field path) or
infeasible (exit 3); never an internal error (exit 1), a traceback or a hang. Bounded to
about a minute on 2 cores."""

from __future__ import annotations

import copy
import json
import random
import re
import time
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from placer.cli import app

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = sorted((ROOT / "instances").glob("*.yaml"))
PLANS = {p.stem: p for p in (ROOT / "instances" / "plans").glob("*.json")}
runner = CliRunner()
FIELD = re.compile(r":(\d+:)? [A-Za-z_][\w]*(\[\d+\])*(\.[\w-]+(\[\d+\])*)*: ")

HOSTILE: list[Any] = [
    -1,
    0,
    1,
    3,
    2**63,
    10**30,
    -(10**30),
    1e400,
    -1e400,
    float("nan"),
    True,
    False,
    None,
    "",
    "x" * 5000,
    "..",
    [],
    {},
    [1, 2],
    0.5,
    1e-300,
    "1e400",
    {"a": 1},
    7.25,
    100000,
    "h100-sxm",
]


def _leaves(data: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path] if path else []
    if isinstance(data, dict):
        for k, v in data.items():
            out += _leaves(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += _leaves(v, path + (i,))
    return out


def _set(data: Any, path: tuple[Any, ...], value: Any) -> None:
    for p in path[:-1]:
        data = data[p]
    if value is _DELETE:
        if isinstance(data, dict):
            data.pop(path[-1])
        else:
            data.pop(path[-1])
    else:
        data[path[-1]] = value


_DELETE = object()


def _mutate(rng: random.Random, data: Any) -> Any:
    m = copy.deepcopy(data)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        paths = _leaves(m)
        if not paths:
            break
        path = rng.choice(paths)
        value = rng.choice([*HOSTILE, _DELETE])
        _set(m, path, value)
    return m


def _dump(data: Any) -> str:
    # yaml writes inf/nan as .inf/.nan: the loader sees real infinities
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def _check(r: Any, f: Path, allowed: tuple[int, ...] = (0, 2, 3)) -> None:
    out = r.output
    assert r.exit_code in allowed, (
        f"exit {r.exit_code} for {f.name}:\n{f.read_text()[:3000]}\n{out[-3000:]}"
    )
    assert "Traceback" not in out and "internal error" not in out, out
    if r.exit_code == 2:
        assert str(f) in out, out
        assert FIELD.search(out) or "malformed" in out or "an instance file is a mapping" in out, (
            out
        )


def test_fuzz_instances_and_plans(tmp_path: Path) -> None:
    rng = random.Random(15)
    t_end = time.monotonic() + 30  # of one xdist worker (not serial: 30 s is 10x a 3 s limit)
    docs = {p: yaml.safe_load(p.read_text()) for p in INSTANCES}
    plans = {k: json.loads(p.read_text()) for k, p in PLANS.items()}
    n = {"validate": 0, "evaluate": 0, "plan": 0, "solve": 0}
    i = 0
    while time.monotonic() < t_end:
        i += 1
        src = rng.choice(INSTANCES)
        inst = tmp_path / f"m{i}.yaml"
        kind = rng.random()
        if kind < 0.55:
            inst.write_text(_dump(_mutate(rng, docs[src])))
            r = runner.invoke(app, ["validate", str(inst)])
            _check(r, inst, (0, 2))
            n["validate"] += 1
        elif kind < 0.75 and src.stem in PLANS:
            inst.write_text(_dump(_mutate(rng, docs[src])))
            r = runner.invoke(app, ["evaluate", str(inst), str(PLANS[src.stem]), "--json"])
            _check(r, inst)
            if r.exit_code in (0, 3):
                json.loads(
                    r.stdout, parse_constant=lambda c: (_ for _ in ()).throw(AssertionError(c))
                )
            n["evaluate"] += 1
        elif kind < 0.97 and src.stem in PLANS:
            plan = tmp_path / f"p{i}.json"
            plan.write_text(json.dumps(_mutate(rng, plans[src.stem]), allow_nan=True))
            inst = src
            r = runner.invoke(app, ["evaluate", str(inst), str(plan)])
            _check(r, plan)
            n["plan"] += 1
        else:
            inst.write_text(_dump(_mutate(rng, docs[src])))
            t0 = time.monotonic()
            r = runner.invoke(
                app, ["solve", str(inst), "-q", "--time-limit", "3", "-o", str(tmp_path / f"o{i}")]
            )
            _check(r, inst, (0, 2, 3, 4))
            assert time.monotonic() - t0 < 30, (
                f"solve of {inst} took {time.monotonic() - t0:.0f} s on a 3 s limit"
            )
            n["solve"] += 1
    print("mutants", n)
    assert sum(n.values()) >= 100, n
