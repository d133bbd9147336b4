"""Coefficients of the inner problem of one configuration, shared by every backend.

Everything here is computed by the performance model (placer.perf.step) and the
network (placer.network), so the formulations and the evaluator read the same numbers.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from placer.io import Problem
from placer.network import Network, PairKey, Path, RouteKey, route_key
from placer.optimize import deadline
from placer.perf.step import Chain, Config, PerfModel
from placer.rules import (
    amortization_s,
    energy_usd_per_j,
    node_it_w,
    node_usd_per_s,
    replica_slots,
    site_gpus_per_node,
    waves_lost,
)
from placer.schema import Plan


@dataclass(frozen=True)
class WaveOption:
    waves: int
    capacity_Bps: float
    capex_usd: float
    module_w: float  # coherent module power at each end


@dataclass
class ResilienceData:
    """What the formulations need to keep the worst single failure within the limit."""

    collective: str
    max_slowdown: float
    max_step_time_s: float | None
    # (class, route) -> per wave option: degraded capacity (B/s) and, per number of
    # participating sites p (index p), the data-parallel slowdown factor
    degraded_capacity: dict[tuple[str, RouteKey], list[float]]
    dp_factor: dict[tuple[str, RouteKey], list[list[float]]]
    nic_factor: float | None  # intra-site sync slowdown under one lost NIC, or None


@dataclass
class InnerData:
    cfg: Config
    chains: list[Chain]
    chain_time: list[float]  # on shortest paths
    chain_cross: list[dict[RouteKey, int]]  # routes crossed via fixed-path pairs only
    pp_bytes_per_crossing: float
    sites: list[str]
    site_groups: dict[str, int]  # TP groups the site can host (node granularity)
    site_groups_per_node: dict[str, int]
    site_nodes: dict[str, int]
    site_node_w: dict[str, float]  # all-in W of one node
    site_node_usd_per_s: dict[str, float]  # GPU-hour price of one node, per second (0: sunk)
    site_pue: dict[str, float]
    site_power_w: dict[str, float | None]
    routes: list[RouteKey]
    route_optic: dict[RouteKey, str | None]
    wave_options: dict[RouteKey, list[WaveOption]]
    intra: dict[tuple[int, str], float]  # (stage, site) -> intra-site sync seconds
    wan_bytes: list[float]  # S_k
    pairs: list[tuple[str, str]]
    pair_routes: dict[tuple[str, str], list[RouteKey]]
    pair_latency: dict[tuple[str, str], float]
    disconnected: list[tuple[str, str]]
    sync_mode: str
    every_steps: int
    max_step_time_s: float | None
    max_cost_usd: float | None
    stage_sites: list[list[str]] = field(default_factory=list)  # sites that may host stage k
    amortization_s: float = math.inf  # catalog costs.amortization_years (placer.rules)
    energy_usd_per_j: float = 0.0
    resilience: ResilienceData | None = None
    stage_classes: list[list[int]] = field(default_factory=list)
    # part-filled nodes and the site's own ring (PerfModel.intra_sync_s): replicas per node
    # of a site whose NIC phase depends on its member count (0: one coefficient, intra),
    # and per (stage, site) the intra-site sync seconds by member count n = 1 .. dp (its
    # ring of ceil(n / q) nodes, its fill by n mod q)
    fill_q: dict[str, int] = field(default_factory=dict)
    intra_fill: dict[tuple[int, str], dict[int, float]] = field(default_factory=dict)
    # per (stage, site), c_{k,s} of the WAN phase's NIC term (PerfModel.wan_nic_coef_s):
    # a stage hosted by K sites pays (K - 1)/K c / n at each hosting site of n members
    wan_nic: dict[tuple[int, str], float] = field(default_factory=dict)
    # multi-commodity routing: pairs with several candidate paths get flow variables
    pair_paths: dict[PairKey, list[Path]] = field(
        default_factory=dict
    )  # candidates, shortest first
    chain_pairs: list[list[PairKey]] = field(default_factory=list)  # pairs each chain crosses
    # chain -> {levels: 1F1B time} where levels[i] indexes the slowest path used for the
    # chain's i-th routed pair (only for chains that cross a routed pair)
    chain_level_time: list[dict[tuple[int, ...], float]] = field(default_factory=list)
    # data-parallel overlap (PerfModel.dp_pieces): (fraction of the per-step sync, window
    # in seconds it hides under); exposed = sum max(0, f sync - window)
    dp_pieces: tuple[tuple[float, float], ...] = ((1.0, 0.0),)
    # per piece, R (PerfModel.dp_lat_repeats): its half's buckets pay the WAN latency R
    # more times, the piece exposing max(0, f (sync + R T_lat) - window) when synchronous
    dp_lat_repeats: tuple[int, ...] = (0,)
    # per stage, R_k (PerfModel.dp_stage_repeats), and per sequence (sync, gather) the
    # share of it bucketed (PerfModel.dp_repeat_share): with release groups each group's
    # work carries the largest share x R_k x its pairs' latency of its stages in place of
    # dp_lat_repeats' R T_lat on every piece
    dp_stage_repeats: tuple[int, ...] = ()
    dp_repeat_share: tuple[float, float] = (0.0, 0.0)
    # per stage, delta_k (PerfModel.dp_release_s): its WAN sync starts at T_pipe - delta_k
    # (a few distinct values, the release groups); per piece, whether it sees that
    # staggered WAN phase (PerfModel.dp_staggered) or every stage's at once
    dp_release: tuple[float, ...] = ()
    dp_staggered: tuple[bool, ...] = (True,)
    # per chain type, per release group (release_groups' order), the chain's own tail
    # and head at the group's first stage (PerfModel.chain_offsets_s): the group's sync
    # starts at max over the chain types in use of T_c - tail, its gather is exposed past
    # T_c - head, each against T_pipe (PerfModel.step); empty without a stagger
    release_tail: list[tuple[float, ...]] = field(default_factory=list)
    fill_head: list[tuple[float, ...]] = field(default_factory=list)
    # (sync, gather): the integer each credit (T_end - the moment) is multiplied by in the
    # staggered rows, 1 / the fraction of the sync that runs as one sequence from that
    # moment (PerfModel.dp_credit_scale: 2 for ZeRO-1's overlapped halves)
    dp_credit_scale: tuple[int, int] = (1, 1)
    # whether each release group's WAN work is its routes' U_g after its NIC phase (False
    # on an instance with a flow-routed pair, PerfModel.any_dp_pair_routed: there each
    # stage's own routes at its group's load, B_series, and the group's NIC phase alone)
    dp_wan_stagger: bool = True
    # physical nodes per formulation "node": 1, or the whole nodes one replica stage of
    # tp x cp x ep GPUs spans when it is wider than a node (rules.replica_slots)
    site_node_block: dict[str, int] = field(default_factory=dict)
    # lockstep contention (placer.optimize.contention): per chain type its crossings and
    # planes (None: staggered replicas, no per-tick term); per hop the boundaries of each
    # chain type that cross it on a single-path pair; a routed pair's per-step flow times
    # tick_fraction is its per-tick load
    planes: list[Any] | None = None
    hop_cross: dict[tuple[str, str], dict[int, int]] = field(default_factory=dict)
    message_bytes: float = 0.0
    tick_fraction: float = 0.0
    _series_memo: dict[tuple[int, ...], list[tuple[int, int]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def routed(self, pair: PairKey) -> bool:
        """Whether the pair's split over paths is a decision (it has several candidates)."""
        return len(self.pair_paths.get(pair, ())) >= 2

    def chain_routed_pairs(self, c: int) -> list[PairKey]:
        return [q for q in self.chain_pairs[c] if self.routed(q)]

    def routed_crossings(self) -> dict[PairKey, list[int]]:
        """Routed pairs some chain crosses, each with the chains that cross it (sorted)."""
        out: dict[PairKey, list[int]] = {}
        for c in range(len(self.chains)):
            for q in self.chain_routed_pairs(c):
                out.setdefault(q, []).append(c)
        return dict(sorted(out.items()))

    def class_wan_bytes(self, cls: list[int]) -> float:
        return sum(self.wan_bytes[k] for k in cls)

    @property
    def release_groups(self) -> list[float]:
        """The distinct release offsets, smallest first (one: no stagger)."""
        return sorted(set(self.dp_release)) or [0.0]

    @property
    def gather_staggered(self) -> bool:
        """Whether some piece is the staggered gather (PerfModel.step, gather_staggered_s):
        a piece dp_staggered does not mark, with at least two release groups."""
        return len(self.release_groups) >= 2 and not all(self.dp_staggered)

    @property
    def repeat_ratio(self) -> float:
        """The share of the staggered sequences that pays each stage's latency repeats in
        the release groups' works (0: none there). The sequences that have any share it:
        1 for each, or 1/2 for ZeRO-1's bucketed reduce-scatter with its gather in the
        same sequence (no gather sequence then), so one set of variables carries both."""
        if self.sync_mode != "synchronous" or len(self.release_groups) < 2:
            return 0.0
        if not any(r > 0 for r in self.dp_stage_repeats):
            return 0.0
        shares = {x for x in self.dp_repeat_share if x > 0}
        if len(shares) > 1:
            raise ValueError(f"two bucketed sequences of different shares: {shares}")
        return shares.pop() if shares else 0.0

    def class_release_fraction(self, cls: list[int], g: float) -> float:
        """The part of the class's WAN bytes released at or after T_pipe - g."""
        total = self.class_wan_bytes(cls)
        part = sum(self.wan_bytes[k] for k in cls if self.dp_release[k] <= g)
        return part / total if total > 0 else 1.0

    def class_wan_nic(self, cls: list[int], site: str, g: float | None = None) -> float:
        """The largest c_{k,s} (wan_nic) over the class's stages (in release group g; 0:
        none there): the stages of a class share their hosts, so the slowest one's
        NIC term is the class's."""
        ks = cls if g is None else self.group_stages(cls, g)
        return max((self.wan_nic[(k, site)] for k in ks), default=0.0)

    def has_wan_nic(self, k: int) -> bool:
        """Whether stage k pays a WAN NIC term at some candidate site (wan_nic)."""
        return any(self.wan_nic[(k, s)] > 0 for s in self.stage_sites[k])

    def class_intra(self, cls: list[int], site: str) -> float:
        return max(self.intra[(k, site)] for k in cls)

    def class_intra_fill(self, cls: list[int], site: str) -> dict[int, float]:
        """The class's intra-site sync seconds by member count (see intra_fill)."""
        states = self.intra_fill[(cls[0], site)]
        return {st: max(self.intra_fill[(k, site)][st] for k in cls) for st in states}

    def group_stages(self, cls: list[int], g: float) -> list[int]:
        """The class's stages released at or after T_pipe - g (release group g)."""
        return [k for k in cls if self.dp_release[k] <= g]

    def class_intra_group(self, cls: list[int], site: str, g: float) -> float:
        """class_intra over the class's stages in release group g (0: none there); the
        staggered sync's NIC phase of that group (PerfModel.step, sync_staggered_s)."""
        ks = self.group_stages(cls, g)
        return max((self.intra[(k, site)] for k in ks), default=0.0)

    def class_intra_fill_group(self, cls: list[int], site: str, g: float) -> dict[int, float]:
        """class_intra_fill over the class's stages in release group g ({}: none there)."""
        ks = self.group_stages(cls, g)
        if not ks:
            return {}
        states = self.intra_fill[(cls[0], site)]
        return {st: max(self.intra_fill[(k, site)][st] for k in ks) for st in states}

    def series_stages(self, cls: list[int], g: float) -> list[int]:
        """The class's stages in release group g with per-stage terms (PerfModel.step:
        each release group's work is at least every stage's own NIC phase, latency and
        latency repeats in series with the group's routes, and its own NIC phase,
        latency, NIC term and repeats in series): none where one site hosts the class. Of
        the rest,
        the ones no other dominates (at every hosting site and member count, a NIC phase
        and a NIC-term coefficient at least as large, and as many repeats R_k; the first
        of equals: the class's stages share their hosts, hence their pairs' latency), so
        that the largest over these is the largest over all: per class usually one."""
        hosts = self.stage_sites[cls[0]]
        if len(hosts) < 2:
            return []
        ks = self.group_stages(cls, g)

        def profile(k: int) -> list[float]:
            out: list[float] = [self.dp_stage_repeats[k] if self.dp_stage_repeats else 0]
            for s in hosts:
                fill = self.intra_fill.get((k, s), {})
                out += [self.intra[(k, s)], *(fill[n] for n in sorted(fill)), self.wan_nic[(k, s)]]
            return out

        prof = {k: profile(k) for k in ks}

        def dominated(k: int) -> bool:
            return any(
                j != k
                and all(a >= b for a, b in zip(prof[j], prof[k], strict=True))
                and (prof[j] != prof[k] or j < k)
                for j in ks
            )

        return [k for k in ks if not dominated(k)]

    def series_keys(self, cls: list[int]) -> list[tuple[int, int]]:
        """(first release group index, stage) of the class's per-stage terms: the stages
        series_stages keeps in some release group, each once, with the first group that
        holds it (a stage is in that group and every later one: its variables serve
        them all, the works of a group taking the keys whose first group is not later;
        a stage a group's series_stages drops is dominated there by one it keeps, so
        the extra works change no max). Computed once per class (the formulations read
        them per site and per pair)."""
        key = tuple(cls)
        if key not in self._series_memo:
            groups = self.release_groups
            kept = {j for g in groups for j in self.series_stages(cls, g)}
            first = {j: sum(g < self.dp_release[j] for g in groups) for j in kept}
            self._series_memo[key] = sorted((i, j) for j, i in first.items())
        return self._series_memo[key]

    @property
    def intra_lower_bound(self) -> float:
        """Every stage is hosted somewhere and, with dp >= 2, pays its NIC phases there."""
        lb = 0.0
        for k, hosts in enumerate(self.stage_sites):
            if self.cfg.dp >= 2 and hosts:
                lb = max(
                    lb,
                    min(
                        min(self.intra_fill[(k, s)].values())
                        if (k, s) in self.intra_fill
                        else self.intra[(k, s)]
                        for s in hosts
                    ),
                )
        return lb

    @property
    def n_stages(self) -> int:
        return self.cfg.pp


def build_inner(
    problem: Problem,
    perf: PerfModel,
    cfg: Config,
    chains: list[Chain],
    collective: str | None = None,
) -> InnerData:
    inst, cat, net = problem.instance, problem.catalog, perf.net
    sites = [s.name for s in inst.sites]
    budget = inst.objective.max_cost_usd
    groups, gpn_groups, nodes, node_w, pue, power = {}, {}, {}, {}, {}, {}
    node_usd, node_block = {}, {}
    for s in inst.sites:
        gpn = site_gpus_per_node(problem, s.name)
        # a replica-stage is tp x cp x ep GPUs: several per node, or (wider than a node)
        # a block of whole nodes; the formulations' "node" is then that block, so that
        # their rows stay `groups per node x nodes >= replica-stages` (rules.replica_slots)
        per, block = replica_slots(gpn, cfg.tp, cfg.width)
        gpn_groups[s.name] = per
        nodes[s.name] = s.gpus // gpn // block
        groups[s.name] = nodes[s.name] * gpn_groups[s.name]
        node_w[s.name] = node_it_w(problem, s.name) * block
        node_usd[s.name] = node_usd_per_s(problem, s.name) * block
        node_block[s.name] = block
        pue[s.name] = s.pue
        power[s.name] = None if s.power_mw is None else s.power_mw * 1e6
    routes = sorted(net.routes)
    optic, options = {}, {}
    for r in routes:
        o = net.default_optic(r)
        optic[r] = o
        opts = [WaveOption(0, net.capacity_Bps(r, 0), 0.0, 0.0)]
        if o is not None:
            for v in range(1, net.max_waves(r, o) + 1):
                capex = net.link_capex_usd(r, v, o)
                if budget is not None and capex > budget * (1 + 1e-9):
                    break
                opts.append(
                    WaveOption(v, net.capacity_Bps(r, v, o), capex, v * cat.optics[o].module_w)
                )
        options[r] = opts
    intra = {(k, s): perf.intra_sync_s(cfg, k, s) for k in range(cfg.pp) for s in sites}
    fill_q = {s: perf.node_fill_q(cfg, s) for s in sites}
    intra_fill = {
        (k, s): _fill_states(perf, cfg, k, s, fill_q[s])
        for k in range(cfg.pp)
        for s in sites
        if fill_q[s]
    }
    pairs, pair_routes, pair_lat, disconnected = [], {}, {}, []
    k_paths = inst.solver.paths_per_pair
    pair_paths: dict[PairKey, list[Path]] = {}
    for i, a in enumerate(sites):
        for b in sites[i + 1 :]:
            p = net.path(a, b)
            if p is None:
                disconnected.append((a, b))
            else:
                q = route_key(a, b)
                pairs.append((a, b))
                pair_routes[(a, b)] = p
                pair_lat[(a, b)] = net.path_latency_s(a, b)
                pair_paths[q] = net.candidate_paths(*q, k_paths)
    # a pair once per message stream that crosses it (interleaving: v per boundary and
    # v - 1 for the wrap, PerfModel.chain_boundaries), so that counts are bytes
    v = cfg.virtual_stages
    chain_pairs = [perf.crossing_pairs(c, v, cfg.dualpipev) for c in chains]
    chain_cross, chain_level_time = [], []
    for c, qs in zip(chains, chain_pairs, strict=True):
        deadline.check()  # hook (placer.optimize.deadline): a build stops at the time limit
        cross: dict[RouteKey, int] = {}
        for q in qs:
            if len(pair_paths[q]) == 1:
                for r in pair_paths[q][0].routes:
                    cross[r] = cross.get(r, 0) + 1
        chain_cross.append(cross)
        routed = [q for q in qs if len(pair_paths[q]) >= 2]
        # one path level per distinct pair (all its streams share the pair's paths), keyed
        # by the level of every entry of `routed` as the formulations zip them
        distinct = list(dict.fromkeys(routed))
        levels_time: dict[tuple[int, ...], float] = {}
        if routed:
            for levels in itertools.product(*(range(len(pair_paths[q])) for q in distinct)):
                level = dict(zip(distinct, levels, strict=True))
                lat = {q: pair_paths[q][lv].latency_s for q, lv in level.items()}
                lats = tuple(
                    lat.get(
                        route_key(a, b), pair_paths[route_key(a, b)][0].latency_s if a != b else 0.0
                    )
                    for a, b, _ in perf.chain_boundaries(c, v, cfg.dualpipev)
                )
                levels_time[tuple(level[q] for q in routed)] = perf.chain_time_at(cfg, c, lats)
        chain_level_time.append(levels_time)
    stage_sites = [sorted({c[k] for c in chains}) for k in range(cfg.pp)]
    # stages whose site is the same in every chain type share their hosting decisions (with
    # replicas inside sites, all stages do): one set of data-parallel variables per class,
    # with the class's gradient bytes summed and its slowest NIC phase
    classes: dict[tuple[str, ...], list[int]] = {}
    for k in range(cfg.pp):
        classes.setdefault(tuple(c[k] for c in chains), []).append(k)
    chain_time = [deadline.checked(perf.chain_time, cfg, c) for c in chains]  # hook
    planes, hop_cross = _contention(perf, cfg, chains, pair_paths, chain_time)
    release = perf.dp_release_s(cfg)
    firsts = [release.index(g) for g in sorted(set(release))] if len(set(release)) >= 2 else []
    release_tail = [tuple(perf.chain_offsets_s(cfg, c, "bwd")[k] for k in firsts) for c in chains]
    fill_head = [tuple(perf.chain_offsets_s(cfg, c, "fwd")[k] for k in firsts) for c in chains]
    return InnerData(
        cfg=cfg,
        chains=chains,
        chain_time=chain_time,
        chain_cross=chain_cross,
        pp_bytes_per_crossing=perf.pp_bytes_per_crossing(cfg),
        sites=sites,
        site_groups=groups,
        site_groups_per_node=gpn_groups,
        site_nodes=nodes,
        site_node_w=node_w,
        site_node_usd_per_s=node_usd,
        site_node_block=node_block,
        site_pue=pue,
        site_power_w=power,
        routes=routes,
        route_optic=optic,
        wave_options=options,
        intra=intra,
        wan_bytes=[perf.stage_wan_bytes(cfg, k) for k in range(cfg.pp)],
        pairs=pairs,
        pair_routes=pair_routes,
        pair_latency=pair_lat,
        disconnected=disconnected,
        sync_mode=cfg.sync_mode,
        every_steps=cfg.every_steps,
        max_step_time_s=inst.objective.max_step_time_s,
        max_cost_usd=budget,
        stage_sites=stage_sites,
        stage_classes=list(classes.values()),
        fill_q=fill_q,
        intra_fill=intra_fill,
        wan_nic={(k, s): perf.wan_nic_coef_s(cfg, k, s) for k in range(cfg.pp) for s in sites},
        pair_paths=pair_paths,
        chain_pairs=chain_pairs,
        chain_level_time=chain_level_time,
        dp_pieces=perf.dp_pieces(cfg),
        dp_lat_repeats=perf.dp_lat_repeats(cfg),
        dp_stage_repeats=perf.dp_stage_repeats(cfg),
        dp_repeat_share=perf.dp_repeat_share(cfg),
        dp_release=perf.dp_release_s(cfg),
        dp_staggered=perf.dp_staggered(cfg),
        release_tail=release_tail if firsts else [],
        fill_head=fill_head if firsts else [],
        dp_credit_scale=perf.dp_credit_scale(cfg),
        dp_wan_stagger=not perf.any_dp_pair_routed(),
        amortization_s=amortization_s(cat),
        energy_usd_per_j=energy_usd_per_j(cat),
        resilience=resilience_data(problem, cfg, routes, options, optic, sites, collective),
        planes=planes,
        hop_cross=hop_cross,
        message_bytes=perf.message_bytes(cfg),
        tick_fraction=perf.message_bytes(cfg) / perf.pp_bytes_per_crossing(cfg),
    )


def _fill_states(perf: PerfModel, cfg: Config, k: int, site: str, q: int) -> dict[int, float]:
    """intra_sync_s by the site's member count n = 1 .. dp, priced by the evaluator at n
    members (its fill by n mod q, its ring of ceil(n / q) nodes)."""
    return {n: perf.intra_sync_s(cfg, k, site, members=n) for n in range(1, cfg.dp + 1)}


def _contention(
    perf: PerfModel,
    cfg: Config,
    chains: list[Chain],
    pair_paths: dict[PairKey, list[Path]],
    chain_time: list[float],
) -> tuple[list[Any] | None, dict[tuple[str, str], dict[int, int]]]:
    """Chain planes and per-hop crossings for lockstep contention (None when staggered)."""
    from placer.optimize.contention import ChainPlanes, crossings, seed_planes, signature

    if cfg.staggered:
        return None, {}
    planes, hop_cross = [], {}
    for ci, c in enumerate(chains):
        deadline.check()  # hook (placer.optimize.deadline): planes stop at the time limit
        if any(q not in pair_paths for q in perf.crossing_pairs(c)):
            planes.append(ChainPlanes(c, []))  # disconnected: no plane, never in use
            continue
        xs = crossings(perf, cfg, c, pair_paths)
        cp = ChainPlanes(c, xs, signature=signature(perf, cfg, c, xs))
        seed_planes(cp, chain_time[ci])
        deadline.check()
        planes.append(cp)
        for x in cp.crossings:
            if len(x.hops) == 1:
                for h in x.hops[0]:
                    hop_cross.setdefault(h, {}).setdefault(ci, 0)
                    hop_cross[h][ci] += 1
    return planes, hop_cross


def resilience_data(
    problem: Problem,
    cfg: Config,
    routes: list[RouteKey],
    options: dict[RouteKey, list[WaveOption]],
    optic: dict[RouteKey, str | None],
    sites: list[str],
    collective: str | None = None,
) -> ResilienceData | None:
    from placer.resilience import nic_factor, slowdown_factor

    res = problem.instance.resilience
    if res is None or not res.survive:
        return None
    collective = collective or res.collective
    eps = problem.catalog.resilience.optcc_eps
    net = Network(problem)
    caps: dict[tuple[str, RouteKey], list[float]] = {}
    factors: dict[tuple[str, RouteKey], list[list[float]]] = {}
    for r in routes:
        o = optic[r]
        ch = problem.catalog.channels_per_pair(o) if o else 1
        for klass in ("wave", "fiber_pair"):
            if klass not in res.survive:
                continue
            cap_list, fac_list = [], []
            for opt in options[r]:
                lost = waves_lost(klass, opt.waves, ch)
                c1 = net.capacity_Bps(r, opt.waves - lost, o)
                cap_list.append(c1)
                l = opt.capacity_Bps / c1 if c1 > 0 else math.inf  # noqa: E741
                fac_list.append(
                    [slowdown_factor(collective, p, l, eps) for p in range(len(sites) + 1)]
                )
            caps[(klass, r)] = cap_list
            factors[(klass, r)] = fac_list
    nic = None
    if "nic" in res.survive and cfg.dp >= 2:
        l = max(nic_factor(problem, s) for s in sites)  # noqa: E741
        nic = slowdown_factor(collective, cfg.dp, l, eps)
    return ResilienceData(
        collective, res.max_slowdown, problem.instance.objective.max_step_time_s, caps, factors, nic
    )


@dataclass
class InnerSolution:
    """A backend's answer for one configuration."""

    counts: dict[int, int]  # chain index -> replicas
    waves: dict[RouteKey, int]
    objective: float  # in the objective's unit (s or USD)
    bound: float
    optimal: bool
    step_time_s: float | None = None  # the backend's own step-time value
    routing: list[dict[str, Any]] = field(default_factory=list)  # plan `routing` entries


@dataclass
class NoPlan:
    """A backend's answer for a configuration without a plan. `proven`: the model is
    infeasible, so the configuration has no plan (better than the cutoff, when one was
    set). Otherwise the time limit ended the search first and `bound` (the solver's best
    bound in the objective's unit, None when it has none) is all that is known: the
    configuration stays open in the global bound."""

    proven: bool
    bound: float | None = None
    reason: str = ""


def solution_plan(problem: Problem, data: InnerData, sol: InnerSolution) -> Plan:
    cfg = data.cfg
    groups = [
        {"count": n, "stage_sites": list(data.chains[i])}
        for i, n in sorted(sol.counts.items(), key=lambda kv: (-kv[1], data.chains[kv[0]]))
        if n > 0
    ]
    links = [
        {"sites": list(r), "waves": w, "optic": data.route_optic[r]}
        for r, w in sorted(sol.waves.items())
        if w > 0
    ]
    return config_plan(problem, cfg, groups, links, drop_stray_shares(data, sol))


# A share a backend leaves on a path over a route without capacity, at most this: a MILP's
# integrality tolerance (HiGHS' mip_feasibility_tolerance, 1e-6) lets a path's flow ride on a
# wave option that is lit to 1e-6 and then rounded to none. Larger ones are kept, so that
# the evaluator rejects them (a model mismatch, not a rounding).
STRAY_SHARE = 1e-6


def drop_stray_shares(data: InnerData, sol: InnerSolution) -> list[dict[str, Any]]:
    """The solution's routing with every share of at most STRAY_SHARE on a path that
    crosses a route left without capacity set to 0 (the others rescaled to sum to 1).
    Seen on the links-vs-cost study at a $1.25M budget: HiGHS' proven optimum sent a
    3.4e-13 share of a data-parallel pair over a route with no wave."""

    def dead(r: RouteKey) -> bool:
        w = sol.waves.get(r, 0)
        return not any(o.waves == w and o.capacity_Bps > 0 for o in data.wave_options[r])

    out = []
    for entry in sol.routing:
        paths = entry["paths"]
        keep = [
            0.0
            if p["share"] <= STRAY_SHARE
            and any(dead(route_key(a, b)) for a, b in itertools.pairwise(p["via"]))
            else p["share"]
            for p in paths
        ]
        total = sum(keep)
        if total <= 0 or keep == [p["share"] for p in paths]:
            out.append(entry)
            continue
        out.append(
            {
                **entry,
                "paths": [{**p, "share": k / total} for p, k in zip(paths, keep, strict=True)],
            }
        )
    return out


def config_plan(
    problem: Problem,
    cfg: Config,
    groups: list[dict[str, Any]],
    links: list[dict[str, Any]],
    routing: list[dict[str, Any]],
) -> Plan:
    """The plan of a configuration with these replica groups, links and routing (cp, ep,
    dp_shard and virtual_stages written only when not 1, etp only when folded, chunk_layers
    only when uneven, as CONTRACT plans leave them out)."""
    return Plan.model_validate(
        {
            "instance": problem.name,
            "parallelism": {
                "tp": cfg.tp,
                "pp": cfg.pp,
                "dp": cfg.dp,
                **({"cp": cfg.cp} if cfg.cp > 1 else {}),
                **({"ep": cfg.ep} if cfg.ep > 1 else {}),
                **({"etp": cfg.etp} if cfg.etp is not None else {}),
                **({"dp_shard": cfg.dp_shard} if cfg.dp_shard > 1 else {}),
                "micro_batch": cfg.micro_batch,
                "num_micro_batches": cfg.num_micro_batches,
                **({"virtual_stages": cfg.virtual_stages} if cfg.virtual_stages > 1 else {}),
                **({"chunk_layers": list(cfg.chunk_split)} if cfg.chunk_split else {}),
                **({"pipeline_schedule": "dualpipev"} if cfg.dualpipev else {}),
            },
            "stage_layers": list(cfg.stage_layers),
            "replica_groups": groups,
            "links": links,
            "routing": routing,
            "sync_mode": cfg.sync_mode,
        }
    )


def finite(x: float, cap: float = 1e9) -> float:
    return x if math.isfinite(x) else cap


PHASE_NAMES = {"pp": "pipeline", "dp": "data_parallel"}


def extract_routing(
    data: InnerData, flow_keys: Any, allowed: Any, flow: Any
) -> list[dict[str, Any]]:
    """A plan's `routing` entries from a solved model: `flow_keys` are the model's
    (phase, pair, path) flow keys, `allowed(key)` whether path j is allowed and `flow(key)`
    its flow. A pair may use its paths up to the last allowed (listed, the slowest sets
    the latency), split as the flows; pairs on their shortest path alone are left out."""
    out = []
    for phase, name in PHASE_NAMES.items():
        for q in sorted({q for (ph, q, _j) in flow_keys if ph == phase}):
            k = len(data.pair_paths[q])
            levels = 1 + max([j for j in range(1, k) if allowed((phase, q, j))], default=0)
            flows = [max(0.0, flow((phase, q, j))) for j in range(levels)]
            total = sum(flows)
            if levels <= 1 or total <= 0:
                continue
            shares = [f / total for f in flows]
            shares[-1] = max(0.0, 1.0 - sum(shares[:-1]))
            paths = data.pair_paths[q][:levels]
            out.append(
                {
                    "phase": name,
                    "sites": list(q),
                    "paths": [
                        {"via": list(p.sites), "share": sh}
                        for p, sh in zip(paths, shares, strict=True)
                    ],
                }
            )
    return out
