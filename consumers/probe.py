"""TRAIN_SCRIPT of the consumer tier: started by the exported torchrun scripts (and srun), it
records where it runs and the parallel groups the real frameworks build for it.

On 127.0.0.1 with gloo: Megatron-Core's parallel_state.initialize_model_parallel (default order
tp-cp-ep-dp-pp) and torchtitan's ParallelDims.build_mesh, the latter from the exported
torchtitan_args.sh loaded through torchtitan's own ConfigManager. Writes PROBE_OUT/rank<r>.json.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

# The probe builds no model, logs nothing and runs no kernel: it only asks the tools for their
# process groups. Two import-time costs of megatron.core that it never uses are skipped, as a
# user's install would: wandb (an optional import in megatron.core.inference, which sets it to
# None when absent; torchtitan imports it only for its metrics logger), and the torch.compile
# Megatron-Core applies at import to its fused bias-activation kernels (megatron/core/jit.py
# `jit_fuser`; the same decorators become identities as with its own `disable_jit_fuser()`,
# which cannot run before megatron.core's own imports). Measured per rank on the 2-core box,
# CPU seconds: 9.2 -> 6.0 of imports, about 75 s of the consumer tier's three 16-rank launches.
sys.modules.setdefault("wandb", None)  # type: ignore[arg-type]
_TORCH_COMPILE = torch.compile


def _no_jit(model=None, **_kw):
    return model if model is not None else (lambda fn: fn)


def torchtitan_args(path: str) -> list[str]:
    text = open(path).read()
    env = {}
    for ln in text.splitlines():
        if ln.startswith(': "${TORCHTITAN_'):
            k, v = ln[len(': "${') :].rstrip('}"').split(":=", 1)
            env[k] = v
    body = text.split("TORCHTITAN_ARGS=(", 1)[1].split("\n)", 1)[0]
    for k, v in env.items():
        body = body.replace(f'"${k}"', v)
    return shlex.split(body, comments=True)


def main() -> None:
    out = os.environ["PROBE_OUT"]
    export = os.environ["PROBE_EXPORT"]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rec: dict = {
        "rank": rank,
        "world": world,
        "host": os.environ.get("PROBE_HOST") or os.environ.get("SLURMD_NODENAME"),
        "site": os.environ.get("PLACER_SITE"),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_device_max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
    }
    # --- Megatron-Core
    torch.compile = _no_jit
    try:
        from megatron.core import parallel_state as ps
    finally:
        torch.compile = _TORCH_COMPILE

    tp, pp = int(os.environ["PROBE_TP"]), int(os.environ["PROBE_PP"])
    cp, ep = int(os.environ.get("PROBE_CP", "1")), int(os.environ.get("PROBE_EP", "1"))
    extra = {}
    if cp > 1:
        extra["context_parallel_size"] = cp
    if ep > 1:  # as the export: --expert-model-parallel-size ep --expert-tensor-parallel-size 1
        extra |= {"expert_model_parallel_size": ep, "expert_tensor_parallel_size": 1}
    dist_opt = int(os.environ.get("PROBE_DIST_OPT", "1"))  # --num-distributed-optimizer-instances
    if dist_opt > 1:
        extra["num_distributed_optimizer_instances"] = dist_opt
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, **extra
    )
    rec["megatron"] = {
        "tp": ps.get_tensor_model_parallel_rank(),
        "pp": ps.get_pipeline_model_parallel_rank(),
        "dp": ps.get_data_parallel_rank(),
        "tp_group": dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()),
        "pp_group": dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group()),
        "dp_group": dist.get_process_group_ranks(ps.get_data_parallel_group()),
    }
    if cp > 1 or ep > 1:
        rec["megatron"] |= {
            "cp": ps.get_context_parallel_rank(),
            "cp_group": dist.get_process_group_ranks(ps.get_context_parallel_group()),
            "ep": ps.get_expert_model_parallel_rank(),
            "ep_group": dist.get_process_group_ranks(ps.get_expert_model_parallel_group()),
            "expert_dp_group": dist.get_process_group_ranks(ps.get_expert_data_parallel_group()),
        }
    if dist_opt > 1:  # HSDP: Megatron-FSDP's shard (intra-instance) and replicate groups
        rec["megatron"] |= {
            "intra_dp_cp_group": dist.get_process_group_ranks(
                ps.get_data_parallel_group(with_context_parallel=True, partial_data_parallel=True)
            ),
            "inter_dist_opt_group": dist.get_process_group_ranks(
                ps.get_inter_distributed_optimizer_instance_group()
            ),
        }
    # --- torchtitan: the exported overrides through its ConfigManager, then its mesh
    import torchtitan.distributed.parallel_dims as tpd
    from torchtitan.config.manager import ConfigManager

    # Rank 0 parses the exported overrides (every rank reads the same file: the same argv),
    # and the parsed parallelism section reaches the others by broadcast. The first parse
    # costs ~4 CPU s (the model registry and tyro's parser), 16 ranks on 2 cores ~30 s of
    # each launch (measured); the mesh, what is under test, is still built in every rank.
    parsed = [None]
    if rank == 0:
        args = torchtitan_args(os.path.join(export, "torchtitan_args.sh"))
        parsed[0] = ConfigManager().parse_args(args).parallelism
    dist.broadcast_object_list(parsed, src=0)
    parallelism = parsed[0]
    tpd.device_type = "cpu"  # torchtitan picks "cuda" when no accelerator exists; gloo needs cpu
    dims = tpd.ParallelDims.from_config(parallelism, world)
    dims.build_mesh()
    coords = {}
    for name in ("pp", "dp_replicate", "dp_shard", "tp", "cp", "ep"):
        mesh = dims.get_optional_mesh(name)
        coords[name] = (
            (mesh.get_local_rank(), mesh.mesh.flatten().tolist())
            if mesh is not None
            else (0, [rank])
        )
    rec["torchtitan"] = {k: v[0] for k, v in coords.items()} | {
        f"{k}_group": v[1] for k, v in coords.items()
    }
    rec["torchtitan"]["module_fqns_per_model_part"] = parallelism.module_fqns_per_model_part
    rec["torchtitan"]["fsdp_reshard_after_forward"] = parallelism.fsdp_reshard_after_forward
    dist.barrier()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(rec, f)
    ps.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # The record is written and closed, the groups destroyed. Skip the interpreter's teardown
    # of the ~3,500 modules torch, megatron.core and torchtitan load: about 1 s of CPU per
    # rank, 15-20 s of each 16-rank launch on 2 cores (measured), and nothing of the tools'
    # behaviour under test happens there.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
