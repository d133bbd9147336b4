"""Parameter counts, FLOPs and memory from the model's matrix shapes.

Counting matmuls from the shapes (rather than 6N) handles grouped-query attention, gated
(SwiGLU) FFNs and large vocabularies. For a GPT-style model with a 4h GELU FFN the totals
reduce to Megatron's SC21 count `72 B s l h^2 (1 + s/(6h) + V/(12 l h))`
(Narayanan et al., SC21; reference/performance-model.md), which tests check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from placer.schema import ModelSpec

BYTES_BF16 = 2


def attention_params(m: ModelSpec) -> int:
    """Q and O are h x h; K and V are h x (kv_heads * head_dim)."""
    kv_dim = m.kv * (m.hidden // m.heads)
    return 2 * m.hidden * m.hidden + 2 * m.hidden * kv_dim


def ffn_params(m: ModelSpec) -> int:
    return (3 if m.gated_ffn else 2) * m.hidden * m.ffn


def layer_params(m: ModelSpec) -> int:
    """One transformer block: attention, FFN and its two norms (biases are ignored)."""
    return attention_params(m) + ffn_params(m) + 2 * m.hidden


def embedding_params(m: ModelSpec) -> int:
    return m.vocab * m.hidden


def output_params(m: ModelSpec) -> int:
    """The LM head (zero extra when tied to the input embedding) plus the final norm."""
    return (0 if m.tied_embeddings else m.vocab * m.hidden) + m.hidden


def param_count(m: ModelSpec) -> int:
    return m.layers * layer_params(m) + embedding_params(m) + output_params(m)


def stage_params(m: ModelSpec, layers: int, first: bool, last: bool) -> int:
    """Parameters a pipeline stage holds. With tied embeddings both ends hold the matrix
    (Megatron keeps a copy on the last stage and all-reduces its gradient)."""
    n = layers * layer_params(m)
    if first:
        n += embedding_params(m)
    if last:
        n += output_params(m) + (embedding_params(m) if m.tied_embeddings and not first else 0)
    return n


def layer_matmul_flops_per_token(m: ModelSpec) -> float:
    """Forward FLOPs of one block's weight matmuls for one token (2 per multiply-add)."""
    return 2.0 * (attention_params(m) + ffn_params(m))


def attention_core_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Q K^T and attention x V: 2 * 2 * s * h per token (full, as Megatron counts)."""
    return 4.0 * seq_len * m.hidden


def logits_flops_per_token(m: ModelSpec) -> float:
    return 2.0 * m.hidden * m.vocab


@dataclass(frozen=True)
class StageFlops:
    """FLOPs of one micro-batch on one stage (all tp ranks together)."""

    forward: float
    backward: float  # includes recomputation

    @property
    def total(self) -> float:
        return self.forward + self.backward


def stage_flops(
    m: ModelSpec, layers: int, last: bool, micro_batch: int, recompute: str
) -> StageFlops:
    s = m.seq_len
    tokens = micro_batch * s
    matmul = layer_matmul_flops_per_token(m)
    core = attention_core_flops_per_token(m, s)
    fwd_layer = matmul + core
    fwd = tokens * (layers * fwd_layer + (logits_flops_per_token(m) if last else 0.0))
    bwd = 2.0 * fwd
    if recompute == "full":
        bwd += tokens * layers * fwd_layer  # one more forward of every block (not the logits)
    elif recompute == "selective":
        bwd += tokens * layers * core  # only the attention core is recomputed (Korthikanti et al.)
    return StageFlops(forward=fwd, backward=bwd)


def model_flops_per_step(m: ModelSpec, global_batch: int) -> float:
    """Model FLOPs (no recompute) of one optimizer step: the numerator of MFU."""
    tokens = global_batch * m.seq_len
    per_token = m.layers * (
        layer_matmul_flops_per_token(m) + attention_core_flops_per_token(m, m.seq_len)
    )
    per_token += logits_flops_per_token(m)
    return 3.0 * tokens * per_token


def hardware_flops_per_step(m: ModelSpec, global_batch: int, recompute: str) -> float:
    """Hardware FLOPs (with recompute) of one step: what SC21 Table 1 reports per GPU."""
    f = stage_flops(m, m.layers, last=True, micro_batch=global_batch, recompute=recompute)
    return f.total


# ----------------------------------------------------------------------------- memory


def model_state_bytes_per_param(dp: int, zero1: bool) -> float:
    """Mixed-precision Adam: 2 (bf16 weights) + 2 (grads) + 12 (fp32 master, m, v);
    ZeRO-1 shards the 12 optimizer bytes over the data-parallel group."""
    return 4.0 + (12.0 / dp if zero1 else 12.0)


def activation_bytes_per_layer(m: ModelSpec, micro_batch: int, tp: int, recompute: str) -> float:
    """Korthikanti et al. 2022 (arXiv 2205.05198), tensor + sequence parallel."""
    s, b, h, a = m.seq_len, micro_batch, m.hidden, m.heads
    if recompute == "none":
        return s * b * h * (34.0 / tp + 5.0 * a * s / (h * tp))
    if recompute == "selective":
        return 34.0 * s * b * h / tp
    return 2.0 * s * b * h  # full: only the block input is checkpointed


def stage_memory_bytes(
    m: ModelSpec,
    layers: int,
    stage: int,
    pp: int,
    tp: int,
    dp: int,
    micro_batch: int,
    num_micro_batches: int,
    recompute: str,
    zero1: bool,
    virtual_stages: int = 1,
) -> dict[str, float]:
    """Per-GPU memory of a stage (pipeline rank): model state, and the activations of the
    chunk micro-batches its schedule holds at once (in_flight_chunks), each of
    layers / virtual_stages layers."""
    first, last = stage == 0, stage == pp - 1
    params = stage_params(m, layers, first, last) / tp
    state = params * model_state_bytes_per_param(dp, zero1)
    chunks = in_flight_chunks(pp, num_micro_batches, virtual_stages, stage)
    act = (
        layers / virtual_stages * chunks * activation_bytes_per_layer(m, micro_batch, tp, recompute)
    )
    if recompute == "full":
        act += activation_bytes_per_layer(
            m, micro_batch, tp, "selective"
        )  # the block being recomputed
    if last:
        act += 4.0 * micro_batch * m.seq_len * m.vocab / tp  # fp32 logits of one micro-batch
    return {"model_state": state, "activations": act, "total": state + act}


def in_flight_chunks(pp: int, m: int, v: int, rank: int) -> int:
    """Chunk micro-batches whose activations pipeline rank `rank` holds at its peak: the
    forwards its schedule runs before its first backward, plus the one in flight.

    1F1B (v = 1): min(pp - rank, m) (Narayanan et al. SC21 section 2.2.1: the first stage
    holds pp micro-batches). Interleaved (Megatron-Core forward_backward_pipelining_with_
    interleaving, placer.perf.critical_path.interleaved_order): a warm-up of
    min(m v, 2 (pp - rank - 1) + (v - 1) pp) forwards, then one more forward before each
    backward: min(m v, 2 (pp - rank - 1) + (v - 1) pp + 1). For the first rank that is
    pp v + pp - 1 chunks of 1/v of the stage each, pp (1 + (pp - 1) / (pp v)) stages'
    worth: Megatron-LM's own estimate (megatron/training/theoretical_memory_usage.py,
    `interleaved_schedule_memory_penalty` = 1 + (pp - 1) / (pp v) on pp micro-batches).
    tests/test_interleave.py checks the count against the schedule itself."""
    if v == 1:
        return min(pp - rank, m)
    return min(m * v, 2 * (pp - rank - 1) + (v - 1) * pp + 1)


def config_stage_memory_bytes(m: ModelSpec, cfg: Any, stage: int) -> dict[str, float]:
    """stage_memory_bytes for stage `stage` of a configuration (placer.rules.Config)."""
    return stage_memory_bytes(
        m,
        cfg.stage_layers[stage],
        stage,
        cfg.pp,
        cfg.tp,
        cfg.dp,
        cfg.micro_batch,
        cfg.num_micro_batches,
        cfg.recompute,
        cfg.zero1,
        getattr(cfg, "virtual_stages", 1),
    )
