"""A genetic-algorithm planner over placer's plan space, scored by the evaluator alone.

The baseline issue 12 measures the solver against ("a genetic-algorithm baseline driving
placer's own evaluator ... on 8-region instances"), in the style of the GA schedulers of
decentralized training (Yuan et al., "Decentralized Training of Foundation Models in
Heterogeneous Environments", NeurIPS 2022, arXiv 2206.01288: 64 GPUs over 8 regions).

It shares with the formulations only what brute force shares (placer.optimize.brute): the
configuration, its chain types (a replica's stage sites: contiguous blocks over at most
`solver.max_sites_per_replica` sites) and the evaluator. A genome is the multiset of the dp
replicas' chains; its fitness is `placer.evaluate` of the plan it writes (infeasible: inf).
Operators keep every genome within the sites' replica-stage slots (InnerData.site_groups),
so the search does not spend its evaluations on plans that overfill a site:

* initial genomes: each replica draws a chain among those that still fit;
* crossover: the child keeps a random half of parent A's replicas, then takes parent B's
  chains that fit, then random fitting ones;
* mutation: two or three replicas re-draw fitting chains (probability `mutation` per
  child, and always when the child equals a parent);
* tournament selection (3), two elites kept.

Restricted to instances whose configuration has no wave or routing choice (every route's
`max_waves: 0` or fixed capacity, `solver.paths_per_pair: 1`): the comparison is over
placement, the decision the GA schedulers make.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from placer.evaluate import evaluate
from placer.io import Problem
from placer.optimize.data import InnerData, InnerSolution, build_inner, solution_plan
from placer.optimize.space import SpaceReport, chain_types, enumerate_configs
from placer.perf.step import PerfModel

Genome = tuple[int, ...]  # sorted chain indices, one per replica


@dataclass
class GaResult:
    best: float  # best step time found (inf: no feasible plan)
    best_genome: Genome | None
    evaluations: int  # distinct plans evaluated
    seconds: float
    generations: int
    reached_s: float | None  # seconds until best <= target (None: not reached)
    trace: list[tuple[float, float]] = field(default_factory=list)  # (seconds, best) on improvement


class GeneticPlanner:
    """The GA over one configuration's chain multisets (see the module docstring)."""

    def __init__(self, problem: Problem, seed: int = 0):
        self.problem = problem
        self.perf = PerfModel(problem)
        configs = enumerate_configs(problem, SpaceReport(), self.perf)
        if len(configs) != 1:
            raise ValueError(
                f"the GA searches one configuration; the instance has {len(configs)} "
                "(fix job.parallelism tp, pp, dp, micro_batch, stage_layers)"
            )
        self.cfg = configs[0]
        self.data: InnerData = build_inner(
            problem, self.perf, self.cfg, chain_types(problem, self.perf, self.cfg)
        )
        d = self.data
        if any(len(d.wave_options[r]) != 1 for r in d.routes):
            raise ValueError("the GA has no wave decisions: set max_waves 0 on every route")
        if problem.instance.solver.paths_per_pair != 1:
            raise ValueError("the GA has no routing decisions: set solver.paths_per_pair 1")
        self.waves = {r: d.wave_options[r][0].waves for r in d.routes}
        self.rng = random.Random(seed)
        # replica-stage slots each chain takes per site
        self.use = [Counter(chain) for chain in d.chains]
        self.cache: dict[Genome, float] = {}

    # ------------------------------------------------------------------ genomes

    def _fits(self, c: int, free: dict[str, int]) -> bool:
        return all(free[s] >= n for s, n in self.use[c].items())

    def _take(self, c: int, free: dict[str, int]) -> None:
        for s, n in self.use[c].items():
            free[s] -= n

    def _fill(self, kept: list[int], donors: list[int]) -> Genome | None:
        """Complete `kept` to dp replicas: donors first (in order), then random fitting
        chains (None: nothing fits, the slots are exhausted)."""
        free = dict(self.data.site_groups)
        out: list[int] = []
        for c in kept:
            if self._fits(c, free):
                self._take(c, free)
                out.append(c)
        for c in donors:
            if len(out) == self.cfg.dp:
                break
            if self._fits(c, free):
                self._take(c, free)
                out.append(c)
        while len(out) < self.cfg.dp:
            fitting = [c for c in range(len(self.data.chains)) if self._fits(c, free)]
            if not fitting:
                return None
            c = self.rng.choice(fitting)
            self._take(c, free)
            out.append(c)
        return tuple(sorted(out))

    def random_genome(self) -> Genome | None:
        return self._fill([], [])

    def crossover(self, a: Genome, b: Genome) -> Genome | None:
        kept = [c for c in a if self.rng.random() < 0.5]
        donors = list(b)
        self.rng.shuffle(donors)
        return self._fill(kept, donors)

    def mutate(self, g: Genome) -> Genome | None:
        """Two or three replicas re-draw their chains: with every slot taken (the 8-region
        instances use all 64 GPUs) one replica alone can only take back its own slots."""
        out = list(g)
        for _ in range(min(len(out), self.rng.choice((2, 3)))):
            del out[self.rng.randrange(len(out))]
        return self._fill(out, [])

    # ------------------------------------------------------------------ fitness

    def plan(self, g: Genome) -> Any:
        sol = InnerSolution(dict(Counter(g)), dict(self.waves), 0.0, 0.0, True, routing=[])
        return solution_plan(self.problem, self.data, sol)

    def fitness(self, g: Genome) -> float:
        if g not in self.cache:
            ev = evaluate(self.problem, self.plan(g), self.perf)
            self.cache[g] = ev.step_time_s if ev.feasible else math.inf
        return self.cache[g]

    # ------------------------------------------------------------------ search

    def run(
        self,
        time_budget_s: float,
        target: float | None = None,
        population: int = 48,
        mutation: float = 0.3,
        max_generations: int | None = None,
    ) -> GaResult:
        """Evolve until `target` is reached (best <= target), the budget or the generation
        count ends."""
        t0 = time.perf_counter()
        pop: list[Genome] = []
        for _ in range(20 * population):
            if len(pop) == population:
                break
            g = self.random_genome()
            if g is not None:
                pop.append(g)
        if not pop:
            return GaResult(math.inf, None, 0, time.perf_counter() - t0, 0, None)
        best_g = min(pop, key=self.fitness)
        best = self.fitness(best_g)
        trace = [(time.perf_counter() - t0, best)]
        reached = trace[0][0] if target is not None and best <= target else None
        gen = 0
        while reached is None and time.perf_counter() - t0 < time_budget_s:
            if max_generations is not None and gen >= max_generations:
                break
            gen += 1
            ranked = sorted(pop, key=self.fitness)
            nxt = ranked[:2]
            while len(nxt) < population:
                a = min(self.rng.sample(pop, min(3, len(pop))), key=self.fitness)
                b = min(self.rng.sample(pop, min(3, len(pop))), key=self.fitness)
                child = self.crossover(a, b)
                if child is not None and (child in (a, b) or self.rng.random() < mutation):
                    child = self.mutate(child)
                if child is None:
                    continue
                nxt.append(child)
                f = self.fitness(child)
                if f < best:
                    best, best_g = f, child
                    trace.append((time.perf_counter() - t0, best))
                    if target is not None and best <= target:
                        reached = trace[-1][0]
                        break
            pop = nxt
        return GaResult(
            best, best_g, len(self.cache), time.perf_counter() - t0, gen, reached, trace
        )
