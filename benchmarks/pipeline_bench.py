"""Milliseconds per call of ``one_f_one_b_time`` for p = 4, 16, 32, 64 stages, m = 1.5 p.

Run: ``.venv/bin/python benchmarks/pipeline_bench.py``.  Inputs are heterogeneous (seeded):
stage times 5-50 ms (backward 1-3x forward), latency <= 5 ms, transmit <= 20 ms.  Each figure
is the best of 7 repeats (the least disturbed by other load on the machine).
"""

from __future__ import annotations

import random
import timeit

from placer.perf.pipeline import one_f_one_b_time


def case(p: int, m: int, seed: int = 0):
    rng = random.Random(seed)
    fwd = [rng.uniform(5e-3, 50e-3) for _ in range(p)]
    bwd = [x * rng.uniform(1.0, 3.0) for x in fwd]
    latency = [rng.uniform(0.0, 5e-3) for _ in range(p - 1)]
    transmit = [rng.uniform(0.0, 20e-3) for _ in range(p - 1)]
    return fwd, bwd, latency, transmit, m


def ms_per_call(args, budget_s: float = 0.2, repeat: int = 7) -> float:
    once = timeit.timeit(lambda: one_f_one_b_time(*args), number=1)
    number = max(1, int(budget_s / repeat / max(once, 1e-7)))
    best = min(timeit.repeat(lambda: one_f_one_b_time(*args), number=number, repeat=repeat))
    return best / number * 1e3


def main() -> None:
    print(f"{'p':>4} {'m':>4} {'ms/call':>9}")
    for p in (4, 16, 32, 64):
        m = round(1.5 * p)
        print(f"{p:>4} {m:>4} {ms_per_call(case(p, m)):>9.3f}")


if __name__ == "__main__":
    main()
