"""Context- and expert-parallel layouts (issue 16) in the real tools: the exported torchrun
scripts of consumers/case5d (tp 2 x cp 2 x ep 2 x pp 2, a replica stage spanning two NVLink
domains at one site) launch on 127.0.0.1 with gloo, and in every rank Megatron-Core's
parallel_state (initialize_model_parallel with context_parallel_size and
expert_model_parallel_size, expert TP 1 as exported) and torchtitan's ParallelDims mesh (from
the exported overrides, through its ConfigManager) give the TP, CP, EP, DP and PP groups of
placer's rank map. The Megatron flags are checked in the exported argument list."""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import pytest
from conftest import ROOT, megatron_lm_src, megatron_validate, require
from torchrun_probe import groups, run_export


@pytest.fixture(scope="module")
def export_5d() -> Path:
    d = Path(os.environ.get("PLACER_EXPORT_5D", ROOT / "build" / "consumers" / "export-5d"))
    require((d / "rankmap.csv").exists(), f"placer's 5D export in {d} (make test-consumers)")
    return d


def test_megatron_flags_of_the_5d_export(export_5d: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from placer.outputs.launch import parse_megatron_args

    args = parse_megatron_args((export_5d / "megatron_args.sh").read_text())
    assert args["--context-parallel-size"] == ["2"]
    assert args["--expert-model-parallel-size"] == ["2"]
    assert args["--expert-tensor-parallel-size"] == ["1"]
    assert args["--num-experts"] == ["8"] and args["--moe-router-topk"] == ["2"]
    assert args["--moe-layer-freq"] == ["([0]*1+[1]*3)"]
    # Megatron-LM evaluates the expression (arguments.moe_freq_type): the model's pattern
    assert eval(args["--moe-layer-freq"][0]) == [0, 1, 1, 1]  # noqa: S307


def test_torchrun_5d_groups(export_5d: Path, tmp_path: Path) -> None:
    require(
        Path(sys.executable).parent.joinpath("torchrun").exists(), "torchrun (torch) in this venv"
    )
    with open(export_5d / "rankmap.csv") as f:
        rankmap = list(csv.DictReader(f))
    world = len(rankmap)
    par = json.loads((export_5d / "rankmap.json").read_text())["parallelism"]
    assert (par["tp"], par["cp"], par["ep"], par["pp"], par["dp"]) == (2, 2, 2, 2, 1)
    probe = {f"PROBE_{k.upper()}": str(par[k]) for k in ("tp", "pp", "cp", "ep")}
    recs = run_export(export_5d, rankmap, tmp_path, probe)
    i = {k: k for k in ("tp", "cp", "dp", "pp", "ep", "expert_dp")}

    def key(*names):
        return lambda r: tuple(r[i[n]] for n in names)

    want = {
        "tp_group": groups(rankmap, key("cp", "dp", "pp")),
        "cp_group": groups(rankmap, key("tp", "dp", "pp")),
        "dp_group": groups(rankmap, key("tp", "cp", "pp")),
        "pp_group": groups(rankmap, key("tp", "cp", "dp")),
        "ep_group": groups(rankmap, key("pp", "expert_dp")),
        "expert_dp_group": groups(rankmap, key("pp", "ep")),
    }
    sites_of = {int(r["rank"]): r["site"] for r in rankmap}
    for r in rankmap:
        rank = int(r["rank"])
        rec = recs[rank]
        assert (rec["site"], rec["host"]) == (r["site"], r["host"])
        gpu = int(rec["cuda_visible_devices"].split(",")[rec["local_rank"]])
        assert gpu == int(r["local_gpu"])
        m = rec["megatron"]
        assert (m["tp"], m["cp"], m["dp"], m["pp"], m["ep"]) == tuple(
            int(r[k]) for k in ("tp", "cp", "dp", "pp", "ep")
        ), f"Megatron coordinates of rank {rank}"
        for g, ranks in want.items():
            assert sorted(m[g]) == ranks[rank], f"Megatron {g} of rank {rank}"
        # TP, CP and EP groups never leave the site
        for g in ("tp_group", "cp_group", "ep_group"):
            assert {sites_of[x] for x in m[g]} == {r["site"]}
        t = rec["torchtitan"]
        assert (t["tp"], t["cp"], t["pp"]) == (int(r["tp"]), int(r["cp"]), int(r["pp"]))
        assert sorted(t["tp_group"]) == want["tp_group"][rank]
        assert sorted(t["cp_group"]) == want["cp_group"][rank]
        assert sorted(t["ep_group"]) == want["ep_group"][rank], f"torchtitan ep of rank {rank}"
        assert t["ep"] == int(r["ep"])
    print(f"torchrun 5D: {world} ranks, Megatron and torchtitan TP/CP/EP/DP/PP groups checked")


@pytest.fixture(scope="module")
def export_ds3() -> Path:
    d = Path(os.environ.get("PLACER_EXPORT_DS3", ROOT / "build" / "consumers" / "export-ds3"))
    require(
        (d / "rankmap.csv").exists(), f"placer's DeepSeek-V3 export in {d} (make test-consumers)"
    )
    return d


def test_torchtitan_loads_the_deepseek_v3_export(export_ds3: Path) -> None:
    """The shipped DeepSeek-V3 plan (EP 8, PP 8, 2048 GPUs over two sites) through torchtitan
    0.3's ConfigManager with its deepseek_v3_671b recipe, and ParallelDims' validation."""
    sys.path.insert(0, str(ROOT / "consumers"))
    from probe import torchtitan_args
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    cfg = ConfigManager().parse_args(torchtitan_args(str(export_ds3 / "torchtitan_args.sh")))
    p = cfg.parallelism
    assert (p.expert_parallel_degree, p.pipeline_parallel_degree, p.tensor_parallel_degree) == (
        8,
        8,
        1,
    )
    world = sum(1 for _ in open(export_ds3 / "rankmap.csv")) - 1
    dims = ParallelDims.from_config(p, world)
    assert dims.world_size == world == 2048
    assert (
        sum(
            len([m for m in part if m.startswith("layers.")])
            for part in p.module_fqns_per_model_part
        )
        == 61
    )  # noqa: E501


@pytest.mark.parametrize("which", ["5d", "ds3"])
def test_megatron_lm_validates_cp_ep_exports(which: str, request) -> None:
    """Megatron-LM's own parse_args + validate_args on the CP/EP export and on the DeepSeek-V3
    one (MLA, 256 experts, --moe-layer-freq, custom pipeline layout). Needs MEGATRON_LM_SRC
    (megatron/training of the release matching megatron-core; no package ships it)."""
    megatron_lm_src()  # skips first, as before
    export = request.getfixturevalue("export_5d" if which == "5d" else "export_ds3")
    got = megatron_validate(export, sum(1 for _ in open(export / "rankmap.csv")) - 1)
    if which == "5d":
        assert (got["context_parallel_size"], got["expert_model_parallel_size"]) == (2, 2)
        assert got["data_parallel_size"] == 2 and got["moe_layer_freq"] == [0, 1, 1, 1]
    else:
        assert got["expert_model_parallel_size"] == 8 and got["num_experts"] == 256
        assert got["data_parallel_size"] == 256 and got["moe_layer_freq"] == [0] * 3 + [1] * 58
    assert got["expert_tensor_parallel_size"] == 1
