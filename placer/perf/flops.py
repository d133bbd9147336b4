"""Parameter counts, FLOPs and memory from the model's matrix shapes.

Counting matmuls from the shapes (rather than 6N) handles grouped-query attention, gated
(SwiGLU) FFNs and large vocabularies. For a GPT-style model with a 4h GELU FFN the totals
reduce to Megatron's SC21 count `72 B s l h^2 (1 + s/(6h) + V/(12 l h))`
(Narayanan et al., SC21; reference/performance-model.md), which tests check.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from functools import cache
from typing import Any

from placer.perf.critical_path import interleaved_order
from placer.schema import ModelSpec

BYTES_BF16 = 2


def q_dim(m: ModelSpec) -> int:
    """Width of the concatenated queries (heads x per-head query/key width)."""
    if m.mla is not None:
        return m.heads * (m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim)
    return m.heads * m.hd


def v_dim(m: ModelSpec) -> int:
    """Width of the concatenated attention outputs (the input of the output projection)."""
    return m.heads * (m.mla.v_head_dim if m.mla is not None else m.hd)


def kv_exchange_width(m: ModelSpec) -> int:
    """Values per token of the K and V that context parallelism's ring passes on: 2 kv_dim
    with GQA; with MLA the decompressed per-head K (nope + rope) and V, as Megatron-Core's
    MLA with CP exchanges them (its KV is up-projected before the core attention)."""
    if m.mla is not None:
        return q_dim(m) + v_dim(m)
    return 2 * m.kv * m.hd


def attention_params(m: ModelSpec) -> int:
    """Q (h x heads*hd), K and V (h x kv_heads*hd each), O (heads*hd x h). With MLA
    (DeepSeek-V2/V3, arXiv 2405.04434 section 2.1): the query down/up projections and their
    norm, the joint KV down projection (latent + the shared rope key) and its norm, the KV
    up projection to the per-head no-rope key and value, and the output projection."""
    h = m.hidden
    if m.mla is None:
        return h * q_dim(m) + 2 * h * m.kv * m.hd + v_dim(m) * h
    a = m.mla
    q = (
        h * q_dim(m)
        if a.q_lora_rank is None
        else h * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * q_dim(m)
    )
    kv = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank
    kv += a.kv_lora_rank * m.heads * (a.qk_nope_head_dim + a.v_head_dim)
    return q + kv + v_dim(m) * h


def ffn_params(m: ModelSpec) -> int:
    """The dense FFN (every layer of a dense model, the dense layers of an MoE model)."""
    return (3 if m.gated_ffn else 2) * m.hidden * m.ffn


def expert_params(m: ModelSpec) -> int:
    """One routed expert: an FFN of width expert_ffn_hidden (gated like the dense FFN)."""
    assert m.moe is not None
    return (3 if m.gated_ffn else 2) * m.hidden * m.moe.expert_ffn_hidden


def shared_expert_params(m: ModelSpec) -> int:
    assert m.moe is not None
    return (3 if m.gated_ffn else 2) * m.hidden * m.moe.shared_ffn


def router_params(m: ModelSpec) -> int:
    assert m.moe is not None
    return m.hidden * m.moe.experts


def moe_ffn_params(m: ModelSpec, active: bool = False) -> int:
    """An MoE layer's FFN: routed experts (all, or the top-k a token uses), shared experts,
    router."""
    assert m.moe is not None
    n = m.moe.top_k if active else m.moe.experts
    return n * expert_params(m) + shared_expert_params(m) + router_params(m)


def layer_params(m: ModelSpec, i: int = 0, active: bool = False) -> int:
    """Transformer block i: attention, its FFN (dense or MoE) and two norms (no biases)."""
    ffn = moe_ffn_params(m, active) if m.is_moe_layer(i) else ffn_params(m)
    return attention_params(m) + ffn + 2 * m.hidden


def layers_params(m: ModelSpec, first: int, count: int, active: bool = False) -> int:
    """Blocks first..first+count-1: the dense blocks and the MoE blocks each have one
    size, so two block sizes and a count (the search calls this ~10^6 times)."""
    n_moe = m.moe_layers_in(first, count)
    dense = (count - n_moe) * (attention_params(m) + ffn_params(m) + 2 * m.hidden)
    if n_moe == 0:
        return dense
    return dense + n_moe * (attention_params(m) + moe_ffn_params(m, active) + 2 * m.hidden)


def expert_layer_params(m: ModelSpec, first: int, count: int) -> int:
    """Routed-expert parameters of blocks first..first+count-1: what expert parallelism
    shards (shared experts and router stay with the dense part, as in Megatron-Core)."""
    if m.moe is None:
        return 0
    return m.moe_layers_in(first, count) * m.moe.experts * expert_params(m)


def embedding_params(m: ModelSpec) -> int:
    return m.vocab * m.hidden


def output_params(m: ModelSpec) -> int:
    """The LM head (zero extra when tied to the input embedding) plus the final norm."""
    return (0 if m.tied_embeddings else m.vocab * m.hidden) + m.hidden


def param_count(m: ModelSpec) -> int:
    return layers_params(m, 0, m.layers) + embedding_params(m) + output_params(m)


def active_param_count(m: ModelSpec, with_embedding: bool = True) -> int:
    """Parameters one token uses: top-k routed experts instead of all. Model cards differ
    on the input embedding (a lookup, no FLOPs): DeepSeek-V3's 37B counts it, GPT-OSS's
    5.1B does not (`with_embedding`)."""
    n = layers_params(m, 0, m.layers, active=True) + output_params(m)
    return n + (embedding_params(m) if with_embedding else 0)


def stage_params(m: ModelSpec, layers: int, first: bool, last: bool, first_layer: int = 0) -> int:
    """Parameters a pipeline stage holds (its blocks start at `first_layer`). With tied
    embeddings both ends hold the matrix (Megatron keeps a copy on the last stage and
    all-reduces its gradient)."""
    n = layers_params(m, first_layer, layers)
    if first:
        n += embedding_params(m)
    if last:
        n += output_params(m) + (embedding_params(m) if m.tied_embeddings and not first else 0)
    return n


def layer_matmul_flops_per_token(m: ModelSpec, i: int = 0) -> float:
    """Forward FLOPs of block i's weight matmuls for one token (2 per multiply-add); an MoE
    block counts the top-k experts a token goes through, the shared experts, the router."""
    return 2.0 * (layer_params(m, i, active=True) - 2 * m.hidden)


def attention_core_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Q K^T and attention x V: 2 s (q_dim + v_dim) per token, which is Megatron's full
    4 s h when heads x head_dim = h (MLA: 192-wide query/key heads, 128-wide values)."""
    return 2.0 * seq_len * (q_dim(m) + v_dim(m))


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
    m: ModelSpec,
    layers: int,
    last: bool,
    micro_batch: int,
    recompute: str,
    first_layer: int = 0,
) -> StageFlops:
    s = m.seq_len
    tokens = micro_batch * s
    matmul = sum(
        layer_matmul_flops_per_token(m, i) for i in range(first_layer, first_layer + layers)
    )
    core = layers * attention_core_flops_per_token(m, s)
    fwd_blocks = matmul + core
    fwd = tokens * (fwd_blocks + (logits_flops_per_token(m) if last else 0.0))
    bwd = 2.0 * fwd
    if recompute == "full":
        bwd += tokens * fwd_blocks  # one more forward of every block (not the logits)
    elif recompute == "selective":
        bwd += tokens * core  # only the attention core is recomputed (Korthikanti et al.)
    return StageFlops(forward=fwd, backward=bwd)


def model_flops_per_step(m: ModelSpec, global_batch: int) -> float:
    """Model FLOPs (no recompute) of one optimizer step: the numerator of MFU (MoE: the
    FLOPs of the experts each token is routed to, not of all experts)."""
    tokens = global_batch * m.seq_len
    per_token = sum(layer_matmul_flops_per_token(m, i) for i in range(m.layers))
    per_token += m.layers * attention_core_flops_per_token(m, m.seq_len)
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


def activation_bytes_per_layer(
    m: ModelSpec,
    micro_batch: int,
    tp: int,
    recompute: str,
    cp: int = 1,
    moe: bool = False,
    load_imbalance: float = 1.0,
    etp: int = 1,
) -> float:
    """Korthikanti et al. 2022 (arXiv 2205.05198), tensor + sequence parallel; context
    parallelism divides every term by cp (each rank keeps s/cp tokens, and its attention
    scores are (s/cp) x s). An MoE layer replaces the MLP's 19 s b h / t of the 34 (input 2,
    fc1 out 8, GELU out 8, mask 1, per token for the 4h GELU MLP) by the same terms of its
    shared experts and of top_k x load_imbalance routed copies (each with its permuted 2h
    input), all on the rank's s / t tokens; with expert TP etp a GPU keeps the gathered
    copies of its etp GPUs (etp x the permuted input, 1/etp of each copy's FFN width)."""
    s, b, h, a = m.seq_len, micro_batch, m.hidden, m.heads
    if recompute == "full":
        return 2.0 * s * b * h / cp  # only the block input is checkpointed
    per_token = 34.0 * h
    if moe and m.moe is not None:
        e = m.moe
        gate = 2 if m.gated_ffn else 1

        def width_bytes(f: float) -> float:
            return 2.0 * gate * f + 2.0 * f  # fc1 output + activation output, bf16

        routed = e.top_k * load_imbalance * (2.0 * h * etp + width_bytes(e.expert_ffn_hidden))
        per_token += -19.0 * h + 3.0 * h + routed + width_bytes(e.shared_ffn)
    out = s * b * per_token / tp
    if recompute == "none":
        out += 5.0 * a * s * s * b / tp
    return out / cp


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
    *,
    first_layer: int = 0,
    cp: int = 1,
    ep: int = 1,
    load_imbalance: float = 1.0,
    virtual_stages: int = 1,
    dp_shard: int = 1,
    reshard_after_forward: bool = True,
    etp: int | None = None,
    chunks: tuple[int, ...] | None = None,
) -> dict[str, float]:
    """Per-GPU memory of a stage; 1F1B keeps min(pp - stage, m) micro-batches in flight.

    With an FSDP shard group (dp_shard > 1, ep = 1) the model state is fsdp_state_bytes.

    `dp` counts pipeline replicas, each of tp x cp x ep GPUs per stage (placer.rules.Config):
    the dense weights are split over tp and replicated over the dp x cp x ep others (ZeRO-1
    shards their optimizer state over those), the routed experts are split over ep and
    replicated over dp x tp x cp (Megatron-Core's expert data-parallel group, expert
    TP = 1). Folded (etp set, placer.rules.expert_fold_width): a replica stage of
    W = lcm(tp cp, ep etp) GPUs, the dense weights replicated over dp W / tp ranks and the
    routed experts split over ep x etp and replicated over dp W / (ep etp). The activations are
    those of the chunk micro-batches the schedule holds at
    once (in_flight_chunks), each of layers / virtual_stages layers; with uneven `chunks`
    (the rank's layers per chunk, parallelism.chunk_layers) the peak over the schedule of
    the chunk micro-batches it holds, each weighing its chunk's share of the layers
    (peak_chunk_layers)."""
    first, last = stage == 0, stage == pp - 1
    total = stage_params(m, layers, first, last, first_layer)
    experts = expert_layer_params(m, first_layer, layers)
    dense = (total - experts) / tp
    e_tp = etp or 1
    routed = experts / (ep * e_tp)
    if dp_shard > 1:
        state = fsdp_state_bytes(m, layers, total / tp, dp_shard * cp, reshard_after_forward)
    elif etp is not None:
        w = math.lcm(tp * cp, ep * etp)
        state = dense * model_state_bytes_per_param(dp * w // tp, zero1)
        state += routed * model_state_bytes_per_param(dp * w // (ep * etp), zero1)
    else:
        state = dense * model_state_bytes_per_param(dp * cp * ep, zero1)
        state += routed * model_state_bytes_per_param(dp * tp * cp, zero1)
    in_flight = in_flight_chunks(pp, num_micro_batches, virtual_stages, stage)
    n_moe = m.moe_layers_in(first_layer, layers)
    per_mb = (layers - n_moe) * activation_bytes_per_layer(m, micro_batch, tp, recompute, cp)
    per_mb += n_moe * activation_bytes_per_layer(
        m, micro_batch, tp, recompute, cp, True, load_imbalance, e_tp
    )
    if chunks is not None and len(set(chunks)) > 1 and num_micro_batches % pp == 0:
        act = per_mb * peak_chunk_layers(pp, num_micro_batches, stage, chunks) / max(1, layers)
    else:
        act = in_flight * per_mb / virtual_stages
    if recompute == "full":
        act += activation_bytes_per_layer(
            m, micro_batch, tp, "selective", cp, n_moe > 0, load_imbalance, e_tp
        )  # the block being recomputed
    if last:
        act += 4.0 * micro_batch * m.seq_len * m.vocab / (tp * cp)  # fp32 logits of one micro-batch
    return {"model_state": state, "activations": act, "total": state + act}


FSDP_SHARDED_BYTES_PER_PARAM = 16.0  # fp32 parameter + fp32 gradient + Adam m and v
FSDP_GATHERED_LAYERS = 2  # the layer computing and the one prefetched (FSDP2 docs)


def fsdp_state_bytes(
    m: ModelSpec, layers: int, stage_params_tp: float, shard: int, reshard_after_forward: bool
) -> float:
    """Per-GPU model state under FSDP / ZeRO-3 over a shard group of `shard` ranks
    (dp_shard x cp, torchtitan's dp_shard_cp mesh) for a stage of `stage_params_tp`
    parameters per TP rank.

    ZeRO stage 3 (Rajbhandari et al., arXiv 1910.02054, section 5.1, P_os+g+p):
    (2 + 2 + K) Psi / N_d with K = 12; FSDP2 keeps the sharded parameter in fp32 and reduces
    gradients in fp32 (torchtitan's MixedPrecisionPolicy param bf16, reduce fp32), the same
    16 bytes per parameter over the shard group. On top, the unsharded working set
    (PyTorch FSDP2 docs, fully_shard: parameters are all-gathered before each layer's
    forward/backward and freed after; with implicit prefetch the next layer's all-gather is
    in flight): FSDP_GATHERED_LAYERS layers of bf16 parameters and fp32 unsharded
    gradients; with reshard_after_forward off the whole stage stays gathered in bf16 from
    forward to backward."""
    per_layer = stage_params_tp / max(1, layers)
    sharded = stage_params_tp * FSDP_SHARDED_BYTES_PER_PARAM / shard
    working = FSDP_GATHERED_LAYERS * per_layer * (BYTES_BF16 + 4.0)
    if not reshard_after_forward:
        working += stage_params_tp * BYTES_BF16
    return sharded + working


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


@cache
def peak_chunk_layers(pp: int, m: int, rank: int, chunks: tuple[int, ...]) -> int:
    """The most layers' worth of activations pipeline rank `rank` holds at once under
    Megatron-Core's interleaved schedule (placer.perf.critical_path.interleaved_order, m a
    multiple of pp) when its v = len(chunks) chunks hold chunks[c] layers: each forward of
    chunk c adds its chunk's layers, each backward frees them. With equal chunks of n / v
    layers this is in_flight_chunks x n / v (tests/test_chunk_layers.py)."""
    cur = peak = 0
    for kind, _, s in interleaved_order(pp, m, len(chunks), rank):
        cur += chunks[s // pp] if kind == "F" else -chunks[s // pp]
        peak = max(peak, cur)
    return peak


# config_stage_memory_bytes by model (its id, with a weak reference that tells a reused
# id apart; ModelSpec is frozen) and by what stage_memory_bytes reads: the presolve, the
# split candidates and the bounds ask for the same stages of every split of a shape
_MEMORY_MEMO: dict[int, tuple[Any, dict[tuple[Any, ...], dict[str, float]]]] = {}
MEMORY_MEMO_MAX = 200_000  # entries per model before the memo starts again (a long study)


def config_stage_memory_bytes(m: ModelSpec, cfg: Any, stage: int) -> dict[str, float]:
    """stage_memory_bytes for stage `stage` of a configuration (placer.rules.Config), a
    fresh dict each call. It reads the split only through the stage's layers and (through
    the MoE blocks among them) its first block, and the chunks of an uneven interleaving."""
    if getattr(cfg, "dualpipev", False):
        return dualpipev_stage_memory_bytes(m, cfg, stage)
    entry = _MEMORY_MEMO.get(id(m))
    if entry is None or entry[0]() is not m or len(entry[1]) > MEMORY_MEMO_MAX:
        entry = _MEMORY_MEMO[id(m)] = (weakref.ref(m), {})
    chunks = cfg.rank_chunks(stage) if getattr(cfg, "chunk_split", None) else None
    first_layer = sum(cfg.stage_layers[:stage]) if m.moe is not None else 0
    v = getattr(cfg, "virtual_stages", 1)
    if v == 1 and chunks is None:  # the stage's place: first, last, micro-batches in flight
        held = in_flight_chunks(cfg.pp, cfg.num_micro_batches, 1, stage)
        where: tuple[Any, ...] = (stage == 0, stage == cfg.pp - 1, held)
    else:
        where = (stage, cfg.pp)
    key = (
        cfg.stage_layers[stage], where, cfg.tp, cfg.dp, cfg.micro_batch,
        cfg.num_micro_batches, cfg.recompute, cfg.zero1, first_layer, getattr(cfg, "cp", 1),
        getattr(cfg, "ep", 1), getattr(cfg, "expert_load_imbalance", 1.0),
        getattr(cfg, "virtual_stages", 1), getattr(cfg, "dp_shard", 1),
        getattr(cfg, "reshard_after_forward", True), getattr(cfg, "etp", None), chunks,
    )  # fmt: skip
    hit = entry[1].get(key)
    if hit is None:
        hit = entry[1][key] = _config_stage_memory_bytes(m, cfg, stage, chunks)
    return dict(hit)


def _config_stage_memory_bytes(
    m: ModelSpec, cfg: Any, stage: int, chunks: tuple[int, ...] | None
) -> dict[str, float]:
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
        first_layer=sum(cfg.stage_layers[:stage]),
        cp=getattr(cfg, "cp", 1),
        ep=getattr(cfg, "ep", 1),
        load_imbalance=getattr(cfg, "expert_load_imbalance", 1.0),
        virtual_stages=getattr(cfg, "virtual_stages", 1),
        dp_shard=getattr(cfg, "dp_shard", 1),
        reshard_after_forward=getattr(cfg, "reshard_after_forward", True),
        etp=getattr(cfg, "etp", None),
        chunks=chunks,
    )


def dualpipev_stage_memory_bytes(m: ModelSpec, cfg: Any, rank: int) -> dict[str, float]:
    """Per-GPU memory of pipeline rank `rank` under DualPipeV (placer.perf.dualpipe): its
    two model stages, rank and 2 pp - 1 - rank (rank 0 holds the embedding and the LM head).

    Model state: each chunk's as stage_memory_bytes prices it (a model stage of the 2 pp,
    its own first layer for the MoE blocks), summed; under FSDP that counts the gathered
    working set once per chunk (conservative). Activations: the peak over the rank's
    schedule of the chunk micro-batches it holds (dualpipev_peak_layers, each weighing its
    chunk's per-micro-batch activations: 2 pp + 1 chunk micro-batches, the README's PP + 1),
    plus, under full recompute, the block being recomputed, and on rank 0 the fp32 logits
    of one micro-batch."""
    from placer.perf.dualpipe import dualpipev_peak_layers

    p, layers = cfg.pp, cfg.chunk_layers
    cp, etp = getattr(cfg, "cp", 1), getattr(cfg, "etp", None)
    imb = getattr(cfg, "expert_load_imbalance", 1.0)
    state, per_mb, any_moe = 0.0, [], False
    for s in cfg.rank_stages(rank):
        first_layer = sum(layers[:s])
        one = stage_memory_bytes(
            m, layers[s], s, 2 * p, cfg.tp, cfg.dp, cfg.micro_batch, 1, cfg.recompute,
            cfg.zero1, first_layer=first_layer, cp=cp, ep=getattr(cfg, "ep", 1),
            load_imbalance=imb, dp_shard=getattr(cfg, "dp_shard", 1),
            reshard_after_forward=getattr(cfg, "reshard_after_forward", True), etp=etp,
        )  # fmt: skip
        state += one["model_state"]
        n_moe = m.moe_layers_in(first_layer, layers[s])
        any_moe = any_moe or n_moe > 0
        act = (layers[s] - n_moe) * activation_bytes_per_layer(
            m, cfg.micro_batch, cfg.tp, cfg.recompute, cp
        )
        act += n_moe * activation_bytes_per_layer(
            m, cfg.micro_batch, cfg.tp, cfg.recompute, cp, True, imb, etp or 1
        )
        per_mb.append(act)
    act = float(dualpipev_peak_layers(p, cfg.num_micro_batches, rank, (per_mb[0], per_mb[1])))
    if cfg.recompute == "full":
        act += activation_bytes_per_layer(
            m, cfg.micro_batch, cfg.tp, "selective", cp, any_moe, imb, etp or 1
        )  # the block being recomputed
    if rank == 0:
        act += 4.0 * cfg.micro_batch * m.seq_len * m.vocab / (cfg.tp * cp)  # fp32 logits
    return {"model_state": state, "activations": act, "total": state + act}
