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

Mixture-of-experts layers (expert parallelism `ep`, expert tensor parallelism `etp`, 1
as the DeepSeek-V3 / Qwen3 Megatron recipes run): the router sees the rank's
sequence-parallel share of the tokens (b s / (cp t)); each routed token-expert pair lands
on one EP rank (a group of etp GPUs that gathers the pairs its members received and splits
each expert's FFN etp ways), E/ep experts per rank, and the busiest rank gets
`load_imbalance` x the mean (a grouped GEMM per local expert); shared experts run
tensor-parallel like the dense FFN. Token dispatch and combine are an all-to-all each,
forward and backward (and in the recomputed forward under full recompute), exposed by default
(Megatron-Core's default). Under job.overlap.ep_comm (--overlap-moe-expert-parallel-comm,
Megatron-Core's combined 1F1B: the forward of one micro-batch runs with the backward of another,
layer by layer) the forward all-to-alls of an MoE layer hide under the backward compute of that
layer of the other micro-batch and the backward all-to-alls under its forward compute; only the
excess is exposed (ep_exposed_s). Context parallelism `cp` splits each
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
# FP8 token dispatch (DeepSeek-V3, arXiv 2412.19437 sections 3.3.1-3.3.3): e4m3 values with
# one fp32 scale per 1 x 128 tile of the activation
FP8_SCALE_TILE = 128
BYTES_FP32 = 4

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
    ep_hidden: float = 0.0  # expert-parallel all-to-all hidden under compute (job.overlap.ep_comm)
    cp_fwd: float = 0.0  # ring attention's KV exchange not hidden under the attention core
    cp_bwd: float = 0.0
    cp_hidden: float = 0.0
    fsdp_fwd: float = 0.0  # FSDP parameter all-gathers not hidden under the layers' compute
    fsdp_bwd: float = 0.0  # all-gathers (reshard_after_forward) + reduce-scatters, exposed
    fsdp_hidden: float = 0.0
    host_fwd: float = 0.0  # eager MoE layers: the GPU idle while the host launches (moe_host_s)
    host_bwd: float = 0.0

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
            + self.host_fwd
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
            + self.host_bwd
        )

    @property
    def host_exposed(self) -> float:
        return self.host_fwd + self.host_bwd

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
    gpu: GpuSpec,
    m: ModelSpec,
    tokens: int,
    tp: int,
    ep: int,
    load_imbalance: float,
    precision: str,
    etp: int = 1,
) -> float:
    """Forward time of an MoE layer's FFN on one rank: router, routed experts (E/ep local
    experts, the busiest rank's load; with expert TP etp the rank's GPU computes the pairs
    of all etp GPUs of its EP rank on 1/etp of each expert's FFN: etp x the pairs, GEMMs
    of N = ffn / etp, the same FLOPs), shared experts (tensor-parallel)."""
    e = m.moe
    assert e is not None
    n_tok = moe_tokens_per_rank(tokens, tp)
    t = gemm_s(gpu, Gemm("router", max(1, round(n_tok)), e.experts, m.hidden), precision)
    for term in _routed_expert_terms(gpu, m, n_tok, ep, load_imbalance, precision, etp):
        t += term
    if e.shared_ffn:
        t += sum(gemm_s(gpu, g, precision) for g in ffn_gemms(m, tokens, tp, e.shared_ffn))
    return t


def routed_experts_s(
    gpu: GpuSpec,
    m: ModelSpec,
    tokens: int,
    tp: int,
    ep: int,
    load_imbalance: float,
    precision: str,
    etp: int = 1,
) -> float:
    """Forward GEMM time of an MoE layer's routed experts on one rank: moe_ffn_s without
    the router and the shared experts, E/ep local experts at the busiest rank's load, with
    expert TP etp the pairs of all etp GPUs of the EP rank on 1/etp of each expert's FFN."""
    t = 0.0
    for term in _routed_expert_terms(
        gpu, m, moe_tokens_per_rank(tokens, tp), ep, load_imbalance, precision, etp
    ):
        t += term
    return t


def _routed_expert_terms(
    gpu: GpuSpec,
    m: ModelSpec,
    n_tok: float,
    ep: int,
    load_imbalance: float,
    precision: str,
    etp: int,
) -> list[float]:
    """The routed experts' GEMM seconds, one term per FFN GEMM (summed in this order by
    moe_ffn_s and routed_experts_s, so both keep the same floating-point sums)."""
    e = m.moe
    assert e is not None
    local = max(1, e.experts // ep)
    pairs = n_tok * e.top_k * load_imbalance * etp
    per_expert = max(1, math.ceil(pairs / local))
    return [
        local * gemm_s(gpu, g, precision)
        for g in ffn_gemms(m, per_expert, etp, e.expert_ffn_hidden)
    ]


def moe_dispatch_bytes(
    m: ModelSpec, tokens: int, tp: int, load_imbalance: float, value_bytes: float = BYTES_BF16
) -> float:
    """Bytes one rank sends in one all-to-all (dispatch or combine): top_k copies of each
    of its tokens' h values (bf16, or token_value_bytes for FP8); the busiest rank
    receives load_imbalance x the mean."""
    assert m.moe is not None
    return moe_tokens_per_rank(tokens, tp) * m.moe.top_k * m.hidden * value_bytes * load_imbalance


def token_value_bytes(precision: str) -> float:
    """Bytes per hidden value of a dispatched token: bf16, or FP8 plus its fp32 tile scale
    (1 + 4/128)."""
    return 1 + BYTES_FP32 / FP8_SCALE_TILE if precision == "fp8" else BYTES_BF16


def expected_token_nodes(experts: int, top_k: int, nodes: int, max_nodes: int | None) -> float:
    """Expected number of distinct nodes hosting a token's top_k experts, the experts spread
    evenly over the EP group's `nodes` nodes (E/N each) and node-limited routing allowing
    M = min(max_nodes, N) of them: the top_k experts are taken uniformly among the E M / N
    experts of the allowed nodes (balanced routing, the goal of the balancing loss or bias):

        D = M (1 - C(E M/N - E/N, k) / C(E M/N, k))

    (each allowed node is empty with the probability that all k picks miss its E/N experts).
    An assumption: real routers' scores are not uniform; DeepSeek-V3's node-limited
    routing chooses the M nodes by their best experts' scores (arXiv 2412.19437 2.1.2)."""
    if nodes <= 1:
        return 1.0
    allowed = nodes if max_nodes is None else min(max_nodes, nodes)
    per_node = experts // nodes
    pool = per_node * allowed
    k = min(top_k, pool)
    return allowed * (1.0 - math.comb(pool - per_node, k) / math.comb(pool, k))


def moe_node_dispatch_bytes(
    m: ModelSpec,
    tokens: int,
    tp: int,
    load_imbalance: float,
    ep: int,
    gpus_per_node: int,
    value_bytes: float = BYTES_BF16,
    etp: int = 1,
) -> tuple[float, float]:
    """(NVLink bytes, NIC bytes) one rank sends in one dispatch (or combine) with per-node
    deduplication (DeepEP, arXiv 2412.19437 section 3.2.2): a token crosses the NICs once
    per remote node that hosts one of its experts, to the GPU of the same local index, which
    forwards the copies over NVLink to the GPUs holding the experts. With q = min(ep,
    node / etp) EP ranks per node (they sit at stride etp) and N = ep / q nodes, per token
    of the rank:

        NIC    = D (N - 1) / N x h x value bytes   (D = expected_token_nodes; a remote
                 destination node with probability (N - 1)/N)
        NVLink = top_k (q - 1) / q x h x value bytes (a copy lands on the expert's GPU
                 directly with probability 1/q)

    both times load_imbalance (the busiest rank). Combine is the reverse (reduce on the
    node, one copy back per node), the same bytes."""
    e = m.moe
    assert e is not None
    q = max(1, min(ep, gpus_per_node // etp))
    nodes = max(1, ep // q)
    per_token = m.hidden * value_bytes * load_imbalance * moe_tokens_per_rank(tokens, tp)
    nvlink = e.top_k * (q - 1) / q * per_token
    d = expected_token_nodes(e.experts, e.top_k, nodes, e.max_nodes_per_token)
    nic = d * (nodes - 1) / nodes * per_token
    return nvlink, nic


def ep_exposed_s(
    comm_fwd_s: float,
    comm_bwd_s: float,
    compute_fwd_s: float,
    compute_bwd_s: float,
    overlap: bool,
    sm_fraction: float = 0.0,
) -> tuple[float, float]:
    """Exposed (forward, backward) all-to-all seconds of one MoE layer. Without overlap all
    of it. With Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm) the
    forward's dispatch + combine of one micro-batch run under the backward compute of that
    layer for another micro-batch, and the backward's under the forward compute:

        forward  max(0, comm_fwd - compute_bwd),  backward  max(0, comm_bwd - compute_fwd)

    When the communication kernels occupy a fraction f of the SMs while they run
    (`sm_fraction`, the GPU's deepep_sm_fraction under the deepep dispatcher: DeepEP's
    kernels are SM-driven, DeepSeek-V3 report section 3.2.2), the compute under them runs
    at 1 - f: a comm of C seconds beside P seconds of compute ends at max(C, P + f C)
    (compute does C (1 - f) of its work while the comm runs, the rest at full speed after
    it), so the exposed share is max(C - P, f C): f C while the compute outlasts the comm,
    C - P once the comm is longer (the two meet at C = P / (1 - f)).

    Every micro-batch is priced as if paired; the 1F1B warm-up forwards and cool-down
    backwards that Megatron runs alone are not distinguished (an approximation that
    overstates the hidden share by at most (pp - 1) / m of the micro-batches)."""
    if not overlap:
        return comm_fwd_s, comm_bwd_s
    f = sm_fraction
    return (
        max(0.0, comm_fwd_s - compute_bwd_s, f * comm_fwd_s),
        max(0.0, comm_bwd_s - compute_fwd_s, f * comm_bwd_s),
    )


def moe_host_s(gpu: GpuSpec, m: ModelSpec, cuda_graphs: bool) -> float:
    """Host time exposed per MoE layer forward when the layer runs eagerly: the catalog's
    moe_layer_host_s, 0 for a dense model or under job.moe_cuda_graphs.

    Why it is exposed: Megatron-Core's dropless dispatchers need the tokens-per-expert
    counts on the host every MoE layer (token_dispatcher.py: the alltoall dispatcher's
    `cuda_sync_point` "before_ep_alltoall" with EP > 1, "before_finish" without, for the
    all-to-all split sizes and the grouped GEMM's m_splits; the flex dispatcher likewise
    for its receive buffer), so the host waits for the GPU to drain; the router,
    permutation, grouped-GEMM and unpermutation kernels after the sync then run only as
    fast as the host launches them, and the GPU idles for their host time. CUDA graphs of
    the router and dispatcher preprocessing (Megatron-Core --cuda-graph-scope moe_router
    moe_preprocess, which the Megatron-Core MoE report, arXiv 2603.07685, introduces for
    this "host-boundedness" of the compute wall) remove it. A constant per layer forward:
    the host time of the layer's launches does not depend on the tokens."""
    if m.moe is None or cuda_graphs:
        return 0.0
    return gpu.moe_layer_host_s


def moe_host_exposed_s(host_s: float, partner_s: float, ep_overlap: bool) -> float:
    """Host time exposed per MoE layer forward: all of `host_s` (moe_host_s) when the layer
    runs alone, max(0, host_s - partner_s) under Megatron-Core's combined 1F1B
    (`ep_overlap`, Config.ep_overlap), `partner_s` the other micro-batch's routed-expert
    backward already queued on the compute stream when the host blocks.

    Read in Megatron-Core 0.16.1: in eager mode the alltoall dispatcher issues the
    tokens-per-expert D2H copies at `cuda_dtoh_point` "before_permutation_1", in
    dispatch_preprocess, as non-blocking copies on a side stream (`cuda_dtoh_stream`) that
    first waits on the compute stream, and records `d2h_event`; the host blocks at
    `cuda_sync_point` ("before_ep_alltoall" with EP > 1) in token_dispatch with
    `self.d2h_event.synchronize()`: an event sync, neither device-wide nor on the compute
    stream (moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher.__init__, preprocess,
    dispatch_preprocess, token_dispatch, _maybe_dtoh_and_synchronize; moe_utils.py
    maybe_move_tensor_to_cpu, non_blocking=True). Run alone, only permutation 1 lies
    between the two, so the GPU's queue is empty when the host resumes (moe_host_s). Under
    --overlap-moe-expert-parallel-comm, TransformerLayerSchedulePlan.run
    (models/common/model_chunk_schedule_plan.py) launches, for forward layer i of one
    micro-batch and backward layer L-1-i of another: b combine backward (comm stream),
    f attn (attention, pre-MLP norm, router, dispatch preprocess: the D2H, compute stream;
    models/gpt/fine_grained_callables.py submodule_attn_forward), **b mlp backward**
    (compute stream: permutation 2, the routed experts, combine preprocess;
    submodule_moe_forward -> MoELayer.routed_experts_compute), then f moe_dispatch
    (token_dispatch: the sync), b mlp backward_dw, b dispatch backward, f mlp, f combine,
    b attn backward. So the partner's expert backward is queued behind the point the D2H
    waits for, and the GPU runs it while the host is blocked and then launches. The flex
    (deepep) dispatcher gets its counts in the same node (token_dispatch ->
    _DeepepManager.dispatch -> DeepEP's fused_dispatch, which returns them to the host),
    so the order is the same; how DeepEP's host wait itself is implemented was not read.

    `partner_s` is priced as the routed experts' data-gradient GEMMs only (= their forward
    GEMMs, routed_experts_s): the weight gradients are in that node's backward too unless
    delay_wgrad_compute moves them to backward_dw, which is launched after the sync
    (Megatron-Bridge's moe_a2a_overlap presets set it; placer's launch files do not), so
    without it the queued work is larger and the term overstates the exposed host time;
    the memory-bound kernels of the node are not counted either. The paired backward layer
    is priced as an MoE layer of the same stage (a dense partner layer, DeepSeek-V3's
    first three, is not distinguished), and every micro-batch as paired, as ep_exposed_s
    does."""
    if not ep_overlap:
        return host_s
    return max(0.0, host_s - partner_s)


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
    etp: int = 1,
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
    (read + write h each way). With expert TP each GPU holds the gathered copies of its
    etp GPUs: etp x the permuted bytes, 1/etp of each copy's expert width."""
    h, kv_dim = m.hidden, m.kv * m.hd
    per_seq_token = 2 * 2 * h * BYTES_BF16 + 2 * (3 * h * BYTES_BF16 + h * BYTES_MASK)
    width = m.ffn
    permute = 0.0
    if moe and m.moe is not None:
        width = m.moe.top_k * load_imbalance * m.moe.expert_ffn_hidden + m.moe.shared_ffn
        permute = 2 * 2 * m.moe.top_k * load_imbalance * h * BYTES_BF16 * etp
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
    a2a_dispatch_s: float | None = None,
    ep_overlap: bool = False,
    etp: int = 1,
    moe_host_s: float = 0.0,
    ep_sm_fraction: float = 0.0,
) -> StageOps:
    """Operator times of one micro-batch on a stage of `layers` blocks starting at block
    `first_layer`; `tp_allreduce_s` is one all-reduce of the rank's b s h / cp activations
    over the tp group, `tp_overlap` the fraction of TP communication hidden under compute
    (0 when the job does not overlap it), `a2a_s` one expert-parallel all-to-all of an MoE
    layer (bf16), `a2a_dispatch_s` its forward token dispatch when that is sent in another
    precision (None: a2a_s), `ep_overlap` whether the MoE all-to-all hides under the other
    micro-batch's compute (ep_exposed_s), `cp_ring_s` one forward pass of ring attention's
    KV around the cp ring, `etp` the expert tensor parallelism (moe_ffn_s), `moe_host_s` the
    host time exposed per MoE layer forward (the function moe_host_s): once in the forward,
    less the other micro-batch's queued expert backward under ep_overlap
    (moe_host_exposed_s), and once more in the recomputed forward under full recompute
    (never with ep_overlap); the backward reuses the
    counts the forward copied to the host (no sync) and its launches run ahead of the GPU;
    `ep_sm_fraction` the SMs the all-to-all kernels take from the compute that hides them
    under ep_overlap (ep_exposed_s)."""
    tokens = micro_batch * m.seq_len // cp
    n_moe = m.moe_layers_in(first_layer, layers)
    n_dense = layers - n_moe
    attn_gemm = sum(gemm_s(gpu, g, precision) for g in attention_gemms(m, tokens, tp))
    dense_ffn = sum(gemm_s(gpu, g, precision) for g in ffn_gemms(m, tokens, tp, m.ffn))
    moe_ffn = moe_ffn_s(gpu, m, tokens, tp, ep, load_imbalance, precision, etp) if n_moe else 0.0
    gemm_blocks = layers * attn_gemm + n_dense * dense_ffn + n_moe * moe_ffn
    attn_layer = attention_core_s(gpu, m, tokens, tp)
    mem_dense = hbm_s(gpu, layer_memory_bytes(m, tokens, tp, sequence_parallel, m.rotary))
    mem_moe = (
        hbm_s(
            gpu,
            layer_memory_bytes(
                m, tokens, tp, sequence_parallel, m.rotary, True, load_imbalance, etp
            ),
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
    # one MoE layer: forward dispatch (maybe FP8) + combine; backward two bf16 all-to-alls
    a2a_f = (a2a_s if a2a_dispatch_s is None else a2a_dispatch_s) + a2a_s
    a2a_b = 2 * a2a_s
    moe_fwd_compute = attn_gemm + attn_layer + moe_ffn + mem_moe
    moe_bwd_compute = 2 * moe_fwd_compute + (attn_layer if recompute == "selective" else 0.0)
    ep_f, ep_b = ep_exposed_s(
        a2a_f, a2a_b, moe_fwd_compute, moe_bwd_compute, ep_overlap, ep_sm_fraction
    )
    ep_hidden = n_moe * (a2a_f + a2a_b - ep_f - ep_b)
    # the other micro-batch's expert backward queued before the host sync (combined 1F1B)
    partner_s = (
        routed_experts_s(gpu, m, tokens, tp, ep, load_imbalance, precision, etp)
        if n_moe and ep_overlap and moe_host_s > 0.0
        else 0.0
    )
    cp_bwd_raw = layers * max(0.0, 2 * cp_ring_s - 2 * attn_layer)  # KV + dKV under 2x core
    if recompute == "full":  # one more forward of every block (not the LM head)
        gemm_bwd += gemm_blocks
        attn_bwd += attn_fwd
        mem_bwd += mem_blocks
        n_bwd_ar += 2
        ep_b += a2a_f  # the recomputed forward's all-to-alls (never overlapped: ep_overlap)
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
        ep_fwd=n_moe * ep_f,
        ep_bwd=n_moe * ep_b,
        ep_hidden=ep_hidden,
        cp_fwd=cp_fwd,
        cp_bwd=cp_bwd_raw,
        cp_hidden=cp_total - cp_fwd - cp_bwd_raw,
        host_fwd=n_moe * moe_host_exposed_s(moe_host_s, partner_s, ep_overlap),
        host_bwd=n_moe * moe_host_s if recompute == "full" else 0.0,
    )


# ----------------------------------------------------------------------------- optimizer


def optimizer_step_s(gpu: GpuSpec, local_params: float) -> float:
    """Adam over the parameters this GPU updates (its ZeRO-1 shard, or its whole stage
    slice without ZeRO-1): memory-bound at HBM bandwidth."""
    return hbm_s(gpu, local_params * OPTIMIZER_BYTES_PER_PARAM)


# ----------------------------------------------------------------------------- DP overlap


def dp_exposed_s(
    sync_s: float,
    pieces: tuple[tuple[float, float], ...],
    lat_s: float = 0.0,
    repeats: tuple[int, ...] = (),
) -> float:
    """Exposed part of a data-parallel sync of `sync_s` seconds split in pieces
    (fraction of the sync, window it hides under): sum of max(0, f (sync + R lat) -
    window), R the piece's latency repeats (its half's buckets beyond the first each pay
    the latency `lat_s` again; none when `repeats` is empty). Convex piecewise-linear in
    the sync and the latency, so formulations add one pair of rows per piece."""
    reps = repeats or (0,) * len(pieces)
    return sum(
        max(0.0, f * (sync_s + r * lat_s) - w) for (f, w), r in zip(pieces, reps, strict=True)
    )
