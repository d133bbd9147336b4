"""A plan first: a greedy construction plus local search that finds a feasible plan in about
a second, before the exact search starts (issue 12 item 3).

Construction, per configuration (best lower bounds first):

* sites are taken fastest GPU first (the slowest stage time of the configuration on that
  GPU type), each with the TP groups its power feeds (presolve.SiteCap: whole nodes, PUE,
  and one coherent module when the plan spans sites), until they hold pp x dp groups;
* the chosen sites are laid out along a line (nearest neighbour by fiber latency), and the
  line is cut into replicas of pp stages: whole replicas inside a site, and a replica that
  straddles two neighbours where a site's groups run out (a contiguous-block chain of at
  most `solver.max_sites_per_replica` sites, every stage in memory, as the exact search's
  chain types);
* waves are lit where the plan's traffic flows, one at a time on the busiest route
  (bytes / capacity), while the budget, the route's channels and both ends' power allow.

Local search then moves one wave at a time (add, remove, shift between routes) and keeps
a move when the evaluator's tie-break key improves (objective, then fewer waves, ...).

Every plan is scored by placer.evaluate alone: only plans the evaluator calls feasible are
returned, and their objective is the evaluator's, so the incumbent they seed is sound.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from placer import interrupt
from placer.evaluate import Evaluation, evaluate
from placer.io import Problem
from placer.network import RouteKey
from placer.optimize.data import config_plan
from placer.optimize.presolve import SiteCap
from placer.optimize.space import memory_fits
from placer.perf.step import Chain, Config, PerfModel
from placer.schema import Plan

# The work is counted, not timed, so that the plan found does not depend on the machine's
# load (repeat solves give the same incumbent); the time limit only caps it.
MAX_CONFIGS = 24  # configurations (best bounds first) construction tries
MAX_PLANS = 12  # ... or stops once this many gave a plan
MAX_MOVES = 80  # evaluations of local-search moves
TIME_SHARE = 0.25  # at most this share of the time limit, whatever the counts
MAX_WAVE_STEPS = 4096  # waves the construction lights one by one (then it stops adding)
EARLY_TRIES = 8  # constructions per bounded chunk while the bounding pass goes on (first_plan)

Key = Callable[[Evaluation, Plan, Config], tuple[Any, ...]]


@dataclass
class Found:
    cfg: Config
    plan: Plan
    ev: Evaluation
    key: tuple[Any, ...]
    eval_s: float = 0.0  # one evaluation's wall time (the driver's reserve for the final one)


def heuristic_plans(
    problem: Problem,
    perf: PerfModel,
    cfgs: list[Config],
    caps: dict[str, SiteCap],
    key: Key,
    deadline: float,
    time_limit_s: float,
) -> list[Found]:
    """Feasible plans (evaluated), best key first: one per configuration that construction
    could place, the best improved by local search."""
    hard = min(deadline, time.perf_counter() + TIME_SHARE * time_limit_s)
    found: list[Found] = []
    for i, cfg in enumerate(cfgs):
        now = time.perf_counter()
        if interrupt.requested() or len(found) >= MAX_PLANS or now > deadline:
            break
        # counted work; with no plan yet, on down the list up to the deadline itself
        if found and (i >= MAX_CONFIGS or now > hard):
            break
        f = _construct(problem, perf, cfg, caps, key)
        if f is not None:
            found.append(f)
    found.sort(key=lambda f: f.key)
    if found:
        found[0] = _local_search(problem, perf, found[0], key, hard)
        found.sort(key=lambda f: f.key)
    return found


def first_plan(
    problem: Problem,
    perf: PerfModel,
    cfgs: list[Config],
    caps: dict[str, SiteCap],
    key: Key,
    deadline: float,
) -> Found | None:
    """The first feasible construction among the first EARLY_TRIES of `cfgs` (one bounded
    chunk, best bounds first), no local search: a plan while the bounding pass goes on
    (a construction costs 10-30 ms on power-bound-8-sites, bounding all 1,522 of its
    configurations 6-12 s). Counted work, so the plan does not depend on the load."""
    for cfg in cfgs[:EARLY_TRIES]:
        if interrupt.requested() or time.perf_counter() > deadline:
            return None
        f = _construct(problem, perf, cfg, caps, key)
        if f is not None:
            return f
    return None


# ----------------------------------------------------------------------------- construction


def _construct(
    problem: Problem, perf: PerfModel, cfg: Config, caps: dict[str, SiteCap], key: Key
) -> Found | None:
    best: Found | None = None
    layouts = [place_replicas(problem, perf, cfg, caps), whole_replicas(problem, perf, cfg, caps)]
    for i, counts in enumerate(layouts):
        if counts is None or counts in layouts[:i]:
            continue
        plan = _plan(problem, perf, cfg, counts, {})
        t_eval = time.perf_counter()
        ev = evaluate(problem, plan, perf)
        eval_s = time.perf_counter() - t_eval
        waves = _light_waves(problem, perf, cfg, counts, ev)
        if waves:
            plan = _plan(problem, perf, cfg, counts, waves)
            ev = evaluate(problem, plan, perf)
        if ev.feasible:
            f = Found(cfg, plan, ev, key(ev, plan, cfg), eval_s)
            if best is None or f.key < best.key:
                best = f
    return best


def whole_replicas(
    problem: Problem, perf: PerfModel, cfg: Config, caps: dict[str, SiteCap]
) -> Counter[Chain] | None:
    """dp replicas each inside one site (no pipeline traffic on the WAN), fastest sites
    first, each site charged one coherent module (the plan spans sites), or None when the
    sites' whole replicas fall short. The line of place_replicas fills every site's last
    groups with straddling replicas, whose pipeline crosses a route: on power-bound-8-sites
    tp8-pp20-dp512 two straddling replicas took 13.72 s where whole ones take 13.42 s."""
    inst = problem.instance
    usable = [s for s, c in caps.items() if c.groups(cfg.tp, connected=True, width=cfg.width)]
    whole = {
        s: caps[s].groups(cfg.tp, connected=True, width=cfg.width) // cfg.pp
        for s in usable
        if all(memory_fits(problem, cfg, k, inst.site(s).gpu)[0] for k in range(cfg.pp))
    }
    speed = {s: _slowest_stage(perf, cfg, caps[s].gpu) for s in whole}
    counts: Counter[Chain] = Counter()
    left = cfg.dp
    for s in sorted(whole, key=lambda s: (speed[s], -whole[s], s)):
        n = min(whole[s], left)
        if n:
            counts[(s,) * cfg.pp] = n
            left -= n
    return counts if left == 0 else None


def place_replicas(
    problem: Problem, perf: PerfModel, cfg: Config, caps: dict[str, SiteCap]
) -> Counter[Chain] | None:
    """Replica chains holding dp replicas within the power-fed groups, or None."""
    inst = problem.instance
    k_max = inst.solver.max_sites_per_replica
    need = cfg.pp * cfg.dp
    fits: dict[tuple[int, str], bool] = {}

    def fit(k: int, site: str) -> bool:
        if (k, site) not in fits:
            fits[(k, site)] = memory_fits(problem, cfg, k, inst.site(site).gpu)[0]
        return fits[(k, site)]

    usable = [s for s, c in caps.items() if c.groups(cfg.tp, width=cfg.width) > 0]
    speed = {s: _slowest_stage(perf, cfg, caps[s].gpu) for s in usable}
    # one site alone, fastest first
    for s in sorted(usable, key=lambda s: (speed[s], -caps[s].groups(cfg.tp, width=cfg.width), s)):
        if caps[s].groups(cfg.tp, width=cfg.width) >= need and all(
            fit(k, s) for k in range(cfg.pp)
        ):
            return Counter({(s,) * cfg.pp: cfg.dp})
    # several sites: each charged one coherent module (presolve.SiteCap.connected_nodes)
    groups = {s: caps[s].groups(cfg.tp, connected=True, width=cfg.width) for s in usable}
    full = [s for s in usable if groups[s] > 0 and all(fit(k, s) for k in range(cfg.pp))]
    partial = [s for s in usable if groups[s] > 0 and s not in full]
    order = sorted(full, key=lambda s: (speed[s], -groups[s], s)) + sorted(
        partial, key=lambda s: (speed[s], -groups[s], s)
    )
    chosen: list[str] = []
    for s in order:
        if sum(groups[x] for x in chosen) >= need:
            break
        chosen.append(s)
    # leftovers that no chain can use make the line fall short: add sites until it fits
    for extra in range(len(order) - len(chosen) + 1):
        line = _line(perf, chosen + order[len(chosen) : len(chosen) + extra])
        counts = _cut_line(cfg, line, groups, fit, k_max, perf)
        if counts is not None:
            return counts
    return None


def _slowest_stage(perf: PerfModel, cfg: Config, gpu: str) -> float:
    return max(t.fwd + t.bwd for t in perf.stage_times(cfg, gpu))


def _line(perf: PerfModel, sites: list[str]) -> list[str]:
    """The sites in nearest-neighbour order by fiber latency, from the fastest."""
    if not sites:
        return []
    line, rest = [sites[0]], list(sites[1:])
    while rest:
        last = line[-1]
        nxt = min(
            rest,
            key=lambda s: (
                perf.net.path_latency_s(last, s)
                if perf.net.path(last, s) is not None
                else math.inf,
                rest.index(s),
            ),
        )
        line.append(nxt)
        rest.remove(nxt)
    return line


def _cut_line(
    cfg: Config,
    line: list[str],
    groups: dict[str, int],
    fit: Callable[[int, str], bool],
    k_max: int,
    perf: PerfModel,
) -> Counter[Chain] | None:
    """Cut the line's groups into dp replicas of pp consecutive stages: whole replicas
    inside a site, a straddling replica where a site runs out (at most k_max sites)."""
    pp, left = cfg.pp, cfg.dp
    counts: Counter[Chain] = Counter()
    open_chain: list[str] = []
    for s in line:
        if left == 0:
            break
        free = groups[s]
        if open_chain:
            take = min(free, pp - len(open_chain))
            ks = range(len(open_chain), len(open_chain) + take)
            if (
                len(set(open_chain)) < k_max
                and perf.net.path(open_chain[-1], s) is not None
                and all(fit(k, s) for k in ks)
            ):
                open_chain += [s] * take
                free -= take
                if len(open_chain) == pp:
                    counts[tuple(open_chain)] += 1
                    left -= 1
                    open_chain = []
            else:
                open_chain = []
        if open_chain or left == 0:
            continue  # the site's groups all went to the straddling replica
        if all(fit(k, s) for k in range(pp)):
            n = min(free // pp, left)
            if n:
                counts[(s,) * pp] += n
                left -= n
                free -= n * pp
        if left and free and k_max >= 2:
            start = min(free, pp - 1)
            if all(fit(k, s) for k in range(start)):
                open_chain = [s] * start
    return counts if left == 0 else None


def _light_waves(
    problem: Problem,
    perf: PerfModel,
    cfg: Config,
    counts: Counter[Chain],
    ev: Evaluation,
) -> dict[RouteKey, int]:
    """Waves on the routes the plan loads, one at a time on the busiest route, while the
    budget, the channels and the power at both ends allow."""
    net, inst = perf.net, problem.instance
    step = ev.step
    if step is None:
        return {}
    load: dict[RouteKey, float] = {}
    for r, b in {**step.route_pp_load}.items():
        load[r] = load.get(r, 0.0) + b
    for r, b in step.route_dp_load.items():
        load[r] = load.get(r, 0.0) + b
    load = {r: b for r, b in load.items() if b > 0}
    if not load:
        return {}
    budget = inst.objective.max_cost_usd
    spare = {}
    for s in inst.sites:
        if s.power_mw is None:
            spare[s.name] = math.inf
        else:
            spare[s.name] = s.power_mw * 1e6 - ev.power_mw.get(s.name, 0.0) * 1e6
    optic = {r: net.default_optic(r) for r in load}
    waves = {r: 0 for r in load}
    capex = 0.0
    for _ in range(MAX_WAVE_STEPS):
        best, best_t = None, 0.0
        for r in sorted(load):
            o = optic[r]
            if o is None or waves[r] >= net.max_waves(r, o):
                continue
            cap = net.capacity_Bps(r, waves[r], o)
            t = load[r] / cap if cap > 0 else math.inf
            if t > best_t:
                best, best_t = r, t
        if best is None:
            break
        o = optic[best]
        assert o is not None
        extra = net.link_capex_usd(best, waves[best] + 1, o) - net.link_capex_usd(
            best, waves[best], o
        )
        module = problem.catalog.optics[o].module_w
        ends_w = {s: module * inst.site(s).pue for s in best}
        if (budget is not None and capex + extra > budget * (1 + 1e-9)) or any(
            spare[s] < w for s, w in ends_w.items()
        ):
            load.pop(best)  # this route can take no more; the others still may
            if not load:
                break
            continue
        waves[best] += 1
        capex += extra
        for s, w in ends_w.items():
            spare[s] -= w
        # stop once the busiest route is well under the pipeline's own time
        if best_t < 1e-3 * max(step.pipe_s, 1e-9):
            break
    return {r: w for r, w in waves.items() if w > 0}


def _plan(
    problem: Problem,
    perf: PerfModel,
    cfg: Config,
    counts: Counter[Chain],
    waves: dict[RouteKey, int],
) -> Plan:
    links = [
        {"sites": list(r), "waves": w, "optic": perf.net.default_optic(r)}
        for r, w in sorted(waves.items())
        if w > 0
    ]
    groups = [
        {"count": n, "stage_sites": list(c)}
        for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if n > 0
    ]
    return config_plan(problem, cfg, groups, links, [])


# ----------------------------------------------------------------------------- local search


def _local_search(problem: Problem, perf: PerfModel, start: Found, key: Key, until: float) -> Found:
    """One-wave moves (add, remove, shift between two routes of the plan), first
    improvement, until no move improves the key or the time is up."""
    net = perf.net
    best = start
    counts = Counter({tuple(g.stage_sites): g.count for g in best.plan.replica_groups})
    routes = sorted(net.routes)
    improved = True
    budget = MAX_MOVES
    while improved:
        improved = False
        waves = {link.key: link.waves for link in best.plan.links}
        moves: list[dict[RouteKey, int]] = []
        for r in sorted(waves):
            moves.append({**waves, r: waves[r] - 1})
        for r in routes:
            o = net.default_optic(r)
            if o is not None and waves.get(r, 0) < net.max_waves(r, o):
                moves.append({**waves, r: waves.get(r, 0) + 1})
        for a in sorted(waves):
            for b in routes:
                o = net.default_optic(b)
                if b != a and o is not None and waves.get(b, 0) < net.max_waves(b, o):
                    moves.append({**waves, a: waves[a] - 1, b: waves.get(b, 0) + 1})
        for mv in moves:
            if budget <= 0 or time.perf_counter() > until or interrupt.requested():
                return best
            budget -= 1
            plan = _plan(problem, perf, best.cfg, counts, {r: w for r, w in mv.items() if w > 0})
            ev = evaluate(problem, plan, perf)
            if not ev.feasible:
                continue
            k = key(ev, plan, best.cfg)
            if k < best.key:
                best = Found(best.cfg, plan, ev, k, best.eval_s)
                improved = True
                break
    return best
