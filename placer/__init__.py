"""placer: plans multi-site AI training jobs (parallelism, placement, optical links).

import placer
inst = placer.load_instance("instances/two-campus-100km.yaml")
plan = placer.solve(inst, backend="cpsat", time_limit_s=60)
ev = placer.evaluate(inst, plan)
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from placer.errors import InfeasibleError, InputError, PlacerError, TimeLimitError

if TYPE_CHECKING:
    from placer.evaluate import Evaluation
    from placer.io import Problem, load_instance, load_model, load_plan
    from placer.schema import Instance, ModelSpec, Plan

__version__ = "0.1.0"

# imported on first use, so `import placer` (and the CLI's start-up, where a Ctrl-C must
# already be handled: placer._entry) stays cheap
_LAZY = {
    "Evaluation": "placer.evaluate",
    "Problem": "placer.io",
    "load_instance": "placer.io",
    "load_model": "placer.io",
    "load_plan": "placer.io",
    "Instance": "placer.schema",
    "ModelSpec": "placer.schema",
    "Plan": "placer.schema",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'placer' has no attribute {name!r}")


def solve(
    problem: Problem,
    backend: str | None = None,
    time_limit_s: float | None = None,
    threads: int | None = None,
) -> Plan:
    """Solve an instance and return the evaluator-verified plan (CONTRACT section 6)."""
    from placer.optimize.driver import solve as _solve

    return _solve(problem, backend=backend, time_limit_s=time_limit_s, threads=threads).plan


def evaluate(problem: Problem, plan: Plan | dict[str, Any]) -> Evaluation:
    """Check every limit of a plan and compute its step time, throughput, power and cost."""
    from placer.evaluate import evaluate as _evaluate

    return _evaluate(problem, plan)


class _Package(types.ModuleType):
    """`placer.evaluate` stays the API function when the submodule placer.evaluate is
    imported lazily (the import system would otherwise set the attribute to the module)."""

    @property
    def evaluate(self) -> Any:
        return _evaluate_api

    @evaluate.setter
    def evaluate(self, _module: Any) -> None:
        pass  # the submodule stays reachable as sys.modules["placer.evaluate"]


_evaluate_api = evaluate
del evaluate
sys.modules[__name__].__class__ = _Package

__all__ = [
    "Evaluation",
    "InfeasibleError",
    "InputError",
    "Instance",
    "ModelSpec",
    "Plan",
    "PlacerError",
    "Problem",
    "TimeLimitError",
    "evaluate",
    "load_instance",
    "load_model",
    "load_plan",
    "solve",
]
