"""The two published calibration tables and the model's prediction for each row.

reference/performance-model.md, "Calibration data":

* SC21 Table 1 (Narayanan et al., SC21, arXiv 2104.04473): A100 80GB, s=2048, V=51200,
  full activation recompute, hardware FLOPs `96 B s l h^2 (1 + s/(6h) + V/(16 l h))`.
  The 2021 Megatron-LM of those runs had no sequence parallelism, no distributed
  optimizer and no overlap of the gradient reduce or TP communication. The 76B-530B rows
  ran the interleaved schedule: NVIDIA/Megatron-LM examples/sc21/run_table_1.sh passes
  --num-layers-per-virtual-pipeline-stage 5, 5, 3 and 1, i.e. 15/5 = 3, 10/5 = 2, 6/3 = 2
  and 3/1 = 3 chunks per rank (`virtual_stages` below); the 1T row did not. The same
  script gives each run's micro-batch size (MBS 16, 16, 16, 8, 4, 2, 2, 1, 1, 1), which
  sets the micro-batch count m = B / (b d) and so the bubble (`micro_batch` below).
* Megatron-Core weak scaling on H100 (NVIDIA/Megatron-LM README, r0.8.0): s=4096,
  V=131072, micro-batch 1, DP 48, model FLOPs `72 B s l h^2 (1 + s/(6h) + V/(12 l h))`.
  Megatron-Core recipes run flash attention (recompute of the attention core, placer's
  "selective"), sequence parallelism, the distributed optimizer and every overlap
  (--overlap-grad-reduce, --overlap-param-gather, --tp-comm-overlap). The table states no
  interleaving (virtual_stages 1).

benchmarks/fidelity.py prints the comparison; tests/test_calibration.py bounds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from placer.evaluate import evaluate
from placer.io import problem_from_data


@dataclass(frozen=True)
class Row:
    table: str
    params_b: float
    layers: int
    hidden: int
    heads: int
    tp: int
    pp: int
    gpus: int
    batch: int
    published_tflops: float
    virtual_stages: int = 1  # interleaved 1F1B chunks per rank of the published run
    micro_batch: int = 1  # sequences per micro-batch of the published run

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def label(self) -> str:
        return f"{self.table}-{self.params_b:g}b"


SC21 = "sc21-a100"
MCORE = "mcore-h100"

# params (B), layers, h, heads, TP, PP, GPUs, batch, achieved TFLOP/s per GPU, v, MBS
_SC21_ROWS = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 1, 16),
    (3.6, 30, 3072, 32, 2, 1, 64, 512, 138, 1, 16),
    (7.5, 36, 4096, 32, 4, 1, 128, 512, 142, 1, 16),
    (18.4, 40, 6144, 48, 8, 1, 256, 1024, 135, 1, 8),
    (39.1, 48, 8192, 64, 8, 2, 512, 1536, 138, 1, 4),
    (76.1, 60, 10240, 80, 8, 4, 1024, 1792, 140, 3, 2),
    (145.6, 80, 12288, 96, 8, 8, 1536, 2304, 148, 2, 2),
    (310.1, 96, 16384, 128, 8, 16, 1920, 2160, 155, 2, 1),
    (529.6, 105, 20480, 128, 8, 35, 2520, 2520, 163, 3, 1),
    (1008.0, 128, 25600, 160, 8, 64, 3072, 3072, 163, 1, 1),
]
_MCORE_ROWS = [
    (1.7, 24, 2048, 16, 1, 1, 48, 192, 408.8),
    (7.1, 30, 4096, 32, 2, 1, 96, 192, 465.9),
    (16, 32, 6144, 48, 4, 1, 192, 192, 489.1),
    (32, 48, 7168, 56, 8, 1, 384, 192, 459.6),
    (70, 84, 8192, 64, 8, 2, 768, 384, 419.7),
    (119, 92, 10240, 80, 8, 4, 1536, 768, 420.5),
    (177, 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
    (314, 96, 16384, 128, 8, 8, 3072, 1536, 474.4),
    (462, 112, 18432, 144, 8, 16, 6144, 3072, 459.9),
]
TABLES: dict[str, list[Row]] = {
    SC21: [Row(SC21, *r) for r in _SC21_ROWS],
    MCORE: [Row(MCORE, *r) for r in _MCORE_ROWS],
}
GPU = {SC21: "a100-80g", MCORE: "h100-sxm"}
SEQ = {SC21: 2048, MCORE: 4096}
VOCAB = {SC21: 51200, MCORE: 131072}


def published_flops(row: Row) -> float:
    """The FLOP count each table divides by step time and GPUs."""
    B, s, l, h, V = row.batch, SEQ[row.table], row.layers, row.hidden, VOCAB[row.table]  # noqa: E741
    if row.table == SC21:
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def instance_data(
    row: Row, gpu: str | None = None, catalog: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A one-site instance running the row's model with the published run's settings."""
    model = {
        "name": row.label.replace(".", "p"),
        "layers": row.layers,
        "hidden": row.hidden,
        "heads": row.heads,
        "vocab": VOCAB[row.table],
        "seq_len": SEQ[row.table],
        "tied_embeddings": True,
    }
    if row.table == SC21:
        job = {
            "recompute": "full",
            "sequence_parallel": False,
            "zero1": False,
            "overlap": {"grad_reduce": False, "param_gather": False, "tp_comm": False},
        }
    else:
        job = {
            "recompute": "selective",
            "sequence_parallel": True,
            "zero1": True,
            "overlap": {"grad_reduce": True, "param_gather": True, "tp_comm": True},
        }
    return {
        "name": "calibration",
        "sites": [{"name": "dc", "gpu": gpu or GPU[row.table], "gpus": row.gpus}],
        "job": {"model": model, "global_batch": row.batch, **job},
        "catalog": catalog or {},
    }


def plan_data(row: Row) -> dict[str, Any]:
    base, extra = divmod(row.layers, row.pp)
    layers = [base + (1 if k < extra else 0) for k in range(row.pp)]
    par = {"tp": row.tp, "pp": row.pp, "dp": row.dp, "micro_batch": row.micro_batch}
    if row.virtual_stages > 1:
        par["virtual_stages"] = row.virtual_stages
    return {
        "parallelism": par,
        "stage_layers": layers,
        "replica_groups": [{"count": row.dp, "stage_sites": ["dc"] * row.pp}],
    }


def predict(
    row: Row, gpu: str | None = None, catalog: dict[str, Any] | None = None
) -> tuple[float, dict[str, float]]:
    """(TFLOP/s per GPU in the table's own FLOP count, the step's breakdown)."""
    prob = problem_from_data(instance_data(row, gpu, catalog))
    ev = evaluate(prob, plan_data(row))
    return published_flops(row) / (ev.step_time_s * row.gpus) / 1e12, ev.breakdown


def errors(
    table: str, gpu: str | None = None, catalog: dict[str, Any] | None = None
) -> list[tuple[Row, float, float]]:
    """(row, predicted TFLOP/s, relative error) for every row of a table."""
    out = []
    for row in TABLES[table]:
        got, _ = predict(row, gpu, catalog)
        out.append((row, got, (got - row.published_tflops) / row.published_tflops))
    return out
