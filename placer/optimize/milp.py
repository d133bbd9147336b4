"""MILP formulation of one configuration's placement and link problem (PuLP + HiGHS).

Decisions: replicas per chain type, waves per route (one-hot over the route's possible
wave counts, which are small integers, so that 1/capacity is linear), which sites host
each stage (binary), and how many sites host it (one-hot, so that each hosting pair's
share 2 S_k / K_k of the WAN all-reduce is linear). The model is built as the ordered
families of placer.optimize.families, each row named `<namespace>:<index>` (`pipe.chain:0`,
`dp.pair:a:b:0`, `route.pp.capacity:a:b`, `site.power:a`) as in the CP-SAT backend.
Units: seconds, GB and GB/s keep the coefficients within a few orders of magnitude.
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

import pulp

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
    Load,
    NicTerm,
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

GBYTE = 1e9
MIP_REL_GAP = 1e-7  # HiGHS defaults to 1e-4; placer reports proven optima
# relative slack on the optimum while breaking ties. 1e-6 before (HiGHS' feasibility
# tolerance), and HiGHS took plans at that edge: four-site-metro-longhaul's tie-break gave
# a 73-wave plan 1.0e-6 slower than the 80-wave optimum (priced exactly by the model), so
# the driver kept the 80-wave plan while a 73-wave plan at the optimum exists (CP-SAT's).
# At 1e-10 it gives a 73-wave plan at +1.0e-10, and its tie-break took 0.8 s instead of 3.4 s.
TIE_TOL = 1e-10
# how far HiGHS' reported objective may be from its returned columns' before the solve is
# not trusted (_objective_is_solutions): HiGHS' default feasibility tolerance (1e-7) with
# room for the objective's summation; the defect it catches was 5.7e-4 apart
OBJECTIVE_MATCH_REL = 1e-6


# HiGHS' options as placer sets them (the instance's solver options override them):
HIGHS_DEFAULTS: dict[str, Any] = {
    "mip_rel_gap": MIP_REL_GAP,
    # HiGHS' symmetry detection can run for the whole time limit on these models
    "mip_detect_symmetry": False,
    # HiGHS' restart (presolve again once the root has fixed columns) costs more than it
    # saves on these models: the 91 HiGHS models of the six shipped instances, solved
    # again offline with one thread, give the same status and optimum every one, with
    # 208,811 -> 128,036 simplex iterations on three-sites-80-300-500km (12.1 -> 6.3 CPU
    # s) and none slower by more than noise (benchmarks/README.md)
    "mip_allow_restart": False,
    # RENS: HiGHS 1.16.0 loops for ever in the presolve of the sub-MIP of a RENS inside
    # another RENS sub-MIP (HPresolve::strengthenInequalities, where neither time_limit
    # nor the interrupt callback is checked; ERGO-Code/HiGHS#2226 is another such loop).
    # Found on a 770-row round of the two campuses with Llama 3 70B on one wave, as
    # branch credit-repeats' formulation builds it (tests/data/highs_rens_loop.mps.gz,
    # tests/test_highs_defects.py): it hung tests/test_tradeoffs.py. With RENS off it
    # solves in 0.4 s (so it does with random_seed 1). The shipped instances' MILP solves,
    # two runs each, RENS on -> off: deepseek-v3-two-sites 0.84 -> 1.73 s, four-site-
    # metro-longhaul 4.1 -> 5.5 s, seed-1t-two-sites 4.8 -> 5.1 s, three-sites 5.0 ->
    # 5.0 s, two-campus 1.14 -> 1.20 s, four-metro-resilient 2.76 -> 2.31 s; the same
    # plans. A time limit that holds is worth the second (benchmarks/README.md)
    "mip_heuristic_run_rens": False,
}

_HIGHS_THREADS: list[int | None] = []  # the thread count HiGHS' global scheduler runs with


def _highs_threads(threads: int | None) -> None:
    """HiGHS keeps one global thread scheduler per process and fails a run that asks for a
    different number of threads ('Not Set': before, a second solve in the same process
    with other threads silently lost every configuration). Reset it when the count changes,
    and before the first MILP of the process: another HiGHS user (the brute backend's and
    the layer splits' LPs) may have started the scheduler with its default count."""
    import highspy

    if not _HIGHS_THREADS or _HIGHS_THREADS[0] != threads:
        highspy.Highs.resetGlobalScheduler(True)
    _HIGHS_THREADS[:] = [threads]


class _StartedHiGHS(pulp.HiGHS):
    """PuLP's highspy interface with a MIP start. PuLP passes `warmStart` to HiGHS as an
    option, which HiGHS rejects ('warmStart' is no HiGHS option: setOptionValue returns
    kError and the start is lost), so the start is handed over as HiGHS' own sparse
    solution (Highs.setSolution with indices) once PuLP has built the columns; HiGHS
    completes the continuous values (and checks the start) itself."""

    def __init__(self, start: dict[str, float], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start = start

    def callSolver(self, lp: Any) -> None:
        import numpy as np

        idx = [v.index for v in lp.variables() if v.name in self.start]
        if idx:
            vals = [float(self.start[v.name]) for v in lp.variables() if v.name in self.start]
            lp.solverModel.setSolution(
                len(idx), np.array(idx, dtype=np.int32), np.array(vals, dtype=np.float64)
            )
        super().callSolver(lp)


class Outcome(NamedTuple):
    """One HiGHS (or CBC) run: optimal | feasible (limit, with a plan) | infeasible |
    limit (no plan) | error; value and bound in model units."""

    kind: str
    value: float | None
    bound: float | None
    message: str


def _var_name(v: Any) -> str:
    return str(v.name)


def _name(*parts: Any) -> str:
    return "_".join(str(p).replace("-", "m").replace(".", "p") for p in parts)


class MilpInner:
    """One configuration's MILP, built as the families of placer.optimize.families."""

    def __init__(
        self,
        data: InnerData,
        objective: str,
        t_max: float,
        cutoff: float | None = None,
        t_cap: float | None = None,
        rate_cap: float | None = None,
        symmetry: bool = False,
    ):
        self.d = data
        self.symmetry = symmetry  # the symmetry.order rows in the objective solve
        self.t_cap = t_cap  # extra step-time ceiling (cost_per_token frontier walk)
        self.rate_cap = rate_cap  # extra ceiling on USD per second
        # time unit of the model: the fastest chain, so that times are O(1) and HiGHS'
        # absolute tolerances (1e-7) act as relative ones (tiny models step in milliseconds)
        fastest = min(data.chain_time)
        self.ts = fastest if 0 < fastest < math.inf else 1.0
        self.t_max = t_max / self.ts  # a step time no plan of this configuration needs to exceed
        self.objective = objective
        self.cutoff = cutoff
        self.sync = sync_rule(data.sync_mode, data.every_steps)
        self.prob = pulp.LpProblem("placer", pulp.LpMinimize)
        self.warm: dict[str, float] = {}  # the MIP start: integer values by variable name
        self.rows: list[str] = []  # every row's name, in build order
        for family in FAMILIES:
            dl.check()
            getattr(self, f"define_{family}")()

    def start_from(self, values: dict[str, float]) -> None:
        """A MIP start: the integer values of an earlier round's plan (by variable name);
        HiGHS completes the continuous ones."""
        names = {v.name for v in self.prob.variables() if v.cat == pulp.LpInteger}
        values = ordered_start(  # a start that breaks the symmetry rows is permuted first
            self.d, self.sym_classes, values, self.n, self.u, self.y, self.nodes, _var_name
        )
        self.warm = {k: float(v) for k, v in values.items() if k in names}

    def integer_values(self) -> dict[str, float]:
        return {
            v.name: round(v.value())
            for v in self.prob.variables()
            if v.cat == pulp.LpInteger and v.value() is not None
        }

    def add(self, constraint: Any, name: str) -> None:
        dl.check()  # a large configuration's build stops at the driver's deadline
        self.rows.append(name)
        self.prob.addConstraint(constraint, name)

    # ------------------------------------------------------------------ families

    def define_replicas(self) -> None:
        d, D, add = self.d, self.d.cfg.dp, self.add
        C = range(len(d.chains))
        self.n = {c: pulp.LpVariable(f"n_{c}", 0, D, cat="Integer") for c in C}
        self.u = {c: pulp.LpVariable(f"u_{c}", cat="Binary") for c in C}
        add(pulp.lpSum(self.n.values()) == D, row("replicas.total"))
        for c in C:
            add(self.n[c] <= D * self.u[c], row("replicas.use", c))

    def define_placement(self) -> None:
        d, add, n = self.d, self.add, self.n
        cfg, C = d.cfg, range(len(d.chains))
        self.x = x = {
            (s, k): pulp.lpSum(n[c] for c in C if d.chains[c][k] == s)
            for k in range(cfg.pp)
            for s in d.stage_sites[k]
        }
        self.nodes = nodes = {
            s: pulp.LpVariable(_name("nodes", s), 0, d.site_nodes[s], cat="Integer")
            for s in d.sites
        }
        for s in d.sites:
            used = pulp.lpSum(x[(s, k)] for k in range(cfg.pp) if (s, k) in x)
            add(d.site_groups_per_node[s] * nodes[s] >= used, row("site.nodes", s))

    def define_waves(self) -> None:
        d, add = self.d, self.add
        self.y = y = {
            (r, i): pulp.LpVariable(_name("y", *r, i), cat="Binary")
            for r in d.routes
            for i in range(len(d.wave_options[r]))
        }
        for r in d.routes:
            add(
                pulp.lpSum(y[(r, i)] for i in range(len(d.wave_options[r]))) == 1,
                row("route.waves", *r),
            )
        self.capex = pulp.lpSum(
            opt.capex_usd * y[(r, i)] for r in d.routes for i, opt in enumerate(d.wave_options[r])
        )
        self.total_waves = pulp.lpSum(
            opt.waves * y[(r, i)] for r in d.routes for i, opt in enumerate(d.wave_options[r])
        )

    def define_power(self) -> None:
        """Site power: node all-in power plus coherent modules, times PUE; and the running
        cost in USD per second (link capex amortized, energy, and the GPU-hours of priced
        sites: cost_per_token)."""
        d, add, y = self.d, self.add, self.y
        power = {}
        for s in d.sites:
            optics = pulp.lpSum(
                opt.module_w * y[(r, i)]
                for r in d.routes
                if s in r
                for i, opt in enumerate(d.wave_options[r])
            )
            power[s] = d.site_pue[s] * (d.site_node_w[s] * self.nodes[s] + optics)
            if d.site_power_w[s] is not None:
                add(power[s] <= d.site_power_w[s], row("site.power", s))
        self.power_w = power
        self.rate = (
            (1.0 / d.amortization_s) * self.capex
            + d.energy_usd_per_j * pulp.lpSum(power.values())
            + pulp.lpSum(d.site_node_usd_per_s[s] * self.nodes[s] for s in d.sites)
        )

    def define_budget(self) -> None:
        if self.d.max_cost_usd is not None:
            self.add(self.capex <= self.d.max_cost_usd, row("budget"))

    def define_pipeline(self) -> None:
        """T_pipe >= the 1F1B time of every chain type in use (the fastest bounds it below),
        and the pipeline traffic of routed pairs: flows, path prefixes, prefix 1F1B times."""
        d, ts = self.d, self.ts
        self.T_pipe = pulp.LpVariable("T_pipe", min(d.chain_time) / ts)
        self._exact = d.resilience is not None and d.resilience.max_step_time_s is None
        if d.planes is None:  # staggered replicas: the uncontended chain times
            for c in self.u:
                self.add(self.T_pipe >= (d.chain_time[c] / ts) * self.u[c], row("pipe.chain", c))
        self.w: dict[
            tuple[str, Any, int], Any
        ] = {}  # (phase, pair, j): path j of the pair may carry traffic
        self.f: dict[tuple[str, Any, int], Any] = {}  # (phase, pair, j): GB on path j
        self._pipe_level_terms: list[PathLevelTerm] = []
        self._pp_flow_load = self._route_pipeline(self.T_pipe)

    def define_routing(self) -> None:
        """T_pipe >= pipeline bytes / capacity per route (the convex hull of the waves)."""
        d, n, C = self.d, self.n, range(len(self.d.chains))
        pp_flow_load = self._pp_flow_load
        self.pp_loads: dict[Any, Load] = {}
        for r in d.routes:
            load = pulp.lpSum(n[c] * d.chain_cross[c].get(r, 0) for c in C) * (
                d.pp_bytes_per_crossing / GBYTE
            )
            max_load = (
                d.cfg.dp
                * max((cr.get(r, 0) for cr in d.chain_cross), default=0)
                * d.pp_bytes_per_crossing
                / GBYTE
            )
            if r in pp_flow_load:
                load = load + pulp.lpSum(pp_flow_load[r][0])
                max_load += pp_flow_load[r][1]
            if max_load <= 0:
                continue
            self.pp_loads[r] = Load(load, max_load)
            self._hull(
                self.T_pipe,
                Load(load, max_load),
                r,
                self._wave_caps(r),
                None,
                self.t_max,
                "route.pp",
            )
        self._define_ticks()

    # ------------------------------------------------------------------ lockstep ticks

    def _tick_loads(self) -> dict[Any, Load]:
        """GB one tick puts on each hop (a route in one direction): the activations of
        the replicas whose boundary crosses it on a single-path pair, and a routed pair's
        per-step flow on a path times tick_fraction on both directions of its routes."""
        d, n = self.d, self.n
        msg = d.message_bytes / GBYTE
        terms: dict[Any, list[Any]] = {}
        mx: dict[Any, float] = {}
        for h, per_chain in d.hop_cross.items():
            terms[h] = [(k * msg) * n[c] for c, k in per_chain.items()]
            mx[h] = d.cfg.dp * max(per_chain.values()) * msg
        for (phase, q, j), f in self.f.items():
            if phase != "pp":
                continue
            for a, b in zip(d.pair_paths[q][j].sites, d.pair_paths[q][j].sites[1:], strict=False):
                for h in ((a, b), (b, a)):
                    terms.setdefault(h, []).append(d.tick_fraction * f)
                    mx[h] = mx.get(h, 0.0) + d.cfg.dp * msg
        return {h: Load(pulp.lpSum(t), mx[h]) for h, t in sorted(terms.items())}

    def _define_ticks(self) -> None:
        """Lockstep contention (placer.optimize.contention): a tick time per hop, each
        chain crossing's transmit time (its NIC, or the busiest hop of the paths its pair
        may use), and T_pipe >= every plane of every chain type in use."""
        d, add = self.d, self.add
        self.theta: dict[Any, Any] = {}
        self.tau: dict[tuple[int, int], Any] = {}
        self.lam: dict[tuple[int, int], Any] = {}
        self._tau_terms: dict[tuple[int, int], list[Any]] = {}
        self._lam_terms: dict[tuple[int, int], list[Any]] = {}
        self._plane_exprs: list[Any] = []
        if d.planes is None:
            return
        # only chain types with a sloped plane (from an earlier round's plan) need transmit
        # variables, and only the hops they cross need tick variables
        self.sloped = sloped_chains(d.planes)
        used_hops = hops_crossed(d.planes, self.sloped)
        self.tick_loads = {h: v for h, v in self._tick_loads().items() if h in used_hops}
        # each tick's largest value (its hop's largest load on its narrowest lit option):
        # its variable's upper bound, and the big and the scale of the transmit rows that
        # read it (_crossing), so that those rows are written in units of a tick, not of
        # t_max (benchmarks/README.md, branch gather)
        self.theta_max: dict[Any, float] = {}
        for h, load in self.tick_loads.items():
            r = route_key(*h)
            lit = [o.capacity_Bps for o in d.wave_options[r] if o.capacity_Bps > 0]
            top = load.max_load * GBYTE / (min(lit) * self.ts) if lit else self.t_max
            self.theta_max[h] = big = min(self.t_max, top)
            self.theta[h] = t = pulp.LpVariable(_name("theta", *h), 0, big)
            self._hull(
                t, load, r, self._wave_caps(r), None, self.t_max, tick_family(h), exact=self._exact
            )
        for c, cp in enumerate(d.planes):
            if not cp.planes:
                add(self.u[c] == 0, row("pipe.disconnected", c))
                continue
            for i, x in enumerate(cp.crossings if c in self.sloped else ()):
                self._crossing(c, i, x, self.theta, self.tau, self._tau_terms, "pipe.tau")
            for k, pl in enumerate(cp.planes):
                expr = self._plane(c, pl, self.tau)
                add(self.T_pipe >= expr, row("pipe.plane", c, k))
                self._plane_exprs.append(expr)

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
        """tau[c, i] >= the crossing's NIC time and every hop tick of the paths its pair
        may use (path 0 always, path l >= 1 when allowed), all when chain c is in use (0
        otherwise); lam[c, i] likewise for the slowest allowed path's latency."""
        add, u, ts = self.add, self.u[c], self.ts
        # the healthy ticks are bounded by theta_max (_define_ticks); a failure's are not
        bigs = getattr(self, "theta_max", {}) if theta is self.theta else {}
        tau[(c, i)] = t = pulp.LpVariable(_name(family, c, i), 0)
        # each row divided by its own scale (the NIC time, the tick's bound), so that
        # HiGHS' absolute feasibility tolerance (1e-6 in step units) is relative to a
        # transmit time of ~1e-5 steps: unscaled, a 5.7e-7 violation of the tick row let
        # seed-1t-two-sites' 126-wave plan through 1.1e-6 below its step, and the MILP
        # called it optimal over the 128-wave optimum (benchmarks/README.md, branch gather)
        nic = x.nic_s / ts
        rhs = [nic * u] if floor is None else [floor]
        scales = [nic if floor is None and nic > 0 else 1.0]
        for lv, hops in enumerate(x.hops):
            w = self.w.get(("pp", x.pair, lv)) if lv >= 1 else None
            if lv >= 1 and w is None:
                break
            off = (1 - u) if w is None else (2 - u - w)
            for h in hops:
                if h in theta:
                    big = bigs.get(h, self.t_max)
                    rhs.append(theta[h] - big * off)
                    scales.append(big if h in bigs and big > 0 else 1.0)
        for k, (e, sc) in enumerate(zip(rhs, scales, strict=True)):
            add((1.0 / sc) * t >= (1.0 / sc) * e, row(family, c, i, k))
        tau_terms[(c, i)] = rhs
        if (c, i) in self.lam:
            return
        lat = [v / ts for v in x.latency_s]
        if len(x.hops) == 1 or ("pp", x.pair, 1) not in self.w:
            self.lam[(c, i)] = lat[0] * u
            return
        lam = pulp.LpVariable(_name("lam", c, i), 0)
        expr = lat[0] * u + pulp.lpSum(
            (lat[lv] - lat[lv - 1]) * self.w[("pp", x.pair, lv)]
            for lv in range(1, len(lat))
            if ("pp", x.pair, lv) in self.w
        )
        expr = expr - max(lat) * (1 - u)
        add(lam >= expr, row("pipe.lam", c, i))
        self.lam[(c, i)] = lam
        self._lam_terms[(c, i)] = [0, expr]

    def _plane(self, c: int, pl: Any, tau: dict[tuple[int, int], Any]) -> Any:
        """const u_c + sum n_i tau[c, i] + sum l_i lam[c, i] (model time units)."""
        return (
            (pl.const / self.ts) * self.u[c]
            + pulp.lpSum(k * tau[(c, i)] for i, k in enumerate(pl.tau) if k)
            + pulp.lpSum(k * self.lam[(c, i)] for i, k in enumerate(pl.lam) if k)
        )

    def _define_node_fill(self, cls: list[int], s: str, k: int, hv: Any) -> None:
        """The site's NIC phase by its member count x = q a + r (PerfModel.intra_sync_s):
        its fill by the remainder r (a one-hot z_r over r >= 1, none: r = 0) and its ring
        by its node count N = a + [r > 0] (a one-hot w_N, N = 1 .. ceil(dp / q), summing
        to the host indicator); the count n = q (N - 1) + r (r > 0) or q N (r = 0) pays
        the sync's seconds at n members, enforced by w_N + z_r - 1 (r > 0) or w_N - sum z
        (r = 0), which are 1 exactly at that count and at most 0 otherwise (the exact
        step's term is active on both indicators: _exact_max's conjunction). The same rows
        bound each release group's NIC phase I_g by the class's stages in that group
        (dp.intra_group / dp.intra_fill_group, families.intra_targets)."""
        d, add, x, ts = self.d, self.add, self.x, self.ts
        q, D = d.fill_q[s], d.cfg.dp
        targets = self._intra_targets(cls, s, fill=True)
        varies = []
        for var, times, tag, terms in targets:
            lo = min(times.values())
            if lo > 0:
                add(var >= (lo / ts) * hv, row(f"dp.intra{tag[0]}", *tag[1:], s, k))
            if max(times.values()) > lo:
                varies.append((var, times, tag, terms))
            elif lo > 0:
                terms.append(IntraTerm(hv, x[(s, k)], lo / ts))
        if not varies:
            return  # one time at every count (dp <= q with no NIC phase)
        z = {r: pulp.LpVariable(_name("fill_r", s, k, r), cat="Binary") for r in range(1, q)}
        z = {r: v for r, v in z.items() if r <= D}
        w = {
            N: pulp.LpVariable(_name("fill_N", s, k, N), cat="Binary")
            for N in range(1, -(-D // q) + 1)
        }
        a = pulp.LpVariable(_name("fill_nodes", s, k), 0, D // q, cat="Integer")
        add(pulp.lpSum(z.values()) <= 1, row("dp.fill_onehot", s, k))
        add(x[(s, k)] == q * a + pulp.lpSum(r * z[r] for r in z), row("dp.fill_count", s, k))
        add(pulp.lpSum(w.values()) == hv, row("dp.fill_nodes_onehot", s, k))
        add(
            pulp.lpSum(N * w[N] for N in w) == a + pulp.lpSum(z.values()),
            row("dp.fill_nodes_count", s, k),
        )
        for var, times, tag, terms in varies:
            for n, t in times.items():
                N, r = -(-n // q), n % q
                no_r = 1 - pulp.lpSum(z.values())
                add(
                    var >= (t / ts) * (w[N] + (z[r] if r else no_r) - 1),
                    row(f"dp.intra_fill{tag[0]}", *tag[1:], s, k, n),
                )
                # the exact step's term: active where both indicators are 1 (_exact_max)
                terms.append(IntraTerm((w[N], z[r] if r else no_r), x[(s, k)], t / ts))

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
        d, add, x, ts = self.d, self.add, self.x, self.ts
        D = d.cfg.dp
        self.T_intra = pulp.LpVariable("T_intra", d.intra_lower_bound / ts)
        self.T_dpbw = pulp.LpVariable("T_dpbw", 0)
        self.T_lat = T_lat = pulp.LpVariable("T_lat", 0)
        self._intra_terms: list[IntraTerm] = []
        # the staggered sync's NIC phase per release group but the last (the last: T_intra)
        n_groups = len(d.release_groups)
        self.I_group = {i: pulp.LpVariable(_name("I_group", i), 0) for i in range(n_groups - 1)}
        self._group_intra_terms: dict[int, list[IntraTerm]] = {i: [] for i in self.I_group}
        ratio = d.repeat_ratio
        self._rep_max = 0.0  # the largest repeat term (the exact step's big-M)
        # per release group but the last, per route: the pair binaries of its stages' syncs
        # over that route (its gather waits for every stage's bytes there: PerfModel.step)
        self._gather_use: dict[int, dict[Any, list[Any]]] = {i: {} for i in self.I_group}
        # each release group's per-stage series terms (families.series_keys): stage k's
        # NIC phase I, latency L and WAN NIC term N in release group i
        keys = [key for cls in d.stage_classes for key in series_keys(d, cls)]
        self.I_series = {key: pulp.LpVariable(_name("I_series", *key), 0) for key in keys}
        self.L_series = {key: pulp.LpVariable(_name("L_series", *key), 0) for key in keys}
        self.N_series = {key: pulp.LpVariable(_name("N_series", *key), 0) for key in keys}
        # and its latency repeats, share x R_k x its pairs' latency (PerfModel.dp_stage_repeats)
        self._rep_coef = rep_coef = {key: ratio * d.dp_stage_repeats[key[1]] for key in keys}
        self.R_series = {
            key: pulp.LpVariable(_name("R_series", *key), 0) for key in keys if rep_coef[key] > 0
        }
        self._series_rep_terms: dict[Any, list[tuple[float, Any]]] = {k: [] for k in self.R_series}
        self._series_intra_terms: dict[Any, list[IntraTerm]] = {key: [] for key in keys}
        self._series_lat_terms: dict[Any, list[tuple[float, Any]]] = {key: [] for key in keys}
        self._pairs: list[HostPair] = []
        # per routed pair, per class (pair_dem's order): its series keys
        self._routed_series: dict[Any, list[list[tuple[int, int]]]] = {}
        self.B_series: dict[Any, Any] = {}  # their own route terms (_define_stage_routes)
        # per series key, the routes its pairs' paths use, each with the binaries that put
        # it in use (the pair's; a flow-routed pair's path j >= 1 also its allowed w[j]):
        # its own route term with a flow-routed pair (_define_stage_routes)
        self._stage_route_uses: dict[Any, list[tuple[Any, tuple[Any, ...]]]] = {
            key: [] for key in keys
        }
        # the WAN phase's NIC terms per target ("all": T_dpbw; i: release group i's U_i)
        self._nic_terms: dict[Any, list[NicTerm]] = {}
        self._nic_exact: dict[Any, list[tuple[Any, Any]]] = {}
        h: dict[tuple[str, int], pulp.LpVariable] = {}
        dp_load: dict[Any, list[Any]] = {r: [] for r in d.routes}
        dp_max: dict[Any, float] = {r: 0.0 for r in d.routes}
        # the staggered WAN phase's release groups (PerfModel.dp_release_s): the stages
        # released at or after T_pipe - g, per route (the last group is every stage: dp_load)
        groups = d.release_groups
        wan_groups = groups[:-1]
        group_load = {g: {r: [] for r in d.routes} for g in wan_groups}
        group_max = {g: {r: 0.0 for r in d.routes} for g in wan_groups}
        pair_dem: dict[
            Any, list[tuple[Any, Any, float, list[int]]]
        ] = {}  # routed pair -> (D, b, S_k, the class's release groups) per class
        # routed pair -> per release group but the last, its stages' demand and its most
        pair_group: dict[Any, dict[float, tuple[list[Any], float]]] = {}
        for cls in d.stage_classes:
            k = cls[0]  # the class's representative stage
            hosts = d.stage_sites[k]
            for s in hosts:
                h[(s, k)] = hv = pulp.LpVariable(_name("h", s, k), cat="Binary")
                add(x[(s, k)] <= D * hv, row("dp.host_ub", s, k))
                add(x[(s, k)] >= hv, row("dp.host_lb", s, k))
                if D >= 2 and d.fill_q.get(s):
                    self._define_node_fill(cls, s, k, hv)
                elif D >= 2:
                    # every member's NIC carries the data-parallel volume of a flat ring
                    for var, t, tag, terms in self._intra_targets(cls, s, fill=False):
                        if t > 0:
                            add(var >= (t / ts) * hv, row(f"dp.intra{tag[0]}", *tag[1:], s, k))
                            terms.append(IntraTerm(hv, x[(s, k)], t / ts))
            if len(hosts) < 2:
                continue
            z = {
                K: pulp.LpVariable(_name("z", k, K), cat="Binary") for K in range(1, len(hosts) + 1)
            }
            add(pulp.lpSum(z.values()) == 1, row("dp.k_onehot", k))
            add(
                pulp.lpSum(K * z[K] for K in z) == pulp.lpSum(h[(s, k)] for s in hosts),
                row("dp.k_count", k),
            )
            for tag, terms in wan_nic_terms(d, cls, h, z, x).items():
                self._nic_terms.setdefault(tag, []).extend(terms)
            S_k = d.class_wan_bytes(cls) / GBYTE
            share = pulp.lpSum((2 * S_k / K) * z[K] for K in z if K >= 2)
            in_groups = [i for i in self.I_group if d.class_release_fraction(cls, groups[i]) > 0]
            for a, b in d.disconnected:
                if a in hosts and b in hosts:
                    add(h[(a, k)] + h[(b, k)] <= 1, row("dp.disconnected", a, b, k))
            for a, b in d.pairs:
                if a not in hosts or b not in hosts:
                    continue
                bp = pulp.LpVariable(_name("b", a, b, k), cat="Binary")
                add(bp >= h[(a, k)] + h[(b, k)] - 1, row("dp.pair_on", a, b, k))
                dem = pulp.LpVariable(_name("D", a, b, k), 0)
                add(dem >= share - S_k * (1 - bp), row("dp.pair", a, b, k))
                lat = 2 * d.pair_latency[(a, b)] / ts
                add(T_lat >= lat * bp, row("dp.pair_latency", a, b, k))
                for key in series_keys(d, cls):
                    add(
                        self.L_series[key] >= lat * bp,
                        row("dp.series_latency", series_tag(*key), a, b, k),
                    )
                    self._series_lat_terms[key].append((lat, bp))
                    if key in self.R_series:
                        rep = rep_coef[key] * lat
                        add(
                            self.R_series[key] >= rep * bp,
                            row("dp.series_repeats", series_tag(*key), a, b, k),
                        )
                        self._series_rep_terms[key].append((rep, bp))
                        self._rep_max = max(self._rep_max, rep)
                self._pairs.append(
                    HostPair(
                        dem, share, bp, S_k, h[(a, k)], h[(b, k)], 2 * d.pair_latency[(a, b)] / ts
                    )
                )
                if d.routed((a, b)):
                    pair_dem.setdefault((a, b), []).append((dem, bp, S_k, in_groups))
                    self._routed_series.setdefault((a, b), []).append(series_keys(d, cls))
                    for g in wan_groups:
                        fr = d.class_release_fraction(cls, g)
                        if fr > 0:
                            terms, mx = pair_group.setdefault((a, b), {}).get(g, ([], 0.0))
                            pair_group[(a, b)][g] = (terms + [fr * dem], mx + fr * S_k)
                    continue
                for r in d.pair_routes[(a, b)]:
                    dp_load[r].append(dem)
                    dp_max[r] += S_k
                    for key in series_keys(d, cls):
                        self._stage_route_uses[key].append((r, (bp,)))
                    for i in in_groups:
                        self._gather_use[i].setdefault(r, []).append(bp)
                    for g in wan_groups:
                        fr = d.class_release_fraction(cls, g)
                        if fr > 0:
                            group_load[g][r].append(fr * dem)
                            group_max[g][r] += fr * S_k
        routed_load: dict[Any, list[Any]] = {r: [] for r in d.routes}
        routed_max: dict[Any, float] = {r: 0.0 for r in d.routes}
        self._route_data_parallel(pair_dem, T_lat, routed_load, routed_max)
        for r in d.routes:
            dp_load[r] += routed_load[r]
            dp_max[r] += routed_max[r]
        self._define_group_flows(pair_dem, pair_group, group_load, group_max)
        self._group_loads = {
            i: {r: Load(pulp.lpSum(load[r]), group_max[g][r]) for r in d.routes if load[r]}
            for i, (g, load) in enumerate(group_load.items())
        }
        if not d.dp_wan_stagger:
            # with a flow-routed pair the groups' loads serve each stage's own routes
            # (_define_stage_routes), not a group's U
            group_load, group_max = {}, {}
        self._define_wan_nic(self.T_dpbw, "all")
        for key, var in self.N_series.items():
            self._define_wan_nic(var, series_tag(*key))
        if d.dp_wan_stagger and self._nic_terms.get("all") and len(groups) >= 2:
            # the last group's routes alone (its work: T_intra + T_lat + the busiest
            # route, T_dpbw holding the NIC term too)
            group_load[groups[-1]], group_max[groups[-1]] = dp_load, dp_max
        every = {r: Load(pulp.lpSum(dp_load[r]), dp_max[r]) for r in d.routes if dp_load[r]}
        self._define_dp_stagger(groups, group_load, group_max, every)
        self.dp_loads: dict[Any, Load] = {}
        for r in d.routes:
            if dp_load[r]:
                self.dp_loads[r] = Load(pulp.lpSum(dp_load[r]), dp_max[r])
                self._hull(
                    self.T_dpbw,
                    Load(pulp.lpSum(dp_load[r]), dp_max[r]),
                    r,
                    self._wave_caps(r),
                    None,
                    self.t_max * self.sync.window,
                    "route.dp",
                )

    def _define_group_flows(
        self,
        pair_dem: dict[Any, list[tuple[Any, Any, float, list[int]]]],
        pair_group: dict[Any, dict[float, tuple[list[Any], float]]],
        group_load: dict[float, dict[Any, list[Any]]],
        group_max: dict[float, dict[Any, float]],
    ) -> None:
        """A flow-routed pair's bytes on a route in release group g (PerfModel.step):
        m = min(D_g, F_r), D_g its stages' demand in the group, F_r the pair's flow on the
        paths through r (both decisions, so their proportional share is not linear; equal
        to it unless the pair splits over paths, then pessimistic): m <= each, and m >=
        each less M where a binary says the other is the smaller (`dp.group_flow*`, exact
        for any value of the two, so the exact step needs nothing more). A route on
        every path of the pair takes D_g itself."""
        d, add = self.d, self.add
        index = {g: i for i, g in enumerate(group_load)}
        for q, by_group in sorted(pair_group.items()):
            paths = d.pair_paths[q]
            # each route of the pair's paths: the paths through it
            on_routes = {
                r: [j for j, path in enumerate(paths) if r in path.routes]
                for r in sorted({r for path in paths for r in path.routes})
            }
            big = sum(S for _, _, S, _ in pair_dem[q])  # the most of D_g and of F_r
            every = pulp.lpSum(self.f[("dp", q, j)] for j in range(len(paths)))
            for g in sorted(by_group):
                i, (terms, mx) = index[g], by_group[g]
                dem_g = pulp.lpSum(terms)
                for r, through in on_routes.items():
                    if len(through) == len(paths):
                        group_load[g][r] += terms
                        group_max[g][r] += mx
                        continue
                    flow = pulp.lpSum(self.f[("dp", q, j)] for j in through)
                    m = pulp.LpVariable(_name("m_group", *q, i, *r), 0)
                    y = pulp.LpVariable(_name("y_group", *q, i, *r), cat="Binary")
                    add(m <= dem_g, row("dp.group_flow_dem", *q, i, *r))
                    add(m <= flow, row("dp.group_flow_path", *q, i, *r))
                    add(m >= dem_g - big * y, row("dp.group_flow_lo_dem", *q, i, *r))
                    add(m >= flow - big * (1 - y), row("dp.group_flow_lo_path", *q, i, *r))
                    # implied (the pair's flow is its demand, at least D_g and F_r): the LP
                    # relaxation's bound, tighter than the big-M rows'
                    add(m >= dem_g + flow - every, row("dp.group_flow_cut", *q, i, *r))
                    group_load[g][r].append(m)
                    group_max[g][r] += mx

    def _define_wan_nic(
        self,
        var: Any,
        tag: Any,
        scale: float = 1.0,
        family: str = "dp.wan_nic",
    ) -> None:
        """var >= the WAN phase's NIC term (K - 1)/K c / x of every hosting site
        (PerfModel.wan_nic_s) of target `tag`'s terms. c / x is convex in the member count
        x, so at integer x it is the largest of its secants through (j, c / j) and (j + 1,
        c / (j + 1)), j = 1 .. ub - 1, whose hull is the LP relaxation's: each secant a row
        `dp.wan_nic`, relaxed unless the site hosts the class and the class has K hosts
        (by the secant's value at x = 0, the most it can reach when it should not bind).
        The exact step's term per secant is active on both indicators. `scale` != 1 is a
        failure scenario's (a lost NIC: the terms x its factor, no exact terms)."""
        exact = self._nic_exact.setdefault(tag, []) if scale == 1.0 else []
        for t in self._nic_terms.get(tag, []):
            a = scale * t.coef / self.ts
            for j in range(1, max(2, t.ub)):
                secant = a / j - a / (j * (j + 1)) * (t.members - j)
                big = a / j + a / (j + 1)
                self.add(
                    var >= secant - big * (2 - t.host - t.k_on),
                    row(family, tag, t.site, t.stage, t.hosts, j),
                )
                exact.append((secant, (t.host, t.k_on)))

    def _define_dp_stagger(
        self,
        groups: list[float],
        group_load: dict[float, dict[Any, list[Any]]],
        group_max: dict[float, dict[Any, float]],
        every_load: dict[Any, Load],
    ) -> None:
        """T_dpst, the staggered sync's NIC phases and WAN bandwidth (PerfModel.step,
        sync_staggered_s), and T_gst, ZeRO-1's overlapped parameter gather
        (gather_staggered_s): per release group i its works (families.stagger_works: with
        every pair on its shortest path I_i + U_i, and per stage k of the group that can
        cross sites I_{i,k} + L_{i,k} + R_{i,k} + U_i and I_{i,k} + L_{i,k} + R_{i,k} +
        N_{i,k}, R its latency repeats; with a flow-routed pair as follows) W_i = I_i + L_i
        + U_i (I_i >=
        the NIC phase of every hosting site of the group's stages, L_i >= twice the one-way
        latency of every pair, and allowed path, that they sync over, U_i >= the group's
        load / capacity on every route, a hull; none without WAN load; T_dpbw, every
        stage's, where the WAN phase is not staggered: d.dp_wan_stagger; the last group's
        T_intra + T_lat + its routes' U, or T_dpbw where that has no NIC term), or a
        stage's own series I_{i,k} + L_{i,k} + N_{i,k} (its NIC phase, latency and WAN NIC
        term: families.series_keys; each its own rows below, so W_i is their max
        implicitly), released at T_c - tail_c of every chain type c in use
        and exposed past T_c - head_c for the gather, against the longest chain T_end
        (PerfModel.dp_moments_s; T_c the uncontended chain time, d.chain_time):
        T_dpst >= W_i + (T_c - tail_c,i) u_c - T_end, T_gst >= W_i + (T_c - head_c,i) u_c
        - T_end (_define_end pins T_end, so the rows are exact), each credit multiplied by
        d.dp_credit_scale. The gathers all start with the step and share the routes, so
        group i's gather work has G_i, every stage's load over capacity on each route its
        stages sync over, in place of U_i (_define_gather_routes). Without a stagger (one
        group) both are T_intra + T_dpbw + T_lat."""
        self._gather_route_terms: list[tuple[Any, list[tuple[Any, Any]], int]] = []
        self._stagger_terms: list[tuple[Any, list[tuple[Any, Load]], int]] = []
        self._stagger_exprs: list[Any] = []  # T_dpst is their max (_exact_step)
        self._staggered = len(groups) >= 2
        self._gather_terms: list[Any] = []  # T_gst is their max
        self.T_gst = self.T_intra + self.T_dpbw + self.T_lat
        if not self._staggered:
            self.T_dpst = self.T_intra + self.T_dpbw + self.T_lat
            return
        if self.d.gather_staggered:
            self.T_gst = pulp.LpVariable("T_gst", 0)
        self.T_dpst = pulp.LpVariable("T_dpst", 0)
        window = self.t_max * self.sync.window
        usable = sorted(moment_chains(self.d, self.t_max * self.ts))
        T_end = self._define_end(usable)
        U_group: dict[int, Any] = {}
        for i, g in enumerate(groups):
            loads = [
                (r, Load(pulp.lpSum(group_load[g][r]), group_max[g][r]))
                for r in self.d.routes
                if g in group_load and group_load[g][r]
            ]
            if i == len(groups) - 1 and not loads:
                continue  # no WAN load: the last group's work is T_intra + T_dpbw + T_lat
            U = U_group[i] = pulp.LpVariable(_name("U_dpst", i), 0) if loads else None
            for r, load in loads:
                self._hull(U, load, r, self._wave_caps(r), None, window, f"route.dpst{i}")
            self._stagger_terms.append((U, loads, i))
        G = self._define_gather_routes(every_load, window)
        self._define_stage_routes(window)
        # per group and sequence one work variable, the max of its works (exact: _exact_step)
        for i, sync, work, tag in work_maxes(
            self,
            stagger_works(self, len(groups), U_group, G),
            lambda kind, i: pulp.LpVariable(_name(f"W_{kind}", i), 0),
            lambda var, w: var >= w,
        ):
            self._stagger_rows(work, tag, i, usable, T_end, sync=sync, gather=not sync)

    def _define_gather_routes(self, every_load: dict[Any, Load], window: float) -> dict[int, Any]:
        """Per release group i but the last, G_i >= t_r on every route r its stages sync
        over (a pair binary b of theirs on r: G_i >= t_r - window (1 - b)), t_r every
        stage's load on r over its capacity (a hull): ZeRO-1's overlapped gathers all start
        with the step and share the routes (PerfModel.step). Only with the staggered gather
        and the release groups' own WAN loads (d.dp_wan_stagger; T_dpbw otherwise)."""
        self._gather_loads = every_load
        self._every_t: dict[Any, Any] = {}  # _every_route_time's variables
        if not (self.d.gather_staggered and self.d.dp_wan_stagger):
            return {}
        G: dict[int, Any] = {}
        for i, uses in self._gather_use.items():
            uses = {r: bps for r, bps in uses.items() if r in every_load}
            if not uses:
                continue
            G[i] = pulp.LpVariable(_name("G_gst", i), 0)
            terms = []
            for r, bps in sorted(uses.items()):
                t = self._every_route_time(r, window)
                for j, bp in enumerate(bps):
                    self.add(G[i] >= t - window * (1 - bp), row("dp.gather_route", i, *r, j))
                    terms.append((r, bp))
            self._gather_route_terms.append((G[i], terms, i))
        return G

    def _every_route_time(self, r: Any, window: float) -> Any:
        """t_r >= every stage's data-parallel load on route r over its capacity (a hull),
        one variable per route: what the gather's and each stage's route terms read
        (_define_gather_routes, _define_stage_routes)."""
        if r not in self._every_t:
            self._every_t[r] = t = pulp.LpVariable(_name("t_every", *r), 0)
            caps = self._wave_caps(r)
            self._hull(t, self._gather_loads[r], r, caps, None, window, "route.every")
        return self._every_t[r]

    def _exact_every_route_time(self, r: Any) -> Any:
        """Every stage's load on route r over its capacity, exactly (_exact_step), once
        per route."""
        if r not in self._exact_every_t:
            self._exact_every_t[r] = self._exact_route_time(
                self._gather_loads[r], r, "exact.every_route", self.sync.window
            )
        return self._exact_every_t[r]

    def _define_stage_routes(self, window: float) -> None:
        """With a flow-routed pair (not d.dp_wan_stagger), each series key's route term in
        each release group i it serves, B_{i,k} (PerfModel.step's stage_bw): B >= N_{i0,k},
        the stage's own WAN NIC term (dp.stage_nic; before, every stage's: +22% against
        placer.sim where one stage had a lone member at a site), and B >= t_{i,r} on every
        route r its pairs' paths use (B >= t - window (n - the sum of the n binaries that
        put r in use)), t_{i,r} group i's load on r over its capacity (a hull; the last
        group's every stage's, which the gathers read in every group: they all start with
        the step). Before, each stage's route term was T_dpbw, the busiest route of the
        whole WAN phase, though its own pairs' flows may not touch it (+23% against
        placer.sim: benchmarks/README.md, "Each stage's own routes"); and then the busiest
        of its own routes at every stage's load in every group, though the stages
        released before a group's have sent part of their bytes by then (+14%: "Each
        release group's routes with a flow-routed pair")."""
        self.B_series: dict[Any, Any] = {}
        self._stage_bw_terms: dict[Any, list[tuple[Any, tuple[Any, ...]]]] = {}
        self._group_t: dict[tuple[int, Any], Any] = {}  # _group_route_time's variables
        if self.d.dp_wan_stagger or not self.I_series:
            return
        every = len(self.d.release_groups) - 1
        for key, uses in self._stage_route_uses.items():
            for i in range(key[0], every + 1):
                tag = f"{series_tag(*key)}.g{i}"
                B = self.B_series[(i, key)] = pulp.LpVariable(_name("B_series", *key, i), 0)
                self.add(B >= self.N_series[key], row("dp.stage_nic", tag))
                terms = self._stage_bw_terms[(i, key)] = []
                for j, (r, on) in enumerate(uses):
                    t = self._group_route_time(i, r, window)
                    if t is None:
                        continue
                    off = len(on) - pulp.lpSum(on)
                    self.add(B >= t - window * off, row("dp.stage_route", tag, *r, j))
                    terms.append((r, on))

    def _group_route_time(self, i: int, r: Any, window: float) -> Any:
        """t_{i,r} >= release group i's data-parallel load on route r over its capacity (a
        hull), one variable per group and route (the last group's: _every_route_time);
        None without load there."""
        if i == len(self.d.release_groups) - 1:
            return self._every_route_time(r, window) if r in self._gather_loads else None
        load = self._group_loads.get(i, {}).get(r)
        if load is None:
            return None
        if (i, r) not in self._group_t:
            self._group_t[(i, r)] = t = pulp.LpVariable(_name("t_group", i, *r), 0)
            self._hull(t, load, r, self._wave_caps(r), None, window, f"route.group{i}")
        return self._group_t[(i, r)]

    def _exact_group_route_time(self, i: int, r: Any) -> Any:
        """Release group i's load on route r over its capacity, exactly (_exact_step), once
        per group and route."""
        if i == len(self.d.release_groups) - 1:
            return self._exact_every_route_time(r)
        if (i, r) not in self._exact_group_t:
            self._exact_group_t[(i, r)] = self._exact_route_time(
                self._group_loads[i][r], r, f"exact.group_route{i}", self.sync.window
            )
        return self._exact_group_t[(i, r)]

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
        """T_dpst (`sync`) and T_gst (`gather`) >= a work of release group i from each
        chain type's release (first forward), against T_end, the credit multiplied by
        d.dp_credit_scale (_define_dp_stagger)."""
        at_sync, at_gather = self.d.dp_credit_scale
        gather = gather and self.d.gather_staggered
        # a plan's credit is at most its longest chain's own tail (or head): valid cuts,
        # without which the LP relaxation credits up to T_end
        if sync:
            tail = max((self.d.release_tail[c][i] for c in usable), default=0.0)
            self.add(self.T_dpst >= work - at_sync * tail / self.ts, row("dp.stagger_cut", tag))
        if gather:
            head = max((self.d.fill_head[c][i] for c in usable), default=0.0)
            self.add(self.T_gst >= work - at_gather * head / self.ts, row("dp.gather_cut", tag))
        for c in usable:
            if sync:
                expr = work + at_sync * (self._moment(c, self.d.release_tail[c][i]) - T_end)
                self.add(self.T_dpst >= expr, row("dp.stagger", tag, c))
                self._stagger_exprs.append(expr)
            if gather:
                expr = work + at_gather * (self._moment(c, self.d.fill_head[c][i]) - T_end)
                self.add(self.T_gst >= expr, row("dp.gather_stagger", tag, c))
                self._gather_terms.append(expr)

    def _moment(self, c: int, offset: float) -> Any:
        """(T_c - offset) u_c in model units: chain type c's release (offset its tail) or
        first-forward moment (its head), 0 when c is not in use."""
        return ((self.d.chain_time[c] - offset) / self.ts) * self.u[c]

    def _define_end(self, usable: list[int]) -> Any:
        """T_end, the longest uncontended chain time over the chain types in use, exactly:
        >= T_c u_c (`dp.end`) and, for each distinct chain time v, <= v unless a slower
        chain type is in use (`dp.end_cap`: T_end <= v + (V - v) sum_{T_c > v} u_c, V the
        slowest). Exact, because the sync rows read it with a minus sign: a free T_end
        would be raised to hide the sync, and one tied to T_pipe (the first version)
        left the objective flat along T_pipe, on which CP-SAT 9.15 ran out of memory."""
        d, add, ts = self.d, self.add, self.ts
        times = {c: d.chain_time[c] / ts for c in usable}
        if not times:  # no chain type fits the step's range: no plan, no rows
            return 0
        V = max(times.values())
        T_end = pulp.LpVariable("T_end", min(times.values()), V)
        for c in usable:
            add(T_end >= times[c] * self.u[c], row("dp.end", c))
        # every chain's 1F1B time bounds T_pipe from below (the seed plane, pipe.chain):
        # valid, and it ties T_end to the minimized T_pipe in the LP relaxation
        add(T_end <= self.T_pipe, row("dp.end_pipe"))
        for j, v in enumerate(sorted({d.chain_time[c] for c in usable})[:-1]):
            slower = [self.u[c] for c in usable if d.chain_time[c] > v]
            add(T_end <= v / ts + (V - v / ts) * pulp.lpSum(slower), row("dp.end_cap", j))
        return T_end

    def define_step(self) -> None:
        """T = T_pipe + the data-parallel part: the per-step sync (T_intra, and T_wan =
        T_dpbw + T_lat when synchronous; T_dpst, NIC phases and latency included, for the
        staggered pieces) less what its overlap windows hide, plus the sync policy's part
        of T_wan otherwise."""
        self._exposed = None
        self._overlap_terms: list[tuple[Any, Any]] = []  # (exposed piece, f sync - window)
        T_dp = self._dp_part(
            self.T_intra, self.T_dpbw + self.T_lat, self.T_pipe, None, self.T_dpst, self.T_gst
        )
        self.T = pulp.LpVariable("T", 0)
        self.add(self.T == self.T_pipe + T_dp, row("step.time"))

    def define_limits(self) -> None:
        d, add, T, ts = self.d, self.add, self.T, self.ts
        if d.max_step_time_s is not None:
            add(T <= d.max_step_time_s / ts, row("limits.max_step_time"))
        if self.t_cap is not None:
            add(T <= self.t_cap / ts, row("limits.t_cap"))
        if self.rate_cap is not None:
            # relative to the cap: HiGHS' absolute feasibility tolerance would otherwise let a
            # plan a few ppm over a small USD/s cap through, and the cost walk would repeat it
            add((1.0 / self.rate_cap) * self.rate <= 1.0, row("limits.rate_cap"))
        if self.cutoff is not None:
            # needed for step time too: the hulls' t_max bounds only the route-time splits,
            # not T_pipe + T_dp. Without this row HiGHS solves a configuration that cannot
            # beat the incumbent to its own optimum: 60 s instead of 0.06 s for
            # tp8-pp16-dp32-mb1-synchronous of four-site-metro-longhaul (seed-1t-two-sites
            # is ~2 s slower with it)
            add(self._main() <= self.cutoff / self._unit(), row("limits.cutoff"))

    def define_resilience(self) -> None:
        """Sites in use (the participants of the inter-site collective, and the tie-break's
        site count, so written for every model), then the survival rows."""
        d = self.d
        self.sites_used = {s: pulp.LpVariable(_name("site_used", s), cat="Binary") for s in d.sites}
        for s in d.sites:
            self.add(self.nodes[s] <= d.site_nodes[s] * self.sites_used[s], row("site.used", s))
        if self.d.resilience is None:
            return
        if self.d.resilience.max_step_time_s is None:
            self._exact_step(self.T_pipe, self.T_intra, self.T_dpbw, self.T_lat)
        self._add_resilience(self.T, self.T_pipe, self.T_intra, self.T_dpbw, self.T_lat, self.nodes)

    def define_objective(self) -> None:
        self.prob.setObjective(self._main())

    def define_symmetry(self) -> None:
        """Interchangeable sites (placer.optimize.symmetry) host replica-stages in site
        order, most first: used(s1) >= used(s2) >= ... per class (objective solve only).
        Not with lockstep contention: the MILP breaks ties lazily there (driver._backend),
        and a tie-broken plan the planes so far do not price exactly is dropped for the
        first plan, so the plan written would depend on the first solve's orientation
        (library cases dualpipev-two-sites-200km, part-filled: the mirror plan;
        seed-1t-two-sites: another plan 5.5e-7 slower, which the model priced at the optimum)."""
        lazy = self.d.planes is not None
        self.sym_classes = site_classes(self.d) if self.symmetry and not lazy else []
        self.sym_rows: list[Any] = []
        x, pp = self.x, self.d.cfg.pp
        for cl in self.sym_classes:
            used = {s: pulp.lpSum(x[(s, k)] for k in range(pp) if (s, k) in x) for s in cl}
            for a, b in zip(cl, cl[1:], strict=False):
                con = used[a] >= used[b]
                self.add(con, row("symmetry.order", a, b))
                self.sym_rows.append(con)

    def drop_symmetry(self) -> None:
        """The tie-break chooses among every optimal plan: the symmetry rows go."""
        # PuLP 3.4 keeps the rows in `_constraints` (its `constraints` mapping is deprecated
        # and has no successor that deletes); older PuLP has the dict as `constraints`
        table = getattr(self.prob, "_constraints", None)
        table = self.prob.constraints if table is None else table
        for con in self.sym_rows:
            del table[con.name]
        self.rows = [r for r in self.rows if not r.startswith("symmetry.")]
        self.sym_rows = []

    # ------------------------------------------------------------------ routing (MCF)

    def _paths_allowed(self, phase: str, q: Any, active: list[Any]) -> list[Any]:
        """Binaries w[j] for j >= 1: the pair's traffic may use its paths 0..j. Monotone
        (w[1] >= w[2] >= ...): with the slowest allowed path fixing the latency, allowing
        every faster path too never hurts, so only these prefixes need to be searched.
        A pair without traffic allows none."""
        d, add = self.d, self.add
        ws: list[Any] = [None]
        for j in range(1, len(d.pair_paths[q])):
            w = pulp.LpVariable(_name("w", phase, *q, j), cat="Binary")
            self.w[(phase, q, j)] = w
            if j == 1:
                add(w <= pulp.lpSum(active), row(f"route.{phase}.paths_need_traffic", *q))
            else:
                add(w <= ws[-1], row(f"route.{phase}.paths_prefix", *q, j))
            ws.append(w)
        return ws

    def _split(
        self,
        phase: str,
        q: Any,
        demand: Any,
        max_demand: float,
        ws: list[Any],
        loads: dict[Any, tuple[list[Any], float]],
    ) -> None:
        """demand (GB) = sum of the flows on the pair's paths; a path carries flow only when
        allowed; every route of a path takes the path's flow."""
        d, add = self.d, self.add
        flows = []
        for j, path in enumerate(d.pair_paths[q]):
            f = pulp.LpVariable(_name("f", phase, *q, j), 0)
            self.f[(phase, q, j)] = f
            if j >= 1:
                add(f <= max_demand * ws[j], row(f"route.{phase}.path_allowed", *q, j))
            flows.append(f)
            for r in path.routes:
                terms, mx = loads.get(r, ([], 0.0))
                loads[r] = (terms + [f], mx + max_demand)
        add(pulp.lpSum(flows) == demand, row(f"route.{phase}.demand", *q))

    def _route_pipeline(self, T_pipe: Any) -> dict[Any, tuple[list[Any], float]]:
        """Pipeline activations of routed pairs: a multi-commodity flow over candidate paths;
        a chain's 1F1B time grows with the slowest path its pairs allow."""
        d, add, n, u = self.d, self.add, self.n, self.u
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
                add(
                    T_pipe >= (t / self.ts) * (self.u[c] + pulp.lpSum(chosen) - len(chosen)),
                    row("pipe.chain_path", c, *levels),
                )
                self._pipe_level_terms.append(PathLevelTerm(t / self.ts, self.u[c], chosen))
        return loads

    def _route_data_parallel(
        self,
        pair_dem: dict[Any, list[tuple[Any, Any, float, list[int]]]],
        T_lat: Any,
        dp_load: dict[Any, list[Any]],
        dp_max: dict[Any, float],
    ) -> None:
        """Data-parallel WAN traffic of routed pairs: the same flow, and the WAN phase pays
        twice the latency of the slowest path a pair allows."""
        self._lat_terms: list[LatencyTerm] = []
        loads: dict[Any, tuple[list[Any], float]] = {}
        for q, dems in sorted(pair_dem.items()):
            ws = self._paths_allowed("dp", q, [bp for _, bp, _, _ in dems])
            self._split(
                "dp",
                q,
                pulp.lpSum(dem for dem, _, _, _ in dems),
                sum(S for _, _, S, _ in dems),
                ws,
                loads,
            )
            for j, path in enumerate(self.d.pair_paths[q]):
                # each series key of the class: the routes of the paths it may use
                for c, (_, bp, _, _) in enumerate(dems):
                    on = (bp,) if j == 0 else (bp, ws[j])
                    for key in self._routed_series[q][c]:
                        self._stage_route_uses[key] += [(r, on) for r in path.routes]
            for j in range(1, len(ws)):
                lat = 2 * self.d.pair_paths[q][j].latency_s / self.ts
                self.add(T_lat >= lat * ws[j], row("dp.path_latency", *q, j))
                self._lat_terms.append(LatencyTerm(lat, ws[j]))
                # and each series key of the class its latency and repeats
                for c, (_, bp, _, _) in enumerate(dems):
                    for key in self._routed_series[q][c]:
                        tag = series_tag(*key)
                        on = (ws[j], bp)
                        self.add(
                            self.L_series[key] >= lat * (ws[j] + bp - 1),
                            row("dp.series_path_latency", tag, *q, j, c),
                        )
                        self._series_lat_terms[key].append((lat, on))
                        if key in self.R_series:
                            rep = self._rep_coef[key] * lat
                            self.add(
                                self.R_series[key] >= rep * (ws[j] + bp - 1),
                                row("dp.series_path_repeats", tag, *q, j, c),
                            )
                            self._series_rep_terms[key].append((rep, on))
                            self._rep_max = max(self._rep_max, rep)
        for r, (terms, mx) in loads.items():
            dp_load[r].extend(terms)
            dp_max[r] += mx

    def routing(self) -> list[dict[str, Any]]:
        """The plan's `routing` entries from the solved model."""
        return extract_routing(
            self.d,
            self.f,
            lambda key: (self.w[key].value() or 0) > 0.5,
            lambda key: self.f[key].value() or 0.0,
        )

    def _exact_max(self, var: Any, terms: list[tuple[Any, Any]], big: float, name: str) -> None:
        """var <= one of the terms (var >= every term is already in the model), chosen by a
        one-hot delta that may only pick an active term: var == max(terms) exactly."""
        deltas = []
        for i, (expr, active) in enumerate(terms):
            dl = pulp.LpVariable(_name(name, "delta", i), cat="Binary")
            # a term active when all of a tuple's expressions are 1 (a conjunction)
            for j, act in enumerate(active if isinstance(active, tuple) else (active,)):
                if act is not None:
                    self.add(dl <= act, row(f"{name}.active", i, *((j,) if j else ())))
            self.add(var <= expr + big * (1 - dl), row(f"{name}.pick", i))
            deltas.append(dl)
        self.add(pulp.lpSum(deltas) == 1, row(f"{name}.onehot"))

    def _exact_route_time(self, load: Load, r: Any, family: str, factor: float = 1.0) -> Any:
        """A variable equal to load / capacity(waves): the hull with an equality row."""
        t = pulp.LpVariable(_name("t", family, *r), 0)
        self._hull(
            t, load, r, self._wave_caps(r), None, self.t_max * 4 * factor, family, exact=True
        )
        return t

    def _exact_step(self, T_pipe: Any, T_intra: Any, T_dpbw: Any, T_lat: Any) -> None:
        """Make the step-time variable equal the plan's step time (not just bound it), so
        that a limit relative to it (resilience max_slowdown) cannot be met by overstating
        the healthy time. Each max gets a one-hot choice of the term that attains it."""
        d, add = self.d, self.add
        big = self.t_max * 4
        for i, hp in enumerate(self._pairs):
            add(hp.on <= hp.host_a, row("exact.pair_a", i))
            add(hp.on <= hp.host_b, row("exact.pair_b", i))
            add(hp.demand <= hp.share, row("exact.share", i))
            add(hp.demand <= hp.wan_bytes * hp.on, row("exact.pair_off", i))
        for c, uc in self.u.items():
            add(uc <= self.n[c], row("exact.chain_used", c))  # counts in the max only with replicas
        pipe_terms: list[tuple[Any, Any]] = (
            [(d.chain_time[c] / self.ts, self.u[c]) for c in self.u]
            if d.planes is None
            else [(e, None) for e in self._plane_exprs]
        )
        for key, rhs in self._tau_terms.items():
            self._exact_max(self.tau[key], [(e, None) for e in rhs], big, _name("exact.tau", *key))
        for key, rhs in self._lam_terms.items():
            self._exact_max(self.lam[key], [(e, None) for e in rhs], big, _name("exact.lam", *key))
        for i, term in enumerate(self._pipe_level_terms):
            a = pulp.LpVariable(_name("exact.chain_path", i), cat="Binary")
            for j, v in enumerate([term.use, *term.allowed]):
                add(a <= v, row("exact.chain_path_on", i, j))
            pipe_terms.append((term.time, a))
        for r, load in self.pp_loads.items():
            pipe_terms.append((self._exact_route_time(load, r, "exact.pp"), None))
        self._exact_max(T_pipe, pipe_terms, big, "exact.pipe")
        dp_terms: list[tuple[Any, Any]] = [(0, None)]
        for r, load in self.dp_loads.items():
            dp_terms.append((self._exact_route_time(load, r, "exact.dp", self.sync.window), None))
        # the WAN exchange may last H (diloco) or 2H (streaming) steps: its bigs scale with it
        big_wan = big * self.sync.window
        dp_terms += self._nic_exact.get("all", [])
        self._exact_max(T_dpbw, dp_terms, big_wan, "exact.dpbw")
        if self._staggered:
            for i, terms in self._group_intra_terms.items():
                self._exact_max(
                    self.I_group[i],
                    [(0, None)] + [(t.time, t.host) for t in terms],
                    big,
                    f"exact.intra_group{i}",
                )
            big_rep = max(big_wan, self._rep_max)
            for U, loads, i in self._stagger_terms:
                if U is not None:
                    u_terms: list[tuple[Any, Any]] = [(0, None)]
                    for r, load in loads:
                        t = self._exact_route_time(load, r, f"exact.dpst{i}", self.sync.window)
                        u_terms.append((t, None))
                    self._exact_max(U, u_terms, big_wan, f"exact.dpst{i}")
            self._exact_every_t: dict[Any, Any] = {}
            for G, terms, i in self._gather_route_terms:
                g_terms: list[tuple[Any, Any]] = [(0, None)]
                g_terms += [(self._exact_every_route_time(r), bp) for r, bp in terms]
                self._exact_max(G, g_terms, big_wan, f"exact.gst_u{i}")
            for key, var in self.I_series.items():
                tag = series_tag(*key)
                iterms = [(t.time, t.host) for t in self._series_intra_terms[key]]
                self._exact_max(var, [(0, None), *iterms], big, f"exact.intra_series{tag}")
                lterms = self._series_lat_terms[key]
                self._exact_max(
                    self.L_series[key], [(0, None), *lterms], big_wan, f"exact.lat_series{tag}"
                )
                nterms = self._nic_exact.get(tag, [])
                self._exact_max(
                    self.N_series[key], [(0, None), *nterms], big_wan, f"exact.nic_series{tag}"
                )
                if key in self.R_series:
                    rterms = [(0, None), *self._series_rep_terms[key]]
                    self._exact_max(
                        self.R_series[key], rterms, big_rep, f"exact.repeats_series{tag}"
                    )
            self._exact_group_t: dict[tuple[int, Any], Any] = {}
            for (i, key), B in self.B_series.items():
                b_terms: list[tuple[Any, Any]] = [(self.N_series[key], None)]
                b_terms += [
                    (self._exact_group_route_time(i, r), on)
                    for r, on in self._stage_bw_terms[(i, key)]
                ]
                self._exact_max(B, b_terms, big_wan, f"exact.stage_bw{series_tag(*key)}.g{i}")
            # every row of T_dpst is a lower bound and the chain type in use whose release
            # is latest attains it (_define_dp_stagger): T_dpst is their max
            # (a credit scaled by d.dp_credit_scale reaches that many times T_end)
            big_st = (big + big_wan) * max(d.dp_credit_scale) + self._rep_max
            for W, ws, name in self._work_maxes:
                self._exact_max(W, [(w, None) for w in ws], big_st, name)
            st_terms = [(e, None) for e in self._stagger_exprs]
            self._exact_max(self.T_dpst, st_terms, big_st, "exact.dpst")
            if self._gather_terms:
                self._exact_max(
                    self.T_gst, [(e, None) for e in self._gather_terms], big_st, "exact.gst"
                )
        self._exact_max(
            T_lat,
            [(0, None)]
            + [(hp.latency, hp.on) for hp in self._pairs]
            + [(t.latency, t.allowed) for t in self._lat_terms],
            big_wan,
            "exact.lat",
        )
        self._exact_max(
            T_intra, [(0, None)] + [(t.time, t.host) for t in self._intra_terms], big, "exact.intra"
        )
        if self._exposed is not None:
            T_wan = T_dpbw + T_lat
            self._exact_max(
                self._exposed,
                [(0, None), ((1.0 / d.every_steps) * T_wan - T_pipe, None)],
                big_wan,
                "exact.exposed",
            )
        for i, (piece, expr) in enumerate(self._overlap_terms):
            self._exact_max(piece, [(0, None), (expr, None)], big_wan, f"exact.dp_overlap.{i}")

    def _dp_exposed(
        self,
        sync: Any,
        tag: str | None,
        lat: Any = None,
        sync_st: Any = None,
        sync_gather: Any = None,
    ) -> Any:
        """The part of a per-step data-parallel sync that its overlap windows do not hide
        (PerfModel.dp_pieces): one variable per piece with exposed >= f (sync + R lat) -
        window and exposed >= 0, convex piecewise-linear in the sync and the latency (R:
        PerfModel.dp_lat_repeats, its half's buckets paying `lat` again; None: no latency
        term); `sync_st` the sync with the staggered WAN phase, for the pieces that see it
        (PerfModel.dp_staggered; None: `sync` for all), `sync_gather` the staggered
        gather for the others (None: `sync`); `tag` as in _wan_part."""
        terms = []
        reps = self.d.dp_lat_repeats
        for i, (f, window) in enumerate(self.d.dp_pieces):
            e = pulp.LpVariable(_name("T_dp_exposed", tag or "healthy", i), 0)
            if sync_st is not None and self.d.dp_staggered[i]:
                piece_sync = sync_st
            else:
                piece_sync = sync if sync_gather is None else sync_gather
            expr = f * piece_sync - window / self.ts
            if lat is not None and reps[i]:
                expr = expr + (f * reps[i]) * lat
            self.add(e >= expr, row("dp.overlap", *([] if tag is None else [tag]), i))
            if tag is None:
                self._overlap_terms.append((e, expr))
            terms.append(e)
        return pulp.lpSum(terms)

    def _dp_part(
        self,
        T_intra: Any,
        T_wan: Any,
        T_pipe: Any,
        tag: str | None,
        T_wan_st: Any = None,
        T_gather_st: Any = None,
    ) -> Any:
        """The data-parallel term of the step for the sync policy: the per-step sync with
        its overlap, the WAN exchange every H steps (diloco) or under the step (streaming).
        `T_wan_st`: the staggered sync, NIC phases and WAN phase, and `T_gather_st` the
        staggered gather (healthy step; None: every stage's at once, the failure scenarios
        as placer.resilience prices them)."""
        if self.d.sync_mode == "synchronous":
            # every bucket's collective pays the WAN latency (PerfModel.dp_lat_repeats); in
            # the healthy step's release groups, each stage's own (R_series, in T_dpst and T_gst)
            lat = None if (tag is None and self.d.repeat_ratio > 0) else self.T_lat
            return self._dp_exposed(T_intra + T_wan, tag, lat, T_wan_st, T_gather_st)
        return self._dp_exposed(T_intra, tag) + self._wan_part(T_wan, T_pipe, tag)

    def _wan_part(self, T_wan: Any, T_pipe: Any, tag: str | None) -> Any:
        """The data-parallel WAN term of the step for the sync policy (families.SyncRule);
        `tag` None is the healthy step, a tag one failure scenario's."""
        rule = self.sync
        if not rule.overlapped:
            return (1.0 / rule.divisor) * T_wan
        exposed = pulp.LpVariable("T_exposed" if tag is None else _name("T_exposed", tag), 0)
        self.add(
            exposed >= (1.0 / rule.divisor) * T_wan - T_pipe,
            row("dp.streaming_overlap", *([] if tag is None else [tag])),
        )
        if tag is None:
            self._exposed = exposed
        return exposed

    def _add_resilience(
        self, T: Any, T_pipe: Any, T_intra: Any, T_dpbw: Any, T_lat: Any, nodes: Any
    ) -> None:
        """Every single failure of the listed classes keeps the step within the limit:
        (1 + max_slowdown) x healthy, or max_step_time_s when set (placer.resilience).
        A degraded route's pipeline time uses its degraded capacity; its data-parallel time
        is the healthy one times the collective's slowdown factor, which depends on the
        wave option and on the number of sites the plan uses (one-hot, convex hull)."""
        d, res = self.d, self.d.resilience
        assert res is not None
        add = self.add
        limit = (1 + res.max_slowdown) * (
            (res.max_step_time_s / self.ts) if res.max_step_time_s is not None else T
        )
        # number of sites the plan uses (participants of the inter-site collective)
        used = self.sites_used
        for s in d.sites:
            add(used[s] <= nodes[s], row("res.used_has_nodes", s))
        zp = {
            p: pulp.LpVariable(_name("res.p", p), cat="Binary") for p in range(1, len(d.sites) + 1)
        }
        add(pulp.lpSum(zp.values()) == 1, row("res.p_onehot"))
        add(
            pulp.lpSum(p * z for p, z in zp.items()) == pulp.lpSum(used.values()),
            row("res.p_count"),
        )
        t_max = (
            self.t_max * (1 + res.max_slowdown) * 1.01
            if res.max_step_time_s is None
            else (1 + res.max_slowdown) * res.max_step_time_s / self.ts * 1.01
        )
        for (klass, r), caps in sorted(res.degraded_capacity.items()):
            tag = f"{klass}_{r[0]}_{r[1]}"
            Tp = pulp.LpVariable(_name("res.T_pipe", tag), 0)
            add(Tp >= T_pipe, row("res.pipe_healthy", tag))
            if r in self.pp_loads:
                self._hull(
                    Tp,
                    self.pp_loads[r],
                    r,
                    [[c] for c in caps],
                    None,
                    t_max,
                    f"res.pp.{tag}",
                    by_route=False,
                )
            self._scenario_ticks(Tp, r, [[c] for c in caps], t_max, tag)
            Td = pulp.LpVariable(_name("res.T_dpbw", tag), 0)
            add(Td >= T_dpbw, row("res.dp_healthy", tag))
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
                    Td,
                    self.dp_loads[r],
                    r,
                    eff,
                    zp,
                    t_max * self.sync.window,
                    f"res.dp.{tag}",
                    by_route=False,
                )
            add(Tp + self._dp_part(T_intra, Td + T_lat, Tp, tag) <= limit, row("res.survive", tag))
        if res.nic_factor is not None and math.isinf(res.nic_factor):
            add(
                T_intra <= 0, row("res.survive", "nic")
            )  # a lost NIC cuts its node off the collective
        elif res.nic_factor is not None:
            # the WAN phase's bandwidth term with its NIC term slowed by the same factor
            # (PerfModel.step, intra_factor): max(routes, factor x NIC term)
            Tn = pulp.LpVariable(_name("res.T_dpbw", "nic"), 0)
            add(Tn >= T_dpbw, row("res.dp_healthy", "nic"))
            self._define_wan_nic(Tn, "all", res.nic_factor, "res.wan_nic")
            add(
                T_pipe + self._dp_part(res.nic_factor * T_intra, Tn + T_lat, T_pipe, "nic")
                <= limit,
                row("res.survive", "nic"),
            )

    def _scenario_ticks(
        self, Tp: Any, r: Any, caps: list[list[float]], t_max: float, tag: str
    ) -> None:
        """Under a failure of route r its hops' ticks grow (degraded capacity): the chains
        crossing r get the scenario's transmit times, and Tp >= their planes there."""
        d = self.d
        if d.planes is None:
            return
        theta = dict(self.theta)
        for h, load in self.tick_loads.items():
            if route_key(*h) == r:
                theta[h] = t = pulp.LpVariable(_name("res.theta", tag, *h), 0)
                self._hull(
                    t, load, r, caps, None, t_max, f"res.{tick_family(h)}.{tag}", by_route=False
                )
        hit = [h for h in theta if route_key(*h) == r]
        if not hit:
            return
        tau: dict[tuple[int, int], Any] = {}
        for c, crossing_r in crossings_on(d.planes, self.sloped, hit).items():
            cp = d.planes[c]
            for i, x in enumerate(cp.crossings):
                if i in crossing_r:
                    self._crossing(
                        c, i, x, theta, tau, {}, f"res.tau.{tag}", floor=self.tau[(c, i)]
                    )
                else:
                    tau[(c, i)] = self.tau[(c, i)]
            for k, pl in enumerate(cp.planes):
                self.add(Tp >= self._plane(c, pl, tau), row("res.plane", tag, c, k))

    def _wave_caps(self, r: Any) -> list[list[float]]:
        return [[opt.capacity_Bps] for opt in self.d.wave_options[r]]

    def _hull(
        self,
        T_var: Any,
        load: Load,
        r: Any,
        caps: list[list[float]],
        zp: Any,
        t_max: float,
        family: str,
        exact: bool = False,
        by_route: bool = True,
    ) -> None:
        """The one hull writer: load <= capacity(option, p) x T_var on the convex hull of the
        wave one-hot (and of the participants one-hot zp when the capacity depends on it):
        T_var is split into tau[i, p] <= t_max y[i] (and <= t_max zp[p]), and load <=
        sum cap[i, p] tau[i, p] (== with `exact`). Much tighter than big-M rows. The capacity
        row is divided by the route's largest possible load (GB), so that the solver's
        absolute feasibility tolerance is relative to the traffic, however small."""
        scale = load.max_load if load.max_load > 0 else 1.0
        taus, terms = [], []
        for cell in hull_cells(caps, zp is not None):
            i, p = cell.option, cell.participants
            if exact and cell.capacity_Bps <= 0:
                # no capacity (no wave lit, or a lost route): the load must be 0 and so is
                # its time; a slack tau here would leave an exact route time free up to t_max
                # on an unused route, and a max over it could overstate the step
                continue
            tau = pulp.LpVariable(
                _name("tau", family, *r, i) if by_route else _name("tau", family, i, p), 0
            )
            self.add(tau <= t_max * self.y[(r, i)], row(f"{family}.hull", *r, i, p))
            if zp is not None:
                self.add(tau <= t_max * zp[p], row(f"{family}.hull_p", *r, i, p))
            taus.append(tau)
            terms.append(cell.capacity_Bps * self.ts / GBYTE / scale * tau)
        self.add(pulp.lpSum(taus) == T_var, row(f"{family}.split", *r))
        lhs = (1.0 / scale) * load.expr
        self.add(
            lhs == pulp.lpSum(terms) if exact else lhs <= pulp.lpSum(terms),
            row(f"{family}.capacity", *r),
        )

    def _main(self) -> Any:
        return {"step_time": self.T, "cost": self.capex, "rate": self.rate}[self.objective]

    def _unit(self) -> float:
        """The objective's model unit in its user unit (time is counted in units of ts)."""
        return self.ts if self.objective == "step_time" else 1.0

    # ------------------------------------------------------------------ solve

    def solve(
        self,
        time_limit_s: float,
        threads: int | None,
        options: dict[str, Any],
        tiebreak: bool = True,
        deadline_at: float | None = None,
    ) -> InnerSolution | NoPlan:
        """Solve, then (with `tiebreak`) break ties within the time left; without it the
        first plan is returned and break_ties can follow (as CpsatInner.solve). A
        configuration the time limit ends without a plan keeps HiGHS' bound (NoPlan, not
        proven); a HiGHS error is an error. `deadline_at` (a perf_counter() instant) stops
        HiGHS there even when handing it the model took part of `time_limit_s` (HiGHS'
        own clock starts after that)."""
        t0 = time.perf_counter()
        first = self._solve_once(time_limit_s, threads, options, deadline_at)
        if first.kind == "error":
            raise SolverError(f"HiGHS failed on {self.d.cfg.label()}: {first.message}")
        if first.kind == "infeasible":
            return NoPlan(proven=True, reason="infeasible or no better than the incumbent")
        if first.kind == "limit":
            bound = None if first.bound is None else first.bound * self._unit()
            return NoPlan(proven=False, bound=bound, reason=first.message)
        assert first.value is not None
        value, optimal = (
            first.value,
            first.kind == "optimal",
        )  # in model units (time in units of ts)
        bound = value if optimal else first.bound
        counts, waves = self._extract()
        plan = InnerSolution(
            counts,
            waves,
            value * self._unit(),
            -math.inf if bound is None else bound * self._unit(),
            optimal,
            step_time_s=value * self._unit() if self.objective == "step_time" else None,
            routing=self.routing(),
        )
        self._tie = (plan, value, threads, options)
        self._first_values = self.integer_values()  # the tie-breaks' start (rebuilt)
        if not tiebreak:
            return plan
        return self.break_ties(time_limit_s - (time.perf_counter() - t0))

    def break_ties(self, time_limit_s: float) -> InnerSolution:
        """tie-break (families.TieBreak, as CP-SAT): same objective, then fewer waves, fewer
        sites, fewer listed paths, replicas on lower chain-type indices. It only chooses
        among plans of the first solve's value: if it fails or runs out of time without a
        plan, the first plan stands."""
        plan, value, threads, options = self._tie
        self.tiebreak_objective(value)
        self.warm = dict(self._first_values)  # the first solve's plan starts the tie-break
        if (
            time_limit_s > 0.05
            and not interrupt.requested()
            and self._solve_once(time_limit_s, threads, options).kind in ("optimal", "feasible")
        ):
            counts, waves = self._extract()
            return InnerSolution(
                counts,
                waves,
                plan.objective,
                plan.bound,
                plan.optimal,
                step_time_s=plan.step_time_s,
                routing=self.routing(),
            )
        return plan

    def tiebreak_objective(self, value: float) -> None:
        """The tie-break's model: no symmetry rows, the objective at most `value` (model
        units, TIE_TOL), and the tie-break weights (families.tiebreak_weights) minimized."""
        self.drop_symmetry()
        main = self._main()
        self.add(main <= value + TIE_TOL * max(1.0, abs(value)), row("objective.tiebreak"))
        tb = tiebreak_weights(self.d.cfg.dp, len(self.d.chains), len(self.w), len(self.d.sites))
        self.prob.setObjective(
            tb.waves * self.total_waves
            + tb.sites * pulp.lpSum(self.sites_used.values())
            + tb.paths * pulp.lpSum(self.w.values())
            + pulp.lpSum(tb.chain_index * chain_weight(c) * v for c, v in self.n.items())
        )

    def rebuilt(self) -> MilpInner:
        """This model built again over its data, whose contention planes have grown since
        (a tie plan gained some), with the first solve's plan and value, so that
        break_ties can choose again among the ties that the new planes price exactly
        (placer.optimize.driver._break_ties). The first plan is still a plan of it: it was
        priced exactly, and every plane is a valid cut."""
        new = MilpInner(
            self.d,
            self.objective,
            self.t_max * self.ts,
            cutoff=self.cutoff,
            t_cap=self.t_cap,
            rate_cap=self.rate_cap,
            symmetry=self.symmetry,
        )
        names = {v.name for v in new.prob.variables() if v.cat == pulp.LpInteger}
        new._tie = self._tie
        new._first_values = {k: v for k, v in self._first_values.items() if k in names}
        return new

    def _extract(self) -> tuple[dict[int, int], dict[Any, int]]:
        counts = {
            c: int(round(v.value()))
            for c, v in self.n.items()
            if v.value() is not None and round(v.value()) > 0
        }
        waves = {}
        for r in self.d.routes:
            for i, opt in enumerate(self.d.wave_options[r]):
                val = self.y[(r, i)].value()
                if val is not None and val > 0.5:
                    waves[r] = opt.waves
        return counts, waves

    def _solve_once(
        self,
        time_limit_s: float,
        threads: int | None,
        options: dict[str, Any],
        deadline_at: float | None = None,
    ) -> Outcome:
        which = options.get("milp_solver", "highs")
        stop_at = time.perf_counter() + time_limit_s
        if deadline_at is not None:
            stop_at = min(stop_at, deadline_at)
        if which == "cbc":
            solver = pulp.PULP_CBC_CMD(
                msg=False, timeLimit=time_limit_s, threads=threads, gapRel=MIP_REL_GAP
            )
        else:
            kwargs = {k: v for k, v in options.items() if k != "milp_solver"}
            for key, value in HIGHS_DEFAULTS.items():
                kwargs.setdefault(key, value)
            kwargs.update(_interrupt_callback(stop_at))
            solver = _StartedHiGHS(
                self.warm, msg=False, timeLimit=time_limit_s, threads=threads, **kwargs
            )
            _highs_threads(threads)
        status = None
        try:
            status = self.prob.solve(solver)
        except KeyError:
            # PuLP's HiGHS wrapper has no entry for some limit statuses (kSolutionLimit, when
            # mip_max_nodes strikes): read the status and the solution from HiGHS itself
            highs = getattr(self.prob, "solverModel", None)
            if highs is None:
                raise
            col = list(highs.getSolution().col_value)
            if highs.getInfo().primal_solution_status == 2 and len(col) == len(
                self.prob.variables()
            ):
                for var, val in zip(self.prob.variables(), col, strict=True):
                    var.varValue = val
        except pulp.PulpSolverError as exc:
            return Outcome("error", None, None, str(exc))
        highs = getattr(self.prob, "solverModel", None)
        if which != "cbc" and highs is not None:
            out = self._highs_outcome(highs)
            if out.value is not None and self.warm and not self._objective_is_solutions(highs):
                # HiGHS 1.16.0 proved an objective that its own solution does not attain:
                # with a MIP start and presolve, it logs the start as feasible 'in the
                # reduced space' at a better value, reports that value as proven, and
                # returns the start's columns (the MILP tie-break of
                # tests/test_routing.py's short-detour triangle: 28,218 claimed, 28,234
                # returned, the brute-force tie plan lost). The same model without the
                # start solves right: once more without it, in the time left; if that
                # ends without a plan, the start's columns stand, not proven
                saved = {v.name: v.varValue for v in self.prob.variables()}
                warm, self.warm = self.warm, {}
                try:
                    again = self._solve_once(
                        max(0.05, stop_at - time.perf_counter()), threads, options, deadline_at
                    )
                finally:
                    self.warm = warm
                if again.value is not None:
                    return again
                for v in self.prob.variables():
                    v.varValue = saved.get(v.name)
                return Outcome("feasible", out.value, out.bound, "HiGHS' proof is not its plan's")
            return out
        # CBC through PuLP: its statuses (no bound when the limit strikes)
        sol_status = getattr(self.prob, "sol_status", None)
        v = self.prob.objective.value()
        if (
            status == pulp.LpStatusOptimal
            and sol_status == pulp.LpSolutionOptimal
            and v is not None
        ):
            return Outcome("optimal", float(v), float(v), "")
        if sol_status == pulp.LpSolutionIntegerFeasible and v is not None:
            return Outcome("feasible", float(v), None, "time limit")
        if status == pulp.LpStatusInfeasible:
            return Outcome("infeasible", None, None, "")
        if status == pulp.LpStatusNotSolved:
            return Outcome("limit", None, None, "time limit before a plan")
        return Outcome("error", None, None, f"CBC status {pulp.LpStatus.get(status, status)}")

    def _objective_is_solutions(self, highs: Any) -> bool:
        """Whether HiGHS' reported objective is its returned solution's (PuLP hands HiGHS
        the objective without its constant)."""
        got = self.prob.objective.value()
        if got is None:
            return True
        got -= self.prob.objective.constant
        claimed = float(highs.getInfo().objective_function_value)
        return abs(got - claimed) <= OBJECTIVE_MATCH_REL * max(1.0, abs(claimed))

    def _highs_outcome(self, highs: Any) -> Outcome:
        """HiGHS' model status read directly (PuLP maps a time limit without a solution to
        'optimal'): proven, limit (with HiGHS' dual bound), or an error with its message."""
        import highspy

        S = highspy.HighsModelStatus
        st = highs.getModelStatus()
        info = highs.getInfo()
        b = float(info.mip_dual_bound)
        bound = b if math.isfinite(b) else None
        has_plan = info.primal_solution_status == 2  # kSolutionStatusFeasible
        v = self.prob.objective.value() if has_plan else None
        if st == S.kOptimal and v is not None:
            return Outcome("optimal", float(v), bound if bound is not None else float(v), "")
        if st in (S.kInfeasible, S.kUnboundedOrInfeasible):
            return Outcome("infeasible", None, None, "")
        limits = (
            S.kTimeLimit,
            S.kInterrupt,
            S.kIterationLimit,
            S.kSolutionLimit,
            S.kObjectiveBound,
            S.kObjectiveTarget,
        )
        if st in limits:
            msg = highs.modelStatusToString(st)
            if st == S.kInterrupt and not interrupt.requested():
                msg = "Time limit reached"  # the callback's deadline (_interrupt_callback)
            return (
                Outcome("feasible", float(v), bound, msg)
                if v is not None
                else Outcome("limit", None, bound, msg)
            )
        return Outcome("error", None, None, f"model status '{highs.modelStatusToString(st)}'")


def _interrupt_callback(stop_at: float = math.inf) -> dict[str, Any]:
    """HiGHS stops at its next interrupt check once placer.interrupt has a stop request
    (SIGINT/SIGTERM) or perf_counter() passes `stop_at` (the time limit counted from
    before PuLP hands HiGHS the model, which HiGHS' own timeLimit does not see: 0.5 s on
    7,456 chain types); it then reports the incumbent as feasible, not optimal."""
    import highspy

    def cb(_type: Any, _msg: Any, _out: Any, data_in: Any, _user: Any) -> None:
        if data_in is not None and (interrupt.requested() or time.perf_counter() > stop_at):
            data_in.user_interrupt = 1

    kinds = highspy.cb.HighsCallbackType
    return {
        "callbackTuple": (cb, None),
        "callbacksToActivate": [kinds.kCallbackMipInterrupt, kinds.kCallbackSimplexInterrupt],
    }
