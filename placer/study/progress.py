"""The sweep's progress bar."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


# ----------------------------------------------------------------------------- progress


class _Progress:
    """A rich progress bar on stderr: done / total, ETA, and counts by outcome."""

    def __init__(self, total: int, done: int, existing: Iterable[dict[str, Any]], enabled: bool):
        self.total, self.done, self.enabled = total, done, enabled
        self.counts = {"ok": 0, "infeasible": 0, "time_limit": 0, "error": 0}
        for rec in existing:
            self._count(rec)
        self._bar: Any = None
        self._task: Any = None

    def _count(self, rec: dict[str, Any]) -> None:
        s = rec.get("status")
        self.counts[
            "ok" if s in ("optimal", "feasible") else s if s in self.counts else "error"
        ] += 1

    def _text(self) -> str:
        c = self.counts
        parts = [f"ok {c['ok']}"]
        if c["infeasible"]:
            parts.append(f"infeasible {c['infeasible']}")
        if c["time_limit"]:
            parts.append(f"time limit {c['time_limit']}")
        parts.append(f"[red]failed {c['error']}[/red]" if c["error"] else "failed 0")
        return ", ".join(parts)

    def __enter__(self) -> _Progress:
        return self

    def start(self) -> None:
        if not self.enabled or self._bar is not None:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TextColumn("{task.fields[outcome]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._bar.start()
        self._task = self._bar.add_task(
            "sweep", total=self.total, completed=self.done, outcome=self._text()
        )

    def advance(self, rec: dict[str, Any]) -> None:
        self._count(rec)
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, outcome=self._text())

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()
