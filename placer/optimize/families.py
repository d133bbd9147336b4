"""The constraint families of the inner problem, and the backend-neutral math both
formulations write them with.

placer.optimize.milp and placer.optimize.cpsat each build one configuration's model as the
same flat, ordered list of `define_<family>` methods (`FAMILIES`, in the style of PyPSA's
`create_model`). Every row they add is named `<namespace>:<index>` by `row`, with the same
namespace in both backends, so a row of one backend can be looked up in the other. What
differs between the backends is only the arithmetic (floats in model time units vs integer
ticks), not which rows exist.

Families, in build order:

* replicas:   replicas per chain type (n), chain type in use (u); sum n = dp
* pipeline:   T_pipe >= 1F1B time of every chain type in use (shortest paths); pipeline
              traffic of pairs with several candidate paths (flows, path prefixes, the 1F1B
              time of each prefix). Built right after the replicas: CP-SAT searches in
              variable order, and with T_pipe after the waves three-sites-80-300-500km took
              twice as long (0.5 -> 1.0 s)
* placement:  TP groups per (site, stage), nodes per site
* waves:      one-hot wave option per route; link capex and total waves
* power:      site power (node all-in W x nodes + coherent modules) x PUE <= limit; USD/s
* budget:     link capex <= max_cost_usd
* routing:    T_pipe >= pipeline bytes / route capacity (the hull over the wave one-hot);
              lockstep ticks (placer.optimize.contention): a tick time per hop (route and
              direction), each chain crossing's transmit time tau and latency lam, and
              T_pipe >= every plane of every chain type in use (they replace pipeline's
              per-chain rows unless job.replica_schedule is staggered)
* dp_hosting: sites hosting each stage class, number of hosts (one-hot), per-pair WAN
              demand, intra-site NIC phases (T_intra; where they depend on a site's
              member count, one-hots over its fill state and its node count: node_fill,
              PerfModel.site_ring_nodes; the same rows per release group for its
              NIC phase I_g, PerfModel.step's staggered sync), pair
              latencies (T_lat; per release group but the last L_g, the latency of
              the pairs and paths its own stages sync over), the routed
              data-parallel flows, T_dpbw >= data-parallel bytes / route capacity
              and >= the WAN phase's NIC term of every hosting site, (K - 1)/K c / x at
              its member count x (dp.wan_nic: MILP secants on (host, K), CP-SAT an
              element table; PerfModel.wan_nic_s), per release group its routes' U_g
              (the last group's too where T_dpbw holds a NIC term) and per stage of
              the group that can cross sites its own NIC phase I, latency L, latency
              repeats R (R_series, dp.series_repeats: share x R_k x its pairs' latency)
              and NIC term N: I + L + R + U_g and I + L + R + N (series_keys:
              dp.intra_series, dp.series_latency, the NIC term's rows on N; only the
              stages no other of their class dominates), beside I_g + U_g, and
              the staggered sync and gather per release group and chain type, each
              released at the chain's own T_c - tail (first forward at T_c - head)
              against T_end, the longest chain in use, pinned exactly (dp.end,
              dp.end_cap; PerfModel.dp_moments_s), a group's works bounding one
              variable per sequence (W_dpst, W_gst: work_maxes); a stage's
              latency and repeats over a flow-routed pair's allowed paths too
              (dp.series_path_latency, dp.series_path_repeats; InnerData.repeat_ratio,
              PerfModel.dp_stage_repeats); each credit times its sequence's
              scale (PerfModel.dp_credit_scale); the gather's route per group G_g, every
              stage's bytes on each route its stages sync over (dp.gather_route,
              route.gst); with a flow-routed pair each series key's own route term
              per release group B_series in place of T_dpbw, >= the stage's own NIC
              term (N_series, dp.stage_nic) and >= the group's load over capacity on
              each route its pairs' paths use (dp.stage_route, route.group{i},
              route.every; PerfModel.step's stage_bw), a routed pair's group load
              min(its group demand, its flow on the route) (dp.group_flow*), and the
              group's NIC phase alone (no T_dpbw after it)
* step:       T = T_pipe + T_intra + the sync policy's WAN part (`SYNC`)
* limits:     max_step_time_s, the frontier walk's caps, the incumbent cutoff
* resilience: sites in use (also the tie-break's site count), then every single failure
              keeps the step within its limit (and T is exact)
* objective:  step time, link capex or USD per second
* symmetry:   interchangeable sites (placer.optimize.symmetry, solver.symmetry) host
              replica-stages in site order, most first; objective solve only, the
              tie-break removes them

Tie-break (README "Ties"): among plans of the same objective value (9 significant digits),
fewer waves, then fewer sites, then fewer listed paths, then the smallest sum of the chain
types' weights over the replicas (`chain_weight`, `TieBreak`, `tiebreak_key`).
"""

from __future__ import annotations

import hashlib
import math
from functools import lru_cache
from typing import Any, NamedTuple

FAMILIES = (
    "replicas",
    "pipeline",
    "placement",
    "waves",
    "power",
    "budget",
    "routing",
    "dp_hosting",
    "step",
    "limits",
    "resilience",
    "objective",
    "symmetry",
)


def tick_family(hop: tuple[str, str]) -> str:
    """The family of a hop's lockstep tick rows: the route's forward (its first site to its
    second) or reverse direction; the route itself is the row index."""
    return "route.tick_fwd" if hop[0] <= hop[1] else "route.tick_rev"


def row(namespace: str, *index: Any) -> str:
    """The name of one row: its family's namespace and its index, e.g. `site.power:a`."""
    return ":".join([namespace, *(str(i) for i in index)])


# ----------------------------------------------------------------------------- named terms


class HostPair(NamedTuple):
    """Two sites hosting the same stage class: their WAN all-reduce share."""

    demand: Any  # bytes (or GB) the pair exchanges per direction
    share: Any  # 2 S_k / K_k for the class's number of hosts K_k
    on: Any  # both sites host the class
    wan_bytes: float  # S_k, in the backend's load unit
    host_a: Any
    host_b: Any
    latency: float  # two one-way latencies of the pair's shortest path (model time unit)


class IntraTerm(NamedTuple):
    """A site hosting a stage class pays its NIC phases."""

    host: Any
    groups: Any
    time: float  # model time unit


class NicTerm(NamedTuple):
    """A site hosting a stage class with K hosting sites pays the WAN phase's NIC term
    (K - 1)/K c / x at its member count x (PerfModel.wan_nic_s): written where the site
    hosts the class (`host`) and the class has K hosts (`k_on`)."""

    site: str
    stage: int
    hosts: int  # K
    coef: float  # (K - 1)/K c_{k,s}, seconds
    host: Any
    k_on: Any
    members: Any  # x_{s,k}
    ub: int  # the largest member count the site can hold


def wan_nic_terms(
    d: Any, cls: list[int], host: dict[tuple[str, int], Any], k_on: dict[int, Any], x: Any
) -> dict[Any, list[NicTerm]]:
    """The WAN phase's NIC terms of a class hosted by two or more sites, per target: "all"
    (T_dpbw: every stage's WAN phase, the largest c_{k,s} of the class's stages,
    d.class_wan_nic) and each per-stage series term (series_tag(i, k): stage k's own
    c_{k,s} in release group i, series_keys); `k_on[K]` is the backend's indicator of K
    hosting sites."""
    k = cls[0]
    hosts = d.stage_sites[k]
    out: dict[Any, list[NicTerm]] = {}
    coefs = {"all": {s: d.class_wan_nic(cls, s) for s in hosts}}
    # the per-stage series' NIC terms (with a flow-routed pair each stage's route term
    # B_series is at least its own: stagger_works)
    for i, j in series_keys(d, cls):
        coefs[series_tag(i, j)] = {s: d.wan_nic[(j, s)] for s in hosts}
    for tag, by_site in coefs.items():
        for s, c in by_site.items():
            if c <= 0:
                continue
            ub = max(1, min(d.cfg.dp, d.site_groups[s]))
            for K in range(2, len(hosts) + 1):
                out.setdefault(tag, []).append(
                    NicTerm(s, k, K, (K - 1) / K * c, host[(s, k)], k_on[K], x[(s, k)], ub)
                )
    return out


def series_keys(d: Any, cls: list[int]) -> list[tuple[int, int]]:
    """(first release group index, stage) of the class's per-stage terms
    (InnerData.series_keys): each release group's work is at least a stage's own NIC
    phase, latency and repeats in series with the routes or with its NIC term
    (PerfModel.step); a key (i0, k) serves the groups i0 on (stage k's group and every
    later one, the groups being nested)."""
    return d.series_keys(cls)


def stagger_works(m: Any, n_groups: int, U_group: dict[int, Any], G: dict[int, Any]) -> list:
    """Every release group's works for both backends' stagger rows (their variables add
    alike), as (group, work, row tag, for the sync, for the gather) (PerfModel.step): the
    group's longest NIC phase and its routes, and per stage of the group that can cross
    sites (series_keys: a key (i0, k) serves every group from i0 on) its NIC phase,
    latency and latency repeats R_series with the routes, and with the release groups'
    own WAN loads (d.dp_wan_stagger) its own series, NIC phase, latency, NIC term and
    repeats (with a flow-routed pair B_series, at least its own NIC term, holds it).
    The routes: the sync's U_group (the last group every stage's, T_dpbw where it has
    no route of its own), the gather's G (every stage's bytes on the group's routes:
    _define_gather_routes); with a flow-routed pair none after the group's NIC phase,
    and a stage's own works its B_series (its pairs' routes or its own NIC term:
    _define_stage_routes).
    The repeats go to the sequences with a bucketed share (d.dp_repeat_share). `m` is
    the backend's model (T_intra, T_dpbw, I_group, the series variables, R_series,
    B_series, d)."""
    out = []
    every = n_groups - 1
    rep_sync, rep_gather = (x > 0 for x in m.d.dp_repeat_share)
    stagger = m.d.dp_wan_stagger
    for i in range(n_groups):
        U = U_group.get(i)
        if not stagger:
            # with a flow-routed pair the group's NIC phase alone: each stage's NIC phase,
            # latency and own routes or NIC term follow (B_series; PerfModel.step: before,
            # the group's longest NIC phase in series with every stage's WAN phase, NIC
            # terms included, up to +22% against placer.sim; benchmarks/README.md, "Each
            # stage's own NIC term")
            wan = wan_g = 0 if m.B_series else m.T_dpbw
        elif i == every:
            wan = wan_g = m.T_dpbw if U is None else U
        else:
            wan, wan_g = (0 if U is None else U), G.get(i, 0)
        intra = m.T_intra if i == every else m.I_group[i]
        tag = "all" if i == every else i
        works = [(intra + wan, tag, True, False, None), (intra + wan_g, tag, False, True, None)]
        for key in m.I_series:
            if key[0] > i:
                continue
            own, R = m.I_series[key] + m.L_series[key], m.R_series.get(key)
            t = series_tag(i, key[1])
            # with a flow-routed pair the stage's own routes (B_series) at the group's load
            # (the gathers' at every stage's: they all start with the step), else the
            # group's
            B, B_g = m.B_series.get((i, key)), m.B_series.get((every, key))
            works.append((own + (wan if B is None else B), f"{t}r", True, False, R))
            works.append((own + (wan_g if B_g is None else B_g), f"{t}r", False, True, R))
            if stagger and m.d.has_wan_nic(key[1]):
                # (without a NIC term the series is below the route work)
                works.append((own + m.N_series[key], t, True, True, R))
        for w, t, sync, gather, R in works:
            if R is not None and sync and gather and rep_sync != rep_gather:
                # one sequence pays the repeats, the other not: two rows
                out.append((i, w + R if rep_sync else w, t, True, False))
                out.append((i, w + R if rep_gather else w, t, False, True))
                continue
            if R is not None and ((sync and rep_sync) or (gather and rep_gather)):
                w = w + R
            out.append((i, w, t, sync, gather))
    return out


def work_maxes(m: Any, works: list, new_var: Any, at_least: Any) -> list[tuple[Any, ...]]:
    """stagger_works' works per (release group, sequence), as (group, True for the sync or
    False for the gather, work, row tag): where a group and sequence has several works,
    one variable bounded by each (`new_var(kind, group)` makes it, `at_least(var, work)`
    is the backend's row var >= work), so that the backends write the per-chain-type
    release rows once on it (with a stage's works per group they were 3 x stages x chain
    types rows a group); each such variable, its works and its exact-step name go to
    m._work_maxes (_exact_step pins it to their max). No gather rows unless the gather
    is staggered (d.gather_staggered)."""
    by: dict[tuple[int, bool], list[tuple[Any, Any]]] = {}
    for i, w, t, sync, gather in works:
        for seq, on in ((True, sync), (False, gather)):
            if on and (seq or m.d.gather_staggered):
                by.setdefault((i, seq), []).append((w, t))
    m._work_maxes = []
    out: list[tuple[Any, ...]] = []
    for (i, sync), ws in by.items():
        work, tag = ws[0]
        if len(ws) > 1:
            kind = "dpst" if sync else "gst"
            work, tag = new_var(kind, i), f"{i}w"
            for w, t in ws:
                m.add(at_least(work, w), row(f"dp.{kind}_work", t))
            m._work_maxes.append((work, [w for w, _ in ws], f"exact.{kind}_work{i}"))
        out.append((i, sync, work, tag))
    return out


def series_tag(i: int, k: int) -> str:
    """The row index of release group i's series term of stage k, e.g. `0.3`."""
    return f"{i}.{k}"


def intra_targets(
    d: Any,
    t_intra: Any,
    i_group: Any,
    intra_terms: list[IntraTerm],
    group_terms: Any,
    cls: list[int],
    site: str,
    fill: bool,
    i_series: Any = None,
    series_terms: Any = None,
) -> list[tuple[Any, Any, tuple[Any, ...], list[IntraTerm]]]:
    """The NIC-phase variables a hosting site of the class bounds, for both formulations:
    T_intra by all its stages, I_g of every release group but the last by its stages in
    g (the staggered sync, PerfModel.step), and each per-stage series term's I_{i,k} by
    stage k's own (series_keys), each with its seconds (by member count when `fill`, else
    one), its row suffix and its exact-step terms."""
    out = [
        (
            t_intra,
            d.class_intra_fill(cls, site) if fill else d.class_intra(cls, site),
            ("",),
            intra_terms,
        )
    ]
    for i, g in enumerate(d.release_groups[:-1]):
        if not d.group_stages(cls, g):
            continue
        times = (
            d.class_intra_fill_group(cls, site, g) if fill else d.class_intra_group(cls, site, g)
        )
        out.append((i_group[i], times, ("_group", i), group_terms[i]))
    for i, k in series_keys(d, cls) if i_series is not None else []:
        times = d.intra_fill[(k, site)] if fill else d.intra[(k, site)]
        out.append((i_series[(i, k)], times, ("_series", series_tag(i, k)), series_terms[(i, k)]))
    return out


class PathLevelTerm(NamedTuple):
    """The 1F1B time of a chain type when its routed pairs may use the chosen path prefixes."""

    time: float
    use: Any  # the chain type is in use
    allowed: list[Any]  # the prefix binaries the time assumes


class LatencyTerm(NamedTuple):
    """A routed pair's data-parallel traffic may use a path of this two-way latency."""

    latency: float
    allowed: Any


class Load(NamedTuple):
    """A route's traffic of one phase and the most it can be (for scaling its rows)."""

    expr: Any
    max_load: float


class HullCell(NamedTuple):
    """One cell of a route-time hull: wave option i, participants p, its capacity."""

    option: int
    participants: int
    capacity_Bps: float


# ----------------------------------------------------------------------------- shared rules


class SyncRule(NamedTuple):
    """How the data-parallel WAN phase enters the step (placer.perf.step.wan_part_s):
    synchronous: + T_wan; diloco: + T_wan / H; streaming-diloco: + max(0, T_wan / H - T_pipe)."""

    divisor: int  # H for the diloco modes, 1 for synchronous
    overlapped: bool  # streaming: the exchange hides behind the pipeline
    window: float  # how much longer than the step the WAN exchange may last (variable ranges)


def sync_rule(sync_mode: str, every_steps: int) -> SyncRule:
    if sync_mode == "synchronous":
        return SyncRule(1, False, 1.0)
    if sync_mode == "diloco":
        return SyncRule(every_steps, False, float(every_steps))
    # streaming hides up to T_pipe <= T more of the exchange
    return SyncRule(every_steps, True, 2.0 * every_steps)


def hull_cells(caps: list[list[float]], per_participants: bool) -> list[HullCell]:
    """The cells of a route-time hull `load <= sum cap[i, p] tau[i, p]`, sum tau = T,
    tau[i, p] <= ub y[i] (and <= ub z[p] when the capacity depends on the number of
    participating sites p, whose index 0 is unused)."""
    return [
        HullCell(i, p, cap)
        for i, cells in enumerate(caps)
        for p, cap in enumerate(cells)
        if not (per_participants and p == 0)
    ]


class TieBreak(NamedTuple):
    """Weights of the lexicographic tie-break objective, from the most significant."""

    waves: int
    sites: int
    paths: int
    chain_index: int


def objective_grid(value: float) -> float:
    """The objective on the grid ties are judged on: 9 significant digits."""
    return float(f"{value:.9g}")


def tiebreak_key(value: float, waves: int, sites: int, paths: int, *rest: Any) -> tuple[Any, ...]:
    """The one tie-break order of the driver (between configurations, `rest` = the
    configuration label) and of the brute-force backend (inside one, `rest` = the chain-type
    index sum); the exact backends write the same order as weights (`tiebreak_weights`)."""
    return (objective_grid(value), waves, sites, paths, *rest)


CHAIN_WEIGHT_SPREAD = 1009  # chain weights lie in 1..this (a prime: the hash below is spread)


@lru_cache(maxsize=65536)
def chain_weight(c: int) -> int:
    """The tie-break weight of chain type c: a fixed pseudo-random integer in
    1..CHAIN_WEIGHT_SPREAD (BLAKE2b of the index: no linear relation between neighbours).
    With the index as weight, placements of equal index sums tied (four-site-metro-longhaul:
    another optimum in each run); a multiplicative hash mod a prime is linear in c and tied
    just the same (w74 + w76 = 2 w75). Issue 15 item 8."""
    digest = hashlib.blake2b(c.to_bytes(8, "little"), digest_size=8).digest()
    return 1 + int.from_bytes(digest, "little") % CHAIN_WEIGHT_SPREAD


def chain_weight_sum(counts: dict[int, int]) -> int:
    return sum(chain_weight(c) * n for c, n in counts.items())


def tiebreak_weights(dp: int, n_chains: int, n_path_binaries: int, n_sites: int) -> TieBreak:
    """Integer weights that make `waves, sites, paths, sum w_c n[c]` lexicographic: each
    weight exceeds the largest value of everything less significant (w_c = chain_weight)."""
    w_paths = dp * CHAIN_WEIGHT_SPREAD + 1  # sum w_c n[c] <= dp x the largest weight
    w_sites = w_paths * (n_path_binaries + 1)
    w_waves = w_sites * (n_sites + 1)
    return TieBreak(w_waves, w_sites, w_paths, 1)


def moment_chains(d: Any, t_max_s: float) -> set[int]:
    """The chain types whose release and first-forward moments the staggered sync and
    gather rows read (both formulations' _define_dp_stagger, _define_end): connected, and
    no slower uncontended than the configuration's step bound `t_max_s` (a slower one is
    never in use: its pipeline rows alone exceed the step's range; CP-SAT forbids it,
    pipe.too_slow)."""
    return {
        c
        for c, t in enumerate(d.chain_time)
        if math.isfinite(t)
        and t <= t_max_s
        and all(math.isfinite(x) for x in d.release_tail[c] + d.fill_head[c])
    }
