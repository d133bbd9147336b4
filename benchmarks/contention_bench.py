"""Solve times where lockstep contention's rounds and tie walk do the work: the four
shipped two- and three-site instances with both backends, and the seed models of
tests/test_solver_properties.py over two campuses (megatron-1t at 50 and 100 km with the
waves two fiber pairs carry; gpt3-175b and megatron-1t at 1,000 km over one wave) with
CP-SAT. Prints each solve's seconds, status, objective and wave count, then the total
(benchmarks/README.md, "Tie-break in two solves, and the tests' CI time").

    .venv/bin/python benchmarks/contention_bench.py
    .venv/bin/python benchmarks/contention_bench.py m1t-50 seed-1t-two-sites   # some only
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the property tests' two-campus instances

from test_solver_properties import two_campus  # noqa: E402

from placer.io import load_instance, problem_from_data  # noqa: E402
from placer.optimize.driver import solve  # noqa: E402

SHIPPED = [
    "seed-1t-two-sites",
    "deepseek-v3-two-sites",
    "two-campus-100km",
    "three-sites-80-300-500km",
]
CAMPUS = {
    "m1t-50": lambda: two_campus("megatron-1t", 50, max_waves=None, fiber_pairs=2),
    "m1t-100": lambda: two_campus("megatron-1t", 100, max_waves=None, fiber_pairs=2),
    "g175-1000": lambda: two_campus("gpt3-175b", 1000, max_waves=1),
    "m1t-1000": lambda: two_campus("megatron-1t", 1000, max_waves=1),
}


def cases():
    for name in SHIPPED:
        yield (
            name,
            lambda n=name: load_instance(ROOT / "instances" / f"{n}.yaml"),
            ("cpsat", "milp"),
        )
    for name, make in CAMPUS.items():
        yield name, lambda m=make: problem_from_data(m()), ("cpsat",)


def main() -> None:
    only = set(sys.argv[1:])
    total = 0.0
    for name, make, backends in cases():
        if only and name not in only:
            continue
        problem = make()
        for backend in backends:
            t0 = time.perf_counter()
            res = solve(problem, backend=backend, time_limit_s=300)
            dt = time.perf_counter() - t0
            total += dt
            waves = sum(link.waves for link in res.plan.links)
            print(
                f"{name:26s} {backend:5s} {dt:6.1f} s  {res.status}  "
                f"{res.objective:.6f}  waves={waves}",
                flush=True,
            )
    print(f"total {total:.1f} s")


if __name__ == "__main__":
    main()
