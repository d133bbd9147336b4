"""Step time of a training job for a parallel configuration, a placement and links.

The single source of truth for step time: the evaluator calls it on any plan, and the
formulations (placer.optimize) are built from the very same per-stage, per-chain and
per-route quantities that this module exposes. Model (reference/performance-model.md):

    T = T_pipe + T_dp
    T_pipe = max( max over replica chains of the 1F1B (or interleaved 1F1B) time of that
                      chain (its cross-site messages at max(NIC, the route's lockstep tick))
                      + the optimizer step of its slowest stage,
                  max over routes of the cross-site activation bytes / route capacity )
    T_dp   = X(T_intra + T_wan)                         (synchronous)
           = X(T_intra) + T_wan / H                     (diloco, outer sync every H steps)
           = X(T_intra) + max(0, T_wan / H - T_pipe)    (streaming-diloco, overlapped)
    X(S)   = sum over overlap pieces of max(0, f (S + R lat) - window)   (dp_pieces,
             job.overlap; R lat: every bucket pays the WAN latency, dp_lat_repeats; with
             release groups (pp >= 2) each group's work carries its own stages' largest
             R_k lat_k instead, dp_stage_repeats)

* Stage times are operator-level (placer.perf.compute) on the GPU of the stage's own
  site: GEMMs, the attention core, memory-bound operators at HBM bandwidth, and the TP
  communication on NVLink that the job does not hide under compute.
* Pipeline messages are b*s*h bf16 values per micro-batch, scattered over the tp ranks'
  NICs (serialization) plus the one-way latency of the path between the two sites.
  Lockstep contention (job.replica_schedule: lockstep, the default): every replica sends
  its boundary's activation at the same tick of synchronous 1F1B, so a cross-site message
  takes the larger of its NIC serialization and its route's tick, the activations of all
  replicas travelling that route in that direction at once over its capacity
  (route_tick_s), in series with the tick; checked against the flow-level simulator
  (placer.sim, tests/test_simulate.py). `staggered` replicas time-share the routes (Atlas,
  arXiv 2411.14458; needs a launcher that staggers them): only the step-average route
  time below binds.
* Interleaved 1F1B (cfg.virtual_stages = v > 1, Narayanan et al. SC21 section 2.2): each
  rank runs v chunks, model stage s = c pp + k being chunk c of rank k with
  stage_layers[k] / v layers (the LM head on the last model stage, chunk v - 1 of the
  last rank); the chain time is the exact makespan of Megatron-Core's order
  (placer.perf.critical_path) on the chunks' times. Every physical boundary k -> k + 1
  carries v message streams per direction, and the wrap from the last rank back to the
  first carries v - 1 (it crosses the WAN when the chain's last and first sites differ):
  chain_boundaries.
* Data-parallel sync is hierarchical per stage k: reduce-scatter inside each site, an
  all-reduce between the K_k sites that host stage k on the full stage gradient (each pair
  of hosting sites exchanges 2 S_k / K_k bytes per direction, routed on the plan's paths),
  all-gather inside. The NIC phases (T_intra) run over NVLink among the replicas that
  share a node and over the NICs between nodes (intra_sync_s), at the slowest site
  hosting the stage; a site's member count prices a part-filled node, whose fewer NICs
  carry the node's whole share of the ring (node_fill). The WAN phase pays the bandwidth
  of its busiest route plus two one-way path latencies, on top; each stage's exchange
  starts when its own last backward ends (grouped by dp_release_s; its credit before the
  pipeline's end is the plan's, dp_moments_s: the longest chain's end less the latest
  moment any chain in use is done with the stage, each chain's own drain of backwards
  and messages, across the fiber where it crosses), the routes shared only by the stages
  released at or after a moment, each such group's longest NIC phase or one of its
  stages' own NIC phase, pairs' latency and latency repeats in series with its WAN work,
  or a stage's own NIC phase, latency, repeats and NIC term in series if longer
  (sync_staggered_s in step; ZeRO-1's
  overlapped parameter gather, which every rank starts with the step, exposed per group
  past its first forward, the latest over the chains in use of their own fill against
  their slack, gather_staggered_s; every stage's at once in failure scenarios, and for
  the WAN load on instances with a multi-path site pair). The
  per-step sync hides partly under the backward of the last micro-batch and the
  forward of the first (Megatron's --overlap-grad-reduce and --overlap-param-gather):
  X above.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field, fields, replace
from functools import cache

import networkx as nx

from placer.io import Problem
from placer.network import Network, PairKey, Path, RouteKey, Routing, route_key
from placer.perf import comm, compute
from placer.perf.critical_path import CriticalPath, critical_path, service_order
from placer.perf.dualpipe import dualpipev_path
from placer.perf.flops import (
    BYTES_BF16,
    expert_layer_params,
    kv_exchange_width,
    model_flops_per_step,
    stage_params,
)
from placer.perf.pipeline import one_f_one_b_time
from placer.rules import Config, expert_fold_width
from placer.schema import GpuSpec

Chain = tuple[str, ...]
FSDP_REDUCE_BYTES = 4  # torchtitan's default mixed_precision_reduce = "float32"
Hop = tuple[str, str]  # a route traversed from its first site to its second

# Megatron-Core's default gradient bucket, in parameters per GPU: max(40M, 1M x dp)
# (megatron/core/distributed/distributed_data_parallel_config.py, bucket_size)
MEGATRON_BUCKET_MIN = 40_000_000
MEGATRON_BUCKET_PER_DP = 1_000_000
EXACT_BUCKETS = 4  # dp_pieces: bucket pieces priced exactly up to this many buckets
# dp_release_s: the stages' staggered WAN syncs in at most this many release groups (each
# stage released at its group's first, latest-finishing stage: pessimistic). Assumption: a
# size limit of the formulations (G - 1 more hulls per route), not a measured quantity
DP_RELEASE_GROUPS = 4


def hops_of(path: Path, start: str) -> list[Hop]:
    """The routes of a path as hops in the direction of travel from `start`."""
    sites = path.sites if path.sites[0] == start else tuple(reversed(path.sites))
    return list(zip(sites, sites[1:], strict=False))


def _hop_queues(fwd: tuple[frozenset[Hop], ...]) -> tuple[tuple[int, int], ...] | None:
    """Per boundary (activations' FIFO, gradients' FIFO) given the hops each boundary's
    activations surely travel (its gradients the reverse ones): directions with a common
    hop in one FIFO, named by its lowest member (boundary j's activations numbered j, its
    gradients nb + j); None when nothing is shared."""
    nb = len(fwd)
    hops = [*fwd, *(frozenset((y, x) for x, y in h) for h in fwd)]
    uf = nx.utils.UnionFind(range(2 * nb))
    for i, k in itertools.combinations(range(2 * nb), 2):
        if hops[i] & hops[k]:
            uf.union(i, k)
    name = {i: min(group) for group in uf.to_sets() for i in group}
    if all(name[i] == i for i in range(2 * nb)):
        return None
    return tuple((name[j], name[nb + j]) for j in range(nb))


def balanced_stage_layers(layers: int, pp: int) -> tuple[int, ...]:
    """Even split; the remainder goes to the middle stages because the first and last
    stages also carry the embedding and the LM head."""
    base, extra = divmod(layers, pp)
    out = [base] * pp
    order = sorted(range(pp), key=lambda k: (k in (0, pp - 1), abs(k - (pp - 1) / 2), k))
    for k in order[:extra]:
        out[k] += 1
    return tuple(out)


def balanced_chunk_layers(layers: int, pp: int, v: int) -> tuple[int, ...] | None:
    """Decoder layers of each of the v pp model stages (model order, chunk c of rank k at
    c pp + k) for interleaving when the even split per rank does not exist, or None when
    some model stage would get no layer (layers < v pp).

    Megatron-Core's account_for_embedding_in_pipeline_split / account_for_loss_in_
    pipeline_split (TransformerConfig; what Megatron-Bridge's Qwen3 MoE recipes set for
    94 layers with VP 3 or 4): the embedding and the loss count as one layer each, the
    layers + 2 units split evenly over the v pp model stages, the first model stage
    (embedding) and the last (loss) one decoder layer short (transformer_block.
    get_num_layers_to_build). Megatron-Core needs the units to divide; here the
    remainder is spread: the short model stages (a unit fewer) are the last ones, as
    Megatron-Bridge's DeepSeek-V3 layouts shorten the last stage, skipping the first and
    last stage when that would leave them without a decoder layer."""
    n = v * pp
    if layers < n:
        return None
    base, extra = divmod(layers + 2, n)
    units = [base] * n
    ends_ok = base >= 2  # the embedding / loss stage keeps a decoder layer with base - 1 units
    short = [s for s in reversed(range(n)) if ends_ok or s not in (0, n - 1)][: n - extra]
    for s in range(n):
        units[s] += 0 if s in short else 1
    out = [u - (s == 0) - (s == n - 1) for s, u in enumerate(units)]
    if min(out) < 1 or sum(out) != layers:
        return None
    return tuple(out)


@dataclass(frozen=True)
class StageTime:
    fwd: float  # seconds per micro-batch, incl. exposed TP communication
    bwd: float
    fwd_compute: float
    bwd_compute: float
    ops: compute.StageOps | None = None  # the operator-level terms (placer.perf.compute)
    optimizer: float = 0.0  # the stage's optimizer step, once per step


@dataclass
class StepResult:
    step_time_s: float
    pipe_s: float
    dp_s: float
    breakdown: dict[str, float]
    critical_chain: Chain | None
    route_pp_load: dict[RouteKey, float] = field(default_factory=dict)
    route_dp_load: dict[RouteKey, float] = field(default_factory=dict)
    route_pp_s: dict[RouteKey, float] = field(default_factory=dict)
    route_dp_s: dict[RouteKey, float] = field(default_factory=dict)
    route_tick_s: dict[Hop, float] = field(default_factory=dict)  # lockstep, per direction
    wan_s: float = 0.0  # every stage's WAN exchange at once (busiest route + latency)
    wan_staggered_s: float = 0.0  # the same with each stage's from its backward's end
    # NIC phases, WAN latency and bandwidth of the staggered sync, per release group, from
    # the plan's release (PerfModel.step, dp_moments_s: what the staggered pieces charge;
    # intra_s + wan_s without stagger)
    sync_staggered_s: float = 0.0
    # the same for ZeRO-1's overlapped parameter gather: per release group, exposed past
    # the plan's first forward (dp_moments_s); intra_s + wan_s without stagger
    gather_staggered_s: float = 0.0
    intra_s: float = 0.0
    unreachable: list[tuple[str, str]] = field(default_factory=list)
    hidden: dict[str, float] = field(default_factory=dict)  # communication overlapped with compute


class PerfModel:
    """Per-problem cache of everything step time depends on."""

    def __init__(self, problem: Problem, network: Network | None = None):
        self.problem = problem
        self.model = problem.model
        self.catalog = problem.catalog
        self.net = network or Network(problem)
        # the one job setting that is not per configuration: tokens per optimizer step
        self.global_batch = problem.instance.job.global_batch
        self._stage_times = cache(self._stage_times_uncached)
        self._chain_time = cache(self._chain_time_uncached)
        self._service_memo: dict[tuple, tuple[dict, list[float]]] = {}
        self._queue_memo: dict[tuple, tuple[tuple[int, int], ...] | None] = {}
        self._memo: dict[tuple[object, ...], object] = {}
        # one stage's StageTime by (the per-configuration arguments of _stage_times_uncached,
        # the stage's layers, whether it is the first and the last, its first block when the
        # model's blocks differ): every split of a shape shares its stages' times
        self._stage_memo: dict[tuple[object, ...], StageTime] = {}

    # ------------------------------------------------------------------ hardware rates

    def site_gpu(self, site: str) -> GpuSpec:
        return self.catalog.gpus[self.problem.instance.site(site).gpu]

    def peak_flops(self, gpu: GpuSpec, precision: str) -> float:
        peak = gpu.peak_tflops_bf16 * 1e12
        return peak * (self.catalog.precision.fp8_peak_factor if precision == "fp8" else 1.0)

    def nic_Bps(self, gpu: GpuSpec) -> float:
        return gpu.nic_gbps * 1e9 / 8 * self.catalog.network.nic_efficiency

    def nvlink_Bps(self, gpu: GpuSpec) -> float:
        """Per-direction NVLink bandwidth (the catalog gives bidirectional GB/s)."""
        return gpu.nvlink_gbytes_per_s_bidir / 2 * 1e9 * self.catalog.network.nvlink_efficiency

    # ------------------------------------------------------------------ per stage

    def message_bytes(self, cfg: Config) -> float:
        """One pipeline message of a replica: b*s*h activations (or their gradients) in
        bf16 for each of its ep x dp_shard side-by-side sequences of b (cp splits them,
        not adds)."""
        return (
            cfg.ranks_per_replica
            * cfg.micro_batch
            * self.model.seq_len
            * self.model.hidden
            * BYTES_BF16
        )

    def stage_times(self, cfg: Config, gpu_key: str) -> tuple[StageTime, ...]:
        """Times of one micro-batch on each pipeline rank (all of its chunks: under
        DualPipeV the sum of its two model stages', rank_stage_time)."""
        if cfg.dualpipev:
            chunks = self.chunk_times(cfg, gpu_key)
            return tuple(
                rank_stage_time([chunks[s] for s in cfg.rank_stages(k)]) for k in range(cfg.pp)
            )
        return self._times_of(cfg, gpu_key, cfg.pp, cfg.stage_layers)

    def _times_of(
        self, cfg: Config, gpu_key: str, stages: int, layers: tuple[int, ...]
    ) -> tuple[StageTime, ...]:
        """The cached per-stage model for `stages` stages of `layers` under cfg's settings."""
        return self._stage_times(
            cfg.tp,
            stages,
            cfg.micro_batch,
            layers,
            gpu_key,
            cfg.recompute,
            cfg.precision,
            cfg.sequence_parallel,
            cfg.overlap_tp_comm,
            cfg.cp,
            cfg.ep,
            cfg.expert_load_imbalance,
            cfg.zero1,
            cfg.dp_shard,
            cfg.reshard_after_forward,
            cfg.ep_overlap,
            cfg.moe_dispatcher,
            cfg.moe_dispatch_precision,
            cfg.etp,
            cfg.moe_cuda_graphs,
        )

    def ep_all_to_all_s(
        self,
        gpu: GpuSpec,
        tp: int,
        cp: int,
        ep: int,
        b: int,
        imb: float,
        dispatcher: str = "alltoall",
        precision: str = "bf16",
        etp: int = 1,
    ) -> float:
        """One token dispatch (or combine) of an MoE layer over the EP group: ep ranks at
        stride etp (Megatron-Core's expert order tp-ep-dp-pp with tp = etp; etp = 1 unless
        folded), min(ep, node / etp) of them on one NVLink domain. The alltoall
        dispatcher sends every token-expert copy to its rank, the NIC share over the NICs
        (comm.two_level_all_to_all_s); deepep sends one copy per destination node over the
        NICs and fans out over NVLink (compute.moe_node_dispatch_bytes,
        comm.node_dedup_all_to_all_s). `precision` is the wire precision of the values."""
        if ep <= 1 or self.model.moe is None:
            return 0.0
        tokens = b * self.model.seq_len // cp
        vb = compute.token_value_bytes(precision)
        q = min(ep, max(1, gpu.gpus_per_node // etp))
        lat = self.catalog.network.intra_site_latency_s
        if dispatcher == "deepep":
            nvl, nic = compute.moe_node_dispatch_bytes(
                self.model, tokens, tp, imb, ep, gpu.gpus_per_node, vb, etp
            )
            return comm.node_dedup_all_to_all_s(
                ep // q, nvl, nic, self.nvlink_Bps(gpu), self.nic_Bps(gpu), lat
            )
        nbytes = compute.moe_dispatch_bytes(self.model, tokens, tp, imb, vb)
        return comm.two_level_all_to_all_s(
            ep, q, nbytes, self.nvlink_Bps(gpu), self.nic_Bps(gpu), 0.0, lat
        )

    def etp_gather_s(self, gpu: GpuSpec, tp: int, cp: int, etp: int, b: int, imb: float) -> float:
        """One all-gather (or its mirror reduce-scatter) of the dispatched tokens over the
        expert tensor-parallel group (Megatron-Core's alltoall / flex dispatchers gather the
        tokens an EP rank received over its etp GPUs before the experts and reduce-scatter
        the experts' output after them): etp members, each holding the top_k x imbalance
        copies of its own s b / (cp tp) tokens (compute.moe_dispatch_bytes), a ring over
        NVLink when etp fits a node, else over the NICs. 0 without expert TP."""
        if etp <= 1 or self.model.moe is None:
            return 0.0
        tokens = b * self.model.seq_len // cp
        total = etp * compute.moe_dispatch_bytes(self.model, tokens, tp, imb)
        if etp <= gpu.gpus_per_node:
            return comm.all_gather_s(etp, total, self.nvlink_Bps(gpu))
        lat = self.catalog.network.intra_site_latency_s
        return comm.all_gather_s(etp, total, self.nic_Bps(gpu), lat)

    def cp_ring_s(self, gpu: GpuSpec, tp: int, cp: int, b: int) -> float:
        """One forward ring of KV chunks over the CP group (ranks at stride tp): on NVLink
        when tp x cp GPUs fit one scale-up domain, else every step waits for a NIC hop."""
        if cp <= 1:
            return 0.0
        tokens = b * self.model.seq_len // cp
        chunk = tokens * kv_exchange_width(self.model) // tp * BYTES_BF16
        if tp * cp <= gpu.gpus_per_node:
            return comm.ring_attention_kv_s(cp, chunk, self.nvlink_Bps(gpu))
        lat = self.catalog.network.intra_site_latency_s
        return comm.ring_attention_kv_s(cp, chunk, self.nic_Bps(gpu), lat)

    def chunk_times(self, cfg: Config, gpu_key: str) -> tuple[StageTime, ...]:
        """Times of one micro-batch on each model stage (v pp of them, cfg.chunk_layers;
        the LM head on the last): the per-stage model on the chunks. For v = 1 these are
        the stage times. Their `optimizer` is not a rank's (use stage_times for that)."""
        if cfg.chunks_per_rank == 1:
            return self.stage_times(cfg, gpu_key)
        return self._times_of(cfg, gpu_key, cfg.model_stages, cfg.chunk_layers)

    def _stage_times_uncached(
        self,
        tp: int,
        pp: int,
        b: int,
        stage_layers: tuple[int, ...],
        gpu_key: str,
        recompute: str,
        precision: str,
        sequence_parallel: bool,
        tp_overlap: bool,
        cp: int = 1,
        ep: int = 1,
        imbalance: float = 1.0,
        zero1: bool = True,
        dp_shard: int = 1,
        reshard: bool = True,
        ep_overlap: bool = False,
        dispatcher: str = "alltoall",
        dispatch_precision: str = "bf16",
        fold_etp: int | None = None,
        moe_graphs: bool = False,
    ) -> tuple[StageTime, ...]:
        """Operator-level times (placer.perf.compute) of one micro-batch per stage, with
        the FSDP collectives a shard group does not hide (fsdp_exposed). With expert TP the
        gather before and the reduce-scatter after the experts (etp_gather_s) go with the
        dispatch and the combine: exposed, or hidden with them under ep_overlap. `fold_etp`
        is Config.etp (None: unfolded, expert TP 1). `moe_graphs` is job.moe_cuda_graphs: without
        them every MoE layer pass exposes the GPU's moe_layer_host_s (compute.moe_host_s)."""
        gpu = self.catalog.gpus[gpu_key]
        etp = fold_etp or 1
        ar = comm.ring_allreduce_s(
            tp, b * self.model.seq_len // cp * self.model.hidden * BYTES_BF16, self.nvlink_Bps(gpu)
        )
        overlap = gpu.tp_comm_overlap if tp_overlap and sequence_parallel else 0.0  # TE needs SP
        gather = self.etp_gather_s(gpu, tp, cp, etp, b, imbalance)
        a2a = self.ep_all_to_all_s(gpu, tp, cp, ep, b, imbalance, dispatcher, etp=etp) + gather
        a2a_disp = (
            self.ep_all_to_all_s(gpu, tp, cp, ep, b, imbalance, dispatcher, dispatch_precision, etp)
            + gather
            if dispatch_precision != "bf16"
            else None
        )
        ring = self.cp_ring_s(gpu, tp, cp, b)
        # what a stage's time reads besides its own layers, position and first block (its
        # first block only through the MoE blocks it holds: 0 for a model without them)
        outer = (tp, pp > 1, b, gpu_key, recompute, precision, sequence_parallel, tp_overlap)
        outer += (cp, ep, imbalance, zero1, dp_shard, reshard, ep_overlap, dispatcher)
        outer += (dispatch_precision, fold_etp, moe_graphs)
        moe = self.model.moe is not None
        out = []
        first_layer = 0
        for k, layers in enumerate(stage_layers):
            key = (outer, layers, k == 0, k == pp - 1, first_layer if moe else 0)
            first_layer += layers
            hit = self._stage_memo.get(key)
            if hit is None:
                hit = self._stage_memo[key] = self._one_stage_time(
                    gpu, tp, pp, b, k, stage_layers, recompute, precision, sequence_parallel,
                    ar, overlap, cp, ep, a2a, ring, imbalance, a2a_disp, ep_overlap, etp,
                    moe_graphs, zero1, dp_shard, reshard, fold_etp, dispatcher,
                )  # fmt: skip
            out.append(hit)
        return tuple(out)

    def _one_stage_time(
        self,
        gpu: GpuSpec,
        tp: int,
        pp: int,
        b: int,
        k: int,
        stage_layers: tuple[int, ...],
        recompute: str,
        precision: str,
        sequence_parallel: bool,
        ar: float,
        overlap: float,
        cp: int,
        ep: int,
        a2a: float,
        ring: float,
        imbalance: float,
        a2a_disp: float | None,
        ep_overlap: bool,
        etp: int,
        moe_graphs: bool,
        zero1: bool,
        dp_shard: int,
        reshard: bool,
        fold_etp: int | None,
        dispatcher: str,
    ) -> StageTime:
        """Stage k's StageTime (_stage_times_uncached): it reads stage_layers only through
        stage k's layers, whether k is the first or the last stage, and the MoE blocks among
        its layers (the first block), as _stage_memo's key says."""
        layers = stage_layers[k]
        ops = compute.stage_ops(
            gpu,
            self.model,
            layers,
            k == pp - 1,
            b,
            tp,
            recompute,
            precision,
            sequence_parallel,
            ar,
            overlap,
            first_layer=sum(stage_layers[:k]),
            cp=cp,
            ep=ep,
            a2a_s=a2a,
            cp_ring_s=ring,
            load_imbalance=imbalance,
            a2a_dispatch_s=a2a_disp,
            ep_overlap=ep_overlap,
            etp=etp,
            moe_host_s=compute.moe_host_s(gpu, self.model, moe_graphs),
            # DeepEP's SM-driven kernels (catalog deepep_sm_fraction); NCCL's all-to-all
            # under the alltoall dispatcher is not charged (no sourced SM count)
            ep_sm_fraction=gpu.deepep_sm_fraction if dispatcher == "deepep" else 0.0,
        )
        fc = ops.gemm_fwd + ops.attn_fwd + ops.mem_fwd
        bc = ops.gemm_bwd + ops.attn_bwd + ops.mem_bwd
        if dp_shard > 1:
            ops = self._with_fsdp(ops, gpu, tp, cp, dp_shard, reshard, pp, k, stage_layers)
        opt = self._optimizer_s(gpu, tp, pp, k, stage_layers, cp, ep, zero1, dp_shard, fold_etp)
        return StageTime(ops.fwd, ops.bwd, fc, bc, ops, opt)

    def fsdp_collectives_s(
        self, gpu: GpuSpec, tp: int, cp: int, dp_shard: int, layer_params: float
    ) -> tuple[float, float]:
        """(all-gather, reduce-scatter) of one layer's parameters over the FSDP shard group:
        dp_shard x cp ranks holding the same tp slice (torchtitan's dp_shard_cp mesh), ring
        collectives (comm.all_gather_s / reduce_scatter_s: (n-1)/n of the layer's bytes per
        rank). All-gather in bf16, reduce-scatter in fp32 (torchtitan's default
        mixed_precision_param bfloat16 / mixed_precision_reduce float32). On NVLink when the
        replica's tp x cp x dp_shard GPUs fit one scale-up domain, else through each rank's
        NIC (the ring's slowest hop) with the fabric latency per step."""
        n = dp_shard * cp
        numel = layer_params / tp
        if tp * n <= gpu.gpus_per_node:
            bw, lat = self.nvlink_Bps(gpu), 0.0
        else:
            bw, lat = self.nic_Bps(gpu), self.catalog.network.intra_site_latency_s
        return (
            comm.all_gather_s(n, numel * BYTES_BF16, bw, lat),
            comm.reduce_scatter_s(n, numel * FSDP_REDUCE_BYTES, bw, lat),
        )

    def _with_fsdp(
        self,
        ops: compute.StageOps,
        gpu: GpuSpec,
        tp: int,
        cp: int,
        dp_shard: int,
        reshard: bool,
        pp: int,
        k: int,
        stage_layers: tuple[int, ...],
    ) -> compute.StageOps:
        """The stage's operators plus FSDP2's per-layer collectives of one micro-batch.

        PyTorch FSDP2 (docs: torch.distributed.fsdp.fully_shard and "FSDP Notes",
        prefetching): each layer's parameters are all-gathered before its forward and, with
        reshard_after_forward, again before its backward; its gradients are
        reduce-scattered after its backward. The collectives run on their own stream, so
        layer i + 1's all-gather overlaps layer i's compute (implicit prefetch) and only
        the part longer than a layer's compute is exposed, plus the first all-gather (it
        overlaps nothing) and the last reduce-scatter (nothing follows it): ZeRO-3's
        1.5 x the data-parallel all-reduce volume (Rajbhandari et al., arXiv 1910.02054,
        section 7.2.2). Per micro-batch, as fully_shard runs by default with gradient
        accumulation; torch.distributed.pipelining's skipping of the reshard and
        reduce-scatter between micro-batches is not credited (conservative for pp > 1)."""
        layers = stage_layers[k]
        first = sum(stage_layers[:k])
        per_layer = stage_params(self.model, layers, False, False, first) / max(1, layers)
        ag, rs = self.fsdp_collectives_s(gpu, tp, cp, dp_shard, per_layer)
        c_fwd = (ops.gemm_fwd + ops.attn_fwd + ops.mem_fwd) / max(1, layers)
        c_bwd = (ops.gemm_bwd + ops.attn_bwd + ops.mem_bwd) / max(1, layers)
        bwd_comm = (ag if reshard else 0.0) + rs
        rest = max(0, layers - 1)
        fwd = ag + rest * max(0.0, ag - c_fwd)
        bwd = (ag if reshard else 0.0) + rs + rest * max(0.0, bwd_comm - c_bwd)
        total = layers * (ag + bwd_comm)
        return replace(ops, fsdp_fwd=fwd, fsdp_bwd=bwd, fsdp_hidden=max(0.0, total - fwd - bwd))

    def _optimizer_s(
        self,
        gpu: GpuSpec,
        tp: int,
        pp: int,
        k: int,
        stage_layers: tuple[int, ...],
        cp: int = 1,
        ep: int = 1,
        zero1: bool = True,
        dp_shard: int = 1,
        fold_etp: int | None = None,
    ) -> float:
        """Adam over the parameters one GPU of stage k updates. Under ZeRO-1 that is its
        1/d shard; d is not an argument of the stage-time cache, so the ZeRO-1 division by
        the dp replicas is applied by the caller (optimizer_step_s). Inside a replica of
        tp x cp x ep GPUs the dense weights are split over tp and (ZeRO-1) sharded over
        cp x ep, the routed experts split over ep and sharded over tp x cp: either way
        1/(tp cp ep) of the stage per GPU; without ZeRO-1 a GPU updates dense/tp +
        experts/ep (experts/(ep etp) with expert TP; ZeRO-1 folded: every GPU of the
        replica stage holds 1/width of it either way, the dense 1/tp over width/tp ranks and
        the experts' 1/(ep etp) over width/(ep etp)). Under FSDP (dp_shard > 1, ep = 1) a GPU
        updates its 1/(tp cp dp_shard) shard whatever job.zero1 says (ZeRO-3 shards the optimizer
        state with the parameters)."""
        first = sum(stage_layers[:k])
        total = stage_params(self.model, stage_layers[k], k == 0, k == pp - 1, first)
        if dp_shard > 1:
            n = total / (tp * cp * dp_shard)
        elif zero1:
            n = total / (tp * cp * ep)
            if fold_etp is not None:  # the folded replica stage (rules.expert_fold_width)
                n = total / expert_fold_width(tp, cp, ep, fold_etp)
        else:
            experts = expert_layer_params(self.model, first, stage_layers[k])
            n = (total - experts) / tp + experts / (ep * (fold_etp or 1))
        return compute.optimizer_step_s(gpu, n)

    def optimizer_step_s(self, cfg: Config, chain: Chain) -> float:
        """The step waits for the slowest GPU's optimizer step: the max over the chain's
        stages (ZeRO-1 shards it over the dp replicas)."""
        shard = cfg.optimizer_shard_over_dp
        return (
            max(
                self.stage_times(cfg, self.problem.instance.site(s).gpu)[k].optimizer
                for k, s in enumerate(chain)
            )
            / shard
        )

    def grad_buckets(self, cfg: Config, k: int) -> int:
        """Megatron-Core's gradient buckets of rank k's first model chunk (model stage k):
        its parameters per GPU (dense / tp + routed experts / ep) over the default bucket
        size, max(40M, 1M x dp) parameters (DistributedDataParallelConfig.bucket_size; the
        later chunks are not bucketed)."""
        return self._bucket_counts(cfg)[k]

    def _bucket_counts(self, cfg: Config) -> tuple[int, ...]:
        """grad_buckets of every rank, in one pass over the model stages (memoized)."""
        key = ("buckets", cfg)
        hit = self._memo.get(key)
        if hit is None:
            layers, n_stages = cfg.chunk_layers, cfg.model_stages
            size = max(MEGATRON_BUCKET_MIN, MEGATRON_BUCKET_PER_DP * cfg.dp)
            out, first = [], 0
            for k in range(cfg.pp):
                total = stage_params(self.model, layers[k], k == 0, k == n_stages - 1, first)
                experts = expert_layer_params(self.model, first, layers[k])
                per_gpu = (total - experts) / cfg.tp + experts / (cfg.ep * cfg.expert_tp)
                out.append(max(1, math.ceil(per_gpu / size)))
                first += layers[k]
            hit = self._memo[key] = tuple(out)
        return hit  # type: ignore[return-value]

    def dp_pieces(self, cfg: Config) -> tuple[tuple[float, float], ...]:
        """How the data-parallel sync overlaps with compute: (fraction of the sync, window
        it hides under) pieces, exposed = sum max(0, f sync - window) (compute.dp_exposed_s).

        * without ZeRO-1 the gradient all-reduce runs in buckets under the backward of the
          last micro-batch (--overlap-grad-reduce);
        * with ZeRO-1 its reduce-scatter half does, and the parameter all-gather half runs
          under the first forward of the next step (--overlap-param-gather).
        With pipelining only the last (first) micro-batch's backward (forward) of the stage
        is the window: the window is one micro-batch's stage time, the shortest over the
        stages and over the GPU types of the instance's sites, so that it is a constant of
        the configuration (the formulations read it as data); pairing the slowest sync with
        the shortest window never hides more than Megatron can.

        Buckets: a half f S in n buckets, bucket j ready (j + 1)/n into the window W and
        reduced one after the other, is exposed max(f S / n, f S - (n - 1)/n W) (the last
        bucket always; all that the window cannot take when a bucket outlasts its slice):
        one bucket (n = 1, a small stage) hides nothing, the piece (f, 0); up to
        EXACT_BUCKETS buckets the pieces (f / n, 0) and ((n - 1)/n f, (n - 1)/n W); more
        buckets the continuous window (f, W), optimistic by at most f S / n (the fractions
        of the exact pieces would leave CP-SAT's coarse grid and slow its proofs: 31/64
        for 32 buckets stopped four-site-metro-longhaul from being proven in 400 s). n
        is the fewest buckets of any rank (grad_buckets)."""
        return tuple(p for pieces, _ in self._dp_halves(cfg) for p in pieces)

    def _dp_halves(self, cfg: Config) -> list[tuple[tuple[tuple[float, float], ...], bool]]:
        """dp_pieces by half of the sync, in order: (the half's pieces, whether Megatron
        buckets it: the gradient reduce under --overlap-grad-reduce, ZeRO-1's parameter
        gather under --overlap-param-gather; dp_lat_repeats)."""
        key = ("dp_halves", cfg)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._dp_halves_uncached(cfg)
        return hit  # type: ignore[return-value]

    def _dp_halves_uncached(
        self, cfg: Config
    ) -> list[tuple[tuple[tuple[float, float], ...], bool]]:
        gpus = sorted({s.gpu for s in self.problem.instance.sites})
        # DualPipeV: a rank's last backward (first forward) is one chunk's
        each = self.chunk_times if cfg.dualpipev else self.stage_times
        times = [t for g in gpus for t in each(cfg, g)]
        # FSDP's exposed collectives occupy the fabric the sync needs: not a window
        w_bwd = min(t.bwd - _fsdp(t, "bwd") for t in times) if cfg.overlap_grad_reduce else 0.0
        w_fwd = min(t.fwd - _fsdp(t, "fwd") for t in times) if cfg.overlap_param_gather else 0.0
        n = min(self._bucket_counts(cfg))

        def half(f: float, w: float) -> tuple[tuple[float, float], ...]:
            if w <= 0 or n == 1:  # one bucket: ready when the window is over
                return ((f, 0.0),)
            if n > EXACT_BUCKETS:
                return ((f, w),)
            return ((f / n, 0.0), (f * (n - 1) / n, w * (n - 1) / n))

        if cfg.dp_shard > 1:
            # FSDP: the replicate all-reduce of the shards follows each layer's
            # reduce-scatter in the backward (HSDP): one bucket per layer, not Megatron's
            # DDP buckets, so the window is the continuous one
            return [(((1.0, w_bwd),), False)]
        if not cfg.zero1:
            return [(half(1.0, w_bwd), cfg.overlap_grad_reduce)]
        return [
            (half(0.5, w_bwd), cfg.overlap_grad_reduce),
            (half(0.5, w_fwd), cfg.overlap_param_gather),
        ]

    def dp_lat_repeats(self, cfg: Config) -> tuple[int, ...]:
        """Per dp_pieces piece, R: how many more times than once its half pays the sync's
        latency, a piece exposing max(0, f (S + R lat) - window) (compute.dp_exposed_s).

        Every bucket is its own collective (Megatron-Core start_grad_sync / start_param_sync:
        one reduce-scatter, all-reduce or all-gather per bucket group, coalesced over its
        buckets only), and the collectives of the data-parallel group run one after the
        other on its NCCL stream, so each bucket pays the latency of its half (one WAN
        round, a one-way path latency, under ZeRO-1; both with the all-reduce): a half f S
        in n buckets takes f (B + n lat) = f (S + (n - 1) lat), B its bandwidth part, and
        its exposed part is dp_pieces' formula on that. R = n - 1 with n the most buckets of
        any rank (grad_buckets; the windows take the fewest), so that no rank is priced
        below its own sync. That is the charge of one release group (pp 1, and the
        failure scenarios' every-stage-at-once sync); with release groups each group's
        work carries its own stages' repeats instead (dp_stage_repeats). A half that is
        not bucketed (its overlap off: one collective after the backward or the optimizer
        step) and HSDP's replicate all-reduce (not Megatron's buckets) repeat nothing."""
        r = max(self._bucket_counts(cfg)) - 1
        return tuple(
            r if bucketed else 0 for pieces, bucketed in self._dp_halves(cfg) for _ in pieces
        )

    def dp_stage_repeats(self, cfg: Config) -> tuple[int, ...]:
        """Per stage k, R_k: how many more times than once a bucketed half of its own sync
        pays its own pairs' latency, its buckets (grad_buckets) less one. The staggered
        sync charges each release group the largest R_k lat_k of its stages synced across
        sites (PerfModel.step), where dp_lat_repeats charges every piece the most buckets
        of any rank at the slowest pair's latency: placer.sim runs each stage's buckets one
        after the other on its own ranks, so a stage synced inside one site, or released
        long before the end, paid another stage's repeats (up to +27% against placer.sim;
        benchmarks/README.md, branch repeats2)."""
        return tuple(n - 1 for n in self._bucket_counts(cfg))

    def dp_repeat_share(self, cfg: Config) -> tuple[float, float]:
        """(sync, gather): the fraction of each sequence of dp_credit_scale (the pieces
        dp_staggered marks, and the others) that Megatron buckets (dp_lat_repeats). A
        sequence's latency repeats enter its S times this, so that its pieces, which take
        f of S each, pay f_bucketed R lat in all: 1 where the whole sequence is bucketed,
        1/2 for ZeRO-1's bucketed reduce-scatter followed by its one gather (job.overlap
        grad_reduce without param_gather), 0 without buckets."""
        stag = self.dp_staggered(cfg)
        flags = [b for pieces, b in self._dp_halves(cfg) for _ in pieces]
        fs = [f for f, _ in self.dp_pieces(cfg)]
        out = []
        for mark in (True, False):
            total = sum(f for f, st in zip(fs, stag, strict=True) if st is mark)
            part = sum(f for f, st, b in zip(fs, stag, flags, strict=True) if st is mark and b)
            out.append(part / total if total > 0 else 0.0)
        return out[0], out[1]

    def dp_release_s(self, cfg: Config) -> tuple[float, ...]:
        """Per stage k, delta_k: how long before the pipeline's end (T_pipe, stage 0's last
        backward) stage k's WAN sync may start, in at most DP_RELEASE_GROUPS groups.

        In 1F1B (and interleaved 1F1B: rank k's last backward is chunk 0 of the last
        micro-batch) the last backward runs from rank p - 1 down to rank 0, so rank k
        finishes at least the backwards of ranks 0 .. k - 1 before the end: delta_k =
        sum_{j<k} of rank j's last backward (chunk 0) and of the gradient message into it,
        the shortest over the instance's GPU types and sites (a message inside a site: the
        fabric latency and its NIC serialization), so that it is a constant of
        the configuration (the formulations read it as data) and never more than the real
        stagger (Megatron reduces each rank's gradients as soon as that rank is done;
        placer.sim does too). Grouped by stage index into G prefix groups, each stage
        released at its group's first stage's delta (later: pessimistic). The groups and
        this constant are what the driver's bounds and the formulations' group loads
        read; the step credits each group the plan's own release, never less
        (dp_moments_s: a chain whose drain crosses the WAN is done with its later ranks a
        one-way latency earlier, and a chain that ends before the longest by its slack).

        All zero (every stage's exchange at once, as before) where the stagger does not
        apply: one stage, fewer than two replicas, a sync mode other than synchronous
        (the outer exchange is its own phase) and HSDP (the replicate all-reduce follows
        each layer's reduce-scatter, not the rank's end). On instances where some site pair
        has several candidate paths (solver.paths_per_pair >= 2 on a route graph with a
        cycle: any_dp_pair_routed) each stage's route term is per release group (its own
        routes at its group's load: PerfModel.step), a flow-routed pair's group load the
        smaller of its group's demand and its flow on the route: the formulations split a
        pair's flow over paths summed over stages, and the proportional share is a
        product of two decisions (before, every stage's load in every group there: up to
        +14% against placer.sim; benchmarks/README.md, "Each release group's routes with
        a flow-routed pair")."""
        p = cfg.pp
        if p < 2 or cfg.dp < 2 or cfg.sync_mode != "synchronous" or cfg.dp_shard > 1:
            return (0.0,) * p
        if cfg.dualpipev:  # its ranks end on W ops in no rank order: no stagger credited
            return (0.0,) * p
        # rank j's last backward and the gradient message from rank j + 1 into it
        return self._rank_offsets(cfg, "bwd")

    def offsets_bound_s(self, cfg: Config, hosts: list[set[str]], phase: str) -> tuple[float, ...]:
        """Per stage k, the most chain_offsets_s can be for a chain whose rank j sits at a
        site of hosts[j]: each boundary's longest message between the two ranks' hosts
        (the driver's configuration bound: a plan's release or fill credit is at most its
        critical chain's tail or head past T_pipe - T_c, PerfModel.step)."""
        p = cfg.pp
        gpus = sorted({s.gpu for s in self.problem.instance.sites})
        times = [min(getattr(self.chunk_times(cfg, g)[j], phase) for g in gpus) for j in range(p)]
        msgs = []
        for j in range(p - 1):
            pairs = [(a, b) for a in hosts[j + 1] for b in hosts[j]]
            pairs = [(a, b) if phase == "bwd" else (b, a) for a, b in pairs]
            msgs.append(max(sum(self.boundary(cfg, a, b)) for a, b in pairs))
        offset = [sum(times[:k]) + sum(msgs[:k]) for k in range(p)]
        G = min(p, DP_RELEASE_GROUPS)
        first = [min(k for k in range(p) if k * G // p == g) for g in range(G)]
        return tuple(offset[first[k * G // p]] for k in range(p))

    def _rank_offsets(
        self, cfg: Config, phase: str, chain: Chain | None = None
    ) -> tuple[float, ...]:
        """Per stage k, the sum over ranks j < k of rank j's chunk-0 `phase` time (the
        shortest over the instance's GPU types) and one pipeline message per boundary
        between them, each stage at its group's first stage's value (DP_RELEASE_GROUPS
        prefix groups by stage index): dp_release_s ("bwd") and dp_fill_s ("fwd") with
        the shortest message inside a site; chain_offsets_s with `chain`'s own messages
        (the gradients' from rank j + 1 to rank j, the activations' the other way)."""
        p = cfg.pp
        gpus = sorted({s.gpu for s in self.problem.instance.sites})
        times = [min(getattr(self.chunk_times(cfg, g)[j], phase) for g in gpus) for j in range(p)]
        if chain is None:
            msg = min(sum(self.boundary(cfg, s.name, s.name)) for s in self.problem.instance.sites)
            offset = [sum(times[:k]) + k * msg for k in range(p)]
        else:
            hops = [
                (chain[j + 1], chain[j]) if phase == "bwd" else (chain[j], chain[j + 1])
                for j in range(p - 1)
            ]
            msgs = [sum(self.boundary(cfg, a, b)) for a, b in hops]
            offset = [sum(times[:k]) + sum(msgs[:k]) for k in range(p)]
        G = min(p, DP_RELEASE_GROUPS)
        first = [min(k for k in range(p) if k * G // p == g) for g in range(G)]
        return tuple(offset[first[k * G // p]] for k in range(p))

    def dp_fill_s(self, cfg: Config) -> tuple[float, ...]:
        """Per stage k, phi_k: how long after the step's start rank k's first forward runs
        at the earliest, grouped as dp_release_s groups the stages (its group's first
        stage's offset: earlier, pessimistic); all zero where dp_release_s is.

        ZeRO-1's parameter all-gather under --overlap-param-gather starts with the step on
        every rank, and each chunk's first forward waits for its own buckets (Megatron-Core
        DistributedOptimizer: the forward pre-hook waits for the bucket's all-gather;
        placer.sim does the same), so rank k's gather is exposed only past phi_k: the
        pipeline fill ahead of it, the first forwards of ranks 0 .. k - 1 (chunk 0, the
        shortest over the instance's GPU types) and the activation messages between them
        (inside a site: the fabric latency and its NIC serialization), a constant of the
        configuration and never more than the real fill. The mirror of dp_release_s for
        the gather (the staggered gather: PerfModel.step, gather_staggered_s)."""
        if not any(self.dp_release_s(cfg)):
            return (0.0,) * cfg.pp
        return self._rank_offsets(cfg, "fwd")

    def chain_offsets_s(self, cfg: Config, chain: Chain, phase: str) -> tuple[float, ...]:
        """Per stage k, what `chain`'s own pipeline puts between rank k and the chain's end
        (phase "bwd": the tail, the last backwards of ranks k - 1 .. 0 and the gradient
        messages into them) or its start (phase "fwd": the head, the first forwards of ranks
        0 .. k - 1 and the activation messages between them), uncontended, over the
        chain's own sites (a message across sites pays the shortest path's latency), each
        stage at its release group's first stage's value. A chain ending at T_c releases
        rank k's sync at T_c - tail_k at the latest and runs rank k's first forward at
        head_k at the earliest (PerfModel.step, the plan's release and fill); never below
        dp_release_s / dp_fill_s, which use the shortest message inside a site."""
        key = ("offsets", cfg, chain, phase)
        if key not in self._memo:
            self._memo[key] = self._rank_offsets(cfg, phase, chain)
        return self._memo[key]

    def dp_moments_s(
        self, cfg: Config, chains: list[Chain]
    ) -> tuple[dict[int, float], dict[int, float], float]:
        """The plan's release and first-forward moments (PerfModel.step): per stage k
        (its release group's first stage), the latest T_c - tail_c and T_c - head_c over
        `chains` (chain_offsets_s), and the latest T_c, with T_c each chain type's
        uncontended 1F1B time over shortest paths (chain_time). Group g's sync is exposed
        past its credit T_end - max (T_c - tail_c): the longest chain ends that long after
        the last of the group's ranks is done; its gather likewise past the first forward
        it delays most."""
        ends = {c: self.chain_time(cfg, c) for c in chains}
        rel = {
            k: max(t - self.chain_offsets_s(cfg, c, "bwd")[k] for c, t in ends.items())
            for k in range(cfg.pp)
        }
        fil = {
            k: max(t - self.chain_offsets_s(cfg, c, "fwd")[k] for c, t in ends.items())
            for k in range(cfg.pp)
        }
        return rel, fil, max(ends.values())

    def dp_pair_routed(self, a: str, b: str) -> bool:
        """Whether the formulations split the pair's traffic over several candidate paths
        (a flow per path, summed over stages: a release group's load on a route is the
        smaller of its stages' demand and the flow, step; placer.optimize.data.routed)."""
        key = ("routed", *route_key(a, b))
        if key not in self._memo:
            k = self.problem.instance.solver.paths_per_pair
            self._memo[key] = len(self.net.candidate_paths(*route_key(a, b), k)) >= 2
        return self._memo[key]

    def any_dp_pair_routed(self) -> bool:
        """Whether some connected site pair of the instance has several candidate paths
        (dp_pair_routed): each stage's routes are then its own, at its release group's
        load, and a group's NIC phase has no routes after it (step)."""
        if ("any_routed",) not in self._memo:
            sites = [s.name for s in self.problem.instance.sites]
            self._memo[("any_routed",)] = any(
                self.net.path(a, b) is not None and self.dp_pair_routed(a, b)
                for i, a in enumerate(sites)
                for b in sites[i + 1 :]
            )
        return self._memo[("any_routed",)]

    def dp_staggered(self, cfg: Config) -> tuple[bool, ...]:
        """Per dp_pieces piece, whether its WAN phase is the staggered one (each stage's
        from its backward's end, dp_release_s): all but ZeRO-1's parameter all-gather
        under --overlap-param-gather, which every rank starts with the step (placer.sim),
        each rank's exposed past its own first forward (dp_fill_s: the staggered gather,
        PerfModel.step). Without that overlap the gather follows each rank's own
        optimizer step, itself after that rank's reduce: staggered too."""
        return tuple(
            not (cfg.zero1 and cfg.overlap_param_gather and i == 1)
            for i, (pieces, _) in enumerate(self._dp_halves(cfg))
            for _ in pieces
        )

    def dp_credit_scale(self, cfg: Config) -> tuple[int, int]:
        """(sync, gather): what the staggered sync's and the staggered gather's credits are
        multiplied by inside sync_staggered_s and gather_staggered_s, 1 / F with F the
        fraction of the sync that runs as one sequence from that moment: the pieces that
        dp_staggered marks (each rank's reduce, then, without --overlap-param-gather, its
        optimizer step and gather), or the others (ZeRO-1's overlapped gather, from the
        step's start).

        The exposed part of a piece is f (S + R lat) - w (dp_pieces), with S the group's
        work less its credit. A sequence of fraction F released c before the pipeline's end
        ends c + ... earlier, its whole credit, but F S takes only F c of it: with ZeRO-1's
        reduce-scatter under the backward and its gather under the forward (F = 1/2 each),
        half of each credit was lost (benchmarks/README.md, branch credit: up to +39% over
        placer.sim). So S carries c / F. Where one sequence holds every piece (F = 1) nothing
        changes. F is 1 or 1/2 (dp_pieces' halves), so the scale is an integer, which
        CP-SAT's rows need."""
        fs = [f for f, _ in self.dp_pieces(cfg)]
        stag = self.dp_staggered(cfg)
        out = []
        for mark in (True, False):
            total = sum(f for f, st in zip(fs, stag, strict=True) if st is mark)
            scale = round(1 / total) if total > 0 else 1
            if total > 0 and abs(scale * total - 1) > 1e-9:
                raise ValueError(f"a sync sequence of fraction {total}: no integer credit scale")
            out.append(scale)
        return out[0], out[1]

    def dp_exposed_s(self, cfg: Config, sync_s: float, lat_s: float = 0.0) -> float:
        """The exposed part of a per-step sync of `sync_s` whose collectives each pay
        `lat_s` of latency (the WAN phase's, PerfModel.step; 0: only the sync once)."""
        return compute.dp_exposed_s(sync_s, self.dp_pieces(cfg), lat_s, self.dp_lat_repeats(cfg))

    # ------------------------------------------------------------------ per chain

    def boundary(
        self, cfg: Config, a: str, b: str, fiber_s: float | None = None
    ) -> tuple[float, float]:
        """(latency, transmit) of one pipeline message from a stage at site a to site b;
        `fiber_s` is the one-way latency of the path used (default: the shortest)."""
        gpu_a, gpu_b = self.site_gpu(a), self.site_gpu(b)
        nic = min(self.nic_Bps(gpu_a), self.nic_Bps(gpu_b)) * cfg.width
        transmit = self.message_bytes(cfg) / nic
        # crossing sites adds the fiber path to the fabric hop every message makes
        if a == b:
            fiber_s = 0.0
        elif fiber_s is None:
            fiber_s = self.net.path_latency_s(a, b)
        return self.catalog.network.intra_site_latency_s + fiber_s, transmit

    def chain_time(
        self,
        cfg: Config,
        chain: Chain,
        with_comm: bool = True,
        routing: Routing | None = None,
        tick_s: dict[Hop, float] | None = None,
    ) -> float:
        """1F1B (interleaved for v > 1) time of one replica chain; its cross-site
        boundaries pay the latency of the slowest path the routing uses for that pair
        (default: shortest paths) and, given the routes' lockstep tick times `tick_s`
        (route_tick_s), a transmit time of at least the busiest route's tick on those
        paths."""
        v, dual = cfg.virtual_stages, cfg.dualpipev
        lats = self.boundary_latencies(chain, routing, v, dual) if routing else None
        ticks = self.boundary_ticks(chain, routing, tick_s, v, dual) if tick_s else None
        queues = self.boundary_queues(chain, routing, v, dual) if with_comm else None
        return self._chain_time(cfg, chain, with_comm, lats, ticks, queues)

    def _shared_hops(self, routing: Routing | None, a: str, b: str) -> frozenset[Hop]:
        """The hops every message of the pair's pipeline traffic from a to b travels: on
        every path the routing lists for it and on every candidate path the formulations
        may route it over (solver.paths_per_pair), so that the rule does not depend on a
        formulation's routing decision (on one-path pairs: the path's hops)."""
        if a == b:
            return frozenset()
        memo = self.net._memo
        k = self.problem.instance.solver.paths_per_pair
        if ("common", a, b, k) not in memo:
            cands = self.net.candidate_paths(a, b, k)
            hops = [set(hops_of(c, a)) for c in cands]
            memo[("common", a, b, k)] = frozenset(set.intersection(*hops)) if hops else frozenset()
        common: frozenset[Hop] = memo[("common", a, b, k)]  # type: ignore[assignment]
        for use in self.net.pair_paths(routing, "pipeline", a, b) or ():
            common = common & frozenset(hops_of(use.path, a))
        return common

    def boundary_queues(
        self, chain: Chain, routing: Routing | None = None, v: int = 1, dual: bool = False
    ) -> tuple[tuple[int, int], ...] | None:
        """Per physical boundary, the FIFO its activations and its gradients wait in
        (placer.perf.critical_path's `queues`); None when every direction of every
        boundary has its own.

        A route direction is one transmit queue: two boundaries of a chain whose messages
        travel a common hop (boundary j's activations and boundary j''s gradients both
        going s2 -> s1, say, on a chain s0 -> s2 -> s2 -> s1 whose s0-s2 path runs through
        s1) cannot both have the route at once, so the later waits for the earlier, as in
        the flow-level simulation (placer.sim.job) where they share it. Each boundary's
        transmit time is the larger of its NIC serialization and its lockstep tick
        (route_tick_s); the later batch waits for the part of the earlier's above its NIC
        serialization (what the route adds; critical_path's `floor`), in the order the
        uncontended schedule sends them (queue_service). Measured against the simulation:
        benchmarks/README.md, branch `hops`. DualPipeV keeps its own FIFOs
        (placer.perf.dualpipe)."""
        if dual:
            return None
        fwd = tuple(self._shared_hops(routing, a, b) for a, b, _ in self.chain_boundaries(chain, v))
        if fwd not in self._queue_memo:
            self._queue_memo[fwd] = _hop_queues(fwd)
        return self._queue_memo[fwd]

    @staticmethod
    def chain_boundaries(
        chain: Chain, v: int = 1, dual: bool = False
    ) -> list[tuple[str, str, int]]:
        """The physical pipeline boundaries of a chain: (site of rank k, site of rank k + 1,
        message streams per direction). With v chunks per rank every boundary k -> k + 1
        carries v streams (chunk c's model stages c pp + k -> c pp + k + 1) and, for v > 1,
        the wrap from the last rank back to the first (c pp + pp - 1 -> (c + 1) pp) v - 1:
        the boundary order of placer.perf.critical_path. DualPipeV (`dual`): 2 streams per
        boundary (the V's way down and back up), no wrap (its turn stays on the last rank;
        placer.perf.dualpipe)."""
        if dual:
            return [(a, b, 2) for a, b in zip(chain, chain[1:], strict=False)]
        out = [(a, b, v) for a, b in zip(chain, chain[1:], strict=False)]
        if v > 1:
            out.append((chain[-1], chain[0], v - 1))
        return out

    def boundary_latencies(
        self, chain: Chain, routing: Routing | None, v: int = 1, dual: bool = False
    ) -> tuple[float, ...]:
        return tuple(
            self.net.pair_latency_s(routing, "pipeline", a, b)
            for a, b, _ in self.chain_boundaries(chain, v, dual)
        )

    def boundary_ticks(
        self,
        chain: Chain,
        routing: Routing | None,
        tick_s: dict[Hop, float],
        v: int = 1,
        dual: bool = False,
    ) -> tuple[float, ...]:
        """Per physical boundary of a chain: the busiest route's lockstep tick time, in the
        direction the boundary's activations travel, over every path the routing lists
        for the pair (a replica's message may take any of them); 0 inside a site."""
        out = []
        for a, b, _ in self.chain_boundaries(chain, v, dual):
            uses = self.net.pair_paths(routing, "pipeline", a, b) if a != b else None
            out.append(
                max(
                    (tick_s.get(h, 0.0) for u in uses or () for h in hops_of(u.path, a)),
                    default=0.0,
                )
            )
        return tuple(out)

    def chain_hops(
        self, chain: Chain, routing: Routing | None = None, v: int = 1, dual: bool = False
    ) -> dict[Hop, float]:
        """How many of a chain's boundary activations travel each route in each direction
        per tick (a hop (u, v) is the route u-v traversed from u to v; the gradients of the
        same boundaries travel the reverse hops at another moment of the tick): one per
        physical boundary (a rank sends one message per op, whatever its chunk). A pair the
        routing splits over several paths counts each of its message streams (v per
        boundary, v - 1 for the wrap) on both directions of every route of its listed
        paths, with its share: the split is one per pair in plans, not one per direction or
        stream, so this bounds the messages from above (exact for v = 1 on one path).
        DualPipeV (`dual`): an F&B op sends both its outputs at its end the same way (F0&B1
        up the ranks, F1&B0 down), one after the other through the direction's FIFO
        (placer.perf.dualpipe), so a replica still has one message at a time on the route
        (checked against the flow-level simulator, tests/test_dualpipev.py)."""
        out: dict[Hop, float] = defaultdict(float)
        for a, b, streams in self.chain_boundaries(chain, v, dual):
            if a == b:
                continue
            uses = self.net.pair_paths(routing, "pipeline", a, b) or ()
            split = routing is not None and ("pipeline", route_key(a, b)) in routing
            for use in uses:
                for x, y in hops_of(use.path, a):
                    if split:
                        out[(x, y)] += streams * use.share
                        out[(y, x)] += streams * use.share
                    else:
                        out[(x, y)] += use.share
        return dict(out)

    def chain_time_at(
        self,
        cfg: Config,
        chain: Chain,
        lats: tuple[float, ...],
        ticks: tuple[float, ...] | None = None,
    ) -> float:
        """Chain time with given one-way fiber latencies (and lockstep route tick times)
        per physical boundary (chain_boundaries: pp - 1 of them, pp with the wrap for
        v > 1)."""
        queues = self.boundary_queues(chain, None, cfg.virtual_stages, cfg.dualpipev)
        return self._chain_time(cfg, chain, True, lats, ticks, queues)

    def chain_times_at(
        self,
        cfg: Config,
        chain: Chain,
        lats: tuple[float, ...] | None,
        ticks: tuple[float, ...] | None,
    ) -> tuple[list[float], list[float], list[float], list[float]]:
        """(fwd, bwd, latency, transmit) of a chain's schedule: the times of its v pp model
        stages on each rank's site GPU, and per physical boundary the fabric hop plus the
        fiber path, and the larger of the message's NIC serialization and its route's
        lockstep tick."""
        v, inst = cfg.virtual_stages, self.problem.instance
        fwd, bwd, lat, tx = [], [], [], []
        for s in range(cfg.model_stages):
            st = self.chunk_times(cfg, inst.site(chain[cfg.stage_rank(s)]).gpu)[s]
            fwd.append(st.fwd)
            bwd.append(st.bwd)
        for j, (a, b, _) in enumerate(self.chain_boundaries(chain, v, cfg.dualpipev)):
            fiber = lats[j] if lats is not None else None
            la, t = self.boundary(cfg, a, b, fiber)
            lat.append(la)
            tx.append(max(t, ticks[j]) if ticks is not None else t)
        return fwd, bwd, lat, tx

    def _chain_time_uncached(
        self,
        cfg: Config,
        chain: Chain,
        with_comm: bool,
        lats: tuple[float, ...] | None,
        ticks: tuple[float, ...] | None = None,
        queues: tuple[tuple[int, int], ...] | None = None,
    ) -> float:
        fwd, bwd, lat, tx = self.chain_times_at(cfg, chain, lats, ticks)
        if not with_comm:
            lat, tx = [0.0] * len(lat), [0.0] * len(tx)
        if any(math.isinf(x) for x in lat + tx):
            return math.inf
        m, v = cfg.num_micro_batches, cfg.virtual_stages
        if cfg.dualpipev:
            if m < 2 * cfg.pp:
                return math.inf  # no DualPipeV schedule (the evaluator names the violation)
            wgt = self.chain_weight_grads(cfg, chain)
            pipe = dualpipev_path(fwd, bwd, wgt, lat, tx, m).makespan_s
            return pipe + self.optimizer_step_s(cfg, chain)
        if v > 1 and m % cfg.pp:
            return math.inf  # no interleaved schedule (the evaluator names the violation)
        if v == 1 and queues is None:
            pipe = one_f_one_b_time(fwd, bwd, lat, tx, m)
        else:
            service, nic = self.queue_service(cfg, chain, queues)
            pipe = critical_path(fwd, bwd, lat, tx, m, v, queues, service, nic).makespan_s
        return pipe + self.optimizer_step_s(cfg, chain)

    def queue_service(
        self, cfg: Config, chain: Chain, queues: tuple[tuple[int, int], ...] | None
    ) -> tuple[dict | None, list[float] | None]:
        """The service order of a chain's shared FIFOs (critical_path.service_order) and
        its boundaries' NIC serialization (critical_path's `floor`): the order its
        uncontended schedule (shortest paths, NIC serialization) sends them, one per chain
        type, so the formulations' planes and the evaluator read one DAG; (None, None)
        where nothing is shared."""
        if queues is None:
            return None, None
        key = (cfg, chain, queues)
        memo = self._service_memo
        if key not in memo:
            fwd, bwd, lat, nic = self.chain_times_at(cfg, chain, None, None)
            m, v = cfg.num_micro_batches, cfg.virtual_stages
            memo[key] = (service_order(fwd, bwd, lat, nic, m, v, queues), nic)
        return memo[key]

    def chain_weight_grads(self, cfg: Config, chain: Chain) -> list[float]:
        """Per model stage of a chain, the weight-gradient part W of its backward
        (weight_grad_s) on its rank's GPU: DualPipeV's zero-bubble I / W split."""
        inst = self.problem.instance
        return [
            weight_grad_s(self.chunk_times(cfg, inst.site(chain[cfg.stage_rank(s)]).gpu)[s])
            for s in range(cfg.model_stages)
        ]

    def schedule_path(
        self,
        cfg: Config,
        chain: Chain,
        fwd: list[float],
        bwd: list[float],
        lat: list[float],
        tx: list[float],
    ) -> CriticalPath:
        """The critical path of the configuration's schedule on these times (1F1B,
        interleaved, DualPipeV: the chain gives DualPipeV's W times)."""
        m, v = cfg.num_micro_batches, cfg.virtual_stages
        if cfg.dualpipev:
            return dualpipev_path(fwd, bwd, self.chain_weight_grads(cfg, chain), lat, tx, m)
        queues = self.boundary_queues(chain, None, v)
        service, nic = self.queue_service(cfg, chain, queues)
        return critical_path(fwd, bwd, lat, tx, m, v, queues, service, nic)

    def message_floor(self, cfg: Config, sites: set[str] | list[str]) -> tuple[float, float]:
        """(latency, transmit) no pipeline message of a chain over `sites` is below: every
        message pays the fabric hop (boundary: plus the fiber path between sites) and its
        serialization at the slower NIC of its two sites (with lockstep contention at
        least that), so at least the fabric latency and the serialization at the fastest
        NIC of the sites."""
        lat = self.catalog.network.intra_site_latency_s
        return lat, min(self.boundary(cfg, x, x)[1] for x in sorted(sites))

    def pipeline_lower_bound(self, cfg: Config, chains: list[Chain]) -> float:
        """A bound no chain beats: every stage on the fastest GPU any chain gives it, and
        every pipeline message at message_floor. Valid because the 1F1B makespan is
        non-decreasing in every stage and boundary time (it is a max-plus expression of
        them: placer.perf.critical_path)."""
        inst = self.problem.instance
        v = cfg.virtual_stages
        # the GPU types that may run each rank (a stage's time reads only its site's GPU)
        kinds = [sorted({inst.site(c[k]).gpu for c in chains}) for k in range(cfg.pp)]
        times = {g: self.chunk_times(cfg, g) for g in sorted(set().union(*kinds))}
        fwd, bwd, wgt = [], [], []
        for s in range(cfg.model_stages):
            options = [times[g][s] for g in kinds[cfg.stage_rank(s)]]
            fwd.append(min(t.fwd for t in options))
            if cfg.dualpipev:  # monotone in F, I and W (not in B with W): each at its least
                w = min(weight_grad_s(t) for t in options)
                wgt.append(w)
                bwd.append(w + min(t.bwd - weight_grad_s(t) for t in options))
            else:
                bwd.append(min(t.bwd for t in options))
        n_bound = cfg.pp - 1 if v == 1 or cfg.dualpipev else cfg.pp
        lat_f, tx_f = self.message_floor(cfg, {x for c in chains for x in c})
        lat, tx = [lat_f] * n_bound, [tx_f] * n_bound
        shard = cfg.optimizer_shard_over_dp
        opt = (
            max(min(self.stage_times(cfg, g)[k].optimizer for g in kinds[k]) for k in range(cfg.pp))
            / shard
        )
        m = cfg.num_micro_batches
        if cfg.dualpipev:
            if m < 2 * cfg.pp:
                return math.inf
            return dualpipev_path(fwd, bwd, wgt, lat, tx, m).makespan_s + opt
        if v == 1:
            return one_f_one_b_time(fwd, bwd, lat, tx, m) + opt
        if m % cfg.pp:
            return math.inf
        return critical_path(fwd, bwd, lat, tx, m, v).makespan_s + opt

    def chain_crossings(
        self, chain: Chain, routing: Routing | None = None, v: int = 1, dual: bool = False
    ) -> dict[RouteKey, float]:
        """How many pipeline message streams of one chain use each route (chain_boundaries:
        v per boundary, v - 1 for the wrap; fractions when the routing splits a pair over
        several paths). Each stream puts pp_bytes_per_crossing on each direction."""
        out: dict[RouteKey, float] = defaultdict(float)
        for a, b, n in self.chain_boundaries(chain, v, dual):
            if a != b:
                for use in self.net.pair_paths(routing, "pipeline", a, b) or ():
                    for key in use.path.routes:
                        out[key] += n * use.share
        return dict(out)

    @staticmethod
    def crossing_pairs(chain: Chain, v: int = 1, dual: bool = False) -> list[PairKey]:
        """The site pairs a chain's pipeline message streams cross, in chain order, a pair
        once per stream (chain_boundaries: v times per cross-site boundary, v - 1 times
        for a cross-site wrap; once per boundary for v = 1)."""
        return [
            route_key(a, b)
            for a, b, n in PerfModel.chain_boundaries(chain, v, dual)
            if a != b
            for _ in range(n)
        ]

    def route_tick_s(
        self,
        cfg: Config,
        groups: list[tuple[int, Chain]],
        capacity_Bps: dict[RouteKey, float],
        routing: Routing | None = None,
        factor: dict[RouteKey, float] | None = None,
    ) -> dict[Hop, float]:
        """Seconds the activations of one pipeline tick occupy each route, per direction.

        Lockstep 1F1B (Megatron's synchronous schedule, every replica at the same tick):
        every replica's boundary puts its activation on the routes of its path at the same
        moment of every tick (and its gradient on the reverse hops at another), so a hop
        carries count x hops x message bytes at once, shared max-min fairly: every message
        on it finishes after that many bytes over the route's capacity (times a failure's
        `factor`). Staggered replicas (job.replica_schedule) time-share the routes
        instead: no per-tick term, only the step-average route time binds."""
        if cfg.staggered:
            return {}
        factor = factor or {}
        msg = self.message_bytes(cfg)
        load: dict[Hop, float] = defaultdict(float)
        for count, chain in groups:
            for hop, n in self.chain_hops(
                chain, routing, cfg.virtual_stages, cfg.dualpipev
            ).items():
                load[hop] += count * n * msg
        out = {}
        for (u, v), x in load.items():
            key = route_key(u, v)
            out[(u, v)] = _div(x, capacity_Bps.get(key, 0.0)) * factor.get(key, 1.0)
        return out

    def pp_bytes_per_crossing(self, cfg: Config) -> float:
        """Bytes one message stream crossing a route puts on each direction of it per step
        (one message per micro-batch; a boundary carries v streams, chain_crossings)."""
        return cfg.num_micro_batches * self.message_bytes(cfg)

    # ------------------------------------------------------------------ data parallel

    def _stage_split(self, cfg: Config, k: int) -> tuple[int, int]:
        """(dense, routed-expert) parameters of stage k (DualPipeV: of rank k's two model
        stages, k and 2 pp - 1 - k, the embedding and the LM head both on rank 0)."""
        if cfg.dualpipev:
            layers, n = cfg.chunk_layers, cfg.model_stages
            dense = experts = 0
            for s in cfg.rank_stages(k):
                first = sum(layers[:s])
                total = stage_params(self.model, layers[s], s == 0, s == n - 1, first)
                e = expert_layer_params(self.model, first, layers[s])
                dense, experts = dense + total - e, experts + e
            return dense, experts
        first = sum(cfg.stage_layers[:k])
        n = stage_params(self.model, cfg.stage_layers[k], k == 0, k == cfg.pp - 1, first)
        e = expert_layer_params(self.model, first, cfg.stage_layers[k])
        return n - e, e

    def stage_grad_bytes(self, cfg: Config, k: int) -> float:
        """Gradient bytes of stage k per GPU (bf16): dense / tp + routed experts / (ep etp)."""
        dense, experts = self._stage_split(cfg, k)
        return (dense / cfg.tp + experts / (cfg.ep * cfg.expert_tp)) * BYTES_BF16

    def stage_wan_bytes(self, cfg: Config, k: int) -> float:
        """S_k: the full stage's gradient (all tp ranks) at the sync's bits per value."""
        dense, experts = self._stage_split(cfg, k)
        return (dense + experts) * cfg.sync_bits / 8

    def intra_sync_s(self, cfg: Config, k: int, site: str, members: int | None = None) -> float:
        """The NIC phases of stage k's data-parallel sync for a member at `site`,
        hierarchical inside the site as NCCL runs it: Megatron's rank order puts the dp
        ranks of a stage on consecutive TP groups, so q = min(dp, node / tp) of them share
        a scale-up domain. They all-reduce over NVLink (reduce-scatter + all-gather), and
        the node groups all-reduce their 1/q shards over the NICs: 2 (d/q - 1)/(d/q) G/q
        through each member's NIC (with q = 1, the flat ring's 2 (d-1)/d G). The WAN phase
        of the sync is charged on top, by route.

        `members`: the site's replica count of stage k (None: d in whole nodes). Where
        node_fill applies, its NIC bandwidth term is scaled by node_fill(members): a site
        whose count leaves a node with r < q members has that node's q shard rings on its
        r NICs, ceil(q / r) each (NCCL's rings enter and leave every node once whatever its
        member count: NVIDIA/nccl#687, #569), and its ring is the site's own: ceil(members /
        q) nodes (NCCL's hierarchical all-reduce rings each site's nodes: placer.sim), its
        (N - 1)/N and 2 (N - 1) hop latencies those of N. A site whose members fit one node
        (N = 1) has no NIC phase, as in the simulation; what its few NICs carry is the WAN
        phase's, priced there (wan_nic_s; before that term, such a site kept the ring over
        ceil(d / q) nodes at the fill as a stand-in). Without members
        (or where node_fill does not apply: q = 1, CP, EP, HSDP) the ring is ceil(d / q)
        nodes of all d replicas (pessimistic for a site with fewer, and standing in for
        the WAN phase's NIC term, which is 0 there; with d <= q there is no NIC phase).
        Both formulations encode the count by a one-hot over the site's node count and
        its remainder (milp._define_node_fill).

        With CP and EP the dense gradients are reduced over the dp x cp x ep ranks that
        hold the same tp slice (at stride tp), the routed experts' over the dp x tp x cp
        ranks that hold the same experts (at stride ep, expert TP 1): two such all-reduces,
        one after the other."""
        gpu = self.site_gpu(site)
        dense, experts = self._stage_split(cfg, k)
        gpn = self.site_gpus_per_node(site)
        lat = self.catalog.network.intra_site_latency_s
        out = 0.0
        if cfg.dp_shard > 1:
            # HSDP: the shard group reduce-scattered inside the replica (stage times); the
            # replicate group all-reduces each rank's 1/(dp_shard cp) shard in fp32 over the
            # dp replicas, whose same-shard ranks sit `width` apart
            shard = (dense + experts) / cfg.tp / (cfg.dp_shard * cfg.cp) * FSDP_REDUCE_BYTES
            q = max(1, min(cfg.dp, gpn // cfg.width))
            out += comm.ring_allreduce_s(q, shard, self.nvlink_Bps(gpu))
            out += comm.ring_allreduce_s(math.ceil(cfg.dp / q), shard / q, self.nic_Bps(gpu), lat)
            return out
        fill = 1.0
        fill_site = members is not None and self.node_fill_q(cfg, site) > 0
        if fill_site:
            fill = node_fill(members, self.node_fill_q(cfg, site))
        # dense over dp x cp x ranks_per_replica (dp x cp x ep unfolded) at stride tp; experts
        # over dp x expert_dp_per_replica (dp x tp x cp unfolded) at stride ep x etp
        dense_n = cfg.dp * cfg.cp * cfg.ranks_per_replica
        parts = [(dense / cfg.tp * BYTES_BF16, dense_n, cfg.tp)]
        if experts:
            e_shard = experts / (cfg.ep * cfg.expert_tp) * BYTES_BF16
            parts.append((e_shard, cfg.dp * cfg.expert_dp_per_replica, cfg.ep * cfg.expert_tp))
        for g, n, stride in parts:
            q = max(1, min(n, gpn // stride))
            out += comm.ring_allreduce_s(q, g, self.nvlink_Bps(gpu))
            nodes = math.ceil(n / q)
            if fill_site:
                nodes = self.site_ring_nodes(members * (n // cfg.dp), q)
            if fill == 1.0:
                out += comm.ring_allreduce_s(nodes, g / q, self.nic_Bps(gpu), lat)
            elif nodes > 1:
                # ring_allreduce_s's bandwidth term scaled by the fill, its hop latencies not
                out += fill * comm.ring_allreduce_s(nodes, g / q, self.nic_Bps(gpu))
                out += comm.ring_allreduce_s(nodes, 0.0, self.nic_Bps(gpu), lat)
        return out

    def wan_nic_coef_s(self, cfg: Config, k: int, site: str) -> float:
        """c_{k,s}: 2 S_k over one member's NICs at `site` (its `width` GPUs' NICs), the
        seconds of stage k's two WAN rounds if one member carried all of them; wan_nic_s
        divides it by the site's member count and scales it by (K - 1)/K. 0 where the
        site's NIC ring is not its own (node_fill_q 0: q = 1, CP, EP, HSDP): that ring
        spans all d replicas' nodes (intra_sync_s), whose bandwidth term covers the WAN
        leg's NICs too (2 (d - 1)/d G against the site ring's plus this term's, equal
        for balanced sites), so charging both would count those NICs twice."""
        if self.node_fill_q(cfg, site) == 0:
            return 0.0
        return 2 * self.stage_wan_bytes(cfg, k) / (cfg.width * self.nic_Bps(self.site_gpu(site)))

    def wan_nic_s(self, cfg: Config, k: int, hosts: dict[str, int]) -> float:
        """The NIC term of stage k's WAN phase, (K - 1)/K c_{k,s} / n_s at the slowest of its
        K hosting sites (0 where one site hosts it). In each of the two WAN rounds a site
        sends the other K - 1 sites their (K - 1)/K of its reduced shard S_k and receives
        as much, through its n_s members' NICs, 1/n_s each (placer.sim: every member of a
        hosting site sends and receives its share through its own NICs); the routes carry
        the same bytes (their term, by route), and the phase's bandwidth time is the larger
        of the two. It is what a site with few members of a stage pays: one member with
        tp 2 syncing over 766 km took 5.3 ms on its NICs against the route's 1.19 ms
        (benchmarks/README.md, branch nic)."""
        K = len(hosts)
        if K < 2:
            return 0.0
        return max((K - 1) / K * self.wan_nic_coef_s(cfg, k, s) / n for s, n in hosts.items())

    @staticmethod
    def site_ring_nodes(site_ranks: int, q: int) -> int:
        """The nodes of a site's NIC ring (intra_sync_s, where node_fill applies): the
        site's own ceil(site_ranks / q) (NCCL rings each site's nodes: placer.sim); one
        node has no NIC phase (its WAN shard is the WAN phase's NIC term, wan_nic_s)."""
        return math.ceil(site_ranks / q)

    def node_fill_q(self, cfg: Config, site: str) -> int:
        """Replicas of a stage per node at `site` where the NIC phase depends on the site's
        member count (intra_sync_s), 0 where it does not: with CP, EP or HSDP a stage's
        sync groups span more than the replicas (one coefficient per stage, as before);
        with one replica a node (q = 1) no node is part-filled. A folded expert layout
        (etp set) is a replica stage wider than tp: one coefficient too."""
        if cfg.cp > 1 or cfg.ep > 1 or cfg.dp_shard > 1 or cfg.etp is not None or cfg.dp < 2:
            return 0
        q = self.dp_per_node(cfg, site)
        return q if q >= 2 else 0

    def site_gpus_per_node(self, site: str) -> int:
        s = self.problem.instance.site(site)
        return s.gpus_per_node or self.catalog.gpus[s.gpu].gpus_per_node

    def dp_per_node(self, cfg: Config, site: str) -> int:
        """Data-parallel members of one stage that share a scale-up (NVLink) domain."""
        return max(1, min(cfg.dp, self.site_gpus_per_node(site) // cfg.tp))

    # ------------------------------------------------------------------ whole step

    def step(
        self,
        cfg: Config,
        groups: list[tuple[int, Chain]],
        waves: dict[RouteKey, int],
        optics: dict[RouteKey, str | None] | None = None,
        pp_route_factor: dict[RouteKey, float] | None = None,
        dp_route_factor: dict[RouteKey, float] | None = None,
        intra_factor: float = 1.0,
        routing: Routing | None = None,
        stagger: bool = True,
    ) -> StepResult:
        """Step time of a placement. The factors price failures (placer.resilience): a
        route's pipeline or data-parallel time is multiplied by its factor, the intra-site
        sync and the WAN phase's NIC term (wan_nic_s) by `intra_factor` (a lost NIC).
        `routing` splits pairs' traffic over paths (placer.network); pairs it does not
        list use their shortest path. `stagger` False prices every
        stage's WAN exchange at once (failure scenarios: the formulations' survival rows
        are written that way, pessimistic).

        The staggered sync (sync_staggered_s, the pieces dp_staggered marks) is, per
        release group g of dp_release_s (delta_g; the stages released at or after T_pipe -
        delta_g), its work W_g less its credit: max over g of (W_g - credit_g). W_g is the
        longest of (a) the group's longest NIC phase
        I_g in series with U_g, its busiest route's load; (b) for each stage k of the group
        synced across sites, its own NIC phase I_k, its pairs' two one-way latencies L_k
        and its latency repeats (dp_stage_repeats) in series with U_g; and (c) for each
        such stage, I_k, L_k, its repeats and its NIC term N_k in series (wan_nic_s: a
        site with few members sends its shard through their NICs). Each stage's NIC phase,
        WAN rounds and repeats run on its own ranks one after the other (placer.sim), so
        (b) and (c) take them from one stage, and a stage synced inside its sites has no
        WAN round (a). Before, (a) was the group's longest NIC phase, the slowest pair's
        latency and the largest repeats in series, from up to three stages: a stage synced
        inside a site whose NIC phase is the longest paid another's latency and repeats
        (+28% against placer.sim; benchmarks/README.md, "Each stage's own series"); and
        before that the group's longest NIC phase and longest NIC term in series (max I +
        max L + max(N, U), up to +25%: branch series). The routes carry every stage's bytes,
        so they stay in series with each stage's own part (pessimistic). With a flow-routed
        pair (any_dp_pair_routed) (a) has no U_g, (c) is below (b), and a stage's latency
        is that of the slowest path its pairs' flows use; in (b) a stage's routes are its
        own, the busiest route its pairs' paths use, at the group's load (every stage's for
        the gathers, which all start with the step; a flow-routed pair's group load the
        smaller of its group demand and its flow on the route, the simulation's
        proportional share unless the pair splits; before, every stage's load in every
        group: +14% against placer.sim, "Each release group's routes with a flow-routed
        pair"), or its own NIC term (stage_bw:
        before, the whole WAN phase's busiest route, which a stage's flows need not touch:
        up to +23% against placer.sim; benchmarks/README.md, "Each stage's own routes"),
        and (a) is the group's longest NIC phase alone, each stage's WAN rounds being (b)
        on its own ranks' NICs (before, every stage's NIC term in (b) and the whole WAN
        phase after the NIC phase in (a): a stage with a lone member at a site, whose one
        NIC carries the site's shard, slowed every stage's sync, up to +22% against
        placer.sim; benchmarks/README.md, "Each stage's own NIC term").
        credit_g = T_end - max over the chain types in use of (T_c -
        tail_c,g) (dp_moments_s; before, delta_g, the
        shortest drain with messages inside a site: a chain whose drain crosses the fiber
        is done with the group's ranks a one-way latency or more earlier, and a chain that
        ends T_end - T_c before the longest is done that much earlier still;
        benchmarks/README.md, branch moments). ZeRO-1's overlapped gather likewise past
        T_end - max (T_c - head_c,g), its first forward against the chain's slack; the
        gathers all start with the step and share the routes (placer.sim: max-min fair),
        so the rank needed first waits for every rank's bytes: a group's gather work counts
        every stage's load on each route its own stages sync over (before, its own
        stages': optimistic by up to 8% against placer.sim once the credits below were
        whole; benchmarks/README.md, branch credit). Each credit is multiplied by
        dp_credit_scale (1 / the fraction of the sync that runs as one sequence from that
        moment: 2 for ZeRO-1's overlapped reduce-scatter and gather), since the pieces take
        f of S and a sequence gains its whole head start (before, half of it: up to +39%).
        The latency is the group's
        own because a stage synced inside one site has no WAN round: charged every group,
        the slowest split stage's latency fell on the stages that end last, synced inside
        their sites (benchmarks/README.md, branch glat). Megatron reduces each pipeline
        rank's gradients as soon as that rank's backward is done, with no barrier across
        ranks (megatron/core/pipeline_parallel/schedules.py: each rank's
        forward_backward_func ends in its own
        config.finalize_model_grads_func, finalize_model_grads.py calling its chunks'
        finish_grad_sync; under --overlap-grad-reduce its bucket hooks start earlier still),
        and placer.sim starts each stage's sync, NIC phase included, at its own release
        (_Job._stage_sync): the LM-head stage, released first, often has the longest
        NIC phase and runs it under the drain, where charging the slowest stage's NIC
        phase after T_pipe (max_k intra_k + the WAN phase) was pessimistic
        (benchmarks/README.md, branch ovl3, item 2). Each term is at least its group's
        slowest NIC phase from the group's release, then the group's routes in series
        (pessimistic: the simulation overlaps one stage's NIC phase with another's WAN
        rounds), and never more than the charge it replaces (I_g <= t_intra). Applied
        inside one site too (no WAN term), so that a free WAN prices as one site does
        (tests/test_solver_properties.py test_free_wan_equals_one_site)."""
        net = self.net
        optics = optics or {}
        ppf, dpf = pp_route_factor or {}, dp_route_factor or {}
        # pipeline: the routes' activation load, their lockstep tick, the slowest chain
        pp_load: dict[RouteKey, float] = defaultdict(float)
        unreachable: list[tuple[str, str]] = []
        for count, chain in groups:
            for a, b, _ in self.chain_boundaries(chain, cfg.virtual_stages, cfg.dualpipev):
                if a != b and net.path(a, b) is None:
                    unreachable.append((a, b))
            for key, n in self.chain_crossings(
                chain, routing, cfg.virtual_stages, cfg.dualpipev
            ).items():
                pp_load[key] += count * n * self.pp_bytes_per_crossing(cfg)
        cap = {key: net.capacity_Bps(key, waves.get(key, 0), optics.get(key)) for key in net.routes}
        route_pp_s = {
            k: _div(v, cap[k]) * ppf.get(k, 1.0) if v > 0 else 0.0 for k, v in pp_load.items()
        }
        tick_s = self.route_tick_s(cfg, groups, cap, routing, ppf)
        chain_t = {
            c: self.chain_time(cfg, c, routing=routing, tick_s=tick_s or None) for _, c in groups
        }
        crit = max(chain_t, key=lambda c: (chain_t[c], c))
        t_pipe = max([chain_t[crit], *route_pp_s.values()])

        # data parallel: hierarchical per stage
        hosts: list[dict[str, int]] = [defaultdict(int) for _ in range(cfg.pp)]
        for count, chain in groups:
            for k, site in enumerate(chain):
                hosts[k][site] += count
        t_intra = 0.0
        dp_load: dict[RouteKey, float] = defaultdict(float)
        wan_lat = 0.0
        # the staggered WAN phase (dp_release_s): per release group delta, the load of the
        # stages released at or after T_pipe - delta (on an instance with a flow-routed
        # pair, any_dp_pair_routed, each stage's own routes at its group's load: stage_bw)
        release = self.dp_release_s(cfg) if stagger else (0.0,) * cfg.pp
        wan_whole = self.any_dp_pair_routed()
        group_load: dict[float, dict[RouteKey, float]] = {
            g: defaultdict(float) for g in sorted(set(release))
        }
        # per release group, the longest NIC phase of the stages released at or after
        # T_pipe - delta (sync_staggered_s)
        group_intra: dict[float, float] = dict.fromkeys(group_load, 0.0)
        group_nic: dict[float, float] = dict.fromkeys(group_load, 0.0)
        wan_nic = 0.0
        # per stage synced over the WAN: its NIC phase + its pairs' latency + its NIC term,
        # in series on its own ranks (the per-stage series of each release group)
        stage_series: list[float | None] = [None] * cfg.pp
        # and its NIC phase + its pairs' latency: what comes before the routes' work on its
        # own ranks (the per-stage route terms of each release group)
        stage_route: list[float | None] = [None] * cfg.pp
        # per stage synced over the WAN: its latency repeats, R_k times its pairs' latency
        stage_reps = self.dp_stage_repeats(cfg)
        rep_lat = [0.0] * cfg.pp
        # and the routes its pairs' paths use (with a flow-routed pair, its route term is
        # the busiest of these at its release group's load, or the NIC term: stage_bw)
        stage_routes: list[set[RouteKey]] = [set() for _ in range(cfg.pp)]
        # and its own WAN NIC term (its hosting members' NICs carry its shard: wan_nic_s)
        stage_nic = [0.0] * cfg.pp
        # per site pair synced over the WAN: every stage's demand, per release group the
        # demand of its stages, and per route the share of the pair's bytes on it (a
        # plan's routing splits a pair's traffic alike for every stage)
        pair_demand: dict[tuple[str, str], float] = defaultdict(float)
        pair_group: dict[tuple[str, str], dict[float, float]] = defaultdict(
            lambda: defaultdict(float)
        )
        pair_share: dict[tuple[str, str], dict[RouteKey, float]] = {}
        for k in range(cfg.pp):
            h = hosts[k]
            intra_k = 0.0
            if cfg.dp >= 2:
                intra_k = max(self.intra_sync_s(cfg, k, s, members=n) for s, n in h.items())
                t_intra = max(t_intra, intra_k)
                for g in group_intra:
                    if release[k] <= g:
                        group_intra[g] = max(group_intra[g], intra_k)
            sites = sorted(h)
            if len(sites) >= 2:
                demand = 2 * self.stage_wan_bytes(cfg, k) / len(sites)
                nic_k = self.wan_nic_s(cfg, k, h)
                stage_lat = 0.0
                wan_nic = max(wan_nic, nic_k)
                for g in group_nic:
                    if release[k] <= g:
                        group_nic[g] = max(group_nic[g], nic_k)
                for i, a in enumerate(sites):
                    for b in sites[i + 1 :]:
                        uses = net.pair_paths(routing, "data_parallel", a, b)
                        if uses is None:
                            unreachable.append((a, b))
                            continue
                        pair_demand[(a, b)] += demand
                        for g in group_load:
                            if release[k] <= g:
                                pair_group[(a, b)][g] += demand
                        on: dict[RouteKey, float] = defaultdict(float)
                        for use in uses:
                            stage_routes[k].update(use.path.routes)
                            for key in use.path.routes:
                                dp_load[key] += demand * use.share
                                on[key] += use.share
                        pair_share[(a, b)] = on  # the same split for every stage
                        lat_ab = 2 * net.pair_latency_s(routing, "data_parallel", a, b)
                        wan_lat = max(wan_lat, lat_ab)
                        stage_lat = max(stage_lat, lat_ab)
                stage_series[k] = (intra_k + nic_k) * intra_factor + stage_lat
                stage_nic[k] = nic_k * intra_factor
                stage_route[k] = intra_k * intra_factor + stage_lat
                rep_lat[k] = stage_reps[k] * stage_lat
        # each release group's load on a route: per pair, its group's demand times the
        # pair's share on the route, as the simulation sends it, where the formulations
        # read min(the group's demand, the pair's flow on the route), equal unless a pair
        # splits over paths (then pessimistic: a proportional share is linear in neither
        # the flow nor the demand, which are both decisions; rows `dp.group_flow`)
        for q, on in pair_share.items():
            for key, sh in on.items():
                for g, dem_g in pair_group[q].items():
                    group_load[g][key] += min(dem_g, sh * pair_demand[q])
        route_dp_s = {
            k: _div(v, cap[k]) * dpf.get(k, 1.0) if v > 0 else 0.0 for k, v in dp_load.items()
        }
        if t_intra > 0:
            t_intra *= intra_factor
            group_intra = {g: v * intra_factor for g, v in group_intra.items()}
        # a lost NIC slows the WAN phase's NIC leg by the same factor: the hosting
        # members' NICs carry it (wan_nic_s)
        wan_nic *= intra_factor
        group_nic = {g: v * intra_factor for g, v in group_nic.items()}
        t_wan = (max(*route_dp_s.values(), wan_nic) + wan_lat) if route_dp_s else 0.0
        # each release group's routes' time (its busiest route), and its WAN bandwidth time:
        # that or its NIC term
        group_route = {
            g: max((_div(v, cap[r]) * dpf.get(r, 1.0) for r, v in load.items()), default=0.0)
            for g, load in group_load.items()
        }
        group_bw = {g: max(group_nic[g], group_route[g]) for g in group_load}

        # with a flow-routed pair, each stage's WAN bandwidth term per release group: the
        # busiest route its own pairs' paths use, at that group's load (every stage's for
        # the gathers, which all start with the step), or its own NIC term
        def stage_bw(k: int, g: float | None) -> float:
            load = dp_load if g is None else group_load[g]
            return max(
                [
                    stage_nic[k],
                    *(
                        _div(load[r], cap[r]) * dpf.get(r, 1.0)
                        for r in stage_routes[k]
                        if load.get(r, 0.0) > 0
                    ),
                ]
            )

        # each group's routes finish its stages' exchanges delta after T_pipe - delta at
        # the earliest (one work-conserving route: max over release times r of r + the work
        # released at or after r); delta 0 is the last stage group alone, the largest delta
        # every stage's
        t_wan_st = t_wan
        if route_dp_s and len(group_load) > 1:
            t_wan_st = wan_lat + max(
                0.0, max(group_bw[g] - g for g, load in group_load.items() if load)
            )
        # the staggered sync, NIC phases and WAN bandwidth (sync_staggered_s): per release
        # group its longest NIC phase in series with its routes' load, from T_pipe - delta;
        # one group (no stagger) is every stage's at once, t_intra + t_wan
        # and the overlapped parameter gather (the pieces dp_staggered does not mark):
        # every stage's from the step's start, each group's exposed past its first
        # forward (dp_fill_s), the same groups' work
        t_sync_st = t_gather_st = t_intra + t_wan
        # the latency repeats: one group (no stagger) charges every bucketed piece R lat,
        # the most buckets of any rank at the slowest pair's latency (dp_lat_repeats);
        # release groups charge their own largest R_k lat_k inside their work
        # (dp_stage_repeats), each sequence's share of it bucketed (dp_repeat_share)
        grouped = len(group_load) > 1 and not unreachable
        if grouped:
            # each group's work (per stage: each stage's NIC phase, latency and repeats
            # run on its own ranks, one after the other: placer.sim): the group's routes
            # in series with its longest NIC phase (a stage synced inside its sites has
            # no latency or repeats) or with a stage's NIC phase, latency and repeats, or
            # a stage's own NIC phase, latency, NIC term and repeats in series. With a
            # flow-routed pair (wan_whole) the group's longest NIC phase has no routes
            # after it: each stage's own routes or NIC term follow its own part (stage_bw)
            # (before: the group's longest NIC phase, the slowest pair's latency and the
            # largest repeats in series, from up to three stages: up to +28% against
            # placer.sim; benchmarks/README.md, "Each stage's own series")
            def group_work(g: float, route_s: float, share: float, gather: bool) -> float:
                ks = [k for k in range(cfg.pp) if stage_series[k] is not None and release[k] <= g]
                return max(
                    [
                        group_intra[g] + route_s,
                        *(
                            stage_route[k]
                            + share * rep_lat[k]
                            + (stage_bw(k, None if gather else g) if wan_whole else route_s)
                            for k in ks
                        ),
                        *(stage_series[k] + share * rep_lat[k] for k in ks),
                    ]
                )

            # ZeRO-1's overlapped gathers all start with the step and share the routes
            # (placer.sim: max-min fair), so the rank needed first waits for every rank's
            # bytes: each group's gather work counts every stage's routes (the last group's)
            every = group_load[max(group_load)]

            def gather_route(g: float) -> float:
                # the busiest route the group's stages use, with every stage's bytes
                return max(
                    (_div(every[r], cap[r]) * dpf.get(r, 1.0) for r in group_load[g]),
                    default=0.0,
                )

            # the plan's release and fill (chain_offsets_s): group g's sync starts when the
            # last of its first stage's ranks is done, at the latest T_c - tail_c over the
            # chain types in use, and its gather is exposed past the latest T_c - head_c
            # (a chain ending before the others has that much slack), each against the
            # longest chain; T_c the uncontended 1F1B time over shortest paths (a constant
            # per chain type, so that the formulations pin the longest exactly:
            # dp_moments_s)
            release_at, fill_at, t_end = self.dp_moments_s(cfg, [c for _, c in groups])
            # each group at its first stage's moments (release.index: its first stage)
            # each sequence's whole credit (dp_credit_scale: the pieces take F of S), and
            # its bucketed share of the latency repeats (dp_repeat_share)
            at_sync, at_gather = self.dp_credit_scale(cfg)
            rep_sync, rep_gather = self.dp_repeat_share(cfg)
            t_sync_st = max(
                group_work(g, 0.0 if wan_whole else group_route[g], rep_sync, False)
                + at_sync * (release_at[release.index(g)] - t_end)
                for g in group_load
            )
            t_gather_st = max(
                group_work(g, 0.0 if wan_whole else gather_route(g), rep_gather, True)
                + at_gather * (fill_at[release.index(g)] - t_end)
                for g in group_load
            )
        if unreachable:
            t_wan = t_wan_st = t_sync_st = t_gather_st = math.inf
        # the per-step sync hides partly under the backward / forward (dp_pieces); the
        # diloco outer exchange is a separate phase, streaming's overlaps the whole step
        t_dp_raw = t_intra + wan_part_s(cfg.sync_mode, cfg.every_steps, t_wan, t_pipe)
        if cfg.sync_mode == "synchronous":
            # every bucket's collective pays the WAN phase's latency (dp_lat_repeats); the
            # pieces of a staggered half see the staggered WAN phase (dp_staggered)
            pieces, reps = self.dp_pieces(cfg), self.dp_lat_repeats(cfg)
            lat_rep = 0.0 if grouped else wan_lat
            t_dp = sum(
                max(0.0, f * ((t_sync_st if st else t_gather_st) + r * lat_rep) - w)
                for (f, w), r, st in zip(pieces, reps, self.dp_staggered(cfg), strict=True)
            )
            t_dp_raw = sum(
                f * (t_sync_st if st else t_gather_st)
                for (f, _), st in zip(pieces, self.dp_staggered(cfg), strict=True)
            )
            t_dp_raw += lat_rep * sum(f * r for (f, _), r in zip(pieces, reps, strict=True))
        else:
            t_dp = self.dp_exposed_s(cfg, t_intra) + wan_part_s(
                cfg.sync_mode, cfg.every_steps, t_wan, t_pipe
            )
        total = t_pipe + t_dp

        # additive breakdown of the critical chain (CONTRACT: compute, bubble, tp, pp, dp);
        # the finer terms (matmul, memory-bound, optimizer, ...) split these further
        times = [
            self.stage_times(cfg, self.problem.instance.site(s).gpu)[k] for k, s in enumerate(crit)
        ]
        m = cfg.num_micro_batches
        slow = max(range(len(times)), key=lambda i: times[i].fwd_compute + times[i].bwd_compute)
        compute_s = m * (times[slow].fwd_compute + times[slow].bwd_compute)
        with_tp = m * max(t.fwd + t.bwd for t in times)
        opt = self.optimizer_step_s(cfg, crit)
        no_comm = self.chain_time(cfg, crit, with_comm=False)
        ops = times[slow].ops
        mem = m * ops.memory_bound if ops else 0.0
        widest = max(times, key=lambda t: t.fwd + t.bwd).ops
        ep_s = m * widest.ep_exposed if widest else 0.0
        cp_s = m * widest.cp_exposed if widest else 0.0
        fsdp_s = m * widest.fsdp_exposed if widest else 0.0
        host_s = m * widest.host_exposed if widest else 0.0
        breakdown = {
            "compute_s": compute_s - mem,  # GEMMs and the attention core
            "memory_bound_s": mem,
            "tp_comm_s": with_tp - compute_s - ep_s - cp_s - fsdp_s - host_s,  # exposed
            "bubble_s": no_comm - opt - with_tp,
            "pp_comm_s": t_pipe - no_comm,
            "dp_sync_s": t_dp,  # exposed
            "optimizer_s": opt,
        }
        hidden = {"tp_comm_s": m * ops.tp_hidden if ops else 0.0, "dp_sync_s": t_dp_raw - t_dp}
        if cfg.ep > 1:
            breakdown["ep_comm_s"] = ep_s  # MoE token all-to-all, exposed
            hidden["ep_comm_s"] = m * widest.ep_hidden if widest else 0.0
        if host_s > 0:
            breakdown["moe_host_s"] = host_s  # eager MoE layers: host launch stalls
        if cfg.cp > 1:
            breakdown["cp_comm_s"] = cp_s  # ring attention KV not hidden under attention
            hidden["cp_comm_s"] = m * widest.cp_hidden if widest else 0.0
        if cfg.dp_shard > 1:
            breakdown["fsdp_comm_s"] = fsdp_s  # per-layer all-gather / reduce-scatter, exposed
            hidden["fsdp_comm_s"] = m * widest.fsdp_hidden if widest else 0.0
        return StepResult(
            step_time_s=total,
            pipe_s=t_pipe,
            dp_s=t_dp,
            breakdown=breakdown,
            critical_chain=crit,
            hidden=hidden,
            route_pp_load=dict(pp_load),
            route_dp_load=dict(dp_load),
            route_pp_s=route_pp_s,
            route_tick_s=tick_s,
            route_dp_s=route_dp_s,
            wan_s=t_wan,
            wan_staggered_s=t_wan_st,
            sync_staggered_s=t_sync_st,
            gather_staggered_s=t_gather_st,
            intra_s=t_intra,
            unreachable=sorted(set(unreachable)),
        )

    # ------------------------------------------------------------------ throughput

    def tokens_per_step(self) -> int:
        return self.global_batch * self.model.seq_len

    def mfu(self, cfg: Config, step_time_s: float, gpus_by_site: dict[str, int]) -> float:
        peak = sum(
            n * self.peak_flops(self.site_gpu(s), cfg.precision) for s, n in gpus_by_site.items()
        )
        if step_time_s <= 0 or peak <= 0 or math.isinf(step_time_s):
            return 0.0
        return model_flops_per_step(self.model, self.global_batch) / (step_time_s * peak)


def node_fill(members: int, q: int) -> float:
    """The NIC-phase bandwidth factor of a site holding `members` replicas of a stage, q
    per node in rank order (placer.outputs.launch): 1 in whole nodes, ceil(q / r) when the
    last node holds r < q of them (its r NICs carry the q shard rings). A site whose
    members fit one node has no NIC phase (site_ring_nodes); the WAN shard it sends through
    those r NICs is the WAN phase's NIC term (PerfModel.wan_nic_s), which keeps a free WAN
    from undercutting one site (tests/test_solver_properties.py
    test_free_wan_equals_one_site). Both formulations encode it by members mod q."""
    r = members % q
    return float(math.ceil(q / r)) if r else 1.0


def wan_part_s(sync_mode: str, every_steps: int, t_wan: float, t_pipe: float) -> float:
    """What the WAN phase adds to the step under a sync policy (the sync-mode rule of the
    module docstring; the formulations write the same rule, placer.optimize.families)."""
    if sync_mode == "synchronous":
        return t_wan
    if sync_mode == "diloco":
        return t_wan / every_steps
    return max(0.0, t_wan / every_steps - t_pipe)


def _fsdp(t: StageTime, phase: str) -> float:
    """The exposed FSDP collectives in a stage time's forward or backward."""
    return getattr(t.ops, f"fsdp_{phase}") if t.ops is not None else 0.0


def _div(load: float, capacity: float) -> float:
    if load <= 0:
        return 0.0
    return load / capacity if capacity > 0 else math.inf


def weight_grad_s(t: StageTime) -> float:
    """W of a model stage: the part of its backward that only computes weight gradients,
    which DualPipeV (and zero-bubble schedules) run apart from the input gradient I.
    The weight-gradient GEMMs do the FLOPs of the forward GEMMs (each linear layer: one
    GEMM forward, two backward, dgrad and wgrad; Qi et al., "Zero Bubble Pipeline
    Parallelism", ICLR 2024, arXiv 2401.10241, section 2), so W = the stage's forward GEMM
    time (an assumption: same efficiency as the forward's); the attention core, the
    memory-bound operators, the recomputed forward and the communication stay in I.
    0 without operator terms."""
    if t.ops is None:
        return 0.0
    return min(t.ops.gemm_fwd, t.bwd)


def rank_stage_time(parts: list[StageTime]) -> StageTime:
    """One pipeline rank's StageTime from its model stages' (a micro-batch through all of
    them): times, operator terms and optimizer steps summed (Adam is linear in the
    parameters it updates, compute.optimizer_step_s)."""
    ops = None
    if all(t.ops is not None for t in parts):
        first = parts[0].ops
        ops = replace(
            first,
            **{
                f.name: sum(getattr(t.ops, f.name) for t in parts)
                for f in fields(first)  # type: ignore[arg-type]
            },
        )
    return StageTime(
        sum(t.fwd for t in parts),
        sum(t.bwd for t in parts),
        sum(t.fwd_compute for t in parts),
        sum(t.bwd_compute for t in parts),
        ops,
        sum(t.optimizer for t in parts),
    )
