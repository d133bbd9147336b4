"""Lockstep contention in the formulations: tick times per hop, transmit times per crossing,
and the supporting planes of each chain type's 1F1B time.

Under lockstep 1F1B (placer.perf.step.PerfModel.route_tick_s) a cross-site message takes
the larger of its NIC serialization and its hop's tick time, the activation bytes of every
replica crossing that hop at the same tick over the route's capacity. The tick depends on
the placement and the waves, so a chain's 1F1B time becomes a function of decisions. It is
convex and piecewise linear in the crossings' transmit times ``tau`` and latencies ``lam``
(placer.perf.critical_path): the formulations write it as

    T_pipe >= const + sum_i n_i tau_i + sum_i l_i lam_i      for every plane of a chain type
                                                              in use

and the planes are generated: one at build time (the uncontended chain, a constant), then,
after each solve, the plane at the plan's own
point for every chain whose true time no plane reaches yet (Kelley's cutting planes). Each
plane is a true path of the schedule, valid for every plan, so the model stays a relaxation
and its bound stays valid; once a plan meets the planes of its own point, the model's step
time is the evaluator's and the plan is optimal for the true model (placer.optimize.driver
runs the loop).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from placer.io import Problem
from placer.network import PairKey, Routing, route_key
from placer.perf.step import Chain, Config, Hop, PerfModel, hops_of

TOL = 1e-9  # a plan's true chain time above every plane by more than this (relative) is cut


@dataclass(frozen=True)
class Crossing:
    """A chain boundary between two sites."""

    boundary: int
    pair: PairKey
    nic_s: float  # the message's NIC serialization
    # per candidate path (the pair's order, shortest first): the hops in travel direction
    # and the boundary latency (fabric hop plus the path's fiber)
    hops: tuple[tuple[Hop, ...], ...]
    latency_s: tuple[float, ...]


@dataclass(frozen=True)
class Plane:
    """chain time >= const + sum_i tau[i] x tau_i + sum_i lam[i] x lam_i (i: crossings)."""

    const: float
    tau: tuple[int, ...]
    lam: tuple[int, ...]

    def value(self, taus: tuple[float, ...], lams: tuple[float, ...]) -> float:
        return (
            self.const
            + sum(n * t for n, t in zip(self.tau, taus, strict=True))
            + sum(n * t for n, t in zip(self.lam, lams, strict=True))
        )


@dataclass
class ChainPlanes:
    """One chain type's crossings and the planes generated so far."""

    chain: Chain
    crossings: list[Crossing]
    planes: list[Plane] = field(default_factory=list)
    # chain types with the same signature (stage times, which boundaries cross sites, the
    # other boundaries' times) have the same 1F1B function of their crossings' times:
    # a plane of one is a plane of all (placer.optimize.data groups them)
    signature: tuple = ()
    spread: bool = False  # given planes by _spread (a configuration's later calls spend less)

    def covers(self, point: tuple[tuple[float, ...], tuple[float, ...]], t: float) -> bool:
        best = max((p.value(*point) for p in self.planes), default=-math.inf)
        return best >= t * (1 - TOL) - 1e-12


def crossings(perf: PerfModel, cfg: Config, chain: Chain, paths: dict) -> list[Crossing]:
    out = []
    intra = perf.catalog.network.intra_site_latency_s
    for j, (a, b, _streams) in enumerate(
        perf.chain_boundaries(chain, cfg.virtual_stages, cfg.dualpipev)
    ):
        if a == b:
            continue
        q = route_key(a, b)
        cands = paths[q]
        _lat, nic = perf.boundary(cfg, a, b)
        out.append(
            Crossing(
                j,
                q,
                nic,
                tuple(tuple(hops_of(p, a)) for p in cands),
                tuple(intra + p.latency_s for p in cands),
            )
        )
    return out


def plane_at(
    perf: PerfModel,
    cfg: Config,
    cp: ChainPlanes,
    taus: tuple[float, ...],
    lams: tuple[float, ...],
) -> Plane:
    """The supporting plane of the chain's time at the given crossing transmit times and
    latencies (the other boundaries at their fixed intra-site values)."""
    fwd, bwd, lat, tx = perf.chain_times_at(cfg, cp.chain, None, None)
    for i, x in enumerate(cp.crossings):
        tx[x.boundary] = taus[i]
        lat[x.boundary] = lams[i]
    path = perf.schedule_path(cfg, cp.chain, fwd, bwd, lat, tx)
    const, n, lc = path.plane(tx, lat)
    const += perf.optimizer_step_s(cfg, cp.chain)
    cross = {x.boundary for x in cp.crossings}
    # boundaries inside a site keep their times: fold them into the constant
    for j in range(len(tx)):
        if j not in cross:
            const += n[j] * tx[j] + lc[j] * lat[j]
    return Plane(
        const,
        tuple(n[x.boundary] for x in cp.crossings),
        tuple(lc[x.boundary] for x in cp.crossings),
    )


def seed_planes(cp: ChainPlanes, uncontended_s: float) -> None:
    """The first plane: the chain's uncontended time on its shortest paths, a constant
    (zero slopes). Valid because the 1F1B time is non-decreasing in every transmit and
    latency, and no crossing is faster than its NIC or its shortest path. The planes with
    slopes come from the plans the solver proposes (add_violated_planes): computing them
    for every chain type up front would cost more than the solves (a critical path per
    chain type and point)."""
    n = len(cp.crossings)
    cp.planes.append(Plane(uncontended_s, (0,) * n, (0,) * n))


def chain_points(
    perf: PerfModel,
    cfg: Config,
    groups: list[tuple[int, Chain]],
    capacity_Bps: dict,
    routing: Routing | None,
    factor: dict | None = None,
) -> dict[Chain, tuple[tuple[tuple[float, ...], tuple[float, ...]], float]]:
    """Per chain of a plan: its crossings' (transmit, latency) point and its true 1F1B time
    (the evaluator's, placer.perf.step), healthy or under a failure's route `factor`."""
    tick = perf.route_tick_s(cfg, groups, capacity_Bps, routing, factor)
    out = {}
    for _, chain in groups:
        point = point_at(perf, cfg, chain, routing, tick)
        out[chain] = (point, perf.chain_time(cfg, chain, routing=routing, tick_s=tick or None))
    return out


def point_at(
    perf: PerfModel, cfg: Config, chain: Chain, routing: Routing | None, tick: dict
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """A chain's crossings' (transmit, latency) point under the routes' lockstep ticks
    `tick` (PerfModel.route_tick_s of some plan, whether or not the chain is in it)."""
    v, dual = cfg.virtual_stages, cfg.dualpipev
    lats = perf.boundary_latencies(chain, routing, v, dual) if routing else None
    ticks = perf.boundary_ticks(chain, routing, tick, v, dual) if tick else None
    _f, _b, lat, tx = perf.chain_times_at(cfg, chain, lats, ticks)
    bounds = perf.chain_boundaries(chain, v, dual)
    cross = [j for j, (a, b, _) in enumerate(bounds) if a != b]
    return (tuple(tx[j] for j in cross), tuple(lat[j] for j in cross))


def add_violated_planes(
    problem: Problem,
    perf: PerfModel,
    cfg: Config,
    planes: list[ChainPlanes],
    counts: dict[int, int],
    waves: dict,
    routing: Routing | None,
    scenarios: list[dict] | None = None,
    stop_at: float | None = None,
) -> int:
    """Add, for every chain in use whose true time (healthy, and under each failure's
    route factors in `scenarios`) no plane reaches, the plane at its point; then, when
    any was added, spread planes to the chain types not in use (_spread; until
    perf_counter() `stop_at`). Returns how many planes the plan's own chains gained (0:
    the model priced the plan exactly)."""
    net = perf.net
    groups = [(n, planes[c].chain) for c, n in sorted(counts.items()) if n > 0]
    if not groups:
        return 0
    by_chain = {planes[c].chain: planes[c] for c in counts}
    cap = {r: net.capacity_Bps(r, waves.get(r, 0)) for r in net.routes}
    added = 0
    for factor in [None, *(scenarios or [])]:
        for chain, (point, t) in chain_points(perf, cfg, groups, cap, routing, factor).items():
            cp = by_chain[chain]
            if math.isfinite(t) and not cp.covers(point, t):
                before = len(cp.planes)
                added += _add_around(perf, cfg, cp, point)
                new = cp.planes[before:]
                _share(planes, cp, new)
    if added:
        used = {planes[c].chain for c, n in counts.items() if n > 0}
        _spread(perf, cfg, planes, used, groups, cap, routing, stop_at)
    return added


def _share(planes: list[ChainPlanes], cp: ChainPlanes, new: list[Plane]) -> None:
    """Chain types of cp's signature have the same 1F1B function: the same planes."""
    for other in planes:
        if other is not cp and other.signature == cp.signature:
            have = set(other.planes)
            other.planes.extend(p for p in new if p not in have)


def _spread(
    perf: PerfModel,
    cfg: Config,
    planes: list[ChainPlanes],
    used: set[Chain],
    groups: list[tuple[int, Chain]],
    cap: dict,
    routing: Routing | None,
    stop_at: float | None = None,
) -> None:
    """Every chain type not in the plan whose crossings meet a route the plan loads gets
    the planes at the plan's lockstep ticks and around them (_add_around), once per
    signature. Valid cuts (each a true path of its schedule), added where the next plans
    go: a round's plan moves replicas to other chain types on the same routes and to
    other wave counts, most often a tie of the optimum with fewer waves (the canonical
    plan, families.TieBreak), and each such chain type priced by its uncontended plane
    alone made a round of its own (seed-1t-two-sites: four rounds; two-campus-100km:
    four, two with these; benchmarks/README.md, branch repeats2). As many signatures a
    call as SPREAD_WORK allows, the chain types no call has spread to first, then in
    chain-type order (deterministic: a later call's quarter budget went to re-checking
    the first call's signatures, and megatron-1t at 50 km took a round more), and none
    past `stop_at`: the cuts only speed the rounds up (megatron-1t at pp 32 over two
    campuses: 80 s for every signature of one round, past the solve's time limit)."""
    tick = perf.route_tick_s(cfg, groups, cap, routing)
    if not tick:
        return
    hot = {h for h, t in tick.items() if t > 0}
    done = {planes[c].signature for c, cp in enumerate(planes) if cp.chain in used}
    # a critical path's work: every (rank, chunk, micro-batch) op of the schedule; the
    # first call of a configuration SPREAD_WORK, the later ones a quarter (their points
    # lie between planes the first call's neighbours already hold)
    per_plane, spent = cfg.pp * cfg.virtual_stages * cfg.num_micro_batches, 0
    budget = SPREAD_WORK // 4 if any(cp.spread for cp in planes) else SPREAD_WORK
    for cp in sorted(planes, key=lambda cp: cp.spread):  # stable: chain-type order after
        if cp.signature in done or not cp.crossings:
            continue
        if not any(h in hot for x in cp.crossings for hops in x.hops for h in hops):
            continue
        if spent + per_plane * (1 + len(NEIGHBOURS)) > budget or (
            stop_at is not None and time.perf_counter() > stop_at
        ):
            return
        done.add(cp.signature)
        point = point_at(perf, cfg, cp.chain, routing, tick)
        if not all(math.isfinite(x) for x in (*point[0], *point[1])):
            continue
        at = plane_at(perf, cfg, cp, *point)
        spent += per_plane
        if at in cp.planes or cp.covers(point, at.value(*point)):
            continue  # an earlier round's planes price this point already
        before = len(cp.planes)
        spent += per_plane * len(NEIGHBOURS)
        cp.spread = True
        if _add_around(perf, cfg, cp, point, at):
            _share(planes, cp, cp.planes[before:])


def signature(perf: PerfModel, cfg: Config, chain: Chain, xs: list[Crossing]) -> tuple:
    fwd, bwd, lat, tx = perf.chain_times_at(cfg, chain, None, None)
    cross = {x.boundary for x in xs}
    rest = tuple((lat[j], tx[j]) for j in range(len(lat)) if j not in cross)
    # boundaries sharing a route direction share a FIFO in a fixed order (boundary_queues)
    queues = None if cfg.dualpipev else perf.boundary_queues(chain, None, cfg.virtual_stages)
    service = perf.queue_service(cfg, chain, queues)[0]
    return (
        tuple(fwd),
        tuple(bwd),
        tuple(sorted(cross)),
        rest,
        perf.optimizer_step_s(cfg, chain),
        queues,
        None if service is None else tuple(sorted(service.items())),
    )


SPREAD_WORK = 250_000  # schedule ops (pp x v x micro-batches per critical path) that a
# configuration's first _spread call may spend (its later calls a quarter): seed-1t-two-
# sites' 32 signatures at 9 critical paths of pp 32 x 48 take 440k (3 s; 400k: CP-SAT 14-16
# s, 250k: 22 s); megatron-1t over two campuses (tests/test_solver_properties.py) spends
# 7-17 us an op, and unbudgeted took 80 s in one round, past its 60 s limit (400k: 35 s,
# 61 s under make test's load; 250k: 29 s; benchmarks/README.md, branch repeats2)

NEIGHBOURS = (1 / 64, 1 / 16, 1 / 4, 1 / 2, 2.0, 4.0, 16.0)  # the planes at a violated
# point and at these multiples of its transmit times above the NIC's: the next round's plan
# usually moves along that line (more or fewer waves, more or fewer replicas on the route),
# and a plane costs one critical path, far less than a round of solving


def _add_around(
    perf: PerfModel,
    cfg: Config,
    cp: ChainPlanes,
    point: tuple[tuple[float, ...], tuple[float, ...]],
    at_point: Plane | None = None,
) -> int:
    """The planes at `point` (`at_point` when the caller has it) and at its NEIGHBOURS."""
    taus, lams = point
    nic = tuple(x.nic_s for x in cp.crossings)
    added = 0
    seen = set(cp.planes)
    for f in (1.0, *NEIGHBOURS):
        at = tuple(n + f * (t - n) for n, t in zip(nic, taus, strict=True))
        pl = at_point if f == 1.0 and at_point is not None else plane_at(perf, cfg, cp, at, lams)
        if pl not in seen:
            seen.add(pl)
            cp.planes.append(pl)
            added += 1
    return added


def crossings_on(
    planes: list[ChainPlanes], sloped: set[int], hops: list[Hop]
) -> dict[int, set[int]]:
    """Per chain type with sloped planes, its crossings that may use one of `hops` (on any
    candidate path): the transmit times a failure of their route changes. Both
    formulations' failure rows read it."""
    out: dict[int, set[int]] = {}
    for c, cp in enumerate(planes):
        if c not in sloped:
            continue
        hit = {i for i, x in enumerate(cp.crossings) if any(h in hops for p in x.hops for h in p)}
        if hit:
            out[c] = hit
    return out


def sloped_chains(planes: list[ChainPlanes]) -> set[int]:
    """The chain types with a plane that has a transmit or latency slope (added by an earlier
    round's plan): only they need transmit variables in the formulations."""
    return {c for c, cp in enumerate(planes) if any(any(pl.tau) or any(pl.lam) for pl in cp.planes)}


def hops_crossed(planes: list[ChainPlanes], chains: set[int]) -> set[Hop]:
    """The directed hops that the crossings of `chains` use: only they need tick variables."""
    return {h for c in chains for x in planes[c].crossings for hops in x.hops for h in hops}
