"""Operator-level time of one micro-batch on one pipeline stage, and the optimizer step.

A layer is timed operator by operator (reference/performance-model.md, "Memory-bound
operators"; Calculon, Isaev et al. SC'23, does the same):

* each weight GEMM (QKV with grouped-query K/V, attention projection, FFN in (x2 when
  gated) and out, the LM head on the last stage) at `2 M N K / (peak x e)`, where the
  efficiency e = e_max d / (d + d_half) falls with d = min(M, N, K), the smallest matrix
  dimension a tensor-parallel rank sees (small GEMMs reuse each loaded tile less and
  fill the GPU's waves worse);
* the attention core (Q K^T, softmax, attention x V: flash attention on Hopper and
  later, fused softmax kernels on the SC21 A100 runs) as its own operator with its own
  efficiency on Megatron's full count of 4 s h FLOPs per token;
* memory-bound operators (layer norms, bias-dropout-add with the residual, the
  activation function, rotary embeddings, the vocabulary-parallel cross entropy) at HBM
  bandwidth, by the bytes they read and write (counted below);
* tensor-parallel communication on NVLink: 2 all-reduces forward and 2 backward per layer
  (2 more under full recompute). Sequence parallelism turns each into a reduce-scatter +
  all-gather of the same bytes and, because the gathered input of each column-parallel
  GEMM is not kept, repeats 2 all-gathers (one all-reduce's worth) in the backward pass
  unless full recompute already replays them. A catalog fraction of it hides under
  compute when the job overlaps TP communication (Transformer Engine userbuffers).

Mixture-of-experts layers (expert parallelism `ep`, expert tensor parallelism 1 as the
DeepSeek-V3 / Qwen3 Megatron recipes run): the router and the routed experts see the
rank's sequence-parallel share of the tokens (b s / (cp t)); each routed token-expert pair
lands on one EP rank, E/ep experts per rank, and the busiest rank gets `load_imbalance` x
the mean (a grouped GEMM per local expert); shared experts run tensor-parallel like the
dense FFN. Token dispatch and combine are an all-to-all each, forward and backward (and in
the recomputed forward under full recompute), not overlapped (Megatron's default; its
--overlap-moe-expert-parallel-comm is not modelled). Context parallelism `cp` splits each
sequence over cp ranks: every operator sees b s / cp tokens while the attention core keeps
the full key length, and ring attention passes KV chunks around the cp ring (cp - 1 steps
forward, KV and its gradient backward), hidden under the attention core of the same layer
as Transformer Engine pipelines it; only the excess is exposed.

Backward GEMMs and memory-bound operators cost twice their forward (the input and the
weight gradient; read the output gradient and the saved input, write the input
gradient); recompute adds a forward of what it recomputes (everything under full, the
attention core under selective, as placer.perf.flops counts).

Every function takes plain numbers (or the model spec) and returns seconds, so a test can
check it by hand arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from placer.perf.flops import attention_core_flops_per_token, q_dim, v_dim
from placer.schema import GpuSpec, ModelSpec

BYTES_BF16 = 2
BYTES_MASK = 1  # a dropout mask is one byte per element (PyTorch bool)

# Mixed-precision Adam over the local shard, bytes moved per parameter (reference
# "Optimizer step": ~16-32 bytes): read the bf16 gradient (2), read and write the fp32
# master weight, first and second moments (3 x (4 + 4) = 24), read the gradient again
# for the global-norm clip (2), write the bf16 weight (2).
OPTIMIZER_BYTES_PER_PARAM = 2 + 24 + 2 + 2


@dataclass(frozen=True)
class Gemm:
    """A forward GEMM of one tensor-parallel rank: (M x K) @ (K x N)."""

    name: str
    m: int
    n: int
    k: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


@dataclass(frozen=True)
class StageOps:
    """One micro-batch on one stage, one tensor-parallel rank, seconds."""

    gemm_fwd: float
    gemm_bwd: float
    attn_fwd: float
    attn_bwd: float
    mem_fwd: float
    mem_bwd: float
    tp_fwd: float  # exposed (not overlapped) tensor-parallel communication
    tp_bwd: float
    tp_hidden: float  # tensor-parallel communication hidden under compute (fwd + bwd)
    ep_fwd: float = 0.0  # expert-parallel all-to-all (dispatch + combine), exposed
    ep_bwd: float = 0.0
    cp_fwd: float = 0.0  # ring attention's KV exchange not hidden under the attention core
    cp_bwd: float = 0.0
    cp_hidden: float = 0.0
    fsdp_fwd: float = 0.0  # FSDP parameter all-gathers not hidden under the layers' compute
    fsdp_bwd: float = 0.0  # all-gathers (reshard_after_forward) + reduce-scatters, exposed
    fsdp_hidden: float = 0.0

    @property
    def fwd(self) -> float:
        return (
            self.gemm_fwd
            + self.attn_fwd
            + self.mem_fwd
            + self.tp_fwd
            + self.ep_fwd
            + self.cp_fwd
            + self.fsdp_fwd
        )

    @property
    def bwd(self) -> float:
        return (
            self.gemm_bwd
            + self.attn_bwd
            + self.mem_bwd
            + self.tp_bwd
            + self.ep_bwd
            + self.cp_bwd
            + self.fsdp_bwd
        )

    @property
    def fsdp_exposed(self) -> float:
        return self.fsdp_fwd + self.fsdp_bwd

    @property
    def ep_exposed(self) -> float:
        return self.ep_fwd + self.ep_bwd

    @property
    def cp_exposed(self) -> float:
        return self.cp_fwd + self.cp_bwd

    @property
    def matmul(self) -> float:
        """GEMMs and the attention core, forward and backward."""
        return self.gemm_fwd + self.gemm_bwd + self.attn_fwd + self.attn_bwd

    @property
    def memory_bound(self) -> float:
        return self.mem_fwd + self.mem_bwd

    @property
    def tp_exposed(self) -> float:
        return self.tp_fwd + self.tp_bwd


# ----------------------------------------------------------------------------- GEMMs


def attention_gemms(m: ModelSpec, tokens: int, tp: int) -> list[Gemm]:
    """The attention weight GEMMs of one block on one tensor-parallel rank (Megatron's
    column-parallel QKV, row-parallel projection). MLA: the query and joint-KV down
    projections are replicated over tp (Megatron-Core does not split them), the up
    projections column-parallel."""
    h = m.hidden
    if m.mla is None:
        return [
            Gemm("qkv", tokens, (q_dim(m) + 2 * m.kv * m.hd) // tp, h),
            Gemm("attn_proj", tokens, h, v_dim(m) // tp),
        ]
    a = m.mla
    out = []
    if a.q_lora_rank is None:
        out.append(Gemm("q", tokens, q_dim(m) // tp, h))
    else:
        out += [
            Gemm("q_down", tokens, a.q_lora_rank, h),
            Gemm("q_up", tokens, q_dim(m) // tp, a.q_lora_rank),
        ]
    out += [
        Gemm("kv_down", tokens, a.kv_lora_rank + a.qk_rope_head_dim, h),
        Gemm("kv_up", tokens, m.heads * (a.qk_nope_head_dim + a.v_head_dim) // tp, a.kv_lora_rank),
        Gemm("attn_proj", tokens, h, v_dim(m) // tp),
    ]
    return out


def ffn_gemms(m: ModelSpec, tokens: int, tp: int, width: int) -> list[Gemm]:
    """A (gated) FFN of `width`, column-parallel in, row-parallel out."""
    ffn_in = (2 if m.gated_ffn else 1) * width
    return [
        Gemm("ffn_in", tokens, ffn_in // tp, m.hidden),
        Gemm("ffn_out", tokens, m.hidden, width // tp),
    ]


def layer_gemms(m: ModelSpec, tokens: int, tp: int) -> list[Gemm]:
    """The weight GEMMs of one dense block on one tensor-parallel rank."""
    return attention_gemms(m, tokens, tp) + ffn_gemms(m, tokens, tp, m.ffn)


def moe_tokens_per_rank(tokens: int, tp: int) -> float:
    """Tokens one rank routes in an MoE layer: its sequence-parallel share (Megatron
    requires sequence parallelism for MoE with TP > 1; expert TP is 1)."""
    return tokens / tp


def moe_ffn_s(
    gpu: GpuSpec, m: ModelSpec, tokens: int, tp: int, ep: int, load_imbalance: float, precision: str
) -> float:
    """Forward time of an MoE layer's FFN on one rank: router, routed experts (E/ep local
    experts, the busiest rank's load), shared experts (tensor-parallel)."""
    e = m.moe
    assert e is not None
    n_tok = moe_tokens_per_rank(tokens, tp)
    t = gemm_s(gpu, Gemm("router", max(1, round(n_tok)), e.experts, m.hidden), precision)
    local = max(1, e.experts // ep)
    pairs = n_tok * e.top_k * load_imbalance
    per_expert = max(1, math.ceil(pairs / local))
    for g in ffn_gemms(m, per_expert, 1, e.expert_ffn_hidden):
        t += local * gemm_s(gpu, g, precision)
    if e.shared_ffn:
        t += sum(gemm_s(gpu, g, precision) for g in ffn_gemms(m, tokens, tp, e.shared_ffn))
    return t


def moe_dispatch_bytes(m: ModelSpec, tokens: int, tp: int, load_imbalance: float) -> float:
    """Bytes one rank sends in one all-to-all (dispatch or combine): top_k copies of each
    of its tokens' h bf16 values; the busiest rank receives load_imbalance x the mean."""
    assert m.moe is not None
    return moe_tokens_per_rank(tokens, tp) * m.moe.top_k * m.hidden * BYTES_BF16 * load_imbalance


def lm_head_gemm(m: ModelSpec, tokens: int, tp: int) -> Gemm:
    """Logits of the last stage (vocabulary-parallel)."""
    return Gemm("lm_head", tokens, m.vocab // tp, m.hidden)


def gemm_efficiency(gpu: GpuSpec, g: Gemm) -> float:
    """e_max d / (d + d_half), d the smallest matrix dimension (catalog, fitted)."""
    d = min(g.m, g.n, g.k)
    return gpu.matmul_efficiency * d / (d + gpu.matmul_half_dim)


def gemm_s(gpu: GpuSpec, g: Gemm, precision: str) -> float:
    """Forward time of one GEMM; FP8 speeds GEMMs up by the catalog's measured factor."""
    speedup = gpu.fp8_gemm_speedup if precision == "fp8" else 1.0
    return g.flops / (gpu.peak_tflops_bf16 * 1e12 * gemm_efficiency(gpu, g) * speedup)


def attention_core_s(gpu: GpuSpec, m: ModelSpec, tokens: int, tp: int) -> float:
    """Forward time of Q K^T, softmax and attention x V of one block on one rank (heads
    split over tp), counted as Megatron does: 4 s h FLOPs per token (2 s (q_dim + v_dim)),
    against the full key length s (with context parallelism `tokens` is the rank's s/cp)."""
    flops = tokens * attention_core_flops_per_token(m, m.seq_len) / tp
    return flops / (gpu.peak_tflops_bf16 * 1e12 * gpu.attention_efficiency)


# ----------------------------------------------------------------------------- memory-bound


def layer_memory_bytes(
    m: ModelSpec,
    tokens: int,
    tp: int,
    sequence_parallel: bool,
    rotary: bool,
    moe: bool = False,
    load_imbalance: float = 1.0,
) -> float:
    """Forward bytes the memory-bound operators of one block read and write on one rank.

    Per token, bf16: two layer norms (read h, write h: 4h bytes each), two fused
    bias-dropout-adds (read the branch and the residual, write the sum and a one-byte mask:
    7h each), the activation (GELU reads and writes the ffn-wide tensor: 4 ffn; SwiGLU
    reads two and writes one: 6 ffn), rotary (read and write q and k: 4 (h + kv_dim)).
    Norms and dropouts run on s/t tokens under sequence parallelism, on all s otherwise;
    the activation and rotary act on the rank's head / ffn slice. An MoE layer's
    activation runs on top_k x load_imbalance expert widths per token plus the shared
    experts', and the dispatcher permutes and un-permutes top_k copies of each token
    (read + write h each way)."""
    h, kv_dim = m.hidden, m.kv * m.hd
    per_seq_token = 2 * 2 * h * BYTES_BF16 + 2 * (3 * h * BYTES_BF16 + h * BYTES_MASK)
    width = m.ffn
    permute = 0.0
    if moe and m.moe is not None:
        width = m.moe.top_k * load_imbalance * m.moe.expert_ffn_hidden + m.moe.shared_ffn
        permute = 2 * 2 * m.moe.top_k * load_imbalance * h * BYTES_BF16
    act = (3 if m.gated_ffn else 2) * width * BYTES_BF16 + permute
    rot = 2 * (q_dim(m) + kv_dim) * BYTES_BF16 if rotary else 0  # read + write
    return tokens * (per_seq_token / (tp if sequence_parallel else 1) + (act + rot) / tp)


def loss_memory_bytes(m: ModelSpec, tokens: int, tp: int) -> float:
    """Forward bytes of the vocabulary-parallel cross entropy: the fp32 logits are written,
    then read twice (max, then exp-sum): 12 bytes per logit of the rank's slice."""
    return tokens * m.vocab / tp * 12


def hbm_s(gpu: GpuSpec, nbytes: float) -> float:
    return nbytes / (gpu.hbm_tbytes_per_s * 1e12 * gpu.hbm_efficiency)


# ----------------------------------------------------------------------------- stage


def stage_ops(
    gpu: GpuSpec,
    m: ModelSpec,
    layers: int,
    last: bool,
    micro_batch: int,
    tp: int,
    recompute: str,
    precision: str,
    sequence_parallel: bool,
    tp_allreduce_s: float,
    tp_overlap: float,
    *,
    first_layer: int = 0,
    cp: int = 1,
    ep: int = 1,
    a2a_s: float = 0.0,
    cp_ring_s: float = 0.0,
    load_imbalance: float = 1.0,
) -> StageOps:
    """Operator times of one micro-batch on a stage of `layers` blocks starting at block
    `first_layer`; `tp_allreduce_s` is one all-reduce of the rank's b s h / cp activations
    over the tp group, `tp_overlap` the fraction of TP communication hidden under compute
    (0 when the job does not overlap it), `a2a_s` one expert-parallel all-to-all of an MoE
    layer, `cp_ring_s` one forward pass of ring attention's KV around the cp ring."""
    tokens = micro_batch * m.seq_len // cp
    n_moe = m.moe_layers_in(first_layer, layers)
    n_dense = layers - n_moe
    attn_gemm = sum(gemm_s(gpu, g, precision) for g in attention_gemms(m, tokens, tp))
    dense_ffn = sum(gemm_s(gpu, g, precision) for g in ffn_gemms(m, tokens, tp, m.ffn))
    moe_ffn = moe_ffn_s(gpu, m, tokens, tp, ep, load_imbalance, precision) if n_moe else 0.0
    gemm_blocks = layers * attn_gemm + n_dense * dense_ffn + n_moe * moe_ffn
    attn_layer = attention_core_s(gpu, m, tokens, tp)
    mem_dense = hbm_s(gpu, layer_memory_bytes(m, tokens, tp, sequence_parallel, m.rotary))
    mem_moe = (
        hbm_s(
            gpu,
            layer_memory_bytes(m, tokens, tp, sequence_parallel, m.rotary, True, load_imbalance),
        )
        if n_moe
        else 0.0
    )
    mem_blocks = n_dense * mem_dense + n_moe * mem_moe
    head = gemm_s(gpu, lm_head_gemm(m, tokens, tp), precision) if last else 0.0
    loss = hbm_s(gpu, loss_memory_bytes(m, tokens, tp)) if last else 0.0

    gemm_fwd = gemm_blocks + head
    attn_fwd = layers * attn_layer
    mem_fwd = mem_blocks + loss
    gemm_bwd, attn_bwd, mem_bwd = 2 * gemm_fwd, 2 * attn_fwd, 2 * mem_fwd
    n_fwd_ar, n_bwd_ar = 2.0, 2.0
    n_bwd_a2a = 2.0
    cp_bwd_raw = layers * max(0.0, 2 * cp_ring_s - 2 * attn_layer)  # KV + dKV under 2x core
    if recompute == "full":  # one more forward of every block (not the LM head)
        gemm_bwd += gemm_blocks
        attn_bwd += attn_fwd
        mem_bwd += mem_blocks
        n_bwd_ar += 2
        n_bwd_a2a += 2
        cp_bwd_raw += layers * max(0.0, cp_ring_s - attn_layer)
    elif recompute == "selective":  # the attention core only (Korthikanti et al.)
        attn_bwd += attn_fwd
    if sequence_parallel and tp > 1 and recompute != "full":
        n_bwd_ar += 1  # 2 all-gathers of the column-parallel inputs repeated in backward
    tp_f, tp_b = layers * n_fwd_ar * tp_allreduce_s, layers * n_bwd_ar * tp_allreduce_s
    keep = 1.0 - tp_overlap
    cp_fwd = layers * max(0.0, cp_ring_s - attn_layer)
    cp_total = layers * cp_ring_s * (3 + (1 if recompute == "full" else 0))
    return StageOps(
        gemm_fwd,
        gemm_bwd,
        attn_fwd,
        attn_bwd,
        mem_fwd,
        mem_bwd,
        keep * tp_f,
        keep * tp_b,
        tp_overlap * (tp_f + tp_b),
        ep_fwd=n_moe * 2 * a2a_s,
        ep_bwd=n_moe * n_bwd_a2a * a2a_s,
        cp_fwd=cp_fwd,
        cp_bwd=cp_bwd_raw,
        cp_hidden=cp_total - cp_fwd - cp_bwd_raw,
    )


# ----------------------------------------------------------------------------- optimizer


def optimizer_step_s(gpu: GpuSpec, local_params: float) -> float:
    """Adam over the parameters this GPU updates (its ZeRO-1 shard, or its whole stage
    slice without ZeRO-1): memory-bound at HBM bandwidth."""
    return hbm_s(gpu, local_params * OPTIMIZER_BYTES_PER_PARAM)


# ----------------------------------------------------------------------------- DP overlap


def dp_exposed_s(sync_s: float, pieces: tuple[tuple[float, float], ...]) -> float:
    """Exposed part of a data-parallel sync of `sync_s` seconds split in pieces
    (fraction of the sync, window it hides under): sum of max(0, f sync - window).
    Convex piecewise-linear in the sync, so formulations add one pair of rows per piece."""
    return sum(max(0.0, f * sync_s - w) for f, w in pieces)
