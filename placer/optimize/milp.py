"""MILP formulation of one configuration's placement and link problem (PuLP + HiGHS).

Decisions: replicas per chain type, waves per route (one-hot over the route's possible
wave counts, which are small integers, so that 1/capacity is linear), which sites host
each stage (binary), and how many sites host it (one-hot, so that each hosting pair's
share 2 S_k / K_k of the WAN all-reduce is linear). Constraint families carry namespaced
names (`pipe.chain[..]`, `dp.pair[..]`, `route.pp[..]`, `site.power[..]`), as in linopy.
Units: seconds, GB and GB/s keep the coefficients within a few orders of magnitude.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pulp

from placer import interrupt
from placer.optimize.data import InnerData, InnerSolution, extract_routing

GBYTE = 1e9
MIP_REL_GAP = 1e-7  # HiGHS defaults to 1e-4; placer reports proven optima
TIE_TOL = 1e-6  # relative slack on the optimum while breaking ties (HiGHS feasibility tolerance)


def _name(*parts: Any) -> str:
    return "_".join(str(p).replace("-", "m").replace(".", "p") for p in parts)


class MilpInner:
    def __init__(
        self,
        data: InnerData,
        objective: str,
        t_max: float,
        cutoff: float | None = None,
        t_cap: float | None = None,
        rate_cap: float | None = None,
    ):
        self.d = data
        self.t_cap = t_cap  # extra step-time ceiling (cost_per_token frontier walk)
        self.rate_cap = rate_cap  # extra ceiling on USD per second
        # time unit of the model: the fastest chain, so that times are O(1) and HiGHS'
        # absolute tolerances (1e-7) act as relative ones (tiny models step in milliseconds)
        fastest = min(data.chain_time)
        self.ts = fastest if 0 < fastest < math.inf else 1.0
        self.t_max = t_max / self.ts  # a step time no plan of this configuration needs to exceed
        self.objective = objective
        self.cutoff = cutoff
        self.prob = pulp.LpProblem("placer", pulp.LpMinimize)
        self._build()

    # ------------------------------------------------------------------ model

    def _build(self) -> None:
        d, P = self.d, self.prob
        cfg = d.cfg
        D = cfg.dp
        C = range(len(d.chains))
        add = P.addConstraint
        n = {c: pulp.LpVariable(f"n_{c}", 0, D, cat="Integer") for c in C}
        u = {c: pulp.LpVariable(f"u_{c}", cat="Binary") for c in C}
        self.n, self.u = n, u
        self._intra_terms: list[tuple[Any, Any, float]] = []  # (h, x, seconds/ts)
        self._pairs: list[tuple[Any, Any, Any, float, Any, Any, float]] = []  # (D, share, b, S, h_a, h_b, latency/ts)
        add(pulp.lpSum(n.values()) == D, "replicas.total")
        # every plan runs at least one chain: the fastest chain type bounds T_pipe from below
        ts = self.ts
        T_pipe = pulp.LpVariable("T_pipe", min(d.chain_time) / ts)
        for c in C:
            add(n[c] <= D * u[c], _name("chain.use", c))
            add(T_pipe >= (d.chain_time[c] / ts) * u[c], _name("pipe.chain", c))
        self.w: dict[tuple[str, Any, int], Any] = {}  # (phase, pair, j): path j of the pair may carry traffic
        self.f: dict[tuple[str, Any, int], Any] = {}  # (phase, pair, j): GB on path j
        self._pipe_level_terms: list[tuple[float, Any, list[Any]]] = []  # (time/ts, u_c, w's)
        pp_flow_load = self._route_pipeline(T_pipe)
        # placement per (site, stage)
        x = {(s, k): pulp.lpSum(n[c] for c in C if d.chains[c][k] == s) for k in range(cfg.pp) for s in d.stage_sites[k]}
        nodes = {s: pulp.LpVariable(_name("nodes", s), 0, d.site_nodes[s], cat="Integer") for s in d.sites}
        self.nodes = nodes
        for s in d.sites:
            used = pulp.lpSum(x[(s, k)] for k in range(cfg.pp) if (s, k) in x)
            add(d.site_groups_per_node[s] * nodes[s] >= used, _name("site.nodes", s))
        # waves: one-hot over wave options
        y = {(r, i): pulp.LpVariable(_name("y", *r, i), cat="Binary") for r in d.routes for i in range(len(d.wave_options[r]))}
        self.y = y
        for r in d.routes:
            add(pulp.lpSum(y[(r, i)] for i in range(len(d.wave_options[r]))) == 1, _name("route.waves", *r))
        capex = pulp.lpSum(opt.capex_usd * y[(r, i)] for r in d.routes for i, opt in enumerate(d.wave_options[r]))
        self.capex = capex
        self.total_waves = pulp.lpSum(opt.waves * y[(r, i)] for r in d.routes for i, opt in enumerate(d.wave_options[r]))
        # power per site: node all-in power plus coherent modules, times PUE
        power = {}
        for s in d.sites:
            optics = pulp.lpSum(opt.module_w * y[(r, i)] for r in d.routes if s in r for i, opt in enumerate(d.wave_options[r]))
            power[s] = d.site_pue[s] * (d.site_node_w[s] * nodes[s] + optics)
            if d.site_power_w[s] is not None:
                add(power[s] <= d.site_power_w[s], _name("site.power", s))
        # USD per second: link capex amortized plus energy (cost_per_token numerator)
        self.rate = (1.0 / d.amortization_s) * capex + d.energy_usd_per_j * pulp.lpSum(power.values())
        if d.max_cost_usd is not None:
            add(capex <= d.max_cost_usd, "budget")
        # pipeline activations on routes
        self.pp_loads: dict[Any, tuple[Any, float]] = {}
        self.dp_loads: dict[Any, tuple[Any, float]] = {}
        for r in d.routes:
            load = pulp.lpSum(n[c] * d.chain_cross[c].get(r, 0) for c in C) * (d.pp_bytes_per_crossing / GBYTE)
            max_load = D * max((cr.get(r, 0) for cr in d.chain_cross), default=0) * d.pp_bytes_per_crossing / GBYTE
            if r in pp_flow_load:
                load = load + pulp.lpSum(pp_flow_load[r][0])
                max_load += pp_flow_load[r][1]
            if max_load <= 0:
                continue
            self.pp_loads[r] = (load, max_load)
            self._route_time(T_pipe, load, max_load, r, "route.pp")
        # data-parallel hosting
        T_intra = pulp.LpVariable("T_intra", d.intra_lower_bound / ts)
        T_dpbw = pulp.LpVariable("T_dpbw", 0)
        T_lat = pulp.LpVariable("T_lat", 0)
        h: dict[tuple[str, int], pulp.LpVariable] = {}
        dp_load: dict[Any, list[Any]] = {r: [] for r in d.routes}
        dp_max: dict[Any, float] = {r: 0.0 for r in d.routes}
        pair_dem: dict[Any, list[tuple[Any, Any, float]]] = {}  # routed pair -> (D, b, S_k) per class
        for cls in d.stage_classes:
            k = cls[0]  # the class's representative stage
            hosts = d.stage_sites[k]
            for s in hosts:
                h[(s, k)] = hv = pulp.LpVariable(_name("h", s, k), cat="Binary")
                add(x[(s, k)] <= D * hv, _name("dp.host_ub", s, k))
                add(x[(s, k)] >= hv, _name("dp.host_lb", s, k))
                if D >= 2 and d.class_intra(cls, s) > 0:
                    # every member's NIC carries the data-parallel volume of a flat ring
                    add(T_intra >= (d.class_intra(cls, s) / ts) * hv, _name("dp.intra", s, k))
                    self._intra_terms.append((hv, x[(s, k)], d.class_intra(cls, s) / ts))
            if len(hosts) < 2:
                continue
            z = {K: pulp.LpVariable(_name("z", k, K), cat="Binary") for K in range(1, len(hosts) + 1)}
            add(pulp.lpSum(z.values()) == 1, _name("dp.k_onehot", k))
            add(pulp.lpSum(K * z[K] for K in z) == pulp.lpSum(h[(s, k)] for s in hosts), _name("dp.k_count", k))
            S_k = d.class_wan_bytes(cls) / GBYTE
            share = pulp.lpSum((2 * S_k / K) * z[K] for K in z if K >= 2)
            for a, b in d.disconnected:
                if a in hosts and b in hosts:
                    add(h[(a, k)] + h[(b, k)] <= 1, _name("dp.disconnected", a, b, k))
            for a, b in d.pairs:
                if a not in hosts or b not in hosts:
                    continue
                bp = pulp.LpVariable(_name("b", a, b, k), cat="Binary")
                add(bp >= h[(a, k)] + h[(b, k)] - 1, _name("dp.pair_on", a, b, k))
                dem = pulp.LpVariable(_name("D", a, b, k), 0)
                add(dem >= share - S_k * (1 - bp), _name("dp.pair", a, b, k))
                add(T_lat >= (2 * d.pair_latency[(a, b)] / ts) * bp, _name("dp.pair_latency", a, b, k))
                self._pairs.append((dem, share, bp, S_k, h[(a, k)], h[(b, k)], 2 * d.pair_latency[(a, b)] / ts))
                if d.routed((a, b)):
                    pair_dem.setdefault((a, b), []).append((dem, bp, S_k))
                    continue
                for r in d.pair_routes[(a, b)]:
                    dp_load[r].append(dem)
                    dp_max[r] += S_k
        self._route_data_parallel(pair_dem, T_lat, dp_load, dp_max)
        for r in d.routes:
            if dp_load[r]:
                self.dp_loads[r] = (pulp.lpSum(dp_load[r]), dp_max[r])
                self._route_time(T_dpbw, pulp.lpSum(dp_load[r]), dp_max[r], r, "route.dp", self.t_max * self._wan_factor())
        T_wan = T_dpbw + T_lat
        if d.sync_mode == "synchronous":
            T_dp = T_intra + T_wan
        elif d.sync_mode == "diloco":
            T_dp = T_intra + (1.0 / d.every_steps) * T_wan
        else:
            exposed = pulp.LpVariable("T_exposed", 0)
            self._exposed = exposed
            add(exposed >= (1.0 / d.every_steps) * T_wan - T_pipe, "dp.streaming_overlap")
            T_dp = T_intra + exposed
        T = pulp.LpVariable("T", 0)
        add(T == T_pipe + T_dp, "step.time")
        self.T = T
        if d.max_step_time_s is not None:
            add(T <= d.max_step_time_s / ts, "objective.max_step_time")
        if self.t_cap is not None:
            add(T <= self.t_cap / ts, "objective.t_cap")
        if self.rate_cap is not None:
            add(self.rate <= self.rate_cap, "objective.rate_cap")
        if self.cutoff is not None:
            # needed for step time too: the hulls' t_max bounds only the route-time splits,
            # not T_pipe + T_dp. Without this row HiGHS solves a configuration that cannot
            # beat the incumbent to its own optimum: 60 s instead of 0.06 s for
            # tp8-pp16-dp32-mb1-synchronous of four-site-metro-longhaul (seed-1t-two-sites
            # is ~2 s slower with it)
            add(self._main() <= self.cutoff / self._unit(), "objective.cutoff")
        self.sites_used = {s: pulp.LpVariable(_name("site_used", s), cat="Binary") for s in d.sites}
        for s in d.sites:
            add(nodes[s] <= d.site_nodes[s] * self.sites_used[s], _name("site.used", s))
        if d.resilience is not None:
            if d.resilience.max_step_time_s is None:
                self._exact_step(T_pipe, T_intra, T_dpbw, T_lat)
            self._add_resilience(T, T_pipe, T_intra, T_dpbw, T_lat, nodes)
        P.setObjective(self._main())

    # ------------------------------------------------------------------ routing (MCF)

    def _paths_allowed(self, phase: str, q: Any, active: list[Any]) -> list[Any]:
        """Binaries w[j] for j >= 1: the pair's traffic may use its paths 0..j. Monotone
        (w[1] >= w[2] >= ...): with the slowest allowed path fixing the latency, allowing
        every faster path too never hurts, so only these prefixes need to be searched.
        A pair without traffic allows none."""
        d, add = self.d, self.prob.addConstraint
        ws: list[Any] = [None]
        for j in range(1, len(d.pair_paths[q])):
            w = pulp.LpVariable(_name("w", phase, *q, j), cat="Binary")
            self.w[(phase, q, j)] = w
            if j == 1:
                add(w <= pulp.lpSum(active), _name("route", phase, "paths_need_traffic", *q))
            else:
                add(w <= ws[-1], _name("route", phase, "paths_prefix", *q, j))
            ws.append(w)
        return ws

    def _split(self, phase: str, q: Any, demand: Any, max_demand: float, ws: list[Any], loads: dict[Any, tuple[list[Any], float]]) -> None:
        """demand (GB) = sum of the flows on the pair's paths; a path carries flow only when
        allowed; every route of a path takes the path's flow."""
        d, add = self.d, self.prob.addConstraint
        flows = []
        for j, path in enumerate(d.pair_paths[q]):
            f = pulp.LpVariable(_name("f", phase, *q, j), 0)
            self.f[(phase, q, j)] = f
            if j >= 1:
                add(f <= max_demand * ws[j], _name("route", phase, "path_allowed", *q, j))
            flows.append(f)
            for r in path.routes:
                terms, mx = loads.get(r, ([], 0.0))
                loads[r] = (terms + [f], mx + max_demand)
        add(pulp.lpSum(flows) == demand, _name("route", phase, "demand", *q))

    def _route_pipeline(self, T_pipe: Any) -> dict[Any, tuple[list[Any], float]]:
        """Pipeline activations of routed pairs: a multi-commodity flow over candidate paths;
        a chain's 1F1B time grows with the slowest path its pairs allow."""
        d, add, n, u = self.d, self.prob.addConstraint, self.n, self.u
        loads: dict[Any, tuple[list[Any], float]] = {}
        ws: dict[Any, list[Any]] = {}
        for q, crossing in d.routed_crossings().items():
            ws[q] = self._paths_allowed("pp", q, [u[c] for c in crossing])
            demand = pulp.lpSum(n[c] for c in crossing) * (d.pp_bytes_per_crossing / GBYTE)
            self._split("pp", q, demand, d.cfg.dp * d.pp_bytes_per_crossing / GBYTE, ws[q], loads)
        for c in range(len(d.chains)):
            routed = d.chain_routed_pairs(c)
            for levels, t in d.chain_level_time[c].items():
                chosen = [ws[q][lv] for q, lv in zip(routed, levels, strict=True) if lv >= 1]
                if not chosen:
                    continue
                add(T_pipe >= (t / self.ts) * (self.u[c] + pulp.lpSum(chosen) - len(chosen)), _name("pipe.chain_path", c, *levels))
                self._pipe_level_terms.append((t / self.ts, self.u[c], chosen))
        return loads

    def _route_data_parallel(self, pair_dem: dict[Any, list[tuple[Any, Any, float]]], T_lat: Any, dp_load: dict[Any, list[Any]], dp_max: dict[Any, float]) -> None:
        """Data-parallel WAN traffic of routed pairs: the same flow, and the WAN phase pays
        twice the latency of the slowest path a pair allows."""
        self._lat_terms: list[tuple[float, Any]] = []
        loads: dict[Any, tuple[list[Any], float]] = {}
        for q, dems in sorted(pair_dem.items()):
            ws = self._paths_allowed("dp", q, [bp for _, bp, _ in dems])
            self._split("dp", q, pulp.lpSum(dem for dem, _, _ in dems), sum(S for _, _, S in dems), ws, loads)
            for j in range(1, len(ws)):
                lat = 2 * self.d.pair_paths[q][j].latency_s / self.ts
                self.prob.addConstraint(T_lat >= lat * ws[j], _name("dp.path_latency", *q, j))
                self._lat_terms.append((lat, ws[j]))
        for r, (terms, mx) in loads.items():
            dp_load[r].extend(terms)
            dp_max[r] += mx

    def routing(self) -> list[dict[str, Any]]:
        """The plan's `routing` entries from the solved model."""
        return extract_routing(self.d, self.f, lambda key: (self.w[key].value() or 0) > 0.5, lambda key: self.f[key].value() or 0.0)

    def _exact_max(self, var: Any, terms: list[tuple[Any, Any]], big: float, name: str) -> None:
        """var <= one of the terms (var >= every term is already in the model), chosen by a
        one-hot delta that may only pick an active term: var == max(terms) exactly."""
        deltas = []
        for i, (expr, active) in enumerate(terms):
            dl = pulp.LpVariable(_name(name, "delta", i), cat="Binary")
            if active is not None:
                self.prob.addConstraint(dl <= active, _name(name, "active", i))
            self.prob.addConstraint(var <= expr + big * (1 - dl), _name(name, "pick", i))
            deltas.append(dl)
        self.prob.addConstraint(pulp.lpSum(deltas) == 1, _name(name, "onehot"))

    def _exact_route_time(self, load: Any, max_load: float, r: Any, family: str, factor: float = 1.0) -> Any:
        """A variable equal to load / capacity(waves): the hull with an equality row."""
        scale = max_load if max_load > 0 else 1.0
        t = pulp.LpVariable(_name("t", family, *r), 0)
        taus = []
        for i, opt in enumerate(self.d.wave_options[r]):
            tau = pulp.LpVariable(_name("tau", family, *r, i), 0)
            self.prob.addConstraint(tau <= self.t_max * 4 * factor * self.y[(r, i)], _name(family, "hull", *r, i))
            taus.append((opt.capacity_Bps * self.ts / GBYTE / scale, tau))
        self.prob.addConstraint(pulp.lpSum(tt for _, tt in taus) == t, _name(family, "split", *r))
        self.prob.addConstraint((1.0 / scale) * load == pulp.lpSum(c * tt for c, tt in taus), _name(family, "capacity", *r))
        return t

    def _exact_step(self, T_pipe: Any, T_intra: Any, T_dpbw: Any, T_lat: Any) -> None:
        """Make the step-time variable equal the plan's step time (not just bound it), so
        that a limit relative to it (resilience max_slowdown) cannot be met by overstating
        the healthy time. Each max gets a one-hot choice of the term that attains it."""
        d, add = self.d, self.prob.addConstraint
        big = self.t_max * 4
        for dem, share, bp, S_k, ha, hb, _ in self._pairs:
            add(bp <= ha, _name("exact.pair_a", bp.name))
            add(bp <= hb, _name("exact.pair_b", bp.name))
            add(dem <= share, _name("exact.share", dem.name))
            add(dem <= S_k * bp, _name("exact.pair_off", dem.name))
        pipe_terms: list[tuple[Any, Any]] = [(d.chain_time[c] / self.ts, self.u[c]) for c in self.u]
        for i, (t, uc, chosen) in enumerate(self._pipe_level_terms):
            a = pulp.LpVariable(_name("exact.chain_path", i), cat="Binary")
            for v in [uc, *chosen]:
                add(a <= v, _name("exact.chain_path_on", i, v.name))
            pipe_terms.append((t, a))
        for r, (load, max_load) in self.pp_loads.items():
            pipe_terms.append((self._exact_route_time(load, max_load, r, "exact.pp"), None))
        self._exact_max(T_pipe, pipe_terms, big, "exact.pipe")
        dp_terms: list[tuple[Any, Any]] = [(0, None)]
        for r, (load, max_load) in self.dp_loads.items():
            dp_terms.append((self._exact_route_time(load, max_load, r, "exact.dp", self._wan_factor()), None))
        # the WAN exchange may last H (diloco) or 2H (streaming) steps: its bigs scale with it
        big_wan = big * self._wan_factor()
        self._exact_max(T_dpbw, dp_terms, big_wan, "exact.dpbw")
        self._exact_max(T_lat, [(0, None)] + [(lat, bp) for _dem, _share, bp, _S, _ha, _hb, lat in self._pairs] + list(self._lat_terms), big_wan, "exact.lat")
        self._exact_max(T_intra, [(0, None)] + [(sec, g) for g, _, sec in self._intra_terms], big, "exact.intra")
        if getattr(self, "_exposed", None) is not None:
            T_wan = T_dpbw + T_lat
            self._exact_max(self._exposed, [(0, None), ((1.0 / d.every_steps) * T_wan - T_pipe, None)], big_wan, "exact.exposed")

    def _wan_part(self, T_wan: Any, T_pipe: Any, tag: str) -> Any:
        """The data-parallel WAN term of the step for the sync policy."""
        d = self.d
        if d.sync_mode == "synchronous":
            return T_wan
        if d.sync_mode == "diloco":
            return (1.0 / d.every_steps) * T_wan
        exposed = pulp.LpVariable(_name("T_exposed", tag), 0)
        self.prob.addConstraint(exposed >= (1.0 / d.every_steps) * T_wan - T_pipe, _name("dp.streaming_overlap", tag))
        return exposed

    def _add_resilience(self, T: Any, T_pipe: Any, T_intra: Any, T_dpbw: Any, T_lat: Any, nodes: Any) -> None:
        """Every single failure of the listed classes keeps the step within the limit:
        (1 + max_slowdown) x healthy, or max_step_time_s when set (placer.resilience).
        A degraded route's pipeline time uses its degraded capacity; its data-parallel time
        is the healthy one times the collective's slowdown factor, which depends on the
        wave option and on the number of sites the plan uses (one-hot, convex hull)."""
        d, P, res = self.d, self.prob, self.d.resilience
        assert res is not None
        add = P.addConstraint
        limit = (1 + res.max_slowdown) * ((res.max_step_time_s / self.ts) if res.max_step_time_s is not None else T)
        # number of sites the plan uses (participants of the inter-site collective)
        used = self.sites_used
        for s in d.sites:
            add(used[s] <= nodes[s], _name("res.used_has_nodes", s))
        zp = {p: pulp.LpVariable(_name("res.p", p), cat="Binary") for p in range(1, len(d.sites) + 1)}
        add(pulp.lpSum(zp.values()) == 1, "res.p_onehot")
        add(pulp.lpSum(p * z for p, z in zp.items()) == pulp.lpSum(used.values()), "res.p_count")
        t_max = self.t_max * (1 + res.max_slowdown) * 1.01 if res.max_step_time_s is None else (1 + res.max_slowdown) * res.max_step_time_s / self.ts * 1.01
        for (klass, r), caps in sorted(res.degraded_capacity.items()):
            tag = f"{klass}_{r[0]}_{r[1]}"
            Tp = pulp.LpVariable(_name("res.T_pipe", tag), 0)
            add(Tp >= T_pipe, _name("res.pipe_healthy", tag))
            if r in self.pp_loads:
                load, max_load = self.pp_loads[r]
                self._hull(Tp, load, max_load, r, [[c] for c in caps], None, t_max, f"res.pp.{tag}")
            Td = pulp.LpVariable(_name("res.T_dpbw", tag), 0)
            add(Td >= T_dpbw, _name("res.dp_healthy", tag))
            if r in self.dp_loads:
                load, max_load = self.dp_loads[r]
                healthy = [opt.capacity_Bps for opt in d.wave_options[r]]
                eff = [[(healthy[i] / f if f > 0 and math.isfinite(f) else 0.0) for f in res.dp_factor[(klass, r)][i]] for i in range(len(healthy))]
                self._hull(Td, load, max_load, r, eff, zp, t_max * self._wan_factor(), f"res.dp.{tag}")
            add(Tp + T_intra + self._wan_part(Td + T_lat, Tp, tag) <= limit, _name("res.survive", tag))
        if res.nic_factor is not None and math.isinf(res.nic_factor):
            add(T_intra <= 0, "res.survive_nic")  # a lost NIC cuts its node off the collective
        elif res.nic_factor is not None:
            add(T_pipe + res.nic_factor * T_intra + self._wan_part(T_dpbw + T_lat, T_pipe, "nic") <= limit, "res.survive_nic")

    def _hull(self, T_var: Any, load: Any, max_load: float, r: Any, caps: list[list[float]], zp: Any, t_max: float, family: str) -> None:
        """load <= capacity(option, p) x T_var on the convex hull of the one-hots: T_var is
        split into tau[i, p] <= t_max y[i] (and <= t_max zp[p] when the capacity depends on p)."""
        scale = max_load if max_load > 0 else 1.0
        terms, taus = [], []
        for i, row in enumerate(caps):
            for p, cap in enumerate(row):
                if zp is not None and p == 0:
                    continue
                tau = pulp.LpVariable(_name("tau", family, i, p), 0)
                self.prob.addConstraint(tau <= t_max * self.y[(r, i)], _name(family, "hull_y", i, p))
                if zp is not None:
                    self.prob.addConstraint(tau <= t_max * zp[p], _name(family, "hull_p", i, p))
                taus.append(tau)
                terms.append(cap * self.ts / GBYTE / scale * tau)
        self.prob.addConstraint(pulp.lpSum(taus) == T_var, _name(family, "split"))
        self.prob.addConstraint((1.0 / scale) * load <= pulp.lpSum(terms), _name(family, "capacity"))

    def _main(self) -> Any:
        return {"step_time": self.T, "cost": self.capex, "rate": self.rate}[self.objective]

    def _unit(self) -> float:
        """The objective's model unit in its user unit (time is counted in units of ts)."""
        return self.ts if self.objective == "step_time" else 1.0

    def _wan_factor(self) -> float:
        """How much longer than the step the WAN exchange may take: T_wan / H counts in a
        diloco step, and streaming hides up to T_pipe <= T more of it."""
        H = self.d.every_steps
        return {"synchronous": 1.0, "diloco": float(H)}.get(self.d.sync_mode, 2.0 * H)

    def _route_time(self, T_var: Any, load: Any, max_load: float, r: Any, family: str, t_max: float | None = None) -> None:
        """load <= capacity(waves) * T_var, written on the convex hull of the wave one-hot:
        T_var is split into tau_i <= T_max * y_i, and load <= sum_i capacity_i * tau_i.
        (Much tighter than big-M rows T >= load / capacity_i - M (1 - y_i).)
        The capacity row is divided by the route's largest possible load (GB), so that the
        solver's absolute feasibility tolerance is relative to the traffic, however small."""
        opts = self.d.wave_options[r]
        scale = max_load if max_load > 0 else 1.0
        taus = []
        for i, opt in enumerate(opts):
            tau = pulp.LpVariable(_name("tau", family, *r, i), 0)
            self.prob.addConstraint(tau <= (t_max or self.t_max) * self.y[(r, i)], _name(family, "hull", *r, i))
            taus.append((opt.capacity_Bps * self.ts / GBYTE / scale, tau))
        self.prob.addConstraint(pulp.lpSum(t for _, t in taus) == T_var, _name(family, "split", *r))
        self.prob.addConstraint((1.0 / scale) * load <= pulp.lpSum(c * t for c, t in taus), _name(family, "capacity", *r))

    # ------------------------------------------------------------------ solve

    def solve(self, time_limit_s: float, threads: int | None, options: dict[str, Any]) -> InnerSolution | None:
        t0 = time.perf_counter()
        first = self._solve_once(time_limit_s, threads, options)
        if first is None:
            return None
        value, bound, optimal = first  # in model units (time in units of ts)
        counts, waves = self._extract()
        routing = self.routing()
        # tie-break: same objective, then fewer waves, then fewer sites
        main = self._main()
        self.prob.addConstraint(main <= value + TIE_TOL * max(1.0, abs(value)), "objective.tiebreak")
        n_w = len(self.w) + 1
        self.prob.setObjective(
            n_w * (self.total_waves * (len(self.d.sites) + 1) + pulp.lpSum(self.sites_used.values())) + pulp.lpSum(self.w.values())
        )
        left = time_limit_s - (time.perf_counter() - t0)
        if left > 0.05 and not interrupt.requested() and self._solve_once(left, threads, options) is not None:
            counts, waves = self._extract()
            routing = self.routing()
        value, bound = value * self._unit(), bound * self._unit()
        return InnerSolution(counts, waves, value, bound, optimal, step_time_s=value if self.objective == "step_time" else None, routing=routing)

    def _extract(self) -> tuple[dict[int, int], dict[Any, int]]:
        counts = {c: int(round(v.value())) for c, v in self.n.items() if v.value() is not None and round(v.value()) > 0}
        waves = {}
        for r in self.d.routes:
            for i, opt in enumerate(self.d.wave_options[r]):
                val = self.y[(r, i)].value()
                if val is not None and val > 0.5:
                    waves[r] = opt.waves
        return counts, waves

    def _solve_once(self, time_limit_s: float, threads: int | None, options: dict[str, Any]) -> tuple[float, float, bool] | None:
        which = options.get("milp_solver", "highs")
        t0 = time.perf_counter()
        if which == "cbc":
            solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, threads=threads, gapRel=MIP_REL_GAP)
        else:
            kwargs = {k: v for k, v in options.items() if k != "milp_solver"}
            kwargs.setdefault("mip_rel_gap", MIP_REL_GAP)
            # HiGHS' symmetry detection can run for the whole time limit on these models
            kwargs.setdefault("mip_detect_symmetry", False)
            kwargs.update(_interrupt_callback())
            solver = pulp.HiGHS(msg=False, timeLimit=time_limit_s, threads=threads, **kwargs)
        status = self.prob.solve(solver)
        del t0
        if interrupt.requested() and not _has_primal_solution(self.prob, solver):
            return None  # stopped (SIGINT/SIGTERM) before HiGHS found an integer solution
        if status != pulp.LpStatusOptimal or self.prob.objective.value() is None:
            sol_status = getattr(self.prob, "sol_status", None)
            if sol_status == pulp.LpSolutionIntegerFeasible:
                v = float(self.prob.objective.value())
                return v, self._bound(solver, v), False
            return None
        v = float(self.prob.objective.value())
        optimal = self.prob.sol_status == pulp.LpSolutionOptimal if hasattr(self.prob, "sol_status") else True
        return v, self._bound(solver, v) if not optimal else v, optimal

    @staticmethod
    def _bound(solver: Any, value: float) -> float:
        model = getattr(solver, "solverModel", None)
        try:
            b = model.getInfo().mip_dual_bound  # type: ignore[union-attr]
            return float(b) if math.isfinite(b) else value
        except Exception:  # noqa: BLE001 - not every PuLP solver exposes a bound
            return value


def _interrupt_callback() -> dict[str, Any]:
    """HiGHS stops at its next interrupt check once placer.interrupt has a stop request
    (SIGINT/SIGTERM); it then reports the incumbent as feasible, not optimal."""
    import highspy

    def cb(_type: Any, _msg: Any, _out: Any, data_in: Any, _user: Any) -> None:
        if data_in is not None and interrupt.requested():
            data_in.user_interrupt = 1

    kinds = highspy.cb.HighsCallbackType
    return {"callbackTuple": (cb, None), "callbacksToActivate": [kinds.kCallbackMipInterrupt, kinds.kCallbackSimplexInterrupt]}


def _has_primal_solution(prob: Any, solver: Any) -> bool:
    """Whether HiGHS holds a feasible primal solution (after an interrupt PuLP may report
    column values of an unfinished search)."""
    model = getattr(prob, "solverModel", None) or getattr(solver, "solverModel", None)
    try:
        return int(model.getInfo().primal_solution_status) == 2  # kSolutionStatusFeasible
    except Exception:  # noqa: BLE001 - another PuLP solver: trust its status
        return True
