"""Write the Megatron arguments placer exports for a set of layer splits (run with placer's
venv by `make consumer-exports`); consumers/test_configs.py feeds each to megatron-core.

    python consumers/export_splits.py OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from placer.outputs.launch import megatron_pipeline_args

# even, first only (pp 2), first and last around even middles, last only, and uneven
# middles (the custom layout)
SPLITS = [
    [4, 4],
    [1, 7],
    [6, 2],
    [1, 3, 4],
    [2, 2, 4],
    [2, 3, 3, 4],
    [3, 3, 3, 1],
    [1, 2, 3, 2],
    [1, 1, 4, 1, 1],
]


def main() -> None:
    out = [{"split": s, "args": megatron_pipeline_args(s)[0]} for s in SPLITS]
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
