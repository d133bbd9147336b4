"""The step-time model against the two published calibration tables, row by row.

Run: ``.venv/bin/python benchmarks/fidelity.py`` (the table in benchmarks/README.md).
``--fit`` refits the per-generation compute parameters (scipy least squares on the
relative errors; scipy is a dev dependency) and prints them for the catalog;
``--cross`` is the honesty check: each table predicted with the other generation's fit
(peak, HBM and network of the table's own GPU; only the fitted efficiencies swapped).

Settings of each published run: placer.perf.calibration.
"""

from __future__ import annotations

import argparse
import statistics

from placer.io import default_catalog_data
from placer.perf.calibration import GPU, MCORE, SC21, TABLES, errors, predict

FITTED = ("matmul_efficiency", "matmul_half_dim", "attention_efficiency")


def fitted_params(gpu: str) -> dict[str, float]:
    spec = default_catalog_data()["gpus"][gpu]
    return {k: spec[k] for k in FITTED}


def print_table(table: str, catalog: dict | None = None, title: str = "") -> tuple[float, float]:
    rows = errors(table, catalog=catalog)
    print(f"\n{title or table} ({GPU[table]})\n")
    print("| params (B) | TP | PP | DP | published TFLOP/s | model TFLOP/s | error | compute | memory-bound | TP exposed | bubble | DP exposed | optimizer |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row, got, err in rows:
        _, b = predict(row, catalog=catalog)
        total = sum(b.values())
        share = {k: b[k] / total for k in b}
        print(
            f"| {row.params_b:g} | {row.tp} | {row.pp} | {row.dp} | {row.published_tflops:g} | {got:.1f} | {err:+.1%} | "
            f"{share['compute_s']:.0%} | {share['memory_bound_s']:.0%} | {share['tp_comm_s']:.0%} | {share['bubble_s']:.0%} | "
            f"{share['dp_sync_s']:.0%} | {share['optimizer_s']:.1%} |"
        )
    abs_err = [abs(e) for _, _, e in rows]
    mean, worst = statistics.mean(abs_err), max(abs_err)
    print(f"\nmean |error| {mean:.1%}, max |error| {worst:.1%}")
    return mean, worst


def overrides(gpu: str, params: dict[str, float]) -> dict:
    return {"gpus": {gpu: params}}


def fit(table: str) -> dict[str, float]:
    import numpy as np
    from scipy.optimize import least_squares

    gpu = GPU[table]
    start = fitted_params(gpu)

    def residuals(x: np.ndarray) -> np.ndarray:
        params = dict(zip(FITTED, (float(x[0]), float(x[1]) * 100.0, float(x[2])), strict=True))
        return np.array([e for _, _, e in errors(table, catalog=overrides(gpu, params))])

    x0 = np.array([start["matmul_efficiency"], start["matmul_half_dim"] / 100.0, start["attention_efficiency"]])
    res = least_squares(residuals, x0, bounds=([0.3, 0.0, 0.05], [1.0, 50.0, 1.0]), diff_step=1e-3)
    return {"matmul_efficiency": round(float(res.x[0]), 3), "matmul_half_dim": round(float(res.x[1]) * 100.0), "attention_efficiency": round(float(res.x[2]), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="refit the per-generation parameters")
    ap.add_argument("--cross", action="store_true", help="predict each table with the other generation's fit")
    args = ap.parse_args()
    if args.fit:
        for table in TABLES:
            p = fit(table)
            print(f"{GPU[table]} fitted to {table}: {p}")
            print_table(table, overrides(GPU[table], p))
        return
    summary = {}
    for table in TABLES:
        print(f"fitted parameters of {GPU[table]}: {fitted_params(GPU[table])}")
        summary[table] = print_table(table)
    if args.cross:
        other = {SC21: MCORE, MCORE: SC21}
        for table in TABLES:
            src = GPU[other[table]]
            summary[f"{table} with {src}'s fit"] = print_table(table, overrides(GPU[table], fitted_params(src)), f"{table} predicted with the {src} fit")
    print("\n| table | mean |error| | max |error| |\n|---|---:|---:|")
    for name, (mean, worst) in summary.items():
        print(f"| {name} | {mean:.1%} | {worst:.1%} |")


if __name__ == "__main__":
    main()
