"""Solve seconds with symmetry breaking on and off (solver.symmetry, issue 12 item 4).

    PYTHONPATH=. .venv/bin/python benchmarks/symmetry_bench.py [--repeat 2] [--threads 1]
        [--only NAME ...] [--backends cpsat milp]

The shipped instances with two equal sites, and generated hubs: N equal campuses (GPT-3
175B, 1,024 H100 each) around a smaller hub site, every spoke 80 km from the hub, the
replicas staggered (the MILP writes the rows only then) or in lockstep (CP-SAT only).
Runs are interleaved (on, off, on, off, ...) because the box is shared; every pair must give
the same objective and the same plan (else the row says so). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from placer.io import problem_from_data
from placer.optimize.driver import solve

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ["two-campus-100km", "deepseek-v3-two-sites", "seed-1t-two-sites"]


def hub(spokes: int, schedule: str) -> dict[str, Any]:
    """N equal spokes around a hub (assumption: a procurement study's shape, not a site)."""
    sites = [{"name": "hub", "gpu": "h100-sxm", "gpus": 512, "power_mw": 1.0, "pue": 1.2}]
    sites += [
        {"name": f"c{i}", "gpu": "h100-sxm", "gpus": 1024, "power_mw": 1.8, "pue": 1.2}
        for i in range(1, spokes + 1)
    ]
    return {
        "name": f"hub-{spokes}-equal-{schedule}",
        "sites": sites,
        "routes": [
            {"sites": ["hub", f"c{i}"], "km": 80, "fiber_pairs": 2, "capacity_gbps": 0}
            for i in range(1, spokes + 1)
        ],
        "job": {
            "model": "gpt3-175b",
            "global_batch": 1536,
            "gpus": 2048,
            "precision": "bf16",
            "recompute": "selective",
            "replica_schedule": schedule,
            "sync": {"mode": "synchronous"},
            "parallelism": {"tp": [8], "pp": [8], "micro_batch": [1]},
        },
        "objective": {"minimize": "step_time", "max_cost_usd": 2_000_000},
    }


def run(instance: dict[str, Any], backend: str, on: bool, threads: int | None) -> tuple:
    inst = copy.deepcopy(instance)
    inst.setdefault("solver", {})["symmetry"] = on
    t0 = time.perf_counter()
    res = solve(problem_from_data(inst), backend=backend, time_limit_s=600, threads=threads)
    seconds = time.perf_counter() - t0
    plan = res.plan.model_copy(update={"solver": None}).model_dump_json()
    return seconds, res.objective, res.status, plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="0: unset, as `placer solve` runs")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--backends", nargs="*", default=["cpsat", "milp"])
    args = ap.parse_args()
    cases: list[tuple[dict[str, Any], tuple[str, ...]]] = [
        (yaml.safe_load((ROOT / "instances" / f"{n}.yaml").read_text()), ("cpsat", "milp"))
        for n in SHIPPED
    ]
    for n in (4, 6, 8):
        cases.append((hub(n, "staggered"), ("cpsat", "milp")))
        cases.append((hub(n, "lockstep"), ("cpsat",)))
    print(f"threads {args.threads or 'unset'}, {args.repeat} interleaved pairs per row")
    print("| instance | backend | on s | off s | on/off | objective | same plan |")
    print("|---|---|---|---|---|---|---|")
    for inst, backends in cases:
        if args.only and inst["name"] not in args.only:
            continue
        for backend in backends:
            if backend not in args.backends:
                continue
            times: dict[bool, list[float]] = {True: [], False: []}
            answers = set()
            objective = None
            for _ in range(args.repeat):
                for on in (True, False):
                    s, obj, status, plan = run(inst, backend, on, args.threads or None)
                    times[on].append(s)
                    answers.add((obj, status, plan))
                    objective = obj
            on_s, off_s = statistics.median(times[True]), statistics.median(times[False])
            print(
                f"| {inst['name']} | {backend} | {' '.join(f'{t:.2f}' for t in times[True])} "
                f"| {' '.join(f'{t:.2f}' for t in times[False])} | {on_s / off_s:.2f} "
                f"| {objective:.9g} | {'yes' if len(answers) == 1 else 'NO'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
