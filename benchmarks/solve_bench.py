"""Solve-time benchmark: every shipped instance with both backends, then generated
instances with S = 2 .. 32 sites up to ~1M GPUs and a 2T-parameter model.

    .venv/bin/python benchmarks/solve_bench.py            # full table (minutes)
    .venv/bin/python benchmarks/solve_bench.py --quick    # shipped instances only
    .venv/bin/python benchmarks/solve_bench.py --power    # issue 12.3: power-bound instances
    .venv/bin/python benchmarks/solve_bench.py --deadline # issue 15.3: whole command vs limit
    .venv/bin/python benchmarks/solve_bench.py --milp-work # issue 12.4: HiGHS work, 1 thread

Prints markdown tables (copy them into benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from placer.errors import PlacerError
from placer.generate import random_instance
from placer.io import load_instance, problem_from_data
from placer.optimize.driver import solve

ROOT = Path(__file__).resolve().parent.parent
GENERATED = [  # sites, total GPUs, max sites per replica
    (2, 16_384, 2),
    (4, 65_536, 2),
    (8, 131_072, 2),
    (16, 524_288, 1),
    (32, 1_048_576, 1),
]


# solver threads of the rows (--threads; None: the solver's default, what `placer solve`
# runs without --threads)
THREADS: list[int | None] = [None]


def run(problem, backend: str, time_limit: float) -> tuple[str, float, float, float, int, int]:
    t0 = time.perf_counter()
    try:
        res = solve(problem, backend=backend, time_limit_s=time_limit, threads=THREADS[0])
    except PlacerError as exc:
        return (type(exc).__name__, time.perf_counter() - t0, float("nan"), float("nan"), 0, 0)
    return (
        res.status,
        time.perf_counter() - t0,
        res.objective,
        res.gap,
        res.configs_total,
        res.configs_solved,
    )


POWER_BOUND = ["power-bound-gpt3-two-sites", "power-bound-8-sites"]  # tests/instances


def power_rows(backends: list[str], time_limit: float) -> None:
    """The issue's power-bound instances (exit 4 before the presolve and the heuristic):
    the time to the first plan (the first incumbent), then the search's end."""
    print("| instance | backend | first plan s | status | seconds | step time s | gap |")
    print("|---|---|---:|---|---:|---:|---:|")
    for name in POWER_BOUND:
        prob = load_instance(ROOT / "tests" / "instances" / f"{name}.yaml")
        for b in backends:
            t0 = time.perf_counter()
            first: list[float] = []

            def progress(msg: str, t0: float = t0, first: list[float] = first) -> None:
                if msg.startswith("incumbent") and not first:
                    first.append(time.perf_counter() - t0)

            try:
                res = solve(
                    prob, backend=b, time_limit_s=time_limit, threads=THREADS[0], progress=progress
                )
                st, obj, gap = res.status, f"{res.objective:.4f}", f"{res.gap:.1e}"
            except PlacerError as exc:
                st, obj, gap = type(exc).__name__, "-", "-"
            f = f"{first[0]:.2f}" if first else "-"
            print(
                f"| {name} | {b} | {f} | {st} | {time.perf_counter() - t0:.2f} | {obj} | {gap} |",
                flush=True,
            )


def deadline_rows(limits: list[float]) -> None:
    """Wall time of the whole `placer solve` command (start-up to exit) against --time-limit."""
    import subprocess
    import tempfile

    import yaml

    from placer.generate import ring_instance

    exe = str(Path(sys.executable).parent / "placer")
    with tempfile.TemporaryDirectory() as tmp:
        ring = Path(tmp) / "ring-16.yaml"
        ring.write_text(yaml.safe_dump(ring_instance(16)))
        cases = [
            ("ring-16", ring),
            ("power-bound-8-sites", ROOT / "tests" / "instances" / "power-bound-8-sites.yaml"),
        ]
        print("| instance | --time-limit s | wall s | over the limit | exit |")
        print("|---|---:|---:|---:|---:|")
        for name, path in cases:
            for lim in limits:
                t0 = time.perf_counter()
                r = subprocess.run(
                    [exe, "solve", str(path), "-q", "-o", str(Path(tmp) / "out"),
                     "--time-limit", f"{lim:g}"],
                    capture_output=True,
                    text=True,
                )  # fmt: skip
                wall = time.perf_counter() - t0
                print(
                    f"| {name} | {lim:g} | {wall:.2f} | {wall / lim - 1:+.1%} | {r.returncode} |",
                    flush=True,
                )


def milp_work_rows(names: list[str], time_limit: float) -> None:
    """The MILP's work on shipped instances with one thread, where HiGHS is deterministic:
    HiGHS runs, branch-and-bound nodes and simplex iterations, which a loaded machine does
    not change (the seconds it does). Counted around MilpInner._solve_once."""
    import placer.optimize.milp as milp

    print(
        "| instance | status | step time s | wall s | CPU s | HiGHS runs | nodes | LP iterations |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    once = milp.MilpInner._solve_once
    for name in names:
        work = [0, 0, 0]

        def counted(self, *a, work=work, **kw):  # type: ignore[no-untyped-def]
            out = once(self, *a, **kw)
            info = self.prob.solverModel.getInfo()
            work[0] += 1
            work[1] += info.mip_node_count
            work[2] += info.simplex_iteration_count
            return out

        milp.MilpInner._solve_once = counted
        try:
            prob = load_instance(ROOT / "instances" / f"{name}.yaml")
            t0, c0 = time.perf_counter(), time.process_time()
            res = solve(prob, backend="milp", time_limit_s=time_limit, threads=1)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        finally:
            milp.MilpInner._solve_once = once
        print(
            f"| {name} | {res.status} | {res.objective:.6f} | {wall:.2f} | {cpu:.2f} | "
            f"{work[0]} | {work[1]:,} | {work[2]:,} |",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="shipped instances only")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--backends", default="cpsat,milp")
    ap.add_argument(
        "--sites", default="", help="generated rows only, for these site counts (e.g. 32)"
    )
    ap.add_argument("--power", action="store_true", help="the power-bound instances only")
    ap.add_argument("--deadline", action="store_true", help="whole-command wall time only")
    ap.add_argument(
        "--milp-work",
        nargs="*",
        default=None,
        help="HiGHS work with one thread on these shipped instances (default: the two slowest)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="solver threads (default: unset, as `placer solve`; earlier tables used 2)",
    )
    args = ap.parse_args()
    THREADS[0] = args.threads
    if args.milp_work is not None:
        names = args.milp_work or ["three-sites-80-300-500km", "four-site-metro-longhaul"]
        milp_work_rows(names, max(args.time_limit, 300.0))
        return
    backends = args.backends.split(",")
    if args.power:
        power_rows(backends, args.time_limit)
        return
    if args.deadline:
        deadline_rows([10.0, 20.0])
        return
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}"  # noqa: E501
        f", threads {args.threads or 'unset'}"
    )
    print()
    print("| instance | backend | status | seconds | objective | gap | configs (solved) |")
    print("|---|---|---|---:|---:|---:|---|")
    only = {int(x) for x in args.sites.split(",") if x}
    for path in sorted((ROOT / "instances").glob("*.yaml")) if not only else []:
        prob = load_instance(path)
        for b in backends:
            st, sec, obj, gap, total, solved = run(prob, b, args.time_limit)
            print(
                f"| {prob.name} | {b} | {st} | {sec:.2f} | {obj:.6g} | {gap:.1e} | {total} ({solved}) |",  # noqa: E501
                flush=True,
            )
    if args.quick:
        return
    print()
    print(
        "| sites | GPUs | routes | backend | status | seconds | step time s | gap | configs (solved) |"  # noqa: E501
    )
    print("|---:|---:|---:|---|---|---:|---:|---:|---|")
    for sites, gpus, k in GENERATED:
        if only and sites not in only:
            continue
        data = random_instance(
            sites, gpus, seed=1, max_sites_per_replica=k, time_limit_s=args.time_limit
        )
        prob = problem_from_data(data)
        n_gpus = sum(s.gpus for s in prob.instance.sites)
        for b in backends:
            st, sec, obj, gap, total, solved = run(prob, b, args.time_limit)
            print(
                f"| {sites} | {n_gpus:,} | {len(prob.instance.routes)} | {b} | {st} | {sec:.2f} | {obj:.4f} | {gap:.1e} | {total} ({solved}) |",  # noqa: E501
                flush=True,
            )


if __name__ == "__main__":
    main()
