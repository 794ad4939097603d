"""The live display of `whale run`: the runner's ``on_view`` callback.

On a terminal a rich Live region (bars for the run and the running phase, elapsed and ETA, the latest
reward, kept fraction, loss and learning rate) with the events printed above it; otherwise (a pipe, a
file, CI) one plain line per event, ISO time first. What is shown is computed by the pure functions of
:mod:`whale.console.progress`; this class only stamps the times and keeps the previous frame.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType

from rich.console import Console
from rich.live import Live

from whale.console.progress import ChildFrame, Frame, Pace, RunWork, events, render, update_paces
from whale.runner.local import RunnerView


def _utc_now() -> datetime:
    return datetime.now(UTC)


class RunDisplay:
    """Use as a context manager around the run; pass the instance as the runner's ``on_view``."""

    def __init__(
        self,
        run: str,
        console: Console,
        *,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = _utc_now,
        work: RunWork | None = None,
    ):
        """``work``: the plan's rollouts (:class:`RunWork`), so the run ETA counts evaluations and harness
        phases too."""
        self.run, self.console, self.clock, self.wall, self.work = run, console, clock, wall, work
        self.live_mode = console.is_terminal if live is None else live
        self.started_s = clock()
        self.prev: Frame | None = None
        self.paces: dict[str, Pace] = {}
        self._live: Live | None = None

    def __enter__(self) -> RunDisplay:
        if self.live_mode:
            self._live = Live(
                console=self.console, refresh_per_second=4, transient=True, redirect_stdout=False, redirect_stderr=True
            )
            self._live.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def frame(self, view: RunnerView) -> Frame:
        child = None
        if view.child is not None:
            c = view.child
            child = ChildFrame(c.request, c.started_s, c.metrics, c.progress)
        return Frame(self.run, self.wall(), self.clock(), self.started_s, view.status, child, self.work)

    def __call__(self, view: RunnerView) -> None:
        frame = self.frame(view)
        self.paces = update_paces(self.paces, frame)
        lines = events(self.prev, frame, self.paces)
        self.prev = frame
        printer = self._live.console if self._live is not None else self.console
        for line in lines:
            printer.print(line, markup=False, highlight=False, soft_wrap=True)
        if self._live is not None:
            self._live.update(render(frame, self.paces))
