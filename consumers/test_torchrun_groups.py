"""The exported torchrun scripts launch on 127.0.0.1 with gloo; in every rank Megatron-Core's
parallel_state and torchtitan's ParallelDims mesh (from the exported overrides, through
torchtitan's ConfigManager) give the coordinates and groups of placer's rank map."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import require
from torchrun_probe import groups, run_export


def _groups(rankmap, key_fields):
    return groups(rankmap, lambda r: tuple(r[k] for k in key_fields))


def test_torchrun_launch_megatron_and_torchtitan_groups(
    export_dir: Path, rankmap, tmp_path: Path
) -> None:
    require(
        Path(sys.executable).parent.joinpath("torchrun").exists(), "torchrun (torch) in this venv"
    )
    world = len(rankmap)
    par = json.loads((export_dir / "rankmap.json").read_text())["parallelism"]
    hosts = {(r["site"], r["host"]) for r in rankmap}
    recs = run_export(
        export_dir, rankmap, tmp_path, {"PROBE_TP": str(par["tp"]), "PROBE_PP": str(par["pp"])}, 600
    )
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
        f"torchrun: {world} ranks on {len(hosts)} hosts checked (site, host, GPU, Megatron tp/pp/dp + groups, torchtitan mesh)"  # noqa: E501
    )
