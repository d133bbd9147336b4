"""Re-time the random plans of a `sim_vs_closed.py --dump` with the evaluator on the
path (a scratch copy with a candidate rule applied, e.g. benchmarks/experiments/*.diff),
against placer's closed form and the simulation recorded in the dump.

    .venv/bin/python benchmarks/sim_vs_closed.py --random-only --random 1000 --seed 2 \\
        --overlap off --dump /tmp/off.json
    mkdir /tmp/scratch && git archive HEAD | tar -x -C /tmp/scratch
    (cd /tmp/scratch && git apply benchmarks/experiments/sync_rule_e.diff)
    PYTHONPATH=/tmp/scratch .venv/bin/python benchmarks/retime_dump.py /tmp/off.json

Prints within / above / below 2% of the simulated step, min and max, for placer (the
dump) and for the evaluator on the path. Numbers in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # sim_cases: programmatic instances for the random set
sys.path.insert(0, str(ROOT / "benchmarks"))

from sim_cases import plan as make_plan  # noqa: E402
from sim_cases import problem as make_problem  # noqa: E402
from sim_vs_closed import draw_plan  # noqa: E402

from placer.evaluate import evaluate  # noqa: E402


def summary(name: str, diffs: list[float]) -> str:
    within = sum(abs(x) <= 0.02 for x in diffs)
    above = sum(x > 0.02 for x in diffs)
    below = sum(x < -0.02 for x in diffs)
    return (
        f"{name}: within {within} / above {above} / below {below} (2%), "
        f"min {min(diffs):+.1%}, max {max(diffs):+.1%}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dump", help="a sim_vs_closed.py --dump file (one seed, one overlap)")
    args = ap.parse_args()
    records = json.loads(Path(args.dump).read_text())
    seed, overlap = records[0]["seed"], records[0]["overlap"]
    by_plan = {r["plan"]: r for r in records}
    rng = random.Random(seed)  # random_set's draw order
    base, new, changed = [], [], 0
    for idx in range(max(by_plan) + 1):
        sites, routes, pp, m, tp, groups, links = draw_plan(rng)
        if idx not in by_plan:
            continue
        rec = by_plan[idx]
        glob = m * sum(c for c, _ in groups)
        prob = make_problem(sites, routes, global_batch=glob, overlap=overlap)
        step = evaluate(prob, make_plan(tp, [8 // pp] * pp, groups, m, links)).step_time_s
        base.append(rec["closed_s"] / rec["sim_s"] - 1)
        new.append(step / rec["sim_s"] - 1)
        changed += abs(step - rec["closed_s"]) > 1e-12 * rec["closed_s"]
    print(f"seed {seed}, overlap {'on' if overlap else 'off'}, {len(base)} plans")
    print(summary("placer (dump)", base))
    print(summary("evaluator on the path", new))
    print(f"plans whose closed form changed: {changed}")


if __name__ == "__main__":
    main()
