"""Progress of the library steps that take seconds (drawing, converting and reading weights).

Reported through `logging` at INFO, on loggers under "moe_core", so a library stays quiet unless its
user asks: `logging.basicConfig(level=logging.INFO)` shows it. Nothing is formatted when INFO is off.
(The `moe` CLI draws its own progress on stderr; it passes its callbacks instead.)
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["Heartbeat", "LoggedProgress", "logged_step"]


class LoggedProgress:
    """A `progress(done, total)` callback logging `label: done/total (elapsed)` at INFO: the first
    call, then at most one line every `interval` seconds, and the last call."""

    def __init__(self, logger: logging.Logger, label: str, interval: float = 3.0) -> None:
        self.logger, self.label, self.interval = logger, label, interval
        self.start = time.perf_counter()
        self.last: float | None = None

    def __call__(self, done: int, total: int) -> None:
        if not self.logger.isEnabledFor(logging.INFO):
            return
        now = time.perf_counter()
        if self.last is None or done == total or now - self.last >= self.interval:
            self.last = now
            self.logger.info("%s: %d/%d (%.1fs)", self.label, done, total, now - self.start)


@contextlib.contextmanager
def logged_step(logger: logging.Logger, what: str) -> Iterator[None]:
    """Log at INFO that `what` starts and, when it ends, how long it took."""
    logger.info("%s ...", what)
    start = time.perf_counter()
    yield
    logger.info("%s: done in %.1fs", what, time.perf_counter() - start)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Heartbeat:
    """A step that takes seconds, told at least every `interval` seconds (the `moe` CLI's steps).

    As a context manager: a line when the step starts, one when it ends with its duration, and in
    between, from a background thread, a line whenever `interval` seconds passed without one: the
    latest `done/total` the step reported (it is also a `progress(done, total)` callback), else the
    time elapsed. So a step that reports nothing, or reports slowly, is never silent for long.
    """

    def __init__(self, what: str, write: Callable[[str], None] = _to_stderr, interval: float = 5.0) -> None:
        self.what, self.write, self.interval = what, write, interval
        self.done: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.start = self.last = time.perf_counter()

    def _say(self, text: str) -> None:
        with self._lock:
            self.last = time.perf_counter()
            self.write(f"{self.what}: {text} ({self.last - self.start:.1f}s)")

    def __call__(self, done: int, total: int) -> None:
        first, self.done = self.done is None, (done, total)
        if first or done == total or time.perf_counter() - self.last >= self.interval:
            self._say(f"{done}/{total}")

    def _beat(self) -> None:
        # wake when the next line is due (a line said in between moves that time on)
        while not self._stop.wait(max(0.0, self.last + self.interval - time.perf_counter())):
            if time.perf_counter() - self.last >= self.interval:
                self._say("still working" if self.done is None else f"{self.done[0]}/{self.done[1]}, working")

    def __enter__(self) -> Heartbeat:
        self.write(f"{self.what} ...")
        self.start = self.last = time.perf_counter()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat: {self.what}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if exc[0] is None:
            self.write(f"{self.what}: done in {time.perf_counter() - self.start:.1f}s")
