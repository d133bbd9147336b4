"""The exported sbatch script on a private SLURM cluster (slurmctld + one slurmd per host of the
export, all on 127.0.0.1): sbatch --test-only accepts it, and a real run places every task on the
host and GPU (SLURM_LOCALID) of placer's rank map."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, require, require_cmd

CLUSTER = ROOT / "consumers" / "slurm_cluster.sh"
PROBE = """import json, os
r = int(os.environ["SLURM_PROCID"])
keys = ("SLURMD_NODENAME", "SLURM_PROCID", "SLURM_LOCALID", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")
json.dump({k: os.environ.get(k) for k in keys}, open(os.path.join(os.environ["PROBE_OUT"], f"rank{r}.json"), "w"))
"""  # noqa: E501


@pytest.fixture(scope="module")
def cluster(export_dir: Path, rankmap, tmp_path_factory):
    require_cmd("slurmctld", "slurmd", "sbatch", "munged")
    require(os.geteuid() == 0, "root (munged and slurmd run as root)")
    d = tmp_path_factory.mktemp("slurm")
    hosts = (export_dir / "slurm_nodes.txt").read_text().split()
    gpus = max(int(r["local_gpu"]) for r in rankmap) + 1
    up = subprocess.run(
        ["bash", str(CLUSTER), "start", str(d), str(gpus), *hosts],
        capture_output=True,
        text=True,
        timeout=180,
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield d / "slurm.conf"
    finally:
        subprocess.run(["bash", str(CLUSTER), "stop", str(d)], timeout=60)


def test_sbatch_runs_every_task_where_the_rank_map_says(
    cluster: Path, export_dir: Path, rankmap, tmp_path: Path
) -> None:
    job = tmp_path / "job"
    shutil.copytree(export_dir, job)
    (tmp_path / "probe.py").write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    env = os.environ | {
        "SLURM_CONF": str(cluster),
        "TRAIN_SCRIPT": str(tmp_path / "probe.py"),
        "PROBE_OUT": str(out),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    test = subprocess.run(
        ["sbatch", "--test-only", "slurm.sbatch"],
        cwd=job,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert test.returncode == 0, test.stderr
    # the oracle can fail: the header older exports wrote (node list file + arbitrary distribution
    # on #SBATCH lines, which makes sbatch read the node list as a per-task hostfile)
    text = (job / "slurm.sbatch").read_text()
    nodelist = next(ln for ln in text.splitlines() if ln.startswith("#SBATCH --nodelist="))
    (job / "old.sbatch").write_text(
        text.replace(
            nodelist, "#SBATCH --nodelist=./slurm_nodes.txt\n#SBATCH --distribution=arbitrary", 1
        )
    )
    old = subprocess.run(
        ["sbatch", "--test-only", "old.sbatch"],
        cwd=job,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert old.returncode != 0, old.stderr
    run = subprocess.run(
        ["sbatch", "--wait", "-o", str(tmp_path / "job.out"), "slurm.sbatch"],
        cwd=job,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert run.returncode == 0, run.stderr + log
    recs = {int(f.stem[4:]): json.loads(f.read_text()) for f in out.glob("rank*.json")}
    assert sorted(recs) == [int(r["rank"]) for r in rankmap]
    for r in rankmap:
        rec = recs[int(r["rank"])]
        assert rec["SLURMD_NODENAME"] == r["host"], (
            f"task {r['rank']} ran on {rec['SLURMD_NODENAME']}, rank map says {r['host']}"
        )
        assert int(rec["SLURM_LOCALID"]) == int(r["local_gpu"]) == int(rec["LOCAL_RANK"])
        assert rec["WORLD_SIZE"] == str(len(rankmap)) and rec["MASTER_ADDR"] == rankmap[0]["host"]
    print(
        f"slurm: sbatch --test-only ok; {len(recs)} tasks on {len({r['host'] for r in rankmap})} hosts placed as the rank map says"  # noqa: E501
    )
