"""FSDP / HSDP layouts (issue 16 item 4) in the real tools: consumers/case-hsdp (tp 2 x
dp_shard 2 per replica stage, pp 2, two replicas, one per site) exported by placer.

* torchtitan 0.3 loads the exported overrides through its ConfigManager and ParallelDims
  validates the degrees (HSDP: dp_replicate 2 x dp_shard 2); torchtitan 0.2.2 loads the
  exported torchtitan.toml with the same [parallelism] degrees.
* The exported torchrun scripts launch 16 gloo ranks on 127.0.0.1; in every rank torchtitan's
  ParallelDims.build_mesh (mesh [pp, dp_replicate, dp_shard, cp, tp]) and Megatron-Core's
  parallel_state with --num-distributed-optimizer-instances as exported (Megatron-FSDP's
  HSDP groups) give the shard and replicate groups of placer's rank map: the shard group
  inside one site, the replicate group across the two.
* Megatron-LM's own validate_args accepts the Megatron-FSDP flags (needs MEGATRON_LM_SRC).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import ROOT, megatron_validate, require
from torchrun_probe import groups, run_export


@pytest.fixture(scope="module")
def export_hsdp() -> Path:
    d = Path(os.environ.get("PLACER_EXPORT_HSDP", ROOT / "build" / "consumers" / "export-hsdp"))
    require((d / "rankmap.csv").exists(), f"placer's HSDP export in {d} (make test-consumers)")
    return d


def _rankmap(export: Path) -> list[dict[str, str]]:
    with open(export / "rankmap.csv") as f:
        return list(csv.DictReader(f))


def _want(rows, shard: int) -> dict[str, dict[int, list[int]]]:
    """placer's groups from its rank map alone: the shard group is the ranks of one replica
    (dp // dp_shard) with the same pp, tp, cp; the replicate group the same shard index."""

    def c(r, k):
        return int(r[k])

    return {
        "shard": groups(rows, lambda r: (c(r, "pp"), c(r, "tp"), c(r, "cp"), c(r, "dp") // shard)),
        "replicate": groups(
            rows, lambda r: (c(r, "pp"), c(r, "tp"), c(r, "cp"), c(r, "dp") % shard)
        ),
        "tp": groups(rows, lambda r: (c(r, "pp"), c(r, "cp"), c(r, "dp"))),
        "pp": groups(rows, lambda r: (c(r, "tp"), c(r, "cp"), c(r, "dp"))),
    }


def test_torchtitan_03_builds_hsdp_degrees(export_hsdp: Path) -> None:
    from probe import torchtitan_args
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    rows = _rankmap(export_hsdp)
    cfg = ConfigManager().parse_args(torchtitan_args(str(export_hsdp / "torchtitan_args.sh")))
    p = cfg.parallelism
    assert (p.data_parallel_replicate_degree, p.data_parallel_shard_degree) == (2, 2)
    assert p.fsdp_reshard_after_forward == "always"
    dims = ParallelDims.from_config(p, len(rows))  # torchtitan's own validation of the degrees
    assert dims.dp_replicate_enabled and dims.fsdp_enabled
    assert (dims.pp, dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp) == (2, 2, 2, 1, 2)


def test_torchtitan_02_loads_the_hsdp_toml() -> None:
    path02 = os.environ.get(
        "TORCHTITAN_02_PATH", str(ROOT / ".venv-consumers" / "torchtitan-0.2.2")
    )
    export02 = Path(
        os.environ.get("PLACER_EXPORT_HSDP_02", ROOT / "build" / "consumers" / "export-hsdp-0.2")
    )
    require((Path(path02) / "torchtitan").is_dir(), f"torchtitan 0.2.2 in {path02}")
    require((export02 / "torchtitan.toml").exists(), f"placer's HSDP 0.2 export in {export02}")
    toml = tomllib.loads((export02 / "torchtitan.toml").read_text())
    assert toml["parallelism"]["data_parallel_shard_degree"] == 2
    assert toml["parallelism"]["data_parallel_replicate_degree"] == 2
    code = (
        "import json, sys; import torchtitan; from torchtitan.config import ConfigManager;"
        "c = ConfigManager().parse_args(['--job.config_file', sys.argv[1]]); p = c.parallelism;"
        "print(json.dumps([torchtitan.__file__, p.data_parallel_replicate_degree, p.data_parallel_shard_degree,"  # noqa: E501
        " p.fsdp_reshard_after_forward]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(export02 / "torchtitan.toml")],
        env=os.environ | {"PYTHONPATH": path02},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    where, rep, shard, policy = json.loads(r.stdout.strip().splitlines()[-1])
    assert where.startswith(path02)
    assert (rep, shard, policy) == (2, 2, "always")


def test_torchrun_hsdp_groups(export_hsdp: Path, tmp_path: Path) -> None:
    require(
        Path(sys.executable).parent.joinpath("torchrun").exists(), "torchrun (torch) in this venv"
    )
    sys.path.insert(0, str(ROOT))
    from placer.outputs.launch import parse_megatron_args

    rows = _rankmap(export_hsdp)
    world = len(rows)
    par = json.loads((export_hsdp / "rankmap.json").read_text())["parallelism"]
    assert (par["tp"], par["pp"], par["dp"], par["dp_shard"]) == (2, 2, 2, 2)
    margs = parse_megatron_args((export_hsdp / "megatron_args.sh").read_text())
    instances = int(margs["--num-distributed-optimizer-instances"][0])
    assert instances == par["dp"] and "--use-megatron-fsdp" in margs
    probe = {"PROBE_TP": str(par["tp"]), "PROBE_PP": str(par["pp"])}
    recs = run_export(export_hsdp, rows, tmp_path, probe | {"PROBE_DIST_OPT": str(instances)})
    want = _want(rows, par["dp_shard"])
    site = {int(r["rank"]): r["site"] for r in rows}
    for r in rows:
        rank = int(r["rank"])
        rec = recs[rank]
        assert (rec["site"], rec["host"]) == (r["site"], r["host"])
        t, m = rec["torchtitan"], rec["megatron"]
        assert sorted(t["dp_shard_group"]) == want["shard"][rank], f"torchtitan dp_shard of {rank}"
        assert sorted(t["dp_replicate_group"]) == want["replicate"][rank], f"replicate of {rank}"
        assert (
            sorted(t["tp_group"]) == want["tp"][rank] and sorted(t["pp_group"]) == want["pp"][rank]
        )
        assert t["dp_replicate"] * par["dp_shard"] + t["dp_shard"] == int(r["dp"])
        assert t["fsdp_reshard_after_forward"] == "always"
        assert sorted(m["intra_dp_cp_group"]) == want["shard"][rank], f"Megatron shard of {rank}"
        assert sorted(m["inter_dist_opt_group"]) == want["replicate"][rank]
        assert m["dp"] == int(r["dp"]) and m["tp"] == int(r["tp"]) and m["pp"] == int(r["pp"])
        # the shard group stays inside the site, the replicate group crosses the route
        assert {site[x] for x in want["shard"][rank]} == {r["site"]}
        assert {site[x] for x in want["replicate"][rank]} == {"A", "B"}
    print(
        f"torchrun HSDP: {world} ranks, torchtitan and Megatron-Core shard/replicate groups checked"
    )


def test_megatron_lm_validates_the_hsdp_export(export_hsdp: Path) -> None:
    """Megatron-LM's parse_args + validate_args on the Megatron-FSDP flags (use-megatron-fsdp,
    optim_grads_params, num-distributed-optimizer-instances, fsdp_dtensor checkpoints, no
    CUDA_DEVICE_MAX_CONNECTIONS=1). Needs MEGATRON_LM_SRC, as test_5d_groups."""
    got = megatron_validate(export_hsdp, len(_rankmap(export_hsdp)))
    assert (
        got["use_megatron_fsdp"] and got["data_parallel_sharding_strategy"] == "optim_grads_params"
    )
    assert got["num_distributed_optimizer_instances"] == 2 and got["data_parallel_size"] == 4
    assert got["ckpt_format"] == "fsdp_dtensor"
