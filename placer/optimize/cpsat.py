"""CP-SAT formulation of one configuration's placement and link problem (OR-Tools).

The same decisions and constraint families as placer.optimize.milp, written for an integer
solver: time is counted in ticks of `tau` seconds (tau = upper bound / 1e9, so the time
grid is finer than a part per billion of the answer), loads in bytes, and each wave
option's capacity as an integer number of (bytes / Q) per tick, with Q chosen so that no
product exceeds int64. A route constraint reads `cap_i * T >= Q * load` enforced when the
route runs option i. The plan found is re-evaluated exactly by placer.evaluate.
"""

from __future__ import annotations

import math
import time
from typing import Any

from ortools.sat.python import cp_model

from placer import interrupt
from placer.optimize.data import InnerData, InnerSolution, extract_routing

INT_LIMIT = 4e18  # stay well inside int64 for coefficient x domain products
TIME_TICKS = 10**9
RATE_UNIT = 1e-9  # USD per second per integer unit of the cost rate


class CpsatInner:
    def __init__(
        self,
        data: InnerData,
        objective: str,
        upper_bound_s: float,
        cutoff: float | None = None,
        t_cap: float | None = None,
        rate_cap: float | None = None,
    ):
        self.d = data
        self.t_cap = t_cap
        self.rate_cap = rate_cap
        self.objective = objective
        self.cutoff = cutoff
        self.ub = max(upper_bound_s, 1e-6)
        self.tau = self.ub / TIME_TICKS
        self.m = cp_model.CpModel()
        self._build()

    def ticks(self, seconds: float) -> int:
        return math.ceil(seconds / self.tau - 1e-6)

    def _build(self) -> None:
        d, M = self.d, self.m
        cfg = d.cfg
        D = cfg.dp
        C = range(len(d.chains))
        TT = TIME_TICKS + 1
        n = {c: M.NewIntVar(0, D, f"n[{c}]") for c in C}
        u = {c: M.NewBoolVar(f"u[{c}]") for c in C}
        self.n, self.u = n, u
        self._intra_terms: list[tuple[Any, Any, int]] = []  # (h, x, ticks)
        self._pairs: list[tuple[Any, Any, Any, Any, Any, int]] = []  # (D, share, b, h_a, h_b, latency ticks)
        self._exposed = None
        M.Add(sum(n.values()) == D).WithName("replicas.total")
        T_pipe = M.NewIntVar(min(self.ticks(t) for t in d.chain_time), TT, "T_pipe")
        for c in C:
            M.Add(n[c] <= D * u[c]).WithName(f"chain.use[{c}]")
            tc = self.ticks(d.chain_time[c])
            if tc > TT:
                M.Add(u[c] == 0)
            else:
                M.Add(T_pipe >= tc).WithName(f"pipe.chain[{c}]").OnlyEnforceIf(u[c])
        self.w: dict[tuple[str, Any, int], Any] = {}  # (phase, pair, j): path j may carry traffic
        self.f: dict[tuple[str, Any, int], Any] = {}  # (phase, pair, j): bytes on path j
        self._pipe_level_terms: list[tuple[int, Any, list[Any]]] = []
        self._lat_terms: list[tuple[int, Any]] = []
        pp_flow_load = self._route_pipeline(T_pipe, TT)
        x = {(s, k): sum(n[c] for c in C if d.chains[c][k] == s) for k in range(cfg.pp) for s in d.stage_sites[k]}
        nodes = {s: M.NewIntVar(0, d.site_nodes[s], f"nodes[{s}]") for s in d.sites}
        for s in d.sites:
            used = sum(x[(s, k)] for k in range(cfg.pp) if (s, k) in x)
            M.Add(d.site_groups_per_node[s] * nodes[s] >= used).WithName(f"site.nodes[{s}]")
        y = {(r, i): M.NewBoolVar(f"y[{r}][{i}]") for r in d.routes for i in range(len(d.wave_options[r]))}
        self.y = y
        for r in d.routes:
            M.AddExactlyOne(y[(r, i)] for i in range(len(d.wave_options[r])))
        capex = sum(round(opt.capex_usd) * y[(r, i)] for r in d.routes for i, opt in enumerate(d.wave_options[r]))
        self.capex = capex
        self.total_waves = sum(opt.waves * y[(r, i)] for r in d.routes for i, opt in enumerate(d.wave_options[r]))
        rate_terms = [round(opt.capex_usd / d.amortization_s / RATE_UNIT) * y[(r, i)] for r in d.routes for i, opt in enumerate(d.wave_options[r])]
        for s in d.sites:
            limit = d.site_power_w[s]
            j_rate = d.energy_usd_per_j / RATE_UNIT * d.site_pue[s]
            rate_terms.append(round(j_rate * d.site_node_w[s]) * nodes[s])
            rate_terms += [round(j_rate * opt.module_w) * y[(r, i)] for r in d.routes if s in r for i, opt in enumerate(d.wave_options[r])]
            if limit is None:
                continue
            # milliwatts (rounded up: conservative by at most a milliwatt per term)
            # (float noise below a microwatt is not rounded up: 1.3 x 6496 W is 8444800 mW, not 8444801)
            coef_node = math.ceil(d.site_pue[s] * d.site_node_w[s] * 1000 - 1e-3)
            optics = sum(math.ceil(d.site_pue[s] * opt.module_w * 1000 - 1e-3) * y[(r, i)] for r in d.routes if s in r for i, opt in enumerate(d.wave_options[r]))
            M.Add(coef_node * nodes[s] + optics <= math.floor(limit * 1000 * (1 + 1e-9))).WithName(f"site.power[{s}]")
        self.rate = sum(rate_terms)  # USD per second in RATE_UNIT
        if d.max_cost_usd is not None:
            M.Add(capex <= math.floor(d.max_cost_usd)).WithName("budget")
        # route capacities in integer units: cap_i * T_ticks >= Q * load_bytes
        max_cap_tick = max((opt.capacity_Bps * self.tau for r in d.routes for opt in d.wave_options[r]), default=1.0)
        # Q as large as int64 allows on both sides of a row (sum_i cap_i x ticks, Q x load bytes),
        # with room for the terms of one row (options, x sites and 2 x ticks in the resilience
        # rows). A fixed cap of Q <= 1e6 left a 10 Gbps route 31 100 units per tick on a 3e-11 s
        # grid: 3e-5 off the evaluator, which the driver rejects.
        max_load = max(
            [cfg.dp * (max((cr.get(r, 0) for cr in d.chain_cross), default=0) + self._max_routed) * d.pp_bytes_per_crossing for r in d.routes]
            + [len(d.pairs) * sum(d.wan_bytes), 1.0]
        )
        terms = 4 * max((len(o) for o in d.wave_options.values()), default=1) * len(d.sites)
        self.Q = float(max(1, math.floor(min(INT_LIMIT / (max(max_cap_tick, 1e-30) * TT), INT_LIMIT / max_load) / terms)))
        pp_bytes = round(d.pp_bytes_per_crossing)
        self.pp_loads: dict[Any, Any] = {}
        self.dp_loads: dict[Any, Any] = {}
        for r in d.routes:
            maxc = max((cr.get(r, 0) for cr in d.chain_cross), default=0)
            if maxc == 0 and r not in pp_flow_load:
                continue
            load = sum(n[c] * d.chain_cross[c].get(r, 0) for c in C if d.chain_cross[c].get(r, 0)) * pp_bytes
            load = load + sum(pp_flow_load.get(r, []))
            self.pp_loads[r] = load
            self._route_time(T_pipe, load, r, "route.pp")
        # the WAN exchange may last H (diloco) or 2H (streaming hides up to T_pipe more) times
        # the step: its variables get that much room, and its rows a Q that keeps products in
        # int64 (the step's precision is unchanged: only T_wan / H counts in it)
        wan_factor = {"synchronous": 1, "diloco": d.every_steps}.get(d.sync_mode, 2 * d.every_steps)
        TW = wan_factor * TT
        Q_wan = float(max(1, math.floor(self.Q / wan_factor)))
        T_intra = M.NewIntVar(min(TT, math.floor(d.intra_lower_bound / self.tau)), TT, "T_intra")
        T_dpbw = M.NewIntVar(0, TW, "T_dpbw")
        T_lat = M.NewIntVar(0, TW, "T_lat")
        h: dict[tuple[str, int], Any] = {}
        dp_load: dict[Any, list[Any]] = {r: [] for r in d.routes}
        pair_dem: dict[Any, list[tuple[Any, Any, int]]] = {}  # routed pair -> (D, b, share bound) per class
        for cls in d.stage_classes:
            k = cls[0]  # the class's representative stage
            hosts = d.stage_sites[k]
            for s in hosts:
                h[(s, k)] = hv = M.NewBoolVar(f"h[{s}][{k}]")
                M.Add(x[(s, k)] <= D * hv)
                M.Add(x[(s, k)] >= hv)
                if D >= 2 and d.class_intra(cls, s) > 0:
                    # every member's NIC carries the data-parallel volume of a flat ring
                    M.Add(T_intra >= self.ticks(d.class_intra(cls, s))).WithName(f"dp.intra[{s}][{k}]").OnlyEnforceIf(hv)
                    self._intra_terms.append((hv, x[(s, k)], self.ticks(d.class_intra(cls, s))))
            if len(hosts) < 2:
                continue
            S_k = d.class_wan_bytes(cls)
            shares = [0] + [round(2 * S_k / K) if K >= 2 else 0 for K in range(1, len(hosts) + 1)]
            n_hosts = M.NewIntVar(1, len(hosts), f"K[{k}]")
            M.Add(n_hosts == sum(h[(s, k)] for s in hosts))
            share = M.NewIntVar(0, max(shares), f"share[{k}]")
            M.AddElement(n_hosts, shares, share)
            for a, b in d.disconnected:
                if a in hosts and b in hosts:
                    M.AddBoolOr([h[(a, k)].Not(), h[(b, k)].Not()])
            for a, b in d.pairs:
                if a not in hosts or b not in hosts:
                    continue
                bp = M.NewBoolVar(f"b[{a},{b}][{k}]")
                M.AddBoolOr([h[(a, k)].Not(), h[(b, k)].Not(), bp])
                dem = M.NewIntVar(0, max(shares), f"D[{a},{b}][{k}]")
                M.Add(dem >= share).WithName(f"dp.pair[{a},{b}][{k}]").OnlyEnforceIf(bp)
                M.Add(T_lat >= self.ticks(2 * d.pair_latency[(a, b)])).OnlyEnforceIf(bp)
                self._pairs.append((dem, share, bp, h[(a, k)], h[(b, k)], self.ticks(2 * d.pair_latency[(a, b)])))
                if d.routed((a, b)):
                    pair_dem.setdefault((a, b), []).append((dem, bp, max(shares)))
                    continue
                for r in d.pair_routes[(a, b)]:
                    dp_load[r].append(dem)
        self._route_data_parallel(pair_dem, T_lat, dp_load)
        for r in d.routes:
            if dp_load[r]:
                self.dp_loads[r] = sum(dp_load[r])
                self._route_time(T_dpbw, sum(dp_load[r]), r, "route.dp", TW, Q_wan)
        T_wan = T_dpbw + T_lat
        H = d.every_steps
        T = M.NewIntVar(0, TT, "T")
        self.T = T
        if d.sync_mode == "synchronous":
            M.Add(T == T_pipe + T_intra + T_wan)
        elif d.sync_mode == "diloco":
            # T * H == H * (T_pipe + T_intra) + T_wan, rounded up to the tick grid
            M.Add(H * T >= H * (T_pipe + T_intra) + T_wan)
            M.Add(H * T < H * (T_pipe + T_intra) + T_wan + H)
        else:
            exposed = M.NewIntVar(0, TT, "T_exposed")
            self._exposed = exposed
            M.Add(H * exposed >= T_wan - H * T_pipe)
            M.Add(T == T_pipe + T_intra + exposed)
        if d.max_step_time_s is not None:
            M.Add(T <= math.floor(d.max_step_time_s / self.tau * (1 + 1e-9)))
        if self.t_cap is not None:
            M.Add(T <= math.floor(self.t_cap / self.tau))
        if self.rate_cap is not None:
            M.Add(self.rate <= math.floor(self.rate_cap / RATE_UNIT))
        if self.cutoff is not None:
            if self.objective == "step_time":
                M.Add(T <= self.ticks(self.cutoff) + 1)
            elif self.objective == "cost":
                M.Add(capex <= math.floor(self.cutoff))
            else:
                M.Add(self.rate <= math.ceil(self.cutoff / RATE_UNIT))
        self.sites_used = {s: M.NewBoolVar(f"site_used[{s}]") for s in d.sites}
        for s in d.sites:
            M.Add(nodes[s] <= d.site_nodes[s] * self.sites_used[s])
        self.TW, self.Q_wan = TW, Q_wan
        if d.resilience is not None:
            if d.resilience.max_step_time_s is None:
                self._exact_step(T_pipe, T_intra, T_dpbw, T_lat)
            self._add_resilience(T, T_pipe, T_intra, T_dpbw, T_lat, nodes)
        M.Minimize(self._main())

    # ------------------------------------------------------------------ routing (MCF)

    def _paths_allowed(self, phase: str, q: Any, active: list[Any]) -> list[Any]:
        """w[j], j >= 1: the pair may use its paths 0..j (prefixes only, see milp)."""
        M = self.m
        ws: list[Any] = [None]
        for j in range(1, len(self.d.pair_paths[q])):
            w = M.NewBoolVar(f"w[{phase}][{q}][{j}]")
            self.w[(phase, q, j)] = w
            # linear rows (not enforcement literals): CP-SAT's default LP relaxation sees them
            if j == 1:
                M.Add(w <= sum(active))
            else:
                M.Add(w <= ws[-1])
            ws.append(w)
        return ws

    def _split(self, phase: str, q: Any, demand: Any, max_demand: int, ws: list[Any], loads: dict[Any, list[Any]]) -> None:
        M = self.m
        flows = []
        for j, path in enumerate(self.d.pair_paths[q]):
            f = M.NewIntVar(0, max_demand, f"f[{phase}][{q}][{j}]")
            self.f[(phase, q, j)] = f
            if j >= 1:
                M.Add(f <= max_demand * ws[j])
            flows.append(f)
            for r in path.routes:
                loads.setdefault(r, []).append(f)
        M.Add(sum(flows) == demand).WithName(f"route.{phase}.demand[{q}]")

    def _route_pipeline(self, T_pipe: Any, TT: int) -> dict[Any, list[Any]]:
        """Pipeline activations of routed pairs as a flow over candidate paths (see milp)."""
        d, M = self.d, self.m
        pp_bytes = round(d.pp_bytes_per_crossing)
        loads: dict[Any, list[Any]] = {}
        ws: dict[Any, list[Any]] = {}
        self._max_routed = max((len(d.chain_routed_pairs(c)) for c in range(len(d.chains))), default=0)
        for q, crossing in d.routed_crossings().items():
            ws[q] = self._paths_allowed("pp", q, [self.u[c] for c in crossing])
            self._split("pp", q, sum(self.n[c] for c in crossing) * pp_bytes, d.cfg.dp * pp_bytes, ws[q], loads)
        for c in range(len(d.chains)):
            routed = d.chain_routed_pairs(c)
            for levels, t in d.chain_level_time[c].items():
                chosen = [ws[q][lv] for q, lv in zip(routed, levels, strict=True) if lv >= 1]
                if not chosen:
                    continue
                tc = self.ticks(t)
                if tc > TT:
                    M.AddBoolOr([self.u[c].Not(), *(w.Not() for w in chosen)])
                else:
                    M.Add(T_pipe >= tc * (self.u[c] + sum(chosen) - len(chosen)))
                self._pipe_level_terms.append((min(tc, TT), self.u[c], chosen))
        return loads

    def _route_data_parallel(self, pair_dem: dict[Any, list[tuple[Any, Any, int]]], T_lat: Any, dp_load: dict[Any, list[Any]]) -> None:
        loads: dict[Any, list[Any]] = {}
        for q, dems in sorted(pair_dem.items()):
            ws = self._paths_allowed("dp", q, [bp for _, bp, _ in dems])
            self._split("dp", q, sum(dem for dem, _, _ in dems), sum(mx for _, _, mx in dems), ws, loads)
            for j in range(1, len(ws)):
                lat = self.ticks(2 * self.d.pair_paths[q][j].latency_s)
                self.m.Add(T_lat >= lat * ws[j])
                self._lat_terms.append((lat, ws[j]))
        for r, terms in loads.items():
            dp_load[r].extend(terms)

    def routing(self, solver: cp_model.CpSolver) -> list[dict[str, Any]]:
        return extract_routing(self.d, self.f, lambda key: bool(solver.Value(self.w[key])), lambda key: float(solver.Value(self.f[key])))

    def _exact_route_time(self, load: Any, r: Any, ub: int, Q: float, family: str) -> Any:
        """t = ceil(Q load / cap) for the chosen wave option: the hull with a two-sided row."""
        M = self.m
        t = M.NewIntVar(0, ub, f"t[{family}][{r}]")
        taus, slack = [], []
        for i, opt in enumerate(self.d.wave_options[r]):
            tau = M.NewIntVar(0, ub, f"tau[{family}][{r}][{i}]")
            M.Add(tau <= ub * self.y[(r, i)])
            cap_int = math.floor(opt.capacity_Bps * self.tau * Q)
            if cap_int <= 0:
                M.Add(tau == 0)
            else:
                slack.append((cap_int - 1) * self.y[(r, i)])
            taus.append((cap_int, tau))
        M.Add(sum(tt for _, tt in taus) == t)
        lhs = sum(c * tt for c, tt in taus if c > 0)
        M.Add(lhs >= round(Q) * load)
        M.Add(lhs <= round(Q) * load + sum(slack))
        return t

    def _exact_step(self, T_pipe: Any, T_intra: Any, T_dpbw: Any, T_lat: Any) -> None:
        """The step-time variable equals the plan's step time (see milp._exact_step)."""
        d, M = self.d, self.m
        TT = TIME_TICKS + 1
        for dem, share, bp, ha, hb, _ in self._pairs:
            M.AddImplication(bp, ha)
            M.AddImplication(bp, hb)
            M.Add(dem <= share)
            M.Add(dem == 0).OnlyEnforceIf(bp.Not())
        pipe = [self.ticks(d.chain_time[c]) * self.u[c] for c in self.u]
        for i, (tc, uc, chosen) in enumerate(self._pipe_level_terms):
            a = M.NewBoolVar(f"exact.chain_path[{i}]")
            M.AddBoolAnd([uc, *chosen]).OnlyEnforceIf(a)
            M.AddBoolOr([a, uc.Not(), *(w.Not() for w in chosen)])
            pipe.append(tc * a)
        pipe += [self._exact_route_time(load, r, TT, self.Q, "exact.pp") for r, load in self.pp_loads.items()]
        M.AddMaxEquality(T_pipe, pipe)
        dp = [0] + [self._exact_route_time(load, r, self.TW, self.Q_wan, "exact.dp") for r, load in self.dp_loads.items()]
        M.AddMaxEquality(T_dpbw, dp)
        M.AddMaxEquality(T_lat, [0] + [lat * bp for _dem, _share, bp, _ha, _hb, lat in self._pairs] + [lat * w for lat, w in self._lat_terms])
        M.AddMaxEquality(T_intra, [0] + [tk * g for g, _, tk in self._intra_terms])
        if self._exposed is not None:
            H = d.every_steps
            raw = M.NewIntVar(-4 * self.TW, 4 * self.TW, "exact.exposed_raw")
            M.Add(raw == T_dpbw + T_lat - H * T_pipe)
            pos = M.NewIntVar(0, 4 * self.TW, "exact.exposed_pos")
            M.AddMaxEquality(pos, [0, raw])
            M.Add(H * self._exposed <= pos + H - 1)

    def _wan_part(self, T_wan: Any, T_pipe: Any, tag: str) -> Any:
        """The data-parallel WAN term for the sync policy, in ticks (rounded up)."""
        d, M = self.d, self.m
        H = d.every_steps
        if d.sync_mode == "synchronous":
            return T_wan
        part = M.NewIntVar(0, 2 * (TIME_TICKS + 1), f"wan_part[{tag}]")
        if d.sync_mode == "diloco":
            M.Add(H * part >= T_wan)
        else:
            M.Add(H * part >= T_wan - H * T_pipe)
        return part

    def _add_resilience(self, T: Any, T_pipe: Any, T_intra: Any, T_dpbw: Any, T_lat: Any, nodes: Any) -> None:
        """The same survival constraints as placer.optimize.milp._add_resilience, on ticks."""
        d, M, res = self.d, self.m, self.d.resilience
        assert res is not None
        TT = TIME_TICKS + 1
        big = 2 * TT
        if res.max_step_time_s is not None:
            limit_rhs = None
            limit_ticks = math.floor((1 + res.max_slowdown) * res.max_step_time_s / self.tau * (1 + 1e-9))
        else:
            limit_rhs = round((1 + res.max_slowdown) * 10**6)
        used = self.sites_used
        for s in d.sites:
            M.Add(used[s] <= nodes[s])
        zp = {p: M.NewBoolVar(f"res.p[{p}]") for p in range(1, len(d.sites) + 1)}
        M.AddExactlyOne(zp.values())
        M.Add(sum(p * z for p, z in zp.items()) == sum(used.values()))

        def within(expr: Any, tag: str) -> None:
            if limit_rhs is None:
                M.Add(expr <= limit_ticks).WithName(f"res.survive[{tag}]")
            else:
                M.Add(10**6 * expr <= limit_rhs * T).WithName(f"res.survive[{tag}]")

        for (klass, r), caps in sorted(res.degraded_capacity.items()):
            tag = f"{klass}:{r[0]}-{r[1]}"
            Tp = M.NewIntVar(0, big, f"res.T_pipe[{tag}]")
            M.Add(Tp >= T_pipe)
            if r in self.pp_loads:
                self._hull(Tp, self.pp_loads[r], r, [[c] for c in caps], None, big, f"res.pp[{tag}]")
            Td = M.NewIntVar(0, 2 * self.TW, f"res.T_dpbw[{tag}]")
            M.Add(Td >= T_dpbw)
            if r in self.dp_loads:
                healthy = [opt.capacity_Bps for opt in d.wave_options[r]]
                eff = [[(healthy[i] / f if f > 0 and math.isfinite(f) else 0.0) for f in res.dp_factor[(klass, r)][i]] for i in range(len(healthy))]
                self._hull(Td, self.dp_loads[r], r, eff, zp, 2 * self.TW, f"res.dp[{tag}]", self.Q_wan)
            within(Tp + T_intra + self._wan_part(Td + T_lat, Tp, tag), tag)
        if res.nic_factor is not None and math.isinf(res.nic_factor):
            M.Add(T_intra <= 0)  # a lost NIC cuts its node off the collective
        elif res.nic_factor is not None:
            scaled = M.NewIntVar(0, big * 4, "res.T_intra_nic")
            num = round(res.nic_factor * 10**6)
            M.Add(10**6 * scaled >= num * T_intra)
            within(T_pipe + scaled + self._wan_part(T_dpbw + T_lat, T_pipe, "nic"), "nic")

    def _hull(self, T_var: Any, load: Any, r: Any, caps: list[list[float]], zp: Any, ub: int, family: str, Q: float | None = None) -> None:
        Q = Q or self.Q
        taus = []
        for i, row in enumerate(caps):
            for p, cap in enumerate(row):
                if zp is not None and p == 0:
                    continue
                tau = self.m.NewIntVar(0, ub, f"tau[{family}][{i}][{p}]")
                self.m.Add(tau <= ub * self.y[(r, i)])
                if zp is not None:
                    self.m.Add(tau <= ub * zp[p])
                taus.append((math.floor(cap * self.tau * Q), tau))
        self.m.Add(sum(t for _, t in taus) == T_var)
        self.m.Add(sum(c * t for c, t in taus if c > 0) >= round(Q) * load)

    def _main(self) -> Any:
        return {"step_time": self.T, "cost": self.capex, "rate": self.rate}[self.objective]

    def _scale(self) -> float:
        return {"step_time": self.tau, "cost": 1.0, "rate": RATE_UNIT}[self.objective]

    def _route_time(self, T_var: Any, load: Any, r: Any, family: str, ub: int = TIME_TICKS + 1, Q: float | None = None) -> None:
        """Q * load <= sum_i cap_i * tau_i with sum_i tau_i = T_var and tau_i <= UB * y_i:
        the convex hull of 'load / capacity(waves) <= T_var' over the wave one-hot."""
        Q = Q or self.Q
        taus = []
        for i, opt in enumerate(self.d.wave_options[r]):
            tau = self.m.NewIntVar(0, ub, f"tau[{family}][{r}][{i}]")
            self.m.Add(tau <= ub * self.y[(r, i)])
            cap_int = math.floor(opt.capacity_Bps * self.tau * Q)
            taus.append((cap_int, tau))
        self.m.Add(sum(t for _, t in taus) == T_var).WithName(f"{family}.split[{r}]")
        self.m.Add(sum(c * t for c, t in taus if c > 0) >= round(Q) * load).WithName(f"{family}.capacity[{r}]")

    def add_hint(self, counts: dict[int, int], waves: dict[Any, int]) -> None:
        for c, v in self.n.items():
            self.m.AddHint(v, counts.get(c, 0))
        for (r, i), yv in self.y.items():
            self.m.AddHint(yv, 1 if self.d.wave_options[r][i].waves == waves.get(r, 0) else 0)

    def solve(self, time_limit_s: float, threads: int | None, seed: int, options: dict[str, Any]) -> InnerSolution | None:
        solver = cp_model.CpSolver()
        p = solver.parameters
        p.max_time_in_seconds = max(0.01, time_limit_s)
        p.num_workers = threads or 0
        p.random_seed = seed
        for key, value in options.items():
            if hasattr(p, key):
                setattr(p, key, value)
        p.catch_sigint_signal = False  # placer.interrupt stops the search and keeps the plan
        t0 = time.perf_counter()
        with interrupt.stoppable(solver.StopSearch):
            st = solver.Solve(self.m)
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        optimal = st == cp_model.OPTIMAL
        # the tie-break solve gets what is left of the time limit, not a second one
        p.max_time_in_seconds = max(0.01, time_limit_s - (time.perf_counter() - t0))
        scale = self._scale()
        value = solver.ObjectiveValue() * scale
        bound = solver.BestObjectiveBound() * scale
        first = self._extract(solver)
        first_routing = self.routing(solver)
        t_first = solver.Value(self.T) * self.tau
        # tie-break: same objective value, then fewer waves, then fewer sites
        self.m.Add(self._main() <= round(solver.ObjectiveValue()))
        for v in self.n.values():
            self.m.AddHint(v, solver.Value(v))
        # canonical order among the remaining ties (CP-SAT's parallel workers may otherwise
        # return a different optimal plan on each run): lowest chain-type indices first
        # then fewer listed paths per routed pair
        w_paths = self.d.cfg.dp * max(1, len(self.d.chains)) + 1
        w_sites = w_paths * (len(self.w) + 1)
        w_waves = w_sites * (len(self.d.sites) + 1)
        self.m.Minimize(
            w_waves * self.total_waves
            + w_sites * sum(self.sites_used.values())
            + w_paths * sum(self.w.values())
            + sum(c * v for c, v in self.n.items())
        )
        if interrupt.requested():
            st2 = cp_model.UNKNOWN  # stopping: keep the first solution, no tie-break solve
        else:
            with interrupt.stoppable(solver.StopSearch):
                st2 = solver.Solve(self.m)
        if st2 not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            counts, waves = first
            return InnerSolution(counts, waves, value, bound, optimal, step_time_s=value if self.objective == "step_time" else t_first, routing=first_routing)
        counts, waves = self._extract(solver)
        return InnerSolution(counts, waves, value, bound, optimal, step_time_s=value if self.objective == "step_time" else None, routing=self.routing(solver))

    def _extract(self, solver: cp_model.CpSolver) -> tuple[dict[int, int], dict[Any, int]]:
        counts = {c: solver.Value(v) for c, v in self.n.items() if solver.Value(v) > 0}
        waves = {r: self.d.wave_options[r][i].waves for (r, i), yv in self.y.items() if solver.Value(yv)}
        return counts, waves
