"""Run an export's torchrun launch files for real (gloo, CPU) with the probe as the
training script, as a Megatron user would: megatron_args.sh sourced first (its
environment), then each host's torchrun_<site>.sh. Shared by the consumer tests that check
the process groups the tools build against placer's rank map."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import ROOT

PROBE = ROOT / "consumers" / "probe.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def groups(
    rows: list[dict[str, str]], key: Callable[[dict[str, str]], Any]
) -> dict[int, list[int]]:
    """rank -> the sorted ranks that share key(row) with it."""
    out = defaultdict(list)
    for r in rows:
        out[key(r)].append(int(r["rank"]))
    return {rank: sorted(g) for g in out.values() for rank in g}


def run_export(
    export: Path,
    rankmap: list[dict[str, str]],
    out: Path,
    probe_env: dict[str, str],
    timeout_s: float = 900,
) -> dict[int, dict[str, Any]]:
    """Every host of the rank map runs its site's torchrun script; each one must exit 0
    and every rank of the rank map must have written its record. Returns rank -> record."""
    hosts = defaultdict(set)
    for r in rankmap:
        hosts[r["site"]].add(r["host"])
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        TRAIN_SCRIPT=str(PROBE),
        PROBE_OUT=str(out),
        PROBE_EXPORT=str(export),
        OMP_NUM_THREADS="1",
        **probe_env,
    )
    args = shlex.quote(str(export / "megatron_args.sh"))
    procs = []
    for site, hs in sorted(hosts.items()):
        script = shlex.quote(str(export / f"torchrun_{site}.sh"))
        for h in sorted(hs):
            cmd = f"source {args} && exec bash {script} {shlex.quote(h)}"
            p = subprocess.Popen(
                ["bash", "-c", cmd],
                env=env | {"PROBE_HOST": h},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            procs.append((h, p))
    for h, p in procs:
        log, _ = p.communicate(timeout=timeout_s)
        assert p.returncode == 0, f"torchrun on {h} failed:\n{log[-3000:]}"
    recs = {int(f.stem[4:]): json.loads(f.read_text()) for f in out.glob("rank*.json")}
    assert sorted(recs) == list(range(len(rankmap))), "every rank of the rank map must have run"
    return recs
