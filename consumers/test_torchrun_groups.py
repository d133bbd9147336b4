"""The exported torchrun scripts launch on 127.0.0.1 with gloo; in every rank Megatron-Core's
parallel_state and torchtitan's ParallelDims mesh (from the exported overrides, through
torchtitan's ConfigManager) give the coordinates and groups of placer's rank map."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from conftest import ROOT, require

PROBE = ROOT / "consumers" / "probe.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _groups(rankmap, key_fields):
    out = defaultdict(list)
    for r in rankmap:
        out[tuple(r[k] for k in key_fields)].append(int(r["rank"]))
    return {rank: sorted(g) for g in out.values() for rank in g}


def test_torchrun_launch_megatron_and_torchtitan_groups(
    export_dir: Path, rankmap, tmp_path: Path
) -> None:
    require(
        Path(sys.executable).parent.joinpath("torchrun").exists(), "torchrun (torch) in this venv"
    )
    world = len(rankmap)
    par = json.loads((export_dir / "rankmap.json").read_text())["parallelism"]
    hosts = defaultdict(set)
    for r in rankmap:
        hosts[r["site"]].add(r["host"])
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        TRAIN_SCRIPT=str(PROBE),
        PROBE_OUT=str(tmp_path),
        PROBE_EXPORT=str(export_dir),
        PROBE_TP=str(par["tp"]),
        PROBE_PP=str(par["pp"]),
        OMP_NUM_THREADS="1",
    )
    procs = []
    for site, hs in sorted(hosts.items()):
        for h in sorted(hs):
            # as a Megatron user would: megatron_args.sh sourced first (its environment), then the site's script  # noqa: E501
            cmd = f"source {shlex.quote(str(export_dir / 'megatron_args.sh'))} && exec bash {shlex.quote(str(export_dir / f'torchrun_{site}.sh'))} {shlex.quote(h)}"  # noqa: E501
            procs.append(
                (
                    h,
                    subprocess.Popen(
                        ["bash", "-c", cmd],
                        env=env | {"PROBE_HOST": h},
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    ),
                )
            )
    logs = {}
    for h, p in procs:
        out, _ = p.communicate(timeout=600)
        logs[h] = out
        assert p.returncode == 0, f"torchrun on {h} failed:\n{out[-3000:]}"
    recs = {int(f.stem[4:]): json.loads(f.read_text()) for f in tmp_path.glob("rank*.json")}
    assert sorted(recs) == list(range(world)), "every rank of the rank map must have run"
    tp_of = _groups(rankmap, ("pp", "dp"))
    pp_of = _groups(rankmap, ("tp", "dp"))
    dp_of = _groups(rankmap, ("tp", "pp"))
    for r in rankmap:
        rank = int(r["rank"])
        rec = recs[rank]
        assert rec["world"] == world
        assert (rec["site"], rec["host"]) == (r["site"], r["host"]), (
            f"rank {rank} ran on the wrong host"
        )
        gpu = int(rec["cuda_visible_devices"].split(",")[rec["local_rank"]])
        assert gpu == int(r["local_gpu"]), f"rank {rank}: GPU {gpu} != rank map {r['local_gpu']}"
        assert (
            rec["cuda_device_max_connections"] == "1"
        )  # tp > 1 on H100 (site A): Megatron requires it
        m = rec["megatron"]
        assert (m["tp"], m["pp"], m["dp"]) == (int(r["tp"]), int(r["pp"]), int(r["dp"])), (
            f"Megatron coordinates of rank {rank}"
        )
        assert (sorted(m["tp_group"]), sorted(m["pp_group"]), sorted(m["dp_group"])) == (
            tp_of[rank],
            pp_of[rank],
            dp_of[rank],
        )
        t = rec["torchtitan"]
        assert (t["tp"], t["pp"]) == (int(r["tp"]), int(r["pp"]))
        assert t["dp_replicate"] * len(t["dp_shard_group"]) + t["dp_shard"] == int(r["dp"]), (
            f"torchtitan dp of rank {rank}"
        )
        assert sorted(t["tp_group"]) == tp_of[rank] and sorted(t["pp_group"]) == pp_of[rank]
        assert sorted(set(t["dp_replicate_group"]) | set(t["dp_shard_group"])) <= dp_of[rank]
        assert t["module_fqns_per_model_part"][-1][-1] == "lm_head"
    print(
        f"torchrun: {world} ranks on {sum(len(h) for h in hosts.values())} hosts checked (site, host, GPU, Megatron tp/pp/dp + groups, torchtitan mesh)"  # noqa: E501
    )
