"""A library of tiny solver instances, in the style of cvxpy's problem library.

Each `Case` is an instance dict (the YAML schema, CONTRACT section 1) and what is expected
of it: either an optimum, which the exhaustive `brute` backend finds at test time and
every backend must match, or an infeasibility whose error message names the binding
resource.

Instances come from a seeded generator (`random_instance`) over the tiny models of
models/ (tiny-4l, tiny-8l, tiny-gqa): 1-3 sites of 8-32 GPUs in nodes of 2-8, routes of
10-1200 km with 0-3 new waves and sometimes a little existing capacity, power limits,
link budgets, every sync mode (alone or as a list for the solver to choose), objectives
`step_time` and `cost` (with `max_step_time_s`), and explicit small candidate lists. A
draw whose exhaustive search would evaluate more than `MAX_BRUTE_PLANS` plans is
redrawn (same seed, next draw), so brute force stays well under a second per case.

The `flavor` of a case turns a draw into a designed infeasibility:

* `power`: every site's power limit is below one node's draw;
* `budget`: the job needs both sites (job.gpus = all GPUs), the route has no capacity in
  place and the budget is one dollar short of the first wave;
* `memory`: the sequence length is raised until no stage of any candidate fits in HBM;
* `reach`: as `budget`, but the route is longer than any optic reaches (no budget);
* `gpus`: job.gpus exceeds the GPUs the sites offer.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import cache
from typing import Any

from shared_memo import shared_cache

from placer.io import default_catalog_data, problem_from_data
from placer.network import Network
from placer.optimize.data import build_inner
from placer.optimize.space import chain_types, enumerate_configs, memory_fits
from placer.perf.step import PerfModel

MODELS = {"tiny-4l": 4, "tiny-8l": 8, "tiny-gqa": 4}  # name -> layers
GPUS = ("h100-sxm", "h100-sxm", "h200", "a100-80g")
SYNC_MODES = ("synchronous", "diloco", "streaming-diloco")
MAX_BRUTE_PLANS = 4000  # evaluator calls of the brute backend, all configurations together
FLAVORS = ("power", "budget", "memory", "reach", "gpus")
# how the error message names the binding resource (explain_infeasible's line prefixes)
BINDING = {
    "power": "power:",
    "budget": "budget:",
    "memory": "memory:",
    "reach": "reach:",
    "gpus": "GPUs:",
}


@dataclass(frozen=True)
class Case:
    id: str
    instance: dict[str, Any]
    infeasible: str | None = None  # the resource the InfeasibleError message must name

    def __repr__(self) -> str:
        return f"Case({self.id})"


# ----------------------------------------------------------------------------- helpers


def node_power_mw(gpu: str, gpus_per_node: int, pue: float) -> float:
    """Facility draw of one node (all-in W per GPU x GPUs per node x PUE), MW."""
    return default_catalog_data()["gpus"][gpu]["all_in_w"] * gpus_per_node * pue / 1e6


def brute_plans(instance: dict[str, Any]) -> int:
    """Plans the brute backend evaluates if no configuration is pruned (its worst case)."""
    problem = problem_from_data(instance)
    perf = PerfModel(problem)
    total = 0
    for cfg in enumerate_configs(problem):
        chains = chain_types(problem, perf, cfg)
        if not chains:
            continue
        data = build_inner(problem, perf, cfg, chains)
        waves = math.prod(len(data.wave_options[r]) for r in data.routes)
        total += math.comb(len(chains) + cfg.dp - 1, cfg.dp) * waves
    return total


def _subset(rng: random.Random, values: tuple[Any, ...], k_max: int = 2) -> list[Any]:
    k = rng.randint(1, min(k_max, len(values)))
    return sorted(rng.sample(values, k))


def _pipe_reference_s(instance: dict[str, Any]) -> float | None:
    """Fastest single-site pipeline of any configuration: a scale for max_step_time_s."""
    problem = problem_from_data(instance)
    perf = PerfModel(problem)
    best = math.inf
    for cfg in enumerate_configs(problem):
        for chain in chain_types(problem, perf, cfg):
            if len(set(chain)) == 1:
                best = min(best, perf.chain_time(cfg, chain))
    return best if math.isfinite(best) else None


# ----------------------------------------------------------------------------- generator


def _draw(rng: random.Random, name: str) -> dict[str, Any]:
    model = rng.choice(sorted(MODELS))
    layers = MODELS[model]
    if rng.random() < 0.3:
        mode: Any = rng.choice(SYNC_MODES)
    else:
        mode = _subset(rng, SYNC_MODES, 3)
    par = {
        "tp": _subset(rng, (1, 2, 4)),
        "pp": _subset(rng, tuple(p for p in (1, 2, 4) if p <= layers)),
        "dp": _subset(rng, (1, 2, 4, 8)),
        "micro_batch": rng.choice(([1], [1, 2])),
    }
    job: dict[str, Any] = {
        "model": model,
        "global_batch": rng.choice((8, 16)),
        "recompute": rng.choice(("none", "selective", "full")),
        "sync": {
            "mode": mode,
            "every_steps": rng.choice((1, 4, 16)),
            "bits": rng.choice((16, 8, 4)),
        },
        "parallelism": par,
    }
    cost = rng.random() < 0.3
    # half of the draws (and every cost draw) size the sites so that the largest candidate
    # job needs all of them: that is where placement, routes and waves matter
    n_sites = rng.choice((1, 2, 2, 2, 3))
    spread = n_sites > 1 and (cost or rng.random() < 0.5)
    largest = max(par["tp"]) * max(par["pp"]) * max(par["dp"])
    base_gpu = rng.choice(GPUS)
    sites = []
    for i in range(n_sites):
        gpn = rng.choice((2, 4, 8))
        if spread:
            share = (
                largest * rng.choice((0.5, 0.75))
                if n_sites == 2
                else largest * rng.choice((0.34, 0.5))
            )
            gpus = max(gpn, math.ceil(share / gpn) * gpn)
        else:
            gpus = rng.choice((8, 16, 32))
        gpu = base_gpu if rng.random() < 0.8 else rng.choice(GPUS)
        pue = rng.choice((1.1, 1.2, 1.3))
        site: dict[str, Any] = {
            "name": f"s{i}",
            "gpu": gpu,
            "gpus": gpus,
            "gpus_per_node": gpn,
            "pue": pue,
        }
        if rng.random() < 0.3:
            fed = rng.randint(max(1, gpus // gpn - 1), gpus // gpn)
            spare_w = rng.choice(
                (0.0, 60.0, 500.0)
            )  # 0: exactly `fed` nodes, so a wave's optics tip it over
            site["power_mw"] = round(fed * node_power_mw(gpu, gpn, pue) + spare_w * pue / 1e6, 9)
        sites.append(site)
    if min(par["tp"]) > min(s["gpus_per_node"] for s in sites):
        par["tp"] = [1, *par["tp"]]  # every site must fit some candidate (io rejects it otherwise)
    if spread or rng.random() < 0.3:
        sizes = sorted({t * p * d for t in par["tp"] for p in par["pp"] for d in par["dp"]})
        fitting = [g for g in sizes if g <= sum(s["gpus"] for s in sites)]
        wide = [g for g in fitting if g > max(s["gpus"] for s in sites)]
        job["gpus"] = max(wide or fitting or sizes[:1])
    names = [s["name"] for s in sites]
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    if len(pairs) == 3 and rng.random() < 0.5:
        pairs.pop(rng.randrange(3))  # a path instead of a triangle
    routes = []
    for a, b in pairs:
        km = rng.choice((10, 60, 100, 100, 400, 1200))
        max_waves = rng.choice((1, 1, 2, 3) if spread else (0, 1, 1, 2, 3))
        route: dict[str, Any] = {
            "sites": [a, b],
            "km": km,
            "fiber_pairs": 1,
            "max_waves": max_waves,
        }
        if km > 1000 or rng.random() < 0.3:
            route["capacity_gbps"] = rng.choice((0, 10, 100, 400))
        if rng.random() < 0.2:
            route["latency_ms"] = round(km * 0.0049 * rng.choice((1.0, 1.5)), 6)
        routes.append(route)
    objective: dict[str, Any] = {"minimize": "step_time"}
    budget = rng.choice((None, None, None, 0, 80_000, 150_000, 400_000))
    if budget is not None:
        objective["max_cost_usd"] = budget
    inst = {"name": name, "sites": sites, "routes": routes, "job": job, "objective": objective}
    if cost:
        ref = _pipe_reference_s(inst)
        if ref is not None:
            objective["minimize"] = "cost"
            objective["max_step_time_s"] = round(ref * rng.choice((1.5, 4.0, 20.0)), 12)
    return inst


def _two_sites_all_gpus(rng: random.Random, name: str, km: float, **route: Any) -> dict[str, Any]:
    """Two equal sites and a job that must use every GPU of both (so traffic crosses)."""
    gpn = rng.choice((2, 4, 8))
    gpus = rng.choice((8, 16))
    gpu = rng.choice(GPUS)
    model = rng.choice(sorted(MODELS))
    tp = rng.choice([t for t in (1, 2) if t <= gpn])
    pp = rng.choice((1, 2))
    dp = 2 * gpus // (tp * pp)
    return {
        "name": name,
        "sites": [{"name": s, "gpu": gpu, "gpus": gpus, "gpus_per_node": gpn} for s in ("a", "b")],
        "routes": [
            {
                "sites": ["a", "b"],
                "km": km,
                "fiber_pairs": 1,
                "max_waves": rng.choice((1, 2)),
                **route,
            }
        ],
        "job": {
            "model": model,
            "global_batch": dp * rng.choice((1, 2)),
            "gpus": 2 * gpus,
            "sync": {
                "mode": rng.choice(
                    (["synchronous"], ["synchronous", "diloco"], ["streaming-diloco"])
                ),
                "every_steps": 4,
            },
            "parallelism": {"tp": [tp], "pp": [pp], "dp": [dp], "micro_batch": [1]},
        },
        "objective": {"minimize": "step_time"},
    }


def _flavored(rng: random.Random, name: str, flavor: str) -> dict[str, Any]:
    if flavor == "power":
        inst = _draw(rng, name)
        inst["objective"] = {"minimize": "step_time"}
        inst["job"].pop("gpus", None)
        for s in inst["sites"]:
            s["power_mw"] = round(
                rng.uniform(0.5, 0.95) * node_power_mw(s["gpu"], s["gpus_per_node"], s["pue"]), 9
            )
        return inst
    if flavor == "budget":
        inst = _two_sites_all_gpus(rng, name, rng.choice((10, 60, 100, 400)))
        problem = problem_from_data(inst)
        first_wave = Network(problem).link_capex_usd(("a", "b"), 1)
        inst["objective"] = {
            "minimize": "step_time",
            "max_cost_usd": rng.choice((0.0, first_wave - 1)),
        }
        return inst
    if flavor == "reach":
        return _two_sites_all_gpus(rng, name, rng.choice((1100, 1500, 3000)), capacity_gbps=0)
    if flavor == "gpus":
        inst = _draw(rng, name)
        inst["job"]["gpus"] = sum(s["gpus"] for s in inst["sites"]) + rng.choice((1, 8, 64))
        inst["objective"] = {"minimize": "step_time"}
        return inst
    if flavor == "memory":
        inst = _draw(rng, name)
        inst["objective"] = {"minimize": "step_time"}
        inst["job"].pop("gpus", None)
        seq = 1 << 14
        while True:
            inst["job"]["seq_len"] = seq
            problem = problem_from_data(inst)
            fits = any(
                memory_fits(problem, cfg, k, s.gpu)[0]
                for cfg in enumerate_configs(problem)
                for k in range(cfg.pp)
                for s in problem.instance.sites
            )
            if not fits:
                return inst
            seq *= 2
    raise ValueError(f"unknown flavor {flavor!r}")


@cache
def _random_instance(seed: int, flavor: str | None) -> dict[str, Any]:
    rng = random.Random(f"placer-solver-cases/{flavor}/{seed}")
    # a neutral name: error messages quote it, and must not pass for naming a resource
    name = f"case-{FLAVORS.index(flavor) + 1 if flavor else 0}-{seed}"
    for _ in range(200):
        inst = _flavored(rng, name, flavor) if flavor else _draw(rng, name)
        if brute_plans(inst) <= MAX_BRUTE_PLANS:
            return inst
    raise RuntimeError(f"no small enough draw for seed {seed}")


def random_instance(seed: int, flavor: str | None = None) -> dict[str, Any]:
    """A tiny instance, a pure function of (seed, flavor); a fresh copy on every call."""
    import copy

    return copy.deepcopy(_random_instance(seed, flavor))


# ----------------------------------------------------------------------------- the library

N_GENERATED = 40
N_PER_FLAVOR = 2


# tiny-moe (models/tiny-moe.yaml) with 16 experts and node-limited routing to one node
TINY_MOE16: dict[str, Any] = {
    "layers": 4,
    "hidden": 256,
    "heads": 4,
    "vocab": 1024,
    "seq_len": 256,
    "moe": {
        "experts": 16,
        "top_k": 2,
        "expert_ffn_hidden": 256,
        "first_dense_layers": 1,
        "max_nodes_per_token": 1,
    },
}


def _parallel_5d(
    name: str, model: str | dict[str, Any], par: dict[str, Any], gpus_per_node: int, **job: Any
) -> dict[str, Any]:
    """Two sites of 16 GPUs, 100 km apart with up to two new waves; the job needs 16 or
    more GPUs, so replicas spread over both sites or stages cross the route."""
    return {
        "name": name,
        "sites": [
            {"name": s, "gpu": "h100-sxm", "gpus": 16, "gpus_per_node": gpus_per_node, "pue": 1.2}
            for s in ("a", "b")
        ],
        "routes": [{"sites": ["a", "b"], "km": 100, "fiber_pairs": 1, "max_waves": 2}],
        "job": {
            "model": model,
            "global_batch": 16,
            "recompute": "selective",
            "parallelism": {"micro_batch": [1], **par},
            "sync": {"mode": "synchronous"},
            **job,
        },
        "objective": {"minimize": "step_time"},
    }


# Expert and context parallelism (issue 16): EP inside a node and over the NICs (ep 8 on
# 4-GPU nodes: a replica stage spans two nodes), CP with its ring on NVLink, mixed with TP,
# PP and a sync-mode choice; the exhaustive search sees every (tp, cp, ep) of the lists.
PARALLEL_5D = [
    Case(
        "ep-nvlink-nic",
        _parallel_5d(
            "case-ep",
            "tiny-moe",
            {"tp": [1, 2], "pp": [1, 2], "ep": [1, 2, 4, 8], "dp": [1, 2]},
            4,
            gpus=32,
        ),
    ),
    Case(
        "cp-ring",
        _parallel_5d(
            "case-cp",
            "tiny-gqa",
            {"tp": [1, 2], "pp": [1, 2], "cp": [1, 2, 4], "dp": [2, 4, 8], "stage_layers": "even"},
            8,
            seq_len=2048,
            gpus=32,
            sync={"mode": ["synchronous", "diloco"], "every_steps": 4},
        ),
    ),
    Case(
        "ep-cp-cost",
        {
            **_parallel_5d(
                "case-ep-cp",
                "tiny-moe",
                {"tp": [1], "pp": [1, 2], "cp": [1, 2], "ep": [1, 2, 4], "dp": [1, 2, 4]},
                8,
                seq_len=1024,
                gpus=32,
            ),
            "objective": {"minimize": "cost", "max_step_time_s": 0.05},
        },
    ),
    # the MoE fidelity terms (issue 16 items 2 and 6): the all-to-all overlap (on where
    # Megatron-Core accepts it: pp 1, or pp 2 with virtual stages 2), per-node dedup with
    # node-limited routing (16 experts, ep 16 spans two 8-GPU NVLink domains) and FP8 dispatch
    Case(
        "ep-overlap-dedup",
        _parallel_5d(
            "case-ep-overlap",
            {**TINY_MOE16, "name": "tiny-moe16"},
            {"tp": [1], "pp": [1, 2], "ep": [1, 4, 16], "dp": [1, 2], "virtual_stages": [1, 2]},
            8,
            precision="fp8",
            overlap={"ep_comm": True},
            moe_dispatcher="deepep",
            moe_dispatch_precision="fp8",
        ),
    ),
]


# Megatron-Core's EP folding (issue 16 item 2, job.parallelism.etp): a wide MoE (128
# gated experts of width 12288, 58B routed parameters) on two sites of 8 H100s: the unfolded
# tp 2 x ep 8 replica stage is 16 GPUs (no site has them) and the unfolded tp 2 x ep 4 one
# holds 1/4 of the experts per GPU (over 80 GB); folded, tp 2 with ep 8 x etp 1 or ep 4 x
# etp 2 is an 8-GPU stage with 1/8 of the experts per GPU, pipelined over both sites.
WIDE_MOE = {
    "name": "wide-moe",
    "layers": 4,
    "hidden": 4096,
    "heads": 32,
    "gated_ffn": True,
    "moe": {"experts": 128, "top_k": 2, "expert_ffn_hidden": 12288, "first_dense_layers": 1},
    "vocab": 1024,
    "seq_len": 256,
    "tied_embeddings": False,
}
ETP_CASES = [
    Case(
        "etp-fold",
        {
            "name": "case-etp",
            "sites": [
                {"name": s, "gpu": "h100-sxm", "gpus": 8, "gpus_per_node": 8, "pue": 1.2}
                for s in ("a", "b")
            ],
            "routes": [{"sites": ["a", "b"], "km": 100, "fiber_pairs": 1, "max_waves": 2}],
            "job": {
                "model": WIDE_MOE,
                "global_batch": 16,
                "recompute": "selective",
                "gpus": 16,
                "parallelism": {
                    "micro_batch": [1],
                    "tp": [2],
                    "pp": [1, 2],
                    "ep": [2, 4, 8],
                    "etp": [1, 2],
                    "dp": [1, 2],
                },
                "sync": {"mode": "synchronous"},
            },
            "objective": {"minimize": "step_time"},
        },
    )
]
BY_ID_5D = {c.id: c for c in ETP_CASES}


def hsdp_instance(sync: dict[str, Any], pp: list[int], dp_shard: list[int]) -> dict[str, Any]:
    """An 18.4B model (SC21) on two sites of 16 H100s: at tp 1 its ZeRO-1 state over 32
    ranks (4.375 B/param, 80 GB) does not fit one GPU, so a replica either pipelines over
    two stages (inside a site or across the route) or shards its state with FSDP over 8
    or 16 GPUs of a site (HSDP: the replicas all-reduce their shards across the route)."""
    return _parallel_5d(
        "case-hsdp",
        "sc21-18.4b",
        {"tp": [1], "pp": pp, "dp_shard": dp_shard, "stage_layers": "even"},
        8,
        global_batch=64,
        gpus=32,
        sync=sync,
    )


# FSDP / HSDP (issue 16 item 4), all on job.gpus = 32: with DiLoCo's outer sync every 4
# steps HSDP (one stage, shards over a node, replicas in both sites) beats the pipelines;
# with a synchronous all-reduce of the whole gradient over the route every step it loses to
# a pipeline of two stages; with pp 1 only sharding fits memory (dp_shard 16 spans two
# nodes: NIC-bound).
HSDP_CASES = [
    Case(
        "hsdp-diloco-wins",
        hsdp_instance({"mode": "diloco", "every_steps": 4}, [1, 2], [1, 8]),
    ),
    Case("hsdp-sync-loses", hsdp_instance({"mode": "synchronous"}, [1, 2], [1, 8])),
    Case("hsdp-memory", hsdp_instance({"mode": "synchronous"}, [1], [1, 8, 16])),
]


def cases() -> list[Case]:
    out = [Case(f"gen-{seed}", random_instance(seed)) for seed in range(N_GENERATED)]
    out += PARALLEL_5D + HSDP_CASES + ETP_CASES
    for flavor in FLAVORS:
        for seed in range(N_PER_FLAVOR):
            out.append(
                Case(f"{flavor}-{seed}", random_instance(seed, flavor), infeasible=BINDING[flavor])
            )
    out += [
        Case("interleave-one-site", interleave_instance(None)),
        Case("interleave-two-sites-20km", interleave_instance(20.0)),
        Case("interleave-two-sites-200km", interleave_instance(200.0)),
    ]
    return (
        out
        + UNEVEN_SPLIT_CASES
        + PART_FILLED_CASES
        + SITE_RING_CASES
        + UNEVEN_CHUNK_CASES
        + DUALPIPEV_CASES
        + BUCKET_LATENCY_CASES
        + STAGGER_RESILIENCE_CASES
        + GROUP_LATENCY_CASES
        + WAN_NIC_CASES
    )


@cache
def cases_by_id() -> dict[str, Case]:
    """The library's cases by id (brute_solve's key: a string, so that it pickles and hashes)."""
    return {c.id: c for c in cases()}


@shared_cache
def brute_solve(case_id: str) -> Any:
    """The brute-force backend's answer on a case (a SolveResult, or the exception it
    raised), once per test run: test_solver_library, test_pinned_plan and
    test_presolve_heuristic all need it."""
    from placer.optimize.driver import solve

    case = cases_by_id()[case_id]
    try:
        return solve(problem_from_data(case.instance), backend="brute")
    except Exception as exc:  # the caller decides what an infeasible case means
        return exc


# 8 layers of h = 2048 at s = 2048: ~1 ms per stage forward, 8 MB pipeline messages, so that
# interleaving's halved bubble and its extra messages (and WAN crossings) both matter
INTERLEAVE_MODEL = {
    "name": "il-small",
    "layers": 8,
    "hidden": 2048,
    "heads": 16,
    "vocab": 32000,
    "seq_len": 2048,
}


def interleave_instance(
    km: float | None, virtual_stages: list[int] | None = None
) -> dict[str, Any]:
    """pp 4 with m = 8 micro-batches and interleaving candidates [1, 2]: on one site (km None:
    one 8-GPU node, dp 2) the halved bubble wins; across two sites of two 4-GPU nodes (dp 4,
    traffic must cross the route) v = 2 sends every micro-batch over the WAN three times each
    way (the boundary twice, the wrap once), so the route's length decides (tests/
    test_interleave.py pins which side wins)."""
    par = {
        "tp": [1],
        "pp": [4],
        "micro_batch": [1],
        "virtual_stages": virtual_stages or [1, 2],
        "stage_layers": "even",  # interleaving vs not, on the balanced split (see layers cases)
    }
    if km is None:
        return {
            "name": "case-interleave-1",
            "sites": [{"name": "a", "gpu": "h100-sxm", "gpus": 8, "gpus_per_node": 8}],
            "routes": [],
            "job": {
                "model": dict(INTERLEAVE_MODEL),
                "global_batch": 16,
                "gpus": 8,
                "parallelism": {**par, "dp": [2]},
                "sync": {"mode": "synchronous"},
            },
            "objective": {"minimize": "step_time"},
        }
    return {
        "name": "case-interleave-2",
        "sites": [
            {"name": s, "gpu": "h100-sxm", "gpus": 8, "gpus_per_node": 4} for s in ("a", "b")
        ],
        "routes": [{"sites": ["a", "b"], "km": km, "max_waves": 2, "fiber_pairs": 1}],
        "job": {
            "model": dict(INTERLEAVE_MODEL),
            "global_batch": 16,
            "gpus": 16,
            "parallelism": {**par, "dp": [4]},
            "sync": {"mode": "synchronous"},
        },
        "objective": {"minimize": "step_time"},
    }


def _two_nodes_each(
    name: str, route: dict[str, Any], power_mw: float | None = None
) -> dict[str, Any]:
    """Two sites of two 4-GPU nodes, and a 16-GPU job: traffic must cross the route."""
    return {
        "name": name,
        "sites": [
            {"name": s, "gpu": "h100-sxm", "gpus": 8, "gpus_per_node": 4, "power_mw": power_mw}
            for s in ("a", "b")
        ],
        "routes": [{"sites": ["a", "b"], "km": 100, **route}],
        "job": {
            "model": "tiny-4l",
            "global_batch": 8,
            "gpus": 16,
            "parallelism": {"tp": [1], "pp": [2], "dp": [8], "micro_batch": [1]},
        },
        "objective": {"minimize": "step_time"},
    }


# Infeasible instances whose error message once failed to name the binding resource
# (explain.py looked only at reach, GPU counts, memory and power for nodes); kept as
# regression cases with the reason they were added.
KNOWN_GAPS = [
    (
        # the route can carry nothing: max_waves 0 and no capacity in place (the optics reach)
        Case(
            "gap-no-waves", _two_nodes_each("case-gap-1", {"max_waves": 0}), infeasible="route a-b"
        ),
        "explain_infeasible names a route only when no optic reaches it, not when max_waves is 0",
    ),
    (
        # each site's power feeds exactly its two nodes: the coherent modules of a wave tip it over
        Case(
            "gap-optics-power",
            _two_nodes_each(
                "case-gap-2", {"max_waves": 1}, power_mw=node_power_mw("h100-sxm", 4, 1.2) * 2
            ),
            infeasible="power:",
        ),
        "explain_infeasible counts node power only, not the optics' module power",
    ),
]


# ----------------------------------------------------------------------------- uneven splits


def mixed_gpu_pair(
    name: str,
    gpus: tuple[str, str] = ("a100-80g", "h100-sxm"),
    model: str = "tiny-4l",
    global_batch: int = 8,
    dp: int = 1,
    micro_batch: int = 1,
    km: float = 10,
    site_gpus: tuple[int, int] = (4, 4),
) -> dict[str, Any]:
    """Two sites of 4-GPU nodes, different GPU types, and a tp 4 pp 2 job that needs both:
    the stage on the slower GPU should get fewer layers (issue 12's failing case)."""
    return {
        "name": name,
        "sites": [
            {"name": f"s{i}", "gpu": g, "gpus": n, "gpus_per_node": 4}
            for i, (g, n) in enumerate(zip(gpus, site_gpus, strict=True))
        ],
        "routes": [{"sites": ["s0", "s1"], "km": km, "fiber_pairs": 1, "max_waves": 2}],
        "job": {
            "model": model,
            "global_batch": global_batch,
            "gpus": 8 * dp,
            "sync": {"mode": "synchronous"},
            "parallelism": {"tp": [4], "pp": [2], "dp": [dp], "micro_batch": [micro_batch]},
        },
        "objective": {"minimize": "step_time"},
    }


# heterogeneous cases whose optimum needs an uneven split (test_solver_library checks that
# brute force finds an uneven one, so the generator cannot silently lose them)
UNEVEN_SPLIT_CASES = [
    Case("split-a100-h100", mixed_gpu_pair("case-split-0")),
    Case("split-h100-a100-8l", mixed_gpu_pair("case-split-1", ("h100-sxm", "a100-80g"), "tiny-8l")),
    # two replicas, one across both sites and one inside the B200 site, share the split
    Case(
        "split-a100-b200-dp2",
        mixed_gpu_pair("case-split-2", ("a100-80g", "b200"), dp=2, site_gpus=(4, 12)),
    ),
    Case(
        "split-h200-a100-8l-mb2",
        mixed_gpu_pair("case-split-3", ("h200", "a100-80g"), "tiny-8l", 16, micro_batch=2),
    ),
]


# ----------------------------------------------------------------------------- part-filled nodes


def part_filled_instance(
    km: float = 100.0,
    dp: int = 5,
    overlap: bool = False,
    site_gpus: int = 12,
    max_waves: int = 2,
) -> dict[str, Any]:
    """Two sites of three 4-GPU nodes, a tp 1 pp 2 job of dp replicas: q = 4 replicas a
    node. dp 5 at one site leaves each stage a node of 1, whose one NIC carries that
    node's 4 shard rings (PerfModel.node_fill: 4x the NIC phase); split 3 / 2 each site's
    members of a stage share one node (no NIC ring) and the sync crosses the route, the
    WAN phase's NIC term through b's 2 members' NICs (PerfModel.wan_nic_s). Priced as
    whole nodes the optimum keeps all 5 at one site; priced by the fill it splits them
    (test_solver_library checks that the pricing decides). dp 6: the fill (2x) is priced.
    job.overlap off: the whole sync is exposed, so the NIC phases decide; with overlap on
    every bucket of the split stage pays the WAN latency (PerfModel.dp_lat_repeats: the
    bucket-latency cases, `overlap`, and `site_gpus` 4 or 8 to force the split;
    `max_waves` 1 where the route, not the split sites' NICs, is to bound the WAN
    phase)."""
    return {
        "name": "case-part-filled",
        "sites": [
            {"name": s, "gpu": "h100-sxm", "gpus": site_gpus, "gpus_per_node": 4}
            for s in ("a", "b")
        ],
        "routes": [{"sites": ["a", "b"], "km": km, "fiber_pairs": 1, "max_waves": max_waves}],
        "job": {
            "model": dict(INTERLEAVE_MODEL),
            "global_batch": 8 * dp,
            "gpus": 2 * dp,
            "sync": {"mode": "synchronous"},
            "overlap": {"grad_reduce": overlap, "param_gather": overlap, "tp_comm": overlap},
            "parallelism": {"tp": [1], "pp": [2], "dp": [dp], "micro_batch": [1]},
        },
        "objective": {"minimize": "step_time"},
    }


PART_FILLED_CASES = [
    Case("part-filled-100km", part_filled_instance()),
    Case("part-filled-20km", part_filled_instance(20.0)),
    Case("part-filled-100km-dp6", part_filled_instance(dp=6)),
]
PART_FILLED_MOVES = [c for c in PART_FILLED_CASES if c.instance["job"]["gpus"] == 10]


# the site's own NIC ring (PerfModel.site_ring_nodes): pp 1, dp 16 replicas of 1 GPU on
# sites of three 4-GPU nodes, so the stage splits (at most 12 at a site). Ringed over all
# 16 replicas' 4 nodes every split pays 2 x 3/4 of the node shard (12 / 4 and 8 / 8 tie);
# with each site ringing its own nodes 8 / 8 pays 2 x 1/2 while 12 / 4's site a rings its
# 3 nodes, 2 x 2/3 (site b's one node has no NIC ring: its WAN shard is the WAN phase's
# NIC term), so 8 / 8 becomes the optimum (test_site_ring_decides_the_optimum)
def _site_ring() -> dict[str, Any]:
    inst = part_filled_instance(100.0, dp=16)
    inst["job"]["parallelism"]["pp"] = [1]
    inst["job"]["gpus"] = 16
    inst["job"]["global_batch"] = 64
    return inst


SITE_RING_CASES = [Case("site-ring-100km-dp16", _site_ring())]


# ----------------------------------------------------------------------------- uneven chunks


def uneven_chunk_instance(km: float | None) -> dict[str, Any]:
    """The interleave instance at pp 2 with virtual_stages [3] only: 8 layers do not split
    into 3 equal chunks per rank, so every plan runs uneven chunks (parallelism.
    chunk_layers, placer.perf.step.balanced_chunk_layers: 1, 2, 2 / 1, 1, 1) and brute
    force, CP-SAT and the MILP price the same uneven pipeline (issue 16)."""
    inst = interleave_instance(km, [3])
    par = inst["job"]["parallelism"]
    par["pp"] = [2]
    par["dp"] = [inst["job"]["gpus"] // 2]
    return inst


UNEVEN_CHUNK_CASES = [
    Case("interleave-uneven-one-site", uneven_chunk_instance(None)),
    Case("interleave-uneven-two-sites-20km", uneven_chunk_instance(20.0)),
]


# ----------------------------------------------------------------------------- DualPipeV


def dualpipev_instance(km: float | None = None) -> dict[str, Any]:
    """The interleave instance (pp 4) with job.parallelism.pipeline_schedule [1f1b,
    dualpipev] and m = 8 = 2 pp micro-batches, DualPipeV's minimum (issue 16 item 6;
    tests/test_dualpipev.py). One site (one 8-GPU node, dp 2): DualPipeV's bubble (p - 1)(F
    + 2B - 3W) of half-stage chunks undercuts interleaving's and 1F1B's, so it wins. Two
    sites (dp 4, the chain crosses the route once): DualPipeV sends every micro-batch over
    the crossing twice each way (down the V and back up, with lockstep contention of two
    messages a tick), so the route's length decides: it wins at 200 km, 1F1B at 1000 km."""
    inst = interleave_instance(km)
    inst["name"] = "case-dualpipev-1" if km is None else "case-dualpipev-2"
    inst["job"]["parallelism"]["pipeline_schedule"] = ["1f1b", "dualpipev"]
    if km is not None:
        inst["job"]["global_batch"] = 32
    return inst


DUALPIPEV_CASES = [
    Case("dualpipev-one-site", dualpipev_instance()),
    Case("dualpipev-two-sites-200km", dualpipev_instance(200.0)),
    Case("dualpipev-two-sites-1000km", dualpipev_instance(1000.0)),
]


# overlap on: every bucket of a stage synced across the sites pays the WAN latency
# (PerfModel.dp_lat_repeats); at 30 km on one wave, every stage's exchange at once (the
# stagger off), it keeps all 5 replicas at one site, and with 4 GPUs a site (pp 1) the
# split it forces is priced with it. One wave: on two, the split sites' NICs (2 and 3
# members: PerfModel.wan_nic_s) bound the WAN phase, each stage's on its own members'
# NICs, so every stage's at once costs the same as staggered and the stagger decides
# nothing (brute force over 10-100 km: the split at 20-80 km either way)
def _bucket_latency_split() -> dict[str, Any]:
    """pp 1: 5 replicas of 1 GPU on sites of 4 GPUs, so the one stage syncs across both."""
    inst = part_filled_instance(100.0, dp=5, overlap=True, site_gpus=4)
    inst["job"]["parallelism"]["pp"] = [1]
    inst["job"]["gpus"] = 5
    inst["job"]["global_batch"] = 20
    return inst


BUCKET_LATENCY_CASES = [
    Case("bucket-latency-30km", part_filled_instance(30.0, overlap=True, max_waves=1)),
    Case("bucket-latency-split", _bucket_latency_split()),
]


# the staggered WAN phase (PerfModel.dp_release_s) under resilience: the survival limit is
# (1 + max_slowdown) x the healthy step, which is staggered, while a failure scenario
# prices every stage's exchange at once (placer.resilience), so both formulations need
# the healthy step exact (milp/cpsat _exact_step: T_dpst's and T_gst's one-hots). On
# part_filled_instance(20 km, overlap on, 2 waves) the optimum splits both stages 3 at b /
# 2 at a; its step with one of its 2 waves lost is 1.0645 x its healthy step, so it
# survives at 7% and not at 6% (an overstated T_dpst would let it through at 6%, an
# understated one would reject it at 7%), and at 6% the optimum splits stage 0 3 / 2 and
# stage 1 4 / 1: its stage 1's NIC and WAN work runs under the drain, per release group
# (PerfModel.step; test_nic_phase_per_release_group_moves_the_optimum). At 4% no split
# survives (brute force over 3-20%). (Before the per-stage series of each release group
# the 6% optimum split stage 0 alone; before the WAN phase's NIC term, PerfModel.wan_nic_s,
# the cases were 12% and 8%; before the staggered parameter gather, 10% and 6%:
# benchmarks/README.md, branches gather, nic and series.)
def _stagger_resilience(slowdown: float) -> dict[str, Any]:
    inst = part_filled_instance(20.0, overlap=True)
    inst["resilience"] = {"survive": ["wave"], "collective": "ring", "max_slowdown": slowdown}
    return inst


# a NIC or a wave lost, 3%: no plan survives (brute force: none at 3-4%, a plan from 5%;
# a lost NIC slows the WAN phase's NIC term too, PerfModel.step). The MILP once returned the
# single-site plan here (ModelMismatchError): an unused route's exact time (hull cell of
# zero waves, zero capacity) was free, the staggered WAN phase's max picked it up, and the
# overstated healthy step relaxed the survival limit (milp._hull, exact)
def _nic_survival(slowdown: float) -> dict[str, Any]:
    inst = part_filled_instance(20.0, overlap=True)
    inst["resilience"] = {
        "survive": ["wave", "nic"],
        "collective": "ring",
        "max_slowdown": slowdown,
    }
    return inst


STAGGER_RESILIENCE_CASES = [
    Case("stagger-resilience-7pct", _stagger_resilience(0.07)),
    Case("stagger-resilience-6pct", _stagger_resilience(0.06)),
    Case("nic-survival-3pct", _nic_survival(0.03), infeasible="no feasible plan"),
]


# the WAN latency per release group (PerfModel.step, sync_staggered_s): dp 8 over two sites
# of 12 GPUs (three 4-GPU nodes) at 100 km on one wave, overlap off. Stage 0 at b alone
# (8: two full nodes) and stage 1 split 4 at a / 4 at b syncs stage 1 across the route,
# but stage 1 is released delta_1 before stage 0 and its two WAN rounds run under the
# drain: with each group's own latency that plan is the optimum (and the simulator
# agrees it beats splitting both stages 4 / 4); with the latency charged to every group
# (before) it was slower than that, 2 lat on top of stage 0's NIC phase
# (test_wan_latency_per_release_group_moves_the_optimum). (dp 6 on 8-GPU sites at 50 km
# was the case before the WAN phase's NIC term, PerfModel.wan_nic_s: now both stages
# split 3 / 3 there, each site's members one node with no NIC ring; brute force over dp
# 6-8, sites of 8-16, 30-200 km, 1-2 waves found only this family of the kind.)
GROUP_LATENCY_CASES = [
    Case("group-latency-100km", part_filled_instance(100.0, dp=8, site_gpus=12, max_waves=1)),
]


# the WAN phase's NIC term (PerfModel.wan_nic_s): dp 6 over two sites of 8 GPUs (two 4-GPU
# nodes) at 50 km, overlap off. Without the term the optimum splits both stages 4 at a /
# 2 at b (b's 2 members of each stage one node: no NIC ring, and before the term nothing
# charged their NICs for the WAN phase); with it, 3 / 3, whose slowest site sends its
# shard through 3 members' NICs, not 2, and the 4 / 2 split is slower under the term
# than that (the simulator agrees: test_wan_nic_term_decides_the_optimum)
WAN_NIC_CASES = [
    Case("wan-nic-50km", part_filled_instance(50.0, dp=6, site_gpus=8)),
]
