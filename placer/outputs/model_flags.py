"""The one place that maps what placer's performance and memory model assumes to framework flags.

Every assumption the step-time and memory model makes about how the job runs must be what
the launch files ask the framework to do, or a plan that fits in placer's model can run out of
memory (or be slower) as exported. Each `Assumption` names the model's assumption, when it
applies, and the Megatron-LM arguments / environment and torchtitan overrides that realise
it; the fidelity work (interleaving, overlap) extends this table, nothing else.

Sources: placer.perf.flops.activation_bytes_per_layer (Korthikanti et al. 2022, tensor +
sequence parallel), placer.perf.step (job.overlap: which TP and DP communication hides under
compute; 1F1B or interleaved 1F1B by parallelism.virtual_stages), Megatron-LM
megatron/training/arguments.py (validate_args: CUDA_DEVICE_MAX_CONNECTIONS=1 is required
for tp > 1 or cp > 1 before the Blackwell architecture, i.e. compute capability < 10).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from placer.io import Problem
from placer.rules import config_of
from placer.schema import Plan


@dataclass(frozen=True)
class Assumption:
    name: str
    applies: Callable[[Problem, Plan], bool]
    megatron: list[str] = field(default_factory=list)
    megatron_env: dict[str, str] = field(default_factory=dict)
    torchtitan: list[str] = field(default_factory=list)
    note: str = ""


def _llama(problem: Problem, plan: Plan) -> bool:
    """Llama family: gated (SwiGLU) FFN; placer's models of that shape are Llama-style
    (rotary positions, RMSNorm, no linear biases)."""
    return problem.model.gated_ffn


def _pre_blackwell_tp(problem: Problem, plan: Plan) -> bool:
    """TP before Blackwell needs CUDA_DEVICE_MAX_CONNECTIONS=1, except under Megatron-FSDP
    (parallelism.dp_shard > 1), which validate_args requires NOT to have it at 1 (it only
    warns about the TP combination)."""
    if plan.parallelism.tp == 1 or (plan.parallelism.dp_shard or 1) > 1:
        return False
    used = {s for g in plan.replica_groups for s in g.stage_sites}
    return any(
        (problem.catalog.gpus[problem.instance.site(s).gpu].cuda_arch or 0) < 10 for s in used
    )


def _job(problem: Problem):  # noqa: ANN202 - the instance's job block
    return problem.instance.job


def _sequence_parallel(problem: Problem, plan: Plan) -> bool:
    return plan.parallelism.tp > 1 and _job(problem).sequence_parallel


ASSUMPTIONS: list[Assumption] = [
    Assumption(
        "sequence parallelism (activation memory 34 s b h / tp per layer, Korthikanti et al. 2022; job.sequence_parallel)",  # noqa: E501
        _sequence_parallel,
        megatron=["--sequence-parallel"],
        torchtitan=["--parallelism.enable_sequence_parallel"],
        note="the memory model divides all activations by tp",
    ),
    Assumption(
        "FSDP / ZeRO-3 over each replica's dp_shard ranks, the replicas replicating (HSDP; parallelism.dp_shard > 1)",  # noqa: E501
        lambda p, plan: (plan.parallelism.dp_shard or 1) > 1,
        note="Megatron-FSDP optim_grads_params with --num-distributed-optimizer-instances = replicas; torchtitan data_parallel_shard_degree / data_parallel_replicate_degree and fsdp_reshard_after_forward; CUDA_DEVICE_MAX_CONNECTIONS must not be 1",  # noqa: E501
    ),
    Assumption(
        "Megatron's TP kernels need ordered launches before Blackwell",
        _pre_blackwell_tp,
        megatron_env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
        note="validate_args aborts without it for tp > 1 on compute capability < 10",
    ),
    Assumption(
        "Llama architecture: rotary embeddings, RMSNorm, no linear biases",
        _llama,
        megatron=[
            "--position-embedding-type",
            "rope",
            "--normalization",
            "RMSNorm",
            "--disable-bias-linear",
        ],
    ),
    Assumption(
        "GQA: key/value heads",
        lambda p, plan: p.model.kv_heads is not None and p.model.kv_heads != p.model.heads,
        megatron=["--group-query-attention", "--num-query-groups", "{kv_heads}"],
    ),
    Assumption("gated FFN (SwiGLU)", lambda p, plan: p.model.gated_ffn, megatron=["--swiglu"]),
    Assumption(
        "untied input and output embeddings",
        lambda p, plan: not p.model.tied_embeddings,
        megatron=["--untie-embeddings-and-output-weights"],
    ),
    Assumption(
        "gradient reduce in buckets under the last micro-batch's backward (job.overlap.grad_reduce)",  # noqa: E501
        lambda p, plan: _job(p).overlap.grad_reduce,
        megatron=["--overlap-grad-reduce"],
    ),
    Assumption(
        "parameter all-gather under the next step's first forward (job.overlap.param_gather, ZeRO-1)",  # noqa: E501
        lambda p, plan: _job(p).overlap.param_gather and _job(p).zero1,
        megatron=["--overlap-param-gather"],
    ),
    Assumption(
        "TP communication overlapped with compute in Transformer Engine (job.overlap.tp_comm)",
        lambda p, plan: _job(p).overlap.tp_comm and _sequence_parallel(p, plan),
        megatron=["--tp-comm-overlap"],
        note="the catalog's tp_comm_overlap fraction of TP communication is hidden",
    ),
    Assumption(
        "MoE all-to-all of one micro-batch hidden under another's compute in the 1F1B phase (job.overlap.ep_comm, where Megatron-Core accepts it: EP > 1, no full recompute, virtual_stages > 1 with pipelining)",  # noqa: E501
        lambda p, plan: config_of(p, plan).ep_overlap,
        megatron=["--overlap-moe-expert-parallel-comm"],
        note="Megatron-Core's combined 1F1B schedule (needs torch >= 2.6, the alltoall or flex dispatcher, no --moe-shared-expert-overlap)",  # noqa: E501
    ),
    Assumption(
        "MoE layers run eagerly (job.moe_cuda_graphs false, Megatron-Core's default): every MoE layer forward waits for its tokens-per-expert host copy",  # noqa: E501
        lambda p, plan: p.model.moe is not None and not _job(p).moe_cuda_graphs,
        note="the step time prices the catalog's moe_layer_host_s per MoE layer forward (placer.perf.compute.moe_host_s)",  # noqa: E501
    ),
    Assumption(
        "MoE router and dispatcher preprocessing captured in CUDA graphs (job.moe_cuda_graphs)",
        lambda p, plan: p.model.moe is not None and _job(p).moe_cuda_graphs,
        megatron=[
            "--cuda-graph-impl",
            "transformer_engine",
            "--cuda-graph-scope",
            "moe_router",
            "moe_preprocess",
        ],
        note="no host time priced per MoE layer; Transformer Engine's partial CUDA graphs (TransformerConfig: selective or no recompute)",  # noqa: E501
    ),
    Assumption(
        "FP8 forward token dispatch, BF16 combine (job.moe_dispatch_precision fp8, DeepSeek-V3)",
        lambda p, plan: p.model.moe is not None and _job(p).moe_dispatch_precision == "fp8",
        note="DeepEP's FP8 dispatch: Megatron-Core 0.16.1 has no argument for it (its flex dispatcher sends bf16); the step time assumes FP8 dispatch, so run a DeepEP-FP8 build or expect the bf16 dispatch time",  # noqa: E501
    ),
    Assumption(
        "non-interleaved 1F1B (parallelism.virtual_stages 1)",
        lambda p, plan: (
            plan.parallelism.virtual_stages == 1
            and plan.parallelism.pipeline_schedule != "dualpipev"
        ),
        note="no virtual-stage flag; torchtitan pipeline_parallel_schedule 1F1B",
    ),
    Assumption(
        "interleaved 1F1B (parallelism.virtual_stages > 1): bubble (p-1)/(v m), v times the p2p messages, Megatron-Core's warm-up in memory",  # noqa: E501
        lambda p, plan: plan.parallelism.virtual_stages > 1,
        note="--num-virtual-stages-per-pipeline-rank (or a layout of v*pp stages) with the pipeline flags; torchtitan Interleaved1F1B over v*pp model parts",  # noqa: E501
    ),
    Assumption(
        "DualPipeV (parallelism.pipeline_schedule dualpipev): 2 chunks per rank in a V, bubble (pp-1)(F&B + B - 3W) per chunk, 2 pp + 1 chunk micro-batches in memory",  # noqa: E501
        lambda p, plan: plan.parallelism.pipeline_schedule == "dualpipev",
        note="torchtitan pipeline_parallel_schedule DualPipeV over 2*pp model parts (torch's ScheduleDualPipeV); W priced as the forward GEMMs (assumption); Megatron has no DualPipe",  # noqa: E501
    ),
]


def applicable(problem: Problem, plan: Plan) -> list[Assumption]:
    return [a for a in ASSUMPTIONS if a.applies(problem, plan)]


def megatron_model_args(problem: Problem, plan: Plan) -> list[tuple[list[str], str]]:
    """(arguments, comment) per applicable assumption that has Megatron arguments."""
    fill = {"kv_heads": str(problem.model.kv)}
    return [
        ([a.format(**fill) for a in x.megatron], x.note or x.name)
        for x in applicable(problem, plan)
        if x.megatron
    ]


def megatron_env(problem: Problem, plan: Plan) -> dict[str, str]:
    env: dict[str, str] = {}
    for a in applicable(problem, plan):
        env.update(a.megatron_env)
    return env


def model_notes(problem: Problem, plan: Plan) -> list[str]:
    return [f"- {a.name}" + (f": {a.note}" if a.note else "") for a in applicable(problem, plan)]


def torchtitan_overrides(problem: Problem, plan: Plan) -> list[str]:
    return [t for a in applicable(problem, plan) for t in a.torchtitan]


__all__ = [
    "ASSUMPTIONS",
    "Assumption",
    "applicable",
    "megatron_env",
    "megatron_model_args",
    "model_notes",
    "torchtitan_overrides",
]
