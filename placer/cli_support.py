"""What every placer command shares: the consoles, the error-to-exit-code guard and the
JSON encoder of tuples (placer.cli and placer.study.cli both use them)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from placer.errors import PlacerError

PIPE_WIDTH = 1000  # columns when stdout is not a terminal: tables are never cut for files and pipes
err = Console(stderr=True)
out = Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)


def clip_lines(text: str) -> str:
    """No line of a message longer than MESSAGE_LINE_CHARS (a hostile value is not echoed whole)."""
    from placer.limits import MESSAGE_LINE_CHARS

    return "\n".join(
        ln
        if len(ln) <= MESSAGE_LINE_CHARS
        else f"{ln[:MESSAGE_LINE_CHARS]}... ({len(ln):,} characters)"
        for ln in text.splitlines()
    )


def guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map placer errors to exit codes; never show a traceback for bad input."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from placer.interrupt import command_started

        command_started()
        try:
            return fn(*args, **kwargs)
        except PlacerError as exc:
            err.print(
                Text("error: ", style="red") + Text(clip_lines(str(exc))),
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(exc.exit_code) from None
        except typer.Exit:
            raise
        except KeyboardInterrupt:  # Ctrl-C before the handlers are in place (start-up)
            err.print(Text("interrupted", style="red"), highlight=False)
            raise typer.Exit(130) from None
        except Exception as exc:  # noqa: BLE001
            if caused_by_interrupt(exc):  # e.g. Python 3.11 wraps it raised in __set_name__
                err.print(Text("interrupted", style="red"), highlight=False)
                raise typer.Exit(130) from None
            if os.environ.get("PLACER_DEBUG"):
                raise
            err.print(
                Text("internal error: ", style="red")
                + Text(
                    clip_lines(f"{type(exc).__name__}: {exc} (set PLACER_DEBUG=1 for a traceback)")
                ),
                soft_wrap=True,
            )
            raise typer.Exit(1) from None

    return wrapper


def caused_by_interrupt(exc: BaseException) -> bool:
    """Whether a Ctrl-C or SIGTERM (a KeyboardInterrupt) is behind this exception: an
    interrupt that lands while a class is created (a lazy import of a pydantic model)
    reaches the command as RuntimeError("Error calling __set_name__ ...") on Python 3.11,
    the KeyboardInterrupt only as its __cause__."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def json_default(o: Any) -> Any:
    if isinstance(o, tuple | set):
        return list(o)
    return str(o)
