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

Backward GEMMs and memory-bound operators cost twice their forward (the input and the
weight gradient; read the output gradient and the saved input, write the input
gradient); recompute adds a forward of what it recomputes (everything under full, the
attention core under selective, as placer.perf.flops counts).

Every function takes plain numbers (or the model spec) and returns seconds, so a test can
check it by hand arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def fwd(self) -> float:
        return self.gemm_fwd + self.attn_fwd + self.mem_fwd + self.tp_fwd

    @property
    def bwd(self) -> float:
        return self.gemm_bwd + self.attn_bwd + self.mem_bwd + self.tp_bwd

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


def layer_gemms(m: ModelSpec, tokens: int, tp: int) -> list[Gemm]:
    """The four weight GEMMs of one block on one tensor-parallel rank (Megatron's column-
    parallel QKV and FFN-in, row-parallel projection and FFN-out)."""
    h, kv_dim = m.hidden, m.kv * (m.hidden // m.heads)
    ffn_in = (2 if m.gated_ffn else 1) * m.ffn
    return [
        Gemm("qkv", tokens, (h + 2 * kv_dim) // tp, h),
        Gemm("attn_proj", tokens, h, h // tp),
        Gemm("ffn_in", tokens, ffn_in // tp, h),
        Gemm("ffn_out", tokens, h, m.ffn // tp),
    ]


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
    split over tp), counted as Megatron does: 4 s h FLOPs per token."""
    flops = 4.0 * tokens * m.seq_len * m.hidden / tp
    return flops / (gpu.peak_tflops_bf16 * 1e12 * gpu.attention_efficiency)


# ----------------------------------------------------------------------------- memory-bound


def layer_memory_bytes(
    m: ModelSpec, tokens: int, tp: int, sequence_parallel: bool, rotary: bool
) -> float:
    """Forward bytes the memory-bound operators of one block read and write on one rank.

    Per token, bf16: two layer norms (read h, write h: 4h bytes each), two fused
    bias-dropout-adds (read the branch and the residual, write the sum and a one-byte mask:
    7h each), the activation (GELU reads and writes the ffn-wide tensor: 4 ffn; SwiGLU
    reads two and writes one: 6 ffn), rotary (read and write q and k: 4 (h + kv_dim)).
    Norms and dropouts run on s/t tokens under sequence parallelism, on all s otherwise;
    the activation and rotary act on the rank's head / ffn slice."""
    h, kv_dim = m.hidden, m.kv * (m.hidden // m.heads)
    per_seq_token = 2 * 2 * h * BYTES_BF16 + 2 * (3 * h * BYTES_BF16 + h * BYTES_MASK)
    act = (3 if m.gated_ffn else 2) * m.ffn * BYTES_BF16
    rot = 2 * (h + kv_dim) * BYTES_BF16 if rotary else 0  # read + write
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
) -> StageOps:
    """Operator times of one micro-batch on a stage of `layers` blocks; `tp_allreduce_s`
    is one all-reduce of the b s h activations over the tp group, `tp_overlap` the fraction
    of TP communication hidden under compute (0 when the job does not overlap it)."""
    tokens = micro_batch * m.seq_len
    gemm_layer = sum(gemm_s(gpu, g, precision) for g in layer_gemms(m, tokens, tp))
    attn_layer = attention_core_s(gpu, m, tokens, tp)
    mem_layer = hbm_s(gpu, layer_memory_bytes(m, tokens, tp, sequence_parallel, m.rotary))
    head = gemm_s(gpu, lm_head_gemm(m, tokens, tp), precision) if last else 0.0
    loss = hbm_s(gpu, loss_memory_bytes(m, tokens, tp)) if last else 0.0

    gemm_fwd = layers * gemm_layer + head
    attn_fwd = layers * attn_layer
    mem_fwd = layers * mem_layer + loss
    gemm_bwd, attn_bwd, mem_bwd = 2 * gemm_fwd, 2 * attn_fwd, 2 * mem_fwd
    n_fwd_ar, n_bwd_ar = 2.0, 2.0
    if recompute == "full":  # one more forward of every block (not the LM head)
        gemm_bwd += layers * gemm_layer
        attn_bwd += attn_fwd
        mem_bwd += layers * mem_layer
        n_bwd_ar += 2
    elif recompute == "selective":  # the attention core only (Korthikanti et al.)
        attn_bwd += attn_fwd
    if sequence_parallel and tp > 1 and recompute != "full":
        n_bwd_ar += 1  # 2 all-gathers of the column-parallel inputs repeated in backward
    tp_f, tp_b = layers * n_fwd_ar * tp_allreduce_s, layers * n_bwd_ar * tp_allreduce_s
    keep = 1.0 - tp_overlap
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
