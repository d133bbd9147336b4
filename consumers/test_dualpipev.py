"""DualPipeV (issue 16 item 6) against torch's own schedule and torchtitan's config.

The oracle is torch 2.13's ScheduleDualPipeV (torch.distributed.pipelining.schedules,
``_calculate_single_rank_operations``: the per-rank action lists its runtime executes,
derived from DeepSeek's dualpipev.py): placer's dualpipev_order must be the same actions,
and the makespan of torch's lists, evaluated here with unit op times by a small event loop
of this file's own (not placer's), must be the DualPipe README's bubble
(p - 1)(F&B + B - 3W) over 2 m (F + B) of work, and equal placer's dualpipev_path.
torchtitan 0.2.2 must accept the DualPipeV export of consumers/case-dualpipev.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, require

KIND = {"F": "F", "B": "B", "I": "I", "W": "W"}


def _torch_orders(p: int, m: int) -> list[list[tuple[tuple[str, int, int], ...]]]:
    """torch's action lists, one op a tuple of (kind, micro-batch, stage) actions (the
    overlapped F&B op its two sub-actions, forward first)."""
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV

    fake = SimpleNamespace(pp_group_size=p, _n_microbatches=m)
    out = []
    for rank in range(p):
        ops = []
        for a in ScheduleDualPipeV._calculate_single_rank_operations(fake, rank):
            acts = a.sub_actions if a.sub_actions is not None else (a,)
            ops.append(
                tuple(
                    (KIND[x.computation_type.value], x.microbatch_index, x.stage_index)
                    for x in acts
                )
            )
        out.append(ops)
    return out


CASES = [(2, 4), (2, 7), (3, 6), (4, 8), (4, 11), (8, 16), (8, 20)]


@pytest.mark.parametrize(("p", "m"), CASES)
def test_torch_runs_the_order_placer_prices(p: int, m: int) -> None:
    from placer.perf.dualpipe import dualpipev_order

    torch_orders = _torch_orders(p, m)
    for rank in range(p):
        assert torch_orders[rank] == dualpipev_order(p, m, rank), rank


def _makespan(orders, p: int, f: float, b: float, w: float) -> float:
    """Unit-time evaluation of the action lists, no communication time: an op starts when
    its rank is free and its inputs exist (forward of stage s after that of s - 1; backward
    of s after that of s + 1, the last stage's after its own forward; W after its I)."""
    n = 2 * p
    dur = {"F": f, "B": b, "I": b - w, "W": w}
    done: dict[tuple[str, int, int], float] = {}
    nxt, free = [0] * p, [0.0] * p
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for r in range(p):
            while nxt[r] < len(orders[r]):
                op = orders[r][nxt[r]]
                need = []
                for kind, x, s in op:
                    if kind == "F" and s > 0:
                        need.append(("F", x, s - 1))
                    elif kind in ("B", "I"):
                        need.append(("F", x, s) if s == n - 1 else ("G", x, s + 1))
                    elif kind == "W":
                        need.append(("G", x, s))
                if any(k not in done for k in need):
                    break
                end = max([free[r], *(done[k] for k in need)]) + sum(dur[a[0]] for a in op)
                for kind, x, s in op:
                    if kind != "W":  # F: the activation; B, I: the input gradient
                        done[("F" if kind == "F" else "G", x, s)] = end
                free[r] = end
                nxt[r] += 1
                left -= 1
                moved = True
        assert moved, "deadlock"
    return max(free)


@pytest.mark.parametrize(("p", "m"), CASES)
@pytest.mark.parametrize("fbw", [(1.0, 2.0, 1.0), (2.0, 3.0, 1.0)])
def test_torch_schedule_has_the_readme_bubble(p: int, m: int, fbw) -> None:
    from placer.perf.dualpipe import dualpipev_path

    f, b, w = fbw
    t = _makespan(_torch_orders(p, m), p, f, b, w)
    assert t == pytest.approx(2 * m * (f + b) + (p - 1) * (f + b + b - 3 * w))
    n = 2 * p
    zero = [0.0] * (p - 1)
    assert dualpipev_path([f] * n, [b] * n, [w] * n, zero, zero, m).makespan_s == pytest.approx(t)


EXPORT = Path(
    os.environ.get("PLACER_EXPORT_DUALPIPEV", ROOT / "build" / "consumers" / "export-dualpipev")
)
TT02 = os.environ.get("TORCHTITAN_02_PATH", str(ROOT / ".venv-consumers" / "torchtitan-0.2.2"))

_PROBE = """
import json, sys
from types import SimpleNamespace
import torchtitan
from torchtitan.config import ConfigManager
from torchtitan.distributed.dual_pipe_v import get_dual_pipe_v_flag
from torch.distributed.pipelining.schedules import (
    ScheduleDualPipeV, generate_rank_to_stage_mapping, get_schedule_class)
c = ConfigManager().parse_args(['--job.config_file', sys.argv[1]])
p = c.parallelism
pp = p.pipeline_parallel_degree
dims = SimpleNamespace(ep_enabled=p.expert_parallel_degree > 1, pp_enabled=pp > 1)
parts = p.module_fqns_per_model_part
print(json.dumps({
    "where": torchtitan.__file__,
    "schedule_is_dualpipev": get_schedule_class(p.pipeline_parallel_schedule) is ScheduleDualPipeV,
    "dual_pipe_v_flag": get_dual_pipe_v_flag(c, dims),
    "pp": pp,
    "n_micro": c.training.local_batch_size // p.pipeline_parallel_microbatch_size,
    "rank_parts": {r: [parts[s] for s in st] for r, st in
                   generate_rank_to_stage_mapping(pp, len(parts), style="v").items()},
}))
"""


def test_torchtitan_02_accepts_the_dualpipev_export() -> None:
    """torchtitan 0.2.2 parses placer's DualPipeV export: the schedule class is torch's
    ScheduleDualPipeV, torchtitan's own check turns the EP overlap on without raising (it
    refuses activation checkpointing), the micro-batches meet the schedule's minimum (2 pp),
    and its V stage mapping gives rank 0 the embedding and the output head, every rank
    the two parts placer's model prices on it."""
    import json
    import subprocess
    import sys

    require((Path(TT02) / "torchtitan").is_dir(), f"torchtitan 0.2.2 in {TT02}")
    toml = EXPORT / "torchtitan.toml"
    require(toml.exists(), f"placer's DualPipeV export in {EXPORT} (make test-consumers)")
    r = subprocess.run(
        [sys.executable, "-c", _PROBE, str(toml)],
        env=os.environ | {"PYTHONPATH": TT02},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["where"].startswith(TT02)
    assert got["schedule_is_dualpipev"] and got["dual_pipe_v_flag"] is True
    pp = got["pp"]
    assert pp == 2 and got["n_micro"] >= 2 * pp
    sys.path.insert(0, str(ROOT))
    from placer.io import load_instance, load_plan
    from placer.rules import config_of

    prob = load_instance(ROOT / "consumers" / "case-dualpipev" / "instance.yaml")
    cfg = config_of(prob, load_plan(ROOT / "consumers" / "case-dualpipev" / "plan.json"))
    assert cfg.dualpipev and cfg.ep_overlap and got["n_micro"] == cfg.num_micro_batches
    for rank, parts in got["rank_parts"].items():
        layers = [sum(x.startswith("layers.") for x in part) for part in parts]
        assert tuple(layers) == cfg.rank_chunks(int(rank)), rank
    assert "tok_embeddings" in got["rank_parts"]["0"][0]
    assert "output" in got["rank_parts"]["0"][1]
