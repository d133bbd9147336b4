"""Link bill of materials: what procurement orders for a plan's new coherent waves.

Every quantity follows from the plan by a closed form (the rules below, also printed in the
markdown); every price and power figure comes from the catalog with its `source` text.

Per route with `waves` new waves of optic `o` over `km` of fiber:

- optic `o`: the plan's `links[].optic`, else `Network.default_optic` (among the optics that
  reach `km`: highest line rate, then lowest cost per Gb/s; so ZR up to 120 km, ZR+ beyond);
- coherent transceiver modules = 2 x waves (one per wave at each end);
- router/switch ports = 2 x waves (one per wave at each end);
- fiber pairs lit P = ceil(waves / channels per pair), channels = floor(C-band GHz / grid GHz);
- DWDM mux/demux = 2 x P (one per lit pair at each end);
- in-line amplifiers = P x (ceil(km / spacing) - 1) (one per span beyond the first);
- module power waves x module_w is charged to each end site (IT watts; the evaluator adds PUE);
  amplifiers sit in huts along the route: their power is reported per route, charged to no site;
- switch buffer per inter-site port >= line rate x RTT, RTT = 2 x the route's one-way latency;
- capex = modules + ports + muxes + amplifiers at catalog unit costs (= evaluate().capex_usd);
- fiber lease opex = P x km x fiber_usd_per_pair_km_year when the route sets that price.
"""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from placer.evaluate import evaluate
from placer.io import Problem, plan_from_data
from placer.network import Network
from placer.schema import Plan

BOM_COLUMNS = [
    "route",
    "item",
    "model",
    "quantity",
    "unit",
    "unit_cost_usd",
    "capex_usd",
    "opex_usd_per_year",
    "power_w",
    "charged_to",
    "buffer_mb_per_port",
    "source",
    "rule",
]

HUTS = "route huts (no site)"
ITEM_ORDER = [
    "wave",
    "coherent transceiver",
    "router/switch port",
    "fiber pair lit",
    "DWDM mux/demux",
    "in-line amplifier",
]


def _num(x: float | int | None) -> float | int | str:
    """Numbers as procurement reads them: integers without '.0', others to 6 decimals."""
    if x is None:
        return ""
    if isinstance(x, int) or float(x).is_integer():
        return int(x)
    return round(float(x), 6)


def _line(
    label: str,
    name: str,
    model: str,
    qty: int,
    unit: str,
    unit_cost: float | None,
    charged: str,
    source: str,
    rule: str,
    power_w: float | None = None,
    buffer_mb: float | None = None,
    opex: float | None = None,
) -> dict[str, Any]:
    return {
        "route": label,
        "item": name,
        "model": model,
        "quantity": qty,
        "unit": unit,
        "unit_cost_usd": unit_cost,
        "capex_usd": None if unit_cost is None else qty * unit_cost,
        "opex_usd_per_year": opex,
        "power_w": power_w,
        "charged_to": charged,
        "buffer_mb_per_port": buffer_mb,
        "source": source,
        "rule": rule,
    }


def _source(problem: Problem, section: str, key: str | None, fields: tuple[str, ...]) -> str:
    """The catalog `source` text for a figure, or a note that the instance overrode it."""
    cat = problem.catalog
    over: Any = problem.instance.catalog.get(section, {}) or {}
    if key is not None:
        over = over.get(key, {}) if isinstance(over, dict) else {}
    if isinstance(over, dict) and any(f in over for f in fields) and "source" not in over:
        return "instance catalog override (no source given)"
    if section == "optics":
        return cat.optics[key].source  # type: ignore[index]
    return getattr(cat, section).source


def rules(problem: Problem) -> list[str]:
    """The closed forms, one sentence each, with the catalog numbers in use."""
    cat = problem.catalog
    net = cat.network
    return [
        "Optic: the plan's optic for the route, else the one placer buys: among the catalog optics whose reach covers the route length, the highest line rate, then the lowest cost per Gb/s (reach: "  # noqa: E501
        + ", ".join(f"{o} {spec.reach_km:g} km" for o, spec in cat.optics.items())
        + "; ZR+ routes need in-line amplifiers).",
        "Coherent transceiver modules = 2 x waves: one module per wave at each end.",
        "Router/switch ports = 2 x waves: one port per wave at each end.",
        f"Fiber pairs lit = ceil(waves / channels per pair), channels per pair = floor({net.c_band_ghz:g} GHz of C-band / the optic's grid spacing) (32 at 150 GHz for 800G).",  # noqa: E501
        "DWDM mux/demux units = 2 x fiber pairs lit: one per lit pair at each end.",
        f"In-line amplifiers = fiber pairs lit x (ceil(km / {net.amplifier_spacing_km:g} km) - 1): one per amplified span beyond the first, on each lit pair.",  # noqa: E501
        "Optics power: waves x module watts at each end, charged to that end's site (IT watts; the evaluator multiplies by the site PUE).",  # noqa: E501
        f"Amplifier power: amplifiers x {cat.costs.amplifier_w:g} W, in huts along the route: reported per route and charged to no site.",  # noqa: E501
        f"Switch buffer per inter-site port >= line rate x round-trip time, RTT = 2 x one-way latency (the route's latency_ms, else km x {net.fiber_us_per_km:g} us/km); decimal MB.",  # noqa: E501
        "Capex = modules x module cost + ports x port cost + mux/demux x mux cost + amplifiers x amplifier cost; it equals the evaluator's link capex.",  # noqa: E501
        "Fiber lease opex per year = fiber pairs lit x km x the route's fiber_usd_per_pair_km_year, when the route sets it (dark fiber is otherwise not priced).",  # noqa: E501
        "Existing capacity (routes' capacity_gbps) is free and needs no new equipment; routes without new waves are not listed.",  # noqa: E501
    ]


def bom_data(problem: Problem, plan: Plan | dict[str, Any]) -> dict[str, Any]:
    """The BOM as a dictionary: per-route detail, line items and totals."""
    plan = plan_from_data(plan)
    ev = evaluate(problem, plan)
    cat = problem.catalog
    costs = cat.costs
    net = Network(problem)
    plan_optic = {link.key: link.optic for link in plan.links}
    cost_src = _source(
        problem, "costs", None, ("router_port_usd", "mux_usd", "amplifier_usd", "amplifier_w")
    )
    routes: list[dict[str, Any]] = []
    for link in ev.links:
        key = (min(link["sites"]), max(link["sites"]))
        a, b = key
        route = net.routes[key]
        label = f"{a}-{b}"
        optic = link["optic"]
        spec = cat.optics[optic]
        opt_src = _source(
            problem, "optics", optic, ("module_cost_usd", "module_w", "line_rate_gbps")
        )
        w = int(link["waves"])
        channels = cat.channels_per_pair(optic)
        pairs = net.fiber_pairs_lit(key, w, optic)
        amps_per_pair = net.amplifiers_per_pair(key)
        amps = pairs * amps_per_pair
        one_way_s = net.latency_s(key)
        rtt_s = 2 * one_way_s
        buffer_bytes = spec.line_rate_gbps * 1e9 * rtt_s / 8
        chosen = "plan" if plan_optic.get(key) else "default"
        why = (
            "set by the plan"
            if chosen == "plan"
            else "placer's default (highest line rate, then lowest cost per Gb/s, among the optics that reach)"  # noqa: E501
        )
        items: list[dict[str, Any]] = []

        items.append(
            _line(
                label,
                "wave",
                optic,
                w,
                "wave",
                None,
                "",
                opt_src,
                f"waves from the plan; optic {why}: {spec.line_rate_gbps:g}G, reach {spec.reach_km:g} km >= {route.km:g} km",  # noqa: E501
            )
        )
        for end in key:
            items.append(
                _line(
                    label,
                    "coherent transceiver",
                    optic,
                    w,
                    "module",
                    spec.module_cost_usd,
                    end,
                    opt_src,
                    "one per wave per end",
                    power_w=w * spec.module_w,
                )
            )
        for end in key:
            items.append(
                _line(
                    label,
                    "router/switch port",
                    f"{spec.line_rate_gbps:g}G deep-buffer port",
                    w,
                    "port",
                    costs.router_port_usd,
                    end,
                    cost_src,
                    "one per wave per end; buffer >= line rate x RTT",
                    buffer_mb=buffer_bytes / 1e6,
                )
            )
        opex = None
        lease_src = ""
        if route.fiber_usd_per_pair_km_year is not None:
            opex = pairs * route.km * route.fiber_usd_per_pair_km_year
            lease_src = f"instance route {label}: fiber_usd_per_pair_km_year = {route.fiber_usd_per_pair_km_year:g}"  # noqa: E501
        items.append(
            _line(
                label,
                "fiber pair lit",
                "dark fiber pair",
                pairs,
                "pair",
                None,
                "",
                lease_src or "instance route fiber_pairs",
                f"ceil({w} waves / {channels} channels per pair); {route.fiber_pairs} available",
                opex=opex,
            )
        )
        for end in key:
            items.append(
                _line(
                    label,
                    "DWDM mux/demux",
                    f"{channels}-channel",
                    pairs,
                    "unit",
                    costs.mux_usd,
                    end,
                    cost_src,
                    "one per lit pair per end",
                )
            )
        items.append(
            _line(
                label,
                "in-line amplifier",
                "ILA",
                amps,
                "unit",
                costs.amplifier_usd,
                HUTS,
                cost_src,
                f"{pairs} lit pair(s) x (ceil({route.km:g} km / {cat.network.amplifier_spacing_km:g} km) - 1 = {amps_per_pair})",  # noqa: E501
                power_w=amps * costs.amplifier_w,
            )
        )
        capex = sum(it["capex_usd"] or 0.0 for it in items)
        routes.append(
            {
                "route": label,
                "sites": [a, b],
                "km": route.km,
                "one_way_latency_ms": one_way_s * 1e3,
                "rtt_ms": rtt_s * 1e3,
                "optic": optic,
                "optic_chosen_by": chosen,
                "line_rate_gbps": spec.line_rate_gbps,
                "reach_km": spec.reach_km,
                "waves": w,
                "channels_per_pair": channels,
                "fiber_pairs_available": route.fiber_pairs,
                "fiber_pairs_lit": pairs,
                "transceivers": 2 * w,
                "router_ports": 2 * w,
                "mux_demux": 2 * pairs,
                "amplifiers_per_pair": amps_per_pair,
                "amplifiers": amps,
                "buffer_per_port_bytes": buffer_bytes,
                "buffer_per_port_mb": buffer_bytes / 1e6,
                "optics_power_w": {a: w * spec.module_w, b: w * spec.module_w},
                "amplifier_power_w": amps * costs.amplifier_w,
                "capex_usd": capex,
                "fiber_opex_usd_per_year": opex,
                "items": items,
            }
        )
    capex_total = sum(r["capex_usd"] for r in routes)
    if not math.isclose(capex_total, ev.capex_usd, rel_tol=1e-9, abs_tol=1e-6):
        raise AssertionError(f"BOM capex {capex_total} != evaluator capex {ev.capex_usd}")
    power: dict[str, float] = {s.name: 0.0 for s in problem.instance.sites}
    for r in routes:
        for s, pw in r["optics_power_w"].items():
            power[s] += pw
    opex_values = [
        r["fiber_opex_usd_per_year"] for r in routes if r["fiber_opex_usd_per_year"] is not None
    ]
    totals: dict[str, Any] = {
        "waves": sum(r["waves"] for r in routes),
        "transceivers": sum(r["transceivers"] for r in routes),
        "transceivers_by_optic": {},
        "router_ports": sum(r["router_ports"] for r in routes),
        "fiber_pairs_lit": sum(r["fiber_pairs_lit"] for r in routes),
        "mux_demux": sum(r["mux_demux"] for r in routes),
        "amplifiers": sum(r["amplifiers"] for r in routes),
        "optics_power_w_by_site": power,
        "amplifier_power_w": sum(r["amplifier_power_w"] for r in routes),
        "capex_usd": capex_total,
        "fiber_opex_usd_per_year": sum(opex_values) if opex_values else None,
    }
    for r in routes:
        totals["transceivers_by_optic"][r["optic"]] = (
            totals["transceivers_by_optic"].get(r["optic"], 0) + r["transceivers"]
        )
    return {
        "instance": problem.name,
        "feasible": ev.feasible,
        "evaluator_capex_usd": ev.capex_usd,
        "rules": rules(problem),
        "routes": routes,
        "totals": totals,
    }


def _total_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """TOTAL lines: quantities and costs summed by (item, model, charged_to), then the sums."""
    agg: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in data["routes"]:
        for it in r["items"]:
            k = (it["item"], it["model"], it["charged_to"])
            row = agg.setdefault(
                k,
                {
                    **it,
                    "route": "TOTAL",
                    "quantity": 0,
                    "capex_usd": None,
                    "opex_usd_per_year": None,
                    "power_w": None,
                    "buffer_mb_per_port": None,
                    "rule": "sum over routes",
                },
            )
            row["quantity"] += it["quantity"]
            for f in ("capex_usd", "opex_usd_per_year", "power_w"):
                if it[f] is not None:
                    row[f] = (row[f] or 0.0) + it[f]
            if row["unit_cost_usd"] != it["unit_cost_usd"] or row["source"] != it["source"]:
                row["unit_cost_usd"], row["source"] = None, "several"
    t = data["totals"]
    out = sorted(
        agg.values(), key=lambda r: (ITEM_ORDER.index(r["item"]), r["model"], r["charged_to"])
    )
    blank = {c: None for c in BOM_COLUMNS}
    out.append(
        {
            **blank,
            "route": "TOTAL",
            "item": "capex",
            "quantity": None,
            "unit": "USD",
            "capex_usd": t["capex_usd"],
            "charged_to": "",
            "model": "",
            "source": "",
            "rule": "sum of extended costs (= evaluate capex_usd)",
        }
    )
    if t["fiber_opex_usd_per_year"] is not None:
        out.append(
            {
                **blank,
                "route": "TOTAL",
                "item": "fiber lease opex",
                "quantity": None,
                "unit": "USD/year",
                "opex_usd_per_year": t["fiber_opex_usd_per_year"],
                "charged_to": "",
                "model": "",
                "source": "",
                "rule": "sum over routes with a fiber price",
            }
        )
    for site, pw in t["optics_power_w_by_site"].items():
        out.append(
            {
                **blank,
                "route": "TOTAL",
                "item": "optics power",
                "quantity": None,
                "unit": "W",
                "power_w": pw,
                "charged_to": site,
                "model": "",
                "source": "",
                "rule": "module watts at this site's ends (IT, before PUE)",
            }
        )
    out.append(
        {
            **blank,
            "route": "TOTAL",
            "item": "amplifier power",
            "quantity": None,
            "unit": "W",
            "power_w": t["amplifier_power_w"],
            "charged_to": HUTS,
            "model": "",
            "source": "",
            "rule": "in huts along the routes; charged to no site",
        }
    )
    return out


def rows_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Line items (one per item per route end) followed by TOTAL lines."""
    return [it for r in data["routes"] for it in r["items"]] + _total_rows(data)


def bom_rows(problem: Problem, plan: Plan | dict[str, Any]) -> list[dict[str, Any]]:
    return rows_of(bom_data(problem, plan))


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, int | float) and not isinstance(v, bool):
        return _num(v)
    return v


def csv_of(data: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=BOM_COLUMNS, lineterminator="\n")
    w.writeheader()
    for row in rows_of(data):
        w.writerow({c: _cell(row.get(c)) for c in BOM_COLUMNS})
    return buf.getvalue()


def json_of(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"


def bom_csv(problem: Problem, plan: Plan | dict[str, Any]) -> str:
    return csv_of(bom_data(problem, plan))


def bom_json(problem: Problem, plan: Plan | dict[str, Any]) -> str:
    return json_of(bom_data(problem, plan))


def _usd(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f}"


def bom_markdown(problem: Problem, plan: Plan | dict[str, Any]) -> str:
    """A markdown section (tables and the rules) for report.md."""
    return markdown_of(bom_data(problem, plan))


def markdown_of(data: dict[str, Any]) -> str:
    t = data["totals"]
    lines = ["## Link bill of materials", ""]
    if not data["routes"]:
        return (
            "\n".join(
                lines + ["No new coherent waves: nothing to buy (existing capacity only).", ""]
            )
            + "\n"
        )
    lines += [
        "| route | km | RTT ms | optic | waves | transceivers | router ports | fiber pairs lit | mux/demux | amplifiers | buffer per port MB | capex USD | fiber opex USD/yr |",  # noqa: E501
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["routes"]:
        lines.append(
            f"| {r['route']} | {r['km']:g} | {r['rtt_ms']:.3f} | {r['optic']} | {r['waves']} | {r['transceivers']} | {r['router_ports']} | {r['fiber_pairs_lit']} | {r['mux_demux']} | {r['amplifiers']} | {r['buffer_per_port_mb']:.1f} | {_usd(r['capex_usd'])} | {_usd(r['fiber_opex_usd_per_year'])} |"  # noqa: E501
        )
    lines.append(
        f"| **total** | | | | {t['waves']} | {t['transceivers']} | {t['router_ports']} | {t['fiber_pairs_lit']} | {t['mux_demux']} | {t['amplifiers']} | | **{_usd(t['capex_usd'])}** | {_usd(t['fiber_opex_usd_per_year'])} |"  # noqa: E501
    )
    lines += [
        "",
        "Line items (unit costs from the catalog, with their source):",
        "",
        "| route | item | model | qty | unit cost USD | extended USD | charged to | source |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for r in data["routes"]:
        for it in r["items"]:
            if (it["unit_cost_usd"] is None and it["opex_usd_per_year"] is None) or not it[
                "quantity"
            ]:
                continue
            ext = (
                _usd(it["capex_usd"])
                if it["capex_usd"] is not None
                else f"{_usd(it['opex_usd_per_year'])} /yr"
            )
            unit = _usd(it["unit_cost_usd"]) if it["unit_cost_usd"] is not None else ""
            lines.append(
                f"| {it['route']} | {it['item']} | {it['model']} | {it['quantity']} | {unit} | {ext} | {it['charged_to']} | {it['source']} |"  # noqa: E501
            )
    lines += [
        "",
        "Power of the link equipment (IT watts, before PUE):",
        "",
        "| where | W |",
        "|---|---:|",
    ]
    for site, pw in t["optics_power_w_by_site"].items():
        lines.append(f"| site {site} (coherent modules) | {pw:,.0f} |")
    for r in data["routes"]:
        if r["amplifier_power_w"]:
            lines.append(
                f"| route {r['route']} huts ({r['amplifiers']} amplifiers; charged to no site) | {r['amplifier_power_w']:,.0f} |"  # noqa: E501
            )
    lines += ["", "How each quantity follows from the plan:", ""]
    lines += [f"- {s}" for s in data["rules"]]
    return "\n".join(lines) + "\n"


__all__ = [
    "BOM_COLUMNS",
    "bom_csv",
    "bom_data",
    "bom_json",
    "bom_markdown",
    "bom_rows",
    "csv_of",
    "json_of",
    "markdown_of",
    "rules",
    "rows_of",
]
