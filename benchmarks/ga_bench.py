"""The solver against a genetic-algorithm baseline on 8-region instances (issue 12 target).

    PYTHONPATH=. .venv/bin/python benchmarks/ga_bench.py [--seeds 0 1] [--solver-limit 120]
        [--ga-budget 120] [--ga-seeds 0 1 2] [--backends cpsat milp] [--sync synchronous]
        [--every-steps 1]

The aim the issue states: placer's proven optimum in 1/100 of the time the GA
(benchmarks/ga.py, placer's evaluator as its fitness) needs to get within 1% of it. Per
instance seed: each backend solves with `--solver-limit` (status, objective, bound,
seconds); then the GA runs `--ga-budget` seconds per GA seed with the target 1.01 x the
best objective the backends found, and the row gives the seconds it took to reach it (or
"not reached" and its best, relative to the target's base). A GA plan below a backend's
*proven* optimum would refute that proof: the script says so (and exits 1).

The instances (assumption: the shape of the issue's 8-region case and of the 8-region
setting of Yuan et al., arXiv 2206.01288, not measured regions): 8 sites of 8 A100 80 GB,
every pair of sites joined by a route with one-way latency uniform in [5.5, 119] ms (the
issue's 11-238 ms read as round trips) and existing capacity uniform in [0.3, 1.2] Gbit/s,
no waves to buy (max_waves 0), one path per pair; SC21's 1.7B GPT (models/sc21-1.7b.yaml),
global batch 512, tp 1, pp 8, dp 8, micro-batch 1, even layer split; replicas over at most
two sites (placer's default).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ga import GeneticPlanner  # noqa: E402

from placer.io import problem_from_data  # noqa: E402
from placer.optimize.driver import solve  # noqa: E402

MODEL = "sc21-1.7b"  # models/sc21-1.7b.yaml


def regions_instance(
    seed: int,
    sync: str = "synchronous",
    sites: int = 8,
    max_sites_per_replica: int = 2,
    every_steps: int = 1,
) -> dict[str, Any]:
    """An 8-region instance (module docstring); `seed` draws latencies and capacities."""
    rng = np.random.default_rng(seed)
    names = [f"r{i}" for i in range(sites)]
    routes = []
    for i in range(sites):
        for j in range(i + 1, sites):
            one_way_ms = round(float(rng.uniform(11, 238)) / 2, 3)
            routes.append(
                {
                    "sites": [names[i], names[j]],
                    # fiber at 4.9 us/km, rounded down: the latency is never below propagation
                    "km": math.floor(one_way_ms * 10_000 / 4.9) / 10,
                    "latency_ms": one_way_ms,
                    "fiber_pairs": 0,
                    "capacity_gbps": round(float(rng.uniform(0.3, 1.2)), 3),
                    "max_waves": 0,
                }
            )
    return {
        "name": f"regions-{sites}-seed{seed}-{sync}"
        + ("" if sync == "synchronous" else f"-h{every_steps}"),
        "sites": [
            {"name": n, "gpu": "a100-80g", "gpus": 8, "power_mw": 1.0, "pue": 1.2} for n in names
        ],
        "routes": routes,
        "job": {
            "model": MODEL,
            "global_batch": 512,
            "precision": "bf16",
            "recompute": "selective",
            "sync": {"mode": sync}
            if sync == "synchronous"
            else {"mode": sync, "every_steps": every_steps},
            "parallelism": {
                "tp": [1],
                "pp": [8],
                "dp": [8],
                "micro_batch": [1],
                "stage_layers": "even",
            },
        },
        "objective": {"minimize": "step_time"},
        "solver": {"max_sites_per_replica": max_sites_per_replica, "paths_per_pair": 1},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--solver-limit", type=float, default=120.0)
    ap.add_argument("--ga-budget", type=float, default=120.0)
    ap.add_argument("--ga-seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--backends", nargs="+", default=["cpsat", "milp"])
    ap.add_argument("--sync", default="synchronous")
    ap.add_argument("--every-steps", type=int, default=1, help="outer sync interval H (diloco)")
    args = ap.parse_args()
    refuted = False
    print("| instance | backend | status | objective s | bound s | seconds |")
    print("|---|---|---|---:|---:|---:|")
    ga_rows = []
    for seed in args.seeds:
        inst = regions_instance(seed, args.sync, every_steps=args.every_steps)
        results = {}
        for be in args.backends:
            r = solve(problem_from_data(inst), backend=be, time_limit_s=args.solver_limit)
            results[be] = r
            print(
                f"| {inst['name']} | {be} | {r.status} | {r.objective:.4f} | {r.bound:.4f} "
                f"| {r.seconds:.2f} |",
                flush=True,
            )
        base = min(r.objective for r in results.values())
        proven = [r for r in results.values() if r.status == "optimal"]
        for gs in args.ga_seeds:
            ga = GeneticPlanner(problem_from_data(inst), seed=gs)
            res = ga.run(args.ga_budget, target=base * 1.01)
            if any(res.best < r.objective * (1 - 1e-9) for r in proven):
                refuted = True
            solver_s = min((r.seconds for r in proven), default=math.nan)
            reached = f"{res.reached_s:.2f}" if res.reached_s is not None else "not reached"
            ratio = f"{res.reached_s / solver_s:.1f}" if res.reached_s and proven else "-"
            ga_rows.append(
                f"| {inst['name']} | {gs} | {reached} | {res.best:.4f} "
                f"({res.best / base - 1:+.2%}) | {res.evaluations} | {res.seconds:.1f} | {ratio} |"
            )
            print(ga_rows[-1], flush=True)
    print()
    print(
        "| instance | GA seed | GA s to within 1% | GA best (vs best solver plan) | plans "
        "evaluated | GA s | GA s / proof s |"
    )
    print("|---|---:|---|---|---:|---:|---:|")
    print("\n".join(ga_rows))
    if refuted:
        print("A GA plan beats a proven optimum: the proof is wrong.")
        sys.exit(1)


if __name__ == "__main__":
    main()
