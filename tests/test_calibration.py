"""The step-time model against the two published calibration tables.

SC21 Table 1 (A100, Narayanan et al.) and the Megatron-Core weak-scaling table (H100), as
in reference/performance-model.md; each predicted figure uses the table's own FLOP count
over placer's step time, so only placer's time model is tested. The per-generation
compute parameters in the catalog were fitted to these rows (benchmarks/fidelity.py
--fit); the test keeps every row within 5% and the tables' means within 3.5%, so that a
change to the model that breaks the fit is caught.
"""

from __future__ import annotations

import statistics

import pytest

from placer.perf.calibration import MCORE, SC21, TABLES, errors, predict, published_flops

ROWS = [row for table in TABLES.values() for row in table]


@pytest.mark.parametrize("row", ROWS, ids=[r.label for r in ROWS])
def test_row_within_5_percent(row) -> None:
    got, _ = predict(row)
    assert abs(got - row.published_tflops) / row.published_tflops <= 0.05, (
        f"{row.label}: predicted {got:.1f} TFLOP/s, published {row.published_tflops}"
    )


@pytest.mark.parametrize("table", [SC21, MCORE])
def test_table_mean_error(table: str) -> None:
    assert statistics.mean(abs(e) for _, _, e in errors(table)) <= 0.035


def test_published_flop_counts() -> None:
    """The tables' own FLOP formulas against their published totals: SC21's 1T row is
    163 TFLOP/s on 3072 GPUs, and its batch of 3072 sequences of 2048 tokens is
    96 B s l h^2 (1 + s/6h + V/16lh) with l=128, h=25600, V=51200."""
    row = TABLES[SC21][-1]
    s, l, h, v = 2048, 128, 25600, 51200  # noqa: E741
    assert published_flops(row) == pytest.approx(
        96 * 3072 * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    )
    h100 = TABLES[MCORE][0]  # 1.7B: l=24, h=2048, s=4096, V=131072
    s, l, h, v = 4096, 24, 2048, 131072  # noqa: E741
    assert published_flops(h100) == pytest.approx(
        72 * 192 * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    )


def test_breakdown_is_additive_on_calibration_rows() -> None:
    """The terms the benchmark prints add up to the step time."""
    for row in (TABLES[SC21][4], TABLES[MCORE][4]):
        got, b = predict(row)
        step = published_flops(row) / (got * 1e12 * row.gpus)
        assert sum(b.values()) == pytest.approx(step, rel=1e-9)
        assert {
            "compute_s",
            "memory_bound_s",
            "tp_comm_s",
            "bubble_s",
            "pp_comm_s",
            "dp_sync_s",
            "optimizer_s",
        } <= set(b)
