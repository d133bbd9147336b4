"""Link bill of materials: what procurement orders for a plan."""

from __future__ import annotations

import csv
import io

from placer.evaluate import evaluate
from placer.io import Problem
from placer.schema import Plan

BOM_COLUMNS = ["route", "km", "optic", "waves", "transceivers", "router_ports", "fiber_pairs_lit", "capex_usd"]


def bom_rows(problem: Problem, plan: Plan) -> list[dict[str, object]]:
    ev = evaluate(problem, plan)
    routes = {r.key: r for r in problem.instance.routes}
    rows = []
    for link in ev.links:
        key = tuple(sorted(link["sites"]))
        rows.append(
            {
                "route": f"{key[0]}-{key[1]}",
                "km": routes[key].km,
                "optic": link["optic"],
                "waves": link["waves"],
                "transceivers": 2 * link["waves"],
                "router_ports": 2 * link["waves"],
                "fiber_pairs_lit": link["fiber_pairs_lit"],
                "capex_usd": round(link["capex_usd"], 2),
            }
        )
    return rows


def bom_csv(problem: Problem, plan: Plan) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=BOM_COLUMNS, lineterminator="\n")
    w.writeheader()
    for row in bom_rows(problem, plan):
        w.writerow(row)
    return buf.getvalue()
