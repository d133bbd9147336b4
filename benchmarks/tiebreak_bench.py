"""Where a CP-SAT solve spends its time: every configuration's solve and tie-break call,
timed, with the tie-break's status and the plan's wave count (benchmarks/README.md,
"Tie-break in two solves").

    .venv/bin/python benchmarks/tiebreak_bench.py instances/seed-1t-two-sites.yaml
    .venv/bin/python benchmarks/tiebreak_bench.py instances/three-sites-80-300-500km.yaml -t 2
"""

from __future__ import annotations

import argparse
import time

from placer.io import load_instance
from placer.optimize import cpsat
from placer.optimize.driver import solve


def _timed(name: str, fn):
    def wrapper(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = fn(self, *args, **kwargs)
        extra = ""
        if name == "break_ties":
            extra = f" {self.tie_status} waves={sum(out.waves.values())}"
        elif name == "solve":
            extra = f" {type(out).__name__}"
        print(f"  {name:10s} {self.d.cfg.label():60s} {time.perf_counter() - t0:7.2f} s{extra}")
        return out

    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("instance")
    ap.add_argument("-t", "--threads", type=int, default=None, help="CP-SAT workers (default: its)")
    args = ap.parse_args()
    for name in ("solve", "break_ties"):
        setattr(cpsat.CpsatInner, name, _timed(name, getattr(cpsat.CpsatInner, name)))
    problem = load_instance(args.instance)
    t0 = time.perf_counter()
    res = solve(problem, backend="cpsat", time_limit_s=600, threads=args.threads)
    print(f"whole solve {time.perf_counter() - t0:.2f} s: {res.status}, {res.objective:.6g}")


if __name__ == "__main__":
    main()
