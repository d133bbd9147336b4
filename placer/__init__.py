"""placer: plans multi-site AI training jobs (parallelism, placement, optical links).

    import placer
    inst = placer.load_instance("instances/two-campus-100km.yaml")
    plan = placer.solve(inst, backend="cpsat", time_limit_s=60)
    ev = placer.evaluate(inst, plan)
"""

from __future__ import annotations

from typing import Any

from placer.errors import InfeasibleError, InputError, PlacerError, TimeLimitError
from placer.evaluate import Evaluation
from placer.evaluate import evaluate as _evaluate
from placer.io import Problem, load_instance, load_model, load_plan
from placer.schema import Instance, ModelSpec, Plan

__version__ = "0.1.0"


def solve(problem: Problem, backend: str | None = None, time_limit_s: float | None = None, threads: int | None = None) -> Plan:
    """Solve an instance and return the evaluator-verified plan (CONTRACT section 6)."""
    from placer.optimize.driver import solve as _solve

    return _solve(problem, backend=backend, time_limit_s=time_limit_s, threads=threads).plan


def evaluate(problem: Problem, plan: Plan | dict[str, Any]) -> Evaluation:
    """Check every limit of a plan and compute its step time, throughput, power and cost."""
    return _evaluate(problem, plan)


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
