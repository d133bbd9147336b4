"""FSDP / HSDP (issue 16 item 4): what the optimizer does with job.parallelism.dp_shard.

    .venv/bin/python benchmarks/hsdp_bench.py

1. The solver library's HSDP cases (tests/solver_cases.py HSDP_CASES) with every backend:
   status, step time, plan, seconds.
2. Llama 3 70B over two sites of 512 H100 joined by 100 km (synchronous, then DiLoCo every
   8 steps), solved by CP-SAT without and with FSDP shard groups offered: which layout
   wins and by how much.
Prints markdown tables (benchmarks/README.md records them).
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import solver_cases as sc  # noqa: E402

from placer.errors import InfeasibleError  # noqa: E402
from placer.io import problem_from_data  # noqa: E402
from placer.optimize.driver import solve  # noqa: E402


def _plan_text(res: Any) -> str:
    p = res.plan.parallelism
    shard = f" fsdp{p.dp_shard}" if (p.dp_shard or 1) > 1 else ""
    chains = ", ".join(f"{g.count}x{'/'.join(g.stage_sites)}" for g in res.plan.replica_groups)
    return f"tp{p.tp}{shard} pp{p.pp} dp{p.dp} {res.plan.sync_mode} [{chains}]"


def _row(name: str, inst: dict[str, Any], backend: str, limit: float = 120.0) -> str:
    t = time.perf_counter()
    try:
        res = solve(problem_from_data(copy.deepcopy(inst)), backend=backend, time_limit_s=limit)
    except InfeasibleError as exc:
        return f"| {name} | {backend} | infeasible | {time.perf_counter() - t:.2f} | - | {str(exc).splitlines()[0][:60]} |"  # noqa: E501
    secs = time.perf_counter() - t
    return f"| {name} | {backend} | {res.status} | {secs:.2f} | {res.objective:.4f} | {_plan_text(res)} |"  # noqa: E501


def llama70b(dp_shard: list[int], sync: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "llama3-70b-two-sites",
        "sites": [{"name": s, "gpu": "h100-sxm", "gpus": 512, "pue": 1.2} for s in ("a", "b")],
        "routes": [{"sites": ["a", "b"], "km": 100, "fiber_pairs": 2}],
        "job": {
            "model": "llama3-70b",
            "global_batch": 512,
            "recompute": "selective",
            "gpus": 1024,
            "sync": sync,
            "parallelism": {
                "tp": [1, 2, 4, 8],
                "pp": [1, 2, 4, 8],
                "micro_batch": [1],
                "dp_shard": dp_shard,
                "stage_layers": "even",
            },
        },
        "objective": {"minimize": "step_time"},
    }


def main() -> None:
    print("| case | backend | status | seconds | step s | plan |")
    print("|---|---|---|---:|---:|---|")
    for case in sc.HSDP_CASES:
        for backend in ("brute", "cpsat", "milp"):
            print(_row(case.id, case.instance, backend), flush=True)
    print()
    print("| case | backend | status | seconds | step s | plan |")
    print("|---|---|---|---:|---:|---|")
    for label, sync in (
        ("sync", {"mode": "synchronous"}),
        ("diloco/8", {"mode": "diloco", "every_steps": 8}),
    ):
        for shards in ([1], [1, 8, 16, 32]):
            name = f"llama3-70b {label} dp_shard {shards}"
            print(_row(name, llama70b(shards, sync), "cpsat", 300.0), flush=True)


if __name__ == "__main__":
    main()
