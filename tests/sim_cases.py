"""Programmatic multi-site instances and plans for the simulator tests (placer's own
schema, a small inline model so that one simulated step takes a fraction of a second)."""

from __future__ import annotations

from typing import Any

from placer.io import Problem, problem_from_data

# 8 layers of h = 2048 at s = 2048: ~1 ms per stage forward on an H100, 8 MB messages, so
# that WAN transfers (0.1-40 ms at 1-64 replicas per wave) and fiber latency (0.25-5 ms)
# range from negligible to dominant.
SMALL_MODEL = {
    "name": "sim-small",
    "layers": 8,
    "hidden": 2048,
    "heads": 16,
    "vocab": 32000,
    "seq_len": 2048,
}


def problem(
    sites: list[str],
    routes: list[tuple[str, str, float]],
    global_batch: int,
    gpus_per_site: int = 4096,
    capacity_gbps: float = 0.0,
    sync: str = "synchronous",
    every_steps: int = 1,
    bits: int = 16,
    model: dict[str, Any] | None = None,
    gpu: str = "h100-sxm",
    overlap: bool = False,
    replica_schedule: str = "lockstep",
    zero1: bool = True,
    solver: dict[str, Any] | None = None,
) -> Problem:
    """Sites of one GPU type, routes (a, b, km) with 8 fiber pairs, no limits that bind.
    The overlap of the sync with compute (job.overlap) is off unless asked for, so that
    the exact cases see the whole sync."""
    return problem_from_data(
        {
            "name": "sim-case",
            "sites": [{"name": s, "gpu": gpu, "gpus": gpus_per_site} for s in sites],
            "routes": [
                {"sites": [a, b], "km": km, "fiber_pairs": 8, "capacity_gbps": capacity_gbps}
                for a, b, km in routes
            ],
            "job": {
                "model": model or SMALL_MODEL,
                "global_batch": global_batch,
                "sync": {"mode": sync, "every_steps": every_steps, "bits": bits},
                "overlap": {"grad_reduce": overlap, "param_gather": overlap, "tp_comm": overlap},
                "replica_schedule": replica_schedule,
                "zero1": zero1,
            },
            **({"solver": solver} if solver else {}),
        }
    )


def plan(
    tp: int,
    stage_layers: list[int],
    groups: list[tuple[int, list[str]]],
    micro_batches: int,
    links: dict[tuple[str, str], int] | None = None,
    sync_mode: str | None = None,
) -> dict[str, Any]:
    """A plan dict: `groups` are (count, stage sites); `links` waves per route."""
    dp = sum(c for c, _ in groups)
    out: dict[str, Any] = {
        "parallelism": {
            "tp": tp,
            "pp": len(stage_layers),
            "dp": dp,
            "micro_batch": 1,
            "num_micro_batches": micro_batches,
        },
        "stage_layers": stage_layers,
        "replica_groups": [{"count": c, "stage_sites": s} for c, s in groups],
        "links": [{"sites": list(k), "waves": w} for k, w in (links or {}).items()],
    }
    if sync_mode:
        out["sync_mode"] = sync_mode
    return out


def dp_sync_class(prob, p: dict[str, Any]) -> str:
    """How each stage's data-parallel sync runs, the cases benchmarks/README.md's
    "data-parallel sync of each stage" table splits by: inside one site or across sites,
    in whole nodes or with a part-filled node (some site's member count of some stage not
    a multiple of the replicas per node, gpus_per_node / tp)."""
    tp = p["parallelism"]["tp"]
    q = max(1, prob.catalog.gpus["h100-sxm"].gpus_per_node // tp)
    groups = [(g["count"], g["stage_sites"]) for g in p["replica_groups"]]
    one_site, partial = True, False
    for k in range(len(groups[0][1])):
        per_site: dict[str, int] = {}
        for c, chain in groups:
            per_site[chain[k]] = per_site.get(chain[k], 0) + c
        one_site &= len(per_site) == 1
        partial |= any(n % q for n in per_site.values())
    where = "inside one site" if one_site else "across sites"
    return f"{where}, {'a part-filled node' if partial else 'full nodes'}"
