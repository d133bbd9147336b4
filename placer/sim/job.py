"""Whole-job discrete-event simulation of one training step (`placer simulate`).

The independent check of the closed form in placer.perf.step: instead of a max-plus
formula over one chain plus step-average route loads, every replica chain of the plan
(replica_groups expanded into individual replicas) runs its own 1F1B schedule, every
micro-batch's activation and gradient is a flow on the fabric (placer.sim.fabric: NIC
directions and route directions, max-min fair sharing, path latency after the bytes),
and every stage's data-parallel gradient sync is a set of flows that mirrors the
hierarchical collective the closed form prices (reduce-scatter inside each site, two
mesh rounds of 1/K shards between the K hosting sites on the plan's data-parallel paths,
all-gather inside).

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
* Each stage's sync starts when every replica has finished that stage's last backward
  and sent its last gradient (`dp_buckets=0`, the evaluator's assumption: no overlap;
  Megatron reduces after forward_backward_func returns, rank by rank, so the ranks' syncs
  spread over the pipeline drain), or bucket by bucket during the last micro-batch's
  backward (`dp_buckets=n`: bucket j is ready after (j+1)/n of it, buckets of a stage
  reduce one after the other, as Megatron's --overlap-grad-reduce).
* A device's NIC links carry all its traffic: activations out, gradients out, both
  inbound streams and its sync flows share them (max-min fair). Differs: the closed form
  gives each direction of each boundary a NIC of its own.
* DiLoCo modes: each step syncs inside each site (reduce-scatter + all-gather; differs:
  the closed form charges the NIC volume of a ring over all d replicas); the outer
  WAN exchange is simulated on its own and amortized as the evaluator does: T_wan / H
  (diloco) or max(0, T_wan / H - T_pipe) (streaming-diloco).
* `virtual_stages=v > 1` runs Megatron's interleaved 1F1B order (v chunks per device,
  each 1/v of the stage's time; needs m % p == 0). Plans do not carry v yet (issue 11
  item 2); the option exists so that the closed form for interleaving can be checked.
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
from placer.perf.pipeline import simulate_1f1b
from placer.perf.step import Config, PerfModel
from placer.schema import Plan
from placer.sim.fabric import Fabric

__all__ = ["SimOptions", "SimulationResult", "Transfer", "schedule", "simulate"]


@dataclass(frozen=True)
class SimOptions:
    dp_buckets: int = 0  # 0: each stage syncs after its last backward (no overlap)
    virtual_stages: int = 1


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
    if options.dp_buckets < 0:
        raise InputError(f"dp_buckets must be >= 0, got {options.dp_buckets}")
    if options.virtual_stages < 1:
        raise InputError(f"virtual_stages must be >= 1, got {options.virtual_stages}")
    plan = plan_from_data(plan)
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
    # the optimizer step runs once gradients are reduced, on every GPU at once: the step
    # waits for the slowest stage's (PerfModel.optimizer_step_s, as the closed form adds it)
    opt = max(perf.optimizer_step_s(ev.config, chain) for chain in set(job.chains))
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
        self.p, self.m, self.v = cfg.pp, cfg.num_micro_batches, options.virtual_stages
        self.chains = [tuple(g.stage_sites) for g in plan.replica_groups for _ in range(g.count)]
        inst = problem.instance
        self.gpu_of = {s.name: s.gpu for s in inst.sites}
        # per pipeline rank k and site: stage times (seconds per micro-batch, per chunk)
        self.fwd: dict[int, dict[str, float]] = defaultdict(dict)
        self.bwd: dict[int, dict[str, float]] = defaultdict(dict)
        self.fwd_c: dict[int, dict[str, float]] = defaultdict(dict)
        self.bwd_c: dict[int, dict[str, float]] = defaultdict(dict)
        for k, site in self.device_stage_sites():
            st = perf.stage_times(cfg, self.gpu_of[site])[k]
            self.fwd[k][site], self.bwd[k][site] = st.fwd, st.bwd
            self.fwd_c[k][site], self.bwd_c[k][site] = st.fwd_compute, st.bwd_compute
        self.msg_bytes = perf.message_bytes(cfg)
        self.intra_lat = problem.catalog.network.intra_site_latency_s
        net = perf.net
        optic_of = {tuple(r["sites"]): r["optic"] for r in ev.links}
        waves = {tuple(r["sites"]): r["waves"] for r in ev.links}
        self.route_cap = {
            key: net.capacity_Bps(key, waves.get(key, 0), optic_of.get(key)) for key in net.routes
        }

    def device_stage_sites(self) -> list[tuple[int, str]]:
        return sorted({(k, s) for c in self.chains for k, s in enumerate(c)})

    def nic_Bps(self, site: str) -> float:
        return self.perf.nic_Bps(self.problem.catalog.gpus[self.gpu_of[site]]) * self.cfg.tp

    def _fabric(self, env: simpy.Environment) -> Fabric:
        fab = Fabric(env)
        for r, chain in enumerate(self.chains):
            for k, site in enumerate(chain):
                fab.add_link(("nic-out", r, k), self.nic_Bps(site))
                fab.add_link(("nic-in", r, k), self.nic_Bps(site))
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
        if self.v > 1:
            return self.run(comm=False).pipe_s
        out = 0.0
        for chain in set(self.chains):
            f = [self.fwd[k][s] for k, s in enumerate(chain)]
            b = [self.bwd[k][s] for k, s in enumerate(chain)]
            zeros = [0.0] * (self.p - 1)
            out = max(out, simulate_1f1b(f, b, zeros, zeros, self.m).makespan_s)
        return out

    # ------------------------------------------------------------------ one step

    def run(self, comm: bool) -> _Run:
        env = simpy.Environment()
        run = _Run(env, self._fabric(env))
        p, v, m = self.p, self.v, self.m
        n_stages = p * v
        act: dict[tuple[int, int, int], simpy.Event] = {}
        grad: dict[tuple[int, int, int], simpy.Event] = {}
        n_buckets = max(1, self.opt.dp_buckets)
        ready = {
            (r, k): [env.event() for _ in range(n_buckets)]
            for r in range(len(self.chains))
            for k in range(p)
        }

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
            if not comm:
                target.succeed()
                if sent is not None:
                    sent.succeed()
                return
            key = (r, s % p, dst % p)
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
            src_dev, dst_dev = s % p, dst % p
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
            f, b = self.fwd[k][site] / v, self.bwd[k][site] / v
            ops = schedule(p, m, v, k)
            for i, (kind, x, s) in enumerate(ops):
                if kind == "F" and s > 0:
                    yield inbox(act, (r, s, x))
                elif kind == "B" and s < n_stages - 1:
                    yield inbox(grad, (r, s, x))
                dur = f if kind == "F" else b
                last = i == len(ops) - 1
                if last and self.opt.dp_buckets:
                    env.process(_buckets(env, ready[(r, k)], dur, self.opt.dp_buckets))
                yield env.timeout(dur)
                if kind == "F" and s < n_stages - 1:
                    send("F", r, s, x)
                elif kind == "B" and s > 0:
                    # without overlap the sync starts once the schedule's last send is out
                    # (Megatron reduces gradients after forward_backward_func returns)
                    send(
                        "B", r, s, x, ready[(r, k)][0] if last and not self.opt.dp_buckets else None
                    )
                elif last and not self.opt.dp_buckets:
                    ready[(r, k)][0].succeed()
            run.pipe_s = max(run.pipe_s, env.now)

        for r in range(len(self.chains)):
            for k in range(p):
                env.process(device(r, k))
        run.sync_end = [0.0] * p
        if comm and self.cfg.dp >= 2:
            wan = self.cfg.sync_mode == "synchronous"
            for k in range(p):
                env.process(self._stage_sync(run, k, ready, n_buckets, wan))
        env.run()
        return run

    def _stage_sync(self, run: _Run, k: int, ready: dict, n_buckets: int, wan: bool) -> Generator:
        env = run.env
        members = range(len(self.chains))
        for j in range(n_buckets):
            yield env.all_of([ready[(r, k)][j] for r in members])
            yield from self._allreduce(run, k, 1.0 / n_buckets, wan=wan, intra=True)
        run.sync_end[k] = env.now

    def _by_site(self, k: int) -> dict[str, list[int]]:
        out: dict[str, list[int]] = defaultdict(list)
        for r, chain in enumerate(self.chains):
            out[chain[k]].append(r)
        return dict(sorted(out.items()))

    def _allreduce(self, run: _Run, k: int, fraction: float, wan: bool, intra: bool) -> Generator:
        """Hierarchical all-reduce of `fraction` of rank k's gradient (see module doc)."""
        env, fab = run.env, run.fabric
        by_site = self._by_site(k)
        grad = self.perf.stage_grad_bytes(self.cfg, k) * self.cfg.tp * fraction  # per device, bf16
        wan_bytes = self.perf.stage_wan_bytes(self.cfg, k) * fraction  # whole stage, at sync bits

        def ring_phase() -> Generator:
            procs = []
            for members in by_site.values():
                n = len(members)
                if n < 2:
                    continue
                for i, r in enumerate(members):
                    nxt = members[(i + 1) % n]
                    f = fab.transfer((n - 1) / n * grad, [("nic-out", r, k), ("nic-in", nxt, k)])
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

        if intra:
            yield from ring_phase()  # reduce-scatter inside each site
        if wan and len(by_site) >= 2:
            yield from wan_round()  # reduce-scatter of the site shards between sites
            yield from wan_round()  # all-gather of the reduced shards
        if intra:
            yield from ring_phase()  # all-gather inside each site

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
    The larger side has one flow per member, each 1/max(n_src, n_dst) of the bytes,
    dealt round-robin over the smaller side (exactly balanced when one count divides the
    other): max(n_src, n_dst) flows instead of n_src x n_dst."""
    if n_src >= n_dst:
        return [(i, i % n_dst, 1.0 / n_src) for i in range(n_src)]
    return [(j % n_src, j, 1.0 / n_dst) for j in range(n_dst)]


def _after(env: simpy.Environment, event: simpy.Event, delay: float) -> Generator:
    yield event
    if delay > 0:
        yield env.timeout(delay)


def _buckets(env: simpy.Environment, events: list[simpy.Event], dur: float, n: int) -> Generator:
    """Gradient buckets of the last backward: the j-th is ready after (j + 1) / n of it."""
    for j in range(n):
        yield env.timeout(dur / n)
        events[j].succeed()
