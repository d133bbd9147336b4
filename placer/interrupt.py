"""Ctrl-C and SIGTERM: stop the search, keep the best plan, exit 130 (issue 15).

`handle_signals()` installs handlers for SIGINT and SIGTERM that only record the request;
the search polls `requested()` between steps, and a solver that runs for long inside C++
(CP-SAT) registers a stop function with `stoppable()`. Python runs signal handlers in the
main thread only between bytecodes, so while CP-SAT holds the main thread a watcher thread,
woken through `signal.set_wakeup_fd`, calls the stop functions (CpSolver.StopSearch is
thread-safe). CP-SAT itself is told not to catch SIGINT (`catch_sigint_signal = False`).
A second signal while stopping restores the default behaviour (a third one kills at once).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from collections.abc import Callable, Iterator

from placer.limits import STOP_GRACE_S

EXIT_CODE = 130  # 128 + SIGINT, the shell convention for an interrupted command

_requested: str | None = None
_stoppers: dict[int, Callable[[], None]] = {}
_lock = threading.Lock()


def requested() -> str | None:
    """The name of the signal that asked to stop ('SIGINT', 'SIGTERM'), or None."""
    return _requested


def request(name: str = "SIGINT") -> None:
    """Ask the running search to stop (what the signal handler does; also for tests)."""
    global _requested
    _requested = _requested or name
    with _lock:
        stops = list(_stoppers.values())
    for stop in stops:
        with contextlib.suppress(Exception):
            stop()


def reset() -> None:
    global _requested
    _requested = None


@contextlib.contextmanager
def stoppable(stop: Callable[[], None]) -> Iterator[None]:
    """While the block runs, a stop request calls `stop` (from the watcher thread)."""
    key = id(stop)
    with _lock:
        _stoppers[key] = stop
    try:
        if _requested:
            stop()
        yield
    finally:
        with _lock:
            _stoppers.pop(key, None)


@contextlib.contextmanager
def handle_signals() -> Iterator[None]:
    """Record SIGINT/SIGTERM instead of raising; only in the main thread (no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    reset()
    names = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}
    old = {s: signal.getsignal(s) for s in names}
    r, w = os.pipe()
    os.set_blocking(w, False)
    os.set_blocking(r, False)
    done = threading.Event()
    seen = [0]

    def handler(signum: int, _frame: object) -> None:
        seen[0] += 1
        if seen[0] >= 2:  # a second signal: let the next one act as usual
            for s, h in old.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)
        request(names.get(signum, "SIGINT"))

    def watch() -> None:
        while not done.is_set():
            ready, _, _ = select.select([r], [], [], 0.5)
            if not ready:
                continue
            try:
                data = os.read(r, 64)
            except BlockingIOError:
                continue
            if not data:
                return
            if not any(b in (signal.SIGINT, signal.SIGTERM) for b in data):
                continue  # another signal with a Python handler (not ours)
            name = "SIGTERM" if signal.SIGTERM in data else "SIGINT"
            request(name)  # stops CP-SAT while the main thread is inside Solve()
            if done.wait(STOP_GRACE_S):
                return
            # the main thread is stuck in code that does not poll (a bug): end anyway; outputs
            # are written as sets (placer.outputs.fileset), so nothing half-written remains
            os.write(2, f"placer: stop not honoured within {STOP_GRACE_S:g} s; exiting\n".encode())
            os._exit(EXIT_CODE)

    old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    for s in names:
        if (
            old[s] is not signal.SIG_IGN
        ):  # a signal the caller ignores (nohup, `cmd &`) stays ignored
            signal.signal(s, handler)
    watcher = threading.Thread(target=watch, name="placer-signal-watcher", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(old_fd)
        done.set()
        watcher.join(timeout=1.0)
        os.close(r)
        os.close(w)


def die_with_parent() -> None:
    """In a worker process: get SIGKILL when the parent process dies, however it dies
    (Linux prctl PR_SET_PDEATHSIG); elsewhere, exit if the parent is already gone."""
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


# ----------------------------------------------------------------------------- start-up


def command_started() -> None:
    """Called as a command begins (placer.cli_support.guard): from here on SIGINT and SIGTERM
    raise KeyboardInterrupt, which the command turns into cleanup and exit 130 (solve's
    search installs its own handlers on top). Only when the early handler is in place,
    so tests and embedding programs keep theirs."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for s in (signal.SIGINT, signal.SIGTERM):
        if getattr(signal.getsignal(s), "placer_early_stop", False):  # placer._entry's
            signal.signal(s, _raise_interrupt)


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)
