"""Run Megatron-LM's own parse_args and validate_args on the exported MEGATRON_ARGS.

    python megatron_validate.py MEGATRON_LM_SRC EXPORT_DIR ARCH

MEGATRON_LM_SRC holds megatron/training of the Megatron-LM release matching the installed
megatron-core (not shipped in the megatron-core wheel); ARCH is the compute capability major of
the GPU emulated (validate_args asks torch.cuda, which a CPU build does not have). The
environment is what megatron_args.sh exports (source it first). Prints the parsed parallel
sizes as JSON; exits non-zero with Megatron's own message when it rejects the arguments.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")


def exported_args(export: Path) -> list[str]:
    body = (
        (export / "megatron_args.sh").read_text().split("MEGATRON_ARGS=(", 1)[1].split("\n)", 1)[0]
    )
    return shlex.split(body, comments=True)


def main() -> None:
    src, export, arch = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    sys.path.append(
        str(src)
    )  # `megatron` is a namespace package: core from the wheel, training from src
    import megatron.training.arguments as A

    A.get_device_arch_version = lambda: arch
    import torch

    # --moe-grouped-gemm asks torch.cuda for the compute capability: the emulated GPU's
    torch.cuda.get_device_capability = lambda *a, **k: (arch, 0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # the data/tokenizer/optimizer arguments the export leaves to the user (mock data)
    extra = [
        "--mock-data",
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        "2048",
        "--train-iters",
        "1",
        "--lr",
        "1e-4",
        "--no-gradient-accumulation-fusion",
        "--transformer-impl",
        "local",
    ]
    sys.argv = ["pretrain_gpt.py", *exported_args(export), *extra]
    args = A.parse_args()
    args.world_size = world
    A.validate_args(args)
    print(
        json.dumps(
            {
                k: getattr(args, k)
                for k in (
                    "tensor_model_parallel_size",
                    "pipeline_model_parallel_size",
                    "data_parallel_size",
                    "sequence_parallel",
                    "normalization",
                    "position_embedding_type",
                    "add_bias_linear",
                    "swiglu",
                    "num_query_groups",
                    "untie_embeddings_and_output_weights",
                    "num_layers",
                    "global_batch_size",
                    "micro_batch_size",
                    "context_parallel_size",
                    "expert_model_parallel_size",
                    "expert_tensor_parallel_size",
                    "num_experts",
                    "moe_router_topk",
                    "moe_ffn_hidden_size",
                    "moe_layer_freq",
                    "use_megatron_fsdp",
                    "data_parallel_sharding_strategy",
                    "num_distributed_optimizer_instances",
                    "ckpt_format",
                )
            }
        )
    )


if __name__ == "__main__":
    main()
