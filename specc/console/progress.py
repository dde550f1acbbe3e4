"""Report long work on stderr: the stages of a compile with their times, and progress bars
that redraw as tqdm does in a terminal but only now and then into a log."""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager


class StageReporter:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, description: str, own_line: bool = False):
        """`own_line`: the stage shows its own progress (a bar, summary lines), so its
        line is ended first and its time is reported on a line of its own."""
        from specc.console import interrupts

        interrupts.check()
        if self.enabled:
            print(f"  {description} ...", end="\n" if own_line else "", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            yield
            interrupts.check()
        except BaseException as exc:
            if self.enabled:
                word = "interrupted" if isinstance(exc, (KeyboardInterrupt, interrupts.Terminated)) else "failed"
                print(f"  {description}: {word}" if own_line else f" {word}", file=sys.stderr, flush=True)
            raise
        elapsed = time.perf_counter() - start
        self.seconds[description] = round(elapsed, 3)
        if self.enabled:
            print(f"  {description}: {elapsed:.1f}s" if own_line else f" {elapsed:.1f}s", file=sys.stderr,
                  flush=True)


LOG_REDRAW_SECONDS = 30.0   # the most often a bar redraws into a log: a 20-minute compile writes ~40 redraws
TERMINAL_TICK_SECONDS = 1.0


def writes_to_terminal(file) -> bool:
    isatty = getattr(file, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:   # a closed stream
        return False


def progress_bar(iterable=None, **options):
    """A tqdm bar on stderr (or `file=`). Into a terminal it redraws as tqdm does; when the stream is
    not a terminal (a log file, CI) it redraws at most every LOG_REDRAW_SECONDS, as tqdm's own
    advice for logs goes, instead of ten times a second."""
    from tqdm import tqdm

    options.setdefault("file", sys.stderr)
    options.setdefault("dynamic_ncols", True)
    if not writes_to_terminal(options["file"]):
        options.setdefault("mininterval", LOG_REDRAW_SECONDS)
    return tqdm(iterable, **options)


def in_terminal(bar) -> bool:
    """Whether `bar` draws into a terminal: pass it as a postfix's `refresh=`, since a forced redraw
    ignores the log interval `progress_bar` sets."""
    return writes_to_terminal(getattr(bar, "fp", None))


@contextmanager
def ticking(bar, every_seconds: float | None = None):
    """Redraw `bar` while the block runs, so its elapsed time moves during one long step (tqdm
    redraws only when the bar advances): every `every_seconds`, by default every second into a
    terminal and every LOG_REDRAW_SECONDS into a log."""
    if getattr(bar, "disable", False):
        yield bar
        return
    if every_seconds is None:
        every_seconds = TERMINAL_TICK_SECONDS if in_terminal(bar) else LOG_REDRAW_SECONDS
    stop = threading.Event()

    def tick():
        while not stop.wait(every_seconds):
            bar.refresh()

    ticker = threading.Thread(target=tick, name="specc-progress-ticker", daemon=True)
    ticker.start()
    try:
        yield bar
    finally:
        stop.set()
        ticker.join()
