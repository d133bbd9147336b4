"""The `placer` command's entry point: a Ctrl-C or SIGTERM during start-up (importing
typer, pydantic, OR-Tools) ends the command with exit 130 and one line, not a traceback;
solve's search (placer.interrupt) and sweep's pool install their own handlers."""

from __future__ import annotations

import os
import signal
import sys

from placer.interrupt import early_stop


def main() -> None:
    from placer.optimize import deadline

    # the command's time limit counts from the process start (imports included)
    deadline.command_started_at = deadline.process_start()
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s, h in old.items():
        if h is not signal.SIG_IGN:
            signal.signal(s, early_stop)
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
