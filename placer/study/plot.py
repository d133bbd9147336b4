"""Plots of sweep results (matplotlib, Agg canvas: no display needed).

Kinds:
- `step_time`: step time vs a swept column, one line per `--by` group;
- `efficiency`: MFU vs a swept column, one line per group;
- `pareto`: link capex vs step time, the non-dominated points highlighted;
- `spare_waves`: spare waves a plan needs to ride through failures, ring all-reduce vs
  OptCC (columns `spare_waves_ring`, `spare_waves_optcc` of the resilience feature).

Rows without a plan (infeasible, error, time limit without a plan) are marked on the x
axis of the line plots and left out of the Pareto front.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from placer.errors import InputError
from placer.study.sweep import OK_STATUSES, override_columns, read_results

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

KINDS = ("step_time", "efficiency", "pareto", "spare_waves")
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
FIGSIZE_IN = (8.0, 5.0)
DPI = 150  # PNG: 1200 x 750 pixels
SPARE_COLUMNS = ("spare_waves_ring", "spare_waves_optcc")

# column -> (axis label, scale factor applied to the values)
LABELS: dict[str, tuple[str, float]] = {
    "step_time_s": ("step time (s)", 1.0),
    "mfu": ("MFU (% of peak)", 100.0),
    "capex_usd": ("link capex (million USD)", 1e-6),
    "tokens_per_s": ("throughput (million tokens/s)", 1e-6),
    "cost_per_token_usd": ("cost per million tokens (USD)", 1e6),
    "power_mw": ("power (MW)", 1.0),
    "gpus": ("GPUs", 1.0),
    "spare_waves_ring": ("spare waves, ring all-reduce", 1.0),
    "spare_waves_optcc": ("spare waves, OptCC", 1.0),
    "objective.max_cost_usd": ("link budget objective.max_cost_usd (million USD)", 1e-6),
}
_SUFFIX_UNITS = (
    ("_usd", "USD"),
    ("_km", "km"),
    (".km", "km"),
    ("_ms", "ms"),
    ("_s", "s"),
    ("_mw", "MW"),
    ("_gbps", "Gbit/s"),
    ("_w", "W"),
)


def axis_label(column: str) -> tuple[str, float]:
    """An axis label with units, and the factor to scale the column by."""
    if column in LABELS:
        return LABELS[column]
    if column.endswith("_s") and column in {
        "compute_s",
        "memory_bound_s",
        "bubble_s",
        "tp_comm_s",
        "pp_comm_s",
        "dp_sync_s",
        "optimizer_s",
        "solver_s",
    }:
        return (f"{column.removesuffix('_s').replace('_', ' ')} (s)", 1.0)
    if column.endswith(".km"):
        return (f"fiber route length {column} (km)", 1.0)
    if column.startswith("waves["):
        return (f"new waves on {column[6:-1]} (800G waves)", 1.0)
    for suffix, unit in _SUFFIX_UNITS:
        if column.endswith(suffix):
            return (f"{column} ({unit})", 1.0)
    return (column, 1.0)


# ----------------------------------------------------------------------------- helpers


def _require(df: pd.DataFrame, cols: Sequence[str], where: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise InputError(
            f"{where}: no column {', '.join(repr(c) for c in missing)} (columns: {', '.join(map(str, df.columns))})"  # noqa: E501
        )


def _numeric(s: pd.Series) -> bool:
    import pandas as pd

    return bool(pd.api.types.is_numeric_dtype(s)) and not pd.api.types.is_bool_dtype(s)


def _varying(df: pd.DataFrame, cols: Sequence[str]) -> list[str]:
    return [c for c in cols if df[c].nunique(dropna=False) > 1]


def default_x(df: pd.DataFrame) -> str | None:
    """The first swept column that varies, preferring numeric ones."""
    varying = _varying(df, override_columns(df))
    numeric = [c for c in varying if _numeric(df[c])]
    return (numeric or varying or [None])[0]


def _parse_by(by: str | Sequence[str] | None) -> list[str]:
    if by is None:
        return []
    items = [by] if isinstance(by, str) else list(by)
    return [c.strip() for item in items for c in item.split(",") if c.strip()]


def _fmt_key(k: Any) -> str:
    import pandas as pd

    if k is None or (not isinstance(k, str) and pd.isna(k)):
        return "null"
    if isinstance(k, float) and k.is_integer():
        return str(int(k))
    return str(k)


def _group_label(keys: Any, by: list[str]) -> str:
    keys = keys if isinstance(keys, tuple) else (keys,)
    if len(by) == 1:
        return _fmt_key(keys[0])
    return ", ".join(f"{c}={_fmt_key(k)}" for c, k in zip(by, keys, strict=True))


def _ok(df: pd.DataFrame, y: str) -> pd.Series:
    import pandas as pd

    status_ok = (
        df["status"].isin(OK_STATUSES) if "status" in df else pd.Series(True, index=df.index)
    )
    return status_ok & df[y].notna()


def _x_positions(df: pd.DataFrame, x: str) -> tuple[pd.Series, list[str] | None]:
    """Numeric x as is; categorical x as positions 0..n-1 in order of first appearance."""
    if _numeric(df[x]):
        return df[x].astype(float), None
    cats = list(dict.fromkeys(df[x].astype(str)))
    return df[x].astype(str).map({c: i for i, c in enumerate(cats)}).astype(float), cats


def new_figure() -> tuple[Figure, Axes]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


# ----------------------------------------------------------------------------- kinds


def plot_lines(
    df: pd.DataFrame,
    y: str,
    x: str | None = None,
    by: str | Sequence[str] | None = None,
    title: str | None = None,
    where: str = "results",
) -> Figure:
    """y vs x, one line per group of the `by` columns (default: the other swept columns
    that vary). Points without a plan are marked on the x axis."""
    x = x or default_x(df)
    if x is None:
        raise InputError(f"{where}: no swept column varies; choose the x axis with --x COLUMN")
    by_cols = _parse_by(by)
    if by is None:
        by_cols = [c for c in _varying(df, override_columns(df)) if c != x]
    _require(df, [x, y, *by_cols], where)
    ylab, yk = axis_label(y)
    xlab, xk = axis_label(x)
    fig, ax = new_figure()
    xs, cats = _x_positions(df, x)
    xs = xs * (xk if cats is None else 1.0)
    ok = _ok(df, y)
    groups = df.groupby(by_cols, sort=False, dropna=False) if by_cols else [(None, df)]
    for keys, g in groups:
        gok = g[ok.loc[g.index]]
        if gok.empty:
            continue
        order = xs.loc[gok.index].sort_values().index
        label = _group_label(keys, by_cols) if by_cols else None
        ax.plot(xs.loc[order], gok.loc[order, y].astype(float) * yk, marker="o", label=label)
    _mark_unproven(ax, df[ok], xs, y, yk)
    bad = df[~ok]
    if not bad.empty:
        ax.plot(
            xs.loc[bad.index],
            [0.0] * len(bad),
            linestyle="none",
            marker="x",
            color="tab:red",
            markersize=8,
            transform=ax.get_xaxis_transform(),
            clip_on=False,
            label=f"no plan ({', '.join(sorted(set(bad['status'].astype(str))))})"
            if "status" in bad
            else "no value",
        )
    if cats is not None:
        ax.set_xticks(range(len(cats)), cats, rotation=20, ha="right")
    ax.set_xlabel(xlab)
    ax.set_ylabel(ylab)
    ax.set_title(title or f"{ylab.split(' (')[0]} vs {xlab.split(' (')[0]}")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(
            title=", ".join(by_cols) if by_cols else None, fontsize="small", title_fontsize="small"
        )
    return fig


def unproven(df: pd.DataFrame) -> pd.Series:
    """Points with a plan that the time limit ended before the proof (status not optimal)."""
    import pandas as pd

    if "status" not in df:
        return pd.Series(False, index=df.index)
    return df["status"].isin(OK_STATUSES) & (df["status"] != "optimal")


def _mark_unproven(ax: Axes, df: pd.DataFrame, xs: pd.Series, y: str, yk: float) -> None:
    """A hollow orange ring around every point whose value is not proven (issue 12.5)."""
    import pandas as pd

    u = df[unproven(df)]
    if u.empty:
        return
    gaps = u["gap"].astype(float) if "gap" in u else pd.Series(dtype=float)
    worst = f", gap up to {gaps.max():.1%}" if len(gaps) and gaps.notna().any() else ""
    ax.scatter(
        xs.loc[u.index],
        u[y].astype(float) * yk,
        s=160,
        facecolors="none",
        edgecolors="tab:orange",
        linewidths=2,
        zorder=4,
        label=f"not proven: time limit ({len(u)}{worst})",
    )


def pareto_mask(df: pd.DataFrame, x: str = "capex_usd", y: str = "step_time_s") -> pd.Series:
    """True for the points no other point beats on both x and y (both minimized; ties on
    both keep one point)."""
    import pandas as pd

    ok = _ok(df, y) & df[x].notna()
    mask = pd.Series(False, index=df.index)
    best_y = math.inf
    for idx, row in df[ok].sort_values([x, y], kind="stable").iterrows():
        if float(row[y]) < best_y * (1 - 1e-12):
            mask.loc[idx] = True
            best_y = float(row[y])
    return mask


def plot_pareto(
    df: pd.DataFrame,
    x: str | None = None,
    y: str | None = None,
    by: str | Sequence[str] | None = None,
    title: str | None = None,
    where: str = "results",
) -> Figure:
    x = x or "capex_usd"
    y = y or "step_time_s"
    by_cols = _parse_by(by)
    _require(df, [x, y, *by_cols], where)
    xlab, xk = axis_label(x)
    ylab, yk = axis_label(y)
    ok = _ok(df, y) & df[x].notna()
    if not ok.any():
        raise InputError(f"{where}: no point has a plan; nothing to plot")
    front = pareto_mask(df, x, y)
    fig, ax = new_figure()
    if by_cols:
        for keys, g in df[ok].groupby(by_cols, sort=False, dropna=False):
            ax.scatter(
                g[x].astype(float) * xk,
                g[y].astype(float) * yk,
                s=25,
                alpha=0.7,
                label=_group_label(keys, by_cols),
            )
    else:
        dom = df[ok & ~front]
        if not dom.empty:
            ax.scatter(
                dom[x].astype(float) * xk,
                dom[y].astype(float) * yk,
                s=25,
                color="0.6",
                label="dominated",
            )
    f = df[front].sort_values(x)
    ax.step(
        f[x].astype(float) * xk,
        f[y].astype(float) * yk,
        where="post",
        color="tab:blue",
        linewidth=1.5,
        alpha=0.8,
    )
    ax.scatter(
        f[x].astype(float) * xk,
        f[y].astype(float) * yk,
        s=70,
        facecolors="none" if by_cols else "tab:blue",
        edgecolors="black" if by_cols else "tab:blue",
        linewidths=1.5,
        zorder=3,
        label=f"Pareto front ({len(f)} points)",
    )
    _mark_unproven(ax, df[ok], df[x].astype(float) * xk, y, yk)
    ax.set_xlabel(xlab)
    ax.set_ylabel(ylab)
    ax.set_title(title or f"{ylab.split(' (')[0]} vs {xlab.split(' (')[0]}: Pareto front")
    ax.grid(True, alpha=0.3)
    ax.legend(
        title=", ".join(by_cols) if by_cols else None, fontsize="small", title_fontsize="small"
    )
    return fig


def plot_spare_waves(
    df: pd.DataFrame,
    x: str | None = None,
    by: str | Sequence[str] | None = None,
    title: str | None = None,
    where: str = "results",
) -> Figure:
    """Spare waves under a ring all-reduce vs OptCC: grouped bars per point (or per value of
    x), or one pair of lines per `by` group."""
    missing = [c for c in SPARE_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(
            f"{where}: --kind spare_waves needs the columns {' and '.join(SPARE_COLUMNS)} "
            f"(written by sweeps of instances with a resilience: block); missing: {', '.join(missing)}"  # noqa: E501
        )
    x = x or default_x(df) or "point_id"
    by_cols = _parse_by(by)
    _require(df, [x, *by_cols], where)
    ok = df[list(SPARE_COLUMNS)].notna().any(axis=1)
    if "status" in df:
        ok &= df["status"].isin(OK_STATUSES)
    d = df[ok]
    if d.empty:
        raise InputError(f"{where}: no point has spare-wave values; nothing to plot")
    fig, ax = new_figure()
    xlab, xk = axis_label(x)
    xs, cats = _x_positions(d, x)
    if not by_cols:
        # grouped bars at each distinct x (categorical positions keep the bars readable)
        keys = list(dict.fromkeys(d[x].tolist()))
        if cats is None:
            keys = sorted(keys)
        pos = {k: i for i, k in enumerate(keys)}
        agg = d.groupby(x, sort=False)[list(SPARE_COLUMNS)].max()
        width = 0.38
        for j, (col, name, color) in enumerate(
            zip(
                SPARE_COLUMNS, ("ring all-reduce", "OptCC"), ("tab:orange", "tab:blue"), strict=True
            )
        ):
            vals = [float(agg.loc[k, col]) if k in agg.index else math.nan for k in keys]
            bars = ax.bar(
                [pos[k] + (j - 0.5) * width for k in keys],
                vals,
                width=width,
                label=name,
                color=color,
            )
            ax.bar_label(bars, fmt="%g", fontsize="x-small")
        ticks = [f"{k * xk:g}" if isinstance(k, int | float) else str(k) for k in keys]
        ax.set_xticks(
            range(len(keys)),
            ticks,
            rotation=20 if cats is not None else 0,
            ha="right" if cats is not None else "center",
        )
    else:
        xs = xs * (xk if cats is None else 1.0)
        colors = iter(f"C{i}" for i in range(100))
        for keys_, g in d.groupby(by_cols, sort=False, dropna=False):
            color = next(colors)
            order = xs.loc[g.index].sort_values().index
            lab = _group_label(keys_, by_cols)
            ax.plot(
                xs.loc[order],
                g.loc[order, "spare_waves_ring"],
                marker="o",
                linestyle="--",
                color=color,
                label=f"{lab}: ring",
            )
            ax.plot(
                xs.loc[order],
                g.loc[order, "spare_waves_optcc"],
                marker="s",
                linestyle="-",
                color=color,
                label=f"{lab}: OptCC",
            )
        if cats is not None:
            ax.set_xticks(range(len(cats)), cats, rotation=20, ha="right")
    ax.set_xlabel(xlab)
    ax.set_ylabel("spare waves needed (800G waves)")
    ax.set_title(title or "Spare waves to ride through a single failure: ring vs OptCC")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(
        title=", ".join(by_cols) if by_cols else "collective under failure",
        fontsize="small",
        title_fontsize="small",
    )
    return fig


def plot_results(
    df: pd.DataFrame,
    kind: str = "step_time",
    x: str | None = None,
    by: str | Sequence[str] | None = None,
    y: str | None = None,
    title: str | None = None,
    where: str = "results",
) -> Figure:
    if kind not in KINDS:
        raise InputError(f"--kind: expected one of {', '.join(KINDS)}, got '{kind}'")
    if kind == "step_time":
        return plot_lines(df, y or "step_time_s", x, by, title, where)
    if kind == "efficiency":
        return plot_lines(df, y or "mfu", x, by, title, where)
    if kind == "pareto":
        return plot_pareto(df, x, y, by, title, where)
    return plot_spare_waves(df, x, by, title, where)


def save_figure(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write PNG, SVG or PDF (by extension) atomically."""
    p = Path(path)
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise InputError(f"-o {p}: unsupported image format '{p.suffix}' (use .png, .svg or .pdf)")
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=p.suffix, dir=p.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format=fmt, dpi=DPI)
        os.replace(tmp, p)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return p


def plot_file(
    results: str | os.PathLike[str],
    output: str | os.PathLike[str],
    kind: str = "step_time",
    x: str | None = None,
    by: str | Sequence[str] | None = None,
    y: str | None = None,
    title: str | None = None,
) -> Path:
    """Read a results table (csv, parquet or a sweep folder), plot it, write the image."""
    out = Path(output)
    if out.suffix.lower() not in FORMATS:
        raise InputError(
            f"-o {out}: unsupported image format '{out.suffix}' (use .png, .svg or .pdf)"
        )
    if kind not in KINDS:
        raise InputError(f"--kind: expected one of {', '.join(KINDS)}, got '{kind}'")
    df = read_results(results)
    if df.empty:
        raise InputError(f"{results}: the results table has no rows")
    fig = plot_results(df, kind, x=x, by=by, y=y, title=title, where=str(results))
    return save_figure(fig, out)


__all__ = [
    "KINDS",
    "axis_label",
    "default_x",
    "pareto_mask",
    "plot_file",
    "plot_lines",
    "plot_pareto",
    "plot_results",
    "plot_spare_waves",
    "save_figure",
]
