"""Candidate paths per pair vs the backends (issue 12 item 4): four-metro-resilient (a K4
of identical sites, 5 simple paths per pair) with solver.paths_per_pair 1 .. 4, each
solved by CP-SAT and the MILP with 2 threads and a 60 s limit: the instance as shipped
(`resilient`), and without its resilience section (`none`: the variant the resilience
summary solves to count spare waves, where the data-parallel flows of every pair are
split over the candidate paths and CP-SAT's capacity rows are largest).

    .venv/bin/python benchmarks/paths_bench.py                 # k = 1..4, both backends
    .venv/bin/python benchmarks/paths_bench.py --k 3 --backend cpsat

Prints a markdown table (copy it into benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import time
from pathlib import Path

import yaml

from placer.errors import PlacerError
from placer.io import problem_from_data
from placer.optimize.driver import solve

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instance", default=str(ROOT / "instances" / "four-metro-resilient.yaml"))
    ap.add_argument("--k", type=int, nargs="*", default=[1, 2, 3, 4])
    ap.add_argument("--backend", nargs="*", default=["cpsat", "milp"])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variant", nargs="*", default=["resilient", "none"])
    args = ap.parse_args()
    base = yaml.safe_load(Path(args.instance).read_text())
    print(f"{Path(args.instance).stem}, {args.threads} threads, {args.time_limit:g} s limit")
    print("| variant | paths_per_pair | backend | status | objective | gap | seconds |")
    print("|---|---:|---|---|---:|---:|---:|")
    for variant, k, backend in itertools.product(args.variant, args.k, args.backend):
        data = copy.deepcopy(base)
        if variant == "none":
            data.pop("resilience", None)
        data.setdefault("solver", {})["paths_per_pair"] = k
        problem = problem_from_data(data)
        t0 = time.perf_counter()
        try:
            res = solve(
                problem, backend=backend, time_limit_s=args.time_limit, threads=args.threads
            )
            cells = (res.status, f"{res.objective:,.6f}", f"{res.gap:.2e}")
        except PlacerError as exc:
            cells = (type(exc).__name__, "-", "-")
        wall = time.perf_counter() - t0
        print(f"| {variant} | {k} | {backend} | {' | '.join(cells)} | {wall:.1f} |", flush=True)


if __name__ == "__main__":
    main()
