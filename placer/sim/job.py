"""Whole-job discrete-event simulation of one training step (`placer simulate`).

The independent check of the closed form in placer.perf.step: instead of a max-plus
formula over one chain plus step-average route loads, every replica chain of the plan
(replica_groups expanded into individual replicas) runs its own 1F1B schedule, every
micro-batch's activation and gradient is a flow on the fabric (placer.sim.fabric: NIC
directions and route directions, max-min fair sharing, path latency after the bytes),
and every stage's data-parallel gradient sync is a set of flows of the hierarchical
collective NCCL runs (reduce inside each node over NVLink, between the site's nodes by one
ring per NIC, then two mesh rounds of 1/K shards between the K hosting sites on the plan's
data-parallel paths, and back: NVIDIA/nccl#530, NVIDIA/nccl-tests#196), bucketed under the
backward as the plan's job.overlap says.

Breakdown (same keys as the evaluator's, adding up to the step): compute_s and tp_comm_s
from the stage times, bubble_s = the pipeline with instant transfers (simulate_1f1b) minus
them, pp_comm_s = the simulated pipeline minus that, dp_sync_s = what follows the last
backward.

What is taken from the closed form's inputs, not re-derived: per-stage forward/backward
times (PerfModel.stage_times: the compute model, TP all-reduces included), message and
gradient bytes, NIC and route capacities, paths and latencies (placer.network, the
plan's routing resolved as the evaluator does). What is simulated: timing, i.e. when
each transfer starts, who it shares a link with, and how long it really takes.

Modelling choices (each mirrors the closed form unless it says otherwise):

* A device is one (replica, pipeline rank): a TP group whose tp NICs form one link per
  direction of capacity tp x NIC rate (nic_efficiency applied). The intra-site fabric is
  non-blocking: only NICs limit intra-site transfers (assumption, as in the closed form).
* Pipeline sends are asynchronous (compute does not wait for its own send) and leave in
  order through a FIFO per (replica, device pair, direction), as in
  placer.perf.pipeline.simulate_1f1b; a message arrives intra_site_latency + path latency
  after its last byte is through.
* Sync inside a site: consecutive replicas of a stage share a node (Megatron's rank
  order, dp next to tp), gpus_per_node // (tp cp ep) of them; the node's members
  reduce-scatter over NVLink (a ring, tp cp ep x the GPU's per-direction NVLink rate,
  no latency), then shard i rings over the i-th member of every node of the site on the
  NICs ((n - 1) hop latencies a phase); a partial node's members carry its missing
  members' shards (ring i through member i mod r of a node of r: NCCL's rings enter and
  leave every node once, through that node's NICs, whatever its member count:
  NVIDIA/nccl#687, #569). The closed form prices the same partial node (intra_sync_s at
  the site's member count: node_fill, ceil(q / r) on the NIC bandwidth). A site whose
  members fit one node has no NIC phase, here and in the closed form (its few NICs carry
  the WAN phase's bytes: next item). The closed form's ring is the site's own ceil(n/q)
  nodes, as here, where node_fill applies (q >= 2, no CP/EP/HSDP:
  PerfModel.site_ring_nodes); elsewhere (differs) it is ceil(d/q) of all d replicas,
  pessimistic when a site holds fewer (its (N-1)/N and 2 (N-1) hop latencies are those
  of the larger ring, whose bandwidth term stands in for the WAN phase's NIC term
  there); it takes the max over sites of NVLink + NIC phase where the simulation runs
  each phase at every site before the next (the same when one site is the slowest in
  both, as with one site).
* Overlap (job.overlap, or SimOptions.dp_buckets: 0 none, n chunk 0 in n buckets):
  without --overlap-grad-reduce each rank's sync starts when every replica has finished
  its schedule and sent its last gradient (Megatron reduces after forward_backward_func
  returns, rank by rank, so the ranks' syncs spread over the pipeline drain). With it,
  each chunk's gradients reduce during that chunk's last backward in buckets (bucket j
  ready after (j + 1)/n of it, a rank's buckets one after the other): chunk 0 in buckets
  of Megatron-Core's default size, max(40M, 1M x dp) parameters per GPU, the later
  chunks in one bucket each (Megatron disables their bucketing). Without ZeRO-1 a bucket
  is an all-reduce; with it a reduce-scatter, and the parameter all-gather either
  follows the optimizer step, exposed, or (--overlap-param-gather) runs from the start
  of the step, each chunk's first forward consuming its buckets as they arrive.
  Every bucket pays its collective's hop latencies. Differs: the closed form
  (dp_pieces) prices a half f S in n buckets under the shortest stage window W of the
  instance as max(f S / n, f S - (n - 1)/n W) up to 4 buckets and as the continuous
  max(0, f S - W) beyond (optimistic by at most f S / n), charges the WAN latency of
  every bucket (each release group the largest (n_k - 1) lat_k of its stages synced
  across sites, n_k a stage's own buckets and lat_k its own pairs': PerfModel.
  dp_stage_repeats; in series with the group's other work, pessimistic where the
  simulation overlaps one stage's repeats with another's rounds) but the intra-site
  hop latencies once (optimistic by (n - 1) of them), lets no rank hide more under
  the pipeline drain (pessimistic for the ranks that finish first), and exposes each
  rank's overlapped parameter gather past its first forward, grouped as the releases
  are (PerfModel.dp_moments_s: the latest over the chains in use of each chain's own
  fill at the fastest GPU, uncontended, against its slack; each gather's routes carry
  every rank's gather bytes, as here where all start with the step; the gathers' use of
  the routes the fill needs is not charged: optimistic there).
* Sync between sites: in each of the two WAN rounds every member of a hosting site sends
  its share of the site's 1/K shard to the members of the other sites through its NIC
  and the routed paths, each sender to the receivers whose ranges of the shard overlap
  its own (_pairing: n_a + n_b - 1 flows a pair at most, every member's NICs carrying
  1/n of its site's bytes). The closed form's WAN phase takes the larger of the busiest
  route and the NIC term, (K - 1)/K 2 S / n through the n members of the slowest hosting
  site (PerfModel.wan_nic_s; where node_fill applies). Differs: the closed form charges
  the busiest route with the WAN phases of the ranks released at or after a moment,
  each rank from its chains' own uncontended drain in at most 4 groups
  (PerfModel.dp_release_s groups, dp_moments_s credits; all at once on instances with
  a multi-path pair), in series
  after the longest NIC phase of those ranks, or after one stage's NIC phase, WAN
  latency and latency repeats (PerfModel.step; here each rank's NIC phase and WAN
  rounds start at its own release and overlap the others'; pessimistic where the ranks'
  syncs spread wider than that bound); the WAN rounds pay the fiber's latency, not the
  fabric hop a pipeline message pays (both here and in the closed form).
* A device's NIC links carry all its traffic: activations out, gradients out, both
  inbound streams and its sync flows share them (max-min fair). Differs: the closed form
  gives each direction of each boundary a NIC of its own.
* DiLoCo modes: each step syncs inside each site (reduce-scatter + all-gather; differs:
  the closed form charges the NIC volume of a ring over all d replicas); the outer
  WAN exchange is simulated on its own and amortized as the evaluator does: T_wan / H
  (diloco) or max(0, T_wan / H - T_pipe) (streaming-diloco).
* Interleaved 1F1B (the plan's `parallelism.virtual_stages` = v > 1) runs Megatron-Core's
  interleaved order (placer.perf.critical_path.interleaved_order: v chunks per device,
  model stage s = c pp + k on device k at PerfModel.chunk_times, the LM head on the last
  chunk; needs m % p == 0); every chunk boundary is a message, the wrap from the last
  device to the first included. `SimOptions(virtual_stages=v)` (CLI --virtual-stages)
  overrides the plan's v for both the simulation and the closed form beside it.
* DualPipeV (`parallelism.pipeline_schedule: dualpipev`) runs DeepSeek's order
  (placer.perf.dualpipe.dualpipev_order: model stages k and 2 pp - 1 - k on device k, the
  turn of the V on the last device without a message, F&B ops as one op of both times,
  I and W apart); a chunk's gradients are ready after its last B or W. Differs: the closed
  form credits no stagger of the ranks' WAN syncs and takes one chunk's backward as the
  overlap window (pessimistic: tests/test_dualpipev.py).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import simpy

from placer.errors import InputError
from placer.evaluate import Evaluation, evaluate
from placer.io import Problem, plan_from_data
from placer.network import PathUse
from placer.perf.critical_path import interleaved_order
from placer.perf.dualpipe import dualpipev_order
from placer.perf.flops import BYTES_BF16, stage_params
from placer.perf.pipeline import simulate_1f1b
from placer.perf.step import (
    MEGATRON_BUCKET_MIN,
    MEGATRON_BUCKET_PER_DP,
    Config,
    PerfModel,
    weight_grad_s,
)
from placer.schema import Plan
from placer.sim.fabric import Fabric

__all__ = ["SimOptions", "SimulationResult", "Transfer", "schedule", "simulate", "simulate_chain"]


@dataclass(frozen=True)
class SimOptions:
    # None: the plan's job.overlap with Megatron's bucket size; 0: no overlap at all (each
    # stage syncs after its schedule, ZeRO-1's parameter all-gather before the first
    # forward); n >= 1: overlap on, the first chunk's gradients in n buckets
    dp_buckets: int | None = None
    virtual_stages: int | None = None  # None: the plan's parallelism.virtual_stages


@dataclass(frozen=True)
class Transfer:
    """One pipeline message: an activation (kind 'F') or a gradient ('B')."""

    kind: str
    replica: int
    src_stage: int  # model stage (chunk) that produced it
    micro_batch: int
    src_site: str
    dst_site: str
    ready: float  # its producer finished
    start: float  # first byte (after the messages queued ahead of it)
    sent: float  # last byte through the bottleneck
    arrival: float  # delivered: sent + latency

    @property
    def cross_site(self) -> bool:
        return self.src_site != self.dst_site


@dataclass
class SimulationResult:
    step_time_s: float
    pipe_s: float  # last backward of any device
    breakdown: dict[str, float]
    closed_form_s: float
    closed_breakdown: dict[str, float]
    closed_pipe_s: float  # the closed form's T_pipe (slowest chain, route-average bound)
    routes: list[dict[str, Any]]
    transfers: list[Transfer]
    sync_end_s: list[float]  # per pipeline rank
    outer_sync_s: float  # DiLoCo: the outer WAN exchange on its own (0 when synchronous)
    outer_routes: list[dict[str, Any]]  # the routes' use during that exchange
    replicas: int
    micro_batches: int
    sync_mode: str
    options: SimOptions
    flows: int
    wall_s: float
    cpu_s: float  # process time: what the simulation costs on a machine shared with others
    feasible: bool
    violations: list[str] = field(default_factory=list)
    virtual_stages: int = 1  # the interleaving simulated (the plan's, or the option's)

    @property
    def rel_diff(self) -> float:
        """(closed form - simulation) / simulation: negative when the closed form is
        optimistic."""
        return (self.closed_form_s - self.step_time_s) / self.step_time_s

    def max_cross_site_transfer_s(self) -> float:
        """Longest start-to-arrival time of a cross-site pipeline message."""
        return max((t.arrival - t.start for t in self.transfers if t.cross_site), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        cross = [t for t in self.transfers if t.cross_site]
        return {
            "step_time_s": self.step_time_s,
            "pipe_s": self.pipe_s,
            "breakdown": self.breakdown,
            "closed_form": {
                "step_time_s": self.closed_form_s,
                "pipe_s": self.closed_pipe_s,
                "breakdown": self.closed_breakdown,
            },
            "rel_diff": self.rel_diff,
            "routes": self.routes,
            "pipeline_messages": {
                "total": len(self.transfers),
                "cross_site": len(cross),
                "max_cross_site_s": self.max_cross_site_transfer_s(),
                "mean_cross_site_s": sum(t.arrival - t.start for t in cross) / len(cross)
                if cross
                else 0.0,
            },
            "sync_end_s": self.sync_end_s,
            "outer_sync_s": self.outer_sync_s,
            "outer_sync_routes": self.outer_routes,
            "replicas": self.replicas,
            "micro_batches": self.micro_batches,
            "virtual_stages": self.virtual_stages,
            "sync_mode": self.sync_mode,
            "options": {
                "dp_buckets": self.options.dp_buckets,
                "virtual_stages": self.options.virtual_stages,
            },
            "flows": self.flows,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "feasible": self.feasible,
            "violations": self.violations,
        }


# ----------------------------------------------------------------------------- schedule


def schedule(p: int, m: int, v: int, rank: int) -> list[tuple[str, int, int]]:
    """The op order of pipeline rank `rank`: (kind, micro-batch, model stage) triples, as
    placer.perf.critical_path.interleaved_order (1F1B for v = 1, Megatron-Core's interleaved
    schedule for v > 1); a micro-batch count that is not a multiple of pp is bad input."""
    if v > 1 and m % p:
        raise InputError(
            f"interleaved 1F1B needs the micro-batch count ({m}) to be a multiple of pp ({p})"
        )
    return interleaved_order(p, m, v, rank)


# ----------------------------------------------------------------------------- simulate


def simulate(
    problem: Problem, plan: Plan | dict[str, Any], options: SimOptions | None = None
) -> SimulationResult:
    """Simulate one step of `plan` and put the evaluator's closed form beside it."""
    options = options or SimOptions()
    if options.dp_buckets is not None and options.dp_buckets < 0:
        raise InputError(f"dp_buckets must be >= 0, got {options.dp_buckets}")
    if options.virtual_stages is not None and options.virtual_stages < 1:
        raise InputError(f"virtual_stages must be >= 1, got {options.virtual_stages}")
    plan = plan_from_data(plan)
    if options.virtual_stages is not None:
        data = plan.model_dump(mode="json", exclude_none=True)
        if data["parallelism"].get("virtual_stages", 1) != options.virtual_stages:
            data["parallelism"].pop("chunk_layers", None)  # the plan's chunks are of its own v
        data["parallelism"]["virtual_stages"] = options.virtual_stages
        plan = plan_from_data(data)
    perf = PerfModel(problem)
    ev = evaluate(problem, plan, perf, check_resilience=False)
    broken = [str(v) for v in ev.violations if v.kind in {"topology", "shape"}]
    if ev.step is None or broken:
        raise InputError(
            "plan cannot be simulated: " + "; ".join(broken or ["it has no step time"])
        )
    if not math.isfinite(ev.step_time_s):
        why = [str(v) for v in ev.violations if v.kind in {"channels", "topology"}]
        raise InputError(
            "plan cannot be simulated: " + "; ".join(why or ["its step time is infinite"])
        )
    t0, c0 = time.perf_counter(), time.process_time()
    job = _Job(problem, plan, perf, ev, options)
    full = job.run(comm=True)
    bare_s = job.pipe_without_comm()
    outer, outer_routes = (
        job.run_outer_sync() if ev.config.sync_mode != "synchronous" else (0.0, [])
    )
    h = problem.instance.job.sync.every_steps
    opt = job.opt_s
    full.pipe_s += opt
    step = max(full.pipe_s, *(t + opt for t in full.sync_end))
    if ev.config.sync_mode == "diloco":
        step += outer / h
    elif ev.config.sync_mode == "streaming-diloco":
        step += max(0.0, outer / h - full.pipe_s)
    m = ev.config.num_micro_batches
    compute = m * max(job.fwd_c[k][s] + job.bwd_c[k][s] for k, s in job.device_stage_sites())
    with_tp = m * max(job.fwd[k][s] + job.bwd[k][s] for k, s in job.device_stage_sites())
    breakdown = {
        "compute_s": compute,
        "tp_comm_s": with_tp - compute,
        "bubble_s": bare_s - with_tp,
        "pp_comm_s": full.pipe_s - opt - bare_s,
        "dp_sync_s": step - full.pipe_s,
        "optimizer_s": opt,
    }
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return SimulationResult(
        step_time_s=step,
        pipe_s=full.pipe_s,
        breakdown=breakdown,
        closed_form_s=ev.step_time_s,
        closed_breakdown=dict(ev.breakdown),
        closed_pipe_s=ev.step.pipe_s,
        routes=full.routes(step),
        transfers=full.transfers,
        sync_end_s=full.sync_end,
        outer_sync_s=outer,
        outer_routes=outer_routes,
        replicas=len(job.chains),
        micro_batches=m,
        sync_mode=ev.config.sync_mode,
        options=options,
        flows=full.fabric.flows_started,
        wall_s=wall,
        cpu_s=cpu,
        feasible=ev.feasible,
        violations=[str(v) for v in ev.violations],
        virtual_stages=ev.config.virtual_stages,
    )


@dataclass
class _Run:
    env: simpy.Environment
    fabric: Fabric
    pipe_s: float = 0.0
    sync_end: list[float] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)

    def routes(self, step_s: float) -> list[dict[str, Any]]:
        self.fabric.close()
        out = []
        for key, link in sorted(self.fabric.links.items(), key=lambda kv: str(kv[0])):
            if key[0] != "route":
                continue
            out.append(
                {
                    "route": [key[1], key[2]],
                    "capacity_Bps": link.capacity_Bps,
                    "bytes": link.bytes,
                    "peak_utilisation": link.peak_Bps / link.capacity_Bps,
                    "mean_utilisation": link.bytes / (link.capacity_Bps * step_s)
                    if step_s > 0
                    else 0.0,
                }
            )
        return out


class _Job:
    """The static description of the step: devices, stage times, links, paths."""

    def __init__(
        self, problem: Problem, plan: Plan, perf: PerfModel, ev: Evaluation, options: SimOptions
    ):
        self.problem, self.perf, self.ev, self.opt = problem, perf, ev, options
        cfg: Config = ev.config
        self.cfg = cfg
        self.p, self.m, self.v = cfg.pp, cfg.num_micro_batches, cfg.virtual_stages
        self.chains = [tuple(g.stage_sites) for g in plan.replica_groups for _ in range(g.count)]
        inst = problem.instance
        self.gpu_of = {s.name: s.gpu for s in inst.sites}
        # per pipeline rank k and site: stage times (seconds per micro-batch, per chunk)
        self.fwd: dict[int, dict[str, float]] = defaultdict(dict)
        self.bwd: dict[int, dict[str, float]] = defaultdict(dict)
        self.fwd_c: dict[int, dict[str, float]] = defaultdict(dict)
        self.bwd_c: dict[int, dict[str, float]] = defaultdict(dict)
        # per model stage s (chunk s // p of device s mod p) and site: chunk times
        self.chunk_fwd: dict[int, dict[str, float]] = defaultdict(dict)
        self.chunk_bwd: dict[int, dict[str, float]] = defaultdict(dict)
        self.chunk_w: dict[int, dict[str, float]] = defaultdict(dict)  # DualPipeV's W
        for k, site in self.device_stage_sites():
            st = perf.stage_times(cfg, self.gpu_of[site])[k]
            self.fwd[k][site], self.bwd[k][site] = st.fwd, st.bwd
            self.fwd_c[k][site], self.bwd_c[k][site] = st.fwd_compute, st.bwd_compute
            chunks = perf.chunk_times(cfg, self.gpu_of[site])
            for s in cfg.rank_stages(k):
                self.chunk_fwd[s][site], self.chunk_bwd[s][site] = chunks[s].fwd, chunks[s].bwd
                self.chunk_w[s][site] = weight_grad_s(chunks[s])
        self.msg_bytes = perf.message_bytes(cfg)
        # the optimizer step, on every GPU once gradients are reduced: the step waits for
        # the slowest stage's (PerfModel.optimizer_step_s, as the closed form adds it)
        self.opt_s = max(perf.optimizer_step_s(cfg, chain) for chain in set(self.chains))
        # job.overlap (or the --dp-buckets override): what hides under compute
        forced = options.dp_buckets
        self.overlap_grad = cfg.overlap_grad_reduce if forced is None else forced > 0
        self.overlap_param = cfg.overlap_param_gather if forced is None else forced > 0
        self.intra_lat = problem.catalog.network.intra_site_latency_s
        net = perf.net
        optic_of = {tuple(r["sites"]): r["optic"] for r in ev.links}
        waves = {tuple(r["sites"]): r["waves"] for r in ev.links}
        self.route_cap = {
            key: net.capacity_Bps(key, waves.get(key, 0), optic_of.get(key)) for key in net.routes
        }

    def ops(self, k: int) -> list[tuple[tuple[str, int, int], ...]]:
        """Rank k's ops, each one action or (DualPipeV's F&B) two run as one op."""
        if self.cfg.dualpipev:
            return dualpipev_order(self.p, self.m, k)
        return [(a,) for a in schedule(self.p, self.m, self.v, k)]

    def chunk_of(self, k: int, s: int) -> int:
        """The chunk index on rank k of model stage s (Config.rank_stages order)."""
        return self.cfg.rank_stages(k).index(s)

    def device_stage_sites(self) -> list[tuple[int, str]]:
        return sorted({(k, s) for c in self.chains for k, s in enumerate(c)})

    def nic_Bps(self, site: str) -> float:
        # a replica stage's message leaves over its tp x cp x ep NICs (PerfModel.boundary)
        return self.perf.nic_Bps(self.problem.catalog.gpus[self.gpu_of[site]]) * self.cfg.width

    def nvlink_Bps(self, site: str) -> float:
        # the device's GPUs each reach their peers of the next replica over NVLink
        return self.perf.nvlink_Bps(self.problem.catalog.gpus[self.gpu_of[site]]) * self.cfg.width

    def _fabric(self, env: simpy.Environment) -> Fabric:
        fab = Fabric(env)
        for r, chain in enumerate(self.chains):
            for k, site in enumerate(chain):
                fab.add_link(("nic-out", r, k), self.nic_Bps(site))
                fab.add_link(("nic-in", r, k), self.nic_Bps(site))
                fab.add_link(("nvl-out", r, k), self.nvlink_Bps(site))
                fab.add_link(("nvl-in", r, k), self.nvlink_Bps(site))
        for (a, b), cap in self.route_cap.items():
            if cap > 0:
                fab.add_link(("route", a, b), cap)
                fab.add_link(("route", b, a), cap)
        return fab

    def paths(
        self, phase: str, a: str, b: str
    ) -> list[tuple[float, list[tuple[str, str, str]], float]]:
        """(share, route links a -> b, one-way latency) of every path the pair uses."""
        uses: tuple[PathUse, ...] = self.perf.net.pair_paths(self.ev.routing, phase, a, b) or ()
        out = []
        for use in uses:
            if use.share <= 0:
                continue  # a listed path that carries nothing (its latency does not apply)
            sites = list(use.path.sites)
            if sites[0] != a:
                sites.reverse()
            out.append(
                (
                    use.share,
                    [("route", u, w) for u, w in zip(sites, sites[1:], strict=False)],
                    use.path.latency_s,
                )
            )
        return out

    def pipe_without_comm(self) -> float:
        """The pipeline with instant transfers (splits bubble from communication in the
        breakdown). Non-interleaved: placer.perf.pipeline.simulate_1f1b, the ordered event
        evaluation, once per distinct chain; interleaved: this simulator without comm."""
        if self.v > 1 or self.cfg.dualpipev:
            return self.run(comm=False).pipe_s
        out = 0.0
        for chain in set(self.chains):
            f = [self.fwd[k][s] for k, s in enumerate(chain)]
            b = [self.bwd[k][s] for k, s in enumerate(chain)]
            zeros = [0.0] * (self.p - 1)
            out = max(out, simulate_1f1b(f, b, zeros, zeros, self.m).makespan_s)
        return out

    # ------------------------------------------------------------------ overlap plan

    def _chunk_fractions(self, k: int) -> list[float]:
        """Share of rank k's parameters (and gradients) in each of its v chunks (model
        stages c pp + k; the embedding on model stage 0, the LM head on the last)."""
        layers, n_stages = self.cfg.chunk_layers, self.cfg.model_stages
        params = [
            stage_params(self.problem.model, layers[s], s == 0, s == n_stages - 1, sum(layers[:s]))
            for s in self.cfg.rank_stages(k)
        ]
        total = sum(params)
        n = len(params)
        return [x / total for x in params] if total else [1.0 / n] * n

    def _chunk_buckets(self, k: int, c: int, fraction: float) -> int:
        """Buckets of chunk c of rank k under overlap: Megatron-Core buckets the first model
        chunk at `bucket_size` parameters per GPU (default max(40M, 1M x dp),
        DistributedDataParallelConfig.bucket_size) and disables bucketing for the later
        chunks (training.get_model: disable_bucketing=model_chunk_idx > 0); --dp-buckets
        gives chunk 0's count instead."""
        if c > 0:
            return 1
        if self.opt.dp_buckets:
            return self.opt.dp_buckets
        per_gpu = self.perf.stage_grad_bytes(self.cfg, k) / BYTES_BF16 * fraction
        size = max(MEGATRON_BUCKET_MIN, MEGATRON_BUCKET_PER_DP * self.cfg.dp)
        return max(1, math.ceil(per_gpu / size))

    def _pieces(self, k: int, kind: str) -> list[tuple[int, int, int, float]]:
        """The sync pieces of rank k, in the order they are reduced ('B', the gradient
        reduce: chunks by their last backward) or gathered ('F', ZeRO-1's parameter
        all-gather: chunks by their first forward): (chunk, bucket, buckets of the chunk,
        fraction of the rank's gradient). Without overlap one piece (chunk -1)."""
        overlap = self.overlap_grad if kind == "B" else self.overlap_param
        if not overlap:
            return [(-1, 0, 1, 1.0)]
        when = self._grad_ops(k) if kind == "B" else self._first_forwards(k)
        fracs = self._chunk_fractions(k)
        out = []
        for c in sorted(when, key=when.get):
            n = self._chunk_buckets(k, c, fracs[c])
            out.extend((c, j, n, fracs[c] / n) for j in range(n))
        return out

    def _grad_ops(self, k: int) -> dict[int, int]:
        """Chunk -> index of the op that completes its gradients: its last backward (B, or
        DualPipeV's W after its I)."""
        out: dict[int, int] = {}
        for i, op in enumerate(self.ops(k)):
            for kd, _, s in op:
                if kd in ("B", "W"):
                    out[self.chunk_of(k, s)] = i
        return out

    def _first_forwards(self, k: int) -> dict[int, int]:
        """Chunk -> index of its first forward."""
        out: dict[int, int] = {}
        for i, op in enumerate(self.ops(k)):
            for kd, _, s in op:
                if kd == "F":
                    out.setdefault(self.chunk_of(k, s), i)
        return out

    # ------------------------------------------------------------------ one step

    def run(self, comm: bool) -> _Run:
        env = simpy.Environment()
        run = _Run(env, self._fabric(env))
        p = self.p
        n_stages = self.cfg.model_stages
        rank_of = self.cfg.stage_rank
        act: dict[tuple[int, int, int], simpy.Event] = {}
        grad: dict[tuple[int, int, int], simpy.Event] = {}
        syncs = comm and self.cfg.dp >= 2
        red = {k: self._pieces(k, "B") for k in range(p)}
        # ZeRO-1's parameter all-gather: overlapped, under the step's first forwards (the
        # previous step's optimizer is done at its start); else after the optimizer step,
        # in _stage_sync
        overlap_gather = self.cfg.zero1 and self.overlap_param
        gat = {k: self._pieces(k, "F") if overlap_gather else [] for k in range(p)}
        ready = {
            (r, k): [env.event() for _ in red[k]] for r in range(len(self.chains)) for k in range(p)
        }
        gathered = {k: [env.event() for _ in gat[k]] for k in range(p)}

        def inbox(box: dict, key: tuple[int, int, int]) -> simpy.Event:
            if key not in box:
                box[key] = env.event()
            return box[key]

        last_out: dict[
            tuple[int, int, int], simpy.Event
        ] = {}  # per channel: its last message is out

        def send(kind: str, r: int, s: int, x: int, sent: simpy.Event | None = None) -> None:
            dst = s + 1 if kind == "F" else s - 1
            target = inbox(act if kind == "F" else grad, (r, dst, x))
            if not comm or rank_of(s) == rank_of(dst):  # DualPipeV's turn: the same device
                target.succeed()
                if sent is not None:
                    sent.succeed()
                return
            key = (r, rank_of(s), rank_of(dst))
            prev = last_out.get(key)
            out = last_out[key] = sent or env.event()
            env.process(transmit(kind, r, s, dst, x, target, prev, out))

        def transmit(
            kind: str,
            r: int,
            s: int,
            dst: int,
            x: int,
            target: simpy.Event,
            prev: simpy.Event | None,
            out: simpy.Event,
        ) -> Generator:
            """One message through its channel's FIFO: first byte when the message ahead
            of it is out, arrival latency after its last byte."""
            src_dev, dst_dev = rank_of(s), rank_of(dst)
            a, b = self.chains[r][src_dev], self.chains[r][dst_dev]
            t_ready = env.now
            if prev is not None and not prev.processed:
                yield prev
            t_start = env.now
            head, tail = [("nic-out", r, src_dev)], [("nic-in", r, dst_dev)]
            if a == b:
                yield run.fabric.transfer(self.msg_bytes, head + tail)
                t_sent = env.now
                out.succeed()
                yield env.timeout(self.intra_lat)
            else:
                legs = self.paths("pipeline", a, b)
                flows = [
                    run.fabric.transfer(self.msg_bytes * share, head + links + tail)
                    for share, links, _ in legs
                ]
                arrivals = [
                    env.process(_after(env, f, self.intra_lat + lat))
                    for f, (_, _, lat) in zip(flows, legs, strict=True)
                ]
                yield env.all_of(flows)
                t_sent = env.now
                out.succeed()
                yield env.all_of(arrivals)
            run.transfers.append(Transfer(kind, r, s, x, a, b, t_ready, t_start, t_sent, env.now))
            target.succeed()

        def device(r: int, k: int) -> Generator:
            site = self.chains[r][k]
            ops = self.ops(k)
            # the op index of each chunk's last gradient (grad reduce) and first forward
            # (parameter gather), the pieces that hang on them
            last_b = self._grad_ops(k)
            first_f = self._first_forwards(k)
            overlapped = self.overlap_grad and syncs
            for i, op in enumerate(ops):
                for kind, x, s in op:
                    if kind == "F" and s > 0:
                        yield inbox(act, (r, s, x))
                    elif kind in ("B", "I") and s < n_stages - 1:
                        yield inbox(grad, (r, s, x))
                dur = sum(self._duration(kind, s, site) for kind, _, s in op)
                last = i == len(ops) - 1
                for kind, _, s in op:
                    c = self.chunk_of(k, s)
                    if syncs and gat[k] and kind == "F" and first_f.get(c) == i:
                        # ZeRO-1 with --overlap-param-gather: the chunk's first forward uses
                        # its parameters bucket by bucket as their all-gather completes
                        mine = [j for j, pc in enumerate(gat[k]) if pc[0] == c]
                        for j in mine:
                            if not gathered[k][j].processed:
                                yield gathered[k][j]
                            yield env.timeout(dur / len(mine))
                        dur = 0.0
                    if overlapped and last_b.get(c) == i and kind in ("B", "W"):
                        mine = [j for j, pc in enumerate(red[k]) if pc[0] == c]
                        env.process(_buckets(env, [ready[(r, k)][j] for j in mine], dur, len(mine)))
                if dur > 0:
                    yield env.timeout(dur)
                sent_last = False
                for kind, x, s in op:
                    if kind == "F" and s < n_stages - 1:
                        send("F", r, s, x)
                    elif kind in ("B", "I") and s > 0:
                        # without overlap the sync starts once the schedule's last send is
                        # out (Megatron reduces gradients after forward_backward_func returns)
                        final = last and not overlapped and not sent_last
                        send("B", r, s, x, ready[(r, k)][0] if final else None)
                        sent_last = sent_last or final
                if last and not overlapped and not sent_last:
                    ready[(r, k)][0].succeed()
            run.pipe_s = max(run.pipe_s, env.now)

        for r in range(len(self.chains)):
            for k in range(p):
                env.process(device(r, k))
        run.sync_end = [0.0] * p
        if syncs:
            wan = self.cfg.sync_mode == "synchronous"
            for k in range(p):
                env.process(self._stage_sync(run, k, ready, red[k], wan))
                if gat[k]:
                    env.process(self._stage_gather(run, k, gathered[k], gat[k], wan))
        env.run()
        return run

    def _duration(self, kind: str, s: int, site: str) -> float:
        """One action's seconds: a forward, a full backward, or DualPipeV's I (the
        backward less its weight gradient) and W."""
        if kind == "F":
            return self.chunk_fwd[s][site]
        if kind == "B":
            return self.chunk_bwd[s][site]
        if kind == "I":
            return self.chunk_bwd[s][site] - self.chunk_w[s][site]
        return self.chunk_w[s][site]

    def _stage_sync(
        self, run: _Run, k: int, ready: dict, pieces: list[tuple[int, int, int, float]], wan: bool
    ) -> Generator:
        """Rank k's gradient reduce, piece by piece once every member has the piece ready:
        an all-reduce, or under ZeRO-1 (the distributed optimizer) its reduce-scatter."""
        env = run.env
        for i, piece in enumerate(pieces):
            yield env.all_of([ready[(r, k)][i] for r in range(len(self.chains))])
            yield from self._allreduce(
                run, k, piece[3], wan=wan, intra=True, gather=not self.cfg.zero1
            )
        if self.cfg.zero1 and not self.overlap_param:
            # the parameter all-gather follows the optimizer step, exposed: the step ends
            # optimizer_s after sync_end (simulate), so sync_end is its end minus that
            yield env.timeout(self.opt_s)
            yield from self._allreduce(run, k, 1.0, wan=wan, intra=True, scatter=False)
            run.sync_end[k] = env.now - self.opt_s
            return
        run.sync_end[k] = env.now

    def _stage_gather(
        self,
        run: _Run,
        k: int,
        done: list[simpy.Event],
        pieces: list[tuple[int, int, int, float]],
        wan: bool,
    ) -> Generator:
        """ZeRO-1's parameter all-gather of rank k, from the start of the step (the previous
        step's optimizer is done), piece by piece."""
        for i, piece in enumerate(pieces):
            yield from self._allreduce(run, k, piece[3], wan=wan, intra=True, scatter=False)
            done[i].succeed()

    def _by_site(self, k: int) -> dict[str, list[int]]:
        out: dict[str, list[int]] = defaultdict(list)
        for r, chain in enumerate(self.chains):
            out[chain[k]].append(r)
        return dict(sorted(out.items()))

    def _nodes(self, site: str, members: list[int]) -> list[list[int]]:
        """The scale-up domains of a site's members of one rank: Megatron's rank order puts
        consecutive data-parallel replicas of a stage on consecutive TP groups, so
        gpus_per_node // (tp cp ep) of them share a node (in replica order)."""
        q = max(1, self.perf.site_gpus_per_node(site) // self.cfg.width)
        return [members[i : i + q] for i in range(0, len(members), q)]

    def _allreduce(
        self,
        run: _Run,
        k: int,
        fraction: float,
        wan: bool,
        intra: bool,
        scatter: bool = True,
        gather: bool = True,
    ) -> Generator:
        """Hierarchical all-reduce of `fraction` of rank k's gradient (see module doc); its
        reduce-scatter half (`gather=False`) or all-gather half (`scatter=False`)."""
        env, fab = run.env, run.fabric
        by_site = self._by_site(k)
        grad = self.perf.stage_grad_bytes(self.cfg, k) * self.cfg.tp * fraction  # per device, bf16
        wan_bytes = self.perf.stage_wan_bytes(self.cfg, k) * fraction  # whole stage, at sync bits

        def nvlink_phase() -> Generator:
            """Reduce-scatter (or all-gather) inside each node: a ring over NVLink."""
            procs = []
            for site, members in by_site.items():
                for node in self._nodes(site, members):
                    n = len(node)
                    for i, r in enumerate(node if n >= 2 else ()):
                        nxt = node[(i + 1) % n]
                        links = [("nvl-out", r, k), ("nvl-in", nxt, k)]
                        procs.append(fab.transfer((n - 1) / n * grad, links))
            if procs:
                yield env.all_of(procs)

        def nic_phase() -> Generator:
            """Reduce-scatter (or all-gather) of the node shards between a site's nodes: q
            rings over the NICs, ring i joining the i-th member of every node."""
            procs = []
            for site, members in by_site.items():
                nodes = self._nodes(site, members)
                n = len(nodes)
                if n < 2:
                    continue
                q = len(nodes[0])
                for i in range(q):
                    ring = [node[i % len(node)] for node in nodes]
                    for a, r in enumerate(ring):
                        nxt = ring[(a + 1) % n]
                        f = fab.transfer(
                            (n - 1) / n * grad / q, [("nic-out", r, k), ("nic-in", nxt, k)]
                        )
                        procs.append(env.process(_after(env, f, (n - 1) * self.intra_lat)))
            if procs:
                yield env.all_of(procs)

        def wan_round() -> Generator:
            sites = list(by_site)
            n_sites = len(sites)
            procs = []
            for a in sites:
                src = by_site[a]
                for b in sites:
                    if a == b:
                        continue
                    dst = by_site[b]
                    for share, links, lat in self.paths("data_parallel", a, b):
                        for i, j, frac in _pairing(len(src), len(dst)):
                            nbytes = wan_bytes / n_sites * frac * share
                            f = fab.transfer(
                                nbytes, [("nic-out", src[i], k), *links, ("nic-in", dst[j], k)]
                            )
                            procs.append(env.process(_after(env, f, lat)))
            if procs:
                yield env.all_of(procs)

        cross = wan and len(by_site) >= 2
        if scatter:
            if intra:
                yield from nvlink_phase()  # reduce-scatter inside each node
                yield from nic_phase()  # ... and between the site's nodes
            if cross:
                yield from wan_round()  # reduce-scatter of the site shards between sites
        if gather:
            if cross:
                yield from wan_round()  # all-gather of the reduced shards
            if intra:
                yield from nic_phase()  # all-gather between the site's nodes
                yield from nvlink_phase()  # ... and inside each node

    def run_outer_sync(self) -> tuple[float, list[dict[str, Any]]]:
        """DiLoCo's outer exchange: every rank's WAN rounds at once on an idle network;
        its duration and the routes' use during it."""
        env = simpy.Environment()
        run = _Run(env, self._fabric(env))
        procs = [
            env.process(self._allreduce(run, k, 1.0, wan=True, intra=False)) for k in range(self.p)
        ]
        env.run(env.all_of(procs))
        return env.now, run.routes(env.now)


def _pairing(n_src: int, n_dst: int) -> list[tuple[int, int, float]]:
    """Who sends to whom in a WAN round: (sender, receiver, fraction of the site's bytes).
    Member i of a side of n holds the contiguous range [i/n, (i+1)/n) of the stage's
    gradient (the site's reduce-scatter), so a sender sends each receiver the overlap of
    their ranges: the north-west-corner transport plan, at most n_src + n_dst - 1 flows,
    every sender 1/n_src and every receiver 1/n_dst of the bytes (balanced NICs)."""
    out, i, j = [], 0, 0
    # in units of 1 / (n_src n_dst): sender i's range ends at (i+1) n_dst, receiver j's at
    # (j+1) n_src
    at = 0
    while i < n_src and j < n_dst:
        end = min((i + 1) * n_dst, (j + 1) * n_src)
        out.append((i, j, (end - at) / (n_src * n_dst)))
        at = end
        i += end == (i + 1) * n_dst
        j += end == (j + 1) * n_src
    return out


def _after(env: simpy.Environment, event: simpy.Event, delay: float) -> Generator:
    yield event
    if delay > 0:
        yield env.timeout(delay)


def _buckets(env: simpy.Environment, events: list[simpy.Event], dur: float, n: int) -> Generator:
    """Gradient buckets of a chunk's last backward: the j-th is ready after (j + 1) / n of
    it (the backward produces the chunk's gradients at an even rate, last layer first)."""
    for j in range(n):
        yield env.timeout(dur / n)
        events[j].succeed()


def simulate_chain(
    fwd: list[float], bwd: list[float], lat: list[float], tx: list[float], m: int, v: int
) -> float:
    """One replica chain's step as a simpy event simulation with fixed message times:
    every rank runs its op order (schedule: 1F1B, or interleaved for v > 1) on its model
    stages' times (fwd / bwd: v pp entries), every message leaves through the FIFO of its
    physical boundary's direction (boundary j: rank j -> j + 1, for v > 1 boundary pp - 1
    the wrap), is on the wire tx[j] and arrives lat[j] later. The event-driven check of
    the closed form's ordered evaluation (placer.perf.critical_path) that `placer
    evaluate --simulate` runs on the critical chain. Returns the makespan."""
    p = len(fwd) // v
    last_stage = p * v - 1
    env = simpy.Environment()
    boxes: dict[tuple[str, int, int], simpy.Event] = {}
    fifo: dict[tuple[str, int], simpy.Event | None] = {}
    end = [0.0]

    def box(key: tuple[str, int, int]) -> simpy.Event:
        if key not in boxes:
            boxes[key] = env.event()
        return boxes[key]

    def message(kind: str, j: int, target: simpy.Event) -> Generator:
        prev = fifo.get((kind, j))
        out = fifo[(kind, j)] = env.event()
        if prev is not None and not prev.processed:
            yield prev
        yield env.timeout(tx[j])
        out.succeed()
        yield env.timeout(lat[j])
        target.succeed()

    def rank(r: int) -> Generator:
        for kind, x, s in schedule(p, m, v, r):
            if kind == "F" and s > 0:
                yield box(("F", x, s))
            elif kind == "B" and s < last_stage:
                yield box(("B", x, s))
            yield env.timeout(fwd[s] if kind == "F" else bwd[s])
            if kind == "F" and s < last_stage:
                env.process(message("F", r, box(("F", x, s + 1))))
            elif kind == "B" and s > 0:
                env.process(message("B", r - 1 if r > 0 else p - 1, box(("B", x, s - 1))))
        end[0] = max(end[0], env.now)

    for r in range(p):
        env.process(rank(r))
    env.run()
    return end[0]
