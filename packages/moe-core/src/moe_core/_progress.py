"""Progress of the library steps that take seconds (drawing, converting and reading weights).

Reported through `logging` at INFO, on loggers under "moe_core", so a library stays quiet unless its
user asks: `logging.basicConfig(level=logging.INFO)` shows it. Nothing is formatted when INFO is off.
(The `moe` CLI draws its own progress on stderr; it passes its callbacks instead.)
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

__all__ = ["LoggedProgress", "logged_step"]


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
