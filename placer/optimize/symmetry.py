"""Symmetry breaking between interchangeable sites (issue 12 item 4).

Two sites s, t are interchangeable in one configuration when the transposition (s t) maps
everything the formulations read (placer.optimize.data.InnerData) onto itself: then every
plan has a twin of the same objective with s and t swapped, and branch and bound explores
both (k! copies for k interchangeable sites). The check is made on the InnerData, not the
instance, because candidate paths, chains and contention planes are built with name-order
tie-breaks that can break a symmetry the instance has. Any piece that does not map makes
the pair NOT interchangeable (sound before clever).

Interchangeability is an equivalence: (s u) = (s t)(t u)(s t) is an automorphism when
(s t) and (t u) are, so each class is checked against its first site and the full
symmetric group on a class is a symmetry. For a class s1 < s2 < ... (site order) the rows
`symmetry.order` keep used(s1) >= used(s2) >= ..., used(s) the replica-stages the site
hosts: every plan can be permuted inside each class (the classes are disjoint) into that
order without changing its value, so the optimum and its proof are kept. The model with
lockstep-contention planes is a relaxation of the one with all of them, which is the
symmetric one: its optimum under the rows is still no higher than the true optimum.

The rows only enter the objective solve: the tie-break (break_ties) removes them, so the
canonical plan among the optima, and every plan placer writes, stays what it was.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from typing import Any

from placer.network import route_key
from placer.optimize.data import InnerData

REL = 1e-12  # floats of two sites' data are equal to this (sums in another order)


def same(a: Any, b: Any) -> bool:
    """Structural equality with floats compared to REL (lists, tuples, dicts, dataclasses)."""
    if isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, int | float) or not isinstance(b, int | float):
            return False
        if math.isinf(a) or math.isinf(b) or math.isnan(a) or math.isnan(b):
            return a == b
        return math.isclose(a, b, rel_tol=REL, abs_tol=1e-300)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if is_dataclass(a) and is_dataclass(b) and type(a) is type(b):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    return bool(a == b)


class _Swap:
    """The transposition (s t) on sites, routes, pairs, hops and chain indices."""

    def __init__(self, d: InnerData, s: str, t: str) -> None:
        self.s, self.t = s, t
        self.index = {c: i for i, c in enumerate(d.chains)}

    def site(self, a: str) -> str:
        return self.t if a == self.s else self.s if a == self.t else a

    def key(self, r: tuple[str, str]) -> tuple[str, str]:
        """A route or pair key (sorted) mapped, sorted again."""
        return route_key(self.site(r[0]), self.site(r[1]))

    def hop(self, h: tuple[str, str]) -> tuple[str, str]:
        """A directed hop keeps its direction."""
        return (self.site(h[0]), self.site(h[1]))

    def chain(self, c: int, d: InnerData) -> int | None:
        return self.index.get(tuple(self.site(a) for a in d.chains[c]))

    def oriented(self, q: tuple[str, str], sites: tuple[str, ...]) -> tuple[str, ...]:
        """A path of pair q as a path of the mapped pair, from its first site."""
        m = tuple(self.site(a) for a in sites)
        return m if m[0] == self.key(q)[0] else m[::-1]


def interchangeable(d: InnerData, s: str, t: str) -> bool:
    """Whether the transposition (s t) is an automorphism of the configuration's data."""
    if s == t:
        return True
    sw = _Swap(d, s, t)
    site_maps: list[dict[str, Any]] = [
        d.site_groups,
        d.site_groups_per_node,
        d.site_nodes,
        d.site_node_w,
        d.site_node_usd_per_s,
        d.site_pue,
        d.site_power_w,
        d.site_node_block,
        d.fill_q,
    ]
    if any(not same(m.get(s), m.get(t)) for m in site_maps):
        return False
    for k in range(d.cfg.pp):
        if not same(d.intra.get((k, s)), d.intra.get((k, t))):
            return False
        if not same(d.intra_fill.get((k, s)), d.intra_fill.get((k, t))):
            return False
        if {sw.site(a) for a in d.stage_sites[k]} != set(d.stage_sites[k]):
            return False
    return _routes_map(d, sw) and _pairs_map(d, sw) and _chains_map(d, sw)


def _keyed(d: dict[Any, Any], f: Callable[[Any], Any]) -> dict[Any, Any]:
    return {f(k): v for k, v in d.items()}


def _routes_map(d: InnerData, sw: _Swap) -> bool:
    if {sw.key(r) for r in d.routes} != set(d.routes):
        return False
    for r in d.routes:
        if d.route_optic[r] != d.route_optic[sw.key(r)]:
            return False
        if not same(d.wave_options[r], d.wave_options[sw.key(r)]):
            return False
    res = d.resilience
    if res is not None:
        for table in (res.degraded_capacity, res.dp_factor):
            mapped = _keyed(table, lambda kr: (kr[0], sw.key(kr[1])))
            if not same(mapped, table):
                return False
    return True


def _pairs_map(d: InnerData, sw: _Swap) -> bool:
    # d.pairs, pair_latency, pair_routes and disconnected are keyed in instance site order,
    # not sorted: compare them unordered
    def unordered(qs: list[tuple[str, str]]) -> set[frozenset[str]]:
        return {frozenset(q) for q in qs}

    if unordered([sw.hop(q) for q in d.pairs]) != unordered(d.pairs):
        return False
    if unordered([sw.hop(q) for q in d.disconnected]) != unordered(d.disconnected):
        return False
    own = {frozenset(q): q for q in d.pairs}
    for q in d.pairs:
        m = own[frozenset(sw.hop(q))]
        if not same(d.pair_latency[q], d.pair_latency[m]):
            return False
        if sorted(sw.key(r) for r in d.pair_routes[q]) != sorted(d.pair_routes[m]):
            return False
    if set(d.pair_paths) != {sw.key(q) for q in d.pair_paths}:
        return False
    for q, paths in d.pair_paths.items():
        theirs = d.pair_paths[sw.key(q)]
        if len(paths) != len(theirs):
            return False
        for p, p2 in zip(paths, theirs, strict=True):
            # candidate j of the pair must be candidate j of its image (the prefix
            # binaries and the path levels index them): a name-order tie-break breaks it
            if sw.oriented(q, p.sites) != p2.sites or not same(p.latency_s, p2.latency_s):
                return False
    hop_cross = {
        sw.hop(h): {sw.chain(c, d): n for c, n in per.items()} for h, per in d.hop_cross.items()
    }
    return hop_cross == d.hop_cross


def _chains_map(d: InnerData, sw: _Swap) -> bool:
    image = [sw.chain(c, d) for c in range(len(d.chains))]
    if any(c2 is None for c2 in image):
        return False
    for c, c2 in enumerate(image):
        assert c2 is not None
        if not same(d.chain_time[c], d.chain_time[c2]):
            return False
        if _keyed(d.chain_cross[c], sw.key) != d.chain_cross[c2]:
            return False
        if [sw.key(q) for q in d.chain_pairs[c]] != d.chain_pairs[c2]:
            return False
        if not same(d.chain_level_time[c], d.chain_level_time[c2]):
            return False
        if d.planes is not None and not _planes_map(d.planes[c], d.planes[c2], sw):
            return False
    # the chain set maps onto itself, so the stage classes (stages keyed by their site in
    # every chain type) are the same partition
    return True


def _planes_map(a: Any, b: Any, sw: _Swap) -> bool:
    """Chain type a's contention crossings and planes are chain type b's, sites swapped."""
    if a.signature != b.signature or set(a.planes) != set(b.planes):
        return False
    if len(a.crossings) != len(b.crossings):
        return False
    for x, y in zip(a.crossings, b.crossings, strict=True):
        if x.boundary != y.boundary or sw.key(x.pair) != y.pair:
            return False
        if not same(x.nic_s, y.nic_s) or not same(x.latency_s, y.latency_s):
            return False
        if tuple(tuple(sw.hop(h) for h in hops) for hops in x.hops) != y.hops:
            return False
    return True


def site_classes(d: InnerData) -> list[list[str]]:
    """The classes (two sites or more, site order) of interchangeable sites that host
    something (a site no stage may use has no replica-stages to order)."""
    hosts = sorted({a for ks in d.stage_sites for a in ks})
    classes: list[list[str]] = []
    for a in hosts:
        for cl in classes:
            if interchangeable(d, cl[0], a):
                cl.append(a)
                break
        else:
            classes.append([a])
    return [sorted(cl) for cl in classes if len(cl) >= 2]


def used_by_site(d: InnerData, counts: dict[int, int]) -> dict[str, int]:
    """Replica-stages per site of a plan (chain index -> replicas): sum_k x[(s, k)]."""
    used = dict.fromkeys(d.sites, 0)
    for c, n in counts.items():
        for a in d.chains[c]:
            used[a] += n
    return used


def ordering(d: InnerData, classes: list[list[str]], counts: dict[int, int]) -> dict[str, str]:
    """The site permutation that puts a plan into the rows' order (each class's sites by
    replica-stages, most first, ties in site order); {} when it already is in order."""
    used = used_by_site(d, counts)
    perm: dict[str, str] = {}
    for cl in classes:
        ranked = sorted(cl, key=lambda a: (-used[a], cl.index(a)))
        for new, old in zip(cl, ranked, strict=True):
            if new != old:
                perm[old] = new  # the plan's site `old` moves to `new`
    return perm


def permute_counts(
    d: InnerData, counts: dict[int, int], perm: dict[str, str]
) -> dict[int, int] | None:
    """A plan's replica counts with its sites permuted (None: an image is no chain type)."""
    index = {c: i for i, c in enumerate(d.chains)}
    out: dict[int, int] = {}
    for c, n in counts.items():
        c2 = index.get(tuple(perm.get(a, a) for a in d.chains[c]))
        if c2 is None:
            return None
        out[c2] = n
    return out


def ordered_start(
    d: InnerData,
    classes: list[list[str]],
    values: dict[str, Any],
    n: dict[int, Any],
    u: dict[int, Any],
    y: dict[Any, Any],
    nodes: dict[str, Any],
    name: Callable[[Any], str],
) -> dict[str, Any]:
    """A start (integer values by variable name) that keeps the rows: unchanged when its
    plan is in order, else its placement, waves and nodes with the sites permuted into the
    order (the solver completes the rest, as for placer.optimize.warmstart's starts)."""
    if not classes:
        return values
    counts = {c: int(round(values[name(v)])) for c, v in n.items() if name(v) in values}
    perm = ordering(d, classes, counts)
    if not perm:
        return values
    moved = permute_counts(d, counts, perm)
    if moved is None:
        return {}
    out: dict[str, Any] = {}
    for c, v in n.items():
        out[name(v)] = moved.get(c, 0)
    for c, v in u.items():
        out[name(v)] = int(moved.get(c, 0) > 0)
    back = {new: old for old, new in perm.items()}  # the site that moves onto a
    for (r, i), v in y.items():
        src = name(y[(route_key(back.get(r[0], r[0]), back.get(r[1], r[1])), i)])
        if src in values:
            out[name(v)] = values[src]
    for a, v in nodes.items():
        src = name(nodes[back.get(a, a)])
        if src in values:
            out[name(v)] = values[src]
    return out
