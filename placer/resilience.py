"""Single failures priced with the OptCC cost model (reference/optcc.md, arXiv 2606.01680).

Failure classes (CONTRACT section 5):
- `wave`: one new wave on a route is lost; the route keeps `waves - 1`.
- `fiber_pair`: one lit pair is cut with all its waves (waves are packed into the fewest
  pairs, so the fullest pair holds min(waves, channels)); when the route is left with no
  capacity its traffic is rerouted over the route graph for the report, or the scenario is
  reported as disconnecting the sites. The guarantee (`survive`) does not count on
  rerouting: a route that carries the plan's traffic must keep some capacity, as the
  formulations require.
- `nic`: one NIC of a node is lost: the node keeps (nics - 1) / nics of its bandwidth and
  becomes the straggler of its data-parallel collective inside the site.

A degraded participant slows an all-reduce by a factor over the fault-free ring:
- ring: l (the straggler stays on the critical path);
- optcc: min(l, T_LB(p, l) / T_ring(p) x (1 + eps)) (OptCC approaches the lower bound;
  the ring is kept when it is faster);
- bound: T_LB(p, l) / T_ring(p) (no algorithm does better).
Between sites the participants are the sites the plan uses; inside a site, the
data-parallel group (dp members, the same convention as the healthy model). Pipeline
messages on a degraded route slow by the capacity lost (l), whatever the collective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from placer.io import Problem, problem_with
from placer.network import RouteKey
from placer.optimize import deadline
from placer.perf.comm import allreduce_lower_bound_s, nic_loss_factor, ring_fault_free_s
from placer.perf.step import PerfModel
from placer.rules import site_gpus_per_node, waves_lost

if TYPE_CHECKING:
    from placer.evaluate import Evaluation

COLLECTIVES = ("ring", "optcc", "bound")


def slowdown_factor(collective: str, p: int, l: float, eps: float) -> float:  # noqa: E741
    """All-reduce time with one participant at 1/l of its bandwidth, over the healthy ring."""
    if l <= 1.0 or p < 2:
        return 1.0
    if math.isinf(l):
        return math.inf
    if collective == "ring":
        return l
    ratio = allreduce_lower_bound_s(p, 1.0, 1.0, l) / ring_fault_free_s(p, 1.0, 1.0)
    if collective == "optcc":
        # OptCC's pipelined schedule costs eps over the bound; a runtime that has both
        # keeps the plain ring when it is faster (tiny degradations, l < 1 + ~eps)
        return min(l, ratio * (1.0 + eps))
    return ratio


def _failure_text(klass: str, lost: int, waves: int, key: RouteKey) -> str:
    route = f"{key[0]}-{key[1]}"
    if klass == "wave":
        return (
            f"one of {waves} waves lost on {route}"
            if waves > 1
            else f"the only wave on {route} lost"
        )
    pair = f"a fiber-pair cut on {route} takes {lost} of its {waves} waves"
    return (
        pair
        if lost < waves
        else f"a fiber-pair cut on {route} takes all its {waves} wave{'s' if waves > 1 else ''}"
    )


def nic_factor(problem: Problem, site: str) -> float:
    """l for one lost NIC of a node at `site` (8 NICs: 8/7)."""
    gpu = problem.catalog.gpus[problem.instance.site(site).gpu]
    nics = gpu.nics_per_node or site_gpus_per_node(problem, site)
    return math.inf if nics <= 1 else nic_loss_factor(nics)  # a node's only NIC: cut off


@dataclass
class Scenario:
    klass: str  # wave | fiber_pair | nic
    where: str  # "route a-b" or "site a"
    description: str
    step_s: dict[str, float] = field(default_factory=dict)  # collective -> step time
    disconnected: bool = False
    dark: bool = False  # a route carrying the plan's traffic lost all capacity

    def to_dict(self) -> dict[str, Any]:
        # JSON has no infinity: a step that cannot complete (no capacity left) is null
        steps = {c: (v if math.isfinite(v) else None) for c, v in self.step_s.items()}
        return {
            "class": self.klass,
            "where": self.where,
            "description": self.description,
            "step_time_s": steps,
            "disconnected": self.disconnected,
            "route_dark": self.dark,
        }


@dataclass
class FailureReport:
    healthy_s: float
    scenarios: list[Scenario]
    collective: str
    limit_s: float | None
    expected_s: dict[str, float] = field(default_factory=dict)

    def worst(self, collective: str | None = None) -> Scenario | None:
        c = collective or self.collective
        return max(self.scenarios, key=lambda s: s.step_s.get(c, 0.0), default=None)

    @property
    def survives(self) -> bool:
        """The guarantee holds: every scenario within the limit, and none that relies on
        rerouting around a dark route (the optimizer does not count on rerouting)."""
        if any(s.dark for s in self.scenarios):
            return False
        w = self.worst()
        return (
            w is None
            or self.limit_s is None
            or w.step_s[self.collective] <= self.limit_s * (1 + 1e-6)
        )

    def to_dict(self) -> dict[str, Any]:
        w = self.worst()
        return {
            "healthy_step_time_s": self.healthy_s,
            "collective": self.collective,
            "limit_s": self.limit_s,
            "survives": self.survives,
            "worst": w.to_dict() if w else None,
            "scenarios": [s.to_dict() for s in self.scenarios],
            "expected_step_time_s": self.expected_s,
        }


def _without_route(problem: Problem, key: RouteKey) -> Problem:
    routes = [r.model_dump(mode="json") for r in problem.instance.routes if r.key != key]
    return problem_with(problem, routes=routes)


def failure_report(
    problem: Problem, ev: Evaluation, classes: list[str] | None = None
) -> FailureReport:
    """Step time of an evaluated plan under every single failure of the listed classes."""
    res = problem.instance.resilience
    classes = (
        classes
        if classes is not None
        else (list(res.survive) if res and res.survive else ["wave", "fiber_pair", "nic"])
    )
    collective = res.collective if res else "optcc"
    eps = problem.catalog.resilience.optcc_eps
    perf = PerfModel(problem)
    cfg = ev.config
    groups = list(ev.groups)
    waves = {tuple(sorted(link["sites"])): link["waves"] for link in ev.links}
    optics = {tuple(sorted(link["sites"])): link["optic"] for link in ev.links}
    p_sites = sum(1 for g in ev.gpus_by_site.values() if g > 0)
    routing = ev.routing
    scenarios: list[Scenario] = []
    net = perf.net
    base = None  # the healthy step's route loads, computed once
    for key, w in sorted(waves.items()):
        if w <= 0:
            continue
        ch = problem.catalog.channels_per_pair(optics[key])
        for klass in ("wave", "fiber_pair"):
            if klass not in classes:
                continue
            deadline.check()  # within the driver's time limit (warnings after a solve)
            lost = waves_lost(klass, w, ch)
            left = w - lost
            cap0 = net.capacity_Bps(key, w, optics[key])
            cap1 = net.capacity_Bps(key, left, optics[key])
            desc = _failure_text(klass, lost, w, key)
            sc = Scenario(klass, f"route {key[0]}-{key[1]}", desc)
            if cap1 <= 0:
                # the route carries nothing: reroute over the rest of the graph
                other = _without_route(problem, key)
                perf2 = PerfModel(other)
                w2 = {k: v for k, v in waves.items() if k != key}
                # split pairs keep the paths that avoid the dark route; the others reroute
                kept = {
                    q: uses
                    for q, uses in routing.items()
                    if all(key not in u.path.routes for u in uses)
                }
                st = perf2.step(cfg, groups, w2, optics=optics, routing=kept, stagger=False)
                sc.disconnected = bool(st.unreachable)
                if base is None:
                    base = perf.step(cfg, groups, waves, optics=optics, routing=routing)
                sc.dark = base.route_pp_load.get(key, 0) > 0 or base.route_dp_load.get(key, 0) > 0
                if sc.disconnected:
                    sc.description += " (route dark: no other path, sites disconnected)"
                elif not math.isfinite(st.step_time_s):
                    sc.description += " (route dark: the detour has no capacity)"
                else:
                    sc.description += " (route dark: traffic rerouted)"
                for c in COLLECTIVES:
                    sc.step_s[c] = st.step_time_s
            else:
                l = cap0 / cap1  # noqa: E741
                for c in COLLECTIVES:
                    st = perf.step(
                        cfg,
                        groups,
                        waves,
                        optics=optics,
                        pp_route_factor={key: l},
                        dp_route_factor={key: slowdown_factor(c, p_sites, l, eps)},
                        routing=routing,
                        stagger=False,
                    )
                    sc.step_s[c] = st.step_time_s
            scenarios.append(sc)
    if "nic" in classes and cfg.dp >= 2:
        # the largest loss over all sites, as the optimizer assumes (conservative)
        l = max(nic_factor(problem, s.name) for s in problem.instance.sites)  # noqa: E741
        sc = Scenario(
            "nic",
            "any node",
            f"one NIC of {round(1 / (1 - 1 / l))} lost on a node: bandwidth x {1 / l:.3f}",
        )
        for c in COLLECTIVES:
            st = perf.step(
                cfg,
                groups,
                waves,
                optics=optics,
                intra_factor=slowdown_factor(c, cfg.dp, l, eps),
                routing=routing,
                stagger=False,
            )
            sc.step_s[c] = st.step_time_s
        scenarios.append(sc)
    limit = None
    if res is not None:
        # (1 + max_slowdown) x the healthy target: max_step_time_s when set, else the plan's own step  # noqa: E501
        limit = (problem.instance.objective.max_step_time_s or ev.step_time_s) * (
            1 + res.max_slowdown
        )
    report = FailureReport(ev.step_time_s, scenarios, collective, limit)
    if res is not None and res.nic_failure_rate and scenarios:
        nic = next((s for s in scenarios if s.klass == "nic"), None)
        if nic is not None:
            nodes = sum(ev.nodes_by_site.values())
            p_any = 1 - (1 - res.nic_failure_rate) ** nodes
            report.expected_s = {
                c: (1 - p_any) * ev.step_time_s + p_any * nic.step_s[c] for c in COLLECTIVES
            }
    return report
