"""Outer search: configurations in lower-bound order, an exact inner solve for each,
pruning by bound against the incumbent, and evaluation of every plan before it is kept.

Optimality: a configuration is either solved to optimality by the backend or pruned
because its lower bound (the fastest chain it admits, plus the intra-site sync that the
pigeonhole principle forces) is no better than the incumbent. The reported bound is the
smallest objective any unresolved configuration could still reach.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from placer import interrupt
from placer.diagnostics import instance_warnings, plan_warnings
from placer.errors import (
    InfeasibleError,
    InputError,
    ModelMismatchError,
    PlacerError,
    SearchInterrupted,
    TimeLimitError,
)
from placer.evaluate import Evaluation, completed_plan, evaluate
from placer.io import Problem
from placer.network import RouteKey
from placer.optimize import deadline as dl
from placer.optimize.brute import brute_inner
from placer.optimize.canonical import canonical_routing_plan, routed_pairs
from placer.optimize.capacity import capacity_bound
from placer.optimize.contention import add_violated_planes
from placer.optimize.cpsat import CpsatInner
from placer.optimize.data import InnerData, InnerSolution, NoPlan, build_inner, solution_plan
from placer.optimize.explain import explain_infeasible
from placer.optimize.families import tiebreak_key
from placer.optimize.greedy import greedy
from placer.optimize.heuristic import first_plan, heuristic_plans
from placer.optimize.milp import MilpInner
from placer.optimize.presolve import SiteCap, presolve, site_caps, tighten
from placer.optimize.quiet import absorb_highs_banner
from placer.optimize.space import (
    SpaceReport,
    _check_chain_space,
    chain_types,
    enumerate_configs,
    memory_gap_gb,
    site_group_capacity,
    stage_memory_gb,
)
from placer.optimize.splits import rest_lower_bound_s
from placer.optimize.warmstart import hint_from_plan, start_values
from placer.perf.critical_path import critical_path
from placer.perf.pipeline import one_f_one_b_time
from placer.perf.step import Config, PerfModel
from placer.rules import energy_usd_per_j, replica_slots, site_gpus_per_node, site_power_w
from placer.schema import MAX_THREADS, Plan

# slow_slot_bound: at most this many sets of slow ranks evaluated (1F1B each) per
# configuration; past it the set size is lowered (a weaker, still valid bound). A cost
# limit of the bounding pass, not a measured quantity
SLOW_SETS = 64
GREEDY_CONFIGS = 4  # configurations (best bounds first) that get a greedy incumbent
FINISH_RESERVE_S = 1.0  # of the time limit, for the final evaluation (capped at 2% of it)
MIN_LIMIT_S = 0.05  # what a command whose start-up used its whole limit still gives the search
AGREEMENT_REL = 1e-5  # backend objective vs evaluator (CP-SAT works on a 1e-9 time grid)

Progress = Callable[[str], None]


@dataclass
class Candidate:
    cfg: Config
    lower_bound: float
    data: InnerData | None = None
    # bound only: the layer splits of this shape that were not enumerated
    # (placer.optimize.splits); never solved, its bound stays open unless pruned
    rest: bool = False
    # the search order: the pipeline bound without the power caps (slow_slot_bound), at
    # most lower_bound. Ordering by the raised bound put configurations that the fast
    # GPUs cannot hold after worse ones, and the incumbent came late (three-sites-80-300-
    # 500km: 118 s on one configuration, against 7 s)
    order: float | None = None
    # bounded without the power caps' slow-slot and capacity bounds (the first, cheap pass
    # of _prepare_until): lower_bound is the plain bound, valid but weaker, until refined
    pending: bool = False
    dropped: bool = False  # refined above objective.max_step_time_s: not a candidate

    def key(self) -> tuple[float, bool, str]:
        return (self.lower_bound if self.order is None else self.order, self.rest, self.cfg.label())


@dataclass
class SolveResult:
    plan: Plan
    evaluation: Evaluation
    status: str
    objective: float
    bound: float
    gap: float
    seconds: float
    backend: str
    configs_total: int
    configs_solved: int


def _objective_value(objective: str, ev: Evaluation) -> float:
    return {
        "step_time": ev.step_time_s,
        "cost": ev.capex_usd,
        "cost_per_token": ev.cost_per_token_usd,
    }[objective]


def _tiebreak(objective: str, ev: Evaluation, plan: Plan, cfg: Config) -> tuple[Any, ...]:
    waves = sum(link["waves"] for link in ev.links)
    sites = sum(1 for g in ev.gpus_by_site.values() if g > 0)
    paths = sum(len(entry.paths) - 1 for entry in plan.routing)
    return tiebreak_key(_objective_value(objective, ev), waves, sites, paths, cfg.label())


BACKENDS = ("cpsat", "milp", "brute")
RATE_STEP = 1e-6  # the cost-per-token walk's next cost-rate cap is this much (relative) lower


def check_solver_options(
    time_limit_s: Any, threads: Any, names: tuple[str, str] = ("time_limit_s", "threads")
) -> None:
    """Range checks of the run options (the CLI passes its option names): a finite positive
    time limit, and 1 to MAX_THREADS threads. Either may be None (the instance's setting)."""
    if time_limit_s is not None and (
        isinstance(time_limit_s, bool)
        or not isinstance(time_limit_s, int | float)
        or not math.isfinite(time_limit_s)
        or time_limit_s <= 0
    ):
        raise InputError(
            f"{names[0]}: must be a finite number of seconds > 0, got {time_limit_s!r}"
        )
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS
    ):
        raise InputError(f"{names[1]}: must be an integer from 1 to {MAX_THREADS}, got {threads!r}")


def solve(
    problem: Problem,
    backend: str | None = None,
    time_limit_s: float | None = None,
    threads: int | None = None,
    progress: Progress | None = None,
    _nested: bool = False,
    deadline_at: float | None = None,
) -> SolveResult:
    """The best plan within the time limit. `deadline_at` (a time.perf_counter() instant,
    the CLI's: its start plus the limit, less what writing the outputs needs) makes the
    limit count from there, so that the whole command stays within it."""
    check_solver_options(time_limit_s, threads)
    asked_s = time_limit_s if time_limit_s is not None else problem.instance.solver.time_limit_s
    if deadline_at is not None:
        time_limit_s = min(asked_s, max(MIN_LIMIT_S, deadline_at - time.perf_counter()))
    if backend is not None and backend not in BACKENDS:
        raise InputError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    absorb_highs_banner()  # HiGHS' banner goes to stderr, never onto stdout (CONTRACT section 4)
    inst = problem.instance
    opts = inst.solver
    if inst.objective.within_fastest is not None and not _nested:
        from placer.optimize.lexicographic import solve_within_fastest

        return solve_within_fastest(
            solve,
            problem,
            backend,
            time_limit_s if time_limit_s is not None else opts.time_limit_s,
            threads,
            progress,
        )
    backend = backend or opts.backend
    time_limit_s = time_limit_s if time_limit_s is not None else opts.time_limit_s
    threads = threads if threads is not None else opts.threads
    objective = inst.objective.minimize
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    # keep back a little of the limit for evaluating and completing the final plan, so
    # that the whole call, not just the search, stays within time_limit_s
    deadline = t0 + time_limit_s - min(FINISH_RESERVE_S, 0.02 * time_limit_s)
    perf = PerfModel(problem)
    report = SpaceReport()
    configs = enumerate_configs(problem, report, perf)
    # presolve: each site's GPUs capped by power and memory; configurations no set of sites
    # can power are dropped, and with none left the binding resource is reported at once
    caps = site_caps(problem, perf.net)
    powered = presolve(problem, configs, caps, report)

    best: tuple[tuple[Any, ...], Plan, Evaluation, Config] | None = None
    best_sol: InnerSolution | None = None  # the backend's answer behind `best`, if any
    ties: tuple[InnerData, InnerSolution, Any] | None = None  # its ties, not broken yet
    finish_s = 0.0  # time kept back for evaluating, completing and writing the final plan

    def offer(plan: Plan, ev: Evaluation, cfg: Config, source: str) -> None:
        """A plan the evaluator already accepted (the heuristic's) competes as is."""
        nonlocal best, best_sol
        key = _tiebreak(objective, ev, plan, cfg)
        if best is None or key < best[0]:
            best, best_sol = (key, plan, ev, cfg), None
            say(f"incumbent {source} {cfg.label()}: {_fmt(objective, key[0])}")

    def construct(cfgs: list[Config], chunk: str) -> bool:
        """The heuristic's first plan over `cfgs` offered as an incumbent; whether it gave one
        (its evaluation time, x3, is kept back for the final plan's)."""
        nonlocal finish_s
        f = first_plan(
            problem,
            perf,
            cfgs,
            caps,
            lambda ev, plan, cfg: _tiebreak(objective, ev, plan, cfg),
            deadline,
        )
        if f is None:
            return False
        offer(f.plan, f.ev, f.cfg, f"heuristic ({chunk})")
        finish_s = max(finish_s, 3 * f.eval_s)
        return True

    def early(new: list[Candidate]) -> None:
        """A plan while the bounding pass goes on: the heuristic's construction on the
        first chunks' candidates until one gives a plan (counted work; the bounds and the
        search are unchanged, the plan only seeds the incumbent)."""
        if best is not None or interrupt.requested():
            return
        t_h = time.perf_counter()
        if construct([c.cfg for c in _by_bound(new) if not c.rest], "first chunk"):
            say(f"first plan in {time.perf_counter() - t_h:.2f} s, bounding goes on")

    def refined(new: list[Candidate]) -> None:
        """A refined chunk (raised bounds, sorted) whose best bound is below the incumbent:
        its first construction may beat the incumbent, and a better incumbent ends the
        refinement sooner (_prepare_until)."""
        if best is None or interrupt.requested() or not new:
            return
        if objective == "cost" or new[0].lower_bound >= best[0][0] * (1 - 1e-9):
            return
        construct(
            [c.cfg for c in new if not c.rest and c.lower_bound < best[0][0]], "refined chunk"
        )

    # bounding stops at a share of the limit, so that the heuristic and the search get the
    # rest; configurations left unbounded stay open with the trivial bound 0
    # (a share of what is left once enumeration and presolve are done: on a slow or loaded
    # machine they can take most of a short limit)
    t_bound = time.perf_counter()
    cands, unbounded = _prepare_until(
        problem,
        perf,
        powered,
        report,
        objective,
        t_bound + PREPARE_SHARE * (deadline - t_bound),
        deadline,
        caps,
        early,
        lambda: best[0][0] if best is not None and objective != "cost" else None,
        refined,
    )
    if unbounded:
        say(f"time limit: {unbounded} configurations left unbounded (bound 0)")
    say(
        f"{len(configs)} configurations, {len(powered)} after the power and memory presolve, "
        f"{len(cands)} after bound pruning"
    )

    def consider(data: InnerData, sol: InnerSolution, source: str) -> None:
        nonlocal best, best_sol, finish_s
        t_eval = time.perf_counter()
        plan = solution_plan(problem, data, sol)
        ev = evaluate(problem, plan, perf)
        finish_s = max(
            finish_s, 3 * (time.perf_counter() - t_eval)
        )  # the final plan is evaluated again
        if not ev.feasible:
            if source in {"greedy", "greedy-nowaves"}:
                return
            if not sol.optimal:
                # a time-limited incumbent of the solver, integral only to its tolerance (a
                # MILP seen carrying traffic on a route whose wave option was 1e-6 lit):
                # not a claim; the configuration is already counted open with its bound
                say(f"{backend}: unproven plan of {data.cfg.label()} rejected by the evaluator")
                return
            raise ModelMismatchError(
                f"{backend} returned a plan the evaluator rejects ({data.cfg.label()}): "
                + "; ".join(str(v) for v in ev.violations)
            )
        if source not in {"greedy", "greedy-nowaves"} and sol.step_time_s is not None:
            diff = ev.step_time_s - sol.step_time_s
            # an optimal backend's step time equals the evaluator's; a feasible one bounds it
            # (with another objective the model's step time is only bounded from below)
            if diff > AGREEMENT_REL * ev.step_time_s + 1e-9 or (
                sol.optimal
                and objective == "step_time"
                and -diff > AGREEMENT_REL * ev.step_time_s + 1e-9
            ):
                raise ModelMismatchError(
                    f"{backend} step time {sol.step_time_s:.9g} s != evaluator {ev.step_time_s:.9g} s "  # noqa: E501
                    f"for {data.cfg.label()}"
                )
        key = _tiebreak(objective, ev, plan, data.cfg)
        if best is None or key < best[0]:
            best, best_sol = (key, plan, ev, data.cfg), sol
            say(f"incumbent {source} {data.cfg.label()}: {_fmt(objective, key[0])}")

    # a plan first (placer.optimize.heuristic): greedy construction and local search, every
    # plan checked by the evaluator; it seeds the incumbent, so a time limit returns a plan
    if cands and not interrupt.requested():
        t_h = time.perf_counter()
        found = heuristic_plans(
            problem,
            perf,
            [c.cfg for c in _by_bound(cands)],
            caps,
            lambda ev, plan, cfg: _tiebreak(objective, ev, plan, cfg),
            deadline,
            time_limit_s,
        )
        for f in found:
            offer(f.plan, f.ev, f.cfg, "heuristic")
            finish_s = max(finish_s, 3 * f.eval_s)
        say(f"heuristic: {len(found)} plan(s) in {time.perf_counter() - t_h:.2f} s")

    # greedy incumbent over the most promising configurations
    last_build_s = 0.0  # the slowest model build so far, to avoid starting one that cannot finish
    for cand in [c for c in cands if not c.rest][:GREEDY_CONFIGS]:
        if time.perf_counter() + 1.5 * last_build_s + finish_s > deadline or interrupt.requested():
            break
        t_build = time.perf_counter()
        try:
            with dl.until(deadline - finish_s):
                cand.data = build_inner(
                    problem, perf, cand.cfg, chain_types(problem, perf, cand.cfg)
                )
        except dl.DeadlinePassed:
            break
        tighten(cand.data, caps)
        last_build_s = max(last_build_s, time.perf_counter() - t_build)
        g = greedy(cand.data) if cand.data.chains else None
        if g is not None:
            consider(cand.data, g, "greedy")
            consider(cand.data, InnerSolution(g.counts, {}, math.inf, 0.0, False), "greedy-nowaves")

    solved = 0
    unproven = 0  # configurations the time limit ended before the solver proved them
    rest_open = 0  # of which: layer splits left out of the enumeration (stage_layers: all)
    open_bounds: list[float] = [0.0] if unbounded else []
    timed_out = bool(unbounded)
    stopped = interrupt.requested()  # SIGINT/SIGTERM: keep the incumbent, report it feasible
    # the smallest bound from each position on (the order key is not the bound)
    suffix_min = [math.inf] * (len(cands) + 1)
    for j in range(len(cands) - 1, -1, -1):
        suffix_min[j] = min(cands[j].lower_bound, suffix_min[j + 1])
    for i, cand in enumerate(cands):
        inc = best[0][0] if best else None
        if objective != "cost" and inc is not None and cand.key()[0] >= inc * (1 - 1e-9):
            break  # sorted by a key no bound is below: every remaining one is pruned
        if objective != "cost" and inc is not None and cand.lower_bound >= inc * (1 - 1e-9):
            continue  # pruned by its own bound
        if objective == "cost" and inc is not None and inc <= 0:
            break
        remaining = deadline - finish_s - time.perf_counter()
        if remaining <= 0 or stopped:
            timed_out = not stopped
            open_bounds.extend(c.lower_bound for c in cands[i:])
            break
        if cand.rest:
            # splits left out of the enumeration could still beat the incumbent
            unproven += 1
            rest_open += 1
            open_bounds.append(cand.lower_bound)
            bound_text = _fmt(objective, cand.lower_bound)
            say(f"[{i + 1}/{len(cands)}] {cand.cfg.label()}: other splits, bound {bound_text}")
            continue
        if cand.data is None and remaining < 1.5 * last_build_s:
            timed_out = True  # building this model alone would overrun the limit
            open_bounds.extend(c.lower_bound for c in cands[i:])
            break
        t_build = time.perf_counter()
        if cand.data is None:
            try:
                with dl.until(deadline - finish_s):
                    cand.data = build_inner(
                        problem, perf, cand.cfg, chain_types(problem, perf, cand.cfg)
                    )
            except dl.DeadlinePassed:  # the limit struck inside the build: still open
                stopped = interrupt.requested()
                timed_out = not stopped
                open_bounds.extend(c.lower_bound for c in cands[i:])
                break
            tighten(cand.data, caps)
        data = cand.data
        last_build_s = max(last_build_s, time.perf_counter() - t_build)
        if not data.chains:  # stage_hosts' superset admitted it; no chain type exists
            solved += 1
            continue
        remaining = deadline - finish_s - time.perf_counter()
        hint = None  # the incumbent's plan, when it is of this configuration, as a start
        if best is not None and best[3] == cand.cfg:
            hint = hint_from_plan(
                data,
                {tuple(g.stage_sites): g.count for g in best[1].replica_groups},
                {link.key: link.waves for link in best[1].links},
            )
        deferred: list[Any] = []
        res = _solve_inner(
            problem,
            perf,
            data,
            backend,
            objective,
            inc,
            remaining,
            threads,
            opts,
            best,
            hint,
            deferred,
        )
        solved += 1
        sol = res if isinstance(res, InnerSolution) else None
        stopped = interrupt.requested()
        if isinstance(res, NoPlan) and not res.proven:
            # the time limit (or a stop request) ended this configuration without a plan:
            # what it could still reach stays in the global bound (its own bound, or the
            # solver's if tighter)
            unproven += 1
            open_bounds.append(
                cand.lower_bound if res.bound is None else max(cand.lower_bound, res.bound)
            )
        if sol is not None:
            if not sol.optimal:
                unproven += 1
                open_bounds.append(max(cand.lower_bound, sol.bound))
            consider(data, sol, backend)
            if deferred and best_sol is sol:  # its ties are broken if it stays the incumbent
                ties = (data, sol, deferred[0])
        nxt = suffix_min[i + 1]
        inc = best[0][0] if best else math.inf
        say(
            f"[{i + 1}/{len(cands)}] {cand.cfg.label()}: "
            + (
                _fmt(objective, sol.objective)
                if sol is not None
                else "no better plan"
                if res.proven
                else f"{res.reason or 'time limit'}, no plan yet"
            )
            + (
                f"; incumbent {_fmt(objective, inc)}, bound {_fmt(objective, min([inc, nxt, *open_bounds]))}"  # noqa: E501
                if objective != "cost" and math.isfinite(inc)
                else ""
            )
        )

    seconds = time.perf_counter() - t0
    if best is None and stopped:
        raise SearchInterrupted(f"interrupted by {stopped} before any feasible plan was found")
    if best is None:
        if unproven and unproven == rest_open and not timed_out:
            raise TimeLimitError(  # nothing proves infeasibility: not exit 3
                "no feasible plan among the candidate layer splits, and with job.parallelism."
                "stage_layers: all the other splits are too many to search one by one; list "
                "the splits to try in job.parallelism.stage_layers"
            )
        if timed_out or unproven:
            search = (
                f" ({time_limit_s:.3g} s of it for the search)" if asked_s != time_limit_s else ""
            )
            raise TimeLimitError(
                f"time limit {asked_s:g} s{search} reached before any feasible plan was found"
            )
        raise InfeasibleError(explain_infeasible(problem, perf, report, cands))
    if ties is not None and best_sol is ties[1] and not stopped:
        # the final plan's configuration breaks its ties now (deferred in the search)
        broken = _break_ties(
            problem, perf, ties, objective, deadline - finish_s, backend, best[2].step_time_s
        )
        if broken is not None:
            best = broken
    if not stopped:  # repeatable routing: the flows solved again from the decisions
        canon = _canonical(problem, perf, cands, best, objective, deadline - time.perf_counter())
        if canon is not None:
            best = canon
    _, plan, ev, cfg = best
    value = _objective_value(objective, ev)
    bound = min([value, *open_bounds])
    gap = 0.0 if value <= 0 else max(0.0, (value - bound) / value)
    # optimal only when every configuration was solved to optimality, proved to have
    # nothing better, or pruned by a valid bound no lower than the plan's value
    status = (
        "optimal"
        if gap <= 1e-9 and not timed_out and not stopped
        else ("time_limit" if timed_out else "feasible")
    )
    bound_T = bound if objective == "step_time" else None
    final = completed_plan(
        problem,
        plan,
        ev,
        status=status,
        solver={
            "backend": backend,
            "seconds": round(seconds, 3),
            "gap": gap,
            "bound_step_time_s": bound_T if bound_T is not None else ev.step_time_s,
            "status": status,
            "configs_total": len(configs),
            "configs_solved": solved,
            "objective": value,
            "bound": bound,
            "splits": splits_searched(report),
        },
    )
    res = inst.resilience
    if res is not None and res.survive and not _nested and not stopped:
        left = deadline - time.perf_counter()  # no floor: the summary never overruns the limit
        summary = resilience_summary(problem, final, backend, left, threads)
        final = final.model_copy(update={"resilience": summary})
    if not _nested:
        with dl.until(deadline):  # the failure analysis of the warnings is long
            found_warnings = instance_warnings(problem) + plan_warnings(problem, final, ev)
        final = final.model_copy(update={"warnings": found_warnings})
    return SolveResult(final, ev, status, value, bound, gap, seconds, backend, len(configs), solved)


def _by_bound(cands: list[Candidate]) -> list[Candidate]:
    """The heuristic's order: the raised bound first (the power caps' slow-slot and
    capacity bounds), then the search order. power-bound-8-sites: the plain bound puts
    tp8-pp20-dp1024 first (11.7 s), which half the replica stages must run on H100/H200
    (capacity bound 15.8 s); the configurations the B200 groups can hold (dp 512, bound
    13.35 s) came after the heuristic's 24 tries, and its plan was 23-26 s instead of 13.7 s.
    The exact search keeps the plain order (Candidate.order: three-sites-80-300-500km)."""
    return sorted(cands, key=lambda c: (c.lower_bound, c.key()))


TIE_ROUNDS = 8  # tie-breaks over grown planes before the plan found stands (_break_ties)


def _break_ties(
    problem: Problem,
    perf: PerfModel,
    ties: tuple[InnerData, InnerSolution, Any],
    objective: str,
    until: float,
    backend: str,
    value_s: float = math.inf,
) -> tuple[tuple[Any, ...], Plan, Evaluation, Config] | None:
    """The canonical plan among the ties of the final configuration's optimum (what the
    backend's tie-break solve gives: fewer waves, sites, paths; lower chain types), when it
    is priced exactly (no contention plane it violates) and the evaluator accepts it at the
    same value, no slower than the plan found (`value_s`: HiGHS' tie-break may take a plan
    up to TIE_TOL above the optimum, and the plan found is proven); None keeps that plan."""
    data, sol, model = ties
    for _ in range(TIE_ROUNDS):
        left = until - time.perf_counter()
        if left <= 0.05 or interrupt.requested():
            return None
        tied = model.break_ties(left)
        if tied is sol:
            return None
        plan = solution_plan(problem, data, tied)
        ev = evaluate(problem, plan, perf)
        if not ev.feasible:
            return None
        if data.planes is None or not _add_planes(problem, perf, data, tied, ev, until):
            break
        if not isinstance(model, MilpInner):  # CP-SAT breaks ties inside its rounds
            return None
        # the tie plan was under-priced: choose again over the planes it gained (a
        # canonical plan of fewer waves moves replicas to chain types the first round's
        # planes priced at their uncontended time: seed-1t-two-sites, branch repeats2)
        with dl.until(until):
            try:
                model = model.rebuilt()
            except dl.DeadlinePassed:
                return None
    else:
        return None
    if ev.step_time_s > value_s * (1 + 1e-9):
        return None
    diff = ev.step_time_s - (tied.step_time_s if tied.step_time_s is not None else ev.step_time_s)
    if diff > AGREEMENT_REL * ev.step_time_s + 1e-9 or (
        tied.optimal and -diff > AGREEMENT_REL * ev.step_time_s + 1e-9
    ):  # as consider(): the backend's step time is the evaluator's
        raise ModelMismatchError(
            f"{backend} step time {tied.step_time_s:.9g} s != evaluator {ev.step_time_s:.9g} s "
            f"for {data.cfg.label()} (tie-break)"
        )
    return (_tiebreak(objective, ev, plan, data.cfg), plan, ev, data.cfg)


def _canonical(
    problem: Problem,
    perf: PerfModel,
    cands: list[Candidate],
    best: tuple[tuple[Any, ...], Plan, Evaluation, Config],
    objective: str,
    left_s: float,
) -> tuple[tuple[Any, ...], Plan, Evaluation, Config] | None:
    """The final plan with canonical routing (placer.optimize.canonical), when the
    evaluator accepts it and its tie-break key is no worse; None keeps the plan as is."""
    key, plan, _ev, cfg = best
    data = next((c.data for c in cands if c.cfg == cfg and c.data is not None), None)
    if data is None or not routed_pairs(data):
        return None
    try:
        with dl.until(time.perf_counter() + left_s):
            again = canonical_routing_plan(problem, data, plan, left_s, _upper_bound_time(data))
    except dl.DeadlinePassed:
        return None
    if again is None:
        return None
    ev = evaluate(problem, again, perf)
    if not ev.feasible:
        return None
    k = _tiebreak(objective, ev, again, cfg)
    return (k, again, ev, cfg) if k <= key else None


def _variant(problem: Problem, resilience: Any) -> Problem:
    from placer.io import problem_with

    return problem_with(problem, resilience=resilience)


def resilience_summary(
    problem: Problem, plan: Plan, backend: str, time_limit_s: float, threads: int | None
) -> dict[str, Any]:
    """Failure analysis of the resilient plan, and the spare waves the same guarantee costs
    under ring vs OptCC: each is solved again and compared with the plan solved without
    resilience (spare = waves with the guarantee - waves without it, per route). Each
    variant's solver status is recorded (`<variant>_status`, and `_gap` when not proven):
    the variants share what is left of the time limit."""
    from placer.resilience import failure_report

    res = problem.instance.resilience
    assert res is not None
    fr = failure_report(problem, evaluate(problem, plan, check_resilience=False))
    waves_of = lambda p: {"-".join(sorted(link.sites)): link.waves for link in p.links}  # noqa: E731
    out: dict[str, Any] = {
        "collective": res.collective,
        "survive": list(res.survive),
        "max_slowdown": res.max_slowdown,
        "failures": fr.to_dict(),
    }
    runs: dict[str, dict[str, int] | None] = {}
    for name, variant in (
        ("none", None),
        ("ring", {**res.model_dump(), "collective": "ring"}),
        ("optcc", {**res.model_dump(), "collective": "optcc"}),
    ):
        if variant is not None and variant["collective"] == res.collective:
            runs[name] = waves_of(plan)
            continue
        if time_limit_s / 3 < MIN_LIMIT_S:
            runs[name] = None
            out[f"{name}_error"] = "not solved: the time limit was used up"
            continue
        try:
            r = solve(
                _variant(problem, variant),
                backend=backend,
                time_limit_s=time_limit_s / 3,
                threads=threads,
                _nested=True,
            )
            runs[name] = waves_of(r.plan)
            # a variant ended by the time limit is a feasible plan, not the cheapest one:
            # its spare waves are then an upper bound, and say so
            out[f"{name}_status"] = r.status
            if r.status != "optimal":
                out[f"{name}_gap"] = r.gap
        except PlacerError as exc:
            runs[name] = None
            out[f"{name}_error"] = str(exc).splitlines()[0]
    base = runs["none"] or {}
    for name in ("ring", "optcc"):
        w = runs[name]
        if w is None:
            out[f"spare_waves_{name}"] = None
            continue
        keys = sorted(set(w) | set(base))
        out[f"spare_waves_{name}_by_route"] = {k: w.get(k, 0) - base.get(k, 0) for k in keys}
        out[f"spare_waves_{name}"] = sum(w.values()) - sum(base.values())
    out["waves_without_resilience"] = base
    return out


# of the time to the deadline, at most, for bounding configurations: a configuration left
# unbounded keeps bound 0, so the gap stays 1.0 whatever the search finds. 0.5 before;
# power-bound-8-sites needs 8-10 CPU s to bound its 1,522 configurations and is within
# 0.6% once they are (the heuristic's plan against the least bound), while its exact
# models take minutes each, so the share goes to the bounds. Instances whose bounding
# pass is short are unchanged.
PREPARE_SHARE = 0.75
PREPARE_CHUNK = 32  # configurations bounded between two looks at the clock


def _prepare_until(
    problem: Problem,
    perf: PerfModel,
    configs: list[Config],
    report: SpaceReport,
    objective: str,
    stop_at: float,
    deadline: float | None = None,
    caps: dict[str, SiteCap] | None = None,
    on_chunk: Callable[[list[Candidate]], None] | None = None,
    incumbent: Callable[[], float | None] | None = None,
    on_refined: Callable[[list[Candidate]], None] | None = None,
) -> tuple[list[Candidate], int]:
    """prepare_candidates in chunks until `stop_at`: the candidates bounded (sorted) and
    how many configurations were left unbounded. While no configuration has a candidate
    yet, bounding goes on up to `deadline` (without a candidate there is no plan to
    find). `on_chunk` sees each chunk's candidates (sorted) while more configurations
    remain to bound (the driver's first plan). A stop request raises as before.

    Two passes when the power caps are given: first every configuration's plain bound
    (pipeline, message floor, intra-site sync: about half the work), then the slow-slot
    and capacity bounds (refine_candidates) in the order of the plain bounds, smallest
    first, until `stop_at` or until the next plain bound is no better than the
    incumbent's value (`incumbent()`: those configurations are pruned by the plain bound
    already; power-bound-8-sites: 1,324 of its 1,522). A time limit inside the second
    pass leaves the rest with their plain bounds, not 0. `on_refined` sees each refined
    chunk (sorted by bound)."""
    cands: list[Candidate] = []
    done = 0
    two_pass = caps is not None and objective != "cost"
    try:
        while done < len(configs):
            until = stop_at if cands or deadline is None else deadline
            if time.perf_counter() > until:
                break
            chunk = configs[done : done + PREPARE_CHUNK]
            with dl.until(until):
                new = prepare_candidates(
                    problem, perf, chunk, report, objective, caps=caps, refine=not two_pass
                )
            cands += new
            done += len(chunk)
            if on_chunk is not None and new and done < len(configs):
                on_chunk(new)
        pending = sorted((c for c in cands if c.pending), key=lambda c: (c.lower_bound, c.key()))
        memo: dict[Config, tuple[float, float, float] | None] = {}
        i = 0
        while i < len(pending):
            inc = incumbent() if incumbent is not None else None
            if time.perf_counter() > stop_at or interrupt.requested():
                break
            if inc is not None and pending[i].lower_bound >= inc * (1 - 1e-9):
                break  # these and all later ones are pruned by their plain bounds
            chunk_c = pending[i : i + PREPARE_CHUNK]
            with dl.until(stop_at):
                refine_candidates(problem, perf, chunk_c, report, objective, caps, memo)  # type: ignore[arg-type]
            i += len(chunk_c)
            if on_refined is not None:
                on_refined(sorted((c for c in chunk_c if not c.dropped), key=_bound_key))
    except dl.DeadlinePassed:
        pass
    if interrupt.requested():
        raise SearchInterrupted(
            f"interrupted while preparing the search: {done} of {len(configs)} configurations bounded, no plan yet"  # noqa: E501
        )
    cands = [c for c in cands if not c.dropped]
    cands.sort(key=Candidate.key)
    return cands, len(configs) - done


def _bound_key(c: Candidate) -> tuple[Any, ...]:
    return (c.lower_bound, c.key())


def prepare_candidates(
    problem: Problem,
    perf: PerfModel,
    configs: list[Config],
    report: SpaceReport,
    objective: str,
    deadline: float | None = None,
    caps: dict[str, SiteCap] | None = None,
    refine: bool = True,
) -> list[Candidate]:
    """Chain types and a lower bound on step time per configuration, sorted by bound
    (with the sites' power caps, `caps`, the bound also counts the fast GPUs' groups;
    with `refine` False it does not yet, and the candidates are `pending`:
    refine_candidates raises their bounds)."""
    inst = problem.instance
    cands: list[Candidate] = []
    kinds = {s.name: (s.gpu, site_gpus_per_node(problem, s.name)) for s in inst.sites}
    reduced: dict[frozenset[str], set[str]] = {}
    same_bound: dict[Config, tuple[float, float, float] | None] = {}
    later = caps is not None and not refine and objective != "cost"
    for n, cfg in enumerate(configs):
        if deadline is not None and (time.perf_counter() > deadline or interrupt.requested()):
            raise (SearchInterrupted if interrupt.requested() else TimeLimitError)(
                f"stopped while preparing the search: {n} of {len(configs)} configurations bounded, no plan yet"  # noqa: E501
            )
        shape = bound_shape(cfg)
        if shape not in same_bound:
            same_bound[shape] = _pipe_intra_bound(
                problem, perf, cfg, report, kinds, reduced, None if later else caps
            )
        parts = same_bound[shape]
        if parts is None:
            report.drop("no stage placement fits in GPU memory")
            continue
        cand = _candidate(problem, perf, cfg, parts, objective, report)
        if cand is not None:
            cand.pending = later
            cands.append(cand)
    for cfg in report.unsearched:
        lb = rest_lower_bound_s(problem, perf, cfg, split_gpus(problem, cfg))
        if inst.objective.max_step_time_s is not None and lb > inst.objective.max_step_time_s:
            continue  # no split left out can meet the step-time limit
        if objective == "cost":
            lb = 0.0
        elif objective == "cost_per_token":
            lb = lb * min_usd_per_s(problem, cfg) / perf.tokens_per_step()
        cands.append(Candidate(cfg, lb, rest=True))
    cands.sort(key=Candidate.key)
    return cands


def _candidate(
    problem: Problem,
    perf: PerfModel,
    cfg: Config,
    parts: tuple[float, float, float],
    objective: str,
    report: SpaceReport,
) -> Candidate | None:
    """The candidate of a configuration from its bound parts (None: dropped, no plan
    within objective.max_step_time_s)."""
    limit = problem.instance.objective.max_step_time_s
    plain_pipe, lb_pipe, lb_intra = parts
    if limit is not None and lb_pipe + lb_intra > limit:
        report.drop_slow(lb_pipe + lb_intra)
        return None
    lb, order = lb_pipe + lb_intra, plain_pipe + lb_intra
    if objective == "cost":
        lb = order = 0.0
    elif objective == "cost_per_token":
        rate = min_usd_per_s(problem, cfg) / perf.tokens_per_step()
        lb, order = lb * rate, order * rate
    return Candidate(cfg, lb, order=order)


def refine_candidates(
    problem: Problem,
    perf: PerfModel,
    cands: list[Candidate],
    report: SpaceReport,
    objective: str,
    caps: dict[str, SiteCap],
    memo: dict[Config, tuple[float, float, float] | None] | None = None,
) -> None:
    """The bounds of `pending` candidates raised by the power caps (what prepare_candidates
    gives with them), in place; a candidate whose raised bound exceeds objective.
    max_step_time_s is marked `dropped`. `memo` shares the parts across calls (shape)."""
    kinds = {s.name: (s.gpu, site_gpus_per_node(problem, s.name)) for s in problem.instance.sites}
    reduced: dict[frozenset[str], set[str]] = {}
    memo = {} if memo is None else memo
    for cand in cands:
        if not cand.pending:
            continue
        shape = bound_shape(cand.cfg)
        if shape not in memo:
            memo[shape] = _pipe_intra_bound(
                problem, perf, cand.cfg, SpaceReport(), kinds, reduced, caps
            )
        parts = memo[shape]
        assert parts is not None  # the plain pass found a stage placement
        new = _candidate(problem, perf, cand.cfg, parts, objective, report)
        if new is None:
            cand.dropped = True
        else:
            cand.lower_bound, cand.order = max(cand.lower_bound, new.lower_bound), new.order
        cand.pending = False


def bound_shape(cfg: Config) -> Config:
    """The configuration with its sync policy (mode, bits, outer period) set to one value:
    the pipeline and intra-site bounds read none of them (the policy enters the step only
    through the WAN phase of the sync, placer.perf.step), so the configurations of every
    policy share one computation."""
    return replace(cfg, sync_mode="synchronous", sync_bits=16, every_steps=1)


def _pipe_intra_bound(
    problem: Problem,
    perf: PerfModel,
    cfg: Config,
    report: SpaceReport,
    kinds: dict[str, tuple[str, int]],
    reduced: dict[frozenset[str], set[str]],
    caps: dict[str, SiteCap] | None = None,
) -> tuple[float, float, float] | None:
    """(pipeline bound without and with the power caps, exposed intra-site sync bound) of
    a configuration, or None when no stage placement fits in GPU memory."""
    hosts = stage_hosts(problem, perf, cfg, report)
    if hosts is None:
        return None
    memo: dict[tuple[Any, ...], float] = {}
    all_hosts = hosts
    hosts = [_one_per_kind(kinds, h, reduced) for h in hosts]
    plain = lb_pipe = perf.pipeline_lower_bound(cfg, host_cover(hosts))
    if caps is not None:
        # the fastest GPUs cannot hold every stage: count every kind's groups too
        slow = slow_slot_bound(
            problem,
            perf,
            cfg,
            hosts,
            caps,
            lambda: capacity_bound(problem, perf, cfg, hosts, caps, kinds),
        )
        lb_pipe = max(lb_pipe, slow)
    lb_intra = 0.0
    if cfg.dp >= 2:  # every stage pays its data-parallel NIC phases at some host
        # some host holds at least ceil(dp / hosts) members; a site's NIC phase depends on
        # its count where node_fill applies (its ring of ceil(n / q) nodes, its fill)
        lb = [
            min(
                _intra(problem, perf, cfg, k, s, memo, n)
                for s in hosts[k]
                for n in _least_intra_members(cfg.dp, len(hosts[k]), perf.node_fill_q(cfg, s))
            )
            for k in range(cfg.pp)
        ]
        # the staggered pieces' sync is at least every stage's NIC phase from its release
        # (PerfModel.step, per release group: max_g I_g + R_g - T_pipe >= intra_k -
        # credit_k; a smaller bound than the unstaggered policies', so valid for them
        # too), the overlapped gather's at least every stage's past its first forward
        # (the staggered gather, likewise); what the overlap windows cannot hide. A
        # plan's credit (T_pipe - R_g) is at most its critical chain's tail, or head, plus
        # T_pipe - T_crit, and the step never falls when T_pipe grows against a fixed R
        # (the pieces' fractions sum to 1): so the step is at least the longest chain's
        # time (lb_pipe bounds it) plus the exposure at the longest tail or head the
        # hosts allow (offsets_bound_s). 0 without a stagger, as dp_release_s is.
        shape = bound_shape(cfg)  # shared by the shape's policies
        staggered = any(perf.dp_release_s(shape))
        rel = perf.offsets_bound_s(shape, all_hosts, "bwd") if staggered else (0.0,) * cfg.pp
        fill = perf.offsets_bound_s(shape, all_hosts, "fwd") if staggered else (0.0,) * cfg.pp
        # each credit as the step scales it (PerfModel.dp_credit_scale)
        at_sync, at_gather = perf.dp_credit_scale(cfg)
        sync = {
            True: max(t - at_sync * r for t, r in zip(lb, rel, strict=True)),
            False: max(t - at_gather * r for t, r in zip(lb, fill, strict=True)),
        }
        lb_intra = sum(
            max(0.0, f * sync[st] - w)
            for (f, w), st in zip(perf.dp_pieces(cfg), perf.dp_staggered(cfg), strict=True)
        )
    return plain, lb_pipe, lb_intra


def slow_slot_bound(
    problem: Problem,
    perf: PerfModel,
    cfg: Config,
    hosts: list[set[str]],
    caps: dict[str, SiteCap],
    other: Callable[[], float] | None = None,
) -> float:
    """A pipeline bound for configurations the fastest GPUs cannot hold alone (0 when they
    can), or the larger of it and `other()` (another bound, computed only when the fastest
    GPUs cannot hold alone: the capacity bound). F: the GPU types that give some model stage
    its fastest forward or backward (pipeline_lower_bound's choice). The pp x dp replica
    stages each take one TP group; when the sites of F-type GPUs have fewer powered groups
    than that, g, some replica runs at most f = floor(g / dp) of its pp ranks on F types
    (pigeonhole: the replicas' counts sum to at most g), so at least n = pp - f ranks on
    GPUs outside F. That replica's chain is at least the 1F1B time with those ranks at
    their fastest hosts outside F and every other rank at its fastest host, every pipeline
    message at PerfModel.message_floor (the makespan is non-decreasing in every stage and
    boundary time, as in pipeline_lower_bound); the bound is the least of these over the
    sets of n ranks that have a host outside F (n lowered, a weaker bound, until at most
    SLOW_SETS sets remain; n = 1 is the one slow stage of before)."""
    if cfg.dualpipev:
        return 0.0  # not formed for the V layout (a weaker bound: pipeline_lower_bound)
    inst = problem.instance
    v, pp = cfg.virtual_stages, cfg.pp
    gpu = {s.name: s.gpu for s in inst.sites}
    times = {
        x: perf.chunk_times(cfg, gpu[x]) for x in sorted(set().union(*hosts))
    }  # per host: every model stage's time on its GPU
    fwd, bwd, fast = [], [], set()
    for s in range(v * pp):
        opts = sorted(hosts[s % pp])
        f = min(opts, key=lambda x: (times[x][s].fwd, x))
        b = min(opts, key=lambda x: (times[x][s].bwd, x))
        fwd.append(times[f][s].fwd)
        bwd.append(times[b][s].bwd)
        fast |= {gpu[f], gpu[b]}
    fast_groups = sum(
        c.groups(cfg.tp, width=cfg.width) for x, c in caps.items() if gpu.get(x) in fast
    )
    if fast_groups >= pp * cfg.dp:
        return 0.0
    shard = cfg.dp if cfg.zero1 else 1
    opt = (
        max(min(perf.stage_times(cfg, gpu[x])[k].optimizer for x in hosts[k]) for k in range(pp))
        / shard
    )
    n_bound = pp - 1 if v == 1 else pp
    lat_f, tx_f = perf.message_floor(cfg, set().union(*hosts))  # as pipeline_lower_bound
    lat, tx = [lat_f] * n_bound, [tx_f] * n_bound
    m = cfg.num_micro_batches
    if v > 1 and m % pp:
        return 0.0  # no interleaved schedule: pipeline_lower_bound is already infinite
    slowed = []  # per rank k with a host outside F: its model stages' times there
    for k in range(pp):
        slow = [x for x in hosts[k] if gpu[x] not in fast]
        if slow:  # else stage k runs only on F types: not the slot outside F
            ks = range(k, v * pp, pp)  # rank k's model stages
            slowed.append(
                (
                    k,
                    {
                        s: (min(times[x][s].fwd for x in slow), min(times[x][s].bwd for x in slow))
                        for s in ks
                    },
                )
            )

    def makespan(f2: list[float], b2: list[float]) -> float:
        if v == 1:
            return one_f_one_b_time(f2, b2, lat, tx, m)
        return critical_path(f2, b2, lat, tx, m, v).makespan_s

    # at least n ranks of some replica outside F (fewer when fewer ranks can be: weaker)
    n = min(pp - fast_groups // cfg.dp, len(slowed))
    while n > 1 and math.comb(len(slowed), n) > SLOW_SETS:
        n -= 1
    sets = list(itertools.combinations(range(len(slowed)), n)) if n >= 1 else []
    cap = other() if other is not None else 0.0
    if other is not None and sets:
        # the makespan is a longest path that visits each of rank k's 2m operations at
        # most once, so slowing ranks adds at most m x their slow-minus-fast times: when
        # `other` is above that for some set, it is above this bound, and the 1F1B
        # evaluations are skipped (power-bound-8-sites: a fifth of the bounding pass)
        base = makespan(fwd, bwd)
        extra = [
            m * sum(ft - fwd[s] + bt - bwd[s] for s, (ft, bt) in d.items()) for _k, d in slowed
        ]
        ceiling = min(base + sum(extra[i] for i in c) for c in sets)
        if cap >= ceiling + opt:
            return cap
    best = math.inf
    for c in sets:
        f2, b2 = list(fwd), list(bwd)
        for i in c:
            for s, (ft, bt) in slowed[i][1].items():
                f2[s], b2[s] = ft, bt
        best = min(best, makespan(f2, b2) + opt)
    return max(cap, 0.0 if math.isinf(best) else best)


# what each split source's claim covers besides itself: every split includes the listed,
# candidate and even ones; the candidates include the even split
SPLIT_SOURCE_COVERS = {"all": {"listed", "candidates", "even"}, "candidates": {"even"}}


def splits_searched(report: SpaceReport) -> str | None:
    """plan.solver.splits: what `optimal` ranges over, the narrowest description that holds
    for every shape searched: one source, or several joined by `+` when shapes were searched
    differently (`listed+even`: the listed splits at v = 1, the even one at v > 1)."""
    sources = set(report.split_sources)
    # a source that covers another one present is not what holds for every shape
    narrowest = {
        s for s in sources if not any(o in SPLIT_SOURCE_COVERS.get(s, ()) for o in sources)
    }
    return "+".join(sorted(narrowest)) or None


def split_gpus(problem: Problem, cfg: Config) -> list[str]:
    """GPU types of the sites that can host a stage of the configuration."""
    return sorted(
        {s.gpu for s in problem.instance.sites if site_group_capacity(problem, s.name, cfg.tp)}
    )


EXACT_HOSTS_CHAINS = 1000  # up to this many chain types, a stage's hosts come from the chains


def stage_hosts(
    problem: Problem, perf: PerfModel, cfg: Config, report: SpaceReport
) -> list[set[str]] | None:
    """The sites that may host each stage (None: no chain type fits). Exact (the chain
    types') on small spaces; on large ones every site with a TP group whose GPU holds the
    stage, a superset, so the lower bounds built on it stay valid, without enumerating
    sites^K x pp chains for every configuration (34 s for the 200 configurations of the
    8-site power-bound instance)."""
    inst = problem.instance
    sites = [
        s.name for s in inst.sites if site_group_capacity(problem, s.name, cfg.tp, cfg.width) > 0
    ]
    _check_chain_space(len(sites), inst.solver.max_sites_per_replica, cfg.pp)  # bad input: refuse
    k_max = min(inst.solver.max_sites_per_replica, len(sites), cfg.pp)
    n_chains = sum(
        math.perm(len(sites), n) * math.comb(cfg.pp - 1, n - 1) for n in range(1, k_max + 1)
    )
    if n_chains <= EXACT_HOSTS_CHAINS:
        chains = chain_types(problem, perf, cfg, report)
        return [{c[k] for c in chains} for k in range(cfg.pp)] if chains else None
    gpu_of = {s: inst.site(s).gpu for s in sites}
    gpus = sorted(set(gpu_of.values()))
    hosts = []
    for k in range(cfg.pp):
        mem = stage_memory_gb(problem, cfg, k)  # once per stage, for every GPU type
        fit = set()
        for gpu in gpus:
            gap = memory_gap_gb(problem, mem, gpu)
            if gap <= 0:
                fit.add(gpu)
            elif gap < report.best_memory_gap_gb:
                report.best_memory_gap_gb = gap
                report.memory_example = (
                    f"{cfg.label()}: stage {k} on {gpu} needs {gap:.1f} GB more than it has"
                )
        hosts.append({s for s in sites if gpu_of[s] in fit})
    if any(not h for h in hosts):
        return None
    if _min_blocks(hosts, sites) > k_max:
        return None  # no chain of at most K blocks holds every stage
    return hosts


def _min_blocks(hosts: list[set[str]], sites: list[str]) -> int:
    """The fewest contiguous single-site blocks that cover the stages (greedy furthest
    reach, optimal for covering a line by runs; distinct sites and routes not required,
    so it never exceeds the true minimum of a chain type)."""
    k, blocks, pp = 0, 0, len(hosts)
    while k < pp:
        reach = k
        for s in sites:
            j = k
            while j < pp and s in hosts[j]:
                j += 1
            reach = max(reach, j)
        if reach == k:
            return pp + 1
        k, blocks = reach, blocks + 1
    return blocks


def _least_intra_members(dp: int, hosts: int, q: int) -> tuple[int | None, ...]:
    """Member counts whose PerfModel.intra_sync_s is at most that of every count n >=
    ceil(dp / hosts) some host must hold (the bound's min over n, in two evaluations rather
    than dp). Where node_fill applies (q >= 2) a site with n members pays the ring of its own
    N = ceil(n / q) nodes when N >= 2, at a fill >= 1, and the ring's (N - 1)/N and 2 (N - 1)
    hops grow with N: so q N1 members, N1 = max(2, ceil(n0 / q)), whole nodes (fill 1), is
    below all of them, whether or not q N1 <= dp. A site whose n <= q members fit one node
    has no NIC phase (its WAN shard is the WAN phase's NIC term, PerfModel.wan_nic_s, which
    this bound leaves out): q members (one node) is that value, below every count.
    Without node_fill the phase does not depend on the count (None)."""
    if not q:
        return (None,)
    n0 = -(-dp // hosts)
    whole = (q * max(2, -(-n0 // q)),)
    return whole + (q,) if n0 <= q else whole


def _intra(
    problem: Problem,
    perf: PerfModel,
    cfg: Config,
    k: int,
    site: str,
    memo: dict[tuple[Any, ...], float],
    members: int | None = None,
) -> float:
    """PerfModel.intra_sync_s (at `members`), once per (stage shape, GPU type, node size,
    members): it reads the
    stage's gradient bytes (its layers, embedding or head) and the site's GPU and node,
    and 8 sites x 160 stages x 200 configurations called it 90,000 times (2.8 s)."""
    key = (
        cfg.stage_layers[k],
        k == 0,
        k == cfg.pp - 1,
        problem.instance.site(site).gpu,
        site_gpus_per_node(problem, site),
        members,
        k if cfg.dualpipev else None,  # DualPipeV: rank k's two chunks (PerfModel._stage_split)
    )
    if key not in memo:
        memo[key] = perf.intra_sync_s(cfg, k, site, members=members)
    return memo[key]


def _one_per_kind(
    kinds: dict[str, tuple[str, int]],
    hosts: set[str],
    reduced: dict[frozenset[str], set[str]],
) -> set[str]:
    """One site per (GPU type, node size): the bounds read a host only through those (its
    stage times and its NIC phases), and 16 equal sites cost 16x the work of one."""
    key = frozenset(hosts)
    if key not in reduced:
        first: dict[tuple[str, int], str] = {}
        for s in sorted(hosts):
            first.setdefault(kinds[s], s)
        reduced[key] = set(first.values())
    return reduced[key]


def host_cover(hosts: list[set[str]]) -> list[tuple[str, ...]]:
    """Pseudo-chains whose stage k runs over exactly hosts[k]: the lower bounds of
    PerfModel read only which sites a stage may run at, never a chain's boundaries."""
    ordered = [sorted(h) for h in hosts]
    width = max(len(h) for h in ordered)
    return [tuple(h[i % len(h)] for h in ordered) for i in range(width)]


def min_usd_per_s(problem: Problem, cfg: Config) -> float:
    """A lower bound on a configuration's running cost: the energy of its TP groups at the
    cheapest site per group (no links, no partly used nodes)."""
    per_group = []
    for s in problem.instance.sites:
        gpn = site_gpus_per_node(problem, s.name)
        per, block = replica_slots(gpn, cfg.tp, cfg.width)
        if per:
            per_group.append(site_power_w(problem, s.name, block) / per)
    return cfg.pp * cfg.dp * min(per_group) * energy_usd_per_j(problem.catalog)


def _backend(
    problem: Problem,
    perf: PerfModel,
    data: InnerData,
    backend: str,
    objective: str,
    cutoff: float | None,
    remaining: float,
    threads: int | None,
    opts: Any,
    t_cap: float | None = None,
    rate_cap: float | None = None,
    hint: InnerSolution | None = None,
    deferred: list[Any] | None = None,
) -> InnerSolution | NoPlan:
    """One configuration through a backend, with the lockstep-contention planes generated
    until the plan found is priced exactly (placer.optimize.contention): each round adds
    the planes its plan violates and solves again. A round the time limit ends with a plan
    still under-priced returns it at its true value, unproven, or no plan when the true
    value breaks a limit. With `deferred` (a list), a plan priced exactly comes back
    before its ties are broken, and the model that breaks them is appended to the list:
    the driver breaks ties only for the configuration whose plan is final (three-sites-
    80-300-500km: two of three improving configurations are beaten later, and their
    MILP tie-breaks took 5 s)."""
    start = time.perf_counter()
    deadline = start + remaining
    t_max = t_cap or (
        cutoff if (objective == "step_time" and cutoff is not None) else _upper_bound_time(data)
    )
    warm: dict[str, float] = {}
    last: tuple[InnerSolution, Evaluation] | None = None
    best: tuple[InnerSolution, Evaluation] | None = None  # the best plan at its true value
    own_cut = False  # the cutoff is `best`'s true value (it only decreases)
    best_model: MilpInner | CpsatInner | None = None  # best's round, ties not yet broken
    # MILP: with contention planes, a round's ties are broken only once its plan is priced
    # exactly (the tie-break of a plan that gains planes would be thrown away with it:
    # four-site-metro-longhaul, 3.3 s of 14.8 s), and with `deferred` not at all. CP-SAT's
    # tie-breaks take a tenth of a second, and its rounds keep the tie-broken plans as their
    # points: from the first plans' points, one worker did not prove four-site-metro-
    # longhaul's third round in 300 s (41 s with the tie-broken points)
    lazy = backend == "milp"
    if not lazy:
        deferred = None
    tiebreak = not lazy or (data.planes is None and deferred is None)
    while True:
        left = max(0.05, deadline - time.perf_counter())
        model: MilpInner | CpsatInner | None = None
        sol: InnerSolution | NoPlan
        try:
            # building counts against the limit too, and stops at it: a configuration of
            # 66,256 chain types (8 regions, 4 sites per replica) took 15 s to build as a
            # MILP, past a 30 s limit (benchmarks/README.md)
            with dl.until(deadline):
                model = _build_model(
                    backend, data, objective, t_max, cutoff, t_cap, rate_cap, opts.symmetry
                )
                model.start_from(warm or _start_names(data, hint, model))
                dl.check()
        except dl.DeadlinePassed:
            sol = NoPlan(proven=False, reason="time limit while building the model")
        else:
            if backend == "milp":
                sol = model.solve(
                    max(0.05, left - (time.perf_counter() - start)),
                    threads,
                    dict(opts.options),
                    tiebreak=tiebreak,
                    deadline_at=deadline,
                )
            else:
                sol = model.solve(
                    max(0.05, deadline - time.perf_counter()),
                    threads,
                    problem.instance.solver.seed,
                    dict(opts.options),
                    tiebreak=tiebreak,
                )
        start = time.perf_counter()
        if isinstance(sol, NoPlan) and sol.proven and best is not None and own_cut:
            # nothing beats the best earlier round's plan, whose true value is the cutoff
            plan_sol, plan_ev = best
            if best_model is not None:  # the canonical plan among its round's ties
                tied = best_model.break_ties(max(0.05, deadline - time.perf_counter()))
                if tied is not plan_sol:
                    tied_ev = evaluate(problem, solution_plan(problem, data, tied), perf)
                    same = plan_ev.step_time_s * (1 + 1e-9)
                    if tied_ev.feasible and tied_ev.step_time_s <= same:
                        plan_sol, plan_ev = tied, tied_ev
            value = plan_ev.step_time_s
            return InnerSolution(
                plan_sol.counts,
                plan_sol.waves,
                value,
                value,
                True,
                step_time_s=value,
                routing=plan_sol.routing,
            )
        if isinstance(sol, NoPlan) and not sol.proven and last is not None:
            # the limit struck in a later round: the best earlier plan at its true value,
            # with this round's bound (the model only grew, so it bounds that plan too)
            plan_sol, plan_ev = best or last
            bound = plan_sol.bound if sol.bound is None else max(plan_sol.bound, sol.bound)
            plan_sol.bound = bound
            return _at_true_value(plan_sol, plan_ev, objective, t_cap)
        if not isinstance(sol, InnerSolution) or data.planes is None:
            if deferred is not None and isinstance(sol, InnerSolution):
                deferred.append(model)
            return sol
        ev = evaluate(problem, solution_plan(problem, data, sol), perf)
        added = _add_planes(problem, perf, data, sol, ev, deadline)
        if not added and (not lazy or deferred is not None):
            if deferred is not None:
                deferred.append(model)
            return sol
        if not added:
            # priced exactly: the canonical plan among the round's ties, which the planes
            # must price exactly too (else it is the next round's point)
            tied = model.break_ties(max(0.05, deadline - time.perf_counter()))
            if tied is sol:  # no tie-break plan in time: the priced plan stands
                return sol
            tied_ev = evaluate(problem, solution_plan(problem, data, tied), perf)
            if not _add_planes(problem, perf, data, tied, tied_ev, deadline):
                return tied
            sol, ev = tied, tied_ev
        ties_open = lazy and bool(added)  # the round's plan gained planes, ties not broken
        warm = model.integer_values()
        last = (sol, ev)
        if objective == "step_time" and ev.feasible and t_cap is None:
            # the plan at its true value is a plan: the next rounds need only beat the best
            # of them (1e-6 relative above it: CP-SAT's ticks round each term up)
            if best is None or ev.step_time_s < best[1].step_time_s:
                best = (sol, ev)
                best_model = model if ties_open else None
            mine = best[1].step_time_s * (1 + 1e-6)
            if cutoff is None or mine < cutoff:
                cutoff, own_cut = mine, True
        if time.perf_counter() >= deadline or interrupt.requested():
            plan_sol, plan_ev = best or (sol, ev)
            return _at_true_value(plan_sol, plan_ev, objective, t_cap)


def _build_model(
    backend: str,
    data: InnerData,
    objective: str,
    t_max: float,
    cutoff: float | None,
    t_cap: float | None,
    rate_cap: float | None,
    symmetry: bool,
) -> MilpInner | CpsatInner:
    """One round's model of the configuration (the families of placer.optimize.families)."""
    cls = MilpInner if backend == "milp" else CpsatInner
    return cls(
        data,
        objective,
        t_max * 1.001 + 1e-6,
        cutoff=cutoff,
        t_cap=t_cap,
        rate_cap=rate_cap,
        symmetry=symmetry,
    )


def _add_planes(
    problem: Problem,
    perf: PerfModel,
    data: InnerData,
    sol: InnerSolution,
    ev: Evaluation,
    stop_at: float | None = None,
) -> int:
    """The contention planes that a round's plan violates, added (0: priced exactly);
    the planes spread to other chain types stop at perf_counter() `stop_at`."""
    assert data.planes is not None
    return add_violated_planes(
        problem,
        perf,
        data.cfg,
        data.planes,
        sol.counts,
        sol.waves,
        ev.routing,
        _failure_factors(data, sol),
        stop_at,
    )


def _start_names(data: InnerData, hint: InnerSolution | None, model: Any) -> dict[str, Any]:
    """The first round's start: the incumbent's plan of this configuration (the heuristic's,
    placer.optimize.warmstart) as the model's named integer values (start_from's input)."""
    if hint is None:
        return {}
    out = {}
    for var, value in start_values(data, hint, model.n, model.u, model.y):
        name = var.name if isinstance(var.name, str) else var.Name()
        out[name] = value
    return out


def _failure_factors(data: InnerData, sol: InnerSolution) -> list[dict[RouteKey, float]]:
    """Per single failure the formulation prices (data.resilience): the route's capacity
    factor (healthy / degraded) for the plan's waves; a route left dark is skipped (its
    traffic must be zero in the model)."""
    res = data.resilience
    if res is None:
        return []
    out = []
    for (_klass, r), caps in sorted(res.degraded_capacity.items()):
        w = sol.waves.get(r, 0)
        opts = data.wave_options[r]
        i = next((k for k, o in enumerate(opts) if o.waves == w), None)
        if i is None or caps[i] <= 0 or opts[i].capacity_Bps <= 0:
            continue
        out.append({r: opts[i].capacity_Bps / caps[i]})
    return out


def _at_true_value(
    sol: InnerSolution, ev: Evaluation, objective: str, t_cap: float | None
) -> InnerSolution | NoPlan:
    """A plan the contention rounds could not finish pricing: its true value, unproven."""
    if not ev.feasible or (t_cap is not None and ev.step_time_s > t_cap * (1 + 1e-9)):
        return NoPlan(proven=False, bound=sol.bound, reason="time limit in the contention rounds")
    value = {"step_time": ev.step_time_s, "rate": ev.usd_per_s}.get(objective, sol.objective)
    return InnerSolution(
        sol.counts,
        sol.waves,
        value,
        sol.bound,
        False,
        step_time_s=ev.step_time_s,
        routing=sol.routing,
    )


def _solve_inner(
    problem: Problem,
    perf: PerfModel,
    data: InnerData,
    backend: str,
    objective: str,
    incumbent: float | None,
    remaining: float,
    threads: int | None,
    opts: Any,
    best: Any,
    hint: InnerSolution | None = None,
    deferred: list[Any] | None = None,
) -> InnerSolution | NoPlan:
    if backend == "brute":
        sol = brute_inner(problem, perf, data, objective)
        return sol if sol is not None else NoPlan(proven=True, reason="no feasible plan")
    if objective == "cost_per_token":
        return _cost_per_token_walk(
            problem, perf, data, backend, incumbent, remaining, threads, opts
        )
    return _backend(
        problem,
        perf,
        data,
        backend,
        objective,
        incumbent,
        remaining,
        threads,
        opts,
        hint=hint,
        deferred=deferred if objective == "step_time" else None,
    )


def _cost_per_token_walk(
    problem: Problem,
    perf: PerfModel,
    data: InnerData,
    backend: str,
    incumbent: float | None,
    remaining: float,
    threads: int | None,
    opts: Any,
) -> InnerSolution | NoPlan:
    """Minimize (USD/s) x (s/step) / tokens exactly by walking the configuration's Pareto
    front of step time vs running cost: the fastest plan under a cost-rate cap, then the
    cheapest plan at that speed, then a strictly cheaper cap (relative RATE_STEP), until the
    step time times the smallest possible cost rate can no longer beat the incumbent."""
    deadline = time.perf_counter() + remaining
    tokens = perf.tokens_per_step()
    r_min = min_usd_per_s(problem, data.cfg)
    best: InnerSolution | None = None
    rate_cap: float | None = None
    optimal = True
    while True:
        left = deadline - time.perf_counter()
        if left <= 0 or interrupt.requested():
            optimal = False
            break
        fast = _backend(
            problem, perf, data, backend, "step_time", None, left, threads, opts, rate_cap=rate_cap
        )
        if isinstance(fast, NoPlan):
            optimal &= fast.proven
            break
        optimal &= fast.optimal
        t_i = fast.objective
        if incumbent is not None and t_i * r_min / tokens >= incumbent * (1 - 1e-9):
            break
        left = deadline - time.perf_counter()
        cheap_or_none = _backend(
            problem,
            perf,
            data,
            backend,
            "rate",
            None,
            max(left, 0.05),
            threads,
            opts,
            t_cap=t_i * (1 + 1e-7) + 1e-9,
        )
        cheap = cheap_or_none if isinstance(cheap_or_none, InnerSolution) else fast
        ev = evaluate(problem, solution_plan(problem, data, cheap), perf)
        if not ev.feasible or ev.step_time_s > t_i * (1 + AGREEMENT_REL) + 1e-9:
            raise ModelMismatchError(
                f"{backend}: cost_per_token walk produced a plan the evaluator disagrees with ({data.cfg.label()})"  # noqa: E501
            )
        value = ev.cost_per_token_usd
        if incumbent is None or value < incumbent:
            incumbent = value
            best = InnerSolution(
                cheap.counts,
                cheap.waves,
                value,
                value,
                True,
                step_time_s=None,
                routing=cheap.routing,
            )
        if rate_cap is not None and ev.usd_per_s > rate_cap * (1 + RATE_STEP):
            optimal = (
                False  # the backend returned a plan over the cap (its tolerance): stop unproven
            )
            break
        rate_cap = ev.usd_per_s * (1 - RATE_STEP)
    if best is not None:
        best.optimal = optimal
        best.bound = best.objective if optimal else 0.0
        return best
    return (
        NoPlan(proven=True)
        if optimal
        else NoPlan(proven=False, reason="time limit in the cost_per_token walk")
    )


def _upper_bound_time(data: InnerData) -> float:
    """A step time no feasible plan of this configuration exceeds (for the CP-SAT grid)."""
    if data.max_step_time_s is not None:
        return data.max_step_time_s
    t_pipe = max([*data.chain_time, *(t for lt in data.chain_level_time for t in lt.values())])
    t_intra = max(
        [*data.intra.values(), *(t for st in data.intra_fill.values() for t in st.values())],
        default=0.0,
    )
    # a chain crosses each of its pairs once; however split, a crossing puts at most its
    # bytes on a route
    crossings = max((len(q) for q in data.chain_pairs), default=0)
    wan = 0.0
    for r in data.routes:
        cap = min((o.capacity_Bps for o in data.wave_options[r] if o.capacity_Bps > 0), default=0.0)
        if cap > 0:
            pp = (
                data.cfg.dp
                * max(crossings, max((cr.get(r, 0) for cr in data.chain_cross), default=0))
                * data.pp_bytes_per_crossing
            )
            if data.planes is not None:
                # lockstep: each of a chain's 2 m FIFO slots per crossing may wait for a
                # tick of the route's whole load (m messages' worth per step)
                pp *= 1 + 2 * max(crossings, 1)
            dp = sum(data.wan_bytes) * len(data.pairs)
            wan = max(wan, (pp + dp) / cap)
    lat = 2 * max(
        [
            *data.pair_latency.values(),
            *(p.latency_s for ps in data.pair_paths.values() for p in ps),
        ],
        default=0.0,
    )
    return t_pipe + t_intra + wan + lat + 1.0


def _fmt(objective: str, v: float) -> str:
    return {
        "step_time": f"{v:.6g} s",
        "cost": f"${v:,.0f}",
        "cost_per_token": f"${v * 1e6:.6g} per M tokens",
    }[objective]
