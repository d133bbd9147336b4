"""Errors that map onto the contract's exit codes (CONTRACT section 4).

The CLI catches `PlacerError` and exits with `exit_code`; anything else is an internal
error (exit 1). Bad input never surfaces as a traceback.
"""

from __future__ import annotations


class PlacerError(Exception):
    exit_code = 1


class InputError(PlacerError):
    """Bad input: file, field or option (exit 2)."""

    exit_code = 2


class InfeasibleError(PlacerError):
    """No plan satisfies the constraints (exit 3); the message names the binding resource."""

    exit_code = 3


class TimeLimitError(PlacerError):
    """The time limit ran out before any feasible plan was found (exit 4)."""

    exit_code = 4


class ModelMismatchError(PlacerError):
    """A backend's objective disagrees with the evaluator: always a bug (exit 1)."""

    exit_code = 1


class SolverError(PlacerError):
    """A backend failed (CP-SAT MODEL_INVALID, a HiGHS error): an internal error with the
    solver's message, never a result (exit 1)."""

    exit_code = 1


class SearchInterrupted(PlacerError):
    """SIGINT or SIGTERM arrived before any feasible plan was found (exit 130)."""

    exit_code = 130
