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
import os
import time
from fractions import Fraction
from typing import Any

from ortools.sat.python import cp_model

from placer import interrupt
from placer.errors import SolverError
from placer.network import route_key
from placer.optimize import deadline as dl
from placer.optimize.contention import crossings_on, hops_crossed, sloped_chains
from placer.optimize.data import InnerData, InnerSolution, NoPlan, extract_routing
from placer.optimize.families import (
    FAMILIES,
    HostPair,
    IntraTerm,
    LatencyTerm,
    PathLevelTerm,
    chain_weight,
    hull_cells,
    intra_targets,
    moment_chains,
    row,
    series_keys,
    series_tag,
    stagger_works,
    sync_rule,
    tick_family,
    tiebreak_weights,
    wan_nic_terms,
    work_maxes,
)
from placer.optimize.symmetry import ordered_start, site_classes

# CP-SAT workers when the user leaves threads unset ("all cores"): at least the 8-worker
# portfolio. With num_workers = 0 CP-SAT runs one worker per core, and on 2 cores that is
# one full-problem subsolver (default_lp) beside the first-solution/LNS worker: on
# four-site-metro-longhaul's first configuration it dived for 54 s (488k branches, 129
# conflicts) without closing a 2e-4 gap in 2 of 3 seeds, while 6-8 workers on the same 2
# cores (core, max_lp, reduced_costs, ... beside LNS, time-sliced) proved it in 1.0-2.1 s in
# 6 of 6 runs (benchmarks/README.md, branch `portfolio`). OR-Tools' maintainers recommend
# several workers for their diverse strategies (google/or-tools discussion #4139). An
# explicit `threads` (CLI --threads, solver.threads) is honoured exactly.
PORTFOLIO_WORKERS = 8
# a split flow's unit (flow_unit): a pair's largest demand spans at most 2**FLOW_BITS units
FLOW_BITS = 20
FLOW_REL = 2.0**-FLOW_BITS  # the flows' rounding, relative to the pair's largest demand
INT_LIMIT = 4e18  # stay well inside int64 for coefficient x domain products
TIME_TICKS = 10**9
RATE_UNIT = 1e-9  # USD per second per integer unit of the cost rate


def flow_unit(max_demand: int) -> int:
    """Bytes per unit of a pair's split flows: the smallest integer U with
    max_demand / U <= 2**FLOW_BITS (1 for demands up to 1 MiB, so small models keep byte
    flows). In bytes a flow spans up to 1e11-1e12 and its path-allowed row
    `f <= max_demand w` puts that coefficient on a Boolean (an LP value w = 1e-11, inside
    the LP's tolerance, carries a whole flow), and CP-SAT's search ran over 1e11-value
    domains: at paths_per_pair 3 it reported `Lp debug: Bad` and proved nothing in 60 s
    (benchmarks/README.md, branch `rescale`). In units the big-M is at most 2**20 and the
    flows' route-load coefficients U Q stay near 1e9.

    Exactness: U * f is what the model puts on the path's routes, and U * sum f is the
    demand rounded up to a whole unit (`route.*.demand` and `demand_round`). The plan
    records the shares f / sum f, and the evaluator puts share x the exact demand on each
    path, which is <= U * f: every route load of the model bounds the evaluator's from
    above (never below), by under one unit per pair, i.e. <= 2**-20 (9.5e-7) of the pair's
    largest demand. So a plan the model accepts is feasible for the evaluator, and the
    model's times exceed the evaluator's by at most that much, well inside the driver's
    AGREEMENT_REL (1e-5), the same direction as the tick grid's rounding up. A bound the
    solver proves is a bound of this slightly pessimistic model: it can exceed the exact
    optimum by at most that rounding (like the ticks), never undercut a feasible plan's
    rounded value."""
    return max(1, -(-int(max_demand) // 2**FLOW_BITS))


class CpsatInner:
    def __init__(
        self,
        data: InnerData,
        objective: str,
        upper_bound_s: float,
        cutoff: float | None = None,
        t_cap: float | None = None,
        rate_cap: float | None = None,
        symmetry: bool = False,
    ):
        self.d = data
        self.symmetry = symmetry  # the symmetry.order rows in the objective solve
        self.t_cap = t_cap
        self.rate_cap = rate_cap
        self.objective = objective
        self.cutoff = cutoff
        self.tie_status: str | None = None  # how the last tie-break solve ended
        self.ub = max(upper_bound_s, 1e-6)
        self.tau = self.ub / TIME_TICKS
        self.TT = TIME_TICKS + 1  # the step's range in ticks
        self.sync = sync_rule(data.sync_mode, data.every_steps)
        self.m = cp_model.CpModel()
        self.rows: list[str] = []  # every row's name, in build order
        self._values: dict[str, int] = {}
        for family in FAMILIES:
            dl.check()
            getattr(self, f"define_{family}")()

    def ticks(self, seconds: float) -> int:
        return math.ceil(seconds / self.tau - 1e-6)

    def start_from(self, values: dict[str, int]) -> None:
        """Hint an earlier round's plan (its named integer variables) to CP-SAT."""
        values = ordered_start(  # a hint that breaks the symmetry rows is permuted first
            self.d, self.sym_classes, values, self.n, self.u, self.y, self.nodes, _var_name
        )
        proto = self.m.Proto()
        for i, var in enumerate(proto.variables):
            if var.name and var.name in values:
                self.m.AddHint(self.m.GetIntVarFromProtoIndex(i), values[var.name])

    def integer_values(self) -> dict[str, int]:
        return dict(self._values)

    def add(self, constraint: Any, name: str) -> Any:
        """Name a row (families.row) and record it."""
        dl.check()  # a large configuration's build stops at the driver's deadline
        self.rows.append(name)
        return constraint.WithName(name)

    # ------------------------------------------------------------------ families

    def define_replicas(self) -> None:
        d, M, add = self.d, self.m, self.add
        D, C = d.cfg.dp, range(len(d.chains))
        self.n = n = {c: M.NewIntVar(0, D, f"n[{c}]") for c in C}
        self.u = u = {c: M.NewBoolVar(f"u[{c}]") for c in C}
        add(M.Add(sum(n.values()) == D), row("replicas.total"))
        for c in C:
            add(M.Add(n[c] <= D * u[c]), row("replicas.use", c))

    def define_placement(self) -> None:
        d, M, add, n = self.d, self.m, self.add, self.n
        cfg, C = d.cfg, range(len(d.chains))
        self.x = x = {
            (s, k): sum(n[c] for c in C if d.chains[c][k] == s)
            for k in range(cfg.pp)
            for s in d.stage_sites[k]
        }
        self.nodes = nodes = {s: M.NewIntVar(0, d.site_nodes[s], f"nodes[{s}]") for s in d.sites}
        for s in d.sites:
            used = sum(x[(s, k)] for k in range(cfg.pp) if (s, k) in x)
            add(M.Add(d.site_groups_per_node[s] * nodes[s] >= used), row("site.nodes", s))

    def define_waves(self) -> None:
        d, M = self.d, self.m
        self.y = y = {
            (r, i): M.NewBoolVar(f"y[{r}][{i}]")
            for r in d.routes
            for i in range(len(d.wave_options[r]))
        }
        for r in d.routes:
            self.add(
                M.AddExactlyOne(y[(r, i)] for i in range(len(d.wave_options[r]))),
                row("route.waves", *r),
            )
        self.capex = sum(
            round(opt.capex_usd) * y[(r, i)]
            for r in d.routes
            for i, opt in enumerate(d.wave_options[r])
        )
        self.total_waves = sum(
            opt.waves * y[(r, i)] for r in d.routes for i, opt in enumerate(d.wave_options[r])
        )

    def define_power(self) -> None:
        """Site power in milliwatts, and the running cost in RATE_UNIT USD per second."""
        d, M, y, nodes = self.d, self.m, self.y, self.nodes
        rate_terms = [
            round(opt.capex_usd / d.amortization_s / RATE_UNIT) * y[(r, i)]
            for r in d.routes
            for i, opt in enumerate(d.wave_options[r])
        ]
        for s in d.sites:
            limit = d.site_power_w[s]
            j_rate = d.energy_usd_per_j / RATE_UNIT * d.site_pue[s]
            rate_terms.append(
                round(j_rate * d.site_node_w[s] + d.site_node_usd_per_s[s] / RATE_UNIT) * nodes[s]
            )
            rate_terms += [
                round(j_rate * opt.module_w) * y[(r, i)]
                for r in d.routes
                if s in r
                for i, opt in enumerate(d.wave_options[r])
            ]
            if limit is None:
                continue
            # milliwatts (rounded up: conservative by at most a milliwatt per term)
            # (float noise below a microwatt is not rounded up: 1.3 x 6496 W is 8444800 mW, not 8444801)  # noqa: E501
            coef_node = math.ceil(d.site_pue[s] * d.site_node_w[s] * 1000 - 1e-3)
            optics = sum(
                math.ceil(d.site_pue[s] * opt.module_w * 1000 - 1e-3) * y[(r, i)]
                for r in d.routes
                if s in r
                for i, opt in enumerate(d.wave_options[r])
            )
            self.add(
                M.Add(coef_node * nodes[s] + optics <= math.floor(limit * 1000 * (1 + 1e-9))),
                row("site.power", s),
            )
        self.rate = sum(rate_terms)  # USD per second in RATE_UNIT

    def define_budget(self) -> None:
        if self.d.max_cost_usd is not None:
            self.add(self.m.Add(self.capex <= math.floor(self.d.max_cost_usd)), row("budget"))

    def define_pipeline(self) -> None:
        d, M, u = self.d, self.m, self.u
        # every chain slower than the range (the cutoff): the rows below leave no chain in
        # use and the model infeasible (proved), rather than an empty domain (invalid)
        self.T_pipe = M.NewIntVar(
            min(min(self.ticks(t) for t in d.chain_time), self.TT), self.TT, "T_pipe"
        )
        self._exact = d.resilience is not None and d.resilience.max_step_time_s is None
        for c in u:
            tc = self.ticks(d.chain_time[c])
            if tc > self.TT:
                name = "pipe.chain" if d.planes is None else "pipe.too_slow"
                self.add(M.Add(u[c] == 0), row(name, c))
            elif d.planes is None:  # staggered replicas: the uncontended chain times
                self.add(M.Add(self.T_pipe >= tc), row("pipe.chain", c)).OnlyEnforceIf(u[c])
        self.w: dict[tuple[str, Any, int], Any] = {}  # (phase, pair, j): path j may carry traffic
        self.f: dict[tuple[str, Any, int], Any] = {}  # (phase, pair, j): units on path j
        self.f_unit: dict[tuple[str, Any], int] = {}  # (phase, pair): bytes per flow unit
        self._pipe_level_terms: list[PathLevelTerm] = []
        self._pp_flow_load = self._route_pipeline(self.T_pipe, self.TT)

    def define_routing(self) -> None:
        """T_pipe >= pipeline bytes / capacity per route, with loads in bytes / Q per tick so
        that no row leaves int64."""
        d, n, cfg, C = self.d, self.n, self.d.cfg, range(len(self.d.chains))
        pp_flow_load = self._pp_flow_load
        TT = self.TT
        # route capacities in integer units: cap_i * T_ticks >= Q * load_bytes
        max_cap_tick = max(
            (opt.capacity_Bps * self.tau for r in d.routes for opt in d.wave_options[r]),
            default=1.0,
        )
        # Q as large as int64 allows on both sides of a row (sum_i cap_i x ticks, Q x load bytes),
        # with room for the terms of one row (options, x sites and 2 x ticks in the resilience
        # rows). A fixed cap of Q <= 1e6 left a 10 Gbps route 31 100 units per tick on a 3e-11 s
        # grid: 3e-5 off the evaluator, which the driver rejects.
        # CP-SAT checks a row for overflow term by term (coefficient x the variable's upper
        # bound), so a route's load is bounded by dp replicas on every chain type at once
        max_load = max(
            [
                cfg.dp
                * (sum(cr.get(r, 0) for cr in d.chain_cross) + self._max_routed)
                * d.pp_bytes_per_crossing
                for r in d.routes
            ]
            + [len(d.pairs) * sum(d.wan_bytes), 1.0]
        )
        terms = 4 * max((len(o) for o in d.wave_options.values()), default=1) * len(d.sites)
        self.Q = float(
            max(
                1,
                math.floor(
                    min(INT_LIMIT / (max(max_cap_tick, 1e-30) * TT), INT_LIMIT / max_load) / terms
                ),
            )
        )
        pp_bytes = round(d.pp_bytes_per_crossing)
        self.pp_loads: dict[Any, Any] = {}
        for r in d.routes:
            maxc = max((cr.get(r, 0) for cr in d.chain_cross), default=0)
            if maxc == 0 and r not in pp_flow_load:
                continue
            load = (
                sum(n[c] * d.chain_cross[c].get(r, 0) for c in C if d.chain_cross[c].get(r, 0))
                * pp_bytes
            )
            load = load + sum(pp_flow_load.get(r, []))
            self.pp_loads[r] = load
            self._hull(
                self.T_pipe, load, r, self._wave_caps(r), None, TT, "route.pp", by_route=True
            )
        self._define_ticks()

    # ------------------------------------------------------------------ lockstep ticks

    def _tick_loads(self) -> dict[Any, Any]:
        """Bytes one tick puts on each hop (see milp._tick_loads); a routed pair's tick
        flow on a path is ceil(per-step flow x tick_fraction), an integer."""
        d, M, n = self.d, self.m, self.n
        msg = round(d.message_bytes)
        terms: dict[Any, list[Any]] = {}
        for h, per_chain in d.hop_cross.items():
            terms[h] = [k * msg * n[c] for c, k in per_chain.items()]
        N = round(1 / d.tick_fraction)  # messages per crossing and step
        for (phase, q, j), f in self.f.items():
            if phase != "pp":
                continue
            g = M.NewIntVar(0, d.cfg.dp * msg, f"g[{q}][{j}]")
            U = self.f_unit[(phase, q)]
            self.add(M.Add(N * g >= U * f), row("route.tick_flow", *q, j))
            if self._exact:
                self.add(M.Add(N * g <= U * f + N - 1), row("route.tick_flow_ub", *q, j))
            for a, b in zip(d.pair_paths[q][j].sites, d.pair_paths[q][j].sites[1:], strict=False):
                for h in ((a, b), (b, a)):
                    terms.setdefault(h, []).append(g)
        return {h: sum(t) for h, t in sorted(terms.items())}

    def _define_ticks(self) -> None:
        """Lockstep contention (see milp._define_ticks), in ticks."""
        d, M, add = self.d, self.m, self.add
        self.theta: dict[Any, Any] = {}
        self.tau_x: dict[tuple[int, int], Any] = {}
        self.lam: dict[tuple[int, int], Any] = {}
        self._tau_terms: dict[tuple[int, int], list[Any]] = {}
        self._plane_exprs: list[Any] = []
        if d.planes is None:
            return
        # only chain types with a sloped plane (from an earlier round's plan) need transmit
        # variables, and only the hops they cross need tick variables
        self.sloped = sloped_chains(d.planes)
        used_hops = hops_crossed(d.planes, self.sloped)
        self.tick_loads = {h: v for h, v in self._tick_loads().items() if h in used_hops}
        for h, load in self.tick_loads.items():
            self.theta[h] = t = M.NewIntVar(0, self.TT, f"theta[{h}]")
            r = route_key(*h)
            self._hull(
                t,
                load,
                r,
                self._wave_caps(r),
                None,
                self.TT,
                tick_family(h),
                exact=self._exact,
                by_route=True,
            )
        for c, cp in enumerate(d.planes):
            if not cp.planes:
                add(M.Add(self.u[c] == 0), row("pipe.disconnected", c))
                continue
            for i, x in enumerate(cp.crossings if c in self.sloped else ()):
                self._crossing(c, i, x, self.theta, self.tau_x, self._tau_terms, "pipe.tau")
            for k, pl in enumerate(cp.planes):
                expr = self._plane(c, pl, self.tau_x)
                add(M.Add(self.T_pipe >= expr), row("pipe.plane", c, k))
                self._plane_exprs.append(expr)

    def _both(self, a: Any, b: Any) -> Any:
        """A literal equal to a and b."""
        M = self.m
        z = M.NewBoolVar("")
        M.AddImplication(z, a)
        M.AddImplication(z, b)
        M.AddBoolOr([a.Not(), b.Not(), z])
        return z

    def _crossing(
        self,
        c: int,
        i: int,
        x: Any,
        theta: dict[Any, Any],
        tau: dict[tuple[int, int], Any],
        tau_terms: dict[tuple[int, int], list[Any]],
        family: str,
        floor: Any = None,
    ) -> None:
        """tau[c, i] (ticks) >= the NIC time and every hop tick of the paths the pair may
        use, when chain c is in use; 0 otherwise (see milp._crossing). In exact mode it
        equals the largest of them."""
        M, add, u, TT = self.m, self.add, self.u[c], self.TT
        tau[(c, i)] = t = M.NewIntVar(0, TT, f"{family}[{c}][{i}]")
        add(M.Add(t == 0), row(f"{family}.off", c, i)).OnlyEnforceIf(u.Not())
        terms: list[Any] = [min(self.ticks(x.nic_s), TT) * u] if floor is None else [floor]
        for lv, hops in enumerate(x.hops):
            w = self.w.get(("pp", x.pair, lv)) if lv >= 1 else None
            if lv >= 1 and w is None:
                break
            on = u if w is None else self._both(u, w)
            for h in hops:
                if h not in theta:
                    continue
                g = M.NewIntVar(0, TT, f"{family}.hop[{c}][{i}][{lv}][{h}]")
                add(M.Add(g == theta[h]), row(f"{family}.hop_on", c, i, lv, *h)).OnlyEnforceIf(on)
                add(M.Add(g == 0), row(f"{family}.hop_off", c, i, lv, *h)).OnlyEnforceIf(on.Not())
                terms.append(g)
        for k, e in enumerate(terms):
            add(M.Add(t >= e), row(family, c, i, k))
        tau_terms[(c, i)] = terms
        if (c, i) in self.lam:
            return
        lat = [min(self.ticks(v), TT) for v in x.latency_s]
        if len(x.hops) == 1 or ("pp", x.pair, 1) not in self.w:
            self.lam[(c, i)] = lat[0] * u
            return
        lam = M.NewIntVar(0, TT, f"lam[{c}][{i}]")
        expr = lat[0] + sum(
            (lat[lv] - lat[lv - 1]) * self.w[("pp", x.pair, lv)]
            for lv in range(1, len(lat))
            if ("pp", x.pair, lv) in self.w
        )
        if self._exact:
            add(M.Add(lam == expr), row("pipe.lam", c, i)).OnlyEnforceIf(u)
        else:
            add(M.Add(lam >= expr), row("pipe.lam", c, i)).OnlyEnforceIf(u)
        add(M.Add(lam == 0), row("pipe.lam_off", c, i)).OnlyEnforceIf(u.Not())
        self.lam[(c, i)] = lam

    def _plane(self, c: int, pl: Any, tau: dict[tuple[int, int], Any]) -> Any:
        """ceil(const) u_c + sum n_i tau[c, i] + sum l_i lam[c, i], in ticks."""
        return (
            min(self.ticks(pl.const), 2 * self.TT) * self.u[c]
            + sum(k * tau[(c, i)] for i, k in enumerate(pl.tau) if k)
            + sum(k * self.lam[(c, i)] for i, k in enumerate(pl.lam) if k)
        )

    def _define_node_fill(self, cls: list[int], s: str, k: int, hv: Any) -> None:
        """The site's NIC phase by its member count x = q a + r (PerfModel.intra_sync_s), as
        MilpInner._define_node_fill: a one-hot z_r over the remainders r >= 1, a one-hot
        w_N over the node count N = a + [r > 0] summing to the host indicator, and per
        count n the sync's seconds at n members, enforced by w_N and z_r (r > 0) or w_N and
        no z (r = 0); the same rows for each release group's I_g (families.intra_targets)."""
        d, M, add, x = self.d, self.m, self.add, self.x
        q, D = d.fill_q[s], d.cfg.dp
        varies = []
        for var, times, tag, terms in self._intra_targets(cls, s, fill=True):
            lo = min(times.values())
            if lo > 0:
                add(
                    M.Add(var >= self.ticks(lo)), row(f"dp.intra{tag[0]}", *tag[1:], s, k)
                ).OnlyEnforceIf(hv)
            if max(times.values()) > lo:
                varies.append((var, times, tag, terms))
            elif lo > 0:
                terms.append(IntraTerm(hv, x[(s, k)], self.ticks(lo)))
        if not varies:
            return  # one time at every count (dp <= q with no NIC phase)
        z = {r: M.NewBoolVar(f"fill_r[{s}][{k}][{r}]") for r in range(1, min(q - 1, D) + 1)}
        w = {N: M.NewBoolVar(f"fill_N[{s}][{k}][{N}]") for N in range(1, -(-D // q) + 1)}
        a = M.NewIntVar(0, D // q, f"fill_nodes[{s}][{k}]")
        add(M.AddAtMostOne(list(z.values())), row("dp.fill_onehot", s, k))
        add(M.Add(x[(s, k)] == q * a + sum(r * z[r] for r in z)), row("dp.fill_count", s, k))
        add(M.Add(sum(w.values()) == hv), row("dp.fill_nodes_onehot", s, k))
        add(
            M.Add(sum(N * w[N] for N in w) == a + sum(z.values())),
            row("dp.fill_nodes_count", s, k),
        )
        for var, times, tag, terms in varies:
            for n, t in times.items():
                N, r = -(-n // q), n % q
                if r:
                    cond, on = [w[N], z[r]], w[N] + z[r] - 1
                else:
                    cond, on = [w[N], *(v.Not() for v in z.values())], w[N] - sum(z.values())
                add(
                    M.Add(var >= self.ticks(t)), row(f"dp.intra_fill{tag[0]}", *tag[1:], s, k, n)
                ).OnlyEnforceIf(cond)
                terms.append(IntraTerm(on, x[(s, k)], self.ticks(t)))

    def _intra_targets(
        self, cls: list[int], s: str, fill: bool
    ) -> list[tuple[Any, Any, tuple[Any, ...], list[IntraTerm]]]:
        """families.intra_targets on this model's variables."""
        return intra_targets(
            self.d,
            self.T_intra,
            self.I_group,
            self._intra_terms,
            self._group_intra_terms,
            cls,
            s,
            fill,
            self.I_series,
            self._series_intra_terms,
        )

    def define_dp_hosting(self) -> None:
        d, M, add, x = self.d, self.m, self.add, self.x
        D, TT = d.cfg.dp, self.TT
        # the WAN exchange may last H (diloco) or 2H (streaming hides up to T_pipe more) times
        # the step: its variables get that much room, and its rows a Q that keeps products in
        # int64 (the step's precision is unchanged: only T_wan / H counts in it)
        wan_factor = int(self.sync.window)
        self.TW = TW = wan_factor * TT
        self.Q_wan = Q_wan = float(max(1, math.floor(self.Q / wan_factor)))
        self.T_intra = M.NewIntVar(
            min(TT, math.floor(d.intra_lower_bound / self.tau)), TT, "T_intra"
        )
        self.T_dpbw = M.NewIntVar(0, TW, "T_dpbw")
        self.T_lat = T_lat = M.NewIntVar(0, TW, "T_lat")
        self._intra_terms: list[IntraTerm] = []
        # the staggered sync's NIC phase per release group but the last (the last: T_intra)
        n_groups = len(d.release_groups)
        self.I_group = {i: M.NewIntVar(0, TT, f"I_group[{i}]") for i in range(n_groups - 1)}
        self._group_intra_terms: dict[int, list[IntraTerm]] = {i: [] for i in self.I_group}
        ratio = d.repeat_ratio
        self._rep_ub = TW * max(d.dp_stage_repeats) if ratio > 0 else 0
        # each release group's per-stage series terms (milp.define_dp_hosting)
        keys = [key for cls in d.stage_classes for key in series_keys(d, cls)]
        self.I_series = {key: M.NewIntVar(0, TT, f"I_series[{series_tag(*key)}]") for key in keys}
        self.L_series = {key: M.NewIntVar(0, TW, f"L_series[{series_tag(*key)}]") for key in keys}
        self.N_series = {key: M.NewIntVar(0, TW, f"N_series[{series_tag(*key)}]") for key in keys}
        # and its latency repeats (milp.define_dp_hosting: R_series)
        self._rep_coef = rep_coef = {key: ratio * d.dp_stage_repeats[key[1]] for key in keys}
        self.R_series = {
            key: M.NewIntVar(0, self._rep_ub, f"R_series[{series_tag(*key)}]")
            for key in keys
            if rep_coef[key] > 0
        }
        self._series_rep_terms: dict[Any, list[Any]] = {key: [] for key in self.R_series}
        self._series_intra_terms: dict[Any, list[IntraTerm]] = {key: [] for key in keys}
        self._series_lat_terms: dict[Any, list[Any]] = {key: [] for key in keys}
        self._pairs: list[HostPair] = []
        # per routed pair, per class (pair_dem's order): its series keys
        self._routed_series: dict[Any, list[list[tuple[int, int]]]] = {}
        self.B_series: dict[Any, Any] = {}  # their own route terms (_define_stage_routes)
        # per series key, the routes its pairs' paths use, with the literals that put it in
        # use (milp.define_dp_hosting)
        self._stage_route_uses: dict[Any, list[tuple[Any, tuple[Any, ...]]]] = {
            key: [] for key in keys
        }
        # per release group but the last, per route: its stages' pair booleans there
        # (milp.define_dp_hosting: its gather waits for every stage's bytes there)
        self._gather_use: dict[int, dict[Any, list[Any]]] = {i: {} for i in self.I_group}
        # the WAN phase's NIC terms per target ("all": T_dpbw; i: release group i's U_i),
        # each with its class's host count
        self._nic_terms: dict[Any, list[tuple[Any, list[Any]]]] = {}
        self._nic_exact: dict[Any, list[Any]] = {}
        h: dict[tuple[str, int], Any] = {}
        dp_load: dict[Any, list[Any]] = {r: [] for r in d.routes}
        pair_dem: dict[
            Any, list[tuple[Any, Any, int, list[int]]]
        ] = {}  # routed pair -> (D, b, share bound, the class's release groups) per class
        # the staggered WAN phase's release groups (milp.define_dp_hosting): per group but
        # the last, the demand of each class's stages released at or after T_pipe - g
        groups = d.release_groups
        wan_groups = groups[:-1]
        # routed pair -> per release group but the last, its stages' demand and its most
        pair_group: dict[Any, dict[float, tuple[list[Any], int]]] = {}
        group_load: dict[float, dict[Any, list[Any]]] = {
            g: {r: [] for r in d.routes} for g in wan_groups
        }
        self._group_pairs: list[tuple[Any, Any, Any]] = []  # (demand, share, on) per group
        for cls in d.stage_classes:
            k = cls[0]  # the class's representative stage
            hosts = d.stage_sites[k]
            for s in hosts:
                h[(s, k)] = hv = M.NewBoolVar(f"h[{s}][{k}]")
                add(M.Add(x[(s, k)] <= D * hv), row("dp.host_ub", s, k))
                add(M.Add(x[(s, k)] >= hv), row("dp.host_lb", s, k))
                if D >= 2 and d.fill_q.get(s):
                    self._define_node_fill(cls, s, k, hv)
                elif D >= 2:
                    # every member's NIC carries the data-parallel volume of a flat ring
                    for var, t, tag, terms in self._intra_targets(cls, s, fill=False):
                        if t > 0:
                            add(
                                M.Add(var >= self.ticks(t)),
                                row(f"dp.intra{tag[0]}", *tag[1:], s, k),
                            ).OnlyEnforceIf(hv)
                            terms.append(IntraTerm(hv, x[(s, k)], self.ticks(t)))
            if len(hosts) < 2:
                continue
            S_k = d.class_wan_bytes(cls)
            shares = [0] + [round(2 * S_k / K) if K >= 2 else 0 for K in range(1, len(hosts) + 1)]
            n_hosts = M.NewIntVar(1, len(hosts), f"K[{k}]")
            add(M.Add(n_hosts == sum(h[(s, k)] for s in hosts)), row("dp.k_count", k))
            no_k = dict.fromkeys(range(2, len(hosts) + 1))  # K is read off n_hosts here
            for tag, terms in wan_nic_terms(d, cls, h, no_k, x).items():
                self._nic_terms.setdefault(tag, []).append((n_hosts, terms))
            share = M.NewIntVar(0, max(shares), f"share[{k}]")
            add(M.AddElement(n_hosts, shares, share), row("dp.k_share", k))
            group_share: dict[float, tuple[Any, int] | None] = {}
            in_groups = [i for i in self.I_group if d.class_release_fraction(cls, groups[i]) > 0]
            for a, b in d.disconnected:
                if a in hosts and b in hosts:
                    add(
                        M.AddBoolOr([h[(a, k)].Not(), h[(b, k)].Not()]),
                        row("dp.disconnected", a, b, k),
                    )
            for a, b in d.pairs:
                if a not in hosts or b not in hosts:
                    continue
                bp = M.NewBoolVar(f"b[{a},{b}][{k}]")
                add(M.AddBoolOr([h[(a, k)].Not(), h[(b, k)].Not(), bp]), row("dp.pair_on", a, b, k))
                dem = M.NewIntVar(0, max(shares), f"D[{a},{b}][{k}]")
                add(M.Add(dem >= share), row("dp.pair", a, b, k)).OnlyEnforceIf(bp)
                lat = self.ticks(2 * d.pair_latency[(a, b)])
                add(M.Add(T_lat >= lat), row("dp.pair_latency", a, b, k)).OnlyEnforceIf(bp)
                for key in series_keys(d, cls):
                    add(
                        M.Add(self.L_series[key] >= lat),
                        row("dp.series_latency", series_tag(*key), a, b, k),
                    ).OnlyEnforceIf(bp)
                    self._series_lat_terms[key].append(lat * bp)
                    if key in self.R_series:
                        rep = self.ticks(rep_coef[key] * 2 * d.pair_latency[(a, b)])
                        add(
                            M.Add(self.R_series[key] >= rep),
                            row("dp.series_repeats", series_tag(*key), a, b, k),
                        ).OnlyEnforceIf(bp)
                        self._series_rep_terms[key].append(rep * bp)
                self._pairs.append(
                    HostPair(
                        dem,
                        share,
                        bp,
                        max(shares),
                        h[(a, k)],
                        h[(b, k)],
                        self.ticks(2 * d.pair_latency[(a, b)]),
                    )
                )
                if d.routed((a, b)):
                    pair_dem.setdefault((a, b), []).append((dem, bp, max(shares), in_groups))
                    self._routed_series.setdefault((a, b), []).append(series_keys(d, cls))
                    for g in wan_groups:
                        dem_g = self._group_demand(cls, n_hosts, g, (a, b), bp, group_share)
                        if dem_g is not None:
                            terms, mx = pair_group.setdefault((a, b), {}).get(g, ([], 0))
                            pair_group[(a, b)][g] = (terms + [dem_g], mx + group_share[g][1])
                    continue
                for r in d.pair_routes[(a, b)]:
                    dp_load[r].append(dem)
                    for key in series_keys(d, cls):
                        self._stage_route_uses[key].append((r, (bp,)))
                    for i in in_groups:
                        self._gather_use[i].setdefault(r, []).append(bp)
                for g in wan_groups:
                    dem_g = self._group_demand(cls, n_hosts, g, (a, b), bp, group_share)
                    if dem_g is not None:
                        for r in d.pair_routes[(a, b)]:
                            group_load[g][r].append(dem_g)
        routed_load: dict[Any, list[Any]] = {r: [] for r in d.routes}
        self._route_data_parallel(pair_dem, T_lat, routed_load)
        for r in d.routes:
            dp_load[r] += routed_load[r]
        self._define_group_flows(pair_dem, pair_group, group_load)
        self._group_loads = {
            i: {r: sum(load[r]) for r in d.routes if load[r]}
            for i, load in enumerate(group_load.values())
        }
        if not d.dp_wan_stagger:
            # with a flow-routed pair the groups' loads serve each stage's own routes
            # (_define_stage_routes), not a group's U (milp)
            group_load = {}
        self._define_wan_nic(self.T_dpbw, "all")
        for key, var in self.N_series.items():
            self._define_wan_nic(var, series_tag(*key))
        if d.dp_wan_stagger and self._nic_terms.get("all") and len(groups) >= 2:
            group_load[groups[-1]] = dp_load  # the last group's routes (milp)
        every = {r: sum(dp_load[r]) for r in d.routes if dp_load[r]}
        self._define_dp_stagger(groups, group_load, every)
        self.dp_loads: dict[Any, Any] = {}
        for r in d.routes:
            if dp_load[r]:
                self.dp_loads[r] = sum(dp_load[r])
                self._hull(
                    self.T_dpbw,
                    sum(dp_load[r]),
                    r,
                    self._wave_caps(r),
                    None,
                    TW,
                    "route.dp",
                    Q_wan,
                    by_route=True,
                )

    def _group_demand(
        self,
        cls: list[int],
        n_hosts: Any,
        g: float,
        pair: tuple[str, str],
        on: Any,
        shares: dict[float, tuple[Any, int] | None],
    ) -> Any:
        """A pair's demand of the class's stages in release group g (the share table of
        dp.k_share on those stages' bytes; None: the class has none in the group)."""
        d, M, add, k = self.d, self.m, self.add, cls[0]
        if g not in shares:
            S_g = sum(d.wan_bytes[j] for j in cls if d.dp_release[j] <= g)
            shares[g] = None
            if S_g > 0:
                n = len(d.stage_sites[k])
                tab = [0] + [round(2 * S_g / K) if K >= 2 else 0 for K in range(1, n + 1)]
                sg = M.NewIntVar(0, max(tab), f"share_g[{k}][{g}]")
                add(M.AddElement(n_hosts, tab, sg), row("dp.k_share_group", k, g))
                shares[g] = (sg, max(tab))
        if shares[g] is None:
            return None
        sg, mx = shares[g]
        dem = M.NewIntVar(0, mx, f"D_g[{pair[0]},{pair[1]}][{k}][{g}]")
        add(M.Add(dem >= sg), row("dp.pair_group", *pair, k, g)).OnlyEnforceIf(on)
        self._group_pairs.append((dem, sg, on))
        return dem

    def _define_group_flows(
        self,
        pair_dem: dict[Any, list[tuple[Any, Any, int, list[int]]]],
        pair_group: dict[Any, dict[float, tuple[list[Any], int]]],
        group_load: dict[float, dict[Any, list[Any]]],
    ) -> None:
        """A flow-routed pair's bytes on a route in release group g: min(D_g, F_r), D_g its
        stages' demand in the group, F_r its flow on the paths through r (U f: whole flow
        units, milp._define_group_flows); a route on every path takes D_g itself."""
        M, add = self.m, self.add
        index = {g: i for i, g in enumerate(group_load)}
        for q, by_group in sorted(pair_group.items()):
            paths = self.d.pair_paths[q]
            U = self.f_unit[("dp", q)]
            top = U * -(-sum(mx for _, _, mx, _ in pair_dem[q]) // U)  # the most of U sum f
            every = U * sum(self.f[("dp", q, j)] for j in range(len(paths)))
            # each route of the pair's paths: the paths through it
            on_routes = {
                r: [j for j, path in enumerate(paths) if r in path.routes]
                for r in sorted({r for path in paths for r in path.routes})
            }
            for g, (terms, _) in sorted(by_group.items()):
                i, dem_g = index[g], sum(terms)
                for r, through in on_routes.items():
                    if len(through) == len(paths):
                        group_load[g][r] += terms
                        continue
                    flow = U * sum(self.f[("dp", q, j)] for j in through)
                    m = M.NewIntVar(0, top, f"m_group[{q}][{i}][{r}]")
                    add(M.Add(m <= dem_g), row("dp.group_flow_dem", *q, i, *r))
                    add(M.Add(m <= flow), row("dp.group_flow_path", *q, i, *r))
                    # m = the min (the MILP: two big-M rows on a binary); as two rows
                    # enforced by a literal, one worker took 72 s on four-metro-resilient
                    # against 9 s with AddMinEquality
                    add(M.AddMinEquality(m, [dem_g, flow]), row("dp.group_flow_lo_dem", *q, i, *r))
                    # implied (the pair's flow U sum f is at least D_g and F_r): the LP
                    # relaxation's bound from below
                    add(M.Add(m >= dem_g + flow - every), row("dp.group_flow_cut", *q, i, *r))
                    group_load[g][r].append(m)

    def _define_wan_nic(self, var: Any, tag: Any) -> None:
        """var >= the WAN phase's NIC term of every hosting site of target `tag`'s terms
        (milp._define_wan_nic), exactly: per (site, class) an element over (K - 1) (ub + 1)
        + x into the table of (K - 1)/K c / n in ticks (rounded up; 0 at n = 0 or K = 1),
        so one variable carries the site's term whatever K and x are."""
        M, add = self.m, self.add
        exact = self._nic_exact.setdefault(tag, [])
        for n_hosts, terms in self._nic_terms.get(tag, []):
            by_site: dict[str, list[Any]] = {}
            for t in terms:
                by_site.setdefault(t.site, []).append(t)
            for site, ts in by_site.items():
                ub, k, coef = ts[0].ub, ts[0].stage, {t.hosts: t.coef for t in ts}
                table = [
                    self.ticks(coef[K] / n) if K in coef and n else 0
                    for K in range(1, max(coef) + 1)
                    for n in range(ub + 1)
                ]
                v = M.NewIntVar(0, max(table), f"wan_nic[{tag}][{site}][{k}]")
                idx = (n_hosts - 1) * (ub + 1) + ts[0].members
                add(M.AddElement(idx, table, v), row("dp.nic_table", tag, site, k))
                add(M.Add(var >= v), row("dp.wan_nic", tag, site, k))
                exact.append(v)

    def _define_dp_stagger(
        self,
        groups: list[float],
        group_load: dict[float, dict[Any, list[Any]]],
        every_load: dict[Any, Any],
    ) -> None:
        """T_dpst and T_gst, the staggered sync and the staggered gather
        (milp._define_dp_stagger), in ticks: each chain time rounded up as its pipeline
        rows have it, each tail or head rounded to the nearest tick (within a tick or two
        of the evaluator)."""
        M = self.m
        self._gather_route_terms: list[tuple[Any, list[tuple[Any, Any]], int]] = []
        self._stagger_terms: list[tuple[Any, list[tuple[Any, Any]], int]] = []
        self._stagger_exprs: list[Any] = []  # T_dpst is their max (_exact_step)
        self._staggered = len(groups) >= 2
        self._gather_terms: list[Any] = []  # T_gst is their max
        self.T_gst = self.T_intra + self.T_dpbw + self.T_lat
        if not self._staggered:
            self.T_dpst = self.T_intra + self.T_dpbw + self.T_lat
            return
        if self.d.gather_staggered:
            self.T_gst = M.NewIntVar(0, self.TT + self.TW + self._rep_ub, "T_gst")
        self.T_dpst = M.NewIntVar(0, self.TT + self.TW + self._rep_ub, "T_dpst")
        usable = sorted(moment_chains(self.d, self.ub))
        T_end = self._define_end(usable)
        U_group: dict[int, Any] = {}
        for i, g in enumerate(groups):
            loads = [
                (r, sum(group_load[g][r]))
                for r in self.d.routes
                if g in group_load and group_load[g][r]
            ]
            if i == len(groups) - 1 and not loads:
                continue  # no WAN load: the last group's work is T_intra + T_dpbw + T_lat
            U = U_group[i] = M.NewIntVar(0, self.TW, f"U_dpst[{i}]") if loads else None
            for r, load in loads:
                self._hull(
                    U,
                    load,
                    r,
                    self._wave_caps(r),
                    None,
                    self.TW,
                    f"route.dpst{i}",
                    self.Q_wan,
                    by_route=True,
                )
            self._stagger_terms.append((U, loads, i))
        G = self._define_gather_routes(every_load)
        self._define_stage_routes()
        # per group and sequence one work variable, the max of its works (milp)
        ub = 2 * (self.TT + self.TW) + self._rep_ub
        for i, sync, work, tag in work_maxes(
            self,
            stagger_works(self, len(groups), U_group, G),
            lambda kind, i: M.NewIntVar(0, ub, f"W_{kind}[{i}]"),
            lambda var, w: M.Add(var >= w),
        ):
            self._stagger_rows(work, tag, i, usable, T_end, sync=sync, gather=not sync)

    def _define_gather_routes(self, every_load: dict[Any, Any]) -> dict[int, Any]:
        """Per release group i but the last, G_i >= t_r on every route r its stages sync
        over (enforced if a pair boolean of theirs on r is), t_r every stage's load on r
        over its capacity in ticks (milp._define_gather_routes)."""
        M = self.m
        self._gather_loads = every_load
        self._every_t: dict[Any, Any] = {}  # _every_route_time's variables
        if not (self.d.gather_staggered and self.d.dp_wan_stagger):
            return {}
        G: dict[int, Any] = {}
        for i, uses in self._gather_use.items():
            uses = {r: bps for r, bps in uses.items() if r in every_load}
            if not uses:
                continue
            G[i] = M.NewIntVar(0, self.TW, f"G_gst[{i}]")
            terms = []
            for r, bps in sorted(uses.items()):
                t = self._every_route_time(r)
                for j, bp in enumerate(bps):
                    self.add(M.Add(G[i] >= t), row("dp.gather_route", i, *r, j)).OnlyEnforceIf(bp)
                    terms.append((r, bp))
            self._gather_route_terms.append((G[i], terms, i))
        return G

    def _every_route_time(self, r: Any) -> Any:
        """t_r >= every stage's data-parallel load on route r over its capacity in ticks,
        one variable per route (milp._every_route_time)."""
        if r not in self._every_t:
            self._every_t[r] = t = self.m.NewIntVar(0, self.TW, f"t_every[{r}]")
            caps = self._wave_caps(r)
            load = self._gather_loads[r]
            self._hull(t, load, r, caps, None, self.TW, "route.every", self.Q_wan, by_route=True)
        return self._every_t[r]

    def _exact_every_term(
        self, r: Any, on: tuple[Any, ...], family: str, *index: Any, group: int | None = None
    ) -> Any:
        """A variable equal to every stage's load (release group `group`'s: B's) on route
        r over its capacity, exactly, when the literals `on` all hold, else 0
        (_exact_step: a term of G's or B's max); the exact route time once per route."""
        M, add = self.m, self.add
        exact = self._exact_group_route_time(
            len(self.d.release_groups) - 1 if group is None else group, r
        )
        lit = on[0]
        if len(on) > 1:  # all of them: one literal
            lit = M.NewBoolVar(f"{family}_on{list(index)}")
            add(M.AddBoolAnd(list(on)), row(f"{family}_and", *index)).OnlyEnforceIf(lit)
            add(M.AddBoolOr([lit, *(v.Not() for v in on)]), row(f"{family}_or", *index))
        v = M.NewIntVar(0, self.TW, f"{family}_term{list(index)}")
        add(M.Add(v == exact), row(f"{family}_on", *index)).OnlyEnforceIf(lit)
        add(M.Add(v == 0), row(f"{family}_off", *index)).OnlyEnforceIf(lit.Not())
        return v

    def _exact_group_route_time(self, i: int, r: Any) -> Any:
        """Release group i's load on route r over its capacity in ticks, exactly
        (_exact_step; the last group's every stage's), once per group and route
        (milp._exact_group_route_time)."""
        last = len(self.d.release_groups) - 1
        if (i, r) not in self._exact_every_t:
            load = self._gather_loads[r] if i == last else self._group_loads[i][r]
            family = "exact.every_route" if i == last else f"exact.group{i}"
            self._exact_every_t[(i, r)] = self._exact_route_time(
                load, r, self.TW, self.Q_wan, family
            )
        return self._exact_every_t[(i, r)]

    def _define_stage_routes(self) -> None:
        """With a flow-routed pair, each series key's route term per release group i it
        serves, B_{i,k} >= N_{i,k} (the stage's own WAN NIC term) and >= t_{i,r}, group i's
        load on every route r its pairs' paths use over its capacity, enforced if the
        literals that put r in use are (milp._define_stage_routes)."""
        M, add = self.m, self.add
        self._group_t: dict[tuple[int, Any], Any] = {}  # _group_route_time's variables
        if self.d.dp_wan_stagger or not self.I_series:
            return
        self._stage_bw_terms: dict[Any, list[tuple[Any, tuple[Any, ...]]]] = {}
        every = len(self.d.release_groups) - 1
        for key, uses in self._stage_route_uses.items():
            for i in range(key[0], every + 1):
                tag = f"{series_tag(*key)}.g{i}"
                B = self.B_series[(i, key)] = M.NewIntVar(0, self.TW, f"B_series[{tag}]")
                add(M.Add(B >= self.N_series[key]), row("dp.stage_nic", tag))
                terms = self._stage_bw_terms[(i, key)] = []
                for j, (r, on) in enumerate(uses):
                    t = self._group_route_time(i, r)
                    if t is None:
                        continue
                    add(M.Add(B >= t), row("dp.stage_route", tag, *r, j)).OnlyEnforceIf(list(on))
                    terms.append((r, on))

    def _group_route_time(self, i: int, r: Any) -> Any:
        """t_{i,r} >= release group i's data-parallel load on route r over its capacity in
        ticks, one variable per group and route (the last group's: _every_route_time);
        None without load there."""
        if i == len(self.d.release_groups) - 1:
            return self._every_route_time(r) if r in self._gather_loads else None
        load = self._group_loads.get(i, {}).get(r)
        if load is None:
            return None
        if (i, r) not in self._group_t:
            self._group_t[(i, r)] = t = self.m.NewIntVar(0, self.TW, f"t_group[{i}][{r}]")
            caps = self._wave_caps(r)
            self._hull(
                t, load, r, caps, None, self.TW, f"route.group{i}", self.Q_wan, by_route=True
            )
        return self._group_t[(i, r)]

    def _stagger_rows(
        self,
        work: Any,
        tag: Any,
        i: int,
        usable: list[int],
        T_end: Any,
        sync: bool = True,
        gather: bool = True,
    ) -> None:
        """T_dpst (`sync`) and T_gst (`gather`) >= a work of release group i, the credit
        multiplied by d.dp_credit_scale (milp._stagger_rows)."""
        M, add = self.m, self.add
        at_sync, at_gather = self.d.dp_credit_scale
        gather = gather and self.d.gather_staggered
        # valid cuts (milp._define_dp_stagger): the credit is at most a tail (head)
        if sync:
            tail = max((self.d.release_tail[c][i] for c in usable), default=0.0)
            cut = at_sync * math.ceil(tail / self.tau)
            add(M.Add(self.T_dpst >= work - cut), row("dp.stagger_cut", tag))
        if gather:
            head = max((self.d.fill_head[c][i] for c in usable), default=0.0)
            cut = at_gather * math.ceil(head / self.tau)
            add(M.Add(self.T_gst >= work - cut), row("dp.gather_cut", tag))
        for c in usable:
            if sync:
                expr = work + at_sync * (self._moment(c, self.d.release_tail[c][i]) - T_end)
                add(M.Add(self.T_dpst >= expr), row("dp.stagger", tag, c))
                self._stagger_exprs.append(expr)
            if gather:
                expr = work + at_gather * (self._moment(c, self.d.fill_head[c][i]) - T_end)
                add(M.Add(self.T_gst >= expr), row("dp.gather_stagger", tag, c))
                self._gather_terms.append(expr)

    def _moment(self, c: int, offset: float) -> Any:
        """(T_c - offset) u_c in ticks (milp._moment): T_c rounded up, the offset to the
        nearest tick."""
        return (self.ticks(self.d.chain_time[c]) - round(offset / self.tau)) * self.u[c]

    def _define_end(self, usable: list[int]) -> Any:
        """T_end, the longest uncontended chain time in use, exactly (milp._define_end)."""
        M, add = self.m, self.add
        times = {c: self.ticks(self.d.chain_time[c]) for c in usable}
        if not times:  # no chain type fits the step's range: no plan, no rows
            return 0
        V = max(times.values())
        T_end = M.NewIntVar(min(times.values()), V, "T_end")
        for c in usable:
            add(M.Add(T_end >= times[c] * self.u[c]), row("dp.end", c))
        add(M.Add(T_end <= self.T_pipe), row("dp.end_pipe"))  # valid (milp._define_end)
        secs = {c: self.d.chain_time[c] for c in usable}  # distinct as the MILP's
        for j, v in enumerate(sorted(set(secs.values()))[:-1]):
            slower = [self.u[c] for c in usable if secs[c] > v]
            vt = self.ticks(v)
            add(M.Add(T_end <= vt + (V - vt) * sum(slower)), row("dp.end_cap", j))
        return T_end

    def define_step(self) -> None:
        """T = T_pipe + the data-parallel part: the per-step sync (T_intra, and T_wan when
        synchronous, with the staggered WAN phase for the pieces that see it) less what its
        overlap windows hide (in 1/L ticks), plus the sync policy's part of T_wan otherwise;
        on the tick grid (rounded up)."""
        M, add, rule = self.m, self.add, self.sync
        T_pipe, T_intra = self.T_pipe, self.T_intra
        T_wan = self.T_dpbw + self.T_lat
        H = rule.divisor
        self.T = T = M.NewIntVar(0, self.TT, "T")
        self._exposed = None
        self._overlap_terms: list[tuple[Any, int, Any, int]] = []  # (piece, L f, sync, L window)
        L = self._overlap_den()
        if self.d.sync_mode == "synchronous":
            st = self.T_dpst
            # with release groups the latency repeats are in T_dpst and T_gst (R_series)
            lat = None if self.d.repeat_ratio > 0 else self.T_lat
            E = self._dp_exposed(T_intra + T_wan, None, self.TW, lat, st, self.T_gst)
            add(M.Add(L * T >= L * T_pipe + E), row("step.time"))
            add(M.Add(L * T < L * T_pipe + E + L), row("step.time_round"))
        elif not rule.overlapped:
            # T * H == H * (T_pipe + exposed intra) + T_wan, rounded up to the tick grid
            E = self._dp_exposed(T_intra, None, self.TT)
            add(M.Add(L * H * T >= L * H * T_pipe + H * E + L * T_wan), row("step.time"))
            add(
                M.Add(L * H * T < L * H * T_pipe + H * E + L * T_wan + L * H),
                row("step.time_round"),
            )
        else:
            exposed = M.NewIntVar(0, self.TT, "T_exposed")
            self._exposed = exposed
            add(M.Add(H * exposed >= T_wan - H * T_pipe), row("dp.streaming_overlap"))
            E = self._dp_exposed(T_intra, None, self.TT)
            add(M.Add(L * T >= L * (T_pipe + exposed) + E), row("step.time"))
            add(M.Add(L * T < L * (T_pipe + exposed) + E + L), row("step.time_round"))

    def define_limits(self) -> None:
        d, M, add, T = self.d, self.m, self.add, self.T
        if d.max_step_time_s is not None:
            add(
                M.Add(T <= math.floor(d.max_step_time_s / self.tau * (1 + 1e-9))),
                row("limits.max_step_time"),
            )
        if self.t_cap is not None:
            add(M.Add(T <= math.floor(self.t_cap / self.tau)), row("limits.t_cap"))
        if self.rate_cap is not None:
            add(M.Add(self.rate <= math.floor(self.rate_cap / RATE_UNIT)), row("limits.rate_cap"))
        if self.cutoff is not None:
            if self.objective == "step_time":
                add(M.Add(T <= self.ticks(self.cutoff) + 1), row("limits.cutoff"))
            elif self.objective == "cost":
                add(M.Add(self.capex <= math.floor(self.cutoff)), row("limits.cutoff"))
            else:
                add(M.Add(self.rate <= math.ceil(self.cutoff / RATE_UNIT)), row("limits.cutoff"))

    def define_resilience(self) -> None:
        """Sites in use (the participants of the inter-site collective, and the tie-break's
        site count, so written for every model), then the survival rows."""
        d, M = self.d, self.m
        self.sites_used = {s: M.NewBoolVar(f"site_used[{s}]") for s in d.sites}
        for s in d.sites:
            self.add(
                M.Add(self.nodes[s] <= d.site_nodes[s] * self.sites_used[s]), row("site.used", s)
            )
        if d.resilience is None:
            return
        if d.resilience.max_step_time_s is None:
            self._exact_step(self.T_pipe, self.T_intra, self.T_dpbw, self.T_lat)
        self._add_resilience(self.T, self.T_pipe, self.T_intra, self.T_dpbw, self.T_lat, self.nodes)

    def define_objective(self) -> None:
        self.m.Minimize(self._main())

    def define_symmetry(self) -> None:
        """Interchangeable sites (placer.optimize.symmetry) host replica-stages in site
        order, most first: used(s1) >= used(s2) >= ... per class (objective solve only)."""
        self.sym_classes = site_classes(self.d) if self.symmetry else []
        self.sym_rows: list[int] = []  # their indices in the proto
        x, pp, M = self.x, self.d.cfg.pp, self.m
        for cl in self.sym_classes:
            used = {s: sum(x[(s, k)] for k in range(pp) if (s, k) in x) for s in cl}
            for a, b in zip(cl, cl[1:], strict=False):
                con = self.add(M.Add(used[a] >= used[b]), row("symmetry.order", a, b))
                self.sym_rows.append(con.Index())

    def drop_symmetry(self) -> None:
        """The tie-break chooses among every optimal plan: the symmetry rows go (an
        empty constraint in the proto is none)."""
        proto = self.m.Proto()
        for i in self.sym_rows:
            proto.constraints[i].clear_linear()
        self.rows = [r for r in self.rows if not r.startswith("symmetry.")]
        self.sym_rows = []

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
                self.add(M.Add(w <= sum(active)), row(f"route.{phase}.paths_need_traffic", *q))
            else:
                self.add(M.Add(w <= ws[-1]), row(f"route.{phase}.paths_prefix", *q, j))
            ws.append(w)
        return ws

    def _split(
        self,
        phase: str,
        q: Any,
        demand: Any,
        max_demand: int,
        ws: list[Any],
        loads: dict[Any, list[Any]],
    ) -> None:
        """A pair's demand (bytes) split over its allowed paths, each flow an integer
        number of the pair's flow unit U (flow_unit): U * sum f = the demand rounded up to
        a whole unit. Route loads see U * f >= the bytes the evaluator puts on the path
        (it splits the exact demand in the shares f / sum f), so the rounding is
        pessimistic, by under one unit per pair (<= FLOW_REL of the pair's largest demand)."""
        M = self.m
        U = flow_unit(max_demand)
        self.f_unit[(phase, q)] = U
        top = -(-max_demand // U)
        flows = []
        for j, path in enumerate(self.d.pair_paths[q]):
            f = M.NewIntVar(0, top, f"f[{phase}][{q}][{j}]")
            self.f[(phase, q, j)] = f
            if j >= 1:
                self.add(M.Add(f <= top * ws[j]), row(f"route.{phase}.path_allowed", *q, j))
            flows.append(f)
            for r in path.routes:
                loads.setdefault(r, []).append(U * f)
        # sum f = ceil(demand / U): at least the demand, less than a unit over it
        self.add(M.Add(U * sum(flows) >= demand), row(f"route.{phase}.demand", *q))
        if U > 1:
            self.add(
                M.Add(U * sum(flows) <= demand + U - 1), row(f"route.{phase}.demand_round", *q)
            )

    def _route_pipeline(self, T_pipe: Any, TT: int) -> dict[Any, list[Any]]:
        """Pipeline activations of routed pairs as a flow over candidate paths (see milp)."""
        d, M = self.d, self.m
        pp_bytes = round(d.pp_bytes_per_crossing)
        loads: dict[Any, list[Any]] = {}
        ws: dict[Any, list[Any]] = {}
        self._max_routed = max(
            (len(d.chain_routed_pairs(c)) for c in range(len(d.chains))), default=0
        )
        for q, crossing in d.routed_crossings().items():
            ws[q] = self._paths_allowed("pp", q, [self.u[c] for c in crossing])
            self._split(
                "pp",
                q,
                sum(self.n[c] for c in crossing) * pp_bytes,
                d.cfg.dp * pp_bytes,
                ws[q],
                loads,
            )
        for c in range(len(d.chains)):
            routed = d.chain_routed_pairs(c)
            for levels, t in d.chain_level_time[c].items():
                chosen = [ws[q][lv] for q, lv in zip(routed, levels, strict=True) if lv >= 1]
                if not chosen:
                    continue
                tc = self.ticks(t)
                if tc > TT:
                    self.add(
                        M.AddBoolOr([self.u[c].Not(), *(w.Not() for w in chosen)]),
                        row("pipe.chain_path", c, *levels),
                    )
                else:
                    self.add(
                        M.Add(T_pipe >= tc * (self.u[c] + sum(chosen) - len(chosen))),
                        row("pipe.chain_path", c, *levels),
                    )
                self._pipe_level_terms.append(PathLevelTerm(min(tc, TT), self.u[c], chosen))
        return loads

    def _route_data_parallel(
        self,
        pair_dem: dict[Any, list[tuple[Any, Any, int, list[int]]]],
        T_lat: Any,
        dp_load: dict[Any, list[Any]],
    ) -> None:
        self._lat_terms: list[LatencyTerm] = []
        loads: dict[Any, list[Any]] = {}
        for q, dems in sorted(pair_dem.items()):
            ws = self._paths_allowed("dp", q, [bp for _, bp, _, _ in dems])
            self._split(
                "dp",
                q,
                sum(dem for dem, _, _, _ in dems),
                sum(mx for _, _, mx, _ in dems),
                ws,
                loads,
            )
            for j, path in enumerate(self.d.pair_paths[q]):
                # each series key of the class: the routes of the paths it may use (milp)
                for c, (_, bp, _, _) in enumerate(dems):
                    on = (bp,) if j == 0 else (bp, ws[j])
                    for key in self._routed_series[q][c]:
                        self._stage_route_uses[key] += [(r, on) for r in path.routes]
            for j in range(1, len(ws)):
                lat = self.ticks(2 * self.d.pair_paths[q][j].latency_s)
                self.add(self.m.Add(T_lat >= lat * ws[j]), row("dp.path_latency", *q, j))
                self._lat_terms.append(LatencyTerm(lat, ws[j]))
                # and each series key of the class its latency and repeats
                for c, (_, bp, _, _) in enumerate(dems):
                    for key in self._routed_series[q][c]:
                        tag = series_tag(*key)
                        on = lat * (ws[j] + bp - 1)
                        self.add(
                            self.m.Add(self.L_series[key] >= on),
                            row("dp.series_path_latency", tag, *q, j, c),
                        )
                        self._series_lat_terms[key].append(on)
                        if key in self.R_series:
                            path_lat = 2 * self.d.pair_paths[q][j].latency_s
                            rep = self.ticks(self._rep_coef[key] * path_lat)
                            on = rep * (ws[j] + bp - 1)
                            self.add(
                                self.m.Add(self.R_series[key] >= on),
                                row("dp.series_path_repeats", tag, *q, j, c),
                            )
                            self._series_rep_terms[key].append(on)
        for r, terms in loads.items():
            dp_load[r].extend(terms)

    def routing(self, solver: cp_model.CpSolver) -> list[dict[str, Any]]:
        return extract_routing(
            self.d,
            self.f,
            lambda key: bool(solver.Value(self.w[key])),
            lambda key: float(solver.Value(self.f[key]) * self.f_unit[key[:2]]),
        )

    # ------------------------------------------------------------------ exact step (resilience)

    def _exact_route_time(self, load: Any, r: Any, ub: int, Q: float, family: str) -> Any:
        """t = ceil(Q load / cap) for the chosen wave option: the hull with a two-sided row."""
        t = self.m.NewIntVar(0, ub, f"t[{family}][{r}]")
        self._hull(t, load, r, self._wave_caps(r), None, ub, family, Q, exact=True, by_route=True)
        return t

    def _exact_step(self, T_pipe: Any, T_intra: Any, T_dpbw: Any, T_lat: Any) -> None:
        """The step-time variable equals the plan's step time (see milp._exact_step)."""
        d, M, add = self.d, self.m, self.add
        TT = self.TT
        for i, hp in enumerate(self._pairs):
            add(M.AddImplication(hp.on, hp.host_a), row("exact.pair_a", i))
            add(M.AddImplication(hp.on, hp.host_b), row("exact.pair_b", i))
            add(M.Add(hp.demand <= hp.share), row("exact.share", i))
            add(M.Add(hp.demand == 0), row("exact.pair_off", i)).OnlyEnforceIf(hp.on.Not())
        for c, uc in self.u.items():
            add(
                M.Add(self.n[c] >= uc), row("exact.chain_used", c)
            )  # a chain counts in the max only when it has replicas
        pipe = (
            [self.ticks(d.chain_time[c]) * self.u[c] for c in self.u]
            if d.planes is None
            else list(self._plane_exprs)
        )
        for key, terms in self._tau_terms.items():
            add(M.AddMaxEquality(self.tau_x[key], terms), row("exact.tau", *key))
        for i, term in enumerate(self._pipe_level_terms):
            a = M.NewBoolVar(f"exact.chain_path[{i}]")
            add(
                M.AddBoolAnd([term.use, *term.allowed]), row("exact.chain_path_on", i)
            ).OnlyEnforceIf(a)
            add(
                M.AddBoolOr([a, term.use.Not(), *(w.Not() for w in term.allowed)]),
                row("exact.chain_path_off", i),
            )
            pipe.append(term.time * a)
        pipe += [
            self._exact_route_time(load, r, TT, self.Q, "exact.pp")
            for r, load in self.pp_loads.items()
        ]
        add(M.AddMaxEquality(T_pipe, pipe), row("exact.pipe"))
        dp = [0] + [
            self._exact_route_time(load, r, self.TW, self.Q_wan, "exact.dp")
            for r, load in self.dp_loads.items()
        ]
        dp += self._nic_exact.get("all", [])
        add(M.AddMaxEquality(T_dpbw, dp), row("exact.dpbw"))
        if self._staggered:
            for i, (dem_g, sg, on) in enumerate(self._group_pairs):
                add(M.Add(dem_g <= sg), row("exact.share_group", i))
                add(M.Add(dem_g == 0), row("exact.pair_off_group", i)).OnlyEnforceIf(on.Not())
            for i, iterms in self._group_intra_terms.items():
                add(
                    M.AddMaxEquality(self.I_group[i], [0] + [t.time * t.host for t in iterms]),
                    row("exact.intra_group", i),
                )
            for U, loads, i in self._stagger_terms:
                if U is not None:
                    u = [0] + [
                        self._exact_route_time(load, r, self.TW, self.Q_wan, f"exact.dpst{i}")
                        for r, load in loads
                    ]
                    add(M.AddMaxEquality(U, u), row("exact.dpst_u", i))
            self._exact_every_t: dict[Any, Any] = {}
            for G, terms, i in self._gather_route_terms:
                g_terms = [
                    self._exact_every_term(r, (bp,), "exact.gst", i, j)
                    for j, (r, bp) in enumerate(terms)
                ]
                add(M.AddMaxEquality(G, [0, *g_terms]), row("exact.gst_u", i))
            for key, var in self.I_series.items():
                tag = series_tag(*key)
                iterms = [t.time * t.host for t in self._series_intra_terms[key]]
                add(M.AddMaxEquality(var, [0, *iterms]), row("exact.intra_series", tag))
                lterms = self._series_lat_terms[key]
                add(
                    M.AddMaxEquality(self.L_series[key], [0, *lterms]), row("exact.lat_series", tag)
                )
                nterms = self._nic_exact.get(tag, [])
                add(
                    M.AddMaxEquality(self.N_series[key], [0, *nterms]), row("exact.nic_series", tag)
                )
                if key in self.R_series:
                    add(
                        M.AddMaxEquality(self.R_series[key], [0, *self._series_rep_terms[key]]),
                        row("exact.repeats_series", tag),
                    )
            for (i, key), B in self.B_series.items():
                tag = f"{series_tag(*key)}.g{i}"
                b_terms = [
                    self._exact_every_term(r, on, "exact.stage_bw", tag, j, group=i)
                    for j, (r, on) in enumerate(self._stage_bw_terms[(i, key)])
                ]
                add(M.AddMaxEquality(B, [self.N_series[key], *b_terms]), row("exact.stage_bw", tag))
            st = list(self._stagger_exprs)  # each a lower bound, the latest release attains it
            # (a credit scaled by d.dp_credit_scale reaches that many times T_end)
            scale = max(self.d.dp_credit_scale)
            self._exact_max_of(self.T_dpst, st, "exact.dpst", scale)
            for W, ws, name in self._work_maxes:
                self._exact_max_of(W, ws, name, 2)
            if self._gather_terms:
                self._exact_max_of(self.T_gst, self._gather_terms, "exact.gst", scale)
        add(
            M.AddMaxEquality(
                T_lat,
                [0]
                + [hp.latency * hp.on for hp in self._pairs]
                + [t.latency * t.allowed for t in self._lat_terms],
            ),
            row("exact.lat"),
        )
        add(
            M.AddMaxEquality(T_intra, [0] + [t.time * t.host for t in self._intra_terms]),
            row("exact.intra"),
        )
        if self._exposed is not None:
            H = d.every_steps
            raw = M.NewIntVar(-4 * self.TW, 4 * self.TW, "exact.exposed_raw")
            add(M.Add(raw == T_dpbw + T_lat - H * T_pipe), row("exact.exposed_raw"))
            pos = M.NewIntVar(0, 4 * self.TW, "exact.exposed_pos")
            add(M.AddMaxEquality(pos, [0, raw]), row("exact.exposed_pos"))
            add(M.Add(H * self._exposed <= pos + H - 1), row("exact.exposed"))
        for i, (e, num, sync, w, lat) in enumerate(self._overlap_terms):
            reps = 1 + self.d.dp_lat_repeats[i]
            raw = M.NewIntVar(
                -8 * self.TW * num - w, 8 * self.TW * num * reps, f"exact.dp_overlap_raw[{i}]"
            )
            add(M.Add(raw == num * sync + lat - w), row("exact.dp_overlap_raw", i))
            add(M.AddMaxEquality(e, [0, raw]), row("exact.dp_overlap", i))

    def _overlap_den(self) -> int:
        """L: the overlap pieces count in 1/L ticks, so that a fraction f of the sync
        (L f integer) and the windows (rounded to 1/L tick) add no rounding of their own."""
        return math.lcm(
            *(Fraction(f).limit_denominator(64).denominator for f, _ in self.d.dp_pieces)
        )

    def _exact_max_of(self, var: Any, exprs: list[Any], name: str, scale: int = 1) -> None:
        """var == max(exprs): AddMaxEquality over variables, one per expression (each within
        `scale` times the step's and the WAN phase's ranges)."""
        M, bound, terms = self.m, scale * (self.TT + self.TW) + self._rep_ub, []
        for j, e in enumerate(exprs):
            v = M.NewIntVar(-bound, bound, f"{name}_term[{j}]")
            self.add(M.Add(v == e), row(f"{name}_term", j))
            terms.append(v)
        self.add(M.AddMaxEquality(var, terms), row(name))

    def _dp_exposed(
        self,
        sync: Any,
        tag: str | None,
        ub: int,
        lat: Any = None,
        sync_st: Any = None,
        sync_gather: Any = None,
    ) -> Any:
        """The per-step sync's exposed part (milp._dp_exposed) in 1/L ticks: a piece with
        fraction f of the sync, window w and latency repeats R (PerfModel.dp_lat_repeats)
        is e >= L f (sync + R lat) - L w, e >= 0 (lat None: no latency term); `sync_st`
        the sync with the staggered WAN phase for the pieces that see it (None: `sync`),
        `sync_gather` the staggered gather for the others (None: `sync`); `tag` None is
        the healthy step, a tag one failure scenario's."""
        M, L, terms = self.m, self._overlap_den(), []
        reps = self.d.dp_lat_repeats
        for i, (f, window) in enumerate(self.d.dp_pieces):
            if sync_st is not None and self.d.dp_staggered[i]:
                piece_sync = sync_st
            else:
                piece_sync = sync if sync_gather is None else sync_gather
            num = round(Fraction(f).limit_denominator(64) * L)
            w = round(L * window / self.tau)
            extra = num * reps[i] * lat if lat is not None and reps[i] else 0
            e = M.NewIntVar(0, 4 * L * ub * (1 + reps[i]), f"T_dp_exposed[{tag or 'healthy'}][{i}]")
            self.add(
                M.Add(e >= num * piece_sync + extra - w),
                row("dp.overlap", *([] if tag is None else [tag]), i),
            )
            if tag is None:
                self._overlap_terms.append((e, num, piece_sync, w, extra))
            terms.append(e)
        return sum(terms)

    def _dp_part(self, T_intra: Any, T_wan: Any, T_pipe: Any, tag: str) -> Any:
        """The data-parallel term of one failure scenario (milp._dp_part), in ticks (rounded up)."""
        M, L = self.m, self._overlap_den()
        sync_all = self.d.sync_mode == "synchronous"
        ub = 2 * self.TW if sync_all else 2 * self.TT
        part = M.NewIntVar(0, 4 * ub, f"dp_part[{tag}]")
        self.add(
            M.Add(
                L * part
                >= (
                    self._dp_exposed(T_intra + T_wan, tag, ub, self.T_lat)
                    if sync_all
                    else self._dp_exposed(T_intra, tag, ub)
                )
            ),
            row("res.dp_part", tag),
        )
        if sync_all:
            return part
        return part + self._wan_part(T_wan, T_pipe, tag)

    def _wan_part(self, T_wan: Any, T_pipe: Any, tag: str) -> Any:
        """The data-parallel WAN term of one failure scenario's step for the sync policy
        (families.SyncRule), in ticks (rounded up)."""
        M, rule = self.m, self.sync
        H = rule.divisor
        if H == 1 and not rule.overlapped:
            return T_wan
        part = M.NewIntVar(0, 2 * self.TT, f"wan_part[{tag}]")
        if not rule.overlapped:
            self.add(M.Add(H * part >= T_wan), row("res.wan_part", tag))
        else:
            self.add(M.Add(H * part >= T_wan - H * T_pipe), row("res.wan_part", tag))
        return part

    def _add_resilience(
        self, T: Any, T_pipe: Any, T_intra: Any, T_dpbw: Any, T_lat: Any, nodes: Any
    ) -> None:
        """The same survival constraints as placer.optimize.milp._add_resilience, on ticks."""
        d, M, res, add = self.d, self.m, self.d.resilience, self.add
        assert res is not None
        TT = self.TT
        big = 2 * TT
        if res.max_step_time_s is not None:
            limit_rhs = None
            limit_ticks = math.floor(
                (1 + res.max_slowdown) * res.max_step_time_s / self.tau * (1 + 1e-9)
            )
        else:
            limit_rhs = round((1 + res.max_slowdown) * 10**6)
        used = self.sites_used
        for s in d.sites:
            add(M.Add(used[s] <= nodes[s]), row("res.used_has_nodes", s))
        zp = {p: M.NewBoolVar(f"res.p[{p}]") for p in range(1, len(d.sites) + 1)}
        add(M.AddExactlyOne(zp.values()), row("res.p_onehot"))
        add(M.Add(sum(p * z for p, z in zp.items()) == sum(used.values())), row("res.p_count"))

        def within(expr: Any, tag: str) -> None:
            if limit_rhs is None:
                add(M.Add(expr <= limit_ticks), row("res.survive", tag))
            else:
                add(M.Add(10**6 * expr <= limit_rhs * T), row("res.survive", tag))

        for (klass, r), caps in sorted(res.degraded_capacity.items()):
            tag = f"{klass}_{r[0]}_{r[1]}"
            Tp = M.NewIntVar(0, big, f"res.T_pipe[{tag}]")
            add(M.Add(Tp >= T_pipe), row("res.pipe_healthy", tag))
            if r in self.pp_loads:
                self._hull(Tp, self.pp_loads[r], r, [[c] for c in caps], None, big, f"res.pp.{tag}")
            self._scenario_ticks(Tp, r, [[c] for c in caps], big, tag)
            Td = M.NewIntVar(0, 2 * self.TW, f"res.T_dpbw[{tag}]")
            add(M.Add(Td >= T_dpbw), row("res.dp_healthy", tag))
            if r in self.dp_loads:
                healthy = [opt.capacity_Bps for opt in d.wave_options[r]]
                eff = [
                    [
                        (healthy[i] / f if f > 0 and math.isfinite(f) else 0.0)
                        for f in res.dp_factor[(klass, r)][i]
                    ]
                    for i in range(len(healthy))
                ]
                self._hull(
                    Td, self.dp_loads[r], r, eff, zp, 2 * self.TW, f"res.dp.{tag}", self.Q_wan
                )
            within(Tp + self._dp_part(T_intra, Td + T_lat, Tp, tag), tag)
        if res.nic_factor is not None and math.isinf(res.nic_factor):
            add(
                M.Add(T_intra <= 0), row("res.survive", "nic")
            )  # a lost NIC cuts its node off the collective
        elif res.nic_factor is not None:
            scaled = M.NewIntVar(0, big * 4, "res.T_intra_nic")
            num = round(res.nic_factor * 10**6)
            add(M.Add(10**6 * scaled >= num * T_intra), row("res.nic_scaled"))
            # the WAN phase's NIC term slowed by the same factor (milp._add_resilience)
            Tn = M.NewIntVar(0, big * 4, "res.T_dpbw[nic]")
            add(M.Add(Tn >= T_dpbw), row("res.dp_healthy", "nic"))
            for i, v in enumerate(self._nic_exact.get("all", [])):
                add(M.Add(10**6 * Tn >= num * v), row("res.wan_nic", "nic", i))
            within(T_pipe + self._dp_part(scaled, Tn + T_lat, T_pipe, "nic"), "nic")

    def _scenario_ticks(self, Tp: Any, r: Any, caps: list[list[float]], ub: int, tag: str) -> None:
        """The failure of route r raises its hops' ticks (see milp._scenario_ticks)."""
        d, M = self.d, self.m
        if d.planes is None:
            return
        theta = dict(self.theta)
        for h, load in self.tick_loads.items():
            if route_key(*h) == r:
                theta[h] = t = M.NewIntVar(0, ub, f"res.theta[{tag}][{h}]")
                self._hull(t, load, r, caps, None, ub, f"res.{tick_family(h)}.{tag}")
        hit = [h for h in theta if route_key(*h) == r]
        if not hit:
            return
        tau: dict[tuple[int, int], Any] = {}
        for c, crossing_r in crossings_on(d.planes, self.sloped, hit).items():
            cp = d.planes[c]
            for i, x in enumerate(cp.crossings):
                if i in crossing_r:
                    self._crossing(
                        c, i, x, theta, tau, {}, f"res.tau.{tag}", floor=self.tau_x[(c, i)]
                    )
                else:
                    tau[(c, i)] = self.tau_x[(c, i)]
            for k, pl in enumerate(cp.planes):
                self.add(M.Add(Tp >= self._plane(c, pl, tau)), row("res.plane", tag, c, k))

    # ------------------------------------------------------------------ the hull writer

    def _wave_caps(self, r: Any) -> list[list[float]]:
        return [[opt.capacity_Bps] for opt in self.d.wave_options[r]]

    def _hull(
        self,
        T_var: Any,
        load: Any,
        r: Any,
        caps: list[list[float]],
        zp: Any,
        ub: int,
        family: str,
        Q: float | None = None,
        exact: bool = False,
        by_route: bool = False,
    ) -> None:
        """The one hull writer: Q load <= sum cap[i, p] tau[i, p] with sum tau = T_var and
        tau[i, p] <= ub y[i] (and <= ub zp[p] when the capacity depends on the number of
        participating sites): the convex hull of 'load / capacity <= T_var' over the one-hots.
        Capacities are integer (bytes / Q) per tick. With `exact`, also <= Q load plus the
        rounding slack of the chosen option, so that T_var = ceil(Q load / cap)."""
        M, add = self.m, self.add
        Q = Q or self.Q
        taus, slack = [], []
        for cell in hull_cells(caps, zp is not None):
            i, p = cell.option, cell.participants
            tau = M.NewIntVar(
                0, ub, f"tau[{family}][{r}][{i}]" if by_route else f"tau[{family}][{i}][{p}]"
            )
            add(M.Add(tau <= ub * self.y[(r, i)]), row(f"{family}.hull", *r, i, p))
            if zp is not None:
                add(M.Add(tau <= ub * zp[p]), row(f"{family}.hull_p", *r, i, p))
            cap_int = math.floor(cell.capacity_Bps * self.tau * Q)
            if exact:
                if cap_int <= 0:
                    add(M.Add(tau == 0), row(f"{family}.no_capacity", *r, i))
                else:
                    slack.append((cap_int - 1) * self.y[(r, i)])
            taus.append((cap_int, tau))
        add(M.Add(sum(t for _, t in taus) == T_var), row(f"{family}.split", *r))
        lhs = sum(c * t for c, t in taus if c > 0)
        add(M.Add(lhs >= round(Q) * load), row(f"{family}.capacity", *r))
        if exact:
            add(M.Add(lhs <= round(Q) * load + sum(slack)), row(f"{family}.capacity_ub", *r))

    def _main(self) -> Any:
        return {"step_time": self.T, "cost": self.capex, "rate": self.rate}[self.objective]

    def _scale(self) -> float:
        return {"step_time": self.tau, "cost": 1.0, "rate": RATE_UNIT}[self.objective]

    def solve(
        self,
        time_limit_s: float,
        threads: int | None,
        seed: int,
        options: dict[str, Any],
        tiebreak: bool = True,
    ) -> InnerSolution | NoPlan:
        """The optimum, then (with `tiebreak`) the canonical plan among its ties. Without
        it the first solve's plan is returned and break_ties can follow: the contention
        rounds only break ties once a round's plan is priced exactly (the tie-break of a
        round whose plan gains planes is thrown away with the round)."""
        solver = cp_model.CpSolver()
        p = solver.parameters
        p.max_time_in_seconds = max(0.01, time_limit_s)
        p.num_workers = threads or max(PORTFOLIO_WORKERS, os.cpu_count() or 1)
        p.random_seed = seed
        for key, value in options.items():
            if hasattr(p, key):
                if isinstance(value, list):  # a repeated field (e.g. subsolvers)
                    field = getattr(p, key)
                    field.clear()
                    field.extend(value)
                else:
                    setattr(p, key, value)
        p.catch_sigint_signal = False  # placer.interrupt stops the search and keeps the plan
        t0 = time.perf_counter()
        with interrupt.stoppable(solver.StopSearch):
            st = solver.Solve(self.m)
        if st == cp_model.MODEL_INVALID:
            why = self.m.Validate() or _solution_info(solver) or "CP-SAT gave no message"
            raise SolverError(f"CP-SAT: the model of {self.d.cfg.label()} is invalid: {why}")
        if st == cp_model.INFEASIBLE:
            return NoPlan(proven=True, reason="infeasible or no better than the incumbent")
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            # UNKNOWN: the time limit struck before a plan; the bound CP-SAT proved stays open
            b = solver.BestObjectiveBound()
            bound = b * self._scale() if math.isfinite(b) else None
            return NoPlan(proven=False, bound=bound, reason=f"CP-SAT {solver.StatusName(st)}")
        optimal = st == cp_model.OPTIMAL
        self._record(solver)
        scale = self._scale()
        value = solver.ObjectiveValue() * scale
        bound = solver.BestObjectiveBound() * scale
        counts, waves = self._extract(solver)
        first = InnerSolution(
            counts,
            waves,
            value,
            bound,
            optimal,
            step_time_s=value if self.objective == "step_time" else solver.Value(self.T) * self.tau,
            routing=self.routing(solver),
        )
        everything = [(var, solver.Value(var)) for var in self._all_vars()]
        self._tie = (solver, first, round(solver.ObjectiveValue()), everything)
        if not tiebreak:
            return first
        # the tie-break solve gets what is left of the time limit, not a second one
        return self.break_ties(time_limit_s - (time.perf_counter() - t0))

    def break_ties(self, time_limit_s: float) -> InnerSolution:
        """Among the plans of the last solve's objective value: fewer waves, then fewer
        sites, ... (the first plan when the tie-break solve finds none in time).

        Two solves, lexicographic: the fewest waves, then, at that count, the rest of the
        order as weights. One weighted objective made CP-SAT walk the wave count down one
        LNS step at a time under a weak bound (seed-1t-two-sites' second round, whose ties
        mix layouts: 8.3 s; the two solves 4.4 s; benchmarks/README.md, "Tie-break in two
        solves"). The order and so the plan are the same: the weights are lexicographic."""
        solver, first, objective, everything = self._tie
        deadline = time.perf_counter() + time_limit_s
        self.drop_symmetry()
        self.add(self.m.Add(self._main() <= objective), row("objective.tiebreak"))
        # 1. the fewest waves among the ties, from this solve's plan (a complete hint)
        st = self._tie_solve(solver, self.total_waves, everything, deadline)
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return first
        waves = solver.Value(self.total_waves)
        at_waves = [(var, solver.Value(var)) for var in self._all_vars()]
        self._record(solver)
        tied = self._solution(solver, first)  # kept if the second solve finds none in time
        fixed = self.total_waves == waves if st == cp_model.OPTIMAL else self.total_waves <= waves
        self.add(self.m.Add(fixed), row("objective.tiebreak_waves"))
        # 2. at that count: fewer sites, fewer listed paths per routed pair, then the
        # lowest chain-type weights (CP-SAT's parallel workers may otherwise return a
        # different optimal plan on each run)
        tb = tiebreak_weights(self.d.cfg.dp, len(self.d.chains), len(self.w), len(self.d.sites))
        rest = (
            tb.sites * sum(self.sites_used.values())
            + tb.paths * sum(self.w.values())
            + sum(tb.chain_index * chain_weight(c) * v for c, v in self.n.items())  # hook
        )
        first_status = self.tie_status
        st2 = self._tie_solve(solver, rest, at_waves, deadline)
        if st == cp_model.FEASIBLE:  # the limit struck in the first solve: say so
            self.tie_status = f"{first_status} (waves), then {self.tie_status}"
        if st2 not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return tied
        self._record(solver)
        return self._solution(solver, first)

    def _solution(self, solver: cp_model.CpSolver, first: InnerSolution) -> InnerSolution:
        """The tie-break solve's plan, at the first solve's objective and bound."""
        counts, waves = self._extract(solver)
        return InnerSolution(
            counts,
            waves,
            first.objective,
            first.bound,
            first.optimal,
            step_time_s=first.objective if self.objective == "step_time" else None,
            routing=self.routing(solver),
        )

    def _all_vars(self) -> list[Any]:
        return [self.m.GetIntVarFromProtoIndex(i) for i in range(len(self.m.Proto().variables))]

    def _tie_solve(
        self,
        solver: cp_model.CpSolver,
        objective: Any,
        hint: list[tuple[Any, int]],
        deadline: float,
    ) -> Any:
        """One solve of the tie-break, from a complete plan of its model as the hint (the
        first solve's, then the fewest-waves one), with what is left until `deadline`."""
        self.m.ClearHints()  # hook: the tie-break starts from this solve's plan, not the start
        for var, value in hint:
            self.m.AddHint(var, value)
        self.m.Minimize(objective)
        solver.parameters.max_time_in_seconds = max(0.01, deadline - time.perf_counter())
        if interrupt.requested():
            st = cp_model.UNKNOWN  # stopping: keep the first solution, no tie-break solve
        else:
            with interrupt.stoppable(solver.StopSearch):
                st = solver.Solve(self.m)
        self.tie_status = solver.StatusName(st) if st != cp_model.UNKNOWN else "UNKNOWN"
        if st == cp_model.INFEASIBLE and not interrupt.requested():
            st = self._tie_without_presolve(solver, hint, deadline - time.perf_counter())
        return st

    def _tie_without_presolve(
        self, solver: cp_model.CpSolver, everything: list[tuple[Any, int]], time_limit_s: float
    ) -> Any:
        """The tie-break model holds the first solve's plan (its objective row is that plan's
        value), so INFEASIBLE is CP-SAT's presolve in error: OR-Tools 9.15.6755 reports
        "exactly_one: empty or all false" on four equal spokes around a hub in lockstep
        (benchmarks/symmetry_bench.py; tests/test_cpsat_tiebreak.py injects it), and solves
        the same model without presolve. Solved again that way, from the first plan as a
        complete hint (CP-SAT checks every solution against the model it was given, so what
        this returns is a plan of that model)."""
        self.m.ClearHints()
        for var, value in everything:
            self.m.AddHint(var, value)
        presolve = solver.parameters.cp_model_presolve
        solver.parameters.cp_model_presolve = False
        solver.parameters.max_time_in_seconds = max(0.01, time_limit_s)
        try:
            with interrupt.stoppable(solver.StopSearch):
                st = solver.Solve(self.m)
        finally:
            solver.parameters.cp_model_presolve = presolve
        self.tie_status = f"{self.tie_status}, then {solver.StatusName(st)} without presolve"
        return st

    def _record(self, solver: cp_model.CpSolver) -> None:
        proto = self.m.Proto()
        self._values = {
            var.name: solver.Value(self.m.GetIntVarFromProtoIndex(i))
            for i, var in enumerate(proto.variables)
            if var.name
        }

    def _extract(self, solver: cp_model.CpSolver) -> tuple[dict[int, int], dict[Any, int]]:
        counts = {c: solver.Value(v) for c, v in self.n.items() if solver.Value(v) > 0}
        waves = {
            r: self.d.wave_options[r][i].waves for (r, i), yv in self.y.items() if solver.Value(yv)
        }
        return counts, waves


def _var_name(v: Any) -> str:
    return str(v.Name())


def _solution_info(solver: cp_model.CpSolver) -> str:
    """CP-SAT's own account of a failed solve (why the parameters or model are invalid)."""
    try:
        return str(solver.SolutionInfo())
    except RuntimeError:  # no response to read
        return ""
