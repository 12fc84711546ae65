"""Log lines above the progress bar, each printed exactly once.

``tqdm.contrib.logging.logging_redirect_tqdm`` swaps only plain ``StreamHandler``s for its own.
Under ``absl.app`` the root logger's console handler is absl's ``ABSLHandler`` (a wrapper around a
``StreamHandler``), so it stayed, and every line came out twice: once from absl, once from tqdm's
handler. On a terminal the bar redraw hid it; in a log file or CI, every line was doubled.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

from tqdm.auto import tqdm


def _console_stream(handler: logging.Handler) -> object | None:
    """The stream a console handler writes to (through absl's wrapper too), else None."""
    target = getattr(handler, "python_handler", handler)  # absl.logging.ABSLHandler wraps a StreamHandler
    stream = getattr(target, "stream", None) if isinstance(target, logging.StreamHandler) else None
    return stream if stream in (sys.stdout, sys.stderr) else None


class _AboveBar(logging.Handler):
    """Writes each record through ``tqdm.write``, which clears the bar, prints the line and redraws it."""

    def __init__(self, stream: object, formatter: logging.Formatter | None):
        super().__init__()
        self.stream = stream
        self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging must never raise into the run
            self.handleError(record)


@contextlib.contextmanager
def logs_above_bar() -> Iterator[None]:
    """Replaces the root logger's console handlers (absl's included) by one that prints above the bar,
    with the same format, for the duration; puts them back afterwards."""
    root = logging.getLogger()
    console = [h for h in root.handlers if _console_stream(h) is not None]
    if not console:
        yield
        return
    first = console[0]
    formatter = getattr(first, "python_handler", first).formatter
    above = _AboveBar(_console_stream(first), formatter)
    for handler in console:
        root.removeHandler(handler)
    root.addHandler(above)
    try:
        yield
    finally:
        root.removeHandler(above)
        for handler in console:
            root.addHandler(handler)
