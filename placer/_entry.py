"""The `placer` command's entry point: a Ctrl-C or SIGTERM during start-up (importing
typer, pydantic, OR-Tools) ends the command with exit 130 and one line, not a traceback;
solve's search (placer.interrupt) and sweep's pool install their own handlers."""

from __future__ import annotations

import os
import signal
import sys


def _early_stop(signum: int, _frame: object) -> None:
    sys.stderr.write(f"interrupted by {signal.Signals(signum).name} during start-up\n")
    sys.stderr.flush()
    os._exit(130)  # nothing has been written yet


def main() -> None:
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s, h in old.items():
        if h is not signal.SIG_IGN:
            signal.signal(s, _early_stop)
    from placer.cli import app

    app()


def command_started() -> None:
    """Called as a command begins (placer.cli._guard): from here on SIGINT and SIGTERM
    raise KeyboardInterrupt, which the command turns into cleanup and exit 130 (solve's
    search installs its own handlers on top). Only when the early handler is in place,
    so tests and embedding programs keep theirs."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for s in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(s) is _early_stop:
            signal.signal(s, _raise_interrupt)


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


if __name__ == "__main__":
    main()
