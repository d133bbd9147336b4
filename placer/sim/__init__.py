"""Whole-job discrete-event simulation of a training step: the independent check of the
closed-form step time (placer.perf.step). `simulate(problem, plan)` is the entry point."""

from placer.sim.fabric import Fabric, max_min_fair
from placer.sim.job import (
    SimOptions,
    SimulationResult,
    Transfer,
    schedule,
    simulate,
    simulate_chain,
)

__all__ = [
    "Fabric",
    "SimOptions",
    "SimulationResult",
    "Transfer",
    "max_min_fair",
    "schedule",
    "simulate",
    "simulate_chain",
]
