"""CP-SAT's worker count on one configuration's model (issue 12 item 4: every shipped
instance proven optimal in <= 10 s).

Captures the CP-SAT model of the first configuration placer solves exactly on an instance
(with its hints, as the driver builds it) and solves that model alone at several worker
counts and seeds, printing status, seconds and the gap left. On 2 cores CP-SAT's default
(num_workers 0: one per core) runs one full-problem subsolver; placer now runs at least
PORTFOLIO_WORKERS when threads is unset.

    .venv/bin/python benchmarks/cpsat_workers.py                     # four-site-metro-longhaul
    .venv/bin/python benchmarks/cpsat_workers.py --workers 2,8 --seeds 0,1,2 --time-limit 30
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from ortools.sat.python import cp_model

from placer.io import load_instance
from placer.optimize import cpsat
from placer.optimize.driver import solve

ROOT = Path(__file__).resolve().parent.parent


class _Captured(Exception):
    pass


def first_model(instance: Path) -> tuple[cp_model.CpModel, str]:
    """The first exactly solved configuration's CP-SAT model, as the driver built it."""
    box: list = []
    real = cpsat.CpsatInner.solve

    def capture(self, *args, **kwargs):
        box.append((self.m.Clone(), self.d.cfg.label()))
        raise _Captured

    cpsat.CpsatInner.solve = capture
    try:
        solve(load_instance(instance), backend="cpsat", time_limit_s=600)
    except _Captured:
        pass
    finally:
        cpsat.CpsatInner.solve = real
    if not box:
        raise SystemExit("no configuration reached an exact CP-SAT solve")
    return box[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instance", default=str(ROOT / "instances" / "four-site-metro-longhaul.yaml"))
    ap.add_argument("--workers", default="2,8")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--time-limit", type=float, default=30.0)
    args = ap.parse_args()
    model, label = first_model(Path(args.instance))
    print(f"{Path(args.instance).name}: first configuration {label}; {os.cpu_count()} cores")
    print("| workers | seed | status | seconds | gap |")
    print("|---:|---:|---|---:|---:|")
    for w in (int(x) for x in args.workers.split(",")):
        for seed in (int(x) for x in args.seeds.split(",")):
            s = cp_model.CpSolver()
            s.parameters.num_workers = w
            s.parameters.random_seed = seed
            s.parameters.max_time_in_seconds = args.time_limit
            t0 = time.perf_counter()
            st = s.Solve(model.Clone())
            sec = time.perf_counter() - t0
            obj, bound = s.ObjectiveValue(), s.BestObjectiveBound()
            gap = (obj - bound) / obj if obj else float("nan")
            print(f"| {w} | {seed} | {s.StatusName(st)} | {sec:.2f} | {gap:.1e} |", flush=True)


if __name__ == "__main__":
    main()
