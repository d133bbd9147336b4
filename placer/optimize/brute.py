"""Exhaustive search over every plan of a tiny instance, scored by the evaluator alone.

The reference the formulations are tested against: it shares no code with them except
the search space (configurations and chain types) and the evaluator.
"""

from __future__ import annotations

import itertools

from placer.errors import InputError
from placer.evaluate import evaluate
from placer.io import Problem
from placer.optimize.data import InnerData, InnerSolution, solution_plan
from placer.perf.step import PerfModel

MAX_PLANS = 200_000


def brute_inner(problem: Problem, perf: PerfModel, data: InnerData, objective: str) -> InnerSolution | None:
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
        for wv in itertools.product(*wave_choices):
            waves = dict(zip(data.routes, wv, strict=True))
            sol = InnerSolution(counts, waves, 0.0, 0.0, True)
            ev = evaluate(problem, solution_plan(problem, data, sol), perf)
            if not ev.feasible:
                continue
            value = {"step_time": ev.step_time_s, "cost": ev.capex_usd, "cost_per_token": ev.cost_per_token_usd}[objective]
            sites = sum(1 for g in ev.gpus_by_site.values() if g > 0)
            key = (round(value, 9), sum(wv), sites)
            if best is None or key < best:
                best = key
                best_sol = InnerSolution(dict(counts), waves, value, value, True, step_time_s=ev.step_time_s)
    return best_sol


def _multisets(n: int, k: int) -> int:
    from math import comb

    return comb(n + k - 1, k) if n > 0 else 0
