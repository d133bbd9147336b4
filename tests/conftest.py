"""Test-run policy: which tests run alone.

`make test` runs the suite in two passes: every test not marked `serial` spread over the
cores (pytest-xdist, `-n auto`), then the `serial` ones one at a time. A test is serial
when what it asserts depends on having the machine to itself: a wall-clock bound (the time
limit holds for the whole command, a hostile input is refused within seconds, a signal is
honoured within its grace time, pool workers die with their parent) or a plan that must be
found within a time limit. Tests whose solver work is fixed (one thread, a proof long
before a generous limit) are not serial. Plain `pytest` still runs everything in one
process.
"""

from __future__ import annotations

import pytest

SERIAL_MODULES = {
    "test_deadline.py",  # the whole command ends within its limit
    "test_hostile_input.py",  # refused or ended within seconds
    "test_output_set.py",  # signals honoured within their grace time, kills at moments
    "test_sweep_faults.py",  # workers die with their parent within seconds
}
SERIAL_TESTS = {
    # a plan within a 20 s limit on the 8-site power-bound instance
    "test_presolve_heuristic.py::test_power_bound_eight_sites_returns_a_plan_within_the_limit",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "serial: asserts wall-clock behaviour; `make test` runs it alone"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.name
        name = f"{module}::{item.originalname if hasattr(item, 'originalname') else item.name}"
        if module in SERIAL_MODULES or name in SERIAL_TESTS:
            item.add_marker(pytest.mark.serial)
