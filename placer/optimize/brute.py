"""Exhaustive search over every plan of a tiny instance, scored by the evaluator alone.

The reference the formulations are tested against: it shares no code with them except
the search space (configurations, chain types, candidate paths) and the evaluator.

Routing: for a placement and waves, a pair's latency is set by the slowest path it may
use, and allowing every faster path too never hurts, so the only routing choices that
matter are, per (phase, pair), how many of its lowest-latency paths it may use. For each
such choice the best split is the one with the least congestion in each phase (step time
is non-decreasing in both), a small LP solved with HiGHS directly. Resilience is not
supported together with routed pairs: a routing that survives failures need not be the
least congested one.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from typing import Any

from placer.errors import InputError
from placer.evaluate import evaluate
from placer.io import Problem
from placer.network import Network, PairKey, RouteKey, route_key
from placer.optimize.data import InnerData, InnerSolution, solution_plan
from placer.optimize.families import chain_weight_sum, tiebreak_key
from placer.perf.step import PerfModel

MAX_PLANS = 200_000
MAX_ROUTINGS = 64  # routing choices per placement and wave vector


def brute_inner(
    problem: Problem, perf: PerfModel, data: InnerData, objective: str
) -> InnerSolution | None:
    cfg = data.cfg
    n_chains = len(data.chains)
    wave_choices = [[o.waves for o in data.wave_options[r]] for r in data.routes]
    n_multisets = _multisets(n_chains, cfg.dp)
    n_waves = 1
    for w in wave_choices:
        n_waves *= len(w)
    if n_multisets * n_waves > MAX_PLANS:
        raise InputError(
            f"brute backend: {cfg.label()} has {n_multisets} placements x {n_waves} wave vectors; "
            f"it is meant for tiny instances (at most {MAX_PLANS} plans per configuration)"
        )
    best: tuple | None = None
    best_sol: InnerSolution | None = None
    for combo in itertools.combinations_with_replacement(range(n_chains), cfg.dp):
        counts: dict[int, int] = {}
        for c in combo:
            counts[c] = counts.get(c, 0) + 1
        demands, fixed = _demands(data, counts)
        for wv in itertools.product(*wave_choices):
            waves = dict(zip(data.routes, wv, strict=True))
            for routing in _routings(problem, perf.net, data, demands, fixed, waves):
                sol = InnerSolution(counts, waves, 0.0, 0.0, True, routing=routing)
                ev = evaluate(problem, solution_plan(problem, data, sol), perf)
                if not ev.feasible:
                    continue
                value = {
                    "step_time": ev.step_time_s,
                    "cost": ev.capex_usd,
                    "cost_per_token": ev.cost_per_token_usd,
                }[objective]
                sites = sum(1 for g in ev.gpus_by_site.values() if g > 0)
                paths = sum(len(e["paths"]) - 1 for e in routing)
                key = tiebreak_key(value, sum(wv), sites, paths, chain_weight_sum(counts))
                if best is None or key < best:
                    best = key
                    best_sol = InnerSolution(
                        dict(counts),
                        waves,
                        value,
                        value,
                        True,
                        step_time_s=ev.step_time_s,
                        routing=routing,
                    )
    return best_sol


def _demands(
    data: InnerData, counts: dict[int, int]
) -> tuple[dict[tuple[str, PairKey], float], dict[tuple[str, RouteKey], float]]:
    """Bytes per step of each routed pair in each phase, and the bytes the other pairs
    (one candidate path) put on each route."""
    out: dict[tuple[str, PairKey], float] = defaultdict(float)
    fixed: dict[tuple[str, RouteKey], float] = defaultdict(float)
    for c, n in counts.items():
        for q in data.chain_routed_pairs(c):
            out[("pipeline", q)] += n * data.pp_bytes_per_crossing
        for r, x in data.chain_cross[c].items():
            fixed[("pipeline", r)] += n * x * data.pp_bytes_per_crossing
    cfg = data.cfg
    for k in range(cfg.pp):
        hosts = sorted({data.chains[c][k] for c in counts})
        for i, a in enumerate(hosts):
            for b in hosts[i + 1 :]:
                q = route_key(a, b)
                demand = 2 * data.wan_bytes[k] / len(hosts)
                if data.routed(q):
                    out[("data_parallel", q)] += demand
                else:
                    for r in data.pair_paths[q][0].routes:
                        fixed[("data_parallel", r)] += demand
    return dict(out), dict(fixed)


def _routings(
    problem: Problem,
    net: Network,
    data: InnerData,
    demands: dict[tuple[str, PairKey], float],
    fixed: dict[tuple[str, RouteKey], float],
    waves: dict[RouteKey, int],
) -> list[list[dict[str, Any]]]:
    if not demands:
        return [[]]
    if problem.instance.resilience is not None and problem.instance.resilience.survive:
        raise InputError(
            "brute backend: resilience with routed pairs is not supported; set solver.paths_per_pair: 1"  # noqa: E501
        )
    keys = sorted(demands)
    choices = [range(1, len(data.pair_paths[q]) + 1) for _, q in keys]
    total = math.prod(len(c) for c in choices)
    if total > MAX_ROUTINGS:
        raise InputError(
            f"brute backend: {total} routing choices per plan (at most {MAX_ROUTINGS})"
        )
    cap = {r: net.capacity_Bps(r, waves.get(r, 0), data.route_optic[r]) for r in data.routes}
    out = []
    for levels in itertools.product(*choices):
        entries: list[dict[str, Any]] = []
        ok = True
        for phase in ("pipeline", "data_parallel"):
            sel = {q: lv for (ph, q), lv in zip(keys, levels, strict=True) if ph == phase}
            if not sel:
                continue
            shares = _least_congested(data, phase, sel, demands, fixed, cap)
            if shares is None:
                ok = False
                break
            for q, lv in sorted(sel.items()):
                if lv >= 2:
                    paths = data.pair_paths[q][:lv]
                    entries.append(
                        {
                            "phase": phase,
                            "sites": list(q),
                            "paths": [
                                {"via": list(p.sites), "share": s}
                                for p, s in zip(paths, shares[q], strict=True)
                            ],
                        }
                    )
        if ok:
            out.append(entries)
    return out


def _least_congested(
    data: InnerData,
    phase: str,
    sel: dict[PairKey, int],
    demands: dict[tuple[str, PairKey], float],
    fixed: dict[tuple[str, RouteKey], float],
    cap: dict[RouteKey, float],
) -> dict[PairKey, list[float]] | None:
    """Shares of each selected pair's paths that minimise the phase's busiest route time,
    with the phase's fixed-path traffic (pairs with one candidate) on top."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    lam = h.addVariable(lb=0.0)
    flows: dict[tuple[PairKey, int], Any] = {}
    route_terms: dict[RouteKey, list[Any]] = defaultdict(list)
    for q, lv in sorted(sel.items()):
        dem = demands[(phase, q)]
        vs = []
        for j, path in enumerate(data.pair_paths[q][:lv]):
            f = h.addVariable(lb=0.0)
            flows[(q, j)] = f
            vs.append(f)
            for r in path.routes:
                route_terms[r].append((f, dem))
        h.addConstr(sum(vs) == 1.0)
    for r, terms in route_terms.items():
        if cap[r] <= 0:
            for f, _ in terms:
                h.addConstr(f <= 0.0)
            continue
        h.addConstr(
            sum(f * (dem / cap[r]) for f, dem in terms) + fixed.get((phase, r), 0.0) / cap[r] <= lam
        )
    h.minimize(lam)
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    sol = h.getSolution().col_value
    out: dict[PairKey, list[float]] = {}
    for q, lv in sel.items():
        vals = [max(0.0, sol[flows[(q, j)].index]) for j in range(lv)]
        total = sum(vals) or 1.0
        shares = [v / total for v in vals]
        shares[-1] = max(0.0, 1.0 - sum(shares[:-1]))
        out[q] = shares
    return out


def _multisets(n: int, k: int) -> int:
    from math import comb

    return comb(n + k - 1, k) if n > 0 else 0
