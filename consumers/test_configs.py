"""Exported framework configurations loaded by the frameworks' own parsers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import MEGATRON_VALIDATE, ROOT, megatron_lm_src, megatron_validate, require

sys.path.insert(0, str(ROOT / "consumers"))
from probe import torchtitan_args  # noqa: E402


def test_torchtitan_03_config_manager_loads_the_export(export_dir: Path, rankmap) -> None:
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    cfg = ConfigManager().parse_args(torchtitan_args(export_dir / "torchtitan_args.sh"))
    par = json.loads((export_dir / "rankmap.json").read_text())["parallelism"]
    p = cfg.parallelism
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree) == (par["tp"], par["pp"])
    assert p.data_parallel_replicate_degree * p.data_parallel_shard_degree == par["dp"]
    assert p.enable_sequence_parallel is (par["tp"] > 1)
    dims = ParallelDims.from_config(p, len(rankmap))  # torchtitan's own validation of the degrees
    assert dims.world_size == len(rankmap)
    if par["pp"] > 1:
        assert cfg.training.disable_cuda_graphs is True
        layers = [
            sum(m.startswith("layers.") for m in part) for part in p.module_fqns_per_model_part
        ]
        assert layers == [2, 2] and p.module_fqns_per_model_part[-1][-2:] == ["norm", "lm_head"]


def test_torchtitan_03_rejects_an_unknown_option(export_dir: Path) -> None:
    """The oracle can fail: the option older exports used is refused."""
    import contextlib
    import io

    from torchtitan.config.manager import ConfigManager

    said = io.StringIO()
    with (
        pytest.raises(SystemExit),
        contextlib.redirect_stdout(said),
        contextlib.redirect_stderr(said),
    ):
        ConfigManager().parse_args(
            [
                *torchtitan_args(export_dir / "torchtitan_args.sh"),
                "--parallelism.pipeline_parallel_module_fqns_per_model_part",
                "x",
            ]
        )
    assert "Unrecognized options" in said.getvalue()


def test_torchtitan_02_loads_the_toml(tmp_path: Path) -> None:
    path02 = os.environ.get(
        "TORCHTITAN_02_PATH", str(ROOT / ".venv-consumers" / "torchtitan-0.2.2")
    )
    export02 = Path(os.environ.get("PLACER_EXPORT_02", ROOT / "build" / "consumers" / "export-0.2"))
    require((Path(path02) / "torchtitan").is_dir(), f"torchtitan 0.2.2 in {path02}")
    require((export02 / "torchtitan.toml").exists(), f"placer's 0.2 export in {export02}")
    code = (
        "import json, sys; import torchtitan; from torchtitan.config import ConfigManager;"
        "c = ConfigManager().parse_args(['--job.config_file', sys.argv[1]]); p = c.parallelism;"
        "print(json.dumps([torchtitan.__file__, p.data_parallel_replicate_degree, p.data_parallel_shard_degree,"  # noqa: E501
        " p.tensor_parallel_degree, p.pipeline_parallel_degree, p.module_fqns_per_model_part, c.training.local_batch_size]))"  # noqa: E501
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(export02 / "torchtitan.toml")],
        env=os.environ | {"PYTHONPATH": path02},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    where, rep, shard, tp, pp, parts, local = json.loads(r.stdout.strip().splitlines()[-1])
    assert where.startswith(path02)
    toml = tomllib.loads((export02 / "torchtitan.toml").read_text())
    assert (rep, shard, tp, pp) == tuple(
        toml["parallelism"][k]
        for k in (
            "data_parallel_replicate_degree",
            "data_parallel_shard_degree",
            "tensor_parallel_degree",
            "pipeline_parallel_degree",
        )
    )
    assert parts[-1][-1] == "output" and local == toml["training"]["local_batch_size"]


def _megatron_args(export_dir: Path) -> dict[str, list[str]]:
    import shlex

    body = (
        (export_dir / "megatron_args.sh")
        .read_text()
        .split("MEGATRON_ARGS=(", 1)[1]
        .split("\n)", 1)[0]
    )
    out: dict[str, list[str]] = {}
    key = None
    for t in shlex.split(body, comments=True):
        if t.startswith("--"):
            key = t
            out[key] = []
        else:
            out[key].append(t)
    return out


def test_megatron_core_transformer_config_accepts_the_export(export_dir: Path) -> None:
    """Without Megatron-LM's parser (not in the megatron-core wheel): the exported values, mapped
    the way megatron/training's core_transformer_config_from_args maps them, pass
    megatron-core's own TransformerConfig validation."""
    import torch
    from megatron.core.transformer import TransformerConfig

    a = _megatron_args(export_dir)
    dtype = torch.bfloat16 if "--bf16" in a else torch.float16 if "--fp16" in a else torch.float32
    cfg = TransformerConfig(
        num_layers=int(a["--num-layers"][0]) // int(a["--pipeline-model-parallel-size"][0]),
        hidden_size=int(a["--hidden-size"][0]),
        ffn_hidden_size=int(a["--ffn-hidden-size"][0]),
        num_attention_heads=int(a["--num-attention-heads"][0]),
        num_query_groups=int(a["--num-query-groups"][0]) if "--num-query-groups" in a else None,
        tensor_model_parallel_size=int(a["--tensor-model-parallel-size"][0]),
        pipeline_model_parallel_size=int(a["--pipeline-model-parallel-size"][0]),
        sequence_parallel="--sequence-parallel" in a,
        normalization=a.get("--normalization", ["LayerNorm"])[0],
        add_bias_linear="--disable-bias-linear" not in a,
        gated_linear_unit="--swiglu" in a,
        bf16="--bf16" in a,
        params_dtype=dtype,
        pipeline_dtype=dtype,  # as core_transformer_config_from_args sets them
    )
    assert (
        cfg.sequence_parallel
        and cfg.normalization == "RMSNorm"
        and cfg.gated_linear_unit
        and not cfg.add_bias_linear
    )
    assert a["--position-embedding-type"] == ["rope"]


def test_megatron_lm_parse_and_validate_args(export_dir: Path) -> None:
    """Megatron-LM's own parse_args + validate_args. megatron/training ships in no PyPI package
    (checked: megatron-core wheel and sdist, megatron-bridge, mcore-bridge), so this runs only
    with MEGATRON_LM_SRC = a Megatron-LM checkout of the release matching megatron-core."""
    world = sum(1 for _ in open(export_dir / "rankmap.csv")) - 1
    got = megatron_validate(export_dir, world)
    src, script = megatron_lm_src(), MEGATRON_VALIDATE
    assert (
        got["sequence_parallel"]
        and got["normalization"] == "RMSNorm"
        and got["position_embedding_type"] == "rope"
        and not got["add_bias_linear"]
    )
    # the oracle can fail: without the environment megatron_args.sh exports, H100 (arch 9) aborts
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"} | {
        "WORLD_SIZE": str(world)
    }
    bad = subprocess.run(
        [sys.executable, str(script), src, str(export_dir), "9"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert bad.returncode != 0 and "CUDA_DEVICE_MAX_CONNECTIONS" in bad.stderr


# ----------------------------------------------------------------------------- uneven splits


def _uneven_export() -> Path:
    d = Path(os.environ.get("PLACER_EXPORT_UNEVEN", ROOT / "build" / "consumers" / "export-uneven"))
    require((d / "megatron_args.sh").exists(), f"placer's uneven-split export in {d}")
    return d


def _core_config(num_layers: int, split_args: dict[str, list[str]], pp: int):
    import torch
    from megatron.core.transformer import TransformerConfig

    first = split_args.get("--decoder-first-pipeline-num-layers")
    last = split_args.get("--decoder-last-pipeline-num-layers")
    layout = split_args.get("--pipeline-model-parallel-layout")
    # mapped as megatron/training's core_transformer_config_from_args maps these arguments
    return TransformerConfig(
        num_layers=num_layers,
        hidden_size=64,
        num_attention_heads=4,
        pipeline_model_parallel_size=pp,
        num_layers_in_first_pipeline_stage=int(first[0]) if first else None,
        num_layers_in_last_pipeline_stage=int(last[0]) if last else None,
        pipeline_model_parallel_layout=layout[0] if layout else None,
        pipeline_dtype=torch.bfloat16,
    )


def _layers_per_rank(cfg, pp: int) -> list[int]:
    """megatron-core's own count of the decoder layers each pipeline rank builds."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    if cfg.pipeline_model_parallel_layout is not None:
        lay = cfg.pipeline_model_parallel_layout
        return [lay.get_num_layers_to_build(pp_rank=r) for r in range(pp)]
    return [get_num_layers_to_build(cfg, pp_rank=r) for r in range(pp)]


def _split_cases() -> list[dict]:
    path = Path(
        os.environ.get("PLACER_SPLITS", ROOT / "build" / "consumers" / "megatron_splits.json")
    )
    require(path.exists(), f"placer's exported split arguments in {path}")
    return json.loads(path.read_text())


def test_megatron_core_builds_the_exported_layers_per_stage() -> None:
    """For every split placer exports (first/last stage flags or the custom layout),
    megatron-core's TransformerConfig accepts the arguments and builds exactly the split's
    layers on each pipeline rank (embedding on the first, loss on the last for a layout)."""
    from megatron.core.transformer.enums import LayerType

    cases = _split_cases()
    assert any("--pipeline-model-parallel-layout" in c["args"] for c in cases)
    assert any("--decoder-last-pipeline-num-layers" in c["args"] for c in cases)
    for c in cases:
        split, args = c["split"], c["args"]
        parsed: dict[str, list[str]] = {}
        for i in range(0, len(args), 2):
            parsed[args[i]] = [args[i + 1]]
        cfg = _core_config(sum(split), parsed, len(split))
        assert _layers_per_rank(cfg, len(split)) == split, (split, args)
        if cfg.pipeline_model_parallel_layout is not None:
            rows = cfg.pipeline_model_parallel_layout.layout
            assert LayerType.embedding in rows[0][0] and LayerType.loss in rows[-1][0]


def test_megatron_core_split_oracle_can_fail() -> None:
    """A first-stage count whose remaining layers do not divide over the middle stages is
    rejected by megatron-core (so the check above could catch a wrong mapping)."""
    with pytest.raises(ValueError, match="divisible"):
        _core_config(8, {"--decoder-first-pipeline-num-layers": ["1"]}, 3)


def test_uneven_export_in_megatron_core_and_torchtitan() -> None:
    """The uneven plan's export (stage_layers [1, 3]): Megatron's arguments give megatron-core
    1 and 3 layers; torchtitan's parser reads 1 and 3 layers per model part, with the
    embedding first and the final norm and output projection last."""
    from torchtitan.config.manager import ConfigManager

    d = _uneven_export()
    a = _megatron_args(d)
    pp = int(a["--pipeline-model-parallel-size"][0])
    cfg = _core_config(int(a["--num-layers"][0]), a, pp)
    assert _layers_per_rank(cfg, pp) == [1, 3]
    tt = ConfigManager().parse_args(torchtitan_args(d / "torchtitan_args.sh"))
    parts = tt.parallelism.module_fqns_per_model_part
    assert [sum(m.startswith("layers.") for m in p) for p in parts] == [1, 3]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    assert [m for p in parts for m in p if m.startswith("layers.")] == [
        f"layers.{i}" for i in range(4)
    ]
