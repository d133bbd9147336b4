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

    # the handler stays for commands that install none of their own (solve's search and
    # sweep's pool install theirs and put this one back when they end)
    app()


if __name__ == "__main__":
    main()
