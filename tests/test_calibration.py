"""The step-time model against Megatron-LM's published measurements (SC21 Table 1).

Narayanan et al., SC21, Table 1: A100 80GB, full recompute, s=2048, V=51200, achieved
TFLOP/s per GPU counted with the paper's own formula F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
The predicted figure uses that same formula over placer's step time, so the only thing
tested is placer's time model (compute efficiency, bubble, TP and DP communication).
"""

from __future__ import annotations

import pytest

from placer.evaluate import evaluate
from placer.io import problem_from_data

# params (B), model file, TP, PP, GPUs, batch, achieved TFLOP/s per GPU
SC21_TABLE1 = [
    (1.7, "sc21-1.7b", 1, 1, 32, 512, 137),
    (3.6, "sc21-3.6b", 2, 1, 64, 512, 138),
    (7.5, "sc21-7.5b", 4, 1, 128, 512, 142),
    (18.4, "sc21-18.4b", 8, 1, 256, 1024, 135),
    (39.1, "sc21-39.1b", 8, 2, 512, 1536, 138),
    (76.1, "sc21-76.1b", 8, 4, 1024, 1792, 140),
    (145.6, "sc21-145.6b", 8, 8, 1536, 2304, 148),
    (310.1, "sc21-310.1b", 8, 16, 1920, 2160, 155),
    (529.6, "sc21-529.6b", 8, 35, 2520, 2520, 163),
    (1008.0, "sc21-1t", 8, 64, 3072, 3072, 163),
]


def megatron_hfu_flops(batch: int, s: int, layers: int, h: int, vocab: int) -> float:
    return 96 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))


def predicted_tflops(model: str, tp: int, pp: int, gpus: int, batch: int) -> float:
    dp = gpus // (tp * pp)
    prob = problem_from_data(
        {
            "name": "sc21",
            "sites": [{"name": "dc", "gpu": "a100-80g", "gpus": gpus}],
            "job": {"model": model, "global_batch": batch, "recompute": "full"},
        }
    )
    m = prob.model
    base, extra = divmod(m.layers, pp)
    layers = [base + (1 if k < extra else 0) for k in range(pp)]
    plan = {
        "parallelism": {"tp": tp, "pp": pp, "dp": dp, "micro_batch": 1},
        "stage_layers": layers,
        "replica_groups": [{"count": dp, "stage_sites": ["dc"] * pp}],
    }
    ev = evaluate(prob, plan)
    flops = megatron_hfu_flops(batch, m.seq_len, m.layers, m.hidden, m.vocab)
    return flops / (ev.step_time_s * gpus) / 1e12


@pytest.mark.parametrize("row", SC21_TABLE1, ids=[r[1] for r in SC21_TABLE1])
def test_sc21_table1_within_10_percent(row: tuple) -> None:
    _, model, tp, pp, gpus, batch, published = row
    got = predicted_tflops(model, tp, pp, gpus, batch)
    assert abs(got - published) / published <= 0.10, f"{model}: predicted {got:.1f} TFLOP/s, published {published}"
