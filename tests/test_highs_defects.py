"""HiGHS defects placer works around (placer.optimize.milp.HIGHS_DEFAULTS), each on the model
that showed it. The solve runs in a subprocess with a deadline: a regression there loops
inside HiGHS, where no time limit or callback reaches, so it must fail the test, not hang
the suite."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"

SOLVE = """
import sys
import highspy
from placer.optimize.milp import HIGHS_DEFAULTS
h = highspy.Highs()
h.setOptionValue("output_flag", False)
for key, value in {**HIGHS_DEFAULTS, "time_limit": 30.0}.items():
    h.setOptionValue(key, value)
h.readModel(sys.argv[1])
h.run()
print(h.modelStatusToString(h.getModelStatus()), repr(h.getInfo().objective_function_value))
"""


def test_rens_sub_mip_loop_is_avoided(tmp_path: Path) -> None:
    """A round of the MILP of two-campus-100km with Llama 3 70B and at most one wave (as
    branch credit-repeats' formulation builds it) that HiGHS 1.16.0 never finished with
    RENS on: more than 10 minutes in HPresolve::strengthenInequalities of a RENS sub-MIP
    inside another, where no time limit reaches (it hung tests/test_tradeoffs.py). With
    placer's options it is solved, to the value HiGHS gives with RENS on under another
    random seed (1.046064725609461)."""
    mps = tmp_path / "rens_loop.mps"
    mps.write_bytes(gzip.decompress((DATA / "highs_rens_loop.mps.gz").read_bytes()))
    run = subprocess.run(
        [sys.executable, "-c", SOLVE, str(mps)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    status, value = run.stdout.split()[-2:]
    assert status == "Optimal"
    assert float(value) == pytest.approx(1.046064725609461, rel=1e-9)
