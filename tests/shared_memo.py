"""A memo that pytest-xdist's workers share: `functools.cache`, plus a pickle per call in a
folder of this test run, behind a lock per call.

Why: a few expensive helpers (the solver library's solves of each case) are called by
tests that xdist sends to different workers. With `functools.cache` alone each worker
solved the same case again (stop 46, pytest --durations=0: the brute-force pass over the
whole library 36 s, a 22 s case twice). The lock makes a second worker wait for the first
one's answer instead of computing it too. The folder belongs to one run (pytest's
temporary folder of that run), so no run reads another's answers; outside xdist this is
`functools.cache`.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
MEMO_ENV = "PLACER_TEST_MEMO"


def _folder() -> Path | None:
    """The run's folder (tests/conftest.py sets it in xdist's workers: beside the workers'
    own temporary folders, which pytest prunes after three runs)."""
    folder = os.environ.get(MEMO_ENV)
    return Path(folder) if folder else None


def shared_cache(fn: F) -> F:
    """Memoize fn(*args) (hashable, repr-stable arguments; a picklable result) across the
    workers of one pytest-xdist run."""

    @functools.cache
    def wrapper(*args: Any) -> Any:
        folder = _folder()
        if folder is None:
            return fn(*args)
        key = hashlib.sha256(repr((fn.__module__, fn.__qualname__, args)).encode()).hexdigest()
        folder.mkdir(parents=True, exist_ok=True)
        done = folder / f"{key}.pkl"
        with open(folder / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second worker waits for the first's answer
            if done.exists():
                return pickle.loads(done.read_bytes())
            value = fn(*args)
            tmp = folder / f"{key}.{os.getpid()}.tmp"
            tmp.write_bytes(pickle.dumps(value))
            tmp.replace(done)
            return value

    return wrapper  # type: ignore[return-value]
