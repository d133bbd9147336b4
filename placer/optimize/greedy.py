"""A fast greedy incumbent: whole replicas inside single sites, then the links that help.

It gives both backends a cutoff (and CP-SAT a hint) before the exact search starts.
"""

from __future__ import annotations

import math

from placer.optimize.data import InnerData, InnerSolution


def greedy(data: InnerData) -> InnerSolution | None:
    """Fill sites with whole replicas, largest free capacity first (power-aware); if
    replicas are left, try two-site chains; then buy the most waves the budget allows on
    the routes that carry traffic."""
    cfg = data.cfg
    free = {}
    for s in data.sites:
        nodes = data.site_nodes[s]
        lim = data.site_power_w[s]
        if lim is not None:
            nodes = min(nodes, math.floor(lim / (data.site_pue[s] * data.site_node_w[s]) + 1e-9))
        free[s] = nodes * data.site_groups_per_node[s]
    index = {c: i for i, c in enumerate(data.chains)}
    counts: dict[int, int] = {}
    left = cfg.dp
    locals_ = sorted((c for c in data.chains if len(set(c)) == 1), key=lambda c: (-free[c[0]], c))
    while left > 0:
        best = max(locals_, key=lambda c: (free[c[0]], c[0]), default=None)
        if best is None or free[best[0]] < cfg.pp:
            break
        counts[index[best]] = counts.get(index[best], 0) + 1
        free[best[0]] -= cfg.pp
        left -= 1
    while left > 0:
        cands = [c for c in data.chains if len(set(c)) > 1]
        placed = False
        for c in sorted(cands, key=lambda c: (data.chain_time[index[c]], c)):
            need: dict[str, int] = {}
            for s in c:
                need[s] = need.get(s, 0) + 1
            if all(free[s] >= n for s, n in need.items()):
                counts[index[c]] = counts.get(index[c], 0) + 1
                for s, n in need.items():
                    free[s] -= n
                left -= 1
                placed = True
                break
        if not placed:
            return None
    # links: most waves the budget allows, cheapest routes first, only where traffic flows
    waves: dict[tuple[str, str], int] = {}
    budget = data.max_cost_usd if data.max_cost_usd is not None else math.inf
    for r in data.routes:
        opts = data.wave_options[r]
        best_opt = opts[0]
        for opt in opts:
            if opt.capex_usd <= budget:
                best_opt = opt
        waves[r] = best_opt.waves
        budget -= best_opt.capex_usd
    return InnerSolution(counts, waves, math.inf, 0.0, False)
