"""Keep solver libraries off stdout (CONTRACT section 4: under `--json` stdout is one JSON document).

HiGHS prints its copyright banner from C++ straight to file descriptor 1 the first time a
`highspy.Highs` object is built in a process, before any option (``output_flag``) can be set;
Python's ``sys.stdout`` redirection cannot catch it. We build that first object once with
descriptor 1 pointed at descriptor 2, so the banner goes to stderr and every later solver
object (PuLP's, the brute-force LP's) starts silent.
"""  # noqa: E501

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_done = False


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Point file descriptor 1 at descriptor 2 for the duration (C/C++ writes included)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def absorb_highs_banner() -> None:
    """Build the process's first HiGHS object with stdout sent to stderr (once per process)."""
    global _done
    if _done:
        return
    with _lock:
        if _done:
            return
        import highspy

        with stdout_to_stderr():
            h = highspy.Highs()
            h.setOptionValue("output_flag", False)
            del h
        _done = True
