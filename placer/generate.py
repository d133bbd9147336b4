"""Random instance generator for benchmarks and studies: S sites, a connected route graph,
GPUs and power per site. Deterministic for a seed.

Site positions are drawn on a plane (km); routes join each site to its nearest
neighbours (a spanning tree plus extra edges) with fiber km = 1.3 x straight line, the
median conduit detour of Bozkurt et al. (arXiv 1811.10737, cited in reference/hardware.md).
"""

from __future__ import annotations

import math
from typing import Any

import networkx as nx
import numpy as np

from placer.io import default_catalog_data

ROUTE_DETOUR = 1.3  # fiber km per straight-line km (Bozkurt et al., arXiv 1811.10737)
SITE_PUE = 1.2  # new liquid-cooled AI sites run 1.1-1.2 (hardware.md); the schema's default


def random_instance(
    sites: int,
    total_gpus: int,
    model: str = "dense-2t",
    seed: int = 0,
    region_km: float = 600.0,
    gpu: str = "b200",
    global_batch: int | None = None,
    tp: list[int] | None = None,
    pp: list[int] | None = None,
    sync: list[str] | None = None,
    extra_route_ratio: float = 0.5,
    max_sites_per_replica: int = 2,
    time_limit_s: float = 60.0,
    budget_usd: float | None = None,
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    pos = rng.uniform(0, region_km, size=(sites, 2))
    names = [f"s{i:02d}" for i in range(sites)]
    per_site = rng.dirichlet(np.full(sites, 4.0)) * total_gpus
    gpn = 8
    all_in_w = default_catalog_data()["gpus"][gpu]["all_in_w"]
    site_list = []
    for i, n in enumerate(names):
        gpus = max(gpn, int(per_site[i]) // gpn * gpn)
        # power: enough for 90-110% of the GPUs at the catalog's all-in watts x the site PUE
        power = gpus * all_in_w * SITE_PUE * float(rng.uniform(0.9, 1.1)) / 1e6
        site_list.append(
            {"name": n, "gpu": gpu, "gpus": gpus, "power_mw": round(power, 3), "pue": SITE_PUE}
        )
    g = nx.Graph()
    for i in range(sites):
        for j in range(i + 1, sites):
            g.add_edge(i, j, km=float(np.hypot(*(pos[i] - pos[j]))) * ROUTE_DETOUR)
    tree = nx.minimum_spanning_tree(g, weight="km")
    edges = set(tree.edges())
    extra = sorted(
        (d["km"], i, j)
        for i, j, d in g.edges(data=True)
        if (i, j) not in edges and (j, i) not in edges
    )
    for _, i, j in extra[: int(extra_route_ratio * sites)]:
        edges.add((i, j))
    routes = []
    for i, j in sorted(edges):
        km = max(5.0, round(g[i][j]["km"], 1))
        routes.append(
            {"sites": [names[i], names[j]], "km": km, "fiber_pairs": int(rng.integers(1, 3))}
        )
    total = sum(s["gpus"] for s in site_list)
    inst: dict[str, Any] = {
        "name": f"gen-s{sites}-g{total}-seed{seed}",
        "description": f"generated: {sites} sites, {total} GPUs, seed {seed}",
        "sites": site_list,
        "routes": routes,
        "job": {
            "model": model,
            "global_batch": global_batch
            or max(512, 2 ** math.ceil(math.log2(max(1, total // 64)))),
            "recompute": "selective",
            "sync": {"mode": sync or ["synchronous", "diloco"], "every_steps": 100, "bits": 8},
            "parallelism": {"tp": tp or [8], "pp": pp or [16, 32], "micro_batch": [1]},
        },
        "objective": {"minimize": "step_time", "max_cost_usd": budget_usd},
        "solver": {"time_limit_s": time_limit_s, "max_sites_per_replica": max_sites_per_replica},
    }
    return inst


def ring_instance(
    sites: int,
    gpus_per_site: int = 4096,
    model: str = "gpt3-175b",
    km: float = 80.0,
    time_limit_s: float = 20.0,
    max_sites_per_replica: int = 2,
) -> dict[str, Any]:
    """S equal H100 sites on a ring of `km` routes (issue 15's time-limit cases), power for
    all GPUs at the catalog's all-in watts x PUE plus 10%, open candidate sets."""
    all_in_w = default_catalog_data()["gpus"]["h100-sxm"]["all_in_w"]
    power = round(gpus_per_site * all_in_w * SITE_PUE * 1.1 / 1e6, 3)
    names = [f"r{i:02d}" for i in range(sites)]
    return {
        "name": f"ring-{sites}",
        "sites": [
            {"name": n, "gpu": "h100-sxm", "gpus": gpus_per_site, "power_mw": power} for n in names
        ],
        "routes": [
            {"sites": [names[i], names[(i + 1) % sites]], "km": km, "fiber_pairs": 2}
            for i in range(sites if sites > 2 else 1)
        ],
        "job": {"model": model, "global_batch": 1536},
        "objective": {"minimize": "step_time"},
        "solver": {"time_limit_s": time_limit_s, "max_sites_per_replica": max_sites_per_replica},
    }
