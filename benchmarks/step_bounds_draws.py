"""The closed form against the simulator on the draws tests/test_simulate.py bounds.

STEP_BOUNDS (tests/test_simulate.py) is the envelope of sim_vs_closed.py's random sets
(seed 1, seed 2's 1,000) and of draws of the test's own strategy, `multi_site_plans`,
overlap off and on. This prints such draws per sync class (min / max of (closed form -
simulation) / simulation, and how many within 2%), from a fixed hypothesis seed: a
sample apart from the test's own (derandomized, keyed to the test function), so that a
change to either model can re-measure the bounds on fresh plans:

    PYTHONPATH=$PWD .venv/bin/python benchmarks/step_bounds_draws.py [--draws 200]
        [--seed 0] [--dump F]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from sim_cases import dp_sync_class  # noqa: E402
from test_simulate import multi_site_plans  # noqa: E402

from placer.sim import simulate  # noqa: E402

# (sync class, overlap, (closed - sim) / sim, simulated T_pipe, closed-form step)
Draw = tuple[str, bool, float, float, float]


def _draws(n: int, overlap: bool, out: list[Draw], at: int) -> None:
    @seed(at)
    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=multi_site_plans(overlap=overlap))
    def run(case) -> None:
        prob, p = case
        res = simulate(prob, p)
        out.append((dp_sync_class(prob, p), overlap, res.rel_diff, res.pipe_s, res.closed_form_s))

    run()


def draws(n: int, at: int) -> list[Draw]:
    out: list[Draw] = []
    for overlap in (False, True):
        _draws(n, overlap, out, at)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=200, help="draws per overlap setting")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed of the draws")
    ap.add_argument("--dump", help="write (class, overlap, rel_diff, ...) records (JSON)")
    args = ap.parse_args()
    rows = draws(args.draws, args.seed)
    if args.dump:
        Path(args.dump).write_text(json.dumps(rows))
    by: dict[tuple[str, bool], list[float]] = defaultdict(list)
    for cls, overlap, rel, *_ in rows:
        by[(cls, overlap)].append(rel)
    print("| sync of each stage | overlap | draws | min | max | within 2% |")
    print("|---|---|---:|---:|---:|---:|")
    for (cls, overlap), v in sorted(by.items()):
        within = sum(abs(x) <= 0.02 for x in v)
        print(
            f"| {cls} | {'on' if overlap else 'off'} | {len(v)} | {min(v):+.1%} | "
            f"{max(v):+.1%} | {within} |"
        )


if __name__ == "__main__":
    main()
