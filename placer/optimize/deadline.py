"""The time limit inside long loops (issue 15 item 3, issue 12 item 4): model building,
chain enumeration and the performance model's per-chain work check a deadline and stop
with `DeadlinePassed`, which the driver turns into "this configuration stays open" (its
bound kept, status `time_limit`), so that no single build can overrun the limit.

The driver sets the deadline around the work (`until`); outside it `check()` does nothing,
so the API and tests that build models directly are unaffected. A stop request (SIGINT,
SIGTERM: placer.interrupt) ends the work the same way.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from placer import interrupt

# assumption: writing plan.json, bom.csv, report.md and report.html (its matplotlib figure
# grows with the sites) took 1.1 s for 2 sites, 1.7-3.7 s for 8 and 3.1 s for 16 on the
# 2-core box at load average ~10; the command keeps this much of its limit for them
OUTPUT_BASE_S = 2.0
OUTPUT_PER_SITE_S = 0.15
OUTPUT_RESERVE_SHARE = 0.25  # ... but at most this share of the limit


def output_reserve_s(time_limit_s: float, sites: int = 8) -> float:
    return min(OUTPUT_BASE_S + OUTPUT_PER_SITE_S * sites, OUTPUT_RESERVE_SHARE * time_limit_s)


class DeadlinePassed(Exception):  # noqa: N818 (a signal to unwind, not an error)
    """The time limit (or a stop request) struck inside a long computation."""


_deadline: float | None = None
T = TypeVar("T")


def check() -> None:
    """Raise DeadlinePassed once the current deadline has passed or a stop is requested."""
    if _deadline is not None and (time.perf_counter() > _deadline or interrupt.requested()):
        raise DeadlinePassed()


def checked(f: Callable[..., T], *args: Any) -> T:
    """f(*args) after a check (for per-item work inside comprehensions)."""
    check()
    return f(*args)


@contextlib.contextmanager
def until(t: float | None) -> Iterator[None]:
    """Work inside the block stops at perf_counter() time `t` (None: no deadline)."""
    global _deadline
    old = _deadline
    _deadline = t if old is None or t is None else min(old, t)
    try:
        yield
    finally:
        _deadline = old


command_started_at: float | None = None  # set by the `placer` entry point (placer._entry)


def process_start() -> float:
    """The process's start as a time.perf_counter() instant."""
    return time.perf_counter() - process_elapsed_s()


def command_start() -> float:
    """When the current command started: the process start under the `placer` entry point,
    now when the CLI runs in-process (tests, embedding programs)."""
    return command_started_at if command_started_at is not None else time.perf_counter()


def process_elapsed_s() -> float:
    """Seconds since this process started (Linux /proc; 0.0 elsewhere): what the
    interpreter's start-up and imports already took of a command's time limit."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 (starttime), counted after the ")"
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0
