"""The inter-site network: route graph, paths, latency, wave capacity and optic choice.

Traffic between two sites is a commodity routed over the route graph. By default it
follows the lowest-latency path (deterministic: ties broken by route order in the
instance); a plan's `routing` may split a pair's traffic over several simple paths
(multi-commodity flow). The candidate paths of a pair are its k lowest-latency simple
paths (`solver.paths_per_pair`). A pair's latency is that of the slowest path it uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import networkx as nx

from placer.io import Problem
from placer.perf.comm import fiber_one_way_s, wave_payload_bytes_per_s
from placer.schema import Plan, Route

RouteKey = tuple[str, str]
PairKey = tuple[str, str]  # unordered site pair, sorted like a RouteKey


def route_key(a: str, b: str) -> RouteKey:
    return (a, b) if a <= b else (b, a)


@dataclass(frozen=True)
class Path:
    """A simple path of the route graph between two sites."""

    sites: tuple[str, ...]
    routes: tuple[RouteKey, ...]
    latency_s: float

    def label(self) -> str:
        return "-".join(self.sites)


@dataclass(frozen=True)
class PathUse:
    path: Path
    share: float


# (phase, pair) -> the paths the pair's traffic of that phase uses, with their shares
Routing = dict[tuple[str, PairKey], tuple[PathUse, ...]]
PHASES = ("pipeline", "data_parallel")


@dataclass(frozen=True)
class Network:
    problem: Problem

    @cached_property
    def routes(self) -> dict[RouteKey, Route]:
        return {r.key: r for r in self.problem.instance.routes}

    @cached_property
    def graph(self) -> nx.Graph:
        g = nx.Graph()
        g.add_nodes_from(s.name for s in self.problem.instance.sites)
        for r in self.problem.instance.routes:
            g.add_edge(*r.sites, km=r.km)
        return g

    @cached_property
    def _memo(self) -> dict[tuple, object]:
        """Pure lookups the step model repeats thousands of times per solve (route latency,
        a pair's shortest path): computed once per network (the instance is frozen)."""
        return {}

    def latency_s(self, key: RouteKey) -> float:
        memo = self._memo
        hit = memo.get(("lat", key))
        if hit is None:
            hit = memo[("lat", key)] = self._route_latency_s(key)
        return hit  # type: ignore[return-value]

    def _route_latency_s(self, key: RouteKey) -> float:
        r = self.routes[key]
        if r.latency_ms is not None:
            return r.latency_ms / 1000.0
        return fiber_one_way_s(r.km, self.problem.catalog.network.fiber_us_per_km)

    @cached_property
    def _latency_graph(self) -> nx.Graph:
        g = nx.Graph()
        g.add_nodes_from(s.name for s in self.problem.instance.sites)
        for r in self.problem.instance.routes:
            # whole picoseconds: exact ties (90 km direct vs 55 + 35 km) stay ties, broken by
            # route order, instead of by floating-point noise
            g.add_edge(*r.sites, latency=round(self.latency_s(r.key) * 1e12))
        return g

    @cached_property
    def _paths(self) -> dict[str, dict[str, list[str]]]:
        return dict(nx.all_pairs_dijkstra_path(self._latency_graph, weight="latency"))

    def make_path(self, sites: list[str] | tuple[str, ...]) -> Path:
        keys = tuple(route_key(u, v) for u, v in zip(sites, sites[1:], strict=False))
        return Path(tuple(sites), keys, sum(self.latency_s(k) for k in keys))

    def candidate_paths(self, a: str, b: str, k: int) -> list[Path]:
        """The k lowest-latency simple paths from a to b (the shortest first); [] when
        disconnected. Deterministic for an instance (networkx breaks ties by insertion)."""
        first = self.path(a, b)
        if not first:
            return []
        out = [self.make_path(self._paths[a][b])]
        if k > 1:
            gen = nx.shortest_simple_paths(self._latency_graph, a, b, weight="latency")
            for nodes in gen:
                p = self.make_path(nodes)
                if p.sites != out[0].sites:
                    out.append(p)
                if len(out) >= k:
                    break
        return out

    def path(self, a: str, b: str) -> list[RouteKey] | None:
        """Routes on the shortest path from a to b; None when disconnected; [] when a == b."""
        if a == b:
            return []
        nodes = self._paths.get(a, {}).get(b)
        if nodes is None:
            return None
        return [route_key(u, v) for u, v in zip(nodes, nodes[1:], strict=False)]

    def pair_paths(
        self, routing: Routing | None, phase: str, a: str, b: str
    ) -> tuple[PathUse, ...] | None:
        """The paths a pair's traffic of a phase uses: the plan's split, else the shortest
        path; None when the sites are disconnected."""
        key = (phase, route_key(a, b))
        if routing and key in routing:
            return routing[key]
        memo = self._memo
        if ("uses", a, b) not in memo:
            nodes = self._paths.get(a, {}).get(b)
            memo[("uses", a, b)] = None if nodes is None else (PathUse(self.make_path(nodes), 1.0),)
        return memo[("uses", a, b)]  # type: ignore[return-value]

    def pair_latency_s(self, routing: Routing | None, phase: str, a: str, b: str) -> float:
        """A pair's one-way latency in a phase: its slowest path in use."""
        if a == b:
            return 0.0
        uses = self.pair_paths(routing, phase, a, b)
        if uses is None:
            return math.inf
        return max(u.path.latency_s for u in uses)

    def path_latency_s(self, a: str, b: str) -> float:
        p = self.path(a, b)
        if p is None:
            return math.inf
        return sum(self.latency_s(k) for k in p)

    # -------------------------------------------------------------- optics and capacity

    def reaching_optics(self, key: RouteKey) -> list[str]:
        km = self.routes[key].km
        return [o for o, spec in self.problem.catalog.optics.items() if spec.reach_km >= km]

    def default_optic(self, key: RouteKey) -> str | None:
        """The optic placer buys on a route: among those that reach, the highest line rate,
        then the lowest cost per Gbps (incl. the two router ports), then the name."""
        cat = self.problem.catalog
        opts = self.reaching_optics(key)
        if not opts:
            return None

        def rank(o: str) -> tuple[float, float, str]:
            spec = cat.optics[o]
            per_wave = 2 * spec.module_cost_usd + 2 * cat.costs.router_port_usd
            return (-spec.line_rate_gbps, per_wave / spec.line_rate_gbps, o)

        return min(opts, key=rank)

    def max_waves(self, key: RouteKey, optic: str | None = None) -> int:
        """Waves the route can carry: fiber pairs x DWDM channels, capped by max_waves."""
        optic = optic or self.default_optic(key)
        if optic is None:
            return 0
        r = self.routes[key]
        n = r.fiber_pairs * self.problem.catalog.channels_per_pair(optic)
        return min(n, r.max_waves) if r.max_waves is not None else n

    def capacity_Bps(self, key: RouteKey, waves: int, optic: str | None = None) -> float:
        """Usable bytes/s per direction: existing capacity plus new waves, times the payload
        efficiency (catalog `network.wave_payload_efficiency`)."""
        r = self.routes[key]
        eff = self.problem.catalog.network.wave_payload_efficiency
        rate = 0.0
        if waves:
            optic = optic or self.default_optic(key)
            rate = self.problem.catalog.optics[optic].line_rate_gbps if optic else 0.0
        return wave_payload_bytes_per_s(r.capacity_gbps + waves * rate, eff)

    def fiber_pairs_lit(self, key: RouteKey, waves: int, optic: str | None = None) -> int:
        optic = optic or self.default_optic(key)
        if not waves or optic is None:
            return 0
        return math.ceil(waves / self.problem.catalog.channels_per_pair(optic))

    def amplifiers_per_pair(self, key: RouteKey) -> int:
        """In-line amplifiers per lit pair: one per span beyond the first."""
        spacing = self.problem.catalog.network.amplifier_spacing_km
        return max(0, math.ceil(self.routes[key].km / spacing) - 1)

    def wave_cost_usd(self, optic: str) -> float:
        cat = self.problem.catalog
        return 2 * cat.optics[optic].module_cost_usd + 2 * cat.costs.router_port_usd

    def pair_cost_usd(self, key: RouteKey) -> float:
        cat = self.problem.catalog.costs
        return 2 * cat.mux_usd + self.amplifiers_per_pair(key) * cat.amplifier_usd

    def link_capex_usd(self, key: RouteKey, waves: int, optic: str | None = None) -> float:
        optic = optic or self.default_optic(key)
        if not waves or optic is None:
            return 0.0
        return waves * self.wave_cost_usd(optic) + self.fiber_pairs_lit(
            key, waves, optic
        ) * self.pair_cost_usd(key)


def resolve_routing(
    problem: Problem, plan: Plan, net: Network
) -> tuple[Routing, list[tuple[str, str]]]:
    """The plan's `routing` as paths of the route graph, and its topology errors as
    (where, message): unknown sites, missing routes and pairs listed twice (the evaluator
    reports them as violations; entries with an error are left out of the routing)."""
    out: Routing = {}
    errors: list[tuple[str, str]] = []
    sites = {s.name for s in problem.instance.sites}
    for i, entry in enumerate(plan.routing):
        where = f"routing[{i}]"
        bad = [s for p in entry.paths for s in p.via if s not in sites]
        if bad:
            errors.append((where, f"unknown site '{bad[0]}'"))
            continue
        if entry.key in out:
            errors.append(
                (
                    where,
                    f"{entry.phase} traffic of {entry.key[1][0]}-{entry.key[1][1]} listed twice",
                )
            )
            continue
        uses = []
        for j, p in enumerate(entry.paths):
            missing = [
                route_key(a, b)
                for a, b in zip(p.via, p.via[1:], strict=False)
                if route_key(a, b) not in net.routes
            ]
            if missing:
                errors.append(
                    (f"{where}.paths[{j}]", f"no route between {missing[0][0]} and {missing[0][1]}")
                )
                break
            uses.append(PathUse(net.make_path(p.via), p.share))
        else:
            out[entry.key] = tuple(uses)
    return out, errors
