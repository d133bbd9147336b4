"""report.html: report.md's tables with the plan picture and the step-time breakdown as a
chart, in one self-contained file (inline SVG and CSS, nothing fetched when opened).

The tables are report.md rendered by Python-Markdown, so the two reports can never say
different things.
"""

from __future__ import annotations

import html
import io
from typing import Any

from placer.evaluate import Evaluation
from placer.io import Problem
from placer.outputs.figure import render_plan_figure
from placer.outputs.report import markdown_report
from placer.schema import Plan

CSS = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.5rem; }
th { background: #f3f3f3; }
figure { margin: 1rem 0; }
figure svg { max-width: 100%; height: auto; }
figcaption { color: #555; font-size: 0.9rem; }
"""  # noqa: E501
BREAKDOWN_FIGSIZE_IN = (7.0, 3.0)


def breakdown_svg(ev: Evaluation) -> str:
    """A horizontal bar per step-time component (seconds), as inline SVG."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    items = [(k, v) for k, v in ev.breakdown.items() if v > 0]
    fig = Figure(figsize=BREAKDOWN_FIGSIZE_IN, layout="constrained")
    ax = fig.add_subplot()
    names = [k for k, _ in items][::-1]
    vals = [v for _, v in items][::-1]
    ax.barh(names, vals, color="#3b7dd8")
    for y, v in enumerate(vals):
        ax.annotate(
            f"{v:.4g} s", (v, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8
        )
    ax.set_xlabel("seconds per step")
    ax.set_title(f"step time {ev.step_time_s:.4g} s", fontsize=10)
    ax.margins(x=0.15)
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "placer"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return _inline(buf.getvalue())


def _inline(svg: str) -> str:
    """Drop the XML prolog and doctype so the SVG can sit inside HTML."""
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def html_report(
    problem: Problem, plan: Plan, ev: Evaluation, solver: dict[str, Any] | None = None
) -> str:
    import markdown

    body = markdown.markdown(
        markdown_report(problem, plan, ev, solver), extensions=["tables"], output_format="html"
    )
    picture = _inline(render_plan_figure(problem, plan, ev, "svg").decode("utf-8"))
    figures = (
        f"<figure>{picture}<figcaption>The plan: sites, routes (waves, busy share of the step) and the stages each site hosts.</figcaption></figure>\n"  # noqa: E501
        f"<figure>{breakdown_svg(ev)}<figcaption>Step-time breakdown.</figcaption></figure>\n"
    )
    head_end = body.find("</h1>")
    body = (
        body[: head_end + 5] + "\n" + figures + body[head_end + 5 :]
        if head_end >= 0
        else figures + body
    )
    title = html.escape(f"placer plan: {problem.name}")
    return f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{title}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n'  # noqa: E501


__all__ = ["breakdown_svg", "html_report"]
