"""The `placer` command's entry point: a Ctrl-C or SIGTERM during start-up (importing
typer, pydantic, OR-Tools) ends the command with exit 130 and one line, not a traceback;
solve's search (placer.interrupt) and sweep's pool install their own handlers."""

from __future__ import annotations

import signal

from placer.interrupt import early_stop


def main() -> None:
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s, h in old.items():
        if h is not signal.SIG_IGN:
            signal.signal(s, early_stop)
    from placer.cli import app

    app()


if __name__ == "__main__":
    main()
