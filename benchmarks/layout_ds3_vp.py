"""The shipped DeepSeek-V3 two-site instance with job.parallelism.virtual_stages set: what the
optimizer picks once 61 layers may interleave in uneven chunks (issue 16).

    .venv/bin/python benchmarks/layout_ds3_vp.py cpsat 1,2,4 300
"""

import sys
import tempfile
import time
from pathlib import Path

import yaml

from placer.evaluate import evaluate
from placer.io import load_instance
from placer.optimize.driver import solve

root = Path(__file__).resolve().parent.parent
d = yaml.safe_load((root / "instances/deepseek-v3-two-sites.yaml").read_text())
vs = [int(x) for x in sys.argv[2].split(",")]
d["job"]["parallelism"]["virtual_stages"] = vs
with tempfile.TemporaryDirectory() as t:
    p = Path(t) / "ds3-vp.yaml"
    p.write_text(yaml.safe_dump(d))
    prob = load_instance(p)
    t0 = time.perf_counter()
    res = solve(prob, backend=sys.argv[1], time_limit_s=float(sys.argv[3]))
    dt = time.perf_counter() - t0
    ev = evaluate(prob, res.plan)
    par = res.plan.parallelism
    print(
        sys.argv[1],
        vs,
        res.status,
        f"{dt:.1f}s",
        f"step {ev.step_time_s:.3f} objective {res.objective:.3f}",
        f"tp{par.tp} ep{par.ep} pp{par.pp} dp{par.dp} v{par.virtual_stages}",
        "chunks",
        par.chunk_layers,
        "stage_layers",
        res.plan.stage_layers,
        "configs",
        res.plan.solver.configs_total if res.plan.solver else None,
    )
