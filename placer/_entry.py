"""The `placer` command's entry point: a Ctrl-C or SIGTERM during start-up (importing
typer, pydantic, OR-Tools) ends the command with exit 130 and one line, not a traceback;
solve's search (placer.interrupt) and sweep's pool install their own handlers."""

from __future__ import annotations

import os
import signal
import sys


def early_stop(signum: int, _frame: object) -> None:
    """The handler while the command imports: nothing has been written yet. Defined here,
    with only the interpreter's built-in modules, so that it is in place before any of
    placer's imports (placer.interrupt.command_started replaces it once the command runs)."""
    sys.stderr.write(f"interrupted by {signal.Signals(signum).name} during start-up\n")
    sys.stderr.flush()
    os._exit(130)


early_stop.placer_early_stop = True  # type: ignore[attr-defined]


def main() -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, early_stop)
    from placer.optimize import deadline

    # the command's time limit counts from the process start (imports included)
    deadline.command_started_at = deadline.process_start()
    from placer.cli import app

    if sys.argv[1:2] != ["solve"]:
        app()
        return
    # `solve` ends within its time limit: its outputs are written (as a set, placer.outputs
    # .fileset) before the command returns, so skip the interpreter's teardown of the
    # solver's objects (1-1.5 s on the 2-core box) once the streams are flushed
    try:
        app()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if isinstance(code, str):
        sys.stderr.write(code + "\n")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)


if __name__ == "__main__":
    main()
