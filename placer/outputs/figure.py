"""A picture of a plan: sites, routes with their waves and load, and where the stages run.

    plan_figure(problem, plan, ev) -> matplotlib Figure
    write_plan_figure(problem, plan, ev, path)   # .svg or .png, written atomically

A planner looks at this before the tables: each site is a disc whose area is the GPUs it
offers, the filled part the GPUs the plan uses, labelled with its stages and replica
counts; each route is a line as wide as its capacity (new waves plus existing capacity),
coloured by the share of the step it is busy (the evaluator's per-route seconds of
pipeline plus data-parallel traffic over the step time), dashed when it carries nothing.

Sites are placed by their optional `lat`/`lon` (an equirectangular projection, fine over
the few hundred km between sites of one job) when every site has them, otherwise by a
force-directed layout of the route graph weighted by km (seeded: the same plan always
gives the same picture).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from placer.errors import InputError
from placer.evaluate import Evaluation
from placer.io import Problem, write_atomic
from placer.network import RouteKey
from placer.schema import Plan

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FORMATS = {".png": "png", ".svg": "svg"}
FIGSIZE_IN = (9.0, 6.5)
DPI = 150
LABEL_AT = 0.42  # route labels a little off the midpoint, so crossing routes keep theirs apart
LAYOUT_SEED = 7  # any fixed seed: the layout only has to be reproducible


def site_positions(problem: Problem) -> dict[str, tuple[float, float]]:
    """x, y per site: projected coordinates when every site has lat/lon, else a layout."""
    sites = problem.instance.sites
    if sites and all(s.lat is not None and s.lon is not None for s in sites):
        lat0 = math.radians(sum(s.lat for s in sites) / len(sites))  # type: ignore[misc]
        return {s.name: (s.lon * math.cos(lat0), s.lat) for s in sites}  # type: ignore[operator]
    import networkx as nx

    g = nx.Graph()
    g.add_nodes_from(s.name for s in sites)
    for r in problem.instance.routes:
        # spring_layout pulls by weight: nearer sites (fewer km) pull harder
        g.add_edge(*r.key, weight=1.0 / max(r.km, 1.0))
    if len(g) == 1:
        return {sites[0].name: (0.0, 0.0)}
    pos = (
        nx.spring_layout(g, seed=LAYOUT_SEED, weight="weight")
        if g.number_of_edges()
        else nx.circular_layout(g)
    )
    return {n: (float(x), float(y)) for n, (x, y) in pos.items()}


def stages_by_site(plan: Plan) -> dict[str, list[str]]:
    """Per site, one line per replica group: which of its stages run there, and how many replicas."""  # noqa: E501
    out: dict[str, list[str]] = defaultdict(list)
    for g in plan.replica_groups:
        ks: dict[str, list[int]] = defaultdict(list)
        for k, s in enumerate(g.stage_sites):
            ks[s].append(k)
        for s, idx in ks.items():
            out[s].append(f"{g.count} x stages {_ranges(idx)}")
    return out


def _ranges(idx: list[int]) -> str:
    parts, start = [], idx[0]
    for a, b in zip(idx, idx[1:] + [None], strict=True):
        if b is None or b != a + 1:
            parts.append(f"{start}" if start == a else f"{start}-{a}")
            start = b if b is not None else start
    return ",".join(parts)


def route_busy_share(ev: Evaluation) -> dict[RouteKey, float]:
    """Seconds of traffic per step a route carries (both phases) over the step time."""
    step = ev.step
    if step is None or not ev.step_time_s or not math.isfinite(ev.step_time_s):
        return {}
    keys = set(step.route_pp_s) | set(step.route_dp_s)
    return {
        k: (step.route_pp_s.get(k, 0.0) + step.route_dp_s.get(k, 0.0)) / ev.step_time_s
        for k in keys
    }


def plan_figure(problem: Problem, plan: Plan, ev: Evaluation) -> Figure:
    """Draw the plan on a fresh Agg figure (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import colormaps
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    from placer.network import Network

    net = Network(problem)
    pos = site_positions(problem)
    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.set_aspect("equal", adjustable="datalim")
    ax.axis("off")
    cmap, norm = colormaps["viridis"], Normalize(0.0, 1.0)
    busy = route_busy_share(ev)
    waves = {tuple(sorted(link["sites"])): link for link in ev.links}
    caps = {
        r.key: net.capacity_Bps(
            r.key, waves.get(r.key, {}).get("waves", 0), waves.get(r.key, {}).get("optic")
        )
        for r in problem.instance.routes
    }
    cap_max = max([c for c in caps.values() if math.isfinite(c)] + [1.0])
    for r in problem.instance.routes:
        (x0, y0), (x1, y1) = pos[r.key[0]], pos[r.key[1]]
        share = busy.get(r.key, 0.0)
        link = waves.get(r.key)
        carries = share > 0
        width = 1.0 + 7.0 * (caps[r.key] / cap_max if math.isfinite(caps[r.key]) else 1.0)
        ax.plot(
            [x0, x1],
            [y0, y1],
            color=cmap(norm(min(share, 1.0))) if carries else "0.7",
            lw=width if carries else 1.0,
            ls="-" if carries else "--",
            zorder=1,
            solid_capstyle="round",
        )
        label = f"{r.km:g} km"
        if link:
            label += f"\n{link['waves']} x {link['optic']}"
        if r.capacity_gbps:
            label += f"\n+{r.capacity_gbps:g} Gb/s existing"
        if carries:
            label += f"\nbusy {share:.0%} of step"
        ax.annotate(
            label,
            (x0 + LABEL_AT * (x1 - x0), y0 + LABEL_AT * (y1 - y0)),
            ha="center",
            va="center",
            fontsize=7,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.8", "alpha": 0.9},
            zorder=3,
        )
    xs, ys = zip(*pos.values(), strict=True)
    span = max(max(xs) - min(xs), max(ys) - min(ys), 1e-9)
    r_max = 0.09 * span if len(pos) > 1 else 1.0
    g_max = max([s.gpus for s in problem.instance.sites] + [1])
    hosted = stages_by_site(plan)
    for s in problem.instance.sites:
        x, y = pos[s.name]
        r_out = r_max * math.sqrt(max(s.gpus, 1) / g_max)
        used = ev.gpus_by_site.get(s.name, 0)
        r_in = r_out * math.sqrt(min(used / s.gpus, 1.0)) if s.gpus else 0.0
        ax.add_patch(_circle((x, y), r_out, fc="white", ec="0.3", lw=1.2, zorder=4))
        if r_in > 0:
            ax.add_patch(_circle((x, y), r_in, fc="#e4572e", ec="none", alpha=0.85, zorder=5))
        power = ev.power_mw.get(s.name, 0.0)
        lim = f"/{s.power_mw:g}" if s.power_mw is not None else ""
        text = [
            f"{s.name} ({s.gpu})",
            f"{used:,}/{s.gpus:,} GPUs, {power:.1f}{lim} MW",
        ] + hosted.get(s.name, ["unused"])[:4]
        if len(hosted.get(s.name, [])) > 4:
            text.append(f"... {len(hosted[s.name]) - 4} more groups")
        ax.annotate(
            "\n".join(text),
            (x, y - r_out),
            xytext=(0, -4),
            textcoords="offset points",
            ha="center",
            va="top",
            fontsize=7.5,
            zorder=6,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.8},
        )
        ax.update_datalim([(x - r_out, y - r_out * 3.2), (x + r_out, y + r_out)])
    par = plan.parallelism
    ax.set_title(
        f"{problem.name}: tp {par.tp} x pp {par.pp} x dp {par.dp}, step {ev.step_time_s:.3f} s, link capex ${ev.capex_usd:,.0f}",  # noqa: E501
        fontsize=10,
    )
    ax.autoscale_view()
    fig.text(
        0.01,
        0.01,
        "disc area: GPUs a site offers; filled: GPUs the plan uses. Line width: route capacity; dashed: no traffic.",  # noqa: E501
        fontsize=7,
        color="0.35",
    )
    sm = matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(sm, ax=ax, shrink=0.5, label="route busy share of the step")
    return fig


def _circle(xy: tuple[float, float], r: float, **kw: object) -> object:
    from matplotlib.patches import Circle

    return Circle(xy, r, **kw)


def render_plan_figure(problem: Problem, plan: Plan, ev: Evaluation, fmt: str) -> bytes:
    """The figure's bytes in `fmt` (svg or png)."""
    import io

    import matplotlib

    fig = plan_figure(problem, plan, ev)
    buf = io.BytesIO()
    # SVG keeps its text as text (searchable, selectable) and carries no timestamp
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "placer"}):
        fig.savefig(buf, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
    return buf.getvalue()


def write_plan_figure(problem: Problem, plan: Plan, ev: Evaluation, path: str | Path) -> Path:
    """Write the picture to `path` (.svg or .png) atomically."""
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InputError(f"-o: the picture is written as {' or '.join(FORMATS)}, got '{path.name}'")
    write_atomic(path, render_plan_figure(problem, plan, ev, fmt))
    return path


__all__ = [
    "plan_figure",
    "render_plan_figure",
    "route_busy_share",
    "site_positions",
    "stages_by_site",
    "write_plan_figure",
]
